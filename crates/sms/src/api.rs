//! The SMS routes of the control API, merged behind its bearer token and
//! JSON errors (`lemon_api::api::router_with`):
//!
//! - `GET /v1/sms/messages`: the inbox, newest first, with the filters of
//!   `sms_list_messages` as query parameters (`limit`, `since_ms`, `to`,
//!   `from_contains`, `body_contains`, `include_claimed`, `claimed_by`);
//! - `POST /v1/sms/messages/{sid}/claim` with `{"session"}`: `409` when
//!   another session has it;
//! - `POST /v1/sms/send` with `{"to", "body"}`: texted through Twilio (with
//!   retries) and recorded; `503` without Twilio credentials, `502` when
//!   Twilio refuses it.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use lemon_api::error::{ApiError, JsonBody, PathParams, QueryParams};
use lemon_api::openapi::Errors;
use lemon_core::ids::SessionKey;
use lemon_core::sms::{ListFilter, SmsError, SmsInbox, SmsMessage};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::inbox::StoreInbox;
use crate::send::{SmsSendError, SmsSender};

/// The most messages one listing returns.
const MAX_LIMIT: usize = 500;

#[derive(Clone)]
struct ApiState {
    inbox: Arc<StoreInbox>,
    sender: Option<SmsSender>,
}

/// The description of these routes, merged into the control API's
/// (`lemon_api::openapi::merge`).
#[derive(utoipa::OpenApi)]
#[openapi(paths(list, claim, send))]
pub(crate) struct SmsDoc;

/// A message in the inbox.
#[derive(Debug, utoipa::ToSchema)]
#[allow(dead_code)] // The shape of `message_json`, for the document only.
struct Message {
    message_sid: String,
    account_sid: Option<String>,
    to: String,
    from: String,
    body: String,
    /// The one-time codes found in the body.
    codes: Vec<String>,
    received_at_ms: u64,
    claimed_by: Option<String>,
    claimed_at_ms: Option<u64>,
}

/// `GET /v1/sms/messages`.
#[derive(Debug, utoipa::ToSchema)]
#[allow(dead_code)] // The shape of the handler's JSON, for the document only.
struct Messages {
    count: u64,
    /// Newest first.
    messages: Vec<Message>,
}

/// `POST /v1/sms/messages/{sid}/claim`.
#[derive(Debug, utoipa::ToSchema)]
#[allow(dead_code)] // The shape of the handler's JSON, for the document only.
struct Claimed {
    ok: bool,
    message_sid: String,
    claimed_by: String,
}

/// `POST /v1/sms/send`.
#[derive(Debug, utoipa::ToSchema)]
#[allow(dead_code)] // The shape of the handler's JSON, for the document only.
struct Sent {
    /// Twilio's MessageSid.
    sid: String,
    status: String,
    to: String,
}

/// The routes, for `router_with`.
pub(crate) fn routes(inbox: Arc<StoreInbox>, sender: Option<SmsSender>) -> Router {
    Router::new()
        .route("/v1/sms/messages", get(list))
        .route("/v1/sms/messages/{sid}/claim", post(claim))
        .route("/v1/sms/send", post(send))
        .with_state(ApiState { inbox, sender })
}

/// A message's one JSON form (the API's and the tools' `details`).
pub fn message_json(message: &SmsMessage) -> Value {
    json!({
        "message_sid": message.message_sid,
        "account_sid": message.account_sid,
        "to": message.to,
        "from": message.from,
        "body": message.body,
        "codes": message.codes,
        "received_at_ms": message.received_at_ms,
        "claimed_by": message.claimed_by,
        "claimed_at_ms": message.claimed_at_ms,
    })
}

fn inbox_error(error: SmsError) -> ApiError {
    match error {
        SmsError::NotFound { .. } => ApiError::NotFound(error.to_string()),
        SmsError::AlreadyClaimed { .. } => ApiError::Conflict(error.to_string()),
        SmsError::Timeout => ApiError::Internal(error.to_string()),
        SmsError::Unavailable(reason) => ApiError::Internal(reason),
    }
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct ListQuery {
    /// 1 to 500; 20 unless given.
    limit: Option<usize>,
    since_ms: Option<u64>,
    to: Option<String>,
    from_contains: Option<String>,
    body_contains: Option<String>,
    #[serde(default)]
    include_claimed: bool,
    claimed_by: Option<String>,
}

fn nonblank(value: Option<String>) -> Option<String> {
    value.map(|v| v.trim().to_owned()).filter(|v| !v.is_empty())
}

#[utoipa::path(
    get,
    path = "/v1/sms/messages",
    tag = "sms",
    params(ListQuery),
    responses((status = 200, description = "The inbox, newest first.", body = Messages), Errors)
)]
async fn list(
    State(state): State<ApiState>,
    QueryParams(query): QueryParams<ListQuery>,
) -> Result<Json<Value>, ApiError> {
    let limit = query.limit.unwrap_or(20);
    if limit == 0 || limit > MAX_LIMIT {
        return Err(ApiError::BadRequest(format!("limit must be 1 to {MAX_LIMIT}")));
    }
    let filter = ListFilter {
        limit,
        since_ms: query.since_ms,
        to: nonblank(query.to),
        from_contains: nonblank(query.from_contains),
        body_contains: query.body_contains.filter(|b| !b.is_empty()),
        include_claimed: query.include_claimed,
        claimed_by: nonblank(query.claimed_by),
    };
    let messages = state.inbox.list_messages(filter).await.map_err(inbox_error)?;
    let messages: Vec<Value> = messages.iter().map(message_json).collect();
    Ok(Json(json!({ "count": messages.len(), "messages": messages })))
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct ClaimBody {
    /// The session that takes the message.
    session: String,
}

#[utoipa::path(
    post,
    path = "/v1/sms/messages/{sid}/claim",
    tag = "sms",
    params(("sid" = String, Path, description = "The message's MessageSid.")),
    request_body = ClaimBody,
    responses(
        (status = 200, description = "Claimed by the session.", body = Claimed),
        (status = 404, description = "No such message.", body = lemon_api::openapi::schema::Error),
        (status = 409, description = "Another session has it.", body = lemon_api::openapi::schema::Error),
        Errors,
    )
)]
async fn claim(
    State(state): State<ApiState>,
    PathParams(sid): PathParams<String>,
    JsonBody(body): JsonBody<ClaimBody>,
) -> Result<Json<Value>, ApiError> {
    let session = SessionKey::parse(body.session.trim())
        .map_err(|err| ApiError::BadRequest(err.to_string()))?;
    if session.is_empty() {
        return Err(ApiError::BadRequest("`session` is empty".into()));
    }
    state.inbox.claim_message(&session, &sid).await.map_err(inbox_error)?;
    Ok(Json(json!({ "ok": true, "message_sid": sid, "claimed_by": session.as_str() })))
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct SendBody {
    /// An E.164 number (`+15551234567`).
    to: String,
    body: String,
}

#[utoipa::path(
    post,
    path = "/v1/sms/send",
    tag = "sms",
    request_body = SendBody,
    responses(
        (status = 200, description = "Sent through Twilio and recorded.", body = Sent),
        (status = 502, description = "Twilio refused it.", body = lemon_api::openapi::schema::Error),
        (status = 503, description = "Sending is not configured, or the gateway is shutting down.", body = lemon_api::openapi::schema::Error),
        Errors,
    )
)]
async fn send(State(state): State<ApiState>, JsonBody(body): JsonBody<SendBody>) -> Response {
    let Some(sender) = &state.sender else {
        let message = "SMS sending is not configured: set inbox_number in [gateway.sms] and the \
                       twilio_account_sid and twilio_auth_token secrets";
        return (StatusCode::SERVICE_UNAVAILABLE, Json(json!({ "error": message })))
            .into_response();
    };
    match sender.send(&body.to, &body.body, None).await {
        Ok(sent) => Json(json!({ "sid": sent.sid, "status": sent.status, "to": body.to.trim() }))
            .into_response(),
        Err(SmsSendError::Invalid(message)) => ApiError::BadRequest(message).into_response(),
        Err(SmsSendError::ShuttingDown) => ApiError::ShuttingDown.into_response(),
        Err(error @ SmsSendError::Failed(_)) => {
            (StatusCode::BAD_GATEWAY, Json(json!({ "error": error.to_string() }))).into_response()
        }
    }
}

#[cfg(test)]
mod openapi_tests {
    use std::sync::Arc;

    use lemon_api::openapi::routes;
    use lemon_core::store::StoreHandle;

    use crate::inbox::StoreInbox;

    #[tokio::test]
    async fn every_sms_route_is_in_its_document_and_nothing_else() {
        let inbox = Arc::new(StoreInbox::new(StoreHandle::memory(), None, 60_000));
        let served = routes::served(&super::routes(inbox, None), None).await;
        assert_eq!(served.len(), 3, "{served:#?}");
        assert_eq!(served, routes::documented(&crate::Sms::api_doc()));
    }
}
