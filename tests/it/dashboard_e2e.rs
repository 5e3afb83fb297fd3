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

use lemon_tests::fake_llm::{FakeLlm, FakeToolCall, Turn};
use serde_json::json;

use crate::support::{home_with, Gateway, PATIENCE, TOKEN};

/// The native engine's model: two runs whose commands wait for an answer on
/// the live page, the first approved, the second denied.
async fn fake_llm() -> FakeLlm {
    let llm = FakeLlm::start().await;
    for (file, answer) in [("approved.txt", "Made it."), ("denied.txt", "Not made.")] {
        let input = json!({ "command": format!("touch {file}") }).to_string();
        llm.push(Turn::tool_calls(vec![FakeToolCall::new("call_1", "bash", &[&input])]));
        llm.push(Turn::text(&[answer]));
    }
    llm
}

fn config(llm: &FakeLlm) -> String {
    let fixture =
        format!("{}/fixtures/cli/claude/steer_two_turns.jsonl", env!("CARGO_MANIFEST_DIR"));
    let native = format!(
        "\n[gateway.engines.lemon]\nbase_url = \"{}\"\nmodel = \"test-model\"\n",
        llm.base_url()
    );
    let cli = format!(
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
    );
    // Listed on the engines page: one disabled, one whose command is missing.
    let mcp = "\n[[gateway.mcp_servers]]\nname = \"docs\"\nurl = \"https://mcp.example.test/mcp\"\n\
               enabled = false\n\n\
               [[gateway.mcp_servers]]\nname = \"missing\"\ncommand = \"lemon-no-such-mcp-server\"\n";
    cli + &native + mcp
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
    let llm = fake_llm().await;
    let home = home_with(&config(&llm));
    let secrets = home.path().join("secrets.toml");
    std::fs::write(&secrets, "openai_api_key = \"sk-dashboard-test\"\n").unwrap();
    std::fs::set_permissions(&secrets, std::os::unix::fs::PermissionsExt::from_mode(0o600))
        .unwrap();
    let gateway = Gateway::start_in(home.path()).await;
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
    for name in [
        "login-refused",
        "live",
        "approval",
        "config-error",
        "config-applied",
        "status",
        "mcp-servers",
    ] {
        assert!(shots.join(format!("{name}.png")).exists(), "screenshot {name}.png");
    }

    // The model read what each button decided.
    let results: Vec<String> = llm
        .requests()
        .iter()
        .filter_map(|request| {
            let messages = request.body["messages"].as_array()?;
            let last = messages.last()?;
            (last["role"] == "tool").then(|| last["content"].as_str().unwrap_or("").to_owned())
        })
        .collect();
    assert_eq!(results.len(), 2, "{results:?}");
    assert!(results[0].contains("[exit code 0]"), "approved: {}", results[0]);
    assert_eq!(
        results[1], "The owner denied this call (api via dashboard); it was not run.",
        "denied"
    );

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

    // The MCP servers the engines page listed, as the API gives them.
    let servers = status["mcp_servers"].as_array().expect("mcp_servers");
    let names: Vec<&str> = servers.iter().filter_map(|s| s["name"].as_str()).collect();
    assert_eq!(names, ["docs", "missing"], "{status}");
    assert_eq!(servers[0]["transport"], "http");
    assert_eq!(servers[0]["state"], "disabled");
    assert_eq!(servers[1]["transport"], "stdio");
    // The native runs above tried to start it.
    assert_eq!(servers[1]["state"], "failed", "{status}");
    let error = servers[1]["error"].as_str().unwrap_or_default();
    assert!(error.contains("lemon-no-such-mcp-server"), "{status}");
}

/// Reads the firehose until an event of type `kind`; its data.
async fn next_event(response: reqwest::Response, kind: &str) -> serde_json::Value {
    use futures::StreamExt;
    let mut parser = lemon_tests::event_stream::EventStream::default();
    let mut stream = response.bytes_stream();
    tokio::time::timeout(PATIENCE, async {
        while let Some(chunk) = stream.next().await {
            for event in parser.push(&chunk.unwrap()) {
                if event.event == kind {
                    return serde_json::from_str(&event.data).unwrap();
                }
            }
        }
        panic!("the event stream ended before {kind}");
    })
    .await
    .unwrap_or_else(|_| panic!("{kind} in time"))
}

#[tokio::test]
async fn a_config_put_is_checked_written_as_sent_and_applied_by_the_running_gateway() {
    let gateway = Gateway::start("# mine\n[gateway]\nmax_concurrent_runs = 2\n").await;
    let file: serde_json::Value =
        gateway.get("/v1/config/file").send().await.unwrap().json().await.unwrap();
    assert_eq!(file["exists"], true);
    let text = file["text"].as_str().unwrap().to_owned();
    assert!(text.starts_with("# mine\n[gateway]\nmax_concurrent_runs = 2\n"), "{file}");
    let put = |body: serde_json::Value| {
        gateway.http.put(format!("{}/v1/config", gateway.api)).bearer_auth(TOKEN).json(&body)
    };

    // Refused before anything is written: the place of the problem comes back.
    let bad = text
        .replace("max_concurrent_runs = 2", "max_concurrent_runs = 2\ndefault_engine = \"nope\"");
    let refused = put(serde_json::json!({ "text": bad })).send().await.unwrap();
    assert_eq!(refused.status(), 422);
    let refused: serde_json::Value = refused.json().await.unwrap();
    assert_eq!(refused["line"], 4, "{refused}");
    assert!(refused["error"].as_str().unwrap().contains("nope"), "{refused}");
    assert_eq!(std::fs::read_to_string(gateway.home.join("config.toml")).unwrap(), text);

    // A good one is written as sent and applied like an edit in an editor.
    let events = gateway.get("/v1/events").send().await.unwrap();
    assert_eq!(events.status(), 200);
    let good = text.replace("max_concurrent_runs = 2", "# three now\nmax_concurrent_runs = 3");
    let saved = put(serde_json::json!({ "text": good })).send().await.unwrap();
    assert_eq!(saved.status(), 200);
    let saved: serde_json::Value = saved.json().await.unwrap();
    assert_eq!(saved["saved"], true, "{saved}");
    let reloaded = next_event(events, "config_reloaded").await;
    assert_eq!(reloaded["applied"], serde_json::json!(["max_concurrent_runs"]), "{reloaded}");
    assert_eq!(gateway.status().await["scheduler"]["max"], 3);
    assert_eq!(std::fs::read_to_string(gateway.home.join("config.toml")).unwrap(), good);

    let no_token = gateway.http.get(format!("{}/v1/config/file", gateway.api)).send().await;
    assert_eq!(no_token.unwrap().status(), 401);
    let page = gateway.http.get(format!("{}/", gateway.api)).send().await.unwrap();
    assert_eq!(page.status(), 200, "the page itself needs no token");
    let policy = page.headers()["content-security-policy"].to_str().unwrap().to_owned();
    assert!(policy.starts_with("default-src 'self'"), "{policy}");
    assert!(page.text().await.unwrap().contains("<script type=\"module\" src=\"/ui/app.js\">"));
}
