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
