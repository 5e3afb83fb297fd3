use std::collections::BTreeMap;

use serde_json::json;

use super::*;
use crate::engine::ResumeToken;

fn failed(error: RunError) -> Completion {
    Completion::failure(error, Some(ResumeToken::new("claude", "s1")))
}

fn no_meta() -> BTreeMap<String, Value> {
    BTreeMap::new()
}

#[test]
fn a_blank_engine_error_is_retried() {
    let http = failed(RunError::Engine { message: "HTTP 400: ".into() });
    assert!(should_retry(&http, "fix the bug", &no_meta()));
    let crashed = failed(RunError::EngineCrashed { detail: "exit 1".into() });
    assert!(should_retry(&crashed, "fix the bug", &no_meta()));
}

#[test]
fn an_answer_is_not_retried() {
    let mut partial = failed(RunError::Engine { message: "HTTP 500".into() });
    partial.answer = "half an answer".into();
    assert!(!should_retry(&partial, "fix the bug", &no_meta()));
    let mut blank = failed(RunError::Engine { message: "HTTP 500".into() });
    blank.answer = " \n\t".into();
    assert!(should_retry(&blank, "fix the bug", &no_meta()));
    assert!(!should_retry(&Completion::success("", None), "fix the bug", &no_meta()));
}

#[test]
fn excluded_errors_are_not_retried() {
    let excluded = [
        RunError::ContextOverflow { message: "prompt is too long".into() },
        RunError::UserRequested,
        RunError::Interrupted,
        RunError::Cancelled { reason: "new session".into() },
        RunError::Timeout,
        RunError::IdleWatchdog,
        RunError::ShuttingDown,
        RunError::BudgetExceeded { detail: "daily limit".into() },
        RunError::LockTimeout,
        RunError::StartFailed { detail: "no such binary".into() },
        RunError::EngineUnavailable { engine: "claude".into(), reason: "missing".into() },
        RunError::UnknownEngine { engine: "x".into() },
        RunError::Merged { into: RunId::generate() },
        RunError::Expired,
        RunError::QueueOverflow,
    ];
    for error in excluded {
        assert!(!should_retry(&failed(error.clone()), "fix the bug", &no_meta()), "{error:?}");
    }
}

#[test]
fn a_retry_or_a_blank_prompt_is_not_retried() {
    let http = failed(RunError::Engine { message: "HTTP 400: ".into() });
    let first = RunId::parse("r1").unwrap();
    let retry = retry_meta(&no_meta(), &first, "HTTP 400: ");
    assert!(!should_retry(&http, "fix the bug", &retry));
    assert!(!should_retry(&http, "  ", &no_meta()));
}

#[test]
fn the_retry_carries_the_notice_and_the_meta() {
    let first = RunId::parse("r1").unwrap();
    let prompt = retry_prompt(&first, "engine error: HTTP 400: ", "fix the bug");
    for part in ["Retry notice:", "check for partially completed work", "Original request:"] {
        assert!(prompt.contains(part), "{prompt}");
    }
    assert!(prompt.contains("Previous run: r1"));
    assert!(prompt.ends_with("fix the bug"));
    let mut meta = no_meta();
    meta.insert("source".into(), json!("webhook"));
    let meta = retry_meta(&meta, &first, "HTTP 400: ");
    assert_eq!(meta[ATTEMPT_KEY], json!(1));
    assert_eq!(meta[OF_RUN_KEY], json!("r1"));
    assert_eq!(meta[REASON_KEY], json!("HTTP 400: "));
    assert_eq!(meta["source"], json!("webhook"));
    assert_eq!(retry_run_id(&first).as_str(), "r1.retry");
    let long = RunId::parse(&"x".repeat(128)).unwrap();
    assert_ne!(retry_run_id(&long), long);
}
