//! A fake transcription service on loopback speaking both APIs a channel's
//! voice transcription uses:
//!
//! - OpenAI's `POST /v1/audio/transcriptions` (`multipart/form-data` with
//!   `file`, `model`, `response_format`; `Authorization: Bearer <key>`),
//!   answered `{"text": …}`; its base URL is [`FakeTranscribe::openai_base_url`];
//! - Deepgram's pre-recorded `POST /v1/listen?model=…` (the audio as the
//!   body; `Authorization: Token <key>`), answered with
//!   `results.channels[0].alternatives[0].transcript`; its base URL is
//!   [`FakeTranscribe::deepgram_base_url`].
//!
//! It records every upload (the audio bytes, the model, the auth header, the
//! media type) and answers the transcript the test scripts, or an error
//! status. A wrong key is answered 401 as the services do.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use serde_json::json;
use tokio::sync::watch;

/// Which API an upload came by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    OpenAi,
    Deepgram,
}

/// One upload the fake received.
#[derive(Debug, Clone)]
pub struct Upload {
    pub api: Api,
    /// The audio: the multipart `file` part (OpenAI) or the body (Deepgram).
    pub audio: Vec<u8>,
    /// The `model` form field (OpenAI) or query parameter (Deepgram).
    pub model: String,
    /// The `Authorization` header as sent.
    pub auth: String,
    /// The audio's media type: the `file` part's (OpenAI) or the body's (Deepgram).
    pub mime: String,
    /// The `file` part's file name (OpenAI only).
    pub file_name: Option<String>,
    /// Other form fields (OpenAI) or the whole query (Deepgram).
    pub params: Vec<(String, String)>,
}

#[derive(Debug)]
struct Inner {
    key: String,
    transcript: Mutex<String>,
    /// Answered instead of the transcript, when set.
    failure: Mutex<Option<(u16, String)>>,
    uploads: watch::Sender<Vec<Upload>>,
}

/// The running fake.
#[derive(Debug, Clone)]
pub struct FakeTranscribe {
    /// `http://127.0.0.1:<port>`.
    pub base_url: String,
    inner: Arc<Inner>,
}

impl FakeTranscribe {
    /// Starts the fake accepting `key`, answering `transcript` until told otherwise.
    pub async fn start(key: &str, transcript: &str) -> FakeTranscribe {
        let inner = Arc::new(Inner {
            key: key.to_owned(),
            transcript: Mutex::new(transcript.to_owned()),
            failure: Mutex::new(None),
            uploads: watch::Sender::new(Vec::new()),
        });
        let app = Router::new()
            .route("/v1/audio/transcriptions", post(openai))
            .route("/v1/listen", post(deepgram))
            .with_state(inner.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        FakeTranscribe { base_url: format!("http://{addr}"), inner }
    }

    /// The `voice_transcription_base_url` for provider `openai`.
    pub fn openai_base_url(&self) -> String {
        format!("{}/v1", self.base_url)
    }

    /// The `voice_transcription_base_url` for provider `deepgram`.
    pub fn deepgram_base_url(&self) -> String {
        self.base_url.clone()
    }

    /// Answers `transcript` from now on.
    pub fn set_transcript(&self, transcript: &str) {
        *self.inner.transcript.lock().unwrap() = transcript.to_owned();
    }

    /// Answers `status` with `message` (in the API's error shape) from now on.
    pub fn fail_with(&self, status: u16, message: &str) {
        *self.inner.failure.lock().unwrap() = Some((status, message.to_owned()));
    }

    /// Every upload so far.
    pub fn uploads(&self) -> Vec<Upload> {
        self.inner.uploads.borrow().clone()
    }

    /// Waits (bounded) for `n` uploads and returns them.
    pub async fn wait_for_uploads(&self, n: usize) -> Vec<Upload> {
        let mut rx = self.inner.uploads.subscribe();
        let waited = tokio::time::timeout(Duration::from_secs(60), async {
            rx.wait_for(|uploads| uploads.len() >= n).await.map(|u| u.clone()).ok()
        })
        .await;
        match waited {
            Ok(Some(uploads)) => uploads,
            _ => panic!("fake transcription: {n} uploads did not come; got {:?}", self.uploads()),
        }
    }
}

fn header(headers: &HeaderMap, name: &str) -> String {
    headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or("").to_owned()
}

/// The scripted answer: the failure, a 401 for a wrong key, or `ok(transcript)`.
fn answer(inner: &Inner, auth_ok: bool, ok: impl FnOnce(&str) -> serde_json::Value) -> Response {
    if !auth_ok {
        return (StatusCode::UNAUTHORIZED, Json(json!({ "error": { "message": "invalid key" } })))
            .into_response();
    }
    if let Some((status, message)) = inner.failure.lock().unwrap().clone() {
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let body = json!({ "error": { "message": message }, "err_msg": message });
        return (status, Json(body)).into_response();
    }
    let transcript = inner.transcript.lock().unwrap().clone();
    Json(ok(&transcript)).into_response()
}

async fn openai(State(inner): State<Arc<Inner>>, headers: HeaderMap, body: Bytes) -> Response {
    let auth = header(&headers, "authorization");
    let content_type = header(&headers, "content-type");
    let Some(boundary) =
        content_type.split("boundary=").nth(1).map(|b| b.trim_matches('"').to_owned())
    else {
        return (StatusCode::BAD_REQUEST, Json(json!({ "error": { "message": "not multipart" } })))
            .into_response();
    };
    let mut upload = Upload {
        api: Api::OpenAi,
        audio: Vec::new(),
        model: String::new(),
        auth: auth.clone(),
        mime: String::new(),
        file_name: None,
        params: Vec::new(),
    };
    for part in parts(&body, &boundary) {
        match part.name.as_str() {
            "file" => {
                upload.audio = part.body;
                upload.mime = part.content_type.unwrap_or_default();
                upload.file_name = part.file_name;
            }
            "model" => upload.model = String::from_utf8_lossy(&part.body).into_owned(),
            other => upload
                .params
                .push((other.to_owned(), String::from_utf8_lossy(&part.body).into_owned())),
        }
    }
    let valid = !upload.audio.is_empty() && !upload.model.is_empty();
    inner.uploads.send_modify(|uploads| uploads.push(upload));
    if !valid {
        return (
            StatusCode::BAD_REQUEST,
            Json(json!({ "error": { "message": "file and model are required" } })),
        )
            .into_response();
    }
    answer(&inner, auth == format!("Bearer {}", inner.key), |text| json!({ "text": text }))
}

async fn deepgram(
    State(inner): State<Arc<Inner>>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let auth = header(&headers, "authorization");
    let params: Vec<(String, String)> =
        serde_urlencoded::from_str(&query.unwrap_or_default()).unwrap_or_default();
    let model =
        params.iter().find(|(k, _)| k == "model").map(|(_, v)| v.clone()).unwrap_or_default();
    inner.uploads.send_modify(|uploads| {
        uploads.push(Upload {
            api: Api::Deepgram,
            audio: body.to_vec(),
            model,
            auth: auth.clone(),
            mime: header(&headers, "content-type"),
            file_name: None,
            params,
        });
    });
    answer(&inner, auth == format!("Token {}", inner.key), |text| {
        json!({
            "metadata": { "request_id": "fake", "duration": 1.0, "channels": 1 },
            "results": { "channels": [ { "alternatives": [
                { "transcript": text, "confidence": 0.98, "words": [] }
            ] } ] }
        })
    })
}

/// One part of a `multipart/form-data` body.
struct Part {
    name: String,
    file_name: Option<String>,
    content_type: Option<String>,
    body: Vec<u8>,
}

/// The parts of a `multipart/form-data` body (enough of RFC 7578 for the
/// gateway's uploads: `Content-Disposition` and `Content-Type` headers).
fn parts(body: &[u8], boundary: &str) -> Vec<Part> {
    let delimiter = format!("--{boundary}");
    let mut found = Vec::new();
    let mut rest = body;
    while let Some(start) = find(rest, delimiter.as_bytes()) {
        rest = &rest[start + delimiter.len()..];
        if rest.starts_with(b"--") {
            break;
        }
        let rest_after_crlf = rest.strip_prefix(b"\r\n").unwrap_or(rest);
        let Some(head_end) = find(rest_after_crlf, b"\r\n\r\n") else { break };
        let head = String::from_utf8_lossy(&rest_after_crlf[..head_end]).into_owned();
        let content = &rest_after_crlf[head_end + 4..];
        let end = find(content, format!("\r\n{delimiter}").as_bytes()).unwrap_or(content.len());
        let mut part = Part {
            name: String::new(),
            file_name: None,
            content_type: None,
            body: content[..end].to_vec(),
        };
        for line in head.lines() {
            let (key, value) = line.split_once(':').unwrap_or((line, ""));
            if key.eq_ignore_ascii_case("content-disposition") {
                for param in value.split(';').map(str::trim) {
                    if let Some(name) = param.strip_prefix("name=") {
                        part.name = name.trim_matches('"').to_owned();
                    } else if let Some(file) = param.strip_prefix("filename=") {
                        part.file_name = Some(file.trim_matches('"').to_owned());
                    }
                }
            } else if key.eq_ignore_ascii_case("content-type") {
                part.content_type = Some(value.trim().to_owned());
            }
        }
        found.push(part);
        rest = &content[end..];
    }
    found
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|window| window == needle)
}

/// `text` spoken by espeak-ng and encoded by opusenc: an Ogg Opus file, as
/// chat apps record voice messages.
#[allow(clippy::disallowed_methods)] // The test's own tools, not the product's processes.
pub fn speech_ogg(text: &str) -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let wav = dir.path().join("out.wav");
    let ogg = dir.path().join("out.ogg");
    let espeak = std::process::Command::new("espeak-ng")
        .arg("-w")
        .arg(&wav)
        .arg(text)
        .status()
        .expect("espeak-ng is installed (scripts/test installs it)");
    assert!(espeak.success());
    let opusenc = std::process::Command::new("opusenc")
        .arg("--quiet")
        .arg(&wav)
        .arg(&ogg)
        .status()
        .expect("opusenc is installed (scripts/test installs opus-tools)");
    assert!(opusenc.success());
    let bytes = std::fs::read(&ogg).unwrap();
    assert!(bytes.starts_with(b"OggS"), "an Ogg file");
    bytes
}
