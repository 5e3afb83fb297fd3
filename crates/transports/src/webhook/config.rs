//! `[gateway.webhook]`: the raw TOML section parsed into typed settings.

use lemon_core::ids::EngineRef;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use lemon_core::config::{field_names, parse_table, QueueMode, UnknownKey};
use lemon_core::media::FilesConfig;
use lemon_core::secrets::SecretStore;
use serde::Deserialize;

/// Default webhook port.
pub const DEFAULT_WEBHOOK_PORT: u16 = 4046;

/// Whether a request waits for its run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Wait for `run_completed` and answer with the result.
    Sync,
    /// Answer `202` at once; the result goes to the callback URL, if any.
    #[default]
    Async,
}

/// `[gateway.webhook]`: `POST /webhooks/<integration>` starts a run, for
/// n8n, Zapier, Make and scripts; each integration has its own token and
/// session, and the result is the answer (`sync`) or a callback (`async`).
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
pub struct WebhookConfig {
    /// Switches the webhook on or off; wins over `[gateway] enable_webhook`.
    #[serde(default)]
    pub enabled: Option<bool>,
    /// Listen address: an IP, `localhost`, or `any` for every interface.
    #[serde(default = "defaults::bind")]
    pub bind: String,
    /// Listen port (default 4046; 0 picks a free one).
    #[serde(default = "defaults::port")]
    pub port: u16,
    /// Whether requests wait for their run (`sync`) or are answered at once.
    #[serde(default)]
    #[schemars(extend("default" = "async"))]
    pub mode: Mode,
    /// How long a sync request waits, in milliseconds; also each callback
    /// attempt's timeout.
    #[serde(default = "defaults::timeout_ms")]
    pub timeout_ms: u64,
    /// Largest body accepted, in bytes; larger ones get `413`.
    #[serde(default = "defaults::max_body_bytes")]
    pub max_body_bytes: usize,
    /// How long an idempotency key answers with its first request's answer,
    /// in milliseconds.
    #[serde(default = "defaults::idempotency_ttl_ms")]
    pub idempotency_ttl_ms: u64,
    /// Where results are POSTed when the integration names no URL.
    #[serde(default)]
    pub callback_url: Option<String>,
    /// Callback attempts before giving up.
    #[serde(default = "defaults::callback_max_attempts")]
    #[schemars(range(min = 1))]
    pub callback_max_attempts: u32,
    /// The wait after a failed callback attempt, in milliseconds; doubled
    /// after each next one.
    #[serde(default = "defaults::callback_backoff_ms")]
    pub callback_backoff_ms: u64,
    /// The longest wait between callback attempts, in milliseconds.
    #[serde(default = "defaults::callback_backoff_max_ms")]
    pub callback_backoff_max_ms: u64,
    /// How long a callback waits for its run to finish; a run still going
    /// then gets no callback (given up on, logged and counted in status).
    /// Unset: as long as the run takes, across restarts (the reference's
    /// default is 10 minutes).
    #[serde(default)]
    pub callback_wait_timeout_ms: Option<u64>,
    /// Whether callbacks may go to loopback, private and link-local addresses.
    #[serde(default)]
    pub allow_private_callback_hosts: bool,
    /// Whether `?token=` authenticates.
    #[serde(default)]
    pub allow_query_token: bool,
    /// Whether a body `token` authenticates.
    #[serde(default)]
    pub allow_payload_token: bool,
    /// Whether a body `callback_url` replaces the configured one.
    #[serde(default)]
    pub allow_callback_override: bool,
    /// Whether a body `idempotency_key` counts (the header always does).
    #[serde(default)]
    pub allow_payload_idempotency_key: bool,
    /// Whether a payload's text is outside text: its runs are marked
    /// untrusted, judged by `[gateway.approvals] untrusted` and give the
    /// model the text in a data block (default on).
    #[serde(default = "defaults::untrusted")]
    pub untrusted: bool,
    /// `[gateway.webhook.files]`: when set, the files a payload carries (as
    /// base64 or as URLs) are saved for its run, within these limits; unset,
    /// attachments are only listed in the prompt and base64 content is refused.
    #[serde(default)]
    pub files: Option<FilesConfig>,
    /// `[gateway.webhook.integrations.<integration>]`: the integrations by
    /// name (the last part of `/webhooks/<integration>`); each has its own
    /// token.
    #[serde(default)]
    #[schemars(extend("x-key" = "integration"))]
    pub integrations: BTreeMap<String, IntegrationConfig>,
}

/// One integration; unset values fall back to `[gateway.webhook]`'s.
#[derive(Clone, Default, Deserialize, schemars::JsonSchema)]
pub struct IntegrationConfig {
    /// The shared token, inline. Never logged.
    #[serde(default)]
    pub token: Option<String>,
    /// The name of a secret holding the token.
    #[serde(default)]
    pub token_secret: Option<String>,
    /// The session runs go to (default `webhook:<integration>`). A payload's
    /// `session_key` counts only with `allow_session_key`.
    #[serde(default)]
    pub session_key: Option<String>,
    /// Whether a payload may choose its session; it is then kept under
    /// `webhook:<integration>:`, so a webhook never reaches another channel's
    /// session.
    #[serde(default)]
    pub allow_session_key: bool,
    /// The agent runs are attributed to.
    #[serde(default)]
    pub agent_id: Option<String>,
    /// The queue mode unless the body names one.
    #[serde(default)]
    pub queue_mode: Option<QueueMode>,
    /// The runs' working directory.
    #[serde(default)]
    pub cwd: Option<PathBuf>,
    /// The engine unless the body names one.
    #[serde(default)]
    pub engine: Option<EngineRef>,
    /// Overrides the section's `mode`.
    #[serde(default)]
    pub mode: Option<Mode>,
    /// Overrides the section's `timeout_ms`.
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    /// Overrides the section's `callback_url`.
    #[serde(default)]
    pub callback_url: Option<String>,
    /// Overrides the section's `callback_max_attempts`.
    #[serde(default)]
    pub callback_max_attempts: Option<u32>,
    /// Overrides the section's `callback_backoff_ms`.
    #[serde(default)]
    pub callback_backoff_ms: Option<u64>,
    /// Overrides the section's `callback_backoff_max_ms`.
    #[serde(default)]
    pub callback_backoff_max_ms: Option<u64>,
    /// Overrides the section's `callback_wait_timeout_ms`.
    #[serde(default)]
    pub callback_wait_timeout_ms: Option<u64>,
    /// Overrides the section's flag of the same name.
    #[serde(default)]
    pub allow_private_callback_hosts: Option<bool>,
    /// Overrides the section's flag of the same name.
    #[serde(default)]
    pub allow_query_token: Option<bool>,
    /// Overrides the section's flag of the same name.
    #[serde(default)]
    pub allow_payload_token: Option<bool>,
    /// Overrides the section's flag of the same name.
    #[serde(default)]
    pub allow_callback_override: Option<bool>,
    /// Overrides the section's flag of the same name.
    #[serde(default)]
    pub allow_payload_idempotency_key: Option<bool>,
    /// Overrides the section's flag of the same name: `false` for a sender
    /// whose text is the owner's own (a script of theirs).
    #[serde(default)]
    pub untrusted: Option<bool>,
    /// Replaces the section's `[gateway.webhook.files]` for this integration.
    #[serde(default)]
    pub files: Option<FilesConfig>,
}

impl std::fmt::Debug for IntegrationConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IntegrationConfig")
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("token_secret", &self.token_secret)
            .field("session_key", &self.session_key)
            .field("allow_session_key", &self.allow_session_key)
            .field("agent_id", &self.agent_id)
            .field("queue_mode", &self.queue_mode)
            .field("cwd", &self.cwd)
            .field("engine", &self.engine)
            .field("mode", &self.mode)
            .field("timeout_ms", &self.timeout_ms)
            .field("callback_url", &self.callback_url)
            .field("callback_max_attempts", &self.callback_max_attempts)
            .field("callback_backoff_ms", &self.callback_backoff_ms)
            .field("callback_backoff_max_ms", &self.callback_backoff_max_ms)
            .field("callback_wait_timeout_ms", &self.callback_wait_timeout_ms)
            .field("allow_private_callback_hosts", &self.allow_private_callback_hosts)
            .field("allow_query_token", &self.allow_query_token)
            .field("allow_payload_token", &self.allow_payload_token)
            .field("allow_callback_override", &self.allow_callback_override)
            .field("allow_payload_idempotency_key", &self.allow_payload_idempotency_key)
            .field("files", &self.files)
            .finish()
    }
}

mod defaults {
    pub(super) fn untrusted() -> bool {
        true
    }
    pub(super) fn bind() -> String {
        "127.0.0.1".to_owned()
    }
    pub(super) fn port() -> u16 {
        super::DEFAULT_WEBHOOK_PORT
    }
    pub(super) fn timeout_ms() -> u64 {
        30_000
    }
    pub(super) fn max_body_bytes() -> usize {
        1024 * 1024
    }
    pub(super) fn idempotency_ttl_ms() -> u64 {
        24 * 60 * 60 * 1000
    }
    pub(super) fn callback_max_attempts() -> u32 {
        3
    }
    pub(super) fn callback_backoff_ms() -> u64 {
        500
    }
    pub(super) fn callback_backoff_max_ms() -> u64 {
        5000
    }
}

/// A `[gateway.webhook]` that cannot be used; the message names the key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid [gateway.webhook]: {0}")]
pub struct WebhookConfigError(pub String);

impl Default for WebhookConfig {
    fn default() -> Self {
        WebhookConfig::parse(&toml::Table::new()).unwrap_or_else(|_| unreachable!())
    }
}

impl WebhookConfig {
    /// Parses the raw section and checks the values serde cannot.
    ///
    /// # Errors
    /// A wrong type, an unknown key, a bad queue mode, an integration without a token.
    pub fn parse(table: &toml::Table) -> Result<Self, WebhookConfigError> {
        WebhookConfig::parse_with_unknown_keys(table).map(|(config, _)| config)
    }

    /// As [`WebhookConfig::parse`], with the keys the section does not know
    /// (ignored), each with the closest known key.
    ///
    /// # Errors
    /// See [`WebhookConfig::parse`].
    pub fn parse_with_unknown_keys(
        table: &toml::Table,
    ) -> Result<(Self, Vec<UnknownKey>), WebhookConfigError> {
        let (config, ignored) = parse_table::<WebhookConfig>(table)
            .map_err(|err| WebhookConfigError(err.to_string()))?;
        let unknown = ignored
            .into_iter()
            .map(|path| {
                let known = match path.as_slice() {
                    [section, _, files, _] if section == "integrations" && files == "files" => {
                        field_names::<FilesConfig>()
                    }
                    [section, _, _] if section == "integrations" => {
                        field_names::<IntegrationConfig>()
                    }
                    [files, _] if files == "files" => field_names::<FilesConfig>(),
                    _ => field_names::<WebhookConfig>(),
                };
                UnknownKey::new(path, known.iter().copied())
            })
            .collect();
        let config = config.checked()?;
        Ok((config, unknown))
    }

    /// The checks serde cannot make.
    fn checked(self) -> Result<Self, WebhookConfigError> {
        let config = self;
        if config.callback_max_attempts == 0 {
            return Err(WebhookConfigError("callback_max_attempts must be at least 1".into()));
        }
        if config.max_body_bytes == 0 {
            return Err(WebhookConfigError("max_body_bytes must be at least 1".into()));
        }
        if config.callback_wait_timeout_ms == Some(0) {
            return Err(WebhookConfigError("callback_wait_timeout_ms must be at least 1".into()));
        }
        if let Some(problem) = config.files.as_ref().and_then(|f| f.check().into_iter().next()) {
            return Err(WebhookConfigError(format!("files.{problem}")));
        }
        for (id, integration) in &config.integrations {
            let files = integration.files.as_ref();
            if let Some(problem) = files.and_then(|f| f.check().into_iter().next()) {
                return Err(WebhookConfigError(format!("integrations.{id}.files.{problem}")));
            }
            if integration.callback_max_attempts == Some(0) {
                return Err(WebhookConfigError(format!(
                    "integrations.{id}.callback_max_attempts must be at least 1"
                )));
            }
            if integration.callback_wait_timeout_ms == Some(0) {
                return Err(WebhookConfigError(format!(
                    "integrations.{id}.callback_wait_timeout_ms must be at least 1"
                )));
            }
            let inline = integration.token.as_deref().is_some_and(|t| !t.trim().is_empty());
            if !inline && integration.token_secret.is_none() {
                return Err(WebhookConfigError(format!(
                    "integrations.{id}: set token or token_secret"
                )));
            }
        }
        Ok(config)
    }

    /// The section when the webhook is enabled, `None` when it is not; see
    /// [`lemon_core::transport::enabled`] for the rule. The section is checked either
    /// way, so a mistake in it is reported before it is switched on.
    ///
    /// # Errors
    /// See [`WebhookConfig::parse`].
    pub fn from_gateway(
        enable_webhook: Option<bool>,
        table: Option<&toml::Table>,
    ) -> Result<Option<Self>, WebhookConfigError> {
        let config = match table {
            Some(table) => WebhookConfig::parse(table)?,
            None => WebhookConfig::default(),
        };
        Ok(lemon_core::transport::enabled(enable_webhook, table).then_some(config))
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

    /// Every integration's token: inline, or read from the secret store.
    ///
    /// # Errors
    /// A secret that is not set or cannot be read.
    pub fn resolve_tokens(
        &self,
        secrets: &SecretStore,
    ) -> Result<BTreeMap<String, String>, WebhookConfigError> {
        let mut tokens = BTreeMap::new();
        for (id, integration) in &self.integrations {
            let token = lemon_core::transport::inline_or_secret(
                "token",
                integration.token.as_deref(),
                integration.token_secret.as_deref(),
                secrets,
            )
            .map_err(|message| WebhookConfigError(format!("integrations.{id}.{message}")))?;
            tokens.insert(id.clone(), token);
        }
        Ok(tokens)
    }
}
