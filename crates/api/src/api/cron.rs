//! Handlers of `/v1/cron`: scheduled prompts. Bodies use the job's JSON keys
//! (`schedule`, `prompt`, `sessionKey`, `timezone`, `jitterSec`, `timeoutMs`,
//! `maxRetries`, `retryBackoffMs`…, snake_case accepted); answers are the
//! job's and the run's one JSON form.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use lemon_core::cron::input::{patch_from_json, spec_from_json};
use lemon_core::cron::{CronError, CronJob, CronRun};
use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::ApiState;
use crate::error::{ApiError, JsonBody, PathParams, QueryParams};
use crate::openapi::{schema, Errors};

impl From<CronError> for ApiError {
    fn from(error: CronError) -> Self {
        match error {
            CronError::NotFound { .. } | CronError::RunNotFound { .. } => {
                ApiError::NotFound(error.to_string())
            }
            CronError::Schedule { .. } | CronError::Invalid(_) => {
                ApiError::BadRequest(error.to_string())
            }
            CronError::DuplicateName { .. }
            | CronError::ConfigJob { .. }
            | CronError::RunNotActive { .. } => ApiError::Conflict(error.to_string()),
            CronError::Store(store) => ApiError::Internal(format!("cron store: {store}")),
            CronError::ShuttingDown => ApiError::ShuttingDown,
        }
    }
}

fn object(body: Value) -> Result<Map<String, Value>, ApiError> {
    match body {
        Value::Object(map) => Ok(map),
        _ => Err(ApiError::BadRequest("body must be a JSON object".to_owned())),
    }
}

/// `GET /v1/cron`: every job, paused ones included.
#[utoipa::path(
    get,
    path = "/v1/cron",
    tag = "cron",
    responses((status = 200, description = "Every job.", body = schema::CronJobs), Errors)
)]
pub(super) async fn list(State(state): State<ApiState>) -> Result<Json<Value>, ApiError> {
    let jobs: Vec<Value> = state.cron.list().await?.iter().map(CronJob::to_json).collect();
    Ok(Json(json!({ "jobs": jobs })))
}

/// `POST /v1/cron`: a new job; `schedule` and `prompt` are required.
#[utoipa::path(
    post,
    path = "/v1/cron",
    tag = "cron",
    request_body = schema::NewCronJob,
    responses(
        (status = 201, description = "The new job.", body = schema::CronJob),
        (status = 409, description = "A job of that name exists.", body = schema::Error),
        Errors,
    )
)]
pub(super) async fn create(
    State(state): State<ApiState>,
    JsonBody(body): JsonBody<Value>,
) -> Result<Response, ApiError> {
    let spec = spec_from_json(&object(body)?).map_err(|e| ApiError::BadRequest(e.to_string()))?;
    let job = state.cron.add(spec).await?;
    Ok((StatusCode::CREATED, Json(job.to_json())).into_response())
}

/// `PATCH /v1/cron/{id}`: changes the fields the body has.
#[utoipa::path(
    patch,
    path = "/v1/cron/{id}",
    tag = "cron",
    params(("id" = String, Path, description = "The job id.")),
    request_body = schema::CronJobPatch,
    responses(
        (status = 200, description = "The changed job.", body = schema::CronJob),
        (status = 404, description = "No such job.", body = schema::Error),
        (status = 409, description = "A job of the config file, or the name is taken.", body = schema::Error),
        Errors,
    )
)]
pub(super) async fn update(
    State(state): State<ApiState>,
    PathParams(id): PathParams<String>,
    JsonBody(body): JsonBody<Value>,
) -> Result<Json<Value>, ApiError> {
    let patch = patch_from_json(&object(body)?).map_err(|e| ApiError::BadRequest(e.to_string()))?;
    if patch.is_empty() {
        return Err(ApiError::BadRequest("no job fields to change in the body".to_owned()));
    }
    Ok(Json(state.cron.update(&id, patch).await?.to_json()))
}

/// `DELETE /v1/cron/{id}`: removes the job and its runs.
#[utoipa::path(
    delete,
    path = "/v1/cron/{id}",
    tag = "cron",
    params(("id" = String, Path, description = "The job id.")),
    responses(
        (status = 200, description = "Removed.", body = schema::CronRemoved),
        (status = 404, description = "No such job.", body = schema::Error),
        (status = 409, description = "A job of the config file.", body = schema::Error),
        Errors,
    )
)]
pub(super) async fn remove(
    State(state): State<ApiState>,
    PathParams(id): PathParams<String>,
) -> Result<Json<Value>, ApiError> {
    let job = state.cron.remove(&id).await?;
    Ok(Json(json!({ "removed": true, "id": job.id })))
}

/// `POST /v1/cron/{id}/run`: fires the job now; `202` with the cron run.
#[utoipa::path(
    post,
    path = "/v1/cron/{id}/run",
    tag = "cron",
    params(("id" = String, Path, description = "The job id.")),
    responses(
        (status = 202, description = "The run just started.", body = schema::CronRun),
        (status = 404, description = "No such job.", body = schema::Error),
        (status = 409, description = "The job is running.", body = schema::Error),
        Errors,
    )
)]
pub(super) async fn run(
    State(state): State<ApiState>,
    PathParams(id): PathParams<String>,
) -> Result<Response, ApiError> {
    let run = state.cron.trigger(&id).await?;
    Ok((StatusCode::ACCEPTED, Json(run.to_json())).into_response())
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(super) struct RunsQuery {
    /// The most runs to list.
    limit: Option<usize>,
}

/// `GET /v1/cron/{id}/runs?limit=`: the job's runs, newest first (100 by default).
#[utoipa::path(
    get,
    path = "/v1/cron/{id}/runs",
    tag = "cron",
    params(("id" = String, Path, description = "The job id."), RunsQuery),
    responses(
        (status = 200, description = "The job's runs, newest first.", body = schema::CronRuns),
        (status = 404, description = "No such job.", body = schema::Error),
        Errors,
    )
)]
pub(super) async fn runs(
    State(state): State<ApiState>,
    PathParams(id): PathParams<String>,
    QueryParams(query): QueryParams<RunsQuery>,
) -> Result<Json<Value>, ApiError> {
    let runs = state.cron.runs(&id).await?;
    let limit = query.limit.unwrap_or(lemon_core::cron::RUNS_KEPT);
    let runs: Vec<Value> = runs.iter().take(limit).map(CronRun::to_json).collect();
    Ok(Json(json!({ "jobId": id, "runs": runs })))
}
