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

fn values(text: &str) -> (EmailConfig, Vec<UnknownKey>, Vec<KeyNote>) {
    let table = text.parse::<toml::Table>().expect("toml");
    let (config, unknown) = EmailConfig::parse_values(&table).expect(text);
    (config, unknown, EmailConfig::reference_notes(&table))
}

/// The reference gateway's flat keys: an SMTP server and an inbound webhook.
#[test]
fn the_reference_flat_keys_make_the_smtp_server_and_the_inbound_webhook() {
    let (config, unknown, notes) = values(
        "enabled = false\ninbound_enabled = true\nwebhook_port = 4048\nwebhook_bind = \"any\"\n\
         webhook_path = \"/webhooks/email/inbound\"\nwebhook_token = \"hook-secret\"\n\
         reply_to = \"Lemon <lemon@example.test>\"\nfrom = \"Lemon <lemon@example.test>\"\n\
         relay = \"smtp.example.test\"\nsmtp_port = 465\nsmtp_username = \" lemon \"\n\
         smtp_password = \"smtp-secret\"\nsmtp_ssl = true\nsmtp_auth = \"always\"\n\
         smtp_hostname = \"lemon.example.test\"\n",
    );
    assert!(unknown.is_empty(), "{unknown:?}");
    assert!(notes.is_empty(), "{notes:?}");
    let smtp = config.smtp.as_ref().unwrap();
    assert_eq!(smtp.host, "smtp.example.test");
    assert_eq!(smtp.port(), 465);
    assert_eq!(smtp.security, SmtpSecurity::Tls);
    assert_eq!(smtp.username.as_deref(), Some("lemon"));
    assert_eq!(smtp.hostname.as_deref(), Some("lemon.example.test"));
    assert_eq!(smtp.reply_to.as_deref(), Some("Lemon <lemon@example.test>"));
    let hook = config.inbound_webhook.as_ref().unwrap();
    assert_eq!(hook.listen, "0.0.0.0:4048");
    assert_eq!(hook.path, "/webhooks/email/inbound");
    let shown = format!("{config:?}");
    assert!(!shown.contains("smtp-secret") && !shown.contains("hook-secret"), "{shown}");
    // The inline values count while no secret is named.
    let dir = tempfile::tempdir().unwrap();
    let secrets = SecretStore::new(Default::default(), dir.path().join("secrets.toml"));
    let read = config.resolve_secrets(&secrets).unwrap();
    assert_eq!(read.smtp_password.as_deref(), Some("smtp-secret"));
    assert_eq!(read.webhook_token.as_deref(), Some("hook-secret"));
}

#[test]
fn the_reference_nested_keys_win_over_its_flat_ones() {
    let (config, unknown, notes) = values(
        "smtp_relay = \"flat.example.test\"\n\
         [inbound]\nenabled = true\nbind = \"127.0.0.1\"\nport = 4050\npath = \"/in\"\ntoken = \"t\"\n\
         [outbound]\nfrom = \"lemon@example.test\"\nreply_to = \"r@example.test\"\n\
         relay = \"nested.example.test\"\nport = 587\nusername = \"u\"\npassword = \"p\"\n\
         tls = \"if_available\"\ntls_versions = [\"tlsv1.2\"]\nssl = false\nauth = \"never\"\n\
         hostname = \"h.example.test\"\n",
    );
    assert!(unknown.is_empty(), "{unknown:?}");
    assert_eq!(config.from, "lemon@example.test");
    let smtp = config.smtp.as_ref().unwrap();
    assert_eq!(smtp.host, "nested.example.test");
    assert_eq!(smtp.security, SmtpSecurity::Starttls);
    assert_eq!(smtp.username, None, "auth = never logs in with nothing");
    assert_eq!(smtp.reply_to.as_deref(), Some("r@example.test"));
    assert_eq!(config.inbound_webhook.as_ref().unwrap().listen, "127.0.0.1:4050");
    let described: Vec<(String, &str)> =
        notes.iter().map(|n| (n.path.join("."), n.message.as_str())).collect();
    assert_eq!(
        described,
        [
            ("smtp_relay".to_owned(), "both `outbound.relay` and `smtp_relay` are set; `outbound.relay` is used"),
            ("outbound.tls_versions".to_owned(), "accepted; TLS 1.2 or later is always used"),
            ("outbound.tls".to_owned(), "\"if_available\" is read as \"always\": STARTTLS is required here, never skipped"),
            ("inbound.enabled".to_owned(), "the inbound webhook is set up; the email channel itself is switched on by `enabled = true` in [gateway.email]"),
        ]
    );
}

#[test]
fn our_own_tables_win_over_the_reference_keys_with_a_note_naming_them() {
    let (config, unknown, notes) = values(&format!(
        "relay = \"other.example.test\"\nsmtp_port = 2525\n\
         webhook_enabled = true\nwebhook_port = 1\n{MINIMAL}\
         [inbound_webhook]\ntoken_secret = \"t\"\n"
    ));
    assert!(unknown.is_empty(), "{unknown:?}");
    assert_eq!(config.smtp.as_ref().unwrap().host, "smtp.example.com");
    assert_eq!(config.inbound_webhook.as_ref().unwrap().listen, "127.0.0.1:4049");
    let keys: Vec<String> = notes.iter().map(|n| n.path.join(".")).collect();
    assert_eq!(keys, ["relay", "smtp_port", "webhook_enabled", "webhook_port"]);
    assert!(notes[0].message.contains("`[gateway.email.smtp]` is used"), "{notes:?}");
    assert!(notes[2].message.contains("`[gateway.email.inbound_webhook]` is used"), "{notes:?}");
}

#[test]
fn reference_keys_without_their_switch_are_accepted_and_said_to_have_no_use() {
    let (config, unknown, notes) =
        values("webhook_port = 4048\nsmtp_port = 25\nreply_to = \"r@example.test\"\n");
    assert!(unknown.is_empty(), "{unknown:?}");
    assert!(config.smtp.is_none() && config.inbound_webhook.is_none());
    let keys: Vec<String> = notes.iter().map(|n| n.path.join(".")).collect();
    assert_eq!(keys, ["smtp_port", "reply_to", "webhook_port"]);
    assert!(notes.iter().all(|n| n.message.starts_with("accepted; ")), "{notes:?}");
}

#[test]
fn bad_reference_values_name_the_key_the_file_wrote() {
    for (text, key) in [
        ("relay = \"s.example.test\"\nsmtp_port = \"x\"", "`smtp_port`"),
        ("relay = \"s.example.test\"\nsmtp_tls = \"sometimes\"", "`smtp_tls`"),
        ("relay = \"s.example.test\"\n[outbound]\nauth = 3", "`outbound.auth`"),
        ("inbound_enabled = true\nwebhook_port = 70000", "`webhook_port`"),
        ("inbound_enabled = \"yes\"", "`inbound_enabled`"),
        ("relay = \"s.example.test\"\nreply_to = \"nobody\"", "`smtp.reply_to`"),
    ] {
        let table = text.parse::<toml::Table>().unwrap();
        let err = EmailConfig::parse_values(&table).expect_err(text).0;
        assert!(err.contains(key), "{text}: {err}");
    }
}
