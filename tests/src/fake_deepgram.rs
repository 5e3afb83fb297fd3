//! A fake Deepgram live-transcription server on loopback (`/v1/listen`).
//!
//! It checks `Authorization: Token <key>`, records the query, counts the audio
//! bytes each stream sends and the control messages (`KeepAlive`,
//! `CloseStream`), and sends what the test scripts: transcripts
//! ([`results`]), [`utterance_end`] and [`speech_started`], in Deepgram's JSON.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use futures::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::sync::{mpsc, watch};

/// What the fake has seen.
#[derive(Debug, Clone, Default)]
pub struct Seen {
    /// Streams opened with the right key.
    pub streams: usize,
    /// Streams refused for a wrong or missing key.
    pub refused: usize,
    /// The last stream's query string.
    pub query: String,
    /// Audio bytes of the current stream.
    pub audio_bytes: usize,
    /// Control messages (`type` values) of every stream, in order.
    pub controls: Vec<String>,
    /// Streams that ended.
    pub closed: usize,
}

#[derive(Debug)]
struct Inner {
    key: String,
    seen: watch::Sender<Seen>,
    /// The current stream's outbox.
    say: Mutex<Option<mpsc::UnboundedSender<String>>>,
}

/// The running fake.
#[derive(Debug, Clone)]
pub struct FakeDeepgram {
    /// `ws://127.0.0.1:<port>`, for `deepgram_base_url`.
    pub base_url: String,
    inner: Arc<Inner>,
}

impl FakeDeepgram {
    /// Starts the fake accepting `key`.
    pub async fn start(key: &str) -> FakeDeepgram {
        let inner = Arc::new(Inner {
            key: key.to_owned(),
            seen: watch::Sender::new(Seen::default()),
            say: Mutex::new(None),
        });
        let app = Router::new().route("/v1/listen", get(listen)).with_state(inner.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let listener =
            axum::serve::ListenerExt::tap_io(listener, |tcp: &mut tokio::net::TcpStream| {
                let _ = tcp.set_nodelay(true);
            });
        tokio::spawn(async move { axum::serve(listener, app).await });
        FakeDeepgram { base_url: format!("ws://{addr}"), inner }
    }

    /// What it has seen so far.
    pub fn seen(&self) -> Seen {
        self.inner.seen.borrow().clone()
    }

    /// Waits (bounded) until `done` holds for what it has seen.
    pub async fn wait_for(&self, what: &str, done: impl Fn(&Seen) -> bool) -> Seen {
        let mut rx = self.inner.seen.subscribe();
        let waited = tokio::time::timeout(Duration::from_secs(60), async {
            rx.wait_for(|s| done(s)).await.map(|seen| seen.clone()).ok()
        })
        .await;
        match waited {
            Ok(Some(seen)) => seen,
            _ => panic!("fake Deepgram: {what} did not happen; seen {:?}", self.seen()),
        }
    }

    /// Sends `message` on the current stream.
    pub fn say(&self, message: Value) {
        let say = self.inner.say.lock().unwrap();
        say.as_ref().expect("a Deepgram stream is open").send(message.to_string()).unwrap();
    }
}

/// A `Results` message with one alternative.
pub fn results(transcript: &str, is_final: bool, speech_final: bool) -> Value {
    json!({
        "type": "Results",
        "channel_index": [0, 1],
        "duration": 1.5,
        "start": 0.0,
        "is_final": is_final,
        "speech_final": speech_final,
        "from_finalize": false,
        "channel": { "alternatives": [ { "transcript": transcript, "confidence": 0.98, "words": [] } ] },
        "metadata": { "request_id": "fake", "model_info": { "name": "nova-3", "version": "1", "arch": "nova-3" }, "model_uuid": "fake" }
    })
}

/// An `UtteranceEnd` message.
pub fn utterance_end() -> Value {
    json!({ "type": "UtteranceEnd", "channel": [0, 1], "last_word_end": 1.5 })
}

/// A `SpeechStarted` message.
pub fn speech_started() -> Value {
    json!({ "type": "SpeechStarted", "channel": [0, 1], "timestamp": 0.5 })
}

async fn listen(
    State(inner): State<Arc<Inner>>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    ws: WebSocketUpgrade,
) -> Response {
    let auth = headers.get("authorization").and_then(|v| v.to_str().ok()).unwrap_or("");
    if auth != format!("Token {}", inner.key) {
        inner.seen.send_modify(|s| s.refused += 1);
        return (StatusCode::UNAUTHORIZED, "bad key").into_response();
    }
    let query = query.unwrap_or_default();
    ws.on_upgrade(move |socket| stream(inner, socket, query))
}

async fn stream(inner: Arc<Inner>, socket: WebSocket, query: String) {
    let (tx, mut rx) = mpsc::unbounded_channel::<String>();
    *inner.say.lock().unwrap() = Some(tx);
    inner.seen.send_modify(|s| {
        s.streams += 1;
        s.query = query;
        s.audio_bytes = 0;
    });
    let (mut sink, mut source) = socket.split();
    loop {
        tokio::select! {
            out = rx.recv() => match out {
                Some(text) => {
                    if sink.send(Message::Text(text.into())).await.is_err() {
                        break;
                    }
                }
                None => break,
            },
            message = source.next() => match message {
                Some(Ok(Message::Binary(bytes))) => {
                    inner.seen.send_modify(|s| s.audio_bytes += bytes.len());
                }
                Some(Ok(Message::Text(text))) => {
                    let kind = serde_json::from_str::<Value>(&text)
                        .ok()
                        .and_then(|v| v["type"].as_str().map(str::to_owned))
                        .unwrap_or_else(|| "invalid".to_owned());
                    let close = kind == "CloseStream";
                    inner.seen.send_modify(|s| s.controls.push(kind));
                    if close {
                        let metadata = json!({ "type": "Metadata", "request_id": "fake", "duration": 1.0, "channels": 1 });
                        let _ = sink.send(Message::Text(metadata.to_string().into())).await;
                        let _ = sink.close().await;
                        break;
                    }
                }
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break,
                Some(Ok(_)) => {}
            },
        }
    }
    inner.seen.send_modify(|s| s.closed += 1);
}
