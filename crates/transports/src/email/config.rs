//! `[gateway.email]`: the raw TOML section parsed into typed settings.
//!
//! ```toml
//! [gateway.email]
//! enabled = true
//! from = "Lemon <agent@example.com>"
//! allowed_senders = ["alice@example.com", "@example.org"]
//! authserv_id = "mx.example.com"   # whose Authentication-Results are believed
//!
//! [gateway.email.imap]
//! host = "imap.example.com"        # port 993, TLS
//! username = "agent@example.com"
//! password_secret = "email_password"
//!
//! [gateway.email.smtp]
//! host = "smtp.example.com"        # port 587, STARTTLS
//! username = "agent@example.com"
//! password_secret = "email_password"
//!
//! [gateway.email.inbound_webhook]   # optional: mail relayed as JSON
//! token_secret = "email_webhook_token"
//! ```
//!
//! A section written for the reference gateway is read as it is
//! ([`translate`]): its SMTP keys (`relay`/`smtp_relay`, `smtp_port`,
//! `smtp_username`, `smtp_password`, `smtp_tls`, `smtp_ssl`, `smtp_auth`,
//! `smtp_hostname`, or the same in `[gateway.email.outbound]`) make
//! `[gateway.email.smtp]`, its inbound webhook keys (`inbound_enabled`,
//! `webhook_*`, or `[gateway.email.inbound]`) make
//! `[gateway.email.inbound_webhook]`, and `reply_to` is the answers'
//! `Reply-To`. Where our own table is written it is used, and a warning
//! names the reference key that lost.

use std::time::Duration;

use lemon_core::config::{
    field_names, parse_table, reference_bind, KeyNote, QueueMode, Translation, UnknownKey,
};
use lemon_core::ids::EngineRef;
use lemon_core::secrets::{SecretStore, SecretValue};
use serde::{Deserialize, Deserializer};

/// `[gateway.email]`: an agent's mailbox. Mail comes in over IMAP (or a
/// relay's webhook), each thread is a conversation, and answers go out over
/// SMTP in the thread; only the senders listed may start runs. A section
/// written for the reference layout (its `smtp_*` and `webhook_*` keys, or
/// `[gateway.email.outbound]` and `[gateway.email.inbound]`) is read as
/// `[gateway.email.smtp]` and `[gateway.email.inbound_webhook]`.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[schemars(transform = reference_keys_schema)]
pub struct EmailConfig {
    /// Switches the channel on (off unless set).
    #[serde(default)]
    pub enabled: Option<bool>,
    /// The address answers come from (`Name <addr>` or a bare address).
    #[serde(default)]
    pub from: String,
    /// Who may start runs: full addresses, or `@domain` for a whole domain.
    /// Empty lets nobody in (mail to an agent is open to the world otherwise).
    #[serde(default)]
    pub allowed_senders: Vec<String>,
    /// Every sender may start runs, whatever `allowed_senders` says. Warned
    /// about at every start and shown in status.
    #[serde(default)]
    pub allow_everyone: bool,
    /// Mail gets a run only when `authserv_id`'s `Authentication-Results`
    /// show a passing DMARC, DKIM or SPF check for a domain aligned with the
    /// `From` domain (on by default: a `From` alone is easy to forge). A
    /// failing check refuses the mail either way.
    #[serde(default = "defaults::yes")]
    pub require_authenticated: bool,
    /// The authserv-id of the server that receives the mail (the first word
    /// of the `Authentication-Results` header it adds, e.g. `mx.google.com`):
    /// only its headers are believed; unset, none is. Required while
    /// `require_authenticated` is on.
    #[serde(default)]
    pub authserv_id: Option<String>,
    /// Whether mail is outside text (on by default: a sender's words are not
    /// the owner's, and a forwarded mail carries a stranger's): its runs are
    /// marked untrusted, judged by `[gateway.approvals] untrusted`, and give
    /// the model the mail in a data block.
    #[serde(default = "defaults::yes")]
    pub untrusted: bool,
    /// The agent part of session keys: letters, digits, `-` and `_`.
    #[serde(default = "defaults::agent_id")]
    #[schemars(pattern(r"^[A-Za-z0-9_-]+$"))]
    pub agent_id: String,
    /// The threads' queue mode unless a binding sets one.
    #[serde(default)]
    pub queue_mode: Option<QueueMode>,
    /// The engine unless a binding, a directive or `/engine` picks one.
    #[serde(default)]
    pub engine: Option<EngineRef>,
    /// Largest attachment kept for the run, in bytes (the older key; the
    /// smaller of it and `files.max_download_bytes` applies); larger ones are
    /// listed in the prompt but not saved.
    #[serde(default = "defaults::max_attachment_bytes")]
    pub max_attachment_bytes: u64,
    /// `[gateway.email.files]`: attachments (who may send them, how large,
    /// which names are refused, where they are saved).
    #[serde(default)]
    pub files: lemon_core::media::FilesConfig,
    /// Attempts of one answer over SMTP before it is recorded as undelivered.
    #[serde(default = "defaults::delivery_attempts")]
    #[schemars(range(min = 1))]
    pub delivery_attempts: u32,
    #[serde(default)]
    pub imap: Option<ImapConfig>,
    #[serde(default)]
    pub smtp: Option<SmtpConfig>,
    #[serde(default)]
    pub inbound_webhook: Option<InboundWebhookConfig>,
}

/// `[gateway.email.imap]`: where mail comes in.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
pub struct ImapConfig {
    /// The IMAP server (`imap.gmail.com`); required.
    #[serde(default)]
    #[schemars(length(min = 1))]
    pub host: String,
    /// Default 993 with TLS, 143 without.
    #[serde(default)]
    pub port: Option<u16>,
    /// TLS from the first byte (IMAPS). `false` speaks plain IMAP, for a
    /// server on this machine only.
    #[serde(default = "defaults::yes")]
    pub tls: bool,
    /// The mailbox's user name; required.
    #[serde(default)]
    #[schemars(length(min = 1))]
    pub username: String,
    /// The name of the secret holding the password (an app password),
    /// never the password itself; required.
    #[serde(default)]
    #[schemars(length(min = 1))]
    pub password_secret: String,
    /// The folder watched.
    #[serde(default = "defaults::folder")]
    pub folder: String,
    /// Wait for news with IDLE; `false` (or a server without IDLE) checks
    /// every `poll_interval_s`.
    #[serde(default = "defaults::yes")]
    pub idle: bool,
    /// Seconds between two checks for new mail without IDLE.
    #[serde(default = "defaults::poll_interval_s")]
    #[schemars(range(min = 1, max = 3600))]
    pub poll_interval_s: u64,
    /// How long one IDLE lasts before it is renewed, in seconds (servers
    /// drop it after 30 minutes).
    #[serde(default = "defaults::idle_renew_s")]
    #[schemars(range(min = 1, max = 1740))]
    pub idle_renew_s: u64,
    /// A PEM file of certificates trusted besides the Mozilla roots (a
    /// server with its own CA or a self-signed certificate).
    #[serde(default)]
    pub tls_ca_file: Option<std::path::PathBuf>,
}

/// An inline secret: kept out of `Debug`; blank is unset.
fn inline_secret<'de, D: Deserializer<'de>>(d: D) -> Result<Option<SecretValue>, D::Error> {
    Ok(Option::<String>::deserialize(d)?
        .filter(|value| !value.trim().is_empty())
        .map(|value| SecretValue::new(value.trim())))
}

/// How an SMTP connection is secured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum SmtpSecurity {
    /// Plain, then upgraded with STARTTLS (required); port 587.
    Starttls,
    /// TLS from the first byte; port 465.
    Tls,
    /// No TLS at all, for a relay on this machine only; port 25.
    None,
}

/// `[gateway.email.smtp]`: where answers go out.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
pub struct SmtpConfig {
    /// The SMTP server (`smtp.gmail.com`); required.
    #[serde(default)]
    #[schemars(length(min = 1))]
    pub host: String,
    /// Unset: 587 (STARTTLS), 465 (TLS) or 25 (none).
    #[serde(default)]
    pub port: Option<u16>,
    /// How the connection is secured.
    #[serde(default = "defaults::security")]
    #[schemars(extend("default" = "starttls"))]
    pub security: SmtpSecurity,
    /// The user name to log in with. Unset: no authentication.
    #[serde(default)]
    pub username: Option<String>,
    /// The name of the secret holding the password; set with `username`.
    #[serde(default)]
    pub password_secret: Option<String>,
    /// The reference's inline password (`smtp_password`,
    /// `outbound.password`), used when `password_secret` names no secret
    /// that is set. Never logged.
    #[serde(default, deserialize_with = "inline_secret")]
    #[schemars(with = "Option<String>")]
    pub password: Option<SecretValue>,
    /// A PEM file of certificates trusted besides the Mozilla roots.
    #[serde(default)]
    pub tls_ca_file: Option<std::path::PathBuf>,
    /// The name the gateway gives itself in `EHLO` (the reference's
    /// `smtp_hostname`); unset: lettre's default.
    #[serde(default)]
    pub hostname: Option<String>,
    /// The `Reply-To` of answers (the reference's `reply_to`); unset: none,
    /// replies go to `from`.
    #[serde(default)]
    pub reply_to: Option<String>,
}

/// The certificates of a PEM file, as DER.
///
/// # Errors
/// The file cannot be read or holds no certificate.
pub fn read_ca_file(path: &std::path::Path) -> Result<Vec<Vec<u8>>, String> {
    use tokio_rustls::rustls::pki_types::pem::PemObject;
    use tokio_rustls::rustls::pki_types::CertificateDer;
    let text = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let certs: Vec<Vec<u8>> = CertificateDer::pem_slice_iter(&text)
        .filter_map(Result::ok)
        .map(|cert| cert.as_ref().to_vec())
        .collect();
    if certs.is_empty() {
        return Err(format!("{} holds no PEM certificate", path.display()));
    }
    Ok(certs)
}

/// [`read_ca_file`]'s PEM blocks, each as its own PEM text (for lettre).
pub(super) fn ca_pems(path: &std::path::Path) -> Result<Vec<Vec<u8>>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let end = "-----END CERTIFICATE-----";
    let pems: Vec<Vec<u8>> = text
        .split_inclusive(end)
        .filter(|block| block.contains("-----BEGIN CERTIFICATE-----"))
        .map(|block| block.trim().as_bytes().to_vec())
        .collect();
    if pems.is_empty() {
        return Err(format!("{} holds no PEM certificate", path.display()));
    }
    Ok(pems)
}

/// `[gateway.email.inbound_webhook]`: `POST <path>` with a JSON mail, for relay
/// services that push mail instead of an IMAP mailbox.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
pub struct InboundWebhookConfig {
    /// `address:port`; port 0 picks a free one.
    #[serde(default = "defaults::listen")]
    pub listen: String,
    /// The path relays post to: a plain path starting with `/`.
    #[serde(default = "defaults::path")]
    #[schemars(pattern(r"^/[^{}*?#]*$"))]
    pub path: String,
    /// The name of the secret holding the token callers send as
    /// `Authorization: Bearer <token>` (or `X-Lemon-Email-Token`).
    #[serde(default)]
    pub token_secret: Option<String>,
    /// The reference's inline token (`webhook_token`, `inbound.token`),
    /// used when `token_secret` is not set. Never logged.
    #[serde(default, deserialize_with = "inline_secret")]
    #[schemars(with = "Option<String>")]
    pub token: Option<SecretValue>,
}

mod defaults {
    pub(super) fn agent_id() -> String {
        "default".to_owned()
    }
    pub(super) fn max_attachment_bytes() -> u64 {
        25 * 1024 * 1024
    }
    pub(super) fn delivery_attempts() -> u32 {
        8
    }
    pub(super) fn yes() -> bool {
        true
    }
    pub(super) fn folder() -> String {
        "INBOX".to_owned()
    }
    pub(super) fn poll_interval_s() -> u64 {
        60
    }
    pub(super) fn idle_renew_s() -> u64 {
        25 * 60
    }
    pub(super) fn security() -> super::SmtpSecurity {
        super::SmtpSecurity::Starttls
    }
    pub(super) fn listen() -> String {
        "127.0.0.1:4049".to_owned()
    }
    pub(super) fn path() -> String {
        "/email/inbound".to_owned()
    }
}

/// A `[gateway.email]` that cannot be used; the message names the key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid [gateway.email]: {0}")]
pub struct EmailConfigError(pub String);

/// The passwords and token the section names, read from the secrets.
#[derive(Clone, Default)]
pub struct EmailSecrets {
    pub imap_password: Option<String>,
    pub smtp_password: Option<String>,
    pub webhook_token: Option<String>,
}

impl std::fmt::Debug for EmailSecrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let shown = |v: &Option<String>| v.as_ref().map(|_| "<redacted>");
        f.debug_struct("EmailSecrets")
            .field("imap_password", &shown(&self.imap_password))
            .field("smtp_password", &shown(&self.smtp_password))
            .field("webhook_token", &shown(&self.webhook_token))
            .finish()
    }
}

impl EmailConfig {
    /// Parses the raw section and checks what an enabled transport needs.
    ///
    /// # Errors
    /// A wrong type or value, no `from`, no way in, no SMTP server.
    pub fn parse(table: &toml::Table) -> Result<Self, EmailConfigError> {
        let (config, _) = EmailConfig::parse_values(table)?;
        if config.answer_address().is_none() {
            return Err(EmailConfigError(
                "`from`: set the address answers come from, e.g. \"Agent <agent@example.com>\""
                    .into(),
            ));
        }
        if config.imap.is_none() && config.inbound_webhook.is_none() {
            return Err(EmailConfigError(
                "set [gateway.email.imap] or [gateway.email.inbound_webhook]: mail has no way in"
                    .into(),
            ));
        }
        if config.smtp.is_none() {
            return Err(EmailConfigError(
                "set [gateway.email.smtp]: answers need an SMTP server".into(),
            ));
        }
        if config.require_authenticated && config.authserv_id.is_none() {
            return Err(EmailConfigError(
                "`authserv_id`: required while `require_authenticated` is on (the default): set \
                 authserv_id to your mail server's authserv-id (the first word of the \
                 Authentication-Results header it adds, e.g. \"mx.google.com\"), or set \
                 require_authenticated = false to let mail in on its From address alone"
                    .into(),
            ));
        }
        Ok(config)
    }

    /// Parses the raw section's types and values (a section switched off is
    /// checked this far), with the keys it does not know.
    ///
    /// # Errors
    /// A wrong type or value.
    pub fn parse_values(table: &toml::Table) -> Result<(Self, Vec<UnknownKey>), EmailConfigError> {
        let translated = translate(table)?;
        let (config, ignored) = parse_table::<EmailConfig>(&translated.table)
            .map_err(|err| EmailConfigError(translated.in_file(err).to_string()))?;
        let unknown = ignored
            .into_iter()
            .map(|path| {
                let known = match path.first().map(String::as_str) {
                    Some("smtp") if path.len() > 1 => field_names::<SmtpConfig>(),
                    Some("imap") if path.len() > 1 => field_names::<ImapConfig>(),
                    Some("inbound_webhook") if path.len() > 1 => {
                        field_names::<InboundWebhookConfig>()
                    }
                    Some("files") if path.len() > 1 => {
                        field_names::<lemon_core::media::FilesConfig>()
                    }
                    _ => field_names::<EmailConfig>(),
                };
                UnknownKey::new(translated.file_path(&path), known.iter().copied())
            })
            .collect();
        config.check()?;
        Ok((config, unknown))
    }

    /// What the section's reference keys do where that is worth saying: one
    /// that lost to our own table, one without a use.
    pub fn reference_notes(table: &toml::Table) -> Vec<KeyNote> {
        translate(table).map(|t| t.notes).unwrap_or_default()
    }

    fn check(&self) -> Result<(), EmailConfigError> {
        let err = |message: String| Err(EmailConfigError(message));
        if let Some(problem) = self.files.check().into_iter().next() {
            return err(format!("files.{problem}"));
        }
        if !self.from.trim().is_empty() && self.answer_address().is_none() {
            return err(format!("`from`: {:?} is not an email address", self.from));
        }
        if let Some(id) = &self.authserv_id {
            let id = id.trim();
            if id.is_empty() || id.contains(|c: char| c.is_whitespace() || c == ';') {
                return err(format!(
                    "`authserv_id`: {id:?} is not an authserv-id (one word, e.g. \"mx.google.com\")"
                ));
            }
        }
        for sender in &self.allowed_senders {
            if normalize_sender_rule(sender).is_none() {
                return err(format!(
                    "`allowed_senders`: {sender:?} is neither an address nor `@domain`"
                ));
            }
        }
        let agent = self.agent_id.trim();
        if agent.is_empty()
            || !agent.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        {
            return err(format!("`agent_id`: {agent:?} must be letters, digits, '-' or '_'"));
        }
        if self.delivery_attempts == 0 {
            return err("`delivery_attempts`: at least 1".into());
        }
        if let Some(imap) = &self.imap {
            for (key, value) in [
                ("imap.host", &imap.host),
                ("imap.username", &imap.username),
                ("imap.password_secret", &imap.password_secret),
            ] {
                if value.trim().is_empty() {
                    return err(format!("`{key}`: required"));
                }
            }
            if imap.folder.trim().is_empty() || imap.folder.contains(['"', '\r', '\n', '\\']) {
                return err(format!("`imap.folder`: {:?} is not a folder name", imap.folder));
            }
            if imap.poll_interval_s == 0 || imap.poll_interval_s > 3600 {
                return err("`imap.poll_interval_s`: between 1 and 3600".into());
            }
            if imap.idle_renew_s == 0 || imap.idle_renew_s > 29 * 60 {
                return err("`imap.idle_renew_s`: between 1 and 1740 (29 minutes)".into());
            }
            if let Some(path) = &imap.tls_ca_file {
                if let Err(why) = read_ca_file(path) {
                    return err(format!("`imap.tls_ca_file`: {why}"));
                }
            }
        }
        if let Some(smtp) = &self.smtp {
            if smtp.host.trim().is_empty() {
                return err("`smtp.host`: required".into());
            }
            let password = smtp.password_secret.is_some() || smtp.password.is_some();
            if smtp.username.is_some() != password {
                return err(
                    "`smtp.password_secret`: set both username and password_secret, or neither"
                        .into(),
                );
            }
            if let Some(reply_to) = &smtp.reply_to {
                if parse_address(reply_to).is_none() {
                    return err(format!("`smtp.reply_to`: {reply_to:?} is not an email address"));
                }
            }
            if let Some(name) = &smtp.hostname {
                if !is_domain(name.trim()) {
                    return err(format!("`smtp.hostname`: {name:?} is not a host name"));
                }
            }
            if let Some(path) = &smtp.tls_ca_file {
                if let Err(why) = ca_pems(path) {
                    return err(format!("`smtp.tls_ca_file`: {why}"));
                }
            }
        }
        if let Some(hook) = &self.inbound_webhook {
            if hook.token.is_none()
                && hook.token_secret.as_deref().is_none_or(|s| s.trim().is_empty())
            {
                return err("`inbound_webhook.token_secret`: required".into());
            }
            if hook.listen.parse::<std::net::SocketAddr>().is_err() {
                return err(format!(
                    "`inbound_webhook.listen`: {:?} is not address:port",
                    hook.listen
                ));
            }
            if !hook.path.starts_with('/') || hook.path.contains(['{', '}', '*', '?', '#']) {
                return err(format!(
                    "`inbound_webhook.path`: {:?} must be a plain path starting with '/'",
                    hook.path
                ));
            }
        }
        Ok(())
    }

    /// The bare address of `from`, lowercased.
    pub fn answer_address(&self) -> Option<String> {
        parse_address(&self.from)
    }

    /// Whether `address` (bare, any case) is in `allowed_senders` (an empty
    /// list has nobody; `allow_everyone` is checked by the caller).
    pub fn sender_listed(&self, address: &str) -> bool {
        let address = address.trim().to_ascii_lowercase();
        let Some((_, domain)) = address.rsplit_once('@') else { return false };
        self.allowed_senders.iter().filter_map(|rule| normalize_sender_rule(rule)).any(|rule| {
            match rule.strip_prefix('@') {
                Some(allowed_domain) => domain == allowed_domain,
                None => address == rule,
            }
        })
    }

    /// Reads the secrets the section names.
    ///
    /// # Errors
    /// Which key names a secret that is not set or cannot be read; never a value.
    pub fn resolve_secrets(&self, secrets: &SecretStore) -> Result<EmailSecrets, EmailConfigError> {
        let read = |key: &str, name: &str| {
            lemon_core::transport::inline_or_secret(key, None, Some(name), secrets)
                .map_err(|message| {
                    EmailConfigError(format!("`{}", message.replacen(": ", "`: ", 1)))
                })
                .map(Some)
        };
        // The secret when one is named and set, else the reference's inline
        // value, else the error naming the secret.
        let secret_or_inline = |key: &str, name: Option<&str>, inline: Option<&SecretValue>| {
            if let (Some(name), Some(inline)) = (name, inline) {
                if matches!(secrets.get(name), Ok(None)) {
                    return Ok(Some(inline.expose().to_owned()));
                }
            }
            match (name, inline) {
                (Some(name), _) => read(key, name),
                (None, inline) => Ok(inline.map(|v| v.expose().to_owned())),
            }
        };
        Ok(EmailSecrets {
            imap_password: match &self.imap {
                Some(imap) => read("imap.password", &imap.password_secret)?,
                None => None,
            },
            smtp_password: match &self.smtp {
                Some(smtp) => secret_or_inline(
                    "smtp.password",
                    smtp.password_secret.as_deref(),
                    smtp.password.as_ref(),
                )?,
                None => None,
            },
            webhook_token: match &self.inbound_webhook {
                Some(hook) => secret_or_inline(
                    "inbound_webhook.token",
                    hook.token_secret.as_deref(),
                    hook.token.as_ref(),
                )?,
                None => None,
            },
        })
    }
}

impl ImapConfig {
    pub fn port(&self) -> u16 {
        self.port.unwrap_or(if self.tls { 993 } else { 143 })
    }

    pub fn poll_interval(&self) -> Duration {
        Duration::from_secs(self.poll_interval_s)
    }

    pub fn idle_renew(&self) -> Duration {
        Duration::from_secs(self.idle_renew_s)
    }
}

impl SmtpConfig {
    pub fn port(&self) -> u16 {
        self.port.unwrap_or(match self.security {
            SmtpSecurity::Starttls => 587,
            SmtpSecurity::Tls => 465,
            SmtpSecurity::None => 25,
        })
    }
}

/// The reference's flat SMTP keys and their place in `[gateway.email.outbound]`.
const REFERENCE_SMTP: [(&str, &str); 8] = [
    ("smtp_relay", "relay"),
    ("smtp_port", "port"),
    ("smtp_username", "username"),
    ("smtp_password", "password"),
    ("smtp_tls", "tls"),
    ("smtp_ssl", "ssl"),
    ("smtp_auth", "auth"),
    ("smtp_hostname", "hostname"),
];

/// The reference's flat inbound webhook keys and their place in
/// `[gateway.email.inbound]`.
const REFERENCE_INBOUND: [(&str, &str); 5] = [
    ("inbound_enabled", "enabled"),
    ("webhook_bind", "bind"),
    ("webhook_port", "port"),
    ("webhook_path", "path"),
    ("webhook_token", "token"),
];

/// Default listen port of the inbound mail webhook.
const DEFAULT_INBOUND_PORT: u16 = 4049;

/// The reference layout's keys of the section (flat, and in its
/// `[gateway.email.outbound]` and `[gateway.email.inbound]` tables), as
/// [`translate`] reads them, in the section's schema.
fn reference_keys_schema(schema: &mut schemars::Schema) {
    use lemon_core::config::schema::add_reference_property;
    use schemars::json_schema;
    let kind = |nested: &str| match nested {
        "port" => json_schema!({ "type": ["integer", "string"] }),
        "tls" => json_schema!({ "enum": [true, false, "always", "if_available", "never"] }),
        "ssl" | "enabled" => json_schema!({ "type": "boolean" }),
        "auth" => json_schema!({ "enum": ["always", "if_available", "never"] }),
        "tls_versions" => json_schema!({ "type": "array", "items": { "type": "string" } }),
        _ => json_schema!({ "type": "string" }),
    };
    let described = |mut schema: schemars::Schema, text: String| {
        schema.insert("description".to_owned(), text.into());
        schema
    };
    let smtp = "`[gateway.email.smtp]`, when a relay is named";
    let inbound =
        "`[gateway.email.inbound_webhook]`, when `inbound_enabled` or `webhook_enabled` is true";
    let mut outbound_table = json_schema!({ "type": "object", "properties": {} });
    let mut inbound_table = json_schema!({ "type": "object", "properties": {} });
    for (flat, nested) in REFERENCE_SMTP {
        let text = format!("The reference layout's SMTP `{nested}`, read into {smtp}.");
        add_reference_property(schema, flat, described(kind(nested), text.clone()));
        add_reference_property(&mut outbound_table, nested, described(kind(nested), text));
    }
    add_reference_property(
        schema,
        "relay",
        described(kind("relay"), format!("The reference layout's SMTP relay, read into {smtp}.")),
    );
    for nested in ["from", "reply_to", "tls_versions"] {
        let text = match nested {
            "from" => "The reference layout's `from`, read as `from`.".to_owned(),
            "reply_to" => "The reference layout's `Reply-To` of answers, read as `[gateway.email.smtp] reply_to`.".to_owned(),
            _ => "Accepted from the reference layout; TLS 1.2 or later is always used.".to_owned(),
        };
        add_reference_property(&mut outbound_table, nested, described(kind(nested), text));
    }
    add_reference_property(
        schema,
        "reply_to",
        described(kind("reply_to"), "The reference layout's `Reply-To` of answers, read as `[gateway.email.smtp] reply_to`.".to_owned()),
    );
    for (flat, nested) in REFERENCE_INBOUND {
        let text =
            format!("The reference layout's inbound webhook `{nested}`, read into {inbound}.");
        add_reference_property(schema, flat, described(kind(nested), text.clone()));
        add_reference_property(&mut inbound_table, nested, described(kind(nested), text));
    }
    add_reference_property(
        schema,
        "webhook_enabled",
        described(
            kind("enabled"),
            format!("The reference layout's switch of the inbound webhook, read into {inbound}."),
        ),
    );
    let table = |mut table: schemars::Schema, text: &str| {
        table.insert("description".to_owned(), text.into());
        table
    };
    add_reference_property(
        schema,
        "outbound",
        table(outbound_table, "The reference layout's outbound mail settings, read into `[gateway.email.smtp]` (its `from` as `from`)."),
    );
    add_reference_property(
        schema,
        "inbound",
        table(
            inbound_table,
            "The reference layout's inbound webhook, read into `[gateway.email.inbound_webhook]`.",
        ),
    );
}

/// `table` with the reference gateway's email keys read as ours:
///
/// - SMTP: `[gateway.email.outbound]` keys, else the flat ones (`relay` or
///   `smtp_relay`, `smtp_port`…), make `[gateway.email.smtp]` when a relay is
///   named. `ssl = true` is TLS from the first byte; `tls` true, `"always"` or
///   `"if_available"` is STARTTLS (required here), false or `"never"` no TLS;
///   `auth = "never"` logs in with nothing. `tls_versions` is accepted: TLS
///   1.2 or later is always used.
/// - Inbound: `[gateway.email.inbound]` keys, else `inbound_enabled`,
///   `webhook_enabled`, `webhook_bind`, `webhook_port`, `webhook_path` and
///   `webhook_token`, make `[gateway.email.inbound_webhook]` when enabled.
/// - `outbound.from` is `from`; `reply_to` (or `outbound.reply_to`) is the
///   answers' `Reply-To`.
///
/// Our own `[gateway.email.smtp]` and `[gateway.email.inbound_webhook]` win
/// over the reference's keys, with a note naming them.
///
/// # Errors
/// A reference value of the wrong kind (a port that is not a number…),
/// naming the key as the file writes it.
pub fn translate(table: &toml::Table) -> Result<Translation, EmailConfigError> {
    let mut out = Translation::new(table, &[]);
    let outbound_value = |out: &mut Translation, nested: &str, flat: Option<&str>| {
        if let Some(value) = out.take(&["outbound", nested]) {
            if let Some(flat) = flat {
                if out.take(&[flat]).is_some() {
                    out.notes.push(KeyNote::new(
                        &[flat],
                        format!("both `outbound.{nested}` and `{flat}` are set; `outbound.{nested}` is used"),
                    ));
                }
            }
            return Some((value, vec!["outbound".to_owned(), nested.to_owned()]));
        }
        flat.and_then(|flat| out.take(&[flat]).map(|value| (value, vec![flat.to_owned()])))
    };
    let bad =
        |path: &[String], what: &str| EmailConfigError(format!("`{}`: {what}", path.join(".")));

    // `from` and `reply_to`.
    if out.get(&["outbound", "from"]).is_some() {
        out.alias(&["outbound", "from"], &["from"]);
    }
    let reply_to = outbound_value(&mut out, "reply_to", Some("reply_to"));

    // SMTP.
    let mut smtp: Vec<(&str, toml::Value, Vec<String>)> = Vec::new();
    let relay = match outbound_value(&mut out, "relay", Some("relay")) {
        Some(found) => {
            if out.take(&["smtp_relay"]).is_some() {
                out.notes.push(KeyNote::new(
                    &["smtp_relay"],
                    format!(
                        "both `{}` and `smtp_relay` are set; `{}` is used",
                        found.1.join("."),
                        found.1.join(".")
                    ),
                ));
            }
            Some(found)
        }
        None => outbound_value(&mut out, "relay", Some("smtp_relay")),
    };
    let mut fields: Vec<(&str, toml::Value, Vec<String>)> = Vec::new();
    for (flat, nested) in REFERENCE_SMTP.iter().skip(1) {
        if let Some((value, path)) = outbound_value(&mut out, nested, Some(flat)) {
            fields.push((nested, value, path));
        }
    }
    if let Some((value, path)) = outbound_value(&mut out, "tls_versions", None) {
        out.notes.push(KeyNote {
            path,
            message: "accepted; TLS 1.2 or later is always used".to_owned(),
        });
        drop(value);
    }
    let ours = out.get(&["smtp"]).is_some();
    let lost = |out: &mut Translation, path: Vec<String>, ours_name: &str| {
        out.notes.push(KeyNote {
            message: format!(
                "both `[gateway.email.{ours_name}]` and `{}` (the reference's) are set; `[gateway.email.{ours_name}]` is used",
                path.join(".")
            ),
            path,
        });
    };
    match relay {
        Some((_, path)) if ours => lost(&mut out, path, "smtp"),
        Some((value, path)) => {
            let host = value.as_str().map(str::trim).filter(|h| !h.is_empty());
            let host = host.ok_or_else(|| bad(&path, "must be a host name"))?;
            smtp.push(("host", host.into(), path));
            let (mut ssl, mut tls, mut auth) = (None, None, None);
            for (name, value, path) in fields.drain(..) {
                match name {
                    "ssl" => ssl = Some((value, path)),
                    "tls" => tls = Some((value, path)),
                    "auth" => auth = Some((value, path)),
                    "port" => {
                        let port = match &value {
                            toml::Value::String(raw) => {
                                raw.trim().parse::<i64>().ok().map(toml::Value::from)
                            }
                            _ => Some(value),
                        };
                        let port = port.ok_or_else(|| bad(&path, "must be a port number"))?;
                        smtp.push(("port", port, path));
                    }
                    "username" => {
                        let user = value.as_str().map(|u| u.trim().to_owned());
                        let user = user.ok_or_else(|| bad(&path, "must be a user name"))?;
                        smtp.push(("username", user.into(), path));
                    }
                    other => smtp.push((other, value, path)),
                }
            }
            let ssl_on = match &ssl {
                Some((toml::Value::Boolean(on), _)) => *on,
                Some((_, path)) => return Err(bad(path, "must be true or false")),
                None => false,
            };
            let security = if ssl_on {
                Some(("tls", ssl.map(|(_, path)| path).unwrap_or_default()))
            } else {
                match tls {
                    None => None,
                    Some((value, path)) => {
                        let word = match &value {
                            toml::Value::Boolean(true) => "always".to_owned(),
                            toml::Value::Boolean(false) => "never".to_owned(),
                            toml::Value::String(word) => word.trim().to_ascii_lowercase(),
                            _ => String::new(),
                        };
                        match word.as_str() {
                            "always" => Some(("starttls", path)),
                            "if_available" => {
                                out.notes.push(KeyNote {
                                    path: path.clone(),
                                    message: "\"if_available\" is read as \"always\": STARTTLS is required here, never skipped".to_owned(),
                                });
                                Some(("starttls", path))
                            }
                            "never" => Some(("none", path)),
                            _ => return Err(bad(
                                &path,
                                "must be true, false, \"always\", \"if_available\" or \"never\"",
                            )),
                        }
                    }
                }
            };
            if let Some((security, path)) = security {
                smtp.push(("security", security.into(), path));
            }
            if let Some((value, path)) = auth {
                match value.as_str().map(|w| w.trim().to_ascii_lowercase()).as_deref() {
                    Some("always" | "if_available") => {}
                    Some("never") => {
                        smtp.retain(|(name, _, _)| !matches!(*name, "username" | "password"));
                    }
                    _ => {
                        return Err(bad(&path, "must be \"always\", \"if_available\" or \"never\""))
                    }
                }
            }
        }
        None => {
            for (_, _, path) in fields.drain(..) {
                out.notes.push(KeyNote {
                    path,
                    message:
                        "accepted; without `relay` no SMTP server is configured, so it has no use"
                            .to_owned(),
                });
            }
        }
    }
    if !ours && !smtp.is_empty() {
        for (name, value, path) in smtp {
            let path: Vec<&str> = path.iter().map(String::as_str).collect();
            out.put(&["smtp", name], value, &path);
        }
    } else {
        for (_, _, path) in fields {
            lost(&mut out, path, "smtp");
        }
    }
    if let Some((value, path)) = reply_to {
        let file_path: Vec<&str> = path.iter().map(String::as_str).collect();
        if out.get(&["smtp"]).is_none() {
            out.notes.push(KeyNote {
                path,
                message: "accepted; without an SMTP server nothing is sent, so it has no use"
                    .to_owned(),
            });
        } else if out.get(&["smtp", "reply_to"]).is_some() {
            lost(&mut out, path, "smtp");
        } else {
            out.put(&["smtp", "reply_to"], value, &file_path);
        }
    }

    // The inbound webhook.
    let mut enabled = None;
    let mut inbound: Vec<(&str, toml::Value, Vec<String>)> = Vec::new();
    for (flat, nested) in REFERENCE_INBOUND {
        let found = match out.take(&["inbound", nested]) {
            Some(value) => {
                if out.take(&[flat]).is_some() {
                    out.notes.push(KeyNote::new(
                        &[flat],
                        format!("both `inbound.{nested}` and `{flat}` are set; `inbound.{nested}` is used"),
                    ));
                }
                Some((value, vec!["inbound".to_owned(), nested.to_owned()]))
            }
            None => out.take(&[flat]).map(|value| (value, vec![flat.to_owned()])),
        };
        let Some((value, path)) = found else { continue };
        if nested == "enabled" {
            let on = value.as_bool().ok_or_else(|| bad(&path, "must be true or false"))?;
            enabled = Some((on || enabled.is_some_and(|(on, _)| on), path));
        } else {
            inbound.push((nested, value, path));
        }
    }
    if let Some(value) = out.take(&["webhook_enabled"]) {
        let path = vec!["webhook_enabled".to_owned()];
        let on = value.as_bool().ok_or_else(|| bad(&path, "must be true or false"))?;
        enabled = Some((on || enabled.as_ref().is_some_and(|(on, _)| *on), path));
    }
    let ours = out.get(&["inbound_webhook"]).is_some();
    match enabled {
        Some((true, path)) if ours => {
            lost(&mut out, path, "inbound_webhook");
            for (_, _, path) in inbound {
                lost(&mut out, path, "inbound_webhook");
            }
        }
        Some((true, enabled_path)) => {
            let (mut bind, mut port) = ("127.0.0.1".to_owned(), i64::from(DEFAULT_INBOUND_PORT));
            let mut first_path = enabled_path.clone();
            for (name, value, path) in inbound {
                match name {
                    "bind" => {
                        let raw = value.as_str().ok_or_else(|| bad(&path, "must be an address"))?;
                        bind = reference_bind(raw).ok_or_else(|| {
                            bad(
                                &path,
                                "must be 127.0.0.1, localhost, 0.0.0.0, any or an IPv4 address",
                            )
                        })?;
                        first_path = path;
                    }
                    "port" => {
                        let number = match &value {
                            toml::Value::Integer(n) => Some(*n),
                            toml::Value::String(raw) => raw.trim().parse::<i64>().ok(),
                            _ => None,
                        };
                        port = number
                            .filter(|n| (0..=i64::from(u16::MAX)).contains(n))
                            .ok_or_else(|| bad(&path, "must be a port number"))?;
                    }
                    other => {
                        let file_path: Vec<&str> = path.iter().map(String::as_str).collect();
                        out.put(&["inbound_webhook", other], value, &file_path);
                    }
                }
            }
            if out.get(&["enabled"]).is_none() {
                out.notes.push(KeyNote {
                    path: enabled_path,
                    message: "the inbound webhook is set up; the email channel itself is \
                              switched on by `enabled = true` in [gateway.email]"
                        .to_owned(),
                });
            }
            let file_path: Vec<&str> = first_path.iter().map(String::as_str).collect();
            out.put(&["inbound_webhook", "listen"], format!("{bind}:{port}").into(), &file_path);
        }
        _ => {
            for (_, _, path) in inbound {
                out.notes.push(KeyNote {
                    path,
                    message: "accepted; the inbound webhook is off (`inbound.enabled` is not true), so it has no use".to_owned(),
                });
            }
        }
    }
    Ok(out)
}

/// `a@b.c` or `@b.c`, lowercased; `None` for anything else.
fn normalize_sender_rule(rule: &str) -> Option<String> {
    let rule = rule.trim().to_ascii_lowercase();
    match rule.strip_prefix('@') {
        Some(domain) => is_domain(domain).then_some(rule),
        None => parse_address(&rule).filter(|a| *a == rule),
    }
}

fn is_domain(domain: &str) -> bool {
    !domain.is_empty()
        && domain.contains('.')
        && domain.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.')
        && !domain.starts_with(['.', '-'])
        && !domain.ends_with(['.', '-'])
}

/// The bare, lowercased address of `Name <local@domain>` or `local@domain`.
pub fn parse_address(text: &str) -> Option<String> {
    let text = text.trim();
    // One address: `Name <a@b>` or `a@b`; a second `<…>` (a list) is no
    // single sender, whichever of them a reader would show.
    if text.matches('<').count() > 1 || text.matches('>').count() > 1 {
        return None;
    }
    let bare = match (text.find('<'), text.find('>')) {
        (Some(open), Some(close)) if open < close && text[close + 1..].trim().is_empty() => {
            &text[open + 1..close]
        }
        (None, None) => text,
        _ => return None,
    };
    let bare = bare.trim().to_ascii_lowercase();
    let (local, domain) = bare.rsplit_once('@')?;
    let local_ok = !local.is_empty()
        && local.chars().all(|c| c.is_ascii_graphic() && !matches!(c, '<' | '>' | '"' | ',' | '@'));
    (local_ok && is_domain(domain)).then_some(bare)
}

#[cfg(test)]
mod tests;
