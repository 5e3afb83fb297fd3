//! `/v1/cluster/config`: the cluster config, the keys of `[gateway]` every
//! node of a cluster takes from one versioned row of the database over its
//! own file (see [`lemon_core::config::SharedSettings`]).
//!
//! `GET` answers the row (`version`, `body`, `updated_at_ms`, `updated_by`)
//! and the version this node applied. `PUT` with `{"expected_version",
//! "body"}` checks the body as this node would apply it (the body alone,
//! then merged over this node's config) and writes it only if the row is
//! still at `expected_version`; every node then applies it live. A body that
//! is not TOML is a `400`, one that is refused a `422`, both `{"error",
//! "key", "line", "column"}` (`line` and `column` in the body when the
//! problem is there); a stale `expected_version` is a `409` with the
//! `version` found. Off a cluster both answer `404`.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use lemon_core::cluster::{ClusterError, ClusterNode, SharedConfig};
use lemon_core::config::{ConfigError, SharedSettings};
use serde::Deserialize;
use serde_json::{json, Value};

use super::ApiState;
use crate::error::{ApiError, JsonBody};
use crate::openapi::{schema, Errors};

fn node(state: &ApiState) -> Result<Arc<ClusterNode>, ApiError> {
    state.cluster.clone().ok_or_else(|| ApiError::NotFound("not a cluster node".to_owned()))
}

fn unavailable(error: &ClusterError) -> ApiError {
    ApiError::StoreUnavailable(format!("cluster config: {error}"))
}

fn row_json(row: &SharedConfig, state: &ApiState) -> Value {
    json!({
        "version": row.version,
        "body": row.body,
        "updated_at_ms": row.updated_at_ms,
        "updated_by": row.updated_by.as_ref().map(|node| node.as_str()),
        "applied_version": state.cluster_config.as_ref().map(|c| c.applied.get().version),
    })
}

/// `GET /v1/cluster/config`.
#[utoipa::path(
    get,
    path = "/v1/cluster/config",
    operation_id = "get_cluster_config",
    tag = "cluster",
    responses(
        (status = 200, description = "The cluster config and the version this node applied.", body = schema::ClusterConfig),
        (status = 404, description = "This gateway is not a cluster node.", body = schema::Error),
        Errors,
    )
)]
pub(super) async fn get(State(state): State<ApiState>) -> Result<Json<Value>, ApiError> {
    let node = node(&state)?;
    let row = node.cluster().config().await.map_err(|e| unavailable(&e))?;
    Ok(Json(row_json(&row, &state)))
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
pub(super) struct PutBody {
    /// The version the edit was made from (`version` of `GET`).
    expected_version: Option<i64>,
    /// The new body: TOML with only the cluster-wide keys of `[gateway]`;
    /// `""` leaves every key to the nodes' files.
    body: Option<String>,
}

/// A refused body, placed.
fn refused(error: &ConfigError) -> Response {
    let status = match error {
        ConfigError::Syntax { .. } => StatusCode::BAD_REQUEST,
        _ => StatusCode::UNPROCESSABLE_ENTITY,
    };
    let key = match error {
        ConfigError::Invalid { key, .. } if !key.is_empty() => Some(key.as_str()),
        _ => None,
    };
    let at = error.position();
    let body = json!({
        "error": error.to_string(),
        "key": key,
        "line": at.map(|at| at.line),
        "column": at.map(|at| at.column),
    });
    (status, Json(body)).into_response()
}

/// `PUT /v1/cluster/config` with `{"expected_version", "body"}`.
#[utoipa::path(
    put,
    path = "/v1/cluster/config",
    operation_id = "put_cluster_config",
    tag = "cluster",
    request_body = PutBody,
    responses(
        (status = 200, description = "Checked and written; every node applies it.", body = schema::ClusterConfig),
        (status = 404, description = "This gateway is not a cluster node.", body = schema::Error),
        (status = 409, description = "Another edit came first: the row is at `version`.", body = schema::ClusterConfigConflict),
        (status = 422, description = "Refused, naming the key, with where (a body that is not TOML is a 400 of the same shape).", body = schema::ClusterConfigRefused),
        Errors,
    )
)]
pub(super) async fn put(
    State(state): State<ApiState>,
    JsonBody(request): JsonBody<PutBody>,
) -> Result<Response, ApiError> {
    let node = node(&state)?;
    let expected = request.expected_version.ok_or_else(|| {
        ApiError::BadRequest(
            "expected_version is required: the version the edit was made from".to_owned(),
        )
    })?;
    let body = request.body.ok_or_else(|| {
        ApiError::BadRequest("body is required: the cluster config as TOML".to_owned())
    })?;
    let check = state.cluster_config.as_ref().and_then(|c| c.check.clone());
    let checked = match check {
        Some(check) => check.check(&body).await,
        None => SharedSettings::parse(expected + 1, &body).map(|_| ()),
    };
    if let Err(error) = checked {
        return Ok(refused(&error));
    }
    match node.cluster().put_config(expected, &body).await {
        Ok(version) => {
            tracing::info!(version, node = %node.id(), "cluster config written");
            let row = node.cluster().config().await.map_err(|e| unavailable(&e))?;
            Ok(Json(row_json(&row, &state)).into_response())
        }
        Err(ClusterError::Conflict { expected, found }) => {
            let error = format!(
                "the cluster config is at version {found}, not {expected}: another edit came \
                 first; read it again and edit that"
            );
            Ok((StatusCode::CONFLICT, Json(json!({ "error": error, "version": found })))
                .into_response())
        }
        Err(error) => Err(unavailable(&error)),
    }
}
