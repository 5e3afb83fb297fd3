use super::*;

fn parse(text: &str) -> Result<EmailConfig, EmailConfigError> {
    EmailConfig::parse(&text.parse::<toml::Table>().expect("toml"))
}

const MINIMAL: &str = "from = \"Agent <agent@example.com>\"\nauthserv_id = \"mx.example.com\"\n\
    [imap]\nhost = \"imap.example.com\"\nusername = \"agent@example.com\"\npassword_secret = \"p\"\n\
    [smtp]\nhost = \"smtp.example.com\"\n";

#[test]
fn defaults_are_the_common_providers_ports() {
    let config = parse(MINIMAL).expect("parses");
    let imap = config.imap.as_ref().unwrap();
    assert!(imap.tls && imap.idle);
    assert_eq!(imap.port(), 993);
    assert_eq!(imap.folder, "INBOX");
    let smtp = config.smtp.as_ref().unwrap();
    assert_eq!(smtp.security, SmtpSecurity::Starttls);
    assert_eq!(smtp.port(), 587);
    assert_eq!(config.answer_address().as_deref(), Some("agent@example.com"));
    assert!(config.allowed_senders.is_empty());
    assert!(!config.sender_listed("anyone@example.com"), "nobody by default");
}

#[test]
fn allowed_senders_are_addresses_or_domains() {
    let config =
        parse(&format!("allowed_senders = [\"Alice@Example.com\", \"@team.example\"]\n{MINIMAL}"))
            .unwrap();
    assert!(config.sender_listed("alice@example.com"));
    assert!(config.sender_listed("ALICE@example.COM"));
    assert!(config.sender_listed("bob@team.example"));
    assert!(!config.sender_listed("bob@sub.team.example"));
    assert!(!config.sender_listed("alice@example.com.evil.test"));
    assert!(!config.sender_listed("nobody"));
    let err = parse(&format!("allowed_senders = [\"not an address\"]\n{MINIMAL}")).unwrap_err();
    assert!(err.0.contains("`allowed_senders`"), "{err}");
}

#[test]
fn mistakes_name_their_key() {
    let check = |text: &str, key: &str| {
        let err = parse(text).expect_err(text);
        assert!(err.0.contains(key), "{key}: {err}");
    };
    check(
        "[smtp]\nhost = \"s\"\n[imap]\nhost=\"i\"\nusername=\"u\"\npassword_secret=\"p\"",
        "`from`",
    );
    check("from = \"a@b.cd\"\n[smtp]\nhost = \"s\"", "mail has no way in");
    check("from = \"a@b.cd\"\n[inbound_webhook]\ntoken_secret = \"t\"", "[gateway.email.smtp]");
    check(&format!("{MINIMAL}security = \"ssl\""), "security");
    check(&MINIMAL.replace("host = \"imap.example.com\"\n", ""), "`imap.host`: required");
    check(&MINIMAL.replace("host = \"imap.example.com\"", "host = \"i\"\nport = 99999"), "port");
    check(
        &format!("{MINIMAL}[inbound_webhook]\ntoken_secret = \"t\"\nlisten = \"x\""),
        "`inbound_webhook.listen`",
    );
    check(
        &format!("{MINIMAL}[inbound_webhook]\ntoken_secret = \"t\"\npath = \"in\""),
        "`inbound_webhook.path`",
    );
    check(
        &MINIMAL.replace(
            "[smtp]\nhost = \"smtp.example.com\"\n",
            "[smtp]\nhost = \"s\"\nusername = \"u\"\n",
        ),
        "`smtp.password_secret`",
    );
    check(&format!("agent_id = \"a:b\"\n{MINIMAL}"), "`agent_id`");
    check(
        &MINIMAL
            .replace("username = \"agent@example.com\"", "username = \"u\"\nfolder = \"a\\\"b\""),
        "`imap.folder`",
    );
}

#[test]
fn unknown_keys_are_warnings_with_a_suggestion() {
    let table = format!("alowed_senders = []\n{MINIMAL}").parse::<toml::Table>().unwrap();
    let (_, unknown) = EmailConfig::parse_values(&table).expect("still parses");
    assert_eq!(unknown.len(), 1);
    assert_eq!(unknown[0].suggestion.as_deref(), Some("allowed_senders"));
}

#[test]
fn secrets_are_read_by_name_and_never_shown() {
    let dir = tempfile::tempdir().unwrap();
    let env = [("P".to_owned(), "imap-secret-value".to_owned())].into();
    let secrets = SecretStore::new(env, dir.path().join("secrets.toml"));
    let config = parse(MINIMAL).unwrap();
    let read = config.resolve_secrets(&secrets).unwrap();
    assert_eq!(read.imap_password.as_deref(), Some("imap-secret-value"));
    assert!(!format!("{read:?}").contains("imap-secret-value"));
    let missing = parse(&MINIMAL.replace("password_secret = \"p\"", "password_secret = \"other\""))
        .unwrap()
        .resolve_secrets(&secrets)
        .unwrap_err();
    assert!(missing.0.contains("imap.password_secret") && missing.0.contains("other"), "{missing}");
}

#[test]
fn sender_authentication_is_required_by_default_and_needs_an_authserv_id() {
    let config = parse(MINIMAL).unwrap();
    assert!(config.require_authenticated, "on by default");
    assert!(!config.allow_everyone);
    assert_eq!(config.authserv_id.as_deref(), Some("mx.example.com"));
    let without = MINIMAL.replace("authserv_id = \"mx.example.com\"\n", "");
    let err = parse(&without).expect_err("no authserv_id").0;
    assert!(err.starts_with("`authserv_id`: required"), "{err}");
    assert!(err.contains("require_authenticated = false"), "says the way out: {err}");
    let opted_out = parse(&format!("require_authenticated = false\n{without}")).unwrap();
    assert!(!opted_out.require_authenticated && opted_out.authserv_id.is_none());
    // A section switched off is not held to it.
    let table = without.parse::<toml::Table>().unwrap();
    assert!(EmailConfig::parse_values(&table).is_ok());
    let err = parse(&MINIMAL.replace("\"mx.example.com\"", "\"mx.example.com; dkim=pass\""));
    assert!(err.expect_err("not one word").0.contains("`authserv_id`"));
}

#[test]
fn one_address_is_a_sender_and_a_list_is_none() {
    assert_eq!(parse_address("Alice <Alice@Example.com>").as_deref(), Some("alice@example.com"));
    assert_eq!(parse_address("\"Doe, Jo\" <jo@example.com>").as_deref(), Some("jo@example.com"));
    assert_eq!(parse_address("a@b.cd"), Some("a@b.cd".to_owned()));
    assert_eq!(parse_address("Mallory <m@evil.test>, Alice <alice@example.com>"), None);
    assert_eq!(parse_address("Alice <alice@example.com> m@evil.test"), None);
    assert_eq!(parse_address("a@b.cd, c@d.ef"), None);
}
