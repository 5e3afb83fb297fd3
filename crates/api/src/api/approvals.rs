//! `GET /v1/approvals`: the tool calls waiting for the owner's answer, oldest
//! first. `POST /v1/approvals/{id}` with `{"decision": "approve" | "deny" | "always"}`
//! answers one: `200` with the request; `404` for an id never seen; `409`
//! when it was answered, expired or withdrawn before, saying which.

use axum::extract::{Path, State};
use axum::Json;
use lemon_core::approvals::{AnswerError, Reply};
use serde::{Deserialize, Serialize};

use super::ApiState;
use crate::error::{ApiError, JsonBody};
use crate::openapi::Errors;

/// `GET /v1/approvals`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub(crate) struct Approvals {
    /// Oldest first.
    pub(crate) approvals: Vec<PendingApproval>,
}

/// A tool call waiting for the owner's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub(crate) struct PendingApproval {
    /// Four digits, unique among the requests waiting: what a reply by text
    /// names (`yes 4821`).
    pub(crate) code: String,
    /// Unanswered by then (ms since the epoch), the call is denied.
    pub(crate) expires_at_ms: i64,
    /// `apr_…`.
    pub(crate) id: String,
    pub(crate) requested_at_ms: i64,
    /// The rule that asked (`untrusted: …` for a rule of untrusted runs).
    pub(crate) rule: String,
    pub(crate) run_id: String,
    pub(crate) session_key: String,
    /// The command, resolved path or host, cut to 400 characters.
    pub(crate) subject: String,
    /// The tool the run wants to call (`bash`, `write`, `fetch`…).
    pub(crate) tool: String,
    /// Where the run's untrusted text came from (`webhook ci`, `email from
    /// ann@example.com`, `a page fetched from example.com`); absent for a
    /// run of the owner's own words.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) untrusted: Option<String>,
}

impl From<lemon_core::approvals::PendingApproval> for PendingApproval {
    fn from(pending: lemon_core::approvals::PendingApproval) -> Self {
        PendingApproval {
            code: pending.code,
            expires_at_ms: pending.expires_at_ms,
            id: pending.id,
            requested_at_ms: pending.requested_at_ms,
            rule: pending.rule,
            run_id: pending.run_id,
            session_key: pending.session_key,
            subject: pending.subject,
            tool: pending.tool,
            untrusted: pending.untrusted,
        }
    }
}

/// `POST /v1/approvals/{id}`: the request, answered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub(crate) struct Approval {
    pub(crate) approval: PendingApproval,
    /// Who answered: `api`, for an answer through this route.
    pub(crate) by: String,
    /// `approve`, `deny` or `always`.
    pub(crate) decision: String,
}

/// `GET /v1/approvals`: the calls waiting for an answer, oldest first.
#[utoipa::path(
    get,
    path = "/v1/approvals",
    tag = "approvals",
    responses((status = 200, description = "The calls waiting for an answer.", body = Approvals), Errors)
)]
pub(super) async fn list(State(state): State<ApiState>) -> Json<Approvals> {
    let approvals = state.approvals.pending().into_iter().map(PendingApproval::from).collect();
    Json(Approvals { approvals })
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

/// `POST /v1/approvals/{id}`: answers a waiting call.
#[utoipa::path(
    post,
    path = "/v1/approvals/{id}",
    tag = "approvals",
    params(("id" = String, Path, description = "The request's id (`apr_…`).")),
    request_body = Decide,
    responses((status = 200, description = "The request, answered.", body = Approval), Errors)
)]
pub(super) async fn decide(
    State(state): State<ApiState>,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<Decide>,
) -> Result<Json<Approval>, ApiError> {
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
        Ok(request) => Ok(Json(Approval {
            approval: request.into(),
            by: "api".to_owned(),
            decision: body.decision,
        })),
        Err(err @ AnswerError::NotFound(_)) => Err(ApiError::NotFound(err.to_string())),
        Err(err @ AnswerError::Settled { .. }) => Err(ApiError::Conflict(err.to_string())),
    }
}
