use super::*;
use crate::bus::EventBus;
use crate::engine::{Completion, ResumeToken, RunError};
use crate::store::NewRun;
use crate::testing::within;

fn run_id() -> RunId {
    RunId::parse("r1").unwrap()
}

fn delta(index: u64) -> Arc<BusEvent> {
    event(index, EventKind::Delta { seq: index, text: format!("d{index}") })
}

fn event(index: u64, kind: EventKind) -> Arc<BusEvent> {
    Arc::new(BusEvent { run_id: run_id(), session_key: "s".into(), index, ts_ms: 7, kind })
}

fn completed(index: u64, completion: Completion) -> Arc<BusEvent> {
    event(index, EventKind::RunCompleted { completion, engine: "echo".into(), duration_ms: 3 })
}

async fn store_with_run() -> StoreHandle {
    let store = StoreHandle::memory();
    store
        .insert_run(NewRun {
            run_id: run_id(),
            session_key: "s".into(),
            conversation: "session:s".to_owned(),
            engine: "echo".to_owned(),
            prompt: "hi".to_owned(),
            meta: serde_json::json!({}),
            created_at_ms: 1,
            resumed_from: None,
        })
        .await;
    store
}

/// Queued for the store, then published: the order every publisher keeps.
/// A follower of the run over `bus` and `store`; `fresh` as for [`RunFollower::new`].
fn follow_run(bus: &EventBus, store: &StoreHandle, fresh: bool) -> RunFollower {
    RunFollower::new(run_id(), bus.subscribe_run(&run_id()), store.clone(), fresh)
}

async fn emit(bus: &EventBus, store: &StoreHandle, event: Arc<BusEvent>) {
    store.append_event(event.clone()).await;
    bus.publish(event);
}

/// Everything the follower hands out, as (type, index), until it ends.
async fn collect(follower: &mut RunFollower) -> Vec<(String, u64)> {
    within("the follower to end", async {
        let mut seen = Vec::new();
        while let Some(event) = follower.next().await {
            seen.push((event.type_name().to_owned(), event.index()));
        }
        seen
    })
    .await
}

fn expected(deltas: u64) -> Vec<(String, u64)> {
    let mut all: Vec<(String, u64)> = (1..=deltas).map(|i| ("delta".to_owned(), i)).collect();
    all.push(("run_completed".to_owned(), deltas + 1));
    all
}

#[tokio::test]
async fn events_before_and_after_subscribing_are_joined_without_gaps_or_repeats() {
    let bus = EventBus::default();
    let store = store_with_run().await;
    // Published before anyone followed.
    emit(&bus, &store, delta(1)).await;
    emit(&bus, &store, delta(2)).await;
    let mut follower = follow_run(&bus, &store, false);
    // Live and in the first store read alike.
    emit(&bus, &store, delta(3)).await;
    // A phase is a hint, not one of the run's events.
    bus.publish(event(0, EventKind::Phase(crate::bus::RunPhase::Streaming)));
    let first = within("the first event", follower.next()).await.unwrap();
    assert!(matches!(first, Followed::Stored(_)), "stored events come from the store: {first:?}");
    emit(&bus, &store, delta(4)).await;
    emit(&bus, &store, completed(5, Completion::success("d1d2d3d4", None))).await;
    let mut seen = vec![(first.type_name().to_owned(), first.index())];
    seen.extend(collect(&mut follower).await);
    assert_eq!(seen, expected(4));
}

#[tokio::test]
async fn a_run_that_finished_before_following_ends_with_its_stored_completion() {
    let bus = EventBus::default();
    let store = store_with_run().await;
    emit(&bus, &store, delta(1)).await;
    let error = RunError::EngineUnavailable { engine: "claude".into(), reason: "not found".into() };
    let resume = Some(ResumeToken::new("claude", "abc"));
    let completion = Completion::failure(error, resume);
    emit(&bus, &store, completed(2, completion.clone())).await;

    let mut follower = follow_run(&bus, &store, false);
    assert_eq!(collect(&mut follower).await, expected(1));

    // The typed completion is the one that was published.
    let bus = EventBus::default();
    let store = store_with_run().await;
    emit(&bus, &store, completed(1, completion.clone())).await;
    let mut follower = follow_run(&bus, &store, false);
    let last = within("the completion", follower.next()).await.unwrap();
    // Its JSON is the stored one, byte for byte.
    let stored = store.run_events("r1").await.unwrap().pop().unwrap();
    assert_eq!(last.to_json(), stored.data);
    let end = last.completed().unwrap().clone();
    match &end.kind {
        EventKind::RunCompleted { completion: seen, engine, duration_ms } => {
            assert_eq!(seen, &completion);
            assert_eq!((engine.as_str(), *duration_ms), ("echo", 3));
        }
        other => panic!("not a completion: {other:?}"),
    }
    assert_eq!((end.index, &*end.session_key, end.ts_ms), (1, "s", 7));
    assert!(within("the end", follower.next()).await.is_none());
}

#[test]
fn stored_errors_keep_their_code_and_text() {
    for error in crate::engine::tests::one_of_each_error() {
        let json = crate::bus::completion_json(&Completion::failure(error.clone(), None));
        let stored = StoredEvent { index: 1, kind: RUN_COMPLETED.to_owned(), data: json };
        let event = stored_completion(&run_id(), &stored);
        let EventKind::RunCompleted { completion, .. } = &event.kind else { panic!() };
        let back = completion.error.clone().unwrap();
        assert_eq!((back.code(), back.to_string()), (error.code(), error.to_string()));
    }
}

#[tokio::test]
async fn a_lagged_follower_resynchronises_from_the_store() {
    // A run topic holds two events; the follower reads none until all are out.
    let bus = EventBus::new(64, 2);
    let store = store_with_run().await;
    let mut follower = follow_run(&bus, &store, true);
    for index in 1..=6 {
        emit(&bus, &store, delta(index)).await;
    }
    emit(&bus, &store, completed(7, Completion::success("", None))).await;
    assert_eq!(collect(&mut follower).await, expected(6));
}

#[tokio::test]
async fn a_gap_in_live_events_is_filled_from_the_store() {
    let bus = EventBus::default();
    let store = store_with_run().await;
    let mut follower = follow_run(&bus, &store, true);
    emit(&bus, &store, delta(1)).await;
    // Stored but never seen live.
    store.append_event(delta(2)).await;
    emit(&bus, &store, delta(3)).await;
    emit(&bus, &store, completed(4, Completion::success("", None))).await;
    assert_eq!(collect(&mut follower).await, expected(3));
}

#[tokio::test]
async fn exactly_one_completion_ends_the_follower() {
    let bus = EventBus::default();
    let store = store_with_run().await;
    let mut follower = follow_run(&bus, &store, true);
    emit(&bus, &store, delta(1)).await;
    emit(&bus, &store, completed(2, Completion::success("", None))).await;
    // Whatever is stored after the completion is never handed out.
    store.append_event(delta(3)).await;
    let seen = collect(&mut follower).await;
    assert_eq!(seen, expected(1));
    assert_eq!(seen.iter().filter(|(kind, _)| kind == RUN_COMPLETED).count(), 1);
    assert!(within("the end", follower.next()).await.is_none());
}

#[tokio::test]
async fn a_closed_topic_without_a_completion_ends_after_the_stored_events() {
    let bus = EventBus::default();
    let store = store_with_run().await;
    let mut follower = follow_run(&bus, &store, true);
    emit(&bus, &store, delta(1)).await;
    store.append_event(delta(2)).await;
    drop(bus);
    assert_eq!(collect(&mut follower).await, [("delta".to_owned(), 1), ("delta".to_owned(), 2)]);
    assert!(follower.completion().await.is_none());
}

#[tokio::test(start_paused = true)]
async fn a_quiet_topic_finds_a_completion_written_only_to_the_store() {
    let bus = EventBus::default();
    let store = store_with_run().await;
    let mut follower =
        follow_run(&bus, &store, true).check_store_when_quiet(Duration::from_secs(1));
    store.append_event(delta(1)).await;
    store.append_event(completed(2, Completion::success("", None))).await;
    store
        .finalize_run(crate::store::FinishedRun {
            run_id: run_id(),
            engine: "echo".into(),
            completion: Completion::success("", None),
            completed_at_ms: 2,
            duration_ms: 1,
            spend: Default::default(),
        })
        .await;
    assert_eq!(collect(&mut follower).await, expected(1));
}

#[tokio::test]
async fn resuming_after_an_index_skips_what_the_client_has() {
    let bus = EventBus::default();
    let store = store_with_run().await;
    for index in 1..=3 {
        emit(&bus, &store, delta(index)).await;
    }
    emit(&bus, &store, completed(4, Completion::success("", None))).await;
    let mut follower = follow_run(&bus, &store, false).after(2);
    assert_eq!(
        collect(&mut follower).await,
        [("delta".to_owned(), 3), ("run_completed".to_owned(), 4)]
    );
}

#[tokio::test]
async fn resuming_past_the_completion_ends_at_once() {
    let bus = EventBus::default();
    let store = store_with_run().await;
    emit(&bus, &store, delta(1)).await;
    emit(&bus, &store, completed(2, Completion::success("", None))).await;
    let mut follower = follow_run(&bus, &store, false).after(2);
    assert!(collect(&mut follower).await.is_empty());
}

fn retry_id() -> RunId {
    RunId::parse("r1.retry").unwrap()
}

fn retry_event(index: u64, kind: EventKind) -> Arc<BusEvent> {
    Arc::new(BusEvent { run_id: retry_id(), session_key: "s".into(), index, ts_ms: 8, kind })
}

fn retried() -> Completion {
    let mut failed = Completion::failure(RunError::Engine { message: "HTTP 400: ".into() }, None);
    failed.retried_by = Some(retry_id());
    failed
}

/// Every answer the follower hands out: the text of each `run_completed`.
async fn answers(follower: &mut RunFollower) -> Vec<(String, bool, String)> {
    within("the follower to end", async {
        let mut seen = Vec::new();
        while let Some(event) = follower.next().await {
            if let Some(done) = event.completed() {
                if let EventKind::RunCompleted { completion, .. } = &done.kind {
                    seen.push((done.run_id.to_string(), completion.ok, completion.answer.clone()));
                }
            }
        }
        seen
    })
    .await
}

#[tokio::test]
async fn a_retried_run_is_followed_into_its_retry_live() {
    let bus = EventBus::default();
    let store = store_with_run().await;
    let mut follower = follow_run(&bus, &store, true).following_retries(bus.clone());
    emit(&bus, &store, completed(1, retried())).await;
    let answer = Completion::success("second time lucky", None);
    emit(&bus, &store, retry_event(1, EventKind::Delta { seq: 1, text: "second".into() })).await;
    emit(
        &bus,
        &store,
        retry_event(
            2,
            EventKind::RunCompleted { completion: answer, engine: "echo".into(), duration_ms: 1 },
        ),
    )
    .await;
    let seen = answers(&mut follower).await;
    assert_eq!(seen, vec![("r1.retry".to_owned(), true, "second time lucky".to_owned())]);
    assert_eq!(follower.run_id(), &retry_id());
}

#[tokio::test]
async fn a_retry_that_finished_before_the_follow_is_read_from_the_store() {
    let bus = EventBus::default();
    let store = store_with_run().await;
    emit(&bus, &store, completed(1, retried())).await;
    let done = EventKind::RunCompleted {
        completion: Completion::success("stored answer", None),
        engine: "echo".into(),
        duration_ms: 1,
    };
    emit(&bus, &store, retry_event(1, done)).await;
    let mut follower = follow_run(&bus, &store, false).following_retries(bus.clone());
    let seen = answers(&mut follower).await;
    assert_eq!(seen, vec![("r1.retry".to_owned(), true, "stored answer".to_owned())]);
}

#[tokio::test]
async fn without_retries_the_failed_completion_ends_the_follow() {
    let bus = EventBus::default();
    let store = store_with_run().await;
    emit(&bus, &store, completed(1, retried())).await;
    let mut follower =
        follow_run(&bus, &store, false).following_retries(bus.clone()).without_retries();
    let seen = answers(&mut follower).await;
    assert_eq!(seen, vec![("r1".to_owned(), false, String::new())]);
}
