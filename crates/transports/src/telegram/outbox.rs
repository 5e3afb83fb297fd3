//! The outbox: every Telegram write call of the bot goes through here, paced so
//! that Telegram never has a reason to flood-ban the bot.
//!
//! - Pacing: at most one call a second per chat (sends and edits alike), at most
//!   20 calls in any minute per group chat (negative ids) and at most 30 calls in
//!   any second overall. Chats take turns, so a busy chat cannot starve the others.
//! - Order: sends to one chat go out in the order they were submitted, one at a
//!   time, and ahead of that chat's pending edits.
//! - Edits: a pending edit of a message is replaced by a newer one; an edit that
//!   would show what the message already shows is skipped without a call; Telegram's
//!   "message is not modified" counts as success.
//! - Errors: a 429 stops all calls to that chat until its `retry_after` has passed,
//!   then the same call is made again. Server and network errors are retried with
//!   exponential backoff. A send (or an edit someone waits for) gets its error back
//!   once its attempts are used up; a progress edit is dropped after a few. Other
//!   refusals fail at once. A group that became a supergroup gets the send at its
//!   new id.
//! - Shutdown: when the token is cancelled, calls already made get a short grace
//!   period to finish and everything not sent yet is answered with
//!   [`DeliveryError::ShuttingDown`], so the caller can keep it. When every handle
//!   is dropped, the outbox delivers what is queued and stops.
//!
//! Time is `tokio::time`, so tests run under paused time.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::stream::FuturesUnordered;
use futures::StreamExt;
use tokio::sync::{mpsc, oneshot};
use tokio::time::{sleep_until, timeout_at, Instant};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::delivery::Backoff;

use super::types::{EditMessageText, FormattedText, Message, SendMessage, TelegramError};

/// The Bot API write calls the outbox makes. The HTTP client implements it; tests
/// use a fake.
#[async_trait]
pub trait BotSender: Send + Sync + 'static {
    /// `sendMessage`.
    async fn send_message(&self, req: &SendMessage) -> Result<Message, TelegramError>;
    /// `editMessageText`.
    async fn edit_message_text(&self, req: &EditMessageText) -> Result<(), TelegramError>;
}

/// Pacing and retry settings. The defaults are Telegram's published limits.
#[derive(Debug, Clone, PartialEq)]
pub struct OutboxConfig {
    /// Least time between the starts of two calls to one chat.
    pub chat_interval: Duration,
    /// Most calls to one group chat within [`group_window`](Self::group_window).
    pub group_max_calls: usize,
    /// The rolling window of the group limit.
    pub group_window: Duration,
    /// Most calls over all chats within [`global_window`](Self::global_window).
    pub global_max_calls: usize,
    /// The rolling window of the overall limit.
    pub global_window: Duration,
    /// Attempts of a send, or of an edit someone waits for, before its error is
    /// returned. 429 answers do not use attempts up: they say when to retry.
    pub send_attempts: u32,
    /// Attempts of a progress edit before it is dropped.
    pub edit_attempts: u32,
    /// Wait after the first server or network error; it doubles with each attempt.
    pub backoff_initial: Duration,
    /// The longest wait between two attempts.
    pub backoff_max: Duration,
    /// How long shutdown waits for the answers of calls already made.
    pub shutdown_grace: Duration,
    /// Requests the handle channel holds before callers wait.
    pub queue_capacity: usize,
    /// No call in the first moments after the start: a restarted gateway does
    /// not know when the previous process last wrote to a chat.
    pub quiet_start: Duration,
}

impl Default for OutboxConfig {
    fn default() -> Self {
        OutboxConfig {
            chat_interval: Duration::from_secs(1),
            group_max_calls: 20,
            group_window: Duration::from_secs(60),
            global_max_calls: 30,
            // 30 a second is Telegram's figure for calls as they arrive; calls
            // leave here up to network jitter apart from how they arrive, so the
            // window has a margin (about 27 calls a second at most).
            global_window: Duration::from_millis(1100),
            send_attempts: 10,
            edit_attempts: 3,
            backoff_initial: Duration::from_secs(1),
            backoff_max: Duration::from_secs(60),
            shutdown_grace: Duration::from_secs(5),
            queue_capacity: 256,
            quiet_start: Duration::from_secs(1),
        }
    }
}

/// Why a message was not delivered.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DeliveryError {
    /// The outbox stopped before the call was made (or answered); the caller
    /// should keep the message to deliver it later.
    #[error("the Telegram outbox is shutting down")]
    ShuttingDown,
    /// Telegram refused the call, or it kept failing until its attempts were used.
    #[error("Telegram call failed after {attempts} attempt(s): {error}")]
    Failed {
        /// Calls made for this request (429 answers not counted).
        attempts: u32,
        /// The last error.
        error: TelegramError,
    },
}

/// What the outbox did so far, for status and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OutboxStats {
    /// Messages sent.
    pub n_sent: u64,
    /// Edits made (including those Telegram found unchanged).
    pub n_edited: u64,
    /// Edits skipped because the message already showed that text.
    pub n_skipped_identical: u64,
    /// Pending edits replaced by a newer edit of the same message.
    pub n_coalesced: u64,
    /// 429 answers whose `retry_after` was waited out.
    pub n_rate_limited: u64,
    /// Calls made again after a server or network error.
    pub n_retries: u64,
    /// Sends and edits given up on.
    pub n_failed: u64,
}

/// Counters shared by the actor (which writes) and handles (which read).
#[derive(Debug, Default)]
struct Counters {
    sent: AtomicU64,
    edited: AtomicU64,
    skipped_identical: AtomicU64,
    coalesced: AtomicU64,
    rate_limited: AtomicU64,
    retries: AtomicU64,
    failed: AtomicU64,
}

impl Counters {
    fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    fn snapshot(&self) -> OutboxStats {
        OutboxStats {
            n_sent: self.sent.load(Ordering::Relaxed),
            n_edited: self.edited.load(Ordering::Relaxed),
            n_skipped_identical: self.skipped_identical.load(Ordering::Relaxed),
            n_coalesced: self.coalesced.load(Ordering::Relaxed),
            n_rate_limited: self.rate_limited.load(Ordering::Relaxed),
            n_retries: self.retries.load(Ordering::Relaxed),
            n_failed: self.failed.load(Ordering::Relaxed),
        }
    }
}

type SendReply = oneshot::Sender<Result<Message, DeliveryError>>;
type EditReply = oneshot::Sender<Result<(), DeliveryError>>;

#[derive(Debug)]
enum OutboxMsg {
    Send { req: SendMessage, reply: SendReply },
    Edit { chat_id: i64, message_id: i64, text: FormattedText, reply: Option<EditReply> },
}

/// The handle to the outbox. Cheap to clone; the outbox stops when the last
/// handle is dropped (after delivering what is queued) or when its token is
/// cancelled.
#[derive(Debug, Clone)]
pub struct OutboxHandle {
    tx: mpsc::Sender<OutboxMsg>,
    counters: Arc<Counters>,
}

impl OutboxHandle {
    /// Starts an outbox that makes its calls through `sender`, on `tracker`.
    pub fn spawn(
        sender: Arc<dyn BotSender>,
        config: OutboxConfig,
        token: CancellationToken,
        tracker: &TaskTracker,
    ) -> Self {
        let (tx, rx) = mpsc::channel(config.queue_capacity.max(1));
        let counters = Arc::new(Counters::default());
        let quiet_start = config.quiet_start;
        let global = CallWindow::new(config.global_max_calls, config.global_window);
        let outbox = Outbox {
            rx,
            sender,
            config,
            token,
            counters: counters.clone(),
            chats: HashMap::new(),
            ring: VecDeque::new(),
            global,
            migrated: HashMap::new(),
            in_flight: FuturesUnordered::new(),
            next_cleanup: Instant::now() + CLEANUP_EVERY,
            quiet_until: Instant::now() + quiet_start,
        };
        tracker.spawn(outbox.run());
        OutboxHandle { tx, counters }
    }

    /// Sends a message and waits until Telegram accepted it.
    ///
    /// # Errors
    /// [`DeliveryError::Failed`] when Telegram refused it or it kept failing,
    /// [`DeliveryError::ShuttingDown`] when the outbox stopped first.
    ///
    /// # Cancel safety
    /// Dropping the future does not withdraw the message: it may still be sent.
    pub async fn send(&self, req: SendMessage) -> Result<Message, DeliveryError> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(OutboxMsg::Send { req, reply })
            .await
            .map_err(|_| DeliveryError::ShuttingDown)?;
        rx.await.map_err(|_| DeliveryError::ShuttingDown)?
    }

    /// Queues an edit of a message and returns without waiting for it. A newer
    /// edit of the same message replaces it if it has not been made yet.
    ///
    /// # Errors
    /// [`DeliveryError::ShuttingDown`] when the outbox has stopped.
    ///
    /// # Cancel safety
    /// Cancel safe: once queued, the edit is made whether or not the future is
    /// polled to the end.
    pub async fn edit(
        &self,
        chat_id: i64,
        message_id: i64,
        text: FormattedText,
    ) -> Result<(), DeliveryError> {
        self.tx
            .send(OutboxMsg::Edit { chat_id, message_id, text, reply: None })
            .await
            .map_err(|_| DeliveryError::ShuttingDown)
    }

    /// Edits a message and waits until it shows `text` (or a newer edit of it).
    /// Meant for the last edit of a progress message. Has the attempts of a send.
    ///
    /// # Errors
    /// [`DeliveryError::Failed`] when Telegram refused the edit or it kept
    /// failing, [`DeliveryError::ShuttingDown`] when the outbox stopped first.
    ///
    /// # Cancel safety
    /// Dropping the future does not withdraw the edit.
    pub async fn edit_and_wait(
        &self,
        chat_id: i64,
        message_id: i64,
        text: FormattedText,
    ) -> Result<(), DeliveryError> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(OutboxMsg::Edit { chat_id, message_id, text, reply: Some(reply) })
            .await
            .map_err(|_| DeliveryError::ShuttingDown)?;
        rx.await.map_err(|_| DeliveryError::ShuttingDown)?
    }

    /// The counters so far.
    pub fn stats(&self) -> OutboxStats {
        self.counters.snapshot()
    }
}

/// How many messages per chat the outbox remembers the text of.
const SHOWN_PER_CHAT: usize = 16;
/// A chat idle for this long is forgotten (its pacing no longer matters).
const FORGET_IDLE_CHAT: Duration = Duration::from_secs(600);
/// How often idle chats are looked for.
const CLEANUP_EVERY: Duration = Duration::from_secs(60);

/// A send waiting for its turn.
#[derive(Debug)]
struct PendingSend {
    req: SendMessage,
    /// Failed attempts so far (429 answers not counted).
    attempts: u32,
    reply: SendReply,
}

/// The newest edit of one message waiting for its turn.
#[derive(Debug)]
struct PendingEdit {
    text: FormattedText,
    attempts: u32,
    /// Callers of `edit_and_wait` for this edit or an older one it replaced.
    waiters: Vec<EditReply>,
}

impl PendingEdit {
    fn answer(self, result: &Result<(), DeliveryError>) {
        for waiter in self.waiters {
            let _ = waiter.send(result.clone());
        }
    }
}

/// The call a chat has in flight.
#[derive(Debug)]
enum InFlight {
    Send(PendingSend),
    Edit { message_id: i64, edit: PendingEdit },
}

/// An "at most `max` calls per `window`" limit: the starts of the calls still
/// inside the rolling window.
#[derive(Debug)]
struct CallWindow {
    starts: VecDeque<Instant>,
    max: usize,
    window: Duration,
}

impl CallWindow {
    fn new(max: usize, window: Duration) -> Self {
        CallWindow { starts: VecDeque::new(), max: max.max(1), window }
    }

    /// When the next call may start: `now`, or once the oldest call leaves the window.
    fn free_at(&mut self, now: Instant) -> Instant {
        while self.starts.front().is_some_and(|&t| t + self.window <= now) {
            self.starts.pop_front();
        }
        match self.starts.front() {
            Some(&oldest) if self.starts.len() >= self.max => oldest + self.window,
            _ => now,
        }
    }

    fn record(&mut self, now: Instant) {
        self.starts.push_back(now);
    }
}

/// One chat's queue and pacing state.
#[derive(Debug)]
struct ChatQueue {
    sends: VecDeque<PendingSend>,
    /// Message ids with a pending edit, in the order their first edit came.
    edit_order: VecDeque<i64>,
    edits: HashMap<i64, PendingEdit>,
    /// At most one call per chat is in flight, which keeps sends in order.
    in_flight: Option<InFlight>,
    /// No call before this: spacing, `retry_after` or backoff.
    not_before: Instant,
    /// For group chats: the calls of the last group window.
    group: Option<CallWindow>,
    /// What recent messages show, oldest first, to skip identical edits.
    shown: VecDeque<(i64, FormattedText)>,
    /// Whether the chat is in the round-robin ring.
    in_ring: bool,
    last_used: Instant,
}

impl ChatQueue {
    /// A chat's queue: no call before `not_before`; groups get their own window.
    fn new(chat_id: i64, now: Instant, not_before: Instant, config: &OutboxConfig) -> Self {
        ChatQueue {
            sends: VecDeque::new(),
            edit_order: VecDeque::new(),
            edits: HashMap::new(),
            in_flight: None,
            not_before: not_before.max(now),
            group: (chat_id < 0)
                .then(|| CallWindow::new(config.group_max_calls, config.group_window)),
            shown: VecDeque::new(),
            in_ring: false,
            last_used: now,
        }
    }

    fn has_work(&self) -> bool {
        !self.sends.is_empty() || !self.edit_order.is_empty()
    }

    fn shown(&self, message_id: i64) -> Option<&FormattedText> {
        self.shown.iter().rev().find(|(id, _)| *id == message_id).map(|(_, text)| text)
    }

    fn remember(&mut self, message_id: i64, text: FormattedText) {
        self.shown.retain(|(id, _)| *id != message_id);
        if self.shown.len() >= SHOWN_PER_CHAT {
            self.shown.pop_front();
        }
        self.shown.push_back((message_id, text));
    }

    fn edit_in_flight(&self, message_id: i64) -> bool {
        matches!(self.in_flight, Some(InFlight::Edit { message_id: id, .. }) if id == message_id)
    }

    /// Answers and drops pending edits that would not change their message.
    fn skip_identical_edits(&mut self, counters: &Counters) {
        let mut i = 0;
        while i < self.edit_order.len() {
            let message_id = self.edit_order[i];
            let identical = self
                .edits
                .get(&message_id)
                .is_some_and(|edit| self.shown(message_id) == Some(&edit.text));
            if identical {
                self.edit_order.remove(i);
                if let Some(edit) = self.edits.remove(&message_id) {
                    Counters::bump(&counters.skipped_identical);
                    edit.answer(&Ok(()));
                }
            } else {
                i += 1;
            }
        }
    }

    /// When this chat may make its next call, given its own limits.
    fn ready_at(&mut self, now: Instant) -> Instant {
        match &mut self.group {
            Some(group) => self.not_before.max(group.free_at(now)),
            None => self.not_before,
        }
    }

    /// Puts a send that has to be made again back at the front.
    fn retry_send(&mut self, send: PendingSend) {
        self.sends.push_front(send);
    }

    /// Puts an edit that has to be made again back at the front, unless a newer
    /// edit of the message came meanwhile: that one wins and takes the waiters.
    fn retry_edit(&mut self, message_id: i64, edit: PendingEdit) {
        match self.edits.get_mut(&message_id) {
            Some(newer) => newer.waiters.extend(edit.waiters),
            None => {
                self.edits.insert(message_id, edit);
                self.edit_order.push_front(message_id);
            }
        }
    }

    fn answer_all(&mut self, error: &DeliveryError) {
        let in_flight = self.in_flight.take();
        let sends = self.sends.drain(..).chain(match in_flight {
            Some(InFlight::Send(send)) => Some(send),
            _ => None,
        });
        for send in sends {
            let _ = send.reply.send(Err(error.clone()));
        }
        for (_, edit) in self.edits.drain() {
            edit.answer(&Err(error.clone()));
        }
        self.edit_order.clear();
    }
}

type CallFuture = Pin<Box<dyn Future<Output = CallDone> + Send>>;

/// The answer to a call, for the chat that made it.
#[derive(Debug)]
struct CallDone {
    chat_id: i64,
    result: CallResult,
}

#[derive(Debug)]
enum CallResult {
    /// Boxed: a message is much larger than the other answers.
    Send(Result<Box<Message>, TelegramError>),
    Edit(Result<(), TelegramError>),
}

/// What to do after a failed call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AfterError {
    /// Try again once the chat's `not_before` has passed.
    Retry,
    /// Give up and report the error.
    GiveUp,
}

/// The outbox actor.
struct Outbox {
    /// Requests from handles; closed when the last handle is dropped.
    rx: mpsc::Receiver<OutboxMsg>,
    sender: Arc<dyn BotSender>,
    config: OutboxConfig,
    token: CancellationToken,
    counters: Arc<Counters>,
    /// Queues and pacing per chat, created by the first request for a chat and
    /// forgotten once it has been idle for [`FORGET_IDLE_CHAT`].
    chats: HashMap<i64, ChatQueue>,
    /// Chats with queued or in-flight work, in turn order. A chat served goes to
    /// the back.
    ring: VecDeque<i64>,
    /// The calls of the last global window.
    global: CallWindow,
    /// Groups that became supergroups: old id → new id. Later sends follow.
    migrated: HashMap<i64, i64>,
    /// Calls waiting for Telegram's answer, at most one per chat. Dropped (and
    /// so cancelled) when the outbox stops.
    in_flight: FuturesUnordered<CallFuture>,
    next_cleanup: Instant,
    /// No chat gets a call before this (see [`OutboxConfig::quiet_start`]).
    quiet_until: Instant,
}

impl Outbox {
    async fn run(mut self) {
        let mut accepting = true;
        loop {
            let wake = self.dispatch(Instant::now());
            if !accepting && self.ring.is_empty() && self.in_flight.is_empty() {
                break;
            }
            tokio::select! {
                biased;
                () = self.token.cancelled() => break,
                Some(done) = self.in_flight.next(), if !self.in_flight.is_empty() => {
                    self.complete(done, Instant::now());
                }
                msg = self.rx.recv(), if accepting => match msg {
                    Some(msg) => self.accept(msg, Instant::now()),
                    None => accepting = false,
                },
                () = sleep_until(wake.unwrap_or_else(Instant::now)), if wake.is_some() => {}
            }
        }
        self.shutdown().await;
    }

    fn chat(&mut self, chat_id: i64, now: Instant) -> &mut ChatQueue {
        let (quiet_until, config) = (self.quiet_until, &self.config);
        self.chats
            .entry(chat_id)
            .or_insert_with(|| ChatQueue::new(chat_id, now, quiet_until, config))
    }

    /// Puts a chat with work in the ring if it is not there yet.
    fn enqueue(&mut self, chat_id: i64) {
        if let Some(chat) = self.chats.get_mut(&chat_id) {
            if !chat.in_ring {
                chat.in_ring = true;
                self.ring.push_back(chat_id);
            }
        }
    }

    fn accept(&mut self, msg: OutboxMsg, now: Instant) {
        match msg {
            OutboxMsg::Send { mut req, reply } => {
                if let Some(&new_id) = self.migrated.get(&req.chat_id) {
                    req.chat_id = new_id;
                }
                let chat_id = req.chat_id;
                self.chat(chat_id, now).sends.push_back(PendingSend { req, attempts: 0, reply });
                self.enqueue(chat_id);
            }
            OutboxMsg::Edit { chat_id, message_id, text, reply } => {
                let (quiet_until, config) = (self.quiet_until, &self.config);
                let chat = self
                    .chats
                    .entry(chat_id)
                    .or_insert_with(|| ChatQueue::new(chat_id, now, quiet_until, config));
                if let Some(pending) = chat.edits.get_mut(&message_id) {
                    pending.text = text;
                    pending.attempts = 0;
                    pending.waiters.extend(reply);
                    Counters::bump(&self.counters.coalesced);
                } else if !chat.edit_in_flight(message_id) && chat.shown(message_id) == Some(&text)
                {
                    Counters::bump(&self.counters.skipped_identical);
                    if let Some(reply) = reply {
                        let _ = reply.send(Ok(()));
                    }
                    return;
                } else {
                    let waiters = reply.into_iter().collect();
                    chat.edits.insert(message_id, PendingEdit { text, attempts: 0, waiters });
                    chat.edit_order.push_back(message_id);
                }
                self.enqueue(chat_id);
            }
        }
    }

    /// Starts every call the limits allow now, chats taking turns. Returns when
    /// the next call may be possible, if any work waits.
    fn dispatch(&mut self, now: Instant) -> Option<Instant> {
        self.forget_idle_chats(now);
        let mut wake: Option<Instant> = None;
        let mut earliest = |at: Instant| wake = Some(wake.map_or(at, |w: Instant| w.min(at)));
        for _ in 0..self.ring.len() {
            let Some(chat_id) = self.ring.pop_front() else { break };
            let Some(chat) = self.chats.get_mut(&chat_id) else { continue };
            if chat.in_flight.is_some() {
                self.ring.push_back(chat_id);
                continue;
            }
            chat.skip_identical_edits(&self.counters);
            if !chat.has_work() {
                chat.in_ring = false;
                continue;
            }
            let ready = chat.ready_at(now);
            if ready > now {
                earliest(ready);
                self.ring.push_back(chat_id);
                continue;
            }
            let free = self.global.free_at(now);
            if free > now {
                earliest(free);
                // This chat keeps its turn: it goes first once the window frees.
                self.ring.push_front(chat_id);
                break;
            }
            let call = self.start_call(chat_id, now);
            self.in_flight.push(call);
            self.global.record(now);
            self.ring.push_back(chat_id);
        }
        wake
    }

    /// Takes the chat's next request (sends first) and makes its call.
    fn start_call(&mut self, chat_id: i64, now: Instant) -> CallFuture {
        let sender = self.sender.clone();
        let interval = self.config.chat_interval;
        let chat = self.chat(chat_id, now);
        chat.not_before = now + interval;
        chat.last_used = now;
        if let Some(group) = &mut chat.group {
            group.record(now);
        }
        if let Some(send) = chat.sends.pop_front() {
            let req = send.req.clone();
            chat.in_flight = Some(InFlight::Send(send));
            return Box::pin(async move {
                let result = sender.send_message(&req).await.map(Box::new);
                CallDone { chat_id, result: CallResult::Send(result) }
            });
        }
        let message_id = chat.edit_order.pop_front().unwrap_or_default();
        let edit = chat.edits.remove(&message_id).unwrap_or_else(|| PendingEdit {
            text: FormattedText::default(),
            attempts: 0,
            waiters: Vec::new(),
        });
        let req = EditMessageText::new(chat_id, message_id, edit.text.clone());
        chat.in_flight = Some(InFlight::Edit { message_id, edit });
        Box::pin(async move {
            let result = sender.edit_message_text(&req).await;
            CallDone { chat_id, result: CallResult::Edit(result) }
        })
    }

    /// Delay before attempt `attempts + 1` after a server or network error.
    fn backoff(&self, attempts: u32) -> Duration {
        Backoff::new(self.config.backoff_initial, self.config.backoff_max).delay(attempts)
    }

    /// Counts the failed attempt (a 429 does not count: it says when to retry),
    /// applies the failure's consequences to the chat's pacing and says whether
    /// the request is worth another attempt.
    fn after_error(
        &mut self,
        chat_id: i64,
        error: &TelegramError,
        attempts: &mut u32,
        max_attempts: u32,
        now: Instant,
    ) -> AfterError {
        if !matches!(error, TelegramError::RetryAfter(_)) {
            *attempts += 1;
        }
        let attempts = *attempts;
        let delay = match error {
            TelegramError::RetryAfter(wait) => {
                Counters::bump(&self.counters.rate_limited);
                *wait
            }
            _ if error.is_retryable() && attempts < max_attempts => {
                Counters::bump(&self.counters.retries);
                self.backoff(attempts)
            }
            _ => return AfterError::GiveUp,
        };
        let chat = self.chat(chat_id, now);
        chat.not_before = chat.not_before.max(now + delay);
        AfterError::Retry
    }

    fn complete(&mut self, done: CallDone, now: Instant) {
        let Some(chat) = self.chats.get_mut(&done.chat_id) else { return };
        // One call per chat is in flight, so it is the one just answered.
        match (chat.in_flight.take(), done.result) {
            (Some(InFlight::Send(send)), CallResult::Send(result)) => {
                self.complete_send(done.chat_id, send, result, now);
            }
            (Some(InFlight::Edit { message_id, edit }), CallResult::Edit(result)) => {
                self.complete_edit(done.chat_id, message_id, edit, result, now);
            }
            (in_flight, _) => {
                tracing::error!(chat_id = done.chat_id, "telegram outbox: answer without its call");
                if let Some(chat) = self.chats.get_mut(&done.chat_id) {
                    chat.in_flight = in_flight;
                }
            }
        }
    }

    fn complete_send(
        &mut self,
        chat_id: i64,
        mut send: PendingSend,
        result: Result<Box<Message>, TelegramError>,
        now: Instant,
    ) {
        let error = match result {
            Ok(message) => {
                Counters::bump(&self.counters.sent);
                let text = FormattedText {
                    text: std::mem::take(&mut send.req.text),
                    entities: std::mem::take(&mut send.req.entities),
                };
                self.chat(chat_id, now).remember(message.message_id, text);
                let _ = send.reply.send(Ok(*message));
                return;
            }
            Err(error) => error,
        };
        if let TelegramError::MigratedTo(new_id) = error {
            if new_id != chat_id {
                self.migrate(chat_id, new_id, send, now);
                return;
            }
        }
        let max_attempts = self.config.send_attempts;
        match self.after_error(chat_id, &error, &mut send.attempts, max_attempts, now) {
            AfterError::Retry => self.chat(chat_id, now).retry_send(send),
            AfterError::GiveUp => {
                Counters::bump(&self.counters.failed);
                tracing::warn!(chat_id, attempts = send.attempts, %error, "telegram send failed");
                let attempts = send.attempts;
                let _ = send.reply.send(Err(DeliveryError::Failed { attempts, error }));
            }
        }
    }

    /// A group became a supergroup: its sends, this one first, go to the new id.
    fn migrate(&mut self, old_id: i64, new_id: i64, send: PendingSend, now: Instant) {
        tracing::info!(old_id, new_id, "telegram chat migrated to a supergroup");
        self.migrated.insert(old_id, new_id);
        let mut moved = self
            .chats
            .get_mut(&old_id)
            .map(|chat| std::mem::take(&mut chat.sends))
            .unwrap_or_default();
        moved.push_front(send);
        for send in &mut moved {
            send.req.chat_id = new_id;
        }
        let target = self.chat(new_id, now);
        moved.append(&mut target.sends);
        target.sends = moved;
        self.enqueue(new_id);
    }

    fn complete_edit(
        &mut self,
        chat_id: i64,
        message_id: i64,
        mut edit: PendingEdit,
        result: Result<(), TelegramError>,
        now: Instant,
    ) {
        let error = match result {
            Ok(()) | Err(TelegramError::NotModified) => {
                Counters::bump(&self.counters.edited);
                let shown = std::mem::take(&mut edit.text);
                self.chat(chat_id, now).remember(message_id, shown);
                edit.answer(&Ok(()));
                return;
            }
            Err(error) => error,
        };
        // Someone waiting for this edit gets the persistence of a send.
        let max_attempts = if edit.waiters.is_empty() {
            self.config.edit_attempts
        } else {
            self.config.send_attempts
        };
        match self.after_error(chat_id, &error, &mut edit.attempts, max_attempts, now) {
            AfterError::Retry => self.chat(chat_id, now).retry_edit(message_id, edit),
            AfterError::GiveUp => {
                let chat = self.chat(chat_id, now);
                if let Some(newer) = chat.edits.get_mut(&message_id) {
                    // A newer edit of the message is queued: it gets its own chance.
                    newer.waiters.append(&mut edit.waiters);
                    return;
                }
                Counters::bump(&self.counters.failed);
                tracing::debug!(chat_id, message_id, %error, "telegram edit dropped");
                let attempts = edit.attempts;
                edit.answer(&Err(DeliveryError::Failed { attempts, error }));
            }
        }
    }

    fn forget_idle_chats(&mut self, now: Instant) {
        if now < self.next_cleanup {
            return;
        }
        self.next_cleanup = now + CLEANUP_EVERY;
        self.chats.retain(|_, chat| {
            chat.in_ring
                || chat.in_flight.is_some()
                || chat.not_before > now
                || chat.last_used + FORGET_IDLE_CHAT > now
        });
    }

    /// Lets calls already made finish within the grace period, then answers
    /// everything else with [`DeliveryError::ShuttingDown`].
    async fn shutdown(mut self) {
        self.rx.close();
        let deadline = Instant::now() + self.config.shutdown_grace;
        while !self.in_flight.is_empty() {
            match timeout_at(deadline, self.in_flight.next()).await {
                Ok(Some(done)) => self.complete(done, Instant::now()),
                Ok(None) | Err(_) => break,
            }
        }
        for chat in self.chats.values_mut() {
            chat.answer_all(&DeliveryError::ShuttingDown);
        }
        while let Ok(msg) = self.rx.try_recv() {
            match msg {
                OutboxMsg::Send { reply, .. } => {
                    let _ = reply.send(Err(DeliveryError::ShuttingDown));
                }
                OutboxMsg::Edit { reply: Some(reply), .. } => {
                    let _ = reply.send(Err(DeliveryError::ShuttingDown));
                }
                OutboxMsg::Edit { reply: None, .. } => {}
            }
        }
    }
}

impl fmt::Debug for Outbox {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Outbox")
            .field("chats", &self.chats.len())
            .field("ring", &self.ring)
            .field("in_flight", &self.in_flight.len())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests;
