//! ElevenLabs text-to-speech: one streaming request per sentence, answered
//! with μ-law at 8 kHz (`ulaw_8000`, Twilio's format) or 16-bit PCM at 8 kHz
//! (`pcm_8000`, encoded to μ-law here). Cancelled by dropping the stream.

use std::time::Duration;

use bytes::Bytes;
use futures::{Stream, StreamExt};
use serde_json::json;

use crate::config::VoiceConfig;
use crate::g711;

/// How long a sentence may take to start sounding.
const FIRST_BYTE_TIMEOUT: Duration = Duration::from_secs(10);

/// The ElevenLabs settings a call speaks with.
#[derive(Clone)]
pub(crate) struct Speaker {
    pub(crate) http: reqwest::Client,
    pub(crate) url: String,
    pub(crate) model_id: String,
    pub(crate) api_key: String,
    pub(crate) pcm: bool,
}

impl std::fmt::Debug for Speaker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Speaker").field("url", &self.url).finish_non_exhaustive()
    }
}

/// Why a sentence was not spoken; never holds the key.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SpeakError {
    #[error("ElevenLabs answered {0}")]
    Status(u16),
    #[error("ElevenLabs could not be reached: {0}")]
    Network(String),
}

impl Speaker {
    pub(crate) fn new(config: &VoiceConfig, api_key: String, http: reqwest::Client) -> Self {
        let url = format!(
            "{}/v1/text-to-speech/{}/stream?output_format={}",
            config.elevenlabs_base_url.trim_end_matches('/'),
            config.elevenlabs_voice_id,
            config.elevenlabs_output_format
        );
        Speaker {
            http,
            url,
            model_id: config.elevenlabs_model_id.clone(),
            api_key,
            pcm: config.elevenlabs_output_format == "pcm_8000",
        }
    }

    /// The μ-law audio of `text`, as it streams in.
    pub(crate) async fn speak(
        &self,
        text: &str,
    ) -> Result<impl Stream<Item = Result<Bytes, SpeakError>> + Send + 'static, SpeakError> {
        let body = json!({ "text": text, "model_id": self.model_id });
        let response = self
            .http
            .post(&self.url)
            .header("xi-api-key", &self.api_key)
            .json(&body)
            .timeout(FIRST_BYTE_TIMEOUT)
            .send()
            .await
            .map_err(|e| SpeakError::Network(without_url(&e)))?;
        let status = response.status().as_u16();
        if status != 200 {
            return Err(SpeakError::Status(status));
        }
        let pcm = self.pcm;
        let mut odd: Option<u8> = None;
        Ok(response.bytes_stream().map(move |chunk| {
            let chunk = chunk.map_err(|e| SpeakError::Network(without_url(&e)))?;
            if !pcm {
                return Ok(chunk);
            }
            // A sample may be split across chunks.
            let mut bytes = Vec::with_capacity(chunk.len() + 1);
            bytes.extend(odd.take());
            bytes.extend_from_slice(&chunk);
            if bytes.len() % 2 == 1 {
                odd = bytes.pop();
            }
            Ok(Bytes::from(g711::encode_pcm16le(&bytes)))
        }))
    }
}

fn without_url(err: &reqwest::Error) -> String {
    let text = err.to_string();
    match err.url() {
        Some(url) => text.replace(url.as_str(), "<elevenlabs>"),
        None => text,
    }
}

/// Splits streamed text into sentences as they complete: a sentence ends at
/// `.`, `!`, `?` or `;` followed by whitespace, or at a line break.
#[derive(Debug, Default)]
pub(crate) struct Sentences {
    pending: String,
}

impl Sentences {
    /// Adds a piece of text; the sentences it completes.
    pub(crate) fn push(&mut self, piece: &str) -> Vec<String> {
        self.pending.push_str(piece);
        let mut out = Vec::new();
        loop {
            let bytes = self.pending.as_bytes();
            let end = bytes.iter().enumerate().position(|(i, &b)| {
                b == b'\n'
                    || (matches!(b, b'.' | b'!' | b'?' | b';')
                        && bytes.get(i + 1).is_some_and(|n| n.is_ascii_whitespace()))
            });
            let Some(end) = end else { break };
            let rest = self.pending.split_off(end + 1);
            let sentence = std::mem::replace(&mut self.pending, rest);
            let sentence = sentence.trim();
            if !sentence.is_empty() {
                out.push(sentence.to_owned());
            }
        }
        out
    }

    /// What is left at the end of the answer.
    pub(crate) fn finish(&mut self) -> Option<String> {
        let rest = std::mem::take(&mut self.pending);
        let rest = rest.trim();
        (!rest.is_empty()).then(|| rest.to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sentences_complete_as_the_answer_streams() {
        let mut sentences = Sentences::default();
        assert!(sentences.push("It is ten").is_empty());
        assert!(sentences.push(" o'clock.").is_empty());
        assert_eq!(
            sentences.push(" Anything else? I can"),
            vec!["It is ten o'clock.", "Anything else?"]
        );
        assert_eq!(sentences.push(" help\nwith 3.5 things"), vec!["I can help"]);
        assert_eq!(sentences.finish().as_deref(), Some("with 3.5 things"));
        assert_eq!(sentences.finish(), None);
    }

    #[test]
    fn the_request_url_names_the_voice_and_the_output_format() {
        let speaker = Speaker::new(&VoiceConfig::default(), "k".into(), reqwest::Client::new());
        assert_eq!(
            speaker.url,
            "https://api.elevenlabs.io/v1/text-to-speech/21m00Tcm4TlvDq8ikWAM/stream?output_format=ulaw_8000"
        );
        assert!(!speaker.pcm);
    }
}
