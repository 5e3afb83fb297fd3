//! The writer thread, the only owner of the write connection, and the checkpointer
//! thread that keeps the write-ahead log short.
//!
//! The writer takes one queued op, drains whatever else is already queued (up to
//! [`MAX_BATCH`]), applies them all in one transaction and commits, then answers the
//! barriers (`Flush`, `CheckWritable`, `Stop`) that were in the batch, then runs the
//! batch's point reads (`Read`) on its own connection. One commit per
//! batch instead of per write is what makes tens of thousands of runs a second
//! possible: with WAL and `synchronous = NORMAL` a commit is an append to the log.
//!
//! A batch of writes nobody waits for is held for up to [`LINGER`] to gather
//! what follows (a run's row, its events, its chat state and journal entry
//! arrive from different tasks within a millisecond or two), so a turn costs a
//! commit or two instead of one per task. The writer sleeps through it without
//! listening to the queue, so those writes wake no thread either. Whoever waits
//! (a barrier or a point read) wakes it at once ([`SqliteStore`]'s `wake_writer`),
//! and the batch commits before they are answered.
//!
//! [`SqliteStore`]: super::SqliteStore
//!
//! Copying the log back into the database is what syncs to disk, and a sync can take
//! longer than a whole batch. So the writer does not checkpoint; every
//! [`CHECKPOINT_EVERY_OPS`] writes it nudges the checkpointer thread, which runs a
//! passive checkpoint on its own connection while the writer goes on appending.
//! Only a checkpointer two rounds behind (one running, one due) makes the
//! writer wait, so the log stays short when the disk is slow; and a log whose
//! file passes [`LOG_BOUND_BYTES`] anyway is copied back and truncated by the
//! writer itself between two batches, so its bound holds whatever the threads'
//! pace.
//!
//! [`Inline`] is the same writer without its thread, for stores opened with
//! [`super::SqliteStore::open_inline`]: the task that needs a batch applied
//! applies it, with no linger.

use std::collections::HashMap;

use foldhash::fast::RandomState;
use std::sync::{mpsc as std_mpsc, Arc};
use std::thread;

use rusqlite::{params, Connection, OptionalExtension};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::super::{FinishedRun, JournalEntry, NewRun, PruneStep, StoreError};
use super::chat_states::{ChatStates, FORGET};
use crate::budget::usage::RunSpend;
use crate::bus::{BusEvent, RunStatus};
use crate::ids::{RunId, SessionKey};

/// Most ops applied in one transaction; bounds how long a barrier waits behind a burst.
pub(super) const MAX_BATCH: usize = 4096;

/// How long a batch without a barrier or a read waits for more writes before
/// it commits: the most a write that nobody waits for stays uncommitted.
pub(super) const LINGER: std::time::Duration = std::time::Duration::from_millis(1);

/// Writes between two nudges to the checkpointer: a few MB of log.
const CHECKPOINT_EVERY_OPS: usize = 2048;

/// Log length (in pages) at which the checkpointer also restarts the log. A passive
/// checkpoint never lets the log start over while the writer keeps appending (the
/// writer's next transaction must begin with every frame copied back, and frames
/// keep arriving while the checkpoint runs), so under sustained load the file
/// would grow without bound; a restart checkpoint briefly holds the writer back,
/// copies what the passive one could not, and the next batch starts the log from
/// the top. 8 MiB: the log's file stays well under `journal_size_limit`, so it is
/// never cut back, and the writer's appends rewrite pages the page cache already
/// holds instead of allocating and zeroing fresh ones.
const RESTART_LOG_FRAMES: i64 = 2_048;

/// Size of the log's file past which the writer itself copies the log back and
/// truncates it, between two batches, instead of waiting for the checkpointer:
/// the log's bound holds however far behind the checkpointer has fallen (its
/// restart needs a moment with no write transaction open, which a busy writer
/// rarely leaves it). Half of `journal_size_limit`, so the file never reaches it.
const LOG_BOUND_BYTES: u64 = 32 << 20;

/// Runs per generation of the `seq` cache; two generations are kept.
const SEQ_CACHE_GENERATION: usize = 16_384;

/// The answer to a barrier: `Ok` when the last batch that wrote anything committed cleanly.
pub(super) type Reply = oneshot::Sender<Result<(), StoreError>>;

/// One queued write, or a barrier that is answered once everything before it is committed.
#[derive(Debug)]
pub(super) enum WriteOp {
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
    /// Serialised to JSON here on the writer thread, not by the publisher.
    AppendEvent(Arc<BusEvent>),
    FinalizeRun(FinishedRun),
    /// `version`: its number in [`ChatStates`], no longer pending there once
    /// the batch holding it has ended; so for `DeleteChatState`.
    PutChatState {
        session_key: SessionKey,
        last_engine: String,
        last_resume_token: String,
        updated_at_ms: i64,
        expires_at_ms: i64,
        version: u64,
    },
    DeleteChatState {
        session_key: SessionKey,
        version: u64,
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
    /// Serialised to JSON here on the writer thread.
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
    /// Deletes at most `limit` records expired at `now_ms`, oldest expiry first.
    KvPurgeExpired {
        now_ms: i64,
        limit: usize,
    },
    Flush {
        reply: Reply,
    },
    /// A short read, run on the write connection once the batch it is in is committed.
    Read(Read),
    /// One step of retention, in a transaction of its own once the batch it is in
    /// is committed; answered with what it removed.
    Prune {
        step: PruneStep,
        reply: oneshot::Sender<Result<u64, StoreError>>,
    },
    /// Rewrites the `health` row: a real write, answered like a flush.
    CheckWritable {
        now_ms: i64,
        reply: Reply,
    },
    /// Answered like a flush; the writer then applies what is already queued and exits.
    Stop {
        reply: Reply,
    },
}

impl WriteOp {
    /// Whether someone waits for this op's answer: the batch holding it commits
    /// without lingering.
    fn awaited(&self) -> bool {
        matches!(
            self,
            WriteOp::Flush { .. }
                | WriteOp::Read(_)
                | WriteOp::Prune { .. }
                | WriteOp::CheckWritable { .. }
                | WriteOp::Stop { .. }
        )
    }

    /// A short name for logs.
    pub(super) fn name(&self) -> &'static str {
        match self {
            WriteOp::InsertRun(_) => "insert_run",
            WriteOp::MarkRunning { .. } => "mark_running",
            WriteOp::MarkCancelling { .. } => "mark_cancelling",
            WriteOp::MergeStages { .. } => "merge_stages",
            WriteOp::AppendEvent(_) => "append_event",
            WriteOp::FinalizeRun(_) => "finalize_run",
            WriteOp::PutChatState { .. } => "put_chat_state",
            WriteOp::DeleteChatState { .. } => "delete_chat_state",
            WriteOp::DeleteExpiredChatState { .. } => "delete_expired_chat_state",
            WriteOp::JournalAdmit(_) => "journal_admit",
            WriteOp::JournalStarted { .. } => "journal_started",
            WriteOp::JournalComplete { .. } => "journal_complete",
            WriteOp::KvPut { .. } => "kv_put",
            WriteOp::KvDelete { .. } => "kv_delete",
            WriteOp::KvPurgeExpired { .. } => "kv_purge_expired",
            WriteOp::Flush { .. } => "flush",
            WriteOp::Read(_) => "read",
            WriteOp::Prune { .. } => "prune",
            WriteOp::CheckWritable { .. } => "check_writable",
            WriteOp::Stop { .. } => "stop",
        }
    }
}

/// A read the writer runs for a caller, who gets its answer through the closure.
pub(super) struct Read(Box<dyn FnOnce(&Connection) + Send>);

impl Read {
    pub(super) fn new(read: impl FnOnce(&Connection) + Send + 'static) -> Read {
        Read(Box::new(read))
    }
}

impl std::fmt::Debug for Read {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Read")
    }
}

/// The `SET` clause of `mark_running` (`?2` engine, `?3` started at), which never
/// overwrites a terminal status. `CASE` rather than `IN (…)`, which would build a
/// temporary table on every call.
macro_rules! mark_running_set {
    () => {
        "status = CASE WHEN status = 'completed' OR status = 'failed' OR status = 'cancelled' \
         THEN status ELSE 'running' END, engine = ?2, started_at_ms = ?3"
    };
}

/// The `SET` clause of `finalize_run`, parameters `?2` to `?16`.
macro_rules! finalize_set {
    () => {
        "status = ?2, engine = ?3, answer = ?4, error = ?5, error_code = ?6, resume_engine = ?7, \
         resume_value = ?8, usage = ?9, completed_at_ms = ?10, duration_ms = ?11, \
         input_tokens = ?12, output_tokens = ?13, cache_read_tokens = ?14, \
         cache_write_tokens = ?15, cost_usd = ?16"
    };
}

/// The writer's state, owned by its thread for the thread's whole life.
struct Writer {
    /// The only connection that writes. Its prepared statements stay cached for the
    /// thread's life (`prepare_cached`).
    conn: Connection,
    /// Reused for every JSON column, so serialising does not allocate a `String` per row.
    json: Vec<u8>,
    /// Why the last batch that wrote anything failed; `None` once one commits cleanly.
    failure: Option<String>,
    /// Barriers of the batch being applied, answered after its commit.
    replies: Vec<Reply>,
    /// Point reads of the batch being applied, run after its commit.
    reads: Vec<Read>,
    /// Retention steps of the batch being applied, each run after its commit
    /// in a transaction of its own.
    prunes: Vec<(PruneStep, oneshot::Sender<Result<u64, StoreError>>)>,
    /// Runs inserted in the batch being applied, in insertion order. Later ops of the
    /// same batch on them are folded in, so a run that starts and finishes within one
    /// batch costs one `INSERT` instead of an insert and two updates. `None` marks a
    /// run replaced by a later insert of the same id.
    pending: Vec<Option<PendingRun>>,
    /// Where each run of `pending` is.
    pending_index: HashMap<RunId, usize, RandomState>,
    /// Stage stamps of the batch being applied, written after its runs.
    stage_merges: Vec<(RunId, String)>,
    /// Events of the batch being applied, grouped per run: consecutive events of one
    /// run share a row (JSON lines), so a batch writes one event row per run rather
    /// than one per event.
    event_groups: Vec<EventGroup>,
    /// Where each run's open group in `event_groups` is, by run `seq`.
    event_group_index: HashMap<i64, usize, RandomState>,
    /// The `seq` of recently seen runs, so events of a live run skip the `run_id` index.
    seqs: SeqCache,
    /// The `seq` the next new run gets.
    next_seq: i64,
    /// Whether `event_only_runs` may hold rows; it is empty unless events arrive for a
    /// run that was never inserted, so inserts skip looking there.
    has_event_only_runs: bool,
    /// Writes committed since the checkpointer was last nudged.
    n_writes_since_checkpoint: usize,
    /// The log's file (`<database>-wal`); `None` for a database in memory.
    wal: Option<std::path::PathBuf>,
    /// Dropped (and joined) with the writer.
    checkpointer: Checkpointer,
    /// Chat-state writes on their way and recent committed states, shared
    /// with the store's lookups.
    chat_states: Arc<ChatStates>,
    /// The chat-state writes of the batch being applied, with their numbers.
    chat_done: Vec<(SessionKey, u64)>,
}

/// Events of one run, in index order, written as one `run_events` row keyed by
/// the first index. `data` holds one JSON object per line.
#[derive(Debug)]
struct EventGroup {
    seq: i64,
    first_idx: u64,
    last_idx: u64,
    kind: &'static str,
    data: String,
}

/// A run inserted in the current batch, with the batch's later ops on it applied.
#[derive(Debug)]
struct PendingRun {
    seq: i64,
    /// As inserted, except `engine`, which follows later ops as in an `UPDATE`.
    run: NewRun,
    status: RunStatus,
    started_at_ms: Option<i64>,
    finished: Option<FinishedRun>,
}

/// What happened while applying one batch.
#[derive(Debug, Default)]
struct BatchOutcome {
    n_writes: usize,
    /// The first error; later ones are only logged.
    error: Option<String>,
    /// `BEGIN` failed once; the rest of the batch runs statement by statement.
    begin_failed: bool,
}

impl BatchOutcome {
    fn record<T>(&mut self, op: &'static str, result: rusqlite::Result<T>) {
        if let Err(err) = result {
            tracing::error!(op, error = %err, "store write failed");
            self.error.get_or_insert_with(|| format!("{op}: {err}"));
        }
    }
}

/// Run ids to `seq`s in two generations: when the newer fills up it becomes the older
/// and the older is forgotten, so the cache stays bounded and keeps the live runs.
#[derive(Debug, Default)]
struct SeqCache {
    newer: HashMap<RunId, i64, RandomState>,
    older: HashMap<RunId, i64, RandomState>,
}

impl SeqCache {
    fn get(&self, run_id: &RunId) -> Option<i64> {
        self.newer.get(run_id).or_else(|| self.older.get(run_id)).copied()
    }

    fn insert(&mut self, run_id: RunId, seq: i64) {
        if self.newer.len() >= SEQ_CACHE_GENERATION {
            std::mem::swap(&mut self.newer, &mut self.older);
            self.newer.clear();
        }
        self.newer.insert(run_id, seq);
    }

    fn clear(&mut self) {
        self.newer.clear();
        self.older.clear();
    }
}

/// The checkpointer thread, nudged through a channel of one slot so that nudges
/// arriving during a checkpoint fold into one.
#[derive(Debug)]
struct Checkpointer {
    nudge: Option<std_mpsc::SyncSender<()>>,
    thread: Option<thread::JoinHandle<()>>,
}

impl Checkpointer {
    fn spawn(conn: Connection) -> std::io::Result<Checkpointer> {
        let (nudge, nudges) = std_mpsc::sync_channel(1);
        let thread = thread::Builder::new()
            .name("lemon-store-checkpoint".to_owned())
            .spawn(move || run_checkpoints(&conn, &nudges))?;
        Ok(Checkpointer { nudge: Some(nudge), thread: Some(thread) })
    }

    /// Asks for a checkpoint. With one running and one already due, waits
    /// until the running one ends: a checkpointer slowed by the disk (its
    /// syncs) holds the writer back rather than letting the log grow without
    /// bound. Otherwise returns at once.
    fn nudge(&self) {
        if let Some(nudge) = &self.nudge {
            if let Err(std_mpsc::TrySendError::Full(())) = nudge.try_send(()) {
                let _ = nudge.send(());
            }
        }
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        // Closing the channel stops the thread after its current checkpoint.
        self.nudge = None;
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() {
                tracing::error!("store checkpoint thread panicked");
            }
        }
    }
}

fn run_checkpoints(conn: &Connection, nudges: &std_mpsc::Receiver<()>) {
    while nudges.recv().is_ok() {
        // Columns: busy, pages in the log, pages copied to the database.
        let passive =
            conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |row| row.get::<_, i64>(1));
        match passive {
            Ok(log_frames) if log_frames >= RESTART_LOG_FRAMES => {
                if let Err(err) = conn.query_row("PRAGMA wal_checkpoint(RESTART)", [], |_| Ok(())) {
                    tracing::warn!(error = %err, log_frames, "store log restart failed");
                }
            }
            Ok(_) => {}
            Err(err) => tracing::warn!(error = %err, "store checkpoint failed"),
        }
    }
}

/// Starts the checkpointer on `checkpoint_conn` and the writer on `conn`, on a
/// thread of its own. The writer runs until `Stop` or until every sender is gone,
/// and in both cases first applies everything already queued.
///
/// # Errors
/// A message when the writer cannot read where its sequence stands, or a thread
/// cannot be started.
pub(super) fn spawn(
    conn: Connection,
    checkpoint_conn: Connection,
    rx: mpsc::Receiver<WriteOp>,
    chat_states: Arc<ChatStates>,
) -> Result<thread::JoinHandle<()>, String> {
    let writer = Writer::new(conn, checkpoint_conn, chat_states)?;
    thread::Builder::new()
        .name("lemon-store-writer".to_owned())
        .spawn(move || writer.run(rx))
        .map_err(|e| format!("cannot start writer thread: {e}"))
}

/// The writer without a thread of its own: whoever needs a batch applied calls
/// [`Inline::pump`], which applies what is queued in batches of at most
/// [`MAX_BATCH`], each in one transaction with its barriers answered after the
/// commit, as the thread does.
#[derive(Debug)]
pub(super) struct Inline {
    writer: Writer,
    rx: mpsc::Receiver<WriteOp>,
    batch: Vec<WriteOp>,
}

impl Inline {
    /// Starts the checkpointer on `checkpoint_conn`; the writer on `conn` waits
    /// for [`Inline::pump`].
    ///
    /// # Errors
    /// As [`spawn`].
    pub(super) fn new(
        conn: Connection,
        checkpoint_conn: Connection,
        rx: mpsc::Receiver<WriteOp>,
        chat_states: Arc<ChatStates>,
    ) -> Result<Inline, String> {
        let writer = Writer::new(conn, checkpoint_conn, chat_states)?;
        Ok(Inline { writer, rx, batch: Vec::new() })
    }

    /// Writes waiting in the queue.
    pub(super) fn queued(&self) -> usize {
        self.rx.len()
    }

    /// Applies everything queued, on the calling thread. After a `Stop` the
    /// queue takes no more, as the thread's.
    pub(super) fn pump(&mut self) {
        loop {
            let mut awaited = false;
            drain(&mut self.rx, &mut self.batch, &mut awaited);
            if self.batch.is_empty() {
                return;
            }
            if self.writer.apply_batch(&mut self.batch) {
                self.rx.close();
            }
        }
    }
}

impl std::fmt::Debug for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Writer")
            .field("next_seq", &self.next_seq)
            .field("failure", &self.failure)
            .finish_non_exhaustive()
    }
}

impl Writer {
    /// Past [`LOG_BOUND_BYTES`], copies the log back and truncates its file
    /// (between transactions, where nothing else can write). A reader still on
    /// an old snapshot makes it wait, then give up until the next batch.
    fn bound_log(&mut self) {
        let Some(wal) = &self.wal else { return };
        let Ok(bytes) = std::fs::metadata(wal).map(|meta| meta.len()) else { return };
        if bytes < LOG_BOUND_BYTES {
            return;
        }
        // Columns: busy (1 when it could not finish), pages in the log, pages copied.
        match self.conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |row| row.get::<_, i64>(0)) {
            Ok(0) => tracing::debug!(bytes, "store log past its bound: the writer copied it back and truncated it"),
            Ok(_) => tracing::debug!(bytes, "store log past its bound while a reader holds it; tried again after the next batch"),
            Err(err) => tracing::warn!(error = %err, bytes, "store log past its bound could not be truncated"),
        }
    }

    /// The writer on `conn`, where its sequence stands, and its checkpointer.
    fn new(
        conn: Connection,
        checkpoint_conn: Connection,
        chat_states: Arc<ChatStates>,
    ) -> Result<Writer, String> {
        let last_seq: i64 = conn
            .query_row(
                "SELECT max(coalesce((SELECT max(seq) FROM runs), 0), coalesce((SELECT max(seq) FROM event_only_runs), 0))",
                [],
                |row| row.get(0),
            )
            .map_err(|e| e.to_string())?;
        let has_event_only_runs = conn
            .query_row("SELECT EXISTS (SELECT 1 FROM event_only_runs)", [], |row| row.get(0))
            .map_err(|e| e.to_string())?;
        let checkpointer = Checkpointer::spawn(checkpoint_conn)
            .map_err(|e| format!("cannot start checkpoint thread: {e}"))?;
        let wal =
            conn.path().filter(|path| !path.is_empty()).map(|path| format!("{path}-wal").into());
        Ok(Writer {
            wal,
            conn,
            json: Vec::with_capacity(1024),
            failure: None,
            replies: Vec::new(),
            reads: Vec::new(),
            prunes: Vec::new(),
            pending: Vec::new(),
            pending_index: HashMap::default(),
            stage_merges: Vec::new(),
            event_groups: Vec::new(),
            event_group_index: HashMap::default(),
            seqs: SeqCache::default(),
            next_seq: last_seq + 1,
            has_event_only_runs,
            n_writes_since_checkpoint: 0,
            checkpointer,
            chat_states,
            chat_done: Vec::new(),
        })
    }
}

/// Moves what is queued into `batch`, up to [`MAX_BATCH`], noting an awaited op;
/// false once every sender is gone and the queue is empty.
fn drain(rx: &mut mpsc::Receiver<WriteOp>, batch: &mut Vec<WriteOp>, awaited: &mut bool) -> bool {
    while batch.len() < MAX_BATCH {
        match rx.try_recv() {
            Ok(op) => {
                *awaited |= op.awaited();
                batch.push(op);
            }
            Err(mpsc::error::TryRecvError::Empty) => return true,
            Err(mpsc::error::TryRecvError::Disconnected) => return false,
        }
    }
    true
}

impl Writer {
    fn run(mut self, mut rx: mpsc::Receiver<WriteOp>) {
        let mut batch = Vec::with_capacity(MAX_BATCH);
        // `blocking_recv` keeps returning what was queued before `close()` or before the
        // last sender dropped, then `None`: nothing handed to this thread is lost.
        while let Some(op) = rx.blocking_recv() {
            let mut awaited = op.awaited();
            batch.push(op);
            let mut open = drain(&mut rx, &mut batch, &mut awaited);
            let deadline = Instant::now() + LINGER;
            while open && !awaited && batch.len() < MAX_BATCH {
                let now = Instant::now();
                if now >= deadline {
                    break;
                }
                // Woken early by whoever queues an awaited op.
                thread::park_timeout(deadline - now);
                open = drain(&mut rx, &mut batch, &mut awaited);
            }
            if self.apply_batch(&mut batch) {
                rx.close();
            }
        }
        tracing::debug!("store writer stopped");
    }

    /// Applies `batch` in one transaction and answers its barriers; true when it held a `Stop`.
    fn apply_batch(&mut self, batch: &mut Vec<WriteOp>) -> bool {
        let mut stop = false;
        let mut outcome = BatchOutcome::default();
        for op in batch.drain(..) {
            match op {
                WriteOp::Flush { reply } => self.replies.push(reply),
                WriteOp::Read(read) => self.reads.push(read),
                WriteOp::Prune { step, reply } => self.prunes.push((step, reply)),
                WriteOp::Stop { reply } => {
                    stop = true;
                    self.replies.push(reply);
                }
                op => {
                    outcome.n_writes += 1;
                    self.begin(&mut outcome);
                    match &op {
                        WriteOp::PutChatState { session_key, version, .. }
                        | WriteOp::DeleteChatState { session_key, version } => {
                            self.chat_done.push((session_key.clone(), *version));
                        }
                        WriteOp::DeleteExpiredChatState { session_key, .. } => {
                            self.chat_done.push((session_key.clone(), FORGET));
                        }
                        _ => {}
                    }
                    let name = op.name();
                    let result = self.apply(op);
                    outcome.record(name, result);
                }
            }
        }
        if !self.event_groups.is_empty() {
            self.begin(&mut outcome);
            let groups = std::mem::take(&mut self.event_groups);
            for group in &groups {
                let result = self.write_events(group);
                outcome.record("append_event", result);
            }
            // Keep the allocation for the next batch.
            self.event_groups = groups;
            self.event_groups.clear();
            self.event_group_index.clear();
        }
        if !self.pending.is_empty() {
            self.begin(&mut outcome);
            let pending = std::mem::take(&mut self.pending);
            for run in pending.iter().flatten() {
                let result = self.write_run(run);
                outcome.record("insert_run", result);
            }
            // Keep the allocation for the next batch.
            self.pending = pending;
            self.pending.clear();
            self.pending_index.clear();
        }
        if !self.stage_merges.is_empty() {
            self.begin(&mut outcome);
            for (run_id, stamps) in std::mem::take(&mut self.stage_merges) {
                let result = self.merge_stages(&run_id, &stamps);
                outcome.record("merge_stages", result);
            }
        }
        if !self.conn.is_autocommit() {
            if let Err(err) = self.conn.execute_batch("COMMIT") {
                tracing::error!(error = %err, n_writes = outcome.n_writes, "store commit failed; the batch is lost");
                outcome.error.get_or_insert_with(|| format!("commit: {err}"));
                if let Err(err) = self.conn.execute_batch("ROLLBACK") {
                    tracing::error!(error = %err, "store rollback failed");
                }
            }
        }
        // Committed or rolled back: a clean commit's states stay known, a
        // batch with any failure leaves the last word to the file.
        self.chat_states.ended(&mut self.chat_done, outcome.error.is_none());
        if outcome.n_writes > 0 {
            if outcome.error.is_some() {
                // Some cached `seq`s may belong to rows that were never written.
                self.seqs.clear();
            } else if self.failure.is_some() {
                tracing::info!("store writes succeed again");
            }
            self.failure = outcome.error;
            self.n_writes_since_checkpoint += outcome.n_writes;
            if self.n_writes_since_checkpoint >= CHECKPOINT_EVERY_OPS {
                self.n_writes_since_checkpoint = 0;
                self.checkpointer.nudge();
            }
            self.bound_log();
        }
        let result = match &self.failure {
            None => Ok(()),
            Some(message) => Err(StoreError::Database(message.clone())),
        };
        for reply in self.replies.drain(..) {
            // A caller that stopped waiting is normal.
            let _ = reply.send(result.clone());
        }
        for Read(read) in self.reads.drain(..) {
            // A panicking read loses its answer (the caller sees a closed store),
            // never the writer.
            let conn = &self.conn;
            if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| read(conn))).is_err() {
                tracing::error!("a store read panicked");
            }
        }
        self.prune();
        stop
    }

    /// Runs the batch's retention steps, each in its own transaction, and
    /// answers them. A failed step changes nothing and is only its caller's
    /// news: the writes of runs are not marked failed by it.
    fn prune(&mut self) {
        if self.prunes.is_empty() {
            return;
        }
        let now_ms = crate::clock::now_ms();
        let mut removed_any = false;
        for (step, reply) in std::mem::take(&mut self.prunes) {
            let result = super::prune::apply(&self.conn, &step, now_ms);
            if let Ok(removed @ 1..) = result {
                removed_any = true;
                self.n_writes_since_checkpoint += usize::try_from(removed).unwrap_or(0);
                // A run deleted here may have its `seq` cached.
                if matches!(step, PruneStep::Runs { .. }) {
                    self.seqs.clear();
                }
            }
            let _ = reply.send(result.map_err(|err| StoreError::Database(err.to_string())));
        }
        if removed_any {
            self.bound_log();
        }
    }

    /// Opens the batch's transaction if none is open. Also re-begins when SQLite rolled
    /// the transaction back after an error (I/O, full disk), so later writes of the
    /// batch are still grouped.
    fn begin(&self, outcome: &mut BatchOutcome) {
        if outcome.begin_failed || !self.conn.is_autocommit() {
            return;
        }
        if let Err(err) = self.conn.execute_batch("BEGIN IMMEDIATE") {
            tracing::error!(error = %err, "store could not begin a write transaction");
            outcome.begin_failed = true;
            outcome.error.get_or_insert_with(|| format!("begin: {err}"));
        }
    }

    fn apply(&mut self, op: WriteOp) -> rusqlite::Result<()> {
        match op {
            WriteOp::InsertRun(run) => self.insert_pending(run)?,
            WriteOp::MarkRunning { run_id, engine, started_at_ms } => {
                if let Some(row) = self.pending_run(&run_id) {
                    if !row.status.is_terminal() {
                        row.status = RunStatus::Running;
                    }
                    row.run.engine = engine;
                    row.started_at_ms = Some(started_at_ms);
                    return Ok(());
                }
                // By `seq` when known: the integer key is cheaper than the `run_id` index.
                match self.seqs.get(&run_id) {
                    Some(seq) => {
                        let mut stmt = self.conn.prepare_cached(concat!(
                            "UPDATE runs SET ",
                            mark_running_set!(),
                            " WHERE seq = ?1"
                        ))?;
                        stmt.execute(params![seq, engine, started_at_ms])?;
                    }
                    None => {
                        let mut stmt = self.conn.prepare_cached(concat!(
                            "UPDATE runs SET ",
                            mark_running_set!(),
                            " WHERE run_id = ?1"
                        ))?;
                        stmt.execute(params![run_id.as_str(), engine, started_at_ms])?;
                    }
                }
            }
            WriteOp::MergeStages { run_id, stamps } => self.stage_merges.push((run_id, stamps)),
            WriteOp::MarkCancelling { run_id } => {
                if let Some(row) = self.pending_run(&run_id) {
                    if row.status == RunStatus::Running {
                        row.status = RunStatus::Cancelling;
                    }
                    return Ok(());
                }
                let mut stmt = self.conn.prepare_cached(
                    "UPDATE runs SET status = 'cancelling' WHERE run_id = ?1 AND status = 'running'",
                )?;
                stmt.execute(params![run_id.as_str()])?;
            }
            WriteOp::AppendEvent(event) => {
                let seq = self.event_seq(&event.run_id)?;
                self.json.clear();
                serde_json::to_writer(&mut self.json, &event.json()).map_err(to_sql_error)?;
                let data = std::str::from_utf8(&self.json).map_err(to_sql_error)?;
                let open =
                    self.event_group_index.get(&seq).and_then(|&at| self.event_groups.get_mut(at));
                match open {
                    // JSON text never holds a raw newline, so lines separate events.
                    Some(group) if event.index > group.last_idx => {
                        group.data.push('\n');
                        group.data.push_str(data);
                        group.last_idx = event.index;
                    }
                    _ => {
                        self.event_group_index.insert(seq, self.event_groups.len());
                        self.event_groups.push(EventGroup {
                            seq,
                            first_idx: event.index,
                            last_idx: event.index,
                            kind: event.kind.type_name(),
                            data: data.to_owned(),
                        });
                    }
                }
            }
            WriteOp::FinalizeRun(mut finished) => {
                if let Some(row) = self.pending_run(&finished.run_id) {
                    row.status = RunStatus::of(&finished.completion);
                    row.run.engine = std::mem::take(&mut finished.engine);
                    row.finished = Some(finished);
                    return Ok(());
                }
                let seq = self.seqs.get(&finished.run_id);
                let mut stmt = match seq {
                    Some(_) => self.conn.prepare_cached(concat!(
                        "UPDATE runs SET ",
                        finalize_set!(),
                        " WHERE seq = ?1"
                    ))?,
                    None => self.conn.prepare_cached(concat!(
                        "UPDATE runs SET ",
                        finalize_set!(),
                        " WHERE run_id = ?1"
                    ))?,
                };
                match seq {
                    Some(seq) => stmt.raw_bind_parameter(1, seq)?,
                    None => stmt.raw_bind_parameter(1, finished.run_id.as_str())?,
                }
                let completion = &finished.completion;
                let resume = completion.resume.as_ref();
                let error = completion.error.as_ref();
                stmt.raw_bind_parameter(2, RunStatus::of(completion).as_str())?;
                stmt.raw_bind_parameter(3, &finished.engine)?;
                stmt.raw_bind_parameter(4, &completion.answer)?;
                stmt.raw_bind_parameter(5, error.map(|e| e.to_string()))?;
                stmt.raw_bind_parameter(6, error.map(|e| e.code()))?;
                stmt.raw_bind_parameter(7, resume.map(|r| r.engine.as_str()))?;
                stmt.raw_bind_parameter(8, resume.map(|r| r.value.as_str()))?;
                stmt.raw_bind_parameter(9, json_text(&mut self.json, &completion.usage)?)?;
                stmt.raw_bind_parameter(10, finished.completed_at_ms)?;
                stmt.raw_bind_parameter(11, to_i64(finished.duration_ms))?;
                bind_spend(&mut stmt, 12, &finished.spend)?;
                stmt.raw_execute()?;
            }
            WriteOp::PutChatState {
                session_key,
                last_engine,
                last_resume_token,
                updated_at_ms,
                expires_at_ms,
                version: _,
            } => {
                let mut stmt = self.conn.prepare_cached(
                    "INSERT OR REPLACE INTO chat_state (session_key, last_engine, last_resume_token, updated_at_ms, expires_at_ms)
                     VALUES (?1, ?2, ?3, ?4, ?5)",
                )?;
                stmt.execute(params![
                    session_key.as_str(),
                    last_engine,
                    last_resume_token,
                    updated_at_ms,
                    expires_at_ms
                ])?;
            }
            WriteOp::DeleteChatState { session_key, version: _ } => {
                let mut stmt =
                    self.conn.prepare_cached("DELETE FROM chat_state WHERE session_key = ?1")?;
                stmt.execute(params![session_key.as_str()])?;
            }
            WriteOp::DeleteExpiredChatState { session_key, now_ms } => {
                let mut stmt = self.conn.prepare_cached(
                    "DELETE FROM chat_state WHERE session_key = ?1 AND expires_at_ms <= ?2",
                )?;
                stmt.execute(params![session_key.as_str(), now_ms])?;
            }
            WriteOp::JournalAdmit(entry) => {
                let mut stmt = self.conn.prepare_cached(
                    "INSERT OR REPLACE INTO journal (run_id, seq, session_key, conversation, prompt,
                        engine, resume_engine, resume_value, cwd, meta, route, state, accepted_at_ms)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)",
                )?;
                let resume = entry.resume.as_ref();
                stmt.execute(params![
                    entry.run_id.as_str(),
                    to_i64(entry.seq),
                    entry.session_key.as_str(),
                    entry.conversation,
                    entry.prompt,
                    entry.engine,
                    resume.map(|r| r.engine.as_str()),
                    resume.map(|r| r.value.as_str()),
                    entry.cwd.as_ref().map(|c| c.to_string_lossy().into_owned()),
                    entry.meta.to_string(),
                    serde_json::to_string(&entry.route).map_err(to_sql_error)?,
                    entry.state.as_str(),
                    entry.accepted_at_ms,
                ])?;
            }
            WriteOp::JournalStarted { run_id } => {
                let mut stmt = self
                    .conn
                    .prepare_cached("UPDATE journal SET state = 'started' WHERE run_id = ?1")?;
                stmt.execute(params![run_id.as_str()])?;
            }
            WriteOp::JournalComplete { run_id } => {
                let mut stmt = self.conn.prepare_cached("DELETE FROM journal WHERE run_id = ?1")?;
                stmt.execute(params![run_id.as_str()])?;
            }
            WriteOp::KvPut { namespace, key, value, expires_at_ms } => {
                let mut stmt = self.conn.prepare_cached(
                    "INSERT OR REPLACE INTO kv (namespace, key, value, expires_at_ms)
                     VALUES (?1, ?2, ?3, ?4)",
                )?;
                let value = json_text(&mut self.json, &value)?;
                stmt.execute(params![namespace, key, value, expires_at_ms])?;
            }
            WriteOp::KvDelete { namespace, key } => {
                let mut stmt =
                    self.conn.prepare_cached("DELETE FROM kv WHERE namespace = ?1 AND key = ?2")?;
                stmt.execute(params![namespace, key])?;
            }
            WriteOp::KvPurgeExpired { now_ms, limit } => {
                super::prune::purge_expired(&self.conn, now_ms, limit)?;
            }
            WriteOp::CheckWritable { now_ms, reply } => {
                self.replies.push(reply);
                let mut stmt = self.conn.prepare_cached(
                    "INSERT OR REPLACE INTO health (id, checked_at_ms) VALUES (1, ?1)",
                )?;
                stmt.execute(params![now_ms])?;
            }
            // `apply_batch` answers barriers itself; this arm only keeps the match total.
            WriteOp::Flush { reply } | WriteOp::Stop { reply } => self.replies.push(reply),
            WriteOp::Read(read) => self.reads.push(read),
            WriteOp::Prune { step, reply } => self.prunes.push((step, reply)),
        }
        Ok(())
    }

    /// Adds `stamps` to the run's stages; a stage it has keeps its time.
    fn merge_stages(&mut self, run_id: &RunId, stamps: &str) -> rusqlite::Result<()> {
        let mut stmt = self.conn.prepare_cached(
            "UPDATE runs SET stages = json_patch(?2, coalesce(stages, '{}')) WHERE run_id = ?1",
        )?;
        stmt.execute(params![run_id.as_str(), stamps])?;
        Ok(())
    }

    /// A run inserted earlier in this batch.
    fn pending_run(&mut self, run_id: &RunId) -> Option<&mut PendingRun> {
        let &index = self.pending_index.get(run_id)?;
        self.pending.get_mut(index)?.as_mut()
    }

    /// Queues `run` for [`Writer::write_run`] at the end of the batch, with its `seq`.
    fn insert_pending(&mut self, run: NewRun) -> rusqlite::Result<()> {
        let seq = self.insert_seq(&run.run_id)?;
        let mut row =
            PendingRun { seq, run, status: RunStatus::Queued, started_at_ms: None, finished: None };
        // A repeated id (the router admits a run, the gateway inserts it again when it
        // sends it) replaces the run but keeps its `seq` and creation time.
        if let Some(old) = self.pending_index.insert(row.run.run_id.clone(), self.pending.len()) {
            if let Some(replaced) = self.pending[old].take() {
                row.run.created_at_ms = replaced.run.created_at_ms;
            }
        }
        self.pending.push(Some(row));
        Ok(())
    }

    /// The `seq` an inserted run gets. A run inserted before keeps its `seq`, and so its
    /// events. A run that so far only had events gets a new `seq`, as any new run does
    /// (it lists by insertion order), and its events move along.
    fn insert_seq(&mut self, run_id: &RunId) -> rusqlite::Result<i64> {
        if self.has_event_only_runs {
            let mut stmt = self
                .conn
                .prepare_cached("DELETE FROM event_only_runs WHERE run_id = ?1 RETURNING seq")?;
            let event_only: Option<i64> =
                stmt.query_row(params![run_id.as_str()], |row| row.get(0)).optional()?;
            drop(stmt);
            if let Some(old) = event_only {
                let seq = self.take_seq();
                let mut stmt = self
                    .conn
                    .prepare_cached("UPDATE run_events SET run_seq = ?2 WHERE run_seq = ?1")?;
                stmt.execute(params![old, seq])?;
                // Events of this batch not written yet move with the run too.
                for group in self.event_groups.iter_mut().filter(|g| g.seq == old) {
                    group.seq = seq;
                }
                if let Some(at) = self.event_group_index.remove(&old) {
                    self.event_group_index.insert(seq, at);
                }
                self.seqs.insert(run_id.clone(), seq);
                return Ok(seq);
            }
        }
        let seq = match self.seqs.get(run_id) {
            Some(seq) => seq,
            None => {
                let mut stmt =
                    self.conn.prepare_cached("SELECT seq FROM runs WHERE run_id = ?1")?;
                let existing =
                    stmt.query_row(params![run_id.as_str()], |row| row.get(0)).optional()?;
                drop(stmt);
                existing.unwrap_or_else(|| self.take_seq())
            }
        };
        self.seqs.insert(run_id.clone(), seq);
        Ok(seq)
    }

    /// The `seq` an event of `run_id` is stored under; a run never inserted gets one in
    /// `event_only_runs`.
    fn event_seq(&mut self, run_id: &RunId) -> rusqlite::Result<i64> {
        if let Some(seq) = self.seqs.get(run_id) {
            return Ok(seq);
        }
        let mut stmt = self.conn.prepare_cached(
            "SELECT seq FROM runs WHERE run_id = ?1 UNION ALL SELECT seq FROM event_only_runs WHERE run_id = ?1",
        )?;
        let existing = stmt.query_row(params![run_id.as_str()], |row| row.get(0)).optional()?;
        drop(stmt);
        let seq = match existing {
            Some(seq) => seq,
            None => {
                let seq = self.take_seq();
                let mut stmt = self
                    .conn
                    .prepare_cached("INSERT INTO event_only_runs (run_id, seq) VALUES (?1, ?2)")?;
                stmt.execute(params![run_id.as_str(), seq])?;
                self.has_event_only_runs = true;
                seq
            }
        };
        self.seqs.insert(run_id.clone(), seq);
        Ok(seq)
    }

    fn take_seq(&mut self) -> i64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        seq
    }

    /// Writes a run inserted in this batch, in its state at the end of the batch.
    /// Writes one group of events. A group starting at an index already stored
    /// replaces that row rather than failing the batch.
    fn write_events(&self, group: &EventGroup) -> rusqlite::Result<()> {
        let mut stmt = self.conn.prepare_cached(
            "INSERT OR REPLACE INTO run_events (run_seq, idx, kind, data) VALUES (?1, ?2, ?3, ?4)",
        )?;
        stmt.execute(params![group.seq, to_i64(group.first_idx), group.kind, group.data])?;
        Ok(())
    }

    fn write_run(&mut self, row: &PendingRun) -> rusqlite::Result<()> {
        let mut stmt = self.conn.prepare_cached(
            "INSERT OR REPLACE INTO runs (seq, run_id, session_key, conversation, engine, prompt, meta, status,
                answer, error, error_code, resume_engine, resume_value, usage,
                created_at_ms, started_at_ms, completed_at_ms, duration_ms,
                resumed_from_engine, resumed_from_value,
                input_tokens, output_tokens, cache_read_tokens, cache_write_tokens, cost_usd)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14,
                 coalesce((SELECT created_at_ms FROM runs WHERE seq = ?1), ?15), ?16, ?17, ?18,
                 ?19, ?20, ?21, ?22, ?23, ?24, ?25)",
        )?;
        let run = &row.run;
        let finished = row.finished.as_ref();
        let completion = finished.map(|f| &f.completion);
        let resume = completion.and_then(|c| c.resume.as_ref());
        let error = completion.and_then(|c| c.error.as_ref());
        // Both JSON columns share one buffer: SQLite copies `meta` when it is bound,
        // before the buffer is reused for `usage`.
        stmt.raw_bind_parameter(7, json_text(&mut self.json, &run.meta)?)?;
        let usage = completion.map_or(&serde_json::Value::Null, |c| &c.usage);
        stmt.raw_bind_parameter(14, json_text(&mut self.json, usage)?)?;
        stmt.raw_bind_parameter(1, row.seq)?;
        stmt.raw_bind_parameter(2, run.run_id.as_str())?;
        stmt.raw_bind_parameter(3, run.session_key.as_str())?;
        stmt.raw_bind_parameter(4, &run.conversation)?;
        stmt.raw_bind_parameter(5, &run.engine)?;
        stmt.raw_bind_parameter(6, &run.prompt)?;
        stmt.raw_bind_parameter(8, row.status.as_str())?;
        stmt.raw_bind_parameter(9, completion.map(|c| c.answer.as_str()))?;
        stmt.raw_bind_parameter(10, error.map(|e| e.to_string()))?;
        stmt.raw_bind_parameter(11, error.map(|e| e.code()))?;
        stmt.raw_bind_parameter(12, resume.map(|r| r.engine.as_str()))?;
        stmt.raw_bind_parameter(13, resume.map(|r| r.value.as_str()))?;
        stmt.raw_bind_parameter(15, run.created_at_ms)?;
        stmt.raw_bind_parameter(16, row.started_at_ms)?;
        stmt.raw_bind_parameter(17, finished.map(|f| f.completed_at_ms))?;
        stmt.raw_bind_parameter(18, finished.map(|f| to_i64(f.duration_ms)))?;
        stmt.raw_bind_parameter(19, run.resumed_from.as_ref().map(|r| r.engine.as_str()))?;
        stmt.raw_bind_parameter(20, run.resumed_from.as_ref().map(|r| r.value.as_str()))?;
        bind_spend(&mut stmt, 21, finished.map_or(&RunSpend::default(), |f| &f.spend))?;
        stmt.raw_execute()?;
        Ok(())
    }
}

/// Binds a spend's five columns from parameter `first` on.
fn bind_spend(
    stmt: &mut rusqlite::CachedStatement<'_>,
    first: usize,
    spend: &RunSpend,
) -> rusqlite::Result<()> {
    stmt.raw_bind_parameter(first, to_i64(spend.input_tokens))?;
    stmt.raw_bind_parameter(first + 1, to_i64(spend.output_tokens))?;
    stmt.raw_bind_parameter(first + 2, to_i64(spend.cache_read_tokens))?;
    stmt.raw_bind_parameter(first + 3, to_i64(spend.cache_write_tokens))?;
    stmt.raw_bind_parameter(first + 4, spend.usd)?;
    Ok(())
}

/// `value` as JSON text in the reused buffer `buf`.
fn json_text<'a>(buf: &'a mut Vec<u8>, value: &serde_json::Value) -> rusqlite::Result<&'a str> {
    buf.clear();
    serde_json::to_writer(&mut *buf, value).map_err(to_sql_error)?;
    std::str::from_utf8(buf).map_err(to_sql_error)
}

fn to_sql_error(err: impl std::error::Error + Send + Sync + 'static) -> rusqlite::Error {
    rusqlite::Error::ToSqlConversionFailure(Box::new(err))
}

/// SQLite integers are signed; counts and durations beyond `i64::MAX` saturate.
fn to_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}
