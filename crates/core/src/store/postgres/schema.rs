//! The PostgreSQL schema as an ordered list of migrations, tracked in the
//! one-row table `lemon_schema`.
//!
//! Several gateway nodes may start against one database at once: each applies
//! migrations inside one transaction that first takes a transaction-scoped
//! advisory lock, so exactly one node migrates and the others, once it commits,
//! find the schema current. Shipped entries are never edited or reordered; a
//! new table is a new entry at the end.

use tokio_postgres::Client;

/// The advisory lock key every node's migration takes (`lemon` in ASCII).
const MIGRATION_LOCK: i64 = 0x006c_656d_6f6e;

/// Every migration, oldest first.
const MIGRATIONS: &[&str] = &[
    // 1: what the SQLite schema holds after its seventh migration, in one step.
    //
    // `seq` orders runs accepted in the same millisecond. Events are keyed by
    // run id and index: a run's events may arrive before its row does.
    // JSON is kept as the text the gateway wrote, which is what it reads back.
    "CREATE TABLE runs (
        seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
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
        created_at_ms BIGINT NOT NULL,
        started_at_ms BIGINT,
        completed_at_ms BIGINT,
        duration_ms BIGINT,
        resumed_from_engine TEXT,
        resumed_from_value TEXT,
        input_tokens BIGINT NOT NULL DEFAULT 0,
        output_tokens BIGINT NOT NULL DEFAULT 0,
        cache_read_tokens BIGINT NOT NULL DEFAULT 0,
        cache_write_tokens BIGINT NOT NULL DEFAULT 0,
        cost_usd DOUBLE PRECISION NOT NULL DEFAULT 0,
        compacted TEXT
    );
    CREATE INDEX runs_newest ON runs (created_at_ms, seq);
    CREATE INDEX runs_by_status ON runs (status, created_at_ms, seq);
    CREATE INDEX runs_completed ON runs (completed_at_ms) WHERE completed_at_ms IS NOT NULL;
    CREATE INDEX runs_session_completed ON runs (session_key, completed_at_ms)
        WHERE completed_at_ms IS NOT NULL;
    CREATE INDEX runs_by_session ON runs (session_key, seq);
    CREATE INDEX runs_uncompacted ON runs (completed_at_ms)
        WHERE completed_at_ms IS NOT NULL AND compacted IS NULL;
    CREATE TABLE run_events (
        run_id TEXT NOT NULL,
        idx BIGINT NOT NULL,
        kind TEXT NOT NULL,
        data TEXT NOT NULL,
        PRIMARY KEY (run_id, idx)
    );
    CREATE TABLE chat_state (
        session_key TEXT PRIMARY KEY,
        last_engine TEXT NOT NULL,
        last_resume_token TEXT NOT NULL,
        updated_at_ms BIGINT NOT NULL,
        expires_at_ms BIGINT NOT NULL
    );
    CREATE TABLE health (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        checked_at_ms BIGINT NOT NULL
    );
    CREATE TABLE journal (
        run_id TEXT PRIMARY KEY,
        seq BIGINT NOT NULL,
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
        accepted_at_ms BIGINT NOT NULL
    );
    CREATE INDEX journal_by_seq ON journal (seq);
    CREATE TABLE kv (
        namespace TEXT NOT NULL,
        key TEXT NOT NULL,
        value TEXT NOT NULL,
        expires_at_ms BIGINT,
        PRIMARY KEY (namespace, key)
    );
    CREATE INDEX kv_by_expiry ON kv (expires_at_ms) WHERE expires_at_ms IS NOT NULL;
    CREATE INDEX kv_unexpired_by_key ON kv (key) WHERE expires_at_ms IS NULL;
    CREATE TABLE pruned_usage (
        completed_at_ms BIGINT NOT NULL,
        session_key TEXT NOT NULL,
        engine TEXT NOT NULL,
        input_tokens BIGINT NOT NULL,
        output_tokens BIGINT NOT NULL,
        cache_read_tokens BIGINT NOT NULL,
        cache_write_tokens BIGINT NOT NULL,
        cost_usd DOUBLE PRECISION NOT NULL
    );
    CREATE INDEX pruned_usage_completed ON pruned_usage (completed_at_ms);
    CREATE INDEX pruned_usage_by_session ON pruned_usage (session_key, completed_at_ms);",
    // 2: cluster mode (`crate::cluster`): the nodes, the leases that give each
    // session and each single-consumer channel one owner, the run slots that
    // make the global cap structural, the waiting slot claims that keep grants
    // in admission order, the control requests between nodes and the one
    // cluster-wide config row.
    //
    // Every time is the database's clock. A lease row is never deleted, only
    // released or taken over, so its epoch only ever grows: a fencing check
    // that matches (node, epoch) can never match a later holder. The unique
    // index on (key, epoch) makes `epoch` a key column: a takeover, which
    // changes it, waits for the `FOR KEY SHARE` lock of every write fenced by
    // the old epoch, while a renewal, which does not, never waits. A slot row
    // with `retired` is above the current slot count and is deleted once its
    // run frees it.
    "CREATE TABLE cluster_nodes (
        node_id TEXT PRIMARY KEY,
        started_at TIMESTAMPTZ NOT NULL,
        last_heartbeat TIMESTAMPTZ NOT NULL,
        version TEXT NOT NULL,
        api_base_url TEXT,
        channels TEXT[] NOT NULL
    );
    CREATE TABLE session_leases (
        session_key TEXT PRIMARY KEY,
        node_id TEXT NOT NULL,
        epoch BIGINT NOT NULL CHECK (epoch > 0),
        acquired_at TIMESTAMPTZ NOT NULL,
        expires_at TIMESTAMPTZ NOT NULL,
        released_at TIMESTAMPTZ
    );
    CREATE UNIQUE INDEX session_leases_epoch ON session_leases (session_key, epoch);
    CREATE INDEX session_leases_by_node ON session_leases (node_id);
    CREATE INDEX session_leases_expiring ON session_leases (expires_at)
        WHERE released_at IS NULL;
    CREATE TABLE run_slots (
        slot INTEGER PRIMARY KEY CHECK (slot >= 0),
        retired BOOLEAN NOT NULL DEFAULT false,
        run_id TEXT UNIQUE,
        node_id TEXT,
        session_key TEXT,
        epoch BIGINT,
        admitted_at TIMESTAMPTZ,
        claimed_at TIMESTAMPTZ,
        CHECK (
            (run_id IS NULL) = (node_id IS NULL)
            AND (run_id IS NULL) = (session_key IS NULL)
            AND (run_id IS NULL) = (epoch IS NULL)
            AND (run_id IS NULL) = (admitted_at IS NULL)
            AND (run_id IS NULL) = (claimed_at IS NULL)
        )
    );
    CREATE TABLE slot_requests (
        run_id TEXT PRIMARY KEY,
        seq BIGINT GENERATED ALWAYS AS IDENTITY,
        session_key TEXT NOT NULL,
        node_id TEXT NOT NULL,
        epoch BIGINT NOT NULL,
        admitted_at TIMESTAMPTZ NOT NULL,
        requested_at TIMESTAMPTZ NOT NULL
    );
    CREATE INDEX slot_requests_fifo ON slot_requests (admitted_at, seq);
    CREATE TABLE channel_leases (
        channel TEXT PRIMARY KEY,
        node_id TEXT NOT NULL,
        epoch BIGINT NOT NULL CHECK (epoch > 0),
        acquired_at TIMESTAMPTZ NOT NULL,
        expires_at TIMESTAMPTZ NOT NULL,
        released_at TIMESTAMPTZ
    );
    CREATE UNIQUE INDEX channel_leases_epoch ON channel_leases (channel, epoch);
    CREATE INDEX channel_leases_by_node ON channel_leases (node_id);
    CREATE TABLE cluster_control (
        id BIGSERIAL PRIMARY KEY,
        run_id TEXT NOT NULL,
        target_node TEXT NOT NULL,
        kind TEXT NOT NULL,
        body TEXT NOT NULL,
        created_at TIMESTAMPTZ NOT NULL,
        taken_at TIMESTAMPTZ,
        answered_at TIMESTAMPTZ,
        answer TEXT
    );
    CREATE INDEX cluster_control_pending ON cluster_control (target_node, id)
        WHERE taken_at IS NULL;
    CREATE INDEX cluster_control_created ON cluster_control (created_at);
    CREATE TABLE cluster_config (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        version BIGINT NOT NULL,
        body TEXT NOT NULL,
        updated_at TIMESTAMPTZ NOT NULL,
        updated_by TEXT
    );
    INSERT INTO cluster_config (id, version, body, updated_at) VALUES (1, 0, '', now());",
    // When each stage of a run happened (`timing::Stamps` as JSON).
    "ALTER TABLE runs ADD COLUMN stages TEXT;",
];

/// The version a fully migrated database has.
pub(crate) const SCHEMA_VERSION: i32 = MIGRATIONS.len() as i32;

/// Applies the migrations the database has not seen yet, all in one
/// transaction under the migration lock; returns the version it found.
///
/// # Errors
/// A message when a migration fails or the database comes from a newer build.
pub(super) async fn migrate(client: &mut Client) -> Result<i32, String> {
    let tx = client.transaction().await.map_err(|e| e.to_string())?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .await
        .map_err(|e| format!("could not take the migration lock: {e}"))?;
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS lemon_schema (
            id INTEGER PRIMARY KEY CHECK (id = 1),
            version INTEGER NOT NULL
        );
        INSERT INTO lemon_schema (id, version) VALUES (1, 0) ON CONFLICT (id) DO NOTHING;",
    )
    .await
    .map_err(|e| e.to_string())?;
    let found: i32 = tx
        .query_one("SELECT version FROM lemon_schema WHERE id = 1", &[])
        .await
        .map_err(|e| e.to_string())?
        .get(0);
    if found > SCHEMA_VERSION {
        return Err(format!(
            "schema version {found} is newer than this build supports ({SCHEMA_VERSION})"
        ));
    }
    if found < 0 {
        return Err(format!("schema version {found} is not a valid version"));
    }
    for (at, sql) in MIGRATIONS.iter().enumerate().skip(found as usize) {
        let next = at + 1;
        tx.batch_execute(sql).await.map_err(|e| format!("migration {next} failed: {e}"))?;
        tracing::debug!(version = next, "store schema migrated");
    }
    tx.execute("UPDATE lemon_schema SET version = $1 WHERE id = 1", &[&SCHEMA_VERSION])
        .await
        .map_err(|e| e.to_string())?;
    tx.commit().await.map_err(|e| format!("the migrations failed to commit: {e}"))?;
    Ok(found)
}
