//! `[gateway.telegram]`: the raw TOML section parsed into typed settings.

use lemon_core::ids::EngineRef;
use std::time::Duration;

use lemon_core::config::{
    parse_section, KeyNote, QueueMode, ReferenceKey, Translation, UnknownKey,
};
use lemon_core::secrets::SecretStore;
use serde::{Deserialize, Deserializer};

use super::types::MAX_TEXT_UTF16;

/// `[gateway.telegram]`: a Telegram bot, polling the Bot API for messages.
/// Every chat gets a conversation of its own (a forum topic too); only the
/// chats listed in `allowed_chat_ids` may start runs. A config written for
/// the reference gateway is read with the reference's meaning of its keys
/// (its `token` is `bot_token`).
#[derive(Clone, Deserialize, schemars::JsonSchema)]
#[schemars(transform = reference_keys_schema)]
pub struct TelegramConfig {
    /// Switches the channel on or off, over `[gateway] enable_telegram`.
    /// Unset: as `enable_telegram` says, else off.
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
    /// The Bot API's base URL (a local Bot API server, or a test fake).
    #[serde(default = "defaults::api_base_url")]
    #[schemars(pattern(r"^https?://"))]
    pub api_base_url: String,
    /// How long one `getUpdates` call waits for news, in seconds.
    #[serde(default = "defaults::poll_timeout_s")]
    #[schemars(range(max = 300))]
    pub poll_timeout_s: u64,
    /// The agent part of session keys: a word without `:`.
    #[serde(default = "defaults::agent_id")]
    #[schemars(pattern(r"^[^:\s]+$"))]
    pub agent_id: String,
    /// The chats' queue mode unless a binding sets one.
    #[serde(default)]
    pub queue_mode: Option<QueueMode>,
    /// The engine unless a binding, a directive or `/engine` picks one.
    #[serde(default)]
    pub engine: Option<EngineRef>,
    /// How many times a final answer is sent before it is recorded as undelivered.
    #[serde(default = "defaults::delivery_attempts")]
    #[schemars(range(min = 1))]
    pub delivery_attempts: u32,
    /// A run that ends sooner than this, in milliseconds, gets no progress
    /// message, only its answer.
    #[serde(default = "defaults::progress_delay_ms")]
    pub progress_delay_ms: u64,
    /// Least time between two edits of a progress message, in milliseconds:
    /// changes in between are merged into the next edit, and the last edit
    /// (the run's end) is never held back. Edits are never faster than
    /// Telegram's one call a second per chat, whatever this says.
    #[serde(default = "defaults::edit_throttle_ms")]
    #[schemars(range(max = MAX_PAUSE_MS))]
    pub edit_throttle_ms: u64,
    /// Messages a chat (or forum topic) sends less than this many
    /// milliseconds apart are one prompt: joined with line breaks, in order,
    /// submitted once the chat has been quiet this long. `0` (the default)
    /// submits every message at once. A message starting with `/` is never
    /// merged: it first submits what is waiting, then goes on its own.
    #[serde(default)]
    #[schemars(range(max = MAX_PAUSE_MS))]
    pub debounce_ms: u64,
    /// Whether answers (and the progress message) end with the line that
    /// resumes the session (`` `claude --resume …` ``). Replying to an answer
    /// continues its session either way.
    #[serde(default = "defaults::yes")]
    pub show_resume_line: bool,
    /// Whether answers are sent formatted (code blocks and inline code as
    /// Telegram code); `false` sends the engine's text as it is, plain.
    #[serde(default = "defaults::yes")]
    pub use_markdown: bool,
    /// A message sent when the bot starts to every chat that may talk to it
    /// (those in `allowed_chat_ids`; with `allow_everyone`, the bound ones
    /// too; with `deny_unbound_chats`, only bound ones): `true` for a
    /// standard one, or the text itself; `false` (the default) for none.
    #[serde(default)]
    #[schemars(schema_with = "startup_message_schema", extend("default" = false))]
    pub startup_message: StartupMessage,
    /// At start, the messages that came while the bot was offline are
    /// skipped (Telegram drops them), unless `offset` says where to start.
    #[serde(default)]
    pub drop_pending_updates: bool,
    /// The pause, in milliseconds, before the next `getUpdates` call after
    /// one that brought nothing (each call already waits `poll_timeout_s` for
    /// news) or failed (then the longer of this and the backoff).
    #[serde(default)]
    #[schemars(range(max = MAX_PAUSE_MS))]
    pub poll_interval_ms: u64,
    /// Whether a message may choose its own queue mode with a leading
    /// `/steer`, `/followup`, `/interrupt` or `/redirect` (also `!redirect`);
    /// when false such a message is plain text for the engine.
    #[serde(default)]
    pub allow_queue_override: bool,
    /// The bot's user id (the number before `:` in its token). Optional: the
    /// bot learns it from Telegram at start; when set, a token of another bot
    /// is refused with both ids named.
    #[serde(default)]
    #[schemars(range(min = 1))]
    pub bot_id: Option<i64>,
    /// The bot's `@username` (with or without `@`), by which group messages
    /// address it (`@name …`, `/cmd@name`). Optional: the bot learns it from
    /// Telegram at start; when set, a token of another bot is refused.
    #[serde(default)]
    pub bot_username: Option<String>,
    /// The account part of the chats' session keys
    /// (`agent:<agent_id>:telegram:<account_id>:dm:<chat>`); the bot's user
    /// id when not set. Set it to keep the chats' sessions when the bot (its
    /// token) changes.
    #[serde(default)]
    pub account_id: Option<String>,
    /// The update to start from when it is ahead of where the bot left off:
    /// updates below it are skipped for good (Telegram's `getUpdates`
    /// offset). `0` (the default) starts where the bot left off.
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub offset: i64,
    /// The reference layout's context compaction of Telegram sessions:
    /// accepted, and `config check` says what happens instead. Telegram
    /// chats are compacted by their engine, like every session (the native
    /// engine compacts at 90% of `[gateway.engines.lemon] context_window`).
    #[serde(default)]
    #[schemars(extend("deprecated" = true))]
    pub compaction: Option<CompactionConfig>,
    /// `[gateway.telegram.files]`: photos, documents and other files sent to
    /// the bot (who may, how large, which names are refused, where they are
    /// saved, how long an album waits).
    #[serde(default)]
    pub files: lemon_core::media::FilesConfig,
    /// The voice keys (`voice_transcription`, …), read by
    /// [`VoiceConfig::split`](crate::media::VoiceConfig::split).
    #[serde(skip)]
    #[schemars(!skip, flatten)]
    pub voice: crate::media::VoiceConfig,
}

/// `startup_message` in the schema: a switch or the text.
fn startup_message_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({ "type": ["boolean", "string"], "minLength": 1 })
}

/// The reference layout's keys in the section's schema.
fn reference_keys_schema(schema: &mut schemars::Schema) {
    lemon_core::config::schema::add_reference_keys(schema, REFERENCE_KEYS);
}

/// `startup_message`: none, the standard text, or a text of one's own.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum StartupMessage {
    #[default]
    Off,
    Standard,
    Text(String),
}

/// What `startup_message = true` sends.
pub const STANDARD_STARTUP_MESSAGE: &str =
    "Lemon Gateway is up. Send a message to start a job; /help lists the commands.";

impl StartupMessage {
    /// The text to send, if any.
    pub fn text(&self) -> Option<&str> {
        match self {
            StartupMessage::Off => None,
            StartupMessage::Standard => Some(STANDARD_STARTUP_MESSAGE),
            StartupMessage::Text(text) => Some(text),
        }
    }
}

impl<'de> Deserialize<'de> for StartupMessage {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Expect;
        impl serde::de::Visitor<'_> for Expect {
            type Value = StartupMessage;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("true, false or the message's text")
            }
            fn visit_bool<E: serde::de::Error>(self, on: bool) -> Result<StartupMessage, E> {
                Ok(if on { StartupMessage::Standard } else { StartupMessage::Off })
            }
            fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<StartupMessage, E> {
                Ok(StartupMessage::Text(text.to_owned()))
            }
        }
        deserializer.deserialize_any(Expect)
    }
}

/// `[gateway.telegram.compaction]`, as the reference layout writes it:
/// accepted and checked, without effect here.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, schemars::JsonSchema)]
pub struct CompactionConfig {
    /// The reference layout's switch.
    #[serde(default)]
    pub enabled: Option<bool>,
    /// The context window, in tokens.
    #[serde(default)]
    #[schemars(range(min = 1))]
    pub context_window_tokens: Option<u64>,
    /// Tokens kept free for the answer.
    #[serde(default)]
    #[schemars(range(min = 1))]
    pub reserve_tokens: Option<u64>,
    /// The share of the window that starts a compaction (above 0, at most 1).
    #[serde(default)]
    #[schemars(range(min = 0, max = 1))]
    pub trigger_ratio: Option<f64>,
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
            .field("edit_throttle_ms", &self.edit_throttle_ms)
            .field("debounce_ms", &self.debounce_ms)
            .field("show_resume_line", &self.show_resume_line)
            .field("use_markdown", &self.use_markdown)
            .field("startup_message", &self.startup_message)
            .field("drop_pending_updates", &self.drop_pending_updates)
            .field("poll_interval_ms", &self.poll_interval_ms)
            .field("allow_queue_override", &self.allow_queue_override)
            .field("bot_id", &self.bot_id)
            .field("bot_username", &self.bot_username)
            .field("account_id", &self.account_id)
            .field("offset", &self.offset)
            .field("compaction", &self.compaction)
            .field("files", &self.files)
            .field("voice", &self.voice)
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
    pub(super) fn edit_throttle_ms() -> u64 {
        1000
    }
    pub(super) fn yes() -> bool {
        true
    }
}

/// The reference's keys read as ours: it also takes the token as `token`.
const REFERENCE_KEYS: &[ReferenceKey] =
    &[ReferenceKey::Alias { theirs: "token", ours: "bot_token" }];

/// What `config check` says of `[gateway.telegram.compaction]`.
pub const COMPACTION_NOTE: &str = "accepted; Telegram chats are compacted by their engine, like \
    every session: the native engine compacts a conversation estimated over 90% of \
    [gateway.engines.lemon] context_window (set the window there)";

/// The longest `edit_throttle_ms`, `debounce_ms` and `poll_interval_ms`: ten minutes.
const MAX_PAUSE_MS: u64 = 600_000;

/// A word that can be a part of a session key: not empty, no whitespace, no `:`.
fn is_key_word(word: &str) -> bool {
    !word.is_empty() && !word.contains(char::is_whitespace) && !word.contains(':')
}

/// The bot id a token starts with (`123456:ABC…` → 123456).
fn bot_id_of_token(token: &str) -> Option<i64> {
    token.trim().split_once(':')?.0.parse().ok()
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
        // An inline token names its bot: a bot_id that disagrees is a mistake
        // found now rather than at start.
        let token_bot = config.bot_token.as_deref().and_then(bot_id_of_token);
        if let (Some(configured), Some(token_bot)) = (config.bot_id, token_bot) {
            if configured != token_bot {
                return Err(TelegramConfigError(format!(
                    "bot_id: {configured} is not the bot of bot_token (bot {token_bot})"
                )));
            }
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
        let (voice, table) =
            crate::media::VoiceConfig::split(table).map_err(TelegramConfigError)?;
        let translated = Translation::new(&table, REFERENCE_KEYS);
        let (mut config, mut unknown) = parse_section::<TelegramConfig>(&translated.table)
            .map_err(|err| TelegramConfigError(translated.in_file(err).to_string()))?;
        config.voice = voice;
        crate::media::VoiceConfig::suggest(&mut unknown);
        if let Some(problem) = config.files.check().into_iter().next() {
            return Err(TelegramConfigError(format!("files.{problem}")));
        }
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
        if !is_key_word(agent) {
            return Err(TelegramConfigError(format!(
                "agent_id: {agent:?} must be a non-empty word without ':'"
            )));
        }
        for (key, value) in [
            ("edit_throttle_ms", config.edit_throttle_ms),
            ("debounce_ms", config.debounce_ms),
            ("poll_interval_ms", config.poll_interval_ms),
            ("files.media_group_debounce_ms", config.files.media_group_debounce_ms),
        ] {
            if value > MAX_PAUSE_MS {
                return Err(TelegramConfigError(format!(
                    "{key}: at most {MAX_PAUSE_MS} milliseconds (ten minutes)"
                )));
            }
        }
        if let StartupMessage::Text(text) = &config.startup_message {
            if text.trim().is_empty() {
                return Err(TelegramConfigError(
                    "startup_message: the text is empty; use false to send none".into(),
                ));
            }
            if super::format::utf16_len(text) > MAX_TEXT_UTF16 {
                return Err(TelegramConfigError(format!(
                    "startup_message: longer than one Telegram message ({MAX_TEXT_UTF16} UTF-16 units)"
                )));
            }
        }
        if config.bot_id.is_some_and(|id| id <= 0) {
            return Err(TelegramConfigError("bot_id: a bot's id is a positive number".into()));
        }
        if let Some(name) = &config.bot_username {
            let bare = name.trim().trim_start_matches('@');
            if bare.is_empty() || !bare.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                return Err(TelegramConfigError(format!(
                    "bot_username: {name:?} is not a Telegram username (letters, digits and _)"
                )));
            }
        }
        if let Some(account) = &config.account_id {
            if !is_key_word(account.trim()) {
                return Err(TelegramConfigError(format!(
                    "account_id: {account:?} must be a non-empty word without ':'"
                )));
            }
        }
        if config.offset < 0 {
            return Err(TelegramConfigError(
                "offset: 0 or more (drop_pending_updates skips what is waiting)".into(),
            ));
        }
        if let Some(compaction) = &config.compaction {
            for (key, value) in [
                ("context_window_tokens", compaction.context_window_tokens),
                ("reserve_tokens", compaction.reserve_tokens),
            ] {
                if value == Some(0) {
                    return Err(TelegramConfigError(format!("compaction.{key}: at least 1 token")));
                }
            }
            if let Some(ratio) = compaction.trigger_ratio {
                if !(ratio > 0.0 && ratio <= 1.0) {
                    return Err(TelegramConfigError(format!(
                        "compaction.trigger_ratio: {ratio} is not a share above 0 and at most 1"
                    )));
                }
            }
        }
        Ok((config, unknown))
    }

    /// What the section's reference keys do where that is worth saying, for
    /// `config check` (never "ignored"); paths are inside the section.
    pub fn reference_notes(table: &toml::Table) -> Vec<KeyNote> {
        let mut notes = Translation::new(table, REFERENCE_KEYS).notes;
        if table.contains_key("compaction") {
            notes.push(KeyNote::new(&["compaction"], COMPACTION_NOTE));
        }
        notes
    }

    pub fn edit_throttle(&self) -> Duration {
        Duration::from_millis(self.edit_throttle_ms)
    }

    pub fn debounce(&self) -> Duration {
        Duration::from_millis(self.debounce_ms)
    }

    pub fn poll_interval(&self) -> Duration {
        Duration::from_millis(self.poll_interval_ms)
    }

    /// `bot_username` without its `@`.
    pub fn bot_username(&self) -> Option<&str> {
        self.bot_username.as_deref().map(|name| name.trim().trim_start_matches('@'))
    }

    /// The offset to start polling from, given the one the bot saved: the
    /// configured one when it is ahead.
    pub fn start_offset(&self, saved: Option<i64>) -> Option<i64> {
        let configured = (self.offset > 0).then_some(self.offset);
        match (saved, configured) {
            (Some(saved), Some(configured)) => Some(saved.max(configured)),
            (saved, configured) => saved.or(configured),
        }
    }

    /// Whether pending updates are dropped at start: asked for, and no
    /// `offset` says where to start instead.
    pub fn drops_pending_updates(&self) -> bool {
        self.drop_pending_updates && self.offset <= 0
    }

    /// Why the bot behind the token (as `getMe` gives it) is not the one
    /// `bot_id` / `bot_username` name, if it is not.
    pub fn identity_mismatch(&self, id: i64, username: Option<&str>) -> Option<String> {
        let name = username.unwrap_or_default();
        if let Some(configured) = self.bot_id.filter(|configured| *configured != id) {
            return Some(format!(
                "bot_id {configured} in [gateway.telegram] is not the token's bot (@{name}, id {id}): correct bot_id or the token"
            ));
        }
        if let Some(configured) =
            self.bot_username().filter(|configured| !configured.eq_ignore_ascii_case(name))
        {
            return Some(format!(
                "bot_username @{configured} in [gateway.telegram] is not the token's bot (@{name}, id {id}): correct bot_username or the token"
            ));
        }
        None
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
    fn the_files_section_and_the_voice_keys_are_read_and_checked() {
        let config = parse(
            "bot_token = \"123:abc\"\nvoice_transcription = true\n\
             voice_transcription_base_url = \"http://127.0.0.1:9/v1\"\n\
             voice_transcription_api_key = \"sk-inline\"\nvoice_max_bytes = 2048\n\
             show_transcript = true\n\
             [files]\nmax_download_bytes = 1024\nallowed_user_ids = [1001]\n\
             auto_put_mode = \"upload\"\nmedia_group_debounce_ms = 250\n",
        )
        .expect("parses");
        assert!(config.voice.voice_transcription && config.voice.show_transcript);
        assert_eq!(config.voice.voice_max_bytes, 2048);
        assert_eq!(config.files.max_download_bytes, 1024);
        assert!(config.files.user_allowed("1001") && !config.files.user_allowed("1002"));
        assert_eq!(config.files.auto_put_mode, lemon_core::media::AutoPutMode::Upload);
        assert_eq!(config.files.media_group_debounce_ms, 250);
        assert!(!format!("{config:?}").contains("sk-inline"), "the key is redacted");
        let defaults = parse("bot_token = \"123:abc\"").unwrap();
        assert!(defaults.files.enabled && defaults.files.auto_put);
        assert!(!defaults.voice.voice_transcription);
        let problem = |text: &str| parse(&format!("bot_token = \"1:a\"\n{text}")).unwrap_err().0;
        assert!(problem("voice_max_bytes = 0").contains("voice_max_bytes"));
        assert!(problem("[files]\ndeny_globs = [\"a[\"]").starts_with("files.deny_globs"));
        assert!(problem("[files]\nmedia_group_debounce_ms = 999999")
            .contains("files.media_group_debounce_ms"));
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

    /// Every key of the reference's `[gateway.telegram]` this transport reads
    /// (voice and files are another part's).
    const REFERENCE_KEYS: &str = r#"
bot_token = "123456:abc"
bot_id = 123456
bot_username = "@lemon_bot"
allowed_chat_ids = [12345678]
deny_unbound_chats = false
startup_message = true
poll_interval_ms = 1000
edit_throttle_ms = 1000
debounce_ms = 1000
show_resume_line = true
use_markdown = true
allow_queue_override = false
account_id = "default"
offset = 0
drop_pending_updates = false
[compaction]
enabled = true
context_window_tokens = 123000
reserve_tokens = 12000
trigger_ratio = 0.88
"#;

    #[test]
    fn a_reference_section_parses_without_unknown_keys() {
        let table = REFERENCE_KEYS.parse::<toml::Table>().expect("toml");
        let (config, unknown) = TelegramConfig::parse_values(&table).expect("parses");
        assert_eq!(unknown, [], "every key is known");
        assert_eq!(config.bot_id, Some(123_456));
        assert_eq!(config.bot_username(), Some("lemon_bot"));
        assert_eq!(config.startup_message, StartupMessage::Standard);
        assert_eq!(config.edit_throttle(), Duration::from_secs(1));
        assert_eq!(config.debounce(), Duration::from_secs(1));
        assert_eq!(config.poll_interval(), Duration::from_secs(1));
        assert_eq!(config.account_id.as_deref(), Some("default"));
        let compaction = config.compaction.clone().expect("compaction");
        assert_eq!(compaction.trigger_ratio, Some(0.88));
        assert_eq!(compaction.context_window_tokens, Some(123_000));
        // What happens to compaction is said plainly, never as "ignored".
        let notes = TelegramConfig::reference_notes(&table);
        assert_eq!(notes.len(), 1);
        assert_eq!(notes[0].path, ["compaction"]);
        assert!(notes[0].message.contains("context_window"), "{}", notes[0].message);
        assert!(!notes[0].message.contains("ignored"), "{}", notes[0].message);
        let plain = "bot_token = \"1:a\"".parse::<toml::Table>().unwrap();
        assert!(TelegramConfig::reference_notes(&plain).is_empty());
    }

    #[test]
    fn the_references_token_is_bot_token_and_ours_wins() {
        let config = parse("token = \"9:from-token\"").expect("token is the bot token");
        assert_eq!(config.bot_token.as_deref(), Some("9:from-token"));
        let both = "bot_token = \"9:ours\"\ntoken = \"9:theirs\"".parse::<toml::Table>().unwrap();
        let (config, unknown) = TelegramConfig::parse_values(&both).unwrap();
        assert_eq!((config.bot_token.as_deref(), unknown.len()), (Some("9:ours"), 0));
        let notes = TelegramConfig::reference_notes(&both);
        assert_eq!(notes.len(), 1);
        assert_eq!(notes[0].path, ["token"]);
        assert!(notes[0].message.contains("`bot_token` is used"), "{}", notes[0].message);
        assert!(!notes[0].message.contains("theirs"), "the token is never shown");
        let err = parse("token = 5").unwrap_err().to_string();
        assert!(err.contains("`token`"), "{err}");
    }

    #[test]
    fn the_new_keys_default_to_todays_behaviour() {
        let config = parse("bot_token = \"1:a\"").expect("parses");
        assert_eq!(config.edit_throttle_ms, 1000);
        assert_eq!(config.debounce_ms, 0, "messages are not held back unless asked");
        assert!(config.show_resume_line);
        assert!(config.use_markdown);
        assert_eq!(config.startup_message, StartupMessage::Off);
        assert_eq!(config.startup_message.text(), None);
        assert!(!config.drop_pending_updates && !config.drops_pending_updates());
        assert_eq!(config.poll_interval_ms, 0);
        assert!(!config.allow_queue_override);
        assert_eq!(
            (config.bot_id, config.bot_username(), config.account_id.as_deref()),
            (None, None, None)
        );
        assert_eq!(config.start_offset(None), None);
        assert_eq!(config.start_offset(Some(40)), Some(40));
    }

    #[test]
    fn startup_message_is_a_switch_or_a_text() {
        let check = |value: &str, expected: Option<&str>| {
            let config = parse(&format!("bot_token = \"1:a\"\nstartup_message = {value}"))
                .unwrap_or_else(|e| panic!("{value}: {e}"));
            assert_eq!(config.startup_message.text(), expected, "{value}");
        };
        check("false", None);
        check("true", Some(STANDARD_STARTUP_MESSAGE));
        check("\"Back online\"", Some("Back online"));
        let err = parse("bot_token = \"1:a\"\nstartup_message = \" \"").unwrap_err();
        assert!(err.to_string().contains("startup_message"), "{err}");
        let err = parse("bot_token = \"1:a\"\nstartup_message = 3").unwrap_err();
        assert!(err.to_string().contains("true, false or the message's text"), "{err}");
    }

    #[test]
    fn an_offset_ahead_of_the_saved_one_wins_and_stops_dropping() {
        let config =
            parse("bot_token = \"1:a\"\noffset = 50\ndrop_pending_updates = true").expect("parses");
        assert_eq!(config.start_offset(None), Some(50));
        assert_eq!(config.start_offset(Some(40)), Some(50));
        assert_eq!(config.start_offset(Some(60)), Some(60), "never back to updates handled");
        assert!(!config.drops_pending_updates(), "the offset says where to start");
        let dropping =
            parse("bot_token = \"1:a\"\ndrop_pending_updates = true\noffset = 0").unwrap();
        assert!(dropping.drops_pending_updates());
    }

    #[test]
    fn the_bot_named_must_be_the_tokens() {
        let err = parse("bot_token = \"77:abc\"\nbot_id = 78").unwrap_err().to_string();
        assert!(err.contains("bot_id") && err.contains("78") && err.contains("77"), "{err}");
        assert!(!err.contains("abc"), "the token is never shown: {err}");
        let config = parse("bot_token_secret = \"t\"\nbot_id = 78\nbot_username = \"Lemon_Bot\"")
            .expect("a secret's token is checked at start");
        assert_eq!(config.identity_mismatch(78, Some("lemon_bot")), None);
        let other = config.identity_mismatch(79, Some("lemon_bot")).expect("another bot");
        assert!(other.contains("bot_id 78") && other.contains("id 79"), "{other}");
        let renamed = config.identity_mismatch(78, Some("other_bot")).expect("another name");
        assert!(renamed.contains("@Lemon_Bot") && renamed.contains("@other_bot"), "{renamed}");
    }

    #[test]
    fn bad_values_of_the_new_keys_are_named() {
        for (line, key) in [
            ("debounce_ms = 600001", "debounce_ms"),
            ("edit_throttle_ms = 900000", "edit_throttle_ms"),
            ("poll_interval_ms = -1", "poll_interval_ms"),
            ("offset = -5", "offset"),
            ("bot_id = 0", "bot_id"),
            ("bot_username = \"not a name\"", "bot_username"),
            ("account_id = \"a:b\"", "account_id"),
            ("use_markdown = \"yes\"", "use_markdown"),
            ("[compaction]\ntrigger_ratio = 1.5", "compaction.trigger_ratio"),
            ("[compaction]\nreserve_tokens = 0", "compaction.reserve_tokens"),
            ("[compaction]\nenabled = 1", "compaction"),
        ] {
            let err = parse(&format!("bot_token = \"1:a\"\n{line}")).expect_err(line);
            assert!(err.to_string().contains(key), "{line}: {err}");
        }
    }

    #[test]
    fn debug_output_hides_the_token() {
        let config = parse("bot_token = \"123:very-secret\"").expect("parses");
        assert!(!format!("{config:?}").contains("very-secret"));
    }
}
