use super::*;
use crate::engine::RunError;

fn event(run: &str, index: u64, kind: EventKind) -> Arc<BusEvent> {
    Arc::new(BusEvent {
        run_id: RunId::parse(run).unwrap(),
        session_key: "s".into(),
        index,
        ts_ms: 0,
        kind,
    })
}

fn completed(run: &str, index: u64) -> Arc<BusEvent> {
    let kind = EventKind::RunCompleted {
        completion: Completion::success("a", None),
        engine: "echo".into(),
        duration_ms: 1,
    };
    event(run, index, kind)
}

#[tokio::test]
async fn a_run_topic_sees_only_its_run_and_closes_after_the_completion() {
    let bus = EventBus::default();
    let mut run_a = bus.subscribe_run(&RunId::parse("a").unwrap());
    let mut all = bus.subscribe_all();
    bus.publish(event("b", 1, EventKind::Delta { seq: 1, text: "other".into() }));
    bus.publish(event("a", 1, EventKind::Delta { seq: 1, text: "mine".into() }));
    bus.publish(completed("a", 2));
    assert_eq!(run_a.recv().await.unwrap().index, 1);
    assert!(matches!(run_a.recv().await.unwrap().kind, EventKind::RunCompleted { .. }));
    assert_eq!(run_a.recv().await, Err(RecvError::Closed));
    assert_eq!(bus.n_topics(), 0, "the topic is gone with its run");
    let firehose: Vec<String> = [all.recv().await, all.recv().await, all.recv().await]
        .into_iter()
        .map(|e| e.unwrap().run_id.to_string())
        .collect();
    assert_eq!(firehose, ["b", "a", "a"]);
}

#[test]
fn dropping_the_last_subscriber_removes_the_topic() {
    let bus = EventBus::default();
    let run = RunId::parse("a").unwrap();
    let first = bus.subscribe_run(&run);
    let second = bus.subscribe_run(&run);
    assert_eq!(bus.n_topics(), 1);
    drop(first);
    assert_eq!(bus.n_topics(), 1, "one listener is left");
    drop(second);
    assert_eq!(bus.n_topics(), 0);
}

#[tokio::test]
async fn a_slow_subscriber_is_told_how_much_it_missed() {
    let bus = EventBus::new(2, 2);
    let mut slow = bus.subscribe_all();
    for index in 1..=5 {
        bus.publish(event("a", index, EventKind::Delta { seq: index, text: "x".into() }));
    }
    assert_eq!(slow.recv().await, Err(RecvError::Lagged(3)));
    assert_eq!(slow.recv().await.unwrap().index, 4);
}

#[test]
fn events_have_a_stable_json_form() {
    let json = completed("a", 7).to_json();
    assert_eq!(json["type"], "run_completed");
    assert_eq!(json["status"], "completed");
    assert_eq!(json["index"], 7);
    assert_eq!(json["answer"], "a");
    assert_eq!(json["error"], serde_json::Value::Null);
    let failed = Completion::failure(RunError::LockTimeout, None);
    assert_eq!(completion_json(&failed)["error_code"], "lock_timeout");
    assert_eq!(
        RunStatus::of(&Completion::failure(RunError::UserRequested, None)),
        RunStatus::Cancelled
    );
    assert_eq!(RunStatus::of(&failed), RunStatus::Failed);
}

#[tokio::test]
async fn the_starts_channel_carries_only_starts_and_a_burst_of_deltas_cannot_crowd_one_out() {
    let bus = EventBus::new(4, 4);
    let mut starts = bus.subscribe_starts();
    let started =
        |run: &str| event(run, 0, EventKind::RunStarted { engine: "echo".into(), model: None });
    bus.publish(started("a"));
    // Far more deltas than the firehose holds.
    for index in 1..=100 {
        bus.publish(event("a", index, EventKind::Delta { seq: index, text: "x".into() }));
    }
    bus.publish(completed("a", 101));
    bus.publish(started("b"));
    assert_eq!(starts.recv().await.unwrap().run_id.as_str(), "a");
    assert_eq!(starts.recv().await.unwrap().run_id.as_str(), "b");
    assert_eq!(starts.try_recv().map(|e| e.is_none()), Ok(true), "nothing but starts");
}
