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
use serde::Deserialize;
use serde_json::{json, Value};

use super::ApiState;
use crate::error::{ApiError, JsonBody};
use crate::openapi::{schema, Errors};

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

#[utoipa::path(
    get,
    path = "/v1/config",
    tag = "config",
    responses((status = 200, description = "The config in force.", body = schema::Config), Errors)
)]
pub(super) async fn get(State(state): State<ApiState>) -> Json<Value> {
    let report = state.config.get();
    let pending: Vec<Value> = report
        .pending_restart
        .iter()
        .map(|p| json!({ "key": p.key, "running": p.running, "file": p.file }))
        .collect();
    let rejected = report.rejected.as_ref().map(|r| json!({ "error": r.error, "at_ms": r.at_ms }));
    Json(json!({
        "generation": report.generation,
        "effective": report.effective,
        "pending_restart": pending,
        "rejected": rejected,
        "file_missing": report.missing,
    }))
}

fn editor(state: &ApiState) -> Result<std::sync::Arc<dyn ConfigEditor>, ApiError> {
    state
        .config_file
        .clone()
        .ok_or_else(|| ApiError::NotFound("this gateway has no config file to edit".to_owned()))
}

/// `GET /v1/config/file`: `{"path", "exists", "text"}`, the text as written
/// (comments kept; inline secrets too, so only the token holder sees it).
#[utoipa::path(
    get,
    path = "/v1/config/file",
    tag = "config",
    responses(
        (status = 200, description = "config.toml as written.", body = schema::ConfigFile),
        (status = 404, description = "This gateway has no config file.", body = schema::Error),
        Errors,
    )
)]
pub(super) async fn file(State(state): State<ApiState>) -> Result<Json<Value>, ApiError> {
    let editor = editor(&state)?;
    let read = tokio::task::spawn_blocking(move || editor.read())
        .await
        .map_err(|e| ApiError::Internal(format!("config read task: {e}")))?
        .map_err(|e| ApiError::Internal(format!("cannot read the config file: {e}")))?;
    Ok(Json(json!({
        "path": read.path.display().to_string(),
        "exists": read.text.is_some(),
        "text": read.text.unwrap_or_default(),
    })))
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
pub(super) struct PutBody {
    /// The whole config.toml.
    text: Option<String>,
}

/// `PUT /v1/config` with `{"text"}`: `200 {"saved": true, "path", "warnings"}`
/// once written, `422 {"error", "line", "column"}` when the text would not
/// load (`line` and `column` are `null` when the problem has no place).
#[utoipa::path(
    put,
    path = "/v1/config",
    tag = "config",
    request_body = PutBody,
    responses(
        (status = 200, description = "Checked and written.", body = schema::ConfigSaved),
        (status = 404, description = "This gateway has no config file.", body = schema::Error),
        (status = 422, description = "Refused, with where.", body = schema::ConfigRefused),
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
            let body = json!({ "saved": true, "path": path, "warnings": warnings });
            Ok((StatusCode::OK, Json(body)).into_response())
        }
        Err(ConfigSaveError::Invalid(error)) => {
            let at = error.position();
            let body = json!({
                "error": error.to_string(),
                "line": at.map(|at| at.line),
                "column": at.map(|at| at.column),
            });
            Ok((StatusCode::UNPROCESSABLE_ENTITY, Json(body)).into_response())
        }
        Err(error @ ConfigSaveError::Write(_)) => Err(ApiError::Internal(error.to_string())),
    }
}
