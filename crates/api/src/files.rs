//! Files sent with a request over HTTP: the control API's `attachments`, the
//! OpenAI-compatible routes' image and file parts, a webhook's attachments.
//!
//! Each file comes as base64 text (or a `data:` URL) or as an `http(s)` URL,
//! and is checked against a `files` section ([`FilesConfig`]) before it costs
//! anything: a name a sender gave is checked first (no directory in it, not
//! refused by `deny_globs`), base64 is measured before it is decoded, and a
//! URL is fetched with a capped download. The file is then kept in the
//! [`MediaStage`] until its run starts ([`receive`]).
//!
//! A URL never reaches a loopback, private or link-local address unless the
//! section's `allow_private_hosts` is on: the host is resolved, every address
//! checked, and the connection pinned to the checked address (no second
//! lookup, no proxy); each redirect (at most [`MAX_REDIRECTS`]) is checked
//! the same way. A URL is never logged, and an error names only what the
//! sender gave (it may carry a token).
//!
//! Either every file of a request is kept or none is: the first refusal
//! discards what was staged, and so does dropping the [`Staged`] files of a
//! request that was not accepted.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use base64::Engine as _;
use lemon_core::media::{
    check_file_name, sniff_image, Attachment, FilesConfig, MediaRefusal, MediaStage,
};
use lemon_core::net::{is_localhost_name, is_private};

use crate::error::MAX_BODY_BYTES;

/// Room beside the base64 of one file in a body that carries it: the JSON
/// around it and the prompt.
pub const ATTACHMENT_BODY_SLACK: usize = 64 * 1024;

/// Most files one request may carry.
pub const MAX_FILES: usize = 16;

/// Most redirects followed when a URL is fetched.
pub const MAX_REDIRECTS: usize = 5;

/// How long one fetch may take, body included.
const FETCH_TIMEOUT: Duration = Duration::from_secs(60);

/// How long connecting to a URL's host may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The largest body a route that takes files accepts: `base`, or one file of
/// `max_download_bytes` in base64 with [`ATTACHMENT_BODY_SLACK`] when that is
/// more (and files are enabled).
pub fn body_limit(files: &FilesConfig, base: usize) -> usize {
    if !files.enabled {
        return base;
    }
    let encoded = files.max_download_bytes.div_ceil(3).saturating_mul(4);
    let with_slack =
        usize::try_from(encoded).unwrap_or(usize::MAX).saturating_add(ATTACHMENT_BODY_SLACK);
    base.max(with_slack)
}

/// `[gateway.files]` and the stage: what the control API needs to take files.
#[derive(Debug, Clone)]
pub struct FileIntake {
    /// Where files wait for their run.
    pub stage: MediaStage,
    pub config: Arc<FilesConfig>,
}

impl FileIntake {
    pub fn new(stage: MediaStage, config: FilesConfig) -> Self {
        FileIntake { stage, config: Arc::new(config) }
    }

    /// The body limit of the routes that take files (see [`body_limit`]).
    pub fn body_limit(&self) -> usize {
        body_limit(&self.config, MAX_BODY_BYTES)
    }

    /// Checks and stages `incoming` (see [`receive`]).
    ///
    /// # Errors
    /// The first file refused, naming it.
    pub async fn receive(&self, incoming: Vec<IncomingFile>) -> Result<Staged, AttachmentError> {
        receive(&self.stage, &self.config, incoming).await
    }
}

/// Where a file's bytes are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileSource {
    /// Base64 text (standard or URL-safe alphabet, padding optional, line
    /// breaks allowed).
    Base64(String),
    /// An `http(s)` URL to fetch, or a `data:…;base64,…` URL.
    Url(String),
}

/// A file as a request sent it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IncomingFile {
    /// Where it is in the request, for errors: `attachments[0]`.
    pub label: String,
    /// The name the sender gave: refused when it is not a plain file name.
    pub name: Option<String>,
    /// The media type the sender claimed.
    pub mime: Option<String>,
    pub source: FileSource,
}

/// Why a file was not taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// Refused by the `files` section, or it could not be fetched or saved.
    #[error(transparent)]
    Media(#[from] MediaRefusal),
    /// The request is malformed: not base64, not a URL, both or neither.
    #[error("{0}")]
    Invalid(String),
}

/// A file refused, and where it was in the request. The text is the error
/// the sender gets: `attachments[0] (notes.txt): …`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{label}: {refusal}")]
pub struct AttachmentError {
    /// The file's place in the request, with its name when it has one.
    pub label: String,
    pub refusal: Refusal,
}

impl AttachmentError {
    fn new(file: &IncomingFile, refusal: impl Into<Refusal>) -> Self {
        let name = file.name.as_deref().map(str::trim).filter(|name| !name.is_empty());
        let label = match name {
            Some(name) => format!("{} ({})", file.label, shown(name)),
            None => file.label.clone(),
        };
        AttachmentError { label, refusal: refusal.into() }
    }

    /// `403` when files are not accepted, `413` for a file too large, `422`
    /// for one that could not be fetched, `500` for one that could not be
    /// saved, `400` for the rest (a name refused, bad base64, a bad URL).
    pub fn status(&self) -> StatusCode {
        match &self.refusal {
            Refusal::Media(MediaRefusal::Disabled | MediaRefusal::UserNotAllowed) => {
                StatusCode::FORBIDDEN
            }
            Refusal::Media(MediaRefusal::TooLarge { .. }) => StatusCode::PAYLOAD_TOO_LARGE,
            Refusal::Media(MediaRefusal::Fetch(_)) => StatusCode::UNPROCESSABLE_ENTITY,
            Refusal::Media(MediaRefusal::Save(_)) => StatusCode::INTERNAL_SERVER_ERROR,
            // A name refused, or a refusal of the `/file` commands (not made here).
            Refusal::Media(_) | Refusal::Invalid(_) => StatusCode::BAD_REQUEST,
        }
    }

    /// Whether the fault is the gateway's (the file could not be saved).
    pub fn is_internal(&self) -> bool {
        matches!(self.refusal, Refusal::Media(MediaRefusal::Save(_)))
    }
}

/// A name as an error shows it: one line, controls escaped, at most 120 bytes.
fn shown(name: &str) -> String {
    lemon_core::log_text::escape_within(name, 120)
}

/// Files kept in the stage for a request. Dropped before
/// [`Staged::hand_over`] (the request was refused, or its handler was
/// dropped), they are removed from the stage.
#[derive(Debug)]
pub struct Staged {
    stage: MediaStage,
    attachments: Vec<Attachment>,
    handed_over: bool,
}

impl Staged {
    fn new(stage: &MediaStage) -> Self {
        Staged { stage: stage.clone(), attachments: Vec::new(), handed_over: false }
    }

    /// The files, to record in the request's metadata
    /// ([`lemon_core::media::add_attachments`]).
    pub fn attachments(&self) -> &[Attachment] {
        &self.attachments
    }

    /// The request was accepted: its run owns the files now.
    pub fn hand_over(mut self) {
        self.handed_over = true;
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        if !self.handed_over {
            self.stage.discard(&self.attachments);
        }
    }
}

/// Checks each of `incoming` against `files` and keeps it in `stage`, in
/// order. A name the sender gave is checked before the file is decoded or
/// fetched; base64 is measured before it is decoded; a download stops at
/// `max_download_bytes`.
///
/// # Errors
/// The first file refused; the files staged before it are removed.
pub async fn receive(
    stage: &MediaStage,
    files: &FilesConfig,
    incoming: Vec<IncomingFile>,
) -> Result<Staged, AttachmentError> {
    let mut staged = Staged::new(stage);
    if incoming.is_empty() {
        return Ok(staged);
    }
    if !files.enabled {
        return Err(AttachmentError::new(&incoming[0], MediaRefusal::Disabled));
    }
    if incoming.len() > MAX_FILES {
        let label = format!("{} files", incoming.len());
        let refusal = Refusal::Invalid(format!("a request may carry at most {MAX_FILES} files"));
        return Err(AttachmentError { label, refusal });
    }
    for (index, file) in incoming.into_iter().enumerate() {
        let attachment = receive_one(stage, files, &file, index + 1).await?;
        staged.attachments.push(attachment);
    }
    Ok(staged)
}

async fn receive_one(
    stage: &MediaStage,
    files: &FilesConfig,
    file: &IncomingFile,
    number: usize,
) -> Result<Attachment, AttachmentError> {
    let refuse = |refusal: Refusal| AttachmentError::new(file, refusal);
    let given = file.name.as_deref().filter(|name| !name.trim().is_empty());
    if let Some(name) = given {
        let name = check_file_name(name).map_err(|r| refuse(r.into()))?;
        if let Some(glob) = files.denied_by(&name) {
            return Err(refuse(MediaRefusal::Denied { name, glob }.into()));
        }
    }
    // What a refusal calls the file: its name, else the URL's, else "the file".
    let shown_name = match (given, &file.source) {
        (Some(name), _) => shown(name),
        (None, FileSource::Url(url)) => reqwest::Url::parse(url.trim())
            .ok()
            .filter(|url| matches!(url.scheme(), "http" | "https"))
            .and_then(|url| last_segment(&url))
            .map_or_else(|| "the file".to_owned(), |name| shown(&name)),
        (None, FileSource::Base64(_)) => "the file".to_owned(),
    };
    let (bytes, found_mime, found_name) =
        bytes_of(&file.source, files, &shown_name).await.map_err(refuse)?;
    let mime = file.mime.clone().or(found_mime);
    let name = match given {
        Some(name) => name.to_owned(),
        None => {
            let fallback = fallback_name(number, mime.as_deref(), &bytes);
            found_name.unwrap_or(fallback)
        }
    };
    let (stage, files) = (stage.clone(), files.clone());
    let kept = tokio::task::spawn_blocking(move || {
        stage.keep(&files, Some(&name), &name, mime.as_deref(), &bytes)
    })
    .await
    .map_err(|err| refuse(MediaRefusal::Save(err.to_string()).into()))?;
    kept.map_err(|refusal| refuse(refusal.into()))
}

/// A file's bytes, with the media type and name its source gave.
async fn bytes_of(
    source: &FileSource,
    files: &FilesConfig,
    name: &str,
) -> Result<(Vec<u8>, Option<String>, Option<String>), Refusal> {
    let max = files.max_download_bytes;
    match source {
        FileSource::Base64(text) => Ok((decode_base64(text, max, name)?, None, None)),
        FileSource::Url(url) => match parse_data_url(url) {
            Some(parsed) => {
                let (mime, data) = parsed.map_err(Refusal::Invalid)?;
                Ok((decode_base64(data, max, name)?, mime, None))
            }
            None => {
                let fetched = fetch(url, max, files.allow_private_hosts, name).await?;
                Ok((fetched.bytes, fetched.mime, fetched.name))
            }
        },
    }
}

/// `attachment-<n>` with the extension of the file's type.
fn fallback_name(number: usize, mime: Option<&str>, bytes: &[u8]) -> String {
    let mime = sniff_image(bytes).or(mime);
    let ext = mime.and_then(extension_of_mime).map(|ext| format!(".{ext}")).unwrap_or_default();
    format!("attachment-{number}{ext}")
}

/// The usual extension of a media type, for the common kinds.
pub fn extension_of_mime(mime: &str) -> Option<&'static str> {
    let essence = mime.split(';').next().unwrap_or_default().trim().to_ascii_lowercase();
    Some(match essence.as_str() {
        "image/png" => "png",
        "image/jpeg" | "image/jpg" => "jpg",
        "image/gif" => "gif",
        "image/webp" => "webp",
        "application/pdf" => "pdf",
        "text/plain" => "txt",
        "text/markdown" => "md",
        "text/csv" => "csv",
        "application/json" => "json",
        "application/zip" => "zip",
        "audio/ogg" => "ogg",
        "audio/mpeg" => "mp3",
        "audio/wav" | "audio/x-wav" => "wav",
        _ => return None,
    })
}

/// The size base64 `text` decodes to, counted without decoding (line breaks
/// and blanks skipped, padding optional).
///
/// # Errors
/// A message when the text cannot be base64: padding before the end, or a
/// length no base64 has.
pub fn decoded_len(text: &str) -> Result<u64, String> {
    let (mut data, mut padding) = (0u64, 0u64);
    for byte in text.bytes() {
        match byte {
            b if b.is_ascii_whitespace() => {}
            b'=' => padding += 1,
            _ if padding > 0 => return Err("it is not base64: `=` before its end".to_owned()),
            _ => data += 1,
        }
    }
    if padding > 2 {
        return Err("it is not base64: more than two `=` at its end".to_owned());
    }
    let tail = match data % 4 {
        0 => 0,
        2 => 1,
        3 => 2,
        _ => return Err("it is not base64: its length is not one base64 has".to_owned()),
    };
    Ok(data / 4 * 3 + tail)
}

/// Decodes base64 `text` after checking that it fits in `max` bytes.
fn decode_base64(text: &str, max: u64, name: &str) -> Result<Vec<u8>, Refusal> {
    let size = decoded_len(text).map_err(Refusal::Invalid)?;
    if size > max {
        return Err(MediaRefusal::TooLarge { name: name.to_owned(), bytes: size, max }.into());
    }
    let compact: std::borrow::Cow<'_, str> = if text.bytes().any(|b| b.is_ascii_whitespace()) {
        text.chars().filter(|c| !c.is_ascii_whitespace()).collect::<String>().into()
    } else {
        text.into()
    };
    let config = GeneralPurposeConfig::new()
        .with_decode_padding_mode(DecodePaddingMode::Indifferent)
        .with_decode_allow_trailing_bits(true);
    let alphabet = if compact.contains(['-', '_']) {
        &base64::alphabet::URL_SAFE
    } else {
        &base64::alphabet::STANDARD
    };
    GeneralPurpose::new(alphabet, config)
        .decode(compact.as_bytes())
        .map_err(|err| Refusal::Invalid(format!("it is not base64: {err}")))
}

/// A `data:` URL's media type and base64 text; `None` for a URL that is not
/// a `data:` URL.
///
/// # Errors
/// A message for a `data:` URL without a comma, or not base64.
pub fn parse_data_url(url: &str) -> Option<Result<(Option<String>, &str), String>> {
    let url = url.trim();
    let scheme = url.get(..5)?;
    if !scheme.eq_ignore_ascii_case("data:") {
        return None;
    }
    let Some((header, data)) = url[5..].split_once(',') else {
        return Some(Err("the data URL has no `,` before its data".to_owned()));
    };
    let mut parts = header.split(';').map(str::trim);
    let mime = parts.next().filter(|mime| !mime.is_empty()).map(str::to_ascii_lowercase);
    if !parts.any(|part| part.eq_ignore_ascii_case("base64")) {
        return Some(Err("only base64 data URLs are taken (data:<type>;base64,<data>)".to_owned()));
    }
    Some(Ok((mime, data)))
}

/// A file downloaded from a URL.
#[derive(Debug)]
struct Fetched {
    bytes: Vec<u8>,
    mime: Option<String>,
    /// From `Content-Disposition`, else the URL's last path segment; only
    /// a plain file name.
    name: Option<String>,
}

/// Downloads `raw` (an `http(s)` URL), at most `max` bytes, following at most
/// [`MAX_REDIRECTS`] redirects, each checked against private addresses
/// unless `allow_private`.
async fn fetch(raw: &str, max: u64, allow_private: bool, name: &str) -> Result<Fetched, Refusal> {
    let fetch_error = |why: String| Refusal::Media(MediaRefusal::Fetch(why));
    let mut url = reqwest::Url::parse(raw.trim())
        .map_err(|err| Refusal::Invalid(format!("not a URL: {err}")))?;
    for _ in 0..=MAX_REDIRECTS {
        if !matches!(url.scheme(), "http" | "https") {
            return Err(Refusal::Invalid("the URL must be http, https or data".to_owned()));
        }
        let (domain, addrs) = checked_target(&url, allow_private).await.map_err(fetch_error)?;
        let mut builder = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .timeout(FETCH_TIMEOUT)
            .connect_timeout(CONNECT_TIMEOUT);
        if let Some(domain) = &domain {
            builder = builder.resolve_to_addrs(domain, &addrs);
        }
        let client = builder.build().map_err(|err| fetch_error(err.without_url().to_string()))?;
        let response = client
            .get(url.clone())
            .send()
            .await
            .map_err(|err| fetch_error(err.without_url().to_string()))?;
        let status = response.status();
        if status.is_redirection() {
            let location = response
                .headers()
                .get(reqwest::header::LOCATION)
                .and_then(|value| value.to_str().ok())
                .ok_or_else(|| {
                    fetch_error(format!("the server answered {status} without a Location"))
                })?;
            url = url
                .join(location)
                .map_err(|err| fetch_error(format!("the server redirected to a bad URL: {err}")))?;
            continue;
        }
        if !status.is_success() {
            return Err(fetch_error(format!("the server answered {status}")));
        }
        return read_capped(response, &url, max, name).await;
    }
    Err(fetch_error(format!("more than {MAX_REDIRECTS} redirects")))
}

/// The body of `response`, refused once it is past `max` bytes.
async fn read_capped(
    mut response: reqwest::Response,
    url: &reqwest::Url,
    max: u64,
    name: &str,
) -> Result<Fetched, Refusal> {
    let too_large = |bytes: u64| MediaRefusal::TooLarge { name: name.to_owned(), bytes, max };
    if let Some(length) = response.content_length().filter(|length| *length > max) {
        return Err(too_large(length).into());
    }
    let headers = response.headers();
    let mime = headers
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.split(';').next())
        .map(|essence| essence.trim().to_ascii_lowercase())
        .filter(|essence| !essence.is_empty());
    // The server's name if it is a plain one, else the URL's.
    let disposition = headers
        .get(reqwest::header::CONTENT_DISPOSITION)
        .and_then(|value| value.to_str().ok())
        .and_then(disposition_name);
    let name = [disposition, last_segment(url)]
        .into_iter()
        .flatten()
        .find(|name| check_file_name(name).is_ok());
    let mut bytes = Vec::new();
    loop {
        let chunk = response
            .chunk()
            .await
            .map_err(|err| Refusal::Media(MediaRefusal::Fetch(err.without_url().to_string())))?;
        let Some(chunk) = chunk else { break };
        let total = bytes.len() as u64 + chunk.len() as u64;
        if total > max {
            return Err(too_large(total).into());
        }
        bytes.extend_from_slice(&chunk);
    }
    Ok(Fetched { bytes, mime, name })
}

/// The host name to pin (none for an address) and the addresses to connect
/// to, once every one is checked.
async fn checked_target(
    url: &reqwest::Url,
    allow_private: bool,
) -> Result<(Option<String>, Vec<SocketAddr>), String> {
    let port = url.port_or_known_default().ok_or_else(|| "the URL has no port".to_owned())?;
    let host = url.host_str().unwrap_or_default();
    let literal = host.trim_start_matches('[').trim_end_matches(']').parse::<IpAddr>().ok();
    let private = |what: &str| {
        format!("{what} is a private or loopback address (allow_private_hosts is off)")
    };
    let (domain, addrs) = match literal {
        Some(ip) => (None, vec![SocketAddr::new(ip, port)]),
        None => {
            let name = host.trim().trim_end_matches('.').to_ascii_lowercase();
            if name.is_empty() {
                return Err("the URL has no host".to_owned());
            }
            if !allow_private && is_localhost_name(&name) {
                return Err(private(&name));
            }
            let addrs: Vec<SocketAddr> = tokio::net::lookup_host((name.as_str(), port))
                .await
                .map_err(|err| format!("could not resolve {name}: {err}"))?
                .collect();
            (Some(name), addrs)
        }
    };
    if addrs.is_empty() {
        return Err(format!("{} has no address", domain.unwrap_or_default()));
    }
    if !allow_private {
        if let Some(addr) = addrs.iter().find(|addr| is_private(addr.ip())) {
            return Err(private(&addr.ip().to_string()));
        }
    }
    Ok((domain, addrs))
}

/// `filename*=UTF-8''…` or `filename="…"` of a `Content-Disposition`.
fn disposition_name(value: &str) -> Option<String> {
    let mut plain = None;
    for part in value.split(';').map(str::trim) {
        let Some((key, raw)) = part.split_once('=') else { continue };
        match key.trim().to_ascii_lowercase().as_str() {
            "filename*" => {
                let encoded = raw.trim().rsplit_once('\'').map_or(raw, |(_, text)| text);
                if let Some(name) = percent_decode(encoded).filter(|n| !n.trim().is_empty()) {
                    return Some(name);
                }
            }
            "filename" => {
                let name = raw.trim().trim_matches('"').to_owned();
                if !name.trim().is_empty() {
                    plain = Some(name);
                }
            }
            _ => {}
        }
    }
    plain
}

/// The URL's last path segment, decoded.
fn last_segment(url: &reqwest::Url) -> Option<String> {
    let segment = url.path_segments()?.rev().find(|segment| !segment.is_empty())?;
    percent_decode(segment).filter(|name| !name.trim().is_empty())
}

/// Decodes `%XX`; `None` for invalid UTF-8 or a malformed escape.
fn percent_decode(raw: &str) -> Option<String> {
    let bytes = raw.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests;
