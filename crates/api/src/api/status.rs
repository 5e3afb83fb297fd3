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

use axum::extract::State;
use axum::Json;
use lemon_core::engine::Availability;
use lemon_core::mcp::McpStatusSource;
use lemon_core::store::StoreLocation;
use serde_json::{json, Value};

use super::ApiState;
use crate::error::ApiError;
use crate::openapi::{schema, Errors};

/// How long `/v1/status` waits to learn whether the store saves.
const STORE_CHECK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// The store as `/v1/status` shows it. Rows are `null` when the file cannot
/// be read.
async fn store_json(location: &StoreLocation, state: &ApiState) -> Value {
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
    let rows = state.runs.table_rows().await.ok().map(|rows| {
        rows.into_iter().map(|(table, n)| (table, json!(n))).collect::<serde_json::Map<_, _>>()
    });
    let upkeep = state.upkeep.snapshot();
    // Bounded like the health check: a store another process holds locked
    // must not hold up the status.
    let writable = match tokio::time::timeout(STORE_CHECK_TIMEOUT, state.runs.check_store()).await {
        Ok(checked) => checked.map_err(|err| err.to_string()),
        Err(_) => Err(format!("no answer within {} s", STORE_CHECK_TIMEOUT.as_secs())),
    };
    json!({
        "backend": location.backend(),
        "path": location.describe(),
        "writable": writable.is_ok(),
        "error": writable.err(),
        "bytes": bytes,
        "log_bytes": log_bytes,
        "rows": rows,
        "last_prune": upkeep.last_prune.map(|pass| json!({
            "at_ms": pass.at_ms,
            "took_ms": pass.took_ms,
            "removed": pass.removed,
            "error": pass.error,
        })),
        "pruned_total": upkeep.pruned_total,
        "last_backup": upkeep.last_backup.map(|backup| json!({
            "at_ms": backup.at_ms,
            "path": backup.path.display().to_string(),
        })),
        "backup_error": upkeep.backup_error,
    })
}

/// The configured MCP servers in name order, as `/v1/status` shows them.
fn mcp_servers_json(source: Option<&dyn McpStatusSource>) -> Value {
    let mut servers = source.map(McpStatusSource::servers).unwrap_or_default();
    servers.sort_by(|a, b| a.name.cmp(&b.name));
    Value::Array(
        servers
            .iter()
            .map(|server| {
                json!({
                    "name": server.name,
                    "transport": server.transport,
                    "state": server.state,
                    "tools": server.tools,
                    "error": server.error,
                    "calls": server.calls,
                    "starts": server.starts,
                })
            })
            .collect(),
    )
}

#[utoipa::path(
    get,
    path = "/v1/status",
    tag = "status",
    responses((status = 200, description = "The gateway's state.", body = schema::Status), Errors)
)]
pub(super) async fn status(State(state): State<ApiState>) -> Result<Json<Value>, ApiError> {
    let snapshot = state.runs.snapshot().await?;
    let engines: Vec<Value> = state
        .runs
        .engines_with_versions()
        .await
        .into_iter()
        .map(|engine| {
            let mut body = json!({
                "id": engine.id,
                "available": true,
                "steer": engine.steer,
                "redirect": engine.redirect,
            });
            if let Some(path) = &engine.path {
                body["path"] = json!(path.display().to_string());
            }
            if let Some(version) = &engine.version {
                body["version"] = json!(version);
            }
            if let Availability::Unavailable { reason } = engine.availability {
                body["available"] = json!(false);
                body["reason"] = json!(reason.to_string());
            }
            body
        })
        .collect();
    // An unset `default_engine` is the one the gateway chose.
    let configured = state
        .config
        .get()
        .effective
        .get("default_engine")
        .filter(|value| !value.is_null())
        .cloned();
    let (chosen, reason) = state.default_engine.get();
    Ok(Json(json!({
        "version": &*state.version,
        "uptime_ms": u64::try_from(state.started_at.elapsed().as_millis()).unwrap_or(u64::MAX),
        "paused": snapshot.paused,
        "worker_threads": tokio::runtime::Handle::current().metrics().num_workers(),
        "scheduler": {
            "in_flight": snapshot.in_flight,
            "waitq": snapshot.waitq,
            "max": snapshot.max,
            "conversations": snapshot.conversations,
            "queued": snapshot.queued,
        },
        "engines": engines,
        "default_engine": configured.clone().unwrap_or_else(|| json!(&*chosen)),
        "default_engine_reason": match configured {
            Some(_) => json!("set by default_engine in config.toml"),
            None => json!(&*reason),
        },
        "transports": state.transports.to_json(),
        "mcp_servers": mcp_servers_json(state.mcp.as_deref()),
        "sandbox": state.sandbox,
        "store": match &state.database {
            Some(location) => store_json(location, &state).await,
            None => Value::Null,
        },
        "cluster": match &state.cluster {
            Some(node) => {
                let applied = state.cluster_config.as_ref().map(|c| &c.applied);
                crate::cluster::cluster_json(node, applied, STORE_CHECK_TIMEOUT).await
            }
            None => Value::Null,
        },
        "secrets": state
            .secret_sources
            .iter()
            .map(|(name, origin)| {
                (name.clone(), json!({ "source": origin.source, "overrides": origin.overrides }))
            })
            .collect::<serde_json::Map<String, Value>>(),
    })))
}
