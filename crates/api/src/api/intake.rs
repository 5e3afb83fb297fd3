//! `POST /v1/intake/pause` and `POST /v1/intake/resume`: while intake is
//! paused, messages from every channel are still accepted and queued, runs
//! already started go on, and no new run starts until it is resumed. Both
//! answer `{"paused": bool}`; `/v1/status` shows the same flag.

use axum::extract::State;
use axum::Json;
use serde::Serialize;

use super::ApiState;
use crate::error::ApiError;
use crate::openapi::Errors;

/// `POST /v1/intake/pause` and `/resume`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub(crate) struct Intake {
    /// Whether intake is paused now.
    pub(crate) paused: bool,
}

/// `POST /v1/intake/pause`: messages queue, and no run starts until resumed.
#[utoipa::path(
    post,
    path = "/v1/intake/pause",
    tag = "status",
    responses((status = 200, description = "Whether intake is paused now.", body = Intake), Errors)
)]
pub(super) async fn pause(State(state): State<ApiState>) -> Result<Json<Intake>, ApiError> {
    set(&state, true).await
}

/// `POST /v1/intake/resume`: queued messages start running again.
#[utoipa::path(
    post,
    path = "/v1/intake/resume",
    tag = "status",
    responses((status = 200, description = "Whether intake is paused now.", body = Intake), Errors)
)]
pub(super) async fn resume(State(state): State<ApiState>) -> Result<Json<Intake>, ApiError> {
    set(&state, false).await
}

async fn set(state: &ApiState, paused: bool) -> Result<Json<Intake>, ApiError> {
    state.router.set_intake_paused(paused).await?;
    let snapshot = state.runs.snapshot().await?;
    Ok(Json(Intake { paused: snapshot.paused }))
}
