//! Tests of `[gateway.engines.*]` parsing and where its errors point.

use super::*;

const FILE: &str = "/home/u/.lemon/config.toml";

/// Loads `text` as a start does: core's keys, then the engines' sections.
fn load(text: &str) -> Result<EngineSections, ConfigError> {
    let loaded = lemon_core::config::load_str(text, Path::new(FILE))?;
    EngineSections::parse(&loaded.config.gateway.engines, Path::new(FILE), text)
}

fn check_error(text: &str, expect: &str) {
    match load(text) {
        Ok(sections) => panic!("expected an error, parsed {sections:?}\n--- input ---\n{text}"),
        Err(e) => assert_eq!(e.to_string(), expect, "error for\n{text}"),
    }
}

#[test]
fn the_reference_example_parses() {
    let sections = load(include_str!("../../../core/src/config/reference_example.toml")).unwrap();
    assert_eq!(sections.get("echo").unwrap().delay_ms, Some(25));
    assert_eq!(sections.echo_delay(), Duration::from_millis(25));
    let claude = sections.get("claude").unwrap();
    assert_eq!(claude.enabled, Some(true));
    assert_eq!(claude.cli_path.as_deref(), Some(Path::new("/usr/local/bin/claude")));
    assert_eq!(claude.extra_args, ["--verbose"]);
    assert_eq!(claude.model.as_deref(), Some("opus"));
    assert_eq!(claude.timeout_ms, Some(1_800_000));
    assert_eq!(claude.env.get("CLAUDE_CODE_MAX_OUTPUT_TOKENS").map(String::as_str), Some("32000"));
    assert_eq!(claude.dangerously_skip_permissions, Some(false));
    assert_eq!(claude.allowed_tools, ["Read", "Edit", "Bash"]);
    assert_eq!(claude.steering, Some(true));
    assert_eq!(claude.api_key_secret.as_deref(), Some("anthropic_api_key"));
    assert!(claude.other.is_empty(), "{:?}", claude.other);
    let codex = sections.get("codex").unwrap();
    assert_eq!(codex.other.get("sandbox").and_then(|v| v.as_str()), Some("workspace-write"));
    assert!(sections.get("pi").is_none());
    assert_eq!(sections.longest_cancel_grace(), Some(Duration::from_millis(5000)));
}

#[test]
fn no_sections_give_the_defaults() {
    let sections = load("").unwrap();
    assert_eq!(sections, EngineSections::default());
    assert_eq!(sections.echo_delay(), Duration::ZERO);
    assert_eq!(sections.longest_cancel_grace(), None);
}

#[test]
fn engine_specific_keys_are_kept_for_the_engine() {
    let sections = load("[gateway.engines.pi]\nthinking = \"high\"\n").unwrap();
    assert_eq!(sections.get("pi").unwrap().other["thinking"].as_str(), Some("high"));
}

#[test]
fn wrong_types_point_at_the_value() {
    check_error(
        "[gateway.engines.echo]\ndelay_ms = \"fast\"\n",
        r#"/home/u/.lemon/config.toml:2:12: gateway.engines.echo.delay_ms: invalid type: string "fast", expected a whole number, 0 or more"#,
    );
    check_error(
        "[gateway.engines.claude]\nenv = { A = 1 }\n",
        "/home/u/.lemon/config.toml:2:7: gateway.engines.claude.env: invalid type: integer `1`, expected a string",
    );
    check_error(
        "[gateway]\nengines = { codex = { steering = \"yes\" } }\n",
        r#"/home/u/.lemon/config.toml:2:34: gateway.engines.codex.steering: invalid type: string "yes", expected a boolean"#,
    );
}

#[test]
fn models_are_checked() {
    let rule = "use up to 128 ASCII letters, digits and `._:/@-`, not starting with `-`";
    check_error(
        "[gateway.engines.claude]\nmodel = \"-x\"\n",
        &format!(
            "{FILE}:2:9: gateway.engines.claude.model: invalid model: it starts with '-'; {rule}"
        ),
    );
    let sections =
        load("[gateway.engines.claude]\nmodel = \"claude-opus-4-1@20250805\"\n").unwrap();
    assert_eq!(sections.get("claude").unwrap().model.as_deref(), Some("claude-opus-4-1@20250805"));
    // A blank model means none.
    assert!(load("[gateway.engines.claude]\nmodel = \"  \"\n").is_ok());
}

#[test]
fn durations_are_bounded() {
    check_error(
        "[gateway.engines.echo]\ndelay_ms = 99999999999999\n",
        "/home/u/.lemon/config.toml:2:12: gateway.engines.echo.delay_ms: 99999999999999 is too large: must be at most 2592000000",
    );
    check_error(
        "[gateway.engines.codex]\ncancel_grace_ms = 2592000001\n",
        "/home/u/.lemon/config.toml:2:19: gateway.engines.codex.cancel_grace_ms: 2592000001 is too large: must be at most 2592000000",
    );
    let sections = load("[gateway.engines.claude]\ntimeout_ms = 2592000000\n").unwrap();
    assert_eq!(sections.get("claude").unwrap().timeout_ms, Some(MAX_DURATION_MS));
}

#[test]
fn engine_specific_keys_are_checked_by_type_and_range() {
    let section = |text: &str| -> Result<EngineSection, SectionError> {
        let file = format!("[gateway.engines.claude]\n{text}\n");
        let loaded = lemon_core::config::load_str(&file, Path::new("config.toml")).unwrap();
        EngineSection::parse(&loaded.config.gateway.engines["claude"])
    };
    let err = |text: &str| section(text).map(|_| ()).map_err(|e| e.message);
    assert_eq!(err("max_line_bytes = 4096\nprovider = \"x\""), Ok(()));
    assert_eq!(
        err("max_line_bytes = 0"),
        Err("`max_line_bytes` = 0: must be between 1 and 1073741824".to_owned())
    );
    assert_eq!(
        err("max_line_bytes = 99999999999999"),
        Err("`max_line_bytes` = 99999999999999: must be between 1 and 1073741824".to_owned())
    );
    assert_eq!(
        err("max_line_bytes = \"big\""),
        Err("`max_line_bytes`: invalid type: string, expected an integer".to_owned())
    );
    assert_eq!(
        err("reasoning_effort = 3"),
        Err("`reasoning_effort`: invalid type: integer, expected a string".to_owned())
    );
    assert_eq!(err("gateway_tools = false"), Ok(()));
    assert_eq!(
        err("gateway_tools = \"no\""),
        Err("`gateway_tools`: invalid type: string, expected a boolean".to_owned())
    );
    // In the file, the quoted key places the error.
    check_error(
        "[gateway.engines.codex]\nmax_line_bytes = \"lots\"\n",
        "/home/u/.lemon/config.toml:2:18: gateway.engines.codex.max_line_bytes: `max_line_bytes`: invalid type: string, expected an integer",
    );
}

#[test]
fn debug_output_shows_no_environment_values() {
    let sections =
        load("[gateway.engines.claude]\nenv = { ANTHROPIC_API_KEY = \"sk-live\" }\n").unwrap();
    let debug = format!("{sections:?}");
    assert!(debug.contains("ANTHROPIC_API_KEY") && !debug.contains("sk-live"), "{debug}");
}

#[test]
fn the_lemon_section_is_parsed_with_defaults_per_provider() {
    use crate::native::{NativeSettings, ProviderKind};
    let defaults = NativeSettings::from_section(None).unwrap();
    assert_eq!(defaults.provider, ProviderKind::OpenAi);
    assert_eq!(defaults.api_key_secret, "openai_api_key");
    assert_eq!(defaults.context_window, 128_000);
    assert_eq!(defaults.max_turns, 25);
    assert!(defaults.enabled && defaults.tools.is_none());
    let text = "[gateway.engines.lemon]\nprovider = \"anthropic\"\nbase_url = \"http://127.0.0.1:9\"\nmodel = \"claude-x\"\nmax_tokens = 512\ntemperature = 0.5\nsystem_prompt = \"be brief\"\nmax_turns = 4\ntools = [\"bash\", \"edit\"]\n";
    let sections = load(text).unwrap();
    let settings = NativeSettings::from_section(sections.get("lemon")).unwrap();
    assert_eq!(settings.provider, ProviderKind::Anthropic);
    assert_eq!(settings.api_key_secret, "anthropic_api_key");
    assert_eq!(settings.context_window, 200_000);
    assert_eq!(settings.base_url.as_deref(), Some("http://127.0.0.1:9"));
    assert_eq!(settings.model, "claude-x");
    assert_eq!(
        (settings.max_tokens, settings.temperature, settings.max_turns),
        (Some(512), Some(0.5), 4)
    );
    assert_eq!(settings.system_prompt.as_deref(), Some("be brief"));
    assert!(settings.allows("bash") && !settings.allows("fetch"));
    let custom = load("[gateway.engines.lemon]\napi_key_secret = \"my_key\"\ncontext_window = 8000\nenabled = false\n").unwrap();
    let custom = NativeSettings::from_section(custom.get("lemon")).unwrap();
    assert_eq!(
        (custom.api_key_secret.as_str(), custom.context_window, custom.enabled),
        ("my_key", 8000, false)
    );
}

#[test]
fn vision_is_on_for_every_provider_unless_turned_off() {
    use crate::native::NativeSettings;
    let settings = |text: &str| {
        let sections = load(&format!("[gateway.engines.lemon]\n{text}")).unwrap();
        NativeSettings::from_section(sections.get("lemon")).unwrap()
    };
    assert!(NativeSettings::default().vision);
    for provider in ["openai", "openai-responses", "anthropic"] {
        assert!(settings(&format!("provider = \"{provider}\"\n")).vision, "{provider}");
    }
    assert!(settings("base_url = \"http://127.0.0.1:11434/v1\"\n").vision, "a compatible server");
    assert!(!settings("vision = false\n").vision);
    assert!(settings("provider = \"anthropic\"\nvision = true\n").vision);
}

#[test]
fn a_server_on_this_machine_or_an_empty_secret_needs_no_key() {
    use crate::native::NativeSettings;
    let settings = |text: &str| {
        let sections = load(&format!("[gateway.engines.lemon]\n{text}")).unwrap();
        NativeSettings::from_section(sections.get("lemon")).unwrap()
    };
    for local in [
        "http://localhost:11434/v1",
        "http://127.0.0.1:8080/v1",
        "http://[::1]:11434",
        "https://LOCALHOST/v1",
    ] {
        assert!(settings(&format!("base_url = \"{local}\"\n")).key_optional(), "{local}");
    }
    for remote in [
        "https://api.openai.com/v1",
        "http://10.0.0.5:11434/v1",
        "http://localhost.example.com/v1",
        "http://127.0.0.1.example.com/",
    ] {
        assert!(!settings(&format!("base_url = \"{remote}\"\n")).key_optional(), "{remote}");
    }
    assert!(!settings("").key_optional(), "the public endpoint needs its key");
    let keyless = settings("api_key_secret = \"\"\nbase_url = \"https://llm.example.com/v1\"\n");
    assert!(keyless.key_optional());
    assert_eq!(keyless.api_key_secret, "");
}

#[test]
fn wrong_lemon_keys_point_at_the_value() {
    check_error(
        "[gateway.engines.lemon]\nprovider = \"gemini\"\n",
        r#"/home/u/.lemon/config.toml:2:12: gateway.engines.lemon.provider: unknown provider "gemini": expected "openai", "openai-responses" or "anthropic""#,
    );
    check_error(
        "[gateway.engines.lemon]\ntools = [\"bash\", \"rm\"]\n",
        r#"/home/u/.lemon/config.toml:2:9: gateway.engines.lemon.tools: unknown tool "rm": the tools are bash, read, write, edit, list, grep, glob, fetch"#,
    );
    check_error(
        "[gateway.engines.lemon]\nmax_turns = 0\n",
        "/home/u/.lemon/config.toml:2:13: gateway.engines.lemon.max_turns: 0: must be between 1 and 1000",
    );
    check_error(
        "[gateway.engines.lemon]\ntemperature = \"hot\"\n",
        "/home/u/.lemon/config.toml:2:15: gateway.engines.lemon.temperature: invalid type: string, expected a number",
    );
    check_error(
        "[gateway.engines.lemon]\nbase_url = \"ftp://x\"\n",
        r#"/home/u/.lemon/config.toml:2:12: gateway.engines.lemon.base_url: "ftp://x" is not an http:// or https:// URL"#,
    );
    check_error(
        "[gateway.engines.lemon]\nvision = \"yes\"\n",
        "/home/u/.lemon/config.toml:2:10: gateway.engines.lemon.vision: invalid type: string, expected true or false",
    );
    check_error(
        "[gateway.engines.lemon]\nmodel = \"-x\"\n",
        "/home/u/.lemon/config.toml:2:9: gateway.engines.lemon.model: invalid model: it starts with '-'; use up to 128 ASCII letters, digits and `._:/@-`, not starting with `-`",
    );
}

#[test]
fn env_passthrough_takes_names_and_prefixes_and_refuses_the_rest() {
    let parse = |text: &str| EngineSection::parse(&toml::from_str(text).unwrap());
    let section = parse("env_passthrough = [\"ANTHROPIC_*\", \"GH_TOKEN\"]").unwrap();
    assert_eq!(section.env_passthrough, ["ANTHROPIC_*", "GH_TOKEN"]);
    for (text, why) in [
        ("env_passthrough = [\"*\"]", "`*` alone"),
        ("env_passthrough = [\"A-B\"]", "ASCII letters"),
        ("env_passthrough = [\"1X\"]", "ASCII letters"),
        ("env_passthrough = [\"LEMON_*\"]", "LEMON_*"),
        ("env_passthrough = [\"LEMON_API_TOKEN\"]", "LEMON_*"),
        ("env_passthrough = \"ANTHROPIC_*\"", "expected a sequence"),
    ] {
        let err = parse(text).expect_err(text);
        assert_eq!(err.key.as_deref(), Some("env_passthrough"), "{text}");
        assert!(err.message.contains(why), "{text}: {}", err.message);
    }
}

#[test]
fn unknown_engine_sections_and_keys_warn_with_the_closest_name() {
    let text = "[gateway.engines.cluade]\ncli_path = \"x\"\n\n[gateway.engines.codex]\ncli_pth = \"/bin/codex\"\nmax_line_bytes = 10\ngateway_tools = false\n\n[gateway.engines.lemon]\nwhatever = 1\n";
    let config = lemon_core::config::load_str(text, Path::new("/etc/lemon.toml")).unwrap().config;
    let sections =
        EngineSections::parse(&config.gateway.engines, Path::new("/etc/lemon.toml"), text).unwrap();
    let warnings =
        sections.warnings(Path::new("/etc/lemon.toml"), text, &["echo", "codex", "lemon"]);
    assert_eq!(
        warnings,
        [
            "/etc/lemon.toml:1:18: unknown engine section gateway.engines.cluade (ignored); did you mean `claude`?",
            "/etc/lemon.toml:5:1: unknown key gateway.engines.codex.cli_pth (ignored); did you mean `cli_path`?",
        ]
    );
}
