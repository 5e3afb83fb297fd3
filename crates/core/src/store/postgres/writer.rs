//! The writer: one task that owns the order of the store's writes.
//!
//! The store queues [`WriteOp`]s on a bounded channel and returns, so a caller
//! waits only for a queue slot. The writer takes one op, gathers whatever
//! else is queued (up to [`MAX_BATCH`] writes), sends the batch's statements
//! pipelined on one pooled connection inside one transaction, commits, and
//! only then answers the barriers (`Flush`, `CheckWritable`, `Stop`) that were
//! in the batch and runs its retention steps. A read sends a `Flush` first, so
//! it sees every write queued before it.
//!
//! A batch that fails because the connection broke or the server went away
//! (see [`is_transient`]) is not lost: the writer keeps it, takes another
//! connection and tries again, 50 ms later, then twice as long each time up
//! to 2 s. Barriers behind it are answered with the error from the first
//! failed try on, so callers hear of the trouble, and succeed again once a
//! try commits. A write the database refuses for what it holds (text with a
//! NUL byte, say) is logged and dropped on its own, and the rest of its batch
//! is applied without it, so one bad write never blocks the queue.
//!
//! In cluster mode a write of a run (or of a session's chat state) carries the
//! session lease it is conditional on ([`Queued::fence`]). A batch holding
//! such writes first checks all their leases in one statement of its own
//! transaction, which holds the live lease rows `FOR KEY SHARE` until it
//! commits, so a takeover (which changes the lease's epoch) waits for it; the
//! writes whose lease is no longer this node's at that epoch are left out and
//! the rest commits. A batch with no fenced write sends nothing more. Once the
//! node is fenced ([`Fences::fence_all`]), the fenced writes the writer holds
//! are dropped before its next batch, without asking the database. In cluster
//! mode a batch that wrote events also notifies [`Topic::Events`] in its
//! transaction, once per run, with the run's highest index in the batch.
//!
//! The writer exits once its queue is closed (`Stop`, or every sender
//! dropped) and empty, having applied everything it took. Only a writer whose
//! queue is closed gives up: once its tries have been failing for
//! [`GIVE_UP_AFTER`], it logs how many writes are lost and exits.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{Object, Pool};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_postgres::types::ToSql;

use super::super::{FinishedRun, JournalEntry, NewRun, PruneStep, StoreError};
use super::connect::{error_text, pool_error_text};
use super::fence::{Fence, Fences};
use crate::cluster::Topic;
use crate::ids::{RunId, SessionKey};

/// Writes that may wait for the writer before callers feel backpressure.
pub(super) const QUEUE_CAPACITY: usize = 8192;

/// Most writes applied in one transaction; bounds how long a barrier waits
/// behind a burst, and how much a failing writer holds.
pub(super) const MAX_BATCH: usize = 256;

/// The wait before the first new try at a batch that failed transiently.
const FIRST_BACKOFF: Duration = Duration::from_millis(50);

/// The longest wait between two tries.
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// How long one batch may take before its connection is taken for dead
/// (a server that vanished without closing it) and the batch tried again.
const BATCH_TIMEOUT: Duration = Duration::from_secs(30);

/// How long tries may have been failing before a writer whose queue is
/// closed (the store closed or dropped) gives up on what it holds and logs
/// the loss. An open store's writer never gives up.
const GIVE_UP_AFTER: Duration = Duration::from_secs(10);

/// The answer to a barrier: `Ok` when the last batch that wrote anything committed cleanly.
pub(super) type Reply = oneshot::Sender<Result<(), StoreError>>;

/// The answer to a retention step: what it removed.
pub(super) type PruneReply = oneshot::Sender<Result<u64, StoreError>>;

/// One queued op: a write, or a barrier answered once everything queued
/// before it is committed.
// Nearly every op is a write: boxing it would cost an allocation a write to
// save room in the rare barrier.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub(super) enum WriteOp {
    Write(Queued),
    Flush {
        reply: Reply,
    },
    /// Rewrites the `health` row: a real write, answered like a flush.
    CheckWritable {
        now_ms: i64,
        reply: Reply,
    },
    /// One step of retention, in a transaction of its own once the batch it
    /// is in is committed.
    Prune {
        step: PruneStep,
        reply: PruneReply,
    },
    /// Answered like a flush; the queue takes nothing more, and the writer
    /// exits once it has applied what it holds.
    Stop {
        reply: Reply,
    },
}

/// A write as queued: what to write, and the lease it is conditional on.
#[derive(Debug)]
pub(super) struct Queued {
    pub(super) write: Write,
    /// Written only while this session lease is live and this node's at its
    /// epoch; `None`: written as is.
    pub(super) fence: Option<Arc<Fence>>,
}

/// One write, kept until a batch holding it commits.
#[derive(Debug)]
pub(super) enum Write {
    InsertRun(NewRun),
    MarkRunning {
        run_id: RunId,
        engine: String,
        started_at_ms: i64,
    },
    /// Running → cancelling; any other status stays.
    MarkCancelling {
        run_id: RunId,
    },
    /// Stages a run's timing lacks (`Stamps::to_json`'s form), added.
    MergeStages {
        run_id: RunId,
        stamps: String,
    },
    /// Serialised to JSON here, on the writer's task, not by the publisher.
    AppendEvent(Arc<crate::bus::BusEvent>),
    FinalizeRun(FinishedRun),
    PutChatState {
        session_key: SessionKey,
        last_engine: String,
        last_resume_token: String,
        updated_at_ms: i64,
        expires_at_ms: i64,
    },
    DeleteChatState {
        session_key: SessionKey,
    },
    /// Deletes chat state that is still expired at `now_ms`, so a put queued in between wins.
    DeleteExpiredChatState {
        session_key: SessionKey,
        now_ms: i64,
    },
    JournalAdmit(Box<JournalEntry>),
    JournalStarted {
        run_id: RunId,
    },
    JournalComplete {
        run_id: RunId,
    },
    KvPut {
        namespace: String,
        key: String,
        value: serde_json::Value,
        expires_at_ms: Option<i64>,
    },
    KvDelete {
        namespace: String,
        key: String,
    },
    /// Deletes at most `limit` records expired at `now_ms`, soonest expiry first.
    KvPurgeExpired {
        now_ms: i64,
        limit: usize,
    },
    /// The `health` row `CheckWritable` rewrites.
    Health {
        now_ms: i64,
    },
}

impl Write {
    /// A short name for logs.
    pub(super) fn name(&self) -> &'static str {
        match self {
            Write::InsertRun(_) => "insert_run",
            Write::MarkRunning { .. } => "mark_running",
            Write::MarkCancelling { .. } => "mark_cancelling",
            Write::MergeStages { .. } => "merge_stages",
            Write::AppendEvent(_) => "append_event",
            Write::FinalizeRun(_) => "finalize_run",
            Write::PutChatState { .. } => "put_chat_state",
            Write::DeleteChatState { .. } => "delete_chat_state",
            Write::DeleteExpiredChatState { .. } => "delete_expired_chat_state",
            Write::JournalAdmit(_) => "journal_admit",
            Write::JournalStarted { .. } => "journal_started",
            Write::JournalComplete { .. } => "journal_complete",
            Write::KvPut { .. } => "kv_put",
            Write::KvDelete { .. } => "kv_delete",
            Write::KvPurgeExpired { .. } => "kv_purge_expired",
            Write::Health { .. } => "check_writable",
        }
    }

    /// The run the write is of, if it is of one.
    pub(super) fn run_id(&self) -> Option<&str> {
        match self {
            Write::InsertRun(run) => Some(run.run_id.as_str()),
            Write::MarkRunning { run_id, .. }
            | Write::MarkCancelling { run_id }
            | Write::MergeStages { run_id, .. }
            | Write::JournalStarted { run_id }
            | Write::JournalComplete { run_id } => Some(run_id.as_str()),
            Write::AppendEvent(event) => Some(event.run_id.as_str()),
            Write::FinalizeRun(finished) => Some(finished.run_id.as_str()),
            Write::JournalAdmit(entry) => Some(entry.run_id.as_str()),
            Write::PutChatState { .. }
            | Write::DeleteChatState { .. }
            | Write::DeleteExpiredChatState { .. }
            | Write::KvPut { .. }
            | Write::KvDelete { .. }
            | Write::KvPurgeExpired { .. }
            | Write::Health { .. } => None,
        }
    }
}

/// A statement parameter, owned so that a batch's statements can all be in
/// flight at once.
type Param = Box<dyn ToSql + Sync + Send>;

/// One write as a statement and its parameters.
struct Exec {
    sql: &'static str,
    params: Vec<Param>,
}

/// A write made ready before its transaction begins: an event as its
/// columns (events are written together), or any other write's statement.
enum Ready {
    Event(EventRow),
    Exec(Exec),
}

/// One event as its row.
struct EventRow {
    run_id: String,
    index: i64,
    kind: &'static str,
    data: String,
}

impl EventRow {
    /// The statement that writes this event alone.
    fn exec(self) -> Exec {
        Exec {
            sql: APPEND_EVENT,
            params: vec![
                Box::new(self.run_id),
                Box::new(self.index),
                Box::new(self.kind),
                Box::new(self.data),
            ],
        }
    }
}

/// A repeated insert replaces the run but keeps its `seq` (its place) and its
/// creation time; never a finished run's (an insert held by a node's writer
/// while the database was away may land after another node ran the request).
const INSERT_RUN: &str =
    "INSERT INTO runs (run_id, session_key, conversation, engine, prompt, meta,
        status, usage, created_at_ms, resumed_from_engine, resumed_from_value)
    VALUES ($1, $2, $3, $4, $5, $6, 'queued', 'null', $7, $8, $9)
    ON CONFLICT (run_id) DO UPDATE SET session_key = EXCLUDED.session_key,
        conversation = EXCLUDED.conversation, engine = EXCLUDED.engine,
        prompt = EXCLUDED.prompt, meta = EXCLUDED.meta, status = 'queued', answer = NULL,
        error = NULL, error_code = NULL, resume_engine = NULL, resume_value = NULL,
        usage = 'null', started_at_ms = NULL, completed_at_ms = NULL, duration_ms = NULL,
        resumed_from_engine = EXCLUDED.resumed_from_engine,
        resumed_from_value = EXCLUDED.resumed_from_value, input_tokens = 0, output_tokens = 0,
        cache_read_tokens = 0, cache_write_tokens = 0, cost_usd = 0, compacted = NULL
    WHERE runs.status NOT IN ('completed', 'failed', 'cancelled')";

/// Never overwrites a terminal status.
const MARK_RUNNING: &str = "UPDATE runs SET
        status = CASE WHEN status IN ('completed', 'failed', 'cancelled') THEN status
                      ELSE 'running' END,
        engine = $2, started_at_ms = $3
    WHERE run_id = $1";

/// Stages the run has keep their time: the stored object is applied last.
const MERGE_STAGES: &str = "UPDATE runs
    SET stages = ($2::text::jsonb || coalesce(stages::jsonb, '{}'::jsonb))::text WHERE run_id = $1";

const MARK_CANCELLING: &str =
    "UPDATE runs SET status = 'cancelling' WHERE run_id = $1 AND status = 'running'";

const FINALIZE_RUN: &str = "UPDATE runs SET status = $2, engine = $3, answer = $4, error = $5,
        error_code = $6, resume_engine = $7, resume_value = $8, usage = $9,
        completed_at_ms = $10, duration_ms = $11, input_tokens = $12, output_tokens = $13,
        cache_read_tokens = $14, cache_write_tokens = $15, cost_usd = $16
    WHERE run_id = $1";

/// An event stored again at the same index replaces the first.
const APPEND_EVENT: &str =
    "INSERT INTO run_events (run_id, idx, kind, data) VALUES ($1, $2, $3, $4)
    ON CONFLICT (run_id, idx) DO UPDATE SET kind = EXCLUDED.kind, data = EXCLUDED.data";

const PUT_CHAT_STATE: &str = "INSERT INTO chat_state (session_key, last_engine,
        last_resume_token, updated_at_ms, expires_at_ms)
    VALUES ($1, $2, $3, $4, $5)
    ON CONFLICT (session_key) DO UPDATE SET last_engine = EXCLUDED.last_engine,
        last_resume_token = EXCLUDED.last_resume_token, updated_at_ms = EXCLUDED.updated_at_ms,
        expires_at_ms = EXCLUDED.expires_at_ms";

const DELETE_CHAT_STATE: &str = "DELETE FROM chat_state WHERE session_key = $1";

const DELETE_EXPIRED_CHAT_STATE: &str =
    "DELETE FROM chat_state WHERE session_key = $1 AND expires_at_ms <= $2";

const JOURNAL_ADMIT: &str = "INSERT INTO journal (run_id, seq, session_key, conversation, prompt,
        engine, resume_engine, resume_value, cwd, meta, route, state, accepted_at_ms)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)
    ON CONFLICT (run_id) DO UPDATE SET seq = EXCLUDED.seq, session_key = EXCLUDED.session_key,
        conversation = EXCLUDED.conversation, prompt = EXCLUDED.prompt,
        engine = EXCLUDED.engine, resume_engine = EXCLUDED.resume_engine,
        resume_value = EXCLUDED.resume_value, cwd = EXCLUDED.cwd, meta = EXCLUDED.meta,
        route = EXCLUDED.route, state = EXCLUDED.state, accepted_at_ms = EXCLUDED.accepted_at_ms";

const JOURNAL_STARTED: &str = "UPDATE journal SET state = 'started' WHERE run_id = $1";

const JOURNAL_COMPLETE: &str = "DELETE FROM journal WHERE run_id = $1";

const KV_PUT: &str = "INSERT INTO kv (namespace, key, value, expires_at_ms) VALUES ($1, $2, $3, $4)
    ON CONFLICT (namespace, key) DO UPDATE SET value = EXCLUDED.value,
        expires_at_ms = EXCLUDED.expires_at_ms";

const KV_DELETE: &str = "DELETE FROM kv WHERE namespace = $1 AND key = $2";

/// Also retention's `ExpiredRecords` step.
pub(super) const KV_PURGE_EXPIRED: &str = "DELETE FROM kv WHERE (namespace, key) IN (
        SELECT namespace, key FROM kv
        WHERE expires_at_ms IS NOT NULL AND expires_at_ms <= $1
        ORDER BY expires_at_ms LIMIT $2)";

const HEALTH: &str = "INSERT INTO health (id, checked_at_ms) VALUES (1, $1)
    ON CONFLICT (id) DO UPDATE SET checked_at_ms = EXCLUDED.checked_at_ms";

/// PostgreSQL integers are signed; counts and durations beyond `i64::MAX` saturate.
pub(super) fn to_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// A `LIMIT` as PostgreSQL takes it.
pub(super) fn sql_limit(limit: usize) -> i64 {
    i64::try_from(limit).unwrap_or(i64::MAX)
}

/// Text as PostgreSQL can hold it: it refuses the NUL character, which
/// SQLite keeps, so a NUL in outside text (a prompt, an answer, an engine's
/// error) is stored as U+FFFD instead of failing the write and losing the
/// run. JSON columns never hold one: JSON writes it as `\u0000`.
pub(super) fn text(value: &str) -> String {
    if value.contains('\0') {
        value.replace('\0', "\u{FFFD}")
    } else {
        value.to_owned()
    }
}

fn json(value: &impl serde::Serialize) -> Result<String, String> {
    serde_json::to_string(value).map_err(|e| format!("cannot be written as JSON: {e}"))
}

impl Write {
    /// The statement that applies this write, or its event row.
    ///
    /// # Errors
    /// A JSON column cannot be serialised.
    fn ready(&self) -> Result<Ready, String> {
        fn boxed<T: ToSql + Sync + Send + 'static>(value: T) -> Param {
            Box::new(value)
        }
        let (sql, params): (&'static str, Vec<Param>) = match self {
            Write::InsertRun(run) => {
                let resumed_from = run.resumed_from.as_ref();
                (
                    INSERT_RUN,
                    vec![
                        boxed(text(run.run_id.as_str())),
                        boxed(text(run.session_key.as_str())),
                        boxed(text(&run.conversation)),
                        boxed(text(&run.engine)),
                        boxed(text(&run.prompt)),
                        boxed(json(&run.meta)?),
                        boxed(run.created_at_ms),
                        boxed(resumed_from.map(|r| text(&r.engine))),
                        boxed(resumed_from.map(|r| text(&r.value))),
                    ],
                )
            }
            Write::MarkRunning { run_id, engine, started_at_ms } => (
                MARK_RUNNING,
                vec![boxed(text(run_id.as_str())), boxed(text(engine)), boxed(*started_at_ms)],
            ),
            Write::MarkCancelling { run_id } => {
                (MARK_CANCELLING, vec![boxed(text(run_id.as_str()))])
            }
            Write::MergeStages { run_id, stamps } => {
                (MERGE_STAGES, vec![boxed(text(run_id.as_str())), boxed(text(stamps))])
            }
            Write::AppendEvent(event) => {
                return Ok(Ready::Event(EventRow {
                    run_id: text(event.run_id.as_str()),
                    index: to_i64(event.index),
                    kind: event.kind.type_name(),
                    data: json(&event.json())?,
                }));
            }
            Write::FinalizeRun(finished) => {
                let completion = &finished.completion;
                let resume = completion.resume.as_ref();
                let error = completion.error.as_ref();
                let spend = &finished.spend;
                (
                    FINALIZE_RUN,
                    vec![
                        boxed(text(finished.run_id.as_str())),
                        boxed(crate::bus::RunStatus::of(completion).as_str()),
                        boxed(text(&finished.engine)),
                        boxed(text(&completion.answer)),
                        boxed(error.map(|e| text(&e.to_string()))),
                        boxed(error.map(|e| e.code().to_owned())),
                        boxed(resume.map(|r| text(&r.engine))),
                        boxed(resume.map(|r| text(&r.value))),
                        boxed(json(&completion.usage)?),
                        boxed(finished.completed_at_ms),
                        boxed(to_i64(finished.duration_ms)),
                        boxed(to_i64(spend.input_tokens)),
                        boxed(to_i64(spend.output_tokens)),
                        boxed(to_i64(spend.cache_read_tokens)),
                        boxed(to_i64(spend.cache_write_tokens)),
                        boxed(spend.usd),
                    ],
                )
            }
            Write::PutChatState {
                session_key,
                last_engine,
                last_resume_token,
                updated_at_ms,
                expires_at_ms,
            } => (
                PUT_CHAT_STATE,
                vec![
                    boxed(text(session_key.as_str())),
                    boxed(text(last_engine)),
                    boxed(text(last_resume_token)),
                    boxed(*updated_at_ms),
                    boxed(*expires_at_ms),
                ],
            ),
            Write::DeleteChatState { session_key } => {
                (DELETE_CHAT_STATE, vec![boxed(text(session_key.as_str()))])
            }
            Write::DeleteExpiredChatState { session_key, now_ms } => {
                (DELETE_EXPIRED_CHAT_STATE, vec![boxed(text(session_key.as_str())), boxed(*now_ms)])
            }
            Write::JournalAdmit(entry) => {
                let resume = entry.resume.as_ref();
                (
                    JOURNAL_ADMIT,
                    vec![
                        boxed(text(entry.run_id.as_str())),
                        boxed(to_i64(entry.seq)),
                        boxed(text(entry.session_key.as_str())),
                        boxed(text(&entry.conversation)),
                        boxed(text(&entry.prompt)),
                        boxed(text(&entry.engine)),
                        boxed(resume.map(|r| text(&r.engine))),
                        boxed(resume.map(|r| text(&r.value))),
                        boxed(entry.cwd.as_ref().map(|c| text(&c.to_string_lossy()))),
                        boxed(json(&entry.meta)?),
                        boxed(json(&entry.route)?),
                        boxed(entry.state.as_str()),
                        boxed(entry.accepted_at_ms),
                    ],
                )
            }
            Write::JournalStarted { run_id } => {
                (JOURNAL_STARTED, vec![boxed(text(run_id.as_str()))])
            }
            Write::JournalComplete { run_id } => {
                (JOURNAL_COMPLETE, vec![boxed(text(run_id.as_str()))])
            }
            Write::KvPut { namespace, key, value, expires_at_ms } => (
                KV_PUT,
                vec![
                    boxed(text(namespace)),
                    boxed(text(key)),
                    boxed(json(value)?),
                    boxed(*expires_at_ms),
                ],
            ),
            Write::KvDelete { namespace, key } => {
                (KV_DELETE, vec![boxed(text(namespace)), boxed(text(key))])
            }
            Write::KvPurgeExpired { now_ms, limit } => {
                (KV_PURGE_EXPIRED, vec![boxed(*now_ms), boxed(sql_limit(*limit))])
            }
            Write::Health { now_ms } => (HEALTH, vec![boxed(*now_ms)]),
        };
        Ok(Ready::Exec(Exec { sql, params }))
    }
}

/// Whether a failed statement may succeed on another try: the connection
/// broke or closed, the server is shutting down, out of room or of
/// connections, or the transaction lost a race (serialisation, deadlock).
/// Anything else the server said is about the statement itself.
pub(super) fn is_transient(error: &tokio_postgres::Error) -> bool {
    if error.is_closed() {
        return true;
    }
    let Some(db) = error.as_db_error() else {
        // No answer from the server: the connection failed (an I/O error,
        // a timeout) unless the driver refused a parameter or a column,
        // which says nothing of the connection.
        return match std::error::Error::source(error) {
            None => true,
            Some(source) => source.downcast_ref::<std::io::Error>().is_some(),
        };
    };
    let code = db.code().code();
    matches!(
        code,
        // admin_shutdown, crash_shutdown, cannot_connect_now, query_canceled,
        // read_only_sql_transaction (a standby after failover),
        // lock_not_available, serialization_failure, deadlock_detected.
        "57P01" | "57P02" | "57P03" | "57014" | "25006" | "55P03" | "40001" | "40P01"
    ) || ["08", "53", "58"].iter().any(|class| code.starts_with(class))
}

/// Why a batch did not commit.
#[derive(Debug)]
enum Failure {
    /// The connection or the server failed: the batch is kept and tried again.
    Transient(String),
    /// The database refused write `index` of the batch for what it holds.
    Refused { index: usize, message: String },
    /// The database refused the batch and no one write is known to be the
    /// cause: its writes are tried one at a time.
    Batch(String),
}

impl Failure {
    fn of(error: &tokio_postgres::Error, index: Option<usize>) -> Failure {
        let message = error_text(error);
        match index {
            _ if is_transient(error) => Failure::Transient(message),
            Some(index) => Failure::Refused { index, message },
            None => Failure::Batch(message),
        }
    }
}

/// Every event of a batch in one statement: one row per `(run, index)`, the
/// last written winning, as one statement per event would leave it.
const APPEND_EVENTS: &str = "INSERT INTO run_events (run_id, idx, kind, data)
    SELECT * FROM unnest($1::text[], $2::bigint[], $3::text[], $4::text[])
    ON CONFLICT (run_id, idx) DO UPDATE SET kind = EXCLUDED.kind, data = EXCLUDED.data";

/// The leases of a batch's fenced writes that are still live and this node's
/// at their epochs, their rows held `FOR KEY SHARE` until the transaction
/// ends: a takeover changes the epoch, a key column, so it waits for the
/// batch to commit, and nothing it fenced lands after the new holder starts.
const CHECK_FENCES: &str = "SELECT l.session_key, l.node_id, l.epoch FROM session_leases l
    JOIN unnest($1::text[], $2::text[], $3::bigint[]) AS f(session_key, node_id, epoch)
        ON l.session_key = f.session_key AND l.node_id = f.node_id AND l.epoch = f.epoch
    WHERE l.released_at IS NULL AND l.expires_at > clock_timestamp()
    FOR KEY SHARE OF l";

/// One notification per run whose events the batch wrote, `<run id>:<highest
/// index>`, sent when the transaction commits.
const NOTIFY_EVENTS: &str = "SELECT pg_notify($1, n.run_id || ':' || n.idx)
    FROM unnest($2::text[], $3::bigint[]) AS n(run_id, idx)";

/// The events of a batch as the columns of [`APPEND_EVENTS`].
#[derive(Default)]
struct EventColumns {
    run_ids: Vec<String>,
    indexes: Vec<i64>,
    kinds: Vec<&'static str>,
    data: Vec<String>,
    /// Where each `(run, index)` is in the columns, so a later write replaces it.
    at: HashMap<(String, i64), usize>,
}

impl EventColumns {
    fn push(&mut self, row: EventRow) {
        let EventRow { run_id, index, kind, data } = row;
        match self.at.get(&(run_id.clone(), index)) {
            Some(&at) => (self.kinds[at], self.data[at]) = (kind, data),
            None => {
                self.at.insert((run_id.clone(), index), self.run_ids.len());
                self.run_ids.push(run_id);
                self.indexes.push(index);
                self.kinds.push(kind);
                self.data.push(data);
            }
        }
    }

    fn exec(self) -> Exec {
        Exec {
            sql: APPEND_EVENTS,
            params: vec![
                Box::new(self.run_ids),
                Box::new(self.indexes),
                Box::new(self.kinds),
                Box::new(self.data),
            ],
        }
    }
}

/// The highest event index of each run a batch writes events of, as the
/// parameters of [`NOTIFY_EVENTS`].
#[derive(Default)]
struct EventMaxima(HashMap<String, i64>);

impl EventMaxima {
    fn push(&mut self, row: &EventRow) {
        let max = self.0.entry(row.run_id.clone()).or_insert(row.index);
        *max = (*max).max(row.index);
    }

    fn exec(self) -> Exec {
        let (run_ids, indexes): (Vec<String>, Vec<i64>) = self.0.into_iter().unzip();
        Exec {
            sql: NOTIFY_EVENTS,
            params: vec![Box::new(Topic::Events.channel()), Box::new(run_ids), Box::new(indexes)],
        }
    }
}

/// The distinct leases `writes` are fenced by.
fn fences_of(writes: &[Queued]) -> Vec<&Arc<Fence>> {
    let mut fences: Vec<&Arc<Fence>> = Vec::new();
    for fence in writes.iter().filter_map(|queued| queued.fence.as_ref()) {
        // Pointer first: the writes of one run share their fence.
        if !fences.iter().any(|seen| Arc::ptr_eq(seen, fence) || *seen == fence) {
            fences.push(fence);
        }
    }
    fences
}

/// Which of `fences` are no longer live and this node's at their epochs;
/// holds the others' rows `FOR KEY SHARE` for the rest of `tx`.
async fn lost_fences(
    tx: &deadpool_postgres::Transaction<'_>,
    fences: &[&Arc<Fence>],
) -> Result<Vec<Arc<Fence>>, tokio_postgres::Error> {
    let keys: Vec<&str> = fences.iter().map(|f| f.session_key.as_str()).collect();
    let nodes: Vec<&str> = fences.iter().map(|f| f.node.as_str()).collect();
    let epochs: Vec<i64> = fences.iter().map(|f| f.epoch).collect();
    let statement = tx.prepare_cached(CHECK_FENCES).await?;
    let live = tx.query(&statement, &[&keys, &nodes, &epochs]).await?;
    let live: HashSet<(&str, &str, i64)> = live
        .iter()
        .map(|row| Ok((row.try_get(0)?, row.try_get(1)?, row.try_get(2)?)))
        .collect::<Result<_, tokio_postgres::Error>>()?;
    Ok(fences
        .iter()
        .filter(|f| !live.contains(&(f.session_key.as_str(), f.node.as_str(), f.epoch)))
        .map(|f| Arc::clone(f))
        .collect())
}

/// Applies `writes` in one transaction on `client`, their statements all in
/// flight at once (pipelined), in order; the events among them (most of what
/// runs write) go in one statement of their own, as no other write reads or
/// writes `run_events`. The leases of the fenced writes are checked first,
/// in the same transaction, and the writes of a lease that failed are left
/// out; `notify`: the runs whose events were written are notified.
///
/// Returns the leases that failed.
async fn apply(
    client: &mut Object,
    writes: &[Queued],
    notify: bool,
) -> Result<Vec<Arc<Fence>>, Failure> {
    let mut ready = Vec::with_capacity(writes.len());
    for (index, queued) in writes.iter().enumerate() {
        ready.push(queued.write.ready().map_err(|message| Failure::Refused { index, message })?);
    }
    let fences = fences_of(writes);
    let tx = client.transaction().await.map_err(|e| Failure::of(&e, None))?;
    let lost = match fences.is_empty() {
        true => Vec::new(),
        false => lost_fences(&tx, &fences).await.map_err(|e| Failure::of(&e, None))?,
    };
    let kept = |queued: &Queued| queued.fence.as_ref().is_none_or(|fence| !lost.contains(fence));
    let n_kept = match lost.is_empty() {
        true => writes.len(),
        false => writes.iter().filter(|queued| kept(queued)).count(),
    };
    // Each statement with the write it is, or `None` for the events' and the
    // notifications'.
    let mut execs: Vec<(Option<usize>, Exec)> = Vec::with_capacity(n_kept + 1);
    let mut events = EventColumns::default();
    let mut maxima = EventMaxima::default();
    for (index, (queued, ready)) in writes.iter().zip(ready).enumerate() {
        if !lost.is_empty() && !kept(queued) {
            continue;
        }
        match ready {
            Ready::Exec(exec) => execs.push((Some(index), exec)),
            Ready::Event(row) => {
                if notify {
                    maxima.push(&row);
                }
                match n_kept {
                    1 => execs.push((Some(index), row.exec())),
                    _ => events.push(row),
                }
            }
        }
    }
    if !events.run_ids.is_empty() {
        execs.push((None, events.exec()));
    }
    if !maxima.0.is_empty() {
        execs.push((None, maxima.exec()));
    }
    let mut statements = Vec::with_capacity(execs.len());
    for (_, exec) in &execs {
        statements.push(tx.prepare_cached(exec.sql).await.map_err(|e| Failure::of(&e, None))?);
    }
    let results =
        futures::future::join_all(execs.iter().zip(&statements).map(|((_, exec), statement)| {
            tx.execute_raw(statement, exec.params.iter().map(|p| &**p as &(dyn ToSql + Sync)))
        }))
        .await;
    // Statements after a failed one fail too ("transaction is aborted"): the
    // first failure is the cause. The events' statement names no one write:
    // the batch is then tried a write at a time.
    let failed = results.into_iter().enumerate().find_map(|(i, r)| r.err().map(|e| (i, e)));
    if let Some((at, error)) = failed {
        let failure = Failure::of(&error, execs[at].0);
        // Nothing of the batch is kept; a broken connection has nothing to roll back.
        let _ = tx.rollback().await;
        return Err(failure);
    }
    tx.commit().await.map_err(|e| Failure::of(&e, None))?;
    Ok(lost)
}

/// Logs the writes of `batch` left out because their lease was `lost`: once
/// per run (or, for chat state, per session).
fn report_lost(batch: &[Queued], lost: &[Arc<Fence>]) {
    let mut seen: HashSet<(Option<&str>, &Fence)> = HashSet::new();
    for queued in batch {
        let Some(fence) = queued.fence.as_deref().filter(|f| lost.iter().any(|l| **l == **f))
        else {
            continue;
        };
        let run_id = queued.write.run_id();
        if !seen.insert((run_id, fence)) {
            continue;
        }
        let (session, epoch) = (&fence.session_key, fence.epoch);
        match run_id {
            Some(run_id) => tracing::warn!(
                "write of run {run_id} dropped: session lease {session} at epoch {epoch} is no longer this node's"
            ),
            None => tracing::warn!(
                op = queued.write.name(),
                "write of session {session} dropped: session lease {session} at epoch {epoch} is no longer this node's"
            ),
        }
    }
}

/// Takes a connection that failed out of the pool, so it is not handed out again.
pub(super) fn discard(client: Object) {
    drop(Object::take(client));
}

/// The writer's state, owned by its task for the task's whole life.
pub(super) struct Writer {
    /// Where connections come from; one is taken for each batch and given back.
    pool: Pool,
    /// The store's fences: whether cluster mode is on, and the node fenced.
    fences: Fences,
    /// The store's queue; closed by `Stop`.
    rx: mpsc::Receiver<WriteOp>,
    /// Writes taken from the queue and not committed yet, in queue order.
    /// Kept across failed tries.
    held: Vec<Queued>,
    /// Barriers behind `held`, answered once it commits (or fails once).
    replies: Vec<Reply>,
    /// Retention steps behind `held`, run once it commits.
    prunes: Vec<(PruneStep, PruneReply)>,
    /// The first write of `held` the database refused (and that was dropped),
    /// reported once the rest commits.
    refused: Option<String>,
    /// Why the last batch that wrote anything failed; `None` once one commits cleanly.
    failure: Option<String>,
    /// Since when tries have been failing.
    failing_since: Option<Instant>,
    /// The queue is closed (`Stop`) or every sender is gone: apply what is left, then exit.
    stopping: bool,
    /// The queue is closed and empty: nothing more will come.
    drained: bool,
}

impl std::fmt::Debug for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Writer")
            .field("held", &self.held.len())
            .field("failure", &self.failure)
            .field("stopping", &self.stopping)
            .finish_non_exhaustive()
    }
}

impl Writer {
    pub(super) fn new(pool: Pool, rx: mpsc::Receiver<WriteOp>, fences: Fences) -> Writer {
        Writer {
            pool,
            fences,
            rx,
            held: Vec::with_capacity(MAX_BATCH),
            replies: Vec::new(),
            prunes: Vec::new(),
            refused: None,
            failure: None,
            failing_since: None,
            stopping: false,
            drained: false,
        }
    }

    /// Applies batches until the queue is closed and empty.
    pub(super) async fn run(mut self) {
        let mut backoff = FIRST_BACKOFF;
        loop {
            if self.held.is_empty() && self.replies.is_empty() && self.prunes.is_empty() {
                // `recv` keeps returning what was queued before the queue was
                // closed or the last sender dropped, then `None`.
                match self.rx.recv().await {
                    Some(op) => self.take(op),
                    None => break,
                }
            }
            self.gather();
            let n_writes = self.held.len();
            match self.commit().await {
                Ok(()) => {
                    backoff = FIRST_BACKOFF;
                    if n_writes > 0 {
                        let refused = self.refused.take();
                        if self.failing_since.take().is_some() && refused.is_none() {
                            tracing::info!("store writes succeed again");
                        }
                        self.failure = refused;
                    }
                    self.answer();
                    self.prune().await;
                }
                Err(message) => {
                    let since = *self.failing_since.get_or_insert_with(Instant::now);
                    if self.failure.as_deref() != Some(message.as_str()) {
                        tracing::error!(
                            error = %message,
                            n_writes,
                            "store writes failed; they are kept and tried again"
                        );
                    }
                    self.failure = Some(message);
                    self.answer();
                    self.refuse_prunes();
                    if self.stopping && since.elapsed() >= GIVE_UP_AFTER {
                        self.give_up();
                        break;
                    }
                    self.wait(backoff).await;
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
            }
        }
        tracing::debug!("store writer stopped");
    }

    /// Files one op: writes are held, barriers wait for them.
    fn take(&mut self, op: WriteOp) {
        match op {
            WriteOp::Write(queued) => self.held.push(queued),
            WriteOp::Flush { reply } => self.replies.push(reply),
            WriteOp::CheckWritable { now_ms, reply } => {
                self.held.push(Queued { write: Write::Health { now_ms }, fence: None });
                self.replies.push(reply);
            }
            WriteOp::Prune { step, reply } => self.prunes.push((step, reply)),
            WriteOp::Stop { reply } => {
                self.replies.push(reply);
                self.stopping = true;
                // What is queued already is still received; nothing more is.
                self.rx.close();
            }
        }
    }

    /// Takes what is queued already, up to [`MAX_BATCH`] writes held.
    fn gather(&mut self) {
        while self.held.len() < MAX_BATCH {
            match self.rx.try_recv() {
                Ok(op) => self.take(op),
                Err(mpsc::error::TryRecvError::Empty) => return,
                Err(mpsc::error::TryRecvError::Disconnected) => {
                    self.stopping = true;
                    return;
                }
            }
        }
    }

    /// Waits `backoff` before the next try. Meanwhile writes keep being taken
    /// (up to [`MAX_BATCH`] held, then callers wait for queue slots), and
    /// barriers are answered with the failure at once.
    async fn wait(&mut self, backoff: Duration) {
        let deadline = tokio::time::sleep(backoff);
        tokio::pin!(deadline);
        loop {
            tokio::select! {
                () = &mut deadline => return,
                op = self.rx.recv(), if !self.drained && self.held.len() < MAX_BATCH => match op {
                    Some(op) => {
                        self.take(op);
                        self.answer();
                        self.refuse_prunes();
                    }
                    None => {
                        self.drained = true;
                        self.stopping = true;
                    }
                },
            }
        }
    }

    /// Applies everything held, dropping writes the database refuses.
    ///
    /// # Errors
    /// Why the database could not be reached; what was not applied stays held.
    async fn commit(&mut self) -> Result<(), String> {
        let cluster = self.fences.enabled();
        if cluster && self.fences.is_fenced() {
            self.drop_fenced();
        }
        if self.held.is_empty() {
            return Ok(());
        }
        let mut client = self.pool.get().await.map_err(|e| pool_error_text(&e))?;
        let mut one_at_a_time = false;
        while !self.held.is_empty() {
            let n = if one_at_a_time { 1 } else { self.held.len() };
            let batch = apply(&mut client, &self.held[..n], cluster);
            let applied = tokio::time::timeout(BATCH_TIMEOUT, batch).await.unwrap_or_else(|_| {
                Err(Failure::Transient(format!(
                    "the database did not answer within {} s",
                    BATCH_TIMEOUT.as_secs()
                )))
            });
            match applied {
                Ok(lost) => {
                    if !lost.is_empty() {
                        report_lost(&self.held[..n], &lost);
                    }
                    self.held.drain(..n);
                }
                Err(Failure::Transient(message)) => {
                    discard(client);
                    return Err(message);
                }
                Err(Failure::Refused { index, message }) => self.drop_write(index, &message),
                Err(Failure::Batch(message)) if one_at_a_time => self.drop_write(0, &message),
                Err(Failure::Batch(_)) => one_at_a_time = true,
            }
        }
        Ok(())
    }

    /// Drops the held writes fenced by a lease: the node was fenced, and
    /// writes nothing more under any of its leases.
    fn drop_fenced(&mut self) {
        let before = self.held.len();
        self.held.retain(|queued| {
            let keep = queued.fence.is_none();
            if !keep {
                let op = queued.write.name();
                let run_id = queued.write.run_id().unwrap_or_default();
                tracing::debug!(op, run_id, "write of a fenced node dropped");
            }
            keep
        });
        let n_dropped = before - self.held.len();
        if n_dropped > 0 {
            tracing::warn!(n_dropped, "writes held when the node was fenced dropped");
        }
    }

    /// Drops held write `index`, which the database refused.
    fn drop_write(&mut self, index: usize, message: &str) {
        let queued = self.held.remove(index);
        let op = queued.write.name();
        tracing::error!(op, error = %message, "store write refused by the database; dropped");
        self.refused.get_or_insert_with(|| format!("{op}: {message}"));
    }

    /// Answers the waiting barriers with the state of the last batch that wrote anything.
    fn answer(&mut self) {
        let result = match &self.failure {
            None => Ok(()),
            Some(message) => Err(StoreError::Database(message.clone())),
        };
        for reply in self.replies.drain(..) {
            // A caller that stopped waiting is normal.
            let _ = reply.send(result.clone());
        }
    }

    /// Answers the waiting retention steps with the failure: nothing of them ran.
    fn refuse_prunes(&mut self) {
        let message = self.failure.clone().unwrap_or_default();
        for (_, reply) in self.prunes.drain(..) {
            let _ = reply.send(Err(StoreError::Database(message.clone())));
        }
    }

    /// Runs the batch's retention steps, each in a transaction of its own,
    /// and answers them. A failed step changes nothing and is only its
    /// caller's news.
    async fn prune(&mut self) {
        if self.prunes.is_empty() {
            return;
        }
        let prunes = std::mem::take(&mut self.prunes);
        let mut client = match self.pool.get().await {
            Ok(client) => client,
            Err(error) => {
                let message = pool_error_text(&error);
                for (_, reply) in prunes {
                    let _ = reply.send(Err(StoreError::Database(message.clone())));
                }
                return;
            }
        };
        let now_ms = crate::clock::now_ms();
        let mut broken = false;
        for (step, reply) in prunes {
            let result = if broken {
                Err(StoreError::Database("the connection failed".to_owned()))
            } else {
                super::prune::apply(&mut client, &step, now_ms).await.map_err(|error| {
                    broken = is_transient(&error);
                    let error = error_text(&error);
                    tracing::warn!(step = step.kind(), %error, "store retention step failed");
                    StoreError::Database(error)
                })
            };
            let _ = reply.send(result);
        }
        if broken {
            discard(client);
        }
    }

    /// Logs what is lost when a closed writer cannot reach the database.
    fn give_up(&mut self) {
        let n_lost = self.held.len() + self.rx.len();
        tracing::error!(
            n_lost,
            error = self.failure.as_deref().unwrap_or_default(),
            "store closed while its database is unreachable; the writes it held are lost"
        );
        self.held.clear();
        self.rx.close();
        while let Ok(op) = self.rx.try_recv() {
            self.take(op);
        }
        self.held.clear();
        self.answer();
        self.refuse_prunes();
    }
}

#[cfg(test)]
mod tests;
