//! Handlers of `/v1/runs`: submit, inspect, list, cancel and steer.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use lemon_core::bus::{BusEvent, EventKind, RecvError, Subscription};
use lemon_core::engine::RunError;
use lemon_core::gateway::CancelOutcome;
use lemon_core::ids::RunId;
use lemon_core::router::{SlashCommand, Submitted};
use serde_json::json;

use super::transfer::{
    apply_completion, parse_run_id, run_json, run_not_found, ListQuery, SteerBody, SubmitBody,
    SubmitQuery,
};
use super::ApiState;
use crate::error::{ApiError, JsonBody, PathParams, QueryParams};

/// `POST /v1/runs`: `202` once accepted (the same id again is the same run and
/// answers `"duplicate": true`), `200` with the reply of a slash command, or with
/// `?wait=true` `200` and the run once it has finished.
pub(super) async fn submit(
    State(state): State<ApiState>,
    QueryParams(query): QueryParams<SubmitQuery>,
    JsonBody(body): JsonBody<SubmitBody>,
) -> Result<Response, ApiError> {
    let wait = query.wait()?;
    let req = body.into_request()?;
    let run_id =
        req.run_id.clone().ok_or_else(|| ApiError::Internal("run id not set".to_owned()))?;
    // Subscribed before submitting, so a run that finishes at once is still seen.
    let mut events = wait.then(|| state.gateway.bus().subscribe_run(&run_id));
    let accepted = match state.router.submit(req).await? {
        Submitted::Run(accepted) => accepted,
        Submitted::Command { command, reply } => {
            let body = json!({ "command": command_name(&command), "reply": reply });
            return Ok((StatusCode::OK, Json(body)).into_response());
        }
    };
    if let Some(events) = &mut events {
        return wait_for_run(&state, &run_id, events).await.map(IntoResponse::into_response);
    }
    let mut body = json!({
        "run_id": accepted.run_id.as_str(),
        "session_key": accepted.session_key.as_str(),
        "status": "accepted",
        "conversation": accepted.conversation.as_str(),
        "engine": accepted.engine,
    });
    if accepted.duplicate {
        body["duplicate"] = json!(true);
    }
    Ok((StatusCode::ACCEPTED, Json(body)).into_response())
}

fn command_name(command: &SlashCommand) -> &'static str {
    match command {
        SlashCommand::Cancel => "cancel",
        SlashCommand::New => "new",
        SlashCommand::Status => "status",
        SlashCommand::Engine(_) => "engine",
    }
}

/// Answers with the finished run. A run that already finished (a repeated id)
/// is read from the store; otherwise its `run_completed` is awaited. The wait is
/// bounded by the run itself: every accepted run completes, also at shutdown.
async fn wait_for_run(
    state: &ApiState,
    run_id: &RunId,
    events: &mut Subscription,
) -> Result<Json<serde_json::Value>, ApiError> {
    let store = state.gateway.store();
    let finished = store.get_run(run_id.as_str()).await?.filter(|r| r.status.is_terminal());
    let completed = match finished {
        Some(_) => None,
        None => next_run_completed(events).await,
    };
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
    // The router holds runs still queued in their conversation; the gateway the rest.
    let held = state.router.abort_run(&run_id).await?;
    let outcome = if held {
        CancelOutcome::Cancelling
    } else {
        state.gateway.cancel(&run_id, RunError::UserRequested).await?
    };
    let status = match outcome {
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
