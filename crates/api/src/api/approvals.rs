//! `GET /v1/approvals`: the tool calls waiting for the owner's answer, oldest
//! first. `POST /v1/approvals/{id}` with `{"decision": "approve" | "deny" | "always"}`
//! answers one: `200` with the request; `404` for an id never seen; `409`
//! when it was answered, expired or withdrawn before, saying which.

use axum::extract::{Path, State};
use axum::Json;
use lemon_core::approvals::{AnswerError, Reply};
use serde::Deserialize;
use serde_json::{json, Value};

use super::ApiState;
use crate::error::{ApiError, JsonBody};
use crate::openapi::{schema, Errors};

#[utoipa::path(
    get,
    path = "/v1/approvals",
    tag = "approvals",
    responses((status = 200, description = "The calls waiting for an answer.", body = schema::Approvals), Errors)
)]
pub(super) async fn list(State(state): State<ApiState>) -> Json<Value> {
    Json(json!({ "approvals": state.approvals.pending() }))
}

/// The body of `POST /v1/approvals/{id}`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct Decide {
    /// `approve`, `deny`, or `always` (approve, and calls like it in the
    /// request's session run unasked until the gateway stops).
    decision: String,
    /// The surface the answer was given on, as the decision records it:
    /// `api` (the default), `dashboard` or `desktop`. The one answering is
    /// the token's holder either way.
    #[serde(default)]
    via: Option<String>,
}

/// The surfaces a token holder answers from.
const SURFACES: [&str; 3] = ["api", "dashboard", "desktop"];

#[utoipa::path(
    post,
    path = "/v1/approvals/{id}",
    tag = "approvals",
    params(("id" = String, Path, description = "The request's id (`apr_…`).")),
    request_body = Decide,
    responses((status = 200, description = "The request, answered.", body = schema::Approval), Errors)
)]
pub(super) async fn decide(
    State(state): State<ApiState>,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<Decide>,
) -> Result<Json<Value>, ApiError> {
    let reply = match body.decision.as_str() {
        "approve" => Reply::Approve,
        "deny" => Reply::Deny,
        "always" => Reply::Always,
        other => {
            return Err(ApiError::BadRequest(format!(
                "decision must be \"approve\", \"deny\" or \"always\", not {other:?}"
            )))
        }
    };
    let via = match body.via.as_deref() {
        None => "api",
        Some(via) => SURFACES.into_iter().find(|known| *known == via).ok_or_else(|| {
            ApiError::BadRequest(format!(
                "via must be \"api\", \"dashboard\" or \"desktop\", not {via:?}"
            ))
        })?,
    };
    match state.approvals.reply(&id, reply, "api", via) {
        Ok(request) => Ok(Json(json!({
            "approval": request,
            "decision": body.decision,
            "by": "api",
        }))),
        Err(err @ AnswerError::NotFound(_)) => Err(ApiError::NotFound(err.to_string())),
        Err(err @ AnswerError::Settled { .. }) => Err(ApiError::Conflict(err.to_string())),
    }
}
