//! Conversations over SMS: a text from an allowed sender is a request in the
//! session `sms:<from>`, and its answer is texted back. A tool call of the
//! run that waits for the owner is texted too ("Allow this? … Reply yes 4821
//! or no 4821 …"), and a reply naming the code answers it instead of starting
//! a run.
//!
//! The delivery is on record (the shared [`DeliveryRecords`], kv namespace
//! `sms.reply`, keyed by run id) before the run is submitted and until every
//! part of the answer has been accepted by Twilio, with the count of parts
//! sent so far: a restart follows the run again and sends only what is still
//! owed, so an answer is neither lost nor texted twice.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use lemon_core::approvals::{ApprovalHub, Reply};
use lemon_core::bus::EventKind;
use lemon_core::engine::{Action, ActionKind, ActionPhase};
use lemon_core::ids::{RunId, SessionKey};
use lemon_core::router::{
    ChannelRef, Origin, RequestFlags, RouterHandle, RunFollower, RunRequest, Submitted,
};
use lemon_transports::ask;
use lemon_transports::delivery::{DeliveryRecord, DeliveryRecords};
use lemon_transports::refused::{Refusals, StoreNotice};
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::media::{InboundMedia, MmsMedia};
use crate::send::{split_body, SmsSendError, SmsSender};

/// Store namespace of the answers still owed.
pub const REPLY_NS: &str = "sms.reply";
/// The transport id, and the channel runs are attributed to.
pub const SMS_TRANSPORT_ID: &str = "sms";
/// How long an answer given up on stays on record.
const GIVEN_UP_TTL: Duration = Duration::from_secs(7 * 24 * 60 * 60);

/// An answer owed to a number.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct ReplyRecord {
    run_id: String,
    to: String,
    /// Parts of the answer Twilio accepted so far.
    #[serde(default)]
    parts_sent: usize,
    #[serde(default)]
    failed: Option<String>,
}

impl DeliveryRecord for ReplyRecord {
    fn given_up(&self) -> bool {
        self.failed.is_some()
    }
}

/// The session of a conversation with `from`.
pub fn session_of(from: &str) -> SessionKey {
    SessionKey::from(format!("sms:{from}"))
}

/// Starts conversations and delivers their answers.
#[derive(Debug, Clone)]
pub(crate) struct Replies {
    pub(crate) router: RouterHandle,
    pub(crate) sender: SmsSender,
    pub(crate) records: DeliveryRecords<ReplyRecord>,
    pub(crate) shutdown: CancellationToken,
    /// Tool calls waiting for the owner's answer, answered by `yes 4821`.
    pub(crate) approvals: ApprovalHub,
    /// Numbers told that the store cannot save messages, told once each.
    pub(crate) refusals: Arc<Refusals>,
    /// Fetches and keeps MMS media; `None` without Twilio credentials.
    pub(crate) media: Option<MmsMedia>,
}

impl Replies {
    pub(crate) fn new(
        router: RouterHandle,
        sender: SmsSender,
        store: lemon_core::store::StoreHandle,
        shutdown: CancellationToken,
        approvals: ApprovalHub,
    ) -> Self {
        Replies {
            router,
            sender,
            records: DeliveryRecords::new(store, REPLY_NS, GIVEN_UP_TTL),
            shutdown,
            approvals,
            refusals: Arc::new(Refusals::new(StoreNotice::SendAgain)),
            media: None,
        }
    }

    /// The same, taking MMS media with `media`.
    pub(crate) fn with_media(mut self, media: Option<MmsMedia>) -> Self {
        self.media = media;
        self
    }

    /// Submits `body` from `from` (an allowed E.164 number) in its session,
    /// with the files of `media` (an MMS), and delivers the answer. Returns
    /// once the answer is out, given up on, or the gateway stops (then the
    /// record stays for the next start). Media that cannot be taken are
    /// answered with why, and no run starts.
    pub(crate) async fn converse(
        &self,
        from: String,
        body: String,
        message_sid: String,
        media: Vec<InboundMedia>,
    ) {
        if let Some((reply, code)) = ask::parse_text_reply(&body).filter(|_| media.is_empty()) {
            self.answer(&from, reply, code).await;
            return;
        }
        let attachments = if media.is_empty() {
            Vec::new()
        } else {
            let received = match &self.media {
                Some(mms) => mms.receive(&from, &media).await,
                None => {
                    Err("files cannot be fetched: the Twilio account SID is not set".to_owned())
                }
            };
            match received {
                Ok(attachments) => attachments,
                Err(reply) => {
                    tracing::info!(n_media = media.len(), "MMS media refused; no run");
                    if let Err(error) = self.sender.send(&from, &reply, None).await {
                        tracing::warn!(%error, "reply to refused MMS media not sent");
                    }
                    return;
                }
            }
        };
        let body = if body.trim().is_empty() && !attachments.is_empty() {
            lemon_transports::media::FILES_ONLY_PROMPT.to_owned()
        } else {
            body
        };
        let run_id = RunId::generate();
        let record = ReplyRecord {
            run_id: run_id.as_str().to_owned(),
            to: from.clone(),
            parts_sent: 0,
            failed: None,
        };
        self.records.record_durably(&record.run_id, &record).await;
        let mut meta = BTreeMap::new();
        meta.insert("sms".to_owned(), json!({ "message_sid": message_sid, "from": from }));
        lemon_core::media::add_attachments(&mut meta, &attachments);
        let session = session_of(&from);
        let req = RunRequest {
            origin: Origin::Channel,
            session_key: session.clone(),
            agent_id: None,
            prompt: body,
            queue_mode: None,
            engine: None,
            resume: None,
            cwd: None,
            model: None,
            flags: RequestFlags::default(),
            meta,
            run_id: Some(run_id),
            channel: Some(ChannelRef {
                transport: SMS_TRANSPORT_ID.to_owned(),
                chat_id: Some(from.clone()),
                topic_id: None,
            }),
        };
        match self.router.submit(req).await {
            Ok(Submitted::Run(_, follower)) => {
                self.refusals.accepted(&session);
                self.deliver(record, follower).await;
            }
            Ok(Submitted::Command { reply, .. }) => {
                self.discard(&attachments);
                self.records.finish(&record.run_id).await;
                if let Err(error) = self.sender.send(&from, &reply, None).await {
                    tracing::warn!(%error, "reply to an SMS command not sent");
                }
            }
            Err(error) => {
                self.discard(&attachments);
                self.records.finish(&record.run_id).await;
                tracing::warn!(%error, "an SMS was not accepted as a request");
                if let Some(text) = self.refusals.reply(&session, &error) {
                    if let Err(error) = self.sender.send(&from, &text, None).await {
                        tracing::warn!(%error, "reply to an SMS not accepted not sent");
                    }
                }
            }
        }
    }

    /// Removes the staged files of a request that got no run.
    fn discard(&self, attachments: &[lemon_core::media::Attachment]) {
        if let Some(media) = &self.media {
            media.stage.discard(attachments);
        }
    }

    /// Texts an approval request of the conversation with `to`, to be
    /// answered by a reply naming its code.
    async fn ask(&self, to: &str, action: &Action) {
        let Some(request) = ask::request_of(action) else { return };
        let text = ask::ask_text_by_reply(&request);
        let session = session_of(to);
        if let Err(error) = self.sender.send(to, &text, Some(session.as_str())).await {
            tracing::warn!(%error, approval = %request.id, "approval request not texted");
        }
    }

    /// A reply `yes 4821` / `no 4821` / `always 4821` from `from`: answers
    /// the request of its conversation with that code and texts back how it
    /// went.
    async fn answer(&self, from: &str, reply: Reply, code: &str) {
        let session = session_of(from);
        let answered =
            self.approvals.answer_code(session.as_str(), code, reply, from, SMS_TRANSPORT_ID);
        let notice = ask::notice(&answered, reply);
        tracing::info!(?reply, notice = %notice, "approval answered by SMS");
        if let Err(error) = self.sender.send(from, &notice, Some(session.as_str())).await {
            tracing::warn!(%error, "reply to an approval answer not sent");
        }
    }

    /// Follows the runs a stop left owing an answer. Returns how many.
    pub(crate) async fn recover(&self, tracker: &tokio_util::task::TaskTracker) -> usize {
        let recovered = self.records.recover().await;
        if recovered.given_up > 0 {
            tracing::warn!(given_up = recovered.given_up, "SMS answers given up on are on record");
        }
        let mut count = 0;
        for (_, record) in recovered.pending {
            let Some(run_id) = RunId::parse(&record.run_id) else { continue };
            let follower = self.router.follow(&run_id);
            let replies = self.clone();
            tracker.spawn(async move { replies.deliver(record, follower).await });
            count += 1;
        }
        count
    }

    /// Texts the run's approval requests as they come, then its answer.
    async fn deliver(&self, mut record: ReplyRecord, mut follower: RunFollower) {
        let event = loop {
            let followed = tokio::select! {
                () = self.shutdown.cancelled() => return,
                followed = follower.next() => followed,
            };
            let Some(followed) = followed else { return };
            let Some(event) = followed.event() else { continue };
            match &event.kind {
                EventKind::EngineAction(action)
                    if action.kind == ActionKind::Approval
                        && action.phase == ActionPhase::Started =>
                {
                    self.ask(&record.to, action).await;
                }
                EventKind::RunCompleted { .. } => break event.clone(),
                _ => {}
            }
        };
        let EventKind::RunCompleted { completion, .. } = &event.kind else { return };
        let text = match (&completion.error, completion.answer.trim()) {
            (_, answer) if !answer.is_empty() => answer.to_owned(),
            (Some(error), _) => format!("Sorry, that did not work: {error}"),
            (None, _) => "(no answer)".to_owned(),
        };
        let session = session_of(&record.to);
        for (index, part) in split_body(&text).iter().enumerate().skip(record.parts_sent) {
            match self.sender.send(&record.to, part, Some(session.as_str())).await {
                Ok(_) => {
                    record.parts_sent = index + 1;
                    self.records.record_durably(&record.run_id, &record).await;
                }
                Err(SmsSendError::ShuttingDown) => return,
                Err(error) => {
                    record.failed = Some(error.to_string());
                    self.records.give_up(&record.run_id, &record).await;
                    return;
                }
            }
        }
        self.records.finish(&record.run_id).await;
    }
}
