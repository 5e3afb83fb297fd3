//! `[gateway.voice]`: the raw TOML section parsed into typed settings, and the
//! secrets it names.

use std::fmt;
use std::net::SocketAddr;

use lemon_core::config::{parse_section, KeyNote, ReferenceKey, Translation, UnknownKey};
use lemon_core::ids::EngineRef;
use lemon_core::secrets::SecretStore;
use serde::Deserialize;

/// Default port of the voice webhooks and media streams.
pub const DEFAULT_VOICE_PORT: u16 = 4047;

/// `[gateway.voice]`: phone calls to a Twilio number, each a conversation
/// spoken with the agent: Deepgram turns speech into text, the engine
/// answers, ElevenLabs speaks the answer. Only the callers listed reach the
/// agent.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[schemars(transform = reference_keys_schema)]
pub struct VoiceConfig {
    /// Switches voice calls on (default off).
    #[serde(default)]
    pub enabled: Option<bool>,
    /// Listen address: an IP, `localhost`, or `any` for every interface.
    #[serde(default = "defaults::bind")]
    pub bind: String,
    /// Listen port (default 4047; 0 picks a free one). The reference's
    /// `websocket_port` is read as this.
    #[serde(default = "defaults::port")]
    pub port: u16,
    /// The public base URL Twilio reaches the gateway at (`https://…`, a tunnel
    /// in development). Webhook signatures are checked against it and the media
    /// stream URL is built from it. Unset here: `VOICE_PUBLIC_URL`.
    #[serde(default)]
    pub public_url: Option<String>,
    /// Whether Twilio's signature is required on every voice webhook (default true).
    #[serde(default = "defaults::yes")]
    pub validate_webhook: bool,
    /// The secret holding the Twilio auth token (default `twilio_auth_token`).
    #[serde(default = "defaults::twilio_auth_token_secret")]
    pub twilio_auth_token_secret: String,
    /// The secret holding the Twilio account SID (default `twilio_account_sid`).
    #[serde(default = "defaults::twilio_account_sid_secret")]
    pub twilio_account_sid_secret: String,
    /// The number calls come in on, for status and logs. Unset here:
    /// `TWILIO_PHONE_NUMBER`.
    #[serde(default)]
    pub twilio_phone_number: Option<String>,
    /// Twilio's REST API (recordings, hang-up).
    #[serde(default = "defaults::twilio_api_base_url")]
    pub twilio_api_base_url: String,
    /// The secret holding the Deepgram API key (default `deepgram_api_key`).
    #[serde(default = "defaults::deepgram_api_key_secret")]
    pub deepgram_api_key_secret: String,
    /// Deepgram's live API (`wss://api.deepgram.com`).
    #[serde(default = "defaults::deepgram_base_url")]
    pub deepgram_base_url: String,
    /// The Deepgram model.
    #[serde(default = "defaults::deepgram_model")]
    pub deepgram_model: String,
    /// Deepgram's endpointing: the pause, in ms, that ends speech (`speech_final`).
    #[serde(default = "defaults::endpointing_ms")]
    pub deepgram_endpointing_ms: u32,
    /// Deepgram's `utterance_end_ms`: the gap in words that ends an utterance.
    #[serde(default = "defaults::utterance_end_ms")]
    pub deepgram_utterance_end_ms: u32,
    /// The secret holding the ElevenLabs API key (default `elevenlabs_api_key`).
    #[serde(default = "defaults::elevenlabs_api_key_secret")]
    pub elevenlabs_api_key_secret: String,
    /// ElevenLabs' API (`https://api.elevenlabs.io`).
    #[serde(default = "defaults::elevenlabs_base_url")]
    pub elevenlabs_base_url: String,
    /// The voice answers are spoken with.
    #[serde(default = "defaults::elevenlabs_voice_id")]
    pub elevenlabs_voice_id: String,
    /// The ElevenLabs model.
    #[serde(default = "defaults::elevenlabs_model_id")]
    pub elevenlabs_model_id: String,
    /// `ulaw_8000` (sent to Twilio as is) or `pcm_8000` (encoded to μ-law here).
    #[serde(default = "defaults::elevenlabs_output_format")]
    #[schemars(extend("enum" = ["ulaw_8000", "pcm_8000"]))]
    pub elevenlabs_output_format: String,
    /// A call is ended (politely) after this many seconds.
    #[serde(default = "defaults::max_call_duration_seconds")]
    #[schemars(range(min = 1))]
    pub max_call_duration_seconds: u64,
    /// A call in which nobody speaks for this long, in milliseconds, is
    /// ended (politely).
    #[serde(default = "defaults::silence_timeout_ms")]
    #[schemars(range(min = 100))]
    pub silence_timeout_ms: u64,
    /// Whether the caller can interrupt an answer by speaking.
    #[serde(default = "defaults::yes")]
    pub barge_in: bool,
    /// The words a confirmed transcript needs to interrupt (noise and the
    /// caller's echo of the answer have none).
    #[serde(default = "defaults::barge_in_min_words")]
    #[schemars(range(min = 1))]
    pub barge_in_min_words: usize,
    /// Spoken when the call connects; empty for none.
    #[serde(default = "defaults::greeting")]
    pub greeting: String,
    /// Spoken before the gateway hangs up (silence, the duration cap).
    #[serde(default = "defaults::goodbye")]
    pub goodbye: String,
    /// Whether calls are recorded (dual channel) and saved as WAV under
    /// `$LEMON_HOME/recordings/<date>/`.
    #[serde(default)]
    pub record_calls: bool,
    /// Where recordings are saved: `~` is the user's home, a relative path
    /// is under `$LEMON_HOME`. Unset here: `VOICE_RECORDINGS_DIR`, else
    /// `$LEMON_HOME/recordings`.
    #[serde(default)]
    pub recordings_dir: Option<std::path::PathBuf>,
    /// The engine calls run on; unset: the gateway's default engine (the native
    /// `lemon` engine when it is configured), or a `voice` binding's.
    #[serde(default)]
    pub engine: Option<EngineRef>,
    /// The callers (E.164 numbers, `+15551230100`) whose calls reach the
    /// agent. Anyone else hears a short refusal and is hung up on, with no
    /// transcription opened; the log names the number. Empty: nobody.
    #[serde(default)]
    pub allowed_callers: Vec<String>,
    /// Answers every caller, listed or not: anyone who dials the number talks
    /// to the agent (and spends the Deepgram, ElevenLabs and engine budgets).
    /// Warned about at every start and shown in `/v1/status`.
    #[serde(default)]
    pub allow_everyone: bool,
}

/// The reference layout's keys in the section's schema.
fn reference_keys_schema(schema: &mut schemars::Schema) {
    lemon_core::config::schema::add_reference_keys(schema, REFERENCE_KEYS);
}

/// The reference's `[gateway.voice]` keys: read as ours, or accepted with
/// what happens instead.
const REFERENCE_KEYS: &[ReferenceKey] = &[
    ReferenceKey::Alias { theirs: "websocket_port", ours: "port" },
    ReferenceKey::Inert {
        key: "llm_model",
        what_happens: "calls run on the engine `engine` names (else the default engine); set the model in that engine's section",
    },
    ReferenceKey::Inert {
        key: "system_prompt",
        what_happens: "calls run on the engine `engine` names, with that engine's own instructions",
    },
];

mod defaults {
    pub(super) fn bind() -> String {
        "127.0.0.1".to_owned()
    }
    pub(super) fn port() -> u16 {
        super::DEFAULT_VOICE_PORT
    }
    pub(super) fn yes() -> bool {
        true
    }
    pub(super) fn twilio_auth_token_secret() -> String {
        "twilio_auth_token".to_owned()
    }
    pub(super) fn twilio_account_sid_secret() -> String {
        "twilio_account_sid".to_owned()
    }
    pub(super) fn twilio_api_base_url() -> String {
        "https://api.twilio.com".to_owned()
    }
    pub(super) fn deepgram_api_key_secret() -> String {
        "deepgram_api_key".to_owned()
    }
    pub(super) fn deepgram_base_url() -> String {
        "wss://api.deepgram.com".to_owned()
    }
    pub(super) fn deepgram_model() -> String {
        "nova-3".to_owned()
    }
    pub(super) fn endpointing_ms() -> u32 {
        300
    }
    pub(super) fn utterance_end_ms() -> u32 {
        1000
    }
    pub(super) fn elevenlabs_api_key_secret() -> String {
        "elevenlabs_api_key".to_owned()
    }
    pub(super) fn elevenlabs_base_url() -> String {
        "https://api.elevenlabs.io".to_owned()
    }
    pub(super) fn elevenlabs_voice_id() -> String {
        "21m00Tcm4TlvDq8ikWAM".to_owned()
    }
    pub(super) fn elevenlabs_model_id() -> String {
        "eleven_turbo_v2_5".to_owned()
    }
    pub(super) fn elevenlabs_output_format() -> String {
        "ulaw_8000".to_owned()
    }
    pub(super) fn max_call_duration_seconds() -> u64 {
        600
    }
    pub(super) fn silence_timeout_ms() -> u64 {
        15_000
    }
    pub(super) fn barge_in_min_words() -> usize {
        1
    }
    pub(super) fn greeting() -> String {
        "Hello! How can I help?".to_owned()
    }
    pub(super) fn goodbye() -> String {
        "Thanks for calling. Goodbye.".to_owned()
    }
}

/// A `[gateway.voice]` that cannot be used; the message names the key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid [gateway.voice]: {0}")]
pub struct VoiceConfigError(pub String);

impl Default for VoiceConfig {
    fn default() -> Self {
        VoiceConfig::parse(&toml::Table::new()).unwrap_or_else(|_| unreachable!())
    }
}

impl VoiceConfig {
    /// Parses the raw section and checks the values serde cannot.
    ///
    /// # Errors
    /// A wrong type or value, naming the key.
    pub fn parse(table: &toml::Table) -> Result<Self, VoiceConfigError> {
        VoiceConfig::parse_with_unknown_keys(table).map(|(config, _)| config)
    }

    /// As [`VoiceConfig::parse`], with the keys the section does not know.
    ///
    /// # Errors
    /// See [`VoiceConfig::parse`].
    pub fn parse_with_unknown_keys(
        table: &toml::Table,
    ) -> Result<(Self, Vec<UnknownKey>), VoiceConfigError> {
        let translated = Translation::new(table, REFERENCE_KEYS);
        let (config, unknown) = parse_section::<VoiceConfig>(&translated.table)
            .map_err(|err| VoiceConfigError(translated.in_file(err).to_string()))?;
        Ok((config.checked()?, unknown))
    }

    /// What the section's reference keys do where that is worth saying.
    pub fn reference_notes(table: &toml::Table) -> Vec<KeyNote> {
        Translation::new(table, REFERENCE_KEYS).notes
    }

    /// Where recordings go: `recordings_dir` (`~` the user's home, relative
    /// under `lemon_home`), else `<lemon_home>/recordings`.
    pub fn recordings(
        &self,
        lemon_home: &std::path::Path,
        user_home: Option<&std::path::Path>,
    ) -> std::path::PathBuf {
        let Some(dir) = self.recordings_dir.as_deref().filter(|d| !d.as_os_str().is_empty()) else {
            return lemon_home.join("recordings");
        };
        match (dir.strip_prefix("~"), user_home) {
            (Ok(rest), Some(home)) => home.join(rest),
            _ if dir.is_absolute() => dir.to_path_buf(),
            _ => lemon_home.join(dir),
        }
    }

    fn checked(self) -> Result<Self, VoiceConfigError> {
        let bad = |key: &str, message: &str| Err(VoiceConfigError(format!("`{key}`: {message}")));
        if let Some(url) = &self.public_url {
            if !(url.starts_with("https://") || url.starts_with("http://")) {
                return bad("public_url", "must start with https:// (or http:// for local tests)");
            }
        }
        for (key, url, schemes) in [
            ("twilio_api_base_url", &self.twilio_api_base_url, ["https://", "http://"]),
            ("elevenlabs_base_url", &self.elevenlabs_base_url, ["https://", "http://"]),
            ("deepgram_base_url", &self.deepgram_base_url, ["wss://", "ws://"]),
        ] {
            if !schemes.iter().any(|scheme| url.starts_with(scheme)) {
                return bad(key, &format!("must start with {} or {}", schemes[0], schemes[1]));
            }
        }
        if !matches!(self.elevenlabs_output_format.as_str(), "ulaw_8000" | "pcm_8000") {
            return bad("elevenlabs_output_format", "must be \"ulaw_8000\" or \"pcm_8000\"");
        }
        if self.max_call_duration_seconds == 0 {
            return bad("max_call_duration_seconds", "must be at least 1");
        }
        if self.silence_timeout_ms < 100 {
            return bad("silence_timeout_ms", "must be at least 100");
        }
        if self.barge_in_min_words == 0 {
            return bad("barge_in_min_words", "must be at least 1");
        }
        let safe_id = |id: &str| {
            !id.is_empty() && id.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        };
        if !safe_id(&self.elevenlabs_voice_id) {
            return bad("elevenlabs_voice_id", "letters, digits, `_` and `-` only");
        }
        if let Some(number) =
            self.allowed_callers.iter().find(|number| !crate::twilio::is_phone_number(number))
        {
            let number = lemon_core::log_text::escape_within(number, 64);
            return bad(
                "allowed_callers",
                &format!(
                    "{number:?} is not an E.164 number (`+` and the country code, digits only)"
                ),
            );
        }
        Ok(self)
    }

    /// Whether a call from `caller` (E.164, as Twilio sends it) is answered.
    pub fn allows_caller(&self, caller: &str) -> bool {
        self.allow_everyone || self.allowed_callers.iter().any(|allowed| allowed == caller)
    }

    /// Who gets through, for status: `every caller (allow_everyone)`,
    /// `N allowed caller(s)` or `no caller (allowed_callers is empty)`.
    pub fn callers_summary(&self) -> String {
        match (self.allow_everyone, self.allowed_callers.len()) {
            (true, _) => "every caller is answered (allow_everyone = true)".to_owned(),
            (false, 0) => "no caller is answered (allowed_callers is empty)".to_owned(),
            (false, 1) => "1 allowed caller".to_owned(),
            (false, n) => format!("{n} allowed callers"),
        }
    }

    /// The section when voice is enabled (`enabled = true`), `None` when it is
    /// not; checked either way.
    ///
    /// # Errors
    /// See [`VoiceConfig::parse`]; an enabled section without `public_url`.
    pub fn from_gateway(table: Option<&toml::Table>) -> Result<Option<Self>, VoiceConfigError> {
        let config = match table {
            Some(table) => VoiceConfig::parse(table)?,
            None => return Ok(None),
        };
        if !lemon_core::transport::enabled(None, table) {
            return Ok(None);
        }
        if config.public_url.as_deref().is_none_or(|url| url.trim().is_empty()) {
            return Err(VoiceConfigError(
                "`public_url`: set the https URL Twilio reaches this gateway at".into(),
            ));
        }
        Ok(Some(config))
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

    /// `public_url` without a trailing slash.
    pub fn public_base(&self) -> String {
        self.public_url.as_deref().unwrap_or("").trim().trim_end_matches('/').to_owned()
    }

    /// Reads the secrets the section names.
    ///
    /// # Errors
    /// A required secret (the Deepgram and ElevenLabs keys; the auth token when
    /// webhooks are validated) that is not set, naming its key and where it
    /// was looked for.
    pub fn resolve_secrets(&self, secrets: &SecretStore) -> Result<VoiceSecrets, VoiceConfigError> {
        let read = |key: &str, name: &str, required: bool| -> Result<Option<String>, _> {
            match secrets.get(name) {
                Ok(Some(value)) if !value.expose().trim().is_empty() => {
                    Ok(Some(value.expose().trim().to_owned()))
                }
                Ok(_) if !required => Ok(None),
                Ok(_) => {
                    Err(VoiceConfigError(format!("`{key}`: {}", secrets.not_set_message(name))))
                }
                Err(err) => Err(VoiceConfigError(format!("`{key}`: {err}"))),
            }
        };
        Ok(VoiceSecrets {
            twilio_auth_token: read(
                "twilio_auth_token_secret",
                &self.twilio_auth_token_secret,
                self.validate_webhook,
            )?,
            twilio_account_sid: read(
                "twilio_account_sid_secret",
                &self.twilio_account_sid_secret,
                false,
            )?,
            deepgram_api_key: read("deepgram_api_key_secret", &self.deepgram_api_key_secret, true)?
                .unwrap_or_default(),
            elevenlabs_api_key: read(
                "elevenlabs_api_key_secret",
                &self.elevenlabs_api_key_secret,
                true,
            )?
            .unwrap_or_default(),
        })
    }
}

/// The secrets a call uses. Never logged.
#[derive(Clone, Default)]
pub struct VoiceSecrets {
    pub twilio_auth_token: Option<String>,
    pub twilio_account_sid: Option<String>,
    pub deepgram_api_key: String,
    pub elevenlabs_api_key: String,
}

impl fmt::Debug for VoiceSecrets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VoiceSecrets")
            .field("twilio_auth_token", &self.twilio_auth_token.as_ref().map(|_| "<redacted>"))
            .field("twilio_account_sid", &self.twilio_account_sid.as_ref().map(|_| "<redacted>"))
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(text: &str) -> toml::Table {
        text.parse().unwrap()
    }

    #[test]
    fn defaults_follow_the_documented_values() {
        let config = VoiceConfig::default();
        assert_eq!(config.addr(), "127.0.0.1:4047");
        assert!(config.validate_webhook);
        assert!(config.barge_in);
        assert_eq!(config.barge_in_min_words, 1);
        assert_eq!(config.elevenlabs_output_format, "ulaw_8000");
        assert_eq!(config.max_call_duration_seconds, 600);
        assert_eq!(config.twilio_auth_token_secret, "twilio_auth_token");
        assert_eq!(config.deepgram_api_key_secret, "deepgram_api_key");
        assert!(config.engine.is_none());
        // No allow-list means nobody.
        assert!(config.allowed_callers.is_empty() && !config.allow_everyone);
        assert!(!config.allows_caller("+15551230100"));
    }

    #[test]
    fn listed_callers_or_everyone_by_opt_in_are_answered() {
        let listed = VoiceConfig::parse(&table("allowed_callers = [\"+15551230100\"]")).unwrap();
        assert!(listed.allows_caller("+15551230100"));
        assert!(!listed.allows_caller("+15551230101"));
        assert_eq!(listed.callers_summary(), "1 allowed caller");
        let everyone = VoiceConfig::parse(&table("allow_everyone = true")).unwrap();
        assert!(everyone.allows_caller("+15551230101"));
        assert!(everyone.callers_summary().contains("allow_everyone = true"));
    }

    #[test]
    fn an_enabled_section_needs_a_public_url_and_a_disabled_one_is_still_checked() {
        let err = VoiceConfig::from_gateway(Some(&table("enabled = true"))).unwrap_err();
        assert!(err.0.contains("`public_url`"), "{err}");
        let off = VoiceConfig::from_gateway(Some(&table("port = \"x\""))).unwrap_err();
        assert!(off.0.contains("`port`"), "{off}");
        let on = table("enabled = true\npublic_url = \"https://voice.example.com/\"");
        let config = VoiceConfig::from_gateway(Some(&on)).unwrap().unwrap();
        assert_eq!(config.public_base(), "https://voice.example.com");
        assert!(VoiceConfig::from_gateway(None).unwrap().is_none());
    }

    #[test]
    fn bad_values_name_their_key() {
        for (text, key) in [
            ("max_call_duration_seconds = 0", "max_call_duration_seconds"),
            ("barge_in_min_words = 0", "barge_in_min_words"),
            ("elevenlabs_output_format = \"mp3_44100\"", "elevenlabs_output_format"),
            ("deepgram_base_url = \"https://x\"", "deepgram_base_url"),
            ("elevenlabs_voice_id = \"../x\"", "elevenlabs_voice_id"),
            ("public_url = \"voice.example.com\"", "public_url"),
            ("barge_in = \"yes\"", "barge_in"),
            ("allowed_callers = [\"5551230100\"]", "allowed_callers"),
            ("allowed_callers = \"+15551230100\"", "allowed_callers"),
        ] {
            let err = VoiceConfig::parse(&table(text)).unwrap_err();
            assert!(err.0.contains(&format!("`{key}`")), "{text}: {err}");
        }
    }

    #[test]
    fn the_reference_keys_are_read_as_ours_or_accepted_with_what_happens() {
        let reference = table(
            "websocket_port = 4099\nllm_model = \"gpt-4o-mini\"\nsystem_prompt = \"Be brief.\"",
        );
        let (config, unknown) = VoiceConfig::parse_with_unknown_keys(&reference).unwrap();
        assert!(unknown.is_empty(), "{unknown:?}");
        assert_eq!(config.port, 4099);
        let notes = VoiceConfig::reference_notes(&reference);
        let keys: Vec<String> = notes.iter().map(|n| n.path.join(".")).collect();
        assert_eq!(keys, ["llm_model", "system_prompt"]);
        assert!(notes.iter().all(|n| n.message.starts_with("accepted; ")));
        let both = table("port = 1\nwebsocket_port = 2");
        assert_eq!(VoiceConfig::parse(&both).unwrap().port, 1);
        assert!(VoiceConfig::reference_notes(&both)[0].message.contains("`port` is used"));
    }

    #[test]
    fn recordings_go_where_recordings_dir_says_else_under_the_home() {
        let home = std::path::Path::new("/lemon");
        let user = Some(std::path::Path::new("/home/u"));
        let at = |text: &str| VoiceConfig::parse(&table(text)).unwrap().recordings(home, user);
        assert_eq!(at(""), std::path::Path::new("/lemon/recordings"));
        assert_eq!(at("recordings_dir = \"/var/rec\""), std::path::Path::new("/var/rec"));
        assert_eq!(at("recordings_dir = \"~/rec\""), std::path::Path::new("/home/u/rec"));
        assert_eq!(at("recordings_dir = \"rec\""), std::path::Path::new("/lemon/rec"));
    }

    #[test]
    fn unknown_keys_get_a_suggestion() {
        let (_, unknown) =
            VoiceConfig::parse_with_unknown_keys(&table("greting = \"hi\"")).unwrap();
        assert_eq!(unknown.len(), 1);
        assert_eq!(unknown[0].suggestion.as_deref(), Some("greeting"));
    }
}
