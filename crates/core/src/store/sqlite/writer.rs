//! The writer thread: the only owner of the write connection.
//!
//! It takes one queued op, drains whatever else is already queued (up to
//! [`MAX_BATCH`]), applies them all in one transaction and commits, then answers the
//! barriers (`Flush`, `CheckWritable`, `Stop`) that were in the batch. One commit per
//! batch instead of per write is what makes tens of thousands of runs a second
//! possible: with WAL and `synchronous = NORMAL` a commit is an append to the log.

use std::sync::Arc;
use std::thread;

use rusqlite::{params, Connection};
use tokio::sync::{mpsc, oneshot};

use super::super::{FinishedRun, NewRun, StoreError};
use crate::bus::{BusEvent, RunStatus};
use crate::ids::RunId;

/// Most ops applied in one transaction; bounds how long a barrier waits behind a burst.
const MAX_BATCH: usize = 4096;

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
    /// Serialised to JSON here on the writer thread, not by the publisher.
    AppendEvent(Arc<BusEvent>),
    FinalizeRun(FinishedRun),
    PutChatState {
        session_key: String,
        last_engine: String,
        last_resume_token: String,
        updated_at_ms: i64,
        expires_at_ms: i64,
    },
    DeleteChatState {
        session_key: String,
    },
    /// Deletes chat state that is still expired at `now_ms`, so a put queued in between wins.
    DeleteExpiredChatState {
        session_key: String,
        now_ms: i64,
    },
    Flush {
        reply: Reply,
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
    /// A short name for logs.
    pub(super) fn name(&self) -> &'static str {
        match self {
            WriteOp::InsertRun(_) => "insert_run",
            WriteOp::MarkRunning { .. } => "mark_running",
            WriteOp::AppendEvent(_) => "append_event",
            WriteOp::FinalizeRun(_) => "finalize_run",
            WriteOp::PutChatState { .. } => "put_chat_state",
            WriteOp::DeleteChatState { .. } => "delete_chat_state",
            WriteOp::DeleteExpiredChatState { .. } => "delete_expired_chat_state",
            WriteOp::Flush { .. } => "flush",
            WriteOp::CheckWritable { .. } => "check_writable",
            WriteOp::Stop { .. } => "stop",
        }
    }
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
}

/// Starts the writer thread on `conn`. It runs until `Stop` or until every sender is
/// gone, and in both cases first applies everything already queued.
pub(super) fn spawn(
    conn: Connection,
    rx: mpsc::Receiver<WriteOp>,
) -> std::io::Result<thread::JoinHandle<()>> {
    let writer =
        Writer { conn, json: Vec::with_capacity(1024), failure: None, replies: Vec::new() };
    thread::Builder::new().name("lemon-store-writer".to_owned()).spawn(move || writer.run(rx))
}

impl Writer {
    fn run(mut self, mut rx: mpsc::Receiver<WriteOp>) {
        let mut batch = Vec::with_capacity(MAX_BATCH);
        // `blocking_recv` keeps returning what was queued before `close()` or before the
        // last sender dropped, then `None`: nothing handed to this thread is lost.
        while let Some(op) = rx.blocking_recv() {
            batch.push(op);
            while batch.len() < MAX_BATCH {
                match rx.try_recv() {
                    Ok(op) => batch.push(op),
                    Err(_) => break,
                }
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
        let mut n_writes = 0_usize;
        let mut error: Option<String> = None;
        let mut begin_failed = false;
        for op in batch.drain(..) {
            match op {
                WriteOp::Flush { reply } => self.replies.push(reply),
                WriteOp::Stop { reply } => {
                    stop = true;
                    self.replies.push(reply);
                }
                op => {
                    n_writes += 1;
                    // Also re-begins when SQLite rolled the transaction back after an error
                    // (I/O, full disk), so later ops in the batch are still grouped.
                    if !begin_failed && self.conn.is_autocommit() {
                        if let Err(err) = self.conn.execute_batch("BEGIN IMMEDIATE") {
                            tracing::error!(error = %err, "store could not begin a write transaction");
                            begin_failed = true;
                            error.get_or_insert_with(|| err.to_string());
                        }
                    }
                    let name = op.name();
                    if let Err(err) = self.apply(op) {
                        tracing::error!(op = name, error = %err, "store write failed");
                        error.get_or_insert_with(|| format!("{name}: {err}"));
                    }
                }
            }
        }
        if !self.conn.is_autocommit() {
            if let Err(err) = self.conn.execute_batch("COMMIT") {
                tracing::error!(error = %err, n_writes, "store commit failed; the batch is lost");
                error.get_or_insert_with(|| format!("commit: {err}"));
                if let Err(err) = self.conn.execute_batch("ROLLBACK") {
                    tracing::error!(error = %err, "store rollback failed");
                }
            }
        }
        if n_writes > 0 {
            if self.failure.is_some() && error.is_none() {
                tracing::info!("store writes succeed again");
            }
            self.failure = error;
        }
        let result = match &self.failure {
            None => Ok(()),
            Some(message) => Err(StoreError::Database(message.clone())),
        };
        for reply in self.replies.drain(..) {
            // A caller that stopped waiting is normal.
            let _ = reply.send(result.clone());
        }
        stop
    }

    fn apply(&mut self, op: WriteOp) -> rusqlite::Result<()> {
        let conn = &self.conn;
        let json = &mut self.json;
        match op {
            WriteOp::InsertRun(run) => {
                // A repeated id replaces the run, as the memory backend does.
                let mut stmt = conn.prepare_cached(
                    "INSERT OR REPLACE INTO runs (run_id, session_key, conversation, engine, prompt, meta, status, usage, created_at_ms)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, 'queued', 'null', ?7)",
                )?;
                stmt.execute(params![
                    run.run_id.as_str(),
                    run.session_key,
                    run.conversation,
                    run.engine,
                    run.prompt,
                    json_text(json, &run.meta)?,
                    run.created_at_ms,
                ])?;
            }
            WriteOp::MarkRunning { run_id, engine, started_at_ms } => {
                let mut stmt = conn.prepare_cached(
                    "UPDATE runs SET
                        status = CASE WHEN status IN ('completed', 'failed', 'cancelled') THEN status ELSE 'running' END,
                        engine = ?2, started_at_ms = ?3
                     WHERE run_id = ?1",
                )?;
                stmt.execute(params![run_id.as_str(), engine, started_at_ms])?;
            }
            WriteOp::AppendEvent(event) => {
                // A repeated index replaces the event rather than failing the batch.
                let mut stmt =
                    conn.prepare_cached("INSERT OR REPLACE INTO run_events (run_id, idx, kind, data) VALUES (?1, ?2, ?3, ?4)")?;
                let data = event.to_json();
                stmt.execute(params![
                    event.run_id.as_str(),
                    to_i64(event.index),
                    event.kind.type_name(),
                    json_text(json, &data)?,
                ])?;
            }
            WriteOp::FinalizeRun(run) => {
                let mut stmt = conn.prepare_cached(
                    "UPDATE runs SET status = ?2, engine = ?3, answer = ?4, error = ?5, error_code = ?6,
                        resume_engine = ?7, resume_value = ?8, usage = ?9, completed_at_ms = ?10, duration_ms = ?11
                     WHERE run_id = ?1",
                )?;
                let completion = &run.completion;
                let resume = completion.resume.as_ref();
                stmt.execute(params![
                    run.run_id.as_str(),
                    RunStatus::of(completion).as_str(),
                    run.engine,
                    completion.answer,
                    completion.error.as_ref().map(|e| e.to_string()),
                    completion.error.as_ref().map(|e| e.code()),
                    resume.map(|r| r.engine.as_str()),
                    resume.map(|r| r.value.as_str()),
                    json_text(json, &completion.usage)?,
                    run.completed_at_ms,
                    to_i64(run.duration_ms),
                ])?;
            }
            WriteOp::PutChatState {
                session_key,
                last_engine,
                last_resume_token,
                updated_at_ms,
                expires_at_ms,
            } => {
                let mut stmt = conn.prepare_cached(
                    "INSERT OR REPLACE INTO chat_state (session_key, last_engine, last_resume_token, updated_at_ms, expires_at_ms)
                     VALUES (?1, ?2, ?3, ?4, ?5)",
                )?;
                stmt.execute(params![
                    session_key,
                    last_engine,
                    last_resume_token,
                    updated_at_ms,
                    expires_at_ms
                ])?;
            }
            WriteOp::DeleteChatState { session_key } => {
                let mut stmt =
                    conn.prepare_cached("DELETE FROM chat_state WHERE session_key = ?1")?;
                stmt.execute(params![session_key])?;
            }
            WriteOp::DeleteExpiredChatState { session_key, now_ms } => {
                let mut stmt = conn.prepare_cached(
                    "DELETE FROM chat_state WHERE session_key = ?1 AND expires_at_ms <= ?2",
                )?;
                stmt.execute(params![session_key, now_ms])?;
            }
            WriteOp::CheckWritable { now_ms, reply } => {
                self.replies.push(reply);
                let mut stmt = conn.prepare_cached(
                    "INSERT OR REPLACE INTO health (id, checked_at_ms) VALUES (1, ?1)",
                )?;
                stmt.execute(params![now_ms])?;
            }
            // Barriers are taken out in `apply_batch`; nothing to write for them.
            WriteOp::Flush { reply } | WriteOp::Stop { reply } => self.replies.push(reply),
        }
        Ok(())
    }
}

/// `value` as JSON text in the reused buffer `buf`.
fn json_text<'a>(buf: &'a mut Vec<u8>, value: &serde_json::Value) -> rusqlite::Result<&'a str> {
    buf.clear();
    serde_json::to_writer(&mut *buf, value)
        .map_err(|e| rusqlite::Error::ToSqlConversionFailure(Box::new(e)))?;
    std::str::from_utf8(buf).map_err(|e| rusqlite::Error::ToSqlConversionFailure(Box::new(e)))
}

/// SQLite integers are signed; counts and durations beyond `i64::MAX` saturate.
fn to_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}
