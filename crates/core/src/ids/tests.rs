use super::*;

fn check_engine_id(raw: &str, ok: bool) {
    assert_eq!(EngineId::parse(raw).is_ok(), ok, "engine id {raw:?}");
}

#[test]
fn engine_ids_follow_the_pattern_and_skip_reserved_words() {
    check_engine_id("claude", true);
    check_engine_id("open-code_2", true);
    check_engine_id("Claude", false);
    check_engine_id("2claude", false);
    check_engine_id("", false);
    check_engine_id("claude:opus", false);
    assert_eq!(EngineId::parse("default"), Err(EngineIdError::Reserved("default".into())));
    assert_eq!(EngineId::parse("help"), Err(EngineIdError::Reserved("help".into())));
}

#[test]
fn blank_session_is_the_default_conversation() {
    assert_eq!(ConversationKey::session("  ").as_str(), "session:default");
    assert_eq!(ConversationKey::session("agent:a:main").as_str(), "session:agent:a:main");
    assert_eq!(ConversationKey::resume("claude", "abc").as_str(), "resume:claude:abc");
}

#[test]
fn caller_run_ids_are_trimmed_and_checked() {
    assert_eq!(RunId::parse(" abc-1 ").unwrap().as_str(), "abc-1");
    assert!(RunId::parse("").is_none());
    assert!(RunId::parse("has space").is_none());
    assert!(RunId::generate().as_str().starts_with("run_"));
}
