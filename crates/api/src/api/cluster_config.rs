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
use serde::{Deserialize, Serialize};

use super::ApiState;
use crate::error::{ApiError, ErrorBody, JsonBody};
use crate::openapi::Errors;

/// `GET` and `PUT /v1/cluster/config`: the cluster config.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[schema(as = ClusterConfig)]
pub(crate) struct ClusterConfigRow {
    /// The version in force on this node.
    #[schema(required = true)]
    pub(crate) applied_version: Option<i64>,
    /// TOML with only the cluster-wide keys of `[gateway]`.
    pub(crate) body: String,
    /// When it was written (ms since the epoch).
    pub(crate) updated_at_ms: i64,
    /// The node that wrote it.
    #[schema(required = true)]
    pub(crate) updated_by: Option<String>,
    /// 0 before anyone wrote it.
    pub(crate) version: i64,
}

/// `400` and `422` of `PUT /v1/cluster/config`: the body is refused, with
/// the key and where in the body (or in the node's file) the problem is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub(crate) struct ClusterConfigRefused {
    /// 1-based column of the problem, when it has a place.
    #[schema(required = true)]
    pub(crate) column: Option<usize>,
    pub(crate) error: String,
    /// The key path (`gateway.api`), when the problem has one.
    #[schema(required = true)]
    pub(crate) key: Option<String>,
    /// 1-based line of the problem, when it has a place.
    #[schema(required = true)]
    pub(crate) line: Option<usize>,
}

/// `409` of `PUT /v1/cluster/config`: another edit came first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub(crate) struct ClusterConfigConflict {
    pub(crate) error: String,
    /// The version the row is at now.
    pub(crate) version: i64,
}

fn node(state: &ApiState) -> Result<Arc<ClusterNode>, ApiError> {
    state.cluster.clone().ok_or_else(|| ApiError::NotFound("not a cluster node".to_owned()))
}

fn unavailable(error: &ClusterError) -> ApiError {
    ApiError::StoreUnavailable(format!("cluster config: {error}"))
}

fn row_of(row: &SharedConfig, state: &ApiState) -> ClusterConfigRow {
    ClusterConfigRow {
        applied_version: state.cluster_config.as_ref().map(|c| c.applied.get().version),
        body: row.body.clone(),
        updated_at_ms: row.updated_at_ms,
        updated_by: row.updated_by.as_ref().map(|node| node.as_str().to_owned()),
        version: row.version,
    }
}

/// `GET /v1/cluster/config`: the cluster config, and the version this node
/// applied.
#[utoipa::path(
    get,
    path = "/v1/cluster/config",
    operation_id = "get_cluster_config",
    tag = "cluster",
    responses(
        (status = 200, description = "The cluster config and the version this node applied.", body = ClusterConfigRow),
        (status = 404, description = "This gateway is not a cluster node.", body = ErrorBody),
        Errors,
    )
)]
pub(super) async fn get(State(state): State<ApiState>) -> Result<Json<ClusterConfigRow>, ApiError> {
    let node = node(&state)?;
    let row = node.cluster().config().await.map_err(|e| unavailable(&e))?;
    Ok(Json(row_of(&row, &state)))
}

/// The body of `PUT /v1/cluster/config`.
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
    let body = ClusterConfigRefused {
        column: at.map(|at| at.column),
        error: error.to_string(),
        key: key.map(str::to_owned),
        line: at.map(|at| at.line),
    };
    (status, Json(body)).into_response()
}

/// `PUT /v1/cluster/config`: writes the cluster config, once checked as
/// this node would apply it, if the row is still at `expected_version`;
/// every node then applies it.
#[utoipa::path(
    put,
    path = "/v1/cluster/config",
    operation_id = "put_cluster_config",
    tag = "cluster",
    request_body = PutBody,
    responses(
        (status = 200, description = "Checked and written; every node applies it.", body = ClusterConfigRow),
        (status = 404, description = "This gateway is not a cluster node.", body = ErrorBody),
        (status = 409, description = "Another edit came first: the row is at `version`.", body = ClusterConfigConflict),
        (status = 422, description = "Refused, naming the key, with where (a body that is not TOML is a 400 of the same shape).", body = ClusterConfigRefused),
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
            Ok(Json(row_of(&row, &state)).into_response())
        }
        Err(ClusterError::Conflict { expected, found }) => {
            let error = format!(
                "the cluster config is at version {found}, not {expected}: another edit came \
                 first; read it again and edit that"
            );
            let body = ClusterConfigConflict { error, version: found };
            Ok((StatusCode::CONFLICT, Json(body)).into_response())
        }
        Err(error) => Err(unavailable(&error)),
    }
}
