//! Following one run: its stored events from the start, then live ones, joined
//! by event index with no gap and no repeat, ending with its `run_completed`.
//!
//! A follower subscribes to the run's topic before it reads the store. Every
//! event is queued for the store before it is published, so an event published
//! before the subscription is in that read, and one published after it arrives
//! live. Live events at or below the last index are dropped; a gap in the live
//! indices, a lag or a closed topic is filled from the store. A run that
//! completed before the follower was made ends with its stored completion.
//! Phases (index 0) are hints for UIs and are not followed.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use crate::bus::{BusEvent, EventBus, EventKind, RecvError, Subscription};

use crate::ids::RunId;
use crate::store::{StoreHandle, StoredEvent};

const RUN_COMPLETED: &str = "run_completed";

/// One event of a followed run.
#[derive(Debug, Clone, PartialEq)]
pub enum Followed {
    /// An event as published.
    Event(Arc<BusEvent>),
    /// An event read back from the store (published before the follower
    /// subscribed, or skipped by a lag), in its JSON form.
    Stored(StoredEvent),
    /// The run's `run_completed` read back from the store: typed, and as stored.
    StoredCompletion { event: Arc<BusEvent>, stored: StoredEvent },
}

impl Followed {
    /// 1, 2, 3… over the run's events.
    pub fn index(&self) -> u64 {
        match self {
            Followed::Event(event) | Followed::StoredCompletion { event, .. } => event.index,
            Followed::Stored(event) => event.index,
        }
    }

    /// The event's type name (`run_started`, `delta`, …, `run_completed`).
    pub fn type_name(&self) -> &str {
        match self {
            Followed::Event(event) | Followed::StoredCompletion { event, .. } => {
                event.kind.type_name()
            }
            Followed::Stored(event) => &event.kind,
        }
    }

    /// The event's JSON form, as SSE and the store carry it.
    pub fn to_json(&self) -> serde_json::Value {
        match self {
            Followed::Event(event) => event.to_json(),
            Followed::Stored(event) | Followed::StoredCompletion { stored: event, .. } => {
                event.data.clone()
            }
        }
    }

    /// The typed event: one seen live, and always `run_completed`.
    pub fn event(&self) -> Option<&Arc<BusEvent>> {
        match self {
            Followed::Event(event) | Followed::StoredCompletion { event, .. } => Some(event),
            Followed::Stored(_) => None,
        }
    }

    /// The run's completion, when this is its `run_completed`.
    pub fn completed(&self) -> Option<&Arc<BusEvent>> {
        self.event().filter(|event| matches!(event.kind, EventKind::RunCompleted { .. }))
    }
}

/// Follows one run from its first event to its completion. Made by
/// [`RouterHandle::submit`](super::RouterHandle::submit) for the run it accepted
/// and by [`RouterHandle::follow`](super::RouterHandle::follow) for any run.
#[derive(Debug)]
pub struct RunFollower {
    run_id: RunId,
    live: Subscription,
    store: StoreHandle,
    /// Events ready to hand out, in index order.
    pending: VecDeque<Followed>,
    /// The highest index handed out or queued in `pending`.
    last_index: u64,
    /// The store must be read before the next live event.
    resync: bool,
    /// A live event that showed a gap, handed out after the store read.
    held: Option<Arc<BusEvent>>,
    /// The topic closed: after the next store read nothing more can come.
    closed: bool,
    /// `run_completed` is queued (or nothing more can come).
    finished: bool,
    /// How long the topic may stay quiet before the store is checked for a
    /// completion that never reached it.
    quiet_check: Option<Duration>,
    /// Where to subscribe to a retry that answers instead of the followed run;
    /// `None`: the run's own completion ends the follow, even a retried one.
    retries: Option<EventBus>,
}

impl RunFollower {
    /// A follower over `live`, a subscription to the run's topic. `fresh`: the
    /// subscription was taken before the run could publish anything, so there
    /// is nothing stored to read first.
    pub(crate) fn new(run_id: RunId, live: Subscription, store: StoreHandle, fresh: bool) -> Self {
        RunFollower {
            run_id,
            live,
            store,
            pending: VecDeque::new(),
            last_index: 0,
            resync: !fresh,
            held: None,
            closed: false,
            finished: false,
            quiet_check: None,
            retries: None,
        }
    }

    /// Moves on to the retry when the run fails without an answer and is
    /// retried ([`crate::gateway::retry`]): the failed run's completion is not
    /// handed out, the retry's events follow it, numbered from 1 again, and the
    /// retry's completion ends the follow. [`RunFollower::run_id`] then names
    /// the retry.
    pub(crate) fn following_retries(mut self, bus: EventBus) -> Self {
        self.retries = Some(bus);
        self
    }

    /// Ends the follow at the run's own completion, also when it names a retry
    /// (an API client that follows one run by its id).
    #[must_use]
    pub fn without_retries(mut self) -> Self {
        self.retries = None;
        self
    }

    pub fn run_id(&self) -> &RunId {
        &self.run_id
    }

    /// Skips the events up to and including index `after` (a client that
    /// already has them, as SSE's `Last-Event-ID` says).
    #[must_use]
    pub fn after(mut self, after: u64) -> Self {
        self.last_index = self.last_index.max(after);
        self
    }

    /// Also checks the store whenever the run's topic has been quiet for
    /// `every`, so a completion that was stored but never published is found.
    #[must_use]
    pub fn check_store_when_quiet(mut self, every: Duration) -> Self {
        self.quiet_check = Some(every);
        self
    }

    /// The next event in index order; `None` after `run_completed`, or when the
    /// topic closed and the store holds no completion (the gateway went away).
    ///
    /// # Cancel safety
    /// Cancel safe: an event received before a cancelled store read is kept.
    pub async fn next(&mut self) -> Option<Followed> {
        loop {
            if let Some(event) = self.pending.pop_front() {
                return Some(event);
            }
            if self.finished {
                return None;
            }
            if self.resync {
                self.read_store().await;
                continue;
            }
            let received = match self.quiet_check {
                Some(every) => match tokio::time::timeout(every, self.live.recv()).await {
                    Ok(received) => received,
                    Err(_) => {
                        self.check_finished().await;
                        continue;
                    }
                },
                None => self.live.recv().await,
            };
            match received {
                Ok(event) if event.index == 0 || event.index <= self.last_index => {}
                Ok(event) if event.index == self.last_index + 1 => {
                    self.push(Followed::Event(event));
                }
                Ok(event) => {
                    tracing::debug!(run_id = %self.run_id, index = event.index, "gap in a run's events; reading the store");
                    self.held = Some(event);
                    self.resync = true;
                }
                Err(RecvError::Lagged(skipped)) => {
                    tracing::debug!(run_id = %self.run_id, skipped, "run follower lagged; reading the store");
                    self.resync = true;
                }
                Err(RecvError::Closed) => {
                    self.closed = true;
                    self.resync = true;
                }
            }
        }
    }

    /// Skips to the run's `run_completed`; `None` as for [`RunFollower::next`].
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn completion(&mut self) -> Option<Arc<BusEvent>> {
        while let Some(event) = self.next().await {
            if let Some(completed) = event.completed() {
                return Some(completed.clone());
            }
        }
        None
    }

    /// Queues an event; `false` when it was a completion naming a retry, and
    /// the follower moved on to that retry instead.
    fn push(&mut self, event: Followed) -> bool {
        if self.finished {
            return true;
        }
        let retry = event.completed().and_then(|completed| match &completed.kind {
            EventKind::RunCompleted { completion, .. } => completion.retried_by.clone(),
            _ => None,
        });
        if let (Some(retry), Some(bus)) = (retry, &self.retries) {
            tracing::debug!(run_id = %self.run_id, retry = %retry, "run retried; following the retry");
            self.live = bus.subscribe_run(&retry);
            self.run_id = retry;
            self.last_index = 0;
            self.resync = true;
            self.held = None;
            self.closed = false;
            return false;
        }
        // Also when the caller is already past it: nothing follows `run_completed`.
        self.finished = event.completed().is_some();
        if event.index() > self.last_index {
            self.last_index = event.index();
            self.pending.push_back(event);
        }
        true
    }

    /// Queues the stored events after the last one, then the held live event.
    async fn read_store(&mut self) {
        let read = self.store.run_events(self.run_id.as_str()).await;
        self.resync = false;
        match read {
            Ok(mut events) => {
                events.sort_by_key(|event| event.index);
                for event in events {
                    let followed = if event.kind == RUN_COMPLETED {
                        let typed = stored_completion(&self.run_id, &event);
                        Followed::StoredCompletion { event: typed, stored: event }
                    } else {
                        Followed::Stored(event)
                    };
                    if !self.push(followed) {
                        // Moved on to a retry: it is read from its start.
                        return;
                    }
                }
                if let Some(held) = self.held.take() {
                    self.push(Followed::Event(held));
                }
            }
            Err(error) => {
                tracing::error!(run_id = %self.run_id, %error, "could not read a run's events; no longer following it");
                self.finished = true;
            }
        }
        if self.closed {
            self.finished = true;
        }
    }

    /// A quiet topic usually means a busy engine; if the run has finished, its
    /// last events are in the store.
    async fn check_finished(&mut self) {
        match self.store.get_run(self.run_id.as_str()).await {
            Ok(Some(record)) if !record.status.is_terminal() => {}
            Ok(_) => self.resync = true,
            Err(error) => {
                tracing::error!(run_id = %self.run_id, %error, "could not read a run; no longer following it");
                self.finished = true;
            }
        }
    }
}

/// The typed `run_completed` of a stored one.
fn stored_completion(run_id: &RunId, event: &StoredEvent) -> Arc<BusEvent> {
    let data = &event.data;
    let text = |key: &str| data.get(key).and_then(|v| v.as_str()).map(str::to_owned);
    Arc::new(BusEvent {
        run_id: run_id.clone(),
        session_key: text("session_key").unwrap_or_default().into(),
        index: event.index,
        ts_ms: data.get("ts_ms").and_then(serde_json::Value::as_i64).unwrap_or_default(),
        kind: EventKind::RunCompleted {
            completion: crate::bus::completion_from_json(data),
            engine: text("engine").unwrap_or_default(),
            duration_ms: data.get("duration_ms").and_then(serde_json::Value::as_u64).unwrap_or(0),
        },
    })
}

#[cfg(test)]
mod tests;
