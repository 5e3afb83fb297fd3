//! `POST <path>` (default `/email/inbound`): mail pushed by a relay service as
//! JSON, with the token of `inbound_webhook.token_secret` as
//! `Authorization: Bearer <token>` or `X-Lemon-Email-Token`.
//!
//! The body is either the whole mail, `{"raw": "<RFC 5322 text>"}` (or
//! `raw_base64`), or its parts:
//!
//! ```json
//! {"from": "Alice <alice@example.com>", "subject": "Build", "text": "fix it",
//!  "message_id": "<m1@example.com>", "in_reply_to": "<…>", "references": ["<…>"],
//!  "authentication_results": "mx.example.com; dkim=pass header.d=example.com",
//!  "attachments": [{"filename": "log.txt", "content_type": "text/plain",
//!                   "content_base64": "…"}]}
//! ```
//!
//! Answers: `202 {"run_id", "status": "accepted" | "duplicate"}`; `401` for a
//! wrong token (nothing of the body is read, nothing started); `413` for a body
//! over 40 MiB (judged by its `Content-Length` before reading, and by what
//! arrives otherwise); `403` for a sender that gets no run (the same checks as
//! mail from IMAP: one `From` address, only `authserv_id`'s
//! `authentication_results`, an aligned pass); `400`/`415`/`422` for a body
//! that is not a mail.
//!
//! The body is parsed straight into the mail's fields (no JSON tree of it),
//! nested at most [`lemon_api::error::MAX_JSON_DEPTH`] levels, so a request
//! costs about twice its size while it is read and decoded.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use base64::Engine as _;
use lemon_api::error::{is_json_content_type, parse_json, read_body, ApiError};
use serde::Deserialize;
use serde_json::json;
use subtle::ConstantTimeEq;

use super::message::{self, InboundMail, MailAttachment};
use super::service::{Handled, Mailer};

/// Largest body: a mail with attachments (25 MiB, the most common providers'
/// cap), base64-encoded, with room for its text.
const MAX_BODY_BYTES: usize = 40 * 1024 * 1024;

#[derive(Clone)]
struct HookState {
    mailer: Arc<Mailer>,
    token: Arc<str>,
}

/// The router of the inbound webhook at `path`.
pub(super) fn router(mailer: Arc<Mailer>, path: &str, token: String) -> Router {
    Router::new()
        .route(path, post(receive))
        .method_not_allowed_fallback(lemon_api::error::method_not_allowed)
        .fallback(lemon_api::error::not_found)
        .with_state(HookState { mailer, token: token.into() })
}

/// The mail a relay posts.
#[derive(Debug, Deserialize)]
struct PostedMail {
    #[serde(default)]
    raw: Option<String>,
    #[serde(default)]
    raw_base64: Option<String>,
    #[serde(default)]
    from: Option<String>,
    #[serde(default)]
    subject: Option<String>,
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    message_id: Option<String>,
    #[serde(default)]
    in_reply_to: Option<String>,
    #[serde(default)]
    references: Option<References>,
    #[serde(default)]
    authentication_results: Option<String>,
    #[serde(default)]
    attachments: Vec<PostedAttachment>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum References {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Deserialize)]
struct PostedAttachment {
    filename: String,
    #[serde(default)]
    content_type: Option<String>,
    content_base64: String,
}

fn token_ok(headers: &HeaderMap, token: &str) -> bool {
    let given = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .or_else(|| headers.get("x-lemon-email-token").and_then(|v| v.to_str().ok()));
    given.is_some_and(|given| bool::from(given.trim().as_bytes().ct_eq(token.as_bytes())))
}

async fn receive(State(state): State<HookState>, headers: HeaderMap, body: Body) -> Response {
    // The token first: without it nothing of the body is read. The body is
    // taken as a stream, so no extractor reads it before this check.
    if !token_ok(&headers, &state.token) {
        return ApiError::Unauthorized.into_response();
    }
    let declared = headers.get(header::CONTENT_TYPE).map(|value| value.to_str().unwrap_or(""));
    if declared.is_some_and(|value| !is_json_content_type(value)) {
        return ApiError::UnsupportedMediaType.into_response();
    }
    let bytes = match read_body(&headers, body, MAX_BODY_BYTES).await {
        Ok(bytes) => bytes,
        Err(error) => return error.into_response(),
    };
    if declared.is_none() && !bytes.is_empty() {
        return ApiError::UnsupportedMediaType.into_response();
    }
    let posted: PostedMail = match parse_json(&bytes) {
        Ok(posted) => posted,
        Err(error) => {
            return ApiError::BadRequest(format!("invalid mail: {error}")).into_response()
        }
    };
    drop(bytes);
    let mail = match to_mail(posted) {
        Ok(mail) => mail,
        Err(message) => {
            return (StatusCode::UNPROCESSABLE_ENTITY, Json(json!({ "error": message })))
                .into_response()
        }
    };
    match state.mailer.handle(mail).await {
        Handled::Accepted(run_id) => {
            (StatusCode::ACCEPTED, Json(json!({ "run_id": run_id.as_str(), "status": "accepted" })))
                .into_response()
        }
        Handled::Answered(run_id) => {
            (StatusCode::ACCEPTED, Json(json!({ "run_id": run_id.as_str(), "status": "answered" })))
                .into_response()
        }
        Handled::Duplicate(run_id) => (
            StatusCode::ACCEPTED,
            Json(json!({ "run_id": run_id.as_str(), "status": "duplicate" })),
        )
            .into_response(),
        Handled::Refused(refusal) => {
            (StatusCode::FORBIDDEN, Json(json!({ "error": refusal.as_str() }))).into_response()
        }
        Handled::NotAccepted(reason) => {
            (StatusCode::SERVICE_UNAVAILABLE, Json(json!({ "error": reason }))).into_response()
        }
    }
}

fn to_mail(posted: PostedMail) -> Result<InboundMail, String> {
    let b64 = base64::engine::general_purpose::STANDARD;
    let raw = match (&posted.raw, &posted.raw_base64) {
        (Some(raw), _) => Some(raw.as_bytes().to_vec()),
        (None, Some(encoded)) => {
            Some(b64.decode(encoded.trim()).map_err(|e| format!("raw_base64: {e}"))?)
        }
        (None, None) => None,
    };
    if let Some(raw) = raw {
        return message::parse(&raw).ok_or_else(|| "raw: not a mail".to_owned());
    }
    let from = posted.from.as_deref().ok_or("from: missing")?;
    let from = super::config::parse_address(from).ok_or("from: not an address")?;
    let clean = |id: &str| id.trim().trim_start_matches('<').trim_end_matches('>').to_owned();
    let references = match posted.references {
        Some(References::One(text)) => text.split_whitespace().map(clean).collect(),
        Some(References::Many(list)) => list.iter().map(|id| clean(id)).collect(),
        None => Vec::new(),
    };
    let mut attachments = Vec::new();
    for attachment in posted.attachments.iter().take(20) {
        let content = b64
            .decode(attachment.content_base64.trim())
            .map_err(|e| format!("attachments: {}: {e}", attachment.filename))?;
        attachments.push(MailAttachment {
            filename: message::safe_filename(&attachment.filename),
            mime: attachment
                .content_type
                .clone()
                .unwrap_or_else(|| "application/octet-stream".to_owned())
                .to_ascii_lowercase(),
            content,
        });
    }
    let text = posted.text.unwrap_or_default();
    let subject = posted.subject.unwrap_or_default();
    let message_id = posted.message_id.as_deref().map(clean).filter(|id| !id.is_empty());
    let message_id = message_id.ok_or("message_id: missing (relays pass the mail's Message-ID)")?;
    Ok(InboundMail {
        message_id,
        in_reply_to: posted
            .in_reply_to
            .as_deref()
            .map(clean)
            .into_iter()
            .filter(|id| !id.is_empty())
            .collect(),
        references,
        from: Some(from),
        subject: subject.trim().to_owned(),
        text: message::strip_reply(&text),
        attachments,
        auth: posted
            .authentication_results
            .as_deref()
            .and_then(message::parse_auth_results)
            .into_iter()
            .collect(),
        automatic: false,
    })
}
