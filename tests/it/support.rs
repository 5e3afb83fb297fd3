//! Starting the real `lemon-gateway` binary on ephemeral ports with a private
//! `LEMON_HOME`, and talking to it.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// The API token every test gateway uses.
pub(crate) const TOKEN: &str = "test-token-0123456789";

/// Generous bound for anything a test waits for; a hang fails instead of blocking.
pub(crate) const PATIENCE: Duration = Duration::from_secs(60);

pub(crate) fn gateway_bin() -> &'static str {
    env!("CARGO_BIN_EXE_lemon-gateway-e2e")
}

/// A running gateway process.
/// The gateway's ready line, plain: `line` itself, or with `--log-format
/// json` the JSON object saying it, written as the plain line would be.
pub(crate) fn ready_line(line: &str) -> Option<String> {
    if line.starts_with("lemon-gateway ready") {
        return Some(line.to_owned());
    }
    let value: serde_json::Value = serde_json::from_str(line).ok()?;
    let fields = value["fields"].as_object()?;
    if fields.get("message")? != "lemon-gateway ready" {
        return None;
    }
    let mut plain = "lemon-gateway ready".to_owned();
    for (key, at) in fields.iter().filter(|(key, _)| *key != "message") {
        plain.push_str(&format!(" {key}={}", at.as_str()?));
    }
    Some(plain)
}

pub(crate) struct Gateway {
    pub(crate) child: Child,
    pub(crate) api: String,
    pub(crate) health: String,
    /// Where the webhook listener bound (`127.0.0.1:PORT`), when the ready
    /// line names one: tests give it port 0 so no other process can take it.
    pub(crate) webhook: Option<String>,
    pub(crate) home: PathBuf,
    pub(crate) http: reqwest::Client,
    /// Kept so the directory outlives the process when the test owns it.
    _dir: Option<tempfile::TempDir>,
}

/// The owner's rules as `rules = []`: every call runs unasked, for tests of
/// what a tool does rather than whether it may (the defaults ask about every
/// side effect; `approvals_e2e` tests them).
pub(crate) const ALLOW_EVERY_CALL: &str = "\n[gateway.approvals]\nrules = []\n";

/// [`ALLOW_EVERY_CALL`] for untrusted runs too (a webhook's): a vendor CLI
/// replaying a fixture is then run as it always was, never through its
/// approval relay.
pub(crate) const TRUST_EVERY_CALL: &str = "\n[gateway.approvals]\nrules = []\nuntrusted = []\n";

/// A fresh `LEMON_HOME` with `config` (ports default to 0 unless the config sets them).
pub(crate) fn home_with(config: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path(), config);
    dir
}

pub(crate) fn write_config(home: &Path, config: &str) {
    let mut text = config.to_owned();
    if !text.contains("[gateway.api]") {
        text.push_str("\n[gateway.api]\nport = 0\n");
    }
    if !text.contains("[gateway.health]") {
        text.push_str("\n[gateway.health]\nport = 0\n");
    }
    std::fs::write(home.join("config.toml"), text).unwrap();
}

pub(crate) fn command(home: &Path) -> Command {
    command_with_path(home, &std::env::var("PATH").unwrap_or_default())
}

/// Runs a command made by [`command`] with no stdin, within the tests'
/// patience: whether it succeeded, and its stdout then stderr.
pub(crate) async fn output_text(mut command: Command) -> (bool, String) {
    command.stdin(std::process::Stdio::null());
    let output = tokio::time::timeout(PATIENCE, command.output())
        .await
        .expect("the command ends in time")
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), text)
}

/// The gateway binary with `path` as its `PATH` (e.g. with the fake CLI first).
pub(crate) fn command_with_path(home: &Path, path: &str) -> Command {
    configure(Command::new(gateway_bin()), home, path)
}

/// The gateway binary run by `prefix` (a program and its first arguments,
/// which end by running the binary).
pub(crate) fn command_through(home: &Path, prefix: &[std::ffi::OsString]) -> Command {
    let (program, args) = prefix.split_first().expect("a program");
    let mut command = Command::new(program);
    command.args(args).arg(gateway_bin());
    configure(command, home, &std::env::var("PATH").unwrap_or_default())
}

/// The gateway binary with `args` on a terminal of its own: `script` gives it
/// a pseudo-terminal as stdin, stdout and stderr, fed from this command's
/// stdin and copied to its stdout.
pub(crate) fn command_on_terminal(home: &Path, args: &[&str]) -> Command {
    let quote = |word: &str| format!("'{}'", word.replace('\'', "'\\''"));
    let line = std::iter::once(gateway_bin().to_owned())
        .chain(args.iter().map(|arg| (*arg).to_owned()))
        .map(|word| quote(&word))
        .collect::<Vec<_>>()
        .join(" ");
    let mut command = Command::new("script");
    command.args(["-q", "-f", "-e", "-c", &line, "/dev/null"]);
    configure(command, home, &std::env::var("PATH").unwrap_or_default())
}

/// The gateway binary started through `prlimit` with descriptor limits `soft`
/// and `hard`.
pub(crate) fn command_with_descriptor_limit(home: &Path, soft: u64, hard: u64) -> Command {
    let mut command = Command::new("prlimit");
    command.arg(format!("--nofile={soft}:{hard}")).arg("--").arg(gateway_bin());
    configure(command, home, &std::env::var("PATH").unwrap_or_default())
}

fn configure(mut command: Command, home: &Path, path: &str) -> Command {
    command
        .env_clear()
        .env("PATH", path)
        .env("HOME", home)
        .env("LEMON_HOME", home)
        .env("LEMON_API_TOKEN", TOKEN)
        .env("LEMON_LOG", "warn")
        // The user's own keychain is never touched; tests that use one say so.
        .env("LEMON_KEYCHAIN", "off")
        .kill_on_drop(true);
    command
}

/// Starts the gateway on `home` expecting it to refuse to start: its exit code
/// and what it wrote to stderr.
pub(crate) async fn failed_start(home: &Path) -> (Option<i32>, String) {
    let output = command(home).stdout(Stdio::piped()).stderr(Stdio::piped()).output();
    let output =
        tokio::time::timeout(PATIENCE, output).await.expect("the gateway exits in time").unwrap();
    (output.status.code(), String::from_utf8_lossy(&output.stderr).into_owned())
}

impl Gateway {
    /// Starts a gateway on a new home with `config`.
    pub(crate) async fn start(config: &str) -> Gateway {
        let dir = home_with(config);
        let mut gateway = Gateway::start_in(dir.path()).await;
        gateway._dir = Some(dir);
        gateway
    }

    /// Starts a gateway on an existing home (its config.toml stays as is).
    pub(crate) async fn start_in(home: &Path) -> Gateway {
        Gateway::spawn(command(home), home).await
    }

    /// Starts a gateway on a new home with `config` and `path` as its `PATH`.
    pub(crate) async fn start_with_path(config: &str, path: &str) -> Gateway {
        let dir = home_with(config);
        let mut gateway = Gateway::spawn(command_with_path(dir.path(), path), dir.path()).await;
        gateway._dir = Some(dir);
        gateway
    }

    /// Starts `command` (a gateway on `home`) and waits for its ready line.
    pub(crate) async fn spawn(command: Command, home: &Path) -> Gateway {
        Gateway::spawn_with_stderr(command, home, Stdio::inherit()).await
    }

    /// Starts `command` (from [`command`] or [`command_with_path`]) with its log
    /// (stderr) going to `stderr`.
    pub(crate) async fn spawn_with_stderr(
        mut command: Command,
        home: &Path,
        stderr: Stdio,
    ) -> Gateway {
        let mut child = command.stdout(Stdio::piped()).stderr(stderr).spawn().unwrap();
        let stdout = child.stdout.take().unwrap();
        let mut lines = BufReader::new(stdout).lines();
        let ready = tokio::time::timeout(PATIENCE, async {
            loop {
                let line =
                    lines.next_line().await.unwrap().expect("gateway exited before it was ready");
                if let Some(ready) = ready_line(&line) {
                    return ready;
                }
            }
        })
        .await
        .expect("gateway ready in time");
        Gateway::ready(child, &ready, home)
    }

    /// Starts `command` (from [`command`]) with its stdout and stderr appended
    /// to the file `log`, as a service manager or `nohup` would, and waits for
    /// the ready line there.
    pub(crate) async fn spawn_logging_to(mut command: Command, home: &Path, log: &Path) -> Gateway {
        let file = std::fs::OpenOptions::new().create(true).append(true).open(log).unwrap();
        let mut child = command.stdout(file.try_clone().unwrap()).stderr(file).spawn().unwrap();
        let ready = tokio::time::timeout(PATIENCE, async {
            loop {
                let text = std::fs::read_to_string(log).unwrap_or_default();
                if let Some(line) = text.lines().find_map(ready_line) {
                    return line;
                }
                if let Some(status) = child.try_wait().unwrap() {
                    panic!("gateway exited ({status}) before it was ready:\n{text}");
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .expect("gateway ready in time");
        Gateway::ready(child, &ready, home)
    }

    /// The gateway whose ready line (as [`ready_line`] gives it) is `ready`.
    fn ready(child: Child, ready: &str, home: &Path) -> Gateway {
        let field = |name: &str| -> String {
            ready
                .split_whitespace()
                .find_map(|w| w.strip_prefix(name))
                .expect("address in ready line")
                .to_owned()
        };
        Gateway {
            child,
            api: field("api="),
            health: field("health="),
            webhook: ready.split_whitespace().find_map(|w| {
                w.strip_prefix("webhook=http://")?.strip_suffix("/webhooks/").map(str::to_owned)
            }),
            home: home.to_owned(),
            http: reqwest::Client::new(),
            _dir: None,
        }
    }

    /// The URL of webhook integration `id` on the listener the gateway bound.
    pub(crate) fn webhook_url(&self, id: &str) -> String {
        let addr = self.webhook.as_deref().expect("the ready line names the webhook's address");
        format!("http://{addr}/webhooks/{id}")
    }

    /// Posts `body` to webhook integration `id` with `token`, waiting at most
    /// [`PATIENCE`] for the answer.
    pub(crate) async fn post_webhook(
        &self,
        id: &str,
        token: &str,
        body: &Value,
    ) -> reqwest::Response {
        self.http
            .post(self.webhook_url(id))
            .bearer_auth(token)
            .json(body)
            .timeout(PATIENCE)
            .send()
            .await
            .unwrap()
    }

    pub(crate) fn get(&self, path: &str) -> reqwest::RequestBuilder {
        self.http.get(format!("{}{path}", self.api)).bearer_auth(TOKEN)
    }

    pub(crate) fn post(&self, path: &str) -> reqwest::RequestBuilder {
        self.http.post(format!("{}{path}", self.api)).bearer_auth(TOKEN)
    }

    /// Submits a prompt; the run id.
    pub(crate) async fn submit(&self, body: serde_json::Value) -> String {
        let response = self.post("/v1/runs").json(&body).send().await.unwrap();
        assert_eq!(response.status(), 202, "submit {body}");
        let accepted: serde_json::Value = response.json().await.unwrap();
        accepted["run_id"].as_str().unwrap().to_owned()
    }

    /// The events of a run over SSE until `run_completed`: (type, data) pairs.
    pub(crate) async fn events(&self, run_id: &str) -> Vec<(String, serde_json::Value)> {
        use futures::StreamExt;
        let response = self.get(&format!("/v1/runs/{run_id}/events")).send().await.unwrap();
        assert_eq!(response.status(), 200);
        let mut parser = lemon_tests::event_stream::EventStream::default();
        let mut out = Vec::new();
        let mut stream = response.bytes_stream();
        tokio::time::timeout(PATIENCE, async {
            while let Some(chunk) = stream.next().await {
                for event in parser.push(&chunk.unwrap()) {
                    let data: serde_json::Value = serde_json::from_str(&event.data).unwrap();
                    let done = event.event == "run_completed";
                    out.push((event.event, data));
                    if done {
                        return;
                    }
                }
            }
        })
        .await
        .expect("run completes in time");
        out
    }

    /// The run's record (`GET /v1/runs/{id}`).
    pub(crate) async fn run(&self, run_id: &str) -> serde_json::Value {
        self.get(&format!("/v1/runs/{run_id}")).send().await.unwrap().json().await.unwrap()
    }

    /// The gateway's status (`GET /v1/status`).
    pub(crate) async fn status(&self) -> serde_json::Value {
        self.get("/v1/status").send().await.unwrap().json().await.unwrap()
    }

    /// Waits (bounded) for a run the gateway submits by itself, such as a
    /// zero-answer retry, to exist, then for it to complete; returns its record.
    pub(crate) async fn wait_for_submitted(&self, run_id: &str) -> serde_json::Value {
        let path = format!("/v1/runs/{run_id}");
        let appeared = tokio::time::timeout(PATIENCE, async {
            while self.get(&path).send().await.unwrap().status() == 404 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
        assert!(appeared.is_ok(), "run {run_id} was never submitted");
        self.wait(run_id).await
    }

    /// Waits for the run to complete (via its event stream) and returns its record.
    pub(crate) async fn wait(&self, run_id: &str) -> serde_json::Value {
        self.events(run_id).await;
        self.run(run_id).await
    }

    pub(crate) fn pid(&self) -> i32 {
        self.child.id().expect("gateway running") as i32
    }

    /// Sends SIGTERM and waits for the exit status.
    pub(crate) async fn terminate(mut self) -> std::process::ExitStatus {
        let status =
            Command::new("kill").arg("-TERM").arg(self.pid().to_string()).status().await.unwrap();
        assert!(status.success());
        tokio::time::timeout(PATIENCE, self.child.wait())
            .await
            .expect("gateway exits in time")
            .unwrap()
    }
}

/// A tool `scripts/test` installs into a virtual environment under the user's
/// cache (`<cache>/lemon-gateway/<venv>/<bin>`), or the path in `override_var`.
/// `None` only when there is no Python at all; with a Python but without the
/// tool, the test fails and says to run `scripts/test`.
pub(crate) fn cached_python_tool(
    override_var: &str,
    venv_bin: &str,
    what: &str,
) -> Option<PathBuf> {
    if let Some(path) = std::env::var_os(override_var) {
        return Some(PathBuf::from(path));
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| Path::new(&home).join(".cache")))?;
    let tool = cache.join("lemon-gateway").join(venv_bin);
    if tool.exists() {
        return Some(tool);
    }
    let has_python = std::process::Command::new("python3")
        .arg("--version")
        .output()
        .is_ok_and(|output| output.status.success());
    assert!(
        !has_python,
        "Python is here but {what} is not: run scripts/test, which installs it into {}",
        tool.display()
    );
    None
}

/// `mcp-server-everything`, where `scripts/test` installs it; `None` (with a
/// skip line) when missing, a panic under `LEMON_REQUIRE_MCP=1`.
pub(crate) fn everything_server() -> Option<std::path::PathBuf> {
    let dir = match std::env::var_os("LEMON_MCP_SERVERS_DIR") {
        Some(dir) => std::path::PathBuf::from(dir),
        None => {
            std::path::Path::new(&std::env::var_os("HOME")?).join(".cache/lemon-tests/mcp-servers")
        }
    };
    let bin = dir.join("node_modules/.bin/mcp-server-everything");
    if bin.is_file() {
        return Some(bin);
    }
    assert!(
        std::env::var_os("LEMON_REQUIRE_MCP").is_none(),
        "LEMON_REQUIRE_MCP is set but {} is missing: run scripts/test once (it installs it)",
        bin.display()
    );
    #[allow(clippy::print_stderr)] // the skip is said where the test runs
    {
        eprintln!("skipped: @modelcontextprotocol/server-everything is not installed");
    }
    None
}
