//! A fake Discord on loopback: the Gateway WebSocket and the REST API, with
//! their own wire types (parsed here, never with the product's).
//!
//! - Gateway (`gateway.rs`): HELLO with a heartbeat interval, IDENTIFY (token and
//!   intents checked; a wrong token is closed with 4004) answered by READY with a
//!   `resume_gateway_url`, heartbeats acknowledged (or not, to play a dead
//!   connection), RESUME replaying every dispatch after the client's sequence
//!   number and then RESUMED, INVALID SESSION, RECONNECT and dropped
//!   connections on demand. Dispatches written while no client is connected
//!   stay in the session's log, as Discord keeps them for a resume.
//! - REST (`rest.rs`): `GET /users/@me`, `GET /channels/{id}`, message create
//!   (JSON or multipart with `payload_json` and `files[n]`) and edit,
//!   `PUT /applications/{id}/commands`, interaction callbacks. Every answer
//!   carries `X-RateLimit-*` headers of a fixed-window bucket per channel (5
//!   calls in 5 s by default) and a global limit (50 a second); a call over a
//!   limit is answered 429 with `retry_after` and recorded as a violation.
//!   Injected faults (a 429, a 5xx) are answered first and are not violations;
//!   so are the connection faults: an answer that comes late, a connection
//!   closed without an answer, a call held open and never answered, each
//!   either before the call is applied or after.
//! - A message create with `enforce_nonce: true` and a `nonce` the bot used in
//!   the last few minutes makes no message: the answer is the message made
//!   then, as Discord documents. Such answers are counted
//!   ([`Snapshot::nonce_hits`]).

mod gateway;
mod rest;

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// The bot the fake knows.
pub const BOT_ID: u64 = 900_000_000_000_000_001;
pub const BOT_NAME: &str = "lemon-test";
pub const APPLICATION_ID: u64 = 900_000_000_000_000_002;

/// A channel the fake serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChannelSpec {
    pub id: u64,
    /// 0 text, 1 DM, 11 public thread.
    pub kind: u8,
    pub guild_id: Option<u64>,
    pub parent_id: Option<u64>,
}

impl ChannelSpec {
    pub fn text(guild: u64, id: u64) -> Self {
        ChannelSpec { id, kind: 0, guild_id: Some(guild), parent_id: None }
    }

    pub fn dm(id: u64) -> Self {
        ChannelSpec { id, kind: 1, guild_id: None, parent_id: None }
    }

    pub fn thread(guild: u64, parent: u64, id: u64) -> Self {
        ChannelSpec { id, kind: 11, guild_id: Some(guild), parent_id: Some(parent) }
    }
}

/// A message in a channel, the bot's or a user's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeMessage {
    pub id: u64,
    pub channel_id: u64,
    pub author_id: u64,
    pub content: String,
    /// The message it replies to.
    pub reply_to: Option<u64>,
    /// Every content it showed, first to last.
    pub versions: Vec<String>,
    pub edits: usize,
    /// (filename, bytes) of its attachments.
    pub attachments: Vec<(String, Vec<u8>)>,
    /// Its rows of buttons as last sent (`[]`: none).
    pub components: Value,
    pub sent_at: Instant,
}

impl FakeMessage {
    /// The `custom_id`s of its buttons, row by row.
    pub fn button_ids(&self) -> Vec<String> {
        self.components
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|row| row["components"].as_array().cloned().unwrap_or_default())
            .filter_map(|button| button["custom_id"].as_str().map(str::to_owned))
            .collect()
    }
}

/// A file a user sends with a message.
#[derive(Debug, Clone)]
pub struct UserFile {
    pub filename: String,
    pub content_type: String,
    pub bytes: Vec<u8>,
    /// The size Discord announces (default: the bytes' length).
    pub announced_size: Option<u64>,
    /// A voice message's length in seconds: the message is a voice message.
    pub voice_seconds: Option<f64>,
}

impl UserFile {
    pub fn new(filename: &str, content_type: &str, bytes: &[u8]) -> Self {
        UserFile {
            filename: filename.to_owned(),
            content_type: content_type.to_owned(),
            bytes: bytes.to_vec(),
            announced_size: None,
            voice_seconds: None,
        }
    }

    /// A voice message (`voice-message.ogg`, `audio/ogg`) of `seconds`.
    pub fn voice(bytes: &[u8], seconds: f64) -> Self {
        UserFile {
            voice_seconds: Some(seconds),
            ..UserFile::new("voice-message.ogg", "audio/ogg", bytes)
        }
    }
}

/// One REST call as the fake answered it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    pub method: String,
    pub path: String,
    /// The status of the answer; for a call never answered (dropped or hung),
    /// the status it would have had if it was applied, else 0.
    pub status: u16,
    /// When it arrived (for a delayed call, when the delay was over).
    pub at: Instant,
    /// Whether the client got an answer.
    pub answered: bool,
    /// Whether it took effect (a message made or edited…).
    pub applied: bool,
    /// The `nonce` of a message create, and whether it was enforced.
    pub nonce: Option<(String, bool)>,
}

/// What a Gateway client sent, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GatewayOp {
    Identify { intents: u64 },
    Resume { session_id: String, seq: u64 },
    Heartbeat { seq: Option<u64> },
}

/// An answer the fake gives instead of the real one, once.
#[derive(Debug, Clone, PartialEq)]
pub enum Fault {
    /// 429 with this `retry_after` (seconds) in the body (and `Retry-After`).
    RateLimited { retry_after: f64, global: bool },
    /// This status with a Discord error body.
    Status(u16),
    /// Network latency: the call reaches the fake this much later (its limits
    /// and answer are decided then); the answer is the usual one.
    Delay(Duration),
    /// The connection is closed without an answer; the call is not applied.
    Drop,
    /// The call is held open and never answered, until the client gives up or
    /// the fake stops; `applied` says whether it took effect first (a message
    /// made whose answer never came) or not (it never got that far).
    Hang { applied: bool },
}

/// What the test asks a connected Gateway client's connection to do.
#[derive(Debug)]
pub(crate) enum ToClient {
    Payload(Value),
    /// Close the TCP connection without a close frame.
    Drop,
    /// Close with a code.
    Close(u16),
}

#[derive(Debug, Default)]
pub(crate) struct Session {
    /// Every dispatch (seq, payload) so far.
    pub(crate) log: Vec<(u64, Value)>,
    pub(crate) seq: u64,
}

#[derive(Debug)]
pub(crate) struct Bucket {
    pub(crate) started: Instant,
    pub(crate) count: u32,
}

#[derive(Debug)]
pub(crate) struct State {
    pub(crate) token: String,
    pub(crate) heartbeat_interval: Duration,
    pub(crate) ack_heartbeats: bool,
    /// Answer the next RESUME with INVALID SESSION (d = false).
    pub(crate) refuse_resume: bool,
    pub(crate) sessions: HashMap<String, Session>,
    /// The session of the latest IDENTIFY or RESUME.
    pub(crate) current_session: Option<String>,
    /// The connected client, if any, with its session.
    pub(crate) connection: Option<(String, mpsc::UnboundedSender<ToClient>)>,
    pub(crate) ops: Vec<GatewayOp>,
    pub(crate) connections: usize,
    pub(crate) channels: HashMap<u64, ChannelSpec>,
    pub(crate) messages: Vec<FakeMessage>,
    pub(crate) commands: Vec<Value>,
    /// (interaction id, reply content).
    pub(crate) interaction_replies: Vec<(u64, String)>,
    pub(crate) calls: Vec<Call>,
    pub(crate) buckets: HashMap<String, Bucket>,
    pub(crate) global: Option<Bucket>,
    pub(crate) channel_limit: (u32, Duration),
    pub(crate) global_limit: u32,
    pub(crate) violations: Vec<String>,
    pub(crate) faults: VecDeque<(String, Fault)>,
    /// Nonce of an enforced message create → (the message, when it was made).
    pub(crate) nonces: HashMap<String, (u64, Instant)>,
    /// Enforced creates answered with the message an earlier one made.
    pub(crate) nonce_hits: usize,
    pub(crate) next_id: u64,
    pub(crate) gateway_url: String,
    /// `http://127.0.0.1:PORT`: where the fake's CDN serves attachments.
    pub(crate) cdn_base: String,
    /// CDN path → (content type, bytes) of the files users sent.
    pub(crate) cdn_files: HashMap<String, (String, Vec<u8>)>,
    /// CDN paths fetched, in order.
    pub(crate) cdn_fetches: Vec<String>,
}

impl State {
    pub(crate) fn next_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    /// Adds a dispatch to the current session's log and sends it if connected.
    fn dispatch(&mut self, name: &str, data: Value) {
        let Some(session_id) = self.current_session.clone() else {
            panic!("no gateway session to dispatch {name} on: the bot never identified");
        };
        let session = self.sessions.entry(session_id.clone()).or_default();
        session.seq += 1;
        let payload = json!({ "op": 0, "t": name, "s": session.seq, "d": data });
        session.log.push((session.seq, payload.clone()));
        if let Some((connected, tx)) = &self.connection {
            if *connected == session_id {
                let _ = tx.send(ToClient::Payload(payload));
            }
        }
    }
}

#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) state: Mutex<State>,
    pub(crate) changes: watch::Sender<u64>,
    /// Cancelled when the fake stops (a hung call ends then).
    pub(crate) stop: CancellationToken,
}

impl Shared {
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(crate) fn changed(&self) {
        self.changes.send_modify(|n| *n += 1);
    }
}

/// The fake; dropping it stops its servers.
#[derive(Debug)]
pub struct FakeDiscord {
    shared: Arc<Shared>,
    gateway_addr: std::net::SocketAddr,
    rest_addr: std::net::SocketAddr,
    stop: CancellationToken,
}

impl Drop for FakeDiscord {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl FakeDiscord {
    /// Starts both servers on 127.0.0.1 for a bot with `token`.
    pub async fn start(token: &str) -> FakeDiscord {
        let gateway = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind gateway");
        let rest = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind rest");
        let gateway_addr = gateway.local_addr().unwrap();
        let rest_addr = rest.local_addr().unwrap();
        let stop = CancellationToken::new();
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                token: token.to_owned(),
                heartbeat_interval: Duration::from_millis(1500),
                ack_heartbeats: true,
                refuse_resume: false,
                sessions: HashMap::new(),
                current_session: None,
                connection: None,
                ops: Vec::new(),
                connections: 0,
                channels: HashMap::new(),
                messages: Vec::new(),
                commands: Vec::new(),
                interaction_replies: Vec::new(),
                calls: Vec::new(),
                buckets: HashMap::new(),
                global: None,
                channel_limit: (5, Duration::from_secs(5)),
                global_limit: 50,
                violations: Vec::new(),
                faults: VecDeque::new(),
                nonces: HashMap::new(),
                nonce_hits: 0,
                next_id: 1_300_000_000_000_000_000,
                gateway_url: format!("ws://{gateway_addr}"),
                cdn_base: format!("http://{rest_addr}"),
                cdn_files: HashMap::new(),
                cdn_fetches: Vec::new(),
            }),
            changes: watch::Sender::new(0),
            stop: stop.clone(),
        });
        tokio::spawn(gateway::serve(gateway, shared.clone(), stop.clone()));
        tokio::spawn(rest::serve(rest, shared.clone(), stop.clone()));
        FakeDiscord { shared, gateway_addr, rest_addr, stop }
    }

    /// `ws://127.0.0.1:PORT`, for `gateway_url`.
    pub fn gateway_url(&self) -> String {
        format!("ws://{}", self.gateway_addr)
    }

    /// `http://127.0.0.1:PORT/api/v10`, for `api_base_url`.
    pub fn api_base_url(&self) -> String {
        format!("http://{}/api/v10", self.rest_addr)
    }

    pub fn add_channel(&self, channel: ChannelSpec) {
        self.shared.lock().channels.insert(channel.id, channel);
    }

    /// At most `calls` REST calls per channel bucket in each `window` (5 in 5 s by default).
    pub fn set_channel_limit(&self, calls: u32, window: Duration) {
        self.shared.lock().channel_limit = (calls, window);
    }

    /// Heartbeats are acknowledged (the default) or not.
    pub fn ack_heartbeats(&self, ack: bool) {
        self.shared.lock().ack_heartbeats = ack;
    }

    /// The next RESUME gets INVALID SESSION (d = false).
    pub fn refuse_next_resume(&self) {
        self.shared.lock().refuse_resume = true;
    }

    /// The next call whose path contains `route` gets `fault`.
    pub fn fail_next(&self, route: &str, fault: Fault) {
        self.shared.lock().faults.push_back((route.to_owned(), fault));
    }

    /// Drops the client's connection without a close frame.
    pub fn drop_connection(&self) {
        if let Some((_, tx)) = self.shared.lock().connection.take() {
            let _ = tx.send(ToClient::Drop);
        }
    }

    /// Closes the client's connection with `code`.
    pub fn close_connection(&self, code: u16) {
        if let Some((_, tx)) = self.shared.lock().connection.take() {
            let _ = tx.send(ToClient::Close(code));
        }
    }

    /// Sends a gateway payload (op 7, op 9…) to the connected client.
    pub fn send_op(&self, payload: Value) {
        if let Some((_, tx)) = &self.shared.lock().connection {
            let _ = tx.send(ToClient::Payload(payload));
        }
    }

    /// A user writes `content` in `channel` (replying to `reply_to`); the
    /// message as dispatched (MESSAGE_CREATE). `mention` adds a mention of the bot.
    pub fn inject_message(
        &self,
        channel: u64,
        author: u64,
        content: &str,
        mention: bool,
        reply_to: Option<u64>,
    ) -> FakeMessage {
        self.inject_message_with_files(channel, author, content, mention, reply_to, &[])
    }

    /// [`FakeDiscord::inject_message`] with `files` attached: each served by
    /// the fake's CDN at the `url` of its attachment. A voice file (with
    /// `voice_seconds`) makes it a voice message (flag `IS_VOICE_MESSAGE`).
    pub fn inject_message_with_files(
        &self,
        channel: u64,
        author: u64,
        content: &str,
        mention: bool,
        reply_to: Option<u64>,
        files: &[UserFile],
    ) -> FakeMessage {
        let mut state = self.shared.lock();
        let spec =
            state.channels.get(&channel).cloned().unwrap_or_else(|| ChannelSpec::dm(channel));
        let id = state.next_id();
        let content = if mention { format!("<@{BOT_ID}> {content}") } else { content.to_owned() };
        let referenced =
            reply_to.and_then(|rid| state.messages.iter().find(|m| m.id == rid).cloned());
        let mut data = json!({
            "id": id.to_string(), "channel_id": channel.to_string(), "type": 0,
            "author": { "id": author.to_string(), "username": format!("user{author}"), "global_name": null },
            "content": content, "timestamp": "2026-12-01T00:00:00.000000+00:00",
            "tts": false, "mention_everyone": false, "attachments": [], "embeds": [],
            "mentions": if mention { json!([{ "id": BOT_ID.to_string(), "username": BOT_NAME, "bot": true }]) } else { json!([]) },
        });
        if let Some(guild) = spec.guild_id {
            data["guild_id"] = json!(guild.to_string());
            data["member"] =
                json!({ "roles": [], "joined_at": "2026-01-01T00:00:00.000000+00:00" });
        }
        let mut attachments = Vec::new();
        for file in files {
            let attachment_id = state.next_id();
            let encoded: String = file
                .filename
                .bytes()
                .map(|b| {
                    if b.is_ascii_alphanumeric() || b"-_.".contains(&b) {
                        (b as char).to_string()
                    } else {
                        format!("%{b:02X}")
                    }
                })
                .collect();
            let path = format!("/attachments/{channel}/{attachment_id}/{encoded}");
            let url = format!("{}{path}?ex=6a1b&is=6a0a&hm=signed", state.cdn_base);
            state.cdn_files.insert(path, (file.content_type.clone(), file.bytes.clone()));
            let mut attachment = json!({
                "id": attachment_id.to_string(), "filename": file.filename,
                "size": file.announced_size.unwrap_or(file.bytes.len() as u64),
                "url": url, "proxy_url": url, "content_type": file.content_type,
            });
            if let Some(seconds) = file.voice_seconds {
                attachment["duration_secs"] = json!(seconds);
                attachment["waveform"] = json!("AAAAAAAA");
                data["flags"] = json!(1 << 13);
            }
            attachments.push(attachment);
        }
        data["attachments"] = Value::Array(attachments);
        if let Some(replied) = &referenced {
            data["message_reference"] =
                json!({ "message_id": replied.id.to_string(), "channel_id": channel.to_string() });
            data["referenced_message"] = json!({
                "id": replied.id.to_string(), "channel_id": channel.to_string(),
                "author": { "id": replied.author_id.to_string(), "username": "x", "bot": replied.author_id == BOT_ID },
                "content": replied.content, "mentions": [], "attachments": [],
            });
        }
        let message = FakeMessage {
            id,
            channel_id: channel,
            author_id: author,
            content: content.clone(),
            reply_to,
            versions: vec![content],
            edits: 0,
            attachments: Vec::new(),
            components: json!([]),
            sent_at: Instant::now(),
        };
        state.messages.push(message.clone());
        state.dispatch("MESSAGE_CREATE", data);
        drop(state);
        self.shared.changed();
        message
    }

    /// A user runs the slash command `name` (with an `engine` option) in
    /// `channel`; the interaction id.
    pub fn inject_command(&self, channel: u64, user: u64, name: &str, option: Option<&str>) -> u64 {
        let mut state = self.shared.lock();
        let spec =
            state.channels.get(&channel).cloned().unwrap_or_else(|| ChannelSpec::dm(channel));
        let id = state.next_id();
        let user_json = json!({ "id": user.to_string(), "username": format!("user{user}") });
        let options: Vec<Value> = option
            .map(|v| json!({ "name": "engine", "type": 3, "value": v }))
            .into_iter()
            .collect();
        let mut data = json!({
            "id": id.to_string(), "application_id": APPLICATION_ID.to_string(), "type": 2,
            "token": format!("itoken-{id}"), "version": 1, "channel_id": channel.to_string(),
            "data": { "id": "1", "name": name, "type": 1, "options": options },
        });
        match spec.guild_id {
            Some(guild) => {
                data["guild_id"] = json!(guild.to_string());
                data["member"] = json!({ "user": user_json, "roles": [] });
            }
            None => data["user"] = user_json,
        }
        state.dispatch("INTERACTION_CREATE", data);
        drop(state);
        self.shared.changed();
        id
    }

    /// A user presses the button `custom_id` under the bot's message
    /// `message` in `channel`; the interaction id.
    pub fn press_button(&self, channel: u64, message: u64, user: u64, custom_id: &str) -> u64 {
        let mut state = self.shared.lock();
        let spec =
            state.channels.get(&channel).cloned().unwrap_or_else(|| ChannelSpec::dm(channel));
        let id = state.next_id();
        let user_json = json!({ "id": user.to_string(), "username": format!("user{user}") });
        let mut data = json!({
            "id": id.to_string(), "application_id": APPLICATION_ID.to_string(), "type": 3,
            "token": format!("itoken-{id}"), "version": 1, "channel_id": channel.to_string(),
            "message": { "id": message.to_string(), "channel_id": channel.to_string() },
            "data": { "custom_id": custom_id, "component_type": 2 },
        });
        match spec.guild_id {
            Some(guild) => {
                data["guild_id"] = json!(guild.to_string());
                data["member"] = json!({ "user": user_json, "roles": [] });
            }
            None => data["user"] = user_json,
        }
        state.dispatch("INTERACTION_CREATE", data);
        drop(state);
        self.shared.changed();
        id
    }

    /// Reads the state through `f`.
    pub fn snapshot<T>(&self, f: impl FnOnce(&Snapshot<'_>) -> T) -> T {
        let state = self.shared.lock();
        f(&Snapshot { state: &state })
    }

    /// Waits until `pred` holds, at most `timeout`; panics with the calls made otherwise.
    pub async fn wait_until(
        &self,
        what: &str,
        timeout: Duration,
        pred: impl Fn(&Snapshot<'_>) -> bool,
    ) {
        let deadline = Instant::now() + timeout;
        let mut changes = self.shared.changes.subscribe();
        loop {
            changes.borrow_and_update();
            if self.snapshot(&pred) {
                return;
            }
            if tokio::time::timeout_at(deadline, changes.changed()).await.is_err() {
                panic!("timed out after {timeout:?} waiting for {what}\n{}", self.describe());
            }
        }
    }

    /// The bot's messages in `channel`, oldest first.
    pub fn bot_messages(&self, channel: u64) -> Vec<FakeMessage> {
        self.snapshot(|s| s.bot_messages(channel).into_iter().cloned().collect())
    }

    /// The CDN paths of the attachments fetched so far, in order.
    pub fn cdn_fetches(&self) -> Vec<String> {
        self.shared.lock().cdn_fetches.clone()
    }

    pub fn violations(&self) -> Vec<String> {
        self.shared.lock().violations.clone()
    }

    pub fn calls(&self) -> Vec<Call> {
        self.shared.lock().calls.clone()
    }

    pub fn ops(&self) -> Vec<GatewayOp> {
        self.shared.lock().ops.clone()
    }

    pub fn commands(&self) -> Vec<Value> {
        self.shared.lock().commands.clone()
    }

    /// The calls and gateway ops, for a failure message.
    pub fn describe(&self) -> String {
        let state = self.shared.lock();
        let mut out = String::from("gateway ops (heartbeats left out):\n");
        for op in state.ops.iter().filter(|op| !matches!(op, GatewayOp::Heartbeat { .. })) {
            out.push_str(&format!("  {op:?}\n"));
        }
        out.push_str("rest calls:\n");
        let start = state.calls.first().map(|c| c.at);
        for call in &state.calls {
            let ms = start.map_or(0, |s| call.at.duration_since(s).as_millis());
            let answer = match (call.answered, call.applied) {
                (true, _) => call.status.to_string(),
                (false, true) => format!("no answer (applied: {})", call.status),
                (false, false) => "no answer (not applied)".to_owned(),
            };
            let nonce = call.nonce.as_ref().map_or(String::new(), |(n, _)| format!(" nonce={n}"));
            out.push_str(&format!("  +{ms}ms {} {}{nonce} -> {answer}\n", call.method, call.path));
        }
        out
    }
}

/// A view of the fake's state.
#[derive(Debug)]
pub struct Snapshot<'a> {
    state: &'a State,
}

impl<'a> Snapshot<'a> {
    pub fn bot_messages(&self, channel: u64) -> Vec<&'a FakeMessage> {
        self.state
            .messages
            .iter()
            .filter(|m| m.channel_id == channel && m.author_id == BOT_ID)
            .collect()
    }

    pub fn message(&self, id: u64) -> Option<&'a FakeMessage> {
        self.state.messages.iter().find(|m| m.id == id)
    }

    /// The bot's reply to `message_id`, if any.
    pub fn reply_to(&self, message_id: u64) -> Option<&'a FakeMessage> {
        self.state.messages.iter().find(|m| m.author_id == BOT_ID && m.reply_to == Some(message_id))
    }

    pub fn interaction_reply(&self, interaction: u64) -> Option<&'a str> {
        self.state
            .interaction_replies
            .iter()
            .find(|(id, _)| *id == interaction)
            .map(|(_, c)| c.as_str())
    }

    pub fn ops(&self) -> &'a [GatewayOp] {
        &self.state.ops
    }

    pub fn commands(&self) -> &'a [Value] {
        &self.state.commands
    }

    pub fn connected(&self) -> bool {
        self.state.connection.is_some()
    }

    pub fn connections(&self) -> usize {
        self.state.connections
    }

    /// Enforced message creates answered with the message an earlier create
    /// of the same nonce made (no new message).
    pub fn nonce_hits(&self) -> usize {
        self.state.nonce_hits
    }

    /// The REST calls so far.
    pub fn calls(&self) -> &'a [Call] {
        &self.state.calls
    }
}
