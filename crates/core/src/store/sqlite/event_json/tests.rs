//! The stored event JSON must parse back to exactly `BusEvent::to_json()`.

use std::sync::Arc;

use serde_json::json;

use crate::bus::{BusEvent, EventKind, RunPhase};
use crate::engine::{Action, ActionKind, ActionPhase, Completion, ResumeToken, RunError};
use crate::ids::RunId;

fn check(kind: EventKind) {
    let event = BusEvent {
        run_id: RunId::parse("run_json").unwrap(),
        session_key: Arc::from("sess \"quoted\" \u{1f34b}"),
        index: u64::MAX,
        ts_ms: -5,
        kind,
    };
    let mut buf = b"left over".to_vec();
    buf.clear();
    super::write(&mut buf, &event).unwrap();
    let written: serde_json::Value = serde_json::from_slice(&buf).unwrap();
    assert_eq!(written, event.to_json(), "{}", String::from_utf8_lossy(&buf));
}

/// Text with everything JSON has to escape.
const AWKWARD: &str = "tab\tnew\nline \"quote\" back\\slash \u{0}\u{1f} ünï \u{1f34b} </script>";

fn every_error() -> Vec<RunError> {
    let text = || AWKWARD.to_owned();
    vec![
        RunError::UserRequested,
        RunError::Interrupted,
        RunError::LockTimeout,
        RunError::Timeout,
        RunError::EngineCrashed { detail: text() },
        RunError::StartFailed { detail: text() },
        RunError::EngineUnavailable { engine: "codex".to_owned(), reason: text() },
        RunError::UnknownEngine { engine: text() },
        RunError::ShuttingDown,
        RunError::QueueOverflow,
        RunError::IdleWatchdog,
        RunError::Cancelled { reason: text() },
        RunError::Engine { message: text() },
    ]
}

fn completions() -> Vec<Completion> {
    let mut completions = vec![
        Completion::success("", None),
        Completion {
            ok: true,
            answer: AWKWARD.to_owned(),
            error: None,
            resume: Some(ResumeToken::new("claude", AWKWARD)),
            usage: json!({ "input_tokens": 12, "cost": 0.000_125, "nested": [null, true, -1, 1e300] }),
        },
    ];
    let resume = Some(ResumeToken::new("echo", "tok"));
    completions.extend(every_error().into_iter().map(|e| Completion::failure(e, resume.clone())));
    completions
}

#[test]
fn run_started_matches_to_json() {
    check(EventKind::RunStarted { engine: "echo".to_owned(), model: None });
    check(EventKind::RunStarted { engine: AWKWARD.to_owned(), model: Some(AWKWARD.to_owned()) });
}

#[test]
fn engine_started_matches_to_json() {
    check(EventKind::EngineStarted { resume: None, title: None, meta: serde_json::Value::Null });
    check(EventKind::EngineStarted {
        resume: Some(ResumeToken::new("codex", AWKWARD)),
        title: Some(AWKWARD.to_owned()),
        meta: json!({ "pid": 7, "args": ["-q", AWKWARD], "ratio": 0.5 }),
    });
}

#[test]
fn engine_action_matches_to_json_for_every_kind_and_phase() {
    let kinds = [
        ActionKind::Tool,
        ActionKind::Command,
        ActionKind::FileChange,
        ActionKind::WebSearch,
        ActionKind::Subagent,
        ActionKind::Reasoning,
        ActionKind::Note,
        ActionKind::Warning,
    ];
    let phases = [ActionPhase::Started, ActionPhase::Updated, ActionPhase::Completed];
    for kind in kinds {
        for phase in phases {
            check(EventKind::EngineAction(Action {
                id: "a1".to_owned(),
                kind,
                title: AWKWARD.to_owned(),
                detail: serde_json::Value::Null,
                phase,
                ok: None,
                message: None,
                level: None,
            }));
        }
    }
    check(EventKind::EngineAction(Action {
        id: AWKWARD.to_owned(),
        kind: ActionKind::Command,
        title: "ls".to_owned(),
        detail: json!({ "exit_code": 1, "stdout": AWKWARD }),
        phase: ActionPhase::Completed,
        ok: Some(false),
        message: Some(AWKWARD.to_owned()),
        level: Some("error".to_owned()),
    }));
}

#[test]
fn delta_and_phase_match_to_json() {
    check(EventKind::Delta { seq: 0, text: String::new() });
    check(EventKind::Delta { seq: u64::MAX, text: AWKWARD.to_owned() });
    let phases = [
        RunPhase::Accepted,
        RunPhase::QueuedInSession,
        RunPhase::WaitingForSlot,
        RunPhase::Dispatched,
        RunPhase::Streaming,
        RunPhase::Completed,
        RunPhase::Failed,
        RunPhase::Aborted,
    ];
    for phase in phases {
        check(EventKind::Phase(phase));
    }
}

#[test]
fn completions_match_to_json_for_every_error() {
    for completion in completions() {
        check(EventKind::EngineCompleted(completion.clone()));
        check(EventKind::RunCompleted { completion, engine: "echo".to_owned(), duration_ms: 1234 });
    }
}
