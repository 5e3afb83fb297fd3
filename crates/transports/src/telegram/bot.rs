//! The running bot: long polling, one follower task per run, deliveries that
//! survive restarts.
//!
//! - Updates are handled in order, one at a time; the offset of the next one is
//!   saved in the store after each. A message's run id is derived from the
//!   message, so one handled again after a crash is recognised as a duplicate.
//! - Before a message is submitted its delivery (chat, reply target, progress
//!   message) is recorded in the store, and the follower subscribes to the run's
//!   topic, so no event and no completion can be missed. The record is removed
//!   once the answer is out; records left by a stop are picked up on the next
//!   start, and the answer is sent then.
//! - Every call to Telegram goes through the outbox, which keeps the bot inside
//!   Telegram's rate limits.
//! - A tool call of a chat's run that waits for the owner's answer is offered
//!   in the chat with Approve / Deny buttons; a press from an allowed chat
//!   answers it (the first answer from any surface counts), and the message
//!   then says how it was settled.
//! - With `debounce_ms`, a chat's quick messages wait in the poll loop and go
//!   as one prompt once the chat is quiet; while they wait they are on record
//!   in the store (the offset is saved past them), so a stop submits them at
//!   the next start.
//! - With `show_resume_line = false` the answer has no resume line; the
//!   session of each answer and progress message is on record instead, so a
//!   reply to it still continues that session.
//! - Photos, files and voice notes, albums and `/file` are the `media`
//!   module's: files are checked, fetched and staged before the run is
//!   submitted with them, and a refusal is replied instead of a run.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use lemon_core::approvals::ApprovalHub;
use lemon_core::artifacts::Artifact;
use lemon_core::bus::EventKind;
use lemon_core::config::QueueMode;
use lemon_core::engine::{Action, ActionKind, ActionPhase, Completion, ResumeToken, RunError};
use lemon_core::ids::RunId;
use lemon_core::log_text;
use lemon_core::router::resolve::parse_slash_command;
use lemon_core::router::{Origin, RouterHandle, RunFollower, RunRequest, SlashCommand, Submitted};
use lemon_core::secrets::SecretStore;
use lemon_core::store::StoreHandle;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

mod media;

use super::albums::Albums;
use super::api::BotApi;
use super::config::TelegramConfigError;
use super::config::{TelegramConfig, COMPACTION_NOTE};
use super::debounce::Debouncer;
use super::edits::EditPacer;
use super::inbound::{self, Inbound, TRANSPORT_ID};
use super::outbox::{BotSender, DeliveryError, OutboxConfig, OutboxHandle};
use super::render::{ProgressRenderer, RenderStyle, ResumeFormat};
use super::types::{
    BotCommand, CallbackQuery, FileKind, FormattedText, Message, ReplyParameters, SendFile,
    SendMessage, TelegramError, User,
};
use crate::access::Access;
use crate::ask;
use crate::delivery::{DeliveryRecord, DeliveryRecords};
use crate::refused::{Refusals, StoreNotice};
use lemon_core::transport::{
    StatusHandle, Transport, TransportContext, TransportError, TransportState,
};

/// Store namespace of the next `getUpdates` offset, keyed by bot id.
const OFFSET_NS: &str = "telegram.offset";
/// Store namespace of answers not yet delivered, keyed by run id.
const DELIVERY_NS: &str = "telegram.delivery";
/// Store namespace of messages waiting for their chat to go quiet
/// (`debounce_ms`), keyed by chat (and topic).
const DEBOUNCE_NS: &str = "telegram.debounce";
/// Store namespace of the sessions of the bot's messages whose resume line is
/// not shown (`show_resume_line = false`), keyed by `<chat>:<message>`.
const RESUME_NS: &str = "telegram.resume";
/// How long a reply to such a message still continues its session.
const RESUME_TTL: Duration = Duration::from_secs(90 * 24 * 60 * 60);

/// How long an answer Telegram refused stays on record.
const FAILED_DELIVERY_TTL: Duration = Duration::from_secs(7 * 24 * 60 * 60);

/// The longest pause between failed polls.
const MAX_POLL_BACKOFF: Duration = Duration::from_secs(30);

/// What messages the bot cannot take (a sticker, a location, nothing) get.
pub const UNSUPPORTED_REPLY: &str =
    "Send text, a photo, a file or a voice note; this kind of message is not supported.";

/// The Telegram transport.
pub struct TelegramTransport {
    config: TelegramConfig,
    /// The bot token is read from here at every start, so a secret added after a
    /// failed start is picked up by the next attempt.
    secrets: Arc<SecretStore>,
    /// Chat ids with a `[[gateway.bindings]]` entry for this transport.
    bound_chats: Vec<String>,
    /// Set once `startup_message` went out, so a restart of the bot after a
    /// failure does not send it again (a new config makes a new transport).
    announced: AtomicBool,
}

impl std::fmt::Debug for TelegramTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TelegramTransport")
            .field("config", &self.config)
            .field("bound_chats", &self.bound_chats)
            .finish_non_exhaustive()
    }
}

impl TelegramTransport {
    /// `bound_chats` are the chat ids bound to this transport (for
    /// `deny_unbound_chats`).
    pub fn new(
        config: TelegramConfig,
        secrets: Arc<SecretStore>,
        bound_chats: Vec<String>,
    ) -> Self {
        TelegramTransport { config, secrets, bound_chats, announced: AtomicBool::new(false) }
    }
}

/// Errors on the first calls: a wrong token needs a config change, anything
/// else may pass.
fn startup_error(error: TelegramError) -> TransportError {
    match error {
        TelegramError::Unauthorized { .. } => TransportError::fatal(
            "Telegram rejected the bot token: check bot_token / bot_token_secret",
        ),
        other => TransportError::retryable(format!("could not start the bot: {other}")),
    }
}

#[async_trait]
impl Transport for TelegramTransport {
    fn id(&self) -> &str {
        TRANSPORT_ID
    }

    async fn run(&self, ctx: TransportContext) -> Result<(), TransportError> {
        let token = self
            .config
            .resolve_token(&self.secrets)
            .map_err(|error: TelegramConfigError| TransportError::retryable(error.to_string()))?;
        let api = BotApi::new(&self.config.api_base_url, &token).map_err(|error| match error {
            TelegramError::InvalidBaseUrl(_) => TransportError::fatal(error.to_string()),
            other => startup_error(other),
        })?;
        drop(token);
        let transcriber = self.config.voice.transcriber(&self.secrets).map_err(|error| {
            TransportError::retryable(format!("invalid [gateway.telegram]: {error}"))
        })?;
        let me = tokio::select! {
            () = ctx.shutdown.cancelled() => return Ok(()),
            me = api.get_me() => me.map_err(startup_error)?,
        };
        if let Some(mismatch) = self.config.identity_mismatch(me.id, me.username.as_deref()) {
            return Err(TransportError::fatal(mismatch));
        }
        // A webhook set on the bot would make every getUpdates fail with 409.
        if self.config.drops_pending_updates() {
            api.delete_webhook_dropping_pending().await.map_err(startup_error)?;
            tracing::info!(
                "dropped the messages that came while the bot was offline (drop_pending_updates)"
            );
        } else {
            api.delete_webhook().await.map_err(startup_error)?;
        }
        let commands: Vec<BotCommand> = inbound::commands(self.config.allow_queue_override)
            .iter()
            .map(|(command, description)| BotCommand {
                command: (*command).to_owned(),
                description: (*description).to_owned(),
            })
            .collect();
        if let Err(error) = api.set_my_commands(&commands).await {
            tracing::warn!(%error, "could not register the bot's commands");
        }
        let stop = ctx.shutdown.child_token();
        let outbox = OutboxHandle::spawn(
            Arc::new(api.clone()) as Arc<dyn BotSender>,
            OutboxConfig {
                send_attempts: self.config.delivery_attempts,
                ..OutboxConfig::default()
            },
            stop.clone(),
            &ctx.tracker,
        );
        ctx.status.track_backlog(outbox.backlog());
        let access = Access::new(TRANSPORT_ID, self.config.allow_everyone);
        access.warn_at_start();
        if self.config.compaction.is_some() {
            tracing::info!(key = "gateway.telegram.compaction", "{COMPACTION_NOTE}");
        }
        let account = match &self.config.account_id {
            Some(account) => account.trim().to_owned(),
            None => me.id.to_string(),
        };
        let bot = Arc::new(Bot {
            config: self.config.clone(),
            account,
            access,
            bound_chats: self.bound_chats.clone(),
            me,
            api,
            outbox,
            router: ctx.router.clone(),
            store: ctx.store.clone(),
            tracker: ctx.tracker.clone(),
            shutdown: stop.clone(),
            progress: ProgressIndex::default(),
            status: ctx.status.clone(),
            deliveries: DeliveryRecords::new(ctx.store.clone(), DELIVERY_NS, FAILED_DELIVERY_TTL),
            approvals: ctx.approvals.clone(),
            offered: ask::Offered::default(),
            refusals: Refusals::new(StoreNotice::SendAgain),
            media: ctx.media.clone(),
            // Files come from the Bot API's own server: one on this machine
            // (a local Bot API server, a test's fake) is reached there.
            fetcher: crate::media::Fetcher::new(crate::media::is_local_url(
                &self.config.api_base_url,
            )),
            transcriber,
            albums: Mutex::new(Albums::new(Duration::from_millis(
                self.config.files.media_group_debounce_ms,
            ))),
        });
        bot.recover_deliveries().await;
        // Subscribed before polling starts, so no run of a chat is missed.
        let others = bot.router.subscribe_starts();
        let watcher = bot.clone();
        ctx.tracker.spawn(async move { watcher.deliver_others(others).await });
        bot.status.running(Some(bot.detail()));
        if !self.announced.swap(true, Ordering::Relaxed) {
            bot.announce_start();
        }
        tracing::info!(bot = %bot.username(), "telegram bot polling");
        let result = bot.poll().await;
        // Followers and the outbox stop with the transport (a restart makes new ones).
        stop.cancel();
        result
    }
}

/// An answer on its way to a chat, as stored until it is delivered.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Delivery {
    run_id: String,
    chat_id: i64,
    #[serde(default)]
    thread_id: Option<i64>,
    /// The user's message: the answer replies to it. `None` for a run the
    /// chat did not ask for (a cron job's).
    #[serde(default)]
    reply_to: Option<i64>,
    #[serde(default)]
    progress_message_id: Option<i64>,
    /// Answer messages (the text's parts, then its files) already sent; a stop
    /// in the middle resumes after them.
    #[serde(default)]
    sent: usize,
    /// Set once delivery was given up: what Telegram said last.
    #[serde(default)]
    failed: Option<String>,
}

impl DeliveryRecord for Delivery {
    fn given_up(&self) -> bool {
        self.failed.is_some()
    }
}

struct Bot {
    config: TelegramConfig,
    /// The account part of the chats' session keys: `account_id`, or the bot's id.
    account: String,
    /// `allowed_chat_ids` or `allow_everyone`; refusals logged once per chat.
    access: Access,
    bound_chats: Vec<String>,
    me: User,
    api: BotApi,
    outbox: OutboxHandle,
    router: RouterHandle,
    store: StoreHandle,
    tracker: TaskTracker,
    shutdown: CancellationToken,
    progress: ProgressIndex,
    /// Polling trouble shows as `failing` (with the retry) until a poll succeeds.
    status: StatusHandle,
    /// Answers on their way; those given up on are kept for a week and
    /// counted in status.
    deliveries: DeliveryRecords<Delivery>,
    /// Tool calls waiting for the owner's answer.
    approvals: ApprovalHub,
    /// The approval requests offered here: their chat and the message with
    /// the buttons, by request id.
    offered: ask::Offered<i64, i64>,
    /// Chats told that the store cannot save messages, told once each.
    refusals: Refusals,
    /// Where received files wait for their run.
    media: lemon_core::media::MediaStage,
    /// Fetches files from Telegram's file server (within the limits).
    fetcher: crate::media::Fetcher,
    /// Voice notes' words, with `voice_transcription` on.
    transcriber: Option<crate::media::Transcriber>,
    /// Albums waiting for their last photo (`media_group_debounce_ms`).
    albums: Mutex<Albums<(Message, String)>>,
}

fn now_ms() -> i64 {
    lemon_core::clock::now_ms()
}

/// A chat (and forum topic): where a batch of quick messages waits.
type Scope = (i64, Option<i64>);

/// A message waiting in its chat's batch (`debounce_ms`), as it is kept in
/// the store until it is submitted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Waiting {
    message: Message,
    /// What the message says for the run (its text without a mention of the bot).
    text: String,
}

/// The store key of a chat's waiting batch.
fn scope_key((chat_id, topic): Scope) -> String {
    match topic {
        Some(topic) => format!("{chat_id}:{topic}"),
        None => chat_id.to_string(),
    }
}

/// The pause before the next `getUpdates` after a failed one: Telegram's
/// `retry_after`, else a backoff doubling from 2 s up to [`MAX_POLL_BACKOFF`];
/// never shorter than `poll_interval`.
fn failed_poll_pause(error: &TelegramError, failures: u32, poll_interval: Duration) -> Duration {
    let backoff = match error {
        TelegramError::RetryAfter(wait) => *wait,
        _ => Duration::from_secs(1u64 << failures.min(5)).min(MAX_POLL_BACKOFF),
    };
    backoff.max(poll_interval)
}

impl Bot {
    async fn poll(self: &Arc<Self>) -> Result<(), TransportError> {
        let bot_key = self.me.id.to_string();
        let saved = match self.store.kv_get(OFFSET_NS, &bot_key, now_ms()).await {
            Ok(value) => value.and_then(|v| v.as_i64()),
            Err(error) => {
                return Err(TransportError::retryable(format!(
                    "could not read the offset: {error}"
                )))
            }
        };
        let mut offset = self.config.start_offset(saved);
        let mut batches = Debouncer::new(self.config.debounce());
        self.restore_batches(&mut batches).await;
        let mut failures = 0u32;
        loop {
            let poll = self.api.get_updates(offset, self.config.poll_timeout(), 100);
            let Some(polled) = self.flushing(&mut batches, poll).await else { return Ok(()) };
            let pause = match polled {
                Ok(updates) => {
                    if failures > 0 {
                        self.status.running(Some(self.detail()));
                        failures = 0;
                    }
                    let nothing = updates.is_empty();
                    for update in updates {
                        let id = update.update_id;
                        if offset.is_some_and(|next| id < next) {
                            continue;
                        }
                        match update.callback_query {
                            Some(query) => self.answer_button(query).await,
                            None => {
                                let message = update.message.or(update.channel_post);
                                self.handle(message, &mut batches).await;
                            }
                        }
                        offset = Some(id + 1);
                        self.store.kv_put(OFFSET_NS, &bot_key, json!(id + 1), None).await;
                    }
                    // A call with news is followed at once; an empty one
                    // already waited poll_timeout_s, then poll_interval_ms.
                    let interval = self.config.poll_interval();
                    (nothing && !interval.is_zero()).then_some(interval)
                }
                Err(TelegramError::Unauthorized { .. }) => {
                    return Err(startup_error(TelegramError::Unauthorized {
                        description: String::new(),
                    }))
                }
                Err(error) => {
                    failures += 1;
                    let pause = failed_poll_pause(&error, failures, self.config.poll_interval());
                    let retry_in_ms = u64::try_from(pause.as_millis()).unwrap_or(u64::MAX);
                    tracing::warn!(%error, retry_in_ms, "getUpdates failed");
                    self.status.set(TransportState::Failing {
                        reason: format!("getUpdates failed: {error}"),
                        attempts: failures,
                        retry_in_ms: Some(retry_in_ms),
                    });
                    Some(pause)
                }
            };
            if let Some(pause) = pause {
                let paused = tokio::time::sleep(pause);
                if self.flushing(&mut batches, paused).await.is_none() {
                    return Ok(());
                }
            }
        }
    }

    /// Waits for `work` (a poll, a pause), submitting the batches of quick
    /// messages that fall due meanwhile; `None` when the bot stops first.
    async fn flushing<F: Future>(
        self: &Arc<Self>,
        batches: &mut Debouncer<Scope, Waiting>,
        work: F,
    ) -> Option<F::Output> {
        tokio::pin!(work);
        loop {
            let due = batches.next_due();
            tokio::select! {
                () = self.shutdown.cancelled() => return None,
                done = &mut work => return Some(done),
                () = tokio::time::sleep_until(due.unwrap_or_else(tokio::time::Instant::now)), if due.is_some() => {
                    for (scope, batch) in batches.take_due(tokio::time::Instant::now()) {
                        self.submit_batch(scope, batch.items).await;
                    }
                }
            }
        }
    }

    /// Puts back the batches a stop left waiting; they are due at once.
    async fn restore_batches(&self, batches: &mut Debouncer<Scope, Waiting>) {
        let stored = match self.store.kv_list(DEBOUNCE_NS, now_ms()).await {
            Ok(stored) => stored,
            Err(error) => {
                tracing::warn!(%error, "waiting messages unreadable");
                return;
            }
        };
        for (key, value) in stored {
            match serde_json::from_value::<Vec<Waiting>>(value) {
                Ok(items) if !items.is_empty() => {
                    let scope = inbound::scope_of(&items[0].message);
                    batches.restore(scope, items, tokio::time::Instant::now());
                }
                Ok(_) => self.store.kv_delete(DEBOUNCE_NS, &key).await,
                Err(error) => {
                    tracing::warn!(%error, key, "a waiting message could not be read; dropped");
                    self.store.kv_delete(DEBOUNCE_NS, &key).await;
                }
            }
        }
    }

    /// Submits a batch of a chat's quick messages as one prompt, and takes it
    /// off the record.
    async fn submit_batch(self: &Arc<Self>, scope: Scope, items: Vec<Waiting>) {
        if !items.is_empty() {
            self.submit(items, None).await;
        }
        self.store.kv_delete(DEBOUNCE_NS, &scope_key(scope)).await;
    }

    /// Submits `scope`'s waiting messages now (a command came after them).
    async fn flush_scope(self: &Arc<Self>, batches: &mut Debouncer<Scope, Waiting>, scope: Scope) {
        if let Some(batch) = batches.take(&scope) {
            self.submit_batch(scope, batch.items).await;
        }
    }

    /// Sends `startup_message` to every chat that may talk to the bot: those
    /// in `allowed_chat_ids` and the bound ones (bound ones only, with
    /// `deny_unbound_chats`; any bound one, with `allow_everyone`). Paced by
    /// the outbox, without holding up polling.
    fn announce_start(self: &Arc<Self>) {
        let Some(text) = self.config.startup_message.text() else { return };
        let bound: Vec<i64> =
            self.bound_chats.iter().filter_map(|chat| chat.parse::<i64>().ok()).collect();
        let mut chats: Vec<i64> = self.config.allowed_chat_ids.clone();
        chats.extend(&bound);
        chats.sort_unstable();
        chats.dedup();
        chats.retain(|chat| {
            let admitted = self.config.allow_everyone || self.config.chat_listed(*chat);
            admitted && (!self.config.deny_unbound_chats || bound.contains(chat))
        });
        for chat_id in chats {
            let send = message_to(chat_id, None, None, FormattedText::plain(text));
            let outbox = self.outbox.clone();
            self.tracker.spawn(async move {
                match outbox.send(send).await {
                    Ok(_) | Err(DeliveryError::ShuttingDown) => {}
                    Err(error) => tracing::warn!(%error, chat_id, "startup message not delivered"),
                }
            });
        }
    }

    fn username(&self) -> &str {
        self.me.username.as_deref().unwrap_or_default()
    }

    /// What status shows while the bot is serving.
    fn detail(&self) -> String {
        let detail = match self.deliveries.given_up_count() {
            0 => format!("@{}", self.username()),
            1 => format!("@{}; 1 answer Telegram refused (see the log)", self.username()),
            n => format!("@{}; {n} answers Telegram refused (see the log)", self.username()),
        };
        self.access.detail(detail)
    }

    /// Whether `chat_id` may have runs: in `allowed_chat_ids` (or everyone is
    /// allowed), and bound when `deny_unbound_chats` is on. A refusal of a
    /// message (`log`) is logged once per chat.
    ///
    /// A run started elsewhere (`log` false: a cron job, the API) was asked
    /// for by the owner, not by the chat: it is delivered unless the list
    /// names other chats.
    fn chat_allowed(&self, chat_id: i64, log: bool) -> bool {
        let listed = self.config.chat_listed(chat_id);
        let admitted = if log {
            self.access.check(listed, "chat", &chat_id.to_string(), "allowed_chat_ids")
        } else {
            self.access.admits(listed || self.config.allowed_chat_ids.is_empty())
        };
        if !admitted {
            return false;
        }
        let bound = !self.config.deny_unbound_chats
            || self.bound_chats.iter().any(|c| *c == chat_id.to_string());
        if !bound && log {
            tracing::info!(chat_id, "message from a chat without a binding (deny_unbound_chats)");
        }
        bound
    }

    async fn handle(
        self: &Arc<Self>,
        message: Option<Message>,
        batches: &mut Debouncer<Scope, Waiting>,
    ) {
        let Some(message) = message else { return };
        if message.from.as_ref().is_some_and(|from| from.id == self.me.id) {
            return;
        }
        if !self.chat_allowed(message.chat.id, true) {
            return;
        }
        let text = match inbound::classify(&message, self.username()) {
            Inbound::OtherBot => return,
            Inbound::Unsupported => {
                self.reply_soon(&message, UNSUPPORTED_REPLY.to_owned());
                return;
            }
            Inbound::Media(caption) => {
                // What the chat wrote before the files goes first.
                self.flush_scope(batches, inbound::scope_of(&message)).await;
                self.on_media(message, caption).await;
                return;
            }
            Inbound::Text(text) => text,
        };
        let scope = inbound::scope_of(&message);
        let queue_override =
            inbound::queue_override(&text).filter(|_| self.config.allow_queue_override);
        if !text.starts_with('/') && queue_override.is_none() {
            if batches.merges() {
                let waiting = Waiting { message, text };
                let batch = batches.push(scope, waiting, tokio::time::Instant::now());
                // On record before the offset moves past the message.
                let items = serde_json::to_value(&batch.items).unwrap_or_default();
                self.store.kv_put(DEBOUNCE_NS, &scope_key(scope), items, None).await;
            } else {
                self.submit(vec![Waiting { message, text }], None).await;
            }
            return;
        }
        // A command is never merged: what the chat wrote before it goes first.
        self.flush_scope(batches, scope).await;
        if is_help(&text) {
            self.reply_soon(&message, help_text(self.config.allow_queue_override));
            return;
        }
        if lemon_core::media::parse_file_command(&text).is_some() {
            self.on_file_command(&message, &text).await;
            return;
        }
        if let Some(chosen) = queue_override {
            if chosen.prompt.is_empty() {
                let usage = format!(
                    "Write the message after {}, e.g. {} check the tests too",
                    chosen.command, chosen.command
                );
                self.reply_soon(&message, usage);
                return;
            }
            self.submit(vec![Waiting { message, text: chosen.prompt }], Some(chosen.mode)).await;
            return;
        }
        if parse_slash_command(&text) == Some(SlashCommand::Cancel) {
            if let Some(run_id) = self.replied_progress(&message).await {
                self.cancel_run(&message, &run_id).await;
                return;
            }
        }
        self.submit(vec![Waiting { message, text }], None).await;
    }

    /// The run whose progress message `message` replies to.
    async fn replied_progress(&self, message: &Message) -> Option<RunId> {
        let replied = message.reply_to_message.as_ref()?;
        if replied.from.as_ref().is_none_or(|from| from.id != self.me.id) {
            return None;
        }
        self.progress.lookup(message.chat.id, replied.message_id).await
    }

    async fn cancel_run(self: &Arc<Self>, message: &Message, run_id: &RunId) {
        let reply = match self.router.abort_run(run_id).await {
            Ok(true) => "Cancelling.",
            Ok(false) => "That job has already finished.",
            Err(_) => "The gateway is shutting down.",
        };
        self.reply_soon(message, reply.to_owned());
    }

    /// The session the bot message this one replies to belongs to: the
    /// resume line in its text, or (when resume lines are not shown) the one
    /// on record for it.
    async fn resume_from_reply(&self, message: &Message) -> Option<ResumeToken> {
        let replied = message.reply_to_message.as_ref()?;
        if replied.from.as_ref().is_none_or(|from| from.id != self.me.id) {
            return None;
        }
        if let Some(token) =
            replied.text.as_deref().and_then(|text| self.router.query().extract_resume(text))
        {
            return Some(token);
        }
        let key = format!("{}:{}", message.chat.id, replied.message_id);
        let stored = self.store.kv_get(RESUME_NS, &key, now_ms()).await.ok()??;
        let engine = stored["engine"].as_str()?;
        let value = stored["value"].as_str()?;
        Some(ResumeToken::new(engine, value))
    }

    /// Records the session of the bot's `message_id` in `chat_id`, whose
    /// resume line is not shown, so a reply to it continues that session.
    async fn remember_resume(&self, chat_id: i64, message_id: i64, token: &ResumeToken) {
        let expires = now_ms() + i64::try_from(RESUME_TTL.as_millis()).unwrap_or(i64::MAX);
        let value = json!({ "engine": token.engine, "value": token.value });
        self.store
            .kv_put(RESUME_NS, &format!("{chat_id}:{message_id}"), value, Some(expires))
            .await;
    }

    /// Submits the messages (one, or a chat's quick ones merged: their texts
    /// joined with line breaks) as one run, answered as a reply to the last.
    /// `mode` is the queue mode the message chose (`allow_queue_override`).
    async fn submit(self: &Arc<Self>, items: Vec<Waiting>, mode: Option<QueueMode>) {
        self.submit_with(items, mode, media::Received::default()).await;
    }

    /// [`Bot::submit`] with the files (and the voice note's mark) the run
    /// gets; the files are dropped from the stage when no run takes them.
    async fn submit_with(
        self: &Arc<Self>,
        items: Vec<Waiting>,
        mode: Option<QueueMode>,
        received: media::Received,
    ) {
        let Some(last) = items.last() else {
            self.media.discard(&received.attachments);
            return;
        };
        let message = last.message.clone();
        let text = items.iter().map(|item| item.text.as_str()).collect::<Vec<_>>().join("\n");
        let mut resume = None;
        for item in items.iter().rev() {
            resume = self.resume_from_reply(&item.message).await;
            if resume.is_some() {
                break;
            }
        }
        let run_id = inbound::run_id(self.me.id, &message);
        let mut req = RunRequest::new(
            inbound::session_key(&self.config.agent_id, &self.account, &message),
            text.clone(),
        );
        req.origin = Origin::Channel;
        req.agent_id = Some(self.config.agent_id.clone());
        req.queue_mode = mode.or(self.config.queue_mode);
        req.engine = self.config.engine.clone();
        req.resume = resume;
        req.run_id = Some(run_id.clone());
        req.channel = Some(inbound::channel_ref(&message));
        let mut telegram = json!({
            "chat_id": message.chat.id,
            "message_id": message.message_id,
            "thread_id": inbound::topic_of(&message),
            "from": message.from.as_ref().map(|u| u.id),
        });
        if items.len() > 1 {
            let merged: Vec<i64> = items.iter().map(|item| item.message.message_id).collect();
            telegram["merged_message_ids"] = json!(merged);
        }
        if received.voice_transcribed {
            telegram["voice_transcribed"] = json!(true);
        }
        req.meta.insert("telegram".to_owned(), telegram);
        let attachments = received.attachments;
        lemon_core::media::add_attachments(&mut req.meta, &attachments);
        let session = req.session_key.clone();
        let is_command = parse_slash_command(&text).is_some();
        let delivery = Delivery {
            run_id: run_id.to_string(),
            chat_id: message.chat.id,
            thread_id: inbound::topic_of(&message),
            reply_to: Some(message.message_id),
            progress_message_id: None,
            sent: 0,
            failed: None,
        };
        // Recorded before the run exists, so a restart finds it; the follower
        // the router hands back sees everything the run does.
        if !is_command {
            self.deliveries.record(&delivery.run_id, &delivery).await;
        }
        match self.router.submit(req).await {
            Ok(Submitted::Command { reply, .. }) => {
                self.media.discard(&attachments);
                if !is_command {
                    self.deliveries.finish(&delivery.run_id).await;
                }
                self.reply_soon(&message, reply);
            }
            // Seen before: the first handling (or the recovery of its delivery) follows it.
            Ok(Submitted::Run(accepted, _)) if accepted.duplicate => {
                self.media.discard(&attachments);
                self.refusals.accepted(&session);
            }
            Ok(Submitted::Run(_, events)) => {
                self.refusals.accepted(&session);
                let bot = self.clone();
                self.tracker.spawn(async move { bot.follow(delivery, events).await });
            }
            Err(error) => {
                self.media.discard(&attachments);
                self.deliveries.finish(&delivery.run_id).await;
                tracing::warn!(%error, "message not accepted");
                if let Some(reply) = self.refusals.reply(&session, &error) {
                    self.reply_soon(&message, reply);
                }
            }
        }
    }

    /// Delivers the runs of this bot's chats that the bot did not submit (a
    /// cron job's, say) like its own: progress, then the answer, on record
    /// until it is in the chat.
    async fn deliver_others(self: Arc<Self>, mut events: lemon_core::bus::Subscription) {
        loop {
            let event = tokio::select! {
                () = self.shutdown.cancelled() => return,
                event = events.recv() => event,
            };
            let event = match event {
                Ok(event) => event,
                Err(lemon_core::bus::RecvError::Lagged(missed)) => {
                    tracing::warn!(missed, "telegram fell behind the gateway's events");
                    continue;
                }
                Err(lemon_core::bus::RecvError::Closed) => return,
            };
            if !matches!(event.kind, EventKind::RunStarted { .. }) {
                continue;
            }
            let Some((chat_id, thread_id)) = inbound::chat_of(&event.session_key, &self.account)
            else {
                continue;
            };
            if !self.chat_allowed(chat_id, false) {
                continue;
            }
            let run_id = event.run_id.to_string();
            // The bot's own runs are on record before they are submitted.
            match self.store.kv_get(DELIVERY_NS, &run_id, now_ms()).await {
                Ok(None) => {}
                Ok(Some(_)) => continue,
                Err(error) => {
                    tracing::warn!(run = %run_id, %error, "delivery records unreadable");
                    continue;
                }
            }
            let delivery = Delivery {
                run_id,
                chat_id,
                thread_id,
                reply_to: None,
                progress_message_id: None,
                sent: 0,
                failed: None,
            };
            self.deliveries.record(&delivery.run_id, &delivery).await;
            let follower = self.router.follow(&event.run_id);
            let bot = self.clone();
            self.tracker.spawn(async move { bot.follow(delivery, follower).await });
        }
    }

    fn resume_format(&self) -> ResumeFormat {
        let runs = self.router.query();
        Arc::new(move |token: &ResumeToken| runs.format_resume(token))
    }

    /// Sends a short reply on its own task (the poll loop never waits for Telegram's limits).
    fn reply_soon(&self, message: &Message, text: String) {
        let send = message_to(
            message.chat.id,
            inbound::topic_of(message),
            Some(message.message_id),
            FormattedText::plain(text),
        );
        let outbox = self.outbox.clone();
        self.tracker.spawn(async move {
            if let Err(error) = outbox.send(send).await {
                tracing::warn!(%error, "reply not delivered");
            }
        });
    }

    /// Follows a run from its events to its answer in the chat. A run that
    /// finished before (a delivery recovered after a restart) ends at once.
    async fn follow(self: Arc<Self>, mut delivery: Delivery, mut events: RunFollower) {
        let run_id = events.run_id().clone();
        let style = RenderStyle {
            resume_line: self.config.show_resume_line,
            markdown: self.config.use_markdown,
        };
        let mut renderer = ProgressRenderer::with_style(self.resume_format(), style);
        let mut started = false;
        // Edits of the progress message are paced by `edit_throttle_ms`.
        let mut edits = EditPacer::new(self.config.edit_throttle());
        if let Some(progress) = delivery.progress_message_id {
            self.progress.insert(delivery.chat_id, progress, &run_id);
            edits.shown(tokio::time::Instant::now());
        }
        // A run that ends within `progress_delay_ms` gets no progress message: its
        // answer is the only message, and it is not held back by the chat's pace.
        let mut progress_due = delivery
            .progress_message_id
            .is_none()
            .then(|| tokio::time::Instant::now() + self.config.progress_delay());
        let completion = loop {
            let due = progress_due.unwrap_or_else(tokio::time::Instant::now);
            let edit_due = edits.due();
            let event = tokio::select! {
                () = self.shutdown.cancelled() => return,
                () = tokio::time::sleep_until(due), if progress_due.is_some() => {
                    progress_due = None;
                    if self.send_progress(&mut delivery, &renderer, &run_id).await.is_err() {
                        return;
                    }
                    edits.shown(tokio::time::Instant::now());
                    continue;
                }
                () = tokio::time::sleep_until(edit_due.unwrap_or_else(tokio::time::Instant::now)), if edit_due.is_some() => {
                    if edits.fire(tokio::time::Instant::now()) {
                        self.show_progress(&delivery, renderer.progress()).await;
                    }
                    continue;
                }
                event = events.next() => event,
            };
            // No completion will come: the gateway is stopping; the next start delivers.
            let Some(event) = event else { return };
            started |= event.type_name() == "run_started";
            // Events read back from the store are not drawn: progress shows
            // what happens from now on, and the answer is complete either way.
            let Some(typed) = event.event() else { continue };
            if let EventKind::EngineAction(action) = &typed.kind {
                if action.kind == ActionKind::Approval {
                    self.approval_step(&delivery, action).await;
                }
            }
            let changed = renderer.apply(typed);
            if let EventKind::RunCompleted { completion, .. } = &typed.kind {
                break completion.clone();
            }
            if changed
                && delivery.progress_message_id.is_some()
                && edits.changed(tokio::time::Instant::now())
            {
                self.show_progress(&delivery, renderer.progress()).await;
            }
        };
        self.finish(delivery, renderer, completion, started).await;
    }

    /// An approval action of the chat's run: when it starts, the request is
    /// offered with Approve / Deny / Always buttons; when it completes, the message
    /// says how it was settled and loses its buttons.
    async fn approval_step(&self, delivery: &Delivery, action: &Action) {
        let Some(request) = ask::request_of(action) else { return };
        if action.phase != ActionPhase::Completed {
            let text = FormattedText::plain(ask::ask_text(&request));
            let mut send =
                message_to(delivery.chat_id, delivery.thread_id, delivery.reply_to, text);
            let [approve, deny, always] = ask::button_data(&request.id);
            send.reply_markup = Some(json!({ "inline_keyboard": [
                [
                    { "text": "Approve", "callback_data": approve },
                    { "text": "Deny", "callback_data": deny },
                ],
                [{ "text": ask::ALWAYS_LABEL, "callback_data": always }],
            ] }));
            match self.outbox.send(send).await {
                Ok(sent) => self.offered.insert(&request.id, delivery.chat_id, sent.message_id),
                Err(error) => {
                    tracing::warn!(%error, approval = %request.id, "approval request not sent");
                }
            }
            return;
        }
        if let Some((chat_id, message_id)) = self.offered.take(&request.id) {
            let text = FormattedText::plain(ask::settled_text(&request, action));
            // An edit without buttons removes them.
            let _ = self.outbox.edit(chat_id, message_id, text).await;
        }
    }

    /// A pressed Approve / Deny button: answers the request when the press
    /// comes from the chat it was offered in (an allowed chat), and tells the
    /// user how it went.
    async fn answer_button(&self, query: CallbackQuery) {
        let Some((reply, id)) = ask::parse_press(query.data.as_deref().unwrap_or_default()) else {
            tracing::info!("a button press that is no approval request; ignored");
            return;
        };
        let chat_id = query.message.as_ref().map(|message| message.chat.id);
        let notice = match chat_id {
            Some(chat) if !self.chat_allowed(chat, true) => "This chat may not answer.".to_owned(),
            Some(chat) if !self.offered.pressed_in_place(id, &chat) => {
                "This request was not asked here.".to_owned()
            }
            None => "This request is too old to answer here.".to_owned(),
            Some(_) => {
                let by = match &query.from.username {
                    Some(username) => format!("@{username}"),
                    None => query.from.id.to_string(),
                };
                ask::notice(&self.approvals.reply(id, reply, &by, TRANSPORT_ID), reply)
            }
        };
        tracing::info!(approval = id, ?reply, notice = %notice, "approval button pressed");
        if let Err(error) = self.api.answer_callback_query(&query.id, &notice).await {
            tracing::warn!(%error, "could not answer a button press");
        }
    }

    /// Sends the progress message and records its id.
    ///
    /// # Errors
    /// [`DeliveryError::ShuttingDown`]: the outbox stopped; the next start goes on.
    async fn send_progress(
        &self,
        delivery: &mut Delivery,
        renderer: &ProgressRenderer,
        run_id: &RunId,
    ) -> Result<(), DeliveryError> {
        let _sending = self.progress.sending(delivery.chat_id);
        let send = message_to(
            delivery.chat_id,
            delivery.thread_id,
            delivery.reply_to,
            renderer.progress(),
        );
        match self.outbox.send(send).await {
            Ok(sent) => {
                delivery.progress_message_id = Some(sent.message_id);
                self.progress.insert(delivery.chat_id, sent.message_id, run_id);
                // Durable now, so a crash leaves no progress message saying
                // "Running…" forever: the next start finishes it.
                self.deliveries.record_durably(&delivery.run_id, delivery).await;
                Ok(())
            }
            Err(DeliveryError::ShuttingDown) => Err(DeliveryError::ShuttingDown),
            Err(error) => {
                tracing::warn!(%error, run_id = %run_id, "progress message not sent");
                Ok(())
            }
        }
    }

    async fn show_progress(&self, delivery: &Delivery, text: FormattedText) {
        if let Some(message_id) = delivery.progress_message_id {
            // Only queued: the outbox merges it with newer edits of the message.
            let _ = self.outbox.edit(delivery.chat_id, message_id, text).await;
        }
    }

    /// The final progress edit and the answer.
    async fn finish(
        &self,
        mut delivery: Delivery,
        mut renderer: ProgressRenderer,
        completion: Completion,
        started: bool,
    ) {
        // The ending may not have come as an event (a restart, a follower that
        // fell behind): the last progress edit must show it all the same.
        renderer.complete(&completion);
        let (progress, answer) = final_output(&renderer, &completion, started);
        let (chat_id, progress_id) = (delivery.chat_id, delivery.progress_message_id);
        // Without resume lines, the session of each message is kept on record.
        let hidden_resume =
            renderer.resume_token(&completion).filter(|_| !self.config.show_resume_line).cloned();
        if let (Some(token), Some(message_id)) = (&hidden_resume, progress_id) {
            self.remember_resume(chat_id, message_id, token).await;
        }
        // The last edit has a send's attempts; it runs beside the answer, which
        // the outbox puts first in the chat.
        let final_edit = async {
            let Some(message_id) = progress_id else { return };
            self.progress.remove(chat_id, message_id);
            match self.outbox.edit_and_wait(chat_id, message_id, progress).await {
                Ok(()) | Err(DeliveryError::ShuttingDown) => {}
                Err(error) => tracing::warn!(%error, chat_id, "last progress edit not made"),
            }
        };
        let files = uploads(&delivery, &completion.artifacts);
        let send = self.send_answer(&mut delivery, answer, files, hidden_resume.as_ref());
        let ((), delivered) = tokio::join!(final_edit, send);
        if delivered {
            self.deliveries.finish(&delivery.run_id).await;
        }
    }

    /// Sends the answer's parts and then its files not sent yet, recording
    /// each; false when it stopped short (kept for the next start, or given up
    /// on and recorded). `hidden_resume` is the session to record for each
    /// part sent when resume lines are not shown.
    async fn send_answer(
        &self,
        delivery: &mut Delivery,
        answer: Vec<FormattedText>,
        files: Vec<SendFile>,
        hidden_resume: Option<&ResumeToken>,
    ) -> bool {
        let parts = answer.into_iter().map(Part::Text).chain(files.into_iter().map(Part::File));
        for (index, part) in parts.enumerate().skip(delivery.sent) {
            let sent = match part {
                Part::Text(text) => {
                    // The first part answers the user's message; the rest follow it.
                    let reply_to = delivery.reply_to.filter(|_| index == 0);
                    let send = message_to(delivery.chat_id, delivery.thread_id, reply_to, text);
                    self.outbox.send(send).await
                }
                Part::File(file) => {
                    let filename = file.filename.clone();
                    match self.outbox.send_file(file).await {
                        // A file Telegram refuses (too large, unreadable) is
                        // skipped; the answer itself is out.
                        Err(DeliveryError::Failed { error, .. }) => {
                            tracing::warn!(
                                %error,
                                run_id = %delivery.run_id,
                                filename = %log_text::escape(&filename),
                                "file of the answer not delivered"
                            );
                            delivery.sent = index + 1;
                            self.deliveries.record(&delivery.run_id, delivery).await;
                            continue;
                        }
                        other => other,
                    }
                }
            };
            match sent {
                Ok(sent) => {
                    if let Some(token) = hidden_resume {
                        self.remember_resume(delivery.chat_id, sent.message_id, token).await;
                    }
                    delivery.sent = index + 1;
                    self.deliveries.record(&delivery.run_id, delivery).await;
                }
                // Kept in the store: the next start sends the rest.
                Err(DeliveryError::ShuttingDown) => return false,
                Err(error) => {
                    tracing::error!(%error, run_id = %delivery.run_id, chat_id = delivery.chat_id, "answer not delivered");
                    delivery.failed = Some(error.to_string());
                    self.deliveries.give_up(&delivery.run_id, delivery).await;
                    self.status.running(Some(self.detail()));
                    return false;
                }
            }
        }
        true
    }

    /// Picks up the answers a stop left undelivered.
    async fn recover_deliveries(self: &Arc<Self>) {
        for (_, delivery) in self.deliveries.recover().await.pending {
            let Some(run_id) = RunId::parse(&delivery.run_id) else { continue };
            let events = self.router.follow(&run_id);
            let bot = self.clone();
            self.tracker.spawn(async move { bot.follow(delivery, events).await });
        }
    }
}

/// One message of an answer: a part of its text or one of its files.
enum Part {
    Text(FormattedText),
    File(SendFile),
}

/// Largest photo Telegram takes through `sendPhoto`; larger images go as documents.
const MAX_PHOTO_BYTES: u64 = 10 * 1024 * 1024;
/// Largest file a bot can upload.
const MAX_UPLOAD_BYTES: u64 = 50 * 1024 * 1024;
/// Extensions Telegram shows as photos.
const PHOTO_EXTENSIONS: [&str; 4] = ["png", "jpg", "jpeg", "webp"];
/// Longest caption Telegram takes, in characters.
const MAX_CAPTION_CHARS: usize = 1024;

/// The uploads of an answer's files: a photo for an image Telegram shows (within
/// its photo size), a document otherwise; a file over the bot upload limit is
/// logged and left out.
fn uploads(delivery: &Delivery, artifacts: &[Artifact]) -> Vec<SendFile> {
    let mut files = Vec::new();
    for artifact in artifacts {
        if artifact.size > MAX_UPLOAD_BYTES {
            tracing::warn!(
                run_id = %delivery.run_id,
                filename = %log_text::escape(&artifact.filename),
                size = artifact.size,
                "file of the answer is larger than Telegram's upload limit; not sent"
            );
            continue;
        }
        let extension = std::path::Path::new(&artifact.filename)
            .extension()
            .and_then(|ext| ext.to_str())
            .map(str::to_ascii_lowercase);
        let photo = extension.is_some_and(|ext| PHOTO_EXTENSIONS.contains(&ext.as_str()))
            && artifact.size <= MAX_PHOTO_BYTES;
        files.push(SendFile {
            chat_id: delivery.chat_id,
            kind: if photo { FileKind::Photo } else { FileKind::Document },
            path: artifact.path.clone(),
            filename: artifact.filename.clone(),
            mime: artifact.mime().to_owned(),
            caption: artifact
                .caption
                .as_ref()
                .map(|caption| caption.chars().take(MAX_CAPTION_CHARS).collect()),
            message_thread_id: delivery.thread_id,
        });
    }
    files
}

/// A message to a chat (and topic), replying to `reply_to` when given, even if
/// that message is gone by now.
fn message_to(
    chat_id: i64,
    thread_id: Option<i64>,
    reply_to: Option<i64>,
    text: FormattedText,
) -> SendMessage {
    let mut send = SendMessage::new(chat_id, text);
    send.message_thread_id = thread_id;
    send.reply_parameters = reply_to
        .map(|message_id| ReplyParameters { message_id, allow_sending_without_reply: true });
    send
}

/// `/start` (what Telegram sends when someone opens the bot) and `/help`.
fn is_help(text: &str) -> bool {
    let first = text.split_whitespace().next().unwrap_or_default();
    first.eq_ignore_ascii_case("/start") || first.eq_ignore_ascii_case("/help")
}

/// What `/start` and `/help` answer; the queue-mode commands when a message
/// may pick its mode.
fn help_text(allow_queue_override: bool) -> String {
    let mut text = String::from(
        "Send a message and an agent works on it: a progress message shows what it does, \
         then the answer comes as a reply. Reply to an answer to continue its session.\n",
    );
    for (command, description) in inbound::commands(allow_queue_override) {
        text.push_str(&format!("\n/{command} — {description}"));
    }
    text
}

/// Which run each progress message shows, for `/cancel` replies.
///
/// A progress message being sent is counted per chat until its id is known, so
/// a reply that arrives while the send's answer is still on its way waits for it
/// instead of missing it.
#[derive(Debug, Default)]
struct ProgressIndex {
    state: Mutex<ProgressState>,
    changed: Notify,
}

#[derive(Debug, Default)]
struct ProgressState {
    /// (chat, progress message) → run.
    shown: HashMap<(i64, i64), RunId>,
    /// Chat → progress messages being sent.
    sending: HashMap<i64, usize>,
}

/// Counts one progress message being sent; dropped once its id is indexed (or it failed).
struct Sending<'a> {
    index: &'a ProgressIndex,
    chat_id: i64,
}

impl Drop for Sending<'_> {
    fn drop(&mut self) {
        let mut state = self.index.lock();
        if let Some(n) = state.sending.get_mut(&self.chat_id) {
            *n -= 1;
            if *n == 0 {
                state.sending.remove(&self.chat_id);
            }
        }
        drop(state);
        self.index.changed.notify_waiters();
    }
}

impl ProgressIndex {
    /// How long a `/cancel` reply waits for a progress message still being sent.
    const PATIENCE: Duration = Duration::from_secs(30);

    fn lock(&self) -> std::sync::MutexGuard<'_, ProgressState> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn sending(&self, chat_id: i64) -> Sending<'_> {
        *self.lock().sending.entry(chat_id).or_default() += 1;
        Sending { index: self, chat_id }
    }

    fn insert(&self, chat_id: i64, message_id: i64, run_id: &RunId) {
        self.lock().shown.insert((chat_id, message_id), run_id.clone());
        self.changed.notify_waiters();
    }

    fn remove(&self, chat_id: i64, message_id: i64) {
        self.lock().shown.remove(&(chat_id, message_id));
    }

    async fn lookup(&self, chat_id: i64, message_id: i64) -> Option<RunId> {
        let deadline = tokio::time::Instant::now() + Self::PATIENCE;
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            {
                let state = self.lock();
                if let Some(run_id) = state.shown.get(&(chat_id, message_id)) {
                    return Some(run_id.clone());
                }
                if !state.sending.contains_key(&chat_id) {
                    return None;
                }
            }
            tokio::time::timeout_at(deadline, changed).await.ok()?;
        }
    }
}

/// The progress message's last text and the answer messages.
///
/// A message steered into a running job completes with that job's answer, and
/// one merged into the next job completes as cancelled: neither started a run
/// of its own, and the job that took it in delivers the answer once.
fn final_output(
    renderer: &ProgressRenderer,
    completion: &Completion,
    started: bool,
) -> (FormattedText, Vec<FormattedText>) {
    if !started {
        if let Some(RunError::Merged { .. }) = &completion.error {
            return (FormattedText::plain("Added to the next job."), Vec::new());
        }
        if completion.ok {
            return (FormattedText::plain("Added to the running job."), Vec::new());
        }
    }
    (renderer.progress(), renderer.final_messages(completion))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use lemon_core::engine::{Completion, ResumeToken, RunError};
    use lemon_core::ids::RunId;

    use lemon_core::store::StoreHandle;
    use serde_json::json;

    use super::{
        final_output, Delivery, DeliveryRecords, ProgressIndex, ProgressRenderer, DELIVERY_NS,
        FAILED_DELIVERY_TTL,
    };

    #[tokio::test]
    async fn deliveries_recorded_in_the_stored_shape_recover() {
        let store = StoreHandle::memory();
        let in_progress = json!({
            "run_id": "run-7", "chat_id": -100, "thread_id": 3, "reply_to": 5,
            "progress_message_id": 9, "sent": 1, "failed": null,
        });
        store.kv_put("telegram.delivery", "run-7", in_progress.clone(), None).await;
        // Recorded before the progress message was sent: optional fields absent.
        let fresh = json!({ "run_id": "run-8", "chat_id": 42, "reply_to": 6 });
        store.kv_put("telegram.delivery", "run-8", fresh, None).await;
        let refused = json!({
            "run_id": "run-9", "chat_id": 42, "reply_to": 7, "failed": "Forbidden: bot was blocked",
        });
        let expires = lemon_core::clock::now_ms() + 60_000;
        store.kv_put("telegram.delivery", "run-9", refused, Some(expires)).await;

        let records = DeliveryRecords::<Delivery>::new(store, DELIVERY_NS, FAILED_DELIVERY_TTL);
        let found = records.recover().await;
        assert_eq!(found.given_up, 1);
        assert_eq!(records.given_up_count(), 1);
        let pending: Vec<&Delivery> = found.pending.iter().map(|(_, d)| d).collect();
        assert_eq!(
            pending,
            [
                &Delivery {
                    run_id: "run-7".into(),
                    chat_id: -100,
                    thread_id: Some(3),
                    reply_to: Some(5),
                    progress_message_id: Some(9),
                    sent: 1,
                    failed: None,
                },
                &Delivery {
                    run_id: "run-8".into(),
                    chat_id: 42,
                    thread_id: None,
                    reply_to: Some(6),
                    progress_message_id: None,
                    sent: 0,
                    failed: None,
                },
            ]
        );
        // Written back in the same shape.
        assert_eq!(serde_json::to_value(pending[0]).unwrap(), in_progress);
    }

    fn renderer() -> ProgressRenderer {
        ProgressRenderer::new(std::sync::Arc::new(|t: &ResumeToken| {
            format!("`{} resume {}`", t.engine, t.value)
        }))
    }

    #[test]
    fn a_steered_message_gets_a_note_instead_of_a_second_answer() {
        let done = Completion::success("the answer", None);
        let (progress, answer) = final_output(&renderer(), &done, false);
        assert_eq!(progress.text, "Added to the running job.");
        assert!(answer.is_empty());
        let merged =
            Completion::failure(RunError::Merged { into: RunId::parse("r2").unwrap() }, None);
        let (progress, answer) = final_output(&renderer(), &merged, false);
        assert_eq!(progress.text, "Added to the next job.");
        assert!(answer.is_empty());
    }

    #[test]
    fn a_run_that_ran_gets_its_answer_and_a_refused_one_its_error() {
        let done = Completion::success("the answer", None);
        let (_, answer) = final_output(&renderer(), &done, true);
        assert_eq!(answer.len(), 1);
        assert!(answer[0].text.contains("the answer"));
        let overflow = Completion::failure(RunError::QueueOverflow, None);
        let (_, answer) = final_output(&renderer(), &overflow, false);
        assert!(answer[0].text.starts_with("Dropped: too many messages"), "{:?}", answer[0].text);
        let failed = Completion::failure(RunError::Engine { message: "no disk".into() }, None);
        let (_, answer) = final_output(&renderer(), &failed, true);
        assert_eq!(answer[0].text, "Error: no disk");
    }

    #[tokio::test(start_paused = true)]
    async fn a_cancel_reply_waits_for_a_progress_message_being_sent() {
        let index = std::sync::Arc::new(ProgressIndex::default());
        assert_eq!(index.lookup(1, 10).await, None, "nothing sent, nothing to wait for");
        let sending = index.sending(1);
        let waiter = {
            let index = index.clone();
            tokio::spawn(async move { index.lookup(1, 10).await })
        };
        tokio::task::yield_now().await;
        let run_id = RunId::parse("run-a").unwrap();
        index.insert(1, 10, &run_id);
        drop(sending);
        assert_eq!(waiter.await.unwrap(), Some(run_id));
        // Another chat never waits on this one.
        let _sending = index.sending(1);
        assert_eq!(index.lookup(2, 10).await, None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_cancel_reply_gives_up_when_the_send_takes_too_long() {
        let index = ProgressIndex::default();
        let _sending = index.sending(1);
        let started = tokio::time::Instant::now();
        assert_eq!(index.lookup(1, 10).await, None);
        assert!(started.elapsed() >= Duration::from_secs(30));
    }
}
