//! A hub for the fake XMTP bridge (`src/bin/fake_xmtp_bridge.rs`): the gateway
//! starts the fake as its bridge, the fake connects here, and the test speaks
//! the bridge's side of the protocol (JSON lines with `"v": 1`) through a
//! [`BridgeConn`]. Lines are parsed as plain JSON here, never with the
//! gateway's types.
//!
//! [`AttachmentHost`] stands in for the storage a sender's app uploads a
//! remote attachment to: it serves encrypted payloads on loopback, and
//! [`AttachmentHost::put`] seals a file as the sender's app does and gives
//! the `attachment` fields the bridge would forward.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, Notify};

/// Where the fakes connect; each connection is one bridge process.
#[derive(Debug)]
pub struct FakeXmtpHub {
    control_file: PathBuf,
    bridges: tokio::sync::Mutex<mpsc::Receiver<BridgeConn>>,
    _dir: tempfile::TempDir,
}

/// One started bridge, as the test drives it.
#[derive(Debug, Clone)]
pub struct BridgeConn {
    /// How the gateway started it: `{argv, env, cwd, pid}`.
    pub hello: Value,
    writer: Arc<tokio::sync::Mutex<OwnedWriteHalf>>,
    received: Arc<Mutex<Vec<Value>>>,
    changed: Arc<Notify>,
    closed: Arc<Mutex<bool>>,
}

impl FakeXmtpHub {
    /// Listens on loopback; pings are answered with pongs when `auto_pong`.
    pub async fn start(auto_pong: bool) -> FakeXmtpHub {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let control_file = dir.path().join("bridge-control.json");
        std::fs::write(&control_file, json!({ "control": addr.to_string() }).to_string()).unwrap();
        let (tx, rx) = mpsc::channel(16);
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (read, write) = stream.into_split();
                let mut lines = BufReader::new(read).lines();
                let Ok(Some(first)) = lines.next_line().await else { continue };
                let hello: Value = serde_json::from_str(&first).unwrap_or_default();
                let conn = BridgeConn {
                    hello,
                    writer: Arc::new(tokio::sync::Mutex::new(write)),
                    received: Arc::default(),
                    changed: Arc::default(),
                    closed: Arc::default(),
                };
                let reader = conn.clone();
                tokio::spawn(async move {
                    while let Ok(Some(line)) = lines.next_line().await {
                        let value: Value = serde_json::from_str(&line)
                            .unwrap_or_else(|_| json!({ "unparsed": line }));
                        if auto_pong && value["type"] == "ping" {
                            reader.send(json!({"v": 1, "type": "pong", "id": value["id"]})).await;
                        }
                        reader.received.lock().unwrap().push(value);
                        reader.changed.notify_waiters();
                    }
                    *reader.closed.lock().unwrap() = true;
                    reader.changed.notify_waiters();
                });
                if tx.send(conn).await.is_err() {
                    return;
                }
            }
        });
        FakeXmtpHub { control_file, bridges: tokio::sync::Mutex::new(rx), _dir: dir }
    }

    /// What the gateway is given as its bridge script.
    pub fn control_file(&self) -> &Path {
        &self.control_file
    }

    /// The next bridge the gateway starts.
    pub async fn next_bridge(&self, patience: Duration) -> BridgeConn {
        let mut bridges = self.bridges.lock().await;
        tokio::time::timeout(patience, bridges.recv())
            .await
            .expect("the gateway starts a bridge in time")
            .expect("hub running")
    }

    /// Whether another bridge connected (without waiting).
    pub async fn try_next_bridge(&self) -> Option<BridgeConn> {
        self.bridges.lock().await.try_recv().ok()
    }
}

impl BridgeConn {
    /// Writes one line to the gateway.
    pub async fn send(&self, value: Value) {
        self.send_raw(&value.to_string()).await;
    }

    /// Writes `line` as it is (garbage included).
    pub async fn send_raw(&self, line: &str) {
        let mut writer = self.writer.lock().await;
        let _ = writer.write_all(format!("{line}\n").as_bytes()).await;
        let _ = writer.flush().await;
    }

    /// `ready` as `inbox_id`.
    pub async fn ready(&self, inbox_id: &str, address: &str) {
        self.send(json!({"v": 1, "type": "ready", "inbox_id": inbox_id, "address": address, "env": "dev"}))
            .await;
    }

    /// A text message from `sender` in `conversation`.
    pub async fn message(&self, id: &str, conversation: &str, sender: &str, text: &str) {
        self.send(json!({
            "v": 1, "type": "message", "id": id, "conversation_id": conversation,
            "sender": sender, "text": text, "sent_at_ms": 1_700_000_000_000_i64,
        }))
        .await;
    }

    /// A remote attachment from `sender` in `conversation`: a message with
    /// no text and the `attachment` fields ([`AttachmentHost::put`]).
    pub async fn attachment(&self, id: &str, conversation: &str, sender: &str, attachment: Value) {
        self.send(json!({
            "v": 1, "type": "message", "id": id, "conversation_id": conversation,
            "sender": sender, "text": "", "sent_at_ms": 1_700_000_000_000_i64,
            "attachment": attachment,
        }))
        .await;
    }

    /// Answers a `send` as sent.
    pub async fn sent(&self, request_id: &str, message_id: &str) {
        self.send(
            json!({"v": 1, "type": "sent", "request_id": request_id, "message_id": message_id}),
        )
        .await;
    }

    /// Makes the fake process exit with `code` at once.
    pub async fn crash(&self, code: i32) {
        self.send(json!({"fake": "exit", "code": code})).await;
    }

    /// Every line the gateway wrote so far.
    pub fn received(&self) -> Vec<Value> {
        self.received.lock().unwrap().clone()
    }

    /// The lines of `kind` (`ack`, `send`, `ping`) so far.
    pub fn of_type(&self, kind: &str) -> Vec<Value> {
        self.received().into_iter().filter(|v| v["type"] == kind).collect()
    }

    /// Whether the gateway's side of the connection closed (the fake exited).
    pub fn closed(&self) -> bool {
        *self.closed.lock().unwrap()
    }

    /// Waits until `done` holds for the lines received; they are returned.
    pub async fn wait_for(
        &self,
        what: &str,
        patience: Duration,
        mut done: impl FnMut(&[Value]) -> bool,
    ) -> Vec<Value> {
        let wait = async {
            loop {
                let notified = self.changed.notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
                let received = self.received();
                if done(&received) {
                    return received;
                }
                notified.await;
            }
        };
        match tokio::time::timeout(patience, wait).await {
            Ok(received) => received,
            Err(_) => panic!("waited in vain for {what}; the gateway wrote {:#?}", self.received()),
        }
    }

    /// Waits for the fake to be gone (its connection closed).
    pub async fn wait_closed(&self, patience: Duration) {
        let wait = async {
            loop {
                let notified = self.changed.notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
                if self.closed() {
                    return;
                }
                notified.await;
            }
        };
        tokio::time::timeout(patience, wait).await.expect("the bridge is gone in time");
    }
}

/// Where remote attachments are uploaded: `GET /files/<name>` serves what
/// [`AttachmentHost::put`] stored, on loopback.
#[derive(Debug, Clone)]
pub struct AttachmentHost {
    /// `http://127.0.0.1:<port>`.
    pub base_url: String,
    payloads: Arc<Mutex<HashMap<String, Vec<u8>>>>,
    n_fetches: Arc<AtomicUsize>,
}

impl AttachmentHost {
    pub async fn start() -> AttachmentHost {
        let payloads: Arc<Mutex<HashMap<String, Vec<u8>>>> = Arc::default();
        let n_fetches = Arc::new(AtomicUsize::new(0));
        let (served, counted) = (payloads.clone(), n_fetches.clone());
        let app = axum::Router::new().route(
            "/files/{name}",
            axum::routing::get(move |axum::extract::Path(name): axum::extract::Path<String>| {
                let (served, counted) = (served.clone(), counted.clone());
                async move {
                    counted.fetch_add(1, Ordering::SeqCst);
                    match served.lock().unwrap().get(&name) {
                        Some(bytes) => Ok(bytes.clone()),
                        None => Err(axum::http::StatusCode::NOT_FOUND),
                    }
                }
            }),
        );
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base_url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        AttachmentHost { base_url, payloads, n_fetches }
    }

    /// Seals `data` as an attachment named `filename`, serves the payload at
    /// `/files/<path>`, and returns the `attachment` fields of its message.
    pub fn put(&self, path: &str, filename: &str, mime: &str, data: &[u8]) -> Value {
        let (secret, salt, nonce) = ([0x5e; 32], [0x5a; 32], [0x4e; 12]);
        let sealed =
            lemon_transports::xmtp::attachment::seal(filename, mime, data, secret, salt, nonce);
        let b64 = |bytes: &[u8]| {
            use base64::Engine as _;
            base64::engine::general_purpose::STANDARD.encode(bytes)
        };
        let fields = json!({
            "url": format!("{}/files/{path}", self.base_url),
            "filename": filename,
            "content_length": sealed.payload.len(),
            "secret": b64(&secret),
            "salt": b64(&salt),
            "nonce": b64(&nonce),
            "content_digest": sealed.digest,
            "scheme": "https://",
        });
        self.payloads.lock().unwrap().insert(path.to_owned(), sealed.payload);
        fields
    }

    /// Replaces what `/files/<path>` serves (a payload changed on the way).
    pub fn tamper(&self, path: &str) {
        if let Some(bytes) = self.payloads.lock().unwrap().get_mut(path) {
            bytes[0] ^= 0xff;
        }
    }

    /// How many requests it answered.
    pub fn n_fetches(&self) -> usize {
        self.n_fetches.load(Ordering::SeqCst)
    }
}
