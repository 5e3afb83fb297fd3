//! The reference's environment variables over `config.toml`, with the
//! environment passed in as a map.

use std::collections::BTreeMap;
use std::path::Path;

use crate::config::{load_str_with_env, Config, ConfigError, LoadedConfig};

const FILE: &str = "/home/u/.lemon/config.toml";

fn env(vars: &[(&str, &str)]) -> BTreeMap<String, String> {
    vars.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
}

fn load(text: &str, vars: &[(&str, &str)]) -> Result<LoadedConfig, ConfigError> {
    load_str_with_env(text, Path::new(FILE), &env(vars))
}

fn check(text: &str, vars: &[(&str, &str)]) -> Config {
    match load(text, vars) {
        Ok(loaded) => loaded.config,
        Err(e) => panic!("unexpected error: {e}\n--- input ---\n{text}"),
    }
}

fn check_error(text: &str, vars: &[(&str, &str)], expect: &str) {
    match load(text, vars) {
        Ok(loaded) => panic!("expected an error, loaded {:?}", loaded.config.gateway.sms),
        Err(e) => assert_eq!(e.to_string(), expect),
    }
}

fn sms(config: &Config) -> &toml::Table {
    config.gateway.sms.as_ref().expect("an sms section")
}

#[test]
fn gateway_variables_win_over_the_file() {
    let file = "[gateway]\nmax_concurrent_runs = 4\nrequire_engine_lock = true\n\
                engine_lock_timeout_ms = 1000\nenable_webhook = false\n";
    let config = check(
        file,
        &[
            ("LEMON_GATEWAY_MAX_CONCURRENT_RUNS", "7"),
            ("LEMON_GATEWAY_DEFAULT_CWD", " /srv/work "),
            ("LEMON_GATEWAY_AUTO_RESUME", "yes"),
            ("LEMON_GATEWAY_ENABLE_WEBHOOK", "TRUE"),
            ("LEMON_GATEWAY_REQUIRE_ENGINE_LOCK", "0"),
            ("LEMON_GATEWAY_ENGINE_LOCK_TIMEOUT_MS", "45000"),
            ("LEMON_GATEWAY_HEALTH_PORT", "4999"),
        ],
    );
    let gateway = &config.gateway;
    assert_eq!(gateway.max_concurrent_runs, 7);
    assert_eq!(gateway.default_cwd.as_deref(), Some(Path::new("/srv/work")));
    assert_eq!(gateway.auto_resume, Some(true));
    assert_eq!(gateway.enable_webhook, Some(true));
    assert!(!gateway.require_engine_lock);
    assert_eq!(gateway.engine_lock_timeout_ms, 45_000);
    assert_eq!(gateway.health_addr(), "127.0.0.1:4999");
    // Unset and blank variables leave the file's values.
    let config = check(file, &[("LEMON_GATEWAY_MAX_CONCURRENT_RUNS", " ")]);
    assert_eq!(config.gateway.max_concurrent_runs, 4);
    assert!(config.gateway.require_engine_lock);
}

#[test]
fn a_variable_that_replaces_a_value_of_the_file_is_a_warning_naming_both() {
    let loaded = load(
        "[gateway]\nmax_concurrent_runs = 4\n\n[gateway.sms]\nwebhook_port = 4045\n",
        &[("LEMON_GATEWAY_MAX_CONCURRENT_RUNS", "7"), ("LEMON_SMS_WEBHOOK_PORT", "5000")],
    )
    .unwrap();
    assert_eq!(
        loaded.warnings,
        [
            format!("{FILE}:2:1: gateway.max_concurrent_runs: the environment variable LEMON_GATEWAY_MAX_CONCURRENT_RUNS overrides this value"),
            format!("{FILE}:5:1: gateway.sms.webhook_port: the environment variable LEMON_SMS_WEBHOOK_PORT overrides this value"),
        ]
    );
    // Nothing to say when the file leaves the setting alone.
    assert!(load("", &[("LEMON_SMS_WEBHOOK_PORT", "5000")]).unwrap().warnings.is_empty());
}

#[test]
fn sms_variables_set_our_keys_and_replace_both_names_in_the_file() {
    let file = "[gateway.sms]\nwebhook_enabled = false\nport = 1\nwebhook_port = 2\n\
                webhook_bind = \"0.0.0.0\"\npublic_url = \"https://a.example\"\n\
                validate_webhook = true\ninbox_ttl_ms = 5\n";
    let config = check(
        file,
        &[
            ("LEMON_SMS_WEBHOOK_ENABLED", "on"),
            ("LEMON_SMS_WEBHOOK_PORT", "4045"),
            ("LEMON_SMS_WEBHOOK_BIND", "localhost"),
            ("LEMON_SMS_INBOX_TTL_MS", "60000"),
            ("TWILIO_INBOX_NUMBER", "+15551230000"),
            ("TWILIO_VALIDATE_WEBHOOK", "false"),
            ("TWILIO_WEBHOOK_URL", "https://b.example/webhooks/twilio/sms"),
        ],
    );
    let expect: toml::Table = "enabled = true\nport = 4045\nbind = \"127.0.0.1\"\n\
        inbox_ttl_ms = 60000\ninbox_number = \"+15551230000\"\nvalidate_webhook = false\n\
        webhook_url = \"https://b.example/webhooks/twilio/sms\"\n"
        .parse()
        .unwrap();
    assert_eq!(sms(&config), &expect);
    // A variable alone makes the section (the SMS channel stays off unless
    // LEMON_SMS_WEBHOOK_ENABLED or the file switches it on).
    let config = check("", &[("LEMON_SMS_WEBHOOK_ENABLED", "1")]);
    assert_eq!(sms(&config).get("enabled").and_then(toml::Value::as_bool), Some(true));
    assert!(check("", &[]).gateway.sms.is_none());
}

#[test]
fn bad_values_are_errors_naming_the_variable() {
    for (var, value, expect) in [
        (
            "LEMON_SMS_WEBHOOK_PORT",
            "70000",
            "environment variable LEMON_SMS_WEBHOOK_PORT: \"70000\" is not a port (a whole number from 0 to 65535)",
        ),
        (
            "LEMON_SMS_WEBHOOK_ENABLED",
            "enable",
            "environment variable LEMON_SMS_WEBHOOK_ENABLED: \"enable\" is not a boolean (use 1, true, yes, on or 0, false, no, off)",
        ),
        (
            "LEMON_SMS_WEBHOOK_BIND",
            "::1",
            "environment variable LEMON_SMS_WEBHOOK_BIND: \"::1\" must be 127.0.0.1, localhost, 0.0.0.0, any or an IPv4 address",
        ),
        (
            "LEMON_SMS_INBOX_TTL_MS",
            "0",
            "environment variable LEMON_SMS_INBOX_TTL_MS: \"0\" is not a whole number from 1 to 2592000000",
        ),
        (
            "TWILIO_INBOX_NUMBER",
            "5551230000",
            "environment variable TWILIO_INBOX_NUMBER: \"5551230000\" is not an E.164 number (`+` and the country code, like +15551234567)",
        ),
        (
            "TWILIO_WEBHOOK_URL",
            "sms.example.com/hook",
            "environment variable TWILIO_WEBHOOK_URL: \"sms.example.com/hook\" is not an http(s) URL with a host",
        ),
        (
            "LEMON_GATEWAY_MAX_CONCURRENT_RUNS",
            "5000",
            "environment variable LEMON_GATEWAY_MAX_CONCURRENT_RUNS: \"5000\" is not a whole number from 0 to 4096",
        ),
        (
            "LEMON_GATEWAY_HEALTH_PORT",
            "-1",
            "environment variable LEMON_GATEWAY_HEALTH_PORT: \"-1\" is not a port (a whole number from 0 to 65535)",
        ),
        (
            "VOICE_PUBLIC_URL",
            "ftp://x",
            "environment variable VOICE_PUBLIC_URL: \"ftp://x\" is not an http(s) URL with a host",
        ),
    ] {
        check_error("[gateway.voice]\n", &[(var, value)], expect);
    }
}

#[test]
fn voice_variables_fill_only_what_an_existing_section_leaves_unset() {
    let vars = [
        ("VOICE_PUBLIC_URL", "https://env.example"),
        ("TWILIO_PHONE_NUMBER", "+15551239999"),
        ("VOICE_RECORDINGS_DIR", "/var/rec"),
    ];
    let config = check("[gateway.voice]\npublic_url = \"https://file.example\"\n", &vars);
    let voice = config.gateway.voice.as_ref().unwrap();
    assert_eq!(voice["public_url"].as_str(), Some("https://file.example"));
    assert_eq!(voice["twilio_phone_number"].as_str(), Some("+15551239999"));
    assert_eq!(voice["recordings_dir"].as_str(), Some("/var/rec"));
    // No section: the variables switch nothing on.
    assert!(check("", &vars).gateway.voice.is_none());
}

#[test]
fn xmtp_dollar_values_are_the_variables_and_an_unset_one_leaves_the_key_unset() {
    let loaded = load(
        "[gateway.xmtp]\nwallet_key = \"${XMTP_KEY}\"\napi_url = \" ${XMTP_API} \"\n\
         inbox_id = \"$NOT_A_REFERENCE\"\n",
        &[("XMTP_KEY", "0xsecret")],
    )
    .unwrap();
    let xmtp = loaded.config.gateway.xmtp.as_ref().unwrap();
    assert_eq!(xmtp["wallet_key"].as_str(), Some("0xsecret"));
    assert!(xmtp.get("api_url").is_none());
    assert_eq!(xmtp["inbox_id"].as_str(), Some("$NOT_A_REFERENCE"));
    assert_eq!(
        loaded.warnings,
        [format!(
            "{FILE}:3:1: gateway.xmtp.api_url: the environment variable XMTP_API is not set; the key is left unset"
        )]
    );
    // The value never appears in a warning.
    assert!(loaded.warnings.iter().all(|w| !w.contains("0xsecret")));
}

#[test]
fn auto_resume_false_is_accepted_with_a_note_from_the_file_or_the_environment() {
    let note = "gateway.auto_resume: false is accepted; a conversation here always continues its last engine session (send /new, or meta.disable_auto_resume = true, to start fresh)";
    let loaded = load("[gateway]\nauto_resume = false\n", &[]).unwrap();
    assert_eq!(loaded.warnings, [format!("{FILE}:2:1: {note}")]);
    let loaded = load("", &[("LEMON_GATEWAY_AUTO_RESUME", "false")]).unwrap();
    assert_eq!(loaded.warnings, [format!("{FILE}: {note}")]);
    assert!(load("[gateway]\nauto_resume = true\n", &[]).unwrap().warnings.is_empty());
}
