//! The SQLite schema as an ordered list of migrations, tracked in `PRAGMA user_version`.
//!
//! Migration `n` (1-based) moves `user_version` from `n - 1` to `n` inside one
//! transaction, so a crash mid-migration leaves the file at the previous version.
//! Shipped entries are never edited or reordered; a new table is a new entry at the end.

use rusqlite::{Connection, TransactionBehavior};

/// Every migration, oldest first.
const MIGRATIONS: &[&str] = &[
    // 1: runs, their events, chat state, and the row `check_writable` rewrites.
    //
    // Run ids are random, so anything keyed by them is written at random places in
    // its b-tree, and at tens of thousands of runs a second that random I/O is what
    // limits throughput. So only the `run_id` index is random: each run also gets a
    // `seq` in insertion order, and its events are keyed by `(run_seq, idx)`, which
    // appends. `seq` also breaks ties between runs created in the same millisecond.
    // Events of a run that was never inserted get their `seq` from `event_only_runs`.
    "CREATE TABLE runs (
        seq INTEGER PRIMARY KEY,
        run_id TEXT NOT NULL UNIQUE,
        session_key TEXT NOT NULL,
        conversation TEXT NOT NULL,
        engine TEXT NOT NULL,
        prompt TEXT NOT NULL,
        meta TEXT NOT NULL,
        status TEXT NOT NULL,
        answer TEXT,
        error TEXT,
        error_code TEXT,
        resume_engine TEXT,
        resume_value TEXT,
        usage TEXT NOT NULL,
        created_at_ms INTEGER NOT NULL,
        started_at_ms INTEGER,
        completed_at_ms INTEGER,
        duration_ms INTEGER
    );
    CREATE INDEX runs_newest ON runs (created_at_ms);
    CREATE INDEX runs_by_status ON runs (status, created_at_ms);
    CREATE TABLE event_only_runs (
        run_id TEXT PRIMARY KEY NOT NULL,
        seq INTEGER NOT NULL UNIQUE
    );
    CREATE TABLE run_events (
        run_seq INTEGER NOT NULL,
        idx INTEGER NOT NULL,
        kind TEXT NOT NULL,
        data TEXT NOT NULL,
        PRIMARY KEY (run_seq, idx)
    ) WITHOUT ROWID;
    CREATE TABLE chat_state (
        session_key TEXT PRIMARY KEY NOT NULL,
        last_engine TEXT NOT NULL,
        last_resume_token TEXT NOT NULL,
        updated_at_ms INTEGER NOT NULL,
        expires_at_ms INTEGER NOT NULL
    ) WITHOUT ROWID;
    CREATE TABLE health (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        checked_at_ms INTEGER NOT NULL
    );",
    // 2: the router's admission journal: accepted requests until their completion.
    "CREATE TABLE journal (
        run_id TEXT PRIMARY KEY NOT NULL,
        seq INTEGER NOT NULL,
        session_key TEXT NOT NULL,
        conversation TEXT NOT NULL,
        prompt TEXT NOT NULL,
        engine TEXT NOT NULL,
        resume_engine TEXT,
        resume_value TEXT,
        cwd TEXT,
        meta TEXT NOT NULL,
        route TEXT NOT NULL,
        state TEXT NOT NULL,
        accepted_at_ms INTEGER NOT NULL
    );
    CREATE INDEX journal_by_seq ON journal (seq);",
    // 3: small records channels keep (idempotency keys, update offsets, pending
    // deliveries), by namespace and key, with an optional expiry. Expired rows are
    // purged a few at a time, oldest expiry first, through the partial index.
    "CREATE TABLE kv (
        namespace TEXT NOT NULL,
        key TEXT NOT NULL,
        value TEXT NOT NULL,
        expires_at_ms INTEGER,
        PRIMARY KEY (namespace, key)
    ) WITHOUT ROWID;
    CREATE INDEX kv_by_expiry ON kv (expires_at_ms) WHERE expires_at_ms IS NOT NULL;",
    // 4: the session a run continued: the resume token it was started with.
    "ALTER TABLE runs ADD COLUMN resumed_from_engine TEXT;
    ALTER TABLE runs ADD COLUMN resumed_from_value TEXT;",
    // 5: what each run spent, normalised (tokens and US dollars), for usage
    // totals and budgets, which sum finished runs by completion time.
    "ALTER TABLE runs ADD COLUMN input_tokens INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE runs ADD COLUMN output_tokens INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE runs ADD COLUMN cache_read_tokens INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE runs ADD COLUMN cache_write_tokens INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE runs ADD COLUMN cost_usd REAL NOT NULL DEFAULT 0;
    CREATE INDEX runs_completed ON runs (completed_at_ms) WHERE completed_at_ms IS NOT NULL;
    CREATE INDEX runs_session_completed ON runs (session_key, completed_at_ms)
        WHERE completed_at_ms IS NOT NULL;",
    // 6: a session's runs in order, for its export.
    "CREATE INDEX runs_by_session ON runs (session_key, seq);",
    // 7: retention. A deleted run's spend stays in `pruned_usage`, so usage totals
    // and budgets read the same; a run whose events were compacted keeps what
    // they showed in `compacted` (JSON), and the runs still to compact have an
    // index of their own. Unexpired records are found by key, so that a run
    // owed a delivery (a record keyed by its id) is never deleted.
    "ALTER TABLE runs ADD COLUMN compacted TEXT;
    CREATE INDEX runs_uncompacted ON runs (completed_at_ms)
        WHERE completed_at_ms IS NOT NULL AND compacted IS NULL;
    CREATE TABLE pruned_usage (
        completed_at_ms INTEGER NOT NULL,
        session_key TEXT NOT NULL,
        engine TEXT NOT NULL,
        input_tokens INTEGER NOT NULL,
        output_tokens INTEGER NOT NULL,
        cache_read_tokens INTEGER NOT NULL,
        cache_write_tokens INTEGER NOT NULL,
        cost_usd REAL NOT NULL
    );
    CREATE INDEX pruned_usage_completed ON pruned_usage (completed_at_ms);
    CREATE INDEX pruned_usage_by_session ON pruned_usage (session_key, completed_at_ms);
    CREATE INDEX kv_unexpired_by_key ON kv (key) WHERE expires_at_ms IS NULL;",
    // 8: when each stage of a run happened (`timing::Stamps` as JSON).
    "ALTER TABLE runs ADD COLUMN stages TEXT;",
];

/// The version a fully migrated file has.
pub(crate) const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// Applies the migrations `conn`'s file has not seen yet.
///
/// Each step re-reads the version inside an immediate transaction, so two processes
/// opening the same new file cannot both apply a migration.
///
/// # Errors
/// A message when a migration fails or the file comes from a newer build.
pub(super) fn migrate(conn: &mut Connection) -> Result<(), String> {
    loop {
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(|e| e.to_string())?;
        let version: i64 =
            tx.query_row("PRAGMA user_version", [], |row| row.get(0)).map_err(|e| e.to_string())?;
        if version > SCHEMA_VERSION {
            return Err(format!(
                "schema version {version} is newer than this build supports ({SCHEMA_VERSION})"
            ));
        }
        if version < 0 {
            return Err(format!("schema version {version} is not a valid version"));
        }
        let Some(sql) = usize::try_from(version).ok().and_then(|v| MIGRATIONS.get(v)) else {
            return Ok(());
        };
        let next = version + 1;
        tx.execute_batch(sql).map_err(|e| format!("migration {next} failed: {e}"))?;
        tx.pragma_update(None, "user_version", next).map_err(|e| e.to_string())?;
        tx.commit().map_err(|e| format!("migration {next} failed to commit: {e}"))?;
        tracing::debug!(version = next, "store schema migrated");
    }
}
