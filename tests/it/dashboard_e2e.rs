//! The web dashboard end to end: the real gateway, driven in headless
//! Chromium by Playwright (`tests/dashboard/dashboard.test.mjs`). The script's
//! screenshots are kept in `<target>/dashboard-screenshots/`.
//!
//! Needs Node.js, Chromium (`/usr/bin/chromium`, or `LEMON_CHROMIUM`) and
//! `playwright-core` (in `$LEMON_PLAYWRIGHT_DIR`, else
//! `~/.cache/lemon-tests/node/node_modules`); `scripts/test` installs them.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use tokio::process::Command;

use crate::support::{Gateway, PATIENCE, TOKEN};

fn config() -> String {
    let fixture =
        format!("{}/fixtures/cli/claude/steer_two_turns.jsonl", env!("CARGO_MANIFEST_DIR"));
    format!(
        "# dashboard test: this comment must survive a save\n\
         [gateway]\n\
         max_concurrent_runs = 4\n\
         \n\
         [gateway.engines.echo]\n\
         # slow enough to watch and to cancel\n\
         delay_ms = 40\n\
         \n\
         [gateway.engines.claude]\n\
         cli_path = \"{}\"\n\
         steering = true\n\
         env = {{ FAKE_CLI_FIXTURE = \"{fixture}\" }}\n",
        env!("CARGO_BIN_EXE_fake-cli"),
    )
}

/// `playwright-core`'s folder, or why it is missing.
fn playwright_core(home: Option<&str>, dir: Option<&str>) -> PathBuf {
    let modules = match (dir, home) {
        (Some(dir), _) => PathBuf::from(dir),
        (None, Some(home)) => Path::new(home).join(".cache/lemon-tests/node/node_modules"),
        (None, None) => PathBuf::from("node_modules"),
    };
    modules.join("playwright-core")
}

/// `<target>/dashboard-screenshots`, next to the test binary's `debug/`.
fn screenshot_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let target = exe.ancestors().nth(3).expect("the test binary is under <target>/debug/deps");
    target.join("dashboard-screenshots")
}

#[tokio::test]
async fn the_dashboard_signs_in_streams_cancels_steers_and_edits_the_config() {
    let playwright = playwright_core(
        std::env::var("HOME").ok().as_deref(),
        std::env::var("LEMON_PLAYWRIGHT_DIR").ok().as_deref(),
    );
    let chromium = std::env::var("LEMON_CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    assert!(
        playwright.join("package.json").exists() && Path::new(&chromium).exists(),
        "the dashboard test needs playwright-core at {} and Chromium at {chromium}: \
         run scripts/test once (it installs both)",
        playwright.display()
    );
    let gateway = Gateway::start(&config()).await;
    let shots = screenshot_dir();
    let script = format!("{}/dashboard/dashboard.test.mjs", env!("CARGO_MANIFEST_DIR"));
    let node = Command::new("node")
        .arg(&script)
        .env("DASHBOARD_URL", format!("{}/", gateway.api))
        .env("DASHBOARD_TOKEN", TOKEN)
        .env("DASHBOARD_SCREENSHOTS", &shots)
        .env("PLAYWRIGHT_CORE", &playwright)
        .env("CHROMIUM", &chromium)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(PATIENCE, node)
        .await
        .expect("the dashboard script ends in time")
        .expect("node runs (install Node.js)");
    let (stdout, stderr) =
        (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(
        output.status.success() && stdout.contains("DASHBOARD OK"),
        "dashboard script failed ({}):\n{stdout}\n{stderr}",
        output.status
    );
    for name in ["login-refused", "live", "config-error", "config-applied", "status"] {
        assert!(shots.join(format!("{name}.png")).exists(), "screenshot {name}.png");
    }

    // The saved file is the edited text: comments kept, the new limit in force.
    let saved = std::fs::read_to_string(gateway.home.join("config.toml")).unwrap();
    assert!(saved.starts_with("# dashboard test: this comment must survive a save\n"), "{saved}");
    assert!(saved.contains("# slow enough to watch and to cancel\n"), "{saved}");
    assert!(saved.contains("\nmax_concurrent_runs = 3\n"), "{saved}");
    let status = gateway.status().await;
    assert_eq!(status["scheduler"]["max"], 3, "{status}");
    let config: serde_json::Value =
        gateway.get("/v1/config").send().await.unwrap().json().await.unwrap();
    assert!(config["rejected"].is_null(), "the refused text was never written: {config}");
}
