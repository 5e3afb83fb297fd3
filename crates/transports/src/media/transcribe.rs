//! A voice message's words, from a transcription service:
//!
//! - `openai` (and any OpenAI-compatible server): `POST {base_url}/audio/transcriptions`,
//!   `multipart/form-data` with `file`, `model` and `response_format=json`,
//!   `Authorization: Bearer <key>`; the answer is `{"text": …}`.
//! - `deepgram`: pre-recorded audio, `POST {base_url}/v1/listen?model=…&smart_format=true`
//!   with the audio as the body (its media type as `Content-Type`) and
//!   `Authorization: Token <key>`; the words are
//!   `results.channels[0].alternatives[0].transcript`.
//!
//! A note over `max_bytes` or `max_seconds` is refused before anything is
//! uploaded ([`Transcriber::admit`] with what the channel announced, and
//! again by the bytes in hand). Errors say what went wrong in words the
//! sender can read and never carry the key.

use std::time::Duration;

use lemon_core::media::size_text;
use lemon_core::secrets::SecretValue;
use serde::Deserialize;
use serde_json::Value;

use super::fetch::Fetcher;
use super::BasicAuth;

/// How long one transcription may take.
pub const DEFAULT_TRANSCRIBE_TIMEOUT: Duration = Duration::from_secs(120);

/// Which API the transcription service speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, schemars::JsonSchema)]
pub enum TranscriptionProvider {
    /// OpenAI's `/audio/transcriptions`, or a server that speaks it.
    #[default]
    #[serde(rename = "openai")]
    OpenAi,
    /// Deepgram's pre-recorded `/v1/listen`.
    #[serde(rename = "deepgram")]
    Deepgram,
}

impl TranscriptionProvider {
    pub fn as_str(self) -> &'static str {
        match self {
            TranscriptionProvider::OpenAi => "openai",
            TranscriptionProvider::Deepgram => "deepgram",
        }
    }

    /// The service's own base URL.
    pub fn default_base_url(self) -> &'static str {
        match self {
            TranscriptionProvider::OpenAi => "https://api.openai.com/v1",
            TranscriptionProvider::Deepgram => "https://api.deepgram.com",
        }
    }

    /// The model used unless one is named.
    pub fn default_model(self) -> &'static str {
        match self {
            TranscriptionProvider::OpenAi => "gpt-4o-mini-transcribe",
            TranscriptionProvider::Deepgram => "nova-3",
        }
    }

    /// The secret the key is read from unless one is named (its environment
    /// variable is `OPENAI_API_KEY` / `DEEPGRAM_API_KEY`).
    pub fn default_key_secret(self) -> &'static str {
        match self {
            TranscriptionProvider::OpenAi => "openai_api_key",
            TranscriptionProvider::Deepgram => "deepgram_api_key",
        }
    }
}

/// What a [`Transcriber`] is built from.
#[derive(Debug, Clone)]
pub struct TranscriberSettings {
    pub provider: TranscriptionProvider,
    /// `https://api.openai.com/v1` (OpenAI: the part before
    /// `/audio/transcriptions`), `https://api.deepgram.com` (Deepgram: the
    /// part before `/v1/listen`; a trailing `/v1` is taken as that).
    pub base_url: String,
    pub model: String,
    pub api_key: SecretValue,
    /// The largest voice message transcribed.
    pub max_bytes: u64,
    /// The longest voice message transcribed, in seconds.
    pub max_seconds: u64,
    /// How long one transcription may take.
    pub timeout: Duration,
}

/// Why a voice message has no words. The text is the reply the sender sees.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TranscribeError {
    #[error("the voice message is {} — the limit for transcription is {}", size_text(*bytes), size_text(*max))]
    TooLarge { bytes: u64, max: u64 },
    #[error("the voice message is {} long — the limit for transcription is {}", duration_text(*seconds), duration_text(*max))]
    TooLong { seconds: u64, max: u64 },
    #[error("{0}")]
    Fetch(lemon_core::media::MediaRefusal),
    #[error("the transcription service refused the API key ({status}): check voice_transcription_api_key_secret")]
    Rejected { status: u16 },
    #[error("the transcription service is busy (429): send it again in a moment")]
    RateLimited,
    #[error("the transcription service answered {status}: {message}")]
    Status { status: u16, message: String },
    #[error("the transcription service could not be reached: {0}")]
    Unreachable(String),
    #[error("the transcription took longer than {0} s")]
    Timeout(u64),
    #[error("no words were heard in the voice message")]
    NoSpeech,
    #[error("the transcription service's answer was not understood: {0}")]
    Invalid(String),
    #[error("voice transcription is not set up: {0}")]
    Setup(String),
}

/// `42 s`, `5 min`, `5 min 3 s`.
pub fn duration_text(seconds: u64) -> String {
    match (seconds / 60, seconds % 60) {
        (0, s) => format!("{s} s"),
        (m, 0) => format!("{m} min"),
        (m, s) => format!("{m} min {s} s"),
    }
}

/// A voice message in hand.
#[derive(Debug, Clone, Copy)]
pub struct VoiceNote<'a> {
    pub audio: &'a [u8],
    /// Its file name (`voice-message.ogg`): OpenAI reads the format from it.
    pub file_name: &'a str,
    /// Its media type (`audio/ogg`).
    pub mime: &'a str,
    /// Its length, when the channel says.
    pub seconds: Option<f64>,
}

/// Transcribes voice messages with one service. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Transcriber {
    settings: TranscriberSettings,
    client: reqwest::Client,
}

impl Transcriber {
    /// A transcriber for `settings`.
    ///
    /// # Errors
    /// [`TranscribeError::Setup`]: the base URL is not http(s), the model or
    /// the key is blank.
    pub fn new(settings: TranscriberSettings) -> Result<Self, TranscribeError> {
        let base = settings.base_url.trim().trim_end_matches('/').to_owned();
        match reqwest::Url::parse(&base) {
            Ok(url) if matches!(url.scheme(), "http" | "https") && url.host_str().is_some() => {}
            _ => {
                return Err(TranscribeError::Setup(format!(
                    "voice_transcription_base_url: {base:?} is not an http(s) URL"
                )))
            }
        }
        if settings.model.trim().is_empty() {
            return Err(TranscribeError::Setup("voice_transcription_model is blank".into()));
        }
        if settings.api_key.expose().trim().is_empty() {
            return Err(TranscribeError::Setup("the API key is blank".into()));
        }
        let client = reqwest::Client::builder()
            .timeout(settings.timeout)
            .connect_timeout(Duration::from_secs(10).min(settings.timeout))
            .build()
            .map_err(|err| TranscribeError::Setup(format!("no HTTP client: {err}")))?;
        Ok(Transcriber { settings: TranscriberSettings { base_url: base, ..settings }, client })
    }

    pub fn provider(&self) -> TranscriptionProvider {
        self.settings.provider
    }

    pub fn model(&self) -> &str {
        &self.settings.model
    }

    /// The largest voice message transcribed.
    pub fn max_bytes(&self) -> u64 {
        self.settings.max_bytes
    }

    /// The longest voice message transcribed, in seconds.
    pub fn max_seconds(&self) -> u64 {
        self.settings.max_seconds
    }

    /// Refuses a voice message by what the channel announced, before it is
    /// fetched: its size and its length, each when known.
    ///
    /// # Errors
    /// [`TranscribeError::TooLarge`] or [`TranscribeError::TooLong`].
    pub fn admit(&self, bytes: Option<u64>, seconds: Option<f64>) -> Result<(), TranscribeError> {
        if let Some(bytes) = bytes.filter(|b| *b > self.settings.max_bytes) {
            return Err(TranscribeError::TooLarge { bytes, max: self.settings.max_bytes });
        }
        if let Some(seconds) = seconds.filter(|s| s.is_finite() && *s > 0.0) {
            let whole = seconds.ceil() as u64;
            if whole > self.settings.max_seconds {
                return Err(TranscribeError::TooLong {
                    seconds: whole,
                    max: self.settings.max_seconds,
                });
            }
        }
        Ok(())
    }

    /// Fetches a voice message from `url` (within [`Transcriber::max_bytes`])
    /// and transcribes it: [`Transcriber::admit`], the download, then
    /// [`Transcriber::transcribe`].
    ///
    /// # Errors
    /// A [`TranscribeError`] the sender is told.
    pub async fn fetch_and_transcribe(
        &self,
        fetcher: &Fetcher,
        url: &str,
        note: RemoteVoice<'_>,
        auth: Option<&BasicAuth>,
    ) -> Result<String, TranscribeError> {
        self.admit(note.bytes, note.seconds)?;
        let downloaded = fetcher
            .fetch(url, note.file_name, self.settings.max_bytes, auth)
            .await
            .map_err(|refusal| match refusal {
                lemon_core::media::MediaRefusal::TooLarge { bytes, max, .. } => {
                    TranscribeError::TooLarge { bytes, max }
                }
                other => TranscribeError::Fetch(other),
            })?;
        let mime = note
            .mime
            .map(str::to_owned)
            .or(downloaded.content_type)
            .unwrap_or_else(|| lemon_core::media::mime_of_name(note.file_name).to_owned());
        self.transcribe(VoiceNote {
            audio: &downloaded.bytes,
            file_name: note.file_name,
            mime: &mime,
            seconds: note.seconds,
        })
        .await
    }

    /// The words of `note`.
    ///
    /// # Errors
    /// A [`TranscribeError`] the sender is told: over the limits, the
    /// service refused or failed, or heard nothing.
    pub async fn transcribe(&self, note: VoiceNote<'_>) -> Result<String, TranscribeError> {
        self.admit(Some(note.audio.len() as u64), note.seconds)?;
        let mime = clean_mime(note.mime);
        let note = VoiceNote { mime: &mime, ..note };
        let request = match self.settings.provider {
            TranscriptionProvider::OpenAi => self.openai_request(note),
            TranscriptionProvider::Deepgram => self.deepgram_request(note),
        };
        let response = request.send().await.map_err(|err| self.network_error(&err))?;
        let status = response.status().as_u16();
        let body = response.bytes().await.map_err(|err| self.network_error(&err))?;
        if !(200..300).contains(&status) {
            return Err(match status {
                401 | 403 => TranscribeError::Rejected { status },
                429 => TranscribeError::RateLimited,
                _ => TranscribeError::Status { status, message: self.service_message(&body) },
            });
        }
        let value: Value = serde_json::from_slice(&body)
            .map_err(|_| TranscribeError::Invalid("not JSON".to_owned()))?;
        let text = match self.settings.provider {
            TranscriptionProvider::OpenAi => value.get("text").and_then(Value::as_str),
            TranscriptionProvider::Deepgram => value
                .pointer("/results/channels/0/alternatives/0/transcript")
                .and_then(Value::as_str),
        };
        let Some(text) = text else {
            let field = match self.settings.provider {
                TranscriptionProvider::OpenAi => "no `text`",
                TranscriptionProvider::Deepgram => {
                    "no `results.channels[0].alternatives[0].transcript`"
                }
            };
            return Err(TranscribeError::Invalid(field.to_owned()));
        };
        let text = text.trim();
        if text.is_empty() {
            return Err(TranscribeError::NoSpeech);
        }
        Ok(text.to_owned())
    }

    fn openai_request(&self, note: VoiceNote<'_>) -> reqwest::RequestBuilder {
        let boundary = boundary_for(note.audio);
        let body = multipart(
            &boundary,
            &[("model", &self.settings.model), ("response_format", "json")],
            ("file", note.file_name, note.mime, note.audio),
        );
        self.client
            .post(format!("{}/audio/transcriptions", self.settings.base_url))
            .bearer_auth(self.settings.api_key.expose())
            .header("content-type", format!("multipart/form-data; boundary={boundary}"))
            .body(body)
    }

    fn deepgram_request(&self, note: VoiceNote<'_>) -> reqwest::RequestBuilder {
        let base = self.settings.base_url.trim_end_matches("/v1");
        self.client
            .post(format!("{base}/v1/listen"))
            .query(&[("model", self.settings.model.as_str()), ("smart_format", "true")])
            .header("authorization", format!("Token {}", self.settings.api_key.expose()))
            .header("content-type", note.mime)
            .body(note.audio.to_vec())
    }

    fn network_error(&self, err: &reqwest::Error) -> TranscribeError {
        if err.is_timeout() {
            return TranscribeError::Timeout(self.settings.timeout.as_secs());
        }
        let host = reqwest::Url::parse(&self.settings.base_url)
            .ok()
            .and_then(|u| u.host_str().map(str::to_owned))
            .unwrap_or_default();
        let why = if err.is_connect() { "no connection" } else { "the request failed" };
        TranscribeError::Unreachable(format!("{host}: {why}"))
    }

    /// The service's own error message (OpenAI's `error.message`,
    /// Deepgram's `err_msg`), short, on one line, without the key.
    fn service_message(&self, body: &[u8]) -> String {
        let value: Option<Value> = serde_json::from_slice(body).ok();
        let found = value.as_ref().and_then(|v| {
            v.pointer("/error/message")
                .or_else(|| v.get("err_msg"))
                .or_else(|| v.get("message"))
                .or_else(|| v.get("error"))
                .and_then(Value::as_str)
                .map(str::to_owned)
        });
        let text = found.unwrap_or_else(|| String::from_utf8_lossy(body).into_owned());
        let key = self.settings.api_key.expose();
        let text = if key.len() >= 4 { text.replace(key, "***") } else { text };
        let line: String =
            text.chars().map(|c| if c.is_control() { ' ' } else { c }).take(200).collect();
        let line = line.trim();
        if line.is_empty() {
            "no message".to_owned()
        } else {
            line.to_owned()
        }
    }
}

/// A voice message a channel points to, as it describes it.
#[derive(Debug, Clone, Copy)]
pub struct RemoteVoice<'a> {
    pub file_name: &'a str,
    /// The media type the channel claims.
    pub mime: Option<&'a str>,
    /// The size the channel announced.
    pub bytes: Option<u64>,
    /// The length the channel announced, in seconds.
    pub seconds: Option<f64>,
}

/// `mime` when it is a plain `type/subtype`, else `application/octet-stream`.
fn clean_mime(mime: &str) -> String {
    let mime = mime.split(';').next().unwrap_or_default().trim().to_ascii_lowercase();
    let part = |s: &str| {
        !s.is_empty()
            && s.len() <= 64
            && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"+-.".contains(&b))
    };
    match mime.split_once('/') {
        Some((top, sub)) if part(top) && part(sub) => mime,
        _ => "application/octet-stream".to_owned(),
    }
}

/// A boundary that does not occur in `content`.
fn boundary_for(content: &[u8]) -> String {
    let mut seed = u64::from(u32::try_from(content.len() % 0xffff_ffff).unwrap_or(0));
    loop {
        let boundary = format!("lemon-voice-{seed:016x}");
        if !content.windows(boundary.len()).any(|w| w == boundary.as_bytes()) {
            return boundary;
        }
        seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
    }
}

/// A `multipart/form-data` body: the text `fields`, then one file
/// `(field, file name, media type, bytes)`.
fn multipart(boundary: &str, fields: &[(&str, &str)], file: (&str, &str, &str, &[u8])) -> Vec<u8> {
    let mut body = Vec::with_capacity(file.3.len() + 512);
    for (name, value) in fields {
        body.extend_from_slice(
            format!(
                "--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"\r\n\r\n{value}\r\n"
            )
            .as_bytes(),
        );
    }
    let (field, file_name, mime, bytes) = file;
    let file_name: String = file_name
        .chars()
        .map(|c| if c == '"' || c == '\\' || c.is_control() { '_' } else { c })
        .collect();
    body.extend_from_slice(
        format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"{field}\"; filename=\"{file_name}\"\r\nContent-Type: {mime}\r\n\r\n"
        )
        .as_bytes(),
    );
    body.extend_from_slice(bytes);
    body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    body
}
