//! What the chat channels share for files and voice messages people send:
//! fetching a file a message points to, keeping it in the gateway's stage
//! ([`lemon_core::media`]), and turning a voice message into words.
//!
//! - [`fetch`]: a capped download. A file larger than the channel's
//!   `max_download_bytes` is refused by its `Content-Length` before a byte of
//!   it is read, and a download that goes past the limit stops there (never
//!   more than the limit and one chunk in memory). URLs that come from
//!   outside never reach a private or loopback address unless the channel
//!   allows it (its own API is on this machine: a test's fake, a proxy):
//!   every hop of a redirect is resolved, checked and pinned like a webhook
//!   callback, and credentials go only to the URL's own origin.
//! - [`transcribe`]: a voice message's words from an OpenAI-compatible
//!   `/audio/transcriptions` or Deepgram's pre-recorded `/v1/listen`, with
//!   the size and length limits checked before anything is uploaded.
//! - [`voice`]: the voice keys of a chat channel's section
//!   (`voice_transcription`, `voice_transcription_model`, …), the same for
//!   every channel, and the [`Transcriber`] they
//!   build.
//!
//! A refusal's text ([`MediaRefusal`], [`TranscribeError`])
//! is the reply the sender sees; none holds a URL's query, a token or a key.

pub mod fetch;
pub mod transcribe;
pub mod voice;

use lemon_core::media::{check_file_name, Attachment, FilesConfig, MediaRefusal, MediaStage};

pub use fetch::{BasicAuth, Downloaded, Fetcher};
pub use transcribe::{TranscribeError, Transcriber, TranscriberSettings, TranscriptionProvider};
pub use voice::VoiceConfig;

/// The prompt of a message that brought files and no text.
pub const FILES_ONLY_PROMPT: &str = "(files attached)";

/// The reply that shows a voice message's words before its run
/// (`show_transcript`).
pub fn heard(transcript: &str) -> String {
    format!("heard: {transcript}")
}

/// Whether `url` names this machine or a private network (a literal private
/// or loopback address, or a localhost name): a channel whose own API is
/// configured there (a test's fake, a local proxy) fetches its files from
/// there too, so its fetcher allows private addresses.
pub fn is_local_url(url: &str) -> bool {
    let Ok(url) = reqwest::Url::parse(url.trim()) else { return false };
    let host = url.host_str().unwrap_or_default();
    match host.trim_start_matches('[').trim_end_matches(']').parse::<std::net::IpAddr>() {
        Ok(ip) => lemon_core::net::is_private(ip),
        Err(_) => {
            lemon_core::net::is_localhost_name(&host.trim_end_matches('.').to_ascii_lowercase())
        }
    }
}

/// A file a message points to, as the channel describes it.
#[derive(Debug, Clone, Copy)]
pub struct RemoteFile<'a> {
    /// Where it is fetched from. Never logged or shown (it may carry a token).
    pub url: &'a str,
    /// The name the sender gave it, if any.
    pub name: Option<&'a str>,
    /// The name used when it has none (`photo-<id>.jpg`).
    pub fallback: &'a str,
    /// The media type the channel claims.
    pub mime: Option<&'a str>,
    /// The size the channel announced, if it did.
    pub size: Option<u64>,
}

/// Checks what can be checked before a byte is fetched (the name, the deny
/// globs, the announced size), then fetches the file within `files`'
/// `max_download_bytes` and keeps it in `stage`.
///
/// # Errors
/// A [`MediaRefusal`] the sender is told.
pub async fn fetch_and_keep(
    fetcher: &Fetcher,
    stage: &MediaStage,
    files: &FilesConfig,
    file: RemoteFile<'_>,
    auth: Option<&BasicAuth>,
) -> Result<Attachment, MediaRefusal> {
    let name = match file.name.filter(|n| !n.trim().is_empty()) {
        Some(name) => check_file_name(name)?,
        None => check_file_name(file.fallback)?,
    };
    if let Some(glob) = files.denied_by(&name) {
        return Err(MediaRefusal::Denied { name, glob });
    }
    let max = files.max_download_bytes;
    if let Some(size) = file.size.filter(|size| *size > max) {
        return Err(MediaRefusal::TooLarge { name, bytes: size, max });
    }
    let downloaded = fetcher.fetch(file.url, &name, max, auth).await?;
    let mime = file.mime.map(str::to_owned).or(downloaded.content_type);
    keep(stage, files, name, mime, downloaded.bytes).await
}

/// [`MediaStage::keep`] off the async threads (it writes and syncs the file).
///
/// # Errors
/// A [`MediaRefusal`] the sender is told.
pub async fn keep(
    stage: &MediaStage,
    files: &FilesConfig,
    name: String,
    mime: Option<String>,
    bytes: Vec<u8>,
) -> Result<Attachment, MediaRefusal> {
    let (stage, files) = (stage.clone(), files.clone());
    let fallback = name.clone();
    tokio::task::spawn_blocking(move || {
        stage.keep(&files, Some(&name), &name, mime.as_deref(), &bytes)
    })
    .await
    .unwrap_or_else(|_| Err(MediaRefusal::Save(format!("{fallback} could not be written"))))
}

/// The refusals of a message's files as one reply, one a line.
pub fn refusals_text(refusals: &[MediaRefusal]) -> Option<String> {
    match refusals {
        [] => None,
        [one] => Some(one.to_string()),
        many => Some(many.iter().map(|r| format!("- {r}")).collect::<Vec<_>>().join("\n")),
    }
}

#[cfg(test)]
mod tests;
