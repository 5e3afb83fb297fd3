//! The running bot: the gateway session, one follower task per run, answers
//! streamed by editing one message, deliveries that survive restarts.
//!
//! - Dispatches are handled in order, one at a time. After each, the session
//!   (id, the sequence number handled, the resume URL) is saved in the store, so
//!   a restart resumes the session and Discord replays what came meanwhile. A
//!   message's run id is derived from its id, so a message seen twice is one run.
//! - Before a message is submitted its delivery (channel, reply target, working
//!   message) is recorded; the record goes once the answer is in the channel, and
//!   records left by a stop are delivered at the next start.
//! - Every message and edit goes through the shared outbox; slash commands are
//!   answered directly on their interaction (Discord wants that within 3 s).
//! - A message's files are fetched from Discord's CDN (and a voice message
//!   transcribed, when `voice_transcription` is on) before the next dispatch
//!   is handled, so messages keep their order; each download and each
//!   transcription is bounded by its time limit. A file refused is answered
//!   with the reason and nothing of that message runs.
//! - A tool call of a channel's run that waits for the owner's answer is
//!   offered in the channel with Approve / Deny buttons ([`crate::ask`]); a
//!   press counts from a user allowed in that channel, and the message then
//!   says how it was settled and loses its buttons.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use lemon_core::approvals::ApprovalHub;
use lemon_core::artifacts::Artifact;
use lemon_core::bus::EventKind;
use lemon_core::engine::{Action, ActionKind, ActionPhase, Completion, ResumeToken};
use lemon_core::log_text;
use lemon_core::media::{MediaRefusal, MediaStage};
use lemon_core::router::{Origin, RouterHandle, RunFollower, RunRequest, Submitted};
use lemon_core::secrets::SecretStore;
use lemon_core::store::StoreHandle;
use lemon_core::transport::{
    StatusHandle, Transport, TransportContext, TransportError, TransportState,
};
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::config::DiscordConfig;
use super::gateway::{self, GatewayEvent, GatewaySettings, Resumable};
use super::inbound::{self, Place, COMMANDS, TRANSPORT_ID};
use super::render::StreamRenderer;
use super::rest::Rest;
use super::sink::{self, DiscordSink};
use super::types::{
    nonce, Button, CreateFile, CreateMessage, DiscordError, Interaction, Message, Outgoing,
    Snowflake, User,
};
use crate::access::Access;
use crate::ask;
use crate::delivery::{self, DeliveryRecord, DeliveryRecords, Outbox};
use crate::media::{self, transcribe::RemoteVoice, Fetcher, RemoteFile, Transcriber};
use crate::refused::{self, Refusals, StoreNotice};

/// Store namespace of the gateway session to resume, under [`SESSION_KEY`].
const SESSION_NS: &str = "discord.gateway";
const SESSION_KEY: &str = "session";
/// Store namespace of answers not yet delivered, keyed by run id.
const DELIVERY_NS: &str = "discord.delivery";
/// How long an answer Discord refused stays on record.
const FAILED_DELIVERY_TTL: Duration = Duration::from_secs(7 * 24 * 60 * 60);

type DeliveryError = delivery::DeliveryError<DiscordError>;

/// The Discord transport.
pub struct DiscordTransport {
    config: DiscordConfig,
    /// The bot token is read from here at every start.
    secrets: Arc<SecretStore>,
    /// Channel ids with a `[[gateway.bindings]]` entry for this transport.
    bound_channels: Vec<String>,
}

impl std::fmt::Debug for DiscordTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiscordTransport")
            .field("config", &self.config)
            .field("bound_channels", &self.bound_channels)
            .finish_non_exhaustive()
    }
}

impl DiscordTransport {
    /// `bound_channels` are the channel ids bound to this transport (for `deny_unbound`).
    pub fn new(
        config: DiscordConfig,
        secrets: Arc<SecretStore>,
        bound_channels: Vec<String>,
    ) -> Self {
        DiscordTransport { config, secrets, bound_channels }
    }
}

fn startup_error(error: DiscordError) -> TransportError {
    match error {
        DiscordError::Unauthorized => TransportError::fatal(
            "Discord rejected the bot token: check bot_token_secret (or bot_token)",
        ),
        other => TransportError::retryable(format!("could not start the bot: {other}")),
    }
}

#[async_trait]
impl Transport for DiscordTransport {
    fn id(&self) -> &str {
        TRANSPORT_ID
    }

    async fn run(&self, ctx: TransportContext) -> Result<(), TransportError> {
        let token = self
            .config
            .resolve_token(&self.secrets)
            .map_err(|error| TransportError::retryable(error.to_string()))?;
        let rest = Rest::new(&self.config.api_base_url, &token, self.config.api_timeout())
            .map_err(startup_error)?;
        let transcriber = self.config.voice.transcriber(&self.secrets).map_err(|error| {
            TransportError::retryable(format!("invalid [gateway.discord]: {error}"))
        })?;
        let me = tokio::select! {
            () = ctx.shutdown.cancelled() => return Ok(()),
            me = rest.with_retries(3, || rest.current_user()) => me.map_err(startup_error)?,
        };
        let stop = ctx.shutdown.child_token();
        let outbox = Outbox::spawn(
            DiscordSink::new(rest.clone()),
            sink::settings(self.config.edit_interval(), self.config.delivery_attempts),
            stop.clone(),
            &ctx.tracker,
        );
        ctx.status.track_backlog(outbox.backlog());
        let access = Access::new(TRANSPORT_ID, self.config.allow_everyone);
        access.warn_at_start();
        let bot = Arc::new(Bot {
            config: self.config.clone(),
            access,
            bound_channels: self.bound_channels.clone(),
            me,
            rest,
            outbox,
            router: ctx.router.clone(),
            store: ctx.store.clone(),
            tracker: ctx.tracker.clone(),
            shutdown: stop.clone(),
            status: ctx.status.clone(),
            deliveries: DeliveryRecords::new(ctx.store.clone(), DELIVERY_NS, FAILED_DELIVERY_TTL),
            places: Mutex::default(),
            approvals: ctx.approvals.clone(),
            offered: ask::Offered::default(),
            refusals: Refusals::new(StoreNotice::SendAgain),
            media: ctx.media.clone(),
            // The CDN is Discord's; a Discord on this machine (a test's fake,
            // a proxy) serves its files from here too.
            fetcher: Fetcher::new(media::is_local_url(&self.config.api_base_url)),
            transcriber,
        });
        bot.recover_deliveries().await;
        if let Some(application_id) = self.config.application_id {
            bot.register_commands(application_id);
        }
        let saved = match ctx.store.kv_get(SESSION_NS, SESSION_KEY, now_ms()).await {
            Ok(value) => value.and_then(|v| serde_json::from_value::<Resumable>(v).ok()),
            Err(error) => {
                return Err(TransportError::retryable(format!(
                    "could not read the gateway session: {error}"
                )))
            }
        };
        let settings = GatewaySettings::new(self.config.gateway_url.clone(), token);
        // Subscribed before the session starts, so no run of a channel is missed.
        let others = bot.router.subscribe_starts();
        let watcher = bot.clone();
        ctx.tracker.spawn(async move { watcher.deliver_others(others).await });
        let (events_tx, events) = mpsc::channel(1024);
        let session =
            ctx.tracker.spawn(gateway::run(settings, saved.clone(), events_tx, stop.clone()));
        tracing::info!(bot = %bot.me.username, "discord bot connecting");
        bot.serve(events, saved).await;
        stop.cancel();
        match session.await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(reason)) => Err(TransportError::fatal(reason)),
            Err(_) => Err(TransportError::retryable("the gateway session stopped")),
        }
    }
}

/// An answer on its way to a channel, as stored until it is delivered.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Delivery {
    run_id: String,
    /// Where the answer goes (the thread, for a thread).
    channel_id: Snowflake,
    /// The user's message, which the answer replies to.
    #[serde(default)]
    reply_to: Option<Snowflake>,
    /// The message edited as the run goes, once sent.
    #[serde(default)]
    working_message_id: Option<Snowflake>,
    /// Answer messages (parts, then files) already out.
    #[serde(default)]
    sent: usize,
    /// Set once delivery was given up: what Discord said last.
    #[serde(default)]
    failed: Option<String>,
}

impl DeliveryRecord for Delivery {
    fn given_up(&self) -> bool {
        self.failed.is_some()
    }
}

struct Bot {
    config: DiscordConfig,
    /// The allow-lists or `allow_everyone`; refusals logged once per id.
    access: Access,
    bound_channels: Vec<String>,
    me: User,
    rest: Rest,
    outbox: Outbox<DiscordSink>,
    router: RouterHandle,
    store: StoreHandle,
    tracker: TaskTracker,
    shutdown: CancellationToken,
    status: StatusHandle,
    deliveries: DeliveryRecords<Delivery>,
    /// Channel id → where it is (a thread's parent), looked up once.
    places: Mutex<HashMap<Snowflake, Located>>,
    /// Tool calls waiting for the owner's answer.
    approvals: ApprovalHub,
    /// The approval requests offered here: their channel and the message
    /// with the buttons, by request id.
    offered: ask::Offered<Snowflake, Snowflake>,
    /// Conversations told that the store cannot save messages, told once each.
    refusals: Refusals,
    /// Where received files wait for their run.
    media: MediaStage,
    /// Fetches attachments from Discord's CDN.
    fetcher: Fetcher,
    /// Voice messages' words, when `voice_transcription` is on.
    transcriber: Option<Transcriber>,
}

/// What a message's files became.
struct Received {
    prompt: String,
    /// The files kept, for the run.
    attachments: Vec<lemon_core::media::Attachment>,
    /// A voice message's words, to show before the run (`show_transcript`).
    heard: Option<String>,
}

/// A channel as looked up: a thread's (parent, thread), else (None, None).
type Located = (Option<Snowflake>, Option<Snowflake>);

fn now_ms() -> i64 {
    lemon_core::clock::now_ms()
}

/// One message of an answer: a part of its text or one of its files.
enum Part {
    Text(String),
    File(CreateFile),
}

impl Bot {
    /// Handles the session's events until it ends.
    async fn serve(
        self: &Arc<Self>,
        mut events: mpsc::Receiver<GatewayEvent>,
        saved: Option<Resumable>,
    ) {
        let mut session = saved;
        while let Some(event) = events.recv().await {
            match event {
                GatewayEvent::Ready { user, application_id, session_id, resume_url } => {
                    tracing::info!(bot = %user.username, "discord gateway ready");
                    session = Some(Resumable { session_id, seq: 0, resume_url });
                    self.save_session(session.as_ref()).await;
                    if self.config.application_id.is_none() {
                        if let Some(application_id) = application_id {
                            self.register_commands(application_id);
                        }
                    }
                    self.status.running(Some(self.detail()));
                }
                GatewayEvent::Resumed => {
                    tracing::info!("discord gateway session resumed");
                    self.status.running(Some(self.detail()));
                }
                GatewayEvent::Dispatch { name, seq, data } => {
                    match name.as_str() {
                        "MESSAGE_CREATE" => match serde_json::from_value::<Message>(data) {
                            Ok(message) => self.on_message(message).await,
                            Err(error) => tracing::warn!(%error, "discord message skipped"),
                        },
                        "INTERACTION_CREATE" => match serde_json::from_value::<Interaction>(data) {
                            Ok(interaction) => self.on_interaction(interaction).await,
                            Err(error) => tracing::warn!(%error, "discord interaction skipped"),
                        },
                        _ => {}
                    }
                    if let Some(session) = session.as_mut() {
                        session.seq = session.seq.max(seq);
                    }
                    self.save_session(session.as_ref()).await;
                }
                GatewayEvent::Disconnected { reason, attempts, retry_in } => {
                    self.status.set(TransportState::Failing {
                        reason: format!("gateway connection lost: {reason}"),
                        attempts,
                        retry_in_ms: Some(u64::try_from(retry_in.as_millis()).unwrap_or(u64::MAX)),
                    });
                }
            }
        }
    }

    async fn save_session(&self, session: Option<&Resumable>) {
        if let Some(Ok(value)) = session.map(serde_json::to_value) {
            self.store.kv_put(SESSION_NS, SESSION_KEY, value, None).await;
        }
    }

    /// Registers `/cancel`, `/new`, `/status` and `/engine`, on its own task.
    fn register_commands(self: &Arc<Self>, application_id: Snowflake) {
        let rest = self.rest.clone();
        self.tracker.spawn(async move {
            let commands = inbound::application_commands();
            let registered = rest
                .with_retries(5, || rest.bulk_overwrite_commands(application_id, &commands))
                .await;
            if let Err(error) = registered {
                tracing::warn!(%error, "could not register the bot's slash commands");
            }
        });
    }

    /// What status shows while the bot is serving.
    fn detail(&self) -> String {
        let detail = match self.deliveries.given_up_count() {
            0 => format!("@{}", self.me.username),
            1 => format!("@{}; 1 answer Discord refused (see the log)", self.me.username),
            n => format!("@{}; {n} answers Discord refused (see the log)", self.me.username),
        };
        self.access.detail(detail)
    }

    /// Where a message of `channel_id` in `guild` was written: a thread is its
    /// own place under its parent channel. A lookup that fails counts the
    /// channel as a plain channel.
    async fn place(&self, guild: Option<Snowflake>, channel_id: Snowflake) -> Place {
        let Some(guild) = guild else {
            return Place { guild: None, channel: channel_id, thread: None };
        };
        let known = self
            .places
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(&channel_id)
            .copied();
        let (parent, thread) = match known {
            Some(found) => found,
            None => {
                let looked_up =
                    self.rest.with_retries(3, || self.rest.get_channel(channel_id)).await;
                let found = match looked_up {
                    Ok(channel) if channel.is_thread() => (channel.parent_id, Some(channel_id)),
                    Ok(_) => (None, None),
                    Err(error) => {
                        tracing::warn!(%error, channel = %channel_id, "discord channel lookup failed");
                        return Place { guild: Some(guild), channel: channel_id, thread: None };
                    }
                };
                self.places
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .insert(channel_id, found);
                found
            }
        };
        match (parent, thread) {
            (Some(parent), Some(thread)) => {
                Place { guild: Some(guild), channel: parent, thread: Some(thread) }
            }
            _ => Place { guild: Some(guild), channel: channel_id, thread: None },
        }
    }

    /// Whether `user` may have runs at `place`: on the allow-lists (or
    /// everyone is allowed), and bound when `deny_unbound` is on. A refusal is
    /// logged once per id.
    fn allowed(&self, place: &Place, user: Snowflake) -> bool {
        let unlisted = self.config.unlisted(place.guild, place.channel, user);
        if !self.access.admits(unlisted.is_none()) {
            if let Some(unlisted) = unlisted {
                let (what, id, key) = unlisted.describe();
                self.access.refused(what, &id, key);
            }
            return false;
        }
        let bound = !self.config.deny_unbound
            || self.bound_channels.iter().any(|c| *c == place.channel.to_string());
        if !bound {
            tracing::info!(channel = %place.channel, "message in a channel without a binding (deny_unbound)");
        }
        bound
    }

    async fn on_message(self: &Arc<Self>, message: Message) {
        let Some(text) = inbound::text_for_bot(&message, self.me.id, self.config.mention_required)
        else {
            return;
        };
        if text.is_empty() && message.attachments.is_empty() {
            return;
        }
        let place = self.place(message.guild_id, message.channel_id).await;
        if !self.allowed(&place, message.author.id) {
            return;
        }
        if is_help(&text) {
            self.reply_soon(place.target(), message.id, help_text());
            return;
        }
        let received = if message.attachments.is_empty() {
            Received { prompt: text, attachments: Vec::new(), heard: None }
        } else {
            match self.receive_files(&message, text).await {
                Ok(received) => received,
                Err(reply) => {
                    self.reply_soon(place.target(), message.id, reply);
                    return;
                }
            }
        };
        if let Some(words) = &received.heard {
            self.send_heard(place.target(), message.id, words).await;
        }
        let attachments = received.attachments;
        let run_id = inbound::run_id(message.id);
        let mut req = self.request(&place, received.prompt);
        req.run_id = Some(run_id.clone());
        let session = req.session_key.clone();
        req.resume = self.resume_from_reply(&message);
        req.meta.insert(
            "discord".to_owned(),
            json!({
                "guild_id": place.guild,
                "channel_id": place.channel,
                "thread_id": place.thread,
                "message_id": message.id,
                "author_id": message.author.id,
            }),
        );
        lemon_core::media::add_attachments(&mut req.meta, &attachments);
        let delivery = Delivery {
            run_id: run_id.to_string(),
            channel_id: place.target(),
            reply_to: Some(message.id),
            working_message_id: None,
            sent: 0,
            failed: None,
        };
        // Recorded before the run exists, so a restart (and the watcher of
        // runs started elsewhere) finds it.
        self.deliveries.record(&delivery.run_id, &delivery).await;
        match self.router.submit(req).await {
            Ok(Submitted::Command { reply, .. }) => {
                self.media.discard(&attachments);
                self.deliveries.finish(&delivery.run_id).await;
                self.reply_soon(place.target(), message.id, reply);
            }
            // Seen before: the first handling (or its recovered delivery) follows it.
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
                    self.reply_soon(place.target(), message.id, reply);
                }
            }
        }
    }

    /// The prompt and the files of a message that brought files: a voice
    /// message's words when transcription is on, else every file fetched from
    /// Discord's CDN within `[gateway.discord.files]` and kept for the run
    /// (no text: [`media::FILES_ONLY_PROMPT`]). `Err` is the reply refusing
    /// them; then nothing is kept and no run starts.
    async fn receive_files(&self, message: &Message, text: String) -> Result<Received, String> {
        if let (true, Some(transcriber), Some(voice)) =
            (message.is_voice_message(), &self.transcriber, message.attachments.first())
        {
            let note = RemoteVoice {
                file_name: if voice.filename.is_empty() {
                    "voice-message.ogg"
                } else {
                    &voice.filename
                },
                mime: voice.content_type.as_deref(),
                bytes: voice.size,
                seconds: voice.duration(),
            };
            let words = transcriber
                .fetch_and_transcribe(&self.fetcher, &voice.url, note, None)
                .await
                .map_err(|error| {
                    tracing::info!(%error, message = %message.id, "voice message not transcribed");
                    error.to_string()
                })?;
            let prompt = if text.is_empty() { words.clone() } else { format!("{text}\n\n{words}") };
            let heard = self.config.voice.show_transcript.then_some(words);
            return Ok(Received { prompt, attachments: Vec::new(), heard });
        }
        // A voice message transcribed is words, not a file: the files
        // section does not apply to it.
        let files = &self.config.files;
        if !files.enabled {
            return Err(MediaRefusal::Disabled.to_string());
        }
        if !files.user_allowed(&message.author.id.to_string()) {
            return Err(MediaRefusal::UserNotAllowed.to_string());
        }
        let mut kept = Vec::new();
        let mut refused = Vec::new();
        for (n, attachment) in message.attachments.iter().enumerate() {
            let fallback = format!("attachment-{}", n + 1);
            let remote = RemoteFile {
                url: &attachment.url,
                name: Some(&attachment.filename),
                fallback: &fallback,
                mime: attachment.content_type.as_deref(),
                size: attachment.size,
            };
            match media::fetch_and_keep(&self.fetcher, &self.media, files, remote, None).await {
                Ok(file) => kept.push(file),
                Err(refusal) => refused.push(refusal),
            }
        }
        if let Some(reply) = media::refusals_text(&refused) {
            tracing::info!(
                message = %message.id,
                refused = refused.len(),
                reply = %log_text::escape(&reply),
                "files of a message refused; no run"
            );
            self.media.discard(&kept);
            return Err(reply);
        }
        let prompt = if text.is_empty() { media::FILES_ONLY_PROMPT.to_owned() } else { text };
        Ok(Received { prompt, attachments: kept, heard: None })
    }

    /// Shows a voice message's words (`heard: …`) before its run, waiting
    /// until it is sent so it comes before the answer.
    async fn send_heard(&self, channel_id: Snowflake, reply_to: Snowflake, words: &str) {
        let message = CreateMessage {
            channel_id,
            content: truncated(&media::heard(words), super::types::MAX_CONTENT_CHARS),
            reply_to: Some(reply_to),
            nonce: nonce(&format!("heard:{reply_to}")),
            buttons: Vec::new(),
        };
        if let Err(error) = self.outbox.send(Outgoing::Text(message)).await {
            tracing::warn!(%error, "transcript not shown");
        }
    }

    /// A slash command: submitted as its text, the router's reply sent as the
    /// interaction's answer.
    async fn on_interaction(self: &Arc<Self>, interaction: Interaction) {
        // A button under a message (type 3): an approval's answer.
        if interaction.kind == 3 {
            self.answer_button(interaction).await;
            return;
        }
        // Otherwise only application commands (type 2) are the bot's.
        if interaction.kind != 2 {
            return;
        }
        let (Some(channel_id), Some(user)) =
            (interaction.channel_id, interaction.invoker().cloned())
        else {
            return;
        };
        let text = interaction.data.as_ref().and_then(inbound::command_text);
        let place = self.place(interaction.guild_id, channel_id).await;
        let reply = match text {
            None => "Unknown command.".to_owned(),
            // Discord wants every interaction answered: a short refusal, no run.
            Some(_) if !self.allowed(&place, user.id) => "Not allowed here.".to_owned(),
            Some(text) => {
                let run_id = inbound::interaction_run_id(interaction.id);
                let mut req = self.request(&place, text);
                req.run_id = Some(run_id.clone());
                let session = req.session_key.clone();
                let delivery = Delivery {
                    run_id: run_id.to_string(),
                    channel_id: place.target(),
                    reply_to: None,
                    working_message_id: None,
                    sent: 0,
                    failed: None,
                };
                self.deliveries.record(&delivery.run_id, &delivery).await;
                match self.router.submit(req).await {
                    Ok(Submitted::Command { reply, .. }) => {
                        self.deliveries.finish(&delivery.run_id).await;
                        reply
                    }
                    Ok(Submitted::Run(accepted, events)) => {
                        self.refusals.accepted(&session);
                        if !accepted.duplicate {
                            let bot = self.clone();
                            self.tracker.spawn(async move { bot.follow(delivery, events).await });
                        }
                        "Working on it.".to_owned()
                    }
                    Err(error) => {
                        self.deliveries.finish(&delivery.run_id).await;
                        // Discord wants every interaction answered.
                        self.refusals
                            .reply(&session, &error)
                            .unwrap_or_else(|| refused::STILL_FAILING.to_owned())
                    }
                }
            }
        };
        let rest = self.rest.clone();
        self.tracker.spawn(async move {
            let answered = rest
                .with_retries(3, || {
                    rest.interaction_reply(interaction.id, &interaction.token, &reply)
                })
                .await;
            if let Err(error) = answered {
                tracing::warn!(%error, "slash command answer not delivered");
            }
        });
    }

    /// A pressed Approve / Deny button: answers the request when the press
    /// comes from the channel it was offered in, by a user allowed there, and
    /// tells the presser (alone) how it went.
    async fn answer_button(&self, interaction: Interaction) {
        let data = interaction.data.as_ref().and_then(|data| data.custom_id.as_deref());
        let Some((reply, id)) = ask::parse_press(data.unwrap_or_default()) else {
            tracing::info!("a button press that is no approval request; ignored");
            return;
        };
        let notice = match (interaction.channel_id, interaction.invoker()) {
            (Some(channel_id), Some(user)) => {
                let place = self.place(interaction.guild_id, channel_id).await;
                if !self.allowed(&place, user.id) {
                    "You may not answer here.".to_owned()
                } else if !self.offered.pressed_in_place(id, &channel_id) {
                    "This request was not asked here.".to_owned()
                } else {
                    let by = format!("@{}", user.username);
                    ask::notice(&self.approvals.reply(id, reply, &by, TRANSPORT_ID), reply)
                }
            }
            _ => "This request cannot be answered here.".to_owned(),
        };
        tracing::info!(approval = id, ?reply, notice = %notice, "approval button pressed");
        let answered = self
            .rest
            .with_retries(3, || {
                self.rest.interaction_notice(interaction.id, &interaction.token, &notice)
            })
            .await;
        if let Err(error) = answered {
            tracing::warn!(%error, "could not answer a button press");
        }
    }

    /// An approval action of the channel's run: when it starts, the request
    /// is offered with Approve / Deny / Always buttons; when it completes, the message
    /// says how it was settled and loses its buttons.
    async fn approval_step(&self, delivery: &Delivery, action: &Action) {
        let Some(request) = ask::request_of(action) else { return };
        if action.phase != ActionPhase::Completed {
            let [approve, deny, always] = ask::button_data(&request.id);
            let message = CreateMessage {
                channel_id: delivery.channel_id,
                content: ask::ask_text(&request),
                reply_to: delivery.reply_to,
                nonce: nonce(&format!("{}:ask", request.id)),
                buttons: vec![
                    Button { label: "Approve", style: 3, custom_id: approve },
                    Button { label: "Deny", style: 4, custom_id: deny },
                    Button { label: ask::ALWAYS_LABEL, style: 2, custom_id: always },
                ],
            };
            match self.outbox.send(Outgoing::Text(message)).await {
                Ok(sent) => self.offered.insert(&request.id, delivery.channel_id, sent.id),
                Err(error) => {
                    tracing::warn!(%error, approval = %request.id, "approval request not sent");
                }
            }
            return;
        }
        if let Some((channel_id, message_id)) = self.offered.take(&request.id) {
            let text = ask::settled_text(&request, action);
            let edited = self
                .rest
                .with_retries(3, || {
                    self.rest.edit_message_without_buttons(channel_id, message_id, &text)
                })
                .await;
            if let Err(error) = edited {
                tracing::warn!(%error, approval = %request.id, "approval message not settled");
            }
        }
    }

    /// Delivers the runs of this bot's channels that it did not submit (a cron
    /// job's, one started through the API) like its own: a working message,
    /// then the answer, on record until it is in the channel.
    async fn deliver_others(self: Arc<Self>, mut events: lemon_core::bus::Subscription) {
        loop {
            let event = tokio::select! {
                () = self.shutdown.cancelled() => return,
                event = events.recv() => event,
            };
            let event = match event {
                Ok(event) => event,
                Err(lemon_core::bus::RecvError::Lagged(missed)) => {
                    tracing::warn!(missed, "discord fell behind the gateway's events");
                    continue;
                }
                Err(lemon_core::bus::RecvError::Closed) => return,
            };
            if !matches!(event.kind, EventKind::RunStarted { .. }) {
                continue;
            }
            let Some((dm, channel, thread)) = inbound::place_of(&event.session_key, self.me.id)
            else {
                continue;
            };
            // Runs started elsewhere (cron, the API) were asked for by the
            // owner, not by whoever writes in the channel.
            let listed = dm
                || self.config.allowed_channel_ids.is_empty()
                || self.config.allowed_channel_ids.contains(&channel);
            let bound =
                !self.config.deny_unbound || self.bound_channels.contains(&channel.to_string());
            if !(listed && bound) {
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
                channel_id: thread.unwrap_or(channel),
                reply_to: None,
                working_message_id: None,
                sent: 0,
                failed: None,
            };
            self.deliveries.record(&delivery.run_id, &delivery).await;
            let follower = self.router.follow(&event.run_id);
            let bot = self.clone();
            self.tracker.spawn(async move { bot.follow(delivery, follower).await });
        }
    }

    fn request(&self, place: &Place, text: String) -> RunRequest {
        let mut req =
            RunRequest::new(inbound::session_key(&self.config.agent_id, self.me.id, place), text);
        req.origin = Origin::Channel;
        req.agent_id = Some(self.config.agent_id.clone());
        req.queue_mode = self.config.queue_mode;
        req.engine = self.config.engine.clone();
        req.channel = Some(inbound::channel_ref(place));
        req
    }

    /// A resume line in the bot's message this one replies to continues that session.
    fn resume_from_reply(&self, message: &Message) -> Option<ResumeToken> {
        let replied = message.referenced_message.as_ref()?;
        if replied.author.id != self.me.id {
            return None;
        }
        self.router.query().extract_resume(&replied.content)
    }

    /// Sends a short reply to `reply_to` on its own task (the event loop never
    /// waits for Discord's limits). A message has at most one such reply, so
    /// its nonce comes from the message.
    fn reply_soon(self: &Arc<Self>, channel_id: Snowflake, reply_to: Snowflake, text: String) {
        let outbox = self.outbox.clone();
        self.tracker.spawn(async move {
            let message = CreateMessage {
                channel_id,
                content: text,
                reply_to: Some(reply_to),
                nonce: nonce(&format!("reply:{reply_to}")),
                buttons: Vec::new(),
            };
            if let Err(error) = outbox.send(Outgoing::Text(message)).await {
                tracing::warn!(%error, "reply not delivered");
            }
        });
    }

    /// Follows a run to its answer in the channel: a working message once it
    /// starts, edited as text streams in, then the answer.
    async fn follow(self: Arc<Self>, mut delivery: Delivery, mut events: RunFollower) {
        let runs = self.router.query();
        let mut renderer =
            StreamRenderer::new(Arc::new(move |token: &ResumeToken| runs.format_resume(token)));
        let mut started = false;
        let completion = loop {
            let event = tokio::select! {
                () = self.shutdown.cancelled() => return,
                event = events.next() => event,
            };
            // No completion will come: the gateway is stopping; the next start delivers.
            let Some(event) = event else { return };
            started |= event.type_name() == "run_started";
            // Events read back from the store are not drawn: the answer is complete either way.
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
            if matches!(typed.kind, EventKind::RunStarted { .. })
                && delivery.working_message_id.is_none()
            {
                if self.send_working(&mut delivery, &renderer).await.is_err() {
                    return;
                }
                continue;
            }
            if changed {
                if let Some(message_id) = delivery.working_message_id {
                    // Only queued: the outbox merges it with newer edits of the message.
                    let _ =
                        self.outbox.edit(delivery.channel_id, message_id, renderer.working()).await;
                }
            }
        };
        self.finish(delivery, renderer, completion, started).await;
    }

    /// Sends the working message and records its id.
    ///
    /// # Errors
    /// The outbox stopped; the next start goes on.
    async fn send_working(
        &self,
        delivery: &mut Delivery,
        renderer: &StreamRenderer,
    ) -> Result<(), ()> {
        let message = CreateMessage {
            channel_id: delivery.channel_id,
            content: renderer.working(),
            reply_to: delivery.reply_to,
            nonce: nonce(&format!("{}:working", delivery.run_id)),
            buttons: Vec::new(),
        };
        match self.outbox.send(Outgoing::Text(message)).await {
            Ok(sent) => {
                delivery.working_message_id = Some(sent.id);
                // Durable now, so a crash leaves no message saying "Running…" forever.
                self.deliveries.record_durably(&delivery.run_id, delivery).await;
                Ok(())
            }
            Err(DeliveryError::ShuttingDown) => Err(()),
            Err(error) => {
                tracing::warn!(%error, run_id = %delivery.run_id, "working message not sent");
                Ok(())
            }
        }
    }

    /// The answer: its first part in the working message, the rest and the
    /// files after it, each recorded as it goes out.
    async fn finish(
        &self,
        mut delivery: Delivery,
        renderer: StreamRenderer,
        completion: Completion,
        started: bool,
    ) {
        let parts = renderer.final_parts(&completion, started);
        let files = self.uploads(&delivery, &completion.artifacts, parts.len());
        let all = parts.into_iter().map(Part::Text).chain(files.into_iter().map(Part::File));
        for (index, part) in all.enumerate().skip(delivery.sent) {
            let sent = match part {
                Part::Text(content) => self.send_text(&delivery, index, content).await,
                Part::File(file) => {
                    let filename = file.filename.clone();
                    match self.outbox.send(Outgoing::File(file)).await {
                        // A file Discord refuses is skipped; the answer itself is out.
                        Err(DeliveryError::Failed { error, .. }) => {
                            tracing::warn!(%error, run_id = %delivery.run_id, filename = %log_text::escape(&filename), "file of the answer not delivered");
                            Ok(())
                        }
                        other => other.map(drop),
                    }
                }
            };
            match sent {
                Ok(()) => {
                    delivery.sent = index + 1;
                    self.deliveries.record(&delivery.run_id, &delivery).await;
                }
                // Kept in the store: the next start sends the rest.
                Err(DeliveryError::ShuttingDown) => return,
                Err(error) => {
                    tracing::error!(%error, run_id = %delivery.run_id, channel = %delivery.channel_id, "answer not delivered");
                    delivery.failed = Some(error.to_string());
                    self.deliveries.give_up(&delivery.run_id, &delivery).await;
                    self.status.running(Some(self.detail()));
                    return;
                }
            }
        }
        self.deliveries.finish(&delivery.run_id).await;
    }

    /// Part `index` of the answer: the first replaces the working message (or,
    /// without one, replies to the user's message); the others follow it.
    async fn send_text(
        &self,
        delivery: &Delivery,
        index: usize,
        content: String,
    ) -> Result<(), DeliveryError> {
        if index == 0 {
            if let Some(message_id) = delivery.working_message_id {
                match self
                    .outbox
                    .edit_and_wait(delivery.channel_id, message_id, content.clone())
                    .await
                {
                    Ok(()) => return Ok(()),
                    Err(DeliveryError::ShuttingDown) => return Err(DeliveryError::ShuttingDown),
                    // The working message is gone (deleted): the answer comes as a new one.
                    Err(error) => {
                        tracing::warn!(%error, run_id = %delivery.run_id, "working message not edited")
                    }
                }
            }
        }
        let message = CreateMessage {
            channel_id: delivery.channel_id,
            content,
            reply_to: delivery.reply_to.filter(|_| index == 0),
            nonce: part_nonce(&delivery.run_id, index),
            buttons: Vec::new(),
        };
        self.outbox.send(Outgoing::Text(message)).await.map(drop)
    }

    /// The attachments of an answer's files, the first of them part `first`
    /// of the answer; one over the upload limit is logged and left out.
    fn uploads(
        &self,
        delivery: &Delivery,
        artifacts: &[Artifact],
        first: usize,
    ) -> Vec<CreateFile> {
        let mut files = Vec::new();
        for (n, artifact) in artifacts.iter().enumerate() {
            if artifact.size > self.config.max_upload_bytes {
                tracing::warn!(
                    run_id = %delivery.run_id,
                    filename = %log_text::escape(&artifact.filename),
                    size = artifact.size,
                    "file of the answer is larger than max_upload_bytes; not sent"
                );
                continue;
            }
            files.push(CreateFile {
                channel_id: delivery.channel_id,
                path: artifact.path.clone(),
                filename: artifact.filename.clone(),
                mime: artifact.mime().to_owned(),
                caption: artifact.caption.as_ref().map(|c| c.chars().take(1000).collect()),
                nonce: part_nonce(&delivery.run_id, first + n),
            });
        }
        files
    }

    /// Picks up the answers a stop left undelivered.
    async fn recover_deliveries(self: &Arc<Self>) {
        for (_, delivery) in self.deliveries.recover().await.pending {
            let Some(run_id) = lemon_core::ids::RunId::parse(&delivery.run_id) else { continue };
            let events = self.router.follow(&run_id);
            let bot = self.clone();
            self.tracker.spawn(async move { bot.follow(delivery, events).await });
        }
    }
}

/// The nonce of part `index` of a run's answer (its texts, then its files):
/// the same whenever that part is sent again, after a timeout or a restart.
fn part_nonce(run_id: &str, index: usize) -> String {
    nonce(&format!("{run_id}:part:{index}"))
}

/// `text` cut to `max` characters (an ellipsis at the end when cut).
fn truncated(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_owned();
    }
    let mut cut: String = text.chars().take(max.saturating_sub(1)).collect();
    cut.push('…');
    cut
}

/// `/help` (and `/start`).
fn is_help(text: &str) -> bool {
    let first = text.split_whitespace().next().unwrap_or_default();
    first.eq_ignore_ascii_case("/help") || first.eq_ignore_ascii_case("/start")
}

fn help_text() -> String {
    let mut text = String::from(
        "Mention me (or write to me directly) and an agent works on it: one message shows the \
         answer as it comes. Reply to an answer to continue its session.\n",
    );
    for (command, description) in COMMANDS {
        text.push_str(&format!("\n`/{command}` — {description}"));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn deliveries_recorded_in_the_stored_shape_recover() {
        let store = StoreHandle::memory();
        let stored = json!({
            "run_id": "dc_7", "channel_id": "20", "reply_to": "7",
            "working_message_id": "9", "sent": 1, "failed": null,
        });
        store.kv_put(DELIVERY_NS, "dc_7", stored.clone(), None).await;
        store
            .kv_put(DELIVERY_NS, "dc_8", json!({ "run_id": "dc_8", "channel_id": "21" }), None)
            .await;
        let records = DeliveryRecords::<Delivery>::new(store, DELIVERY_NS, FAILED_DELIVERY_TTL);
        let found = records.recover().await;
        assert_eq!(found.pending.len(), 2);
        let first = &found.pending[0].1;
        assert_eq!(first.working_message_id, Some(Snowflake(9)));
        assert_eq!(first.sent, 1);
        assert_eq!(serde_json::to_value(first).unwrap(), stored);
        assert_eq!(found.pending[1].1.reply_to, None);
    }

    #[test]
    fn help_names_every_command() {
        let help = help_text();
        for (command, _) in COMMANDS {
            assert!(help.contains(&format!("/{command}")), "{help}");
        }
        assert!(is_help("/help me") && !is_help("help"));
    }
}
