//! `GET /v1/status`: version, uptime, whether intake is `paused`, the async runtime's
//! `worker_threads`, scheduler counters, engines (with `path`
//! and `version` where known) and transports
//! (`{"<id>": {"state", "detail"?, "reason"?, "attempts"?, "retry_in_ms"?}}`),
//! where the config's secrets come from (`{"<name>": {"source", "overrides"}}`),
//! the MCP servers of `[[gateway.mcp_servers]]` (`mcp_servers`: `[{"name",
//! "transport", "state", "tools", "error", "calls", "starts"}]`), how
//! commands are contained (`sandbox`), and the store (`store`, `null` for
//! a store in memory): its `backend` (`sqlite` or `postgres`) and `path` (the
//! file, or `postgres://host:port/database`), whether it saves (`writable`,
//! and the `error` when it does not), its size (`bytes`; the file's, or the
//! tables' in PostgreSQL) and its log's (`log_bytes`, SQLite only), rows per table, the last
//! retention pass and what retention removed since start, the last backup;
//! and the cluster (`cluster`, `null` unless the gateway is a cluster node;
//! see [`crate::cluster`]).

use std::collections::BTreeMap;

use axum::extract::State;
use axum::Json;
use lemon_core::engine::Availability;
use lemon_core::mcp::McpStatusSource;
use lemon_core::store::StoreLocation;
use lemon_core::transport::TransportState;
use serde::Serialize;
use serde_json::Value;

use super::ApiState;
use crate::cluster::ClusterStatus;
use crate::error::ApiError;
use crate::openapi::{schema, Errors};

/// How long `/v1/status` waits to learn whether the store saves.
const STORE_CHECK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// `GET /v1/status`.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub(crate) struct Status {
    /// The cluster, when the gateway is one of its nodes; `null` otherwise.
    #[schema(required = true)]
    pub(crate) cluster: Option<ClusterStatus>,
    /// The engine of requests that name none.
    pub(crate) default_engine: String,
    /// Why that engine (`set by default_engine in config.toml`, `no
    /// openai_api_key set`…).
    pub(crate) default_engine_reason: String,
    /// Every registered engine, whether it can run now or not.
    pub(crate) engines: Vec<EngineStatus>,
    /// The servers of `[[gateway.mcp_servers]]`, in name order.
    pub(crate) mcp_servers: Vec<McpServerStatus>,
    /// Whether intake is paused (`/v1/intake/pause`).
    pub(crate) paused: bool,
    /// How the native engine's `bash` commands are contained.
    #[schema(value_type = schema::SandboxStatus)]
    pub(crate) sandbox: Value,
    pub(crate) scheduler: Scheduler,
    /// Where each secret the config names was found, by name (never a value).
    pub(crate) secrets: BTreeMap<String, SecretSource>,
    /// The store; `null` for a store in memory.
    #[schema(required = true)]
    pub(crate) store: Option<StoreStatus>,
    /// Every transport's state, by transport id.
    pub(crate) transports: BTreeMap<String, TransportStatus>,
    /// How long the gateway has been up.
    pub(crate) uptime_ms: u64,
    /// The gateway's version.
    pub(crate) version: String,
    /// Threads of the async runtime the gateway runs on (`[gateway] worker_threads`).
    pub(crate) worker_threads: usize,
}

/// The scheduler's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub(crate) struct Scheduler {
    /// Conversations with queued or running work.
    pub(crate) conversations: usize,
    /// Runs holding a slot.
    pub(crate) in_flight: usize,
    /// Runs that may hold a slot at once (`max_concurrent_runs`).
    pub(crate) max: usize,
    /// Requests accepted and not yet started.
    pub(crate) queued: usize,
    /// Conversations waiting for a slot.
    pub(crate) waitq: usize,
}

/// An engine in `/v1/status`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub(crate) struct EngineStatus {
    /// Whether it can run now.
    pub(crate) available: bool,
    pub(crate) id: String,
    /// The executable, for a CLI engine found on `PATH`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) path: Option<String>,
    /// Why it is unavailable.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) reason: Option<String>,
    /// Whether a run of it can be sent to another engine mid-way.
    pub(crate) redirect: bool,
    /// Whether it takes text while it runs (`POST /v1/runs/{id}/steer`).
    pub(crate) steer: bool,
    /// The version it reports, when it reports one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) version: Option<String>,
}

impl From<lemon_core::router::EngineInfo> for EngineStatus {
    fn from(engine: lemon_core::router::EngineInfo) -> Self {
        let reason = match engine.availability {
            Availability::Unavailable { reason } => Some(reason.to_string()),
            _ => None,
        };
        EngineStatus {
            available: reason.is_none(),
            id: engine.id,
            path: engine.path.map(|path| path.display().to_string()),
            reason,
            redirect: engine.redirect,
            steer: engine.steer,
            version: engine.version,
        }
    }
}

/// A transport's state in `/v1/status`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub(crate) struct TransportStatus {
    /// Failures in a row (`failing` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) attempts: Option<u32>,
    /// Where it serves (`running` only, when it says).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) detail: Option<String>,
    /// The error that stopped it (`failing` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) reason: Option<String>,
    /// When it is started again (`failing` only; `null`: it is not).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<u64>)]
    pub(crate) retry_in_ms: Option<Option<u64>>,
    /// `disabled`, `starting`, `running`, `failing` or `stopped`.
    pub(crate) state: String,
}

impl From<&TransportState> for TransportStatus {
    fn from(state: &TransportState) -> Self {
        let mut status = TransportStatus {
            attempts: None,
            detail: None,
            reason: None,
            retry_in_ms: None,
            state: state.as_str().to_owned(),
        };
        match state {
            TransportState::Running { detail } => status.detail.clone_from(detail),
            TransportState::Failing { reason, attempts, retry_in_ms } => {
                status.attempts = Some(*attempts);
                status.reason = Some(reason.clone());
                status.retry_in_ms = Some(*retry_in_ms);
            }
            TransportState::Disabled | TransportState::Starting | TransportState::Stopped => {}
        }
        status
    }
}

/// Where a secret the config names was found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub(crate) struct SecretSource {
    /// Later sources that have it too and are not used.
    pub(crate) overrides: Vec<String>,
    /// The source in use (`the environment variable TELEGRAM_BOT_TOKEN`).
    pub(crate) source: String,
}

/// An MCP server of `[[gateway.mcp_servers]]`: the native engine's runs are
/// offered its tools.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub(crate) struct McpServerStatus {
    /// Tool calls finished, by outcome (`ok`, `error`, `timeout`, `cancelled`).
    pub(crate) calls: BTreeMap<String, u64>,
    /// Why the last start or call failed.
    #[schema(required = true)]
    pub(crate) error: Option<String>,
    pub(crate) name: String,
    /// Times the server was started or restarted.
    pub(crate) starts: u64,
    /// `disabled`, `idle` (not started yet: it starts with the first run
    /// that offers it), `starting`, `running` or `failed` (started again
    /// when a run offers it).
    pub(crate) state: String,
    /// The tools offered, as runs see them (`<server>__<tool>`), in name order.
    pub(crate) tools: Vec<String>,
    /// `stdio` (a command) or `http` (Streamable HTTP).
    pub(crate) transport: String,
}

impl From<lemon_core::mcp::McpServerStatus> for McpServerStatus {
    fn from(server: lemon_core::mcp::McpServerStatus) -> Self {
        McpServerStatus {
            calls: server.calls,
            error: server.error,
            name: server.name,
            starts: server.starts,
            state: server.state.to_string(),
            tools: server.tools,
            transport: server.transport.to_string(),
        }
    }
}

/// The store, in `/v1/status`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub(crate) struct StoreStatus {
    /// `sqlite` or `postgres`.
    pub(crate) backend: String,
    /// Why the last scheduled backup failed, until one succeeds.
    #[schema(required = true)]
    pub(crate) backup_error: Option<String>,
    /// The database file's size, or the PostgreSQL tables' with their
    /// indexes; `null` when it cannot be read.
    #[schema(required = true)]
    pub(crate) bytes: Option<u64>,
    /// Why it does not save; `null` while it does.
    #[schema(required = true)]
    pub(crate) error: Option<String>,
    /// The newest scheduled backup known.
    #[schema(required = true)]
    pub(crate) last_backup: Option<BackupMade>,
    /// The last retention pass, once one ran.
    #[schema(required = true)]
    pub(crate) last_prune: Option<PrunePass>,
    /// Its write-ahead log's size; `null` for PostgreSQL.
    #[schema(required = true)]
    pub(crate) log_bytes: Option<u64>,
    /// The SQLite file, or the database as `postgres://host:port/database`
    /// (never the user or password).
    pub(crate) path: String,
    /// What retention removed since start, by kind (`runs`, `events`, `usage`,
    /// `expired_records`, `sessions`, `cron_runs`, `pages`).
    pub(crate) pruned_total: BTreeMap<String, u64>,
    /// Rows per table (`runs`, `run_events`, `pruned_usage`, `journal`, `kv`,
    /// `chat_state`); `null` when the file cannot be read.
    #[schema(required = true)]
    pub(crate) rows: Option<BTreeMap<String, u64>>,
    /// Whether it saves right now (a full disk or a read-only file system: no).
    pub(crate) writable: bool,
}

/// One retention pass.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub(crate) struct PrunePass {
    /// When it ended (ms since the epoch).
    pub(crate) at_ms: i64,
    /// The step that failed, and why; the pass stopped there.
    #[schema(required = true)]
    pub(crate) error: Option<String>,
    /// What it removed, by kind; kinds that removed nothing are left out.
    pub(crate) removed: BTreeMap<String, u64>,
    pub(crate) took_ms: u64,
}

/// A scheduled backup that was made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub(crate) struct BackupMade {
    /// When (ms since the epoch).
    pub(crate) at_ms: i64,
    /// The backup file.
    pub(crate) path: String,
}

/// Counts by kind, with the kinds as owned keys.
fn by_kind(counts: BTreeMap<&'static str, u64>) -> BTreeMap<String, u64> {
    counts.into_iter().map(|(kind, n)| (kind.to_owned(), n)).collect()
}

/// The store as `/v1/status` shows it. Rows are `null` when the file cannot
/// be read.
async fn store_status(location: &StoreLocation, state: &ApiState) -> StoreStatus {
    let (bytes, log_bytes) = match location {
        StoreLocation::File(path) => {
            let sizes = lemon_core::store::sqlite::file_sizes(path);
            (Some(sizes.database), Some(sizes.log))
        }
        StoreLocation::Postgres(_) => {
            let bytes = tokio::time::timeout(STORE_CHECK_TIMEOUT, state.runs.store_bytes()).await;
            (bytes.ok().and_then(Result::ok), None)
        }
    };
    let rows = state.runs.table_rows().await.ok().map(|rows| rows.into_iter().collect());
    let upkeep = state.upkeep.snapshot();
    // Bounded like the health check: a store another process holds locked
    // must not hold up the status.
    let writable = match tokio::time::timeout(STORE_CHECK_TIMEOUT, state.runs.check_store()).await {
        Ok(checked) => checked.map_err(|err| err.to_string()),
        Err(_) => Err(format!("no answer within {} s", STORE_CHECK_TIMEOUT.as_secs())),
    };
    StoreStatus {
        backend: location.backend().to_owned(),
        backup_error: upkeep.backup_error,
        bytes,
        error: writable.as_ref().err().cloned(),
        last_backup: upkeep.last_backup.map(|backup| BackupMade {
            at_ms: backup.at_ms,
            path: backup.path.display().to_string(),
        }),
        last_prune: upkeep.last_prune.map(|pass| PrunePass {
            at_ms: pass.at_ms,
            error: pass.error,
            removed: by_kind(pass.removed),
            took_ms: pass.took_ms,
        }),
        log_bytes,
        path: location.describe(),
        pruned_total: by_kind(upkeep.pruned_total),
        rows,
        writable: writable.is_ok(),
    }
}

/// The configured MCP servers in name order, as `/v1/status` shows them.
fn mcp_servers(source: Option<&dyn McpStatusSource>) -> Vec<McpServerStatus> {
    let mut servers = source.map(McpStatusSource::servers).unwrap_or_default();
    servers.sort_by(|a, b| a.name.cmp(&b.name));
    servers.into_iter().map(McpServerStatus::from).collect()
}

/// `GET /v1/status`: the gateway's state.
#[utoipa::path(
    get,
    path = "/v1/status",
    tag = "status",
    responses((status = 200, description = "The gateway's state.", body = Status), Errors)
)]
pub(super) async fn status(State(state): State<ApiState>) -> Result<Json<Status>, ApiError> {
    let snapshot = state.runs.snapshot().await?;
    let engines = state.runs.engines_with_versions().await;
    // An unset `default_engine` is the one the gateway chose.
    let configured = state
        .config
        .get()
        .effective
        .get("default_engine")
        .and_then(Value::as_str)
        .map(str::to_owned);
    let (chosen, reason) = state.default_engine.get();
    let (default_engine, default_engine_reason) = match configured {
        Some(engine) => (engine, "set by default_engine in config.toml".to_owned()),
        None => (chosen.to_string(), reason.to_string()),
    };
    let store = match &state.database {
        Some(location) => Some(store_status(location, &state).await),
        None => None,
    };
    let cluster = match &state.cluster {
        Some(node) => {
            let applied = state.cluster_config.as_ref().map(|c| &c.applied);
            Some(crate::cluster::cluster_status(node, applied, STORE_CHECK_TIMEOUT).await)
        }
        None => None,
    };
    let transports = state.transports.snapshot();
    Ok(Json(Status {
        cluster,
        default_engine,
        default_engine_reason,
        engines: engines.into_iter().map(EngineStatus::from).collect(),
        mcp_servers: mcp_servers(state.mcp.as_deref()),
        paused: snapshot.paused,
        sandbox: state.sandbox.clone(),
        scheduler: Scheduler {
            conversations: snapshot.conversations,
            in_flight: snapshot.in_flight,
            max: snapshot.max,
            queued: snapshot.queued,
            waitq: snapshot.waitq,
        },
        secrets: state
            .secret_sources
            .iter()
            .map(|(name, origin)| {
                let source = SecretSource {
                    overrides: origin.overrides.clone(),
                    source: origin.source.clone(),
                };
                (name.clone(), source)
            })
            .collect(),
        store,
        transports: transports
            .iter()
            .map(|(id, state)| (id.clone(), TransportStatus::from(state)))
            .collect(),
        uptime_ms: u64::try_from(state.started_at.elapsed().as_millis()).unwrap_or(u64::MAX),
        version: state.version.to_string(),
        worker_threads: tokio::runtime::Handle::current().metrics().num_workers(),
    }))
}
