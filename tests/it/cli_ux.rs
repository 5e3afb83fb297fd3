//! The command line as a user drives it, end to end on the real binary: `run`
//! in the caller's directory with fresh or continued sessions, prompts from
//! stdin, Ctrl-C once (cancelled, exit 130) and twice (left running, `attach`
//! follows it), the exit code of each class of error, and `status`, `engines`,
//! `runs`, `logs`, `cancel`. One test runs `run` in a real terminal under tmux
//! and keeps the screen as an artifact.

use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

use crate::support::{command, Gateway, PATIENCE, TOKEN};

/// The client binary on `gateway`, started in `dir`.
fn cli(gateway: &Gateway, dir: &Path) -> Command {
    let mut command = command(&gateway.home);
    command.env("LEMON_URL", &gateway.api).current_dir(dir).stdin(Stdio::null());
    command
}

async fn output(mut command: Command) -> Output {
    let output = command.stdout(Stdio::piped()).stderr(Stdio::piped()).output();
    tokio::time::timeout(PATIENCE, output).await.expect("the command ends in time").unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A fixture of the fake Claude CLI: a successful run without its answer and
/// result lines, so with `FAKE_CLI_HANG` the run is still going after its actions.
fn unfinished_fixture(dir: &Path) -> PathBuf {
    let source = lemon_tests::fake_cli::fixture("claude", "synth_tool_use_success.jsonl");
    let text = std::fs::read_to_string(source).unwrap();
    let lines: Vec<&str> = text
        .lines()
        .filter(|line| !line.starts_with("{\"type\":\"result\""))
        .filter(|line| !line.contains("There are 2 test files."))
        .collect();
    let path = dir.join("unfinished.jsonl");
    std::fs::write(&path, format!("{}\n", lines.join("\n"))).unwrap();
    path
}

/// `[gateway.engines.claude]` on the fake CLI; `env` is TOML inline-table text.
fn claude_config(env: &str, extra: &str) -> String {
    format!(
        "[gateway.engines.claude]\ncli_path = \"{}\"\n{extra}\nenv = {{ {env} }}\n",
        env!("CARGO_BIN_EXE_fake-cli")
    )
}

fn record(stdout: &[u8]) -> Value {
    serde_json::from_slice(stdout).unwrap_or_else(|e| panic!("{e}: {}", text(stdout)))
}

#[tokio::test]
async fn run_works_in_the_callers_directory_and_prints_the_answer_alone() {
    let dir = tempfile::tempdir().unwrap();
    let args = dir.path().join("claude.args");
    let fixture = lemon_tests::fake_cli::fixture("claude", "synth_tool_use_success.jsonl");
    let env = format!(
        "FAKE_CLI_FIXTURE = \"{}\", FAKE_CLI_ARGS_FILE = \"{}\"",
        fixture.display(),
        args.display()
    );
    let gateway = Gateway::start(&claude_config(&env, "")).await;
    let project = dir.path().join("proj");
    std::fs::create_dir(&project).unwrap();

    let mut run = cli(&gateway, &project);
    run.args(["run", "--engine", "claude", "how many tests?"]);
    let out = output(run).await;
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{stdout} {stderr}");
    assert_eq!(stdout, "There are 2 test files.\n", "the answer alone on stdout");
    // The resume line alone on its line, nothing around it to pick up when copied.
    assert!(
        stderr.lines().any(|l| l == "claude --resume 5b1c7a52-8f0e-4d7b-9c1a-2f3e4d5c6b7a"),
        "{stderr}"
    );
    assert!(!stderr.contains('\x1b'), "no escape codes off a terminal: {stderr:?}");
    let recorded: Value =
        serde_json::from_str(std::fs::read_to_string(&args).unwrap().lines().next().unwrap())
            .unwrap();
    let project = std::fs::canonicalize(&project).unwrap();
    assert_eq!(recorded["cwd"], project.display().to_string(), "the CLI ran in the directory");

    // `--cwd` chooses another one.
    let elsewhere = std::fs::canonicalize(dir.path()).unwrap();
    let mut run = cli(&gateway, &project);
    run.args(["run", "--engine", "claude", "--cwd"]).arg(&elsewhere).arg("again");
    assert_eq!(output(run).await.status.code(), Some(0));
    let recorded: Value =
        serde_json::from_str(std::fs::read_to_string(&args).unwrap().lines().next().unwrap())
            .unwrap();
    assert_eq!(recorded["cwd"], elsewhere.display().to_string());
}

#[tokio::test]
async fn a_directory_outside_allowed_cwd_roots_is_refused_with_its_name() {
    let allowed = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(allowed.path()).unwrap();
    let gateway =
        Gateway::start(&format!("[gateway]\nallowed_cwd_roots = [\"{}\"]\n", root.display())).await;
    let outside = tempfile::tempdir().unwrap();
    let mut run = cli(&gateway, outside.path());
    run.args(["run", "hello"]);
    let out = output(run).await;
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let outside = std::fs::canonicalize(outside.path()).unwrap();
    assert!(stderr.contains(&format!("refused the run in {}", outside.display())), "{stderr}");
    assert!(stderr.contains("allowed_cwd_roots"), "{stderr}");
    let mut run = cli(&gateway, &root);
    run.args(["run", "hello"]);
    assert_eq!(output(run).await.status.code(), Some(0), "inside the root it runs");
}

#[tokio::test]
async fn each_run_is_a_fresh_session_unless_it_continues_the_directorys_last() {
    let gateway = Gateway::start("").await;
    let (one, two) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let json_run = |dir: &Path, extra: &[&str], prompt: &str| {
        let mut run = cli(&gateway, dir);
        run.args(["run", "--json"]).args(extra).arg(prompt);
        run
    };
    let first = record(&output(json_run(one.path(), &[], "first")).await.stdout);
    let second = record(&output(json_run(one.path(), &[], "second")).await.stdout);
    assert_eq!(first["status"], "completed", "{first}");
    assert_ne!(first["session_key"], second["session_key"], "a fresh session each time");
    assert_eq!(second["resumed_from"], Value::Null, "{second}");

    let continued = record(&output(json_run(one.path(), &["-c"], "third")).await.stdout);
    assert_eq!(continued["session_key"], second["session_key"], "{continued}");
    assert_eq!(continued["resumed_from"], second["resume"], "{continued}");

    // Another directory has its own last session, and none yet.
    let out = output(json_run(two.path(), &["--continue"], "x")).await;
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("no earlier session in"), "{}", text(&out.stderr));
    let named = record(&output(json_run(two.path(), &["--session", "mine"], "x")).await.stdout);
    assert_eq!(named["session_key"], "mine");
    let again = record(&output(json_run(two.path(), &["-c"], "y")).await.stdout);
    assert_eq!(again["session_key"], "mine");

    use std::os::unix::fs::PermissionsExt;
    let file = gateway.home.join("cli-sessions.json");
    assert_eq!(std::fs::metadata(&file).unwrap().permissions().mode() & 0o777, 0o600);
}

#[tokio::test]
async fn a_piped_stdin_is_the_prompt_or_follows_the_arguments() {
    use tokio::io::AsyncWriteExt;
    let gateway = Gateway::start("").await;
    let dir = tempfile::tempdir().unwrap();
    for (args, expected) in [
        (&["run", "review this"][..], "review this\n\n--- a/x\n+++ b/x\n"),
        (&["run", "-"][..], "--- a/x\n+++ b/x\n"),
    ] {
        let mut run = cli(&gateway, dir.path());
        run.args(args).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = run.spawn().unwrap();
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(b"--- a/x\n+++ b/x\n").await.unwrap();
        drop(stdin);
        let out = tokio::time::timeout(PATIENCE, child.wait_with_output()).await.unwrap().unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        assert_eq!(text(&out.stdout), expected, "echo answers with the prompt");
    }
    let mut run = cli(&gateway, dir.path());
    run.arg("run");
    let out = output(run).await;
    assert_eq!(out.status.code(), Some(2), "no prompt is a usage error");
    assert!(text(&out.stderr).contains("no prompt"), "{}", text(&out.stderr));
}

/// Reads `lines` until one contains `needle`; that line.
async fn line_with(
    lines: &mut tokio::io::Lines<BufReader<tokio::process::ChildStderr>>,
    needle: &str,
    seen: &mut Vec<String>,
) -> String {
    tokio::time::timeout(PATIENCE, async {
        loop {
            let line = lines.next_line().await.unwrap().unwrap_or_else(|| {
                panic!("stderr ended before {needle:?}: {seen:?}");
            });
            seen.push(line.clone());
            if line.contains(needle) {
                return line;
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{needle:?} in time"))
}

fn interrupt(pid: u32) {
    let pid = nix::unistd::Pid::from_raw(i32::try_from(pid).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).unwrap();
}

#[tokio::test]
async fn the_first_ctrl_c_cancels_the_run_and_exits_130() {
    let dir = tempfile::tempdir().unwrap();
    let env = format!(
        "FAKE_CLI_FIXTURE = \"{}\", FAKE_CLI_HANG = \"1\"",
        unfinished_fixture(dir.path()).display()
    );
    let gateway = Gateway::start(&claude_config(&env, "")).await;
    let mut run = cli(&gateway, dir.path());
    run.args(["-v", "run", "--engine", "claude", "go"]);
    let mut child = run.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut seen = Vec::new();
    let started = line_with(&mut lines, "tool: ", &mut seen).await;
    assert!(started.contains("▸"), "{started}");
    let run_id = seen[0].split_whitespace().nth(1).unwrap().trim_end_matches(':').to_owned();
    interrupt(child.id().unwrap());
    line_with(&mut lines, &format!("cancelling run {run_id}"), &mut seen).await;
    line_with(&mut lines, &format!("run {run_id} cancelled"), &mut seen).await;
    let status = tokio::time::timeout(PATIENCE, child.wait()).await.unwrap().unwrap();
    assert_eq!(status.code(), Some(130), "{seen:?}");
    assert_eq!(gateway.run(&run_id).await["status"], "cancelled");
}

#[tokio::test]
async fn a_second_ctrl_c_leaves_the_run_and_attach_follows_it_to_its_end() {
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("pids.json");
    // The CLI ignores SIGTERM and the grace period is long, so the cancelled
    // run stays `cancelling` until the test ends the CLI itself.
    let env = format!(
        "FAKE_CLI_FIXTURE = \"{}\", FAKE_CLI_HANG = \"1\", FAKE_CLI_IGNORE_SIGTERM = \"1\", FAKE_CLI_PID_FILE = \"{}\"",
        unfinished_fixture(dir.path()).display(),
        pid_file.display()
    );
    let gateway = Gateway::start(&claude_config(&env, "cancel_grace_ms = 600000")).await;
    let mut run = cli(&gateway, dir.path());
    run.args(["-v", "run", "--engine", "claude", "go"]);
    let mut child = run.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut seen = Vec::new();
    line_with(&mut lines, "tool: ", &mut seen).await;
    let run_id = seen[0].split_whitespace().nth(1).unwrap().trim_end_matches(':').to_owned();
    let pid = child.id().unwrap();
    interrupt(pid);
    line_with(&mut lines, &format!("cancelling run {run_id}"), &mut seen).await;
    interrupt(pid);
    let left = line_with(&mut lines, "left run", &mut seen).await;
    assert!(left.contains(&format!("`lemon-gateway attach {run_id}`")), "{left}");
    let status = tokio::time::timeout(PATIENCE, child.wait()).await.unwrap().unwrap();
    assert_eq!(status.code(), Some(130));
    assert_eq!(gateway.run(&run_id).await["status"], "cancelling", "still stopping");

    let mut attach = cli(&gateway, dir.path());
    attach.args(["attach", &run_id]).stdout(Stdio::piped()).stderr(Stdio::piped());
    let attached = attach.spawn().unwrap();
    // The CLI goes: the run ends, and `attach` sees its end.
    let cli_pid = crate::cli_support::read_pids(&pid_file).pid;
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(cli_pid), nix::sys::signal::Signal::SIGKILL)
        .unwrap();
    let out = tokio::time::timeout(PATIENCE, attached.wait_with_output()).await.unwrap().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains(&format!("run {run_id} was cancelled")));
    assert_eq!(gateway.run(&run_id).await["status"], "cancelled");
}

#[tokio::test]
async fn each_class_of_error_has_its_exit_code_and_says_what_to_do() {
    let gateway = Gateway::start("").await;
    let dir = tempfile::tempdir().unwrap();

    let mut usage = cli(&gateway, dir.path());
    usage.args(["runs", "--limit", "many"]);
    assert_eq!(output(usage).await.status.code(), Some(2), "usage");

    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let mut unreachable = cli(&gateway, dir.path());
    unreachable.env("LEMON_URL", format!("http://127.0.0.1:{port}")).args(["run", "hi"]);
    let out = output(unreachable).await;
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(stderr.contains("is it running? start it with `lemon-gateway`"), "{stderr}");
    assert!(!stderr.contains("error sending request"), "no raw client error: {stderr}");

    let mut bad_token = cli(&gateway, dir.path());
    bad_token.env("LEMON_API_TOKEN", "wrong-token-0123456789").arg("status");
    let out = output(bad_token).await;
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{stderr}");
    assert!(stderr.contains("refused the API token from $LEMON_API_TOKEN"), "{stderr}");
    assert!(!stderr.contains("wrong-token-0123456789"), "the token is never printed");

    let empty_home = tempfile::tempdir().unwrap();
    let mut no_token = cli(&gateway, dir.path());
    no_token.env_remove("LEMON_API_TOKEN").env("LEMON_HOME", empty_home.path()).arg("status");
    let out = output(no_token).await;
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{stderr}");
    assert!(stderr.contains("$LEMON_API_TOKEN"), "{stderr}");
    assert!(stderr.contains(&empty_home.path().join("secrets.toml").display().to_string()));

    let bad_config = tempfile::tempdir().unwrap();
    std::fs::write(bad_config.path().join("config.toml"), "[gateway\n").unwrap();
    let mut config = cli(&gateway, dir.path());
    config.env_remove("LEMON_URL").env("LEMON_HOME", bad_config.path()).arg("status");
    let out = output(config).await;
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(5), "{stderr}");
    assert!(stderr.contains("config.toml:1:"), "{stderr}");

    let mut unknown = cli(&gateway, dir.path());
    unknown.args(["cancel", "run_does_not_exist"]);
    let out = output(unknown).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("run run_does_not_exist not found"));
}

#[tokio::test]
async fn a_failed_run_exits_1_with_its_error_and_no_resume_line() {
    let dir = tempfile::tempdir().unwrap();
    let fixture = lemon_tests::fake_cli::fixture("claude", "synth_resumed_no_result.jsonl");
    let env = format!(
        "FAKE_CLI_FIXTURE = \"{}\", FAKE_CLI_EXIT_CODE = \"139\", FAKE_CLI_STDERR = \"Segmentation fault\"",
        fixture.display()
    );
    let gateway = Gateway::start(&claude_config(&env, "")).await;
    let mut run = cli(&gateway, dir.path());
    run.args(["run", "--engine", "claude", "go"]);
    let out = output(run).await;
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("failed:") && stderr.contains("Segmentation fault"), "{stderr}");
    assert!(!stderr.contains("--resume"), "no resume line for a failed run: {stderr}");
}

#[tokio::test]
async fn status_engines_runs_logs_and_cancel_for_people_and_scripts() {
    let gateway = Gateway::start("").await;
    let dir = tempfile::tempdir().unwrap();
    let run = |args: &[&str]| {
        let mut command = cli(&gateway, dir.path());
        command.args(args);
        output(command)
    };
    let out = run(&["run", "--detach", "hello"]).await;
    assert_eq!(out.status.code(), Some(0));
    let run_id = text(&out.stdout).trim().to_owned();
    assert!(run_id.starts_with("run_"), "{run_id}");
    assert_eq!(gateway.wait(&run_id).await["status"], "completed");

    let status = text(&run(&["status"]).await.stdout);
    assert!(status.contains(&format!("gateway   {}, up ", gateway.api)), "{status}");
    assert!(status.contains("slots     0 of 2 in use, 0 queued"), "{status}");
    let store = format!("at {}\n", gateway.home.join("lemon.db").display());
    assert!(
        status.lines().any(|l| l.starts_with("store     ") && l.contains("B (log ")),
        "{status}"
    );
    assert!(status.contains(&store), "{status}");
    assert!(status.contains("echo         available (default)"), "{status}");
    assert!(status.contains("channels  discord      disabled"), "{status}");
    assert!(status.contains("          email        disabled"), "{status}");
    assert!(status.contains("          sms          disabled"), "{status}");
    assert!(status.contains("          telegram     disabled"), "{status}");
    assert!(!status.contains('\x1b'), "no colour into a pipe");
    let coloured = text(&run(&["--color", "always", "status"]).await.stdout);
    assert!(coloured.contains("\x1b[32mavailable\x1b[0m"), "{coloured:?}");
    let json: Value = serde_json::from_slice(&run(&["status", "--json"]).await.stdout).unwrap();
    assert_eq!(json["scheduler"]["max"], 2);

    let engines = text(&run(&["engines"]).await.stdout);
    assert!(engines.lines().any(|l| l.starts_with("echo") && l.contains("available")), "{engines}");
    let engines: Value = serde_json::from_slice(&run(&["engines", "--json"]).await.stdout).unwrap();
    assert!(engines.as_array().unwrap().iter().any(|e| e["id"] == "echo"));

    let runs = text(&run(&["runs"]).await.stdout);
    let line = runs.lines().find(|l| l.starts_with(&run_id)).unwrap_or_else(|| panic!("{runs}"));
    assert!(line.contains("completed") && line.contains("echo") && line.ends_with("hello"));
    assert!(!text(&run(&["runs", "--status", "failed"]).await.stdout).contains(&run_id));
    let listed: Value =
        serde_json::from_slice(&run(&["runs", "--json", "--limit", "1"]).await.stdout).unwrap();
    assert_eq!(listed.as_array().unwrap().len(), 1);
    let bad = run(&["runs", "--status", "done"]).await;
    assert_eq!(bad.status.code(), Some(1));
    assert!(text(&bad.stderr).contains("invalid status"), "{}", text(&bad.stderr));

    let logs = text(&run(&["logs", &run_id]).await.stdout);
    assert!(logs.lines().next().unwrap().contains("run_started       engine echo"), "{logs}");
    assert!(logs.lines().last().unwrap().contains("run_completed     completed"), "{logs}");
    let logs = text(&run(&["logs", "--json", &run_id]).await.stdout);
    let events: Vec<Value> = logs.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(events.last().unwrap()["type"], "run_completed");
    assert!(events.iter().all(|e| e["run_id"] == run_id.as_str()));

    let cancel = run(&["cancel", &run_id]).await;
    assert_eq!(cancel.status.code(), Some(0));
    assert_eq!(text(&cancel.stdout), format!("run {run_id}: completed\n"));

    let help = text(&run(&["--help"]).await.stdout);
    assert!(help.contains("Exit codes:") && help.contains("130  cancelled by Ctrl-C"), "{help}");
    let version = text(&run(&["--version"]).await.stdout);
    assert!(version.starts_with("lemon-gateway "), "{version}");
    let completions = run(&["completions", "bash"]).await;
    assert_eq!(completions.status.code(), Some(0));
    assert!(text(&completions.stdout).contains("lemon-gateway"));
    assert!(!text(&run(&["status"]).await.stderr).contains(TOKEN));
}

/// A tmux server on its own socket, killed when dropped.
struct Tmux {
    socket: String,
}

impl Tmux {
    fn command(&self) -> Command {
        let mut command = Command::new("tmux");
        command.arg("-L").arg(&self.socket);
        command
    }

    async fn capture(&self) -> String {
        // From the start of the history: what scrolled off the screen too.
        let out =
            self.command().args(["capture-pane", "-p", "-S", "-", "-t", "cli"]).output().await;
        text(&out.unwrap().stdout)
    }

    /// Waits (bounded) until the pane shows everything `wanted` accepts.
    async fn until(&self, what: &str, wanted: impl Fn(&str) -> bool) -> String {
        let last = std::sync::Mutex::new(String::new());
        let found = tokio::time::timeout(PATIENCE, async {
            loop {
                let pane = self.capture().await;
                if wanted(&pane) {
                    return pane;
                }
                *last.lock().unwrap() = pane;
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        })
        .await;
        found.unwrap_or_else(|_| {
            panic!("{what} on the screen in time; the screen:\n{}", last.lock().unwrap())
        })
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = std::process::Command::new("tmux")
            .args(["-L", &self.socket, "kill-server"])
            .stderr(Stdio::null())
            .status();
    }
}

fn quote(value: &str) -> String {
    format!("'{}'", value.replace('\'', "'\\''"))
}

impl Tmux {
    /// A terminal `width` columns wide, in `dir`, running the client on
    /// `gateway` with `args` (shell words), then saying its exit code.
    async fn client(gateway: &Gateway, dir: &Path, width: u16, args: &str) -> Tmux {
        static SESSIONS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = SESSIONS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tmux = Tmux { socket: format!("lemon-cli-ux-{}-{n}", std::process::id()) };
        let vars = [
            ("PATH", std::env::var("PATH").unwrap_or_default()),
            ("HOME", gateway.home.display().to_string()),
            ("LEMON_HOME", gateway.home.display().to_string()),
            ("LEMON_API_TOKEN", TOKEN.to_owned()),
            ("LEMON_URL", gateway.api.clone()),
            ("LEMON_LOG", "warn".to_owned()),
            ("TERM", "xterm-256color".to_owned()),
        ];
        let vars: Vec<String> = vars.iter().map(|(k, v)| format!("{k}={}", quote(v))).collect();
        let script = format!(
            "env -i {} {} {args}; echo \"exit code $?\"; cat",
            vars.join(" "),
            quote(crate::support::gateway_bin())
        );
        let started = tmux
            .command()
            .args(["new-session", "-d", "-s", "cli", "-x", &width.to_string(), "-y", "30", "-c"])
            .arg(dir)
            .arg(script)
            .status()
            .await
            .unwrap();
        assert!(started.success(), "tmux starts");
        tmux
    }
}

#[tokio::test]
async fn in_a_terminal_run_shows_a_spinner_and_each_action_and_ctrl_c_cancels() {
    let dir = tempfile::tempdir().unwrap();
    let env = format!(
        "FAKE_CLI_FIXTURE = \"{}\", FAKE_CLI_HANG = \"1\"",
        unfinished_fixture(dir.path()).display()
    );
    let gateway = Gateway::start(&claude_config(&env, "")).await;
    let tmux =
        Tmux::client(&gateway, dir.path(), 100, "run --engine claude 'count the tests'").await;

    let running = tmux
        .until("the spinner and both tool calls", |pane| {
            pane.contains("▸ tool: ")
                && pane.matches("▸").count() >= 2
                && pane.lines().any(|l| l.contains("claude") && l.trim_end().ends_with('s'))
        })
        .await;
    let spinner = running.lines().find(|l| l.contains("claude")).unwrap();
    assert!(spinner.chars().any(|c| ('\u{2800}'..='\u{28ff}').contains(&c)), "{spinner}");
    let sent = tmux.command().args(["send-keys", "-t", "cli", "C-c"]).status().await.unwrap();
    assert!(sent.success());
    let done = tmux
        .until("the cancellation", |pane| {
            pane.contains("cancelling run") && pane.contains("exit code 130")
        })
        .await;
    assert!(done.contains("cancelled"), "{done}");

    let artifacts = Path::new(env!("CARGO_TARGET_TMPDIR")).join("cli_ux");
    std::fs::create_dir_all(&artifacts).unwrap();
    let capture = format!("--- while running ---\n{running}\n--- after Ctrl-C ---\n{done}");
    std::fs::write(artifacts.join("tmux-run.txt"), capture).unwrap();
}

/// A reader that went away (`runs | head -1`, `logs --json RUN | head -3`)
/// ends a command quietly with exit 0, not with a panic.
#[tokio::test]
async fn output_into_a_closed_pipe_ends_the_command_quietly_with_exit_0() {
    let gateway = Gateway::start("").await;
    let dir = tempfile::tempdir().unwrap();
    let run_id = gateway.submit(serde_json::json!({ "prompt": "hello" })).await;
    gateway.wait(&run_id).await;
    for args in [&["runs"][..], &["logs", "--json", &run_id], &["status"], &["engines"]] {
        // A stream whose other end is closed: writing to it fails with EPIPE.
        let (closed, gone) = std::os::unix::net::UnixStream::pair().unwrap();
        drop(gone);
        let mut command = cli(&gateway, dir.path());
        command
            .args(args)
            .stdout(Stdio::from(std::os::fd::OwnedFd::from(closed)))
            .stderr(Stdio::piped());
        let out = tokio::time::timeout(PATIENCE, command.output()).await.unwrap().unwrap();
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    }
}

/// `token` prints the API token the dashboard signs in with, and says where to
/// set one when there is none.
#[tokio::test]
async fn token_prints_the_api_token_or_where_to_set_one() {
    let home = tempfile::tempdir().unwrap();
    let mut with = command(home.path());
    with.arg("token");
    let out = output(with).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), format!("{TOKEN}\n"));

    let mut without = command(home.path());
    without.env_remove("LEMON_API_TOKEN").arg("token");
    let out = output(without).await;
    assert_eq!(out.status.code(), Some(4), "{}", text(&out.stdout));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("LEMON_API_TOKEN") && stderr.contains("secrets.toml"), "{stderr}");
}

/// The native engine on a fake model that calls `bash`, then streams part of
/// its answer and stalls, so the run is still going when the text is out.
async fn slow_lemon() -> (lemon_tests::fake_llm::FakeLlm, Gateway) {
    use lemon_tests::fake_llm::{FakeLlm, FakeToolCall, Turn};
    let llm = FakeLlm::builder().start().await;
    let bash = serde_json::json!({ "command": "echo from the tool" }).to_string();
    llm.push(Turn::tool_calls(vec![FakeToolCall::new("call_1", "bash", &[&bash])]));
    llm.push(Turn::stall(&["Half of the answer, ", "and the model is still thinking"]));
    let config = format!(
        "{}\n[gateway.engines.lemon]\nbase_url = \"{}\"\nmodel = \"test-model\"\n",
        crate::support::ALLOW_EVERY_CALL,
        llm.base_url()
    );
    let gateway = Gateway::start(&config).await;
    (llm, gateway)
}

/// On a terminal `run` prints the answer's text as it arrives and a tool call
/// with its command: both are on the screen while the model is still
/// answering, and Ctrl-C then cancels.
#[tokio::test]
async fn in_a_terminal_run_streams_the_answer_and_shows_the_command_it_runs() {
    let (_llm, gateway) = slow_lemon().await;
    let dir = tempfile::tempdir().unwrap();
    let tmux = Tmux::client(&gateway, dir.path(), 100, "run 'answer slowly'").await;
    let running = tmux
        .until("the streamed text and the command", |pane| {
            pane.contains("Half of the answer, and the model is still thinking")
                && pane.contains("command: echo from the tool")
        })
        .await;
    assert!(!running.contains("exit code"), "the run is still going: {running}");
    let sent = tmux.command().args(["send-keys", "-t", "cli", "C-c"]).status().await.unwrap();
    assert!(sent.success());
    let done = tmux.until("the cancellation", |pane| pane.contains("exit code 130")).await;
    assert!(done.contains("Half of the answer"), "the streamed text stays: {done}");

    let artifacts = Path::new(env!("CARGO_TARGET_TMPDIR")).join("cli_ux");
    std::fs::create_dir_all(&artifacts).unwrap();
    let capture = format!("--- while streaming ---\n{running}\n--- after Ctrl-C ---\n{done}");
    std::fs::write(artifacts.join("tmux-stream.txt"), capture).unwrap();
}

/// Off a terminal `run` prints the answer only at the end, unless `--stream`:
/// then the text comes out of the pipe while the run goes on.
#[tokio::test]
async fn run_stream_prints_the_text_into_a_pipe_as_it_arrives() {
    let (_llm, gateway) = slow_lemon().await;
    let dir = tempfile::tempdir().unwrap();
    let mut run = cli(&gateway, dir.path());
    run.args(["run", "--stream", "answer slowly"]).stdout(Stdio::piped()).stderr(Stdio::null());
    let mut child = run.spawn().unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut seen = Vec::new();
    let streamed = tokio::time::timeout(PATIENCE, async {
        let mut buf = [0u8; 256];
        loop {
            let n = tokio::io::AsyncReadExt::read(&mut stdout, &mut buf).await.unwrap();
            assert!(n > 0, "stdout ended before the text: {}", text(&seen));
            seen.extend_from_slice(&buf[..n]);
            if text(&seen).contains("still thinking") {
                return text(&seen);
            }
        }
    })
    .await
    .expect("the text comes through the pipe while the run goes on");
    assert_eq!(streamed, "Half of the answer, and the model is still thinking");
    assert!(child.try_wait().unwrap().is_none(), "the run is still being followed");
    child.kill().await.unwrap();
}

/// `status` on a 60-column terminal folds its long lines at spaces instead of
/// cutting them: each unavailable CLI's line still ends with its fix.
#[tokio::test]
async fn status_at_60_columns_folds_lines_and_keeps_the_fix() {
    let long_path: Vec<String> =
        (0..8).map(|i| format!("/nonexistent/tools-directory-number-{i}/bin")).collect();
    let gateway = Gateway::start_with_path("", &long_path.join(":")).await;
    let dir = tempfile::tempdir().unwrap();
    let tmux = Tmux::client(&gateway, dir.path(), 60, "status").await;
    let pane = tmux.until("the status", |pane| pane.contains("exit code 0")).await;
    let words = pane.split_whitespace().collect::<Vec<_>>().join(" ");
    assert_eq!(words.matches("; set cli_path").count(), 5, "every CLI's fix is shown: {pane}");
    let folded = pane.lines().filter(|l| l.starts_with(&" ".repeat(10))).count();
    assert!(folded >= 5, "long lines are folded under their values: {pane}");
}

/// `run --engine claude` without the CLI is refused before anything is sent to
/// it, with the fix; no failed run is left behind.
#[tokio::test]
async fn run_on_an_engine_whose_cli_is_missing_is_refused_before_it_starts() {
    let gateway = Gateway::start_with_path("", "/nonexistent/bin").await;
    let dir = tempfile::tempdir().unwrap();
    let mut run = cli(&gateway, dir.path());
    run.args(["run", "--engine", "claude", "hello"]);
    let out = output(run).await;
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("engine claude is unavailable") && stderr.contains("set cli_path"),
        "{stderr}"
    );
    let runs: Value = gateway.get("/v1/runs").send().await.unwrap().json().await.unwrap();
    assert_eq!(runs["runs"], serde_json::json!([]), "no run was recorded");
}

/// `runs` has a header and says when each run was made; `logs`, `attach` and
/// `cancel` take `last` or the start of a run's id.
#[tokio::test]
async fn runs_has_a_header_and_logs_takes_last_or_the_start_of_an_id() {
    let gateway = Gateway::start("").await;
    let dir = tempfile::tempdir().unwrap();
    let first = gateway.submit(serde_json::json!({ "prompt": "first" })).await;
    gateway.wait(&first).await;
    let second = gateway.submit(serde_json::json!({ "prompt": "second" })).await;
    gateway.wait(&second).await;
    let run = |args: &[&str]| {
        let mut command = cli(&gateway, dir.path());
        command.args(args);
        output(command)
    };

    let runs = text(&run(&["runs"]).await.stdout);
    let header = runs.lines().next().unwrap();
    assert!(header.starts_with("RUN ") && header.contains("WHEN") && header.ends_with("PROMPT"));
    let line = runs.lines().find(|l| l.starts_with(&second)).unwrap_or_else(|| panic!("{runs}"));
    assert!(line.contains("s ago") && line.ends_with("second"), "{line}");

    let whole = text(&run(&["logs", &second]).await.stdout);
    assert!(whole.contains("run_completed"), "{whole}");
    assert_eq!(text(&run(&["logs", "last"]).await.stdout), whole, "`last` is the newest run");
    let shared = first.chars().zip(second.chars()).take_while(|(a, b)| a == b).count();
    let prefix = &second[..=shared];
    assert_eq!(text(&run(&["logs", prefix]).await.stdout), whole, "the start of its id");
    let bare = prefix.strip_prefix("run_").unwrap();
    assert_eq!(text(&run(&["logs", bare]).await.stdout), whole, "without `run_`");

    let both = run(&["logs", &second[..shared]]).await;
    assert_eq!(both.status.code(), Some(2));
    assert!(text(&both.stderr).contains("starts 2 runs' ids"), "{}", text(&both.stderr));
    let none = run(&["logs", "nothing-like-it"]).await;
    assert_eq!(none.status.code(), Some(1));
    assert!(text(&none.stderr).contains("run nothing-like-it not found"), "{}", text(&none.stderr));
}

/// Client commands print their own output: their log says only what went
/// wrong, `-v` adds no library's detail, and `config check` says nothing but
/// its report.
#[tokio::test]
async fn clients_log_only_what_went_wrong_and_v_adds_no_library_detail() {
    let gateway = Gateway::start("").await;
    let dir = tempfile::tempdir().unwrap();
    let mut status = cli(&gateway, dir.path());
    status.env_remove("LEMON_LOG").args(["-v", "status"]);
    let out = output(status).await;
    assert_eq!(out.status.code(), Some(0));
    let stderr = text(&out.stderr);
    assert!(!stderr.contains("DEBUG"), "no library debug lines with -v: {stderr}");

    let mut check = cli(&gateway, dir.path());
    check.env_remove("LEMON_LOG").args(["config", "check"]);
    let out = output(check).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(!text(&out.stderr).contains("INFO"), "{}", text(&out.stderr));
    assert!(text(&out.stdout).trim_end().ends_with(": ok"), "{}", text(&out.stdout));
}
