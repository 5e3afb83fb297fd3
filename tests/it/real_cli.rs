//! The real vendor CLIs, at the versions `tests/clis/package.json` pins, run
//! through the gateway binary against the fake LLM on loopback: Claude Code
//! (`ANTHROPIC_BASE_URL`, Anthropic Messages), Codex (a model provider with
//! `base_url` in `$CODEX_HOME/config.toml`, Responses), OpenCode (a provider
//! with `baseURL` in `$OPENCODE_CONFIG`, Chat Completions), Pi (a `models.json`
//! provider, Chat Completions) and Droid (a custom model in
//! `~/.factory/config.json`, used as `custom:Fake-0`). Every CLI gets a HOME
//! of its own in a temporary directory, and its update checks, telemetry and
//! downloads are switched off through its documented settings.
//!
//! For Claude, Codex, OpenCode and Pi: a streamed answer, a resume line that
//! continues the session (the next model request carries the first turn), a
//! tool call of the CLI's own shell tool (an action started and completed, its
//! output in the next model request) and a cancel mid-stream that leaves no
//! process of the CLI's group. Droid: a streamed answer and its resume line
//! (continuing a Droid session needs a Factory login).
//!
//! Each CLI also runs once on its own, and what it prints is compared with the
//! capture in `tests/fixtures/cli/<vendor>/real_<version>_*.jsonl`: every
//! event type and field the gateway's parser reads must still be there.
//! `LEMON_CAPTURE_CLI_FIXTURES=1` rewrites the captures.
//!
//! The CLIs are installed by `scripts/test` into
//! `$LEMON_REAL_CLIS_DIR` (default `~/.cache/lemon-tests/clis`); without them
//! the tests are skipped, unless `LEMON_REQUIRE_REAL_CLIS=1` (which
//! `scripts/test` sets) makes that a failure.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use futures::StreamExt;
use lemon_tests::fake_llm::{FakeLlm, FakeToolCall, RecordedRequest, Turn};
use serde_json::{json, Value};

use crate::support::Gateway;

const PACKAGE_JSON: &str = include_str!("../clis/package.json");
const PACKAGE_LOCK: &str = include_str!("../clis/package-lock.json");

/// The real CLIs start slowly (Node, first-run setup) on a busy machine.
const CLI_PATIENCE: Duration = Duration::from_secs(120);

/// The model the CLIs' side requests (titles, small tasks) go to; answered by
/// a rule so that they never take a turn meant for the main request.
pub(crate) const SMALL_MODEL: &str = "fake-small";

/// What the shell tool runs: its output (`lemon-42`) is not in the command.
const SHELL_COMMAND: &str = "echo lemon-$((6*7))";
const SHELL_OUTPUT: &str = "lemon-42";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cli {
    Claude,
    Codex,
    Opencode,
    Pi,
    Droid,
}

impl Cli {
    fn id(self) -> &'static str {
        match self {
            Cli::Claude => "claude",
            Cli::Codex => "codex",
            Cli::Opencode => "opencode",
            Cli::Pi => "pi",
            Cli::Droid => "droid",
        }
    }

    fn package(self) -> &'static str {
        match self {
            Cli::Claude => "@anthropic-ai/claude-code",
            Cli::Codex => "@openai/codex",
            Cli::Opencode => "opencode-ai",
            Cli::Pi => "@mariozechner/pi-coding-agent",
            Cli::Droid => "@factory/cli",
        }
    }

    /// The pinned version, from `tests/clis/package.json`.
    fn version(self) -> String {
        let manifest: Value = serde_json::from_str(PACKAGE_JSON).expect("tests/clis/package.json");
        manifest["dependencies"][self.package()]
            .as_str()
            .unwrap_or_else(|| panic!("{} is pinned in tests/clis/package.json", self.package()))
            .to_owned()
    }

    /// A call of the CLI's own shell tool running [`SHELL_COMMAND`], its
    /// arguments streamed in two pieces.
    fn shell_call(self) -> FakeToolCall {
        let arguments = match self {
            Cli::Claude | Cli::Opencode => {
                json!({"command": SHELL_COMMAND, "description": "Print a number"})
            }
            Cli::Codex => json!({"cmd": SHELL_COMMAND}),
            Cli::Pi | Cli::Droid => json!({"command": SHELL_COMMAND}),
        }
        .to_string();
        let (head, tail) = arguments.split_at(arguments.len() / 2);
        let name = match self {
            Cli::Claude => "Bash",
            Cli::Codex => "exec_command",
            Cli::Opencode | Cli::Pi => "bash",
            Cli::Droid => "Execute",
        };
        FakeToolCall::new("call_lemon_1", name, &[head, tail])
    }
}

/// The installed CLIs' `node_modules/.bin`, or `None` (the test is skipped)
/// when they are not installed at the pinned versions.
pub(crate) fn installed_clis() -> Option<PathBuf> {
    let root = std::env::var_os("LEMON_REAL_CLIS_DIR").map(PathBuf::from).or_else(|| {
        std::env::var_os("HOME").map(|home| Path::new(&home).join(".cache/lemon-tests/clis"))
    })?;
    // scripts/test writes the lock it installed from once the install is done.
    let lock = std::fs::read_to_string(root.join("installed.lock")).unwrap_or_default();
    if lock == PACKAGE_LOCK && root.join("node_modules/.bin").is_dir() {
        return Some(root.join("node_modules/.bin"));
    }
    assert!(
        std::env::var_os("LEMON_REQUIRE_REAL_CLIS").is_none(),
        "the vendor CLIs of tests/clis are not installed in {}: run scripts/test, which installs them",
        root.display()
    );
    #[allow(clippy::print_stderr)] // The reason a test is skipped is for the person running it.
    {
        eprintln!("skipped: the vendor CLIs of tests/clis are not installed in {}", root.display());
    }
    None
}

/// A CLI's own HOME with its configuration pointing at the fake, and the
/// environment and `[gateway.engines.<id>]` lines that run it.
#[derive(Debug)]
struct Setup {
    cli: Cli,
    program: PathBuf,
    /// The CLI's HOME; the project directory runs use is `proj` in it.
    dir: tempfile::TempDir,
    env: BTreeMap<String, String>,
    /// `[gateway.engines.<id>]` keys besides `cli_path` and `env`.
    section: String,
}

pub(crate) fn toml_str(text: &str) -> String {
    serde_json::to_string(text).expect("a string")
}

impl Setup {
    fn new(cli: Cli, bin: &Path, llm: &FakeLlm) -> Setup {
        let dir = tempfile::tempdir().expect("a temporary HOME");
        let home = dir.path();
        std::fs::create_dir_all(home.join("proj")).expect("the project directory");
        let mut env = BTreeMap::from([("HOME".to_owned(), home.display().to_string())]);
        let mut set = |key: &str, value: &str| env.insert(key.to_owned(), value.to_owned());
        let write = |path: &str, text: String| {
            let path = home.join(path);
            std::fs::create_dir_all(path.parent().expect("a parent")).expect("a config folder");
            std::fs::write(path, text).expect("a CLI's config file");
        };
        let section;
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
                // `--dangerously-skip-permissions` is refused to root; the one
                // tool the tests use is allowed instead.
                section = "allowed_tools = [\"Bash\"]\n".to_owned();
            }
            Cli::Codex => {
                program = bin.join("codex");
                let codex_home = home.join(".codex");
                set("CODEX_HOME", &codex_home.display().to_string());
                set("LEMON_FAKE_LLM_KEY", "sk-fake-key");
                write(
                    ".codex/config.toml",
                    format!(
                        "model = \"fake-model\"\nmodel_provider = \"fake\"\n\
                         check_for_update_on_startup = false\n\n\
                         [model_providers.fake]\nname = \"Fake\"\nbase_url = {}\n\
                         env_key = \"LEMON_FAKE_LLM_KEY\"\nwire_api = \"responses\"\n\n\
                         [analytics]\nenabled = false\n",
                        toml_str(&llm.base_url())
                    ),
                );
                // Started as `codex app-server`, which relays its approvals.
                section = String::new();
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
                    "$schema": "https://opencode.ai/config.json",
                    "autoupdate": false,
                    "share": "disabled",
                    "model": "fake/fake-model",
                    "small_model": format!("fake/{SMALL_MODEL}"),
                    "permission": {"bash": "allow", "edit": "allow", "read": "allow"},
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
                write("opencode.json", format!("{text:#}\n"));
                section = String::new();
            }
            Cli::Pi => {
                program = bin.join("pi");
                let agent_dir = home.join(".pi/agent");
                set("PI_CODING_AGENT_DIR", &agent_dir.display().to_string());
                set("PI_OFFLINE", "1");
                set("PI_SKIP_VERSION_CHECK", "1");
                set("PI_TELEMETRY", "0");
                let text = json!({"providers": {"fake": {
                    "baseUrl": llm.base_url(),
                    "api": "openai-completions",
                    "apiKey": "sk-fake-key",
                    "compat": {"supportsDeveloperRole": false, "supportsReasoningEffort": false},
                    "models": [{"id": "fake-model"}],
                }}});
                write(".pi/agent/models.json", format!("{text:#}\n"));
                section = "provider = \"fake\"\nmodel = \"fake-model\"\n".to_owned();
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
                write(".factory/config.json", format!("{text:#}\n"));
                section =
                    "model = \"custom:Fake-0\"\ndangerously_skip_permissions = true\n".to_owned();
            }
        }
        Setup { cli, program, dir, env, section }
    }

    fn proj(&self) -> PathBuf {
        self.dir.path().join("proj")
    }

    /// The gateway's config: runs in `proj`, the engine on the real CLI; the
    /// owner's rules allow the shell call of [`Cli::shell_call`] and ask
    /// about every other call.
    fn config(&self) -> String {
        let env: Vec<String> =
            self.env.iter().map(|(key, value)| format!("{key} = {}", toml_str(value))).collect();
        format!(
            "[gateway]\ndefault_cwd = {}\n\n[gateway.approvals]\nrules = [\n  {{ tool = \"bash\", match = \"echo lemon-*\", action = \"allow\" }},\n  {{ tool = \"*\", action = \"ask\" }},\n]\n\n[gateway.engines.{}]\ncli_path = {}\ncancel_grace_ms = 3000\n{}env = {{ {} }}\n",
            toml_str(&self.proj().display().to_string()),
            self.cli.id(),
            toml_str(&self.program.display().to_string()),
            self.section,
            env.join(", ")
        )
    }

    /// The command line the engine gives a new run of `prompt` (as
    /// `crates/engines/src/cli/<vendor>.rs` builds it), and its stdin.
    fn direct_args(&self, prompt: &str) -> (Vec<String>, Option<String>) {
        let owned = |args: &[&str]| args.iter().map(|a| (*a).to_owned()).collect::<Vec<_>>();
        match self.cli {
            Cli::Claude => (
                owned(&[
                    "-p",
                    "--output-format",
                    "stream-json",
                    "--input-format",
                    "text",
                    "--verbose",
                    "--allowedTools",
                    "Bash",
                ]),
                Some(format!("{prompt}\n")),
            ),
            Cli::Codex => (
                owned(&[
                    "exec",
                    "--json",
                    "--skip-git-repo-check",
                    "--color=never",
                    "--dangerously-bypass-approvals-and-sandbox",
                    "-c",
                    "model_auto_compact_token_limit=170000",
                    "-",
                ]),
                Some(format!("{prompt}\n")),
            ),
            Cli::Opencode => (owned(&["run", "--format", "json", "--", prompt]), None),
            Cli::Pi => {
                let session = self.dir.path().join(".pi/agent/sessions/capture.jsonl");
                let mut args = owned(&[
                    "--print",
                    "--mode",
                    "json",
                    "--provider",
                    "fake",
                    "--model",
                    "fake-model",
                    "--session",
                ]);
                args.push(session.display().to_string());
                args.push(prompt.to_owned());
                (args, None)
            }
            Cli::Droid => {
                let mut args = owned(&[
                    "exec",
                    "-o",
                    "stream-json",
                    "--skip-permissions-unsafe",
                    "-m",
                    "custom:Fake-0",
                    "--cwd",
                ]);
                args.push(self.proj().display().to_string());
                args.push(prompt.to_owned());
                (args, None)
            }
        }
    }

    /// Runs the CLI on its own (no gateway) with `prompt`: what it printed.
    async fn run_direct(&self, prompt: &str) -> String {
        let (args, stdin) = self.direct_args(prompt);
        let mut command = tokio::process::Command::new(&self.program);
        command
            .args(&args)
            .current_dir(self.proj())
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .envs(&self.env)
            .stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = command.spawn().expect("the CLI starts");
        if let Some(text) = stdin {
            use tokio::io::AsyncWriteExt;
            let mut pipe = child.stdin.take().expect("stdin");
            pipe.write_all(text.as_bytes()).await.expect("the prompt on stdin");
        }
        let output = tokio::time::timeout(CLI_PATIENCE, child.wait_with_output())
            .await
            .unwrap_or_else(|_| panic!("{} ends in time", self.cli.id()))
            .expect("the CLI's output");
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        assert!(
            output.status.success(),
            "{} exited with {}: {}\n{stdout}",
            self.cli.id(),
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
        stdout
    }

    /// `text` with this machine's paths and ports replaced, for a fixture.
    fn normalized(&self, text: &str, llm: &FakeLlm) -> String {
        let home = self.dir.path().display().to_string();
        text.replace(&llm.root_url(), "http://127.0.0.1:8080").replace(&home, "/home/dev")
    }
}

/// A gateway on one CLI and the fake it talks to.
struct Rig {
    setup: Setup,
    llm: FakeLlm,
    gateway: Gateway,
}

impl Rig {
    async fn start(cli: Cli, bin: &Path) -> Rig {
        let llm = FakeLlm::start().await;
        llm.rule_for_model(SMALL_MODEL, Turn::text(&["Fake title"]));
        let setup = Setup::new(cli, bin, &llm);
        let gateway = Gateway::start(&setup.config()).await;
        Rig { setup, llm, gateway }
    }

    fn main_requests(&self) -> Vec<RecordedRequest> {
        main_requests(&self.llm)
    }

    /// Waits until `count` main requests arrived.
    async fn wait_main_requests(&self, count: usize) -> Vec<RecordedRequest> {
        let mut total = self.llm.requests().len();
        loop {
            let main = self.main_requests();
            if main.len() >= count {
                return main;
            }
            total = total.max(self.llm.requests().len()) + 1;
            self.llm.wait_for_requests_for(CLI_PATIENCE, total).await;
        }
    }

    async fn submit(&self, prompt: &str, session: &str) -> String {
        self.gateway
            .submit(
                json!({ "prompt": prompt, "engine": self.setup.cli.id(), "session_key": session }),
            )
            .await
    }

    /// The run's events until `run_completed`, and its record.
    async fn finish(&self, run_id: &str) -> (Vec<(String, Value)>, Value) {
        let events = tokio::time::timeout(CLI_PATIENCE, events(&self.gateway, run_id))
            .await
            .unwrap_or_else(|_| panic!("{}: the run completes in time", self.setup.cli.id()));
        (events, self.gateway.run(run_id).await)
    }
}

/// The model requests of the runs themselves (not the CLIs' side requests).
pub(crate) fn main_requests(llm: &FakeLlm) -> Vec<RecordedRequest> {
    llm.requests()
        .into_iter()
        .filter(|request| request.body.get("model").and_then(Value::as_str) != Some(SMALL_MODEL))
        .collect()
}

/// A run's events over SSE until `run_completed`.
async fn events(gateway: &Gateway, run_id: &str) -> Vec<(String, Value)> {
    let response = gateway.get(&format!("/v1/runs/{run_id}/events")).send().await.unwrap();
    assert_eq!(response.status(), 200);
    let mut parser = lemon_tests::event_stream::EventStream::default();
    let mut stream = response.bytes_stream();
    let mut out = Vec::new();
    while let Some(chunk) = stream.next().await {
        for event in parser.push(&chunk.unwrap()) {
            let data: Value = serde_json::from_str(&event.data).unwrap();
            let done = event.event == "run_completed";
            out.push((event.event, data));
            if done {
                return out;
            }
        }
    }
    panic!("the event stream of {run_id} ended before run_completed: {out:?}");
}

fn deltas(events: &[(String, Value)]) -> String {
    events
        .iter()
        .filter(|(kind, _)| kind == "delta")
        .filter_map(|(_, data)| data["text"].as_str())
        .collect()
}

fn actions(events: &[(String, Value)]) -> Vec<&Value> {
    events
        .iter()
        .filter(|(kind, _)| kind == "engine_action")
        .map(|(_, data)| &data["action"])
        .collect()
}

/// The resume line's prefix of each CLI.
fn resume_prefix(cli: Cli) -> &'static str {
    match cli {
        Cli::Claude => "claude --resume ",
        Cli::Codex => "codex resume ",
        Cli::Opencode => "opencode --session ",
        Cli::Pi => "pi --session ",
        Cli::Droid => "droid exec -s ",
    }
}

/// A streamed answer: its deltas, the completion's answer and resume line.
async fn streamed_answer(rig: &Rig) -> String {
    let id = rig.setup.cli.id();
    rig.llm.push(Turn::text(&["Hello", " from", " the", " fake."]));
    let run_id = rig.submit("Say hello.", "answer").await;
    let (events, record) = rig.finish(&run_id).await;
    assert_eq!(record["status"], "completed", "{id}: {record}\n{events:?}");
    assert_eq!(record["answer"], "Hello from the fake.", "{id}: {record}");
    let streamed = deltas(&events);
    assert!(streamed.contains("Hello from the fake."), "{id}: deltas {streamed:?}");
    assert_eq!(events.first().map(|(kind, _)| kind.as_str()), Some("run_started"), "{id}");
    let line = record["resume_line"].as_str().unwrap_or_default().to_owned();
    assert!(line.starts_with(resume_prefix(rig.setup.cli)), "{id}: resume line {line:?}");
    let main = rig.main_requests();
    let asked = main.last().expect("a request to the fake LLM");
    assert!(asked.body.to_string().contains("Say hello."), "{id}: {}", asked.body);
    line
}

/// The resume line continues the session: the model sees the first turn.
async fn resumed(rig: &Rig, line: &str) {
    let id = rig.setup.cli.id();
    let before = rig.main_requests().len();
    rig.llm.push(Turn::text(&["Still", " here."]));
    let run_id = rig.submit(&format!("{line}\nWhat did you say?"), "resume").await;
    let (events, record) = rig.finish(&run_id).await;
    assert_eq!(record["status"], "completed", "{id}: {record}\n{events:?}");
    assert_eq!(record["answer"], "Still here.", "{id}: {record}");
    let main = rig.main_requests();
    assert!(main.len() > before, "{id}: the resumed run asked the model");
    let history = main[before].body.to_string();
    assert!(history.contains("What did you say?"), "{id}: {history}");
    assert!(
        history.contains("Say hello.") && history.contains("Hello from the fake."),
        "{id}: the resumed request carries the first turn: {history}"
    );
}

/// The CLI runs its own shell tool: the action starts and completes, and the
/// next model request carries the output.
async fn tool_call(rig: &Rig) {
    let id = rig.setup.cli.id();
    let before = rig.main_requests().len();
    rig.llm.push(Turn::tool_calls(vec![rig.setup.cli.shell_call()]));
    rig.llm.push(Turn::text(&["The", " tool", " said", " 42."]));
    let run_id = rig.submit("Run the command.", "tool").await;
    let (events, record) = rig.finish(&run_id).await;
    assert_eq!(record["status"], "completed", "{id}: {record}\n{events:?}");
    assert_eq!(record["answer"], "The tool said 42.", "{id}: {record}");
    let commands: Vec<&Value> =
        actions(&events).into_iter().filter(|action| action["kind"] == "command").collect();
    let completed = commands.iter().find(|action| action["phase"] == "completed");
    let Some(completed) = completed else {
        panic!("{id}: a command action completed: {commands:?}\n{events:?}");
    };
    assert!(
        completed["title"].as_str().unwrap_or_default().contains("lemon-"),
        "{id}: {completed}"
    );
    assert_eq!(completed["ok"], true, "{id}: {completed}");
    let started = commands.iter().find(|action| action["phase"] == "started");
    if rig.setup.cli == Cli::Opencode {
        // `opencode run --format json` prints a tool part only once the tool
        // has finished: the action arrives completed.
        assert!(started.is_none(), "{id}: {commands:?}");
    } else {
        let started = started
            .unwrap_or_else(|| panic!("{id}: a command action started: {commands:?}\n{events:?}"));
        assert_eq!(started["id"], completed["id"], "{id}: {commands:?}");
    }
    let main = rig.main_requests();
    assert!(main.len() >= before + 2, "{id}: the model was asked again after the tool");
    let next = main[before + 1].body.to_string();
    assert!(next.contains(SHELL_OUTPUT), "{id}: the tool's output goes back to the model: {next}");
}

/// (pid, process group, parent, start time) of every process, from /proc.
fn processes() -> Vec<(i32, i32, i32, u64)> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| {
            let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let (_, rest) = text.rsplit_once(')')?;
            let fields: Vec<&str> = rest.split_whitespace().collect();
            if fields[0] == "Z" || fields[0] == "X" {
                return None;
            }
            Some((pid, fields[2].parse().ok()?, fields[1].parse().ok()?, fields[19].parse().ok()?))
        })
        .collect()
}

/// Cancelling a run mid-stream ends it and leaves no process of the CLI's
/// group, nor any process the CLI started.
async fn cancelled(rig: &Rig) {
    let id = rig.setup.cli.id();
    let before = rig.main_requests().len();
    rig.llm.push(Turn::stall(&["Working", " on", " it"]));
    let run_id = rig.submit("Take your time.", "cancel").await;
    rig.wait_main_requests(before + 1).await;
    let gateway_pid = rig.gateway.pid();
    let all = processes();
    let leaders: Vec<i32> = all
        .iter()
        .filter(|(pid, group, parent, _)| *parent == gateway_pid && pid == group)
        .map(|(pid, ..)| *pid)
        .collect();
    assert_eq!(leaders.len(), 1, "{id}: one CLI process group under the gateway: {leaders:?}");
    let group = leaders[0];
    // The CLI's whole family: its group and everything descended from it.
    let mut family: BTreeSet<(i32, u64)> = BTreeSet::new();
    let mut grew = true;
    while grew {
        grew = false;
        for (pid, pgrp, parent, start) in &all {
            let inside = *pgrp == group || family.iter().any(|(p, _)| p == parent);
            if inside && family.insert((*pid, *start)) {
                grew = true;
            }
        }
    }
    let cancel = rig.gateway.post(&format!("/v1/runs/{run_id}/cancel")).send().await.unwrap();
    assert_eq!(cancel.status(), 202, "{id}");
    let (events, record) = rig.finish(&run_id).await;
    assert_eq!(record["status"], "cancelled", "{id}: {record}\n{events:?}");
    // The gateway completes a cancelled run once the group is reaped.
    let left: Vec<_> = processes()
        .into_iter()
        .filter(|(pid, pgrp, _, start)| *pgrp == group || family.contains(&(*pid, *start)))
        .collect();
    assert!(left.is_empty(), "{id}: processes of the cancelled CLI are left: {left:?}");
}

/// Event types and field paths the gateway's parser reads, per CLI, as
/// `<discriminator> <path>` ([`shapes`]).
fn relied_on(cli: Cli) -> &'static [&'static str] {
    match cli {
        Cli::Claude => &[
            "system/init session_id",
            "system/init cwd",
            "system/init model",
            "system/init tools[]",
            "system/init permissionMode",
            "assistant message.content[].type",
            "assistant message.content[].text",
            "assistant message.content[].id",
            "assistant message.content[].name",
            "assistant message.content[].input.command",
            "assistant parent_tool_use_id",
            "user message.content[].type",
            "user message.content[].tool_use_id",
            "user message.content[].content",
            "user message.content[].is_error",
            "result/success is_error",
            "result/success result",
            "result/success session_id",
            "result/success total_cost_usd",
            "result/success duration_ms",
            "result/success num_turns",
            "result/success usage.input_tokens",
            "result/success usage.output_tokens",
        ],
        Cli::Codex => &[
            "thread.started thread_id",
            "turn.started",
            "item.started/command_execution item.id",
            "item.started/command_execution item.command",
            "item.completed/command_execution item.id",
            "item.completed/command_execution item.command",
            "item.completed/command_execution item.exit_code",
            "item.completed/command_execution item.status",
            "item.completed/agent_message item.text",
            "turn.completed usage.input_tokens",
            "turn.completed usage.cached_input_tokens",
            "turn.completed usage.output_tokens",
        ],
        Cli::Opencode => &[
            "step_start/step-start sessionID",
            "tool_use/tool sessionID",
            "tool_use/tool part.callID",
            "tool_use/tool part.tool",
            "tool_use/tool part.state.status",
            "tool_use/tool part.state.input.command",
            "tool_use/tool part.state.output",
            "tool_use/tool part.state.metadata.exit",
            "text/text part.text",
            "step_finish/step-finish part.reason",
        ],
        Cli::Pi => &[
            "session id",
            "tool_execution_start toolCallId",
            "tool_execution_start toolName",
            "tool_execution_start args.command",
            "tool_execution_end toolCallId",
            "tool_execution_end isError",
            "message_end message.role",
            "message_end message.content[].type",
            "message_end message.content[].text",
            "message_end message.stopReason",
            "message_end message.usage.input",
            "message_end message.usage.output",
            "agent_end messages[].role",
        ],
        Cli::Droid => &[
            "system/init session_id",
            "system/init cwd",
            "system/init model",
            "message role",
            "message text",
            "message session_id",
            "completion finalText",
            "completion numTurns",
            "completion durationMs",
            "completion session_id",
        ],
    }
}

/// `<discriminator> <path>` for every field of every JSON line: the
/// discriminator is `type`, with `/subtype`, `/item.type` or `/part.type`
/// where the line has one; a path names object keys with `.` and array
/// elements with `[]`; a line's own `type` is also there alone.
fn shapes(text: &str) -> BTreeSet<String> {
    fn walk(value: &Value, path: String, out: &mut BTreeSet<String>) {
        match value {
            Value::Object(map) if !map.is_empty() => {
                for (key, value) in map {
                    let path = if path.is_empty() { key.clone() } else { format!("{path}.{key}") };
                    walk(value, path, out);
                }
            }
            Value::Array(items) if !items.is_empty() => {
                for item in items {
                    walk(item, format!("{path}[]"), out);
                }
            }
            _ => {
                out.insert(path);
            }
        }
    }
    let mut out = BTreeSet::new();
    for line in text.lines() {
        let Ok(value) = serde_json::from_str::<Value>(line) else { continue };
        let Some(kind) = value.get("type").and_then(Value::as_str) else { continue };
        let sub = ["/subtype", "/item/type", "/part/type"]
            .iter()
            .find_map(|pointer| value.pointer(pointer).and_then(Value::as_str));
        let discriminator = match sub {
            Some(sub) => format!("{kind}/{sub}"),
            None => kind.to_owned(),
        };
        out.insert(discriminator.clone());
        let mut paths = BTreeSet::new();
        walk(&value, String::new(), &mut paths);
        out.extend(paths.into_iter().map(|path| format!("{discriminator} {path}")));
    }
    out
}

/// What a capture run asks the model for: a tool call, then an answer (Droid
/// only answers).
fn script_capture(cli: Cli, llm: &FakeLlm) -> &'static str {
    llm.rule_for_model(SMALL_MODEL, Turn::text(&["Fake title"]));
    if cli == Cli::Droid {
        llm.push(Turn::text(&["Hello", " from", " the", " fake."]));
        "answer"
    } else {
        llm.push(Turn::tool_calls(vec![cli.shell_call()]));
        llm.push(Turn::text(&["The", " tool", " said", " 42."]));
        "tool_call"
    }
}

/// The CLI run on its own prints every shape the parser reads, as its capture
/// in `tests/fixtures/cli/<vendor>/` does; `LEMON_CAPTURE_CLI_FIXTURES=1`
/// rewrites the capture first.
async fn shapes_match_the_capture(cli: Cli, bin: &Path) {
    let id = cli.id();
    let llm = FakeLlm::start().await;
    let scenario = script_capture(cli, &llm);
    let setup = Setup::new(cli, bin, &llm);
    let live = setup.run_direct("Run the command.").await;
    let fixture =
        lemon_tests::fake_cli::fixture(id, &format!("real_{}_{scenario}.jsonl", cli.version()));
    if std::env::var_os("LEMON_CAPTURE_CLI_FIXTURES").is_some_and(|v| v == "1") {
        std::fs::write(&fixture, setup.normalized(&live, &llm)).expect("the capture is written");
    }
    let captured = std::fs::read_to_string(&fixture).unwrap_or_else(|_| {
        panic!(
            "{} is missing: run the test with LEMON_CAPTURE_CLI_FIXTURES=1 to capture it",
            fixture.display()
        )
    });
    let (live, captured) = (shapes(&live), shapes(&captured));
    let needed: BTreeSet<&str> = relied_on(cli).iter().copied().collect();
    let not_captured: Vec<&&str> = needed.iter().filter(|s| !captured.contains(**s)).collect();
    assert!(
        not_captured.is_empty(),
        "{id}: the capture lacks what the parser reads: {not_captured:?}"
    );
    let changed: Vec<&&str> = needed.iter().filter(|s| !live.contains(**s)).collect();
    assert!(
        changed.is_empty(),
        "{id} {}: the CLI no longer prints what the parser reads (in {}): {changed:?}\nit prints: {live:#?}",
        cli.version(),
        fixture.display(),
    );
}

/// One CLI's checks through the gateway, beside its shape check.
async fn through_the_gateway(cli: Cli) {
    let Some(bin) = installed_clis() else { return };
    let checks = async {
        let rig = Rig::start(cli, &bin).await;
        let line = streamed_answer(&rig).await;
        if cli == Cli::Droid {
            // The line names the session Droid reported.
            let token = line.strip_prefix(resume_prefix(cli)).unwrap_or_default();
            assert!(!token.is_empty() && !token.contains(char::is_whitespace), "{line}");
            return;
        }
        resumed(&rig, &line).await;
        tool_call(&rig).await;
        cancelled(&rig).await;
        rig.gateway.terminate().await;
    };
    tokio::join!(checks, shapes_match_the_capture(cli, &bin));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_claude_code_answers_resumes_runs_tools_and_cancels() {
    through_the_gateway(Cli::Claude).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_codex_answers_resumes_runs_tools_and_cancels() {
    through_the_gateway(Cli::Codex).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_opencode_answers_resumes_runs_tools_and_cancels() {
    through_the_gateway(Cli::Opencode).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_pi_answers_resumes_runs_tools_and_cancels() {
    through_the_gateway(Cli::Pi).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_droid_answers_with_a_custom_model_and_names_its_session() {
    through_the_gateway(Cli::Droid).await;
}

/// Reads a run's events until its approval request arrives; the request.
async fn asked(gateway: &Gateway, run_id: &str) -> Value {
    crate::approvals_e2e::until_asked_within(gateway, run_id, CLI_PATIENCE).await
}

/// A call of `cli`'s shell tool that makes `file`; each call has its own id
/// (Claude drops a call whose id it has seen).
fn touch_call(cli: Cli, file: &str) -> FakeToolCall {
    let command = format!("touch {file}");
    let (name, input) = match cli {
        Cli::Claude => ("Bash", json!({ "command": command, "description": "Make a file" })),
        Cli::Codex => ("exec_command", json!({ "cmd": command })),
        _ => ("bash", json!({ "command": command, "description": "Make a file" })),
    };
    let id = format!("toolu_lemon_{}", file.trim_end_matches(".txt"));
    FakeToolCall::new(&id, name, &[&input.to_string()])
}

/// A CLI run under the default policy asks the owner about its shell call
/// through the gateway (Claude Code through `--permission-prompt-tool` and
/// the MCP endpoint, Codex through `codex app-server`, OpenCode through
/// `opencode serve`): the call waits, runs once approved and not at all once
/// denied, and the run completes with the model's answer.
async fn asks_the_owner(cli: Cli) {
    let Some(bin) = installed_clis() else { return };
    let id = cli.id();
    let llm = FakeLlm::start().await;
    llm.rule_for_model(SMALL_MODEL, Turn::text(&["Fake title"]));
    let mut setup = Setup::new(cli, &bin, &llm);
    // Nothing pre-allowed or skipped: every call the CLI would run is judged.
    setup.section = String::new();
    let gateway = Gateway::start(&setup.config()).await;
    let decide = |id: String, decision: &'static str| {
        let request = gateway.post(&format!("/v1/approvals/{id}"));
        async move {
            let response = request.json(&json!({ "decision": decision })).send().await.unwrap();
            assert_eq!(response.status(), 200, "{}", response.text().await.unwrap());
        }
    };

    for (file, decision, answer) in
        [("approved.txt", "approve", "Made it."), ("denied.txt", "deny", "Not made.")]
    {
        llm.push(Turn::tool_calls(vec![touch_call(cli, file)]));
        llm.push(Turn::text(&[answer]));
        let run_id =
            gateway.submit(json!({ "prompt": format!("Make {file}."), "engine": id })).await;
        let request = asked(&gateway, &run_id).await;
        assert_eq!(
            request["tool"].as_str().map(str::to_lowercase).as_deref(),
            Some("bash"),
            "{id}: {request}"
        );
        assert_eq!(request["subject"], format!("touch {file}"), "{id}: {request}");
        assert_eq!(request["rule"], "tool = \"*\", action = \"ask\"", "{id}: {request}");
        assert!(!setup.proj().join(file).exists(), "{id}: nothing runs before the answer");
        decide(request["id"].as_str().unwrap().to_owned(), decision).await;
        let (events, record) = tokio::time::timeout(CLI_PATIENCE, async {
            (events(&gateway, &run_id).await, gateway.run(&run_id).await)
        })
        .await
        .unwrap_or_else(|_| panic!("{id}: the run completes in time"));
        let approved = decision == "approve";
        assert_eq!(setup.proj().join(file).exists(), approved, "{id}: {file}\n{events:?}");
        let settled: Vec<&Value> = actions(&events)
            .into_iter()
            .filter(|a| a["kind"] == "approval" && a["phase"] == "completed")
            .collect();
        assert_eq!(settled.len(), 1, "{id}: {events:?}");
        assert_eq!(settled[0]["ok"], approved, "{id}: {settled:?}");
        assert_eq!(record["status"], "completed", "{id}: {record}\n{events:?}");
        assert_eq!(record["answer"], answer, "{id}: {record}");
        if !approved && cli != Cli::Codex {
            // The model reads the refusal as the call's result (Codex tells
            // its model the call was declined, in its own words).
            let told = main_requests(&llm).iter().any(|request| {
                request.body.to_string().contains("The owner denied this call (api via api)")
            });
            assert!(told, "{id}: no request carried the refusal");
        }
    }
    gateway.terminate().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_claude_code_asks_the_owner_before_its_tool_runs() {
    asks_the_owner(Cli::Claude).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_codex_asks_the_owner_before_its_command_runs() {
    asks_the_owner(Cli::Codex).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_opencode_asks_the_owner_before_its_command_runs() {
    asks_the_owner(Cli::Opencode).await;
}
