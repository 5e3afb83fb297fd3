//! Handlers of `/v1/sessions/{key}`: what a session is doing, and cancelling it.

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
