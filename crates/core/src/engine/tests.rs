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
