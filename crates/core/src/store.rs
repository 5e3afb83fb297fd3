//! Durable state: runs, every event of every run, chat state, the router's
//! admission journal, and small records that channels keep (the `kv` methods: a
//! namespaced key/value table with optional expiry, for idempotency keys, update
//! offsets, pending deliveries, and the process groups of running CLIs).
//!
//! Each concern is a small trait: [`RunStore`], [`RunEventStore`],
//! [`ChatStateStore`], [`JournalStore`], [`KvStore`], [`UsageStore`],
//! [`RetentionStore`] (bounded pruning steps, rows per table), plus
//! [`StoreLifecycle`] (flush, probe, close). A backend implements all of them ([`StoreBackend`]);
//! [`StoreHandle`] is what the rest of the gateway holds, so callers never name
//! a backend. Three backends exist: [`sqlite`] (one file under `$LEMON_HOME`, WAL,
//! a single writer thread that batches writes into transactions), [`postgres`]
//! (a PostgreSQL database several nodes can share, a pool of connections and a
//! writer task that batches writes the same way and retries them while the
//! server is unreachable) and [`memory`] (for unit tests and benchmarks).
//! Writes are queued and return once queued;
//! [`StoreLifecycle::flush`] waits until everything queued before it is durable,
//! and [`StoreLifecycle::close`] flushes and stops the writer, so nothing a run
//! published is lost on a clean shutdown.
//!
//! Every JSON shape the store itself reads back has a serde type
//! ([`JournalRoute`], [`ProcessGroupRecord`], the head of a stored event);
//! request metadata, usage and channel records are kept as the caller's JSON.

mod columns;
pub mod memory;
pub mod postgres;
pub mod sqlite;
#[cfg(test)]
mod tests;
pub mod upkeep;

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::budget::usage::RunSpend;
use crate::bus::{BusEvent, RunStatus};
use crate::engine::{Completion, ResumeToken};
use crate::ids::{RunId, SessionKey};

/// Chat state lives this long after its last write unless configured otherwise.
pub const DEFAULT_CHAT_STATE_TTL_MS: i64 = 24 * 60 * 60 * 1000;

/// The most expired `kv` records one read purges, so tidying up stays a small,
/// bounded piece of work however many records expired at once.
pub const KV_PURGE_BATCH: usize = 64;

/// Where a store keeps what it holds, as status and metrics show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreLocation {
    /// The SQLite file (its write-ahead log beside it).
    File(Arc<Path>),
    /// A PostgreSQL database, as `postgres://host:port/database`: never the
    /// user or the password.
    Postgres(Arc<str>),
}

impl StoreLocation {
    /// `sqlite` or `postgres`, as `[gateway.store] backend` names it.
    pub fn backend(&self) -> &'static str {
        match self {
            StoreLocation::File(_) => "sqlite",
            StoreLocation::Postgres(_) => "postgres",
        }
    }

    /// The file's path or the database's `postgres://host:port/database`.
    pub fn describe(&self) -> String {
        match self {
            StoreLocation::File(path) => path.display().to_string(),
            StoreLocation::Postgres(target) => target.to_string(),
        }
    }
}

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
    pub session_key: SessionKey,
    pub conversation: String,
    pub engine: String,
    pub prompt: String,
    /// Request metadata as given by the caller (JSON object).
    pub meta: serde_json::Value,
    /// The session the run continues: the resume token it was started with.
    pub resumed_from: Option<ResumeToken>,
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
    /// What the run spent, normalised from the completion's usage and priced.
    pub spend: RunSpend,
}

/// A stored run.
#[derive(Debug, Clone, PartialEq)]
pub struct RunRecord {
    pub run_id: String,
    pub session_key: SessionKey,
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
    /// The session the run continued (the token it was started with), if any.
    pub resumed_from: Option<ResumeToken>,
    /// The session to continue after it: the token its engine reported.
    pub resume: Option<ResumeToken>,
    pub usage: serde_json::Value,
    /// What the run spent (zero until it finished).
    pub spend: RunSpend,
    pub created_at_ms: i64,
    pub started_at_ms: Option<i64>,
    pub completed_at_ms: Option<i64>,
    pub duration_ms: Option<u64>,
    /// Set once retention compacted the run's events: what it kept of them.
    pub compacted: Option<Compacted>,
}

/// What compaction keeps of a finished run's events, besides its answer and
/// error (in the run's record already) and its `run_completed` event (kept,
/// marked `"compacted"`, so a follower of the run still sees it end).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Compacted {
    /// When the events were compacted (ms since the epoch).
    pub at_ms: i64,
    /// How many events the run had.
    pub events: u64,
    /// Its completed actions: `[{kind, title, ok, message}]`, as [`action_summary`] makes them.
    pub actions: Vec<serde_json::Value>,
}

/// A run's completed actions, each as `{kind, title, ok, message}`, in order:
/// what an export lists and what compaction keeps.
pub fn action_summary<'a>(
    events: impl IntoIterator<Item = &'a serde_json::Value>,
) -> Vec<serde_json::Value> {
    events
        .into_iter()
        .filter(|event| event["type"] == "engine_action")
        .map(|event| &event["action"])
        .filter(|action| action["phase"] == "completed")
        .map(|action| {
            serde_json::json!({
                "kind": action["kind"],
                "title": action["title"],
                "ok": action["ok"],
                "message": action["message"],
            })
        })
        .collect()
}

/// One bounded step of retention: each deletes or rewrites at most `limit`
/// rows (or frees at most `pages` pages) in one short transaction of its own,
/// so the writer is never held for long. Never touched: runs not finished,
/// runs owed a delivery (a `kv` record keyed by the run id without expiry),
/// the journal, chat state, secrets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PruneStep {
    /// Finished runs completed before `before_ms`, oldest first, with their
    /// events. What each spent moves to the usage history, so usage totals and
    /// budgets do not change.
    Runs { before_ms: i64, limit: usize },
    /// Compacts the events of finished runs completed before `before_ms` into
    /// their record ([`Compacted`]), keeping only `run_completed`.
    Events { before_ms: i64, limit: usize },
    /// The usage history of deleted runs completed before `before_ms`.
    Usage { before_ms: i64, limit: usize },
    /// `kv` records expired at `now_ms` (idempotency keys, given-up deliveries,
    /// SMS inbox entries…), soonest expiry first.
    ExpiredRecords { now_ms: i64, limit: usize },
    /// Records of `namespace` whose value's `updated_at_ms` is before
    /// `before_ms` (native sessions not used since).
    IdleRecords { namespace: String, before_ms: i64, limit: usize },
    /// Gives free pages back to the file system.
    Vacuum { pages: u32 },
}

impl PruneStep {
    /// The step's name in logs and `lemon_store_pruned_total{kind}`.
    pub fn kind(&self) -> &'static str {
        match self {
            PruneStep::Runs { .. } => "runs",
            PruneStep::Events { .. } => "events",
            PruneStep::Usage { .. } => "usage",
            PruneStep::ExpiredRecords { .. } => "expired_records",
            PruneStep::IdleRecords { .. } => "sessions",
            PruneStep::Vacuum { .. } => "pages",
        }
    }
}

/// A stored event: its index within the run, type name and JSON body
/// (the same JSON as [`BusEvent::to_json`]).
#[derive(Debug, Clone, PartialEq)]
pub struct StoredEvent {
    pub index: u64,
    pub kind: String,
    pub data: serde_json::Value,
}

impl StoredEvent {
    /// The resume token the event carries (`engine_started`, `engine_completed`,
    /// `run_completed`), if any.
    pub fn resume(&self) -> Option<ResumeToken> {
        let stored = StoredResume::deserialize(self.data.get("resume")?).ok()?;
        Some(ResumeToken::new(stored.engine, stored.value))
    }
}

/// A resume token as events store it: `{"engine", "value"}`.
#[derive(Debug, Deserialize)]
struct StoredResume {
    engine: String,
    value: String,
}

/// Which runs to list; newest first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunFilter {
    pub status: Option<RunStatus>,
    pub limit: usize,
}

/// Which finished runs a usage query sums: those completed at or after
/// `since_ms`, of one session and one engine when given.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct UsageFilter {
    pub since_ms: i64,
    pub session_key: Option<SessionKey>,
    pub engine: Option<String>,
}

/// What a group of runs spent together.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct UsageTotals {
    pub spend: RunSpend,
    pub runs: u64,
}

impl UsageTotals {
    /// Both groups together.
    pub fn plus(&self, other: &UsageTotals) -> UsageTotals {
        UsageTotals { spend: self.spend.plus(&other.spend), runs: self.runs + other.runs }
    }

    /// Adds one run.
    pub fn add(&mut self, spend: &RunSpend) {
        self.spend = self.spend.plus(spend);
        self.runs += 1;
    }
}

/// How [`UsageStore::usage_by`] groups runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UsageGroup {
    Engine,
    Session,
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
    pub session_key: SessionKey,
    pub conversation: String,
    pub prompt: String,
    pub engine: String,
    pub resume: Option<ResumeToken>,
    pub cwd: Option<std::path::PathBuf>,
    /// Request metadata (JSON object).
    pub meta: serde_json::Value,
    /// The router's own fields: origin, queue mode, engine choice.
    pub route: JournalRoute,
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
            resumed_from: self.resume.clone(),
            created_at_ms: self.accepted_at_ms,
        }
    }
}

/// How the router routed a journaled request, stored as a JSON object so
/// that entries written by older builds (missing keys) or newer ones (unknown
/// keys) still read: a missing key takes its default, an unknown one is ignored.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct JournalRoute {
    /// Where the request came from, by `router::Origin::as_str`; `None` reads as internal.
    pub origin: Option<String>,
    /// The queue mode it was accepted with, by `QueueMode::as_str`.
    pub queue_mode: Option<String>,
    /// Continue the session's stored token when it is dispatched.
    pub auto_resume: bool,
    /// The engine the caller, a directive or `/engine` chose.
    pub chosen_engine: Option<String>,
    /// The engine used without a stored session; `None` means the entry's engine.
    pub fallback_engine: Option<String>,
    /// The model the request asked for; `None` in journals written before the
    /// router kept it (it is then read from the entry's `meta`).
    pub model: Option<String>,
    /// The request's flags; `None` in older journals, which had them in `meta`.
    pub no_auto_resume: Option<bool>,
    pub goal_continuation: Option<bool>,
    pub auto_followup: Option<bool>,
}

/// The `kv` namespace of [`ProcessGroupRecord`]s.
pub const PROCESS_GROUPS_NAMESPACE: &str = "process_groups";

/// A process group the gateway started (a CLI run) and has not reaped yet.
/// Written when the group starts and removed once it is reaped; what a start
/// finds left over belonged to a gateway that died without reaping it.
/// Stored in `kv` as `{"pgid", "start_time", "session", "scope"}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessGroupRecord {
    /// The group id: the leader's pid.
    pub pgid: i32,
    /// The leader's start time (clock ticks after boot, `/proc/<pid>/stat` field
    /// 22), so that a pid used again by another process is never taken for it.
    pub start_time: u64,
    /// The leader's session id: every member of the group is in it.
    pub session: i32,
    /// The value of `LEMON_PROCESS_SCOPE` in the leader's environment, which its
    /// descendants inherit even when they leave the group (`setsid`); 0 in
    /// records written before it existed.
    #[serde(default)]
    pub scope: u64,
}

/// The runs: one row per accepted run, from `queued` to its final status.
///
/// Write methods queue and return; read methods see every write queued before
/// them on the same backend (as do the reads of the other concerns).
#[async_trait]
pub trait RunStore: Send + Sync + fmt::Debug + 'static {
    /// Writes a queued run. A repeated id replaces the run but keeps its place
    /// and creation time.
    async fn insert_run(&self, run: NewRun);
    async fn mark_running(&self, run_id: RunId, engine: String, started_at_ms: i64);
    /// Marks a running run as `cancelling` (it waits for its engine to stop); a
    /// queued or finished run keeps its status.
    async fn mark_cancelling(&self, run_id: RunId);
    async fn finalize_run(&self, run: FinishedRun);
    async fn get_run(&self, run_id: &str) -> Result<Option<RunRecord>, StoreError>;
    async fn list_runs(&self, filter: RunFilter) -> Result<Vec<RunRecord>, StoreError>;
    /// The runs of one session, oldest first, at most `limit`.
    async fn session_runs(
        &self,
        session_key: &SessionKey,
        limit: usize,
    ) -> Result<Vec<RunRecord>, StoreError>;
    /// Adds stage stamps to a run's timing: stages it has keep their time, so
    /// nodes that each saw part of a run can each add theirs. A run not
    /// written (yet, or any more) gets nothing.
    async fn merge_stages(&self, run_id: RunId, stamps: crate::timing::Stamps);
    /// The run's stage stamps; empty when it has none (or is unknown).
    async fn run_stages(&self, run_id: &str) -> Result<crate::timing::Stamps, StoreError>;
}

/// Every event of every run, by run and index. Events may arrive for a run that
/// was never inserted (or before it is); they stay with it.
#[async_trait]
pub trait RunEventStore: Send + Sync + fmt::Debug + 'static {
    async fn append_event(&self, event: Arc<BusEvent>);
    /// The run's events in index order.
    async fn run_events(&self, run_id: &str) -> Result<Vec<StoredEvent>, StoreError>;
    /// The events of each of `run_ids`, in its order, each run's in index
    /// order: one read for many runs (a session's export).
    async fn runs_events(&self, run_ids: Vec<String>) -> Result<Vec<Vec<StoredEvent>>, StoreError> {
        let mut all = Vec::with_capacity(run_ids.len());
        for run_id in &run_ids {
            all.push(self.run_events(run_id).await?);
        }
        Ok(all)
    }
}

/// The last engine and resume token of each session, for auto-resume, with expiry.
#[async_trait]
pub trait ChatStateStore: Send + Sync + fmt::Debug + 'static {
    /// Writes chat state; `expires_at_ms` is `updated_at_ms` plus the store's TTL.
    async fn put_chat_state(
        &self,
        session_key: &SessionKey,
        last_engine: &str,
        last_resume_token: &str,
        now_ms: i64,
    );
    /// Chat state that has not expired at `now_ms`.
    async fn get_chat_state(
        &self,
        session_key: &SessionKey,
        now_ms: i64,
    ) -> Result<Option<ChatState>, StoreError>;
    async fn delete_chat_state(&self, session_key: &SessionKey);
}

/// The router's admission journal: accepted requests until their completion.
#[async_trait]
pub trait JournalStore: Send + Sync + fmt::Debug + 'static {
    /// Writes (or rewrites, by run id) an admission journal entry.
    async fn journal_admit(&self, entry: JournalEntry);
    /// Marks a journaled request as started; unknown ids are ignored.
    async fn journal_mark_started(&self, run_id: &RunId);
    /// Removes a journaled request: its completion is out.
    async fn journal_complete(&self, run_id: &RunId);
    /// Every journal entry, in `seq` order.
    async fn journal_pending(&self) -> Result<Vec<JournalEntry>, StoreError>;
}

/// Small namespaced records with optional expiry, for channel state.
#[async_trait]
pub trait KvStore: Send + Sync + fmt::Debug + 'static {
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
}

/// What finished runs spent, summed.
#[async_trait]
pub trait UsageStore: Send + Sync + fmt::Debug + 'static {
    /// The totals of the runs `filter` selects.
    ///
    /// # Errors
    /// The store is closed or cannot be read.
    async fn usage_totals(&self, filter: &UsageFilter) -> Result<UsageTotals, StoreError>;
    /// The same, per engine or per session, ordered by engine or session.
    ///
    /// # Errors
    /// The store is closed or cannot be read.
    async fn usage_by(
        &self,
        filter: &UsageFilter,
        group: UsageGroup,
    ) -> Result<Vec<(String, UsageTotals)>, StoreError>;
}

/// Keeping the store small: retention's steps and what the store holds.
#[async_trait]
pub trait RetentionStore: Send + Sync + fmt::Debug + 'static {
    /// Applies one step; how many runs, events, rows or pages it removed
    /// (events compacted count their runs).
    ///
    /// # Errors
    /// The store is closed or the step could not be written (nothing of it is).
    async fn prune(&self, step: PruneStep) -> Result<u64, StoreError>;
    /// Rows per table, by table name in order.
    ///
    /// # Errors
    /// The store is closed or cannot be read.
    async fn table_rows(&self) -> Result<Vec<(String, u64)>, StoreError>;
    /// Bytes of the pages that hold data (the file less its free pages): what
    /// `max_db_mb` bounds. 0 for a store in memory.
    ///
    /// # Errors
    /// The store is closed or cannot be read.
    async fn used_bytes(&self) -> Result<u64, StoreError>;
}

/// Durability and lifetime of a backend, across all that it holds.
#[async_trait]
pub trait StoreLifecycle: Send + Sync + fmt::Debug + 'static {
    /// Waits until every write queued before this call is durable.
    async fn flush(&self) -> Result<(), StoreError>;
    /// Proves the store accepts writes right now.
    async fn check_writable(&self) -> Result<(), StoreError>;
    /// Flushes and stops; later writes are dropped with a warning, later reads fail.
    async fn close(&self) -> Result<(), StoreError>;
}

/// A backend that holds everything: what [`StoreHandle::new`] takes. Implemented
/// for every type that implements each concern's trait.
pub trait StoreBackend:
    RunStore
    + RunEventStore
    + ChatStateStore
    + JournalStore
    + KvStore
    + UsageStore
    + RetentionStore
    + StoreLifecycle
{
}

impl<T> StoreBackend for T where
    T: RunStore
        + RunEventStore
        + ChatStateStore
        + JournalStore
        + KvStore
        + UsageStore
        + RetentionStore
        + StoreLifecycle
{
}

/// The store, as the gateway holds it. Cheap to clone.
///
/// Callers use its methods (one per operation, named as in the concern's trait)
/// or the typed views [`StoreHandle::runs`], [`StoreHandle::events`],
/// [`StoreHandle::chat_state`], [`StoreHandle::journal`] and [`StoreHandle::kv`];
/// neither depends on which backend is behind it.
#[derive(Debug, Clone)]
pub struct StoreHandle {
    backend: Arc<dyn StoreBackend>,
}

impl StoreHandle {
    pub fn new<B: StoreBackend>(backend: Arc<B>) -> Self {
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

    /// Connects to the PostgreSQL database `config` names, applies the
    /// migrations it has not seen and starts the store's writer task on the
    /// current runtime: see [`postgres::PostgresStore::connect`].
    ///
    /// # Errors
    /// [`StoreError::Open`] naming `host:port/database` (never the user or the
    /// password) when the server cannot be reached, refuses the login, or the
    /// database cannot be migrated or comes from a newer build.
    ///
    /// # Cancel safety
    /// Dropping the future leaves nothing running.
    pub async fn open_postgres(config: postgres::PostgresConfig) -> Result<Self, StoreError> {
        Ok(StoreHandle::new(Arc::new(postgres::PostgresStore::connect(config).await?)))
    }

    /// The SQLite store at `path` with no writer thread, for deterministic tests
    /// on a paused current-thread runtime: see [`sqlite::SqliteStore::open_inline`].
    ///
    /// # Errors
    /// [`StoreError::Open`] when the file cannot be opened or migrated.
    pub fn open_sqlite_inline(path: &Path) -> Result<Self, StoreError> {
        let store = sqlite::SqliteStore::open_inline(path, DEFAULT_CHAT_STATE_TTL_MS)?;
        Ok(StoreHandle::new(Arc::new(store)))
    }

    /// The runs.
    pub fn runs(&self) -> &dyn RunStore {
        &*self.backend
    }

    /// The runs' events.
    pub fn events(&self) -> &dyn RunEventStore {
        &*self.backend
    }

    /// The sessions' chat state.
    pub fn chat_state(&self) -> &dyn ChatStateStore {
        &*self.backend
    }

    /// The admission journal.
    pub fn journal(&self) -> &dyn JournalStore {
        &*self.backend
    }

    /// The small namespaced records.
    pub fn kv(&self) -> &dyn KvStore {
        &*self.backend
    }

    /// Flushing, the writable probe and closing.
    pub fn lifecycle(&self) -> &dyn StoreLifecycle {
        &*self.backend
    }

    /// What finished runs spent.
    pub fn usage(&self) -> &dyn UsageStore {
        &*self.backend
    }

    /// Retention's steps and the store's rows.
    pub fn retention(&self) -> &dyn RetentionStore {
        &*self.backend
    }

    /// See [`RunStore::insert_run`].
    pub async fn insert_run(&self, run: NewRun) {
        self.runs().insert_run(run).await;
    }

    /// See [`RunStore::mark_running`].
    pub async fn mark_running(&self, run_id: RunId, engine: String, started_at_ms: i64) {
        self.runs().mark_running(run_id, engine, started_at_ms).await;
    }

    /// See [`RunStore::mark_cancelling`].
    pub async fn mark_cancelling(&self, run_id: RunId) {
        self.runs().mark_cancelling(run_id).await;
    }

    /// See [`RunStore::finalize_run`].
    pub async fn finalize_run(&self, run: FinishedRun) {
        self.runs().finalize_run(run).await;
    }

    /// See [`RunStore::get_run`].
    ///
    /// # Errors
    /// The store is closed or the run cannot be read.
    pub async fn get_run(&self, run_id: &str) -> Result<Option<RunRecord>, StoreError> {
        self.runs().get_run(run_id).await
    }

    /// See [`RunStore::list_runs`].
    ///
    /// # Errors
    /// The store is closed or a run cannot be read.
    pub async fn list_runs(&self, filter: RunFilter) -> Result<Vec<RunRecord>, StoreError> {
        self.runs().list_runs(filter).await
    }

    /// The runs of one session, oldest first, at most `limit`.
    ///
    /// # Errors
    /// The store is closed or a run cannot be read.
    pub async fn session_runs(
        &self,
        session_key: &SessionKey,
        limit: usize,
    ) -> Result<Vec<RunRecord>, StoreError> {
        self.runs().session_runs(session_key, limit).await
    }

    /// See [`RunEventStore::append_event`].
    pub async fn append_event(&self, event: Arc<BusEvent>) {
        self.events().append_event(event).await;
    }

    /// See [`RunEventStore::run_events`].
    ///
    /// # Errors
    /// The store is closed or an event cannot be read.
    pub async fn run_events(&self, run_id: &str) -> Result<Vec<StoredEvent>, StoreError> {
        self.events().run_events(run_id).await
    }

    /// See [`RunEventStore::runs_events`].
    ///
    /// # Errors
    /// The store is closed or an event cannot be read.
    pub async fn runs_events(
        &self,
        run_ids: Vec<String>,
    ) -> Result<Vec<Vec<StoredEvent>>, StoreError> {
        self.events().runs_events(run_ids).await
    }

    /// See [`ChatStateStore::put_chat_state`].
    pub async fn put_chat_state(
        &self,
        session_key: &SessionKey,
        last_engine: &str,
        last_resume_token: &str,
        now_ms: i64,
    ) {
        self.chat_state().put_chat_state(session_key, last_engine, last_resume_token, now_ms).await;
    }

    /// See [`ChatStateStore::get_chat_state`].
    ///
    /// # Errors
    /// The store is closed or the state cannot be read.
    pub async fn get_chat_state(
        &self,
        session_key: &SessionKey,
        now_ms: i64,
    ) -> Result<Option<ChatState>, StoreError> {
        self.chat_state().get_chat_state(session_key, now_ms).await
    }

    /// See [`ChatStateStore::delete_chat_state`].
    pub async fn delete_chat_state(&self, session_key: &SessionKey) {
        self.chat_state().delete_chat_state(session_key).await;
    }

    /// See [`JournalStore::journal_admit`].
    pub async fn journal_admit(&self, entry: JournalEntry) {
        self.journal().journal_admit(entry).await;
    }

    /// See [`JournalStore::journal_mark_started`].
    pub async fn journal_mark_started(&self, run_id: &RunId) {
        self.journal().journal_mark_started(run_id).await;
    }

    /// See [`JournalStore::journal_complete`].
    pub async fn journal_complete(&self, run_id: &RunId) {
        self.journal().journal_complete(run_id).await;
    }

    /// See [`JournalStore::journal_pending`].
    ///
    /// # Errors
    /// The store is closed or an entry cannot be read.
    pub async fn journal_pending(&self) -> Result<Vec<JournalEntry>, StoreError> {
        self.journal().journal_pending().await
    }

    /// See [`KvStore::kv_put`].
    pub async fn kv_put(
        &self,
        namespace: &str,
        key: &str,
        value: serde_json::Value,
        expires_at_ms: Option<i64>,
    ) {
        self.kv().kv_put(namespace, key, value, expires_at_ms).await;
    }

    /// See [`KvStore::kv_get`].
    ///
    /// # Errors
    /// The store is closed or the record cannot be read.
    pub async fn kv_get(
        &self,
        namespace: &str,
        key: &str,
        now_ms: i64,
    ) -> Result<Option<serde_json::Value>, StoreError> {
        self.kv().kv_get(namespace, key, now_ms).await
    }

    /// See [`KvStore::kv_delete`].
    pub async fn kv_delete(&self, namespace: &str, key: &str) {
        self.kv().kv_delete(namespace, key).await;
    }

    /// See [`KvStore::kv_list`].
    ///
    /// # Errors
    /// The store is closed or a record cannot be read.
    pub async fn kv_list(
        &self,
        namespace: &str,
        now_ms: i64,
    ) -> Result<Vec<(String, serde_json::Value)>, StoreError> {
        self.kv().kv_list(namespace, now_ms).await
    }

    /// See [`StoreLifecycle::flush`].
    ///
    /// # Errors
    /// The store is closed or a queued write failed.
    pub async fn flush(&self) -> Result<(), StoreError> {
        self.lifecycle().flush().await
    }

    /// See [`StoreLifecycle::check_writable`].
    ///
    /// # Errors
    /// The store is closed or cannot write.
    pub async fn check_writable(&self) -> Result<(), StoreError> {
        self.lifecycle().check_writable().await
    }

    /// See [`StoreLifecycle::close`].
    ///
    /// # Errors
    /// The last writes could not be made durable.
    pub async fn close(&self) -> Result<(), StoreError> {
        self.lifecycle().close().await
    }

    /// Records a started process group and waits until the record is durable, so
    /// a gateway killed from now on leaves it for the next start to find.
    ///
    /// # Errors
    /// The store could not make the record durable.
    pub async fn record_process_group(&self, group: ProcessGroupRecord) -> Result<(), StoreError> {
        let value = serde_json::to_value(group)
            .map_err(|e| StoreError::Corrupt(format!("process group {}: {e}", group.pgid)))?;
        self.kv_put(PROCESS_GROUPS_NAMESPACE, &group.pgid.to_string(), value, None).await;
        self.flush().await
    }

    /// Removes the record of a reaped process group.
    pub async fn forget_process_group(&self, pgid: i32) {
        self.kv_delete(PROCESS_GROUPS_NAMESPACE, &pgid.to_string()).await;
    }

    /// Every recorded process group; an unreadable record is dropped with a warning.
    ///
    /// # Errors
    /// The store is closed or cannot be read.
    pub async fn process_groups(&self) -> Result<Vec<ProcessGroupRecord>, StoreError> {
        let records = self.kv_list(PROCESS_GROUPS_NAMESPACE, crate::clock::now_ms()).await?;
        let mut groups = Vec::with_capacity(records.len());
        for (key, value) in records {
            match ProcessGroupRecord::deserialize(&value) {
                Ok(group) => groups.push(group),
                Err(error) => {
                    tracing::warn!(key, %error, "unreadable process group record dropped");
                    self.kv_delete(PROCESS_GROUPS_NAMESPACE, &key).await;
                }
            }
        }
        Ok(groups)
    }
}
