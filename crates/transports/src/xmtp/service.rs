//! [`XmtpTransport`]: keeps a bridge running (restarted with backoff), takes
//! its messages through the router, one conversation per XMTP conversation,
//! and sends each answer when its run completes, on record until it is sent.
//!
//! - A message is acked to the bridge once the router has it (or it was
//!   refused for good), so the bridge moves its cursor past it; its run id
//!   comes from its message id, so a message handed over again (a bridge
//!   restarted before its cursor moved) is one run.
//! - The answer's delivery is recorded before the run is submitted and
//!   finished once the bridge said `sent`; an answer pending across a restart
//!   of the gateway or of the bridge is sent once after it.
//! - Runs started elsewhere in an XMTP conversation's session (the API, cron)
//!   are answered in that conversation as well.
//! - A remote attachment is fetched, checked and decrypted off the bridge's
//!   read loop (a large download must not hold its pings up), then submitted
//!   like a text with the file kept for the run, and acked once the router
//!   has it; a refused one is answered in the conversation with the reason.
//!   A gateway that stops mid-download has not acked it: the bridge hands it
//!   over again.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use lemon_core::bus::EventKind;
use lemon_core::engine::Completion;
use lemon_core::ids::{RunId, SessionKey};
use lemon_core::log_text;
use lemon_core::media::{Attachment, MediaRefusal, MediaStage};
use lemon_core::router::{ChannelRef, Origin, RouterHandle, RunFollower, RunRequest, Submitted};
use lemon_core::secrets::SecretStore;
use lemon_core::store::StoreHandle;
use lemon_core::transport::{
    StatusHandle, Transport, TransportContext, TransportError, TransportState,
};
use serde::{Deserialize, Serialize};
use serde_json::json;
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::attachment;
use super::bridge::{self, BridgeCommand, BridgeEvents, Ended, Launcher, Link, Timings};
use super::config::XmtpConfig;
use super::protocol::{InboundMessage, RemoteAttachment};
use super::sink::{BridgeSink, Outgoing};
use super::TRANSPORT_ID;
use crate::access::Access;
use crate::delivery::{
    Backoff, DeliveryError, DeliveryRecord, DeliveryRecords, Outbox, OutboxSettings, Window,
};
use crate::media::{self, Fetcher};
use crate::refused::{Refusals, StoreNotice};

/// Store namespace of answers not yet sent, keyed by run id.
pub const DELIVERY_NS: &str = "xmtp.delivery";
/// Store namespace of the messages already answered, keyed by run id.
pub const SEEN_NS: &str = "xmtp.seen";
/// How long an answer the bridge refused stays on record.
const FAILED_DELIVERY_TTL: Duration = Duration::from_secs(7 * 24 * 60 * 60);
/// How long an answered message is remembered.
const SEEN_TTL: Duration = Duration::from_secs(30 * 24 * 60 * 60);
/// The longest restart wait.
const MAX_RESTART_WAIT: Duration = Duration::from_secs(60);

/// What the XMTP transport is built from.
#[derive(Debug)]
pub struct XmtpDeps {
    pub config: XmtpConfig,
    /// The wallet key is read from here at every start of the bridge.
    pub secrets: Arc<SecretStore>,
    pub launcher: Arc<dyn Launcher>,
    /// The bridge script (checked to exist at every start).
    pub script: PathBuf,
    /// Where the bridge keeps its database and cursor.
    pub state_dir: PathBuf,
    /// The environment the bridge inherits (`PATH`, `HOME`…), without secrets.
    pub base_env: BTreeMap<String, String>,
    /// Conversation ids with a `[[gateway.bindings]]` entry.
    pub bound_conversations: Vec<String>,
}

/// The XMTP transport.
#[derive(Debug)]
pub struct XmtpTransport {
    deps: XmtpDeps,
}

impl XmtpTransport {
    pub fn new(deps: XmtpDeps) -> Self {
        XmtpTransport { deps }
    }

    /// The bridge's command line and environment, with the secrets read now.
    fn command(&self) -> Result<BridgeCommand, TransportError> {
        let deps = &self.deps;
        let secrets = deps
            .config
            .resolve_secrets(&deps.secrets)
            .map_err(|error| TransportError::retryable(error.0))?;
        if !deps.script.is_file() {
            return Err(TransportError::retryable(format!(
                "the bridge script {} does not exist (set bridge_script)",
                deps.script.display()
            )));
        }
        let cwd = deps.script.parent().map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/"));
        let mut env: BTreeMap<String, String> = ["PATH", "HOME", "LANG", "TZ"]
            .iter()
            .filter_map(|key| deps.base_env.get(*key).map(|v| ((*key).to_owned(), v.clone())))
            .collect();
        env.insert("XMTP_ENV".into(), deps.config.env.as_str().into());
        env.insert("XMTP_WALLET_KEY".into(), secrets.wallet_key.expose().to_owned());
        if let Some(key) = &secrets.db_encryption_key {
            env.insert("XMTP_DB_ENCRYPTION_KEY".into(), key.expose().to_owned());
        }
        env.insert("LEMON_XMTP_STATE_DIR".into(), deps.state_dir.display().to_string());
        env.insert("LEMON_XMTP_PROTOCOL".into(), super::protocol::PROTOCOL_VERSION.to_string());
        Ok(BridgeCommand {
            program: deps.config.node.clone(),
            args: vec![deps.script.display().to_string()],
            cwd,
            env,
        })
    }
}

/// An answer on its way, as stored until it is sent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Delivery {
    run_id: String,
    conversation_id: String,
    /// Set once delivery was given up: what the bridge said last.
    #[serde(default)]
    failed: Option<String>,
}

impl DeliveryRecord for Delivery {
    fn given_up(&self) -> bool {
        self.failed.is_some()
    }
}

#[async_trait]
impl Transport for XmtpTransport {
    fn id(&self) -> &str {
        TRANSPORT_ID
    }

    async fn run(&self, ctx: TransportContext) -> Result<(), TransportError> {
        let config = &self.deps.config;
        // Checked before anything starts, so a missing key shows as the reason.
        self.command()?;
        if let Err(error) = tokio::fs::create_dir_all(&self.deps.state_dir).await {
            return Err(TransportError::retryable(format!(
                "cannot create {}: {error}",
                self.deps.state_dir.display()
            )));
        }
        let stop = ctx.shutdown.child_token();
        let link = Arc::new(Link::new(XmtpConfig::duration(config.send_timeout_ms)));
        let outbox = Outbox::spawn(
            BridgeSink { link: link.clone() },
            OutboxSettings {
                interval: Duration::from_millis(200),
                overall: Some(Window::new(60, Duration::from_secs(10))),
                send_attempts: config.delivery_attempts,
                edit_attempts: 1,
                backoff: Backoff::new(Duration::from_millis(500), Duration::from_secs(30)),
                shutdown_grace: Duration::from_secs(5),
                queue_capacity: 256,
                quiet_start: Duration::ZERO,
            },
            stop.clone(),
            &ctx.tracker,
        );
        let access = Access::new(TRANSPORT_ID, config.allow_everyone);
        access.warn_at_start();
        let service = Arc::new(Service {
            config: config.clone(),
            access,
            bound: self.deps.bound_conversations.clone(),
            router: ctx.router.clone(),
            store: ctx.store.clone(),
            tracker: ctx.tracker.clone(),
            shutdown: stop.clone(),
            status: ctx.status.clone(),
            outbox,
            deliveries: DeliveryRecords::new(ctx.store.clone(), DELIVERY_NS, FAILED_DELIVERY_TTL),
            me: Mutex::new(None),
            refusals: Refusals::new(StoreNotice::SendAgain),
            media: ctx.media.clone(),
            fetcher: Fetcher::new(config.attachments_may_be_local()),
            link: link.clone(),
        });
        service.recover_deliveries().await;
        // Subscribed before the bridge starts, so no run of a conversation is missed.
        let others = ctx.router.subscribe_starts();
        let watcher = service.clone();
        ctx.tracker.spawn(async move { watcher.deliver_others(others).await });

        let timings = Timings {
            ready_timeout: XmtpConfig::duration(config.ready_timeout_ms),
            ping_interval: XmtpConfig::duration(config.ping_interval_ms),
            ping_timeout: XmtpConfig::duration(config.ping_timeout_ms),
        };
        let backoff =
            Backoff::new(XmtpConfig::duration(config.restart_backoff_ms), MAX_RESTART_WAIT);
        let mut failures = 0u32;
        loop {
            let command = match self.command() {
                Ok(command) => command,
                Err(error) => {
                    stop.cancel();
                    return Err(error);
                }
            };
            let ended = bridge::run_once(
                self.deps.launcher.as_ref(),
                command,
                timings,
                &link,
                &service,
                &stop,
                &ctx.tracker,
            )
            .await;
            let Ended::Failed { reason, was_ready } = ended else { break };
            failures = if was_ready { 1 } else { failures + 1 };
            let wait = backoff.delay(failures);
            tracing::warn!(%reason, retry_in_ms = wait.as_millis() as u64, "xmtp bridge ended; restarting it");
            ctx.status.set(TransportState::Failing {
                reason,
                attempts: failures,
                retry_in_ms: Some(u64::try_from(wait.as_millis()).unwrap_or(u64::MAX)),
            });
            tokio::select! {
                () = stop.cancelled() => break,
                () = tokio::time::sleep(wait) => {}
            }
        }
        stop.cancel();
        Ok(())
    }
}

struct Service {
    config: XmtpConfig,
    /// `allowed_senders` or `allow_everyone`; refusals logged once per sender.
    access: Access,
    bound: Vec<String>,
    router: RouterHandle,
    store: StoreHandle,
    tracker: TaskTracker,
    shutdown: CancellationToken,
    status: StatusHandle,
    outbox: Outbox<BridgeSink>,
    deliveries: DeliveryRecords<Delivery>,
    /// The bridge's inbox id once it is ready: its own messages get no run.
    me: Mutex<Option<String>>,
    /// Conversations told that the store cannot save messages, told once each.
    refusals: Refusals,
    /// Where received files wait for their run.
    media: MediaStage,
    /// Fetches remote attachments: private addresses only with `env = "local"`.
    fetcher: Fetcher,
    /// The running bridge: attachments are acked through it once taken.
    link: Arc<Link>,
}

fn now_ms() -> i64 {
    lemon_core::clock::now_ms()
}

/// Conversation ids are hex (or at least plain ids): anything else is refused
/// before it reaches a session key.
pub fn is_conversation_id(id: &str) -> bool {
    (1..=128).contains(&id.len())
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// The session of an XMTP conversation.
pub fn session_key(agent_id: &str, conversation_id: &str) -> SessionKey {
    format!("agent:{agent_id}:{TRANSPORT_ID}:{conversation_id}").into()
}

/// The conversation a session key names ([`session_key`]'s inverse).
pub fn conversation_of(session_key: &str) -> Option<&str> {
    let rest = session_key.strip_prefix("agent:")?;
    let (_agent, rest) = rest.split_once(':')?;
    let conversation = rest.strip_prefix(TRANSPORT_ID)?.strip_prefix(':')?;
    is_conversation_id(conversation).then_some(conversation)
}

/// The run id of a message: the same for the same message id, whatever its shape.
pub fn run_id(message_id: &str) -> RunId {
    let digest = Sha256::digest(message_id.as_bytes());
    let hex: String = digest.iter().take(16).map(|b| format!("{b:02x}")).collect();
    RunId::parse(&format!("xmtp_{hex}")).unwrap_or_else(RunId::generate)
}

#[async_trait]
impl BridgeEvents for Arc<Service> {
    async fn ready(&self, inbox_id: &str, address: Option<&str>) {
        *self.me.lock().unwrap_or_else(std::sync::PoisonError::into_inner) =
            Some(inbox_id.to_ascii_lowercase());
        let mut detail = format!("inbox {}", log_text::escape(inbox_id));
        if let Some(address) = address {
            detail.push_str(&format!(" ({})", log_text::escape(address)));
        }
        detail.push_str(&format!(" on {}", self.config.env.as_str()));
        match self.deliveries.given_up_count() {
            0 => {}
            n => detail.push_str(&format!("; {n} answer(s) not delivered (see the log)")),
        }
        tracing::info!(%detail, "xmtp bridge ready");
        self.status.running(Some(self.access.detail(detail)));
    }

    async fn message(&self, message: InboundMessage) -> bool {
        let Some(remote) = message.attachment.clone() else {
            return self.take(message, Vec::new()).await;
        };
        if !self.admitted(&message).await {
            return true;
        }
        let this = self.clone();
        self.tracker.spawn(async move {
            let id = message.id.clone();
            let acked = tokio::select! {
                () = this.shutdown.cancelled() => false,
                acked = this.take_attachment(message, remote) => acked,
            };
            if acked {
                this.link.ack(&id);
            }
        });
        // Acked by the task once the router has it.
        false
    }
}

impl Service {
    fn is_me(&self, sender: &str) -> bool {
        self.me
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .as_deref()
            .is_some_and(|me| me.eq_ignore_ascii_case(sender))
    }

    /// Whether a message may start a run: a plain conversation id, not the
    /// bridge's own, an allowed sender, a bound conversation if that is
    /// required, and not answered before. `false`: the bridge may forget it.
    async fn admitted(&self, message: &InboundMessage) -> bool {
        if !is_conversation_id(&message.conversation_id) {
            tracing::warn!(
                conversation = %log_text::escape(&message.conversation_id),
                "an XMTP message with a malformed conversation id; skipped"
            );
            return false;
        }
        if self.is_me(&message.sender) {
            return false;
        }
        let listed = self.config.sender_listed(&message.sender, message.sender_address.as_deref());
        if !self.access.check(listed, "sender", &message.sender, "allowed_senders") {
            return false;
        }
        if self.config.deny_unbound && !self.bound.contains(&message.conversation_id) {
            tracing::info!(
                conversation = %message.conversation_id,
                "an XMTP message in a conversation without a binding; no run"
            );
            return false;
        }
        let run_id = run_id(&message.id);
        let seen = self.store.kv_get(SEEN_NS, run_id.as_str(), now_ms()).await;
        let owed = self.store.kv_get(DELIVERY_NS, run_id.as_str(), now_ms()).await;
        !(matches!(seen, Ok(Some(_))) || matches!(owed, Ok(Some(_))))
    }

    /// Fetches, checks and keeps a remote attachment, then takes its message
    /// with it (no text: [`media::FILES_ONLY_PROMPT`]); a refusal is answered
    /// in the conversation. `true` when the bridge may forget the message.
    async fn take_attachment(
        &self,
        message: InboundMessage,
        remote: Box<RemoteAttachment>,
    ) -> bool {
        let files = &self.config.files;
        let kept = if !files.enabled {
            Err(MediaRefusal::Disabled.to_string())
        } else if !files.user_allowed(&message.sender)
            && !message.sender_address.as_deref().is_some_and(|a| files.user_allowed(a))
        {
            Err(MediaRefusal::UserNotAllowed.to_string())
        } else {
            attachment::fetch_open_and_keep(
                &self.fetcher,
                &self.media,
                files,
                &remote,
                "attachment",
            )
            .await
            .map_err(|refusal| refusal.to_string())
        };
        match kept {
            Ok(file) => self.take(message, vec![file]).await,
            Err(reply) => {
                tracing::info!(
                    message = %log_text::escape(&message.id),
                    reply = %log_text::escape(&reply),
                    "an XMTP attachment refused; no run"
                );
                let answer = Outgoing {
                    request_id: format!("{}.refused", run_id(&message.id)),
                    conversation_id: message.conversation_id,
                    text: reply,
                };
                if let Err(error) = self.outbox.send(answer).await {
                    tracing::warn!(%error, "xmtp reply refusing an attachment not sent");
                }
                true
            }
        }
    }

    /// Takes one message with the files kept for it: `true` when the bridge
    /// may forget it.
    async fn take(&self, message: InboundMessage, attachments: Vec<Attachment>) -> bool {
        if message.attachment.is_none() && !self.admitted(&message).await {
            return true;
        }
        let text = message.text.trim();
        let prompt = match (text.is_empty(), attachments.is_empty()) {
            (true, true) => return true,
            (true, false) => media::FILES_ONLY_PROMPT.to_owned(),
            (false, _) => text.to_owned(),
        };
        let run_id = run_id(&message.id);
        let session = session_key(&self.config.agent_id, &message.conversation_id);
        let mut req = RunRequest::new(session.clone(), prompt);
        req.origin = Origin::Channel;
        req.agent_id = Some(self.config.agent_id.clone());
        req.queue_mode = self.config.queue_mode;
        req.engine = self.config.engine.clone();
        req.run_id = Some(run_id.clone());
        req.channel = Some(ChannelRef {
            transport: TRANSPORT_ID.to_owned(),
            chat_id: Some(message.conversation_id.clone()),
            topic_id: None,
        });
        req.meta.insert(
            TRANSPORT_ID.to_owned(),
            json!({
                "message_id": message.id,
                "conversation_id": message.conversation_id,
                "sender": message.sender,
                "sender_address": message.sender_address,
                "sent_at_ms": message.sent_at_ms,
            }),
        );
        lemon_core::media::add_attachments(&mut req.meta, &attachments);
        let is_command = lemon_core::router::resolve::parse_slash_command(&req.prompt).is_some();
        let delivery = Delivery {
            run_id: run_id.to_string(),
            conversation_id: message.conversation_id.clone(),
            failed: None,
        };
        if !is_command {
            self.deliveries.record_durably(&delivery.run_id, &delivery).await;
        }
        match self.router.submit(req).await {
            Ok(Submitted::Command { reply, .. }) => {
                self.media.discard(&attachments);
                if !is_command {
                    self.deliveries.finish(&delivery.run_id).await;
                }
                let outbox = self.outbox.clone();
                let answer = Outgoing {
                    request_id: delivery.run_id.clone(),
                    conversation_id: delivery.conversation_id,
                    text: reply,
                };
                self.tracker.spawn(async move {
                    if let Err(error) = outbox.send(answer).await {
                        tracing::warn!(%error, "xmtp command reply not sent");
                    }
                });
                true
            }
            Ok(Submitted::Run(accepted, _)) if accepted.duplicate => {
                // The first handling (or its recovered delivery) answers it.
                self.media.discard(&attachments);
                self.refusals.accepted(&session);
                true
            }
            Ok(Submitted::Run(_, events)) => {
                self.refusals.accepted(&session);
                let this = self.handle();
                self.tracker.spawn(async move { this.follow(delivery, events).await });
                true
            }
            Err(error) => {
                self.media.discard(&attachments);
                self.deliveries.finish(&delivery.run_id).await;
                tracing::warn!(%error, "xmtp message not accepted");
                if let Some(text) = self.refusals.reply(&session, &error) {
                    let outbox = self.outbox.clone();
                    let answer = Outgoing {
                        request_id: format!("{}.refused", delivery.run_id),
                        conversation_id: delivery.conversation_id,
                        text,
                    };
                    self.tracker.spawn(async move {
                        if let Err(error) = outbox.send(answer).await {
                            tracing::warn!(%error, "xmtp reply to a message not accepted not sent");
                        }
                    });
                }
                false
            }
        }
    }

    /// What a spawned follower holds: the parts of the service it needs.
    fn handle(&self) -> Follower {
        Follower {
            router: self.router.clone(),
            store: self.store.clone(),
            shutdown: self.shutdown.clone(),
            outbox: self.outbox.clone(),
            deliveries: self.deliveries.clone(),
        }
    }

    /// Picks up the answers a stop left unsent.
    async fn recover_deliveries(&self) {
        for (_, delivery) in self.deliveries.recover().await.pending {
            let Some(run_id) = RunId::parse(&delivery.run_id) else { continue };
            let events = self.router.follow(&run_id);
            let this = self.handle();
            self.tracker.spawn(async move { this.follow(delivery, events).await });
        }
    }

    /// Answers runs started elsewhere (the API, cron, another channel's
    /// resume) in an XMTP conversation's session, in that conversation.
    async fn deliver_others(self: Arc<Self>, mut events: lemon_core::bus::Subscription) {
        loop {
            let event = tokio::select! {
                () = self.shutdown.cancelled() => return,
                event = events.recv() => event,
            };
            let event = match event {
                Ok(event) => event,
                Err(lemon_core::bus::RecvError::Lagged(missed)) => {
                    tracing::warn!(missed, "xmtp fell behind the gateway's events");
                    continue;
                }
                Err(lemon_core::bus::RecvError::Closed) => return,
            };
            if !matches!(event.kind, EventKind::RunStarted { .. }) {
                continue;
            }
            let Some(conversation) = conversation_of(&event.session_key) else { continue };
            if self.config.deny_unbound && !self.bound.iter().any(|b| b == conversation) {
                continue;
            }
            let run_id = event.run_id.to_string();
            // The transport's own runs are on record before they are submitted.
            match self.store.kv_get(DELIVERY_NS, &run_id, now_ms()).await {
                Ok(None) => {}
                Ok(Some(_)) => continue,
                Err(error) => {
                    tracing::warn!(run = %run_id, %error, "xmtp delivery records unreadable");
                    continue;
                }
            }
            if matches!(self.store.kv_get(SEEN_NS, &run_id, now_ms()).await, Ok(Some(_))) {
                continue;
            }
            let delivery =
                Delivery { run_id, conversation_id: conversation.to_owned(), failed: None };
            self.deliveries.record(&delivery.run_id, &delivery).await;
            let follower = self.router.follow(&event.run_id);
            let this = self.handle();
            self.tracker.spawn(async move { this.follow(delivery, follower).await });
        }
    }
}

/// Follows one run to its completion and sends the answer.
struct Follower {
    router: RouterHandle,
    store: StoreHandle,
    shutdown: CancellationToken,
    outbox: Outbox<BridgeSink>,
    deliveries: DeliveryRecords<Delivery>,
}

impl Follower {
    async fn follow(self, delivery: Delivery, mut events: RunFollower) {
        let mut started = false;
        let completion = loop {
            let event = tokio::select! {
                () = self.shutdown.cancelled() => return,
                event = events.next() => event,
            };
            // The gateway is stopping; the next start delivers.
            let Some(event) = event else { return };
            started |= event.type_name() == "run_started";
            if let Some(done) = event.completed() {
                if let EventKind::RunCompleted { completion, .. } = &done.kind {
                    break completion.clone();
                }
            }
        };
        self.finish(delivery, &completion, started).await;
    }

    async fn finish(&self, mut delivery: Delivery, completion: &Completion, started: bool) {
        let Some(text) = crate::delivery::plain_answer(&self.router, completion, started) else {
            // Steered into a running job or merged into the next: that job answers.
            self.mark_seen(&delivery.run_id).await;
            self.deliveries.finish(&delivery.run_id).await;
            return;
        };
        let answer = Outgoing {
            request_id: delivery.run_id.clone(),
            conversation_id: delivery.conversation_id.clone(),
            text,
        };
        match self.outbox.send(answer).await {
            Ok(_) => {
                self.mark_seen(&delivery.run_id).await;
                self.deliveries.finish(&delivery.run_id).await;
            }
            // Kept on record: the next start sends it.
            Err(DeliveryError::ShuttingDown) => {}
            Err(error) => {
                tracing::error!(%error, run_id = %delivery.run_id, "xmtp answer not delivered");
                delivery.failed = Some(error.to_string());
                self.mark_seen(&delivery.run_id).await;
                self.deliveries.give_up(&delivery.run_id, &delivery).await;
            }
        }
    }

    async fn mark_seen(&self, run_id: &str) {
        let expires = now_ms() + i64::try_from(SEEN_TTL.as_millis()).unwrap_or(i64::MAX / 2);
        self.store.kv_put(SEEN_NS, run_id, json!(now_ms()), Some(expires)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_key_names_its_conversation_and_nothing_else() {
        let key = session_key("default", "0a1b2c");
        assert_eq!(key.as_str(), "agent:default:xmtp:0a1b2c");
        assert_eq!(conversation_of(&key), Some("0a1b2c"));
        assert_eq!(conversation_of("agent:default:discord:1:dm:2"), None);
        assert_eq!(conversation_of("agent:default:xmtp:a b"), None);
        assert_eq!(conversation_of("agent:default:xmtp:"), None);
    }

    #[test]
    fn conversation_ids_are_plain_ids() {
        assert!(is_conversation_id("d6c2a1f0e9b8c7d6a5b4c3d2e1f00112"));
        for bad in ["", "a:b", "a\nb", "../x", &"a".repeat(129)] {
            assert!(!is_conversation_id(bad), "{bad:?}");
        }
    }

    #[test]
    fn the_same_message_is_the_same_run() {
        assert_eq!(run_id("m-1"), run_id("m-1"));
        assert_ne!(run_id("m-1"), run_id("m-2"));
        assert!(run_id("anything: even \n this").as_str().starts_with("xmtp_"));
    }
}
