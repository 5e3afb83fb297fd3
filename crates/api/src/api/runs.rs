//! Handlers of `/v1/runs`: submit, inspect, list, cancel and steer.

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use lemon_core::bus::{completion_json, EventKind};
use lemon_core::gateway::CancelOutcome;
use lemon_core::ids::RunId;
use lemon_core::router::{RouterHandle, RunFollower, Runs, SlashCommand, Submitted};
use serde_json::json;

use super::transfer::{
    apply_completion, parse_run_id, run_json, run_not_found, ListQuery, SteerBody, SubmitBody,
    SubmitQuery,
};
use super::ApiState;
use crate::error::{read_json, ApiError, JsonBody, PathParams, QueryParams};
use crate::openapi::{schema, Errors};

/// `POST /v1/runs`: `202` once accepted (the same id again is the same run and
/// answers `"duplicate": true`), `200` with the reply of a slash command, or with
/// `?wait=true` `200` and the run once it has finished. `attachments` are
/// checked and staged before the run is submitted: one refused refuses the
/// request, and the files of a request not accepted are removed.
#[utoipa::path(
    post,
    path = "/v1/runs",
    tag = "runs",
    params(SubmitQuery),
    request_body = SubmitBody,
    responses(
        (status = 202, description = "Accepted.", body = schema::Accepted),
        (status = 200, description = "A slash command's reply, or with `?wait=true` the finished run.", body = schema::SubmitReply),
        (status = 409, description = "The run id names another run, or the engine named cannot run (its CLI is not installed).", body = schema::Error),
        Errors,
        (status = 403, description = "Files are not accepted (`[gateway.files] enabled = false`).", body = schema::Error),
        (status = 413, description = "The body is larger than its limit (one file of `[gateway.files] max_download_bytes` in base64, at least 1 MiB), or an attachment is larger than `max_download_bytes`.", body = schema::Error),
        (status = 422, description = "An attachment's URL could not be fetched, or points at a private or loopback address.", body = schema::Error),
    )
)]
pub(super) async fn submit(
    State(state): State<ApiState>,
    QueryParams(query): QueryParams<SubmitQuery>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let mut body: SubmitBody = read_json(&headers, body, state.files.body_limit()).await?;
    let wait = query.wait()?;
    let files = body.take_attachments()?;
    let mut req = body.into_request()?;
    if let Some(engine) = &req.engine {
        refuse_unavailable(&state.runs, engine)?;
    }
    // Dropped (the files removed) unless the run takes them.
    let staged = state.files.receive(files).await?;
    lemon_core::media::add_attachments(&mut req.meta, staged.attachments());
    let (accepted, follower) = match state.router.submit(req).await? {
        Submitted::Run(accepted, follower) => (accepted, follower),
        Submitted::Command { command, reply } => {
            let body = json!({ "command": command_name(&command), "reply": reply });
            return Ok((StatusCode::OK, Json(body)).into_response());
        }
    };
    // A repeated run id is the first request's run, with its own files.
    if !accepted.duplicate {
        staged.hand_over();
    }
    if wait {
        return wait_for_run(&state.runs, follower)
            .await
            .map(Json)
            .map(IntoResponse::into_response);
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

/// An engine named by the request that cannot run (its CLI is not installed)
/// is refused before anything is accepted, with what fixes it: no failed run
/// is recorded for it.
pub(crate) fn refuse_unavailable(
    runs: &Runs,
    engine: &lemon_core::ids::EngineRef,
) -> Result<(), ApiError> {
    let engines = runs.engines();
    let info = engines.iter().find(|info| engine.is(&info.id));
    match info.map(|info| &info.availability) {
        Some(lemon_core::engine::Availability::Unavailable { reason }) => {
            Err(ApiError::Conflict(format!("engine {} is unavailable: {reason}", engine.id())))
        }
        _ => Ok(()),
    }
}

pub(crate) fn command_name(command: &SlashCommand) -> &'static str {
    match command {
        SlashCommand::Cancel => "cancel",
        SlashCommand::New => "new",
        SlashCommand::Status => "status",
        SlashCommand::Engine(_) => "engine",
    }
}

/// Answers with the finished run, once the follower reaches its completion (a
/// run that already finished, a repeated id, completes at once). The wait is
/// bounded by the run itself: every accepted run completes, also at shutdown.
///
/// # Cancel safety
/// Cancel safe: dropped while it waits, it leaves the run as it is.
pub(crate) async fn wait_for_run(
    runs: &Runs,
    mut follower: RunFollower,
) -> Result<serde_json::Value, ApiError> {
    let completed = follower.completion().await;
    let run_id = follower.run_id();
    let mut record = runs.get(run_id).await?.ok_or_else(|| {
        ApiError::Internal(format!("accepted run {run_id} is missing from the store"))
    })?;
    let mut artifacts = serde_json::Value::Array(Vec::new());
    if let Some(event) = &completed {
        if let EventKind::RunCompleted { completion, engine, duration_ms } = &event.kind {
            if !record.status.is_terminal() {
                apply_completion(&mut record, completion, engine, *duration_ms, event.ts_ms);
            }
            artifacts = completion_json(completion)["artifacts"].take();
        }
    }
    let mut body = run_json(&record, runs);
    body["artifacts"] = artifacts;
    Ok(body)
}

/// The files sent with a finished run's answer, from its stored `run_completed`
/// (`[]` while it runs, and for runs of versions that kept none).
async fn stored_artifacts(state: &ApiState, run_id: &RunId) -> Result<serde_json::Value, ApiError> {
    let events = state.runs.events(run_id).await?;
    let artifacts = events
        .iter()
        .rev()
        .find(|event| event.kind == "run_completed")
        .and_then(|event| event.data.get("artifacts").cloned())
        .unwrap_or_else(|| serde_json::Value::Array(Vec::new()));
    Ok(artifacts)
}

/// `GET /v1/runs/{id}`.
#[utoipa::path(
    get,
    path = "/v1/runs/{id}",
    tag = "runs",
    params(("id" = String, Path, description = "The run id.")),
    responses(
        (status = 200, description = "The run.", body = schema::Run),
        (status = 404, description = "No such run.", body = schema::Error),
        Errors,
    )
)]
pub(super) async fn get(
    State(state): State<ApiState>,
    PathParams(raw): PathParams<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let run_id = parse_run_id(&raw)?;
    let record = state.runs.get(&run_id).await?.ok_or_else(|| run_not_found(&raw))?;
    let mut body = run_json(&record, &state.runs);
    body["artifacts"] = if record.status.is_terminal() {
        stored_artifacts(&state, &run_id).await?
    } else {
        serde_json::Value::Array(Vec::new())
    };
    Ok(Json(body))
}

/// `GET /v1/runs?status=&limit=`, newest first.
#[utoipa::path(
    get,
    path = "/v1/runs",
    tag = "runs",
    params(ListQuery),
    responses((status = 200, description = "Runs, newest first.", body = schema::RunList), Errors)
)]
pub(super) async fn list(
    State(state): State<ApiState>,
    QueryParams(query): QueryParams<ListQuery>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let filter = query.filter()?;
    let records = state.runs.list(filter).await?;
    let runs: Vec<_> = records.iter().map(|record| run_json(record, &state.runs)).collect();
    Ok(Json(json!({ "runs": runs })))
}

/// `POST /v1/runs/{id}/cancel`: `202` with `cancelling`, or with the run's status
/// when it is no longer active (cancelling a finished run is not an error).
#[utoipa::path(
    post,
    path = "/v1/runs/{id}/cancel",
    tag = "runs",
    params(("id" = String, Path, description = "The run id.")),
    responses(
        (status = 202, description = "Cancelling, or the status of a run no longer active.", body = schema::RunCancelled),
        (status = 404, description = "No such run.", body = schema::Error),
        Errors,
    )
)]
pub(super) async fn cancel(
    State(state): State<ApiState>,
    PathParams(raw): PathParams<String>,
) -> Result<Response, ApiError> {
    let body = cancel_run(&state.router, &state.runs, &raw).await?;
    Ok((StatusCode::ACCEPTED, Json(body)).into_response())
}

/// Cancels the run `raw` names: `{"run_id", "status"}`, `cancelling` or the
/// status of a run no longer active.
pub(crate) async fn cancel_run(
    router: &RouterHandle,
    runs: &Runs,
    raw: &str,
) -> Result<serde_json::Value, ApiError> {
    let run_id = parse_run_id(raw)?;
    if runs.get(&run_id).await?.is_none() {
        return Err(run_not_found(raw));
    }
    let status = match router.cancel_run(&run_id).await? {
        CancelOutcome::Cancelling => "cancelling",
        // Read again: the run may have finished since the first read.
        CancelOutcome::NotActive => match runs.get(&run_id).await? {
            Some(record) => record.status.as_str(),
            None => return Err(run_not_found(raw)),
        },
    };
    Ok(json!({ "run_id": run_id.as_str(), "status": status }))
}

/// `POST /v1/runs/{id}/steer`: whether the running engine took the text.
#[utoipa::path(
    post,
    path = "/v1/runs/{id}/steer",
    tag = "runs",
    params(("id" = String, Path, description = "The run id.")),
    request_body = SteerBody,
    responses(
        (status = 200, description = "Whether the engine took the text.", body = schema::Steered),
        (status = 404, description = "No such run.", body = schema::Error),
        Errors,
    )
)]
pub(super) async fn steer(
    State(state): State<ApiState>,
    PathParams(raw): PathParams<String>,
    JsonBody(body): JsonBody<SteerBody>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let run_id = parse_run_id(&raw)?;
    let text = body.text()?;
    if state.runs.get(&run_id).await?.is_none() {
        return Err(run_not_found(&raw));
    }
    let body = match state.router.steer(&run_id, &text).await {
        Ok(()) => json!({ "accepted": true }),
        Err(err) => json!({ "accepted": false, "reason": err.to_string() }),
    };
    Ok(Json(body))
}
