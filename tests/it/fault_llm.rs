//! An LLM provider that stalls, resets connections and sends garbage, with the
//! native `lemon` engine on the real binary against the fake LLM server: a reset
//! before the first event is retried, one in the middle of an answer, garbled
//! SSE and a stalled stream each fail the run once with a clear error, and the
//! session's next message is answered.

use lemon_tests::fake_llm::{FakeLlm, Turn};
use serde_json::json;

use crate::fault_support::completions;
use crate::support::{home_with, Gateway};

const KEY: &str = "sk-test-fault-key";

/// A gateway whose default engine is `lemon` on `llm`, with `gateway_extra`
/// keys in its `[gateway]` section.
async fn gateway_on(llm: &FakeLlm, gateway_extra: &str) -> (Gateway, tempfile::TempDir) {
    use std::os::unix::fs::PermissionsExt;
    let home = home_with(&format!(
        "[gateway]\ndefault_engine = \"lemon\"\n{gateway_extra}\n[gateway.engines.lemon]\nbase_url = \"{}\"\nmodel = \"test-model\"\n",
        llm.base_url()
    ));
    let secrets = home.path().join("secrets.toml");
    std::fs::write(&secrets, format!("openai_api_key = \"{KEY}\"\n")).unwrap();
    std::fs::set_permissions(&secrets, std::fs::Permissions::from_mode(0o600)).unwrap();
    (Gateway::start_in(home.path()).await, home)
}

/// Runs `prompt` in session `s` and returns its record, checking it completed once.
async fn run(gateway: &Gateway, prompt: &str) -> serde_json::Value {
    let run_id = gateway.submit(json!({ "prompt": prompt, "session_key": "s" })).await;
    let record = gateway.wait(&run_id).await;
    assert_eq!(completions(gateway, &run_id).await, 1, "{record}");
    record
}

/// The run failed with an error a person can read, and the session goes on.
async fn fails_clearly_then_the_next_message_answers(
    gateway: &Gateway,
    llm: &FakeLlm,
    needle: &str,
) {
    let record = run(gateway, "the broken question").await;
    assert_eq!(record["status"], "failed", "{record}");
    let error = record["error"].as_str().unwrap_or_default();
    assert!(error.starts_with("the openai request failed: "), "{record}");
    assert!(error.contains(needle), "{needle:?} in {record}");
    assert!(!error.contains(KEY), "no key in the error: {record}");
    llm.rule("the next question", Turn::text(&["fine ", "again"]));
    let next = run(gateway, "the next question").await;
    assert_eq!(next["status"], "completed", "{next}");
    assert_eq!(next["answer"], "fine again", "{next}");
}

#[tokio::test]
async fn a_connection_reset_before_the_first_event_is_retried_and_answers() {
    let llm = FakeLlm::builder().api_key(KEY).start().await;
    llm.push(Turn::reset(&[]));
    llm.push(Turn::text(&["recovered ", "answer"]));
    let (gateway, _home) = gateway_on(&llm, "").await;
    let record = run(&gateway, "hello").await;
    assert_eq!(record["status"], "completed", "{record}");
    assert_eq!(record["answer"], "recovered answer", "{record}");
    assert_eq!(llm.requests().len(), 2, "one retry of the reset request");
}

#[tokio::test]
async fn a_connection_reset_in_the_middle_of_an_answer_fails_the_run_clearly() {
    let llm = FakeLlm::builder().api_key(KEY).start().await;
    llm.rule("the broken question", Turn::reset(&["half ", "an "]));
    let (gateway, _home) = gateway_on(&llm, "").await;
    fails_clearly_then_the_next_message_answers(&gateway, &llm, "connection closed").await;
}

#[tokio::test]
async fn garbled_sse_fails_the_run_clearly() {
    let llm = FakeLlm::builder().api_key(KEY).start().await;
    llm.rule("the broken question", Turn::garbage(&["partial "]));
    let (gateway, _home) = gateway_on(&llm, "").await;
    fails_clearly_then_the_next_message_answers(&gateway, &llm, "is not valid JSON").await;
}

#[tokio::test]
async fn a_stalled_stream_is_ended_by_the_inactivity_timeout() {
    let llm = FakeLlm::builder().api_key(KEY).start().await;
    llm.rule("the broken question", Turn::stall(&["thinking "]));
    let (gateway, _home) = gateway_on(&llm, "run_inactivity_timeout_ms = 1500").await;
    let record = run(&gateway, "the broken question").await;
    assert_eq!(record["status"], "failed", "{record}");
    assert_eq!(record["error_code"], "timeout", "{record}");
    llm.rule("the next question", Turn::text(&["fine ", "again"]));
    let next = run(&gateway, "the next question").await;
    assert_eq!(next["answer"], "fine again", "{next}");
}
