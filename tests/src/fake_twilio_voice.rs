//! Twilio's voice side, faked on loopback: signed webhooks as Twilio sends
//! them, a media-stream client that plays real speech (espeak-ng → sox →
//! 8 kHz μ-law, 20 ms frames in real time) and collects what the gateway
//! sends back, and the REST endpoints a call uses (hang up, start a
//! recording, download it as WAV).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use base64::Engine as _;
use futures::{SinkExt, StreamExt};
use hmac::{Hmac, Mac};
use serde::Deserialize;
use serde_json::json;
use tokio::sync::{mpsc, watch};
use tokio_tungstenite::tungstenite::Message;

const PATIENCE: Duration = Duration::from_secs(60);

/// μ-law of one 16-bit sample (the classic bias-0x84 algorithm).
pub fn ulaw_encode(sample: i16) -> u8 {
    let mut pcm = i32::from(sample);
    let sign = if pcm < 0 {
        pcm = -pcm;
        0x80
    } else {
        0
    };
    pcm = pcm.min(32635) + 0x84;
    let mut exponent = 7;
    let mut mask = 0x4000;
    while exponent > 0 && pcm & mask == 0 {
        exponent -= 1;
        mask >>= 1;
    }
    let mantissa = (pcm >> (exponent + 3)) & 0x0F;
    !((sign | (exponent << 4) | mantissa) as u8)
}

/// The 16-bit sample of one μ-law byte.
pub fn ulaw_decode(byte: u8) -> i16 {
    let byte = !byte;
    let exponent = i32::from((byte >> 4) & 0x07);
    let mantissa = i32::from(byte & 0x0F);
    let magnitude = ((mantissa << 3) + 0x84) << exponent;
    let sample = magnitude - 0x84;
    if byte & 0x80 != 0 {
        -sample as i16
    } else {
        sample as i16
    }
}

/// Twilio's `X-Twilio-Signature` of a form webhook: HMAC-SHA1 over the URL
/// followed by every parameter, sorted, as name then value.
pub fn sign(auth_token: &str, url: &str, params: &[(&str, &str)]) -> String {
    let mut sorted = params.to_vec();
    sorted.sort();
    let mut mac = Hmac::<sha1::Sha1>::new_from_slice(auth_token.as_bytes()).unwrap();
    mac.update(url.as_bytes());
    for (name, value) in sorted {
        mac.update(name.as_bytes());
        mac.update(value.as_bytes());
    }
    base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes())
}

/// `text` spoken by espeak-ng, converted by sox to raw 8 kHz mono μ-law.
#[allow(clippy::disallowed_methods)] // The test's own tools, not the product's processes.
pub fn speech_ulaw(text: &str) -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let wav = dir.path().join("speech.wav");
    let raw = dir.path().join("speech.ul");
    let espeak = std::process::Command::new("espeak-ng")
        .arg("-w")
        .arg(&wav)
        .arg(text)
        .status()
        .expect("espeak-ng is installed (scripts/test installs it)");
    assert!(espeak.success());
    let sox = std::process::Command::new("sox")
        .arg(&wav)
        .args(["-r", "8000", "-c", "1", "-t", "ul"])
        .arg(&raw)
        .status()
        .expect("sox is installed (scripts/test installs it)");
    assert!(sox.success());
    std::fs::read(&raw).unwrap()
}

/// A minimal valid WAV: 8 kHz, two channels of μ-law, `frames` frames.
pub fn wav_file(frames: usize) -> Vec<u8> {
    let data_len = (frames * 2) as u32;
    let mut out = b"RIFF".to_vec();
    out.extend((36 + data_len).to_le_bytes());
    out.extend(b"WAVEfmt ");
    out.extend(16u32.to_le_bytes());
    out.extend(7u16.to_le_bytes()); // μ-law
    out.extend(2u16.to_le_bytes());
    out.extend(8000u32.to_le_bytes());
    out.extend(16000u32.to_le_bytes());
    out.extend(2u16.to_le_bytes());
    out.extend(8u16.to_le_bytes());
    out.extend(b"data");
    out.extend(data_len.to_le_bytes());
    out.extend(std::iter::repeat_n(0xFFu8, frames * 2));
    out
}

/// What the gateway sent on the media stream.
#[derive(Debug, Clone, PartialEq)]
pub enum Sent {
    Media(Vec<u8>),
    Mark(String),
    Clear,
}

#[derive(Debug, Clone, Default)]
pub struct StreamLog {
    pub sent: Vec<Sent>,
    /// Messages that were not valid Twilio stream messages.
    pub invalid: Vec<String>,
    pub closed: bool,
}

impl StreamLog {
    /// Every audio byte received, in order.
    pub fn audio(&self) -> Vec<u8> {
        self.sent
            .iter()
            .filter_map(|s| match s {
                Sent::Media(bytes) => Some(bytes.as_slice()),
                _ => None,
            })
            .flatten()
            .copied()
            .collect()
    }

    pub fn marks(&self) -> usize {
        self.sent.iter().filter(|s| matches!(s, Sent::Mark(_))).count()
    }

    pub fn clears(&self) -> usize {
        self.sent.iter().filter(|s| matches!(s, Sent::Clear)).count()
    }
}

#[derive(Deserialize)]
#[serde(tag = "event", rename_all = "lowercase")]
enum Outbound {
    Media {
        #[serde(rename = "streamSid")]
        stream_sid: String,
        media: OutMedia,
    },
    Mark {
        #[serde(rename = "streamSid")]
        stream_sid: String,
        mark: OutMark,
    },
    Clear {
        #[serde(rename = "streamSid")]
        stream_sid: String,
    },
}

#[derive(Deserialize)]
struct OutMedia {
    payload: String,
}

#[derive(Deserialize)]
struct OutMark {
    name: String,
}

/// The media-stream side of a call, as Twilio plays it.
#[derive(Debug)]
pub struct MediaClient {
    pub stream_sid: String,
    log: watch::Receiver<StreamLog>,
    to_gateway: mpsc::UnboundedSender<String>,
    ack_marks: Arc<AtomicBool>,
    held: Arc<Mutex<Vec<String>>>,
}

impl MediaClient {
    /// Connects to `url`, sends `connected` and `start` with `token` as its
    /// custom parameter. Marks are echoed as soon as they arrive (the audio
    /// "played") unless [`MediaClient::hold_marks`] says otherwise.
    pub async fn connect(url: &str, call_sid: &str, token: &str) -> MediaClient {
        let (socket, _) = tokio::time::timeout(
            PATIENCE,
            tokio_tungstenite::connect_async_with_config(url, None, true),
        )
        .await
        .expect("media stream connects in time")
        .expect("media stream accepted");
        let (mut sink, mut source) = socket.split();
        let stream_sid = format!("MZ{}", uuid_like(call_sid));
        let (to_gateway, mut outbox) = mpsc::unbounded_channel::<String>();
        let (log_tx, log) = watch::channel(StreamLog::default());
        let ack_marks = Arc::new(AtomicBool::new(true));
        let held = Arc::new(Mutex::new(Vec::new()));
        tokio::spawn(async move {
            while let Some(text) = outbox.recv().await {
                if sink.send(Message::text(text)).await.is_err() {
                    break;
                }
            }
        });
        {
            let (ack, held, echo) = (ack_marks.clone(), held.clone(), to_gateway.clone());
            let sid = stream_sid.clone();
            tokio::spawn(async move {
                while let Some(message) = source.next().await {
                    let text = match message {
                        Ok(Message::Text(text)) => text.to_string(),
                        Ok(Message::Close(_)) | Err(_) => break,
                        Ok(Message::Binary(_)) => {
                            log_tx.send_modify(|l| l.invalid.push("binary frame".into()));
                            continue;
                        }
                        Ok(_) => continue,
                    };
                    match serde_json::from_str::<Outbound>(&text) {
                        Ok(Outbound::Media { stream_sid, media }) if stream_sid == sid => {
                            let bytes =
                                base64::engine::general_purpose::STANDARD.decode(media.payload);
                            match bytes {
                                Ok(bytes) => {
                                    log_tx.send_modify(|l| l.sent.push(Sent::Media(bytes)))
                                }
                                Err(_) => log_tx.send_modify(|l| l.invalid.push(text.clone())),
                            }
                        }
                        Ok(Outbound::Mark { stream_sid, mark }) if stream_sid == sid => {
                            log_tx.send_modify(|l| l.sent.push(Sent::Mark(mark.name.clone())));
                            if ack.load(Ordering::SeqCst) {
                                let _ = echo.send(mark_json(&sid, &mark.name));
                            } else {
                                held.lock().unwrap().push(mark.name);
                            }
                        }
                        Ok(Outbound::Clear { stream_sid }) if stream_sid == sid => {
                            log_tx.send_modify(|l| l.sent.push(Sent::Clear));
                            // Twilio returns the marks a clear dropped.
                            for name in held.lock().unwrap().drain(..) {
                                let _ = echo.send(mark_json(&sid, &name));
                            }
                        }
                        _ => log_tx.send_modify(|l| l.invalid.push(text.clone())),
                    }
                }
                log_tx.send_modify(|l| l.closed = true);
            });
        }
        let client = MediaClient { stream_sid, log, to_gateway, ack_marks, held };
        client.send(json!({ "event": "connected", "protocol": "Call", "version": "1.0.0" }));
        client.send(json!({
            "event": "start",
            "sequenceNumber": "1",
            "start": {
                "accountSid": "ACfake",
                "streamSid": client.stream_sid,
                "callSid": call_sid,
                "tracks": ["inbound"],
                "customParameters": { "token": token },
                "mediaFormat": { "encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1 }
            },
            "streamSid": client.stream_sid
        }));
        client
    }

    fn send(&self, message: serde_json::Value) {
        let _ = self.to_gateway.send(message.to_string());
    }

    /// Plays `audio` as 20 ms `media` frames at real speed.
    pub async fn play(&self, audio: &[u8]) {
        let mut tick = tokio::time::interval(Duration::from_millis(20));
        for (n, frame) in audio.chunks(160).enumerate() {
            tick.tick().await;
            self.send(json!({
                "event": "media",
                "sequenceNumber": (n + 2).to_string(),
                "media": {
                    "track": "inbound",
                    "chunk": (n + 1).to_string(),
                    "timestamp": (n * 20).to_string(),
                    "payload": base64::engine::general_purpose::STANDARD.encode(frame)
                },
                "streamSid": self.stream_sid
            }));
        }
    }

    /// Whether marks are echoed at once (true) or held as if still playing.
    pub fn hold_marks(&self, hold: bool) {
        self.ack_marks.store(!hold, Ordering::SeqCst);
        if !hold {
            for name in self.held.lock().unwrap().drain(..) {
                let _ = self.to_gateway.send(mark_json(&self.stream_sid, &name));
            }
        }
    }

    /// The caller hangs up.
    pub fn stop(&self, call_sid: &str) {
        self.send(json!({
            "event": "stop",
            "sequenceNumber": "999",
            "streamSid": self.stream_sid,
            "stop": { "accountSid": "ACfake", "callSid": call_sid }
        }));
    }

    pub fn log(&self) -> StreamLog {
        self.log.borrow().clone()
    }

    /// Waits (bounded) until `done` holds for what the gateway sent.
    pub async fn wait_for(&self, what: &str, done: impl Fn(&StreamLog) -> bool) -> StreamLog {
        let mut rx = self.log.clone();
        let found = tokio::time::timeout(PATIENCE, async {
            rx.wait_for(|l| done(l)).await.map(|log| log.clone()).ok()
        })
        .await;
        match found {
            Ok(Some(log)) => log,
            _ => panic!("media stream: {what} did not happen; got {:?}", summary(&self.log())),
        }
    }
}

fn summary(log: &StreamLog) -> String {
    format!(
        "{} audio bytes, {} marks, {} clears, closed: {}, invalid: {:?}",
        log.audio().len(),
        log.marks(),
        log.clears(),
        log.closed,
        log.invalid
    )
}

fn mark_json(stream_sid: &str, name: &str) -> String {
    json!({ "event": "mark", "sequenceNumber": "0", "streamSid": stream_sid, "mark": { "name": name } })
        .to_string()
}

fn uuid_like(seed: &str) -> String {
    let mut out: String = seed.chars().filter(char::is_ascii_alphanumeric).skip(2).collect();
    out.truncate(32);
    out
}

/// One request the fake REST API received.
#[derive(Debug, Clone)]
pub struct RestRequest {
    pub method: String,
    pub path: String,
    pub form: Vec<(String, String)>,
    pub authorized: bool,
}

#[derive(Debug)]
struct RestInner {
    account_sid: String,
    auth_token: String,
    requests: watch::Sender<Vec<RestRequest>>,
    /// Downloads answered 404 before the WAV is served (not ready yet).
    not_ready: Mutex<usize>,
    wav: Vec<u8>,
}

/// A fake of the Twilio REST endpoints a call uses.
#[derive(Debug, Clone)]
pub struct FakeTwilioRest {
    /// `http://127.0.0.1:<port>`, for `twilio_api_base_url`.
    pub base_url: String,
    inner: Arc<RestInner>,
}

impl FakeTwilioRest {
    /// Starts the fake for one account; recordings are `wav`, served after
    /// `not_ready` downloads answered 404.
    pub async fn start(
        account_sid: &str,
        auth_token: &str,
        wav: Vec<u8>,
        not_ready: usize,
    ) -> Self {
        let inner = Arc::new(RestInner {
            account_sid: account_sid.to_owned(),
            auth_token: auth_token.to_owned(),
            requests: watch::Sender::new(Vec::new()),
            not_ready: Mutex::new(not_ready),
            wav,
        });
        let app = Router::new()
            .route("/2010-04-01/Accounts/{account}/Calls/{call}", post(call_update))
            .route(
                "/2010-04-01/Accounts/{account}/Calls/{call}/Recordings.json",
                post(start_recording),
            )
            .route("/2010-04-01/Accounts/{account}/Recordings/{file}", get(download))
            .with_state(inner.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        FakeTwilioRest { base_url: format!("http://{addr}"), inner }
    }

    pub fn requests(&self) -> Vec<RestRequest> {
        self.inner.requests.borrow().clone()
    }

    /// Waits (bounded) for a request whose path ends with `suffix`.
    pub async fn wait_for(&self, method: &str, suffix: &str) -> RestRequest {
        let mut rx = self.inner.requests.subscribe();
        let matches = |r: &RestRequest| r.method == method && r.path.ends_with(suffix);
        let found = tokio::time::timeout(PATIENCE, async {
            let list = rx.wait_for(|list| list.iter().any(matches)).await.ok()?;
            list.iter().find(|r| matches(r)).cloned()
        })
        .await;
        match found {
            Ok(Some(request)) => request,
            _ => panic!("fake Twilio: no {method} …{suffix}; got {:?}", self.requests()),
        }
    }
}

fn authorized(inner: &RestInner, headers: &HeaderMap) -> bool {
    let expected = base64::engine::general_purpose::STANDARD
        .encode(format!("{}:{}", inner.account_sid, inner.auth_token));
    headers.get("authorization").and_then(|v| v.to_str().ok())
        == Some(format!("Basic {expected}").as_str())
}

fn record(inner: &RestInner, method: &str, path: String, headers: &HeaderMap, body: &[u8]) -> bool {
    let ok = authorized(inner, headers);
    let form: Vec<(String, String)> = serde_urlencoded::from_bytes(body).unwrap_or_default();
    inner.requests.send_modify(|list| {
        list.push(RestRequest { method: method.into(), path, form, authorized: ok });
    });
    ok
}

async fn call_update(
    State(inner): State<Arc<RestInner>>,
    Path((account, call)): Path<(String, String)>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let path = format!("/2010-04-01/Accounts/{account}/Calls/{call}");
    if !record(&inner, "POST", path, &headers, &body) || account != inner.account_sid {
        return StatusCode::UNAUTHORIZED.into_response();
    }
    let sid = call.trim_end_matches(".json");
    axum::Json(json!({ "sid": sid, "status": "completed" })).into_response()
}

async fn start_recording(
    State(inner): State<Arc<RestInner>>,
    Path((account, call)): Path<(String, String)>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let path = format!("/2010-04-01/Accounts/{account}/Calls/{call}/Recordings.json");
    if !record(&inner, "POST", path, &headers, &body) || account != inner.account_sid {
        return StatusCode::UNAUTHORIZED.into_response();
    }
    (
        StatusCode::CREATED,
        axum::Json(json!({ "sid": "RE0123456789abcdef0123456789abcdef", "call_sid": call, "status": "in-progress" })),
    )
        .into_response()
}

async fn download(
    State(inner): State<Arc<RestInner>>,
    Path((account, file)): Path<(String, String)>,
    headers: HeaderMap,
) -> Response {
    let path = format!("/2010-04-01/Accounts/{account}/Recordings/{file}");
    if !record(&inner, "GET", path, &headers, &[]) || account != inner.account_sid {
        return StatusCode::UNAUTHORIZED.into_response();
    }
    {
        let mut not_ready = inner.not_ready.lock().unwrap();
        if *not_ready > 0 {
            *not_ready -= 1;
            return (StatusCode::NOT_FOUND, axum::Json(json!({ "code": 20404 }))).into_response();
        }
    }
    ([("content-type", "audio/x-wav")], inner.wav.clone()).into_response()
}
