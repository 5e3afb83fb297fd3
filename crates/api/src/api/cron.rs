//! Handlers of `/v1/cron`: scheduled prompts. Bodies use the job's JSON keys
//! (`schedule`, `prompt`, `sessionKey`, `timezone`, `jitterSec`, `timeoutMs`,
//! `maxRetries`, `retryBackoffMs`…, snake_case accepted); answers are the
//! job's and the run's one JSON form.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use lemon_core::cron::input::{patch_from_json, spec_from_json};
use lemon_core::cron::CronError;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::ApiState;
use crate::error::{ApiError, ErrorBody, JsonBody, PathParams, QueryParams};
use crate::openapi::{schema, Errors};

/// A scheduled job.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct CronJob {
    /// The agent its runs belong to.
    pub(crate) agent_id: String,
    /// When it was made (ms since the epoch).
    pub(crate) created_at_ms: i64,
    /// Whether it fires.
    pub(crate) enabled: bool,
    pub(crate) id: String,
    /// Seconds of random delay added to each firing.
    pub(crate) jitter_sec: u64,
    /// When it last fired.
    #[schema(required = true)]
    pub(crate) last_run_at_ms: Option<i64>,
    /// Retries of a failed run.
    pub(crate) max_retries: u32,
    /// A file whose contents are added to each prompt.
    #[schema(required = true)]
    pub(crate) memory_file: Option<String>,
    /// Kept with each run (`null` when the job was made without).
    pub(crate) meta: Value,
    pub(crate) name: String,
    /// When it fires next (jitter included); `null` when disabled.
    #[schema(required = true)]
    pub(crate) next_run_at_ms: Option<i64>,
    /// What each run is asked.
    pub(crate) prompt: String,
    /// The first retry waits this long, each next one twice as long.
    pub(crate) retry_backoff_ms: u64,
    /// The normalised cron expression (`0 9 * * 1-5`, `@every 10m`).
    pub(crate) schedule: String,
    /// The session its runs go to.
    pub(crate) session_key: String,
    /// `api` (made through the API or the tool) or `config` (a
    /// `[[gateway.cron]]` entry, kept in step with the file).
    pub(crate) source: String,
    /// A run still going after this long is cancelled.
    pub(crate) timeout_ms: u64,
    /// The IANA time zone the schedule is read in.
    pub(crate) timezone: String,
    /// When it was last changed (ms since the epoch).
    pub(crate) updated_at_ms: i64,
}

impl From<&lemon_core::cron::CronJob> for CronJob {
    fn from(job: &lemon_core::cron::CronJob) -> Self {
        CronJob {
            agent_id: job.agent_id.clone(),
            created_at_ms: job.created_at_ms,
            enabled: job.enabled,
            id: job.id.clone(),
            jitter_sec: job.jitter_sec,
            last_run_at_ms: job.last_run_at_ms,
            max_retries: job.max_retries,
            memory_file: job.memory_file.clone(),
            meta: job.meta.clone(),
            name: job.name.clone(),
            next_run_at_ms: job.next_run_at_ms,
            prompt: job.prompt.clone(),
            retry_backoff_ms: job.retry_backoff_ms,
            schedule: job.schedule.clone(),
            session_key: job.session_key.clone(),
            source: job.source.as_str().to_owned(),
            timeout_ms: job.timeout_ms,
            timezone: job.timezone.clone(),
            updated_at_ms: job.updated_at_ms,
        }
    }
}

/// One firing of a job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct CronRun {
    /// 1 for the first attempt.
    pub(crate) attempt: u32,
    /// When it ended; `null` while it goes on.
    #[schema(required = true)]
    pub(crate) ended_at_ms: Option<i64>,
    pub(crate) id: String,
    pub(crate) job_id: String,
    /// The answer or the error, cut to 500 characters.
    #[schema(required = true)]
    pub(crate) output: Option<String>,
    /// The router's run of the latest attempt (`GET /v1/runs/{id}`).
    #[schema(required = true)]
    pub(crate) router_run_id: Option<String>,
    /// When it fired (ms since the epoch).
    pub(crate) started_at_ms: i64,
    /// `running`, `retrying`, `succeeded`, `failed`, `timed_out` or `aborted`.
    pub(crate) status: String,
    /// `schedule` or `manual`.
    pub(crate) trigger: String,
}

impl From<&lemon_core::cron::CronRun> for CronRun {
    fn from(run: &lemon_core::cron::CronRun) -> Self {
        let trigger = match run.trigger {
            lemon_core::cron::Trigger::Schedule => "schedule",
            lemon_core::cron::Trigger::Manual => "manual",
        };
        CronRun {
            attempt: run.attempt,
            ended_at_ms: run.ended_at_ms,
            id: run.id.clone(),
            job_id: run.job_id.clone(),
            output: run.output.clone(),
            router_run_id: run.router_run_id.clone(),
            started_at_ms: run.started_at_ms,
            status: run.status.as_str().to_owned(),
            trigger: trigger.to_owned(),
        }
    }
}

/// `GET /v1/cron`.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub(crate) struct CronJobs {
    /// Every job, paused ones included.
    pub(crate) jobs: Vec<CronJob>,
}

/// `GET /v1/cron/{id}/runs`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct CronRuns {
    pub(crate) job_id: String,
    /// Newest first.
    pub(crate) runs: Vec<CronRun>,
}

/// `DELETE /v1/cron/{id}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub(crate) struct CronRemoved {
    pub(crate) id: String,
    /// `true`.
    pub(crate) removed: bool,
}

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
    responses((status = 200, description = "Every job.", body = CronJobs), Errors)
)]
pub(super) async fn list(State(state): State<ApiState>) -> Result<Json<CronJobs>, ApiError> {
    let jobs = state.cron.list().await?.iter().map(CronJob::from).collect();
    Ok(Json(CronJobs { jobs }))
}

/// `POST /v1/cron`: a new job; `schedule` and `prompt` are required.
#[utoipa::path(
    post,
    path = "/v1/cron",
    tag = "cron",
    request_body = schema::NewCronJob,
    responses(
        (status = 201, description = "The new job.", body = CronJob),
        (status = 409, description = "A job of that name exists.", body = ErrorBody),
        Errors,
    )
)]
pub(super) async fn create(
    State(state): State<ApiState>,
    JsonBody(body): JsonBody<Value>,
) -> Result<Response, ApiError> {
    let spec = spec_from_json(&object(body)?).map_err(|e| ApiError::BadRequest(e.to_string()))?;
    let job = state.cron.add(spec).await?;
    Ok((StatusCode::CREATED, Json(CronJob::from(&job))).into_response())
}

/// `PATCH /v1/cron/{id}`: changes the fields the body has.
#[utoipa::path(
    patch,
    path = "/v1/cron/{id}",
    tag = "cron",
    params(("id" = String, Path, description = "The job id.")),
    request_body = schema::CronJobPatch,
    responses(
        (status = 200, description = "The changed job.", body = CronJob),
        (status = 404, description = "No such job.", body = ErrorBody),
        (status = 409, description = "A job of the config file, or the name is taken.", body = ErrorBody),
        Errors,
    )
)]
pub(super) async fn update(
    State(state): State<ApiState>,
    PathParams(id): PathParams<String>,
    JsonBody(body): JsonBody<Value>,
) -> Result<Json<CronJob>, ApiError> {
    let patch = patch_from_json(&object(body)?).map_err(|e| ApiError::BadRequest(e.to_string()))?;
    if patch.is_empty() {
        return Err(ApiError::BadRequest("no job fields to change in the body".to_owned()));
    }
    Ok(Json(CronJob::from(&state.cron.update(&id, patch).await?)))
}

/// `DELETE /v1/cron/{id}`: removes the job and its runs.
#[utoipa::path(
    delete,
    path = "/v1/cron/{id}",
    tag = "cron",
    params(("id" = String, Path, description = "The job id.")),
    responses(
        (status = 200, description = "Removed.", body = CronRemoved),
        (status = 404, description = "No such job.", body = ErrorBody),
        (status = 409, description = "A job of the config file.", body = ErrorBody),
        Errors,
    )
)]
pub(super) async fn remove(
    State(state): State<ApiState>,
    PathParams(id): PathParams<String>,
) -> Result<Json<CronRemoved>, ApiError> {
    let job = state.cron.remove(&id).await?;
    Ok(Json(CronRemoved { id: job.id, removed: true }))
}

/// `POST /v1/cron/{id}/run`: fires the job now; `202` with the cron run.
#[utoipa::path(
    post,
    path = "/v1/cron/{id}/run",
    tag = "cron",
    params(("id" = String, Path, description = "The job id.")),
    responses(
        (status = 202, description = "The run just started.", body = CronRun),
        (status = 404, description = "No such job.", body = ErrorBody),
        (status = 409, description = "The job is running.", body = ErrorBody),
        Errors,
    )
)]
pub(super) async fn run(
    State(state): State<ApiState>,
    PathParams(id): PathParams<String>,
) -> Result<Response, ApiError> {
    let run = state.cron.trigger(&id).await?;
    Ok((StatusCode::ACCEPTED, Json(CronRun::from(&run))).into_response())
}

/// The query of `GET /v1/cron/{id}/runs`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(super) struct RunsQuery {
    /// The most runs to list.
    limit: Option<usize>,
}

/// `GET /v1/cron/{id}/runs`: the job's runs, newest first (100 unless `limit` says).
#[utoipa::path(
    get,
    path = "/v1/cron/{id}/runs",
    tag = "cron",
    params(("id" = String, Path, description = "The job id."), RunsQuery),
    responses(
        (status = 200, description = "The job's runs, newest first.", body = CronRuns),
        (status = 404, description = "No such job.", body = ErrorBody),
        Errors,
    )
)]
pub(super) async fn runs(
    State(state): State<ApiState>,
    PathParams(id): PathParams<String>,
    QueryParams(query): QueryParams<RunsQuery>,
) -> Result<Json<CronRuns>, ApiError> {
    let runs = state.cron.runs(&id).await?;
    let limit = query.limit.unwrap_or(lemon_core::cron::RUNS_KEPT);
    let runs = runs.iter().take(limit).map(CronRun::from).collect();
    Ok(Json(CronRuns { job_id: id, runs }))
}
