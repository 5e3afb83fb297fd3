//! A fake vendor CLI for the CLI engine tests: installed under `claude`, `codex`,
//! `opencode`, `pi` and `droid`, it replays a recorded JSONL stream to stdout and
//! behaves as the test asks through its environment (set with the engine's `env`):
//!
//! | variable | effect |
//! |---|---|
//! | `FAKE_CLI_FIXTURE` | file whose lines are printed to stdout, in order |
//! | `FAKE_CLI_LINE_DELAY_MS` | pause between lines |
//! | `FAKE_CLI_OVERSIZED_LINE_BYTES` | first print one line of that many bytes |
//! | `FAKE_CLI_STDERR` | text written to stderr after the replay |
//! | `FAKE_CLI_EXIT_CODE` | exit status (default 0) |
//! | `FAKE_CLI_HANG=1` | after the replay, never exit |
//! | `FAKE_CLI_IGNORE_SIGTERM=1` | block SIGTERM (only SIGKILL stops it) |
//! | `FAKE_CLI_GRANDCHILD=1` | start a grandchild that sleeps forever (and inherits stdout) |
//! | `FAKE_CLI_GRANDCHILD=setsid` | the same, but the grandchild calls `setsid` first: it leaves the CLI's process group and session, as a daemon does |
//! | `FAKE_CLI_SIGNAL_LOG` | JSON lines of what happened to the CLI, each with `at_ms` (Unix time in ms): `{"signal":"SIGTERM"}` for every SIGTERM (which is then ignored), and, from a witness process outside the CLI's group, `{"event":"killed"}` when the CLI died without exiting (only SIGKILL can do that then) or `{"event":"exited"}` |
//! | `FAKE_CLI_FLOOD_LINES` | first print that many short JSON lines that are no event of any vendor |
//! | `FAKE_CLI_PID_FILE` | JSON `{pid, pgid, grandchild}`, written before the first line |
//! | `FAKE_CLI_ARGS_FILE` | line 1: JSON `{argv, cwd}`; then everything read from stdin |
//! | `FAKE_CLI_ENV_FILE` | the whole environment as a JSON object |
//! | `FAKE_CLI_PARENT_ENVIRON_FILE` | `read: ` and the parent's `/proc/<ppid>/environ` (one entry a line), or `refused: ` and why it could not be read; then `mem: opened` or `mem: refused: ` and why for `/proc/<ppid>/mem` |
//! | `FAKE_CLI_VERSION` | what `--version` prints (default `1.0.0-fake (fake-cli)`) |
//! | `FAKE_CLI_WRITE_FILE` | `name=content`: writes that file in the working directory first |
//! | `FAKE_CLI_RUN_LOG` | lines `start <ns> <pid> <run>…` once the prompt is in (the runs are the prompt's `msg:<run>` words, in order) and `end <ns> <pid> exited` just before exiting, or `end <ns> <pid> killed` from a witness outside the CLI's group when it died otherwise; `<ns>` is `CLOCK_MONOTONIC`, comparable across processes |
//! | `FAKE_CLI_RETRY_FIXTURE` | read stdin to its end first; if it holds the gateway's `Retry notice:`, replay this file instead, with no stderr and exit status 0 |
//!
//! Run as `<cli> --version` it prints its version and exits, like the real ones.
//!
//! A fixture line `{"fake_cli":"wait_stdin_lines","count":N}` is not printed: the
//! replay waits until N lines have arrived on stdin (steering tests).
//!
//! Stdin is read to its end on a thread; the fake exits only after it closes.

// A CLI stand-in prints to stdout and stderr by design.
#![allow(clippy::print_stdout, clippy::print_stderr)]
// The fake must start a grandchild to test process-group cleanup; it is test tooling,
// not library code, so the workspace's single spawning module does not apply.
#![allow(clippy::disallowed_methods)]

use std::collections::BTreeMap;
use std::fs;
use std::io::{self, BufRead, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::Duration;

use nix::sys::signal::{sigprocmask, SigSet, SigmaskHow, Signal};

fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|value| !value.is_empty())
}

fn flag(name: &str) -> bool {
    var(name).is_some_and(|value| value == "1" || value == "true")
}

fn main() -> ExitCode {
    match var("FAKE_CLI_ROLE").as_deref() {
        Some("sleeper") => sleep_forever(),
        Some("sleeper-setsid") => {
            if let Err(err) = nix::unistd::setsid() {
                eprintln!("fake-cli: setsid failed: {err}");
            }
            sleep_forever();
        }
        Some("witness") => return witness(),
        Some("run-witness") => return run_witness(),
        _ => {}
    }
    // Kept until the process ends: the witness sees the pipe close when it dies.
    let mut witness_pipe = None;
    if let Some(log) = var("FAKE_CLI_SIGNAL_LOG") {
        match record_signals(&log) {
            Ok(pipe) => witness_pipe = Some(pipe),
            Err(err) => {
                eprintln!("fake-cli: could not record signals: {err}");
                return ExitCode::from(70);
            }
        }
    }
    let code = run_with_options();
    if let Some(mut pipe) = witness_pipe {
        // A normal exit, told to the witness before the pipe closes.
        let _ = pipe.write_all(b"exit\n");
    }
    code
}

fn run_with_options() -> ExitCode {
    if flag("FAKE_CLI_IGNORE_SIGTERM") {
        let mut set = SigSet::empty();
        set.add(Signal::SIGTERM);
        if let Err(err) = sigprocmask(SigmaskHow::SIG_BLOCK, Some(&set), None) {
            eprintln!("fake-cli: could not block SIGTERM: {err}");
            return ExitCode::from(70);
        }
    }
    match run() {
        Ok(code) => code,
        Err(err) => {
            eprintln!("fake-cli: {err}");
            ExitCode::from(70)
        }
    }
}

fn run() -> io::Result<ExitCode> {
    if std::env::args().skip(1).eq(["--version"]) {
        let version = var("FAKE_CLI_VERSION").unwrap_or_else(|| "1.0.0-fake (fake-cli)".to_owned());
        println!("{version}");
        return Ok(ExitCode::SUCCESS);
    }
    let args_file = var("FAKE_CLI_ARGS_FILE").map(PathBuf::from);
    if let Some(path) = &args_file {
        let header = serde_json::json!({
            "argv": std::env::args().skip(1).collect::<Vec<_>>(),
            "cwd": std::env::current_dir()?.to_string_lossy(),
        });
        fs::write(path, format!("{header}\n"))?;
    }
    if let Some(path) = var("FAKE_CLI_ENV_FILE") {
        let env: BTreeMap<String, String> = std::env::vars().collect();
        fs::write(path, serde_json::to_string(&env)?)?;
    }
    if let Some(path) = var("FAKE_CLI_PARENT_ENVIRON_FILE") {
        // What a CLI could learn of the process that started it.
        let parent = std::os::unix::process::parent_id();
        let mut text = match fs::read(format!("/proc/{parent}/environ")) {
            Ok(bytes) => format!("read: {}", String::from_utf8_lossy(&bytes).replace('\0', "\n")),
            Err(err) => format!("refused: {err}"),
        };
        match fs::File::open(format!("/proc/{parent}/mem")) {
            Ok(_) => text.push_str("\nmem: opened"),
            Err(err) => text.push_str(&format!("\nmem: refused: {err}")),
        }
        fs::write(path, text)?;
    }
    if let Some(spec) = var("FAKE_CLI_WRITE_FILE") {
        let (name, content) = spec.split_once('=').unwrap_or((&spec, ""));
        fs::write(name, content)?;
    }
    let grandchild_mode = var("FAKE_CLI_GRANDCHILD");
    let grandchild = if let Some(mode) = grandchild_mode.filter(|m| m != "0" && m != "false") {
        let role = if mode == "setsid" { "sleeper-setsid" } else { "sleeper" };
        let child = Command::new(std::env::current_exe()?)
            .env("FAKE_CLI_ROLE", role)
            .stdin(Stdio::null())
            .stdout(Stdio::inherit())
            .stderr(Stdio::inherit())
            .spawn()?;
        // The grandchild is never waited for: it must be killed with the process group.
        Some(child.id())
    } else {
        None
    };
    if let Some(path) = var("FAKE_CLI_PID_FILE") {
        let pids = serde_json::json!({
            "pid": std::process::id(),
            "pgid": nix::unistd::getpgrp().as_raw(),
            "grandchild": grandchild,
        });
        let tmp = format!("{path}.tmp");
        fs::write(&tmp, pids.to_string())?;
        fs::rename(&tmp, &path)?;
    }

    let stdin_lines = Arc::new((Mutex::new(Stdin::default()), Condvar::new()));
    let mut reader = Some({
        let stdin_lines = stdin_lines.clone();
        thread::spawn(move || read_stdin(args_file.as_deref(), &stdin_lines))
    });
    let run_log = match var("FAKE_CLI_RUN_LOG") {
        Some(path) => Some(RunLog::start(path, &stdin_lines)?),
        None => None,
    };
    // A retry of a failed run answers: the prompt decides which fixture plays.
    let retry_fixture = var("FAKE_CLI_RETRY_FIXTURE");
    let retrying = match (&retry_fixture, reader.take_if(|_| retry_fixture.is_some())) {
        (Some(_), Some(reader)) => {
            let input = reader.join().unwrap_or_default();
            String::from_utf8_lossy(&input).contains("Retry notice:")
        }
        _ => false,
    };
    let fixture = if retrying { retry_fixture } else { var("FAKE_CLI_FIXTURE") };

    let mut out = io::stdout().lock();
    if let Some(lines) = var("FAKE_CLI_FLOOD_LINES").and_then(|n| n.parse::<u64>().ok()) {
        for n in 0..lines {
            writeln!(out, "{{\"type\":\"fake_cli_flood\",\"n\":{n}}}")?;
        }
        out.flush()?;
    }
    if let Some(bytes) = var("FAKE_CLI_OVERSIZED_LINE_BYTES").and_then(|n| n.parse::<usize>().ok())
    {
        let chunk = vec![b'x'; 64 * 1024];
        let mut left = bytes;
        while left > 0 {
            let n = left.min(chunk.len());
            out.write_all(&chunk[..n])?;
            left -= n;
        }
        out.write_all(b"\n")?;
        out.flush()?;
    }
    let delay = var("FAKE_CLI_LINE_DELAY_MS")
        .and_then(|ms| ms.parse::<u64>().ok())
        .map(Duration::from_millis);
    if let Some(fixture) = fixture {
        for line in fs::read_to_string(fixture)?.lines() {
            if let Some(count) = wait_directive(line) {
                let (lines, arrived) = &*stdin_lines;
                let mut seen =
                    lines.lock().map_err(|_| io::Error::other("stdin counter poisoned"))?;
                while seen.lines < count {
                    seen = arrived
                        .wait(seen)
                        .map_err(|_| io::Error::other("stdin counter poisoned"))?;
                }
                continue;
            }
            if let Some(delay) = delay {
                thread::sleep(delay);
            }
            writeln!(out, "{line}")?;
            out.flush()?;
        }
    }
    if let Some(text) = var("FAKE_CLI_STDERR").filter(|_| !retrying) {
        eprint!("{text}");
    }
    if flag("FAKE_CLI_HANG") {
        sleep_forever();
    }
    drop(out);
    // Like a real CLI, finish reading the input before exiting.
    if let Some(reader) = reader {
        let _ = reader.join();
    }
    let code = var("FAKE_CLI_EXIT_CODE").and_then(|code| code.parse::<u8>().ok()).unwrap_or(0);
    let code = if retrying { 0 } else { code };
    if let Some(run_log) = run_log {
        run_log.end();
    }
    Ok(ExitCode::from(code))
}

/// `Some(n)` for a `{"fake_cli":"wait_stdin_lines","count":n}` line.
fn wait_directive(line: &str) -> Option<usize> {
    let value: serde_json::Value = serde_json::from_str(line).ok()?;
    if value.get("fake_cli")?.as_str()? != "wait_stdin_lines" {
        return None;
    }
    value.get("count")?.as_u64().and_then(|n| usize::try_from(n).ok())
}

/// What has arrived on stdin so far.
#[derive(Debug, Default)]
struct Stdin {
    /// Whole lines.
    lines: usize,
    text: Vec<u8>,
    closed: bool,
}

/// Copies stdin to the args file (after its header) and counts its lines;
/// returns everything it read.
fn read_stdin(args_file: Option<&Path>, lines: &(Mutex<Stdin>, Condvar)) -> Vec<u8> {
    let mut input = Vec::new();
    let mut file = args_file.and_then(|path| fs::OpenOptions::new().append(true).open(path).ok());
    let mut stdin = io::stdin().lock();
    loop {
        let mut line = Vec::new();
        match stdin.read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => {
                if let Ok(mut seen) = lines.0.lock() {
                    seen.closed = true;
                    lines.1.notify_all();
                }
                break;
            }
            Ok(_) => {
                if let Some(file) = file.as_mut() {
                    let _ = file.write_all(&line);
                    let _ = file.flush();
                }
                if let Ok(mut seen) = lines.0.lock() {
                    seen.text.extend_from_slice(&line);
                    if line.ends_with(b"\n") {
                        seen.lines += 1;
                    }
                    lines.1.notify_all();
                }
                input.extend_from_slice(&line);
            }
        }
    }
    input
}

/// Unix time in milliseconds: one clock for the CLI and its witness.
fn now_ms() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_millis())
}

/// Appends `line` in one write, so a reader never sees half of it (the
/// CLI's signal thread and its witness append to the same file).
fn append_line(path: &str, line: &serde_json::Value) {
    if let Ok(mut file) = fs::OpenOptions::new().create(true).append(true).open(path) {
        let _ = file.write_all(format!("{line}\n").as_bytes());
    }
}

/// Blocks SIGTERM and records each one from a thread (the CLI goes on), and
/// starts the witness that records how the CLI ends. Returns the witness's pipe.
fn record_signals(log: &str) -> io::Result<std::process::ChildStdin> {
    let mut set = SigSet::empty();
    set.add(Signal::SIGTERM);
    sigprocmask(SigmaskHow::SIG_BLOCK, Some(&set), None).map_err(io::Error::other)?;
    let path = log.to_owned();
    thread::spawn(move || {
        while let Ok(signal) = set.wait() {
            append_line(
                &path,
                &serde_json::json!({ "signal": signal.as_str(), "at_ms": now_ms() }),
            );
        }
    });
    // In a process group of its own, without the gateway's process scope and
    // out of the run's cgroup, so neither a signal to the CLI's group nor the
    // kill of the run's descendants reaches it: it has to outlive the CLI to
    // say how the CLI ended.
    let mut witness = Command::new(std::env::current_exe()?)
        .env_remove("LEMON_PROCESS_SCOPE")
        .env("FAKE_CLI_ROLE", "witness")
        .env("FAKE_CLI_SIGNAL_LOG", log)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()?;
    leave_run_cgroup(witness.id())?;
    witness.stdin.take().ok_or_else(|| io::Error::other("the witness has no stdin"))
}

/// Moves `pid` from the run's cgroup (`…/lemon-runs/<scope>`, where the
/// gateway puts every child) to the gateway's own, above `lemon-runs`.
/// Nothing to do where the gateway tracks children by scope only.
fn leave_run_cgroup(pid: u32) -> io::Result<()> {
    let own = fs::read_to_string("/proc/self/cgroup")?;
    let Some(path) = own.lines().find_map(|line| line.strip_prefix("0::")) else { return Ok(()) };
    let Some((gateway, _scope)) = path.trim().rsplit_once("/lemon-runs/") else { return Ok(()) };
    let procs = format!("/sys/fs/cgroup{gateway}/cgroup.procs");
    fs::write(procs, pid.to_string())
}

/// The witness: waits for the CLI's pipe to close and records whether the CLI
/// said it was exiting first.
fn witness() -> ExitCode {
    let mut said = String::new();
    let _ = io::Read::read_to_string(&mut io::stdin(), &mut said);
    let event = if said.contains("exit") { "exited" } else { "killed" };
    if let Some(log) = var("FAKE_CLI_SIGNAL_LOG") {
        append_line(&log, &serde_json::json!({ "event": event, "at_ms": now_ms() }));
    }
    ExitCode::SUCCESS
}

/// `CLOCK_MONOTONIC` in nanoseconds: the clock every process of the machine shares.
fn monotonic_ns() -> i128 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .map_or(0, |now| i128::from(now.tv_sec()) * 1_000_000_000 + i128::from(now.tv_nsec()))
}

/// Appends `line` and a newline in one write.
fn append_text(path: &str, line: &str) {
    if let Ok(mut file) = fs::OpenOptions::new().create(true).append(true).open(path) {
        let _ = file.write_all(format!("{line}\n").as_bytes());
    }
}

/// The engine interval of this CLI in `FAKE_CLI_RUN_LOG`: the start once the
/// prompt is in, the end from the CLI itself or, when it is killed, from a
/// witness outside its process group.
struct RunLog {
    path: String,
    witness: std::process::ChildStdin,
}

impl RunLog {
    /// Waits for the prompt (stdin closed, or the first stream-json line of a
    /// steered run), logs the start and starts the witness.
    fn start(path: String, stdin: &(Mutex<Stdin>, Condvar)) -> io::Result<RunLog> {
        let (state, arrived) = stdin;
        let mut seen = state.lock().map_err(|_| io::Error::other("stdin state poisoned"))?;
        while !(seen.closed || (seen.lines > 0 && seen.text.first() == Some(&b'{'))) {
            seen = arrived.wait(seen).map_err(|_| io::Error::other("stdin state poisoned"))?;
        }
        let prompt = String::from_utf8_lossy(&seen.text).into_owned();
        drop(seen);
        let runs: Vec<&str> = prompt
            .split("msg:")
            .skip(1)
            .map(|rest| {
                let end = rest
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '_'))
                    .unwrap_or(rest.len());
                &rest[..end]
            })
            .filter(|run| !run.is_empty())
            .collect();
        let pid = std::process::id();
        append_text(&path, &format!("start {} {pid} {}", monotonic_ns(), runs.join(" ")));
        let mut witness = Command::new(std::env::current_exe()?)
            .env_remove("LEMON_PROCESS_SCOPE")
            .env("FAKE_CLI_ROLE", "run-witness")
            .env("FAKE_CLI_WITNESSED_PID", pid.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()?;
        leave_run_cgroup(witness.id())?;
        let witness =
            witness.stdin.take().ok_or_else(|| io::Error::other("the witness has no stdin"))?;
        Ok(RunLog { path, witness })
    }

    /// Logs the end, then tells the witness the CLI is exiting by itself.
    fn end(mut self) {
        append_text(&self.path, &format!("end {} {} exited", monotonic_ns(), std::process::id()));
        let _ = self.witness.write_all(b"exit\n");
    }
}

/// The run log's witness: when the CLI's pipe closes without its saying it
/// exits, logs its end as killed.
fn run_witness() -> ExitCode {
    let mut said = String::new();
    let _ = io::Read::read_to_string(&mut io::stdin(), &mut said);
    if !said.contains("exit") {
        if let (Some(log), Some(pid)) = (var("FAKE_CLI_RUN_LOG"), var("FAKE_CLI_WITNESSED_PID")) {
            append_text(&log, &format!("end {} {pid} killed", monotonic_ns()));
        }
    }
    ExitCode::SUCCESS
}

fn sleep_forever() -> ! {
    loop {
        thread::sleep(Duration::from_secs(3600));
    }
}
