//! `[gateway.discord]`: the raw TOML section parsed into typed settings.

use std::time::Duration;

use lemon_core::config::{
    parse_section, KeyNote, QueueMode, ReferenceKey, Translation, UnknownKey,
};
use lemon_core::ids::EngineRef;
use lemon_core::secrets::SecretStore;
use serde::{Deserialize, Deserializer};

use super::types::Snowflake;

/// Discord's Gateway, the URL a bot connects to.
pub const DEFAULT_GATEWAY_URL: &str = "wss://gateway.discord.gg";
/// Discord's REST API, version 10.
pub const DEFAULT_API_BASE_URL: &str = "https://discord.com/api/v10";
/// The secret the bot token is read from unless `bot_token_secret` names another.
pub const DEFAULT_TOKEN_SECRET: &str = "discord_bot_token";

/// `[gateway.discord]`: a Discord bot on the Gateway WebSocket, answering
/// in server channels and direct messages; only the servers, channels and
/// users listed may start runs. The reference layout's
/// `deny_unbound_channels` is read as `deny_unbound`.
#[derive(Clone, Deserialize, schemars::JsonSchema)]
#[schemars(transform = reference_keys_schema)]
pub struct DiscordConfig {
    /// Switches the channel on or off, over `[gateway] enable_discord`.
    /// Unset: as `enable_discord` says, else off.
    #[serde(default)]
    pub enabled: Option<bool>,
    /// The bot token, inline (a secret is better). Never logged.
    #[serde(default)]
    pub bot_token: Option<String>,
    /// The name of the secret holding the bot token.
    #[serde(default = "defaults::bot_token_secret")]
    pub bot_token_secret: String,
    /// The application whose commands are registered; taken from the
    /// gateway's READY when not set.
    #[serde(default, deserialize_with = "optional_snowflake")]
    #[schemars(schema_with = "lemon_core::config::schema::integer_or_string")]
    pub application_id: Option<Snowflake>,
    /// Servers whose channels may start runs. A server message needs its
    /// server here or its channel in `allowed_channel_ids` (both lists set:
    /// both); all three lists empty lets nobody in.
    #[serde(default, deserialize_with = "snowflakes")]
    #[schemars(schema_with = "snowflake_list")]
    pub allowed_guild_ids: Vec<Snowflake>,
    /// Server channels (a thread counts as its parent) that may start runs.
    #[serde(default, deserialize_with = "snowflakes")]
    #[schemars(schema_with = "snowflake_list")]
    pub allowed_channel_ids: Vec<Snowflake>,
    /// Users who may start runs: a direct message needs its author here; in
    /// a server, when set, the author must be here too.
    #[serde(default, deserialize_with = "snowflakes")]
    #[schemars(schema_with = "snowflake_list")]
    pub allowed_user_ids: Vec<Snowflake>,
    /// Every server, channel and user may start runs, whatever the lists say:
    /// a public bot. Warned about at every start and shown in status.
    #[serde(default)]
    pub allow_everyone: bool,
    /// Channels without a `[[gateway.bindings]]` entry for `transport =
    /// "discord"` get no run. The reference's `deny_unbound_channels` is read
    /// as this (where both are written, this is used).
    #[serde(default)]
    pub deny_unbound: bool,
    /// In servers, only messages that mention the bot (or reply to it) start
    /// runs; direct messages always do.
    #[serde(default = "defaults::yes")]
    pub mention_required: bool,
    /// Discord's Gateway, the WebSocket the bot connects to (a test fake).
    #[serde(default = "defaults::gateway_url")]
    #[schemars(pattern(r"^wss?://"))]
    pub gateway_url: String,
    /// Discord's REST API (a test fake).
    #[serde(default = "defaults::api_base_url")]
    #[schemars(pattern(r"^https?://"))]
    pub api_base_url: String,
    /// The agent part of session keys: a word without `:`.
    #[serde(default = "defaults::agent_id")]
    #[schemars(pattern(r"^[^:\s]+$"))]
    pub agent_id: String,
    /// The channels' queue mode unless a binding sets one.
    #[serde(default)]
    pub queue_mode: Option<QueueMode>,
    /// The engine unless a binding, a directive or `/engine` picks one.
    #[serde(default)]
    pub engine: Option<EngineRef>,
    /// The largest file of an answer sent as an attachment, in bytes;
    /// larger ones are not attached.
    #[serde(default = "defaults::max_upload_bytes")]
    #[schemars(range(min = 1))]
    pub max_upload_bytes: u64,
    /// Least time between two calls to one channel (sends and edits), in
    /// milliseconds, so a streamed answer is a few edits a second at most.
    #[serde(default = "defaults::edit_interval_ms")]
    #[schemars(range(min = 50, max = 60_000))]
    pub edit_interval_ms: u64,
    /// How many times an answer is sent before it is recorded as undelivered.
    #[serde(default = "defaults::delivery_attempts")]
    #[schemars(range(min = 1))]
    pub delivery_attempts: u32,
    /// How long one REST call may take; one that takes longer counts as
    /// failed and is made again (a message create with the same nonce, so it
    /// shows once even if Discord had made it). In milliseconds.
    #[serde(default = "defaults::api_timeout_ms")]
    #[schemars(range(min = 100, max = 600_000))]
    pub api_timeout_ms: u64,
    /// `[gateway.discord.files]`: files sent with a message (who may, how
    /// large, which names are refused, where they are saved).
    #[serde(default)]
    pub files: lemon_core::media::FilesConfig,
    /// The voice keys (`voice_transcription`, …), read by
    /// [`VoiceConfig::split`](crate::media::VoiceConfig::split).
    #[serde(skip)]
    #[schemars(!skip, flatten)]
    pub voice: crate::media::VoiceConfig,
}

/// A list of Discord ids, each a number or a string of digits.
fn snowflake_list(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "array",
        "items": { "type": ["integer", "string"] },
        "default": [],
    })
}

/// The reference layout's keys in the section's schema.
fn reference_keys_schema(schema: &mut schemars::Schema) {
    lemon_core::config::schema::add_reference_keys(schema, REFERENCE_KEYS);
}

impl std::fmt::Debug for DiscordConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiscordConfig")
            .field("enabled", &self.enabled)
            .field("bot_token", &self.bot_token.as_ref().map(|_| "<redacted>"))
            .field("bot_token_secret", &self.bot_token_secret)
            .field("application_id", &self.application_id)
            .field("allowed_guild_ids", &self.allowed_guild_ids)
            .field("allowed_channel_ids", &self.allowed_channel_ids)
            .field("allowed_user_ids", &self.allowed_user_ids)
            .field("allow_everyone", &self.allow_everyone)
            .field("deny_unbound", &self.deny_unbound)
            .field("mention_required", &self.mention_required)
            .field("gateway_url", &self.gateway_url)
            .field("api_base_url", &self.api_base_url)
            .field("agent_id", &self.agent_id)
            .field("queue_mode", &self.queue_mode)
            .field("engine", &self.engine)
            .field("max_upload_bytes", &self.max_upload_bytes)
            .field("edit_interval_ms", &self.edit_interval_ms)
            .field("delivery_attempts", &self.delivery_attempts)
            .field("api_timeout_ms", &self.api_timeout_ms)
            .field("files", &self.files)
            .field("voice", &self.voice)
            .finish()
    }
}

mod defaults {
    pub(super) fn bot_token_secret() -> String {
        super::DEFAULT_TOKEN_SECRET.to_owned()
    }
    pub(super) fn yes() -> bool {
        true
    }
    pub(super) fn gateway_url() -> String {
        super::DEFAULT_GATEWAY_URL.to_owned()
    }
    pub(super) fn api_base_url() -> String {
        super::DEFAULT_API_BASE_URL.to_owned()
    }
    pub(super) fn agent_id() -> String {
        "default".to_owned()
    }
    pub(super) fn max_upload_bytes() -> u64 {
        10 * 1024 * 1024
    }
    pub(super) fn edit_interval_ms() -> u64 {
        1000
    }
    pub(super) fn delivery_attempts() -> u32 {
        10
    }
    pub(super) fn api_timeout_ms() -> u64 {
        30_000
    }
}

/// The reference's keys read as ours.
const REFERENCE_KEYS: &[ReferenceKey] =
    &[ReferenceKey::Alias { theirs: "deny_unbound_channels", ours: "deny_unbound" }];

/// A snowflake written as a number or as a string of digits.
#[derive(Deserialize)]
#[serde(untagged)]
enum RawId {
    Number(u64),
    Text(String),
}

impl RawId {
    fn into_snowflake<E: serde::de::Error>(self) -> Result<Snowflake, E> {
        match self {
            RawId::Number(n) => Ok(Snowflake(n)),
            RawId::Text(text) => text.trim().parse::<u64>().map(Snowflake).map_err(|_| {
                E::custom(format!("{text:?} is not a Discord id (a number of digits)"))
            }),
        }
    }
}

fn snowflakes<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<Snowflake>, D::Error> {
    Vec::<RawId>::deserialize(deserializer)?.into_iter().map(RawId::into_snowflake).collect()
}

fn optional_snowflake<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<Snowflake>, D::Error> {
    RawId::deserialize(deserializer)?.into_snowflake().map(Some)
}

/// A `[gateway.discord]` that cannot be used; the message names the key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid [gateway.discord]: {0}")]
pub struct DiscordConfigError(pub String);

impl DiscordConfig {
    /// Parses the raw section and checks what serde cannot.
    ///
    /// # Errors
    /// A wrong type, a bad URL, id or number.
    pub fn parse(table: &toml::Table) -> Result<Self, DiscordConfigError> {
        DiscordConfig::parse_values(table).map(|(config, _)| config)
    }

    /// Parses the raw section, with the keys it does not know (ignored), each
    /// with the closest known key; a section switched off is checked as well.
    ///
    /// # Errors
    /// A wrong type, a bad URL, id or number.
    pub fn parse_values(
        table: &toml::Table,
    ) -> Result<(Self, Vec<UnknownKey>), DiscordConfigError> {
        let (voice, table) = crate::media::VoiceConfig::split(table).map_err(DiscordConfigError)?;
        let translated = Translation::new(&table, REFERENCE_KEYS);
        let (mut config, mut unknown) = parse_section::<DiscordConfig>(&translated.table)
            .map_err(|err| DiscordConfigError(translated.in_file(err).to_string()))?;
        config.voice = voice;
        crate::media::VoiceConfig::suggest(&mut unknown);
        if let Some(problem) = config.files.check().into_iter().next() {
            return Err(DiscordConfigError(format!("files.{problem}")));
        }
        let gateway = config.gateway_url.trim();
        if !(gateway.starts_with("ws://") || gateway.starts_with("wss://")) {
            return Err(DiscordConfigError(format!("gateway_url: {gateway:?} is not a ws(s) URL")));
        }
        let api = config.api_base_url.trim();
        if !(api.starts_with("http://") || api.starts_with("https://")) {
            return Err(DiscordConfigError(format!("api_base_url: {api:?} is not an http(s) URL")));
        }
        if config.bot_token_secret.trim().is_empty() {
            return Err(DiscordConfigError("bot_token_secret: name a secret".into()));
        }
        if config.delivery_attempts == 0 {
            return Err(DiscordConfigError("delivery_attempts must be at least 1".into()));
        }
        if config.max_upload_bytes == 0 {
            return Err(DiscordConfigError("max_upload_bytes must be at least 1".into()));
        }
        if !(50..=60_000).contains(&config.edit_interval_ms) {
            return Err(DiscordConfigError(
                "edit_interval_ms: between 50 and 60000 milliseconds".into(),
            ));
        }
        if !(100..=600_000).contains(&config.api_timeout_ms) {
            return Err(DiscordConfigError(
                "api_timeout_ms: between 100 and 600000 milliseconds".into(),
            ));
        }
        let agent = config.agent_id.trim();
        if agent.is_empty() || agent.contains(char::is_whitespace) || agent.contains(':') {
            return Err(DiscordConfigError(format!(
                "agent_id: {agent:?} must be a non-empty word without ':'"
            )));
        }
        Ok((config, unknown))
    }

    /// What the section's reference keys do where that is worth saying (an
    /// alias beside our own key).
    pub fn reference_notes(table: &toml::Table) -> Vec<KeyNote> {
        Translation::new(table, REFERENCE_KEYS).notes
    }

    /// The bot token: inline, or read from the secret store.
    ///
    /// # Errors
    /// A secret that is not set or cannot be read; a blank token.
    pub fn resolve_token(&self, secrets: &SecretStore) -> Result<String, DiscordConfigError> {
        lemon_core::transport::inline_or_secret(
            "bot_token",
            self.bot_token.as_deref(),
            Some(&self.bot_token_secret),
            secrets,
        )
        .map_err(DiscordConfigError)
    }

    pub fn edit_interval(&self) -> Duration {
        Duration::from_millis(self.edit_interval_ms)
    }

    /// How long one REST call may take.
    pub fn api_timeout(&self) -> Duration {
        Duration::from_millis(self.api_timeout_ms)
    }

    /// Why a message from `user` in `guild` (none for a DM) and `channel` (a
    /// thread's parent for a thread) is not on the allow-lists, if it is not
    /// (`allow_everyone` is checked by the caller):
    ///
    /// - a direct message needs its author in `allowed_user_ids`;
    /// - a server message needs its channel in `allowed_channel_ids` or its
    ///   server in `allowed_guild_ids` (both lists set: both), and its author
    ///   in `allowed_user_ids` when that is set;
    /// - all three lists empty: nobody.
    pub fn unlisted(
        &self,
        guild: Option<Snowflake>,
        channel: Snowflake,
        user: Snowflake,
    ) -> Option<Unlisted> {
        let Some(guild) = guild else {
            return (!self.allowed_user_ids.contains(&user)).then_some(Unlisted::User(user));
        };
        let channel_ok = self.allowed_channel_ids.contains(&channel);
        let guild_ok = self.allowed_guild_ids.contains(&guild);
        let place_ok =
            match (self.allowed_guild_ids.is_empty(), self.allowed_channel_ids.is_empty()) {
                (false, false) => guild_ok && channel_ok,
                _ => guild_ok || channel_ok,
            };
        if !place_ok {
            return Some(Unlisted::Place { guild, channel });
        }
        let user_ok = self.allowed_user_ids.is_empty() || self.allowed_user_ids.contains(&user);
        (!user_ok).then_some(Unlisted::User(user))
    }

    /// How many entries the allow-lists have.
    pub fn listed_count(&self) -> usize {
        self.allowed_guild_ids.len() + self.allowed_channel_ids.len() + self.allowed_user_ids.len()
    }
}

/// What keeps a Discord message off the allow-lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unlisted {
    /// The author is not in `allowed_user_ids`.
    User(Snowflake),
    /// Neither the server nor the channel is listed.
    Place { guild: Snowflake, channel: Snowflake },
}

impl Unlisted {
    /// (what, id, the list's key) for the refusal's log line.
    pub fn describe(self) -> (&'static str, String, &'static str) {
        match self {
            Unlisted::User(user) => ("user", user.to_string(), "allowed_user_ids"),
            Unlisted::Place { guild, channel } => (
                "server channel",
                format!("{channel} (server {guild})"),
                "allowed_channel_ids or allowed_guild_ids",
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<DiscordConfig, DiscordConfigError> {
        DiscordConfig::parse(&text.parse::<toml::Table>().expect("toml"))
    }

    #[test]
    fn defaults_are_discords() {
        let config = parse("").expect("parses");
        assert_eq!(config.gateway_url, DEFAULT_GATEWAY_URL);
        assert_eq!(config.api_base_url, DEFAULT_API_BASE_URL);
        assert_eq!(config.bot_token_secret, "discord_bot_token");
        assert!(config.mention_required);
        assert!(!config.deny_unbound);
        assert_eq!(config.application_id, None);
        assert_eq!(config.api_timeout(), Duration::from_secs(30));
    }

    #[test]
    fn ids_are_numbers_or_digit_strings() {
        let config = parse(
            "application_id = \"1100\"\nallowed_guild_ids = [1, \"2\"]\nallowed_user_ids = [33]",
        )
        .unwrap();
        assert_eq!(config.application_id, Some(Snowflake(1100)));
        assert_eq!(config.allowed_guild_ids, [Snowflake(1), Snowflake(2)]);
        let err = parse("allowed_channel_ids = [\"general\"]").unwrap_err().to_string();
        assert!(err.contains("allowed_channel_ids") && err.contains("general"), "{err}");
        let err = parse("allowed_user_ids = 5").unwrap_err().to_string();
        assert!(err.contains("allowed_user_ids"), "{err}");
    }

    #[test]
    fn bad_urls_and_numbers_name_their_key() {
        for (text, key) in [
            ("gateway_url = \"https://x\"", "gateway_url"),
            ("api_base_url = \"ws://x\"", "api_base_url"),
            ("delivery_attempts = 0", "delivery_attempts"),
            ("edit_interval_ms = 1", "edit_interval_ms"),
            ("api_timeout_ms = 99", "api_timeout_ms"),
            ("api_timeout_ms = 600001", "api_timeout_ms"),
            ("agent_id = \"a b\"", "agent_id"),
            ("mention_required = \"yes\"", "mention_required"),
        ] {
            let err = parse(text).unwrap_err().to_string();
            assert!(err.contains(key), "{text}: {err}");
        }
        let table = "gateway_ur = \"wss://x\"".parse::<toml::Table>().unwrap();
        let (_, unknown) = DiscordConfig::parse_values(&table).unwrap();
        assert_eq!(unknown[0].suggestion.as_deref(), Some("gateway_url"));
    }

    #[test]
    fn allow_lists_restrict_guilds_channels_and_users() {
        let config =
            parse("allowed_guild_ids = [1]\nallowed_channel_ids = [10]\nallowed_user_ids = [100]")
                .unwrap();
        let (g, c, u) = (Snowflake(1), Snowflake(10), Snowflake(100));
        let allowed = |config: &DiscordConfig, g, c, u| config.unlisted(g, c, u).is_none();
        assert!(allowed(&config, Some(g), c, u));
        assert!(!allowed(&config, Some(Snowflake(2)), c, u));
        assert!(!allowed(&config, Some(g), Snowflake(11), u));
        assert_eq!(
            config.unlisted(Some(g), c, Snowflake(101)),
            Some(Unlisted::User(Snowflake(101)))
        );
        // A DM has no server or server channel to check, only its user.
        assert!(allowed(&config, None, Snowflake(99), u));
        assert!(!allowed(&config, None, Snowflake(99), Snowflake(101)));
    }

    #[test]
    fn empty_lists_let_nobody_in_and_one_place_list_is_enough() {
        let (g, c, u) = (Snowflake(1), Snowflake(10), Snowflake(100));
        let none = parse("").unwrap();
        assert!(!none.allow_everyone);
        assert_eq!(none.unlisted(Some(g), c, u), Some(Unlisted::Place { guild: g, channel: c }));
        assert_eq!(none.unlisted(None, c, u), Some(Unlisted::User(u)));
        // Users alone: their DMs, no server.
        let users = parse("allowed_user_ids = [100]").unwrap();
        assert_eq!(users.unlisted(None, c, u), None);
        assert!(users.unlisted(Some(g), c, u).is_some());
        // A server alone: anyone in any of its channels, no DMs.
        let guild = parse("allowed_guild_ids = [1]").unwrap();
        assert_eq!(guild.unlisted(Some(g), Snowflake(11), Snowflake(5)), None);
        assert!(guild.unlisted(Some(Snowflake(2)), c, u).is_some());
        assert!(guild.unlisted(None, c, u).is_some());
        // A channel alone: anyone in it.
        let channel = parse("allowed_channel_ids = [10]").unwrap();
        assert_eq!(channel.unlisted(Some(g), c, Snowflake(5)), None);
        assert!(channel.unlisted(Some(g), Snowflake(11), u).is_some());
        assert!(parse("allow_everyone = true").unwrap().allow_everyone);
        assert_eq!(
            Unlisted::Place { guild: g, channel: c }.describe(),
            (
                "server channel",
                "10 (server 1)".to_owned(),
                "allowed_channel_ids or allowed_guild_ids"
            )
        );
    }

    #[test]
    fn files_and_voice_keys_are_read_and_checked() {
        let config = parse(
            "voice_transcription = true\nvoice_transcription_provider = \"deepgram\"\n\
             show_transcript = true\n[files]\nmax_download_bytes = 1234\nuploads_dir = \"incoming\"",
        )
        .unwrap();
        assert_eq!(config.files.max_download_bytes, 1234);
        assert_eq!(config.files.uploads_dir.as_deref(), Some("incoming"));
        assert!(config.voice.voice_transcription && config.voice.show_transcript);
        assert_eq!(config.voice.model(), "nova-3");
        let defaults = parse("").unwrap();
        assert!(defaults.files.enabled && !defaults.voice.voice_transcription);
        for (text, key) in [
            ("voice_max_seconds = 0", "voice_max_seconds"),
            ("voice_transcription_provider = \"siri\"", "voice_transcription_provider"),
            ("[files]\nuploads_dir = \"../out\"", "files.uploads_dir"),
            ("[files]\nmax_download_bytes = \"big\"", "max_download_bytes"),
        ] {
            let err = parse(text).unwrap_err().to_string();
            assert!(err.contains(key), "{text}: {err}");
        }
        let table = "voice_transcripton = true".parse::<toml::Table>().unwrap();
        let (_, unknown) = DiscordConfig::parse_values(&table).unwrap();
        assert_eq!(unknown[0].suggestion.as_deref(), Some("voice_transcription"));
        let inline = parse("voice_transcription_api_key = \"sk-inline-key\"").unwrap();
        assert!(!format!("{inline:?}").contains("sk-inline-key"));
    }

    #[test]
    fn the_token_comes_from_the_default_secret_and_debug_hides_it() {
        let dir = tempfile::tempdir().unwrap();
        let env = [("DISCORD_BOT_TOKEN".to_owned(), "Mzk.secret-value".to_owned())].into();
        let secrets = SecretStore::new(env, dir.path().join("secrets.toml"));
        let config = parse("").unwrap();
        assert_eq!(config.resolve_token(&secrets).unwrap(), "Mzk.secret-value");
        let other = parse("bot_token_secret = \"other\"").unwrap();
        let err = other.resolve_token(&secrets).unwrap_err().to_string();
        assert!(err.contains("other") && !err.contains("secret-value"), "{err}");
        let inline = parse("bot_token = \"inline-secret\"").unwrap();
        assert!(!format!("{inline:?}").contains("inline-secret"));
    }

    #[test]
    fn the_reference_deny_unbound_channels_is_deny_unbound_and_ours_wins() {
        let table = |text: &str| text.parse::<toml::Table>().unwrap();
        let reference = table("deny_unbound_channels = true");
        let (config, unknown) = DiscordConfig::parse_values(&reference).unwrap();
        assert!(config.deny_unbound && unknown.is_empty());
        assert!(DiscordConfig::reference_notes(&reference).is_empty());
        let both = table("deny_unbound = false\ndeny_unbound_channels = true");
        assert!(!parse("deny_unbound = false\ndeny_unbound_channels = true").unwrap().deny_unbound);
        let notes = DiscordConfig::reference_notes(&both);
        assert_eq!(notes.len(), 1);
        assert_eq!(notes[0].path, ["deny_unbound_channels"]);
        assert!(notes[0].message.contains("`deny_unbound` is used"), "{}", notes[0].message);
        let err = parse("deny_unbound_channels = \"yes\"").unwrap_err().to_string();
        assert!(err.contains("`deny_unbound_channels`"), "{err}");
    }
}
