//! Health and metrics: `GET /healthz` (and its alias `/health`) and `GET /metrics`.
//!
//! Meant for a loopback or internal port, and answered without a token: a
//! load balancer or a supervisor learns whether the gateway is up, nothing
//! more. Without `Authorization: Bearer <API token>` `/healthz` says only
//! `ok`, `status`, each check's name and `ok`, and each transport's `state`;
//! with the token it adds the version, the checks' counters, durations and
//! errors, and the transports' addresses and failure reasons. `/metrics` needs
//! no token (Prometheus scrapers usually have none) and then holds only
//! counters, engine and transport ids and MCP server names: no session keys
//! (they name chats and phone numbers), addresses, versions or error texts
//! (an MCP server's last error is in `/v1/status`). With the token it also
//! names the 20 sessions with the longest queues. Its run families come from
//! a [`RunMetrics`] collector on the event bus, its queue figures from the
//! scheduler's snapshot, so a scrape adds no work to a run.
//!
//! `/healthz` runs every check concurrently, each bounded by a timeout, and
//! answers `200` when all pass and `503` otherwise. Built-in checks, in order: `scheduler`
//! (the scheduler answers), `store` (it accepts writes), `runs` (active runs);
//! an app adds its own with [`HealthState::with_check`].
//!
//! The body also lists every transport's state (`transports`) and sums up in
//! `status`: `healthy`, `degraded` (the checks pass but a transport is failing
//! or an edit of the config file was refused, `config.state = "rejected"`:
//! still `200`, since the gateway serves and restarting it would not free a
//! port or fix a token) or `unhealthy` (a check failed: `503`).

mod timestamp;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use lemon_core::config::{ConfigReport, ConfigStatus};
use lemon_core::router::Runs;
use lemon_core::store::StoreLocation;
use serde_json::{json, Value};
use tokio::time::Instant;

use crate::error::{method_not_allowed, not_found};
use crate::metrics::text::{Exposition, Kind};
use crate::metrics::RunMetrics;
use lemon_core::transport::{TransportState, TransportStatuses};

/// How long one check may take before it counts as failed.
pub const DEFAULT_CHECK_TIMEOUT: Duration = Duration::from_secs(2);

/// One named health check.
#[async_trait]
pub trait HealthCheck: Send + Sync + fmt::Debug + 'static {
    /// The check's name in the report.
    fn name(&self) -> &str;

    /// Detail to report on success (`Value::Null` for none).
    ///
    /// # Errors
    /// Why the check failed, shown in the report.
    async fn check(&self) -> Result<Value, String>;
}

/// What the health router needs. Cheap to clone.
#[derive(Debug, Clone)]
pub struct HealthState {
    /// The router's read-only side: scheduler counters, active runs, the store.
    pub runs: Runs,
    pub version: Arc<str>,
    /// When the gateway started, for uptime.
    pub started_at: Instant,
    /// Checks after the built-in ones, in report order.
    pub extra_checks: Vec<Arc<dyn HealthCheck>>,
    /// The bound on each check.
    pub check_timeout: Duration,
    /// Every transport's state; a failing one makes the gateway `degraded`.
    pub transports: TransportStatuses,
    /// The API token that unlocks the detailed report; `None`: never detailed.
    pub detail_token: Option<crate::api::ApiToken>,
    /// The config in force; a refused edit makes the gateway `degraded`.
    pub config: ConfigStatus,
    /// What runs did, for `/metrics`; `None`: no run families.
    pub run_metrics: Option<RunMetrics>,
    /// Where the store is, for `lemon_store_bytes`; `None`: in memory.
    pub database: Option<lemon_core::store::StoreLocation>,
    /// What retention and backups did, for `lemon_store_pruned_total` and
    /// `lemon_backup_last_success_timestamp_seconds`.
    pub upkeep: lemon_core::store::upkeep::Upkeep,
    /// The MCP servers, for the `lemon_mcp_*` families; `None`: none.
    pub mcp: Option<Arc<dyn lemon_core::mcp::McpStatusSource>>,
    /// This node, in cluster mode: the `cluster` check (failing once the node
    /// is fenced) and the `lemon_cluster_*` families.
    pub cluster: Option<Arc<lemon_core::cluster::ClusterNode>>,
}

impl HealthState {
    /// The built-in checks only, each bounded by [`DEFAULT_CHECK_TIMEOUT`].
    pub fn new(runs: Runs, version: impl Into<Arc<str>>, started_at: Instant) -> Self {
        HealthState {
            runs,
            version: version.into(),
            started_at,
            extra_checks: Vec::new(),
            check_timeout: DEFAULT_CHECK_TIMEOUT,
            transports: TransportStatuses::default(),
            detail_token: None,
            config: ConfigStatus::default(),
            run_metrics: None,
            database: None,
            upkeep: Default::default(),
            mcp: None,
            cluster: None,
        }
    }

    /// Reports this cluster node: `/healthz` is unhealthy once it is fenced,
    /// `/metrics` has the `lemon_cluster_*` families.
    #[must_use]
    pub fn with_cluster(mut self, node: Arc<lemon_core::cluster::ClusterNode>) -> Self {
        self.extra_checks.push(Arc::new(crate::cluster::ClusterCheck { node: node.clone() }));
        self.cluster = Some(node);
        self
    }

    /// Shows the MCP servers' states and tool calls (the native engine's
    /// MCP client) in `/metrics`.
    #[must_use]
    pub fn with_mcp(mut self, mcp: Arc<dyn lemon_core::mcp::McpStatusSource>) -> Self {
        self.mcp = Some(mcp);
        self
    }

    /// Shows what runs did (a collector on the bus) in `/metrics`.
    #[must_use]
    pub fn with_run_metrics(mut self, run_metrics: RunMetrics) -> Self {
        self.run_metrics = Some(run_metrics);
        self
    }

    /// Reports the store at `database` (its size, rows per table) and its
    /// `upkeep` in `/metrics`.
    #[must_use]
    pub fn with_database(
        mut self,
        database: lemon_core::store::StoreLocation,
        upkeep: lemon_core::store::upkeep::Upkeep,
    ) -> Self {
        self.database = Some(database);
        self.upkeep = upkeep;
        self
    }

    /// Reports the config's state (`config`): a refused edit of the file is `degraded`.
    #[must_use]
    pub fn with_config(mut self, config: ConfigStatus) -> Self {
        self.config = config;
        self
    }

    /// Shows the detailed report to requests that carry `token` as their bearer.
    #[must_use]
    pub fn with_detail_token(mut self, token: impl Into<crate::api::ApiToken>) -> Self {
        self.detail_token = Some(token.into());
        self
    }

    /// Reports `transports` (the registry's statuses).
    #[must_use]
    pub fn with_transports(mut self, transports: TransportStatuses) -> Self {
        self.transports = transports;
        self
    }

    /// Adds a check, reported after the ones before it.
    #[must_use]
    pub fn with_check(mut self, check: Arc<dyn HealthCheck>) -> Self {
        self.extra_checks.push(check);
        self
    }

    fn checks(&self) -> Vec<Arc<dyn HealthCheck>> {
        let runs = &self.runs;
        let mut checks: Vec<Arc<dyn HealthCheck>> = vec![
            Arc::new(SchedulerCheck { runs: runs.clone() }),
            Arc::new(StoreCheck { runs: runs.clone() }),
            Arc::new(RunsCheck { runs: runs.clone() }),
        ];
        checks.extend(self.extra_checks.iter().cloned());
        checks
    }
}

/// The health router: `/healthz`, `/health`, `/metrics`.
pub fn health_router(state: HealthState) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/health", get(healthz))
        .route("/metrics", get(metrics))
        .method_not_allowed_fallback(method_not_allowed)
        .fallback(not_found)
        .with_state(state)
}

async fn healthz(State(state): State<HealthState>, headers: HeaderMap) -> Response {
    let detailed = state.detail_token.as_ref().is_some_and(|token| token.matches(&headers));
    let results = futures::future::join_all(
        state.checks().iter().map(|check| run_check(&**check, state.check_timeout)),
    )
    .await;
    let ok = results.iter().all(|result| result["ok"] == json!(true));
    let transports = state.transports.snapshot();
    let config = state.config.get();
    let summary = if !ok {
        "unhealthy"
    } else if transports.values().any(TransportState::is_failing) || config.rejected.is_some() {
        "degraded"
    } else {
        "healthy"
    };
    let body = if detailed {
        json!({
            "ok": ok,
            "status": summary,
            "app": "lemon_gateway",
            "version": &*state.version,
            "timestamp": timestamp::iso8601_now(),
            "checks": results,
            "transports": lemon_core::transport::states_json(&transports),
            "config": config_json(&config, true),
        })
    } else {
        let checks: Vec<Value> = results
            .iter()
            .map(|result| json!({ "name": result["name"], "ok": result["ok"] }))
            .collect();
        let transports: serde_json::Map<String, Value> = transports
            .iter()
            .map(|(id, transport)| (id.clone(), json!({ "state": transport.as_str() })))
            .collect();
        let mut body =
            json!({ "ok": ok, "status": summary, "checks": checks, "transports": transports });
        // A fenced node says why it is going away: a prober may not hold the
        // token, and the reason names nothing private.
        if state.cluster.as_ref().is_some_and(|node| node.is_fenced()) {
            body["reason"] = json!(crate::cluster::FENCED_REASON);
        }
        // Only a refused edit is news to a prober.
        if config.rejected.is_some() {
            body["config"] = config_json(&config, false);
        }
        body
    };
    let status = if ok { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (status, Json(body)).into_response()
}

/// The config's state: `ok`, or `rejected` (with the reason when `detailed`)
/// while the file on disk is refused and the last good config runs.
fn config_json(config: &ConfigReport, detailed: bool) -> Value {
    let mut out = match &config.rejected {
        None => json!({ "state": "ok" }),
        Some(rejection) if detailed => json!({ "state": "rejected", "reason": rejection.error }),
        Some(_) => json!({ "state": "rejected" }),
    };
    if detailed {
        out["generation"] = json!(config.generation);
    }
    out
}

/// Runs one check under `timeout` and reports it.
async fn run_check(check: &dyn HealthCheck, timeout: Duration) -> Value {
    let started = Instant::now();
    let outcome = match tokio::time::timeout(timeout, check.check()).await {
        Ok(outcome) => outcome,
        Err(_) => Err(format!("timed out after {} ms", timeout.as_millis())),
    };
    let duration_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    match outcome {
        Ok(detail) => {
            json!({ "name": check.name(), "ok": true, "duration_ms": duration_ms, "detail": detail })
        }
        Err(error) => {
            tracing::warn!(check = check.name(), %error, "health check failed");
            json!({ "name": check.name(), "ok": false, "duration_ms": duration_ms, "error": error })
        }
    }
}

/// The scheduler answers; detail is its slot counters.
#[derive(Debug)]
struct SchedulerCheck {
    runs: Runs,
}

#[async_trait]
impl HealthCheck for SchedulerCheck {
    fn name(&self) -> &str {
        "scheduler"
    }

    async fn check(&self) -> Result<Value, String> {
        let snapshot = self.runs.snapshot().await.map_err(|err| err.to_string())?;
        Ok(json!({ "in_flight": snapshot.in_flight, "waitq": snapshot.waitq, "max": snapshot.max }))
    }
}

/// The store accepts writes.
#[derive(Debug)]
struct StoreCheck {
    runs: Runs,
}

#[async_trait]
impl HealthCheck for StoreCheck {
    fn name(&self) -> &str {
        "store"
    }

    async fn check(&self) -> Result<Value, String> {
        self.runs.check_store().await.map_err(|err| err.to_string())?;
        Ok(Value::Null)
    }
}

/// The number of queued and running runs.
#[derive(Debug)]
struct RunsCheck {
    runs: Runs,
}

#[async_trait]
impl HealthCheck for RunsCheck {
    fn name(&self) -> &str {
        "runs"
    }

    async fn check(&self) -> Result<Value, String> {
        let active = self.runs.active_runs().await.map_err(|err| err.to_string())?;
        Ok(json!({ "active": active.len() }))
    }
}

/// How many sessions `/metrics` names with their queue length; the others
/// are summed in `lemon_session_queue_rest`.
pub const METRICS_TOP_SESSIONS: usize = 20;

/// `GET /metrics`: Prometheus text format 0.0.4. Scheduler gauges are left
/// out while the scheduler does not answer, and `lemon_up` says so.
async fn metrics(State(state): State<HealthState>, headers: HeaderMap) -> Response {
    let detailed = state.detail_token.as_ref().is_some_and(|token| token.matches(&headers));
    let snapshot = tokio::time::timeout(state.check_timeout, state.runs.snapshot())
        .await
        .ok()
        .and_then(Result::ok);
    let mut out = Exposition::default();
    out.single(
        "lemon_up",
        Kind::Gauge,
        "1 when the scheduler answers, else 0.",
        u8::from(snapshot.is_some()),
    );
    if let Some(database) = &state.database {
        let bytes = match database {
            StoreLocation::File(path) => {
                let sizes = lemon_core::store::sqlite::file_sizes(path);
                Some(sizes.database + sizes.log)
            }
            StoreLocation::Postgres(_) => {
                tokio::time::timeout(state.check_timeout, state.runs.store_bytes())
                    .await
                    .ok()
                    .and_then(Result::ok)
            }
        };
        if let Some(bytes) = bytes {
            out.single(
                "lemon_store_bytes",
                Kind::Gauge,
                "Bytes of the store on disk: the SQLite file and its write-ahead log, or the PostgreSQL tables and their indexes.",
                bytes,
            );
        }
        if let Ok(Ok(rows)) =
            tokio::time::timeout(state.check_timeout, state.runs.table_rows()).await
        {
            out.family("lemon_store_rows", Kind::Gauge, "Rows per table of the store.");
            for (table, n) in rows {
                out.sample("lemon_store_rows", &[("table", &table)], n);
            }
        }
        let upkeep = state.upkeep.snapshot();
        out.family(
            "lemon_store_pruned_total",
            Kind::Counter,
            "What retention removed since start, by kind (runs, events: runs compacted, usage, expired_records, sessions, cron_runs, pages).",
        );
        for (kind, n) in &upkeep.pruned_total {
            out.sample("lemon_store_pruned_total", &[("kind", kind)], n);
        }
        if let Some(backup) = &upkeep.last_backup {
            out.single(
                "lemon_backup_last_success_timestamp_seconds",
                Kind::Gauge,
                "When the newest scheduled backup was made (Unix time).",
                backup.at_ms / 1000,
            );
        }
    }
    if let Some(snapshot) = snapshot {
        out.single("lemon_runs_in_flight", Kind::Gauge, "Runs holding a slot.", snapshot.in_flight);
        out.single(
            "lemon_runs_waiting",
            Kind::Gauge,
            "Conversations waiting for a slot (the wait queue).",
            snapshot.waitq,
        );
        out.single("lemon_runs_max", Kind::Gauge, "Maximum concurrent runs.", snapshot.max);
        out.single(
            "lemon_conversations",
            Kind::Gauge,
            "Conversations with queued or running work.",
            snapshot.conversations,
        );
        out.single(
            "lemon_runs_queued",
            Kind::Gauge,
            "Requests accepted and not yet started.",
            snapshot.queued,
        );
        let active = tokio::time::timeout(state.check_timeout, state.runs.active_runs())
            .await
            .ok()
            .and_then(Result::ok);
        let routed = tokio::time::timeout(state.check_timeout, state.runs.session_queues())
            .await
            .ok()
            .and_then(Result::ok);
        if let (Some(active), Some(routed)) = (active, routed) {
            session_queues(&mut out, &active, &routed, detailed);
        }
    }
    if let Some(run_metrics) = &state.run_metrics {
        run_metrics.render(&mut out);
    }
    transport_metrics(&mut out, &state.transports);
    if let Some(node) = &state.cluster {
        let status = tokio::time::timeout(state.check_timeout, node.status())
            .await
            .ok()
            .and_then(Result::ok);
        crate::cluster::render_metrics(&mut out, node, status.as_ref());
    }
    if let Some(mcp) = &state.mcp {
        crate::metrics::render_mcp(&mut out, &mcp.servers());
    }
    let config = state.config.get();
    out.family(
        "lemon_config_reloads_total",
        Kind::Counter,
        "Edits of the config file (or changed secrets) since the start, by outcome: applied or rejected.",
    );
    out.sample("lemon_config_reloads_total", &[("outcome", "applied")], config.n_applied);
    out.sample("lemon_config_reloads_total", &[("outcome", "rejected")], config.n_rejected);
    out.single(
        "lemon_config_rejected",
        Kind::Gauge,
        "1 while the config file on disk is refused and the last good config runs, else 0.",
        u8::from(config.rejected.is_some()),
    );
    let uptime = state.started_at.elapsed().as_secs_f64();
    out.single(
        "lemon_uptime_seconds",
        Kind::Gauge,
        "Seconds since the gateway started.",
        format_args!("{uptime:.3}"),
    );
    ([(header::CONTENT_TYPE, crate::metrics::text::CONTENT_TYPE)], out.finish()).into_response()
}

/// Queued requests per session, at the router (behind the session's active
/// run) and at the scheduler (waiting for a slot): the [`METRICS_TOP_SESSIONS`]
/// longest queues by name, the rest summed, so a scrape stays small however
/// many sessions wait. Sessions are named only to a scrape with the token
/// (`named`); without it every queue is in the sum.
fn session_queues(
    out: &mut Exposition,
    active: &[lemon_core::gateway::ActiveRun],
    routed: &[(lemon_core::ids::SessionKey, usize)],
    named: bool,
) {
    let mut queued: std::collections::HashMap<&str, u64> = std::collections::HashMap::new();
    for run in active.iter().filter(|run| run.status == lemon_core::bus::RunStatus::Queued) {
        *queued.entry(run.session_key.as_str()).or_default() += 1;
    }
    for (session_key, n) in routed {
        *queued.entry(session_key.as_str()).or_default() += *n as u64;
    }
    let mut longest: Vec<(&str, u64)> = queued.into_iter().collect();
    // Longest first; ties by name, so a scrape names the same sessions each time.
    longest.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    let shown = if named { METRICS_TOP_SESSIONS } else { 0 };
    let rest = longest.split_off(longest.len().min(shown));
    out.family(
        "lemon_session_queue_length",
        Kind::Gauge,
        "Requests queued and not started in one session (at the router or waiting for a slot); only the 20 sessions with the longest queues are named, to a scrape with the API token; the others are summed in lemon_session_queue_rest.",
    );
    for (session, n) in &longest {
        out.sample("lemon_session_queue_length", &[("session", session)], n);
    }
    out.single(
        "lemon_session_queue_rest",
        Kind::Gauge,
        "Runs queued in the sessions lemon_session_queue_length does not name (every session's, without the API token).",
        rest.iter().map(|(_, n)| n).sum::<u64>(),
    );
    out.single(
        "lemon_sessions_queued",
        Kind::Gauge,
        "Sessions with at least one queued run.",
        longest.len() + rest.len(),
    );
}

/// Every transport's state (one gauge per state, 1 for the state it is in),
/// its failures, and its outbox's backlog.
fn transport_metrics(out: &mut Exposition, statuses: &TransportStatuses) {
    let transports = statuses.snapshot();
    let figures = statuses.figures();
    out.family("lemon_transport_running", Kind::Gauge, "1 when the transport serves, else 0.");
    for (id, transport) in &transports {
        let running = u8::from(matches!(transport, TransportState::Running { .. }));
        out.sample("lemon_transport_running", &[("transport", id)], running);
    }
    out.family(
        "lemon_transport_state",
        Kind::Gauge,
        "1 for the state the transport is in (disabled, starting, running, failing, stopped), else 0.",
    );
    for (id, transport) in &transports {
        for state in TRANSPORT_STATES {
            let on = u8::from(transport.as_str() == state);
            out.sample("lemon_transport_state", &[("transport", id), ("state", state)], on);
        }
    }
    out.family(
        "lemon_transport_errors_total",
        Kind::Counter,
        "Times the transport stopped on an error since the gateway started.",
    );
    for id in transports.keys() {
        let n = figures.get(id).map_or(0, |figures| figures.n_failures);
        out.sample("lemon_transport_errors_total", &[("transport", id)], n);
    }
    out.family(
        "lemon_outbox_backlog",
        Kind::Gauge,
        "Messages and edits the transport's outbox holds, queued or in flight.",
    );
    for (id, figures) in &figures {
        if let Some(backlog) = figures.backlog {
            out.sample("lemon_outbox_backlog", &[("transport", id)], backlog);
        }
    }
    out.family(
        "lemon_outbox_calls_total",
        Kind::Counter,
        "Calls of the transport's outbox since it started, by outcome: sent, retried (after a \
         failure worth another attempt), rate_limited (a pause the service asked for, waited \
         out), failed (given up).",
    );
    for (id, figures) in &figures {
        if let Some(calls) = figures.outbox_calls {
            for (outcome, n) in [
                ("sent", calls.n_sent),
                ("retried", calls.n_retried),
                ("rate_limited", calls.n_rate_limited),
                ("failed", calls.n_failed),
            ] {
                out.sample(
                    "lemon_outbox_calls_total",
                    &[("transport", id), ("outcome", outcome)],
                    n,
                );
            }
        }
    }
}

/// Every state a transport can be in, as `lemon_transport_state` labels them.
const TRANSPORT_STATES: [&str; 5] = ["disabled", "starting", "running", "failing", "stopped"];

#[cfg(test)]
mod tests;
