//! Handlers of `/v1/sessions/{key}`: what a session is doing, cancelling it,
//! and its export.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use lemon_core::ids::SessionKey;
use lemon_core::router::CancelSummary;
use serde_json::json;

use super::ApiState;
use crate::error::{ApiError, PathParams};
use crate::openapi::{schema, Errors};

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
    responses((status = 200, description = "The session.", body = schema::Session), Errors)
)]
pub(super) async fn get(
    State(state): State<ApiState>,
    PathParams(key): PathParams<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let view = state.runs.session(&session_key(&key)?).await?;
    let chat_state = view.chat_state.as_ref().map(|chat| {
        json!({
            "engine": chat.last_engine,
            "resume_token": chat.last_resume_token,
            "updated_at_ms": chat.updated_at_ms,
            "expires_at_ms": chat.expires_at_ms,
        })
    });
    let ids = |list: &[lemon_core::ids::RunId]| -> Vec<String> {
        list.iter().map(|id| id.as_str().to_owned()).collect()
    };
    Ok(Json(json!({
        "session_key": view.session_key,
        "active_run": view.active.first().map(|id| id.as_str()),
        "active_runs": ids(&view.active),
        "queue": ids(&view.queued),
        "queue_length": view.queued.len(),
        "pending_steers": view.pending_steers,
        "chat_state": chat_state,
        "engine": view.sticky_engine,
    })))
}

fn summary(key: &SessionKey, summary: CancelSummary) -> Response {
    let body = json!({
        "session_key": key,
        "dropped": summary.dropped,
        "cancelled": summary.cancelled,
    });
    (StatusCode::ACCEPTED, Json(body)).into_response()
}

/// `POST /v1/sessions/{key}/cancel`: cancels the active runs; the queue runs next.
#[utoipa::path(
    post,
    path = "/v1/sessions/{key}/cancel",
    tag = "sessions",
    params(("key" = String, Path, description = "The session key.")),
    responses((status = 202, description = "What was cancelled.", body = schema::SessionCancelled), Errors)
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
    responses((status = 202, description = "What was dropped and cancelled.", body = schema::SessionCancelled), Errors)
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
) -> serde_json::Value {
    let actions = match &record.compacted {
        Some(compacted) => compacted.actions.clone(),
        None => lemon_core::store::action_summary(events.iter().map(|event| &event.data)),
    };
    json!({
        "run_id": record.run_id,
        "engine": record.engine,
        "status": record.status.as_str(),
        "prompt": record.prompt,
        "answer": record.answer,
        "error": record.error,
        "actions": actions,
        "usage": record.usage,
        "spend_usd": record.spend.usd,
        "created_at_ms": record.created_at_ms,
        "completed_at_ms": record.completed_at_ms,
    })
}

/// One run in Markdown: a heading with when and on what, the prompt quoted,
/// the actions as a list, the answer (or the error).
fn markdown_run(run: &serde_json::Value) -> String {
    let when = run["created_at_ms"]
        .as_i64()
        .and_then(chrono::DateTime::from_timestamp_millis)
        .map(|at| at.format("%Y-%m-%d %H:%M:%S UTC").to_string())
        .unwrap_or_default();
    let mut out = format!(
        "## {when} · {} · {}\n\n",
        run["engine"].as_str().unwrap_or("?"),
        run["status"].as_str().unwrap_or("?")
    );
    for line in run["prompt"].as_str().unwrap_or_default().lines() {
        out.push_str(&format!("> {line}\n"));
    }
    out.push('\n');
    for action in run["actions"].as_array().into_iter().flatten() {
        let mark = if action["ok"] == false { "✗" } else { "✓" };
        out.push_str(&format!(
            "- {mark} {}: {}\n",
            action["kind"].as_str().unwrap_or("action"),
            action["title"].as_str().unwrap_or_default()
        ));
    }
    if run["actions"].as_array().is_some_and(|a| !a.is_empty()) {
        out.push('\n');
    }
    match (run["answer"].as_str(), run["error"].as_str()) {
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
    let runs: Vec<serde_json::Value> = records
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
        let body: String = runs.iter().map(|run| format!("{run}\n")).collect();
        ("application/x-ndjson", body)
    };
    Ok(([(axum::http::header::CONTENT_TYPE, content_type)], body).into_response())
}
