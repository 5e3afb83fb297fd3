//! The SQLite backend: one file in WAL mode, a single writer thread that batches
//! writes into transactions, a checkpointer thread, and a separate read connection.
//!
//! Writes are `WriteOp`s on a bounded channel to the writer thread, so a caller
//! waits only for a queue slot, and a writer that falls behind slows producers down
//! instead of growing memory. Reads first send a flush barrier through the same
//! channel, then query the read connection on a blocking task, so a read sees every
//! write queued before it on the same store. Writes nobody waits for are
//! gathered for up to a millisecond before they commit (see `writer`); a
//! barrier or a point read wakes the writer at once. A session's chat state is
//! looked up on the calling task instead, from the chat-state writes still on
//! their way (`pending`) or else from the file, with no hand-off to either thread.
//!
//! [`SqliteStore::open_inline`] opens the same store with no writer thread: the
//! task that needs a batch applied (a barrier, a read, a full queue) applies it,
//! and reads run on that task too, so a runtime never sits idle waiting for
//! another thread (deterministic tests in paused time rely on that).
//!
//! Files: `schema` (migrations), `writer` (the writer and checkpointer threads),
//! `chat_states` (chat-state writes not committed yet, and the committed states
//! of recent sessions), `backup` (backup and restore of the file), `prune`
//! (retention's steps).
//! Events are stored in their one JSON form, [`crate::bus::EventJson`].

mod backup;
mod chat_states;
mod prune;
mod schema;
mod writer;

pub use backup::{backup, file_sizes, restore, Copied, CopyError, FileSizes};

use std::fmt;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread;
use std::time::Duration;

use async_trait::async_trait;
use rusqlite::{params, Connection, Row, Rows};
use tokio::sync::{mpsc, oneshot};

use self::chat_states::{ChatStates, Known};
use self::writer::{Reply, WriteOp};
use super::columns::{self, parse_json};
use super::{
    ChatState, ChatStateStore, FinishedRun, JournalEntry, JournalStore, KvStore, NewRun, PruneStep,
    RetentionStore, RunEventStore, RunFilter, RunRecord, RunStore, StoreError, StoreLifecycle,
    StoredEvent, UsageFilter, UsageGroup, UsageStore, UsageTotals, KV_PURGE_BATCH,
};
use crate::bus::BusEvent;
use crate::ids::{RunId, SessionKey};
use crate::timing::Stamps;

#[cfg(test)]
pub(crate) use self::schema::SCHEMA_VERSION;

/// Writes that may wait for the writer before callers feel backpressure.
const QUEUE_CAPACITY: usize = 8192;

/// How long a statement waits for a lock held by another connection (another
/// process on the same file, or the checkpointer restarting the log) before
/// failing.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// The first tries at a lock held by another connection, [`BUSY_SHORT_STEP`]
/// apart. The locks this store's own connections take from each other (a log
/// restart, a reader finishing with the log) are held for well under a
/// millisecond; SQLite's own busy handler sleeps 1, 2, 5, 10 ms and more
/// between tries, so it made the writer, and every turn waiting on it, lose
/// several milliseconds to each of them.
const BUSY_SHORT_TRIES: u32 = 200;
const BUSY_SHORT_STEP: Duration = Duration::from_micros(50);
/// Past the short tries (10 ms), tries are this far apart until
/// [`BUSY_TIMEOUT`]: a lock held that long is another process's.
const BUSY_LONG_STEP: Duration = Duration::from_millis(1);

/// How long to sleep before try `attempt` (0 for the first retry) at a busy
/// lock, or `None` once [`BUSY_TIMEOUT`] has been spent waiting.
pub(super) fn busy_delay(attempt: u32) -> Option<Duration> {
    let short = BUSY_SHORT_STEP * BUSY_SHORT_TRIES;
    if attempt < BUSY_SHORT_TRIES {
        return Some(BUSY_SHORT_STEP);
    }
    let waited = short + BUSY_LONG_STEP * (attempt - BUSY_SHORT_TRIES);
    (waited < BUSY_TIMEOUT).then_some(BUSY_LONG_STEP)
}

/// SQLite's busy handler for every connection: `true` to try again.
fn wait_for_lock(attempt: i32) -> bool {
    match busy_delay(u32::try_from(attempt).unwrap_or(u32::MAX)) {
        Some(delay) => {
            std::thread::sleep(delay);
            true
        }
        None => false,
    }
}

/// The columns [`run_from_row`] reads, in order; a macro so queries are `concat!`ed at compile time.
macro_rules! run_columns {
    () => {
        "run_id, session_key, conversation, engine, prompt, meta, status, answer, error, error_code, \
         resume_engine, resume_value, usage, created_at_ms, started_at_ms, completed_at_ms, duration_ms, \
         resumed_from_engine, resumed_from_value, \
         input_tokens, output_tokens, cache_read_tokens, cache_write_tokens, cost_usd, compacted"
    };
}

/// The sums a usage query selects from `$table` (`runs`, or `pruned_usage`:
/// what deleted runs spent), after its group column if any.
macro_rules! usage_sums {
    ($table:literal) => {
        concat!(
            "count(*), coalesce(sum(input_tokens), 0), coalesce(sum(output_tokens), 0), \
             coalesce(sum(cache_read_tokens), 0), coalesce(sum(cache_write_tokens), 0), \
             coalesce(sum(cost_usd), 0.0) FROM ",
            $table
        )
    };
}

/// The `WHERE` clause of a usage query: `?1` since, `?2` session, `?3` engine. A
/// session's runs are found through their own index.
macro_rules! usage_where {
    () => {
        " WHERE completed_at_ms >= ?1 AND (?2 IS NULL OR session_key = ?2) \
          AND (?3 IS NULL OR engine = ?3)"
    };
}

/// The SQLite store. Dropping it without [`StoreLifecycle::close`] still applies every
/// write already queued: the writer drains its queue once the sender is gone, and
/// drop waits for it (and the writer for the checkpointer).
pub struct SqliteStore {
    /// Shown in logs.
    path: PathBuf,
    /// The writer's queue. `Some` for the store's whole life; drop takes it so the
    /// writer sees the channel close, drains and exits.
    tx: Option<mpsc::Sender<WriteOp>>,
    /// Where the writer applies its batches.
    writer: Writing,
    /// The read connection, shared with the blocking tasks that read and locked only
    /// inside them. `None` after `close`.
    reader: Arc<Mutex<Option<Connection>>>,
    /// The connection of lookups run on the calling task (a session's chat
    /// state): never held for longer than one indexed row takes. `None` after
    /// `close`.
    lookup: Mutex<Option<Connection>>,
    /// Chat-state writes queued and not committed yet, and the committed states
    /// of recent sessions, which lookups answer from.
    chat_states: Arc<ChatStates>,
    /// Set by `close`: later writes are dropped with a warning and reads fail.
    closed: AtomicBool,
    chat_state_ttl_ms: i64,
    /// The lock file beside the database, held shared while the store is
    /// open: a restore refuses to replace the file under it.
    file_lock: Mutex<Option<std::fs::File>>,
}

/// Where a store's writer applies its batches.
enum Writing {
    Thread {
        /// Taken and joined by `close` (or by drop).
        handle: Mutex<Option<thread::JoinHandle<()>>>,
        /// To wake it from its linger when someone waits.
        thread: thread::Thread,
    },
    /// On the task that needs a batch applied ([`SqliteStore::open_inline`]);
    /// taken and dropped by `close` (or by drop).
    Inline(Box<Mutex<Option<writer::Inline>>>),
}

impl fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteStore")
            .field("path", &self.path)
            .field("closed", &self.closed.load(Ordering::Relaxed))
            .field("chat_state_ttl_ms", &self.chat_state_ttl_ms)
            .finish_non_exhaustive()
    }
}

impl SqliteStore {
    /// Opens (creating the file and its parent directory if needed) and migrates the
    /// store at `path`, then starts its writer and checkpointer threads.
    ///
    /// # Errors
    /// [`StoreError::Open`] naming `path` when the directory or file cannot be
    /// created or opened, a migration fails, or the file comes from a newer build.
    pub fn open(path: &Path, chat_state_ttl_ms: i64) -> Result<SqliteStore, StoreError> {
        SqliteStore::open_with(path, chat_state_ttl_ms, false)
    }

    /// Opens the store at `path` like [`SqliteStore::open`], with the same file,
    /// schema, migrations, batches and recovery, but with no writer thread:
    /// writes wait in the queue until a task needs them applied (a flush, a read,
    /// or a full batch's worth queued), and that task applies them, one
    /// transaction a batch, then runs its read itself instead of on a blocking
    /// task. The calling task is busy for as long as the batch takes, so this is
    /// not for serving; it is for tests on a paused current-thread runtime, which
    /// then never waits idle for another thread and so never lets paused time
    /// jump ahead while the store works.
    ///
    /// # Errors
    /// As [`SqliteStore::open`].
    pub fn open_inline(path: &Path, chat_state_ttl_ms: i64) -> Result<SqliteStore, StoreError> {
        SqliteStore::open_with(path, chat_state_ttl_ms, true)
    }

    fn open_with(
        path: &Path,
        chat_state_ttl_ms: i64,
        inline: bool,
    ) -> Result<SqliteStore, StoreError> {
        let open_error =
            |message: String| StoreError::Open { path: path.display().to_string(), message };
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(parent)
                .map_err(|e| open_error(format!("cannot create {}: {e}", parent.display())))?;
        }
        make_private(path).map_err(open_error)?;
        let file_lock = backup::hold_shared(path).map_err(open_error)?;
        let mut write_conn = connect(path).map_err(open_error)?;
        prune::use_incremental_vacuum(&write_conn).map_err(open_error)?;
        schema::migrate(&mut write_conn).map_err(open_error)?;
        let pragmas = [
            // The checkpointer thread copies the log back; the writer only appends.
            ("wal_autocheckpoint", 0),
            // Once the log restarts, give its file back down to 64 MiB.
            ("journal_size_limit", 64 * 1024 * 1024),
            // 32 MiB (negative means KiB) keeps the `run_id` index of about half a
            // million runs in memory, which is where the writer's reads go.
            ("cache_size", -32 * 1024),
        ];
        for (pragma, value) in pragmas {
            write_conn.pragma_update(None, pragma, value).map_err(|e| open_error(e.to_string()))?;
        }
        let checkpoint_conn = connect(path).map_err(open_error)?;
        let read_conn = connect(path).map_err(open_error)?;
        let lookup_conn = connect(path).map_err(open_error)?;
        // The read connections never write; saying so turns a bug into an error.
        for conn in [&read_conn, &lookup_conn] {
            conn.pragma_update(None, "query_only", true).map_err(|e| open_error(e.to_string()))?;
        }
        let chat_states = Arc::new(ChatStates::default());

        let (tx, rx) = mpsc::channel(QUEUE_CAPACITY);
        let writer = if inline {
            let inline =
                writer::Inline::new(write_conn, checkpoint_conn, rx, Arc::clone(&chat_states));
            Writing::Inline(Box::new(Mutex::new(Some(inline.map_err(open_error)?))))
        } else {
            let handle = writer::spawn(write_conn, checkpoint_conn, rx, Arc::clone(&chat_states))
                .map_err(open_error)?;
            let thread = handle.thread().clone();
            Writing::Thread { handle: Mutex::new(Some(handle)), thread }
        };
        tracing::debug!(path = %path.display(), inline, "store opened");
        Ok(SqliteStore {
            path: path.to_owned(),
            tx: Some(tx),
            writer,
            reader: Arc::new(Mutex::new(Some(read_conn))),
            lookup: Mutex::new(Some(lookup_conn)),
            chat_states,
            closed: AtomicBool::new(false),
            chat_state_ttl_ms,
            file_lock: Mutex::new(Some(file_lock)),
        })
    }

    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Hands a write to the writer, waiting for a queue slot; drops it once closed.
    async fn queue(&self, op: WriteOp) {
        if self.is_closed() {
            tracing::warn!(op = op.name(), "write to a closed store dropped");
            return;
        }
        let Some(tx) = &self.tx else { return };
        if let Err(mpsc::error::SendError(op)) = self.send(tx, op).await {
            tracing::warn!(op = op.name(), "write to a closed store dropped");
            return;
        }
        // Inline, a full batch is applied by the write that fills it.
        self.pump_if(|inline| inline.queued() >= writer::MAX_BATCH);
    }

    /// Puts `op` on the writer's queue, waiting for a slot. Inline, a full queue
    /// is applied on the spot to make room.
    async fn send(
        &self,
        tx: &mpsc::Sender<WriteOp>,
        mut op: WriteOp,
    ) -> Result<(), mpsc::error::SendError<WriteOp>> {
        if !matches!(self.writer, Writing::Inline(_)) {
            return tx.send(op).await;
        }
        loop {
            match tx.try_send(op) {
                Ok(()) => return Ok(()),
                Err(mpsc::error::TrySendError::Full(full)) => {
                    op = full;
                    self.pump_if(|_| true);
                }
                Err(mpsc::error::TrySendError::Closed(op)) => {
                    return Err(mpsc::error::SendError(op))
                }
            }
        }
    }

    /// Inline, applies what is queued when `due` says so; with a writer thread,
    /// nothing (the thread applies it).
    fn pump_if(&self, due: impl FnOnce(&writer::Inline) -> bool) {
        if let Writing::Inline(inline) = &self.writer {
            if let Some(inline) = lock(inline).as_mut().filter(|inline| due(inline)) {
                inline.pump();
            }
        }
    }

    /// Wakes the writer from lingering over a batch: an op someone waits for
    /// was just queued (see `writer`'s `LINGER`).
    fn wake_writer(&self) {
        if let Writing::Thread { thread, .. } = &self.writer {
            thread.unpark();
        }
    }

    /// Sends a barrier built around a reply channel and waits for its answer.
    async fn barrier(&self, op: impl FnOnce(Reply) -> WriteOp) -> Result<(), StoreError> {
        let tx = self.tx.as_ref().ok_or(StoreError::Closed)?;
        let (reply, answer) = oneshot::channel();
        self.send(tx, op(reply)).await.map_err(|_| StoreError::Closed)?;
        self.wake_writer();
        self.pump_if(|_| true);
        answer.await.map_err(|_| StoreError::Closed)?
    }

    /// A `kv` read that also notices records expired at `now_ms` and then asks
    /// the writer to delete a few. Tidying up is optional, so it never waits for
    /// a queue slot; a later read asks again.
    async fn read_kv<T, F>(&self, now_ms: i64, query: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    {
        let (found, expired) =
            self.read(move |conn| Ok((query(conn)?, any_kv_expired(conn, now_ms)?))).await?;
        if expired {
            if let Some(tx) = &self.tx {
                let _ = tx.try_send(WriteOp::KvPurgeExpired { now_ms, limit: KV_PURGE_BATCH });
            }
        }
        Ok(found)
    }

    /// Runs `query`, a lookup of a row or two by key, on the writer's thread and
    /// connection right after the batch that holds everything queued before this
    /// call is committed: one round trip to the writer, where [`Self::read`] takes
    /// a barrier and then a blocking task. Longer reads (lists, events, sums) stay
    /// on the read connection so the writer is not held up by them.
    async fn point_read<T, F>(&self, query: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    {
        if self.is_closed() {
            return Err(StoreError::Closed);
        }
        let tx = self.tx.as_ref().ok_or(StoreError::Closed)?;
        let (reply, answer) = oneshot::channel();
        let read = writer::Read::new(move |conn| {
            let _ = reply.send(query(conn));
        });
        self.send(tx, WriteOp::Read(read)).await.map_err(|_| StoreError::Closed)?;
        self.wake_writer();
        self.pump_if(|_| true);
        answer.await.map_err(|_| StoreError::Closed)?
    }

    /// [`Self::point_read`] of a `kv` record that also notices records expired at
    /// `now_ms`, like [`Self::read_kv`].
    async fn point_read_kv<T, F>(&self, now_ms: i64, query: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    {
        let (found, expired) =
            self.point_read(move |conn| Ok((query(conn)?, any_kv_expired(conn, now_ms)?))).await?;
        if expired {
            if let Some(tx) = &self.tx {
                let _ = tx.try_send(WriteOp::KvPurgeExpired { now_ms, limit: KV_PURGE_BATCH });
            }
        }
        Ok(found)
    }

    /// Runs `query`, a lookup of one row by its key, on the calling task and the
    /// lookup connection, without a flush: for tables whose queued writes the
    /// store keeps track of itself ([`ChatStates`]), so what is queued is
    /// answered before the file is asked.
    fn lookup<T>(
        &self,
        query: impl FnOnce(&Connection) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        if self.is_closed() {
            return Err(StoreError::Closed);
        }
        let guard = lock(&self.lookup);
        let conn = guard.as_ref().ok_or(StoreError::Closed)?;
        query(conn)
    }

    /// Runs `query` on the read connection after every write queued before this call
    /// is committed.
    async fn read<T, F>(&self, query: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    {
        if self.is_closed() {
            return Err(StoreError::Closed);
        }
        match self.barrier(|reply| WriteOp::Flush { reply }).await {
            // A failed write is reported by `flush` and `check_writable`; the read
            // still shows what did commit.
            Ok(()) | Err(StoreError::Database(_)) => {}
            Err(err) => return Err(err),
        }
        if matches!(self.writer, Writing::Inline(_)) {
            let guard = lock(&self.reader);
            let conn = guard.as_ref().ok_or(StoreError::Closed)?;
            return query(conn);
        }
        let reader = Arc::clone(&self.reader);
        tokio::task::spawn_blocking(move || {
            let guard = lock(&reader);
            let conn = guard.as_ref().ok_or(StoreError::Closed)?;
            query(conn)
        })
        .await
        .map_err(|e| StoreError::Database(format!("store read task failed: {e}")))?
    }
}

impl Drop for SqliteStore {
    fn drop(&mut self) {
        // Without a sender the writer applies what is queued and exits; waiting for it
        // keeps those writes even if the process ends right after.
        self.tx = None;
        self.wake_writer();
        match &mut self.writer {
            Writing::Thread { handle, .. } => {
                let handle = handle.get_mut().unwrap_or_else(|e| e.into_inner()).take();
                if let Some(handle) = handle {
                    if handle.join().is_err() {
                        tracing::error!(path = %self.path.display(), "store writer thread panicked");
                    }
                }
            }
            Writing::Inline(inline) => {
                if let Some(mut inline) = inline.get_mut().unwrap_or_else(|e| e.into_inner()).take()
                {
                    inline.pump();
                }
            }
        }
    }
}

#[async_trait]
impl RunStore for SqliteStore {
    async fn insert_run(&self, run: NewRun) {
        self.queue(WriteOp::InsertRun(run)).await;
    }

    async fn mark_running(&self, run_id: RunId, engine: String, started_at_ms: i64) {
        self.queue(WriteOp::MarkRunning { run_id, engine, started_at_ms }).await;
    }

    async fn mark_cancelling(&self, run_id: RunId) {
        self.queue(WriteOp::MarkCancelling { run_id }).await;
    }

    async fn merge_stages(&self, run_id: RunId, stamps: Stamps) {
        if stamps.is_empty() {
            return;
        }
        self.queue(WriteOp::MergeStages { run_id, stamps: stamps.to_json().to_string() }).await;
    }

    async fn run_stages(&self, run_id: &str) -> Result<Stamps, StoreError> {
        let run_id = run_id.to_owned();
        self.point_read(move |conn| {
            let mut stmt =
                conn.prepare_cached("SELECT stages FROM runs WHERE run_id = ?1").map_err(db)?;
            let mut rows = stmt.query(params![run_id]).map_err(db)?;
            let text: Option<String> = match rows.next().map_err(db)? {
                Some(row) => row.get(0).map_err(db)?,
                None => None,
            };
            Ok(text
                .and_then(|text| serde_json::from_str(&text).ok())
                .map(|value| Stamps::from_json(&value))
                .unwrap_or_default())
        })
        .await
    }

    async fn finalize_run(&self, run: FinishedRun) {
        self.queue(WriteOp::FinalizeRun(run)).await;
    }

    async fn get_run(&self, run_id: &str) -> Result<Option<RunRecord>, StoreError> {
        let run_id = run_id.to_owned();
        self.point_read(move |conn| {
            let mut stmt = conn
                .prepare_cached(concat!("SELECT ", run_columns!(), " FROM runs WHERE run_id = ?1"))
                .map_err(db)?;
            let mut rows = stmt.query(params![run_id]).map_err(db)?;
            match rows.next().map_err(db)? {
                Some(row) => run_from_row(row).map(Some),
                None => Ok(None),
            }
        })
        .await
    }

    async fn list_runs(&self, filter: RunFilter) -> Result<Vec<RunRecord>, StoreError> {
        let limit = i64::try_from(filter.limit).unwrap_or(i64::MAX);
        self.read(move |conn| {
            // Two statements rather than `status = ?1 OR ?1 IS NULL`, so each can use its index.
            match filter.status {
                Some(status) => {
                    let mut stmt = conn
                        .prepare_cached(concat!(
                            "SELECT ",
                            run_columns!(),
                            " FROM runs WHERE status = ?1 ORDER BY created_at_ms DESC, rowid DESC LIMIT ?2"
                        ))
                        .map_err(db)?;
                    let rows = stmt.query(params![status.as_str(), limit]).map_err(db)?;
                    runs_from_rows(rows)
                }
                None => {
                    let mut stmt = conn
                        .prepare_cached(concat!(
                            "SELECT ",
                            run_columns!(),
                            " FROM runs ORDER BY created_at_ms DESC, rowid DESC LIMIT ?1"
                        ))
                        .map_err(db)?;
                    let rows = stmt.query(params![limit]).map_err(db)?;
                    runs_from_rows(rows)
                }
            }
        })
        .await
    }

    async fn session_runs(
        &self,
        session_key: &SessionKey,
        limit: usize,
    ) -> Result<Vec<RunRecord>, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let session_key = session_key.as_str().to_owned();
        self.read(move |conn| {
            let mut stmt = conn
                .prepare_cached(concat!(
                    "SELECT ",
                    run_columns!(),
                    " FROM runs WHERE session_key = ?1 ORDER BY seq LIMIT ?2"
                ))
                .map_err(db)?;
            let rows = stmt.query(params![session_key, limit]).map_err(db)?;
            runs_from_rows(rows)
        })
        .await
    }
}

#[async_trait]
impl UsageStore for SqliteStore {
    async fn usage_totals(&self, filter: &UsageFilter) -> Result<UsageTotals, StoreError> {
        let filter = filter.clone();
        self.read(move |conn| {
            let mut totals = UsageTotals::default();
            for sql in [
                concat!("SELECT ", usage_sums!("runs"), usage_where!()),
                concat!("SELECT ", usage_sums!("pruned_usage"), usage_where!()),
            ] {
                let mut stmt = conn.prepare_cached(sql).map_err(db)?;
                let mut rows = stmt.query(usage_params(&filter)).map_err(db)?;
                if let Some(row) = rows.next().map_err(db)? {
                    totals = totals.plus(&totals_from_row(row, 0)?);
                }
            }
            Ok(totals)
        })
        .await
    }

    async fn usage_by(
        &self,
        filter: &UsageFilter,
        group: UsageGroup,
    ) -> Result<Vec<(String, UsageTotals)>, StoreError> {
        let filter = filter.clone();
        self.read(move |conn| {
            // The same grouped sums over the runs and over what deleted runs spent.
            macro_rules! grouped {
                ($column:literal) => {
                    [
                        concat!(
                            "SELECT ",
                            $column,
                            ", ",
                            usage_sums!("runs"),
                            usage_where!(),
                            " GROUP BY ",
                            $column
                        ),
                        concat!(
                            "SELECT ",
                            $column,
                            ", ",
                            usage_sums!("pruned_usage"),
                            usage_where!(),
                            " GROUP BY ",
                            $column
                        ),
                    ]
                };
            }
            let queries = match group {
                UsageGroup::Engine => grouped!("engine"),
                UsageGroup::Session => grouped!("session_key"),
            };
            let mut groups: std::collections::BTreeMap<String, UsageTotals> = Default::default();
            for sql in queries {
                let mut stmt = conn.prepare_cached(sql).map_err(db)?;
                let mut rows = stmt.query(usage_params(&filter)).map_err(db)?;
                while let Some(row) = rows.next().map_err(db)? {
                    let group = groups.entry(row.get::<_, String>(0).map_err(db)?).or_default();
                    *group = group.plus(&totals_from_row(row, 1)?);
                }
            }
            Ok(groups.into_iter().collect())
        })
        .await
    }
}

fn usage_params(filter: &UsageFilter) -> (i64, Option<String>, Option<String>) {
    (
        filter.since_ms,
        filter.session_key.as_ref().map(|key| key.as_str().to_owned()),
        filter.engine.clone(),
    )
}

#[async_trait]
impl RetentionStore for SqliteStore {
    async fn prune(&self, step: PruneStep) -> Result<u64, StoreError> {
        if self.is_closed() {
            return Err(StoreError::Closed);
        }
        let tx = self.tx.as_ref().ok_or(StoreError::Closed)?;
        let (reply, answer) = oneshot::channel();
        self.send(tx, WriteOp::Prune { step, reply }).await.map_err(|_| StoreError::Closed)?;
        self.wake_writer();
        self.pump_if(|_| true);
        answer.await.map_err(|_| StoreError::Closed)?
    }

    async fn table_rows(&self) -> Result<Vec<(String, u64)>, StoreError> {
        self.read(|conn| prune::table_rows(conn).map_err(db)).await
    }

    async fn used_bytes(&self) -> Result<u64, StoreError> {
        self.point_read(|conn| prune::used_bytes(conn).map_err(db)).await
    }
}

#[async_trait]
impl RunEventStore for SqliteStore {
    async fn append_event(&self, event: Arc<BusEvent>) {
        self.queue(WriteOp::AppendEvent(event)).await;
    }

    async fn run_events(&self, run_id: &str) -> Result<Vec<StoredEvent>, StoreError> {
        let run_id = run_id.to_owned();
        self.read(move |conn| read_run_events(conn, &run_id)).await
    }

    async fn runs_events(&self, run_ids: Vec<String>) -> Result<Vec<Vec<StoredEvent>>, StoreError> {
        self.read(move |conn| {
            // One read transaction, so every run is seen at the same moment.
            conn.execute_batch("BEGIN").map_err(db)?;
            let all: Result<Vec<_>, _> =
                run_ids.iter().map(|run_id| read_run_events(conn, run_id)).collect();
            // Ended whether or not a run could be read.
            let ended = conn.execute_batch("COMMIT").map_err(db);
            let all = all?;
            ended.map(|()| all)
        })
        .await
    }
}

/// A run's events in index order, on `conn`.
fn read_run_events(conn: &Connection, run_id: &str) -> Result<Vec<StoredEvent>, StoreError> {
    let mut stmt = conn
        .prepare_cached(
            "SELECT idx, kind, data FROM run_events
             WHERE run_seq = (SELECT seq FROM runs WHERE run_id = ?1
                              UNION ALL SELECT seq FROM event_only_runs WHERE run_id = ?1)
             ORDER BY idx",
        )
        .map_err(db)?;
    let mut rows = stmt.query(params![run_id]).map_err(db)?;
    let mut events = Vec::new();
    while let Some(row) = rows.next().map_err(db)? {
        let first: i64 = row.get(0).map_err(db)?;
        let data: String = row.get(2).map_err(db)?;
        // A row holds one or more consecutive events, one JSON object per line.
        columns::push_events(&mut events, run_id, first, &data)?;
    }
    Ok(events)
}

impl SqliteStore {
    /// A session's chat state as the file holds it.
    fn read_chat_state(&self, session_key: &SessionKey) -> Result<Option<ChatState>, StoreError> {
        self.lookup(|conn| {
            let mut stmt = conn
                .prepare_cached(
                    "SELECT last_engine, last_resume_token, updated_at_ms, expires_at_ms
                         FROM chat_state WHERE session_key = ?1",
                )
                .map_err(db)?;
            let mut rows = stmt.query(params![session_key.as_str()]).map_err(db)?;
            let Some(row) = rows.next().map_err(db)? else { return Ok(None) };
            Ok(Some(ChatState {
                last_engine: row.get(0).map_err(db)?,
                last_resume_token: row.get(1).map_err(db)?,
                updated_at_ms: row.get(2).map_err(db)?,
                expires_at_ms: row.get(3).map_err(db)?,
            }))
        })
    }
}

#[async_trait]
impl ChatStateStore for SqliteStore {
    async fn put_chat_state(
        &self,
        session_key: &SessionKey,
        last_engine: &str,
        last_resume_token: &str,
        now_ms: i64,
    ) {
        let state = ChatState {
            last_engine: last_engine.to_owned(),
            last_resume_token: last_resume_token.to_owned(),
            updated_at_ms: now_ms,
            expires_at_ms: now_ms.saturating_add(self.chat_state_ttl_ms),
        };
        if self.is_closed() {
            tracing::warn!(op = "put_chat_state", "write to a closed store dropped");
            return;
        }
        let version = self.chat_states.note(session_key, Some(state.clone()));
        self.queue(WriteOp::PutChatState {
            session_key: session_key.clone(),
            last_engine: state.last_engine,
            last_resume_token: state.last_resume_token,
            updated_at_ms: state.updated_at_ms,
            expires_at_ms: state.expires_at_ms,
            version,
        })
        .await;
    }

    async fn get_chat_state(
        &self,
        session_key: &SessionKey,
        now_ms: i64,
    ) -> Result<Option<ChatState>, StoreError> {
        let state = match self.chat_states.get(session_key) {
            Known::State(state) if !self.is_closed() => state,
            Known::State(_) => return Err(StoreError::Closed),
            Known::Unknown { mark } => {
                let state = self.read_chat_state(session_key)?;
                self.chat_states.remember(session_key, state.clone(), mark);
                state
            }
        };
        match state {
            Some(state) if state.expires_at_ms <= now_ms => {
                // Tidying up is optional, so it never waits for a queue slot.
                if let Some(tx) = &self.tx {
                    let _ = tx.try_send(WriteOp::DeleteExpiredChatState {
                        session_key: session_key.clone(),
                        now_ms,
                    });
                }
                Ok(None)
            }
            other => Ok(other),
        }
    }

    async fn delete_chat_state(&self, session_key: &SessionKey) {
        if self.is_closed() {
            tracing::warn!(op = "delete_chat_state", "write to a closed store dropped");
            return;
        }
        let version = self.chat_states.note(session_key, None);
        self.queue(WriteOp::DeleteChatState { session_key: session_key.clone(), version }).await;
    }
}

#[async_trait]
impl JournalStore for SqliteStore {
    async fn journal_admit(&self, entry: JournalEntry) {
        self.queue(WriteOp::JournalAdmit(Box::new(entry))).await;
    }

    async fn journal_mark_started(&self, run_id: &RunId) {
        self.queue(WriteOp::JournalStarted { run_id: run_id.clone() }).await;
    }

    async fn journal_complete(&self, run_id: &RunId) {
        self.queue(WriteOp::JournalComplete { run_id: run_id.clone() }).await;
    }

    async fn journal_pending(&self) -> Result<Vec<JournalEntry>, StoreError> {
        self.read(|conn| {
            let mut stmt = conn
                .prepare_cached(
                    "SELECT run_id, seq, session_key, conversation, prompt, engine, resume_engine,
                        resume_value, cwd, meta, route, state, accepted_at_ms
                     FROM journal ORDER BY seq",
                )
                .map_err(db)?;
            let mut rows = stmt.query([]).map_err(db)?;
            let mut entries = Vec::new();
            while let Some(row) = rows.next().map_err(db)? {
                entries.push(journal_from_row(row)?);
            }
            Ok(entries)
        })
        .await
    }
}

#[async_trait]
impl KvStore for SqliteStore {
    async fn kv_put(
        &self,
        namespace: &str,
        key: &str,
        value: serde_json::Value,
        expires_at_ms: Option<i64>,
    ) {
        let op = WriteOp::KvPut {
            namespace: namespace.to_owned(),
            key: key.to_owned(),
            value,
            expires_at_ms,
        };
        self.queue(op).await;
    }

    async fn kv_get(
        &self,
        namespace: &str,
        key: &str,
        now_ms: i64,
    ) -> Result<Option<serde_json::Value>, StoreError> {
        let (namespace, key) = (namespace.to_owned(), key.to_owned());
        self.point_read_kv(now_ms, move |conn| {
            let mut stmt = conn
                .prepare_cached(
                    "SELECT value FROM kv WHERE namespace = ?1 AND key = ?2
                         AND (expires_at_ms IS NULL OR expires_at_ms > ?3)",
                )
                .map_err(db)?;
            let mut rows = stmt.query(params![namespace, key, now_ms]).map_err(db)?;
            let value = match rows.next().map_err(db)? {
                Some(row) => {
                    let text: String = row.get(0).map_err(db)?;
                    Some(parse_json(&text, || format!("kv record {namespace}/{key}"))?)
                }
                None => None,
            };
            Ok(value)
        })
        .await
    }

    async fn kv_delete(&self, namespace: &str, key: &str) {
        self.queue(WriteOp::KvDelete { namespace: namespace.to_owned(), key: key.to_owned() })
            .await;
    }

    async fn kv_list(
        &self,
        namespace: &str,
        now_ms: i64,
    ) -> Result<Vec<(String, serde_json::Value)>, StoreError> {
        let namespace = namespace.to_owned();
        self.read_kv(now_ms, move |conn| {
            let mut stmt = conn
                .prepare_cached(
                    "SELECT key, value FROM kv WHERE namespace = ?1
                         AND (expires_at_ms IS NULL OR expires_at_ms > ?2) ORDER BY key",
                )
                .map_err(db)?;
            let mut rows = stmt.query(params![namespace, now_ms]).map_err(db)?;
            let mut records = Vec::new();
            while let Some(row) = rows.next().map_err(db)? {
                let key: String = row.get(0).map_err(db)?;
                let text: String = row.get(1).map_err(db)?;
                let value = parse_json(&text, || format!("kv record {namespace}/{key}"))?;
                records.push((key, value));
            }
            Ok(records)
        })
        .await
    }
}

#[async_trait]
impl StoreLifecycle for SqliteStore {
    async fn flush(&self) -> Result<(), StoreError> {
        if self.is_closed() {
            return Err(StoreError::Closed);
        }
        self.barrier(|reply| WriteOp::Flush { reply }).await
    }

    async fn check_writable(&self) -> Result<(), StoreError> {
        if self.is_closed() {
            return Err(StoreError::Closed);
        }
        let now_ms = crate::clock::now_ms();
        self.barrier(|reply| WriteOp::CheckWritable { now_ms, reply }).await
    }

    async fn close(&self) -> Result<(), StoreError> {
        self.closed.store(true, Ordering::Release);
        // A second close finds the writer gone; that is not an error.
        let result = match self.barrier(|reply| WriteOp::Stop { reply }).await {
            Err(StoreError::Closed) => Ok(()),
            other => other,
        };
        let handle = match &self.writer {
            Writing::Thread { handle, .. } => lock(handle).take(),
            Writing::Inline(inline) => {
                // The stop is applied; so is anything queued after it, then the
                // write connection closes, on this task, as everything inline does.
                if let Some(mut inline) = lock(inline).take() {
                    inline.pump();
                }
                drop(lock(&self.reader).take());
                drop(lock(&self.lookup).take());
                drop(lock(&self.file_lock).take());
                tracing::debug!(path = %self.path.display(), "store closed");
                return result;
            }
        };
        let readers = (lock(&self.reader).take(), lock(&self.lookup).take());
        // Joining waits for the writer to drain, and closing the last connection
        // checkpoints the log into the file: both block, so neither runs on the runtime.
        let joined = tokio::task::spawn_blocking(move || {
            let joined = handle.map_or(Ok(()), |handle| handle.join());
            drop(readers);
            joined
        })
        .await;
        if !matches!(joined, Ok(Ok(()))) {
            tracing::error!(path = %self.path.display(), "store writer thread panicked");
            return Err(StoreError::Database("store writer thread panicked".to_owned()));
        }
        drop(lock(&self.file_lock).take());
        tracing::debug!(path = %self.path.display(), "store closed");
        result
    }
}

/// Opens one connection with the settings every connection shares.
/// Creates the database file with mode 0600 when it is missing and sets an existing
/// one (and its `-wal` and `-shm` files) to 0600, whatever the directory's mode or
/// the process's umask: the file holds every prompt, answer and resume id. SQLite
/// gives the log and shared-memory files the database file's mode when it creates
/// them.
fn make_private(path: &Path) -> Result<(), String> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let private = std::fs::Permissions::from_mode(0o600);
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(path)
        .map_err(|e| format!("cannot create {}: {e}", path.display()))?;
    for suffix in ["", "-wal", "-shm"] {
        let mut file = path.as_os_str().to_owned();
        file.push(suffix);
        match std::fs::set_permissions(&file, private.clone()) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(format!("cannot make {} private: {e}", Path::new(&file).display()))
            }
        }
    }
    Ok(())
}

fn connect(path: &Path) -> Result<Connection, String> {
    let conn = Connection::open(path).map_err(|e| e.to_string())?;
    conn.busy_handler(Some(wait_for_lock)).map_err(|e| e.to_string())?;
    // Before WAL, whose switch writes a new file's header: a new file gives
    // freed pages back incrementally (an existing one is converted by
    // `prune::use_incremental_vacuum`; for it this line alone changes nothing).
    conn.pragma_update(None, "auto_vacuum", "INCREMENTAL").map_err(|e| e.to_string())?;
    // WAL lets the reader read while the writer writes; NORMAL syncs only at
    // checkpoints, so a commit is an append to the log. A power cut may lose the
    // last commits but never corrupts the file.
    let mode: String = conn
        .pragma_update_and_check(None, "journal_mode", "wal", |row| row.get(0))
        .map_err(|e| e.to_string())?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(format!("journal mode is {mode}, not wal"));
    }
    conn.pragma_update(None, "synchronous", "NORMAL").map_err(|e| e.to_string())?;
    // Run events are not tied to runs by a foreign key: events may be stored for a
    // run that was never inserted, as in the memory backend.
    conn.pragma_update(None, "foreign_keys", false).map_err(|e| e.to_string())?;
    conn.set_prepared_statement_cache_capacity(64);
    Ok(conn)
}

/// Whether any `kv` record has expired at `now_ms` (one probe of the expiry index).
fn any_kv_expired(conn: &Connection, now_ms: i64) -> Result<bool, StoreError> {
    let mut stmt = conn
        .prepare_cached(
            "SELECT EXISTS (SELECT 1 FROM kv WHERE expires_at_ms IS NOT NULL AND expires_at_ms <= ?1)",
        )
        .map_err(db)?;
    stmt.query_row(params![now_ms], |row| row.get(0)).map_err(db)
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

fn db(err: rusqlite::Error) -> StoreError {
    StoreError::Database(err.to_string())
}

fn runs_from_rows(mut rows: Rows<'_>) -> Result<Vec<RunRecord>, StoreError> {
    let mut runs = Vec::new();
    while let Some(row) = rows.next().map_err(db)? {
        runs.push(run_from_row(row)?);
    }
    Ok(runs)
}

/// A usage row: the run count at `first`, then the spend.
fn totals_from_row(row: &Row<'_>, first: usize) -> Result<UsageTotals, StoreError> {
    let runs: i64 = row.get(first).map_err(db)?;
    let spend = columns::read_spend_columns!(first + 1, i => row.get(i).map_err(db)?);
    Ok(UsageTotals { runs: u64::try_from(runs).unwrap_or(0), spend: spend.spend() })
}

fn run_from_row(row: &Row<'_>) -> Result<RunRecord, StoreError> {
    columns::read_run_columns!(i => row.get(i).map_err(db)?).into_record()
}

fn journal_from_row(row: &Row<'_>) -> Result<JournalEntry, StoreError> {
    columns::read_journal_columns!(i => row.get(i).map_err(db)?).into_entry()
}
