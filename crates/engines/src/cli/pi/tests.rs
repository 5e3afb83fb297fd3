//! Tests of Pi's session tokens.

use std::time::Duration;

use super::*;

#[test]
fn session_file_timestamps_are_utc_with_dashes() {
    assert_eq!(file_timestamp(UNIX_EPOCH), "1970-01-01T00-00-00-000Z");
    let t = UNIX_EPOCH + Duration::from_millis(1_785_585_600_123);
    assert_eq!(file_timestamp(t), "2026-08-01T12-00-00-123Z");
    assert_eq!(civil_from_days(19_782), (2024, 2, 29));
    assert_eq!(civil_from_days(-1), (1969, 12, 31));
}

#[test]
fn path_tokens_are_promoted_to_short_ids() {
    assert!(is_path_token("/home/me/.pi/agent/sessions/--tmp--/x.jsonl"));
    assert!(is_path_token("~/s.jsonl"));
    assert!(is_path_token("s.jsonl"));
    assert!(!is_path_token("3f2a9c1e"));
    assert_eq!(short_id("3f2a9c1e-7b6d-4e5f"), "3f2a9c1e");
    assert_eq!(short_id("abcdefghijk"), "abcdefgh");
    assert_eq!(short_id("-lead"), "-lead");
}

#[test]
fn a_new_session_token_is_a_file_under_the_agent_dir() {
    let home = tempfile::tempdir().unwrap();
    let settings = crate::cli::settings::CliSettings::from_section(
        crate::cli::Vendor::Pi,
        &Default::default(),
    );
    let base = std::collections::BTreeMap::from([(
        "HOME".to_owned(),
        home.path().to_string_lossy().into_owned(),
    )]);
    let input = CommandInput {
        settings: &settings,
        prompt: "hi",
        resume: None,
        model: None,
        cwd: std::path::Path::new("/work/my:proj"),
        base_env: &base,
        max_budget_usd: None,
    };
    let token = new_session_token(&input);
    let dir = home.path().join(".pi/agent/sessions/--work-my-proj--");
    assert!(token.starts_with(&*dir.to_string_lossy()) && token.ends_with(".jsonl"), "{token}");
    assert!(dir.is_dir());

    let no_home = std::collections::BTreeMap::new();
    let input = CommandInput { base_env: &no_home, ..input };
    assert!(new_session_token(&input).starts_with("pi_session_"));
}
