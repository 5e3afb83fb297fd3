//! The MCP client against real servers: `@modelcontextprotocol/server-everything`
//! and `server-filesystem` where `scripts/test` installs them (skipped when
//! missing, unless `LEMON_REQUIRE_MCP=1`), and `tests/fixtures/mcp/fault_server.py`
//! for the faults no well-behaved server shows.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use lemon_core::contain::OffLimits;
use lemon_core::mcp::{McpServerConfig, McpServerState, McpStatusSource};
use lemon_core::secrets::SecretValue;
use lemon_core::tool::{Tool, ToolContext, ToolOutput};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::server::backoff;
use super::*;

/// How long anything here may take before the test fails.
const PATIENCE: Duration = Duration::from_secs(60);
/// A variable of the gateway's environment no server may see.
const GATEWAY_ONLY: (&str, &str) = ("LEMON_TEST_GATEWAY_ONLY", "gateway-only-value");
/// The value of the secret `fault_token`.
const FAULT_TOKEN: &str = "fault-token-value-7f3a";

/// `node_modules/.bin/<bin>` of the MCP servers `scripts/test` installs;
/// `None` (and a skip line) when missing, a panic under `LEMON_REQUIRE_MCP=1`.
fn installed(bin: &str) -> Option<PathBuf> {
    let dir = match std::env::var_os("LEMON_MCP_SERVERS_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => Path::new(&std::env::var_os("HOME")?).join(".cache/lemon-tests/mcp-servers"),
    };
    let path = dir.join("node_modules/.bin").join(bin);
    if path.is_file() {
        return Some(path);
    }
    assert!(
        std::env::var_os("LEMON_REQUIRE_MCP").is_none(),
        "LEMON_REQUIRE_MCP is set but {} is missing: run scripts/test once (it installs it)",
        path.display()
    );
    #[allow(clippy::print_stderr)] // the skip is said where the test runs
    {
        eprintln!("skipped: {} is not installed (scripts/test installs it)", path.display());
    }
    None
}

fn fault_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/mcp/fault_server.py")
}

/// A client's surroundings: a home, a run directory, the gateway's
/// environment and secrets.
struct Bench {
    home: tempfile::TempDir,
    tracker: TaskTracker,
    shutdown: CancellationToken,
}

impl Bench {
    fn new() -> Bench {
        Bench {
            home: tempfile::tempdir().unwrap(),
            tracker: TaskTracker::new(),
            shutdown: CancellationToken::new(),
        }
    }

    fn options(&self) -> McpOptions {
        let mut base_env: BTreeMap<String, String> = std::env::vars().collect();
        base_env.insert(GATEWAY_ONLY.0.to_owned(), GATEWAY_ONLY.1.to_owned());
        let secrets: SecretLookup = Arc::new(|name: &str| {
            Ok(match name {
                "fault_token" => Some(SecretValue::new(FAULT_TOKEN)),
                "header_value" => Some(SecretValue::new("header-secret-value")),
                _ => None,
            })
        });
        McpOptions {
            base_env,
            home: self.home.path().to_owned(),
            secrets,
            tracker: self.tracker.clone(),
            shutdown: self.shutdown.clone(),
        }
    }

    fn clients(&self, servers: Vec<McpServerConfig>) -> McpClients {
        McpClients::new(servers, self.options())
    }

    fn record(&self) -> PathBuf {
        self.home.path().join("record")
    }

    /// The fault server in `mode`, with the secret `fault_token` as its
    /// `FAULT_TOKEN`.
    fn fault(&self, mode: &str, timeout_ms: u64) -> McpServerConfig {
        let record = self.record().display().to_string();
        let script = fault_script().display().to_string();
        let mut config = McpServerConfig::stdio("fault", "python3", &[&script, &record, mode]);
        config.env.insert("FAULT_TOKEN".to_owned(), "fault_token".to_owned());
        config.timeout_ms = timeout_ms;
        config.startup_timeout_ms = 30_000;
        config
    }

    fn ctx(&self) -> ToolContext {
        ToolContext {
            run_id: lemon_core::ids::RunId::parse("run-1").unwrap(),
            session_key: "webhook:test".into(),
            call_id: "call_1".to_owned(),
            cwd: self.home.path().to_owned(),
            workspace: None,
            off_limits: OffLimits::none(),
            cancel: CancellationToken::new(),
        }
    }

    /// Waits for the file `name` in the fault server's record directory.
    async fn recorded(&self, name: &str) -> String {
        let path = self.record().join(name);
        let wait = async {
            loop {
                if let Ok(text) = std::fs::read_to_string(&path) {
                    if !text.is_empty() {
                        return text;
                    }
                }
                // Another process writes it; there is nothing to await.
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        };
        tokio::time::timeout(PATIENCE, wait)
            .await
            .unwrap_or_else(|_| panic!("{name} never written"))
    }

    /// The pids of the fault server's `n`th start: the server and its child.
    fn pids(&self, n: usize) -> [i32; 2] {
        let read = |name: String| {
            std::fs::read_to_string(self.record().join(name)).unwrap().trim().parse().unwrap()
        };
        [read(format!("pid.{n}")), read(format!("child.{n}"))]
    }

    /// Stops everything as a gateway's shutdown does.
    async fn shut_down(&self) {
        self.shutdown.cancel();
        self.tracker.close();
        tokio::time::timeout(PATIENCE, self.tracker.wait()).await.expect("every task ends");
    }
}

/// Whether process `pid` lives (a zombie does not).
fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().next()) != Some("Z")
    })
}

async fn tools_of(clients: &McpClients) -> Vec<Arc<dyn Tool>> {
    tokio::time::timeout(PATIENCE, clients.tools()).await.expect("tools listed in time")
}

fn names(tools: &[Arc<dyn Tool>]) -> Vec<String> {
    tools.iter().map(|tool| tool.spec().name).collect()
}

async fn call(clients: &McpClients, name: &str, args: Value, ctx: ToolContext) -> ToolOutput {
    let tools = tools_of(clients).await;
    let tool = tools
        .iter()
        .find(|tool| tool.spec().name == name)
        .unwrap_or_else(|| panic!("{name} not among {:?}", names(&tools)))
        .clone();
    tokio::time::timeout(PATIENCE, tool.execute(args, ctx)).await.expect("the call ends in time")
}

fn status(clients: &McpClients, name: &str) -> lemon_core::mcp::McpServerStatus {
    clients.servers().into_iter().find(|status| status.name == name).expect("the server's status")
}

#[tokio::test]
async fn everything_over_stdio_offers_its_tools_and_answers_calls() {
    let Some(everything) = installed("mcp-server-everything") else { return };
    let bench = Bench::new();
    let mut config =
        McpServerConfig::stdio("everything", &everything.display().to_string(), &["stdio"]);
    config.env.insert("EVERYTHING_TOKEN".to_owned(), "fault_token".to_owned());
    let clients = bench.clients(vec![config]);
    assert_eq!(status(&clients, "everything").state, McpServerState::Idle, "lazy: not started yet");

    let tools = tools_of(&clients).await;
    let listed = names(&tools);
    for name in ["everything__echo", "everything__get-sum", "everything__get-tiny-image"] {
        assert!(listed.contains(&name.to_owned()), "{name} in {listed:?}");
    }
    let echo = tools.iter().find(|tool| tool.spec().name == "everything__echo").unwrap().spec();
    assert_eq!(echo.parameters["type"], "object");
    assert!(echo.parameters["properties"]["message"].is_object(), "{}", echo.parameters);
    assert!(!echo.description.is_empty());
    let again = tools_of(&clients).await;
    assert!(Arc::ptr_eq(&tools[0], &again[0]), "an unchanged tool stays the same Arc");

    let out =
        call(&clients, "everything__echo", json!({"message": "hello mcp"}), bench.ctx()).await;
    assert!(!out.is_error && out.text.contains("hello mcp"), "{out:?}");
    assert_eq!(out.details["server"], "everything");

    let out = call(&clients, "everything__get-sum", json!({"a": 2, "b": 40}), bench.ctx()).await;
    assert!(!out.is_error && out.text.contains("42"), "{out:?}");

    let out = call(&clients, "everything__get-tiny-image", json!({}), bench.ctx()).await;
    assert!(!out.is_error, "{out:?}");
    let file = &out.details["auto_send_files"][0];
    let path = PathBuf::from(file["path"].as_str().expect("an image file"));
    assert!(path.starts_with(bench.home.path().canonicalize().unwrap().join("mcp-images")));
    assert_eq!(&std::fs::read(&path).unwrap()[1..4], b"PNG");
    assert!(out.text.contains("image saved as mcp-images/"), "{}", out.text);

    // The server's environment: the safe variables and its own `env`, no other.
    let out = call(&clients, "everything__get-env", json!({}), bench.ctx()).await;
    assert!(out.text.contains("EVERYTHING_TOKEN"), "its own env reaches it");
    assert!(out.text.contains(FAULT_TOKEN), "its secret's value reaches it");
    assert!(!out.text.contains(GATEWAY_ONLY.0), "the gateway's other variables do not");

    let seen = status(&clients, "everything");
    assert_eq!(seen.state, McpServerState::Running);
    assert_eq!(seen.starts, 1);
    assert_eq!(seen.calls.get("ok"), Some(&4));
    assert!(seen.tools.contains(&"everything__echo".to_owned()));
    clients.shutdown().await;
    assert_eq!(status(&clients, "everything").state, McpServerState::Idle);
    bench.shut_down().await;
}

#[tokio::test]
async fn everything_over_streamable_http_offers_its_tools_and_answers_calls() {
    let Some(everything) = installed("mcp-server-everything") else { return };
    let bench = Bench::new();
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let mut env = crate::cli::allowlisted_env(&std::env::vars().collect());
    env.insert("PORT".to_owned(), port.to_string());
    let spec = crate::cli::HelperSpec {
        program: everything,
        args: vec!["streamableHttp".to_owned()],
        cwd: bench.home.path().to_owned(),
        env,
    };
    let mut helper = crate::cli::spawn_helper(spec, &bench.tracker).await.unwrap();
    // It says on stderr when it listens.
    let listening = async {
        use tokio::io::AsyncBufReadExt;
        let mut lines = tokio::io::BufReader::new(&mut helper.stderr).lines();
        while let Some(line) = lines.next_line().await.unwrap() {
            if line.contains("listening on port") {
                return;
            }
        }
        panic!("the HTTP server ended before it listened");
    };
    tokio::time::timeout(PATIENCE, listening).await.expect("the HTTP server listens");

    let url = format!("http://127.0.0.1:{port}/mcp");
    let mut config = McpServerConfig::http("remote", &url);
    config.headers.insert("X-Lemon-Test".to_owned(), "header_value".to_owned());
    config.tools = Some(vec!["echo".to_owned(), "get-sum".to_owned()]);
    let clients = bench.clients(vec![config]);
    let tools = tools_of(&clients).await;
    assert_eq!(names(&tools), ["remote__echo", "remote__get-sum"]);
    let out = call(&clients, "remote__echo", json!({"message": "over http"}), bench.ctx()).await;
    assert!(!out.is_error && out.text.contains("over http"), "{out:?}");
    let seen = status(&clients, "remote");
    assert_eq!((seen.state, seen.starts), (McpServerState::Running, 1));
    assert_eq!(seen.transport, lemon_core::mcp::McpTransportKind::Http);

    clients.shutdown().await;
    helper.child.terminate(Duration::from_secs(2)).await;
    // Nothing listens there now: the probe says so.
    let error = probe(&McpServerConfig::http("gone", &url), &bench.options()).await.unwrap_err();
    assert!(error.contains("cannot use http://127.0.0.1"), "{error}");
    bench.shut_down().await;
}

#[tokio::test]
async fn the_filesystem_server_reads_a_file_and_the_allow_list_narrows_tools() {
    let Some(filesystem) = installed("mcp-server-filesystem") else { return };
    let bench = Bench::new();
    let data = bench.home.path().join("data");
    std::fs::create_dir(&data).unwrap();
    std::fs::write(data.join("notes.txt"), "the contents of notes\n").unwrap();
    let data_arg = data.canonicalize().unwrap().display().to_string();
    let mut config = McpServerConfig::stdio("fs", &filesystem.display().to_string(), &[&data_arg]);
    config.tools = Some(vec!["read_*".to_owned(), "list_directory".to_owned()]);
    let clients = bench.clients(vec![config]);
    let listed = names(&tools_of(&clients).await);
    assert!(listed.contains(&"fs__list_directory".to_owned()), "{listed:?}");
    assert!(listed
        .iter()
        .all(|name| name.starts_with("fs__read_") || name == "fs__list_directory"));
    assert!(!listed.contains(&"fs__write_file".to_owned()), "left out by the allow list");
    let read = if listed.contains(&"fs__read_text_file".to_owned()) {
        "fs__read_text_file"
    } else {
        "fs__read_file"
    };
    let path = format!("{data_arg}/notes.txt");
    let out = call(&clients, read, json!({ "path": path }), bench.ctx()).await;
    assert!(!out.is_error && out.text.contains("the contents of notes"), "{out:?}");
    // Outside its directory the server itself refuses: a tool error.
    let out = call(&clients, read, json!({ "path": "/etc/hostname" }), bench.ctx()).await;
    assert!(out.is_error, "{out:?}");
    bench.shut_down().await;
}

#[tokio::test]
async fn tools_are_listed_across_pages_checked_and_cleaned() {
    let bench = Bench::new();
    let clients = bench.clients(vec![bench.fault("normal", 60_000)]);
    let tools = tools_of(&clients).await;
    assert_eq!(
        names(&tools),
        [
            "fault__crash",
            "fault__echo",
            "fault__fail",
            "fault__garbage",
            "fault__grow",
            "fault__hang",
            "fault__image"
        ],
        "both pages of tools/list"
    );
    assert!(tools.iter().all(|tool| !tool.spec().description.contains('\u{1b}')));

    let out = call(&clients, "fault__fail", json!({}), bench.ctx()).await;
    assert!(out.is_error && out.text == "it went wrong", "{out:?}");
    let out = call(&clients, "fault__image", json!({}), bench.ctx()).await;
    assert!(!out.is_error && out.text.starts_with("a pixel\n[image/png image saved as"), "{out:?}");
    assert_eq!(out.details["auto_send_files"][0]["filename"], "fault__image-call_1-1.png");

    // A list_changed notification: the next run lists the tools again.
    let out = call(&clients, "fault__grow", json!({}), bench.ctx()).await;
    assert_eq!(out.text, "grown");
    assert!(names(&tools_of(&clients).await).contains(&"fault__extra".to_owned()));
    bench.shut_down().await;
}

#[tokio::test]
async fn hostile_tool_names_and_schemas_are_left_out() {
    let bench = Bench::new();
    let clients = bench.clients(vec![bench.fault("hostile", 60_000)]);
    assert_eq!(names(&tools_of(&clients).await), ["fault__fine"]);
    let error = probe(&bench.fault("hostile", 60_000), &bench.options()).await;
    assert_eq!(error.unwrap().len(), 1, "doctor is offered what a run is");
    bench.shut_down().await;
}

#[tokio::test]
async fn a_server_that_crashes_mid_call_gives_a_tool_error_and_is_started_again() {
    let bench = Bench::new();
    let clients = bench.clients(vec![bench.fault("normal", 60_000)]);
    let out = call(&clients, "fault__crash", json!({}), bench.ctx()).await;
    assert!(out.is_error, "{out:?}");
    assert!(out.text.contains("exit code 3"), "{}", out.text);
    assert!(out.text.contains("started again on its next use"), "{}", out.text);
    assert!(out.text.contains("secret env is <redacted>"), "its stderr, secrets cut: {}", out.text);
    assert!(!out.text.contains(FAULT_TOKEN));
    let seen = status(&clients, "fault");
    assert_eq!(seen.state, McpServerState::Failed);
    assert!(!seen.error.as_deref().unwrap_or_default().contains(FAULT_TOKEN));
    for pid in bench.pids(1) {
        assert!(!alive(pid), "the crashed server's group is gone ({pid})");
    }

    let out = call(&clients, "fault__echo", json!({"text": "again"}), bench.ctx()).await;
    assert_eq!(out.text, "echo: again", "{out:?}");
    let seen = status(&clients, "fault");
    assert_eq!((seen.state, seen.starts), (McpServerState::Running, 2));
    assert_eq!(seen.calls, BTreeMap::from([("error".to_owned(), 1), ("ok".to_owned(), 1)]));
    bench.shut_down().await;
}

#[tokio::test]
async fn a_server_that_writes_garbage_gives_a_tool_error_and_is_started_again() {
    let bench = Bench::new();
    let clients = bench.clients(vec![bench.fault("normal", 60_000)]);
    let out = call(&clients, "fault__garbage", json!({}), bench.ctx()).await;
    assert!(out.is_error && out.text.contains("not a JSON-RPC message"), "{out:?}");
    for pid in bench.pids(1) {
        assert!(!alive(pid), "the server that broke the protocol is killed ({pid})");
    }
    let out = call(&clients, "fault__echo", json!({"text": "fine"}), bench.ctx()).await;
    assert_eq!(out.text, "echo: fine");
    assert_eq!(status(&clients, "fault").starts, 2);
    bench.shut_down().await;
}

#[tokio::test]
async fn a_call_past_timeout_ms_is_cancelled_at_the_server_and_the_server_keeps_serving() {
    let bench = Bench::new();
    let clients = bench.clients(vec![bench.fault("normal", 300)]);
    let out = call(&clients, "fault__hang", json!({}), bench.ctx()).await;
    assert!(out.is_error && out.text.contains("did not answer within 300 ms"), "{out:?}");
    assert_eq!(out.result_meta, json!({"error_type": "timeout", "timeout_ms": 300}));
    let called = std::fs::read_dir(bench.record())
        .unwrap()
        .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
        .find_map(|name| name.strip_prefix("called-").map(str::to_owned))
        .expect("the server got the call");
    assert_eq!(bench.recorded(&format!("cancelled-{called}")).await, "timeout");

    let out = call(&clients, "fault__echo", json!({"text": "still here"}), bench.ctx()).await;
    assert_eq!(out.text, "echo: still here");
    let seen = status(&clients, "fault");
    assert_eq!(seen.starts, 1, "a slow call does not restart the server");
    assert_eq!(seen.calls, BTreeMap::from([("ok".to_owned(), 1), ("timeout".to_owned(), 1)]));
    bench.shut_down().await;
}

#[tokio::test]
async fn a_cancelled_run_cancels_the_call_at_the_server_and_returns_at_once() {
    let bench = Bench::new();
    let clients = bench.clients(vec![bench.fault("normal", 3_600_000)]);
    let tools = tools_of(&clients).await;
    let hang = tools.iter().find(|tool| tool.spec().name == "fault__hang").unwrap().clone();
    let ctx = bench.ctx();
    let cancel = ctx.cancel.clone();
    let running = tokio::spawn(async move { hang.execute(json!({}), ctx).await });
    // The server has the call once it wrote its record.
    let called = async {
        loop {
            let found = std::fs::read_dir(bench.record())
                .unwrap()
                .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
                .find_map(|name| name.strip_prefix("called-").map(str::to_owned));
            if let Some(id) = found {
                return id;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    let id = tokio::time::timeout(PATIENCE, called).await.expect("the call reaches the server");
    cancel.cancel();
    let out = tokio::time::timeout(PATIENCE, running).await.expect("returns").unwrap();
    assert!(out.is_error && out.text == "cancelled", "{out:?}");
    assert_eq!(bench.recorded(&format!("cancelled-{id}")).await, "the run was cancelled");
    assert_eq!(status(&clients, "fault").calls.get("cancelled"), Some(&1));
    bench.shut_down().await;
}

#[tokio::test]
async fn shutdown_kills_each_servers_whole_process_group() {
    let bench = Bench::new();
    let clients = bench.clients(vec![bench.fault("normal", 60_000)]);
    tools_of(&clients).await;
    let pids = bench.pids(1);
    assert!(pids.iter().all(|pid| alive(*pid)));
    bench.shut_down().await;
    for pid in pids {
        assert!(!alive(pid), "{pid} outlived the shutdown");
    }
    assert!(tools_of(&clients).await.is_empty(), "nothing starts after the shutdown");
}

#[tokio::test]
async fn a_reload_stops_changed_servers_and_keeps_the_others() {
    let bench = Bench::new();
    let kept = bench.fault("normal", 60_000);
    let clients = bench.clients(vec![kept.clone()]);
    tools_of(&clients).await;
    let first = bench.pids(1);

    clients.reload(vec![kept.clone()]);
    assert_eq!(status(&clients, "fault").state, McpServerState::Running, "unchanged: kept");

    let mut changed = kept.clone();
    changed.tools = Some(vec!["echo".to_owned()]);
    clients.reload(vec![changed]);
    assert_eq!(status(&clients, "fault").state, McpServerState::Idle, "changed: idle");
    let gone = async {
        while first.iter().any(|pid| alive(*pid)) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(PATIENCE, gone).await.expect("the old server's group is killed");
    assert_eq!(names(&tools_of(&clients).await), ["fault__echo"]);

    clients.reload(Vec::new());
    assert!(clients.servers().is_empty());
    assert!(tools_of(&clients).await.is_empty());
    bench.shut_down().await;
}

#[tokio::test]
async fn a_server_that_cannot_start_is_skipped_and_says_how_to_fix_it() {
    let bench = Bench::new();
    let missing = McpServerConfig::stdio("missing", "lemon-no-such-mcp-server", &[]);
    let mut unset = bench.fault("normal", 60_000);
    unset.name = "unset".to_owned();
    unset.env.insert("OTHER".to_owned(), "not_a_set_secret".to_owned());
    let mut off = bench.fault("normal", 60_000);
    off.name = "off".to_owned();
    off.enabled = false;
    let clients = bench.clients(vec![missing.clone(), unset, off, bench.fault("normal", 60_000)]);
    let listed = names(&tools_of(&clients).await);
    assert!(listed.iter().all(|name| name.starts_with("fault__")), "{listed:?}");
    assert!(!listed.is_empty());

    let seen = status(&clients, "missing");
    assert_eq!(seen.state, McpServerState::Failed);
    let error = seen.error.unwrap();
    assert!(error.contains("is not on the PATH: install it, or give its full path"), "{error}");
    let error = status(&clients, "unset").error.unwrap();
    assert!(error.contains("the secret not_a_set_secret (env OTHER) is not set"), "{error}");
    assert_eq!(status(&clients, "off").state, McpServerState::Disabled);

    // The second failure in a row waits out a backoff before a third start.
    tools_of(&clients).await;
    let error = probe(&missing, &bench.options()).await.unwrap_err();
    assert!(error.contains("lemon-no-such-mcp-server is not on the PATH"), "{error}");
    let tools = tools_of(&clients).await;
    assert!(!names(&tools).is_empty());
    assert_eq!(status(&clients, "missing").state, McpServerState::Failed);
    bench.shut_down().await;
}

#[test]
fn backoff_grows_from_nothing_to_a_minute() {
    let waits: Vec<u64> = (0..10).map(|n| backoff(n).as_secs()).collect();
    assert_eq!(waits, [0, 0, 1, 2, 4, 8, 16, 32, 60, 60]);
}

#[test]
fn results_become_text_files_and_errors() {
    let bench = Bench::new();
    let ctx = bench.ctx();
    let check = |result: Value, text: &str, is_error: bool| {
        let out = content::output("srv", "t", result, &ctx);
        assert_eq!((out.text.as_str(), out.is_error), (text, is_error));
    };
    check(
        json!({"content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}),
        "a\nb",
        false,
    );
    check(json!({"content": [], "structuredContent": {"x": 1}}), "{\"x\":1}", false);
    check(json!({"content": [], "isError": true}), "the tool failed without saying why", true);
    check(
        json!({"content": "nope"}),
        "MCP server srv answered the call with a malformed result (content is not a list)",
        true,
    );
    check(
        json!([1]),
        "MCP server srv answered the call with something that is not a tool result",
        true,
    );
    check(
        json!({"content": [{"type": "resource", "resource": {"uri": "file:///a", "text": "body"}}]}),
        "[resource file:///a]\nbody",
        false,
    );
    check(
        json!({"content": [{"type": "image", "mimeType": "image/png", "data": "%%%"}]}),
        "[image/png image left out: its data is not base64]",
        false,
    );
    let long = "x".repeat(content::MAX_TEXT_CHARS + 5);
    let out =
        content::output("srv", "t", json!({"content": [{"type": "text", "text": long}]}), &ctx);
    assert!(out.text.ends_with("[cut: 5 more characters]"));
}
