//! Handlers of `/v1/runs`: submit, inspect, list, cancel and steer.

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use lemon_core::bus::{artifact_from_json, EventKind};
use lemon_core::gateway::CancelOutcome;
use lemon_core::ids::RunId;
use lemon_core::router::{RouterHandle, RunFollower, Runs, SlashCommand, Submitted};
use serde::Serialize;

use super::transfer::{
    apply_completion, parse_run_id, run_not_found, Artifact, ListQuery, Run, RunStatusName,
    SteerBody, SubmitBody, SubmitQuery,
};
use super::ApiState;
use crate::error::{read_json, ApiError, ErrorBody, JsonBody, PathParams, QueryParams};
use crate::openapi::Errors;

/// `202` of `POST /v1/runs`: the run is accepted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub(crate) struct Accepted {
    /// The conversation it queues in (runs of one conversation go one at a time).
    pub(crate) conversation: String,
    /// `true` when the run id was submitted before: this is that run, and
    /// nothing new was started. Absent otherwise.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub(crate) duplicate: bool,
    /// The engine it runs on (`claude`, `claude:opus`).
    pub(crate) engine: String,
    pub(crate) run_id: String,
    pub(crate) session_key: String,
    /// `accepted`.
    pub(crate) status: String,
}

/// `200` of `POST /v1/runs` for a slash command (`/new`, `/status`…): the
/// command's answer; no run was started.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub(crate) struct CommandReply {
    /// `cancel`, `new`, `status` or `engine`.
    pub(crate) command: String,
    /// What the command answered, for a person.
    pub(crate) reply: String,
}

impl CommandReply {
    pub(crate) fn new(command: &SlashCommand, reply: String) -> Self {
        CommandReply { command: command_name(command).to_owned(), reply }
    }
}

/// `200` of `POST /v1/runs`: a slash command's reply, or with `?wait=true`
/// the finished run.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(untagged)]
pub(crate) enum SubmitReply {
    Run(Box<Run>),
    Command(CommandReply),
}

/// `GET /v1/runs`.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub(crate) struct RunList {
    /// Newest first.
    pub(crate) runs: Vec<Run>,
}

/// `POST /v1/runs/{id}/cancel`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub(crate) struct RunCancelled {
    pub(crate) run_id: String,
    /// `cancelling`, or the run's status when it is no longer active.
    pub(crate) status: RunStatusName,
}

/// `POST /v1/runs/{id}/steer`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub(crate) struct Steered {
    /// Whether the running engine took the text.
    pub(crate) accepted: bool,
    /// Why not, when it did not (absent when it did).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) reason: Option<String>,
}

/// `POST /v1/runs`: submits a run through the router, as every channel does
/// (queue modes, resume lines, engine directives and slash commands work here
/// too).
///
/// `202` once accepted (the same id again is the same run and answers
/// `"duplicate": true`), `200` with the reply of a slash command, or with
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
        (status = 202, description = "Accepted.", body = Accepted),
        (status = 200, description = "A slash command's reply, or with `?wait=true` the finished run.", body = SubmitReply),
        (status = 409, description = "The run id names another run, or the engine named cannot run (its CLI is not installed).", body = ErrorBody),
        Errors,
        (status = 403, description = "Files are not accepted (`[gateway.files] enabled = false`).", body = ErrorBody),
        (status = 413, description = "The body is larger than its limit (one file of `[gateway.files] max_download_bytes` in base64, at least 1 MiB), or an attachment is larger than `max_download_bytes`.", body = ErrorBody),
        (status = 422, description = "An attachment's URL could not be fetched, or points at a private or loopback address.", body = ErrorBody),
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
            let body = SubmitReply::Command(CommandReply::new(&command, reply));
            return Ok((StatusCode::OK, Json(body)).into_response());
        }
    };
    // A repeated run id is the first request's run, with its own files.
    if !accepted.duplicate {
        staged.hand_over();
    }
    if wait {
        let run = wait_for_run(&state.runs, follower).await?;
        return Ok((StatusCode::OK, Json(SubmitReply::Run(Box::new(run)))).into_response());
    }
    let body = Accepted {
        conversation: accepted.conversation.as_str().to_owned(),
        duplicate: accepted.duplicate,
        engine: accepted.engine.to_string(),
        run_id: accepted.run_id.as_str().to_owned(),
        session_key: accepted.session_key.as_str().to_owned(),
        status: "accepted".to_owned(),
    };
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

fn command_name(command: &SlashCommand) -> &'static str {
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
pub(crate) async fn wait_for_run(runs: &Runs, mut follower: RunFollower) -> Result<Run, ApiError> {
    let completed = follower.completion().await;
    let run_id = follower.run_id();
    let mut record = runs.get(run_id).await?.ok_or_else(|| {
        ApiError::Internal(format!("accepted run {run_id} is missing from the store"))
    })?;
    let mut artifacts = Vec::new();
    if let Some(event) = &completed {
        if let EventKind::RunCompleted { completion, engine, duration_ms } = &event.kind {
            if !record.status.is_terminal() {
                apply_completion(&mut record, completion, engine, *duration_ms, event.ts_ms);
            }
            artifacts = completion.artifacts.iter().map(Artifact::from).collect();
        }
    }
    Ok(Run { artifacts: Some(artifacts), ..Run::of(&record, runs) })
}

/// The files sent with a finished run's answer, from its stored `run_completed`
/// (`[]` while it runs, and for runs of versions that kept none).
async fn stored_artifacts(state: &ApiState, run_id: &RunId) -> Result<Vec<Artifact>, ApiError> {
    let events = state.runs.events(run_id).await?;
    let stored = events
        .iter()
        .rev()
        .find(|event| event.kind == "run_completed")
        .and_then(|event| event.data.get("artifacts"))
        .and_then(serde_json::Value::as_array);
    let artifacts = stored.into_iter().flatten().filter_map(artifact_from_json);
    Ok(artifacts.map(|artifact| Artifact::from(&artifact)).collect())
}

/// `GET /v1/runs/{id}`: one run, its answer, what it spent and the files it sent.
#[utoipa::path(
    get,
    path = "/v1/runs/{id}",
    tag = "runs",
    params(("id" = String, Path, description = "The run id.")),
    responses(
        (status = 200, description = "The run.", body = Run),
        (status = 404, description = "No such run.", body = ErrorBody),
        Errors,
    )
)]
pub(super) async fn get(
    State(state): State<ApiState>,
    PathParams(raw): PathParams<String>,
) -> Result<Json<Run>, ApiError> {
    let run_id = parse_run_id(&raw)?;
    let record = state.runs.get(&run_id).await?.ok_or_else(|| run_not_found(&raw))?;
    let artifacts = if record.status.is_terminal() {
        stored_artifacts(&state, &run_id).await?
    } else {
        Vec::new()
    };
    Ok(Json(Run { artifacts: Some(artifacts), ..Run::of(&record, &state.runs) }))
}

/// `GET /v1/runs`: the latest runs, newest first, of one status if `status` says.
#[utoipa::path(
    get,
    path = "/v1/runs",
    tag = "runs",
    params(ListQuery),
    responses((status = 200, description = "Runs, newest first.", body = RunList), Errors)
)]
pub(super) async fn list(
    State(state): State<ApiState>,
    QueryParams(query): QueryParams<ListQuery>,
) -> Result<Json<RunList>, ApiError> {
    let filter = query.filter()?;
    let records = state.runs.list(filter).await?;
    let runs = records.iter().map(|record| Run::of(record, &state.runs)).collect();
    Ok(Json(RunList { runs }))
}

/// `POST /v1/runs/{id}/cancel`: cancels a queued or running run.
///
/// `202` with `cancelling`, or with the run's status when it is no longer
/// active (cancelling a finished run is not an error).
#[utoipa::path(
    post,
    path = "/v1/runs/{id}/cancel",
    tag = "runs",
    params(("id" = String, Path, description = "The run id.")),
    responses(
        (status = 202, description = "Cancelling, or the status of a run no longer active.", body = RunCancelled),
        (status = 404, description = "No such run.", body = ErrorBody),
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

/// Cancels the run `raw` names: `cancelling`, or the status of a run no
/// longer active.
pub(crate) async fn cancel_run(
    router: &RouterHandle,
    runs: &Runs,
    raw: &str,
) -> Result<RunCancelled, ApiError> {
    let run_id = parse_run_id(raw)?;
    if runs.get(&run_id).await?.is_none() {
        return Err(run_not_found(raw));
    }
    let status = match router.cancel_run(&run_id).await? {
        CancelOutcome::Cancelling => RunStatusName::Cancelling,
        // Read again: the run may have finished since the first read.
        CancelOutcome::NotActive => match runs.get(&run_id).await? {
            Some(record) => record.status.into(),
            None => return Err(run_not_found(raw)),
        },
    };
    Ok(RunCancelled { run_id: run_id.as_str().to_owned(), status })
}

/// `POST /v1/runs/{id}/steer`: whether the running engine took the text.
#[utoipa::path(
    post,
    path = "/v1/runs/{id}/steer",
    tag = "runs",
    params(("id" = String, Path, description = "The run id.")),
    request_body = SteerBody,
    responses(
        (status = 200, description = "Whether the engine took the text.", body = Steered),
        (status = 404, description = "No such run.", body = ErrorBody),
        Errors,
    )
)]
pub(super) async fn steer(
    State(state): State<ApiState>,
    PathParams(raw): PathParams<String>,
    JsonBody(body): JsonBody<SteerBody>,
) -> Result<Json<Steered>, ApiError> {
    let run_id = parse_run_id(&raw)?;
    let text = body.text()?;
    if state.runs.get(&run_id).await?.is_none() {
        return Err(run_not_found(&raw));
    }
    let body = match state.router.steer(&run_id, &text).await {
        Ok(()) => Steered { accepted: true, reason: None },
        Err(err) => Steered { accepted: false, reason: Some(err.to_string()) },
    };
    Ok(Json(body))
}
