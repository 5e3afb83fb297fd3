//! Unit tests of the control API's transfer types.

use lemon_core::bus::RunStatus;
use serde_json::json;

use super::{ListQuery, SubmitBody, SubmitQuery};
use crate::error::ApiError;

fn submit(body: serde_json::Value) -> Result<lemon_core::router::RunRequest, ApiError> {
    serde_json::from_value::<SubmitBody>(body).unwrap().into_request()
}

#[test]
fn submit_body_fills_defaults() {
    let req = submit(json!({ "prompt": "hi" })).unwrap();
    assert_eq!(req.session_key, "default");
    assert_eq!(req.engine, None, "the router chooses");
    assert_eq!(req.queue_mode, None);
    assert_eq!(req.resume, None);
    assert_eq!(req.prompt, "hi");
    assert!(req.run_id.is_some(), "a run id is generated up front");
    assert!(req.cwd.is_none());
    assert!(req.meta.is_empty());
}

#[test]
fn submit_body_takes_every_field() {
    let req = submit(json!({
        "prompt": "hi", "session_key": "s1", "engine": "claude:opus", "cwd": "/tmp",
        "meta": { "k": 1 }, "run_id": "my-run.1", "queue_mode": "steer_backlog",
        "resume": { "engine": "codex", "value": "t-1" },
    }))
    .unwrap();
    assert_eq!(req.session_key, "s1");
    assert_eq!(req.engine.map(|e| e.to_string()).as_deref(), Some("claude:opus"));
    assert_eq!(req.queue_mode, Some(lemon_core::config::QueueMode::SteerBacklog));
    assert_eq!(req.resume, Some(lemon_core::engine::ResumeToken::new("codex", "t-1")));
    assert_eq!(req.cwd.as_deref(), Some(std::path::Path::new("/tmp")));
    assert_eq!(req.meta.get("k"), Some(&json!(1)));
    assert_eq!(req.run_id.unwrap().as_str(), "my-run.1");
}

#[test]
fn submit_body_refuses_bad_input() {
    let check = |body: serde_json::Value, needle: &str| match submit(body.clone()) {
        Err(ApiError::BadRequest(message)) => {
            assert!(message.contains(needle), "{body}: {message}")
        }
        other => panic!("{body}: expected a bad request, got {other:?}"),
    };
    check(json!({}), "prompt is required");
    check(json!({ "prompt": "   " }), "prompt is required");
    check(json!({ "prompt": "hi", "run_id": "has space" }), "invalid run_id");
    check(json!({ "prompt": "hi", "run_id": "" }), "invalid run_id");
    check(
        json!({ "prompt": "hi", "queue_mode": "later" }),
        "invalid queue_mode \"later\": expected one of collect, followup",
    );
    check(json!({ "prompt": "hi", "resume": { "engine": "codex", "value": " " } }), "resume needs");
    // The engine is parsed here, once: a bad composite id is refused naming the field,
    // without repeating the caller's text.
    check(json!({ "prompt": "hi", "engine": "Claude:opus" }), "engine: invalid engine id");
    check(json!({ "prompt": "hi", "engine": "default" }), "engine: invalid engine id");
    check(
        json!({ "prompt": "hi", "engine": "claude:--yolo" }),
        "engine: invalid model for claude (it starts with '-')",
    );
    check(json!({ "prompt": "hi", "engine": "claude:" }), "engine: invalid model for claude");
    match submit(json!({ "prompt": "hi", "engine": "Bad Id:--yolo" })) {
        Err(ApiError::BadRequest(message)) => assert!(!message.contains("yolo"), "{message}"),
        other => panic!("expected a bad request, got {other:?}"),
    }
}

#[test]
fn wait_flag_parses() {
    let wait = |raw: Option<&str>| SubmitQuery { wait: raw.map(str::to_owned) }.wait();
    assert_eq!(wait(None), Ok(false));
    assert_eq!(wait(Some("false")), Ok(false));
    assert_eq!(wait(Some("true")), Ok(true));
    assert_eq!(wait(Some("1")), Ok(true));
    assert_eq!(wait(Some("")), Ok(true));
    assert!(wait(Some("soon")).is_err());
}

#[test]
fn list_query_parses_status_and_limit() {
    let filter = |status: Option<&str>, limit: Option<&str>| {
        ListQuery { status: status.map(str::to_owned), limit: limit.map(str::to_owned) }.filter()
    };
    let default = filter(None, None).unwrap();
    assert_eq!((default.status, default.limit), (None, 50));
    let some = filter(Some("completed"), Some("7")).unwrap();
    assert_eq!((some.status, some.limit), (Some(RunStatus::Completed), 7));
    assert_eq!(filter(Some(""), Some("5000")).unwrap().limit, 1000);
    assert!(
        matches!(filter(Some("done"), None), Err(ApiError::BadRequest(m)) if m.contains("invalid status"))
    );
    assert!(
        matches!(filter(None, Some("-1")), Err(ApiError::BadRequest(m)) if m.contains("invalid limit"))
    );
}
