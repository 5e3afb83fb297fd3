//! A first run as a newcomer meets it, end to end on the real binary: what a
//! start prints off a terminal (the ready line with every URL, where state
//! lives, the config read, the token once, one line for missing CLIs; all of
//! it JSON with `--log-format json`), config mistakes answered one way at start
//! and on reload (warnings with the closest key, errors with their place), a
//! missing secret, a secret set twice, `/engine` in a chat, a CLI that is not
//! logged in, `env_passthrough`, and `engines` with versions and paths.

use std::path::Path;
use std::process::Stdio;

use lemon_tests::fake_telegram::ChatSpec;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};

use crate::support::{
    command, command_with_path, failed_start, home_with, write_config, Gateway, PATIENCE,
};
use crate::telegram_e2e::{fake_telegram, wait_for_reply, USER};

fn fake_cli() -> &'static str {
    env!("CARGO_BIN_EXE_fake-cli")
}

/// What one start printed: its ready line (stdout) and everything on stderr
/// until it was stopped with SIGTERM.
struct StartOutput {
    ready: String,
    stderr: String,
}

/// Starts `command` (stdout and stderr pipes, no terminal), waits for the ready
/// line, stops it with SIGTERM and collects stderr.
async fn start_and_stop(mut command: tokio::process::Command) -> StartOutput {
    let mut child = command.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let mut stderr_pipe = child.stderr.take().unwrap();
    let stderr_task = tokio::spawn(async move {
        let mut text = String::new();
        stderr_pipe.read_to_string(&mut text).await.unwrap();
        text
    });
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let ready = tokio::time::timeout(PATIENCE, async {
        loop {
            let line = lines.next_line().await.unwrap().expect("ready before exiting");
            // Plain, or with `--log-format json` a JSON object saying it.
            if crate::support::ready_line(&line).is_some() {
                return line;
            }
        }
    })
    .await
    .expect("ready in time");
    let pid = child.id().unwrap().to_string();
    let killed = tokio::process::Command::new("kill").args(["-TERM", &pid]).status().await;
    assert!(killed.unwrap().success());
    tokio::time::timeout(PATIENCE, child.wait()).await.expect("stops in time").unwrap();
    let stderr = tokio::time::timeout(PATIENCE, stderr_task).await.expect("stderr ends").unwrap();
    StartOutput { ready, stderr }
}

/// A home whose config enables the webhook on a free port; the gateway gets no
/// API token, so it generates one, and a `PATH` where no vendor CLI is.
fn first_start(home: &Path, extra_args: &[&str]) -> tokio::process::Command {
    write_config(home, "[gateway.webhook]\nenabled = true\nport = 0\n");
    let mut command = command_with_path(home, "/nonexistent/bin");
    command.env_remove("LEMON_API_TOKEN").env("LEMON_LOG", "info").args(extra_args);
    command
}

#[tokio::test]
async fn a_start_off_a_terminal_prints_urls_state_config_token_and_one_engine_line() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path();
    let out = start_and_stop(first_start(home, &[])).await;

    let fields: Vec<&str> = out.ready.split_whitespace().collect();
    assert_eq!(fields[..2], ["lemon-gateway", "ready"], "{}", out.ready);
    assert!(fields[2].starts_with("api=http://127.0.0.1:"), "{}", out.ready);
    assert!(fields[3].starts_with("health=http://127.0.0.1:"), "{}", out.ready);
    assert!(
        fields[4].starts_with("webhook=http://127.0.0.1:") && fields[4].ends_with("/webhooks/"),
        "the webhook's URL: {}",
        out.ready
    );
    assert_eq!(fields.len(), 5, "telegram is off: {}", out.ready);

    let stderr = &out.stderr;
    assert!(!stderr.contains('\x1b'), "no escape codes off a terminal: {stderr:?}");
    assert!(stderr.contains(&format!("home={}", home.display())), "{stderr}");
    assert!(stderr.contains(&format!("database={}", home.join("lemon.db").display())), "{stderr}");
    assert!(
        stderr.contains(&format!("config={}", home.join("config.toml").display()))
            && stderr.contains("config read"),
        "{stderr}"
    );
    let token_lines: Vec<&str> = stderr.lines().filter(|l| l.contains("API token")).collect();
    assert_eq!(token_lines.len(), 1, "{stderr}");
    let saved = std::fs::read_to_string(home.join("secrets.toml")).unwrap();
    let (prefix, token) = token_lines[0].rsplit_once(": ").unwrap();
    assert_eq!(
        prefix,
        format!("API token (saved to {}, shown once)", home.join("secrets.toml").display())
    );
    assert!(token.len() == 64 && saved.contains(token), "the saved token, on its own line");
    let engine_lines: Vec<&str> = stderr.lines().filter(|l| l.contains("unavailable")).collect();
    assert_eq!(engine_lines.len(), 1, "{stderr}");
    assert!(
        engine_lines[0].contains(
            "engines unavailable: claude, codex, opencode, pi, droid: not found on PATH; set cli_path | lemon: no openai_api_key set"
        ),
        "{stderr}"
    );
    assert!(!stderr.contains("/nonexistent/bin"), "the summary leaves out the PATH: {stderr}");
    assert!(!stderr.contains("migrated"), "migrations are debug: {stderr}");
    assert!(!stderr.contains("gateway ready"), "the ready line is said once, on stdout: {stderr}");
    let keychain = stderr.lines().find(|l| l.contains("keychain")).unwrap_or_default();
    assert!(keychain.len() < 200, "the keychain line is short: {keychain}");

    // The token is printed only when it is generated.
    let again = start_and_stop(first_start(home, &[])).await;
    assert!(
        !again.stderr.contains(token) && !again.stderr.contains("API token"),
        "{}",
        again.stderr
    );
}

#[tokio::test]
async fn with_json_logs_every_line_is_json_and_the_token_is_an_object() {
    let dir = tempfile::tempdir().unwrap();
    let out = start_and_stop(first_start(dir.path(), &["--log-format", "json"])).await;
    let lines: Vec<Value> = out
        .stderr
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line:?}")))
        .collect();
    let tokens: Vec<&Value> = lines.iter().filter(|l| l.get("api_token").is_some()).collect();
    assert_eq!(tokens.len(), 1, "{}", out.stderr);
    let token = tokens[0]["api_token"].as_str().unwrap();
    let saved = std::fs::read_to_string(dir.path().join("secrets.toml")).unwrap();
    assert!(token.len() == 64 && saved.contains(token));
    assert!(
        lines.iter().any(|l| l["fields"]["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("engines unavailable: claude, codex"))),
        "{}",
        out.stderr
    );
    let ready: Value =
        serde_json::from_str(&out.ready).unwrap_or_else(|e| panic!("{e}: {}", out.ready));
    assert_eq!(ready["fields"]["message"], "lemon-gateway ready", "{ready}");
    assert!(ready["fields"]["api"].as_str().unwrap().starts_with("http://127.0.0.1:"), "{ready}");
    assert!(ready["fields"]["webhook"].as_str().unwrap().ends_with("/webhooks/"), "{ready}");
}

/// `config.toml` with API and health on free ports (nothing else added).
fn config_path(home: &Path) -> std::path::PathBuf {
    home.join("config.toml")
}

#[tokio::test]
async fn unknown_keys_warn_with_the_closest_key_in_every_section_enabled_or_not() {
    let text = "[gateway]\nmax_concurent_runs = 3\n\
                [gateway.engines.cluade]\nmodel = \"opus\"\n\
                [gateway.engines.codex]\ncli_pth = \"/opt/codex\"\n\
                [gateway.telegram]\nenabled = false\nallowed_chat_id = [1]\n\
                [gateway.webhook]\nenabled = false\nprot = 4046\n";
    let home = home_with(text);
    let mut command = command(home.path());
    command.env("LEMON_LOG", "warn");
    let out = start_and_stop(command).await;
    let file = config_path(home.path()).display().to_string();
    for expected in [
        format!("{file}:2:1: unknown key gateway.max_concurent_runs (ignored); did you mean `max_concurrent_runs`?"),
        format!("{file}:3:18: unknown engine section gateway.engines.cluade (ignored); did you mean `claude`?"),
        format!("{file}:6:1: unknown key gateway.engines.codex.cli_pth (ignored); did you mean `cli_path`?"),
        format!("{file}:9:1: unknown key gateway.telegram.allowed_chat_id (ignored); did you mean `allowed_chat_ids`?"),
        format!("{file}:12:1: unknown key gateway.webhook.prot (ignored); did you mean `port`?"),
    ] {
        assert!(out.stderr.contains(&expected), "{expected}\n--- stderr ---\n{}", out.stderr);
    }
}

#[tokio::test]
async fn wrong_values_and_unknown_engines_stop_the_start_with_their_place() {
    let cases = [
        (
            "[gateway]\ndefault_engine = \"claud\"\n",
            ":2:18: gateway.default_engine: `default_engine`: unknown engine \"claud\": did you mean \"claude\"? the engines are claude, codex, droid, echo, lemon, opencode, pi",
        ),
        (
            "[[gateway.bindings]]\ntransport = \"telegram\"\nchat_id = 5\ndefault_engine = \"ecoh\"\n",
            ":4:18: gateway.bindings[0].default_engine: `default_engine`: unknown engine \"ecoh\": did you mean \"echo\"?",
        ),
        (
            "[gateway.projects.site]\nroot = \"/tmp\"\ndefault_engine = \"nope\"\n",
            ":3:18: gateway.projects.site.default_engine: `default_engine`: unknown engine \"nope\": the engines are",
        ),
        (
            // Telegram is off, and its wrong type is still an error.
            "[gateway.telegram]\nenabled = false\nallowed_chat_ids = \"me\"\n",
            ":3:20: gateway.telegram.allowed_chat_ids:",
        ),
        (
            "[gateway.webhook]\nenabled = false\nport = \"80\"\n",
            ":3:8: gateway.webhook.port:",
        ),
        (
            "[gateway.webhook]\nenabled = true\nport = 0\n[gateway.webhook.integrations.zap]\ntoken = \"t0ken-for-zap\"\ncallback_url = \"http://10.1.2.3/hook\"\n",
            ":6:16: gateway.webhook.integrations.zap.callback_url: `callback_url`: 10.1.2.3 is a private or loopback address; set allow_private_callback_hosts = true to allow it",
        ),
        (
            "[gateway.webhook]\nenabled = true\nport = 0\n[gateway.webhook.integrations.zap]\ntoken = \"t0ken-for-zap\"\ncallback_url = \"ftp://example.com/\"\n",
            ":6:16: gateway.webhook.integrations.zap.callback_url: `callback_url`: invalid callback url: the scheme must be http or https",
        ),
    ];
    for (text, expected) in cases {
        let home = home_with(text);
        let (code, stderr) = failed_start(home.path()).await;
        assert_eq!(code, Some(5), "a config error: {text}\n{stderr}");
        let expected = format!("{}{expected}", config_path(home.path()).display());
        assert!(
            stderr.contains(&expected),
            "{text}\nexpected {expected}\n--- stderr ---\n{stderr}"
        );
    }
}

#[tokio::test]
async fn a_callback_host_that_does_not_resolve_is_a_warning() {
    let home = home_with(
        "[gateway.webhook]\nenabled = true\nport = 0\n[gateway.webhook.integrations.zap]\ntoken = \"t0ken-for-zap\"\ncallback_url = \"https://hooks.nowhere.invalid/in?key=s3cr3t\"\n",
    );
    let out = start_and_stop(command(home.path())).await;
    let expected = format!(
        "{}:6:16: gateway.webhook.integrations.zap.callback_url: `callback_url`: the host \"hooks.nowhere.invalid\" does not resolve now; callbacks fail until it does",
        config_path(home.path()).display()
    );
    assert!(out.stderr.contains(&expected), "{}", out.stderr);
    assert!(!out.stderr.contains("s3cr3t"), "the URL is never logged");
}

#[tokio::test]
async fn an_edit_naming_an_unknown_engine_is_rejected_with_its_place() {
    let gateway = Gateway::start("[gateway]\nmax_concurrent_runs = 2\n").await;
    let text = "[gateway]\nmax_concurrent_runs = 2\ndefault_engine = \"claud\"\n[gateway.api]\nport = 0\n[gateway.health]\nport = 0\n";
    let path = config_path(&gateway.home);
    let tmp = gateway.home.join("config.toml.tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, &path).unwrap();
    let error = tokio::time::timeout(PATIENCE, async {
        loop {
            let report: Value =
                gateway.get("/v1/config").send().await.unwrap().json().await.unwrap();
            if let Some(error) = report["rejected"]["error"].as_str() {
                return error.to_owned();
            }
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the edit is rejected in time");
    let expected = format!(
        "{}:3:18: gateway.default_engine: `default_engine`: unknown engine \"claud\": did you mean \"claude\"?",
        path.display()
    );
    assert!(error.starts_with(&expected), "{error}");
    assert!(
        error.contains("the engines are claude, codex, droid, echo, lemon, opencode, pi"),
        "{error}"
    );
    // The running config is kept.
    let run = gateway.submit(json!({ "prompt": "still echo" })).await;
    assert_eq!(gateway.wait(&run).await["engine"], "echo");
}

#[tokio::test]
async fn a_missing_secret_says_where_it_was_looked_for_and_how_to_set_it() {
    let home = home_with(
        "[gateway.webhook]\nenabled = true\nport = 0\n[gateway.webhook.integrations.zapier]\ntoken_secret = \"zapier_webhook_token\"\n",
    );
    let (code, stderr) = failed_start(home.path()).await;
    assert_eq!(code, Some(5), "{stderr}");
    let secrets = home.path().join("secrets.toml");
    let expected = format!(
        "secret \"zapier_webhook_token\" is not set (looked in the environment variable ZAPIER_WEBHOOK_TOKEN, {path}); add zapier_webhook_token = \"…\" to {path} (mode 0600) or set ZAPIER_WEBHOOK_TOKEN in the gateway's environment",
        path = secrets.display()
    );
    assert!(stderr.contains(&expected), "{stderr}");
}

#[tokio::test]
async fn a_secret_in_the_environment_and_the_file_is_reported_with_the_source_in_use() {
    let home = home_with(
        "[gateway.webhook]\nenabled = true\nport = 0\n[gateway.webhook.integrations.ci]\ntoken_secret = \"ci_hook_token\"\n",
    );
    let secrets = home.path().join("secrets.toml");
    std::fs::write(&secrets, "ci_hook_token = \"from-the-file-0123\"\n").unwrap();
    std::fs::set_permissions(&secrets, std::os::unix::fs::PermissionsExt::from_mode(0o600))
        .unwrap();
    let mut command = command(home.path());
    command.env("CI_HOOK_TOKEN", "from-the-env-4567");
    let mut gateway = Gateway::spawn_with_stderr(command, home.path(), Stdio::piped()).await;
    let status = gateway.status().await;
    assert_eq!(
        status["secrets"]["ci_hook_token"],
        json!({
            "source": "the environment variable CI_HOOK_TOKEN",
            "overrides": [secrets.display().to_string()],
        }),
        "{status}"
    );
    assert_eq!(
        status["secrets"]["lemon_api_token"]["source"],
        "the environment variable LEMON_API_TOKEN"
    );
    let mut stderr = gateway.child.stderr.take().unwrap();
    let _ = gateway.terminate().await;
    let mut text = String::new();
    stderr.read_to_string(&mut text).await.unwrap();
    assert!(text.contains("secret set in more than one place; the first is used"), "{text}");
    assert!(text.contains("source=the environment variable CI_HOOK_TOKEN"), "{text}");
    assert!(!text.contains("from-the-env") && !text.contains("from-the-file"), "{text}");
}

#[tokio::test]
async fn engine_in_a_chat_lists_refuses_unavailable_ones_and_switches() {
    let fake = fake_telegram().await;
    let extra = format!(
        "[gateway.engines.claude]\ncli_path = \"/opt/missing/claude\"\n\
         [gateway.engines.codex]\ncli_path = \"{}\"\n",
        fake_cli()
    );
    let config = crate::telegram_e2e::config(&fake, "", &extra);
    let _gateway = crate::telegram_e2e::start(&fake, &config).await;
    let chat = ChatSpec::private(USER);

    let listed = fake.inject_text(&chat, USER, "/engine");
    let list = wait_for_reply(&fake, USER, listed.message_id, "Engines:").await;
    assert!(list.text.starts_with("This session uses echo."), "{}", list.text);
    for line in [
        "claude: not available (cli_path /opt/missing/claude does not exist)",
        "codex: available",
        "echo: available",
        "pi: not available (not found on PATH; set cli_path)",
    ] {
        assert!(list.text.contains(line), "{line}: {}", list.text);
    }

    let refused = fake.inject_text(&chat, USER, "/engine claude");
    let refusal = wait_for_reply(&fake, USER, refused.message_id, "not available").await;
    assert_eq!(
        refusal.text,
        "claude is not available: cli_path /opt/missing/claude does not exist. This session keeps echo."
    );
    let unknown = fake.inject_text(&chat, USER, "/engine cluade");
    let answer = wait_for_reply(&fake, USER, unknown.message_id, "Unknown engine").await;
    assert_eq!(
        answer.text,
        "Unknown engine cluade. The engines are claude, codex, droid, echo, lemon, opencode, pi."
    );
    let switched = fake.inject_text(&chat, USER, "/engine codex");
    wait_for_reply(&fake, USER, switched.message_id, "This session now uses codex.").await;
    let listed = fake.inject_text(&chat, USER, "/engine");
    let list = wait_for_reply(&fake, USER, listed.message_id, "Engines:").await;
    assert!(list.text.starts_with("This session uses codex."), "{}", list.text);
}

/// `[gateway.engines.claude]` on the fake CLI with `env` (TOML inline-table text).
fn claude_section(env: &str, extra: &str) -> String {
    format!("[gateway.engines.claude]\ncli_path = \"{}\"\n{extra}\nenv = {{ {env} }}\n", fake_cli())
}

#[tokio::test]
async fn a_cli_that_is_not_logged_in_fails_with_the_fix() {
    let fixture = lemon_tests::fake_cli::fixture("claude", "synth_not_logged_in.jsonl");
    let env = format!("FAKE_CLI_FIXTURE = \"{}\"", fixture.display());
    let gateway = Gateway::start(&claude_section(&env, "")).await;
    let run = gateway.submit(json!({ "prompt": "hi", "engine": "claude" })).await;
    let record = gateway.wait(&run).await;
    assert_eq!(record["status"], "failed", "{record}");
    let error = record["error"].as_str().unwrap_or_default();
    assert!(error.contains("Not logged in · Please run /login"), "{record}");
    for fix in [
        "api_key_secret = \"anthropic_api_key\"",
        "secrets.toml",
        "ANTHROPIC_API_KEY",
        "env_passthrough = [\"ANTHROPIC_*\"]",
    ] {
        assert!(error.contains(fix), "{fix}: {error}");
    }
}

#[tokio::test]
async fn env_passthrough_hands_the_cli_the_named_variables_and_no_others() {
    let dir = tempfile::tempdir().unwrap();
    let env_file = dir.path().join("claude.env");
    let fixture = lemon_tests::fake_cli::fixture("claude", "synth_tool_use_success.jsonl");
    let env = format!(
        "FAKE_CLI_FIXTURE = \"{}\", FAKE_CLI_ENV_FILE = \"{}\"",
        fixture.display(),
        env_file.display()
    );
    let home =
        home_with(&claude_section(&env, "env_passthrough = [\"ANTHROPIC_*\", \"GH_TOKEN\"]"));
    let mut command = command(home.path());
    command
        .env("ANTHROPIC_API_KEY", "sk-ant-passed")
        .env("ANTHROPIC_BASE_URL", "https://proxy.example")
        .env("GH_TOKEN", "gh-passed")
        .env("OPENAI_API_KEY", "sk-openai-kept")
        .env("GH_TOKEN_2", "kept");
    let gateway = Gateway::spawn(command, home.path()).await;
    let run = gateway.submit(json!({ "prompt": "hi", "engine": "claude" })).await;
    assert_eq!(gateway.wait(&run).await["status"], "completed");
    let recorded: Value =
        serde_json::from_str(&std::fs::read_to_string(&env_file).unwrap()).unwrap();
    assert_eq!(recorded["ANTHROPIC_API_KEY"], "sk-ant-passed");
    assert_eq!(recorded["ANTHROPIC_BASE_URL"], "https://proxy.example");
    assert_eq!(recorded["GH_TOKEN"], "gh-passed");
    for kept in ["OPENAI_API_KEY", "GH_TOKEN_2", "LEMON_API_TOKEN"] {
        assert!(recorded.get(kept).is_none(), "{kept} is not passed: {recorded}");
    }
}

#[tokio::test]
async fn engines_shows_each_cli_version_and_path() {
    let section = format!(
        "{}\n[gateway.engines.codex]\ncli_path = \"/opt/missing/codex\"\n",
        claude_section("FAKE_CLI_VERSION = \"2.0.14 (Claude Code)\"", "")
    );
    let gateway = Gateway::start(&section).await;
    let mut engines = command(&gateway.home);
    engines.env("LEMON_URL", &gateway.api).arg("engines").stdin(Stdio::null());
    let output = tokio::time::timeout(PATIENCE, engines.output()).await.unwrap().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert_eq!(output.status.code(), Some(0), "{stdout}");
    let claude = stdout.lines().find(|l| l.starts_with("claude")).expect("a claude line");
    assert!(claude.contains("available") && claude.contains("2.0.14 (Claude Code)"), "{claude}");
    assert!(claude.ends_with(fake_cli()), "{claude}");
    let codex = stdout.lines().find(|l| l.starts_with("codex")).expect("a codex line");
    assert!(codex.contains("unavailable: not found at /opt/missing/codex (cli_path)"), "{codex}");

    let status = gateway.status().await;
    let claude =
        status["engines"].as_array().unwrap().iter().find(|e| e["id"] == "claude").unwrap();
    assert_eq!(claude["version"], "2.0.14 (Claude Code)", "{claude}");
    assert_eq!(claude["path"], fake_cli(), "{claude}");
}
