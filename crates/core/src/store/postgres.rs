//! The PostgreSQL backend: the same store as [`super::sqlite`], in a database
//! several gateway nodes can share (cluster mode), or that one node uses
//! instead of the file.
//!
//! Connections come from a pool (`deadpool-postgres`, `[gateway.store]
//! pool_size`). Schema migrations are versioned and applied at connect time by
//! one node under an advisory lock (`schema`).
//!
//! Writes are queued for one writer task, which owns their order and applies
//! them in batches, one transaction a batch (`writer`): a caller waits only
//! for a queue slot, and a database that is briefly unreachable delays writes
//! instead of losing them. Reads first send a flush barrier through the same
//! queue, then query a pooled connection, so a read sees every write queued
//! before it on the same store; a read that meets a broken connection is
//! tried again on another. Dropping the store without
//! [`StoreLifecycle::close`] still applies what is queued, as long as the
//! runtime runs: the writer drains its queue once the sender is gone.
//!
//! In cluster mode the writes of a run (and of a session's chat state) land
//! only while this node holds the session's lease at the epoch the run was
//! registered under (`fence`), checked by the writer in each batch's own
//! transaction, and a batch that wrote events notifies `lemon_events`.
//!
//! JSON is kept as the text the gateway wrote, as on SQLite, and text sorts
//! byte by byte (`COLLATE "C"`) wherever order shows, whatever the database's
//! collation.
//!
//! Files: `connect` (the connection string, TLS, the pool), `schema`
//! (migrations), `writer` (the writer task: batches, retries, the SQL of
//! every write), `prune` (retention's steps, rows and bytes), `rows` (rows
//! read back into the store's types).

mod connect;
pub mod fence;
mod holder;
mod prune;
mod rows;
mod schema;
mod writer;

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use deadpool_postgres::{Object, Pool, PoolError};
use futures::future::BoxFuture;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use self::fence::WriteFence;
use self::rows::ReadError;
use self::writer::{sql_limit, Queued, Write, WriteOp};
use super::columns;
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

/// How many times a read is tried when its connection fails.
const READ_TRIES: u32 = 3;

/// The wait before a read's third try. The second goes at once: the pool hands
/// out another connection, most likely one it has not seen fail yet.
const READ_RETRY_DELAY: Duration = Duration::from_millis(50);

/// The columns [`rows::run_from_row`] reads, in order; a macro so queries are
/// `concat!`ed at compile time.
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
            "count(*), coalesce(sum(input_tokens), 0)::bigint, \
             coalesce(sum(output_tokens), 0)::bigint, coalesce(sum(cache_read_tokens), 0)::bigint, \
             coalesce(sum(cache_write_tokens), 0)::bigint, coalesce(sum(cost_usd), 0)::float8 FROM ",
            $table
        )
    };
}

/// The `WHERE` clause of a usage query: `$1` since, `$2` session, `$3` engine.
macro_rules! usage_where {
    () => {
        " WHERE completed_at_ms >= $1 AND ($2::text IS NULL OR session_key = $2) \
          AND ($3::text IS NULL OR engine = $3)"
    };
}

/// Both tables' sums, in one statement so that both are read in one snapshot
/// (a retention step moving a run's spend between them is seen whole).
const USAGE_TOTALS: &str = concat!(
    "SELECT ",
    usage_sums!("runs"),
    usage_where!(),
    " UNION ALL SELECT ",
    usage_sums!("pruned_usage"),
    usage_where!()
);

/// [`USAGE_TOTALS`] grouped by `$column`.
macro_rules! usage_by {
    ($column:literal) => {
        concat!(
            "SELECT ",
            $column,
            ", ",
            usage_sums!("runs"),
            usage_where!(),
            " GROUP BY ",
            $column,
            " UNION ALL SELECT ",
            $column,
            ", ",
            usage_sums!("pruned_usage"),
            usage_where!(),
            " GROUP BY ",
            $column
        )
    };
}

const USAGE_BY_ENGINE: &str = usage_by!("engine");
const USAGE_BY_SESSION: &str = usage_by!("session_key");

const GET_RUN: &str = concat!("SELECT ", run_columns!(), " FROM runs WHERE run_id = $1");

/// Newest first; runs created in the same millisecond in insertion order (`seq`), newest first.
const LIST_RUNS: &str =
    concat!("SELECT ", run_columns!(), " FROM runs ORDER BY created_at_ms DESC, seq DESC LIMIT $1");

const LIST_RUNS_BY_STATUS: &str = concat!(
    "SELECT ",
    run_columns!(),
    " FROM runs WHERE status = $1 ORDER BY created_at_ms DESC, seq DESC LIMIT $2"
);

const SESSION_RUNS: &str =
    concat!("SELECT ", run_columns!(), " FROM runs WHERE session_key = $1 ORDER BY seq LIMIT $2");

const RUN_EVENTS: &str = "SELECT idx, data FROM run_events WHERE run_id = $1 ORDER BY idx";

/// One statement for many runs, so every run is seen at the same moment.
const RUNS_EVENTS: &str =
    "SELECT run_id, idx, data FROM run_events WHERE run_id = ANY($1) ORDER BY run_id, idx";

const GET_CHAT_STATE: &str = "SELECT last_engine, last_resume_token, updated_at_ms, expires_at_ms
    FROM chat_state WHERE session_key = $1";

const JOURNAL_PENDING: &str = "SELECT run_id, seq, session_key, conversation, prompt, engine,
        resume_engine, resume_value, cwd, meta, route, state, accepted_at_ms
    FROM journal ORDER BY seq";

/// The record, and whether any record has expired at `$3` (one probe of the
/// expiry index), so that the read can ask for a few to be purged.
const KV_GET: &str = "SELECT
        (SELECT value FROM kv WHERE namespace = $1 AND key = $2
            AND (expires_at_ms IS NULL OR expires_at_ms > $3)),
        EXISTS (SELECT 1 FROM kv WHERE expires_at_ms IS NOT NULL AND expires_at_ms <= $3)";

const KV_LIST: &str = r#"SELECT key, value FROM kv WHERE namespace = $1
        AND (expires_at_ms IS NULL OR expires_at_ms > $2) ORDER BY key COLLATE "C""#;

const KV_ANY_EXPIRED: &str =
    "SELECT EXISTS (SELECT 1 FROM kv WHERE expires_at_ms IS NOT NULL AND expires_at_ms <= $1)";

/// Where and how a [`PostgresStore`] connects.
#[derive(Clone)]
pub struct PostgresConfig {
    /// The connection string: a secret (it may hold the password); never
    /// logged or put in an error.
    pub url: String,
    /// At most this many connections.
    pub pool_size: usize,
    /// How long chat state lives after its last write.
    pub chat_state_ttl_ms: i64,
    /// Whether this store must be the only one on its database: a gateway
    /// that is not in cluster mode, which would otherwise recover another
    /// gateway's journal and run its messages twice (see `holder`).
    pub exclusive: bool,
}

impl fmt::Debug for PostgresConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresConfig")
            .field("url", &"<secret>")
            .field("pool_size", &self.pool_size)
            .field("chat_state_ttl_ms", &self.chat_state_ttl_ms)
            .field("exclusive", &self.exclusive)
            .finish()
    }
}

/// The PostgreSQL store. Dropping it without [`StoreLifecycle::close`] still
/// applies every write already queued, on the runtime it was connected on:
/// the writer task drains its queue once the sender is gone.
pub struct PostgresStore {
    /// `postgres://host:port/database`, for logs and errors.
    target: String,
    /// Shared with the writer task and with what shares the database.
    pool: Pool,
    /// The writer's queue; the writer exits once this is dropped (or `Stop`
    /// is sent) and the queue is empty.
    tx: mpsc::Sender<WriteOp>,
    /// The writer task, awaited by `close` once it has applied everything.
    writer: Mutex<Option<JoinHandle<()>>>,
    /// Set by `close`: later writes are dropped with a warning and reads fail.
    closed: AtomicBool,
    chat_state_ttl_ms: i64,
    /// The one-gateway lock of an exclusive store, let go by `close` (or drop).
    holder: Mutex<Option<holder::Holder>>,
    /// The connection settings, for a node's own listening connection.
    settings: tokio_postgres::Config,
    /// Which writes are fenced by which lease (cluster mode).
    fences: fence::Fences,
}

impl fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresStore")
            .field("target", &self.target)
            .field("closed", &self.closed.load(Ordering::Relaxed))
            .field("chat_state_ttl_ms", &self.chat_state_ttl_ms)
            .finish_non_exhaustive()
    }
}

/// A query run on a pooled connection; it may be run again on another one.
type Query<'c, T> = BoxFuture<'c, Result<T, ReadError>>;

impl PostgresStore {
    /// Connects, applies the migrations the database has not seen (one node at
    /// a time), opens the pool and starts the writer task on the current
    /// runtime.
    ///
    /// # Errors
    /// [`StoreError::Open`] naming `host:port/database` (never the user or the
    /// password) when the string cannot be read, the server cannot be reached
    /// or refuses the login, a migration fails, or the database comes from a
    /// newer build.
    ///
    /// # Cancel safety
    /// Dropping the future before it ends leaves at most a migration rolled
    /// back; no writer has started.
    pub async fn connect(config: PostgresConfig) -> Result<PostgresStore, StoreError> {
        let parsed = connect::parse(&config.url)
            .map_err(|message| StoreError::Open { path: "postgres".to_owned(), message })?;
        let target = connect::describe(&parsed);
        let open_error = |message: String| StoreError::Open { path: target.clone(), message };
        let holder = match config.exclusive {
            true => Some(
                holder::Holder::take(parsed.clone(), target.clone()).await.map_err(open_error)?,
            ),
            false => None,
        };
        let pool = connect::pool(parsed.clone(), config.pool_size).map_err(open_error)?;
        let mut client = pool.get().await.map_err(|e| open_error(connect::pool_error_text(&e)))?;
        schema::migrate(&mut client).await.map_err(open_error)?;
        drop(client);
        let (tx, rx) = mpsc::channel(writer::QUEUE_CAPACITY);
        let fences = fence::Fences::default();
        let handle = tokio::spawn(writer::Writer::new(pool.clone(), rx, fences.clone()).run());
        tracing::debug!(target = %target, "store opened");
        Ok(PostgresStore {
            target,
            pool,
            tx,
            writer: Mutex::new(Some(handle)),
            closed: AtomicBool::new(false),
            chat_state_ttl_ms: config.chat_state_ttl_ms,
            holder: Mutex::new(holder),
            settings: parsed,
            fences,
        })
    }

    /// Which writes are fenced by which lease; cluster mode registers its runs here.
    pub fn fences(&self) -> &fence::Fences {
        &self.fences
    }

    /// The connection settings (the login included: never log them) and the
    /// TLS connector, for a connection of a node's own, such as a listener's.
    pub fn connection_settings(
        &self,
    ) -> (tokio_postgres::Config, tokio_postgres_rustls::MakeRustlsConnect) {
        (self.settings.clone(), connect::tls())
    }

    /// `postgres://host:port/database`: where it is, without the login.
    pub fn target(&self) -> &str {
        &self.target
    }

    /// The connection pool, for what shares the database with the store.
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Hands a write that is conditional on no lease to the writer.
    async fn queue(&self, write: Write) {
        self.queue_fenced(write, WriteFence::None).await;
    }

    /// Hands a write to the writer, waiting for a queue slot, with the fence
    /// it was queued under; drops it once closed, or when the node is fenced.
    async fn queue_fenced(&self, write: Write, fence: WriteFence) {
        let fence = match fence {
            WriteFence::None => None,
            WriteFence::Lease(fence) => Some(fence),
            WriteFence::Refused => {
                let run_id = write.run_id().unwrap_or_default();
                tracing::debug!(op = write.name(), run_id, "write of a fenced node dropped");
                return;
            }
        };
        if self.is_closed() {
            tracing::warn!(op = write.name(), "write to a closed store dropped");
            return;
        }
        if let Err(mpsc::error::SendError(WriteOp::Write(queued))) =
            self.tx.send(WriteOp::Write(Queued { write, fence })).await
        {
            tracing::warn!(op = queued.write.name(), "write to a closed store dropped");
        }
    }

    /// Queues a write that tidies up (expired records); tidying up is optional,
    /// so it never waits for a queue slot, and a later read asks again.
    fn tidy(&self, write: Write) {
        if !self.is_closed() {
            let _ = self.tx.try_send(WriteOp::Write(Queued { write, fence: None }));
        }
    }

    /// Sends a barrier built around a reply channel and waits for its answer.
    async fn barrier(&self, op: impl FnOnce(writer::Reply) -> WriteOp) -> Result<(), StoreError> {
        let (reply, answer) = oneshot::channel();
        self.tx.send(op(reply)).await.map_err(|_| StoreError::Closed)?;
        answer.await.map_err(|_| StoreError::Closed)?
    }

    /// Runs `query` on a pooled connection once every write queued before
    /// this call is committed.
    async fn read<T, F>(&self, query: F) -> Result<T, StoreError>
    where
        T: Send,
        F: for<'c> Fn(&'c Object) -> Query<'c, T> + Send + Sync,
    {
        if self.is_closed() {
            return Err(StoreError::Closed);
        }
        match self.barrier(|reply| WriteOp::Flush { reply }).await {
            // A failed write is reported by `flush` and `check_writable`; the
            // read still shows what did commit.
            Ok(()) | Err(StoreError::Database(_)) => {}
            Err(err) => return Err(err),
        }
        let mut tries = 1;
        loop {
            let (transient, message) = match self.pool.get().await {
                Ok(client) => match query(&client).await {
                    Ok(found) => return Ok(found),
                    Err(ReadError::Store(error)) => return Err(error),
                    Err(ReadError::Driver(error)) => {
                        let transient = writer::is_transient(&error);
                        if transient {
                            writer::discard(client);
                        }
                        (transient, connect::error_text(&error))
                    }
                },
                Err(error) => {
                    let transient = match &error {
                        PoolError::Backend(error) => writer::is_transient(error),
                        _ => false,
                    };
                    (transient, connect::pool_error_text(&error))
                }
            };
            if !transient || tries >= READ_TRIES {
                return Err(StoreError::Database(message));
            }
            tokio::time::sleep(READ_RETRY_DELAY * (tries - 1)).await;
            tries += 1;
        }
    }
}

/// A pool error at connect time as one line; a refused login says only that
/// (the server's message names the user).
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

#[async_trait]
impl RunStore for PostgresStore {
    async fn insert_run(&self, run: NewRun) {
        let fence = self.fences.of_run(run.run_id.as_str());
        self.queue_fenced(Write::InsertRun(run), fence).await;
    }

    async fn mark_running(&self, run_id: RunId, engine: String, started_at_ms: i64) {
        let fence = self.fences.of_run(run_id.as_str());
        self.queue_fenced(Write::MarkRunning { run_id, engine, started_at_ms }, fence).await;
    }

    async fn mark_cancelling(&self, run_id: RunId) {
        let fence = self.fences.of_run(run_id.as_str());
        self.queue_fenced(Write::MarkCancelling { run_id }, fence).await;
    }

    async fn merge_stages(&self, run_id: RunId, stamps: Stamps) {
        // Unfenced: each node adds the stages it saw, and none overwrites another's.
        if !stamps.is_empty() {
            self.queue(Write::MergeStages { run_id, stamps: stamps.to_json().to_string() }).await;
        }
    }

    async fn run_stages(&self, run_id: &str) -> Result<Stamps, StoreError> {
        let run_id = writer::text(run_id);
        let text: Option<String> = self
            .read(move |client| {
                let run_id = run_id.clone();
                Box::pin(async move {
                    let stmt =
                        client.prepare_cached("SELECT stages FROM runs WHERE run_id = $1").await?;
                    let row = client.query_opt(&stmt, &[&run_id]).await?;
                    Ok(row.and_then(|row| row.get::<_, Option<String>>(0)))
                })
            })
            .await?;
        Ok(text
            .and_then(|text| serde_json::from_str(&text).ok())
            .map(|value| Stamps::from_json(&value))
            .unwrap_or_default())
    }

    async fn finalize_run(&self, run: FinishedRun) {
        let fence = self.fences.of_run(run.run_id.as_str());
        self.queue_fenced(Write::FinalizeRun(run), fence).await;
    }

    async fn get_run(&self, run_id: &str) -> Result<Option<RunRecord>, StoreError> {
        let run_id = writer::text(run_id);
        self.read(move |client| {
            let run_id = run_id.clone();
            Box::pin(async move {
                let stmt = client.prepare_cached(GET_RUN).await?;
                let row = client.query_opt(&stmt, &[&run_id]).await?;
                row.as_ref().map(rows::run_from_row).transpose()
            })
        })
        .await
    }

    async fn list_runs(&self, filter: RunFilter) -> Result<Vec<RunRecord>, StoreError> {
        let limit = sql_limit(filter.limit);
        let status = filter.status.map(|status| status.as_str());
        self.read(move |client| {
            Box::pin(async move {
                let found = match status {
                    Some(status) => {
                        let stmt = client.prepare_cached(LIST_RUNS_BY_STATUS).await?;
                        client.query(&stmt, &[&status, &limit]).await?
                    }
                    None => {
                        let stmt = client.prepare_cached(LIST_RUNS).await?;
                        client.query(&stmt, &[&limit]).await?
                    }
                };
                found.iter().map(rows::run_from_row).collect()
            })
        })
        .await
    }

    async fn session_runs(
        &self,
        session_key: &SessionKey,
        limit: usize,
    ) -> Result<Vec<RunRecord>, StoreError> {
        let limit = sql_limit(limit);
        let session_key = writer::text(session_key.as_str());
        self.read(move |client| {
            let session_key = session_key.clone();
            Box::pin(async move {
                let stmt = client.prepare_cached(SESSION_RUNS).await?;
                let found = client.query(&stmt, &[&session_key, &limit]).await?;
                found.iter().map(rows::run_from_row).collect()
            })
        })
        .await
    }
}

#[async_trait]
impl RunEventStore for PostgresStore {
    async fn append_event(&self, event: Arc<BusEvent>) {
        let fence = self.fences.of_run(event.run_id.as_str());
        self.queue_fenced(Write::AppendEvent(event), fence).await;
    }

    async fn run_events(&self, run_id: &str) -> Result<Vec<StoredEvent>, StoreError> {
        let run_id = writer::text(run_id);
        self.read(move |client| {
            let run_id = run_id.clone();
            Box::pin(async move {
                let stmt = client.prepare_cached(RUN_EVENTS).await?;
                let mut events = Vec::new();
                for row in client.query(&stmt, &[&run_id]).await? {
                    let idx: i64 = row.try_get(0)?;
                    let data: &str = row.try_get(1)?;
                    columns::push_events(&mut events, &run_id, idx, data)?;
                }
                Ok(events)
            })
        })
        .await
    }

    async fn runs_events(&self, run_ids: Vec<String>) -> Result<Vec<Vec<StoredEvent>>, StoreError> {
        let run_ids = Arc::new(run_ids);
        self.read(move |client| {
            let run_ids = Arc::clone(&run_ids);
            Box::pin(async move {
                let stmt = client.prepare_cached(RUNS_EVENTS).await?;
                let mut by_run: std::collections::HashMap<String, Vec<StoredEvent>> =
                    std::collections::HashMap::new();
                for row in client.query(&stmt, &[&*run_ids]).await? {
                    let run_id: &str = row.try_get(0)?;
                    let idx: i64 = row.try_get(1)?;
                    let data: &str = row.try_get(2)?;
                    let events = by_run.entry(run_id.to_owned()).or_default();
                    columns::push_events(events, run_id, idx, data)?;
                }
                Ok(run_ids.iter().map(|id| by_run.get(id).cloned().unwrap_or_default()).collect())
            })
        })
        .await
    }
}

#[async_trait]
impl ChatStateStore for PostgresStore {
    async fn put_chat_state(
        &self,
        session_key: &SessionKey,
        last_engine: &str,
        last_resume_token: &str,
        now_ms: i64,
    ) {
        let write = Write::PutChatState {
            session_key: session_key.clone(),
            last_engine: last_engine.to_owned(),
            last_resume_token: last_resume_token.to_owned(),
            updated_at_ms: now_ms,
            expires_at_ms: now_ms.saturating_add(self.chat_state_ttl_ms),
        };
        let fence = self.fences.of_session(session_key.as_str());
        self.queue_fenced(write, fence).await;
    }

    async fn get_chat_state(
        &self,
        session_key: &SessionKey,
        now_ms: i64,
    ) -> Result<Option<ChatState>, StoreError> {
        let key = writer::text(session_key.as_str());
        let state = self
            .read(move |client| {
                let key = key.clone();
                Box::pin(async move {
                    let stmt = client.prepare_cached(GET_CHAT_STATE).await?;
                    let Some(row) = client.query_opt(&stmt, &[&key]).await? else {
                        return Ok(None);
                    };
                    Ok(Some(ChatState {
                        last_engine: row.try_get(0)?,
                        last_resume_token: row.try_get(1)?,
                        updated_at_ms: row.try_get(2)?,
                        expires_at_ms: row.try_get(3)?,
                    }))
                })
            })
            .await?;
        match state {
            Some(state) if state.expires_at_ms <= now_ms => {
                self.tidy(Write::DeleteExpiredChatState {
                    session_key: session_key.clone(),
                    now_ms,
                });
                Ok(None)
            }
            other => Ok(other),
        }
    }

    async fn delete_chat_state(&self, session_key: &SessionKey) {
        let fence = self.fences.of_session(session_key.as_str());
        self.queue_fenced(Write::DeleteChatState { session_key: session_key.clone() }, fence).await;
    }
}

#[async_trait]
impl JournalStore for PostgresStore {
    async fn journal_admit(&self, entry: JournalEntry) {
        let fence = self.fences.of_run(entry.run_id.as_str());
        self.queue_fenced(Write::JournalAdmit(Box::new(entry)), fence).await;
    }

    async fn journal_mark_started(&self, run_id: &RunId) {
        let fence = self.fences.of_run(run_id.as_str());
        self.queue_fenced(Write::JournalStarted { run_id: run_id.clone() }, fence).await;
    }

    async fn journal_complete(&self, run_id: &RunId) {
        let fence = self.fences.of_run(run_id.as_str());
        self.queue_fenced(Write::JournalComplete { run_id: run_id.clone() }, fence).await;
    }

    async fn journal_pending(&self) -> Result<Vec<JournalEntry>, StoreError> {
        self.read(|client| {
            Box::pin(async move {
                let stmt = client.prepare_cached(JOURNAL_PENDING).await?;
                let found = client.query(&stmt, &[]).await?;
                found.iter().map(rows::journal_from_row).collect()
            })
        })
        .await
    }
}

#[async_trait]
impl KvStore for PostgresStore {
    async fn kv_put(
        &self,
        namespace: &str,
        key: &str,
        value: serde_json::Value,
        expires_at_ms: Option<i64>,
    ) {
        let write = Write::KvPut {
            namespace: namespace.to_owned(),
            key: key.to_owned(),
            value,
            expires_at_ms,
        };
        self.queue(write).await;
    }

    async fn kv_get(
        &self,
        namespace: &str,
        key: &str,
        now_ms: i64,
    ) -> Result<Option<serde_json::Value>, StoreError> {
        let (namespace, key) = (writer::text(namespace), writer::text(key));
        let (found, expired) = self
            .read(move |client| {
                let (namespace, key) = (namespace.clone(), key.clone());
                Box::pin(async move {
                    let stmt = client.prepare_cached(KV_GET).await?;
                    let row = client.query_one(&stmt, &[&namespace, &key, &now_ms]).await?;
                    let text: Option<String> = row.try_get(0)?;
                    let value = text
                        .map(|text| {
                            columns::parse_json(&text, || format!("kv record {namespace}/{key}"))
                        })
                        .transpose()?;
                    Ok((value, row.try_get::<_, bool>(1)?))
                })
            })
            .await?;
        if expired {
            self.tidy(Write::KvPurgeExpired { now_ms, limit: KV_PURGE_BATCH });
        }
        Ok(found)
    }

    async fn kv_delete(&self, namespace: &str, key: &str) {
        self.queue(Write::KvDelete { namespace: namespace.to_owned(), key: key.to_owned() }).await;
    }

    async fn kv_list(
        &self,
        namespace: &str,
        now_ms: i64,
    ) -> Result<Vec<(String, serde_json::Value)>, StoreError> {
        let namespace = writer::text(namespace);
        let (records, expired) = self
            .read(move |client| {
                let namespace = namespace.clone();
                Box::pin(async move {
                    let list = client.prepare_cached(KV_LIST).await?;
                    let any_expired = client.prepare_cached(KV_ANY_EXPIRED).await?;
                    // Both in flight at once.
                    let (list_params, expired_params) =
                        ([&namespace as _, &now_ms as _], [&now_ms as _]);
                    let (found, expired) = futures::try_join!(
                        client.query(&list, &list_params),
                        client.query_one(&any_expired, &expired_params),
                    )?;
                    let mut records = Vec::with_capacity(found.len());
                    for row in &found {
                        let key: String = row.try_get(0)?;
                        let text: &str = row.try_get(1)?;
                        let value =
                            columns::parse_json(text, || format!("kv record {namespace}/{key}"))?;
                        records.push((key, value));
                    }
                    Ok((records, expired.try_get::<_, bool>(0)?))
                })
            })
            .await?;
        if expired {
            self.tidy(Write::KvPurgeExpired { now_ms, limit: KV_PURGE_BATCH });
        }
        Ok(records)
    }
}

#[async_trait]
impl UsageStore for PostgresStore {
    async fn usage_totals(&self, filter: &UsageFilter) -> Result<UsageTotals, StoreError> {
        let filter = filter.clone();
        self.read(move |client| {
            let (since_ms, session, engine) = usage_params(&filter);
            Box::pin(async move {
                let stmt = client.prepare_cached(USAGE_TOTALS).await?;
                let mut totals = UsageTotals::default();
                for row in client.query(&stmt, &[&since_ms, &session, &engine]).await? {
                    totals = totals.plus(&rows::totals_from_row(&row, 0)?);
                }
                Ok(totals)
            })
        })
        .await
    }

    async fn usage_by(
        &self,
        filter: &UsageFilter,
        group: UsageGroup,
    ) -> Result<Vec<(String, UsageTotals)>, StoreError> {
        let filter = filter.clone();
        let sql = match group {
            UsageGroup::Engine => USAGE_BY_ENGINE,
            UsageGroup::Session => USAGE_BY_SESSION,
        };
        self.read(move |client| {
            let (since_ms, session, engine) = usage_params(&filter);
            Box::pin(async move {
                let stmt = client.prepare_cached(sql).await?;
                let mut groups: std::collections::BTreeMap<String, UsageTotals> =
                    Default::default();
                for row in client.query(&stmt, &[&since_ms, &session, &engine]).await? {
                    let group = groups.entry(row.try_get::<_, String>(0)?).or_default();
                    *group = group.plus(&rows::totals_from_row(&row, 1)?);
                }
                Ok(groups.into_iter().collect())
            })
        })
        .await
    }
}

fn usage_params(filter: &UsageFilter) -> (i64, Option<String>, Option<String>) {
    (
        filter.since_ms,
        filter.session_key.as_ref().map(|key| writer::text(key.as_str())),
        filter.engine.as_deref().map(writer::text),
    )
}

#[async_trait]
impl RetentionStore for PostgresStore {
    /// Applies one step on the writer's task, after the writes queued before
    /// it. [`PruneStep::Vacuum`] frees nothing and returns 0: PostgreSQL has
    /// no incremental vacuum, autovacuum already makes the room of deleted
    /// rows reusable, and giving it back to the file system (`VACUUM FULL`)
    /// locks whole tables, so it is left to the database's operator.
    async fn prune(&self, step: PruneStep) -> Result<u64, StoreError> {
        if self.is_closed() {
            return Err(StoreError::Closed);
        }
        if let PruneStep::Vacuum { .. } = step {
            return Ok(0);
        }
        let (reply, answer) = oneshot::channel();
        self.tx.send(WriteOp::Prune { step, reply }).await.map_err(|_| StoreError::Closed)?;
        answer.await.map_err(|_| StoreError::Closed)?
    }

    async fn table_rows(&self) -> Result<Vec<(String, u64)>, StoreError> {
        self.read(|client| Box::pin(async move { Ok(prune::table_rows(client).await?) })).await
    }

    /// Bytes of the store's tables, their indexes and TOAST, as the server
    /// counts them; the room autovacuum has freed for reuse counts too.
    async fn used_bytes(&self) -> Result<u64, StoreError> {
        self.read(|client| Box::pin(async move { Ok(prune::used_bytes(client).await?) })).await
    }
}

#[async_trait]
impl StoreLifecycle for PostgresStore {
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
        // Once the stop is answered cleanly, the writer only has what raced
        // with it left to apply. A writer that cannot reach the database keeps
        // trying on its own for a while (see `writer`) rather than hold up close.
        // The pool stays open for what shares the database; its connections
        // go when the last holder drops it.
        let handle = lock(&self.writer).take();
        if let (Ok(()), Some(handle)) = (&result, handle) {
            if handle.await.is_err() {
                tracing::error!(target = %self.target, "store writer task failed");
                return Err(StoreError::Database("store writer task failed".to_owned()));
            }
        }
        lock(&self.holder).take();
        tracing::debug!(target = %self.target, "store closed");
        result
    }
}

/// Databases for tests: each test gets one of its own on the server that
/// `LEMON_TEST_POSTGRES_URL` names (`scripts/test` starts one and sets it).
#[cfg(any(test, feature = "test-util"))]
pub mod testing {
    /// The environment variable that names the tests' server.
    pub const URL_VAR: &str = "LEMON_TEST_POSTGRES_URL";

    /// The tests' server, when one is configured. With `LEMON_REQUIRE_POSTGRES=1`
    /// (as `scripts/test` sets) a missing one fails the test instead of
    /// skipping the PostgreSQL half of it.
    ///
    /// # Panics
    /// When PostgreSQL is required and `LEMON_TEST_POSTGRES_URL` is unset.
    pub fn server_url() -> Option<String> {
        match std::env::var(URL_VAR) {
            Ok(url) if !url.is_empty() => Some(url),
            _ if std::env::var("LEMON_REQUIRE_POSTGRES").as_deref() == Ok("1") => {
                panic!("LEMON_REQUIRE_POSTGRES=1 but {URL_VAR} is unset: run scripts/test")
            }
            _ => None,
        }
    }

    /// Creates an empty database with a fresh name on the server at `server_url`
    /// and returns the connection string of it.
    ///
    /// # Panics
    /// When the server cannot be reached or the database cannot be created.
    pub async fn fresh_database(server_url: &str) -> String {
        let name = format!("lemon_test_{}", uuid::Uuid::new_v4().simple());
        let (client, connection) = tokio_postgres::connect(server_url, tokio_postgres::NoTls)
            .await
            .unwrap_or_else(|e| panic!("cannot reach the tests' PostgreSQL: {e}"));
        let driver = tokio::spawn(connection);
        client
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .unwrap_or_else(|e| panic!("cannot create database {name}: {e}"));
        drop(client);
        let _ = driver.await;
        with_dbname(server_url, &name)
    }

    /// `server_url` with its database replaced by `name`.
    fn with_dbname(server_url: &str, name: &str) -> String {
        let (base, query) = match server_url.split_once('?') {
            Some((base, query)) => (base, Some(query)),
            None => (server_url, None),
        };
        let scheme_end = base.find("://").map_or(0, |i| i + 3);
        let path_start = base[scheme_end..].find('/').map(|i| scheme_end + i);
        let host_part = path_start.map_or(base, |i| &base[..i]);
        match query {
            Some(query) => format!("{host_part}/{name}?{query}"),
            None => format!("{host_part}/{name}"),
        }
    }
}
