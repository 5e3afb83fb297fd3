//! The voice keys of a chat channel's section, the same for every channel
//! (`[gateway.telegram]`, `[gateway.discord]`):
//!
//! ```toml
//! voice_transcription = true                    # off by default
//! voice_transcription_provider = "openai"       # or "deepgram"
//! voice_transcription_model = "gpt-4o-mini-transcribe"   # nova-3 for deepgram
//! voice_transcription_base_url = "https://api.openai.com/v1"
//! voice_transcription_api_key_secret = "openai_api_key"  # deepgram_api_key for deepgram
//! # voice_transcription_api_key = "sk-…"       # inline, the reference's key; a secret is better
//! voice_max_bytes = 10485760                    # 10 MiB
//! voice_max_seconds = 300
//! show_transcript = false                       # answer "heard: …" before the run
//! ```
//!
//! The first five and `voice_max_bytes` are the reference's names. A channel
//! reads them with [`VoiceConfig::split`], which takes them out of its raw
//! section, so the rest parses as the channel's own keys (and a key neither
//! knows is suggested from both with [`VoiceConfig::suggest`]).

use lemon_core::config::{did_you_mean, field_names, parse_table, UnknownKey};
use lemon_core::secrets::{SecretStore, SecretValue};
use serde::Deserialize;

use super::transcribe::{
    TranscribeError, Transcriber, TranscriberSettings, TranscriptionProvider,
    DEFAULT_TRANSCRIBE_TIMEOUT,
};

/// 10 MiB.
pub const DEFAULT_VOICE_MAX_BYTES: u64 = 10 * 1024 * 1024;
/// Five minutes.
pub const DEFAULT_VOICE_MAX_SECONDS: u64 = 300;

/// The voice keys of a chat channel's section.
#[derive(Clone, PartialEq, Deserialize, schemars::JsonSchema)]
#[serde(default)]
pub struct VoiceConfig {
    /// Voice messages are transcribed and their words are the prompt (off:
    /// a voice message is a file like any other).
    pub voice_transcription: bool,
    /// The transcription service's API: `openai` (and OpenAI-compatible
    /// servers) or `deepgram`.
    #[schemars(extend("default" = "openai"))]
    pub voice_transcription_provider: TranscriptionProvider,
    /// The transcription model. Unset: `gpt-4o-mini-transcribe` (openai),
    /// `nova-3` (deepgram).
    #[schemars(length(min = 1))]
    pub voice_transcription_model: Option<String>,
    /// The transcription service's base URL. Unset:
    /// `https://api.openai.com/v1` (openai), `https://api.deepgram.com`
    /// (deepgram).
    #[schemars(pattern(r"^https?://"))]
    pub voice_transcription_base_url: Option<String>,
    /// The service's key inline (the reference layout's key; never logged).
    /// A secret is better.
    pub voice_transcription_api_key: Option<String>,
    /// The name of the secret holding the service's key. Unset:
    /// `openai_api_key` (environment `OPENAI_API_KEY`) or `deepgram_api_key`
    /// (`DEEPGRAM_API_KEY`).
    #[schemars(length(min = 1))]
    pub voice_transcription_api_key_secret: Option<String>,
    /// The largest voice message transcribed, in bytes; a larger one is
    /// refused before any upload.
    #[schemars(range(min = 1))]
    pub voice_max_bytes: u64,
    /// The longest voice message transcribed, in seconds.
    #[schemars(range(min = 1))]
    pub voice_max_seconds: u64,
    /// The chat is answered `heard: <words>` before the run starts.
    pub show_transcript: bool,
}

impl Default for VoiceConfig {
    fn default() -> Self {
        VoiceConfig {
            voice_transcription: false,
            voice_transcription_provider: TranscriptionProvider::OpenAi,
            voice_transcription_model: None,
            voice_transcription_base_url: None,
            voice_transcription_api_key: None,
            voice_transcription_api_key_secret: None,
            voice_max_bytes: DEFAULT_VOICE_MAX_BYTES,
            voice_max_seconds: DEFAULT_VOICE_MAX_SECONDS,
            show_transcript: false,
        }
    }
}

impl std::fmt::Debug for VoiceConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VoiceConfig")
            .field("voice_transcription", &self.voice_transcription)
            .field("voice_transcription_provider", &self.voice_transcription_provider)
            .field("voice_transcription_model", &self.voice_transcription_model)
            .field("voice_transcription_base_url", &self.voice_transcription_base_url)
            .field(
                "voice_transcription_api_key",
                &self.voice_transcription_api_key.as_ref().map(|_| "<redacted>"),
            )
            .field("voice_transcription_api_key_secret", &self.voice_transcription_api_key_secret)
            .field("voice_max_bytes", &self.voice_max_bytes)
            .field("voice_max_seconds", &self.voice_max_seconds)
            .field("show_transcript", &self.show_transcript)
            .finish()
    }
}

impl VoiceConfig {
    /// The keys this struct reads.
    pub fn keys() -> &'static [&'static str] {
        field_names::<VoiceConfig>()
    }

    /// Takes the voice keys out of a channel's raw section and parses them;
    /// the rest of the section is returned for the channel to parse.
    ///
    /// # Errors
    /// A voice key with a wrong type or value, named (`voice_max_bytes: …`).
    pub fn split(section: &toml::Table) -> Result<(VoiceConfig, toml::Table), String> {
        let keys = VoiceConfig::keys();
        let (voice, rest): (toml::Table, toml::Table) =
            section.clone().into_iter().partition(|(key, _)| keys.contains(&key.as_str()));
        let (config, _) = parse_table::<VoiceConfig>(&voice).map_err(|err| err.to_string())?;
        config.check()?;
        Ok((config, rest))
    }

    /// Suggests voice keys too for the keys a channel did not know
    /// (`voice_transcripton` → `voice_transcription`), where the channel's
    /// own keys suggested none.
    pub fn suggest(unknown: &mut [UnknownKey]) {
        for key in unknown.iter_mut().filter(|key| key.suggestion.is_none() && key.path.len() == 1)
        {
            key.suggestion =
                did_you_mean(&key.path[0], VoiceConfig::keys().iter().copied()).map(str::to_owned);
        }
    }

    /// What is wrong with the values, naming the key.
    ///
    /// # Errors
    /// The first problem found.
    pub fn check(&self) -> Result<(), String> {
        if self.voice_max_bytes == 0 {
            return Err("voice_max_bytes: must be at least 1".to_owned());
        }
        if self.voice_max_seconds == 0 {
            return Err("voice_max_seconds: must be at least 1".to_owned());
        }
        if let Some(model) = &self.voice_transcription_model {
            if model.trim().is_empty() {
                return Err("voice_transcription_model: must not be blank".to_owned());
            }
        }
        if let Some(base) = &self.voice_transcription_base_url {
            let base = base.trim();
            let ok = reqwest::Url::parse(base)
                .is_ok_and(|url| matches!(url.scheme(), "http" | "https") && url.has_host());
            if !ok {
                return Err(format!(
                    "voice_transcription_base_url: {base:?} is not an http(s) URL"
                ));
            }
        }
        if let Some(secret) = &self.voice_transcription_api_key_secret {
            if secret.trim().is_empty() {
                return Err("voice_transcription_api_key_secret: name a secret".to_owned());
            }
        }
        Ok(())
    }

    /// The model in use.
    pub fn model(&self) -> String {
        self.voice_transcription_model
            .as_deref()
            .map(str::trim)
            .unwrap_or_else(|| self.voice_transcription_provider.default_model())
            .to_owned()
    }

    /// The base URL in use.
    pub fn base_url(&self) -> String {
        self.voice_transcription_base_url
            .as_deref()
            .map(str::trim)
            .unwrap_or_else(|| self.voice_transcription_provider.default_base_url())
            .trim_end_matches('/')
            .to_owned()
    }

    /// The secret the key is read from.
    pub fn api_key_secret(&self) -> String {
        self.voice_transcription_api_key_secret
            .as_deref()
            .map(str::trim)
            .unwrap_or_else(|| self.voice_transcription_provider.default_key_secret())
            .to_owned()
    }

    /// The secret names these keys refer to (for `doctor` and the secrets
    /// list): the key's secret, when transcription is on and no key is inline.
    pub fn secret_names(&self) -> Vec<String> {
        let inline =
            self.voice_transcription_api_key.as_deref().is_some_and(|k| !k.trim().is_empty());
        if self.voice_transcription && !inline {
            vec![self.api_key_secret()]
        } else {
            Vec::new()
        }
    }

    /// The transcriber these keys describe, with its key read from
    /// `secrets`; `None` while `voice_transcription` is off.
    ///
    /// # Errors
    /// Which key is wrong: the secret is not set or cannot be read, the key
    /// is blank, the base URL is not http(s). Never the key's value.
    pub fn transcriber(&self, secrets: &SecretStore) -> Result<Option<Transcriber>, String> {
        if !self.voice_transcription {
            return Ok(None);
        }
        let secret = self.api_key_secret();
        let key = lemon_core::transport::inline_or_secret(
            "voice_transcription_api_key",
            self.voice_transcription_api_key.as_deref(),
            Some(&secret),
            secrets,
        )?;
        self.transcriber_with_key(SecretValue::new(key)).map(Some)
    }

    /// The transcriber these keys describe, with `api_key`.
    ///
    /// # Errors
    /// As [`VoiceConfig::transcriber`].
    pub fn transcriber_with_key(&self, api_key: SecretValue) -> Result<Transcriber, String> {
        Transcriber::new(TranscriberSettings {
            provider: self.voice_transcription_provider,
            base_url: self.base_url(),
            model: self.model(),
            api_key,
            max_bytes: self.voice_max_bytes,
            max_seconds: self.voice_max_seconds,
            timeout: DEFAULT_TRANSCRIBE_TIMEOUT,
        })
        .map_err(|err| match err {
            TranscribeError::Setup(why) => why,
            other => other.to_string(),
        })
    }
}
