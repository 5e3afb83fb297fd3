//! `POST /v1/intake/pause` and `POST /v1/intake/resume`: while intake is
//! paused, messages from every channel are still accepted and queued, runs
//! already started go on, and no new run starts until it is resumed. Both
//! answer `{"paused": bool}`; `/v1/status` shows the same flag.

use axum::extract::State;
use axum::Json;
use serde_json::{json, Value};

use super::ApiState;
use crate::error::ApiError;
use crate::openapi::{schema, Errors};

#[utoipa::path(
    post,
    path = "/v1/intake/pause",
    tag = "status",
    responses((status = 200, description = "Whether intake is paused now.", body = schema::Intake), Errors)
)]
pub(super) async fn pause(State(state): State<ApiState>) -> Result<Json<Value>, ApiError> {
    set(&state, true).await
}

#[utoipa::path(
    post,
    path = "/v1/intake/resume",
    tag = "status",
    responses((status = 200, description = "Whether intake is paused now.", body = schema::Intake), Errors)
)]
pub(super) async fn resume(State(state): State<ApiState>) -> Result<Json<Value>, ApiError> {
    set(&state, false).await
}

async fn set(state: &ApiState, paused: bool) -> Result<Json<Value>, ApiError> {
    state.router.set_intake_paused(paused).await?;
    let snapshot = state.runs.snapshot().await?;
    Ok(Json(json!({ "paused": snapshot.paused })))
}
