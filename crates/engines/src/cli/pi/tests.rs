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
}

/// Pi 0.73 names sessions by UUIDv7: the first segment of two sessions started
/// in the same minute is the same, so the token is the whole id.
#[test]
fn a_new_session_is_resumed_by_its_whole_id() {
    let settings = crate::cli::settings::CliSettings::from_section(
        crate::cli::Vendor::Pi,
        &Default::default(),
    );
    let home = tempfile::tempdir().unwrap();
    let cwd = std::path::PathBuf::from("/tmp/proj");
    let base = std::collections::BTreeMap::from([(
        "HOME".to_owned(),
        home.path().to_string_lossy().into_owned(),
    )]);
    let input = CommandInput {
        settings: &settings,
        prompt: "hi",
        resume: None,
        model: None,
        cwd: &cwd,
        base_env: &base,
        max_budget_usd: None,
        gateway_mcp: None,
    };
    let invocation = command(&input);
    let ctx = ParseContext { cwd: Some(cwd.clone()), ..ParseContext::default() };
    let mut parser = Parser::new(ctx, invocation.new_session.clone(), false);
    let mut out = Emitter::new(crate::cli::Vendor::Pi, None);
    let id = "01a2340e-8e30-7359-8bd9-35a8433ec603";
    let line = format!(r#"{{"type":"session","version":3,"id":"{id}","cwd":"/tmp/proj"}}"#);
    parser.line(&line, &mut out).unwrap();
    assert_eq!(out.found().map(|token| token.value.as_str()), Some(id));
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
        gateway_mcp: None,
    };
    let token = new_session_token(&input);
    let dir = home.path().join(".pi/agent/sessions/--work-my-proj--");
    assert!(token.starts_with(&*dir.to_string_lossy()) && token.ends_with(".jsonl"), "{token}");
    assert!(dir.is_dir());

    let no_home = std::collections::BTreeMap::new();
    let input = CommandInput { base_env: &no_home, ..input };
    assert!(new_session_token(&input).starts_with("pi_session_"));
}

/// The section's `env` is the child's: a new session's file goes under the
/// agent directory (or HOME) the CLI itself uses, where it looks on resume.
#[test]
fn a_new_session_file_is_under_the_agent_dir_of_the_section_env() {
    let gateway_home = tempfile::tempdir().unwrap();
    let agent = tempfile::tempdir().unwrap();
    let section = crate::config::EngineSection {
        env: std::collections::BTreeMap::from([(
            "PI_CODING_AGENT_DIR".to_owned(),
            agent.path().to_string_lossy().into_owned(),
        )]),
        ..Default::default()
    };
    let settings =
        crate::cli::settings::CliSettings::from_section(crate::cli::Vendor::Pi, &section);
    let base = std::collections::BTreeMap::from([(
        "HOME".to_owned(),
        gateway_home.path().to_string_lossy().into_owned(),
    )]);
    let input = CommandInput {
        settings: &settings,
        prompt: "hi",
        resume: None,
        model: None,
        cwd: std::path::Path::new("/tmp/proj"),
        base_env: &base,
        max_budget_usd: None,
        gateway_mcp: None,
    };
    let token = new_session_token(&input);
    let dir = agent.path().join("sessions/--tmp-proj--");
    assert!(token.starts_with(&*dir.to_string_lossy()), "{token}");
    assert!(!gateway_home.path().join(".pi").exists());
}
