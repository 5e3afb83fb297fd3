//! The control API: runs over HTTP with Server-Sent Events.
//!
//! | method | path | success |
//! | --- | --- | --- |
//! | `POST` | `/v1/runs` (`?wait=true`) | `202` accepted (`200` with the finished run, or a slash command's reply) |
//! | `GET` | `/v1/runs?status=&limit=` | `200 {"runs": [...]}`, newest first |
//! | `GET` | `/v1/runs/{id}` | `200` the run |
//! | `POST` | `/v1/runs/{id}/cancel` | `202 {"run_id", "status"}` |
//! | `POST` | `/v1/runs/{id}/steer` | `200 {"accepted", "reason"?}` |
//! | `GET` | `/v1/runs/{id}/events` | SSE: stored events, then live ones, until `run_completed` |
//! | `GET` | `/v1/events` | SSE: every event of every run |
//! | `GET` | `/v1/sessions/{key}` | `200` active runs, queue, chat state |
//! | `POST` | `/v1/sessions/{key}/cancel` | `202` the session's active runs are cancelled; its queue stays |
//! | `POST` | `/v1/sessions/{key}/abort` | `202` the session's queue is dropped and its runs cancelled |
//! | `GET` | `/v1/cron` | `200 {"jobs": [...]}` |
//! | `POST` | `/v1/cron` | `201` the new job |
//! | `PATCH` | `/v1/cron/{id}` | `200` the changed job |
//! | `DELETE` | `/v1/cron/{id}` | `200 {"removed": true, "id"}` |
//! | `POST` | `/v1/cron/{id}/run` | `202` the cron run just started |
//! | `GET` | `/v1/cron/{id}/runs?limit=` | `200 {"jobId", "runs": [...]}`, newest first |
//! | `GET` | `/v1/sessions/{key}/budget` | `200` the session's limits and what it spent today (UTC) |
//! | `PUT` | `/v1/sessions/{key}/budget` | `200` the same, after setting the session's own limits |
//! | `GET` | `/v1/usage?since=&session=&engine=` | `200` tokens, dollars and runs: total, per engine, per session |
//! | `GET` | `/v1/status` | `200` version, uptime, `paused`, scheduler counters, engines, transports |
//! | `POST` | `/v1/intake/pause`, `/v1/intake/resume` | `200 {"paused"}`: while paused, messages queue and no run starts |
//! | `GET` | `/v1/config` | `200` the config in force, its generation, pending and refused edits |
//! | `GET` | `/v1/config/file` | `200 {"path", "exists", "text"}`: config.toml as written |
//! | `PUT` | `/v1/config` | `200 {"saved", "warnings"}` once checked and written; `422 {"error", "line", "column"}` |
//! | `GET` | `/v1/cluster/config` | `200 {"version", "body", "updated_at_ms", "updated_by", "applied_version"}`: the cluster config (cluster nodes only) |
//! | `PUT` | `/v1/cluster/config` | `200` the same once checked and written with `{"expected_version", "body"}`; `409` stale version; `400`/`422 {"error", "key", "line", "column"}` |
//! | `POST` | `/v1/chat/completions`, `/v1/responses`; `GET` `/v1/models` | OpenAI's shapes (see `openai`) |
//! | `GET` | `/v1/openapi.json` | `200` the OpenAPI 3.1 document of every route this gateway serves |
//!
//! Runs are submitted through the router, so queue modes, resume lines, engine
//! directives and slash commands work here as in every channel. A body may carry
//! `queue_mode`, `resume` (`{"engine", "value"}`), `engine`, `run_id` and
//! `tools` (patterns that narrow the tools the run is offered, within its
//! project's and binding's; `400` for a pattern that is not one);
//! `meta.disable_auto_resume` starts a new session.
//!
//! `POST /v1/runs` may carry `attachments` (base64 or URLs, see
//! [`crate::files`]): they are checked and staged before the run is
//! submitted, and one refused refuses the request.
//!
//! Every route needs `Authorization: Bearer <token>`, checked before the body
//! is read; a body is at most 1 MiB ([`MAX_BODY_BYTES`]: a longer declared
//! `Content-Length` is a `413` before reading), the routes that take files
//! one file of `[gateway.files] max_download_bytes` in base64 and some room
//! ([`crate::files::body_limit`]), and JSON nests at most
//! [`crate::error::MAX_JSON_DEPTH`] levels. Every error is
//! `{"error": "..."}` (see [`ApiError`]). The dashboard's page and assets
//! (`/`, `/ui/…`, see [`crate::dashboard`]) are public; every call the page
//! makes carries the token.

mod approvals;
mod cluster_config;
mod config;
mod cron;
mod events;
mod intake;
pub(crate) mod openai;
// The MCP endpoint's control tools (`run`, `status`, `cancel`, `runs`) take
// the routes' paths through these.
pub(crate) mod runs;
mod sessions;
mod status;
pub(crate) mod transfer;
mod usage;

pub use config::{ConfigEditor, ConfigFileText, ConfigSaveError};

use std::fmt;
use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, HeaderMap};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, patch, post};
use axum::Router;
use lemon_core::budget::store_guard::StoreBudgetGuard;
use lemon_core::config::ConfigStatus;
use lemon_core::cron::CronHandle;
use lemon_core::router::{RouterHandle, Runs};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::error::{method_not_allowed, not_found, ApiError, MAX_BODY_BYTES};
use lemon_core::transport::TransportStatuses;

/// What the control API's handlers share: handles and a few settings. Cheap to clone.
#[derive(Clone)]
pub struct ApiState {
    /// Every submission, cancel and steer goes through the router.
    pub router: RouterHandle,
    /// The router's read-only side: runs, events, sessions, status.
    pub runs: Runs,
    /// The bearer token every request must carry. Never logged; replaced
    /// while the gateway runs when the `lemon_api_token` secret changes.
    pub token: ApiToken,
    /// A second token accepted beside [`ApiState::token`]: the desktop app
    /// makes one at each launch for its own window, and it is never stored.
    /// Never logged.
    pub launch_token: Option<Arc<str>>,
    /// The engine of requests that name none when `default_engine` is unset,
    /// and why the gateway chose it (`no openai_api_key set`); chosen again
    /// while it runs when a secret or the `lemon` engine's section changes.
    pub default_engine: DefaultChoice,
    /// The gateway's version, reported by `/v1/status`.
    pub version: Arc<str>,
    /// When the gateway started, for uptime.
    pub started_at: Instant,
    /// Cancelled when the server shuts down; ends open event streams.
    pub shutdown: CancellationToken,
    /// Every transport's state, reported by `/v1/status`.
    pub transports: TransportStatuses,
    /// The config in force, reported by `/v1/config`.
    pub config: ConfigStatus,
    /// Where each secret the config names was found at start (never its
    /// value), reported by `/v1/status` as `secrets`.
    pub secret_sources: Arc<[(String, lemon_core::secrets::SecretOrigin)]>,
    /// Scheduled prompts, for `/v1/cron`.
    pub cron: CronHandle,
    /// The budgets: sessions' limits and what runs spent.
    pub budget: Arc<StoreBudgetGuard>,
    /// `config.toml` for the dashboard's editor (`GET /v1/config/file`, `PUT
    /// /v1/config`); `None` answers those with 404.
    pub config_file: Option<Arc<dyn ConfigEditor>>,
    /// How the native engine's commands are contained, reported by
    /// `/v1/status` as `sandbox` (`{"mode", "landlock_abi", "enforced", "detail"}`).
    pub sandbox: serde_json::Value,
    /// Tool calls waiting for the owner's answer (`/v1/approvals`).
    pub approvals: lemon_core::approvals::ApprovalHub,
    /// Where the store is (the SQLite file, or a PostgreSQL database), which
    /// `/v1/status` reports as `store`; `None` for a store in memory.
    pub database: Option<lemon_core::store::StoreLocation>,
    /// What retention and backups did last, for `/v1/status`.
    pub upkeep: lemon_core::store::upkeep::Upkeep,
    /// `[gateway.files]` and the stage: files sent with `POST /v1/runs` and
    /// the OpenAI-compatible routes.
    pub files: crate::files::FileIntake,
    /// The MCP servers of `[[gateway.mcp_servers]]` (the native engine's
    /// client), reported by `/v1/status` as `mcp_servers`; `None`: none.
    pub mcp: Option<Arc<dyn lemon_core::mcp::McpStatusSource>>,
    /// This node, when the gateway is one node of a cluster: `/v1/status`
    /// reports the cluster as `cluster` (`null` otherwise), and
    /// `/v1/cluster/config` reads and writes the cluster config.
    pub cluster: Option<Arc<lemon_core::cluster::ClusterNode>>,
    /// What this node did with the cluster config, and how it checks a new
    /// body; `None` off a cluster (or where nothing applies it).
    pub cluster_config: Option<crate::cluster::ClusterConfig>,
}

impl fmt::Debug for ApiState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ApiState")
            .field("router", &self.router)
            .field("runs", &self.runs)
            .field("token", &"<redacted>")
            .field("launch_token", &self.launch_token.as_ref().map(|_| "<redacted>"))
            .field("default_engine", &self.default_engine)
            .field("version", &self.version)
            .field("started_at", &self.started_at)
            .field("shutdown", &self.shutdown)
            .field("transports", &self.transports)
            .field("config", &self.config.get().generation)
            .field("cron", &self.cron)
            .field("config_file", &self.config_file)
            .field("files", &self.files)
            .field("mcp", &self.mcp)
            .field("cluster", &self.cluster.as_ref().map(|node| node.id().clone()))
            .field("cluster_config", &self.cluster_config)
            .finish()
    }
}

/// The engine the gateway chose for requests that name none, and why; one
/// value shared by the API and the reload path, which replaces it.
#[derive(Clone, Debug)]
pub struct DefaultChoice(Arc<std::sync::RwLock<(Arc<str>, Arc<str>)>>);

impl DefaultChoice {
    pub fn new(engine: &str, reason: &str) -> Self {
        DefaultChoice(Arc::new(std::sync::RwLock::new((engine.into(), reason.into()))))
    }

    /// The engine and the reason in force.
    pub fn get(&self) -> (Arc<str>, Arc<str>) {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Puts `engine`, chosen for `reason`, in force.
    pub fn replace(&self, engine: &str, reason: &str) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = (engine.into(), reason.into());
    }
}

/// The API's bearer token, shared by every router that checks it (the
/// control API, its OpenAI routes, the detailed health report) and
/// replaceable while they serve: a request is checked against the token in
/// force when it arrives, so a stream opened before a change goes on. Cheap
/// to clone; clones share the token. `Debug` never shows it.
#[derive(Clone)]
pub struct ApiToken {
    current: Arc<std::sync::RwLock<Arc<str>>>,
    /// The desktop app's per-launch token, accepted beside the current one.
    launch: Option<Arc<str>>,
}

impl ApiToken {
    pub fn new(token: impl Into<Arc<str>>) -> Self {
        ApiToken { current: Arc::new(std::sync::RwLock::new(token.into())), launch: None }
    }

    /// The same token in force (replacements still reach it), also accepting
    /// `launch` when there is one.
    pub fn with_launch(&self, launch: Option<Arc<str>>) -> Self {
        ApiToken { current: Arc::clone(&self.current), launch }
    }

    /// Puts `token` in force for every request from now on; whether it differs
    /// from the one it replaces.
    pub fn replace(&self, token: &str) -> bool {
        let mut current = self.current.write().unwrap_or_else(|e| e.into_inner());
        if &**current == token {
            return false;
        }
        *current = token.into();
        true
    }

    /// Whether `headers` carry `Authorization: Bearer` with the token in force
    /// or the launch token (trimmed, compared in constant time; a blank token
    /// matches nothing).
    pub fn matches(&self, headers: &HeaderMap) -> bool {
        if self.launch.as_deref().is_some_and(|launch| bearer_matches(headers, launch)) {
            return true;
        }
        let current = self.current.read().unwrap_or_else(|e| e.into_inner()).clone();
        bearer_matches(headers, &current)
    }
}

impl fmt::Debug for ApiToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ApiToken(<redacted>)")
    }
}

impl From<&str> for ApiToken {
    fn from(token: &str) -> Self {
        ApiToken::new(token)
    }
}

impl From<String> for ApiToken {
    fn from(token: String) -> Self {
        ApiToken::new(token)
    }
}

impl From<Arc<str>> for ApiToken {
    fn from(token: Arc<str>) -> Self {
        ApiToken::new(token)
    }
}

/// The control API router, every route behind the bearer token.
pub fn router(state: ApiState) -> Router {
    router_with(state, Router::new())
}

/// The OpenAPI description of the routes [`router_with`] serves itself.
#[derive(utoipa::OpenApi)]
#[openapi(paths(
    runs::submit,
    runs::list,
    runs::get,
    runs::cancel,
    runs::steer,
    events::run_events,
    events::firehose,
    sessions::get,
    sessions::cancel,
    sessions::abort,
    sessions::export,
    usage::get_budget,
    usage::put_budget,
    usage::usage,
    status::status,
    intake::pause,
    intake::resume,
    approvals::list,
    approvals::decide,
    config::get,
    config::put,
    config::file,
    cluster_config::get,
    cluster_config::put,
    cron::list,
    cron::create,
    cron::update,
    cron::remove,
    cron::run,
    cron::runs,
))]
pub(crate) struct ApiDoc;

/// The OpenAPI description of the OpenAI-compatible routes.
pub(crate) fn openai_doc() -> utoipa::openapi::OpenApi {
    openai::doc()
}

/// The control API router with the routes of other components (the SMS
/// inbox, calls) merged in, behind the same bearer token, body limit and
/// `{"error": …}` fallbacks. `extra` must not repeat a route of the API.
/// The dashboard (`/`, `/ui/…`) is served beside them without the token.
///
/// `GET /v1/openapi.json` describes the API's own routes; a server that merges
/// routes in describes them too with [`router_documented`].
pub fn router_with(state: ApiState, extra: Router) -> Router {
    router_documented(state, extra, crate::openapi::document())
}

/// [`router_with`], serving `document` (the API's own routes merged with those
/// of `extra`, see [`crate::openapi::merge`]) at `GET /v1/openapi.json`.
pub fn router_documented(
    state: ApiState,
    extra: Router,
    document: utoipa::openapi::OpenApi,
) -> Router {
    // Written once: every request gets the same bytes.
    let document = axum::body::Bytes::from(document.to_json().unwrap_or_else(|err| {
        tracing::error!(error = %err, "the OpenAPI document does not serialise");
        "{}".to_owned()
    }));
    let token = state.token.with_launch(state.launch_token.clone());
    let limits = BodyLimits { token, files: state.files.body_limit() };
    let state_for_openai = state.clone();
    let own = Router::new()
        .route("/v1/runs", post(runs::submit).get(runs::list))
        .route("/v1/runs/{id}", get(runs::get))
        .route("/v1/runs/{id}/cancel", post(runs::cancel))
        .route("/v1/runs/{id}/steer", post(runs::steer))
        .route("/v1/runs/{id}/events", get(events::run_events))
        .route("/v1/events", get(events::firehose))
        .route("/v1/sessions/{key}", get(sessions::get))
        .route("/v1/sessions/{key}/cancel", post(sessions::cancel))
        .route("/v1/sessions/{key}/abort", post(sessions::abort))
        .route("/v1/sessions/{key}/export", get(sessions::export))
        .route("/v1/sessions/{key}/budget", get(usage::get_budget).put(usage::put_budget))
        .route("/v1/usage", get(usage::usage))
        .route("/v1/status", get(status::status))
        .route("/v1/intake/pause", post(intake::pause))
        .route("/v1/intake/resume", post(intake::resume))
        .route("/v1/approvals", get(approvals::list))
        .route("/v1/approvals/{id}", post(approvals::decide))
        .route("/v1/config", get(config::get).put(config::put))
        .route("/v1/config/file", get(config::file))
        .route("/v1/cluster/config", get(cluster_config::get).put(cluster_config::put))
        .route("/v1/cron", get(cron::list).post(cron::create))
        .route("/v1/cron/{id}", patch(cron::update).delete(cron::remove))
        .route("/v1/cron/{id}/run", post(cron::run))
        .route("/v1/cron/{id}/runs", get(cron::runs))
        .with_state(state)
        .route("/v1/openapi.json", get(crate::openapi::served).with_state(document));
    let openai = openai::router(state_for_openai);
    let protected = own
        .merge(extra)
        .method_not_allowed_fallback(method_not_allowed)
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(middleware::from_fn_with_state(limits, require_bearer))
        // Its own token check and fallbacks answer in OpenAI's error shape.
        .merge(openai);
    crate::dashboard::router().merge(protected)
}

/// The token and the body limit of the routes that take files.
#[derive(Clone)]
struct BodyLimits {
    token: ApiToken,
    /// `POST /v1/runs` (see [`crate::files::body_limit`]).
    files: usize,
}

/// Lets the request through only with the right `Authorization: Bearer`
/// header, and then only when its declared length is within its route's
/// limit ([`MAX_BODY_BYTES`], more for `POST /v1/runs`, which takes files):
/// nothing of a body is read before both hold.
async fn require_bearer(State(limits): State<BodyLimits>, req: Request, next: Next) -> Response {
    if !limits.token.matches(req.headers()) {
        return ApiError::Unauthorized.into_response();
    }
    let takes_files = req.method() == axum::http::Method::POST && req.uri().path() == "/v1/runs";
    let limit = if takes_files { limits.files } else { MAX_BODY_BYTES };
    if crate::error::declared_too_large(req.headers(), limit) {
        return ApiError::PayloadTooLarge { limit }.into_response();
    }
    next.run(req).await
}

/// Whether `headers` carry `Authorization: Bearer <expected>`. Both tokens are
/// trimmed the same way and compared once, in constant time; a blank expected
/// token matches nothing.
pub(crate) fn bearer_matches(headers: &HeaderMap, expected: &str) -> bool {
    let expected = expected.trim();
    let presented = headers
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.trim().split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token.trim());
    match presented {
        Some(token) => {
            !expected.is_empty() && constant_time_eq(token.as_bytes(), expected.as_bytes())
        }
        None => false,
    }
}

/// Compares two byte strings in time that depends only on their lengths, so a
/// caller cannot find the token byte by byte from response times.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

#[cfg(test)]
mod openapi_tests;
#[cfg(test)]
mod responses_tests;
#[cfg(test)]
mod tests;
