//! Durable state: runs, every event of every run, chat state, and small records
//! that channels keep (the `kv` methods: a namespaced key/value table with
//! optional expiry, for idempotency keys, update offsets, pending deliveries).
//!
//! [`StoreHandle`] is what the rest of the gateway holds. Two backends share its
//! interface: [`sqlite`] (one file under `$LEMON_HOME`, WAL, a single writer thread
//! that batches writes into transactions) and [`memory`] (for unit tests and
//! benchmarks). Writes are queued and return once queued; [`StoreBackend::flush`]
//! waits until everything queued before it is durable, and [`StoreBackend::close`]
//! flushes and stops the writer, so nothing a run published is lost on a clean
//! shutdown.

pub mod memory;
pub mod sqlite;
#[cfg(test)]
mod tests;

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;

use crate::bus::{BusEvent, RunStatus};
use crate::engine::{Completion, ResumeToken};
use crate::ids::RunId;

/// Chat state lives this long after its last write unless configured otherwise.
pub const DEFAULT_CHAT_STATE_TTL_MS: i64 = 24 * 60 * 60 * 1000;

/// The most expired `kv` records one read purges, so tidying up stays a small,
/// bounded piece of work however many records expired at once.
pub const KV_PURGE_BATCH: usize = 64;

/// Why a store operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    #[error("store is closed")]
    Closed,
    #[error("could not open store at {path}: {message}")]
    Open { path: String, message: String },
    #[error("store database error: {0}")]
    Database(String),
    #[error("store holds a corrupt record: {0}")]
    Corrupt(String),
}

/// A run as accepted, before it starts.
#[derive(Debug, Clone, PartialEq)]
pub struct NewRun {
    pub run_id: RunId,
    pub session_key: String,
    pub conversation: String,
    pub engine: String,
    pub prompt: String,
    /// Request metadata as given by the caller (JSON object).
    pub meta: serde_json::Value,
    pub created_at_ms: i64,
}

/// The end of a run.
#[derive(Debug, Clone, PartialEq)]
pub struct FinishedRun {
    pub run_id: RunId,
    pub engine: String,
    /// The completion with the answer already filled in from the streamed text.
    pub completion: Completion,
    pub completed_at_ms: i64,
    pub duration_ms: u64,
}

/// A stored run.
#[derive(Debug, Clone, PartialEq)]
pub struct RunRecord {
    pub run_id: String,
    pub session_key: String,
    pub conversation: String,
    pub engine: String,
    pub prompt: String,
    pub meta: serde_json::Value,
    pub status: RunStatus,
    pub answer: Option<String>,
    /// The error's display text (`lock_timeout`, `engine_unavailable: …`, or the engine's message).
    pub error: Option<String>,
    /// The error's stable code.
    pub error_code: Option<String>,
    pub resume: Option<ResumeToken>,
    pub usage: serde_json::Value,
    pub created_at_ms: i64,
    pub started_at_ms: Option<i64>,
    pub completed_at_ms: Option<i64>,
    pub duration_ms: Option<u64>,
}

/// A stored event: its index within the run, type name and JSON body
/// (the same JSON as [`BusEvent::to_json`]).
#[derive(Debug, Clone, PartialEq)]
pub struct StoredEvent {
    pub index: u64,
    pub kind: String,
    pub data: serde_json::Value,
}

/// Which runs to list; newest first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunFilter {
    pub status: Option<RunStatus>,
    pub limit: usize,
}

/// The last engine and resume token of a session, for auto-resume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatState {
    pub last_engine: String,
    pub last_resume_token: String,
    pub updated_at_ms: i64,
    pub expires_at_ms: i64,
}

/// Whether a journaled request reached its engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JournalState {
    /// Accepted, possibly waiting at the gateway, never started.
    Queued,
    /// The gateway started it.
    Started,
}

impl JournalState {
    pub fn as_str(self) -> &'static str {
        match self {
            JournalState::Queued => "queued",
            JournalState::Started => "started",
        }
    }

    pub fn parse(raw: &str) -> Option<Self> {
        match raw {
            "queued" => Some(JournalState::Queued),
            "started" => Some(JournalState::Started),
            _ => None,
        }
    }
}

/// One request the router accepted, with everything needed to submit it again
/// after a crash. It stays in the admission journal until its `run_completed`.
#[derive(Debug, Clone, PartialEq)]
pub struct JournalEntry {
    /// Acceptance order; recovery re-queues in this order.
    pub seq: u64,
    pub run_id: RunId,
    pub session_key: String,
    pub conversation: String,
    pub prompt: String,
    pub engine: String,
    pub resume: Option<ResumeToken>,
    pub cwd: Option<std::path::PathBuf>,
    /// Request metadata (JSON object).
    pub meta: serde_json::Value,
    /// The router's own fields: origin, queue mode, engine choice (JSON object).
    pub route: serde_json::Value,
    pub state: JournalState,
    pub accepted_at_ms: i64,
}

impl JournalEntry {
    /// The run row of an admitted request, shown as queued until it starts.
    pub fn new_run(&self) -> NewRun {
        NewRun {
            run_id: self.run_id.clone(),
            session_key: self.session_key.clone(),
            conversation: self.conversation.clone(),
            engine: self.engine.clone(),
            prompt: self.prompt.clone(),
            meta: self.meta.clone(),
            created_at_ms: self.accepted_at_ms,
        }
    }
}

/// The `kv` namespace of [`ProcessGroupRecord`]s.
pub const PROCESS_GROUPS_NAMESPACE: &str = "process_groups";

/// A process group the gateway started (a CLI run) and has not reaped yet.
/// Written when the group starts and removed once it is reaped; what a start
/// finds left over belonged to a gateway that died without reaping it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessGroupRecord {
    /// The group id: the leader's pid.
    pub pgid: i32,
    /// The leader's start time (clock ticks after boot, `/proc/<pid>/stat` field
    /// 22), so that a pid used again by another process is never taken for it.
    pub start_time: u64,
    /// The leader's session id: every member of the group is in it.
    pub session: i32,
}

impl ProcessGroupRecord {
    fn to_json(self) -> serde_json::Value {
        serde_json::json!({ "pgid": self.pgid, "start_time": self.start_time, "session": self.session })
    }

    fn from_json(value: &serde_json::Value) -> Option<Self> {
        let int = |key: &str| value.get(key).and_then(serde_json::Value::as_i64);
        Some(ProcessGroupRecord {
            pgid: i32::try_from(int("pgid")?).ok()?,
            start_time: value.get("start_time")?.as_u64()?,
            session: i32::try_from(int("session")?).ok()?,
        })
    }
}

/// What a backend implements. Write methods queue and return; read methods see
/// every write queued before them on the same handle.
#[async_trait]
pub trait StoreBackend: Send + Sync + fmt::Debug + 'static {
    async fn insert_run(&self, run: NewRun);
    async fn mark_running(&self, run_id: RunId, engine: String, started_at_ms: i64);
    /// Marks a running run as `cancelling` (it waits for its engine to stop); a
    /// queued or finished run keeps its status.
    async fn mark_cancelling(&self, run_id: RunId);
    async fn append_event(&self, event: Arc<BusEvent>);
    async fn finalize_run(&self, run: FinishedRun);
    async fn get_run(&self, run_id: &str) -> Result<Option<RunRecord>, StoreError>;
    async fn list_runs(&self, filter: RunFilter) -> Result<Vec<RunRecord>, StoreError>;
    async fn run_events(&self, run_id: &str) -> Result<Vec<StoredEvent>, StoreError>;
    /// Writes chat state; `expires_at_ms` is `updated_at_ms` plus the store's TTL.
    async fn put_chat_state(
        &self,
        session_key: &str,
        last_engine: &str,
        last_resume_token: &str,
        now_ms: i64,
    );
    /// Chat state that has not expired at `now_ms`.
    async fn get_chat_state(
        &self,
        session_key: &str,
        now_ms: i64,
    ) -> Result<Option<ChatState>, StoreError>;
    async fn delete_chat_state(&self, session_key: &str);
    /// Writes (or rewrites, by run id) an admission journal entry.
    async fn journal_admit(&self, entry: JournalEntry);
    /// Marks a journaled request as started; unknown ids are ignored.
    async fn journal_mark_started(&self, run_id: &RunId);
    /// Removes a journaled request: its completion is out.
    async fn journal_complete(&self, run_id: &RunId);
    /// Every journal entry, in `seq` order.
    async fn journal_pending(&self) -> Result<Vec<JournalEntry>, StoreError>;
    /// Writes (or overwrites) the record `key` of `namespace`. With `expires_at_ms`
    /// it reads as absent from that moment on and is purged some time later.
    async fn kv_put(
        &self,
        namespace: &str,
        key: &str,
        value: serde_json::Value,
        expires_at_ms: Option<i64>,
    );
    /// The record `key` of `namespace` unless it has expired at `now_ms`.
    ///
    /// # Errors
    /// The store is closed or the record cannot be read.
    async fn kv_get(
        &self,
        namespace: &str,
        key: &str,
        now_ms: i64,
    ) -> Result<Option<serde_json::Value>, StoreError>;
    /// Removes the record; a missing one is not an error.
    async fn kv_delete(&self, namespace: &str, key: &str);
    /// Every record of `namespace` not expired at `now_ms`, ordered by key.
    ///
    /// # Errors
    /// The store is closed or a record cannot be read.
    async fn kv_list(
        &self,
        namespace: &str,
        now_ms: i64,
    ) -> Result<Vec<(String, serde_json::Value)>, StoreError>;
    /// Waits until every write queued before this call is durable.
    async fn flush(&self) -> Result<(), StoreError>;
    /// Proves the store accepts writes right now.
    async fn check_writable(&self) -> Result<(), StoreError>;
    /// Flushes and stops; later writes are dropped with a warning, later reads fail.
    async fn close(&self) -> Result<(), StoreError>;
}

/// The store, as the gateway holds it. Cheap to clone.
#[derive(Debug, Clone)]
pub struct StoreHandle {
    backend: Arc<dyn StoreBackend>,
}

impl StoreHandle {
    pub fn new(backend: Arc<dyn StoreBackend>) -> Self {
        StoreHandle { backend }
    }

    /// An in-memory store.
    pub fn memory() -> Self {
        StoreHandle::new(Arc::new(memory::MemoryStore::new(DEFAULT_CHAT_STATE_TTL_MS)))
    }

    /// Opens (creating if needed) the SQLite store at `path` and migrates it.
    ///
    /// # Errors
    /// [`StoreError::Open`] when the file cannot be opened or migrated.
    pub fn open_sqlite(path: &Path) -> Result<Self, StoreError> {
        Ok(StoreHandle::new(Arc::new(sqlite::SqliteStore::open(path, DEFAULT_CHAT_STATE_TTL_MS)?)))
    }

    pub fn backend(&self) -> &Arc<dyn StoreBackend> {
        &self.backend
    }

    /// Records a started process group and waits until the record is durable, so
    /// a gateway killed from now on leaves it for the next start to find.
    ///
    /// # Errors
    /// The store could not make the record durable.
    pub async fn record_process_group(&self, group: ProcessGroupRecord) -> Result<(), StoreError> {
        self.backend
            .kv_put(PROCESS_GROUPS_NAMESPACE, &group.pgid.to_string(), group.to_json(), None)
            .await;
        self.backend.flush().await
    }

    /// Removes the record of a reaped process group.
    pub async fn forget_process_group(&self, pgid: i32) {
        self.backend.kv_delete(PROCESS_GROUPS_NAMESPACE, &pgid.to_string()).await;
    }

    /// Every recorded process group; an unreadable record is dropped with a warning.
    ///
    /// # Errors
    /// The store is closed or cannot be read.
    pub async fn process_groups(&self) -> Result<Vec<ProcessGroupRecord>, StoreError> {
        let records =
            self.backend.kv_list(PROCESS_GROUPS_NAMESPACE, crate::clock::now_ms()).await?;
        let mut groups = Vec::with_capacity(records.len());
        for (key, value) in records {
            match ProcessGroupRecord::from_json(&value) {
                Some(group) => groups.push(group),
                None => {
                    tracing::warn!(key, "unreadable process group record dropped");
                    self.backend.kv_delete(PROCESS_GROUPS_NAMESPACE, &key).await;
                }
            }
        }
        Ok(groups)
    }
}

impl std::ops::Deref for StoreHandle {
    type Target = dyn StoreBackend;

    fn deref(&self) -> &Self::Target {
        &*self.backend
    }
}
