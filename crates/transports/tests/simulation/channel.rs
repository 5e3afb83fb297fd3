//! The simulated channel: a chat per session, built the way the real channels
//! are, from the delivery layer. A message is put on record
//! ([`DeliveryRecords`]) before it is submitted; its follower
//! ([`RunFollower`]) is followed to the one answer; the answer
//! ([`plain_answer`]) goes out through the paced [`Outbox`] over a fake
//! destination that fails (transient errors and retry-after answers) when the
//! seed says so; the record is finished once the destination took it. A start
//! recovers what is still on record and delivers it.

use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use lemon_core::ids::RunId;
use lemon_core::router::{RouteError, RouterHandle, RunFollower, RunRequest, Submitted};
use lemon_core::store::StoreHandle;
use lemon_transports::delivery::{
    plain_answer, Backoff, DeliveryError, DeliveryRecord, DeliveryRecords, Failure, Outbox,
    OutboxSettings, Sink,
};

use crate::state::Shared;

pub(crate) const NAMESPACE: &str = "sim.delivery";

/// What the channel still owes, as stored.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Owed {
    run_id: String,
    chat: u8,
    #[serde(default)]
    failed: Option<String>,
}

impl DeliveryRecord for Owed {
    fn given_up(&self) -> bool {
        self.failed.is_some()
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Message {
    chat: u8,
    run_id: String,
    text: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SinkError {
    Unavailable,
    TooMany(u64),
}

impl std::fmt::Display for SinkError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SinkError::Unavailable => f.write_str("503 unavailable"),
            SinkError::TooMany(ms) => write!(f, "429 retry after {ms} ms"),
        }
    }
}

/// The fake destination: takes a message after a latency drawn from the
/// seed, or refuses it while the seed has it failing. What it took is in
/// [`crate::state::World::delivered`].
#[derive(Debug)]
pub(crate) struct Destination {
    shared: Shared,
}

#[async_trait]
impl Sink for Destination {
    type Dest = u8;
    type MessageId = u64;
    type Message = Message;
    type Edit = String;
    type Receipt = u64;
    type Error = SinkError;

    fn destination(&self, message: &Message) -> u8 {
        message.chat
    }

    fn redirect(&self, message: &mut Message, to: &u8) {
        message.chat = *to;
    }

    fn message_id(&self, receipt: &u64) -> u64 {
        *receipt
    }

    fn shown(&self, message: Message) -> Option<String> {
        Some(message.text)
    }

    fn classify(&self, error: &SinkError) -> Failure<u8> {
        match error {
            SinkError::Unavailable => Failure::Transient,
            SinkError::TooMany(ms) => Failure::RetryAfter(Duration::from_millis(*ms)),
        }
    }

    async fn send(&self, message: &Message) -> Result<u64, SinkError> {
        let (latency, refusal) = {
            let mut world = self.shared.lock();
            let latency = world.rng.below(60);
            let left = world.failing.get(&message.chat).copied().unwrap_or(0);
            let refusal = if left > 0 {
                world.failing.insert(message.chat, left - 1);
                Some(if world.rng.chance(50) {
                    SinkError::Unavailable
                } else {
                    SinkError::TooMany(world.rng.below(2000))
                })
            } else {
                None
            };
            world.note(format_args!(
                "send {} to chat {} after {latency} ms: {refusal:?}",
                message.run_id, message.chat
            ));
            (latency, refusal)
        };
        // A call cut off here (the gateway stopped) never reached the chat.
        tokio::time::sleep(Duration::from_millis(latency)).await;
        if let Some(error) = refusal {
            return Err(error);
        }
        let mut world = self.shared.lock();
        world.note(format_args!("delivered {} {:?}", message.run_id, message.text));
        world.delivered.push((message.run_id.clone(), message.text.clone()));
        Ok(world.delivered.len() as u64)
    }

    async fn edit(&self, _dest: &u8, _id: &u64, _edit: &String) -> Result<(), SinkError> {
        Ok(())
    }
}

/// Outbox settings: short pacing and a few attempts, more than the
/// destination ever refuses in a row.
pub(crate) fn outbox_settings() -> OutboxSettings {
    OutboxSettings {
        interval: Duration::from_millis(50),
        overall: None,
        send_attempts: 6,
        edit_attempts: 2,
        backoff: Backoff::new(Duration::from_millis(100), Duration::from_secs(2)),
        shutdown_grace: Duration::from_millis(500),
        queue_capacity: 256,
        quiet_start: Duration::from_millis(200),
    }
}

/// One generation's channel.
#[derive(Debug, Clone)]
pub(crate) struct Channel {
    router: RouterHandle,
    records: DeliveryRecords<Owed>,
    outbox: Outbox<Destination>,
    tracker: TaskTracker,
}

impl Channel {
    pub(crate) fn start(
        shared: &Shared,
        router: RouterHandle,
        store: StoreHandle,
        token: CancellationToken,
        tracker: &TaskTracker,
    ) -> Self {
        let records = DeliveryRecords::new(store, NAMESPACE, Duration::from_secs(24 * 3600));
        let sink = Destination { shared: shared.clone() };
        let outbox = Outbox::spawn(sink, outbox_settings(), token, tracker);
        Channel { router, records, outbox, tracker: tracker.clone() }
    }

    /// Delivers what a previous process left on record.
    pub(crate) async fn recover(&self) {
        for (_, owed) in self.records.recover().await.pending {
            let Some(run_id) = RunId::parse(&owed.run_id) else { continue };
            let follower = self.router.follow(&run_id);
            let channel = self.clone();
            self.tracker.spawn(async move { channel.deliver(owed, follower).await });
        }
    }

    /// The records still owed.
    pub(crate) async fn owed(&self) -> Vec<String> {
        self.records.recover().await.pending.into_iter().map(|(key, _)| key).collect()
    }

    /// A message from chat `chat`: on record, submitted, followed.
    pub(crate) async fn submit(
        &self,
        chat: u8,
        req: RunRequest,
    ) -> Result<lemon_core::router::Accepted, RouteError> {
        let run_id = req.run_id.clone().expect("the channel names its runs");
        let owed = Owed { run_id: run_id.to_string(), chat, failed: None };
        self.records.record_durably(run_id.as_str(), &owed).await;
        match self.router.submit(req).await {
            Ok(Submitted::Run(accepted, follower)) => {
                if !accepted.duplicate {
                    let channel = self.clone();
                    self.tracker.spawn(async move { channel.deliver(owed, follower).await });
                }
                Ok(accepted)
            }
            Ok(Submitted::Command { .. }) => {
                self.records.finish(run_id.as_str()).await;
                panic!("the simulation sends no commands");
            }
            Err(error) => {
                self.records.finish(run_id.as_str()).await;
                Err(error)
            }
        }
    }

    async fn deliver(self, mut owed: Owed, mut follower: RunFollower) {
        let Some(done) = follower.completion().await else { return };
        let lemon_core::bus::EventKind::RunCompleted { completion, .. } = &done.kind else {
            return;
        };
        let text = plain_answer(&self.router, completion, true).unwrap_or_default();
        let message = Message { chat: owed.chat, run_id: owed.run_id.clone(), text };
        match self.outbox.send(message).await {
            Ok(_) => self.records.finish(&owed.run_id).await,
            // Kept on record: the next start delivers it.
            Err(DeliveryError::ShuttingDown) => {}
            Err(DeliveryError::Failed { error, .. }) => {
                owed.failed = Some(error.to_string());
                self.records.give_up(&owed.run_id.clone(), &owed).await;
            }
        }
    }
}
