//! Retention's steps on PostgreSQL, and what the store holds (rows per table,
//! bytes). Each [`PruneStep`] runs on the writer's task after the batch it
//! was queued in, in a short transaction of its own, and touches at most its
//! `limit` rows, as on SQLite (`sqlite/prune.rs`, whose choices of rows this
//! repeats). The rows a step picks are locked with `SKIP LOCKED`, so two
//! nodes pruning one database at once share the work instead of waiting.

use deadpool_postgres::{Object, Transaction};
use tokio_postgres::Error;

use super::super::columns;
use super::super::PruneStep;
use super::writer::{sql_limit, KV_PURGE_EXPIRED};

/// The tables [`table_rows`] counts, in the order it reports them (SQLite's).
const TABLES: [&str; 6] = ["runs", "run_events", "pruned_usage", "journal", "kv", "chat_state"];

/// Every table the store keeps its data in: what [`used_bytes`] sums.
const STORE_TABLES: [&str; 7] =
    ["runs", "run_events", "pruned_usage", "journal", "kv", "chat_state", "health"];

/// Applies `step` in its own transaction at `now_ms`; what it removed.
///
/// [`PruneStep::Vacuum`] frees nothing and returns 0: PostgreSQL has no
/// incremental vacuum. Autovacuum already makes the room of deleted rows
/// reusable inside each table; giving it back to the file system takes
/// `VACUUM FULL`, which rewrites a table under an exclusive lock, so it is
/// left to the database's operator.
///
/// # Errors
/// The step failed; nothing of it is kept.
pub(super) async fn apply(
    client: &mut Object,
    step: &PruneStep,
    now_ms: i64,
) -> Result<u64, Error> {
    if let PruneStep::Vacuum { .. } = step {
        return Ok(0);
    }
    let tx = client.transaction().await?;
    let removed = match step {
        PruneStep::Runs { before_ms, limit } => delete_runs(&tx, *before_ms, *limit).await?,
        PruneStep::Events { before_ms, limit } => {
            compact_events(&tx, *before_ms, *limit, now_ms).await?
        }
        PruneStep::Usage { before_ms, limit } => delete_usage(&tx, *before_ms, *limit).await?,
        PruneStep::ExpiredRecords { now_ms, limit } => {
            let stmt = tx.prepare_cached(KV_PURGE_EXPIRED).await?;
            tx.execute(&stmt, &[now_ms, &sql_limit(*limit)]).await?
        }
        PruneStep::IdleRecords { namespace, before_ms, limit } => {
            delete_idle(&tx, namespace, *before_ms, *limit).await?
        }
        PruneStep::Vacuum { .. } => 0,
    };
    tx.commit().await?;
    Ok(removed)
}

/// Up to `limit` finished runs completed before `before_ms`, oldest first,
/// that no unexpired `kv` record names (a delivery still owed), with their
/// events; what each spent moves to `pruned_usage`.
async fn delete_runs(tx: &Transaction<'_>, before_ms: i64, limit: usize) -> Result<u64, Error> {
    let select = tx
        .prepare_cached(
            "SELECT seq FROM runs
             WHERE completed_at_ms IS NOT NULL AND completed_at_ms < $1
               AND NOT EXISTS (SELECT 1 FROM kv WHERE key = runs.run_id AND expires_at_ms IS NULL)
             ORDER BY completed_at_ms LIMIT $2
             FOR UPDATE SKIP LOCKED",
        )
        .await?;
    let seqs: Vec<i64> = tx
        .query(&select, &[&before_ms, &sql_limit(limit)])
        .await?
        .iter()
        .map(|row| row.try_get(0))
        .collect::<Result<_, _>>()?;
    if seqs.is_empty() {
        return Ok(0);
    }
    let keep_usage = tx
        .prepare_cached(
            "INSERT INTO pruned_usage (completed_at_ms, session_key, engine, input_tokens,
                 output_tokens, cache_read_tokens, cache_write_tokens, cost_usd)
             SELECT completed_at_ms, session_key, engine, input_tokens, output_tokens,
                 cache_read_tokens, cache_write_tokens, cost_usd
             FROM runs WHERE seq = ANY($1)",
        )
        .await?;
    let delete_events = tx
        .prepare_cached(
            "DELETE FROM run_events WHERE run_id IN (SELECT run_id FROM runs WHERE seq = ANY($1))",
        )
        .await?;
    let delete_runs = tx.prepare_cached("DELETE FROM runs WHERE seq = ANY($1)").await?;
    tx.execute(&keep_usage, &[&seqs]).await?;
    tx.execute(&delete_events, &[&seqs]).await?;
    tx.execute(&delete_runs, &[&seqs]).await?;
    Ok(seqs.len() as u64)
}

/// Replaces the events of up to `limit` finished runs completed before
/// `before_ms` by their `run_completed` (marked `"compacted"`), and records
/// what they showed in the run's `compacted` column.
async fn compact_events(
    tx: &Transaction<'_>,
    before_ms: i64,
    limit: usize,
    now_ms: i64,
) -> Result<u64, Error> {
    let select = tx
        .prepare_cached(
            "SELECT run_id FROM runs
             WHERE completed_at_ms IS NOT NULL AND completed_at_ms < $1 AND compacted IS NULL
             ORDER BY completed_at_ms LIMIT $2
             FOR UPDATE SKIP LOCKED",
        )
        .await?;
    let runs: Vec<String> = tx
        .query(&select, &[&before_ms, &sql_limit(limit)])
        .await?
        .iter()
        .map(|row| row.try_get(0))
        .collect::<Result<_, _>>()?;
    let read =
        tx.prepare_cached("SELECT data FROM run_events WHERE run_id = $1 ORDER BY idx").await?;
    let delete = tx.prepare_cached("DELETE FROM run_events WHERE run_id = $1").await?;
    let keep = tx
        .prepare_cached(
            "INSERT INTO run_events (run_id, idx, kind, data) VALUES ($1, $2, 'run_completed', $3)",
        )
        .await?;
    let mark = tx.prepare_cached("UPDATE runs SET compacted = $2 WHERE run_id = $1").await?;
    for run_id in &runs {
        let mut rows = Vec::new();
        for row in tx.query(&read, &[run_id]).await? {
            rows.push(row.try_get::<_, String>(0)?);
        }
        let compacted = columns::compact_events(rows, now_ms);
        tx.execute(&delete, &[run_id]).await?;
        if let Some((index, completed)) = compacted.kept {
            tx.execute(&keep, &[run_id, &index, &completed]).await?;
        }
        tx.execute(&mark, &[run_id, &compacted.summary]).await?;
    }
    Ok(runs.len() as u64)
}

/// The usage history of up to `limit` deleted runs completed before `before_ms`, oldest first.
async fn delete_usage(tx: &Transaction<'_>, before_ms: i64, limit: usize) -> Result<u64, Error> {
    let stmt = tx
        .prepare_cached(
            "DELETE FROM pruned_usage WHERE ctid IN (
                SELECT ctid FROM pruned_usage WHERE completed_at_ms < $1
                ORDER BY completed_at_ms LIMIT $2 FOR UPDATE SKIP LOCKED)",
        )
        .await?;
    tx.execute(&stmt, &[&before_ms, &sql_limit(limit)]).await
}

/// Up to `limit` records of `namespace` without expiry whose value's
/// `updated_at_ms` is a number before `before_ms`. A value that is not JSON,
/// or has no such number, is skipped rather than failing the step; it is
/// read here rather than cast in SQL, where one bad value would fail the
/// whole statement.
async fn delete_idle(
    tx: &Transaction<'_>,
    namespace: &str,
    before_ms: i64,
    limit: usize,
) -> Result<u64, Error> {
    let select = tx
        .prepare_cached(
            "SELECT key, value FROM kv
             WHERE namespace = $1 AND expires_at_ms IS NULL AND value LIKE '%updated_at_ms%'",
        )
        .await?;
    let mut idle = Vec::new();
    for row in tx.query(&select, &[&namespace]).await? {
        if idle.len() >= limit {
            break;
        }
        let value: String = row.try_get(1)?;
        if updated_before(&value, before_ms) {
            idle.push(row.try_get::<_, String>(0)?);
        }
    }
    if idle.is_empty() {
        return Ok(0);
    }
    let delete = tx
        .prepare_cached(
            "DELETE FROM kv WHERE namespace = $1 AND key = ANY($2) AND expires_at_ms IS NULL",
        )
        .await?;
    tx.execute(&delete, &[&namespace, &idle]).await
}

/// Whether `value` is JSON whose `updated_at_ms` is a number before `before_ms`.
fn updated_before(value: &str, before_ms: i64) -> bool {
    let Ok(value) = serde_json::from_str::<serde_json::Value>(value) else { return false };
    match &value["updated_at_ms"] {
        serde_json::Value::Number(n) => match n.as_i64() {
            Some(at) => at < before_ms,
            None => n.as_f64().is_some_and(|at| at < before_ms as f64),
        },
        _ => false,
    }
}

/// Rows per table, in [`TABLES`] order, counted in one snapshot.
pub(super) async fn table_rows(client: &Object) -> Result<Vec<(String, u64)>, Error> {
    let counts: Vec<String> =
        TABLES.iter().map(|table| format!("(SELECT count(*) FROM {table})")).collect();
    let stmt = client.prepare_cached(&format!("SELECT {}", counts.join(", "))).await?;
    let row = client.query_one(&stmt, &[]).await?;
    TABLES
        .iter()
        .enumerate()
        .map(|(i, table)| {
            let rows: i64 = row.try_get(i)?;
            Ok(((*table).to_owned(), u64::try_from(rows).unwrap_or(0)))
        })
        .collect()
}

/// Bytes of the store's tables with their indexes and TOAST, as the server
/// counts them (`pg_total_relation_size`).
pub(super) async fn used_bytes(client: &Object) -> Result<u64, Error> {
    let sizes: Vec<String> =
        STORE_TABLES.iter().map(|table| format!("pg_total_relation_size('{table}')")).collect();
    let stmt = client.prepare_cached(&format!("SELECT ({})::bigint", sizes.join(" + "))).await?;
    let bytes: i64 = client.query_one(&stmt, &[]).await?.try_get(0)?;
    Ok(u64::try_from(bytes).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idle_means_a_numeric_updated_at_before_the_cut() {
        let check = |value: &str, expected: bool| {
            assert_eq!(updated_before(value, 1_000), expected, "{value}");
        };
        check(r#"{"updated_at_ms": 999}"#, true);
        check(r#"{"updated_at_ms": 999.5}"#, true);
        check(r#"{"updated_at_ms": 1000}"#, false);
        check(r#"{"updated_at_ms": "5"}"#, false);
        check(r#"{"other": 5}"#, false);
        check("not json, updated_at_ms", false);
        check("[1, 2]", false);
    }
}
