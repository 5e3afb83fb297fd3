//! `[gateway.telegram]`: the raw TOML section parsed into typed settings.

use lemon_core::ids::EngineRef;
use std::time::Duration;

use lemon_core::config::{parse_section, QueueMode, UnknownKey};
use lemon_core::secrets::SecretStore;
use serde::Deserialize;

/// `[gateway.telegram]`.
#[derive(Clone, Deserialize)]
pub struct TelegramConfig {
    #[serde(default)]
    pub enabled: Option<bool>,
    /// The bot token, inline. Never logged.
    #[serde(default)]
    pub bot_token: Option<String>,
    /// The name of a secret holding the bot token.
    #[serde(default)]
    pub bot_token_secret: Option<String>,
    /// Only these chats (a user's id for a private chat, the group's id for
    /// a group) may start runs; empty lets nobody in. A refused chat's id is
    /// in the log (INFO), to copy here.
    #[serde(default)]
    pub allowed_chat_ids: Vec<i64>,
    /// Every chat may start runs, whatever `allowed_chat_ids` says: a public
    /// bot. Warned about at every start and shown in status.
    #[serde(default)]
    pub allow_everyone: bool,
    /// Chats without a `[[gateway.bindings]]` entry for `transport = "telegram"`
    /// get no run.
    #[serde(default)]
    pub deny_unbound_chats: bool,
    #[serde(default = "defaults::api_base_url")]
    pub api_base_url: String,
    /// How long one `getUpdates` call waits for news, in seconds.
    #[serde(default = "defaults::poll_timeout_s")]
    pub poll_timeout_s: u64,
    /// The agent part of session keys.
    #[serde(default = "defaults::agent_id")]
    pub agent_id: String,
    /// The chats' queue mode unless a binding sets one.
    #[serde(default)]
    pub queue_mode: Option<QueueMode>,
    /// The engine unless a binding, a directive or `/engine` picks one.
    #[serde(default)]
    pub engine: Option<EngineRef>,
    /// How many times a final answer is sent before it is recorded as undelivered.
    #[serde(default = "defaults::delivery_attempts")]
    pub delivery_attempts: u32,
    /// A run that ends sooner gets no progress message, only its answer.
    #[serde(default = "defaults::progress_delay_ms")]
    pub progress_delay_ms: u64,
}

impl std::fmt::Debug for TelegramConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TelegramConfig")
            .field("enabled", &self.enabled)
            .field("bot_token", &self.bot_token.as_ref().map(|_| "<redacted>"))
            .field("bot_token_secret", &self.bot_token_secret)
            .field("allowed_chat_ids", &self.allowed_chat_ids)
            .field("allow_everyone", &self.allow_everyone)
            .field("deny_unbound_chats", &self.deny_unbound_chats)
            .field("api_base_url", &self.api_base_url)
            .field("poll_timeout_s", &self.poll_timeout_s)
            .field("agent_id", &self.agent_id)
            .field("queue_mode", &self.queue_mode)
            .field("engine", &self.engine)
            .field("delivery_attempts", &self.delivery_attempts)
            .field("progress_delay_ms", &self.progress_delay_ms)
            .finish()
    }
}

mod defaults {
    pub(super) fn api_base_url() -> String {
        crate::telegram::api::DEFAULT_BASE_URL.to_owned()
    }
    pub(super) fn poll_timeout_s() -> u64 {
        30
    }
    pub(super) fn agent_id() -> String {
        "default".to_owned()
    }
    pub(super) fn delivery_attempts() -> u32 {
        10
    }
    pub(super) fn progress_delay_ms() -> u64 {
        1000
    }
}

/// A `[gateway.telegram]` that cannot be used; the message names the key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid [gateway.telegram]: {0}")]
pub struct TelegramConfigError(pub String);

impl TelegramConfig {
    /// Parses the raw section and checks what serde cannot.
    ///
    /// # Errors
    /// A wrong type, an unknown key, no token source, a bad URL or number.
    pub fn parse(table: &toml::Table) -> Result<Self, TelegramConfigError> {
        let (config, _) = TelegramConfig::parse_values(table)?;
        let inline = config.bot_token.as_deref().is_some_and(|t| !t.trim().is_empty());
        if !inline && config.bot_token_secret.is_none() {
            return Err(TelegramConfigError("set bot_token or bot_token_secret".into()));
        }
        Ok(config)
    }

    /// Parses the raw section's types and values, with the keys it does not
    /// know (ignored), each with the closest known key; a section that is
    /// switched off is checked this far, so a mistake in it is found before it
    /// is switched on. A token source is required only by [`TelegramConfig::parse`].
    ///
    /// # Errors
    /// A wrong type, a bad URL or number.
    pub fn parse_values(
        table: &toml::Table,
    ) -> Result<(Self, Vec<UnknownKey>), TelegramConfigError> {
        let (config, unknown) = parse_section::<TelegramConfig>(table)
            .map_err(|err| TelegramConfigError(err.to_string()))?;
        let url = config.api_base_url.trim();
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(TelegramConfigError(format!(
                "api_base_url: {url:?} is not an http(s) URL"
            )));
        }
        if config.poll_timeout_s > 300 {
            return Err(TelegramConfigError("poll_timeout_s: at most 300 seconds".into()));
        }
        if config.delivery_attempts == 0 {
            return Err(TelegramConfigError("delivery_attempts must be at least 1".into()));
        }
        let agent = config.agent_id.trim();
        if agent.is_empty() || agent.contains(char::is_whitespace) || agent.contains(':') {
            return Err(TelegramConfigError(format!(
                "agent_id: {agent:?} must be a non-empty word without ':'"
            )));
        }
        Ok((config, unknown))
    }

    pub fn poll_timeout(&self) -> Duration {
        Duration::from_secs(self.poll_timeout_s)
    }

    pub fn progress_delay(&self) -> Duration {
        Duration::from_millis(self.progress_delay_ms)
    }

    /// The bot token: inline, or read from the secret store.
    ///
    /// # Errors
    /// A secret that is not set or cannot be read; a blank token.
    pub fn resolve_token(&self, secrets: &SecretStore) -> Result<String, TelegramConfigError> {
        lemon_core::transport::inline_or_secret(
            "bot_token",
            self.bot_token.as_deref(),
            self.bot_token_secret.as_deref(),
            secrets,
        )
        .map_err(TelegramConfigError)
    }

    /// Whether `chat_id` is in `allowed_chat_ids` (an empty list has nobody;
    /// `allow_everyone` and bindings are checked by the caller).
    pub fn chat_listed(&self, chat_id: i64) -> bool {
        self.allowed_chat_ids.contains(&chat_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<TelegramConfig, TelegramConfigError> {
        TelegramConfig::parse(&text.parse::<toml::Table>().expect("toml"))
    }

    #[test]
    fn defaults_fill_everything_but_the_token() {
        let config = parse("bot_token = \"123:abc\"").expect("parses");
        assert_eq!(config.api_base_url, crate::telegram::api::DEFAULT_BASE_URL);
        assert_eq!(config.poll_timeout_s, 30);
        assert_eq!(config.agent_id, "default");
        assert!(config.allowed_chat_ids.is_empty());
        assert!(!config.allow_everyone);
        assert!(!config.chat_listed(-100_123), "an empty list has nobody");
        assert!(!config.chat_listed(1001));
    }

    #[test]
    fn a_token_source_is_required() {
        let err = parse("agent_id = \"x\"").expect_err("no token");
        assert!(err.to_string().contains("bot_token"), "{err}");
    }

    #[test]
    fn unknown_keys_are_suggested_and_bad_values_are_named() {
        // An unknown key is ignored with a suggestion (it was an error before).
        let table = "bot_token = \"1:a\"\npoll_timeout = 3".parse::<toml::Table>().unwrap();
        let (_, unknown) = TelegramConfig::parse_values(&table).expect("unknown keys are ignored");
        assert_eq!(
            unknown,
            [UnknownKey {
                path: vec!["poll_timeout".into()],
                suggestion: Some("poll_timeout_s".into())
            }]
        );
        // Types and values are checked without a token, as for a section switched off.
        let off = "enabled = false\nallowed_chat_ids = 5".parse::<toml::Table>().unwrap();
        let err = TelegramConfig::parse_values(&off).expect_err("wrong type");
        assert!(err.to_string().contains("allowed_chat_ids"), "{err}");
        let err = parse("bot_token = \"1:a\"\napi_base_url = \"ftp://x\"").expect_err("bad url");
        assert!(err.to_string().contains("api_base_url"), "{err}");
        let err = parse("bot_token = \"1:a\"\nagent_id = \"a:b\"").expect_err("bad agent");
        assert!(err.to_string().contains("agent_id"), "{err}");
    }

    #[test]
    fn allowed_chat_ids_restrict_chats() {
        let config = parse("bot_token = \"1:a\"\nallowed_chat_ids = [42, -100]").expect("parses");
        assert!(config.chat_listed(42));
        assert!(config.chat_listed(-100));
        assert!(!config.chat_listed(7));
        let open = parse("bot_token = \"1:a\"\nallow_everyone = true").expect("parses");
        assert!(open.allow_everyone);
    }

    #[test]
    fn the_token_comes_inline_or_from_a_secret_and_errors_never_show_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let env = [("TG_TOKEN".to_owned(), " 77:from-the-env ".to_owned())].into();
        let secrets = SecretStore::new(env, dir.path().join("secrets.toml"));
        let inline = parse("bot_token = \"1:inline\"\nbot_token_secret = \"tg_token\"").unwrap();
        assert_eq!(inline.resolve_token(&secrets).unwrap(), "1:inline");
        let named = parse("bot_token_secret = \"tg_token\"").unwrap();
        assert_eq!(named.resolve_token(&secrets).unwrap(), "77:from-the-env");
        let missing = parse("bot_token_secret = \"other_token\"").unwrap();
        let err = missing.resolve_token(&secrets).unwrap_err().to_string();
        assert!(err.contains("bot_token_secret") && err.contains("other_token"), "{err}");
        assert!(!err.contains("from-the-env"));
    }

    #[test]
    fn debug_output_hides_the_token() {
        let config = parse("bot_token = \"123:very-secret\"").expect("parses");
        assert!(!format!("{config:?}").contains("very-secret"));
    }
}
