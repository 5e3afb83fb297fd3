//! `POST /webhooks/twilio/sms`: Twilio's inbound messages, checked, stored,
//! and answered with empty TwiML.
//!
//! The signature is checked over the configured `public_url` + the path + the
//! raw query (never the `Host` header), or over `webhook_url` as it is when
//! that is set, and the form parameters of the body only. Unsigned, forged and malformed requests get a 4xx JSON error and
//! store nothing. A duplicate `MessageSid` (Twilio retrying) is answered as
//! success and changes nothing.
//!
//! The signature covers the body, so the body is read, but only once the
//! request carries a signature header (a request without one is a `401`
//! unread), and only up to `max_body_bytes` (64 KiB by default; a longer
//! `Content-Length` is a `413` before reading).

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use serde_json::json;
use tokio_util::task::TaskTracker;

use lemon_transports::access::Access;

use crate::config::{is_e164, SmsConfig, WEBHOOK_PATH};
use crate::inbox::{IngestError, Ingested, StoreInbox};
use crate::reply::Replies;
use crate::signature::{validate_form, SIGNATURE_HEADER};

/// The empty TwiML answer: nothing to send back from the webhook itself.
pub const EMPTY_TWIML: &str = "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Response/>";

/// What the webhook needs.
#[derive(Clone)]
pub(crate) struct HookState {
    pub(crate) config: Arc<SmsConfig>,
    /// Present when signatures are checked (the start refuses otherwise).
    pub(crate) auth_token: Option<Arc<str>>,
    pub(crate) inbox: Arc<StoreInbox>,
    /// Set when `reply_to_allowed` is on.
    pub(crate) replies: Option<Replies>,
    /// Who gets a conversation: `allowed_senders` or `allow_everyone`.
    pub(crate) access: Arc<Access>,
    pub(crate) tracker: TaskTracker,
}

fn error(status: StatusCode, message: &str) -> Response {
    (status, Json(json!({ "error": message }))).into_response()
}

/// The webhook's routes; everything else is a JSON 404 / 405.
pub(crate) fn router(state: HookState) -> Router {
    Router::new()
        .route(WEBHOOK_PATH, post(receive))
        .method_not_allowed_fallback(lemon_api::error::method_not_allowed)
        .fallback(lemon_api::error::not_found)
        .with_state(state)
}

/// The URL Twilio signed: the public URL, the path and the raw query.
fn signed_url(public_url: &str, uri: &Uri) -> String {
    match uri.query() {
        Some(query) => format!("{public_url}{}?{query}", uri.path()),
        None => format!("{public_url}{}", uri.path()),
    }
}

async fn receive(
    State(state): State<HookState>,
    headers: HeaderMap,
    uri: Uri,
    body: Body,
) -> Response {
    // Nothing of the body is read for a request that carries no signature.
    let signature = headers.get(SIGNATURE_HEADER).and_then(|v| v.to_str().ok());
    if state.config.validate_webhook && signature.is_none() {
        return error(StatusCode::UNAUTHORIZED, "missing X-Twilio-Signature");
    }
    let form = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("application/x-www-form-urlencoded"));
    if !form {
        return error(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "send the message as content-type: application/x-www-form-urlencoded",
        );
    }
    let body = match lemon_api::error::read_body(&headers, body, state.config.max_body_bytes).await
    {
        Ok(body) => body,
        Err(refused) => return refused.into_response(),
    };
    let Ok(params) = serde_urlencoded::from_bytes::<Vec<(String, String)>>(&body) else {
        return error(StatusCode::BAD_REQUEST, "the body is not a URL-encoded form");
    };
    if state.config.validate_webhook {
        // The reference's `webhook_url` is the signed URL as it is.
        let url = match (&state.config.webhook_url, &state.config.public_url) {
            (Some(exact), _) => Some(exact.clone()),
            (None, Some(public_url)) => Some(signed_url(public_url, &uri)),
            (None, None) => None,
        };
        let (Some(token), Some(url)) = (&state.auth_token, url) else {
            // The start refuses this; never an open webhook.
            return error(StatusCode::SERVICE_UNAVAILABLE, "SMS signatures cannot be checked");
        };
        let Some(signature) = signature else {
            return error(StatusCode::UNAUTHORIZED, "missing X-Twilio-Signature");
        };
        if !validate_form(token, &url, &params, signature.trim()) {
            tracing::warn!("an SMS webhook with a wrong signature was refused");
            return error(StatusCode::FORBIDDEN, "invalid X-Twilio-Signature");
        }
    }
    let stored = match state.inbox.ingest(&params).await {
        Ok(Ingested::Stored(message)) => message,
        Ok(Ingested::Duplicate) => return twiml(),
        Err(IngestError::Unavailable(reason)) => {
            tracing::warn!(%reason, "SMS not stored");
            return error(StatusCode::SERVICE_UNAVAILABLE, "the SMS inbox is unavailable");
        }
        Err(refused) => return error(StatusCode::BAD_REQUEST, &refused.to_string()),
    };
    tracing::info!(
        message_sid = %stored.message_sid,
        codes = stored.codes.len(),
        "SMS received"
    );
    if let Some(replies) = &state.replies {
        let from = stored.from.clone();
        // A number off the list is kept in the inbox (codes arrive from
        // anyone) but gets no run and no answer.
        let allowed = is_e164(&from)
            && state.access.check(
                state.config.sender_listed(&from),
                "sender",
                &from,
                "allowed_senders",
            );
        let media = crate::media::media_of(&params);
        if allowed && (!stored.body.is_empty() || !media.is_empty()) {
            let replies = replies.clone();
            state.tracker.spawn(async move {
                replies.converse(from, stored.body, stored.message_sid, media).await;
            });
        }
    }
    twiml()
}

fn twiml() -> Response {
    (StatusCode::OK, [(header::CONTENT_TYPE, "text/xml; charset=utf-8")], EMPTY_TWIML)
        .into_response()
}

#[cfg(test)]
mod tests;
