//! Retention's steps on the file: each [`PruneStep`] runs on the writer's
//! connection in a short transaction of its own, after a batch (see `writer`),
//! and touches at most its `limit` rows, so a run's writes never wait long
//! behind it.
//!
//! Also the file's one-time conversion to `auto_vacuum = INCREMENTAL`, which
//! lets [`PruneStep::Vacuum`] give freed pages back to the file system.

use tokio::time::Instant;

use rusqlite::{params, Connection};

use super::super::columns;
use super::super::PruneStep;

/// The tables [`table_rows`] counts, in the order it reports them.
const TABLES: [&str; 6] = ["runs", "run_events", "pruned_usage", "journal", "kv", "chat_state"];

/// Applies `step` in its own transaction at `now_ms`; what it removed.
pub(super) fn apply(conn: &Connection, step: &PruneStep, now_ms: i64) -> rusqlite::Result<u64> {
    conn.execute_batch("BEGIN IMMEDIATE")?;
    let result = match step {
        PruneStep::Runs { before_ms, limit } => delete_runs(conn, *before_ms, *limit),
        PruneStep::Events { before_ms, limit } => compact_events(conn, *before_ms, *limit, now_ms),
        PruneStep::Usage { before_ms, limit } => delete_usage(conn, *before_ms, *limit),
        PruneStep::ExpiredRecords { now_ms, limit } => purge_expired(conn, *now_ms, *limit),
        PruneStep::IdleRecords { namespace, before_ms, limit } => {
            delete_idle(conn, namespace, *before_ms, *limit)
        }
        PruneStep::Vacuum { pages } => vacuum(conn, *pages),
    };
    match result {
        Ok(removed) => {
            conn.execute_batch("COMMIT")?;
            Ok(removed)
        }
        Err(err) => {
            // Nothing of a failed step is kept; a rollback after a failed
            // commit finds no transaction, which is fine.
            let _ = conn.execute_batch("ROLLBACK");
            Err(err)
        }
    }
}

fn sql_limit(limit: usize) -> i64 {
    i64::try_from(limit).unwrap_or(i64::MAX)
}

/// The `seq`s of up to `limit` finished runs completed before `before_ms`, oldest
/// first, that no unexpired `kv` record names (a delivery still owed).
fn old_runs(conn: &Connection, before_ms: i64, limit: usize) -> rusqlite::Result<Vec<i64>> {
    let mut stmt = conn.prepare_cached(
        "SELECT seq FROM runs
         WHERE completed_at_ms IS NOT NULL AND completed_at_ms < ?1
           AND NOT EXISTS (SELECT 1 FROM kv WHERE key = runs.run_id AND expires_at_ms IS NULL)
         ORDER BY completed_at_ms LIMIT ?2",
    )?;
    let rows = stmt.query_map(params![before_ms, sql_limit(limit)], |row| row.get(0))?;
    rows.collect()
}

fn delete_runs(conn: &Connection, before_ms: i64, limit: usize) -> rusqlite::Result<u64> {
    let seqs = old_runs(conn, before_ms, limit)?;
    let mut keep_usage = conn.prepare_cached(
        "INSERT INTO pruned_usage (completed_at_ms, session_key, engine, input_tokens,
             output_tokens, cache_read_tokens, cache_write_tokens, cost_usd)
         SELECT completed_at_ms, session_key, engine, input_tokens, output_tokens,
             cache_read_tokens, cache_write_tokens, cost_usd
         FROM runs WHERE seq = ?1",
    )?;
    let mut delete_events = conn.prepare_cached("DELETE FROM run_events WHERE run_seq = ?1")?;
    let mut delete_run = conn.prepare_cached("DELETE FROM runs WHERE seq = ?1")?;
    for seq in &seqs {
        keep_usage.execute([seq])?;
        delete_events.execute([seq])?;
        delete_run.execute([seq])?;
    }
    Ok(seqs.len() as u64)
}

/// Replaces the events of up to `limit` finished runs completed before
/// `before_ms` by their `run_completed` (marked `"compacted"`), and records
/// what they showed in the run's `compacted` column.
fn compact_events(
    conn: &Connection,
    before_ms: i64,
    limit: usize,
    now_ms: i64,
) -> rusqlite::Result<u64> {
    let runs: Vec<i64> = {
        let mut stmt = conn.prepare_cached(
            "SELECT seq FROM runs
             WHERE completed_at_ms IS NOT NULL AND completed_at_ms < ?1 AND compacted IS NULL
             ORDER BY completed_at_ms LIMIT ?2",
        )?;
        let rows = stmt.query_map(params![before_ms, sql_limit(limit)], |row| row.get(0))?;
        rows.collect::<rusqlite::Result<_>>()?
    };
    let mut read =
        conn.prepare_cached("SELECT data FROM run_events WHERE run_seq = ?1 ORDER BY idx")?;
    let mut delete = conn.prepare_cached("DELETE FROM run_events WHERE run_seq = ?1")?;
    let mut keep = conn.prepare_cached(
        "INSERT INTO run_events (run_seq, idx, kind, data) VALUES (?1, ?2, 'run_completed', ?3)",
    )?;
    let mut mark = conn.prepare_cached("UPDATE runs SET compacted = ?2 WHERE seq = ?1")?;
    for seq in &runs {
        let rows = read.query_map([seq], |row| row.get::<_, String>(0))?;
        let compacted =
            columns::compact_events(rows.collect::<rusqlite::Result<Vec<_>>>()?, now_ms);
        delete.execute([seq])?;
        if let Some((index, completed)) = compacted.kept {
            keep.execute(params![seq, index, completed])?;
        }
        mark.execute(params![seq, compacted.summary])?;
    }
    Ok(runs.len() as u64)
}

fn delete_usage(conn: &Connection, before_ms: i64, limit: usize) -> rusqlite::Result<u64> {
    let mut stmt = conn.prepare_cached(
        "DELETE FROM pruned_usage WHERE rowid IN (
            SELECT rowid FROM pruned_usage WHERE completed_at_ms < ?1
            ORDER BY completed_at_ms LIMIT ?2)",
    )?;
    Ok(stmt.execute(params![before_ms, sql_limit(limit)])? as u64)
}

/// Deletes at most `limit` `kv` records expired at `now_ms`, soonest expiry first.
pub(super) fn purge_expired(conn: &Connection, now_ms: i64, limit: usize) -> rusqlite::Result<u64> {
    let mut stmt = conn.prepare_cached(
        "DELETE FROM kv WHERE (namespace, key) IN (
            SELECT namespace, key FROM kv
            WHERE expires_at_ms IS NOT NULL AND expires_at_ms <= ?1
            ORDER BY expires_at_ms LIMIT ?2)",
    )?;
    Ok(stmt.execute(params![now_ms, sql_limit(limit)])? as u64)
}

fn delete_idle(
    conn: &Connection,
    namespace: &str,
    before_ms: i64,
    limit: usize,
) -> rusqlite::Result<u64> {
    // `CASE` so that a value that is not JSON is skipped rather than failing the step.
    let mut stmt = conn.prepare_cached(
        "DELETE FROM kv WHERE namespace = ?1 AND key IN (
            SELECT key FROM kv WHERE namespace = ?1 AND expires_at_ms IS NULL
              AND CASE WHEN json_valid(value) THEN json_extract(value, '$.updated_at_ms') END < ?2
            LIMIT ?3)",
    )?;
    Ok(stmt.execute(params![namespace, before_ms, sql_limit(limit)])? as u64)
}

fn vacuum(conn: &Connection, pages: u32) -> rusqlite::Result<u64> {
    let free = |conn: &Connection| -> rusqlite::Result<i64> {
        conn.query_row("PRAGMA freelist_count", [], |row| row.get(0))
    };
    let before = free(conn)?;
    // Each row of the pragma's answer is one step of the work; step through all.
    let mut stmt = conn.prepare(&format!("PRAGMA incremental_vacuum({pages})"))?;
    let mut rows = stmt.query([])?;
    while rows.next()?.is_some() {}
    drop(rows);
    let after = free(conn)?;
    Ok(u64::try_from(before - after).unwrap_or(0))
}

/// Bytes of the pages in use: the file's pages less the free ones.
pub(super) fn used_bytes(conn: &Connection) -> rusqlite::Result<u64> {
    let pragma = |name: &str| -> rusqlite::Result<i64> {
        conn.query_row(&format!("PRAGMA {name}"), [], |row| row.get(0))
    };
    let used = pragma("page_count")?.saturating_sub(pragma("freelist_count")?);
    Ok(u64::try_from(used.saturating_mul(pragma("page_size")?)).unwrap_or(0))
}

/// Rows per table, in [`TABLES`] order.
pub(super) fn table_rows(conn: &Connection) -> rusqlite::Result<Vec<(String, u64)>> {
    TABLES
        .iter()
        .map(|table| {
            let rows: i64 =
                conn.query_row(&format!("SELECT count(*) FROM {table}"), [], |row| row.get(0))?;
            Ok(((*table).to_owned(), u64::try_from(rows).unwrap_or(0)))
        })
        .collect()
}

/// Makes a file that does not give pages back (`auto_vacuum = NONE`, made
/// before this build) do so incrementally, by rewriting it once (`VACUUM`),
/// logged with how long it took. A new file is made that way from the start
/// (see `connect`). A file another connection is using is left for the next
/// start.
pub(super) fn use_incremental_vacuum(conn: &Connection) -> Result<(), String> {
    let mode: i64 =
        conn.query_row("PRAGMA auto_vacuum", [], |row| row.get(0)).map_err(|e| e.to_string())?;
    // 0 none, 1 full, 2 incremental.
    if mode != 0 {
        return Ok(());
    }
    conn.pragma_update(None, "auto_vacuum", "INCREMENTAL").map_err(|e| e.to_string())?;
    let started = Instant::now();
    match conn.execute_batch("VACUUM") {
        Ok(()) => tracing::info!(
            took_ms = started.elapsed().as_millis() as u64,
            "store converted to give freed space back to the file system (once)"
        ),
        Err(err) => tracing::warn!(
            error = %err,
            "store could not be converted to give freed space back; trying again at the next start"
        ),
    }
    Ok(())
}
