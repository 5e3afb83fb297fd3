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
fn session_keys_refuse_control_characters_and_serialise_as_their_text() {
    let key = SessionKey::parse("agent:main:telegram:9:dm:42").unwrap();
    assert_eq!(key.as_str(), "agent:main:telegram:9:dm:42");
    assert_eq!(key, "agent:main:telegram:9:dm:42");
    assert_eq!(key.to_string(), "agent:main:telegram:9:dm:42");
    assert_eq!(SessionKey::parse(" spaced key ").unwrap().as_str(), " spaced key ");
    assert_eq!(SessionKey::parse("a\nb"), Err(SessionKeyError::ControlCharacter));
    assert_eq!(SessionKey::parse("tab\there"), Err(SessionKeyError::ControlCharacter));
    assert!(!SessionKeyError::ControlCharacter.to_string().contains("tab"));

    let json = serde_json::to_value(&key).unwrap();
    assert_eq!(json, serde_json::json!("agent:main:telegram:9:dm:42"));
    assert_eq!(serde_json::from_value::<SessionKey>(json).unwrap(), key);
    // Maps keyed by session keys are searched with a plain `&str`.
    let map = std::collections::HashMap::from([(key.clone(), 1)]);
    assert_eq!(map.get("agent:main:telegram:9:dm:42"), Some(&1));
}

#[test]
fn caller_run_ids_are_trimmed_and_checked() {
    assert_eq!(RunId::parse(" abc-1 ").unwrap().as_str(), "abc-1");
    assert!(RunId::parse("").is_none());
    assert!(RunId::parse("has space").is_none());
    assert!(RunId::generate().as_str().starts_with("run_"));
}

#[test]
fn engine_refs_parse_display_and_serialise_as_their_text() {
    let plain = EngineRef::parse("claude").unwrap();
    assert_eq!((plain.id().as_str(), plain.model()), ("claude", None));
    assert_eq!(plain.to_string(), "claude");
    let composite: EngineRef = "pi:anthropic/claude-sonnet-4-5".parse().unwrap();
    assert_eq!(composite.id().as_str(), "pi");
    assert_eq!(composite.model().map(Model::as_str), Some("anthropic/claude-sonnet-4-5"));
    assert_eq!(composite.to_string(), "pi:anthropic/claude-sonnet-4-5");
    assert!(composite.is("pi") && !composite.is("pi:anthropic/claude-sonnet-4-5"));
    assert_eq!(composite, "pi:anthropic/claude-sonnet-4-5");
    assert_ne!(composite, "pi");
    assert_ne!(plain, "claude:opus");
    for raw in ["claude", "claude:opus", "codex:gpt-5-codex", "claude:claude-opus-4-1@20250805"] {
        let parsed = EngineRef::parse(raw).unwrap();
        let json = serde_json::to_value(&parsed).unwrap();
        assert_eq!(json, serde_json::json!(raw), "one string in JSON");
        assert_eq!(serde_json::from_value::<EngineRef>(json).unwrap(), parsed);
    }
}

#[test]
fn bad_engine_refs_are_refused_by_part() {
    assert!(matches!(EngineRef::parse("Claude"), Err(EngineRefError::Id(_))));
    assert!(matches!(EngineRef::parse("9lives:x"), Err(EngineRefError::Id(_))));
    assert!(matches!(EngineRef::parse(""), Err(EngineRefError::Id(_))));
    assert!(matches!(EngineRef::parse("help:opus"), Err(EngineRefError::Id(_))));
    assert_eq!(EngineRef::parse("claude:"), Err(EngineRefError::EmptyModel("claude:".into())));
    assert_eq!(
        EngineRef::parse("claude:--dangerously-skip-permissions"),
        Err(EngineRefError::Model(InvalidValue::LeadingDash))
    );
    assert_eq!(
        EngineRef::parse("codex:gpt 5"),
        Err(EngineRefError::Model(InvalidValue::Character))
    );
    let refused = EngineRef::parse("claude:--yolo").unwrap_err().to_string();
    assert!(!refused.contains("--yolo"), "the model is not repeated: {refused}");
    let from_json = serde_json::from_value::<EngineRef>(serde_json::json!("claude:-x"));
    assert!(from_json.is_err());
    assert!(Model::parse("-x").is_err());
}
