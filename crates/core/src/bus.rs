//! The event bus: every event of every run, typed, on a per-run topic (`run:<id>`)
//! and on a firehose; the `run_started` events alone on a channel of their own,
//! for the channels that deliver runs started elsewhere in their conversations
//! (they are not woken by every delta, and a burst of deltas cannot push a
//! start out of their buffer).
//!
//! Publishing never waits. A subscriber that falls behind loses the oldest events
//! and is told how many ([`RecvError::Lagged`]); it can resynchronise from the
//! store. Per-run topics exist only while someone listens, so a run nobody watches
//! costs one firehose send per event.
//!
//! In cluster mode a run's events are published on the bus of the node that
//! runs it; another node's followers get them from the store through
//! [`EventBus::relay`], rebuilt by [`BusEvent::from_json`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

use tokio::sync::broadcast;

use crate::engine::{Action, ActionKind, ActionPhase, Completion, ResumeToken, RunError};
use crate::ids::{RunId, SessionKey};

mod json;

pub use json::{artifact_from_json, ActionJson, ArtifactJson, CompletionJson, EventJson};

/// Where a run is, as UIs show it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RunPhase {
    Accepted,
    QueuedInSession,
    WaitingForSlot,
    Dispatched,
    Streaming,
    Completed,
    Failed,
    Aborted,
}

impl RunPhase {
    pub fn as_str(self) -> &'static str {
        match self {
            RunPhase::Accepted => "accepted",
            RunPhase::QueuedInSession => "queued_in_session",
            RunPhase::WaitingForSlot => "waiting_for_slot",
            RunPhase::Dispatched => "dispatched",
            RunPhase::Streaming => "streaming",
            RunPhase::Completed => "completed",
            RunPhase::Failed => "failed",
            RunPhase::Aborted => "aborted",
        }
    }

    pub fn parse(raw: &str) -> Option<Self> {
        [
            RunPhase::Accepted,
            RunPhase::QueuedInSession,
            RunPhase::WaitingForSlot,
            RunPhase::Dispatched,
            RunPhase::Streaming,
            RunPhase::Completed,
            RunPhase::Failed,
            RunPhase::Aborted,
        ]
        .into_iter()
        .find(|phase| phase.as_str() == raw)
    }
}

/// A run's status as the API reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RunStatus {
    Queued,
    Running,
    /// Cancelled (or timed out, or stopped by a shutdown) while running, and
    /// waiting for its engine to let go: the CLI's process group is not reaped yet.
    /// The run still holds its slot and its engine lock.
    Cancelling,
    Completed,
    Failed,
    Cancelled,
}

impl RunStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Queued => "queued",
            RunStatus::Running => "running",
            RunStatus::Cancelling => "cancelling",
            RunStatus::Completed => "completed",
            RunStatus::Failed => "failed",
            RunStatus::Cancelled => "cancelled",
        }
    }

    pub fn parse(raw: &str) -> Option<Self> {
        Some(match raw {
            "queued" => RunStatus::Queued,
            "running" => RunStatus::Running,
            "cancelling" => RunStatus::Cancelling,
            "completed" => RunStatus::Completed,
            "failed" => RunStatus::Failed,
            "cancelled" => RunStatus::Cancelled,
            _ => return None,
        })
    }

    /// The terminal status of a completion.
    pub fn of(completion: &Completion) -> Self {
        match &completion.error {
            _ if completion.ok => RunStatus::Completed,
            Some(error) if error.is_abort() => RunStatus::Cancelled,
            _ => RunStatus::Failed,
        }
    }

    pub fn is_terminal(self) -> bool {
        matches!(self, RunStatus::Completed | RunStatus::Failed | RunStatus::Cancelled)
    }
}

/// What happened.
#[derive(Debug, Clone, PartialEq)]
pub enum EventKind {
    /// The run took its slot and lock and is calling the engine.
    RunStarted {
        engine: String,
        model: Option<String>,
    },
    /// The engine started (and may already know its resume token).
    EngineStarted {
        resume: Option<ResumeToken>,
        title: Option<String>,
        meta: serde_json::Value,
    },
    EngineAction(Action),
    /// A piece of the answer; `seq` is 1, 2, 3… per run.
    Delta {
        seq: u64,
        text: String,
    },
    /// The engine's own completion, before the gateway fills the answer in.
    EngineCompleted(Completion),
    /// The run is over: exactly one per accepted request.
    RunCompleted {
        completion: Completion,
        engine: String,
        duration_ms: u64,
    },
    /// The run moved to another phase.
    Phase(RunPhase),
    /// The run's status changed without it completing (`cancelling`).
    Status(RunStatus),
}

impl EventKind {
    /// The event's type name on the wire (SSE `event:` and the store).
    pub fn type_name(&self) -> &'static str {
        match self {
            EventKind::RunStarted { .. } => "run_started",
            EventKind::EngineStarted { .. } => "engine_started",
            EventKind::EngineAction(_) => "engine_action",
            EventKind::Delta { .. } => "delta",
            EventKind::EngineCompleted(_) => "engine_completed",
            EventKind::RunCompleted { .. } => "run_completed",
            EventKind::Phase(_) => "run_phase",
            EventKind::Status(_) => "run_status",
        }
    }
}

/// One event of one run.
#[derive(Debug, Clone, PartialEq)]
pub struct BusEvent {
    pub run_id: RunId,
    pub session_key: SessionKey,
    /// 1, 2, 3… over all events of the run; lets a reader join stored and live events.
    pub index: u64,
    /// Wall-clock milliseconds.
    pub ts_ms: i64,
    pub kind: EventKind,
}

/// The JSON form of a completion, used by the API, SSE and the store.
pub fn completion_json(completion: &Completion) -> serde_json::Value {
    to_value(CompletionJson(completion))
}

/// The JSON form of an action.
pub fn action_json(action: &Action) -> serde_json::Value {
    to_value(ActionJson(action))
}

/// A JSON form as a `Value`. Every form has string keys and finite or written-as-is
/// numbers, so it always converts.
fn to_value(form: impl serde::Serialize) -> serde_json::Value {
    serde_json::to_value(form).unwrap_or(serde_json::Value::Null)
}

impl BusEvent {
    /// The event's one JSON form, for SSE, callbacks and the store; serialise it
    /// straight to text where no `Value` is needed.
    pub fn json(&self) -> EventJson<'_> {
        EventJson(self)
    }

    /// The event's JSON form as a `Value`.
    pub fn to_json(&self) -> serde_json::Value {
        to_value(self.json())
    }

    /// An event back from its JSON form (as the store keeps it); `None` for
    /// JSON that is not an event of a type this version knows. The error of a
    /// completion comes back as [`RunError::from_stored`] reads it.
    pub fn from_json(value: &serde_json::Value) -> Option<BusEvent> {
        let text = |key: &str| value.get(key).and_then(serde_json::Value::as_str);
        let owned = |key: &str| text(key).map(str::to_owned);
        let kind = match text("type")? {
            "run_started" => {
                EventKind::RunStarted { engine: owned("engine")?, model: owned("model") }
            }
            "engine_started" => EventKind::EngineStarted {
                resume: value.get("resume").and_then(resume_from_json),
                title: owned("title"),
                meta: value.get("meta").cloned().unwrap_or_default(),
            },
            "engine_action" => EventKind::EngineAction(action_from_json(value.get("action")?)?),
            "delta" => EventKind::Delta { seq: value.get("seq")?.as_u64()?, text: owned("text")? },
            "engine_completed" => EventKind::EngineCompleted(completion_from_json(value)),
            "run_completed" => EventKind::RunCompleted {
                completion: completion_from_json(value),
                engine: owned("engine").unwrap_or_default(),
                duration_ms: value.get("duration_ms").and_then(|v| v.as_u64()).unwrap_or(0),
            },
            "run_phase" => EventKind::Phase(RunPhase::parse(text("phase")?)?),
            "run_status" => EventKind::Status(RunStatus::parse(text("status")?)?),
            _ => return None,
        };
        Some(BusEvent {
            run_id: RunId::parse(text("run_id")?)?,
            session_key: text("session_key").unwrap_or_default().into(),
            index: value.get("index")?.as_u64()?,
            ts_ms: value.get("ts_ms").and_then(serde_json::Value::as_i64).unwrap_or(0),
            kind,
        })
    }
}

/// A completion back from its JSON form (the fields of `engine_completed` and
/// `run_completed`); a missing field reads as its empty value.
pub fn completion_from_json(data: &serde_json::Value) -> Completion {
    let text = |key: &str| data.get(key).and_then(|v| v.as_str()).map(str::to_owned);
    let error = match (text("error_code"), text("error")) {
        (Some(code), message) => {
            Some(RunError::from_stored(Some(&code), message.unwrap_or_default()))
        }
        (None, Some(message)) => Some(RunError::Engine { message }),
        (None, None) => None,
    };
    Completion {
        ok: data.get("ok").and_then(serde_json::Value::as_bool).unwrap_or(false),
        answer: text("answer").unwrap_or_default(),
        error,
        resume: data.get("resume").and_then(resume_from_json),
        usage: data.get("usage").cloned().unwrap_or(serde_json::Value::Null),
        artifacts: data
            .get("artifacts")
            .and_then(serde_json::Value::as_array)
            .map(|list| list.iter().filter_map(artifact_from_json).collect())
            .unwrap_or_default(),
        retried_by: text("retried_by").as_deref().and_then(RunId::parse),
    }
}

/// A resume token from `{engine, value}`.
fn resume_from_json(value: &serde_json::Value) -> Option<ResumeToken> {
    let engine = value.get("engine")?.as_str()?;
    let token = value.get("value")?.as_str()?;
    Some(ResumeToken::new(engine, token))
}

/// An action from its JSON form; `None` for a kind or phase this version
/// does not know.
fn action_from_json(value: &serde_json::Value) -> Option<Action> {
    let text = |key: &str| value.get(key).and_then(serde_json::Value::as_str);
    let owned = |key: &str| text(key).map(str::to_owned);
    let kind = [
        ActionKind::Tool,
        ActionKind::Command,
        ActionKind::FileChange,
        ActionKind::WebSearch,
        ActionKind::Subagent,
        ActionKind::Reasoning,
        ActionKind::Note,
        ActionKind::Warning,
        ActionKind::Approval,
    ]
    .into_iter()
    .find(|kind| Some(kind.as_str()) == text("kind"))?;
    let phase = [ActionPhase::Started, ActionPhase::Updated, ActionPhase::Completed]
        .into_iter()
        .find(|phase| Some(phase.as_str()) == text("phase"))?;
    Some(Action {
        id: owned("id")?,
        kind,
        title: owned("title").unwrap_or_default(),
        detail: value.get("detail").cloned().unwrap_or_default(),
        phase,
        ok: value.get("ok").and_then(serde_json::Value::as_bool),
        message: owned("message"),
        level: owned("level"),
        result_meta: value.get("result_meta").cloned().unwrap_or_default(),
    })
}

/// A gateway-wide event that belongs to no run (`config_reloaded`,
/// `config_rejected`), published on the bus's notice channel.
#[derive(Debug, Clone, PartialEq)]
pub struct Notice {
    /// The event's type name on the wire (SSE `event:`).
    pub type_name: &'static str,
    /// Wall-clock milliseconds.
    pub ts_ms: i64,
    /// What the event says, as its JSON fields.
    pub body: serde_json::Map<String, serde_json::Value>,
}

impl Notice {
    /// The notice as JSON: its body with `type` and `ts_ms`.
    pub fn to_json(&self) -> serde_json::Value {
        let mut body = self.body.clone();
        body.insert("type".to_owned(), serde_json::json!(self.type_name));
        body.insert("ts_ms".to_owned(), serde_json::json!(self.ts_ms));
        serde_json::Value::Object(body)
    }
}

/// Why a subscription yielded no event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RecvError {
    /// The subscriber fell behind and `n` events were skipped.
    #[error("subscriber lagged behind by {0} events")]
    Lagged(u64),
    /// No more events will come (the run finished, or the bus is gone).
    #[error("subscription closed")]
    Closed,
}

/// A stream of events from one topic.
#[derive(Debug)]
pub struct Subscription {
    rx: broadcast::Receiver<Arc<BusEvent>>,
    /// For a per-run subscription: the topic to drop when its last listener goes.
    topic: Option<(Weak<BusInner>, RunId)>,
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let Some((inner, run_id)) = self.topic.take() else { return };
        let Some(inner) = inner.upgrade() else { return };
        let mut topics = inner.topics.lock().unwrap_or_else(|e| e.into_inner());
        // This subscription's receiver is still alive here, so "only us" is 1.
        if topics.get(&run_id).is_some_and(|sender| sender.receiver_count() <= 1) {
            topics.remove(&run_id);
            inner.n_topics.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

impl Subscription {
    /// # Errors
    /// [`RecvError::Lagged`] after missed events, [`RecvError::Closed`] at the end.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn recv(&mut self) -> Result<Arc<BusEvent>, RecvError> {
        self.rx.recv().await.map_err(|err| match err {
            broadcast::error::RecvError::Lagged(n) => RecvError::Lagged(n),
            broadcast::error::RecvError::Closed => RecvError::Closed,
        })
    }

    /// The next event if one is already waiting, `None` if not.
    ///
    /// # Errors
    /// As [`Subscription::recv`].
    #[cfg(test)]
    pub(crate) fn try_recv(&mut self) -> Result<Option<Arc<BusEvent>>, RecvError> {
        match self.rx.try_recv() {
            Ok(event) => Ok(Some(event)),
            Err(broadcast::error::TryRecvError::Empty) => Ok(None),
            Err(broadcast::error::TryRecvError::Lagged(n)) => Err(RecvError::Lagged(n)),
            Err(broadcast::error::TryRecvError::Closed) => Err(RecvError::Closed),
        }
    }
}

/// The bus. Cheap to clone; all clones publish to the same subscribers.
#[derive(Debug, Clone)]
pub struct EventBus {
    inner: Arc<BusInner>,
}

#[derive(Debug)]
struct BusInner {
    firehose: broadcast::Sender<Arc<BusEvent>>,
    /// The `run_started` events of the firehose, with as many places.
    starts: broadcast::Sender<Arc<BusEvent>>,
    /// Gateway-wide notices; few, so a small buffer.
    notices: broadcast::Sender<Arc<Notice>>,
    /// Per-run topics, created by the first subscriber and removed when the run
    /// completes. Locked only for a map lookup, never across an await.
    topics: Mutex<HashMap<RunId, broadcast::Sender<Arc<BusEvent>>>>,
    /// Number of entries in `topics`, so publishing skips the lock when nobody
    /// watches a single run.
    n_topics: AtomicUsize,
    topic_capacity: usize,
    /// Every open run's stage stamps.
    timings: crate::timing::Timings,
}

impl Default for EventBus {
    fn default() -> Self {
        EventBus::new(4096, 1024)
    }
}

impl EventBus {
    pub fn new(firehose_capacity: usize, topic_capacity: usize) -> Self {
        let (firehose, _) = broadcast::channel(firehose_capacity.max(1));
        let (starts, _) = broadcast::channel(firehose_capacity.max(1));
        let (notices, _) = broadcast::channel(64);
        EventBus {
            inner: Arc::new(BusInner {
                firehose,
                starts,
                notices,
                topics: Mutex::new(HashMap::new()),
                n_topics: AtomicUsize::new(0),
                topic_capacity: topic_capacity.max(1),
                timings: crate::timing::Timings::default(),
            }),
        }
    }

    /// The stage stamps of every run on this bus ([`crate::timing`]).
    pub fn timings(&self) -> &crate::timing::Timings {
        &self.inner.timings
    }

    /// Every event of every run from now on.
    pub fn subscribe_all(&self) -> Subscription {
        Subscription { rx: self.inner.firehose.subscribe(), topic: None }
    }

    /// Every `run_started` event from now on: one per run, however many
    /// events each run has.
    pub fn subscribe_starts(&self) -> Subscription {
        Subscription { rx: self.inner.starts.subscribe(), topic: None }
    }

    /// Gateway-wide notices from now on.
    pub fn subscribe_notices(&self) -> broadcast::Receiver<Arc<Notice>> {
        self.inner.notices.subscribe()
    }

    /// Publishes a gateway-wide notice; never waits.
    pub fn publish_notice(&self, notice: Notice) {
        let _ = self.inner.notices.send(Arc::new(notice));
    }

    /// Events of one run from now on. The subscription closes after the run's
    /// `run_completed`.
    pub fn subscribe_run(&self, run_id: &RunId) -> Subscription {
        let mut topics = self.inner.topics.lock().unwrap_or_else(|e| e.into_inner());
        let sender = topics.entry(run_id.clone()).or_insert_with(|| {
            self.inner.n_topics.fetch_add(1, Ordering::Relaxed);
            broadcast::channel(self.inner.topic_capacity).0
        });
        Subscription {
            rx: sender.subscribe(),
            topic: Some((Arc::downgrade(&self.inner), run_id.clone())),
        }
    }

    /// Publishes to the firehose and the run's topic; never waits.
    pub fn publish(&self, event: Arc<BusEvent>) {
        if matches!(event.kind, EventKind::RunStarted { .. }) {
            let _ = self.inner.starts.send(event.clone());
        }
        self.send_to_topic(&event);
        let _ = self.inner.firehose.send(event);
    }

    /// Publishes an event of a run another node runs, read back from the
    /// store, to the run's topic alone (the firehose and the starts carry
    /// this node's runs); closes the topic after `run_completed`. Never waits.
    pub fn relay(&self, event: Arc<BusEvent>) {
        self.send_to_topic(&event);
    }

    /// Sends `event` to its run's topic, if anyone listens, and removes the
    /// topic after the run's `run_completed`.
    fn send_to_topic(&self, event: &Arc<BusEvent>) {
        if self.inner.n_topics.load(Ordering::Relaxed) == 0 {
            return;
        }
        let mut topics = self.inner.topics.lock().unwrap_or_else(|e| e.into_inner());
        if matches!(event.kind, EventKind::RunCompleted { .. }) {
            if let Some(sender) = topics.remove(&event.run_id) {
                self.inner.n_topics.fetch_sub(1, Ordering::Relaxed);
                let _ = sender.send(event.clone());
            }
        } else if let Some(sender) = topics.get(&event.run_id) {
            let _ = sender.send(event.clone());
        }
    }

    /// The runs someone is subscribed to ([`EventBus::subscribe_run`]) right now.
    pub fn watched_runs(&self) -> Vec<RunId> {
        if self.inner.n_topics.load(Ordering::Relaxed) == 0 {
            return Vec::new();
        }
        let topics = self.inner.topics.lock().unwrap_or_else(|e| e.into_inner());
        topics.keys().cloned().collect()
    }

    /// Number of live per-run topics (for tests and health).
    pub fn n_topics(&self) -> usize {
        self.inner.n_topics.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests;
