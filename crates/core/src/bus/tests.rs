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

/// Every kind of event, with fields set and unset.
fn every_kind() -> Vec<EventKind> {
    use crate::engine::{ActionKind, ActionPhase, ResumeToken};
    let resume = Some(ResumeToken::new("codex", "tok \"1\""));
    let action = |kind, phase| {
        EventKind::EngineAction(Action {
            id: "a1".into(),
            kind,
            title: "ls -la".into(),
            detail: serde_json::json!({ "exit_code": 1 }),
            phase,
            ok: Some(false),
            message: Some("no such file".into()),
            level: Some("error".into()),
            result_meta: serde_json::json!({ "timeout_ms": 5 }),
        })
    };
    let mut kinds = vec![
        EventKind::RunStarted { engine: "echo".into(), model: None },
        EventKind::RunStarted { engine: "claude".into(), model: Some("opus".into()) },
        EventKind::EngineStarted { resume: None, title: None, meta: serde_json::Value::Null },
        EventKind::EngineStarted {
            resume: resume.clone(),
            title: Some("t".into()),
            meta: serde_json::json!({ "pid": 7 }),
        },
        EventKind::Delta { seq: 3, text: "line\nbreak \u{1f34b}".into() },
        EventKind::EngineCompleted(Completion::success("answer", resume.clone())),
        EventKind::RunCompleted {
            completion: Completion {
                usage: serde_json::json!({ "input_tokens": 12 }),
                retried_by: RunId::parse("run-2"),
                ..Completion::success("", None)
            },
            engine: "echo".into(),
            duration_ms: 1234,
        },
        EventKind::Status(RunStatus::Cancelling),
    ];
    for error in [
        RunError::UserRequested,
        RunError::EngineCrashed { detail: "boom".into() },
        RunError::EngineUnavailable { engine: "codex".into(), reason: "missing".into() },
        RunError::Merged { into: RunId::parse("run-3").unwrap() },
        RunError::Engine { message: "rate limited".into() },
    ] {
        kinds.push(EventKind::RunCompleted {
            completion: Completion::failure(error, resume.clone()),
            engine: "codex".into(),
            duration_ms: 1,
        });
    }
    for kind in [
        ActionKind::Tool,
        ActionKind::Command,
        ActionKind::FileChange,
        ActionKind::WebSearch,
        ActionKind::Subagent,
        ActionKind::Reasoning,
        ActionKind::Note,
        ActionKind::Warning,
        ActionKind::Approval,
    ] {
        for phase in [ActionPhase::Started, ActionPhase::Updated, ActionPhase::Completed] {
            kinds.push(action(kind, phase));
        }
    }
    for phase in [
        RunPhase::Accepted,
        RunPhase::QueuedInSession,
        RunPhase::WaitingForSlot,
        RunPhase::Dispatched,
        RunPhase::Streaming,
        RunPhase::Completed,
        RunPhase::Failed,
        RunPhase::Aborted,
    ] {
        kinds.push(EventKind::Phase(phase));
    }
    kinds
}

#[test]
fn every_event_reads_back_from_its_json_as_it_was() {
    for (index, kind) in every_kind().into_iter().enumerate() {
        let event = BusEvent {
            run_id: RunId::parse("run:1").unwrap(),
            session_key: "telegram:42".into(),
            index: index as u64 + 1,
            ts_ms: 1_700_000_000_123,
            kind,
        };
        let text = serde_json::to_string(&event.json()).unwrap();
        let value: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(BusEvent::from_json(&value), Some(event), "{text}");
    }
}

#[test]
fn json_that_is_no_known_event_reads_as_none() {
    let event = event("a", 1, EventKind::Delta { seq: 1, text: "x".into() });
    let mut value = event.to_json();
    assert!(BusEvent::from_json(&value).is_some());
    value["type"] = serde_json::json!("from_a_newer_version");
    assert_eq!(BusEvent::from_json(&value), None);
    let mut value = event.to_json();
    value.as_object_mut().unwrap().remove("index");
    assert_eq!(BusEvent::from_json(&value), None);
    assert_eq!(BusEvent::from_json(&serde_json::json!("text")), None);
}

#[tokio::test]
async fn relayed_events_reach_the_run_topic_only_and_close_it() {
    let bus = EventBus::default();
    let run = RunId::parse("a").unwrap();
    let mut topic = bus.subscribe_run(&run);
    let mut all = bus.subscribe_all();
    let mut starts = bus.subscribe_starts();
    assert_eq!(bus.watched_runs(), std::slice::from_ref(&run));
    bus.relay(event("a", 1, EventKind::RunStarted { engine: "echo".into(), model: None }));
    bus.relay(event("b", 1, EventKind::Delta { seq: 1, text: "nobody listens".into() }));
    bus.relay(completed("a", 2));
    assert_eq!(topic.recv().await.unwrap().index, 1);
    assert_eq!(topic.recv().await.unwrap().index, 2);
    assert_eq!(topic.recv().await, Err(RecvError::Closed));
    assert!(bus.watched_runs().is_empty());
    assert_eq!(all.try_recv(), Ok(None), "the firehose carries this node's runs");
    assert_eq!(starts.try_recv(), Ok(None));
}
