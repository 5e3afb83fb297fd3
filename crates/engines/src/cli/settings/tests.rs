//! Tests of settings, the child environment and the executable lookup.

use std::os::unix::fs::PermissionsExt;

use super::*;

fn write_file(path: &Path, mode: u32) {
    std::fs::write(path, "#!/bin/sh\n").unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

#[test]
fn which_finds_the_first_executable_file_on_the_path() {
    let a = tempfile::tempdir().unwrap();
    let b = tempfile::tempdir().unwrap();
    write_file(&a.path().join("claude"), 0o644);
    std::fs::create_dir(a.path().join("codex")).unwrap();
    write_file(&b.path().join("claude"), 0o755);
    write_file(&b.path().join("codex"), 0o700);
    let path = format!("{}::{}", a.path().display(), b.path().display());
    assert_eq!(which(Path::new("claude"), &path), Some(b.path().join("claude")));
    assert_eq!(which(Path::new("codex"), &path), Some(b.path().join("codex")));
    assert_eq!(which(Path::new("pi"), &path), None);
    assert_eq!(which(Path::new("claude"), ""), None);
}

#[test]
fn resolution_says_where_it_looked() {
    let dir = tempfile::tempdir().unwrap();
    let search = dir.path().to_string_lossy().into_owned();
    let err = resolve_program(Vendor::Pi, None, Some(&search)).unwrap_err();
    assert_eq!(
        err,
        UnavailableReason::NotFound { program: "pi".into(), search_path: search.clone() }
    );
    assert_eq!(err.to_string(), format!("pi not found on PATH (looked in {search}); set cli_path"));
    assert_eq!(err.short(), "not found on PATH; set cli_path");
    let err = resolve_program(Vendor::Pi, None, None).unwrap_err().to_string();
    assert!(err.ends_with("in an empty PATH); set cli_path"), "{err}");

    let configured = dir.path().join("my-claude");
    let err = resolve_program(Vendor::Claude, Some(&configured), None).unwrap_err();
    assert_eq!(err.to_string(), format!("not found at {} (cli_path)", configured.display()));
    write_file(&configured, 0o644);
    let err = resolve_program(Vendor::Claude, Some(&configured), None).unwrap_err().to_string();
    assert!(err.contains("is not an executable file"), "{err}");
    write_file(&configured, 0o755);
    assert_eq!(resolve_program(Vendor::Claude, Some(&configured), None), Ok(configured.clone()));

    // A bare configured name is looked up on the PATH.
    assert_eq!(
        resolve_program(Vendor::Claude, Some(Path::new("my-claude")), Some(&search)),
        Ok(configured)
    );
}

fn settings(section: &EngineSection) -> CliSettings {
    CliSettings::from_section(Vendor::Claude, section)
}

#[test]
fn defaults_and_overrides() {
    let defaults = settings(&EngineSection::default());
    assert_eq!(defaults.timeout, Some(DEFAULT_TIMEOUT));
    assert_eq!(defaults.cancel_grace, DEFAULT_CANCEL_GRACE);
    assert_eq!(defaults.max_line_bytes, DEFAULT_MAX_LINE_BYTES);
    assert!(!defaults.skip_permissions && !defaults.steering);
    assert!(defaults.gateway_tools, "the gateway's tools are offered unless turned off");
    assert_eq!(defaults.api_key_env.as_deref(), Some("ANTHROPIC_API_KEY"));
    assert_eq!(CliSettings::from_section(Vendor::Pi, &EngineSection::default()).api_key_env, None);

    let mut section = EngineSection {
        timeout_ms: Some(0),
        cancel_grace_ms: Some(50),
        ..EngineSection::default()
    };
    section.model = Some("  ".to_owned());
    section.other.insert("api_key_env".to_owned(), "MY_KEY".into());
    section.other.insert("max_line_bytes".to_owned(), 4096_i64.into());
    section.other.insert("gateway_tools".to_owned(), false.into());
    let custom = settings(&section);
    assert!(!custom.gateway_tools);
    assert_eq!(custom.timeout, None, "0 disables the inactivity timeout");
    assert_eq!(custom.cancel_grace, Duration::from_millis(50));
    assert_eq!(custom.model, None);
    assert_eq!(custom.api_key_env.as_deref(), Some("MY_KEY"));
    assert_eq!(custom.max_line_bytes, 4096);
}

#[test]
fn the_child_environment_is_the_allowlist_then_the_vendor_then_env_then_the_key() {
    let base = BTreeMap::from([
        ("PATH".to_owned(), "/bin".to_owned()),
        ("HOME".to_owned(), "/home/me".to_owned()),
        ("CI".to_owned(), "true".to_owned()),
        ("LEMON_API_TOKEN".to_owned(), "secret".to_owned()),
        ("AWS_SECRET_ACCESS_KEY".to_owned(), "secret".to_owned()),
    ]);
    let mut section = EngineSection::default();
    section.env.insert("HOME".to_owned(), "/srv/agent".to_owned());
    section.env.insert("ANTHROPIC_API_KEY".to_owned(), "from-env-config".to_owned());
    let settings = settings(&section);
    let env = child_env(&base, &[("NO_COLOR", "1"), ("CI", "1")], &settings, Some("sk-secret"));
    assert_eq!(
        env,
        BTreeMap::from([
            ("PATH".to_owned(), "/bin".to_owned()),
            ("HOME".to_owned(), "/srv/agent".to_owned()),
            ("NO_COLOR".to_owned(), "1".to_owned()),
            ("CI".to_owned(), "1".to_owned()),
            ("ANTHROPIC_API_KEY".to_owned(), "sk-secret".to_owned()),
        ])
    );
    let debug = format!("{settings:?}");
    assert!(!debug.contains("from-env-config") && debug.contains("ANTHROPIC_API_KEY"), "{debug}");
}

#[test]
fn env_passthrough_adds_the_named_variables_and_prefixes_only() {
    let base = BTreeMap::from([
        ("PATH".to_owned(), "/bin".to_owned()),
        ("ANTHROPIC_API_KEY".to_owned(), "sk-ant".to_owned()),
        ("ANTHROPIC_BASE_URL".to_owned(), "https://proxy".to_owned()),
        ("OPENAI_API_KEY".to_owned(), "sk-openai".to_owned()),
        ("GH_TOKEN".to_owned(), "gh".to_owned()),
        ("LEMON_API_TOKEN".to_owned(), "secret".to_owned()),
    ]);
    let section = EngineSection {
        env_passthrough: vec!["ANTHROPIC_*".to_owned(), "GH_TOKEN".to_owned()],
        ..EngineSection::default()
    };
    let env = child_env(&base, &[], &settings(&section), None);
    let keys: Vec<&str> = env.keys().map(String::as_str).collect();
    assert_eq!(keys, ["ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL", "GH_TOKEN", "PATH"]);
    let debug = format!("{:?}", settings(&section));
    assert!(!debug.contains("sk-ant"), "{debug}");
}
