//! Handlers of `/v1/runs`: submit, inspect, list, cancel and steer.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use lemon_core::bus::{BusEvent, EventKind, RecvError, Subscription};
use lemon_core::engine::RunError;
use lemon_core::gateway::{CancelOutcome, ExecutionRequest, SubmitError};
use lemon_core::ids::RunId;
use serde_json::json;

use super::transfer::{
    apply_completion, parse_run_id, run_json, run_not_found, ListQuery, SteerBody, SubmitBody,
    SubmitQuery,
};
use super::ApiState;
use crate::error::{ApiError, JsonBody, PathParams, QueryParams};

/// `POST /v1/runs`: `202` once accepted, or with `?wait=true` `200` and the run
/// once it has finished.
pub(super) async fn submit(
    State(state): State<ApiState>,
    QueryParams(query): QueryParams<SubmitQuery>,
    JsonBody(body): JsonBody<SubmitBody>,
) -> Result<Response, ApiError> {
    let wait = query.wait()?;
    let req = body.into_request(&state.default_engine)?;
    refuse_known_run_id(&state, &req).await?;
    if wait {
        return submit_and_wait(&state, req).await.map(IntoResponse::into_response);
    }
    let session_key = req.session_key.clone();
    let run_id = state.gateway.submit(req).await?;
    let body =
        json!({ "run_id": run_id.as_str(), "session_key": session_key, "status": "accepted" });
    Ok((StatusCode::ACCEPTED, Json(body)).into_response())
}

/// The gateway refuses ids of queued and running runs; this also refuses ids of
/// finished ones, so a caller cannot overwrite a run's history.
async fn refuse_known_run_id(state: &ApiState, req: &ExecutionRequest) -> Result<(), ApiError> {
    let Some(run_id) = &req.run_id else { return Ok(()) };
    if state.gateway.store().get_run(run_id.as_str()).await?.is_some() {
        return Err(SubmitError::DuplicateRunId { run_id: run_id.to_string() }.into());
    }
    Ok(())
}

/// Submits and answers with the finished run. Subscribes to the run's topic
/// before submitting, so a run that finishes at once is still seen.
///
/// The wait is bounded by the run itself: the gateway completes every accepted
/// run, including when it drains for shutdown.
async fn submit_and_wait(
    state: &ApiState,
    req: ExecutionRequest,
) -> Result<Json<serde_json::Value>, ApiError> {
    let run_id = req.run_id.clone().unwrap_or_else(RunId::generate);
    let req = ExecutionRequest { run_id: Some(run_id.clone()), ..req };
    let mut events = state.gateway.bus().subscribe_run(&run_id);
    state.gateway.submit(req).await?;
    let completed = next_run_completed(&mut events).await;
    let store = state.gateway.store();
    let mut record = store.get_run(run_id.as_str()).await?.ok_or_else(|| {
        ApiError::Internal(format!("accepted run {run_id} is missing from the store"))
    })?;
    if let Some(event) = completed {
        if let EventKind::RunCompleted { completion, engine, duration_ms } = &event.kind {
            apply_completion(&mut record, completion, engine, *duration_ms, event.ts_ms);
        }
    }
    Ok(Json(run_json(&record, state.gateway.engines())))
}

/// The run's `run_completed`, or `None` when the topic closed without one.
async fn next_run_completed(events: &mut Subscription) -> Option<std::sync::Arc<BusEvent>> {
    loop {
        match events.recv().await {
            Ok(event) if matches!(event.kind, EventKind::RunCompleted { .. }) => {
                return Some(event)
            }
            // `run_completed` is the topic's last event, so a lag never skips it.
            Ok(_) | Err(RecvError::Lagged(_)) => {}
            Err(RecvError::Closed) => return None,
        }
    }
}

/// `GET /v1/runs/{id}`.
pub(super) async fn get(
    State(state): State<ApiState>,
    PathParams(raw): PathParams<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let run_id = parse_run_id(&raw)?;
    let record =
        state.gateway.store().get_run(run_id.as_str()).await?.ok_or_else(|| run_not_found(&raw))?;
    Ok(Json(run_json(&record, state.gateway.engines())))
}

/// `GET /v1/runs?status=&limit=`, newest first.
pub(super) async fn list(
    State(state): State<ApiState>,
    QueryParams(query): QueryParams<ListQuery>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let filter = query.filter()?;
    let records = state.gateway.store().list_runs(filter).await?;
    let engines = state.gateway.engines();
    let runs: Vec<_> = records.iter().map(|record| run_json(record, engines)).collect();
    Ok(Json(json!({ "runs": runs })))
}

/// `POST /v1/runs/{id}/cancel`: `202` with `cancelling`, or with the run's status
/// when it is no longer active (cancelling a finished run is not an error).
pub(super) async fn cancel(
    State(state): State<ApiState>,
    PathParams(raw): PathParams<String>,
) -> Result<Response, ApiError> {
    let run_id = parse_run_id(&raw)?;
    let store = state.gateway.store();
    if store.get_run(run_id.as_str()).await?.is_none() {
        return Err(run_not_found(&raw));
    }
    let status = match state.gateway.cancel(&run_id, RunError::UserRequested).await? {
        CancelOutcome::Cancelling => "cancelling",
        // Read again: the run may have finished since the first read.
        CancelOutcome::NotActive => match store.get_run(run_id.as_str()).await? {
            Some(record) => record.status.as_str(),
            None => return Err(run_not_found(&raw)),
        },
    };
    Ok((StatusCode::ACCEPTED, Json(json!({ "run_id": run_id.as_str(), "status": status })))
        .into_response())
}

/// `POST /v1/runs/{id}/steer`: whether the running engine took the text.
pub(super) async fn steer(
    State(state): State<ApiState>,
    PathParams(raw): PathParams<String>,
    JsonBody(body): JsonBody<SteerBody>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let run_id = parse_run_id(&raw)?;
    let text = body.text()?;
    if state.gateway.store().get_run(run_id.as_str()).await?.is_none() {
        return Err(run_not_found(&raw));
    }
    let body = match state.gateway.steer(&run_id, &text).await {
        Ok(()) => json!({ "accepted": true }),
        Err(err) => json!({ "accepted": false, "reason": err.to_string() }),
    };
    Ok(Json(body))
}
