//! The gateway's own tools reach the real vendor CLIs over MCP: a run of
//! Claude Code, Codex, OpenCode or Droid (the versions `tests/clis/package.json`
//! pins) in a Telegram chat's session, whose model (the fake LLM) calls the
//! gateway's `cron` tool as the CLI names it (`mcp__lemon__cron`; `cron` in
//! Codex's namespace `mcp__lemon`; `lemon_cron`; `lemon___cron`), makes a
//! cron job bound to that session;
//! the run's token never shows on the CLI's command line, and once the run is
//! over `/mcp` refuses it with a 401.
//!
//! Each CLI is started through a wrapper (its `cli_path`) that writes down
//! its command line and where its token is (Claude's `--mcp-config` file,
//! Codex's `LEMON_MCP_TOKEN`, OpenCode's `OPENCODE_CONFIG_CONTENT`, Droid's
//! `--settings` file), then execs the real CLI. Codex runs both ways
//! the gateway starts it: `codex exec` (no rule may refuse a call) and `codex
//! app-server` (the owner's rules are relayed).
//!
//! Skipped, like `real_cli`, when the CLIs are not installed, unless
//! `LEMON_REQUIRE_REAL_CLIS=1`.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use futures::StreamExt;
use lemon_tests::fake_llm::{FakeLlm, FakeToolCall, RecordedRequest, Turn};
use serde_json::{json, Value};

use crate::real_cli::{installed_clis, main_requests, toml_str, SMALL_MODEL};
use crate::support::Gateway;

/// The real CLIs start slowly (Node, first-run setup) on a busy machine.
const CLI_PATIENCE: Duration = Duration::from_secs(120);

/// The session of a Telegram direct chat (bot 123456, chat 4242).
const CHAT_SESSION: &str = "agent:main:telegram:123456:dm:4242";

/// The name of the job the model makes.
const JOB: &str = "mcp-digest";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cli {
    Claude,
    Codex,
    Opencode,
    Droid,
}

impl Cli {
    fn id(self) -> &'static str {
        match self {
            Cli::Claude => "claude",
            Cli::Codex => "codex",
            Cli::Opencode => "opencode",
            Cli::Droid => "droid",
        }
    }

    /// A call of the gateway's `cron` tool as the CLI shows it to its
    /// model: Claude's `mcp__lemon__cron`; Codex's `cron` in the Responses
    /// namespace `mcp__lemon`.
    fn cron_call(self, arguments: &str) -> FakeToolCall {
        match self {
            Cli::Claude => FakeToolCall::new("call_lemon_cron_1", "mcp__lemon__cron", &[arguments]),
            Cli::Codex => FakeToolCall::new("call_lemon_cron_1", "cron", &[arguments])
                .in_namespace("mcp__lemon"),
            Cli::Opencode => FakeToolCall::new("call_lemon_cron_1", "lemon_cron", &[arguments]),
            Cli::Droid => FakeToolCall::new("call_lemon_cron_1", "lemon___cron", &[arguments]),
        }
    }
}

/// A CLI's own HOME pointing it at the fake, the wrapper that records how it
/// was started, and the gateway's config that runs it.
struct Setup {
    cli: Cli,
    dir: tempfile::TempDir,
    /// `[gateway.engines.<id>]` and `[gateway.approvals]` lines.
    config: String,
}

impl Setup {
    /// `rules`: the owner's `[gateway.approvals]` rules, as TOML.
    fn new(cli: Cli, bin: &Path, llm: &FakeLlm, rules: &str) -> Setup {
        let dir = tempfile::tempdir().expect("a temporary HOME");
        let home = dir.path();
        std::fs::create_dir_all(home.join("proj")).expect("the project directory");
        std::fs::create_dir_all(home.join("seen")).expect("the wrapper's notes");
        let mut env = vec![("HOME".to_owned(), home.display().to_string())];
        let mut set = |key: &str, value: &str| env.push((key.to_owned(), value.to_owned()));
        let program;
        match cli {
            Cli::Claude => {
                program = bin.join("claude");
                set("ANTHROPIC_BASE_URL", &llm.root_url());
                set("ANTHROPIC_API_KEY", "sk-ant-fake-key");
                set("ANTHROPIC_SMALL_FAST_MODEL", SMALL_MODEL);
                set("ANTHROPIC_DEFAULT_HAIKU_MODEL", SMALL_MODEL);
                set("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1");
                set("DISABLE_AUTOUPDATER", "1");
                set("DISABLE_TELEMETRY", "1");
                set("DISABLE_ERROR_REPORTING", "1");
            }
            Cli::Codex => {
                program = bin.join("codex");
                let codex_home = home.join(".codex");
                set("CODEX_HOME", &codex_home.display().to_string());
                set("LEMON_FAKE_LLM_KEY", "sk-fake-key");
                std::fs::create_dir_all(&codex_home).expect("CODEX_HOME");
                std::fs::write(
                    codex_home.join("config.toml"),
                    format!(
                        "model = \"fake-model\"\nmodel_provider = \"fake\"\n\
                         check_for_update_on_startup = false\n\n\
                         [model_providers.fake]\nname = \"Fake\"\nbase_url = {}\n\
                         env_key = \"LEMON_FAKE_LLM_KEY\"\nwire_api = \"responses\"\n\n\
                         [analytics]\nenabled = false\n",
                        toml_str(&llm.base_url())
                    ),
                )
                .expect("codex's config");
            }
            Cli::Opencode => {
                program = bin.join("opencode");
                let config = home.join("opencode.json");
                set("OPENCODE_CONFIG", &config.display().to_string());
                for flag in [
                    "OPENCODE_DISABLE_AUTOUPDATE",
                    "OPENCODE_DISABLE_MODELS_FETCH",
                    "OPENCODE_DISABLE_LSP_DOWNLOAD",
                    "OPENCODE_DISABLE_DEFAULT_PLUGINS",
                    "OPENCODE_DISABLE_SHARE",
                    "OPENCODE_DISABLE_CLAUDE_CODE",
                ] {
                    set(flag, "1");
                }
                let text = json!({
                    "autoupdate": false,
                    "share": "disabled",
                    "model": "fake/fake-model",
                    "small_model": format!("fake/{SMALL_MODEL}"),
                    "provider": {"fake": {
                        "npm": "@ai-sdk/openai-compatible",
                        "name": "Fake",
                        "options": {"baseURL": llm.base_url(), "apiKey": "sk-fake-key"},
                        "models": {
                            "fake-model": {"name": "Fake model"},
                            SMALL_MODEL: {"name": "Fake small model"},
                        },
                    }},
                });
                std::fs::write(config, format!("{text:#}\n")).expect("opencode's config");
            }
            Cli::Droid => {
                program = bin.join("droid");
                let text = json!({"custom_models": [{
                    "model_display_name": "Fake",
                    "model": "fake-model",
                    "base_url": llm.base_url(),
                    "api_key": "sk-fake-key",
                    "provider": "generic-chat-completion-api",
                    "max_tokens": 4096,
                }]});
                std::fs::create_dir_all(home.join(".factory")).expect("droid's folder");
                std::fs::write(home.join(".factory/config.json"), format!("{text:#}\n"))
                    .expect("droid's config");
            }
        }
        let section = match cli {
            Cli::Droid => "model = \"custom:Fake-0\"\ndangerously_skip_permissions = true\n",
            _ => "",
        };
        let wrapper = write_wrapper(home, &program);
        let env: Vec<String> =
            env.iter().map(|(key, value)| format!("{key} = {}", toml_str(value))).collect();
        let config = format!(
            "[gateway]\ndefault_cwd = {}\n\n[gateway.approvals]\nrules = {rules}\n\n\
             [gateway.engines.{}]\ncli_path = {}\ncancel_grace_ms = 3000\n{section}env = {{ {} }}\n",
            toml_str(&home.join("proj").display().to_string()),
            cli.id(),
            toml_str(&wrapper.display().to_string()),
            env.join(", ")
        );
        Setup { cli, dir, config }
    }

    /// What the wrapper wrote down as `name`.
    fn seen(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.path().join("seen").join(name))
            .unwrap_or_else(|_| panic!("{}: the wrapper wrote {name}", self.cli.id()))
    }

    /// The run's token, as the CLI got it.
    fn token(&self) -> String {
        match self.cli {
            Cli::Claude => {
                let config: Value = serde_json::from_str(&self.seen("mcp-config")).unwrap();
                let header = config["mcpServers"]["lemon"]["headers"]["Authorization"]
                    .as_str()
                    .expect("the lemon server's Authorization header")
                    .to_owned();
                header.strip_prefix("Bearer ").expect("a bearer token").to_owned()
            }
            Cli::Codex => self.seen("token").trim().to_owned(),
            Cli::Opencode | Cli::Droid => {
                let (file, pointer) = match self.cli {
                    Cli::Opencode => ("opencode-config", "/mcp/lemon/headers/Authorization"),
                    _ => ("settings", "/mcp/mcpServers/lemon/headers/Authorization"),
                };
                let config: Value = serde_json::from_str(&self.seen(file)).unwrap();
                let header = config.pointer(pointer).and_then(Value::as_str).expect("a header");
                header.strip_prefix("Bearer ").expect("a bearer token").to_owned()
            }
        }
    }
}

/// A script that writes down the CLI's arguments and its token's place in
/// `<home>/seen`, then execs `program` with the same arguments and stdin.
fn write_wrapper(home: &Path, program: &Path) -> PathBuf {
    let seen = home.join("seen");
    let seen = seen.display();
    let script = format!(
        "#!/bin/sh\nprintf '%s\\n' \"$@\" > '{seen}/argv'\n\
         prev=\nfor a in \"$@\"; do\n  if [ \"$prev\" = --mcp-config ]; then\n    \
         stat -c %a \"$a\" > '{seen}/mcp-config-mode'\n    cat \"$a\" > '{seen}/mcp-config'\n  fi\n  \
         if [ \"$prev\" = --settings ]; then cat \"$a\" > '{seen}/settings'; fi\n  \
         prev=\"$a\"\ndone\n\
         [ -n \"$LEMON_MCP_TOKEN\" ] && printf '%s' \"$LEMON_MCP_TOKEN\" > '{seen}/token'\n\
         [ -n \"$OPENCODE_CONFIG_CONTENT\" ] && printf '%s' \"$OPENCODE_CONFIG_CONTENT\" > '{seen}/opencode-config'\n\
         exec '{}' \"$@\"\n",
        program.display()
    );
    let path = home.join("cli-wrapper");
    std::fs::write(&path, script).expect("the wrapper");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("executable");
    path
}

/// The names of the tools a model request offered, wherever the API puts them.
fn offered_tools(request: &RecordedRequest) -> Vec<String> {
    let tools = request.body.get("tools").and_then(Value::as_array).cloned().unwrap_or_default();
    tools
        .iter()
        .flat_map(|tool| {
            let own = tool
                .get("name")
                .or_else(|| tool.pointer("/function/name"))
                .and_then(Value::as_str)
                .map(str::to_owned);
            let nested: Vec<String> = tool
                .get("tools")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|inner| inner.get("name").and_then(Value::as_str))
                .map(|inner| format!("{}/{inner}", own.as_deref().unwrap_or("?")))
                .collect();
            own.into_iter().chain(nested)
        })
        .collect()
}

/// The tool calls and their outputs a model request carries, as text.
fn call_outputs(body: &Value) -> String {
    let input = body.get("input").or_else(|| body.get("messages")).and_then(Value::as_array);
    let items: Vec<String> = input
        .into_iter()
        .flatten()
        .filter(|item| {
            let kind = item.get("type").and_then(Value::as_str).unwrap_or_default();
            kind.contains("function_call")
                || item.get("role").and_then(Value::as_str) == Some("tool")
                || item.to_string().contains("tool_result")
        })
        .map(Value::to_string)
        .collect();
    items.join("\n")
}

/// The run's record once its event stream has said `run_completed`.
async fn completed(gateway: &Gateway, run_id: &str) -> Value {
    let stream = async {
        let response = gateway.get(&format!("/v1/runs/{run_id}/events")).send().await.unwrap();
        assert_eq!(response.status(), 200);
        let mut parser = lemon_tests::event_stream::EventStream::default();
        let mut chunks = response.bytes_stream();
        while let Some(chunk) = chunks.next().await {
            if parser.push(&chunk.unwrap()).iter().any(|event| event.event == "run_completed") {
                return;
            }
        }
        panic!("the event stream of {run_id} ended before run_completed");
    };
    tokio::time::timeout(CLI_PATIENCE, stream).await.expect("the run completes in time");
    gateway.run(run_id).await
}

/// A run of `cli` in the chat's session whose model calls the gateway's
/// `cron` tool makes a job bound to that session; the token was never on
/// the command line and is refused once the run is over.
async fn the_gateways_cron_tool_acts_for_the_runs_session(cli: Cli, rules: &str) {
    let Some(bin) = installed_clis() else { return };
    let id = cli.id();
    let llm = FakeLlm::start().await;
    llm.rule_for_model(SMALL_MODEL, Turn::text(&["Fake title"]));
    let setup = Setup::new(cli, &bin, &llm, rules);
    let gateway = Gateway::start(&setup.config).await;

    let args = json!({
        "action": "add",
        "name": JOB,
        "schedule": "every 30m",
        "prompt": "Summarise the day.",
        "sessionKey": "agent:main:main",
    })
    .to_string();
    llm.push(Turn::tool_calls(vec![cli.cron_call(&args)]));
    llm.push(Turn::text(&["Scheduled."]));
    let run_id = gateway
        .submit(
            json!({ "prompt": "Schedule my digest.", "engine": id, "session_key": CHAT_SESSION }),
        )
        .await;
    let record = completed(&gateway, &run_id).await;
    let main = main_requests(&llm);
    let offered = main.first().map(offered_tools).unwrap_or_default();
    assert_eq!(record["status"], "completed", "{id}: {record}\noffered: {offered:?}");
    assert_eq!(record["answer"], "Scheduled.", "{id}: {record}");

    let jobs: Value = gateway.get("/v1/cron").send().await.unwrap().json().await.unwrap();
    let jobs = jobs["jobs"].as_array().cloned().unwrap_or_default();
    let job = jobs.iter().find(|job| job["name"] == JOB);
    let Some(job) = job else {
        let results: Vec<String> = main.iter().skip(1).map(|r| call_outputs(&r.body)).collect();
        panic!("{id}: no job {JOB} in {jobs:?}\noffered: {offered:?}\nnext requests: {results:?}");
    };
    assert_eq!(job["sessionKey"], CHAT_SESSION, "{id}: the job is the chat's: {job}");
    assert_eq!(job["prompt"], "Summarise the day.", "{id}: {job}");

    let token = setup.token();
    assert_eq!(token.len(), 64, "{id}: a run token");
    let argv = setup.seen("argv");
    assert!(!argv.contains(&token), "{id}: the token is on the command line: {argv}");
    if cli == Cli::Claude {
        assert_eq!(setup.seen("mcp-config-mode").trim(), "600", "claude's config file is private");
        let file = argv.lines().skip_while(|arg| *arg != "--mcp-config").nth(1).unwrap();
        assert!(!Path::new(file).exists(), "claude's config file is removed with the run");
    }
    let refused = reqwest::Client::new()
        .post(format!("{}/mcp", gateway.api))
        .bearer_auth(&token)
        .header("Accept", "application/json, text/event-stream")
        .json(&json!({ "jsonrpc": "2.0", "id": 1, "method": "tools/list" }))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 401, "{id}: a finished run's token opens nothing");
    gateway.terminate().await;
}

/// Every call runs (`rules = []`): Claude asks nothing; Codex runs as `codex exec`.
const NO_RULES: &str = "[]";
/// The gateway's `cron` is allowed, anything else asked: Claude asks through
/// `approve`; Codex runs as `codex app-server`.
/// Claude names the tool `mcp__lemon__cron` in its permission prompt; the
/// gateway judges a Codex call by the tool's own name, `cron`.
const CRON_ALLOWED: &str = "[\n  { tool = \"mcp__lemon__cron\", action = \"allow\" },\n  { tool = \"cron\", action = \"allow\" },\n  { tool = \"*\", action = \"ask\" },\n]";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_claude_code_calls_the_gateways_cron_for_its_chat() {
    the_gateways_cron_tool_acts_for_the_runs_session(Cli::Claude, CRON_ALLOWED).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_codex_exec_calls_the_gateways_cron_for_its_chat() {
    the_gateways_cron_tool_acts_for_the_runs_session(Cli::Codex, NO_RULES).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_codex_app_server_calls_the_gateways_cron_for_its_chat() {
    the_gateways_cron_tool_acts_for_the_runs_session(Cli::Codex, CRON_ALLOWED).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_opencode_calls_the_gateways_cron_for_its_chat() {
    the_gateways_cron_tool_acts_for_the_runs_session(Cli::Opencode, NO_RULES).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_droid_calls_the_gateways_cron_for_its_chat() {
    the_gateways_cron_tool_acts_for_the_runs_session(Cli::Droid, NO_RULES).await;
}
