//! `[gateway.sms]`: defaults, checks, unknown keys, and the start refusing a
//! webhook that would be left unchecked.

use std::collections::BTreeMap;

use super::*;

fn table(text: &str) -> toml::Table {
    text.parse().unwrap()
}

fn secrets(pairs: &[(&str, &str)]) -> (SecretStore, tempfile_dir::Dir) {
    let dir = tempfile_dir::Dir::new();
    let env: BTreeMap<String, String> =
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
    (SecretStore::new(env, dir.path().join("secrets.toml")), dir)
}

/// A directory removed when dropped, without a dependency for it.
mod tempfile_dir {
    use std::path::{Path, PathBuf};

    pub(super) struct Dir(PathBuf);

    impl Dir {
        pub(super) fn new() -> Self {
            let path = std::env::temp_dir()
                .join(format!("lemon-sms-config-{}", uuid::Uuid::new_v4().simple()));
            std::fs::create_dir_all(&path).unwrap();
            Dir(path)
        }

        pub(super) fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

#[test]
fn defaults_are_loopback_4041_signatures_on_and_secrets_by_name() {
    let config = SmsConfig::default();
    assert_eq!(config.addr(), "127.0.0.1:4041");
    assert!(config.validate_webhook);
    assert_eq!(config.auth_token_secret, "twilio_auth_token");
    assert_eq!(config.account_sid_secret, "twilio_account_sid");
    assert_eq!(config.api_base_url, "https://api.twilio.com");
    assert_eq!(config.inbox_ttl_ms, 86_400_000);
    assert_eq!(config.api_timeout(), Duration::from_secs(15));
    assert!(!config.reply_to_allowed);
    assert!(!config.allow_everyone);
    assert!(!config.sender_listed("+15550001111"), "an empty list has nobody");
    assert_eq!(config.enabled, None);
    assert_eq!(config.webhook_url(), None);
}

#[test]
fn sms_is_on_only_with_enabled_true_and_the_section_is_checked_either_way() {
    assert!(SmsConfig::from_gateway(None).unwrap().is_none());
    assert!(SmsConfig::from_gateway(Some(&table("port = 1"))).unwrap().is_none());
    assert!(SmsConfig::from_gateway(Some(&table("enabled = true"))).unwrap().is_some());
    let off_but_wrong = table("enabled = false\ninbox_number = \"555\"");
    assert!(SmsConfig::from_gateway(Some(&off_but_wrong)).is_err());
}

#[test]
fn values_are_checked_and_errors_name_the_key() {
    let cases = [
        ("port = \"x\"", "`port`"),
        ("inbox_number = \"5551234\"", "`inbox_number`"),
        ("allowed_senders = [\"+15551230000\", \"+0123\"]", "`allowed_senders`"),
        ("allowed_recipients = [\"nope\"]", "`allowed_recipients`"),
        ("public_url = \"ftp://example.com\"", "`public_url`"),
        ("public_url = \"https://example.com/?a=1\"", "`public_url`"),
        ("api_base_url = \"nonsense\"", "`api_base_url`"),
        ("max_body_bytes = 0", "`max_body_bytes`"),
        ("inbox_ttl_ms = 0", "`inbox_ttl_ms`"),
        ("api_timeout_ms = 99", "`api_timeout_ms`"),
        ("api_timeout_ms = 600001", "`api_timeout_ms`"),
        ("validate_webhook = \"yes\"", "`validate_webhook`"),
    ];
    for (text, key) in cases {
        let error = SmsConfig::parse(&table(text)).unwrap_err().to_string();
        assert!(error.contains(key), "{text}: {error}");
    }
}

#[test]
fn urls_and_numbers_are_normalised() {
    let config = SmsConfig::parse(&table(
        "public_url = \" https://abc.trycloudflare.com/ \"\ninbox_number = \" +15551239999 \"\n\
         allowed_senders = [\" +15551230000\"]\napi_base_url = \"http://127.0.0.1:9/\"",
    ))
    .unwrap();
    assert_eq!(config.webhook_url().unwrap(), "https://abc.trycloudflare.com/webhooks/twilio/sms");
    assert_eq!(config.inbox_number.as_deref(), Some("+15551239999"));
    assert_eq!(config.allowed_senders, ["+15551230000"]);
    assert_eq!(config.api_base_url, "http://127.0.0.1:9");
    assert!(config.may_send_to("+15551230000"));
    assert!(!config.may_send_to("+15551230001"));
    assert!(config.sender_listed("+15551230000"));
    assert!(!config.sender_listed("+15551230001"));
}

#[test]
fn unknown_keys_are_reported_with_the_closest_known_one() {
    let (_, unknown) =
        SmsConfig::parse_with_unknown_keys(&table("publc_url = \"https://x.example\"")).unwrap();
    assert_eq!(unknown.len(), 1);
    assert_eq!(unknown[0].path, ["publc_url"]);
    assert_eq!(unknown[0].suggestion.as_deref(), Some("public_url"));
}

#[test]
fn e164_numbers() {
    for good in ["+15551234567", "+447911123456", "+12"] {
        assert!(is_e164(good), "{good}");
    }
    for bad in ["15551234567", "+05551234567", "+1555-123", "+", "+1234567890123456", "GOOGLE", ""]
    {
        assert!(!is_e164(bad), "{bad}");
    }
}

#[test]
fn signatures_on_need_an_auth_token_and_a_public_url() {
    let on = SmsConfig::parse(&table("enabled = true")).unwrap();
    let (none, _dir) = secrets(&[]);
    let error = on.resolve(&none).unwrap_err().to_string();
    assert!(error.contains("auth token") && error.contains("twilio_auth_token"), "{error}");
    let (token, _dir) = secrets(&[("TWILIO_AUTH_TOKEN", "tok-123")]);
    let error = on.resolve(&token).unwrap_err().to_string();
    assert!(error.contains("public_url"), "{error}");
    assert!(!error.contains("tok-123"));
    let with_url =
        SmsConfig::parse(&table("enabled = true\npublic_url = \"https://x.example\"")).unwrap();
    let resolved = with_url.resolve(&token).unwrap();
    assert_eq!(resolved.auth_token.as_deref(), Some("tok-123"));
    assert!(!format!("{resolved:?}").contains("tok-123"));
    // Switched off deliberately, nothing is needed.
    let open = SmsConfig::parse(&table("enabled = true\nvalidate_webhook = false")).unwrap();
    assert!(open.resolve(&none).unwrap().auth_token.is_none());
}

#[test]
fn conversations_need_the_inbox_number_and_both_credentials() {
    let base = "enabled = true\nvalidate_webhook = false\nreply_to_allowed = true\n";
    let (both, _dir) = secrets(&[("TWILIO_AUTH_TOKEN", "t"), ("TWILIO_ACCOUNT_SID", "AC1")]);
    let no_number = SmsConfig::parse(&table(base)).unwrap();
    assert!(no_number.resolve(&both).unwrap_err().to_string().contains("inbox_number"));
    let config =
        SmsConfig::parse(&table(&format!("{base}inbox_number = \"+15551239999\""))).unwrap();
    assert!(config.resolve(&both).is_ok());
    let (token_only, _dir) = secrets(&[("TWILIO_AUTH_TOKEN", "t")]);
    let error = config.resolve(&token_only).unwrap_err().to_string();
    assert!(error.contains("twilio_account_sid"), "{error}");
}

/// The reference's `[gateway.sms]`: its keys read as ours.
#[test]
fn the_reference_keys_are_read_as_ours() {
    let reference = table(
        "webhook_enabled = true\nwebhook_port = 4045\nwebhook_bind = \"any\"\n\
         webhook_url = \"https://sms.example.test/hook\"\ninbox_number = \"+15551230000\"\n\
         inbox_ttl_ms = 60000\nvalidate_webhook = true\nauth_token = \"tok-inline\"\n",
    );
    let (config, unknown) = SmsConfig::parse_with_unknown_keys(&reference).unwrap();
    assert!(unknown.is_empty(), "{unknown:?}");
    assert!(SmsConfig::reference_notes(&reference).is_empty());
    assert_eq!(config.enabled, Some(true));
    assert_eq!(config.addr(), "0.0.0.0:4045");
    assert_eq!(config.webhook_url().as_deref(), Some("https://sms.example.test/hook"));
    assert_eq!(config.inbox_number.as_deref(), Some("+15551230000"));
    assert_eq!(config.inbox_ttl(), Duration::from_secs(60));
    assert!(!format!("{config:?}").contains("tok-inline"), "the inline token is never shown");
    assert!(
        SmsConfig::from_gateway(Some(&reference)).unwrap().is_some(),
        "webhook_enabled switches it on"
    );
    // The inline token counts when no secret is set, and the secret wins over it.
    let (none, _dir) = secrets(&[]);
    assert_eq!(config.resolve(&none).unwrap().auth_token.as_deref(), Some("tok-inline"));
    let (env, _dir) = secrets(&[("TWILIO_AUTH_TOKEN", "tok-env")]);
    assert_eq!(config.resolve(&env).unwrap().auth_token.as_deref(), Some("tok-env"));
}

#[test]
fn reference_values_are_read_as_the_reference_reads_them() {
    let check = |text: &str, addr: &str, enabled: Option<bool>| {
        let config = SmsConfig::parse(&table(text)).unwrap();
        assert_eq!(config.addr(), addr, "{text}");
        assert_eq!(config.enabled, enabled, "{text}");
    };
    check("webhook_port = \"4046\"", "127.0.0.1:4046", None);
    check("webhook_bind = \"localhost\"", "127.0.0.1:4041", None);
    check("webhook_bind = \"0.0.0.0\"", "0.0.0.0:4041", None);
    check("webhook_bind = \"10.0.0.7\"", "10.0.0.7:4041", None);
    check("webhook_bind = \"::1\"", "127.0.0.1:4041", None);
    check("webhook_enabled = 1", "127.0.0.1:4041", Some(true));
    check("webhook_enabled = \"yes\"", "127.0.0.1:4041", Some(true));
    check("webhook_enabled = \"nope\"", "127.0.0.1:4041", Some(false));
    // What the reference does silently is said here.
    let notes =
        SmsConfig::reference_notes(&table("webhook_bind = \"::1\"\nwebhook_enabled = \"nope\""));
    let messages: Vec<&str> = notes.iter().map(|n| n.message.as_str()).collect();
    assert_eq!(
        messages,
        [
            "\"nope\" is read as false, as the reference reads it (only 1, true, yes and on switch it on)",
            "\"::1\" is not an IPv4 address: the webhook listens on loopback (127.0.0.1), as the reference does",
        ]
    );
}

#[test]
fn where_ours_and_the_reference_name_are_both_written_ours_wins_with_a_note_naming_both() {
    let both = table(
        "port = 4050\nwebhook_port = 4045\nenabled = false\nwebhook_enabled = true\n\
         public_url = \"https://a.example\"\nwebhook_url = \"https://b.example/hook\"\n",
    );
    let config = SmsConfig::parse(&both).unwrap();
    assert_eq!(config.port, 4050);
    assert_eq!(config.enabled, Some(false));
    assert_eq!(config.webhook_url().as_deref(), Some("https://a.example/webhooks/twilio/sms"));
    let notes = SmsConfig::reference_notes(&both);
    let described: Vec<(String, &str)> =
        notes.iter().map(|n| (n.path.join("."), n.message.as_str())).collect();
    assert_eq!(
        described,
        [
            ("webhook_port".to_owned(), "both `port` and `webhook_port` (the reference's name for it) are set; `port` is used"),
            ("webhook_enabled".to_owned(), "both `enabled` and `webhook_enabled` (the reference's name for it) are set; `enabled` is used"),
            ("webhook_url".to_owned(), "both `public_url` and `webhook_url` (the reference's URL to sign) are set; `public_url` is used"),
        ]
    );
}

#[test]
fn errors_in_reference_keys_name_the_key_the_file_wrote() {
    let error = SmsConfig::parse(&table("webhook_port = \"abc\"")).unwrap_err().to_string();
    assert!(error.contains("`webhook_port`"), "{error}");
    let error = SmsConfig::parse(&table("webhook_url = \"ftp://x\"")).unwrap_err().to_string();
    assert!(error.contains("`webhook_url`"), "{error}");
}

#[test]
fn signatures_on_accept_the_reference_webhook_url_instead_of_public_url() {
    let config = SmsConfig::parse(&table(
        "enabled = true\nwebhook_url = \"https://sms.example.test/webhooks/twilio/sms\"",
    ))
    .unwrap();
    let (token, _dir) = secrets(&[("TWILIO_AUTH_TOKEN", "tok")]);
    assert!(config.resolve(&token).is_ok());
}
