//! The generic webhook transport: `POST /webhooks/{integration}` turns a JSON
//! body into a run, submitted through the router like any channel message
//! (origin `webhook`).
//!
//! - Auth: a shared token per integration, in `Authorization: Bearer <token>` or
//!   `X-Webhook-Token` (compared in constant time); `?token=` and a body `token`
//!   only where allowed. Tokens are never logged. The header and query tokens
//!   are checked before the body is read; an unknown integration gets the same
//!   `401` as a wrong token. A body is at most `max_body_bytes` (a longer
//!   `Content-Length` is a `413` before reading) and nests at most
//!   [`lemon_api::error::MAX_JSON_DEPTH`] levels.
//! - Body: the text in `prompt` (or `text`, `message`, `input`, `content.text`),
//!   attachments in `attachments`, `files` or `urls` (listed in the prompt under
//!   `Attachments:`; with a `files` section their content is decoded and their
//!   URLs downloaded, and the files saved for the run, see
//!   [`lemon_api::files`]), optional `engine`, `queue_mode`, `metadata`, `session_key`
//!   (only where `allow_session_key` is set, and then kept under
//!   `webhook:<integration>:`), `callback_url` (where overriding is allowed) and
//!   `idempotency_key` (where allowed; the `Idempotency-Key` header always works).
//!   The README lists every accepted shape.
//! - The run's `meta.webhook` holds the integration id, metadata, attachments and
//!   the request (method, path, query with secrets redacted, remote address,
//!   user agent, `X-Request-Id`).
//! - Async (default): `202 {"run_id", "session_key", "status": "accepted"}`; with a
//!   callback URL the run's result is POSTed there once it completes, retried with
//!   exponential backoff. Sync: `200 {"run_id", "ok", "answer", "error", "resume"}`,
//!   or `504` when the run outlives `timeout_ms` (it keeps running).
//! - Idempotency: a key seen within `idempotency_ttl_ms` answers with the first
//!   request's answer and `"duplicate": true` without submitting again. Answers
//!   are kept in the store, so they survive a restart.
//! - Callbacks never reach private or loopback addresses unless allowed: the host
//!   is resolved, every address checked, and the connection pinned to the
//!   checked address (no second lookup, no redirects, no proxy).
//! - Runs that start in an integration's session without coming through it (a
//!   cron job's, a control API run with its session key) are delivered to the
//!   integration's configured callback URL the same way, on the same records;
//!   an integration without one delivers nothing (logged once).
//! - [`WebhookTransport`] runs it all as a [`Transport`](lemon_core::transport::Transport):
//!   it binds its listener when started, so a port in use is reported (and
//!   retried) without stopping the gateway.
//!
//! Every error is `{"error": "..."}`.

mod callback;
mod check;
mod config;
mod idempotency;
pub(crate) mod payload;
mod request_info;
mod service;

pub use check::{check_callback_urls, CallbackUrlProblem};

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fmt;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::connect_info::ConnectInfo;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Extension, Json, Router};
use lemon_core::artifacts::Artifact;
use lemon_core::bus::{completion_json, BusEvent, EventKind, RecvError, Subscription};
use lemon_core::config::QueueMode;
use lemon_core::engine::Field;
use lemon_core::ids::{RunId, SessionKey};
use lemon_core::router::resolve::parse_engine_ref;
use lemon_core::router::{Origin, RequestFlags, RouteError, RouterHandle, RunRequest, Submitted};
use lemon_core::store::StoreHandle;
use lemon_core::transport::StatusHandle;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use callback::{CallbackError, CallbackSettings, Resolve, SystemResolver};
pub use config::{
    IntegrationConfig, Mode, WebhookConfig, WebhookConfigError, DEFAULT_WEBHOOK_PORT,
};
pub use service::WebhookTransport;

use crate::delivery::DeliveryRecords;
use callback::CallbackRecord;
use idempotency::{Claim, IdempotencyKeys};
use payload::{Payload, PayloadError};

use lemon_api::error::{parse_json, read_body, ApiError};
use lemon_api::files::{AttachmentError, FileSource, IncomingFile};
use lemon_core::media::{FilesConfig, MediaRefusal, MediaStage};

/// The transport's id, in status and logs.
pub const WEBHOOK_TRANSPORT_ID: &str = "webhook";

/// Longest idempotency key accepted, in bytes.
const MAX_IDEMPOTENCY_KEY_BYTES: usize = 256;

/// What the webhook router needs.
pub struct WebhookDeps {
    pub config: WebhookConfig,
    /// Integration id → token (see [`WebhookConfig::resolve_tokens`]). Never logged.
    pub tokens: BTreeMap<String, String>,
    /// Every submission goes through the router; its gateway's bus tells when a
    /// run completes.
    pub router: RouterHandle,
    /// Where idempotency answers are kept.
    pub store: StoreHandle,
    /// How callback hosts are resolved; [`SystemResolver`] outside tests.
    pub resolver: Arc<dyn Resolve>,
    /// Callback deliveries run on it.
    pub tracker: TaskTracker,
    /// Stops pending callback deliveries.
    pub shutdown: CancellationToken,
    /// The transport's status entry and the address it shows, kept up to date
    /// with the callbacks given up on; `None` where nothing shows a status.
    pub status: Option<(StatusHandle, String)>,
    /// Where the files payloads carry wait for their run.
    pub media: MediaStage,
}

impl fmt::Debug for WebhookDeps {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WebhookDeps")
            .field("config", &self.config)
            .field("tokens", &"<redacted>")
            .finish_non_exhaustive()
    }
}

/// The handlers' shared state. Cheap to clone.
#[derive(Clone)]
pub struct WebhookState {
    inner: Arc<Inner>,
}

struct Inner {
    config: WebhookConfig,
    tokens: BTreeMap<String, String>,
    router: RouterHandle,
    store: StoreHandle,
    resolver: Arc<dyn Resolve>,
    tracker: TaskTracker,
    /// Integrations already logged as having no callback URL for the runs of
    /// their sessions that others started.
    told_no_callback: Mutex<BTreeSet<String>>,
    /// Runs this webhook submitted that have not been seen starting yet, so
    /// [`WebhookState::deliver_others`] passes over them without reading the
    /// store. Only a shortcut: a run missing here is looked up in the store.
    own_runs: OwnRuns,
    /// Callback deliveries: waited for when the transport stops, so the next
    /// start never picks up a record whose attempt is still under way.
    deliveries: TaskTracker,
    shutdown: CancellationToken,
    keys: IdempotencyKeys,
    /// Callbacks not delivered yet.
    callbacks: DeliveryRecords<CallbackRecord>,
    status: Option<callback::CallbackStatus>,
    media: MediaStage,
}

impl fmt::Debug for WebhookState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WebhookState")
            .field("config", &self.inner.config)
            .field("tokens", &"<redacted>")
            .finish_non_exhaustive()
    }
}

impl WebhookState {
    /// The state of a webhook router over `deps`, with idempotency keys timed by
    /// the wall clock.
    pub fn new(deps: WebhookDeps) -> Self {
        let clock = Arc::new(lemon_core::clock::now_ms);
        let callbacks =
            DeliveryRecords::new(deps.store.clone(), callback::CALLBACK_NS, callback::GIVEN_UP_TTL);
        let store = deps.store.clone();
        let keys = IdempotencyKeys::new(deps.store, deps.config.idempotency_ttl_ms, clock);
        WebhookState {
            inner: Arc::new(Inner {
                config: deps.config,
                tokens: deps.tokens,
                router: deps.router,
                store,
                resolver: deps.resolver,
                tracker: deps.tracker,
                told_no_callback: Mutex::new(BTreeSet::new()),
                own_runs: OwnRuns::default(),
                deliveries: TaskTracker::new(),
                shutdown: deps.shutdown,
                keys,
                status: deps.status.map(|(handle, addr)| callback::CallbackStatus {
                    handle,
                    addr,
                    records: callbacks.clone(),
                }),
                callbacks,
                media: deps.media,
            }),
        }
    }

    /// Picks up the callbacks a stop left undelivered: each follows its run
    /// (one that finished yields its completion at once) and is delivered with
    /// the attempts it has left. Returns how many were picked up.
    pub async fn recover_callbacks(&self) -> usize {
        let inner = &self.inner;
        let recovered = inner.callbacks.recover().await;
        if let Some(status) = &inner.status {
            status.show();
        }
        if recovered.given_up > 0 {
            tracing::warn!(
                given_up = recovered.given_up,
                "webhook callbacks given up on are on record"
            );
        }
        let mut picked_up = 0;
        for (_, record) in recovered.pending {
            let Some(run_id) = RunId::parse(&record.run_id) else { continue };
            let fallback = IntegrationConfig::default();
            let integration = inner.config.integrations.get(&record.integration_id);
            let integration = integration.unwrap_or(&fallback);
            let settings =
                Resolved::new(&inner.config, &record.integration_id, integration).callback;
            let delivery = callback::Delivery {
                record,
                settings,
                resolver: inner.resolver.clone(),
                records: inner.callbacks.clone(),
                status: inner.status.clone(),
            };
            let run = inner.router.follow(&run_id);
            inner.deliveries.spawn(delivery.follow(run, inner.shutdown.clone()));
            picked_up += 1;
        }
        picked_up
    }

    /// Delivers the runs that start in an integration's sessions but did not
    /// come through it (a cron job's, a control API run with its session key)
    /// to the integration's configured callback URL, on record like its own
    /// callbacks (retried, given up on, recovered after a restart). Reads
    /// `events` (the router's firehose, subscribed before the webhook serves)
    /// until the shutdown token is cancelled.
    pub async fn deliver_others(&self, mut events: Subscription) {
        let inner = &self.inner;
        loop {
            let event = tokio::select! {
                biased;
                () = inner.shutdown.cancelled() => return,
                event = events.recv() => event,
            };
            let event = match event {
                Ok(event) => event,
                Err(RecvError::Lagged(missed)) => {
                    tracing::warn!(missed, "webhooks fell behind the gateway's events");
                    continue;
                }
                Err(RecvError::Closed) => return,
            };
            if matches!(event.kind, EventKind::RunStarted { .. }) {
                self.deliver_other(&event).await;
            }
        }
    }

    /// Puts the callback of a run that started in an integration's session on
    /// record and follows it, unless the webhook submitted it itself.
    async fn deliver_other(&self, event: &BusEvent) {
        let inner = &self.inner;
        let Some((id, integration)) = integration_of(&inner.config, &event.session_key) else {
            return;
        };
        // The webhook's own runs are its request's to answer, callback or not.
        if inner.own_runs.take(&event.run_id) {
            return;
        }
        let run_id = event.run_id.as_str();
        // The webhook's own callbacks are on record before their run is submitted.
        match inner.store.kv_get(callback::CALLBACK_NS, run_id, lemon_core::clock::now_ms()).await {
            Ok(None) => {}
            Ok(Some(_)) => return,
            Err(error) => {
                tracing::warn!(run = %run_id, %error, "webhook callback records unreadable");
                return;
            }
        }
        // Its own runs without a callback are its request's to answer.
        if let Ok(Some(run)) = inner.router.query().get(&event.run_id).await {
            if run.meta["origin"] == Origin::Webhook.as_str() {
                return;
            }
        }
        let settings = Resolved::new(&inner.config, id, integration);
        let Some(url) = settings.callback_url else {
            let first = inner
                .told_no_callback
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .insert(id.to_owned());
            if first {
                tracing::info!(
                    integration = %id,
                    "runs in this webhook integration's sessions from elsewhere are not delivered: it has no callback_url"
                );
            }
            return;
        };
        let record = CallbackRecord {
            url: url.to_owned(),
            integration_id: id.to_owned(),
            run_id: run_id.to_owned(),
            session_key: event.session_key.clone(),
            metadata: json!({}),
            attachments: json!([]),
            attempts: 0,
            failed: None,
        };
        inner.callbacks.record(run_id, &record).await;
        let delivery = callback::Delivery {
            record,
            settings: settings.callback,
            resolver: inner.resolver.clone(),
            records: inner.callbacks.clone(),
            status: inner.status.clone(),
        };
        let run = inner.router.follow(&event.run_id);
        inner.deliveries.spawn(delivery.follow(run, inner.shutdown.clone()));
    }

    /// Waits for the callback deliveries under way once the shutdown token is
    /// cancelled: each stops waiting at once, and an attempt already made ends
    /// within its timeout. A transport calls it before its run ends.
    pub async fn finish_deliveries(&self) {
        self.inner.deliveries.close();
        self.inner.deliveries.wait().await;
    }
}

/// Most runs [`OwnRuns`] remembers; past it, it starts over (runs that never
/// started, merged or cancelled while queued, would otherwise stay).
const MAX_OWN_RUNS: usize = 4096;

/// The ids of runs the webhook submitted itself, until their `run_started`.
#[derive(Debug, Default)]
struct OwnRuns(Mutex<HashSet<RunId>>);

impl OwnRuns {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashSet<RunId>> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn insert(&self, run_id: &RunId) {
        let mut runs = self.lock();
        if runs.len() >= MAX_OWN_RUNS {
            runs.clear();
        }
        runs.insert(run_id.clone());
    }

    /// Whether `run_id` was one of them; it is forgotten either way.
    fn take(&self, run_id: &RunId) -> bool {
        self.lock().remove(run_id)
    }
}

/// The webhook router: `POST /webhooks/{integration}`; everything else is a 404.
/// Served with `ConnectInfo<SocketAddr>`, runs record the caller's address.
pub fn router(state: WebhookState) -> Router {
    Router::new()
        .route("/webhooks/{integration}", post(receive))
        .method_not_allowed_fallback(lemon_api::error::method_not_allowed)
        .fallback(lemon_api::error::not_found)
        .with_state(state)
}

fn error(status: StatusCode, message: &str) -> Response {
    (status, Json(json!({ "error": message }))).into_response()
}

/// Settings of one integration after falling back to the section's.
struct Resolved<'a> {
    id: &'a str,
    integration: &'a IntegrationConfig,
    mode: Mode,
    timeout: Duration,
    allow_query_token: bool,
    allow_payload_token: bool,
    allow_callback_override: bool,
    allow_payload_idempotency_key: bool,
    /// Whether its runs are marked untrusted.
    untrusted: bool,
    /// Integration's, else the section's.
    callback_url: Option<&'a str>,
    callback: CallbackSettings,
    /// `files` of the integration, else the section's: `None` takes no files.
    files: Option<&'a FilesConfig>,
}

impl<'a> Resolved<'a> {
    fn new(config: &'a WebhookConfig, id: &'a str, integration: &'a IntegrationConfig) -> Self {
        let flag = |own: Option<bool>, global: bool| own.unwrap_or(global);
        let timeout = Duration::from_millis(integration.timeout_ms.unwrap_or(config.timeout_ms));
        let blank_is_none =
            |url: &'a Option<String>| url.as_deref().filter(|u| !u.trim().is_empty());
        let backoff_ms = integration.callback_backoff_ms.unwrap_or(config.callback_backoff_ms);
        Resolved {
            id,
            integration,
            mode: integration.mode.unwrap_or(config.mode),
            timeout,
            allow_query_token: flag(integration.allow_query_token, config.allow_query_token),
            allow_payload_token: flag(integration.allow_payload_token, config.allow_payload_token),
            allow_callback_override: flag(
                integration.allow_callback_override,
                config.allow_callback_override,
            ),
            allow_payload_idempotency_key: flag(
                integration.allow_payload_idempotency_key,
                config.allow_payload_idempotency_key,
            ),
            untrusted: flag(integration.untrusted, config.untrusted),
            callback_url: blank_is_none(&integration.callback_url)
                .or_else(|| blank_is_none(&config.callback_url)),
            files: integration.files.as_ref().or(config.files.as_ref()),
            callback: CallbackSettings {
                max_attempts: integration
                    .callback_max_attempts
                    .unwrap_or(config.callback_max_attempts)
                    .max(1),
                backoff: Duration::from_millis(backoff_ms),
                backoff_max: Duration::from_millis(
                    integration
                        .callback_backoff_max_ms
                        .unwrap_or(config.callback_backoff_max_ms)
                        .max(backoff_ms),
                ),
                wait: integration
                    .callback_wait_timeout_ms
                    .or(config.callback_wait_timeout_ms)
                    .map(Duration::from_millis),
                timeout,
                allow_private_hosts: flag(
                    integration.allow_private_callback_hosts,
                    config.allow_private_callback_hosts,
                ),
            },
        }
    }
}

/// The integration a session belongs to: the one whose configured
/// `session_key` it is, else the one it is `webhook:<id>` or under
/// `webhook:<id>:` of (the longest such id).
fn integration_of<'c>(
    config: &'c WebhookConfig,
    key: &SessionKey,
) -> Option<(&'c str, &'c IntegrationConfig)> {
    let key = key.as_str();
    let configured = config.integrations.iter().find(|(_, integration)| {
        integration.session_key.as_deref().is_some_and(|own| !own.trim().is_empty() && own == key)
    });
    if let Some((id, integration)) = configured {
        return Some((id.as_str(), integration));
    }
    let rest = key.strip_prefix("webhook:")?;
    config
        .integrations
        .iter()
        .filter(|(id, _)| {
            rest.strip_prefix(id.as_str())
                .is_some_and(|tail| tail.is_empty() || tail.starts_with(':'))
        })
        .max_by_key(|(id, _)| id.len())
        .map(|(id, integration)| (id.as_str(), integration))
}

/// Longest session name a payload may choose.
const MAX_PAYLOAD_SESSION_BYTES: usize = 200;

/// The session a payload chose, kept under `webhook:<id>:` so that a webhook can
/// never reach another channel's conversation (a Telegram chat's, say) and resume
/// its vendor session. Only integrations with `allow_session_key` accept one.
fn payload_session_key(
    id: &str,
    integration: &IntegrationConfig,
    chosen: &str,
) -> Result<SessionKey, String> {
    if !integration.allow_session_key {
        return Err(
            "session_key may not be set by this integration (allow_session_key is off)".to_owned()
        );
    }
    let prefix = format!("webhook:{id}:");
    let name = chosen.strip_prefix(&prefix).unwrap_or(chosen);
    let valid = !name.is_empty()
        && name.len() <= MAX_PAYLOAD_SESSION_BYTES
        && name.bytes().all(|b| b.is_ascii_graphic());
    if !valid {
        return Err(format!(
            "invalid session_key: use 1 to {MAX_PAYLOAD_SESSION_BYTES} printable characters without spaces"
        ));
    }
    Ok(format!("{prefix}{name}").into())
}

/// The first non-blank string among `keys` of a JSON object.
pub(super) fn first_string<'v>(body: &'v Value, keys: &[&str]) -> Option<&'v str> {
    keys.iter().filter_map(|key| body.get(*key)?.as_str()).map(str::trim).find(|s| !s.is_empty())
}

/// The first non-blank string at `outer.inner` of a JSON object (nested).
pub(super) fn nested_string<'v>(body: &'v Value, outer: &str, inner: &str) -> Option<&'v str> {
    body.get(outer)?.get(inner)?.as_str().map(str::trim).filter(|s| !s.is_empty())
}

/// A header's value, trimmed; absent when blank or not text.
pub(super) fn header_str<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    headers.get(name)?.to_str().ok().map(str::trim).filter(|s| !s.is_empty())
}

/// Every token the request presents, in order of precedence.
fn presented_tokens<'r>(
    headers: &'r HeaderMap,
    query: &'r [(String, String)],
    body: Option<&'r Value>,
    settings: &Resolved<'_>,
) -> Vec<&'r str> {
    let mut tokens = Vec::new();
    if let Some(value) = header_str(headers, "authorization") {
        let token = match value.split_once(' ') {
            Some((scheme, rest)) if scheme.eq_ignore_ascii_case("bearer") => rest.trim(),
            _ => value,
        };
        tokens.push(token);
    }
    tokens.extend(header_str(headers, "x-webhook-token"));
    if settings.allow_query_token {
        tokens.extend(
            query
                .iter()
                .filter(|(k, _)| k == "token" || k == "webhook_token")
                .map(|(_, v)| v.trim()),
        );
    }
    if settings.allow_payload_token {
        tokens.extend(body.and_then(|b| first_string(b, &["token", "webhook_token"])));
    }
    tokens.retain(|t| !t.is_empty());
    tokens
}

/// Compares in time that depends only on the lengths.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

/// What the handler knows about the HTTP request besides its body.
struct RequestParts<'r> {
    method: &'r Method,
    uri: &'r Uri,
    raw_query: Option<&'r str>,
    remote: Option<SocketAddr>,
    headers: &'r HeaderMap,
}

/// `POST /webhooks/{integration}`.
#[allow(clippy::too_many_arguments)] // One argument per extractor: that is how axum handlers read a request.
async fn receive(
    State(state): State<WebhookState>,
    Path(integration_id): Path<String>,
    method: Method,
    uri: Uri,
    RawQuery(raw_query): RawQuery,
    connect_info: Option<Extension<ConnectInfo<SocketAddr>>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let inner = &state.inner;
    // An unknown integration is answered as a wrong token is, before anything
    // else, so integration names cannot be listed by probing.
    let (Some(integration), Some(expected)) =
        (inner.config.integrations.get(&integration_id), inner.tokens.get(&integration_id))
    else {
        return error(StatusCode::UNAUTHORIZED, "unauthorized");
    };
    let settings = Resolved::new(&inner.config, &integration_id, integration);
    let query: Vec<(String, String)> = raw_query
        .as_deref()
        .map(|q| {
            q.split('&')
                .filter_map(|pair| {
                    let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
                    Some((percent_decode(k)?, percent_decode(v)?))
                })
                .collect()
        })
        .unwrap_or_default();
    let authorized = |presented: Vec<&str>| {
        presented.iter().any(|t| constant_time_eq(t.as_bytes(), expected.as_bytes()))
    };
    // The header (or query) token is checked before the body is read; only
    // an integration that takes its token in the body reads one without it,
    // and then no more than `max_body_bytes`.
    let by_header = authorized(presented_tokens(&headers, &query, None, &settings));
    if !by_header && !settings.allow_payload_token {
        return error(StatusCode::UNAUTHORIZED, "unauthorized");
    }
    // With files, a body may hold one of the largest in base64.
    let limit = settings.files.map_or(inner.config.max_body_bytes, |files| {
        lemon_api::files::body_limit(files, inner.config.max_body_bytes)
    });
    let bytes = match read_body(&headers, body, limit).await {
        Ok(bytes) => bytes,
        Err(refused) => return refused.into_response(),
    };
    let parsed = parse_json::<Value>(&bytes);
    drop(bytes);
    if !by_header
        && !authorized(presented_tokens(&headers, &query, parsed.as_ref().ok(), &settings))
    {
        return error(StatusCode::UNAUTHORIZED, "unauthorized");
    }
    let body = match parsed {
        Ok(body @ Value::Object(_)) => body,
        Ok(_) => return error(StatusCode::BAD_REQUEST, "the body must be a JSON object"),
        Err(err) => return error(StatusCode::BAD_REQUEST, &err.to_string()),
    };
    let parts = RequestParts {
        method: &method,
        uri: &uri,
        raw_query: raw_query.as_deref(),
        remote: connect_info.map(|Extension(ConnectInfo(addr))| addr),
        headers: &headers,
    };
    let mut request = match Prepared::new(&settings, &parts, &body) {
        Ok(request) => request,
        Err(Refusal::BadRequest(message)) => return error(StatusCode::BAD_REQUEST, &message),
        Err(Refusal::MissingPrompt(detail)) => {
            let body = json!({ "error": "invalid request payload", "detail": detail });
            return (StatusCode::UNPROCESSABLE_ENTITY, Json(body)).into_response();
        }
        Err(Refusal::File(err)) => return ApiError::from(err).into_response(),
    };
    if let Some(url) = &request.callback_url {
        match callback::check(url, inner.resolver.as_ref(), settings.callback.allow_private_hosts)
            .await
        {
            // Delivered to the canonical form (lowercase host, no trailing dot).
            Ok(target) => request.callback_url = Some(target.url().to_string()),
            Err(err) => {
                return error(StatusCode::BAD_REQUEST, &format!("invalid callback url: {err}"))
            }
        }
    }
    let claim = match &request.idempotency_key {
        None => None,
        Some(key) => match inner.keys.claim(&integration_id, key).await {
            Ok(Claim::New(guard)) => Some(guard),
            Ok(Claim::Duplicate { status, mut body }) => {
                body["duplicate"] = json!(true);
                return (status, Json(body)).into_response();
            }
            Ok(Claim::InProgress) => {
                return error(
                    StatusCode::CONFLICT,
                    "a request with this idempotency key is being processed",
                )
            }
            Err(err) => return ApiError::from(err).into_response(),
        },
    };
    // The key is released when `claim` drops without being recorded. The rest
    // runs on its own task: a client that hangs up while its request is being
    // submitted does not stop the answer from being recorded for its key, so a
    // retry with that key replays it instead of running again.
    let task_state = state.clone();
    let settings = SubmitSettings::of(&settings);
    let handle =
        inner.tracker.spawn(async move { submit(&task_state, &settings, request, claim).await });
    handle.await.unwrap_or_else(|err| {
        tracing::error!(%err, "webhook request task failed");
        ApiError::Internal("the request could not be completed".into()).into_response()
    })
}

/// Why a request was not prepared.
#[derive(Debug)]
enum Refusal {
    /// `400` with the message.
    BadRequest(String),
    /// No prompt: `422 {"error": "invalid request payload", "detail"}`, as the
    /// reference answers.
    MissingPrompt(String),
    /// A file the integration does not take (it has no `files` section).
    File(AttachmentError),
}

impl From<String> for Refusal {
    fn from(message: String) -> Self {
        Refusal::BadRequest(message)
    }
}

/// A validated request, ready to submit.
struct Prepared {
    req: RunRequest,
    callback_url: Option<String>,
    idempotency_key: Option<String>,
    metadata: Value,
    attachments: Value,
    /// The files to save for the run (see [`incoming_files`]).
    files: Vec<IncomingFile>,
}

impl Prepared {
    fn new(
        settings: &Resolved<'_>,
        parts: &RequestParts<'_>,
        body: &Value,
    ) -> Result<Self, Refusal> {
        let integration = settings.integration;
        let payload = Payload::from_body(body).map_err(|err| match err {
            PayloadError::MissingPrompt => Refusal::MissingPrompt(err.to_string()),
            PayloadError::Invalid(message) => Refusal::BadRequest(message),
        })?;
        let session_key = match first_string(body, &["session_key"]) {
            Some(chosen) => payload_session_key(settings.id, integration, chosen)?,
            None => integration
                .session_key
                .clone()
                .filter(|s| !s.trim().is_empty())
                .map_or_else(|| format!("webhook:{}", settings.id).into(), SessionKey::from),
        };
        let queue_mode = match first_string(body, &["queue_mode"]) {
            Some(raw) => Some(raw.parse::<QueueMode>().map_err(|err| err.to_string())?),
            None => integration.queue_mode,
        };
        let engine = match first_string(body, &["engine"]) {
            Some(raw) => Some(
                parse_engine_ref(raw.trim(), Field::Engine)
                    .map_err(|refusal| RouteError::from(refusal).to_string())?,
            ),
            None => integration.engine.clone(),
        };
        let payload_callback = first_string(body, &["callback_url", "callbackUrl"])
            .or_else(|| nested_string(body, "callback", "url"));
        let callback_url = match payload_callback {
            Some(url) if settings.allow_callback_override => Some(url.to_owned()),
            Some(_) => {
                return Err(Refusal::BadRequest(
                    "callback_url may not be set by this integration".to_owned(),
                ))
            }
            None => settings.callback_url.map(str::to_owned),
        };
        let payload_key = || {
            first_string(body, &["idempotency_key", "idempotencyKey"])
                .or_else(|| nested_string(body, "idempotency", "key"))
        };
        let idempotency_key = header_str(parts.headers, "idempotency-key")
            .or_else(|| settings.allow_payload_idempotency_key.then(payload_key).flatten())
            .map(str::to_owned);
        if idempotency_key.as_ref().is_some_and(|key| key.len() > MAX_IDEMPOTENCY_KEY_BYTES) {
            return Err(Refusal::BadRequest(format!(
                "the idempotency key is longer than {MAX_IDEMPOTENCY_KEY_BYTES} bytes"
            )));
        }
        let attachments = payload.attachments_json();
        let files = incoming_files(&payload.attachments, settings.files)?;
        let request = request_info::request_json(
            parts.method,
            parts.uri.path(),
            parts.raw_query,
            parts.remote,
            parts.headers,
        );
        let mut meta = BTreeMap::new();
        meta.insert(
            "webhook".to_owned(),
            json!({
                "integration_id": settings.id,
                "metadata": payload.metadata,
                "attachments": attachments,
                "request": request,
            }),
        );
        if settings.untrusted {
            lemon_core::untrusted::mark(&mut meta, &format!("webhook {}", settings.id));
        }
        let run_id = RunId::generate();
        let req = RunRequest {
            origin: Origin::Webhook,
            session_key,
            agent_id: integration.agent_id.clone(),
            prompt: payload.prompt,
            queue_mode,
            engine,
            resume: None,
            cwd: integration.cwd.clone(),
            model: None,
            flags: RequestFlags { fresh_run_id: true, ..RequestFlags::default() },
            meta,
            run_id: Some(run_id),
            channel: None,
        };
        Ok(Prepared {
            req,
            callback_url,
            idempotency_key,
            metadata: payload.metadata,
            attachments,
            files,
        })
    }
}

/// The files a payload carries for its run: every attachment with content
/// (base64 or a `data:` URL) and, where the integration takes files, every
/// one with a URL (downloaded). Labelled by the body field they came from:
/// `attachments[0]`, `urls[1]`.
///
/// # Errors
/// Content sent to an integration that takes no files (`403`).
fn incoming_files(
    attachments: &[payload::Attachment],
    files: Option<&FilesConfig>,
) -> Result<Vec<IncomingFile>, Refusal> {
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    let mut incoming = Vec::new();
    for attachment in attachments {
        let count = counts.entry(attachment.source).or_default();
        let label = format!("{}[{count}]", attachment.source);
        *count += 1;
        let source = match (&attachment.data, &attachment.url) {
            (Some(data), _) if lemon_api::files::parse_data_url(data).is_some() => {
                FileSource::Url(data.clone())
            }
            (Some(data), _) => FileSource::Base64(data.clone()),
            (None, Some(url)) if files.is_some() => FileSource::Url(url.clone()),
            _ => continue,
        };
        if files.is_none() {
            let label = match &attachment.name {
                Some(name) => {
                    format!("{label} ({})", lemon_core::log_text::escape_within(name, 120))
                }
                None => label,
            };
            let refusal = lemon_api::files::Refusal::Media(MediaRefusal::Disabled);
            return Err(Refusal::File(AttachmentError { label, refusal }));
        }
        incoming.push(IncomingFile {
            label,
            name: attachment.name.clone(),
            mime: attachment.content_type.clone(),
            source,
        });
    }
    Ok(incoming)
}

/// What submitting a prepared request still needs of its integration's settings.
struct SubmitSettings {
    id: String,
    mode: Mode,
    timeout: Duration,
    callback: CallbackSettings,
    /// The integration's `files` (none when it takes no files).
    files: FilesConfig,
}

impl SubmitSettings {
    fn of(settings: &Resolved<'_>) -> Self {
        SubmitSettings {
            id: settings.id.to_owned(),
            mode: settings.mode,
            timeout: settings.timeout,
            callback: settings.callback.clone(),
            files: settings.files.cloned().unwrap_or_default(),
        }
    }
}

async fn submit(
    state: &WebhookState,
    settings: &SubmitSettings,
    request: Prepared,
    claim: Option<idempotency::Guard>,
) -> Response {
    let inner = &state.inner;
    let Prepared { mut req, callback_url, metadata, attachments, files, .. } = request;
    // Saved before anything is on record; a refusal releases the key. They
    // go again unless the run takes them.
    let staged = match lemon_api::files::receive(&inner.media, &settings.files, files).await {
        Ok(staged) => staged,
        Err(err) => return ApiError::from(err).into_response(),
    };
    lemon_core::media::add_attachments(&mut req.meta, staged.attachments());
    let session_key = req.session_key.clone();
    let own_run_id = req.run_id.clone();
    // On record before the run exists, so a restart finds it.
    let delivery = match (callback_url, &req.run_id) {
        (Some(url), Some(run_id)) => {
            let record = CallbackRecord {
                url,
                integration_id: settings.id.clone(),
                run_id: run_id.as_str().to_owned(),
                session_key: session_key.clone(),
                metadata,
                attachments,
                attempts: 0,
                failed: None,
            };
            inner.callbacks.record(&record.run_id, &record).await;
            Some(callback::Delivery {
                record,
                settings: settings.callback.clone(),
                resolver: inner.resolver.clone(),
                records: inner.callbacks.clone(),
                status: inner.status.clone(),
            })
        }
        _ => None,
    };
    // Noted before submitting: the run may start before `submit` returns.
    if let Some(run_id) = &own_run_id {
        inner.own_runs.insert(run_id);
    }
    let submitted = inner.router.submit(req).await;
    let started_own = matches!(&submitted, Ok(Submitted::Run(accepted, _)) if !accepted.duplicate);
    if started_own {
        staged.hand_over();
    }
    if !started_own {
        if let Some(run_id) = &own_run_id {
            inner.own_runs.take(run_id);
        }
    }
    if !matches!(submitted, Ok(Submitted::Run(..))) {
        if let Some(delivery) = &delivery {
            inner.callbacks.finish(&delivery.record.run_id).await;
        }
    }
    let (accepted, mut follower) = match submitted {
        Ok(Submitted::Run(accepted, follower)) => (accepted, follower),
        Ok(Submitted::Command { reply, .. }) => {
            let body = json!({ "reply": reply });
            if let Some(claim) = claim {
                claim.complete(StatusCode::OK, body.clone()).await;
            }
            return (StatusCode::OK, Json(body)).into_response();
        }
        Err(err) => return ApiError::from(err).into_response(),
    };
    let run_id = accepted.run_id;
    let accepted_body = json!({
        "run_id": run_id.as_str(),
        "session_key": accepted.session_key.as_str(),
        "status": "accepted",
    });
    let claim = match claim {
        Some(claim) => Some(claim.submitted(StatusCode::ACCEPTED, accepted_body.clone()).await),
        None => None,
    };
    match settings.mode {
        Mode::Async => {
            if let Some(delivery) = delivery {
                inner.deliveries.spawn(delivery.follow(follower, inner.shutdown.clone()));
            }
            (StatusCode::ACCEPTED, Json(accepted_body)).into_response()
        }
        Mode::Sync => {
            let completed = tokio::time::timeout(settings.timeout, follower.completion()).await;
            let event = match completed {
                Ok(Some(event)) => event,
                Ok(None) => {
                    return error(StatusCode::SERVICE_UNAVAILABLE, "the gateway is shutting down")
                }
                Err(_) => {
                    // The run goes on; its callback comes once it completes.
                    if let Some(delivery) = delivery {
                        inner.deliveries.spawn(delivery.follow(follower, inner.shutdown.clone()));
                    }
                    let body = json!({ "error": "run timed out", "run_id": run_id.as_str() });
                    return (StatusCode::GATEWAY_TIMEOUT, Json(body)).into_response();
                }
            };
            let mut body = completed_json(&event).await;
            body["run_id"] = json!(run_id.as_str());
            body["session_key"] = json!(session_key.as_str());
            if let Some(claim) = claim {
                claim.complete(StatusCode::OK, body.clone()).await;
            }
            if let Some(mut delivery) = delivery {
                let shutdown = inner.shutdown.clone();
                inner.deliveries.spawn(async move {
                    delivery.deliver(&event, &shutdown).await;
                });
            }
            (StatusCode::OK, Json(body)).into_response()
        }
    }
}

/// `{"ok", "answer", "error", "resume", "duration_ms", "attachments", …}` of a
/// `run_completed`: the answer's files as `attachments` with their content.
async fn completed_json(event: &BusEvent) -> Value {
    match &event.kind {
        EventKind::RunCompleted { completion, engine, duration_ms } => {
            let mut body = completion_json(completion);
            if let Value::Object(map) = &mut body {
                map.remove("artifacts");
            }
            body["engine"] = json!(engine);
            body["duration_ms"] = json!(duration_ms);
            body["attachments"] = attachments_json(&completion.artifacts).await;
            body
        }
        _ => Value::Null,
    }
}

/// Most bytes of file content one answer carries; files past it are listed
/// with `content_base64: null` and `omitted: "too_large"`.
pub(crate) const MAX_ATTACHMENT_BYTES: u64 = 10 * 1024 * 1024;

/// The answer's files: `[{filename, caption, size, mime, content_base64}]`, read
/// now. A file that cannot be read any more is listed with `omitted: "unreadable"`.
async fn attachments_json(artifacts: &[Artifact]) -> Value {
    use base64::Engine as _;
    let mut budget = MAX_ATTACHMENT_BYTES;
    let mut entries = Vec::with_capacity(artifacts.len());
    for artifact in artifacts {
        let mut entry = json!({
            "filename": artifact.filename,
            "caption": artifact.caption,
            "size": artifact.size,
            "mime": artifact.mime(),
            "content_base64": null,
        });
        if artifact.size > budget {
            entry["omitted"] = json!("too_large");
        } else {
            // Read without following a link swapped in since the run's end.
            match artifact.read().await {
                Ok(content) if content.len() as u64 <= budget => {
                    budget -= content.len() as u64;
                    entry["size"] = json!(content.len());
                    entry["content_base64"] =
                        json!(base64::engine::general_purpose::STANDARD.encode(&content));
                }
                Ok(_) => entry["omitted"] = json!("too_large"),
                Err(_) => entry["omitted"] = json!("unreadable"),
            }
        }
        entries.push(entry);
    }
    Value::Array(entries)
}

/// Decodes `%XX` and `+`; `None` for invalid UTF-8.
pub(crate) fn percent_decode(raw: &str) -> Option<String> {
    let bytes = raw.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 2;
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests;
