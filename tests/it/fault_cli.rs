//! Vendor CLIs that misbehave, with the real binary and the fake CLI as Claude:
//! one that crashes, hangs, floods stdout, prints a 100 MB line, ignores SIGTERM,
//! or leaves grandchildren behind (in its group, or out of it with `setsid`).
//! Each run ends with exactly one completion and a clear error, no process of it
//! survives (checked in `/proc`), and the gateway's memory stays bounded.

use serde_json::json;

use crate::fault_support::{
    alive, claude_config, completions, eventually, init_only_fixture, live_with_env, pids, rss_kib,
    success_fixture, until_event,
};
use crate::support::{home_with, Gateway, PATIENCE};

/// What the fake CLI's signal log says: (what, at_ms) in order. Only whole
/// lines: the last one may still be being written when it is read.
fn signal_log(path: &std::path::Path) -> Vec<(String, u128)> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let whole = text.rfind('\n').map_or("", |end| &text[..end]);
    whole
        .lines()
        .map(|line| {
            let value: serde_json::Value = serde_json::from_str(line).unwrap();
            let what = value["signal"].as_str().or(value["event"].as_str()).unwrap().to_owned();
            (what, u128::from(value["at_ms"].as_u64().unwrap()))
        })
        .collect()
}

#[tokio::test]
async fn a_cancel_sends_sigterm_first_and_sigkill_only_after_cancel_grace() {
    const GRACE_MS: u128 = 800;
    let scratch = tempfile::tempdir().unwrap();
    let log = scratch.path().join("signals.jsonl");
    let env = [
        ("FAKE_CLI_FIXTURE", init_only_fixture(scratch.path()).display().to_string()),
        ("FAKE_CLI_HANG", "1".to_owned()),
        ("FAKE_CLI_SIGNAL_LOG", log.display().to_string()),
    ];
    let gateway =
        Gateway::start(&claude_config(&env, &format!("cancel_grace_ms = {GRACE_MS}"))).await;
    let run_id = gateway.submit(json!({ "prompt": "hang" })).await;
    until_event(&gateway, &run_id, "engine_started").await;

    let cancel = gateway.post(&format!("/v1/runs/{run_id}/cancel")).send().await.unwrap();
    assert_eq!(cancel.status(), 202);
    let record = gateway.wait(&run_id).await;
    assert_eq!(record["status"], "cancelled", "{record}");
    assert_eq!(record["error_code"], "user_requested", "{record}");

    // The witness writes its line once the CLI is gone, which the completion
    // waited for; it may still be on its way to the file.
    eventually("the witness saw the CLI die", || signal_log(&log).len() >= 2).await;
    let seen = signal_log(&log);
    let names: Vec<&str> = seen.iter().map(|(what, _)| what.as_str()).collect();
    assert_eq!(names, ["SIGTERM", "killed"], "one SIGTERM, then death by SIGKILL: {seen:?}");
    // The fake stamps SIGTERM when its signal thread wakes, which under the
    // whole suite's load can be a good part of the grace after the gateway
    // sent it (the grace runs from the send): the gap it sees is the grace
    // less that delay. Half the grace still tells a SIGKILL that waited for
    // the grace from one sent with the SIGTERM.
    const HANDLER_DELAY_MS: u128 = GRACE_MS / 2;
    let waited = seen[1].1 - seen[0].1;
    assert!(
        waited + HANDLER_DELAY_MS >= GRACE_MS,
        "SIGKILL came {waited} ms after the fake saw SIGTERM, before the grace"
    );
    assert_eq!(completions(&gateway, &run_id).await, 1);
}

#[tokio::test]
async fn a_cli_that_crashes_ends_its_run_once_with_its_exit_status_and_stderr() {
    let scratch = tempfile::tempdir().unwrap();
    let fixture = init_only_fixture(scratch.path());
    let env = [
        ("FAKE_CLI_FIXTURE", fixture.display().to_string()),
        ("FAKE_CLI_EXIT_CODE", "3".to_owned()),
        ("FAKE_CLI_STDERR", "panic: corrupted session state\n".to_owned()),
    ];
    let gateway = Gateway::start(&claude_config(&env, "")).await;
    let run_id = gateway.submit(json!({ "prompt": "crash" })).await;
    let record = gateway.wait(&run_id).await;
    assert_eq!(record["status"], "failed", "{record}");
    let error = record["error"].as_str().unwrap();
    assert!(error.contains("exited with status 3"), "{record}");
    assert!(error.contains("panic: corrupted session state"), "{record}");
    // A failure without an answer is retried once; the retry crashes the same way
    // and is the last word.
    let retry = gateway.wait_for_submitted(&format!("{run_id}.retry")).await;
    assert_eq!(retry["status"], "failed", "{retry}");
    assert!(retry["error"].as_str().unwrap().contains("exited with status 3"), "{retry}");
    for id in [run_id.clone(), format!("{run_id}.retry")] {
        let events = gateway.events(&id).await;
        let n = events.iter().filter(|(kind, _)| kind == "run_completed").count();
        assert_eq!(n, 1, "{id}: {events:?}");
    }
    let entry = format!("FAKE_CLI_FIXTURE={}", fixture.display());
    eventually("no fake CLI is left", || live_with_env(&entry).is_empty()).await;
}

#[tokio::test]
async fn a_hung_cli_is_killed_by_the_inactivity_timeout() {
    let scratch = tempfile::tempdir().unwrap();
    let pid_file = scratch.path().join("pids.json");
    let env = [
        ("FAKE_CLI_FIXTURE", init_only_fixture(scratch.path()).display().to_string()),
        ("FAKE_CLI_HANG", "1".to_owned()),
        ("FAKE_CLI_IGNORE_SIGTERM", "1".to_owned()),
        ("FAKE_CLI_PID_FILE", pid_file.display().to_string()),
    ];
    let gateway = Gateway::start(&claude_config(&env, "timeout_ms = 1000")).await;
    let run_id = gateway.submit(json!({ "prompt": "hang" })).await;
    let (pid, _) = pids(&pid_file).await;
    let record = gateway.wait(&run_id).await;
    assert_eq!(record["status"], "failed", "{record}");
    assert_eq!(record["error_code"], "timeout", "{record}");
    assert!(!alive(pid), "the hung CLI is gone when its run completes");
    assert_eq!(completions(&gateway, &run_id).await, 1);
}

#[tokio::test]
async fn a_cli_flooding_stdout_is_read_to_its_answer_in_bounded_memory() {
    let env = [
        ("FAKE_CLI_FIXTURE", success_fixture().display().to_string()),
        ("FAKE_CLI_FLOOD_LINES", "300000".to_owned()),
    ];
    let gateway = Gateway::start(&claude_config(&env, "")).await;
    let before = rss_kib(gateway.pid());
    let run_id = gateway.submit(json!({ "prompt": "flood" })).await;
    let record = gateway.wait(&run_id).await;
    assert_eq!(record["status"], "completed", "{record}");
    assert_eq!(record["answer"], "There are 2 test files.", "{record}");
    let after = rss_kib(gateway.pid());
    // 300 000 lines (about 10 MB) went through; none of them is kept.
    assert!(after < before + 64 * 1024, "RSS grew from {before} KiB to {after} KiB");
    let events = gateway.events(&run_id).await;
    assert!(events.len() < 100, "the flood made no events: {} events", events.len());
}

#[tokio::test]
async fn a_100_mb_line_is_skipped_with_a_warning_and_the_run_answers() {
    let env = [
        ("FAKE_CLI_FIXTURE", success_fixture().display().to_string()),
        ("FAKE_CLI_OVERSIZED_LINE_BYTES", "100000000".to_owned()),
    ];
    let gateway = Gateway::start(&claude_config(&env, "")).await;
    let before = rss_kib(gateway.pid());
    let run_id = gateway.submit(json!({ "prompt": "big line" })).await;
    let record = gateway.wait(&run_id).await;
    assert_eq!(record["status"], "completed", "{record}");
    assert_eq!(record["answer"], "There are 2 test files.", "{record}");
    let after = rss_kib(gateway.pid());
    assert!(after < before + 64 * 1024, "RSS grew from {before} KiB to {after} KiB");
    let events = gateway.events(&run_id).await;
    let warning = events
        .iter()
        .find(|(_, data)| data.to_string().contains("Oversized JSONL line skipped"))
        .map(|(_, data)| data.to_string());
    let warning = warning.expect("the skipped line is reported");
    assert!(warning.contains("\"limit\":8388608"), "with the limit it broke: {warning}");
}

/// A CLI that leaves a grandchild holding its stdout (in its group, or out of
/// it with `setsid`): the run still ends, and the grandchild with it.
async fn grandchild_dies_with_its_run(mode: &str) {
    let scratch = tempfile::tempdir().unwrap();
    let pid_file = scratch.path().join("pids.json");
    let env = [
        ("FAKE_CLI_FIXTURE", success_fixture().display().to_string()),
        ("FAKE_CLI_GRANDCHILD", mode.to_owned()),
        ("FAKE_CLI_PID_FILE", pid_file.display().to_string()),
    ];
    let gateway = Gateway::start(&claude_config(&env, "cancel_grace_ms = 500")).await;
    let run_id = gateway.submit(json!({ "prompt": "daemonise" })).await;
    let (pid, grandchild) = pids(&pid_file).await;
    let grandchild = grandchild.expect("the fake started a grandchild");
    let record = gateway.wait(&run_id).await;
    assert_eq!(record["status"], "completed", "{mode}: {record}");
    assert_eq!(record["answer"], "There are 2 test files.", "{mode}: {record}");
    assert!(!alive(pid), "{mode}: the CLI is gone");
    assert!(!alive(grandchild), "{mode}: the grandchild died with the run");
}

#[tokio::test]
async fn a_grandchild_in_the_cli_group_dies_with_its_run() {
    grandchild_dies_with_its_run("1").await;
}

#[tokio::test]
async fn a_grandchild_that_left_the_group_with_setsid_dies_with_its_run() {
    grandchild_dies_with_its_run("setsid").await;
}

#[tokio::test]
async fn a_setsid_grandchild_left_by_a_killed_gateway_is_killed_by_the_next_start() {
    let scratch = tempfile::tempdir().unwrap();
    let pid_file = scratch.path().join("pids.json");
    let env = [
        ("FAKE_CLI_FIXTURE", init_only_fixture(scratch.path()).display().to_string()),
        ("FAKE_CLI_HANG", "1".to_owned()),
        ("FAKE_CLI_GRANDCHILD", "setsid".to_owned()),
        ("FAKE_CLI_PID_FILE", pid_file.display().to_string()),
    ];
    let home = home_with(&claude_config(&env, ""));
    let mut gateway = Gateway::start_in(home.path()).await;
    let run_id = gateway.submit(json!({ "prompt": "hang" })).await;
    until_event(&gateway, &run_id, "engine_started").await;
    let (pid, grandchild) = pids(&pid_file).await;
    let grandchild = grandchild.unwrap();
    eventually("the grandchild is in a session of its own", || {
        std::fs::read_to_string(format!("/proc/{grandchild}/stat")).is_ok_and(|stat| {
            stat.rsplit_once(')').is_some_and(|(_, rest)| {
                rest.split_whitespace().nth(3) == Some(&grandchild.to_string())
            })
        })
    })
    .await;

    gateway.child.kill().await.unwrap();
    eventually("the CLI dies with the gateway", || !alive(pid)).await;
    // Neither the parent-death signal nor the group reaches it.
    assert!(alive(grandchild), "the setsid grandchild outlived the gateway");

    let gateway = Gateway::start_in(home.path()).await;
    eventually("the next start killed the setsid grandchild", || !alive(grandchild)).await;
    let record = tokio::time::timeout(PATIENCE, gateway.wait(&run_id)).await.unwrap();
    assert_eq!(record["error_code"], "interrupted", "{record}");
}
