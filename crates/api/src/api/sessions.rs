//! Handlers of `/v1/sessions/{key}`: what a session is doing, cancelling it,
//! and its export.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use lemon_core::ids::SessionKey;
use lemon_core::router::CancelSummary;
use serde::Serialize;

use super::ApiState;
use crate::error::{ApiError, PathParams};
use crate::openapi::Errors;

/// `GET /v1/sessions/{key}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub(crate) struct Session {
    /// The first of `active_runs`.
    #[schema(required = true)]
    pub(crate) active_run: Option<String>,
    /// Runs of the session running now (one per conversation it has).
    pub(crate) active_runs: Vec<String>,
    /// The engine session it continues.
    #[schema(required = true)]
    pub(crate) chat_state: Option<ChatState>,
    /// The engine the session sticks to (`/engine`), if any.
    #[schema(required = true)]
    pub(crate) engine: Option<String>,
    /// Steers waiting for the engine's answer.
    pub(crate) pending_steers: usize,
    /// Queued run ids, in the order they run.
    pub(crate) queue: Vec<String>,
    /// How many runs are queued.
    pub(crate) queue_length: usize,
    pub(crate) session_key: String,
}

/// A session's chat state: the engine session it continues.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub(crate) struct ChatState {
    /// The engine that holds the session.
    pub(crate) engine: String,
    /// When it is forgotten (ms since the epoch).
    pub(crate) expires_at_ms: i64,
    /// The engine's session id.
    pub(crate) resume_token: String,
    pub(crate) updated_at_ms: i64,
}

/// `POST /v1/sessions/{key}/cancel` and `/abort`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub(crate) struct SessionCancelled {
    /// Active runs cancelled.
    pub(crate) cancelled: usize,
    /// Queued runs dropped (`abort` only; `0` for `cancel`).
    pub(crate) dropped: usize,
    pub(crate) session_key: String,
}

/// One run of a session's export (`format=jsonl`: one a line).
#[derive(Debug, Clone, PartialEq, Serialize)]
struct ExportedRun {
    /// Each completed action as `{kind, title, ok, message}`.
    actions: Vec<serde_json::Value>,
    answer: Option<String>,
    completed_at_ms: Option<i64>,
    created_at_ms: i64,
    engine: String,
    error: Option<String>,
    prompt: String,
    run_id: String,
    spend_usd: f64,
    status: &'static str,
    usage: serde_json::Value,
}

/// The session a path names; a key the product refuses is a 400 naming the field.
fn session_key(raw: &str) -> Result<SessionKey, ApiError> {
    SessionKey::parse(raw).map_err(|err| ApiError::BadRequest(err.to_string()))
}

/// `GET /v1/sessions/{key}`: active runs, queued runs in order, chat state.
#[utoipa::path(
    get,
    path = "/v1/sessions/{key}",
    tag = "sessions",
    params(("key" = String, Path, description = "The session key.")),
    responses((status = 200, description = "The session.", body = Session), Errors)
)]
pub(super) async fn get(
    State(state): State<ApiState>,
    PathParams(key): PathParams<String>,
) -> Result<Json<Session>, ApiError> {
    let view = state.runs.session(&session_key(&key)?).await?;
    let chat_state = view.chat_state.map(|chat| ChatState {
        engine: chat.last_engine,
        expires_at_ms: chat.expires_at_ms,
        resume_token: chat.last_resume_token,
        updated_at_ms: chat.updated_at_ms,
    });
    let ids = |list: &[lemon_core::ids::RunId]| -> Vec<String> {
        list.iter().map(|id| id.as_str().to_owned()).collect()
    };
    Ok(Json(Session {
        active_run: view.active.first().map(|id| id.as_str().to_owned()),
        active_runs: ids(&view.active),
        chat_state,
        engine: view.sticky_engine.map(|engine| engine.to_string()),
        pending_steers: view.pending_steers,
        queue: ids(&view.queued),
        queue_length: view.queued.len(),
        session_key: view.session_key.as_str().to_owned(),
    }))
}

fn summary(key: &SessionKey, summary: CancelSummary) -> Response {
    let body = SessionCancelled {
        cancelled: summary.cancelled,
        dropped: summary.dropped,
        session_key: key.as_str().to_owned(),
    };
    (StatusCode::ACCEPTED, Json(body)).into_response()
}

/// `POST /v1/sessions/{key}/cancel`: cancels the active runs; the queue runs next.
#[utoipa::path(
    post,
    path = "/v1/sessions/{key}/cancel",
    tag = "sessions",
    params(("key" = String, Path, description = "The session key.")),
    responses((status = 202, description = "What was cancelled.", body = SessionCancelled), Errors)
)]
pub(super) async fn cancel(
    State(state): State<ApiState>,
    PathParams(key): PathParams<String>,
) -> Result<Response, ApiError> {
    let key = session_key(&key)?;
    Ok(summary(&key, state.router.cancel_session(&key).await?))
}

/// `POST /v1/sessions/{key}/abort`: drops the queued work and cancels the active runs.
#[utoipa::path(
    post,
    path = "/v1/sessions/{key}/abort",
    tag = "sessions",
    params(("key" = String, Path, description = "The session key.")),
    responses((status = 202, description = "What was dropped and cancelled.", body = SessionCancelled), Errors)
)]
pub(super) async fn abort(
    State(state): State<ApiState>,
    PathParams(key): PathParams<String>,
) -> Result<Response, ApiError> {
    let key = session_key(&key)?;
    Ok(summary(&key, state.router.abort_session(&key).await?))
}

/// The most runs an export holds (the oldest first).
pub(super) const EXPORT_MAX_RUNS: usize = 10_000;

/// `?format=` of an export.
#[derive(Debug, serde::Deserialize, Default)]
pub(super) struct ExportQuery {
    #[serde(default)]
    format: Option<String>,
}

/// One run of a session as its export shows it: what was asked, answered,
/// done (each completed action), with which engine, when, and what it spent.
/// A run whose events were compacted lists the actions its record kept.
fn exported_run(
    record: &lemon_core::store::RunRecord,
    events: &[lemon_core::store::StoredEvent],
) -> ExportedRun {
    let actions = match &record.compacted {
        Some(compacted) => compacted.actions.clone(),
        None => lemon_core::store::action_summary(events.iter().map(|event| &event.data)),
    };
    ExportedRun {
        actions,
        answer: record.answer.clone(),
        completed_at_ms: record.completed_at_ms,
        created_at_ms: record.created_at_ms,
        engine: record.engine.clone(),
        error: record.error.clone(),
        prompt: record.prompt.clone(),
        run_id: record.run_id.clone(),
        spend_usd: record.spend.usd,
        status: record.status.as_str(),
        usage: record.usage.clone(),
    }
}

/// One run in Markdown: a heading with when and on what, the prompt quoted,
/// the actions as a list, the answer (or the error).
fn markdown_run(run: &ExportedRun) -> String {
    let when = chrono::DateTime::from_timestamp_millis(run.created_at_ms)
        .map(|at| at.format("%Y-%m-%d %H:%M:%S UTC").to_string())
        .unwrap_or_default();
    let mut out = format!("## {when} · {} · {}\n\n", run.engine, run.status);
    for line in run.prompt.lines() {
        out.push_str(&format!("> {line}\n"));
    }
    out.push('\n');
    for action in &run.actions {
        let mark = if action["ok"] == false { "✗" } else { "✓" };
        out.push_str(&format!(
            "- {mark} {}: {}\n",
            action["kind"].as_str().unwrap_or("action"),
            action["title"].as_str().unwrap_or_default()
        ));
    }
    if !run.actions.is_empty() {
        out.push('\n');
    }
    match (run.answer.as_deref(), run.error.as_deref()) {
        (Some(answer), _) if !answer.is_empty() => out.push_str(&format!("{answer}\n\n")),
        (_, Some(error)) => out.push_str(&format!("*Error: {error}*\n\n")),
        _ => {}
    }
    out
}

/// `GET /v1/sessions/{key}/export`: the session's runs, oldest first, as
/// JSON lines (`format=jsonl`, the default: one run per line with its
/// prompt, answer, actions, engine, times and spend) or Markdown
/// (`format=markdown`).
#[utoipa::path(
    get,
    path = "/v1/sessions/{key}/export",
    tag = "sessions",
    params(
        ("key" = String, Path, description = "The session key."),
        ("format" = Option<String>, Query, description = "`jsonl` (default) or `markdown`."),
    ),
    responses(
        (status = 200, description = "The session's runs, oldest first.", content_type = "application/x-ndjson", body = String),
        Errors,
    )
)]
pub(super) async fn export(
    State(state): State<ApiState>,
    PathParams(key): PathParams<String>,
    axum::extract::Query(query): axum::extract::Query<ExportQuery>,
) -> Result<Response, ApiError> {
    let markdown = match query.format.as_deref() {
        None | Some("jsonl") => false,
        Some("markdown") => true,
        Some(_) => {
            return Err(ApiError::BadRequest("format: must be jsonl or markdown".to_owned()))
        }
    };
    let key = session_key(&key)?;
    let records = state.runs.session_runs(&key, EXPORT_MAX_RUNS).await?;
    // The events only of runs whose actions are not kept in their record.
    let wanted: Vec<String> = records
        .iter()
        .filter(|record| record.compacted.is_none())
        .map(|record| record.run_id.clone())
        .collect();
    let mut events = state.runs.runs_events(wanted).await?.into_iter();
    let runs: Vec<ExportedRun> = records
        .iter()
        .map(|record| match record.compacted {
            Some(_) => exported_run(record, &[]),
            None => exported_run(record, &events.next().unwrap_or_default()),
        })
        .collect();
    let (content_type, body) = if markdown {
        let mut body = format!("# Session {}\n\n", key.as_str());
        for run in &runs {
            body.push_str(&markdown_run(run));
        }
        ("text/markdown; charset=utf-8", body)
    } else {
        let mut body = String::new();
        for run in &runs {
            let line = serde_json::to_string(run)
                .map_err(|e| ApiError::Internal(format!("session export: {e}")))?;
            body.push_str(&line);
            body.push('\n');
        }
        ("application/x-ndjson", body)
    };
    Ok(([(axum::http::header::CONTENT_TYPE, content_type)], body).into_response())
}
