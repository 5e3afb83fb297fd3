use super::*;
use crate::testing::FakeEngine;

fn check_extract(text: &str, expected: Option<&str>) {
    let found = extract_plain_resume("lemon", text).map(|t| t.value);
    assert_eq!(found.as_deref(), expected, "{text:?}");
}

#[test]
fn plain_resume_lines_are_found_anywhere() {
    check_extract("lemon resume abc_1-2", Some("abc_1-2"));
    check_extract("please `lemon resume xyz` and go on", Some("xyz"));
    check_extract("LEMON Resume Tok.", Some("Tok"));
    check_extract("lemon resume", None);
    check_extract("claude resume abc", None);
    check_extract("", None);
}

#[test]
fn a_resume_line_must_be_the_whole_line() {
    let engine = FakeEngine::new("fake");
    assert!(engine.is_resume_line("fake resume abc"));
    assert!(engine.is_resume_line("  `fake resume abc`  "));
    assert!(!engine.is_resume_line("please fake resume abc"));
    assert!(!engine.is_resume_line("fake resume abc now"));
    let token = ResumeToken::new("fake", "abc");
    assert_eq!(engine.format_resume(&token), "`fake resume abc`");
    assert_eq!(engine.extract_resume(&engine.format_resume(&token)), Some(token));
}

#[test]
fn the_registry_resolves_composite_ids_by_prefix() {
    let mut registry = EngineRegistry::new();
    registry.register(Arc::new(FakeEngine::new("claude"))).unwrap();
    assert_eq!(
        registry.register(Arc::new(FakeEngine::new("claude"))),
        Err(RegistryError::Duplicate("claude".into()))
    );
    let (engine, model) = registry.resolve("claude:opus").unwrap();
    assert_eq!((engine.id().as_str(), model.as_deref()), ("claude", Some("opus")));
    assert_eq!(registry.resolve("claude").map(|(_, m)| m), Some(None));
    assert!(registry.resolve("codex").is_none());
    assert!(registry.resolve("codex:claude").is_none());
    assert_eq!(
        registry.extract_resume("see claude resume s1"),
        Some(ResumeToken::new("claude", "s1"))
    );
    assert_eq!(registry.format_resume(&ResumeToken::new("claude", "s1")), "`claude resume s1`");
    assert_eq!(registry.format_resume(&ResumeToken::new("gone", "s2")), "`gone resume s2`");
}

#[test]
fn errors_have_stable_codes_and_readable_text() {
    let unavailable =
        RunError::EngineUnavailable { engine: "codex".into(), reason: "not found".into() };
    assert_eq!(unavailable.code(), "engine_unavailable");
    assert_eq!(unavailable.to_string(), "engine_unavailable: codex (not found)");
    assert_eq!(RunError::Engine { message: "boom".into() }.to_string(), "boom");
    assert!(RunError::Interrupted.is_abort());
    assert!(!RunError::Timeout.is_abort());
}

#[test]
fn merged_and_overflow_errors_have_their_own_codes() {
    let merged = RunError::Merged { into: RunId::parse("r2").unwrap() };
    assert_eq!(merged.code(), "merged");
    assert_eq!(merged.to_string(), "merged into r2");
    assert!(merged.is_abort(), "a merged request was not run, it did not fail");
    let overflow = RunError::ContextOverflow { message: "context_length_exceeded".into() };
    assert_eq!(overflow.code(), "context_overflow");
    assert_eq!(overflow.to_string(), "context_length_exceeded", "the engine's text, verbatim");
    assert!(overflow.is_context_overflow());
    assert!(!overflow.is_abort());
    assert!(!RunError::Engine { message: "context_length_exceeded".into() }.is_context_overflow());
}

/// One error of every kind, each with a text worth keeping.
pub(crate) fn one_of_each_error() -> Vec<RunError> {
    vec![
        RunError::UserRequested,
        RunError::Interrupted,
        RunError::LockTimeout,
        RunError::Timeout,
        RunError::EngineCrashed { detail: "it died: badly".into() },
        RunError::StartFailed { detail: "no binary".into() },
        RunError::EngineUnavailable { engine: "codex".into(), reason: "not found (PATH)".into() },
        RunError::UnknownEngine { engine: "kimi".into() },
        RunError::ShuttingDown,
        RunError::QueueOverflow,
        RunError::IdleWatchdog,
        RunError::Expired,
        RunError::Cancelled { reason: "stopped by the API".into() },
        RunError::Merged { into: RunId::parse("run-9").unwrap() },
        RunError::ContextOverflow { message: "HTTP 413 Payload Too Large".into() },
        RunError::BudgetExceeded { detail: "daily usd (limit 1.00, spent 1.02)".into() },
        RunError::Engine { message: "cancelled: not really".into() },
    ]
}

#[test]
fn every_error_reads_back_from_its_stored_code_and_text() {
    let errors = one_of_each_error();
    for error in errors {
        assert_eq!(RunError::from_stored(Some(error.code()), error.to_string()), error);
    }
    assert_eq!(
        RunError::from_stored(Some("from_a_newer_version"), "text".into()),
        RunError::Engine { message: "text".into() }
    );
    assert_eq!(
        RunError::from_stored(None, "text".into()),
        RunError::Engine { message: "text".into() }
    );
}
