//! A fake Telegram Bot API server on loopback, speaking the real wire protocol,
//! for tests in this process and for the real gateway binary polling it.
//!
//! The fake plays both sides a bot sees: it answers the bot's calls (`getMe`,
//! `deleteWebhook`, `getUpdates`, `sendMessage`, `editMessageText`,
//! `setMyCommands`, `sendChatAction`) and lets the test act as users by injecting
//! updates. It keeps Telegram's rules that clients trip over: long polls that end
//! early when an update arrives, offsets that confirm updates for good, one poller
//! per bot (the earlier gets 409), message length counted in UTF-16, "message is
//! not modified", and flood limits answered with 429 and `retry_after`.
//!
//! Tests observe it without sleeping: every state change wakes
//! [`FakeTelegram::wait_until`], and the recorded calls, messages and limit
//! violations can be read at any time. Bot tokens appear in no output of the fake.

mod files;
mod limits;
mod multipart;
mod state;
mod types;

use std::fmt::{self, Write as _};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, Query, State as AxumState};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};
use axum::{Json, Router};
use serde_json::{json, Map, Value};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

pub use files::MAX_GET_FILE_BYTES;
pub use limits::{Enforcement, LimitKind, RateLimits};
use state::State;
pub use types::{Command, Entity};

/// A started fake. Clones share the server; it stops when the last clone is
/// dropped, or at [`FakeTelegram::shutdown`].
///
/// Each clone acts for one bot (the first one given, unless chosen with
/// [`FakeTelegram::bot`]): injection, faults and per-bot observations apply to it.
#[derive(Clone)]
pub struct FakeTelegram {
    shared: Arc<Shared>,
    /// Index into the bots of the state.
    bot: usize,
    server: Arc<Server>,
}

/// State shared by the handlers and the test's handles.
struct Shared {
    /// Everything the fake knows; locked only for short synchronous sections.
    state: Mutex<State>,
    /// Bumped after every change of `state`; long polls and `wait_until` watch it.
    changes: watch::Sender<u64>,
    /// Cancelled when the fake stops; ends long polls at once.
    stop: CancellationToken,
}

/// The running HTTP server; stopping it is tied to the last handle.
struct Server {
    addr: SocketAddr,
    stop: CancellationToken,
    task: Mutex<Option<JoinHandle<()>>>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.cancel();
        if let Some(task) = lock(&self.task).take() {
            task.abort();
        }
    }
}

impl fmt::Debug for FakeTelegram {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (id, username) = self.shared.read(|s| s.bot_identity(self.bot));
        f.debug_struct("FakeTelegram")
            .field("addr", &self.server.addr)
            .field("bot_id", &id)
            .field("bot_username", &username)
            .finish_non_exhaustive()
    }
}

/// How to start a [`FakeTelegram`].
#[derive(Debug, Clone)]
pub struct FakeTelegramBuilder {
    bots: Vec<BotSpec>,
    limits: RateLimits,
    manual_clock: bool,
}

/// A bot the fake knows. `Debug` leaves the token out.
#[derive(Clone)]
struct BotSpec {
    token: String,
    id: i64,
    username: String,
}

impl fmt::Debug for BotSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BotSpec")
            .field("id", &self.id)
            .field("username", &self.username)
            .finish_non_exhaustive()
    }
}

impl FakeTelegramBuilder {
    /// Adds a bot answering to `token`, with user id `id` and `username`.
    pub fn bot(mut self, token: &str, id: i64, username: &str) -> Self {
        self.bots.push(BotSpec { token: token.to_owned(), id, username: username.to_owned() });
        self
    }

    /// The flood limits to apply; [`RateLimits::telegram`] by default.
    pub fn rate_limits(mut self, limits: RateLimits) -> Self {
        self.limits = limits;
        self
    }

    /// Makes the fake's clock (arrival times, flood limits) move only through
    /// [`FakeTelegram::advance_clock`], so limit windows can be tested without
    /// waiting. Long-poll timeouts still run on tokio's clock.
    pub fn manual_clock(mut self) -> Self {
        self.manual_clock = true;
        self
    }

    /// Binds `127.0.0.1:0` and serves.
    ///
    /// # Panics
    /// When no bot was added, two bots share a token or id, or loopback cannot be
    /// bound: all mistakes in the test or its machine.
    pub async fn start(self) -> FakeTelegram {
        assert!(!self.bots.is_empty(), "a fake Telegram needs at least one bot");
        for (i, bot) in self.bots.iter().enumerate() {
            assert!(
                self.bots[..i].iter().all(|b| b.token != bot.token && b.id != bot.id),
                "two fake bots share a token or the id {}",
                bot.id
            );
        }
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binding 127.0.0.1:0 for the fake Telegram");
        let addr = listener.local_addr().expect("the fake Telegram's address");
        let stop = CancellationToken::new();
        let bots = self.bots.into_iter().map(|b| (b.token, b.id, b.username)).collect();
        let shared = Arc::new(Shared {
            state: Mutex::new(State::new(bots, self.limits, self.manual_clock)),
            changes: watch::Sender::new(0),
            stop: stop.clone(),
        });
        let router = Router::new()
            .route("/{bot}/{method}", any(handle))
            .route("/file/{bot}/{*path}", get(download))
            .fallback(not_found)
            .with_state(shared.clone());
        let shutdown = stop.clone().cancelled_owned();
        let task = tokio::spawn(async move {
            // An accept error ends the fake; the test then fails on its calls.
            let _ = axum::serve(listener, router).with_graceful_shutdown(shutdown).await;
        });
        let server = Arc::new(Server { addr, stop, task: Mutex::new(Some(task)) });
        FakeTelegram { shared, bot: 0, server }
    }
}

/// The kind of a chat.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChatKind {
    Private,
    Group,
    Supergroup,
    Channel,
}

impl ChatKind {
    /// The Bot API's `type` string.
    pub fn as_str(self) -> &'static str {
        match self {
            ChatKind::Private => "private",
            ChatKind::Group => "group",
            ChatKind::Supergroup => "supergroup",
            ChatKind::Channel => "channel",
        }
    }
}

/// Where an injected message is posted: the chat, and for forums the topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatSpec {
    pub id: i64,
    pub kind: ChatKind,
    pub title: Option<String>,
    /// A public `@username`, which `chat_id` may name instead of the id.
    pub username: Option<String>,
    /// A supergroup with topics.
    pub is_forum: bool,
    /// The topic (forums) or reply thread (other supergroups) of the message.
    pub message_thread_id: Option<i64>,
    /// Whether the message belongs to a forum topic.
    pub is_topic_message: bool,
}

impl ChatSpec {
    /// The private chat with user `user_id` (its id is the user's).
    pub fn private(user_id: i64) -> Self {
        ChatSpec::new(user_id, ChatKind::Private, None)
    }

    /// A basic group; ids are negative.
    pub fn group(id: i64) -> Self {
        ChatSpec::new(id, ChatKind::Group, Some(format!("Group {id}")))
    }

    /// A supergroup without topics; ids look like `-100…`.
    pub fn supergroup(id: i64) -> Self {
        ChatSpec::new(id, ChatKind::Supergroup, Some(format!("Supergroup {id}")))
    }

    /// A channel; its messages arrive as `channel_post` without `from`.
    pub fn channel(id: i64) -> Self {
        ChatSpec::new(id, ChatKind::Channel, Some(format!("Channel {id}")))
    }

    /// Topic `thread_id` of forum supergroup `id`.
    pub fn forum_topic(id: i64, thread_id: i64) -> Self {
        ChatSpec {
            is_forum: true,
            message_thread_id: Some(thread_id),
            is_topic_message: true,
            ..ChatSpec::new(id, ChatKind::Supergroup, Some(format!("Forum {id}")))
        }
    }

    /// The General topic of forum supergroup `id`: messages carry no thread id.
    pub fn forum_general(id: i64) -> Self {
        ChatSpec {
            is_forum: true,
            ..ChatSpec::new(id, ChatKind::Supergroup, Some(format!("Forum {id}")))
        }
    }

    /// The same chat, with messages in reply thread `thread_id` of a non-forum
    /// supergroup (`is_topic_message` stays false, as Telegram sends it).
    pub fn in_reply_thread(mut self, thread_id: i64) -> Self {
        self.message_thread_id = Some(thread_id);
        self.is_topic_message = false;
        self
    }

    pub fn with_title(mut self, title: &str) -> Self {
        self.title = Some(title.to_owned());
        self
    }

    pub fn with_username(mut self, username: &str) -> Self {
        self.username = Some(username.to_owned());
        self
    }

    fn new(id: i64, kind: ChatKind, title: Option<String>) -> Self {
        ChatSpec {
            id,
            kind,
            title,
            username: None,
            is_forum: false,
            message_thread_id: None,
            is_topic_message: false,
        }
    }
}

/// An injected message: the update carrying it and its id in the chat.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InjectedMessage {
    pub update_id: i64,
    pub message_id: i64,
}

/// A failure answered instead of the next call of a method.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// 429 "Too Many Requests: retry after N" with `parameters.retry_after`.
    RetryAfter(u64),
    /// Any status with the Bot API's error envelope, e.g. 500 or 502.
    Status(u16, String),
    /// 400 "message is not modified".
    NotModified,
    /// 400 "group chat was upgraded to a supergroup chat" with
    /// `parameters.migrate_to_chat_id`.
    MigrateTo(i64),
    /// The status with an HTML body, as a proxy in front of the Bot API answers.
    NonJson(u16),
    /// Network latency: the call reaches the fake this much later (its limits
    /// and answer are decided then); the answer is the usual one.
    Delay(Duration),
    /// The connection is closed without an answer; the call is not acted on.
    Drop,
    /// The call is held open and never answered, until the client gives up (its
    /// timeout) or the fake stops; it is not acted on.
    Hang,
}

impl Fault {
    /// Whether the fault acts on the connection rather than on the answer.
    fn is_connection_fault(&self) -> bool {
        matches!(self, Fault::Delay(_) | Fault::Drop | Fault::Hang)
    }
}

/// One call the fake received.
#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    /// The bot it was for; `None` when the token was unknown.
    pub bot_id: Option<i64>,
    /// The method as written in the URL.
    pub method: String,
    /// The parameters, from JSON, form or query (form and query values are strings).
    pub params: Value,
    /// Arrival, on the fake's clock.
    pub at: Instant,
    /// The HTTP status answered; `None` while the call is still open.
    pub status: Option<u16>,
}

/// A message a bot sent, as it stands now.
#[derive(Debug, Clone, PartialEq)]
pub struct BotMessage {
    pub bot_id: i64,
    pub chat_id: i64,
    pub message_id: i64,
    pub text: String,
    pub entities: Vec<Entity>,
    /// Every text the message showed, the first one first; the last is `text`.
    pub versions: Vec<String>,
    /// How many edits were accepted.
    pub edits: usize,
    /// The message it answers (`reply_parameters.message_id`), if that exists.
    pub reply_to: Option<i64>,
    pub message_thread_id: Option<i64>,
    /// When it was sent, on the fake's clock.
    pub sent_at: Instant,
    /// When it was last edited, on the fake's clock.
    pub edited_at: Option<Instant>,
}

/// A file a user sends in a message (a document, an audio file…).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserFile {
    /// `file_name`; `None` sends none (as for photos and voice notes).
    pub name: Option<String>,
    pub mime: Option<String>,
    pub bytes: Vec<u8>,
    /// The `file_size` the message announces; the real size when `None`.
    pub announced_size: Option<u64>,
}

impl UserFile {
    pub fn new(name: &str, mime: &str, bytes: &[u8]) -> Self {
        UserFile {
            name: Some(name.to_owned()),
            mime: Some(mime.to_owned()),
            bytes: bytes.to_vec(),
            announced_size: None,
        }
    }

    /// The same, announcing `size` bytes whatever it holds.
    pub fn announcing(mut self, size: u64) -> Self {
        self.announced_size = Some(size);
        self
    }

    fn size(&self) -> u64 {
        self.announced_size.unwrap_or(self.bytes.len() as u64)
    }
}

/// A file in a `multipart/form-data` call, as it arrived.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upload {
    /// The form field that carried it (`photo`, `document`).
    pub field: String,
    pub filename: String,
    pub content_type: String,
    pub content: Vec<u8>,
}

/// A file a bot sent with `sendPhoto` or `sendDocument`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BotFile {
    pub bot_id: i64,
    pub chat_id: i64,
    pub message_id: i64,
    /// `sendPhoto` or `sendDocument`.
    pub method: &'static str,
    pub filename: String,
    pub content_type: String,
    pub caption: Option<String>,
    pub message_thread_id: Option<i64>,
    pub content: Vec<u8>,
}

/// A call that broke a flood limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub bot_id: i64,
    pub method: String,
    pub chat_id: i64,
    pub kind: LimitKind,
    /// On the fake's clock.
    pub at: Instant,
}

/// A consistent view of the fake for one bot, valid during a
/// [`FakeTelegram::snapshot`] or [`FakeTelegram::wait_until`] closure.
pub struct Snapshot<'a> {
    state: &'a State,
    bot: usize,
}

impl fmt::Debug for Snapshot<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Snapshot")
            .field("calls", &self.state.calls().len())
            .field("pending_updates", &self.pending_updates().len())
            .finish_non_exhaustive()
    }
}

impl<'a> Snapshot<'a> {
    /// Every call received, for all bots, in order of arrival.
    pub fn calls(&self) -> &'a [Call] {
        self.state.calls()
    }

    /// This bot's calls of `method` (case-insensitive, as Telegram matches them).
    pub fn calls_to(&self, method: &str) -> Vec<&'a Call> {
        let id = self.state.bot_identity(self.bot).0;
        self.state
            .calls()
            .iter()
            .filter(|c| c.bot_id == Some(id) && c.method.eq_ignore_ascii_case(method))
            .collect()
    }

    /// The messages this bot sent to `chat_id`, oldest first.
    pub fn messages(&self, chat_id: i64) -> Vec<&'a BotMessage> {
        self.state.bot_messages(self.bot, chat_id)
    }

    /// The files this bot uploaded to `chat_id`, oldest first.
    pub fn files(&self, chat_id: i64) -> Vec<&'a BotFile> {
        self.state.bot_files(self.bot, chat_id)
    }

    /// One message this bot sent.
    pub fn message(&self, chat_id: i64, message_id: i64) -> Option<&'a BotMessage> {
        self.messages(chat_id).into_iter().find(|m| m.message_id == message_id)
    }

    /// The commands this bot last set.
    pub fn commands(&self) -> &'a [Command] {
        self.state.commands(self.bot)
    }

    /// The highest `offset` a poll of this bot has passed (0 before any):
    /// updates below it were confirmed and are gone for good.
    pub fn confirmed_offset(&self) -> i64 {
        self.state.confirmed_offset(self.bot)
    }

    /// Updates not yet confirmed, oldest first.
    pub fn pending_updates(&self) -> Vec<&'a Value> {
        self.state.pending_updates(self.bot)
    }

    /// The `offset` of each `getUpdates` call of this bot, in order (`None`
    /// for a call without one).
    pub fn poll_offsets(&self) -> Vec<Option<i64>> {
        self.calls_to("getUpdates")
            .into_iter()
            .map(|call| match call.params.get("offset") {
                Some(Value::Number(n)) => n.as_i64(),
                Some(Value::String(s)) => s.parse().ok(),
                _ => None,
            })
            .collect()
    }

    /// The bot's messages in `chat_id` that reply to `message_id`, oldest first.
    pub fn replies_to(&self, chat_id: i64, message_id: i64) -> Vec<&'a BotMessage> {
        self.messages(chat_id).into_iter().filter(|m| m.reply_to == Some(message_id)).collect()
    }

    /// `getUpdates` calls of this bot waiting for updates right now.
    pub fn waiting_polls(&self) -> usize {
        self.state.waiting_polls(self.bot)
    }

    /// Flood-limit violations of every bot, in order.
    pub fn violations(&self) -> &'a [Violation] {
        self.state.violations()
    }

    /// The fake's clock.
    pub fn now(&self) -> Instant {
        self.state.now()
    }
}

impl FakeTelegram {
    /// A builder with no bots yet, Telegram's flood limits and the real clock.
    pub fn builder() -> FakeTelegramBuilder {
        FakeTelegramBuilder {
            bots: Vec::new(),
            limits: RateLimits::telegram(),
            manual_clock: false,
        }
    }

    /// Starts a fake for `bots` (`(token, bot user id, username)`) with Telegram's
    /// flood limits.
    ///
    /// # Panics
    /// See [`FakeTelegramBuilder::start`].
    pub async fn start(bots: &[(&str, i64, &str)]) -> FakeTelegram {
        bots.iter()
            .fold(FakeTelegram::builder(), |b, (token, id, username)| b.bot(token, *id, username))
            .start()
            .await
    }

    /// `http://127.0.0.1:PORT`, the base URL for a Bot API client.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.server.addr)
    }

    pub fn addr(&self) -> SocketAddr {
        self.server.addr
    }

    /// A handle acting for the bot with user id `bot_id`.
    ///
    /// # Panics
    /// When the fake has no such bot.
    pub fn bot(&self, bot_id: i64) -> FakeTelegram {
        let bot = self
            .shared
            .read(|s| s.bot_index(bot_id))
            .unwrap_or_else(|| panic!("the fake Telegram has no bot {bot_id}"));
        FakeTelegram { bot, ..self.clone() }
    }

    /// The user id of the bot this handle acts for.
    pub fn bot_id(&self) -> i64 {
        self.shared.read(|s| s.bot_identity(self.bot).0)
    }

    /// Makes `chat` known, so the bot can send to it before anyone wrote there.
    /// Injecting a message does this too.
    pub fn add_chat(&self, chat: &ChatSpec) {
        self.shared.update(|s| s.add_chat(chat));
    }

    /// User `from` writes `text` in `chat`. A leading `/command` gets its
    /// `bot_command` entity, as Telegram adds it.
    pub fn inject_text(&self, chat: &ChatSpec, from: i64, text: &str) -> InjectedMessage {
        self.shared.update(|s| s.inject_text(self.bot, chat, from, text, None))
    }

    /// User `from` answers message `reply_to_message_id` of `chat` (the user's,
    /// or one a bot sent) with `text`; the update embeds the replied-to message as
    /// it stands, as Telegram does.
    ///
    /// # Panics
    /// When `chat` has no message `reply_to_message_id`.
    pub fn inject_reply(
        &self,
        chat: &ChatSpec,
        from: i64,
        text: &str,
        reply_to_message_id: i64,
    ) -> InjectedMessage {
        self.shared.update(|s| s.inject_text(self.bot, chat, from, text, Some(reply_to_message_id)))
    }

    /// User `from` presses the inline button carrying `data` on the bot's
    /// message `message_id` in `chat`; returns the update id.
    ///
    /// # Panics
    /// When `chat` has no message `message_id`.
    pub fn press_button(&self, chat: &ChatSpec, from: i64, message_id: i64, data: &str) -> i64 {
        self.shared.update(|s| s.press_button(self.bot, chat, from, message_id, data))
    }

    /// User `from` posts a photo, with an optional caption: a message without text.
    pub fn inject_photo(
        &self,
        chat: &ChatSpec,
        from: i64,
        caption: Option<&str>,
    ) -> InjectedMessage {
        self.shared.update(|s| s.inject_photo(self.bot, chat, from, caption))
    }

    /// User `from` sends the photo `bytes` (the largest of its sizes; the
    /// smaller ones are prefixes of it), with an optional caption.
    pub fn inject_photo_bytes(
        &self,
        chat: &ChatSpec,
        from: i64,
        caption: Option<&str>,
        bytes: &[u8],
    ) -> InjectedMessage {
        self.inject_photo_in_group(chat, from, caption, bytes, None)
    }

    /// User `from` sends `photos` at once (an album): one message each, with
    /// the same `media_group_id`, the caption on the first.
    pub fn inject_album(
        &self,
        chat: &ChatSpec,
        from: i64,
        caption: Option<&str>,
        photos: &[&[u8]],
    ) -> Vec<InjectedMessage> {
        let group = format!("1340{}", self.shared.read(|s| s.calls().len()) + photos.len());
        photos
            .iter()
            .enumerate()
            .map(|(n, bytes)| {
                let caption = caption.filter(|_| n == 0);
                self.inject_photo_in_group(chat, from, caption, bytes, Some(&group))
            })
            .collect()
    }

    fn inject_photo_in_group(
        &self,
        chat: &ChatSpec,
        from: i64,
        caption: Option<&str>,
        bytes: &[u8],
        group: Option<&str>,
    ) -> InjectedMessage {
        self.shared.update(|s| {
            let sizes: Vec<Value> =
                [(90, bytes.len() / 8), (320, bytes.len() / 3), (1280, bytes.len())]
                    .into_iter()
                    .map(|(side, len)| {
                        let part = &bytes[..len.max(1).min(bytes.len())];
                        let (file_id, unique_id) = s.served.register(part, "photos", "jpg");
                        json!({
                            "file_id": file_id, "file_unique_id": unique_id,
                            "width": side, "height": side * 3 / 4, "file_size": part.len(),
                        })
                    })
                    .collect();
            let mut fields = Map::new();
            fields.insert("photo".into(), Value::Array(sizes));
            if let Some(caption) = caption {
                fields.insert("caption".into(), json!(caption));
            }
            if let Some(group) = group {
                fields.insert("media_group_id".into(), json!(group));
            }
            s.inject_fields(self.bot, chat, from, fields)
        })
    }

    /// User `from` sends `file` as a document, with an optional caption.
    pub fn inject_document(
        &self,
        chat: &ChatSpec,
        from: i64,
        caption: Option<&str>,
        file: &UserFile,
    ) -> InjectedMessage {
        self.shared.update(|s| {
            let ext =
                file.name.as_deref().and_then(|n| n.rsplit_once('.')).map_or("bin", |(_, e)| e);
            let ext: String = ext.chars().filter(char::is_ascii_alphanumeric).collect();
            let (file_id, unique_id) = s.served.register(&file.bytes, "documents", &ext);
            let mut document = json!({
                "file_id": file_id, "file_unique_id": unique_id, "file_size": file.size(),
            });
            if let Some(name) = &file.name {
                document["file_name"] = json!(name);
            }
            if let Some(mime) = &file.mime {
                document["mime_type"] = json!(mime);
            }
            let mut fields = Map::new();
            fields.insert("document".into(), document);
            if let Some(caption) = caption {
                fields.insert("caption".into(), json!(caption));
            }
            s.inject_fields(self.bot, chat, from, fields)
        })
    }

    /// User `from` sends a voice note: `ogg` (OGG/Opus) lasting `seconds`,
    /// announcing `announced_size` bytes (its real size when `None`).
    pub fn inject_voice(
        &self,
        chat: &ChatSpec,
        from: i64,
        ogg: &[u8],
        seconds: u64,
        announced_size: Option<u64>,
    ) -> InjectedMessage {
        self.shared.update(|s| {
            let (file_id, unique_id) = s.served.register(ogg, "voice", "oga");
            let voice = json!({
                "file_id": file_id, "file_unique_id": unique_id, "duration": seconds,
                "mime_type": "audio/ogg", "file_size": announced_size.unwrap_or(ogg.len() as u64),
            });
            let mut fields = Map::new();
            fields.insert("voice".into(), voice);
            s.inject_fields(self.bot, chat, from, fields)
        })
    }

    /// User `from` sends a sticker (a kind of message the bot does not take).
    pub fn inject_sticker(&self, chat: &ChatSpec, from: i64) -> InjectedMessage {
        self.shared.update(|s| {
            let mut fields = Map::new();
            fields.insert(
                "sticker".into(),
                json!({ "file_id": "CAACAgIAAxkBsticker", "file_unique_id": "AgADsticker",
                        "type": "regular", "width": 512, "height": 512,
                        "is_animated": false, "is_video": false, "emoji": "🍋" }),
            );
            s.inject_fields(self.bot, chat, from, fields)
        })
    }

    /// The `file_path`s bots downloaded from the file route, in order.
    pub fn downloads(&self) -> Vec<String> {
        self.shared.read(|s| s.served.downloads().to_vec())
    }

    /// Queues `update` as it is, with the next `update_id` set in it (replacing
    /// any given); returns that id. For updates the other methods cannot make,
    /// malformed ones included.
    ///
    /// # Panics
    /// When `update` is not a JSON object.
    pub fn inject_raw(&self, update: Value) -> i64 {
        let Value::Object(update) = update else { panic!("a raw update must be a JSON object") };
        self.shared.update(|s| s.inject_raw(self.bot, update))
    }

    /// Answers the next call of `method` (case-insensitive) with `fault`. Faults
    /// queue: each call consumes one.
    pub fn fail_next(&self, method: &str, fault: Fault) {
        self.shared.update(|s| s.push_fault(self.bot, method, fault));
    }

    /// Moves the manual clock forward.
    ///
    /// # Panics
    /// When the fake was not built with [`FakeTelegramBuilder::manual_clock`].
    pub fn advance_clock(&self, by: Duration) {
        self.shared.update(|s| s.advance_clock(by));
    }

    /// Every call received, for all bots, in order of arrival.
    pub fn calls(&self) -> Vec<Call> {
        self.snapshot(|s| s.calls().to_vec())
    }

    /// The messages this bot sent to `chat_id`, oldest first.
    pub fn messages(&self, chat_id: i64) -> Vec<BotMessage> {
        self.snapshot(|s| s.messages(chat_id).into_iter().cloned().collect())
    }

    /// The files this bot uploaded to `chat_id`, oldest first.
    pub fn files(&self, chat_id: i64) -> Vec<BotFile> {
        self.snapshot(|s| s.files(chat_id).into_iter().cloned().collect())
    }

    /// The commands this bot last set.
    pub fn commands(&self) -> Vec<Command> {
        self.snapshot(|s| s.commands().to_vec())
    }

    /// See [`Snapshot::poll_offsets`].
    pub fn poll_offsets(&self) -> Vec<Option<i64>> {
        self.snapshot(|s| s.poll_offsets())
    }

    /// See [`Snapshot::replies_to`].
    pub fn replies_to(&self, chat_id: i64, message_id: i64) -> Vec<BotMessage> {
        self.snapshot(|s| s.replies_to(chat_id, message_id).into_iter().cloned().collect())
    }

    /// See [`Snapshot::confirmed_offset`].
    pub fn confirmed_offset(&self) -> i64 {
        self.snapshot(|s| s.confirmed_offset())
    }

    /// Updates not yet confirmed, oldest first.
    pub fn pending_updates(&self) -> Vec<Value> {
        self.snapshot(|s| s.pending_updates().into_iter().cloned().collect())
    }

    /// Flood-limit violations of every bot, in order.
    pub fn violations(&self) -> Vec<Violation> {
        self.snapshot(|s| s.violations().to_vec())
    }

    /// Runs `f` on a consistent view of the fake.
    pub fn snapshot<R>(&self, f: impl FnOnce(&Snapshot<'_>) -> R) -> R {
        self.shared.read(|state| f(&Snapshot { state, bot: self.bot }))
    }

    /// Waits until `pred` holds, checking after every change of the fake's state.
    ///
    /// # Panics
    /// After `timeout`, with `what` and every call received, so the failure says
    /// what the client did.
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
            // The sender lives in `self.shared`, so `changed` cannot fail here.
            if tokio::time::timeout_at(deadline, changes.changed()).await.is_err() {
                panic!("timed out after {timeout:?} waiting for {what}\n{}", self.describe_calls());
            }
        }
    }

    /// Stops the server: open long polls end at once, then the server task ends.
    /// Other clones of this handle stop working too.
    pub async fn shutdown(self) {
        self.server.stop.cancel();
        let task = lock(&self.server.task).take();
        if let Some(task) = task {
            // The task ends on its own once the open connections close; a panic in
            // it has already been reported by the runtime.
            let _ = task.await;
        }
    }

    /// The calls received, one a line, for failure messages.
    pub fn describe_calls(&self) -> String {
        self.snapshot(|s| {
            let mut text = format!("calls received ({}):\n", s.calls().len());
            for call in s.calls() {
                let status = call.status.map_or_else(|| "open".to_owned(), |s| s.to_string());
                let mut params = call.params.to_string();
                if params.len() > 300 {
                    let cut = (0..=300).rev().find(|i| params.is_char_boundary(*i)).unwrap_or(0);
                    params.truncate(cut);
                    params.push('…');
                }
                let bot =
                    call.bot_id.map_or_else(|| "unknown bot".to_owned(), |id| format!("bot {id}"));
                let _ = writeln!(text, "  {bot} {} -> {status} {params}", call.method);
            }
            text
        })
    }
}

impl Shared {
    fn read<R>(&self, f: impl FnOnce(&State) -> R) -> R {
        f(&lock(&self.state))
    }

    /// Changes the state and wakes everyone watching it.
    fn update<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        let result = f(&mut lock(&self.state));
        self.changes.send_modify(|version| *version = version.wrapping_add(1));
        result
    }
}

/// Locks `mutex`, carrying on after a panic elsewhere: the fake's state stays
/// readable for the failure message.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What the fake answers a call.
#[derive(Debug, Clone, PartialEq)]
enum Reply {
    /// `{"ok":true,"result":…}`.
    Ok(Value),
    /// `{"ok":false,"error_code":…,"description":…,"parameters":…}`.
    Error { code: u16, description: String, parameters: Option<Value> },
    /// A non-JSON body.
    Html(u16),
}

impl Reply {
    fn error(code: u16, description: impl Into<String>) -> Self {
        Reply::Error { code, description: description.into(), parameters: None }
    }

    fn bad_request(description: impl Into<String>) -> Self {
        Reply::error(400, format!("Bad Request: {}", description.into()))
    }

    fn retry_after(secs: u64) -> Self {
        Reply::Error {
            code: 429,
            description: format!("Too Many Requests: retry after {secs}"),
            parameters: Some(json!({ "retry_after": secs })),
        }
    }

    fn status(&self) -> u16 {
        match self {
            Reply::Ok(_) => 200,
            Reply::Error { code, .. } | Reply::Html(code) => *code,
        }
    }

    fn into_response(self) -> Response {
        let status =
            StatusCode::from_u16(self.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        match self {
            Reply::Ok(result) => {
                (status, Json(json!({ "ok": true, "result": result }))).into_response()
            }
            Reply::Error { code, description, parameters } => {
                let mut body =
                    json!({ "ok": false, "error_code": code, "description": description });
                if let Some(parameters) = parameters {
                    body["parameters"] = parameters;
                }
                (status, Json(body)).into_response()
            }
            Reply::Html(code) => {
                let reason = status.canonical_reason().unwrap_or("Error");
                let body = format!(
                    "<html>\r\n<head><title>{code} {reason}</title></head>\r\n<body>\r\n<center><h1>{code} {reason}</h1></center>\r\n<hr><center>nginx</center>\r\n</body>\r\n</html>\r\n"
                );
                (status, [(header::CONTENT_TYPE, "text/html")], body).into_response()
            }
        }
    }
}

impl Fault {
    fn reply(self) -> Reply {
        match self {
            Fault::RetryAfter(secs) => Reply::retry_after(secs),
            Fault::Status(code, description) => Reply::error(code, description),
            Fault::NotModified => Reply::bad_request(state::NOT_MODIFIED),
            Fault::MigrateTo(chat_id) => Reply::Error {
                code: 400,
                description: "Bad Request: group chat was upgraded to a supergroup chat".to_owned(),
                parameters: Some(json!({ "migrate_to_chat_id": chat_id })),
            },
            Fault::NonJson(code) => Reply::Html(code),
            // Taken off the queue before the answer is made (`take_connection_fault`).
            Fault::Delay(_) | Fault::Drop | Fault::Hang => {
                Reply::error(500, "a connection fault reached the answer")
            }
        }
    }
}

/// `/{bot}/{method}`: every Bot API call.
async fn handle(
    AxumState(shared): AxumState<Arc<Shared>>,
    Path((bot_segment, method)): Path<(String, String)>,
    Query(query): Query<Vec<(String, String)>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let bot =
        bot_segment.strip_prefix("bot").and_then(|token| shared.read(|s| s.bot_by_token(token)));
    let params = parse_params(&headers, query, &body);
    let (params, upload) = match params {
        Ok((params, upload)) => (Ok(params), upload),
        Err(reply) => (Err(reply), None),
    };
    let Some(bot) = bot else {
        let params = params.unwrap_or_else(|_| Map::new());
        let reply = Reply::error(401, "Unauthorized");
        shared.update(|s| s.record_call(None, &method, params, Some(reply.status())));
        return reply.into_response();
    };
    let params = match params {
        Ok(params) => params,
        Err(reply) => {
            shared.update(|s| s.record_call(Some(bot), &method, Map::new(), Some(reply.status())));
            return reply.into_response();
        }
    };
    let call = shared.update(|s| s.record_call(Some(bot), &method, params.clone(), None));
    match shared.update(|s| s.take_connection_fault(bot, &method)) {
        Some(Fault::Delay(latency)) => tokio::time::sleep(latency).await,
        Some(Fault::Drop) => return dropped_connection(),
        Some(Fault::Hang) => {
            shared.stop.cancelled().await;
            return dropped_connection();
        }
        _ => {}
    }
    let reply = if method.eq_ignore_ascii_case("getUpdates") {
        get_updates(&shared, bot, call, &params).await
    } else {
        shared.update(|s| {
            let reply = s.answer(bot, &method, &params, upload);
            s.finish_call(call, reply.status());
            reply
        })
    };
    reply.into_response()
}

/// An answer whose body fails before its first byte: the server closes the
/// connection, and the client sees it end without a response.
fn dropped_connection() -> Response {
    let failing = futures::stream::once(async {
        Err::<Bytes, std::io::Error>(std::io::Error::other("connection dropped by the fake"))
    });
    Response::new(axum::body::Body::from_stream(failing))
}

/// `GET /file/bot<token>/<file_path>`: a file users sent, for the bot
/// whose token is in the path.
async fn download(
    AxumState(shared): AxumState<Arc<Shared>>,
    Path((bot_segment, path)): Path<(String, String)>,
) -> Response {
    let bot =
        bot_segment.strip_prefix("bot").and_then(|token| shared.read(|s| s.bot_by_token(token)));
    if bot.is_none() {
        return Reply::error(401, "Unauthorized").into_response();
    }
    match shared.update(|s| s.served.download(&path)) {
        Some(bytes) => {
            ([(header::CONTENT_TYPE, "application/octet-stream")], bytes).into_response()
        }
        None => Reply::error(404, "Not Found").into_response(),
    }
}

/// Any other path: what Telegram answers.
async fn not_found() -> Response {
    Reply::error(404, "Not Found").into_response()
}

/// `getUpdates`: confirms updates below `offset`, then answers the pending ones
/// at once, or waits up to `timeout` seconds for one to arrive. A later poll of
/// the same bot ends this one with 409.
async fn get_updates(
    shared: &Shared,
    bot: usize,
    call: usize,
    params: &Map<String, Value>,
) -> Reply {
    let timeout = state::param_i64(params, "timeout").unwrap_or(0).max(0);
    let poll = match shared.update(|s| s.begin_poll(bot, call, params)) {
        Ok(poll) => poll,
        Err(reply) => return reply,
    };
    // From here the poll counts as waiting; the guard ends it however this
    // future ends, including when the client goes away.
    let mut guard = PollGuard { shared, bot, call, finished: false };
    let deadline = Instant::now() + Duration::from_secs(u64::try_from(timeout).unwrap_or(0));
    let mut changes = shared.changes.subscribe();
    loop {
        changes.borrow_and_update();
        let ready = shared.read(|s| s.poll_answer(bot, &poll, timeout == 0));
        if let Some(reply) = ready {
            return guard.finish(reply);
        }
        tokio::select! {
            () = shared.stop.cancelled() => return guard.finish(Reply::Ok(json!([]))),
            () = tokio::time::sleep_until(deadline) => {
                let reply = shared.read(|s| s.poll_answer(bot, &poll, true)).unwrap_or(Reply::Ok(json!([])));
                return guard.finish(reply);
            }
            changed = changes.changed() => {
                if changed.is_err() {
                    return guard.finish(Reply::Ok(json!([])));
                }
            }
        }
    }
}

/// Ends a waiting `getUpdates` exactly once: with its answer, or with no status
/// when the call is dropped before answering.
struct PollGuard<'a> {
    shared: &'a Shared,
    bot: usize,
    call: usize,
    finished: bool,
}

impl PollGuard<'_> {
    fn finish(&mut self, reply: Reply) -> Reply {
        self.finished = true;
        let status = reply.status();
        self.shared.update(|s| {
            s.end_poll(self.bot);
            s.finish_call(self.call, status);
        });
        reply
    }
}

impl Drop for PollGuard<'_> {
    fn drop(&mut self) {
        if !self.finished {
            self.shared.update(|s| s.end_poll(self.bot));
        }
    }
}

/// The call's parameters from the query string and the JSON or form body.
/// Form and query values stay strings; the methods accept both forms, as
/// Telegram does.
fn parse_params(
    headers: &HeaderMap,
    query: Vec<(String, String)>,
    body: &[u8],
) -> Result<(Map<String, Value>, Option<Upload>), Reply> {
    let mut params: Map<String, Value> =
        query.into_iter().map(|(name, value)| (name, Value::String(value))).collect();
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok((params, None));
    }
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_ascii_lowercase();
    if content_type.starts_with("application/x-www-form-urlencoded") {
        let pairs: Vec<(String, String)> = serde_urlencoded::from_bytes(body)
            .map_err(|_| Reply::bad_request("can't parse the form body"))?;
        params.extend(pairs.into_iter().map(|(name, value)| (name, Value::String(value))));
    } else if content_type.starts_with("multipart/form-data") {
        let boundary = content_type
            .split(';')
            .find_map(|part| part.trim().strip_prefix("boundary="))
            .map(|b| b.trim_matches('"').to_owned())
            .ok_or_else(|| Reply::bad_request("multipart body without a boundary"))?;
        // The boundary as sent (the lower-cased header only finds it).
        let raw_type =
            headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or_default();
        let start = raw_type.to_ascii_lowercase().find(&boundary).unwrap_or(0);
        let boundary = raw_type.get(start..start + boundary.len()).unwrap_or(&boundary);
        let (fields, upload) = multipart::parse(body, boundary)
            .ok_or_else(|| Reply::bad_request("can't parse the multipart body"))?;
        params.extend(fields.into_iter().map(|(name, value)| (name, Value::String(value))));
        return Ok((params, upload));
    } else {
        match serde_json::from_slice::<Value>(body) {
            Ok(Value::Object(body)) => params.extend(body),
            _ => return Err(Reply::bad_request("can't parse JSON object")),
        }
    }
    Ok((params, None))
}
