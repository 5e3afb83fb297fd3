//! How long a vendor CLI lives, with the real binary and the fake CLI: a cancelled
//! run ends only when its process is gone (and holds its session until then), no
//! CLI outlives a gateway killed with SIGKILL (its grandchildren are killed by the
//! next start, by recorded start time, so a reused pid is never signalled), and a
//! CLI's stderr reaches the log escaped, never as lines of its own.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use futures::StreamExt;
use serde_json::json;

use crate::cli_support::read_pids;
use crate::support::{command_with_path, home_with, Gateway, PATIENCE};

/// The first line of a Claude stream (its `init`): the run starts and, with
/// `FAKE_CLI_HANG`, never ends by itself.
fn init_only_fixture(dir: &Path) -> PathBuf {
    let source = lemon_tests::fake_cli::fixture("claude", "synth_tool_use_success.jsonl");
    let text = std::fs::read_to_string(source).unwrap();
    let path = dir.join("init-only.jsonl");
    std::fs::write(&path, format!("{}\n", text.lines().next().unwrap())).unwrap();
    path
}

/// `[gateway.engines.claude]` on the fake CLI; `env` is TOML inline-table text.
fn claude_config(env: &str, extra: &str) -> String {
    format!(
        "[gateway.engines.claude]\ncli_path = \"{}\"\n{extra}\nenv = {{ {env} }}\n",
        env!("CARGO_BIN_EXE_fake-cli")
    )
}

/// What `/proc/<pid>/stat` says: (running, start time, session). A zombie has exited.
fn stat(pid: i32) -> Option<(bool, u64, i32)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = text.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let running = fields[0] != "Z" && fields[0] != "X";
    Some((running, fields[19].parse().ok()?, fields[3].parse().ok()?))
}

fn running(pid: i32) -> bool {
    stat(pid).is_some_and(|(running, _, _)| running)
}

/// Polls (bounded) until `done`: the kernel delivers SIGKILL asynchronously.
async fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    let waited = tokio::time::timeout(PATIENCE, async {
        while !done() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(waited.is_ok(), "{what}");
}

async fn until_pid_file(path: &Path) {
    eventually("the fake CLI writes its pid file", || path.exists()).await;
}

/// Reads the run's event stream until an event of type `kind` has arrived.
async fn until_event(gateway: &Gateway, run_id: &str, kind: &str) {
    let response = gateway.get(&format!("/v1/runs/{run_id}/events")).send().await.unwrap();
    let mut parser = lemon_tests::event_stream::EventStream::default();
    let mut stream = response.bytes_stream();
    let seen = tokio::time::timeout(PATIENCE, async {
        while let Some(chunk) = stream.next().await {
            if parser.push(&chunk.unwrap()).iter().any(|event| event.event == kind) {
                return;
            }
        }
        panic!("stream of {run_id} ended before {kind}");
    })
    .await;
    assert!(seen.is_ok(), "{kind} of {run_id} in time");
}

#[tokio::test]
async fn a_cancelled_cli_run_is_cancelling_until_its_process_is_gone_and_holds_its_session() {
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("pids.json");
    let env = format!(
        "FAKE_CLI_FIXTURE = \"{}\", FAKE_CLI_HANG = \"1\", FAKE_CLI_IGNORE_SIGTERM = \"1\", FAKE_CLI_PID_FILE = \"{}\"",
        init_only_fixture(dir.path()).display(),
        pid_file.display()
    );
    let gateway = Gateway::start(&claude_config(&env, "cancel_grace_ms = 1500")).await;
    let first =
        gateway.submit(json!({ "prompt": "first", "session_key": "s", "engine": "claude" })).await;
    until_pid_file(&pid_file).await;
    let first_pids = read_pids(&pid_file);
    std::fs::remove_file(&pid_file).unwrap();
    let second =
        gateway.submit(json!({ "prompt": "second", "session_key": "s", "engine": "claude" })).await;

    let cancel = gateway.post(&format!("/v1/runs/{first}/cancel")).send().await.unwrap();
    assert_eq!(cancel.status(), 202);
    let mut cancelling_while_alive = false;
    let completed = tokio::time::timeout(PATIENCE, async {
        loop {
            // The second run first, then the first: if the first is still
            // cancelling after, it was when the second was looked at.
            let second_started = pid_file.exists();
            let first_status = gateway.run(&first).await["status"].clone();
            match first_status.as_str().unwrap() {
                "running" => {}
                "cancelling" => {
                    assert!(!second_started, "the session's next run started beside the first");
                    cancelling_while_alive |= running(first_pids.pid);
                }
                "cancelled" => {
                    assert!(!running(first_pids.pid), "cancelled only once its process is gone");
                    return;
                }
                other => panic!("unexpected status {other}"),
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(completed.is_ok(), "the cancelled run completes");
    assert!(cancelling_while_alive, "the run is `cancelling` while its process lives");

    let events = gateway.events(&first).await;
    let statuses: Vec<&serde_json::Value> =
        events.iter().filter(|(kind, _)| kind == "run_status").map(|(_, data)| data).collect();
    assert_eq!(statuses.len(), 1, "{events:?}");
    assert_eq!(statuses[0]["status"], "cancelling");
    let record = gateway.run(&first).await;
    assert_eq!(record["status"], "cancelled", "{record}");
    assert_eq!(record["error_code"], "user_requested", "{record}");

    // Only now does the session go on.
    until_pid_file(&pid_file).await;
    let second_pids = read_pids(&pid_file);
    assert_ne!(second_pids.pid, first_pids.pid);
    assert_eq!(gateway.run(&second).await["status"], "running");
}

#[tokio::test]
async fn no_cli_outlives_a_killed_gateway_and_the_next_start_kills_what_it_left() {
    let scratch = tempfile::tempdir().unwrap();
    let pid_file = scratch.path().join("pids.json");
    let env = format!(
        "FAKE_CLI_FIXTURE = \"{}\", FAKE_CLI_HANG = \"1\", FAKE_CLI_GRANDCHILD = \"1\", FAKE_CLI_PID_FILE = \"{}\"",
        init_only_fixture(scratch.path()).display(),
        pid_file.display()
    );
    let home = home_with(&claude_config(&env, ""));
    let mut gateway = Gateway::start_in(home.path()).await;
    let run_id = gateway.submit(json!({ "prompt": "hang", "engine": "claude" })).await;
    // The group is recorded before the run sees its first engine event.
    until_event(&gateway, &run_id, "engine_started").await;
    let pids = read_pids(&pid_file);
    let grandchild = pids.grandchild.expect("the fake started a grandchild");
    assert!(running(pids.pid) && running(grandchild));

    gateway.child.kill().await.unwrap();
    eventually("the CLI dies with the gateway", || !running(pids.pid)).await;
    // Nothing signals a grandchild when the gateway dies: the next start must.
    assert!(running(grandchild), "the grandchild outlived the gateway");

    let gateway = Gateway::start_in(home.path()).await;
    let health = gateway.http.get(format!("{}/healthz", gateway.health)).send().await.unwrap();
    assert_eq!(health.status(), 200);
    eventually("the next start killed the grandchild", || !running(grandchild)).await;
    assert!(!running(pids.pid));
}

/// A process in its own group, as a CLI run leaves it: the fake in its sleeper role.
fn sleeper() -> tokio::process::Child {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_fake-cli"))
        .env("FAKE_CLI_ROLE", "sleeper")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

#[tokio::test]
async fn a_start_kills_a_recorded_group_but_never_a_process_that_reused_its_pid() {
    use lemon_core::store::{ProcessGroupRecord, StoreHandle};

    let home = home_with("");
    let mut left_behind = sleeper();
    let mut unrelated = sleeper();
    let record = |child: &tokio::process::Child, start_time_shift: u64| {
        let pid = child.id().unwrap() as i32;
        let (_, start_time, session) = stat(pid).unwrap();
        ProcessGroupRecord {
            pgid: pid,
            start_time: start_time - start_time_shift,
            session,
            scope: 0,
        }
    };
    {
        let store = StoreHandle::open_sqlite(&home.path().join("lemon.db")).unwrap();
        store.record_process_group(record(&left_behind, 0)).await.unwrap();
        // A record of an earlier process whose pid the unrelated one has now.
        store.record_process_group(record(&unrelated, 1)).await.unwrap();
        store.close().await.unwrap();
    }

    let mut gateway = Gateway::start_in(home.path()).await;
    let status = tokio::time::timeout(PATIENCE, left_behind.wait()).await.unwrap().unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(9), "the recorded group was killed");
    assert!(unrelated.try_wait().unwrap().is_none(), "a reused pid is never signalled");
    // The records were forgotten durably before the gateway reported ready.
    gateway.child.kill().await.unwrap();

    let store = StoreHandle::open_sqlite(&home.path().join("lemon.db")).unwrap();
    assert_eq!(store.process_groups().await.unwrap(), [], "leftover records are forgotten");
    store.close().await.unwrap();
    unrelated.kill().await.unwrap();
}

/// Text a CLI writes to stderr that would forge a log entry and colour the
/// terminal if it reached the log as it is.
const FORGED: &str = "\n2026-01-01T00:00:00Z  INFO forged entry\u{1b}[31m";

async fn log_of_a_failing_cli(log_format: &str) -> String {
    let scratch = tempfile::tempdir().unwrap();
    let env = format!(
        "FAKE_CLI_FIXTURE = \"{}\", FAKE_CLI_EXIT_CODE = \"2\", FAKE_CLI_STDERR = \"fatal: bad state\\n2026-01-01T00:00:00Z  INFO forged entry\\u001b[31m\"",
        init_only_fixture(scratch.path()).display(),
    );
    let home = home_with(&claude_config(&env, ""));
    let log_path = scratch.path().join("gateway.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let mut command = command_with_path(home.path(), &std::env::var("PATH").unwrap_or_default());
    command.arg("--log-format").arg(log_format);
    let gateway = Gateway::spawn_with_stderr(command, home.path(), log.into()).await;
    let run_id = gateway.submit(json!({ "prompt": "fail", "engine": "claude" })).await;
    let record = gateway.wait(&run_id).await;
    assert_eq!(record["status"], "failed", "{record}");
    // The API keeps the engine's text as it is; only the log escapes it.
    assert!(record["error"].as_str().unwrap().ends_with(FORGED.trim_start()), "{record}");
    assert!(gateway.terminate().await.success());
    std::fs::read_to_string(&log_path).unwrap()
}

fn assert_forged_text_only_escaped(log: &str) -> &str {
    // The human format colours its own fields; the CLI's escape must not get through.
    assert!(!log.contains("forged entry\u{1b}"), "no raw escape from the CLI: {log}");
    assert!(
        !log.lines().any(|line| line.starts_with("2026-01-01T00:00:00Z")),
        "no forged entry: {log}"
    );
    let lines: Vec<&str> = log.lines().filter(|line| line.contains("forged entry")).collect();
    // The failure has no answer, so it is retried once, and the retry fails alike.
    assert_eq!(lines.len(), 2, "the text is in one log line per run: {log}");
    assert!(lines.iter().all(|line| line.contains("run failed")), "{lines:?}");
    assert!(lines[1].contains(".retry"), "the second is the retry: {}", lines[1]);
    lines[0]
}

#[tokio::test]
async fn a_cli_stderr_reaches_the_text_log_escaped_within_one_line() {
    let log = log_of_a_failing_cli("human").await;
    let line = assert_forged_text_only_escaped(&log);
    assert!(
        line.contains("fatal: bad state\\n2026-01-01T00:00:00Z  INFO forged entry\\u{1b}[31m"),
        "{line}"
    );
}

#[tokio::test]
async fn a_cli_stderr_reaches_the_json_log_escaped_within_one_line() {
    let log = log_of_a_failing_cli("json").await;
    let line = assert_forged_text_only_escaped(&log);
    let entry: serde_json::Value = serde_json::from_str(line).unwrap();
    let error = entry["fields"]["error"].as_str().unwrap();
    assert!(
        error.ends_with("fatal: bad state\\n2026-01-01T00:00:00Z  INFO forged entry\\u{1b}[31m"),
        "{error}"
    );
}
