//! `[gateway.sms]`: the raw TOML section parsed into typed settings, and the
//! secrets it names read once at start.
//!
//! A section written for the reference gateway is read as it is: its
//! `webhook_enabled`, `webhook_port` and `webhook_bind` are `enabled`, `port`
//! and `bind` (where both names are written ours is used, and a warning
//! names both); `webhook_url`, `auth_token`, `inbox_number`, `inbox_ttl_ms`
//! and `validate_webhook` have the reference's meaning. Its environment
//! variables (`LEMON_SMS_WEBHOOK_PORT`, `TWILIO_INBOX_NUMBER`…) are applied
//! over the file where the file is loaded (`lemon_core::config::env`).

use std::net::SocketAddr;
use std::time::Duration;

use lemon_core::config::{
    field_names, parse_table, reference_bind, KeyNote, ReferenceKey, Translation, UnknownKey,
};
use lemon_core::secrets::{SecretStore, SecretValue};
use serde::{Deserialize, Deserializer};

/// Default port of the SMS webhook.
pub const DEFAULT_SMS_PORT: u16 = 4041;
/// Twilio's REST API.
pub const DEFAULT_API_BASE_URL: &str = "https://api.twilio.com";
/// The path Twilio posts inbound messages to.
pub const WEBHOOK_PATH: &str = "/webhooks/twilio/sms";
/// How long one call to Twilio's REST API may take unless `api_timeout_ms` says.
pub const DEFAULT_API_TIMEOUT_MS: u64 = 15_000;

/// `[gateway.sms]`: Twilio SMS. Texts to the gateway's number are kept in an
/// inbox the `sms_*` tools read (codes, replies); with `reply_to_allowed`, a
/// text from an allowed number is a conversation and its answer is texted
/// back.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[schemars(transform = reference_keys_schema)]
pub struct SmsConfig {
    /// Switches SMS on (off unless set). The reference's name
    /// `webhook_enabled` is read as this (`true`, a non-zero number, or `1`,
    /// `true`, `yes`, `on`); so is `LEMON_SMS_WEBHOOK_ENABLED`, over the file.
    #[serde(default)]
    pub enabled: Option<bool>,
    /// Listen address of the webhook: an IP, `localhost`, or `any`. The
    /// reference's `webhook_bind` (and `LEMON_SMS_WEBHOOK_BIND`) is read as
    /// the reference reads it: `127.0.0.1`/`localhost` loopback,
    /// `0.0.0.0`/`any` every interface, a dotted IPv4 address itself, anything
    /// else loopback (with a warning).
    #[serde(default = "defaults::bind")]
    pub bind: String,
    /// Listen port of the webhook (default 4041; 0 picks a free one). The
    /// reference's `webhook_port` (a number or a string of digits) and
    /// `LEMON_SMS_WEBHOOK_PORT` set it too.
    #[serde(default = "defaults::port")]
    pub port: u16,
    /// The base URL Twilio calls (the tunnel's or proxy's, `https://…`), which
    /// signatures are computed over: the webhook URL is this plus
    /// `/webhooks/twilio/sms`.
    #[serde(default)]
    pub public_url: Option<String>,
    /// The reference's `webhook_url`: the exact URL Twilio signs, used as it
    /// is instead of `public_url` + path + query (for a proxy that rewrites
    /// the path). `public_url` wins when both are written;
    /// `TWILIO_WEBHOOK_URL` wins over both.
    #[serde(default)]
    pub webhook_url: Option<String>,
    /// Whether inbound requests must carry a valid `X-Twilio-Signature`
    /// (default on here; the reference's default is off).
    /// `TWILIO_VALIDATE_WEBHOOK` overrides it.
    #[serde(default = "defaults::yes")]
    pub validate_webhook: bool,
    /// The secret holding the account's auth token (its environment variable
    /// is `TWILIO_AUTH_TOKEN` for the default name).
    #[serde(default = "defaults::auth_token_secret")]
    pub auth_token_secret: String,
    /// The reference's inline auth token, used when the secret named by
    /// `auth_token_secret` is not set. Never logged; a secret is better.
    #[serde(default, deserialize_with = "inline_secret")]
    #[schemars(with = "Option<String>")]
    pub auth_token: Option<SecretValue>,
    /// The secret holding the account SID (`AC…`), for sending.
    #[serde(default = "defaults::account_sid_secret")]
    pub account_sid_secret: String,
    /// Twilio's REST API base URL.
    #[serde(default = "defaults::api_base_url")]
    pub api_base_url: String,
    /// The gateway's own number (E.164): where codes arrive, and what texts
    /// are sent from. `TWILIO_INBOX_NUMBER` overrides it.
    #[serde(default)]
    pub inbox_number: Option<String>,
    /// How long a received message is kept, in milliseconds.
    /// `LEMON_SMS_INBOX_TTL_MS` overrides it.
    #[serde(default = "defaults::inbox_ttl_ms")]
    #[schemars(range(min = 1))]
    pub inbox_ttl_ms: u64,
    /// Numbers (E.164) that may talk to the agent (with `reply_to_allowed`)
    /// and that `sms_send` may text.
    #[serde(default)]
    pub allowed_senders: Vec<String>,
    /// More numbers `sms_send` may text.
    #[serde(default)]
    pub allowed_recipients: Vec<String>,
    /// An SMS from an allowed sender starts or continues the conversation
    /// `sms:<from>`, and the answer is texted back. A text from any other
    /// number gets no run (its number is in the log, INFO, to copy into
    /// `allowed_senders`); it is still kept in the inbox for `sms_*` tools.
    #[serde(default)]
    pub reply_to_allowed: bool,
    /// With `reply_to_allowed`, a text from any number gets a run and an
    /// answer, whatever `allowed_senders` says. Warned about at every start
    /// and shown in status. `sms_send` still texts only the listed numbers.
    #[serde(default)]
    pub allow_everyone: bool,
    /// The largest webhook body accepted, in bytes; larger ones get `413`.
    #[serde(default = "defaults::max_body_bytes")]
    #[schemars(range(min = 1))]
    pub max_body_bytes: usize,
    /// How long one call to Twilio's REST API may take, in milliseconds. A
    /// text whose call
    /// takes longer is sent again, and Twilio may have taken the first one:
    /// the text can then arrive twice, never not at all.
    #[serde(default = "defaults::api_timeout_ms")]
    pub api_timeout_ms: u64,
    /// `[gateway.sms.files]`: MMS media (who may send them, how large, which
    /// names are refused, where they are saved).
    #[serde(default)]
    pub files: lemon_core::media::FilesConfig,
}

/// An inline secret: kept out of `Debug`.
fn inline_secret<'de, D: Deserializer<'de>>(d: D) -> Result<Option<SecretValue>, D::Error> {
    Ok(Option::<String>::deserialize(d)?
        .filter(|value| !value.trim().is_empty())
        .map(|value| SecretValue::new(value.trim())))
}

/// The reference layout's keys in the section's schema: those read as ours
/// as they are, and `webhook_enabled` and `webhook_bind`, whose values are
/// read the reference's way first.
fn reference_keys_schema(schema: &mut schemars::Schema) {
    use lemon_core::config::schema::{add_reference_keys, add_reference_property};
    add_reference_keys(schema, REFERENCE_KEYS);
    add_reference_property(
        schema,
        "webhook_port",
        schemars::json_schema!({
            "type": ["integer", "string"],
            "description": "The reference layout's name for `port` (a number, or a string of digits), read as it; where both are written, `port` is used.",
        }),
    );
    add_reference_property(
        schema,
        "webhook_enabled",
        schemars::json_schema!({
            "type": ["boolean", "integer", "string"],
            "description": "The reference layout's switch, read as `enabled`: `true`, a number other than 0, or `1`, `true`, `yes`, `on` switch SMS on; where both are written, `enabled` is used.",
        }),
    );
    add_reference_property(
        schema,
        "webhook_bind",
        schemars::json_schema!({
            "type": "string",
            "description": "The reference layout's listen address, read as `bind`: `127.0.0.1` and `localhost` are loopback, `0.0.0.0` and `any` every interface, an IPv4 address itself, anything else loopback.",
        }),
    );
}

/// The reference's keys read as ours without a change of value.
const REFERENCE_KEYS: &[ReferenceKey] =
    &[ReferenceKey::Alias { theirs: "webhook_port", ours: "port" }];

/// `table` with the reference's keys read as ours, and the notes about them.
fn translate(table: &toml::Table) -> Translation {
    let mut table = table.clone();
    let mut notes = Vec::new();
    // The reference's readings of its values, before they are moved.
    if let Some(port) = table.get_mut("webhook_port") {
        if let Some(n) = port.as_str().and_then(|raw| raw.trim().parse::<i64>().ok()) {
            *port = n.into();
        }
    }
    if let Some(enabled) = table.get_mut("webhook_enabled") {
        let on = match &*enabled {
            toml::Value::Boolean(on) => Some(*on),
            toml::Value::Integer(n) => Some(*n != 0),
            toml::Value::String(raw) => {
                let word = raw.trim().to_ascii_lowercase();
                let on = matches!(word.as_str(), "1" | "true" | "yes" | "on");
                if !on && !matches!(word.as_str(), "0" | "false" | "no" | "off" | "") {
                    notes.push(KeyNote::new(
                        &["webhook_enabled"],
                        format!("{raw:?} is read as false, as the reference reads it (only 1, true, yes and on switch it on)"),
                    ));
                }
                Some(on)
            }
            _ => None,
        };
        if let Some(on) = on {
            *enabled = on.into();
        }
    }
    if let Some(bind) = table.get_mut("webhook_bind") {
        if let Some(raw) = bind.as_str().map(str::to_owned) {
            let read = reference_bind(&raw).unwrap_or_else(|| {
                notes.push(KeyNote::new(
                    &["webhook_bind"],
                    format!("{raw:?} is not an IPv4 address: the webhook listens on loopback (127.0.0.1), as the reference does"),
                ));
                "127.0.0.1".to_owned()
            });
            *bind = read.into();
        }
    }
    let mut out = Translation::new(&table, REFERENCE_KEYS);
    out.alias(&["webhook_enabled"], &["enabled"]);
    out.alias(&["webhook_bind"], &["bind"]);
    if out.get(&["public_url"]).is_some() && out.take(&["webhook_url"]).is_some() {
        out.notes.push(KeyNote::new(
            &["webhook_url"],
            "both `public_url` and `webhook_url` (the reference's URL to sign) are set; `public_url` is used",
        ));
    }
    if table.contains_key("auth_token_secret") && table.contains_key("auth_token") {
        out.notes.push(KeyNote::new(
            &["auth_token"],
            "both `auth_token_secret` and `auth_token` are set; the secret is used, and `auth_token` only while that secret is not set",
        ));
    }
    notes.append(&mut out.notes);
    out.notes = notes;
    out
}

mod defaults {
    pub(super) fn bind() -> String {
        "127.0.0.1".to_owned()
    }
    pub(super) fn port() -> u16 {
        super::DEFAULT_SMS_PORT
    }
    pub(super) fn yes() -> bool {
        true
    }
    pub(super) fn auth_token_secret() -> String {
        "twilio_auth_token".to_owned()
    }
    pub(super) fn account_sid_secret() -> String {
        "twilio_account_sid".to_owned()
    }
    pub(super) fn api_base_url() -> String {
        super::DEFAULT_API_BASE_URL.to_owned()
    }
    pub(super) fn inbox_ttl_ms() -> u64 {
        24 * 60 * 60 * 1000
    }
    pub(super) fn max_body_bytes() -> usize {
        64 * 1024
    }
    pub(super) fn api_timeout_ms() -> u64 {
        super::DEFAULT_API_TIMEOUT_MS
    }
}

/// A `[gateway.sms]` that cannot be used; the message names the key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid [gateway.sms]: {0}")]
pub struct SmsConfigError(pub String);

impl Default for SmsConfig {
    fn default() -> Self {
        SmsConfig::parse(&toml::Table::new()).unwrap_or_else(|_| unreachable!())
    }
}

/// Whether `raw` is an E.164 phone number: `+`, then 2 to 15 digits, the first not 0.
pub fn is_e164(raw: &str) -> bool {
    lemon_core::sms::is_e164(raw)
}

impl SmsConfig {
    /// Parses the raw section and checks the values serde cannot.
    ///
    /// # Errors
    /// A wrong type, a number that is not E.164, a public URL that is not
    /// http(s), a zero body cap or TTL.
    pub fn parse(table: &toml::Table) -> Result<Self, SmsConfigError> {
        SmsConfig::parse_with_unknown_keys(table).map(|(config, _)| config)
    }

    /// As [`SmsConfig::parse`], with the keys the section does not know, each
    /// with the closest known key.
    ///
    /// # Errors
    /// See [`SmsConfig::parse`].
    pub fn parse_with_unknown_keys(
        table: &toml::Table,
    ) -> Result<(Self, Vec<UnknownKey>), SmsConfigError> {
        let translated = translate(table);
        let (config, ignored) = parse_table::<SmsConfig>(&translated.table)
            .map_err(|err| SmsConfigError(translated.in_file(err).to_string()))?;
        let known = field_names::<SmsConfig>();
        let unknown =
            ignored.into_iter().map(|path| UnknownKey::new(path, known.iter().copied())).collect();
        Ok((config.checked()?, unknown))
    }

    /// What the section's reference keys do where that is worth saying: an
    /// alias beside our own key, a value read as the reference reads it.
    pub fn reference_notes(table: &toml::Table) -> Vec<KeyNote> {
        translate(table).notes
    }

    fn checked(mut self) -> Result<Self, SmsConfigError> {
        if self.max_body_bytes == 0 {
            return Err(SmsConfigError("`max_body_bytes` must be at least 1".into()));
        }
        if self.inbox_ttl_ms == 0 {
            return Err(SmsConfigError("`inbox_ttl_ms` must be at least 1".into()));
        }
        if !(100..=600_000).contains(&self.api_timeout_ms) {
            return Err(SmsConfigError(
                "`api_timeout_ms` must be between 100 and 600000 milliseconds".into(),
            ));
        }
        if let Some(number) = &self.inbox_number {
            let number = number.trim().to_owned();
            if !is_e164(&number) {
                return Err(SmsConfigError(format!(
                    "`inbox_number`: {number:?} is not an E.164 number (like +15551234567)"
                )));
            }
            self.inbox_number = Some(number);
        }
        for (key, list) in [
            ("allowed_senders", &mut self.allowed_senders),
            ("allowed_recipients", &mut self.allowed_recipients),
        ] {
            for number in list.iter_mut() {
                *number = number.trim().to_owned();
                if !is_e164(number) {
                    return Err(SmsConfigError(format!(
                        "`{key}`: {number:?} is not an E.164 number (like +15551234567)"
                    )));
                }
            }
        }
        if let Some(url) = &self.public_url {
            let url = url.trim().trim_end_matches('/').to_owned();
            let parsed = reqwest::Url::parse(&url).map_err(|err| {
                SmsConfigError(format!("`public_url`: {url:?} is not a URL: {err}"))
            })?;
            if !matches!(parsed.scheme(), "http" | "https") || parsed.host_str().is_none() {
                return Err(SmsConfigError(format!(
                    "`public_url`: {url:?} must be an http(s) URL with a host"
                )));
            }
            if parsed.query().is_some() || parsed.fragment().is_some() {
                return Err(SmsConfigError(format!(
                    "`public_url`: {url:?} must not have a query or fragment"
                )));
            }
            self.public_url = Some(url);
        }
        if let Some(url) = &self.webhook_url {
            let url = url.trim().to_owned();
            let parsed = reqwest::Url::parse(&url).map_err(|err| {
                SmsConfigError(format!("`webhook_url`: {url:?} is not a URL: {err}"))
            })?;
            if !matches!(parsed.scheme(), "http" | "https") || parsed.host_str().is_none() {
                return Err(SmsConfigError(format!(
                    "`webhook_url`: {url:?} must be an http(s) URL with a host"
                )));
            }
            self.webhook_url = Some(url);
        }
        let base = self.api_base_url.trim().trim_end_matches('/').to_owned();
        match reqwest::Url::parse(&base) {
            Ok(url) if matches!(url.scheme(), "http" | "https") => self.api_base_url = base,
            _ => {
                return Err(SmsConfigError(format!(
                    "`api_base_url`: {base:?} must be an http(s) URL"
                )))
            }
        }
        Ok(self)
    }

    /// The section when SMS is enabled (`enabled = true`), `None` when it is
    /// not. The section is checked either way.
    ///
    /// # Errors
    /// See [`SmsConfig::parse`].
    pub fn from_gateway(table: Option<&toml::Table>) -> Result<Option<Self>, SmsConfigError> {
        let config = match table {
            Some(table) => SmsConfig::parse(table)?,
            None => return Ok(None),
        };
        // `enabled` as parsed: the reference's `webhook_enabled` counts.
        Ok(config.enabled.unwrap_or(false).then_some(config))
    }

    /// `bind:port`, with `any` meaning every interface.
    pub fn addr(&self) -> String {
        let bind = match self.bind.trim() {
            "" | "localhost" => "127.0.0.1",
            "any" => "0.0.0.0",
            other => other,
        };
        match bind.parse::<std::net::IpAddr>() {
            Ok(ip) => SocketAddr::new(ip, self.port).to_string(),
            Err(_) => format!("{bind}:{}", self.port),
        }
    }

    /// How long a received message is kept.
    pub fn inbox_ttl(&self) -> Duration {
        Duration::from_millis(self.inbox_ttl_ms)
    }

    /// How long one call to Twilio's REST API may take.
    pub fn api_timeout(&self) -> Duration {
        Duration::from_millis(self.api_timeout_ms)
    }

    /// The URL Twilio is told to call: `webhook_url` as it is, else
    /// `public_url` and the path; `None` when neither is set.
    pub fn webhook_url(&self) -> Option<String> {
        self.webhook_url
            .clone()
            .or_else(|| self.public_url.as_ref().map(|base| format!("{base}{WEBHOOK_PATH}")))
    }

    /// Whether a text from `number` is in `allowed_senders`, so it may talk
    /// to the agent (with `reply_to_allowed`; `allow_everyone` is checked by
    /// the caller).
    pub fn sender_listed(&self, number: &str) -> bool {
        is_e164(number) && self.allowed_senders.iter().any(|n| n == number)
    }

    /// Whether `sms_send` may text `number`.
    pub fn may_send_to(&self, number: &str) -> bool {
        self.allowed_senders.iter().chain(&self.allowed_recipients).any(|n| n == number)
    }

    /// Reads the secrets the section names and checks that the webhook is not
    /// left open by mistake.
    ///
    /// # Errors
    /// `validate_webhook` without an auth token or without `public_url`;
    /// `reply_to_allowed` without what sending needs; a secret that cannot be read.
    pub fn resolve(&self, secrets: &SecretStore) -> Result<SmsSecrets, SmsConfigError> {
        let read = |name: &str, key: &str| -> Result<Option<String>, SmsConfigError> {
            match secrets.get(name) {
                Ok(Some(value)) if !value.expose().trim().is_empty() => {
                    Ok(Some(value.expose().trim().to_owned()))
                }
                Ok(_) => Ok(None),
                Err(err) => Err(SmsConfigError(format!("`{key}`: {err}"))),
            }
        };
        // The secret first, then the reference's inline value.
        let auth_token = read(&self.auth_token_secret, "auth_token_secret")?
            .or_else(|| self.auth_token.as_ref().map(|token| token.expose().to_owned()));
        let account_sid = read(&self.account_sid_secret, "account_sid_secret")?;
        if self.validate_webhook {
            if auth_token.is_none() {
                return Err(SmsConfigError(format!(
                    "`validate_webhook` is on but the auth token is missing: {} \
                     (or set validate_webhook = false to accept unsigned requests)",
                    secrets.not_set_message(&self.auth_token_secret)
                )));
            }
            if self.public_url.is_none() && self.webhook_url.is_none() {
                return Err(SmsConfigError(
                    "`validate_webhook` is on but `public_url` is not set: set it to the \
                     https URL Twilio calls (your tunnel's), which signatures are computed over"
                        .into(),
                ));
            }
        }
        if self.reply_to_allowed {
            if self.inbox_number.is_none() {
                return Err(SmsConfigError(
                    "`reply_to_allowed` needs `inbox_number`, the number answers are sent from"
                        .into(),
                ));
            }
            if auth_token.is_none() || account_sid.is_none() {
                let missing = if auth_token.is_none() {
                    &self.auth_token_secret
                } else {
                    &self.account_sid_secret
                };
                return Err(SmsConfigError(format!(
                    "`reply_to_allowed` needs the Twilio credentials to answer: {}",
                    secrets.not_set_message(missing)
                )));
            }
        }
        Ok(SmsSecrets { auth_token, account_sid })
    }
}

/// The Twilio credentials, read from the secrets at start. Never logged.
#[derive(Clone, Default)]
pub struct SmsSecrets {
    /// Keys the signatures and the REST API's basic auth.
    pub auth_token: Option<String>,
    /// The account the REST API is called for.
    pub account_sid: Option<String>,
}

impl std::fmt::Debug for SmsSecrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SmsSecrets")
            .field("auth_token", &self.auth_token.as_ref().map(|_| "<redacted>"))
            .field("account_sid", &self.account_sid.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

#[cfg(test)]
mod tests;
