//! An event's JSON text (as stored and streamed) and its `Value` form are the form
//! written out field by field below, which stored events of earlier versions have.

use serde_json::{json, Value};

use crate::bus::{BusEvent, EventKind, RunPhase, RunStatus};
use crate::engine::{Action, ActionKind, ActionPhase, Completion, ResumeToken, RunError};
use crate::ids::{RunId, SessionKey};

fn resume(resume: &Option<ResumeToken>) -> Value {
    match resume {
        Some(token) => json!({ "engine": token.engine, "value": token.value }),
        None => Value::Null,
    }
}

fn completion(completion: &Completion) -> Value {
    let mut value = json!({
        "ok": completion.ok,
        "answer": completion.answer,
        "error": completion.error.as_ref().map(|e| e.to_string()),
        "error_code": completion.error.as_ref().map(|e| e.code()),
        "resume": resume(&completion.resume),
        "usage": completion.usage,
        "artifacts": completion.artifacts.iter().map(|a| json!({
            "path": a.path.to_string_lossy(),
            "filename": a.filename,
            "caption": a.caption,
            "size": a.size,
            "mime": a.mime(),
        })).collect::<Vec<_>>(),
    });
    if let Some(retry) = &completion.retried_by {
        value["retried_by"] = json!(retry.as_str());
    }
    value
}

/// The JSON form of an event, field by field.
fn expected(event: &BusEvent) -> Value {
    let mut body = match &event.kind {
        EventKind::RunStarted { engine, model } => json!({ "engine": engine, "model": model }),
        EventKind::EngineStarted { resume: token, title, meta } => {
            json!({ "resume": resume(token), "title": title, "meta": meta })
        }
        EventKind::EngineAction(action) => json!({ "action": {
            "id": action.id,
            "kind": action.kind.as_str(),
            "title": action.title,
            "detail": action.detail,
            "phase": action.phase.as_str(),
            "ok": action.ok,
            "message": action.message,
            "level": action.level,
            "result_meta": action.result_meta,
        }}),
        EventKind::Delta { seq, text } => json!({ "seq": seq, "text": text }),
        EventKind::EngineCompleted(done) => completion(done),
        EventKind::RunCompleted { completion: done, engine, duration_ms } => {
            let mut body = completion(done);
            body["engine"] = json!(engine);
            body["duration_ms"] = json!(duration_ms);
            body["status"] = json!(RunStatus::of(done).as_str());
            body
        }
        EventKind::Phase(phase) => json!({ "phase": phase.as_str() }),
        EventKind::Status(status) => json!({ "status": status.as_str() }),
    };
    body["type"] = json!(event.kind.type_name());
    body["run_id"] = json!(event.run_id.as_str());
    body["session_key"] = json!(&*event.session_key);
    body["index"] = json!(event.index);
    body["ts_ms"] = json!(event.ts_ms);
    body
}

fn check(kind: EventKind) {
    let event = BusEvent {
        run_id: RunId::parse("run_json").unwrap(),
        session_key: SessionKey::from("sess \"quoted\" \u{1f34b}"),
        index: u64::MAX,
        ts_ms: -5,
        kind,
    };
    let text = serde_json::to_vec(&event.json()).unwrap();
    let written: Value = serde_json::from_slice(&text).unwrap();
    assert_eq!(written, expected(&event), "{}", String::from_utf8_lossy(&text));
    assert!(!text.contains(&b'\n'), "one line per event");
    assert_eq!(event.to_json(), written);
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
        RunError::Expired,
        RunError::Cancelled { reason: text() },
        RunError::Merged { into: RunId::parse("run-2").unwrap() },
        RunError::ContextOverflow { message: text() },
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
            artifacts: vec![
                crate::artifacts::Artifact {
                    path: format!("/work/{AWKWARD}.png").into(),
                    filename: AWKWARD.to_owned(),
                    caption: Some(AWKWARD.to_owned()),
                    size: u64::MAX,
                },
                crate::artifacts::Artifact {
                    path: "/work/report.pdf".into(),
                    filename: "report.pdf".to_owned(),
                    caption: None,
                    size: 0,
                },
            ],
            retried_by: Some(RunId::parse("run-1.retry").unwrap()),
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
                result_meta: serde_json::Value::Null,
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
        result_meta: json!({ "error_type": "tool_task_timeout", "timeout_ms": 123, "exit_code": 124 }),
    }));
}

#[test]
fn delta_phase_and_status_match_to_json() {
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
    check(EventKind::Status(RunStatus::Cancelling));
}

#[test]
fn completions_match_to_json_for_every_error() {
    for completion in completions() {
        check(EventKind::EngineCompleted(completion.clone()));
        check(EventKind::RunCompleted { completion, engine: "echo".to_owned(), duration_ms: 1234 });
    }
}
