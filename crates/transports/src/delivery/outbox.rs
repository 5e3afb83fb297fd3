//! A paced outbox over a channel's write calls: every send and edit of a
//! channel goes through here, so that the channel stays inside the limits its
//! service publishes and nothing is lost on the way.
//!
//! A channel implements [`Sink`] (its send and edit calls, what its errors
//! mean, which destinations have a cap of their own) and picks its
//! [`OutboxSettings`]; [`Outbox`] does the rest:
//!
//! - Pacing: a least interval between two calls to one destination (sends and
//!   edits alike), counted from the later of the previous call's start and its
//!   answer, so a slow answer cannot bring two calls closer together at the
//!   service than the interval; an optional cap per destination in a
//!   rolling window (the sink says which destinations have one) and an optional
//!   overall cap in a rolling window. Destinations take turns, so a busy one
//!   cannot starve the others.
//! - Order: sends to one destination go out in the order they were submitted,
//!   one at a time, and ahead of that destination's pending edits.
//! - Edits: a pending edit of a message is replaced by a newer one; an edit
//!   that would show what the message already shows is skipped without a call;
//!   an answer the sink classifies as [`Failure::AlreadyShown`] counts as
//!   success.
//! - Errors, as the sink classifies them: [`Failure::RetryAfter`] stops all
//!   calls to that destination until the wait has passed, then the same call is
//!   made again (without using up an attempt); [`Failure::Transient`] is retried
//!   with [`Backoff`]. A send (or an edit someone waits for) gets its error back
//!   once its attempts are used up; a progress edit is dropped after a few.
//!   [`Failure::Fatal`] fails at once. [`Failure::MovedTo`] sends the message,
//!   and every later send to the old destination, to the new one.
//! - Quiet start: no call in the first moments, since a restarted gateway does
//!   not know when the previous process last wrote to a destination.
//! - Shutdown: when the token is cancelled, calls already made get a grace
//!   period to finish and everything not sent yet is answered with
//!   [`DeliveryError::ShuttingDown`], so the caller can keep it. When every
//!   handle is dropped, the outbox delivers what is queued and stops.
//!
//! Time is `tokio::time`, so tests run under paused time.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::future::Future;
use std::hash::Hash;
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

use super::Backoff;
use lemon_core::transport::{Backlog, CallOutcome};

/// "At most `max_calls` calls in any `window`".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// Most calls that may start within the window (at least 1).
    pub max_calls: usize,
    /// The length of the rolling window.
    pub window: Duration,
}

impl Window {
    pub const fn new(max_calls: usize, window: Duration) -> Self {
        Window { max_calls, window }
    }
}

/// What a failed call means, as the channel's [`Sink::classify`] says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure<D> {
    /// The service asks for a pause: no call to this destination before the
    /// wait has passed, then the same call again. Does not use up an attempt.
    RetryAfter(Duration),
    /// Worth another attempt after a backoff (server or network trouble).
    Transient,
    /// For an edit: the message already shows that; counts as success. For a
    /// send it is a refusal like [`Fatal`](Self::Fatal).
    AlreadyShown,
    /// For a send: the destination moved; this send and every later one to the
    /// old destination go to the new one. For an edit it is a refusal (message
    /// ids do not carry over).
    MovedTo(D),
    /// Refused; the same call again will not help.
    Fatal,
}

/// A channel's write calls, as the outbox makes them.
#[async_trait]
pub trait Sink: Send + Sync + 'static {
    /// Where calls go (a chat, a phone number, a channel); pacing is per destination.
    type Dest: Clone + Eq + Hash + fmt::Debug + Send + Sync + 'static;
    /// The id of a sent message, for edits of it.
    type MessageId: Clone + Eq + Hash + fmt::Debug + Send + Sync + 'static;
    /// A message to send; cloned for each attempt.
    type Message: Clone + fmt::Debug + Send + Sync + 'static;
    /// What an edit makes a message show; equal values show the same.
    type Edit: Clone + PartialEq + fmt::Debug + Send + Sync + 'static;
    /// The answer to a successful send.
    type Receipt: fmt::Debug + Send + 'static;
    /// The error of a failed call.
    type Error: Clone + fmt::Debug + fmt::Display + Send + Sync + 'static;

    /// The destination of a message.
    fn destination(&self, message: &Self::Message) -> Self::Dest;
    /// Points a message at another destination (after [`Failure::MovedTo`]).
    fn redirect(&self, message: &mut Self::Message, to: &Self::Dest);
    /// The id of the message a send created.
    fn message_id(&self, receipt: &Self::Receipt) -> Self::MessageId;
    /// What a sent message shows, in an edit's terms, so that an edit to the
    /// same is skipped; `None` when edits of it cannot be compared.
    fn shown(&self, message: Self::Message) -> Option<Self::Edit>;
    /// The cap of calls to this destination in a rolling window, if it has one.
    fn window(&self, _dest: &Self::Dest) -> Option<Window> {
        None
    }
    /// What a failed call means.
    fn classify(&self, error: &Self::Error) -> Failure<Self::Dest>;

    /// Sends a message.
    async fn send(&self, message: &Self::Message) -> Result<Self::Receipt, Self::Error>;
    /// Makes a sent message show `edit`.
    async fn edit(
        &self,
        dest: &Self::Dest,
        message_id: &Self::MessageId,
        edit: &Self::Edit,
    ) -> Result<(), Self::Error>;
}

/// Pacing and retry settings, chosen by the channel.
#[derive(Debug, Clone, PartialEq)]
pub struct OutboxSettings {
    /// Least time between two calls to one destination, from the later of the
    /// previous call's start and its answer.
    pub interval: Duration,
    /// The cap of calls over all destinations, if any.
    pub overall: Option<Window>,
    /// Attempts of a send, or of an edit someone waits for, before its error
    /// is returned. [`Failure::RetryAfter`] answers do not use attempts up.
    pub send_attempts: u32,
    /// Attempts of a progress edit before it is dropped.
    pub edit_attempts: u32,
    /// The waits after [`Failure::Transient`] errors.
    pub backoff: Backoff,
    /// How long shutdown waits for the answers of calls already made.
    pub shutdown_grace: Duration,
    /// Requests the handle channel holds before callers wait.
    pub queue_capacity: usize,
    /// No call in the first moments after the start.
    pub quiet_start: Duration,
}

/// Why a message was not delivered.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DeliveryError<E> {
    /// The outbox stopped before the call was made (or answered); the caller
    /// should keep the message to deliver it later.
    #[error("the outbox is shutting down")]
    ShuttingDown,
    /// The call was refused, or it kept failing until its attempts were used.
    #[error("call failed after {attempts} attempt(s): {error}")]
    Failed {
        /// Calls made for this request (retry-after answers not counted).
        attempts: u32,
        /// The last error.
        error: E,
    },
}

/// What the outbox did so far, for status and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OutboxStats {
    /// Messages sent.
    pub n_sent: u64,
    /// Edits made (including those the service found unchanged).
    pub n_edited: u64,
    /// Edits skipped because the message already showed that.
    pub n_skipped_identical: u64,
    /// Pending edits replaced by a newer edit of the same message.
    pub n_coalesced: u64,
    /// Retry-after answers whose wait was waited out.
    pub n_rate_limited: u64,
    /// Calls made again after a transient error.
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
    /// Sends and edits held, queued or in flight; set by the actor after
    /// each step, read by metrics.
    backlog: Backlog,
}

impl Counters {
    fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Bumps `counter` and counts the call in the backlog metrics read.
    fn tally(&self, counter: &AtomicU64, outcome: CallOutcome) {
        Self::bump(counter);
        self.backlog.count(outcome);
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

type Reply<T, E> = oneshot::Sender<Result<T, DeliveryError<E>>>;
type SendReply<S> = Reply<<S as Sink>::Receipt, <S as Sink>::Error>;
type EditReply<S> = Reply<(), <S as Sink>::Error>;

enum Request<S: Sink> {
    Send { message: S::Message, reply: SendReply<S> },
    Edit { dest: S::Dest, message_id: S::MessageId, edit: S::Edit, reply: Option<EditReply<S>> },
}

/// The handle to an outbox. Cheap to clone; the outbox stops when the last
/// handle is dropped (after delivering what is queued) or when its token is
/// cancelled.
pub struct Outbox<S: Sink> {
    tx: mpsc::Sender<Request<S>>,
    counters: Arc<Counters>,
}

impl<S: Sink> Clone for Outbox<S> {
    fn clone(&self) -> Self {
        Outbox { tx: self.tx.clone(), counters: self.counters.clone() }
    }
}

impl<S: Sink> fmt::Debug for Outbox<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Outbox").field("stats", &self.stats()).finish_non_exhaustive()
    }
}

impl<S: Sink> Outbox<S> {
    /// Starts an outbox that makes its calls through `sink`, on `tracker`.
    pub fn spawn(
        sink: S,
        settings: OutboxSettings,
        token: CancellationToken,
        tracker: &TaskTracker,
    ) -> Self {
        let (tx, rx) = mpsc::channel(settings.queue_capacity.max(1));
        let counters = Arc::new(Counters::default());
        let now = Instant::now();
        let actor = Actor {
            rx,
            sink: Arc::new(sink),
            overall: settings.overall.map(CallWindow::new),
            quiet_until: now + settings.quiet_start,
            settings,
            token,
            counters: counters.clone(),
            queues: HashMap::new(),
            ring: VecDeque::new(),
            moved: HashMap::new(),
            in_flight: FuturesUnordered::new(),
            next_cleanup: now + CLEANUP_EVERY,
        };
        tracker.spawn(actor.run());
        Outbox { tx, counters }
    }

    /// Sends a message and waits until the service accepted it.
    ///
    /// # Errors
    /// [`DeliveryError::Failed`] when it was refused or kept failing,
    /// [`DeliveryError::ShuttingDown`] when the outbox stopped first.
    ///
    /// # Cancel safety
    /// Dropping the future does not withdraw the message: it may still be sent.
    pub async fn send(&self, message: S::Message) -> Result<S::Receipt, DeliveryError<S::Error>> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Request::Send { message, reply })
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
        dest: S::Dest,
        message_id: S::MessageId,
        edit: S::Edit,
    ) -> Result<(), DeliveryError<S::Error>> {
        self.tx
            .send(Request::Edit { dest, message_id, edit, reply: None })
            .await
            .map_err(|_| DeliveryError::ShuttingDown)
    }

    /// Edits a message and waits until it shows `edit` (or a newer edit of it).
    /// Meant for the last edit of a progress message. Has the attempts of a send.
    ///
    /// # Errors
    /// [`DeliveryError::Failed`] when the edit was refused or kept failing,
    /// [`DeliveryError::ShuttingDown`] when the outbox stopped first.
    ///
    /// # Cancel safety
    /// Dropping the future does not withdraw the edit.
    pub async fn edit_and_wait(
        &self,
        dest: S::Dest,
        message_id: S::MessageId,
        edit: S::Edit,
    ) -> Result<(), DeliveryError<S::Error>> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Request::Edit { dest, message_id, edit, reply: Some(reply) })
            .await
            .map_err(|_| DeliveryError::ShuttingDown)?;
        rx.await.map_err(|_| DeliveryError::ShuttingDown)?
    }

    /// The counters so far.
    pub fn stats(&self) -> OutboxStats {
        self.counters.snapshot()
    }

    /// The sends and edits the outbox holds, queued or in flight, kept up to
    /// date for as long as it runs; a transport hands it to
    /// `StatusHandle::track_backlog` for metrics.
    pub fn backlog(&self) -> Backlog {
        self.counters.backlog.clone()
    }
}

/// How many messages per destination the outbox remembers the content of.
const SHOWN_PER_DEST: usize = 16;
/// A destination idle for this long is forgotten (its pacing no longer matters).
const FORGET_IDLE: Duration = Duration::from_secs(600);
/// How often idle destinations are looked for.
const CLEANUP_EVERY: Duration = Duration::from_secs(60);

/// A send waiting for its turn.
struct PendingSend<S: Sink> {
    message: S::Message,
    /// Failed attempts so far (retry-after answers not counted).
    attempts: u32,
    reply: SendReply<S>,
}

/// The newest edit of one message waiting for its turn.
struct PendingEdit<S: Sink> {
    edit: S::Edit,
    attempts: u32,
    /// Callers of `edit_and_wait` for this edit or an older one it replaced.
    waiters: Vec<EditReply<S>>,
}

impl<S: Sink> PendingEdit<S> {
    fn answer(self, result: &Result<(), DeliveryError<S::Error>>) {
        for waiter in self.waiters {
            let _ = waiter.send(result.clone());
        }
    }
}

/// The call a destination has in flight.
enum InFlight<S: Sink> {
    Send(PendingSend<S>),
    Edit { message_id: S::MessageId, edit: PendingEdit<S> },
}

/// A [`Window`] limit: the starts of the calls still inside the rolling window.
#[derive(Debug)]
struct CallWindow {
    starts: VecDeque<Instant>,
    max: usize,
    window: Duration,
}

impl CallWindow {
    fn new(limit: Window) -> Self {
        CallWindow { starts: VecDeque::new(), max: limit.max_calls.max(1), window: limit.window }
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

/// One destination's queue and pacing state.
struct DestQueue<S: Sink> {
    sends: VecDeque<PendingSend<S>>,
    /// Message ids with a pending edit, in the order their first edit came.
    edit_order: VecDeque<S::MessageId>,
    edits: HashMap<S::MessageId, PendingEdit<S>>,
    /// At most one call per destination is in flight, which keeps sends in order.
    in_flight: Option<InFlight<S>>,
    /// No call before this: spacing, retry-after or backoff.
    not_before: Instant,
    /// The destination's own cap, if the sink gave it one.
    window: Option<CallWindow>,
    /// What recent messages show, oldest first, to skip identical edits.
    shown: VecDeque<(S::MessageId, S::Edit)>,
    /// Whether the destination is in the round-robin ring.
    in_ring: bool,
    last_used: Instant,
}

impl<S: Sink> DestQueue<S> {
    fn new(window: Option<Window>, now: Instant, not_before: Instant) -> Self {
        DestQueue {
            sends: VecDeque::new(),
            edit_order: VecDeque::new(),
            edits: HashMap::new(),
            in_flight: None,
            not_before: not_before.max(now),
            window: window.map(CallWindow::new),
            shown: VecDeque::new(),
            in_ring: false,
            last_used: now,
        }
    }

    fn has_work(&self) -> bool {
        !self.sends.is_empty() || !self.edit_order.is_empty()
    }

    fn shown(&self, message_id: &S::MessageId) -> Option<&S::Edit> {
        self.shown.iter().rev().find(|(id, _)| id == message_id).map(|(_, edit)| edit)
    }

    fn remember(&mut self, message_id: S::MessageId, edit: S::Edit) {
        self.shown.retain(|(id, _)| *id != message_id);
        if self.shown.len() >= SHOWN_PER_DEST {
            self.shown.pop_front();
        }
        self.shown.push_back((message_id, edit));
    }

    fn edit_in_flight(&self, message_id: &S::MessageId) -> bool {
        matches!(&self.in_flight, Some(InFlight::Edit { message_id: id, .. }) if id == message_id)
    }

    /// Answers and drops pending edits that would not change their message.
    fn skip_identical_edits(&mut self, counters: &Counters) {
        let mut i = 0;
        while i < self.edit_order.len() {
            let message_id = &self.edit_order[i];
            let identical = self
                .edits
                .get(message_id)
                .is_some_and(|pending| self.shown(message_id) == Some(&pending.edit));
            if identical {
                if let Some(message_id) = self.edit_order.remove(i) {
                    if let Some(pending) = self.edits.remove(&message_id) {
                        Counters::bump(&counters.skipped_identical);
                        pending.answer(&Ok(()));
                    }
                }
            } else {
                i += 1;
            }
        }
    }

    /// When this destination may make its next call, given its own limits.
    fn ready_at(&mut self, now: Instant) -> Instant {
        match &mut self.window {
            Some(window) => self.not_before.max(window.free_at(now)),
            None => self.not_before,
        }
    }

    /// The next request to make (sends first), now in flight.
    fn take_next(&mut self) -> Option<&InFlight<S>> {
        if let Some(send) = self.sends.pop_front() {
            return Some(self.in_flight.insert(InFlight::Send(send)));
        }
        while let Some(message_id) = self.edit_order.pop_front() {
            if let Some(edit) = self.edits.remove(&message_id) {
                return Some(self.in_flight.insert(InFlight::Edit { message_id, edit }));
            }
        }
        None
    }

    /// Puts a send that has to be made again back at the front.
    fn retry_send(&mut self, send: PendingSend<S>) {
        self.sends.push_front(send);
    }

    /// Puts an edit that has to be made again back at the front, unless a newer
    /// edit of the message came meanwhile: that one wins and takes the waiters.
    fn retry_edit(&mut self, message_id: S::MessageId, edit: PendingEdit<S>) {
        match self.edits.get_mut(&message_id) {
            Some(newer) => newer.waiters.extend(edit.waiters),
            None => {
                self.edits.insert(message_id.clone(), edit);
                self.edit_order.push_front(message_id);
            }
        }
    }

    fn answer_all(&mut self, error: &DeliveryError<S::Error>) {
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

type CallFuture<S> = Pin<Box<dyn Future<Output = CallDone<S>> + Send>>;

/// The answer to a call, for the destination that made it.
struct CallDone<S: Sink> {
    dest: S::Dest,
    result: CallResult<S>,
}

enum CallResult<S: Sink> {
    Send(Result<S::Receipt, S::Error>),
    Edit(Result<(), S::Error>),
}

/// What to do after a failed call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AfterError {
    /// Try again once the destination's `not_before` has passed.
    Retry,
    /// Give up and report the error.
    GiveUp,
}

/// The outbox actor.
struct Actor<S: Sink> {
    /// Requests from handles; closed when the last handle is dropped.
    rx: mpsc::Receiver<Request<S>>,
    sink: Arc<S>,
    settings: OutboxSettings,
    token: CancellationToken,
    counters: Arc<Counters>,
    /// Queues and pacing per destination, created by the first request for it
    /// and forgotten once it has been idle for [`FORGET_IDLE`].
    queues: HashMap<S::Dest, DestQueue<S>>,
    /// Destinations with queued or in-flight work, in turn order. A
    /// destination served goes to the back.
    ring: VecDeque<S::Dest>,
    /// The calls of the last overall window.
    overall: Option<CallWindow>,
    /// Destinations that moved: old → new. Later sends follow.
    moved: HashMap<S::Dest, S::Dest>,
    /// Calls waiting for their answer, at most one per destination. Dropped
    /// (and so cancelled) when the outbox stops.
    in_flight: FuturesUnordered<CallFuture<S>>,
    next_cleanup: Instant,
    /// No destination gets a call before this (see [`OutboxSettings::quiet_start`]).
    quiet_until: Instant,
}

impl<S: Sink> Actor<S> {
    async fn run(mut self) {
        let mut accepting = true;
        loop {
            let wake = self.dispatch(Instant::now());
            self.counters.backlog.set(self.held());
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
        let backlog = self.counters.backlog.clone();
        self.shutdown().await;
        backlog.set(0);
    }

    /// Sends and edits queued or in flight; destinations with either are in the ring.
    fn held(&self) -> u64 {
        let held: usize = self
            .ring
            .iter()
            .filter_map(|dest| self.queues.get(dest))
            .map(|queue| {
                queue.sends.len() + queue.edits.len() + usize::from(queue.in_flight.is_some())
            })
            .sum();
        held as u64
    }

    fn queue(&mut self, dest: &S::Dest, now: Instant) -> &mut DestQueue<S> {
        let (sink, quiet_until) = (&self.sink, self.quiet_until);
        self.queues
            .entry(dest.clone())
            .or_insert_with(|| DestQueue::new(sink.window(dest), now, quiet_until))
    }

    /// Puts a destination with work in the ring if it is not there yet.
    fn enqueue(&mut self, dest: &S::Dest) {
        if let Some(queue) = self.queues.get_mut(dest) {
            if !queue.in_ring {
                queue.in_ring = true;
                self.ring.push_back(dest.clone());
            }
        }
    }

    fn accept(&mut self, request: Request<S>, now: Instant) {
        match request {
            Request::Send { mut message, reply } => {
                let mut dest = self.sink.destination(&message);
                if let Some(new_dest) = self.moved.get(&dest) {
                    self.sink.redirect(&mut message, new_dest);
                    dest = new_dest.clone();
                }
                self.queue(&dest, now).sends.push_back(PendingSend { message, attempts: 0, reply });
                self.enqueue(&dest);
            }
            Request::Edit { dest, message_id, edit, reply } => {
                let counters = self.counters.clone();
                let queue = self.queue(&dest, now);
                if let Some(pending) = queue.edits.get_mut(&message_id) {
                    pending.edit = edit;
                    pending.attempts = 0;
                    pending.waiters.extend(reply);
                    Counters::bump(&counters.coalesced);
                } else if !queue.edit_in_flight(&message_id)
                    && queue.shown(&message_id) == Some(&edit)
                {
                    Counters::bump(&counters.skipped_identical);
                    if let Some(reply) = reply {
                        let _ = reply.send(Ok(()));
                    }
                    return;
                } else {
                    let waiters = reply.into_iter().collect();
                    queue
                        .edits
                        .insert(message_id.clone(), PendingEdit { edit, attempts: 0, waiters });
                    queue.edit_order.push_back(message_id);
                }
                self.enqueue(&dest);
            }
        }
    }

    /// Starts every call the limits allow now, destinations taking turns.
    /// Returns when the next call may be possible, if any work waits.
    fn dispatch(&mut self, now: Instant) -> Option<Instant> {
        self.forget_idle(now);
        let mut wake: Option<Instant> = None;
        let mut earliest = |at: Instant| wake = Some(wake.map_or(at, |w: Instant| w.min(at)));
        for _ in 0..self.ring.len() {
            let Some(dest) = self.ring.pop_front() else { break };
            let Some(queue) = self.queues.get_mut(&dest) else { continue };
            if queue.in_flight.is_some() {
                self.ring.push_back(dest);
                continue;
            }
            queue.skip_identical_edits(&self.counters);
            if !queue.has_work() {
                queue.in_ring = false;
                continue;
            }
            let ready = queue.ready_at(now);
            if ready > now {
                earliest(ready);
                self.ring.push_back(dest);
                continue;
            }
            if let Some(overall) = &mut self.overall {
                let free = overall.free_at(now);
                if free > now {
                    earliest(free);
                    // This destination keeps its turn: it goes first once the window frees.
                    self.ring.push_front(dest);
                    break;
                }
            }
            if let Some(call) = self.start_call(&dest, now) {
                self.in_flight.push(call);
                if let Some(overall) = &mut self.overall {
                    overall.record(now);
                }
            }
            self.ring.push_back(dest);
        }
        wake
    }

    /// Takes the destination's next request (sends first) and makes its call.
    fn start_call(&mut self, dest: &S::Dest, now: Instant) -> Option<CallFuture<S>> {
        let sink = self.sink.clone();
        let interval = self.settings.interval;
        let queue = self.queues.get_mut(dest)?;
        let call: CallFuture<S> = match queue.take_next()? {
            InFlight::Send(send) => {
                let (dest, message) = (dest.clone(), send.message.clone());
                Box::pin(async move {
                    let result = sink.send(&message).await;
                    CallDone { dest, result: CallResult::Send(result) }
                })
            }
            InFlight::Edit { message_id, edit } => {
                let (dest, message_id, edit) =
                    (dest.clone(), message_id.clone(), edit.edit.clone());
                Box::pin(async move {
                    let result = sink.edit(&dest, &message_id, &edit).await;
                    CallDone { dest, result: CallResult::Edit(result) }
                })
            }
        };
        queue.not_before = now + interval;
        queue.last_used = now;
        if let Some(window) = &mut queue.window {
            window.record(now);
        }
        Some(call)
    }

    /// Counts the failed attempt (a retry-after does not count: it says when to
    /// retry), applies the failure's consequences to the destination's pacing
    /// and says whether the request is worth another attempt.
    fn after_error(
        &mut self,
        dest: &S::Dest,
        failure: &Failure<S::Dest>,
        attempts: &mut u32,
        max_attempts: u32,
        now: Instant,
    ) -> AfterError {
        let delay = match failure {
            Failure::RetryAfter(wait) => {
                self.counters.tally(&self.counters.rate_limited, CallOutcome::RateLimited);
                *wait
            }
            Failure::Transient if *attempts + 1 < max_attempts => {
                *attempts += 1;
                self.counters.tally(&self.counters.retries, CallOutcome::Retried);
                self.settings.backoff.delay(*attempts)
            }
            _ => {
                *attempts += 1;
                return AfterError::GiveUp;
            }
        };
        let queue = self.queue(dest, now);
        queue.not_before = queue.not_before.max(now + delay);
        AfterError::Retry
    }

    fn complete(&mut self, done: CallDone<S>, now: Instant) {
        let interval = self.settings.interval;
        let Some(queue) = self.queues.get_mut(&done.dest) else { return };
        // The interval counts from the answer too: the service sees a call when it
        // arrives, which a slow connection delays, so two calls started an interval
        // apart can reach it closer together than that.
        queue.not_before = queue.not_before.max(now + interval);
        // One call per destination is in flight, so it is the one just answered.
        match (queue.in_flight.take(), done.result) {
            (Some(InFlight::Send(send)), CallResult::Send(result)) => {
                self.complete_send(&done.dest, send, result, now);
            }
            (Some(InFlight::Edit { message_id, edit }), CallResult::Edit(result)) => {
                self.complete_edit(&done.dest, message_id, edit, result, now);
            }
            (in_flight, _) => {
                tracing::error!(dest = ?done.dest, "outbox: answer without its call");
                if let Some(queue) = self.queues.get_mut(&done.dest) {
                    queue.in_flight = in_flight;
                }
            }
        }
    }

    fn complete_send(
        &mut self,
        dest: &S::Dest,
        mut send: PendingSend<S>,
        result: Result<S::Receipt, S::Error>,
        now: Instant,
    ) {
        let error = match result {
            Ok(receipt) => {
                self.counters.tally(&self.counters.sent, CallOutcome::Sent);
                let message_id = self.sink.message_id(&receipt);
                if let Some(shown) = self.sink.shown(send.message) {
                    self.queue(dest, now).remember(message_id, shown);
                }
                let _ = send.reply.send(Ok(receipt));
                return;
            }
            Err(error) => error,
        };
        let failure = self.sink.classify(&error);
        if let Failure::MovedTo(new_dest) = &failure {
            if new_dest != dest {
                self.move_sends(dest, new_dest.clone(), send, now);
                return;
            }
        }
        let max_attempts = self.settings.send_attempts;
        match self.after_error(dest, &failure, &mut send.attempts, max_attempts, now) {
            AfterError::Retry => self.queue(dest, now).retry_send(send),
            AfterError::GiveUp => {
                self.counters.tally(&self.counters.failed, CallOutcome::Failed);
                tracing::warn!(?dest, attempts = send.attempts, %error, "outbox: send failed");
                let attempts = send.attempts;
                let _ = send.reply.send(Err(DeliveryError::Failed { attempts, error }));
            }
        }
    }

    /// A destination moved: its sends, this one first, go to the new one.
    fn move_sends(&mut self, old: &S::Dest, new: S::Dest, send: PendingSend<S>, now: Instant) {
        tracing::info!(?old, ?new, "outbox: destination moved");
        self.moved.insert(old.clone(), new.clone());
        let mut moved = self
            .queues
            .get_mut(old)
            .map(|queue| std::mem::take(&mut queue.sends))
            .unwrap_or_default();
        moved.push_front(send);
        for send in &mut moved {
            self.sink.redirect(&mut send.message, &new);
        }
        let target = self.queue(&new, now);
        moved.append(&mut target.sends);
        target.sends = moved;
        self.enqueue(&new);
    }

    fn complete_edit(
        &mut self,
        dest: &S::Dest,
        message_id: S::MessageId,
        mut edit: PendingEdit<S>,
        result: Result<(), S::Error>,
        now: Instant,
    ) {
        let (error, failure) = match result {
            Ok(()) => {
                self.edit_made(dest, message_id, edit, now);
                return;
            }
            Err(error) => {
                let failure = self.sink.classify(&error);
                if matches!(failure, Failure::AlreadyShown) {
                    self.edit_made(dest, message_id, edit, now);
                    return;
                }
                (error, failure)
            }
        };
        // Someone waiting for this edit gets the persistence of a send.
        let max_attempts = if edit.waiters.is_empty() {
            self.settings.edit_attempts
        } else {
            self.settings.send_attempts
        };
        // A move is about sends; an edit of a message at the old place fails.
        let failure = match failure {
            Failure::MovedTo(_) => Failure::Fatal,
            failure => failure,
        };
        match self.after_error(dest, &failure, &mut edit.attempts, max_attempts, now) {
            AfterError::Retry => self.queue(dest, now).retry_edit(message_id, edit),
            AfterError::GiveUp => {
                let queue = self.queue(dest, now);
                if let Some(newer) = queue.edits.get_mut(&message_id) {
                    // A newer edit of the message is queued: it gets its own chance.
                    newer.waiters.append(&mut edit.waiters);
                    return;
                }
                self.counters.tally(&self.counters.failed, CallOutcome::Failed);
                tracing::debug!(?dest, ?message_id, %error, "outbox: edit dropped");
                let attempts = edit.attempts;
                edit.answer(&Err(DeliveryError::Failed { attempts, error }));
            }
        }
    }

    /// The message shows the edit now.
    fn edit_made(
        &mut self,
        dest: &S::Dest,
        message_id: S::MessageId,
        edit: PendingEdit<S>,
        now: Instant,
    ) {
        Counters::bump(&self.counters.edited);
        self.queue(dest, now).remember(message_id, edit.edit.clone());
        edit.answer(&Ok(()));
    }

    fn forget_idle(&mut self, now: Instant) {
        if now < self.next_cleanup {
            return;
        }
        self.next_cleanup = now + CLEANUP_EVERY;
        self.queues.retain(|_, queue| {
            queue.in_ring
                || queue.in_flight.is_some()
                || queue.not_before > now
                || queue.last_used + FORGET_IDLE > now
        });
    }

    /// Lets calls already made finish within the grace period, then answers
    /// everything else with [`DeliveryError::ShuttingDown`].
    async fn shutdown(mut self) {
        self.rx.close();
        let deadline = Instant::now() + self.settings.shutdown_grace;
        while !self.in_flight.is_empty() {
            match timeout_at(deadline, self.in_flight.next()).await {
                Ok(Some(done)) => self.complete(done, Instant::now()),
                Ok(None) | Err(_) => break,
            }
        }
        for queue in self.queues.values_mut() {
            queue.answer_all(&DeliveryError::ShuttingDown);
        }
        while let Ok(request) = self.rx.try_recv() {
            match request {
                Request::Send { reply, .. } => {
                    let _ = reply.send(Err(DeliveryError::ShuttingDown));
                }
                Request::Edit { reply: Some(reply), .. } => {
                    let _ = reply.send(Err(DeliveryError::ShuttingDown));
                }
                Request::Edit { reply: None, .. } => {}
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod checks;
#[cfg(test)]
mod tests;
