//! [`EmailTransport`]: mail in (IMAP, the inbound webhook), one conversation
//! per thread through the router, the answer back as a reply in the thread
//! through the shared outbox, on record until it is sent.
//!
//! - A mail is checked before anything else: a mail without exactly one
//!   `From` address, a sender outside `allowed_senders` (unless
//!   `allow_everyone`), a sender not authenticated by the configured
//!   `authserv_id`'s `Authentication-Results` with a domain aligned with the
//!   `From` (when `require_authenticated`, the default) or failing them, an
//!   automatic mail or the gateway's own gets no run and no answer.
//! - Its run id comes from its `Message-ID`, so a mail handed over twice (by
//!   IMAP after a restart, or by IMAP and the webhook) is one run; a mail
//!   already answered is remembered for a while and skipped.
//! - The answer's delivery is recorded before the run is submitted and
//!   finished once the SMTP server took the mail; a restart follows the run
//!   again and sends what is still owed.
//! - A run started elsewhere in a thread's session (a cron job, the API, a
//!   resume from another channel) is mailed as a reply into that thread, to
//!   its correspondent, after the thread's latest mail (kv `email.tail`).
//! - A tool call of a thread's run that waits for the owner is mailed into
//!   the thread ("Allow this? … Reply yes 4821 or no 4821 …"); a mail in the
//!   thread whose first line is `yes 4821` or `no 4821` answers it (only in
//!   that thread, only from an allowed sender) instead of starting a run.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lemon_core::approvals::ApprovalHub;
use lemon_core::bus::EventKind;
use lemon_core::engine::{ActionKind, ActionPhase, Completion};
use lemon_core::ids::RunId;
use lemon_core::log_text;
use lemon_core::media::{Attachment, MediaRefusal, MediaStage};
use lemon_core::router::{ChannelRef, Origin, RouterHandle, RunFollower, RunRequest, Submitted};
use lemon_core::secrets::SecretStore;
use lemon_core::store::StoreHandle;
use lemon_core::transport::{StatusHandle, Transport, TransportContext, TransportError};
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::config::EmailConfig;
use super::imap::{Receive, Watcher};
use super::message::{self, InboundMail, Refusal, SenderCheck, TRANSPORT_ID};
use super::smtp::{OutgoingMail, SmtpSender};
use crate::access::Access;
use crate::ask;
use crate::delivery::{
    Backoff, DeliveryError, DeliveryRecord, DeliveryRecords, Outbox, OutboxSettings, Window,
};
use crate::media;
use crate::refused::{Refusals, StoreNotice};

/// Store namespace of answers not yet sent, keyed by run id.
pub const DELIVERY_NS: &str = "email.delivery";
/// Store namespace of the thread of each known `Message-ID` (hashed).
pub const THREAD_NS: &str = "email.thread";
/// Store namespace of the mails already answered, keyed by run id.
pub const SEEN_NS: &str = "email.seen";
/// Store namespace of each thread's latest mail (what a reply follows), keyed
/// by thread.
pub const TAIL_NS: &str = "email.tail";

/// How long an answer the SMTP server refused stays on record.
const FAILED_DELIVERY_TTL: Duration = Duration::from_secs(7 * 24 * 60 * 60);
/// How long a thread is remembered after its last mail.
const THREAD_TTL: Duration = Duration::from_secs(180 * 24 * 60 * 60);
/// How long an answered mail is remembered (a mailbox re-delivered within it
/// is not answered twice).
const SEEN_TTL: Duration = Duration::from_secs(90 * 24 * 60 * 60);

/// The email transport.
pub struct EmailTransport {
    config: EmailConfig,
    /// The passwords are read from here at every start.
    secrets: Arc<SecretStore>,
}

impl std::fmt::Debug for EmailTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmailTransport").field("from", &self.config.from).finish_non_exhaustive()
    }
}

impl EmailTransport {
    pub fn new(config: EmailConfig, secrets: Arc<SecretStore>) -> Self {
        EmailTransport { config, secrets }
    }
}

/// An answer on its way, as stored until it is sent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Delivery {
    run_id: String,
    /// The reply; its text is filled in when the run completes.
    mail: OutgoingMail,
    /// Set once delivery was given up: what the server said last.
    #[serde(default)]
    failed: Option<String>,
    /// The thread the reply is in, whose latest mail it becomes once sent.
    #[serde(default)]
    thread: Option<String>,
}

/// A thread's latest mail, as a reply to it needs it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct ThreadTail {
    /// The correspondent.
    to: String,
    subject: String,
    /// The `Message-ID` a reply answers.
    in_reply_to: String,
    references: Vec<String>,
}

impl DeliveryRecord for Delivery {
    fn given_up(&self) -> bool {
        self.failed.is_some()
    }
}

/// What became of one incoming mail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Handled {
    /// A run was started (or the mail was a command and answered).
    Accepted(RunId),
    /// The same mail was seen before: nothing new.
    Duplicate(RunId),
    /// No run, for this reason.
    Refused(Refusal),
    /// The router did not take it (shutting down, overloaded).
    NotAccepted(String),
    /// A reply (`yes 4821`) to an approval request of the thread: no run.
    Answered(RunId),
}

#[async_trait]
impl Transport for EmailTransport {
    fn id(&self) -> &str {
        TRANSPORT_ID
    }

    async fn run(&self, ctx: TransportContext) -> Result<(), TransportError> {
        let secrets = self
            .config
            .resolve_secrets(&self.secrets)
            .map_err(|error| TransportError::retryable(error.to_string()))?;
        let smtp_config = self
            .config
            .smtp
            .as_ref()
            .ok_or_else(|| TransportError::fatal("[gateway.email.smtp] is not set"))?;
        let smtp =
            SmtpSender::new(smtp_config, secrets.smtp_password.as_deref(), &self.config.from)
                .map_err(TransportError::fatal)?;
        let stop = ctx.shutdown.child_token();
        let outbox = Outbox::spawn(
            smtp.clone(),
            OutboxSettings {
                interval: Duration::from_millis(500),
                overall: Some(Window::new(60, Duration::from_secs(60))),
                send_attempts: self.config.delivery_attempts,
                edit_attempts: 1,
                backoff: Backoff::new(Duration::from_secs(1), Duration::from_secs(60)),
                shutdown_grace: Duration::from_secs(5),
                queue_capacity: 256,
                quiet_start: Duration::ZERO,
            },
            stop.clone(),
            &ctx.tracker,
        );
        ctx.status.track_backlog(outbox.backlog());
        let access = Access::new(TRANSPORT_ID, self.config.allow_everyone);
        access.warn_at_start();
        let service = Arc::new(Mailer {
            config: self.config.clone(),
            access,
            media: ctx.media.clone(),
            own_address: smtp.sender_address(),
            smtp,
            outbox,
            router: ctx.router.clone(),
            store: ctx.store.clone(),
            tracker: ctx.tracker.clone(),
            shutdown: stop.clone(),
            status: ctx.status.clone(),
            deliveries: DeliveryRecords::new(ctx.store.clone(), DELIVERY_NS, FAILED_DELIVERY_TTL),
            approvals: ctx.approvals.clone(),
            detail: std::sync::OnceLock::new(),
            refusals: Refusals::new(StoreNotice::Kept),
        });
        service.recover_deliveries().await;
        // Subscribed before mail is read, so no run of a thread is missed.
        let others = ctx.router.subscribe_starts();
        let watcher = service.clone();
        ctx.tracker.spawn(async move { watcher.deliver_others(others).await });

        let listener = match (&self.config.inbound_webhook, secrets.webhook_token.clone()) {
            (Some(hook), Some(token)) => {
                let listener = lemon_api::http::bind(&hook.listen).await.map_err(|e| {
                    TransportError::retryable(format!(
                        "could not listen on {} for inbound mail: {e}",
                        hook.listen
                    ))
                })?;
                let local = listener.local_addr().map_err(|e| {
                    TransportError::retryable(format!("inbound mail listener: {e}"))
                })?;
                Some((listener, local, hook.path.clone(), token))
            }
            _ => None,
        };
        let webhook_addr =
            listener.as_ref().map(|(_, local, path, _)| format!("http://{local}{path}"));
        let detail: Detail = {
            let imap = self
                .config
                .imap
                .as_ref()
                .map(|imap| format!("imap:{}@{}/{}", imap.username, imap.host, imap.folder));
            let parts: Vec<String> = imap.into_iter().chain(webhook_addr.clone()).collect();
            let deliveries = service.deliveries.clone();
            let open = service.access.allow_everyone();
            Arc::new(move || {
                let detail = match deliveries.given_up_count() {
                    0 => parts.join(" "),
                    n => format!("{}; {n} answer(s) not delivered (see the log)", parts.join(" ")),
                };
                crate::access::status_detail(detail, open)
            })
        };
        let _ = service.detail.set(detail.clone());
        // With a mailbox to watch, the watcher reports running once it holds
        // its UID cursor: mail that arrives from then on is answered.
        if self.config.imap.is_none() || secrets.imap_password.is_none() {
            ctx.status.running(Some(detail()));
        }
        if let Some(addr) = &webhook_addr {
            tracing::info!(email_webhook = %addr, "inbound mail webhook listening");
        }

        let served = async {
            match listener {
                Some((listener, local, path, token)) => {
                    let router = super::inbound_hook::router(service.clone(), &path, token);
                    lemon_api::serve_with(listener, router, stop.clone(), ctx.http.clone())
                        .await
                        .map_err(|err| {
                            TransportError::retryable(format!(
                                "inbound mail on {local} stopped: {err}"
                            ))
                        })
                }
                None => {
                    stop.cancelled().await;
                    Ok(())
                }
            }
        };
        let watched = async {
            if let (Some(imap), Some(password)) = (&self.config.imap, secrets.imap_password.clone())
            {
                let watcher = Watcher {
                    config: imap.clone(),
                    password,
                    store: ctx.store.clone(),
                    status: ctx.status.clone(),
                    shutdown: stop.clone(),
                    receiver: service.clone(),
                    detail: detail.clone(),
                };
                watcher.run().await;
            }
        };
        let result = tokio::select! {
            result = served => result,
            () = async { watched.await; stop.cancelled().await } => Ok(()),
        };
        stop.cancel();
        result
    }
}

pub(super) struct Mailer {
    config: EmailConfig,
    /// `allowed_senders` or `allow_everyone`; refusals logged once per sender.
    access: Access,
    /// Where attachments wait for their run.
    media: MediaStage,
    /// The address answers come from: mail from it is the gateway's own.
    own_address: String,
    smtp: SmtpSender,
    outbox: Outbox<SmtpSender>,
    router: RouterHandle,
    store: StoreHandle,
    tracker: TaskTracker,
    shutdown: CancellationToken,
    status: StatusHandle,
    deliveries: DeliveryRecords<Delivery>,
    /// Tool calls waiting for the owner, answered by `yes 4821` in the thread.
    approvals: ApprovalHub,
    /// What status shows while serving; set once at start.
    detail: std::sync::OnceLock<Detail>,
    /// Threads told that the store cannot save mail, told once each (the
    /// mail is handed over again, and would be answered at every attempt).
    refusals: Refusals,
}

type Detail = Arc<dyn Fn() -> String + Send + Sync>;

#[async_trait]
impl Receive for Mailer {
    async fn receive(self: Arc<Self>, raw: Vec<u8>) -> bool {
        match message::parse(&raw) {
            Some(mail) => {
                let handled = self.handle(mail).await;
                tracing::debug!(?handled, "mail handled");
                !matches!(handled, Handled::NotAccepted(_))
            }
            None => {
                tracing::warn!(bytes = raw.len(), "a mail that cannot be parsed; skipped");
                true
            }
        }
    }
}

fn now_ms() -> i64 {
    lemon_core::clock::now_ms()
}

fn ttl(duration: Duration) -> Option<i64> {
    Some(now_ms() + i64::try_from(duration.as_millis()).unwrap_or(i64::MAX / 2))
}

impl Mailer {
    /// Why `mail` gets no run, if it gets none.
    fn refusal(&self, mail: &InboundMail) -> Option<Refusal> {
        let Some(from) = &mail.from else { return Some(Refusal::NoSender) };
        if *from == self.own_address {
            return Some(Refusal::OwnMail);
        }
        if mail.automatic {
            return Some(Refusal::Automatic);
        }
        if !self.access.check(self.config.sender_listed(from), "sender", from, "allowed_senders") {
            return Some(Refusal::NotAllowed);
        }
        match message::check_sender(
            &mail.auth,
            from,
            self.config.authserv_id.as_deref(),
            self.config.require_authenticated,
        ) {
            SenderCheck::Trusted => None,
            SenderCheck::Forged => Some(Refusal::Forged),
            SenderCheck::Unauthenticated => Some(Refusal::Unauthenticated),
        }
    }

    /// The thread `mail` belongs to: that of the nearest ancestor the gateway
    /// knows, else the one its headers name.
    async fn thread_of(&self, mail: &InboundMail) -> String {
        for id in message::ancestors(mail) {
            let key = message::thread_id(id);
            if let Ok(Some(value)) = self.store.kv_get(THREAD_NS, &key, now_ms()).await {
                if let Some(thread) = value.as_str() {
                    return thread.to_owned();
                }
            }
        }
        message::thread_id(message::thread_root(mail))
    }

    async fn remember_in_thread(&self, message_id: &str, thread: &str) {
        let key = message::thread_id(message_id);
        self.store.kv_put(THREAD_NS, &key, json!(thread), ttl(THREAD_TTL)).await;
    }

    /// Takes one mail: checks it, and starts its run with its answer on record.
    pub(super) async fn handle(self: &Arc<Self>, mail: InboundMail) -> Handled {
        let run_id = message::run_id(&mail);
        if let Some(refusal) = self.refusal(&mail) {
            tracing::info!(
                from = %log_text::escape(mail.from.as_deref().unwrap_or("?")),
                reason = refusal.as_str(),
                "mail refused; no run"
            );
            return Handled::Refused(refusal);
        }
        let seen = self.store.kv_get(SEEN_NS, run_id.as_str(), now_ms()).await;
        let in_flight = self.store.kv_get(DELIVERY_NS, run_id.as_str(), now_ms()).await;
        if matches!(seen, Ok(Some(_))) || matches!(in_flight, Ok(Some(_))) {
            return Handled::Duplicate(run_id);
        }
        let thread = self.thread_of(&mail).await;
        let Some(session_key) = message::session_key(&self.config.agent_id, &thread) else {
            return Handled::NotAccepted("no session key for the thread".into());
        };
        self.remember_in_thread(&mail.message_id, &thread).await;
        let from = mail.from.clone().unwrap_or_default();
        if let Some((reply, code)) = approval_reply(&mail.text) {
            let answered =
                self.approvals.answer_code(session_key.as_str(), code, reply, &from, TRANSPORT_ID);
            let notice = ask::notice(&answered, reply);
            tracing::info!(?reply, notice = %log_text::escape(&notice), "approval answered by mail");
            let mut references = mail.references.clone();
            references.push(mail.message_id.clone());
            let reply = OutgoingMail {
                to: from,
                subject: message::reply_subject(&mail.subject),
                message_id: self.smtp.new_message_id(run_id.as_str()),
                in_reply_to: Some(mail.message_id.clone()),
                references,
                text: notice,
            };
            self.remember_in_thread(&reply.message_id, &thread).await;
            self.mark_seen(run_id.as_str()).await;
            let outbox = self.outbox.clone();
            self.tracker.spawn(async move {
                if let Err(error) = outbox.send(reply).await {
                    tracing::warn!(%error, "reply to an approval answer not sent");
                }
            });
            return Handled::Answered(run_id);
        }
        let (attachments, not_kept) = self.keep_attachments(&mail, &from).await;
        let prompt = message::prompt(&mail, &not_kept);

        let mut references = mail.references.clone();
        if !references.contains(&mail.message_id) {
            references.push(mail.message_id.clone());
        }
        let reply = OutgoingMail {
            to: from.clone(),
            subject: message::reply_subject(&mail.subject),
            message_id: self.smtp.new_message_id(run_id.as_str()),
            in_reply_to: Some(mail.message_id.clone()),
            references,
            text: String::new(),
        };
        self.remember_in_thread(&reply.message_id, &thread).await;
        self.remember_tail(
            &thread,
            &ThreadTail {
                to: from.clone(),
                subject: reply.subject.clone(),
                in_reply_to: mail.message_id.clone(),
                references: reply.references.clone(),
            },
        )
        .await;

        let mut req = RunRequest::new(session_key.clone(), prompt.clone());
        req.origin = Origin::Channel;
        req.agent_id = Some(self.config.agent_id.clone());
        req.queue_mode = self.config.queue_mode;
        req.engine = self.config.engine.clone();
        req.run_id = Some(run_id.clone());
        req.channel = Some(ChannelRef {
            transport: TRANSPORT_ID.to_owned(),
            chat_id: Some(from.clone()),
            topic_id: Some(thread.clone()),
        });
        if self.config.untrusted {
            lemon_core::untrusted::mark(&mut req.meta, &format!("email from {from}"));
        }
        req.meta.insert(
            TRANSPORT_ID.to_owned(),
            json!({
                "message_id": mail.message_id,
                "from": from,
                "subject": mail.subject,
                "thread": thread,
                "attachments": mail.attachments.iter().map(|a| &a.filename).collect::<Vec<_>>(),
            }),
        );
        lemon_core::media::add_attachments(&mut req.meta, &attachments);
        let is_command = lemon_core::router::resolve::parse_slash_command(&prompt).is_some();
        let delivery = Delivery {
            run_id: run_id.to_string(),
            mail: reply,
            failed: None,
            thread: Some(thread.clone()),
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
                let mut mail = delivery.mail;
                mail.text = reply;
                let outbox = self.outbox.clone();
                self.tracker.spawn(async move {
                    if let Err(error) = outbox.send(mail).await {
                        tracing::warn!(%error, "command reply not sent");
                    }
                });
                Handled::Accepted(run_id)
            }
            Ok(Submitted::Run(accepted, events)) => {
                self.refusals.accepted(&session_key);
                if accepted.duplicate {
                    self.media.discard(&attachments);
                    return Handled::Duplicate(run_id);
                }
                let this = self.clone();
                self.tracker.spawn(async move { this.follow(delivery, events).await });
                Handled::Accepted(run_id)
            }
            Err(error) => {
                self.media.discard(&attachments);
                self.deliveries.finish(&delivery.run_id).await;
                tracing::warn!(%error, "mail not accepted");
                if let Some(text) = self.refusals.reply(&session_key, &error) {
                    let mut mail = delivery.mail;
                    mail.text = text;
                    let outbox = self.outbox.clone();
                    self.tracker.spawn(async move {
                        if let Err(error) = outbox.send(mail).await {
                            tracing::warn!(%error, "reply to a mail not accepted not sent");
                        }
                    });
                }
                Handled::NotAccepted(error.to_string())
            }
        }
    }

    /// Keeps the attachments of a mail from `from` in the stage, each
    /// checked against `[gateway.email.files]` (and `max_attachment_bytes`):
    /// the files kept for the run, and the index of each one not kept with
    /// why (the prompt says so; the mail still gets its run).
    async fn keep_attachments(
        &self,
        mail: &InboundMail,
        from: &str,
    ) -> (Vec<Attachment>, Vec<(usize, String)>) {
        let mut kept = Vec::new();
        let mut not_kept = Vec::new();
        if mail.attachments.is_empty() {
            return (kept, not_kept);
        }
        let files = &self.config.files;
        let refused_all = if !files.enabled {
            Some(MediaRefusal::Disabled)
        } else if !files.user_allowed(from) {
            Some(MediaRefusal::UserNotAllowed)
        } else {
            None
        };
        let mut limits = files.clone();
        limits.max_download_bytes = files.max_download_bytes.min(self.config.max_attachment_bytes);
        for (index, attachment) in mail.attachments.iter().enumerate() {
            if let Some(refusal) = &refused_all {
                not_kept.push((index, refusal.to_string()));
                continue;
            }
            let size = attachment.content.len() as u64;
            if size > limits.max_download_bytes {
                let refusal = MediaRefusal::TooLarge {
                    name: attachment.filename.clone(),
                    bytes: size,
                    max: limits.max_download_bytes,
                };
                not_kept.push((index, refusal.to_string()));
                continue;
            }
            let result = media::keep(
                &self.media,
                &limits,
                attachment.filename.clone(),
                Some(attachment.mime.clone()),
                attachment.content.clone(),
            )
            .await;
            match result {
                Ok(file) => kept.push(file),
                Err(refusal) => {
                    tracing::info!(
                        name = %log_text::escape(&attachment.filename),
                        %refusal,
                        "an attachment of a mail was not kept"
                    );
                    not_kept.push((index, refusal.to_string()));
                }
            }
        }
        (kept, not_kept)
    }

    /// Follows a run to its completion, then sends the answer.
    async fn follow(self: Arc<Self>, delivery: Delivery, mut events: RunFollower) {
        let mut started = false;
        let completion = loop {
            let event = tokio::select! {
                () = self.shutdown.cancelled() => return,
                event = events.next() => event,
            };
            // The gateway is stopping; the next start delivers.
            let Some(event) = event else { return };
            started |= event.type_name() == "run_started";
            if let Some(EventKind::EngineAction(action)) = event.event().map(|e| &e.kind) {
                if action.kind == ActionKind::Approval && action.phase == ActionPhase::Started {
                    self.ask(&delivery, action).await;
                }
            }
            if let Some(done) = event.completed() {
                if let EventKind::RunCompleted { completion, .. } = &done.kind {
                    break completion.clone();
                }
            }
        };
        self.finish(delivery, &completion, started).await;
    }

    /// Mails an approval request of the run into its thread, as a reply
    /// after the mail that started it; a reply to it stays in the thread.
    async fn ask(&self, delivery: &Delivery, action: &lemon_core::engine::Action) {
        let Some(request) = ask::request_of(action) else { return };
        let answer = &delivery.mail;
        let mail = OutgoingMail {
            to: answer.to.clone(),
            subject: answer.subject.clone(),
            message_id: self.smtp.new_message_id(&delivery.run_id),
            in_reply_to: answer.in_reply_to.clone(),
            references: answer.references.clone(),
            text: ask::ask_text_by_reply(&request),
        };
        if let Some(thread) = &delivery.thread {
            self.remember_in_thread(&mail.message_id, thread).await;
        }
        let outbox = self.outbox.clone();
        let approval = request.id.clone();
        self.tracker.spawn(async move {
            if let Err(error) = outbox.send(mail).await {
                tracing::warn!(%error, %approval, "approval request not mailed");
            }
        });
    }

    async fn finish(&self, mut delivery: Delivery, completion: &Completion, started: bool) {
        let Some(text) = crate::delivery::plain_answer(&self.router, completion, started) else {
            // Steered into a running job or merged into the next: that job answers.
            self.mark_seen(&delivery.run_id).await;
            self.deliveries.finish(&delivery.run_id).await;
            return;
        };
        delivery.mail.text = text;
        match self.outbox.send(delivery.mail.clone()).await {
            Ok(_) => {
                if let Some(thread) = &delivery.thread {
                    let sent = &delivery.mail;
                    let mut references = sent.references.clone();
                    references.push(sent.message_id.clone());
                    let tail = ThreadTail {
                        to: sent.to.clone(),
                        subject: sent.subject.clone(),
                        in_reply_to: sent.message_id.clone(),
                        references,
                    };
                    self.remember_tail(thread, &tail).await;
                }
                self.mark_seen(&delivery.run_id).await;
                self.deliveries.finish(&delivery.run_id).await;
            }
            // Kept on record: the next start sends it.
            Err(DeliveryError::ShuttingDown) => {}
            Err(error) => {
                tracing::error!(%error, run_id = %delivery.run_id, "answer not delivered");
                delivery.failed = Some(error.to_string());
                self.mark_seen(&delivery.run_id).await;
                self.deliveries.give_up(&delivery.run_id, &delivery).await;
                if let Some(detail) = self.detail.get() {
                    self.status.running(Some(detail()));
                }
            }
        }
    }

    async fn remember_tail(&self, thread: &str, tail: &ThreadTail) {
        if let Ok(value) = serde_json::to_value(tail) {
            self.store.kv_put(TAIL_NS, thread, value, ttl(THREAD_TTL)).await;
        }
    }

    /// Mails runs started elsewhere (cron, the API, a resume from another
    /// channel) in a thread's session as a reply into that thread.
    async fn deliver_others(self: Arc<Self>, mut events: lemon_core::bus::Subscription) {
        loop {
            let event = tokio::select! {
                () = self.shutdown.cancelled() => return,
                event = events.recv() => event,
            };
            let event = match event {
                Ok(event) => event,
                Err(lemon_core::bus::RecvError::Lagged(missed)) => {
                    tracing::warn!(missed, "email fell behind the gateway's events");
                    continue;
                }
                Err(lemon_core::bus::RecvError::Closed) => return,
            };
            if !matches!(event.kind, EventKind::RunStarted { .. }) {
                continue;
            }
            let Some(thread) = message::thread_of(&event.session_key) else { continue };
            let run_id = event.run_id.to_string();
            // The transport's own runs are on record before they are submitted.
            let owed = self.store.kv_get(DELIVERY_NS, &run_id, now_ms()).await;
            let seen = self.store.kv_get(SEEN_NS, &run_id, now_ms()).await;
            if !matches!(owed, Ok(None)) || matches!(seen, Ok(Some(_))) {
                continue;
            }
            let tail = match self.store.kv_get(TAIL_NS, thread, now_ms()).await {
                Ok(Some(value)) => serde_json::from_value::<ThreadTail>(value).ok(),
                _ => None,
            };
            let Some(tail) = tail else {
                tracing::info!(%thread, run = %run_id, "a run in an email thread the gateway has no mail of; not mailed");
                continue;
            };
            let mail = OutgoingMail {
                to: tail.to,
                subject: tail.subject,
                message_id: self.smtp.new_message_id(&run_id),
                in_reply_to: Some(tail.in_reply_to),
                references: tail.references,
                text: String::new(),
            };
            self.remember_in_thread(&mail.message_id, thread).await;
            let delivery = Delivery { run_id, mail, failed: None, thread: Some(thread.to_owned()) };
            self.deliveries.record(&delivery.run_id, &delivery).await;
            let follower = self.router.follow(&event.run_id);
            let this = self.clone();
            self.tracker.spawn(async move { this.follow(delivery, follower).await });
        }
    }

    async fn mark_seen(&self, run_id: &str) {
        self.store.kv_put(SEEN_NS, run_id, json!(now_ms()), ttl(SEEN_TTL)).await;
    }

    /// Picks up the answers a stop left unsent.
    async fn recover_deliveries(self: &Arc<Self>) {
        for (_, delivery) in self.deliveries.recover().await.pending {
            let Some(run_id) = RunId::parse(&delivery.run_id) else { continue };
            let events = self.router.follow(&run_id);
            let this = self.clone();
            self.tracker.spawn(async move { this.follow(delivery, events).await });
        }
    }
}

/// `yes 4821` / `no 4821` on the first line of a mail's new text (the
/// quoted request below it is already gone): the answer and the code.
fn approval_reply(text: &str) -> Option<(lemon_core::approvals::Reply, &str)> {
    let first = text.lines().map(str::trim).find(|line| !line.is_empty())?;
    ask::parse_text_reply(first)
}
