//! The zero-answer retry through the router: queued once in the same session,
//! followed by the request's follower, and recovered after a restart.

use super::*;
use crate::gateway::retry::{ATTEMPT_KEY, OF_RUN_KEY, REASON_KEY};
use crate::store::JournalState;

fn completed_answer(event: &Arc<BusEvent>) -> (bool, String) {
    match &event.kind {
        EventKind::RunCompleted { completion, .. } => (completion.ok, completion.answer.clone()),
        other => panic!("not a completion: {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn a_blank_failure_is_retried_once_and_its_follower_gets_the_retrys_answer() {
    let mut h = harness(router_config()).await;
    let (accepted, mut follower) = match h.router.submit(request("s", "fail", None)).await {
        Ok(Submitted::Run(accepted, follower)) => (accepted, follower),
        other => panic!("expected a run, got {other:?}"),
    };
    let failed = accepted.run_id;
    let retry = RunId::parse(&format!("{failed}.retry")).unwrap();
    let last = crate::testing::within("the answer", follower.completion()).await.unwrap();
    let (ok, answer) = completed_answer(&last);
    assert!(ok, "the retry answers: {answer}");
    // The fake takes the first word as its command and streams the rest.
    assert!(answer.starts_with("notice: the previous attempt failed"), "{answer}");
    assert!(answer.contains("Original request: fail"), "{answer}");
    assert_eq!(follower.run_id(), &retry);

    let first = h.completion_of(&failed).await;
    assert_eq!(first.retried_by.as_ref(), Some(&retry));
    assert_eq!(code(&first), Some("engine_error"));
    let started = h.fake.started();
    assert_eq!(started.len(), 2, "the request and one retry: {started:?}");
    assert_eq!(started[0], "fail");
    let record = h.store.get_run(retry.as_str()).await.unwrap().unwrap();
    assert_eq!(record.session_key.as_str(), "s");
    assert_eq!(record.meta[ATTEMPT_KEY], 1);
    assert_eq!(record.meta[OF_RUN_KEY], failed.as_str());
    assert_eq!(record.meta[REASON_KEY], "boom");
    h.settled(&retry).await;
    assert_eq!(h.store.journal_pending().await.unwrap(), []);
}

#[tokio::test(start_paused = true)]
async fn a_failure_with_text_is_not_retried() {
    let mut h = harness(router_config()).await;
    let run_id = h.submit("s", "fail half an answer", None).await;
    let completion = h.completion_of(&run_id).await;
    assert_eq!(code(&completion), Some("engine_error"));
    assert_eq!(completion.retried_by, None);
    h.settled(&run_id).await;
    assert_eq!(h.fake.started(), ["fail half an answer"]);
}

/// The gateway stopped after the failed run's completion was stored, before
/// the router journaled the retry it names: the next start runs the retry.
#[tokio::test(start_paused = true)]
async fn a_retry_named_before_a_crash_runs_at_the_next_start() {
    let store = StoreHandle::memory();
    let failed = journaled("r-failed", 1, "fix it", JournalState::Started);
    leave_row(&store, &failed).await;
    let mut completion =
        Completion::failure(RunError::Engine { message: "HTTP 400: ".into() }, None);
    let retry = RunId::parse("r-failed.retry").unwrap();
    completion.retried_by = Some(retry.clone());
    let end = crate::gateway::RunEnd {
        run_id: failed.run_id.clone(),
        session_key: "s".into(),
        index: 1,
        engine: "fake".to_owned(),
        completion,
        duration_ms: 1,
        spend: Default::default(),
    };
    crate::gateway::complete(&EventBus::default(), &store, end).await;

    let mut h = harness_with(router_config(), FakeEngine::new("fake"), store.clone()).await;
    let answer = h.completion_of(&retry).await;
    assert!(answer.ok, "{answer:?}");
    let started = h.fake.started();
    assert_eq!(started.len(), 1, "only the retry runs: {started:?}");
    assert!(started[0].starts_with("Retry notice:") && started[0].ends_with("fix it"));
    let record = store.get_run(retry.as_str()).await.unwrap().unwrap();
    assert_eq!(record.meta[OF_RUN_KEY], "r-failed");
    assert_eq!(record.meta[REASON_KEY], "HTTP 400: ");
    h.settled(&retry).await;
    assert_eq!(store.journal_pending().await.unwrap(), []);
}
