//! The gateway as an MCP server, on the real binary, driven by the official
//! MCP Python SDK's client (tests/it/mcp_client.py): over Streamable HTTP to
//! `/mcp` with the API token, and over stdio through `lemon-gateway mcp`,
//! which the SDK starts itself as Claude Desktop or Cursor would.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::support::{gateway_bin, Gateway, PATIENCE, TOKEN};

/// The `mcp` package scripts/test installs, pinned.
const MCP_PY_VERSION: &str = "2.3.0";

/// A Python with the pinned MCP SDK: `LEMON_MCP_PYTHON`, else the virtual
/// environment scripts/test makes. `None` (the test is skipped) only when it
/// cannot be found and `LEMON_REQUIRE_MCP` is not set.
fn mcp_python() -> Option<PathBuf> {
    let path = match std::env::var_os("LEMON_MCP_PYTHON") {
        Some(path) => PathBuf::from(path),
        None => {
            let cache = std::env::var_os("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .or_else(|| std::env::var_os("HOME").map(|home| Path::new(&home).join(".cache")))?;
            cache.join(format!("lemon-gateway/mcp-{MCP_PY_VERSION}/bin/python"))
        }
    };
    if path.exists() {
        return Some(path);
    }
    let required = std::env::var_os("LEMON_REQUIRE_MCP").is_some_and(|v| v == "1");
    assert!(
        !required,
        "LEMON_REQUIRE_MCP=1 but the MCP Python SDK is not at {}: run scripts/test",
        path.display()
    );
    #[allow(clippy::print_stderr)] // The reason a test is skipped is for the person running it.
    {
        eprintln!("skipped: no MCP Python SDK at {} (run scripts/test)", path.display());
    }
    None
}

/// Runs the client script in `mode` with `env`; what it printed, as JSON.
async fn client(python: &Path, mode: &str, env: &[(&str, String)]) -> Value {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("it/mcp_client.py");
    let mut command = tokio::process::Command::new(python);
    command.arg(&script).env("LEMON_MCP_MODE", mode).kill_on_drop(true);
    for (name, value) in env {
        command.env(name, value);
    }
    let output =
        tokio::time::timeout(PATIENCE, command.output()).await.expect("the client ends in time");
    let output = output.unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "the {mode} client failed: {stderr}");
    serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|_| panic!("not JSON: {}", String::from_utf8_lossy(&output.stdout)))
}

/// What both transports must show: the tools, a run on echo and its answer,
/// `runs`, `status`, `cancel`, and the errors.
fn check_session(seen: &Value) {
    assert_eq!(seen["server"], "lemon-gateway", "{seen}");
    assert_eq!(seen["list_changed"], true, "{seen}");
    let tools: Vec<&str> =
        seen["tools"].as_array().unwrap().iter().map(|t| t.as_str().unwrap()).collect();
    for tool in ["run", "status", "cancel", "runs", "cron", "sms_wait_for_code"] {
        assert!(tools.contains(&tool), "{tool} in {tools:?}");
    }
    assert!(!tools.contains(&"approve"), "approve is for runs only: {tools:?}");

    let run = &seen["run"]["body"];
    assert_eq!(seen["run"]["is_error"], false, "{seen}");
    assert_eq!(run["status"], "completed", "{run}");
    assert_eq!(run["answer"], "hello from the mcp sdk");
    assert_eq!(run["engine"], "echo");
    let run_id = run["run_id"].as_str().unwrap();
    let listed = seen["runs"]["runs"].as_array().unwrap();
    assert!(listed.iter().any(|r| r["run_id"] == run_id), "{listed:?}");
    assert_eq!(seen["status"]["status"], "completed");
    assert_eq!(seen["status"]["answer"], "hello from the mcp sdk");
    let cancelled = seen["cancel"]["status"].as_str().unwrap();
    assert!(["cancelling", "cancelled", "completed"].contains(&cancelled), "{seen}");

    assert_eq!(seen["bad_argument"]["is_error"], true, "{seen}");
    let text = seen["bad_argument"]["text"].as_str().unwrap();
    assert!(text.contains("prompt"), "the argument is named: {text}");
    assert_eq!(seen["unknown_tool"]["code"], -32602, "{seen}");
}

/// Echo slow enough that a run started without waiting can be cancelled.
const CONFIG: &str = "[gateway.engines.echo]\ndelay_ms = 200\n";

#[tokio::test]
async fn the_official_mcp_client_runs_prompts_over_streamable_http() {
    let Some(python) = mcp_python() else { return };
    let gateway = Gateway::start(CONFIG).await;
    let url = format!("{}/mcp", gateway.api);
    let env = [("LEMON_MCP_URL", url), ("LEMON_API_KEY", TOKEN.to_owned())];
    let seen = client(&python, "http", &env).await;
    check_session(&seen);
    let wrong = seen["wrong_token"].as_str().unwrap();
    assert_ne!(wrong, "accepted");
    assert!(!wrong.contains(TOKEN), "the token is never echoed: {wrong}");

    // The endpoint answers a wrong token with 401 before reading the body.
    let response = gateway
        .http
        .post(format!("{}/mcp", gateway.api))
        .bearer_auth("not-the-token")
        .header("accept", "application/json, text/event-stream")
        .json(&serde_json::json!({ "jsonrpc": "2.0", "id": 1, "method": "tools/list" }))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 401);
}

#[tokio::test]
async fn the_official_mcp_client_runs_prompts_through_lemon_gateway_mcp() {
    let Some(python) = mcp_python() else { return };
    let gateway = Gateway::start(CONFIG).await;
    // `lemon-gateway mcp` with the gateway's home and environment; the port
    // the gateway bound is given as LEMON_URL (its config says 0).
    let home = gateway.home.display().to_string();
    let env = [
        ("LEMON_GATEWAY_BIN", gateway_bin().to_owned()),
        ("HOME", home.clone()),
        ("LEMON_HOME", home),
        ("LEMON_API_TOKEN", TOKEN.to_owned()),
        ("LEMON_URL", gateway.api.clone()),
        ("LEMON_KEYCHAIN", "off".to_owned()),
        ("LEMON_LOG", "warn".to_owned()),
    ];
    let seen = client(&python, "stdio", &env).await;
    check_session(&seen);
}

#[tokio::test]
async fn lemon_gateway_mcp_without_a_gateway_says_how_to_start_one() {
    let dir = crate::support::home_with("");
    let mut command = crate::support::command(dir.path());
    command.arg("mcp").env("LEMON_URL", "http://127.0.0.1:9");
    let (ok, text) = crate::support::output_text(command).await;
    assert!(!ok, "{text}");
    assert!(text.contains("cannot reach the gateway at http://127.0.0.1:9"), "{text}");
    assert!(text.contains("start it with `lemon-gateway`"), "{text}");
    assert!(!text.contains(TOKEN), "{text}");
}
