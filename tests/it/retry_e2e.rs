//! The zero-answer retry on the real binary with the fake CLI: a run that fails
//! with a blank answer on an engine error is resubmitted once with the Retry
//! notice, and the channel hears one answer, the retry's.

use serde_json::{json, Value};

use lemon_tests::fake_telegram::ChatSpec;

use crate::support::Gateway;
use crate::telegram_e2e::{config, fake_telegram, start, wait_for_reply, USER};

fn fixture(name: &str) -> String {
    format!("{}/fixtures/cli/codex/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// `[gateway.engines.codex]` failing its turn with no answer, and answering
/// `pong` when the prompt carries the Retry notice.
fn codex_failing_once(args: &std::path::Path) -> String {
    format!(
        "[gateway.engines.codex]\ncli_path = \"{}\"\nenv = {{ FAKE_CLI_FIXTURE = \"{}\", FAKE_CLI_RETRY_FIXTURE = \"{}\", FAKE_CLI_ARGS_FILE = \"{}\" }}\n{}",
        env!("CARGO_BIN_EXE_fake-cli"),
        fixture("synth_reconnect_then_turn_failed.jsonl"),
        fixture("test_fake_cli_pong.jsonl"),
        args.display(),
        crate::support::TRUST_EVERY_CALL,
    )
}

/// Both runs, oldest first: the failed one and its retry, with what proves it.
async fn the_two_runs(gateway: &Gateway) -> (Value, Value) {
    let runs: Value = gateway.get("/v1/runs").send().await.unwrap().json().await.unwrap();
    let runs = runs["runs"].as_array().unwrap().clone();
    assert_eq!(runs.len(), 2, "the request and its one retry: {runs:?}");
    let (retry, failed) =
        match runs.iter().position(|r| r["meta"].get("zero_answer_retry_attempt").is_some()) {
            Some(0) => (runs[0].clone(), runs[1].clone()),
            Some(_) => (runs[1].clone(), runs[0].clone()),
            None => panic!("no run records a retry: {runs:?}"),
        };
    let failed = gateway.run(failed["run_id"].as_str().unwrap()).await;
    let retry = gateway.run(retry["run_id"].as_str().unwrap()).await;
    assert_eq!(failed["status"], "failed", "{failed}");
    assert_eq!(retry["status"], "completed", "{retry}");
    assert_eq!(retry["answer"], "pong", "{retry}");
    assert_eq!(retry["meta"]["zero_answer_retry_attempt"], 1, "{retry}");
    assert_eq!(retry["meta"]["zero_answer_retry_of_run"], failed["run_id"], "{retry}");
    let reason = retry["meta"]["zero_answer_retry_reason"].as_str().unwrap();
    assert!(reason.contains("stream disconnected"), "{retry}");
    assert_eq!(retry["session_key"], failed["session_key"], "the same session");
    let events = gateway.events(failed["run_id"].as_str().unwrap()).await;
    let (_, completed) = events.iter().find(|(kind, _)| kind == "run_completed").unwrap();
    assert_eq!(completed["retried_by"], retry["run_id"], "{completed}");
    (failed, retry)
}

fn assert_retry_prompt(args: &std::path::Path, original: &str) {
    let seen = std::fs::read_to_string(args).unwrap();
    for part in
        ["Retry notice:", "check for partially completed work", "Original request:", original]
    {
        assert!(seen.contains(part), "{part:?} in the retry's prompt: {seen}");
    }
}

#[tokio::test]
async fn a_webhook_sync_request_gets_the_retrys_answer_once() {
    let scratch = tempfile::tempdir().unwrap();
    let args = scratch.path().join("args");
    let config = format!(
        "[gateway]\nenable_webhook = true\ndefault_engine = \"codex\"\ndefault_cwd = \"{}\"\n{}\
         [gateway.webhook]\nport = 0\n\
         [gateway.webhook.integrations.ci]\ntoken = \"hook-token-retry\"\nmode = \"sync\"\n",
        scratch.path().display(),
        codex_failing_once(&args),
    );
    let gateway = Gateway::start(&config).await;
    let body = json!({ "prompt": "ping the build" });
    let response = gateway.post_webhook("ci", "hook-token-retry", &body).await;
    assert_eq!(response.status(), 200);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["answer"], "pong", "{body}");
    assert_ne!(body["status"], "failed", "{body}");
    let (failed, _) = the_two_runs(&gateway).await;
    assert_eq!(body["run_id"], failed["run_id"], "the request keeps its id: {body}");
    assert_retry_prompt(&args, "ping the build");
    gateway.terminate().await;
}

#[tokio::test]
async fn a_telegram_chat_gets_one_answer_the_retrys() {
    let fake = fake_telegram().await;
    let scratch = tempfile::tempdir().unwrap();
    let args = scratch.path().join("args");
    let extra =
        format!("default_cwd = \"{}\"\n{}", scratch.path().display(), codex_failing_once(&args));
    let gateway = start(&fake, &config(&fake, "engine = \"codex\"", &extra)).await;
    let chat = ChatSpec::private(USER);
    let asked = fake.inject_text(&chat, USER, "ping the build");
    wait_for_reply(&fake, USER, asked.message_id, "pong").await;
    the_two_runs(&gateway).await;
    let replies: Vec<String> = fake.snapshot(|s| {
        s.messages(USER)
            .into_iter()
            .filter(|m| m.reply_to == Some(asked.message_id))
            .map(|m| m.text.clone())
            .collect()
    });
    assert!(
        replies.iter().all(|text| !text.contains("stream disconnected")),
        "the failure is not delivered: {replies:?}"
    );
    assert_eq!(replies.iter().filter(|text| text.contains("pong")).count(), 1, "{replies:?}");
    assert_retry_prompt(&args, "ping the build");
    gateway.terminate().await;
}
