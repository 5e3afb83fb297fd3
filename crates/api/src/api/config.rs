//! `/v1/config`: the config in force (`GET /v1/config`: defaults filled in,
//! secrets redacted, its generation, the edits waiting for a restart, and why
//! the file on disk was last refused), and the file itself (`GET
//! /v1/config/file`, `PUT /v1/config`) for the dashboard's editor.
//!
//! A saved text is checked whole, as a start would check it, before it is
//! written; it is written as sent (comments and layout kept) in place of the
//! file in one rename, and the gateway's watch on the file applies it like any
//! other edit. A refused text changes nothing and answers `422` with the
//! line and column of the problem.

use std::fmt;
use std::path::PathBuf;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use lemon_core::config::ConfigError;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::ApiState;
use crate::error::{ApiError, ErrorBody, JsonBody};
use crate::openapi::Errors;

/// `GET /v1/config`: the config in force.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub(crate) struct Config {
    /// The config in force, defaults filled in, secrets `[REDACTED]`.
    pub(crate) effective: Value,
    /// Whether the file is missing (the running config stays).
    pub(crate) file_missing: bool,
    /// 1 for the config read at start, one more for each applied edit.
    pub(crate) generation: u64,
    /// Settings edited in the file that take effect at the next start.
    pub(crate) pending_restart: Vec<PendingRestart>,
    /// The last edit of the file that was refused, while the file on disk is
    /// refused (the last good config stays).
    #[schema(required = true)]
    pub(crate) rejected: Option<Rejected>,
}

/// A setting that changed in the file and takes effect at the next start.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub(crate) struct PendingRestart {
    /// The value in the file.
    pub(crate) file: Value,
    /// The dotted key (`gateway.api.port`).
    pub(crate) key: String,
    /// The value in force.
    pub(crate) running: Value,
}

/// Why the file on disk is refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub(crate) struct Rejected {
    /// When (ms since the epoch).
    pub(crate) at_ms: i64,
    pub(crate) error: String,
}

/// `GET /v1/config/file`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub(crate) struct ConfigFile {
    /// Whether the file exists.
    pub(crate) exists: bool,
    pub(crate) path: String,
    /// config.toml as written (`""` when it does not exist).
    pub(crate) text: String,
}

/// `200` of `PUT /v1/config`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub(crate) struct ConfigSaved {
    /// Where it was written.
    #[schema(required = true)]
    pub(crate) path: Option<String>,
    /// `true`.
    pub(crate) saved: bool,
    /// What a start would warn about (unknown keys).
    pub(crate) warnings: Vec<String>,
}

/// `422` of `PUT /v1/config`: the text would not load, with where.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub(crate) struct ConfigRefused {
    /// 1-based column of the problem, when it has a place.
    #[schema(required = true)]
    pub(crate) column: Option<usize>,
    pub(crate) error: String,
    /// 1-based line of the problem, when it has a place.
    #[schema(required = true)]
    pub(crate) line: Option<usize>,
}

/// Reads and writes `config.toml` for `GET /v1/config/file` and `PUT
/// /v1/config`. The server implements it: it knows where the file is and how
/// a start checks it (transports, engines, secrets).
pub trait ConfigEditor: Send + Sync + fmt::Debug {
    /// The file's path and text; `text` is `None` when there is no file.
    ///
    /// # Errors
    /// The file exists but cannot be read.
    fn read(&self) -> std::io::Result<ConfigFileText>;

    /// Checks `text` whole as a start would, then puts it in place of the
    /// file atomically (a sibling written and synced, then renamed over it).
    /// The warnings a start would log (unknown keys).
    ///
    /// # Errors
    /// [`ConfigSaveError::Invalid`] when the text would not load (nothing is
    /// written); [`ConfigSaveError::Write`] when it could not be written.
    fn save(&self, text: &str) -> Result<Vec<String>, ConfigSaveError>;
}

/// The config file as it is on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigFileText {
    pub path: PathBuf,
    /// `None` when the file does not exist.
    pub text: Option<String>,
}

/// Why a text was not saved.
#[derive(Debug, thiserror::Error)]
pub enum ConfigSaveError {
    /// The text would not load; it is not written.
    #[error("{0}")]
    Invalid(ConfigError),
    /// The text is good but writing it failed.
    #[error("cannot write the config file: {0}")]
    Write(std::io::Error),
}

/// `GET /v1/config`: the config in force, its generation, the edits waiting
/// for a restart and the last refused one.
#[utoipa::path(
    get,
    path = "/v1/config",
    tag = "config",
    responses((status = 200, description = "The config in force.", body = Config), Errors)
)]
pub(super) async fn get(State(state): State<ApiState>) -> Json<Config> {
    let report = state.config.get();
    let pending_restart = report
        .pending_restart
        .iter()
        .map(|p| PendingRestart {
            file: p.file.clone(),
            key: p.key.clone(),
            running: p.running.clone(),
        })
        .collect();
    let rejected =
        report.rejected.as_ref().map(|r| Rejected { at_ms: r.at_ms, error: r.error.clone() });
    Json(Config {
        effective: report.effective.clone(),
        file_missing: report.missing,
        generation: report.generation,
        pending_restart,
        rejected,
    })
}

fn editor(state: &ApiState) -> Result<std::sync::Arc<dyn ConfigEditor>, ApiError> {
    state
        .config_file
        .clone()
        .ok_or_else(|| ApiError::NotFound("this gateway has no config file to edit".to_owned()))
}

/// `GET /v1/config/file`: config.toml as written (comments kept; inline
/// secrets too, so only the token holder sees it).
#[utoipa::path(
    get,
    path = "/v1/config/file",
    tag = "config",
    responses(
        (status = 200, description = "config.toml as written.", body = ConfigFile),
        (status = 404, description = "This gateway has no config file.", body = ErrorBody),
        Errors,
    )
)]
pub(super) async fn file(State(state): State<ApiState>) -> Result<Json<ConfigFile>, ApiError> {
    let editor = editor(&state)?;
    let read = tokio::task::spawn_blocking(move || editor.read())
        .await
        .map_err(|e| ApiError::Internal(format!("config read task: {e}")))?
        .map_err(|e| ApiError::Internal(format!("cannot read the config file: {e}")))?;
    Ok(Json(ConfigFile {
        exists: read.text.is_some(),
        path: read.path.display().to_string(),
        text: read.text.unwrap_or_default(),
    }))
}

/// The body of `PUT /v1/config`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
pub(super) struct PutBody {
    /// The whole config.toml.
    text: Option<String>,
}

/// `PUT /v1/config`: checks the whole config.toml as a start would, then
/// writes it in one rename; the gateway's watch applies it.
///
/// `200 {"saved": true, "path", "warnings"}` once written, `422 {"error",
/// "line", "column"}` when the text would not load (`line` and `column` are
/// `null` when the problem has no place); nothing is written then.
#[utoipa::path(
    put,
    path = "/v1/config",
    tag = "config",
    request_body = PutBody,
    responses(
        (status = 200, description = "Checked and written.", body = ConfigSaved),
        (status = 404, description = "This gateway has no config file.", body = ErrorBody),
        (status = 422, description = "Refused, with where.", body = ConfigRefused),
        Errors,
    )
)]
pub(super) async fn put(
    State(state): State<ApiState>,
    JsonBody(body): JsonBody<PutBody>,
) -> Result<Response, ApiError> {
    let editor = editor(&state)?;
    let text = body.text.ok_or_else(|| {
        ApiError::BadRequest("text is required: the whole config.toml".to_owned())
    })?;
    let path = editor.read().map(|read| read.path).ok();
    let saved = tokio::task::spawn_blocking(move || editor.save(&text))
        .await
        .map_err(|e| ApiError::Internal(format!("config save task: {e}")))?;
    match saved {
        Ok(warnings) => {
            let path = path.map(|p| p.display().to_string());
            let body = ConfigSaved { path, saved: true, warnings };
            Ok((StatusCode::OK, Json(body)).into_response())
        }
        Err(ConfigSaveError::Invalid(error)) => {
            let at = error.position();
            let body = ConfigRefused {
                column: at.map(|at| at.column),
                error: error.to_string(),
                line: at.map(|at| at.line),
            };
            Ok((StatusCode::UNPROCESSABLE_ENTITY, Json(body)).into_response())
        }
        Err(error @ ConfigSaveError::Write(_)) => Err(ApiError::Internal(error.to_string())),
    }
}
