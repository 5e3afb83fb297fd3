//! The one error type of the HTTP edge, and extractors whose rejections use it.
//!
//! Every error response is JSON `{"error": "..."}` with a fitting status, so
//! clients never have to parse axum's plain-text rejection bodies. Errors caused by
//! bad input are not logged; internal errors are logged once, here, with their
//! detail, and the response body stays generic.

use axum::extract::rejection::{BytesRejection, PathRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use lemon_core::gateway::{ShuttingDown, SubmitError};
use lemon_core::store::StoreError;
use serde::de::DeserializeOwned;

/// Largest request body accepted, in bytes.
pub const MAX_BODY_BYTES: usize = 1024 * 1024;

/// An HTTP error with its JSON body.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApiError {
    #[error("missing or invalid bearer token")]
    Unauthorized,
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    NotFound(String),
    #[error("method not allowed")]
    MethodNotAllowed,
    #[error("{0}")]
    Conflict(String),
    #[error("request body is larger than {MAX_BODY_BYTES} bytes")]
    PayloadTooLarge,
    /// The body is not JSON by its `content-type` (or has none).
    #[error("request body must be JSON: send content-type: application/json")]
    UnsupportedMediaType,
    /// Too much work is waiting; the client should retry later.
    #[error("the gateway is overloaded: {pending} requests are already waiting")]
    Overloaded { pending: usize },
    /// The conversation's queue is full (`[gateway.queue] cap`); the client
    /// should retry once a run of it has finished.
    #[error("this conversation already has {cap} requests waiting; try again once one has run")]
    QueueFull { cap: usize },
    #[error("the gateway is shutting down")]
    ShuttingDown,
    /// The request could not be written to the store (its disk is full, its
    /// file is locked by another process): nothing was accepted, and the client
    /// can try again. The detail is logged, not sent.
    #[error("the request could not be stored; try again later")]
    StoreUnavailable(String),
    /// Something failed on our side; the detail is logged, not sent.
    #[error("internal error")]
    Internal(String),
}

impl ApiError {
    /// `404 {"error":"not found"}`, for unknown routes.
    pub fn route_not_found() -> Self {
        ApiError::NotFound("not found".to_owned())
    }

    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::Unauthorized => StatusCode::UNAUTHORIZED,
            ApiError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::Conflict(_) => StatusCode::CONFLICT,
            ApiError::PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ApiError::Overloaded { .. } | ApiError::QueueFull { .. } => {
                StatusCode::TOO_MANY_REQUESTS
            }
            ApiError::ShuttingDown | ApiError::StoreUnavailable(_) => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        match &self {
            ApiError::Internal(detail) => tracing::error!(error = %detail, "request failed"),
            ApiError::StoreUnavailable(detail) => {
                tracing::warn!(error = %detail, "request refused: the store cannot write");
            }
            _ => {}
        }
        let mut response =
            (self.status(), Json(serde_json::json!({ "error": self.to_string() }))).into_response();
        match self {
            ApiError::Unauthorized => {
                response
                    .headers_mut()
                    .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            }
            ApiError::Overloaded { .. } | ApiError::ShuttingDown => {
                response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            }
            ApiError::StoreUnavailable(_) | ApiError::QueueFull { .. } => {
                response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("5"));
            }
            _ => {}
        }
        response
    }
}

impl From<SubmitError> for ApiError {
    fn from(err: SubmitError) -> Self {
        match err {
            SubmitError::ShuttingDown => ApiError::ShuttingDown,
            SubmitError::UnknownEngine { engine } => {
                ApiError::BadRequest(format!("unknown engine {engine:?}"))
            }
            SubmitError::DuplicateRunId { run_id } => {
                ApiError::Conflict(format!("run id {run_id} is already in use"))
            }
            SubmitError::Overloaded { pending } => ApiError::Overloaded { pending },
        }
    }
}

impl From<ShuttingDown> for ApiError {
    fn from(_: ShuttingDown) -> Self {
        ApiError::ShuttingDown
    }
}

impl From<StoreError> for ApiError {
    fn from(err: StoreError) -> Self {
        ApiError::Internal(format!("store: {err}"))
    }
}

impl From<BytesRejection> for ApiError {
    fn from(rejection: BytesRejection) -> Self {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::PayloadTooLarge
        } else {
            ApiError::BadRequest(format!("could not read request body: {}", rejection.body_text()))
        }
    }
}

impl From<QueryRejection> for ApiError {
    fn from(rejection: QueryRejection) -> Self {
        ApiError::BadRequest(rejection.body_text())
    }
}

impl From<PathRejection> for ApiError {
    fn from(rejection: PathRejection) -> Self {
        if rejection.status().is_server_error() {
            ApiError::Internal(rejection.body_text())
        } else {
            ApiError::BadRequest(rejection.body_text())
        }
    }
}

/// A JSON request body: `content-type` must be `application/json` or a `+json`
/// type (`application/merge-patch+json`), parameters such as `; charset=utf-8`
/// allowed; any other type, or none with a non-empty body, is a 415. Every
/// failure maps to [`ApiError`], and a body over the router's limit is a 413.
#[derive(Debug, Clone, Copy, Default)]
pub struct JsonBody<T>(pub T);

impl<S, T> FromRequest<S> for JsonBody<T>
where
    S: Send + Sync,
    T: DeserializeOwned,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let declared = match req.headers().get(header::CONTENT_TYPE) {
            Some(value) => Some(value.to_str().map_err(|_| ApiError::UnsupportedMediaType)?),
            None => None,
        };
        if declared.is_some_and(|value| !is_json_content_type(value)) {
            return Err(ApiError::UnsupportedMediaType);
        }
        let undeclared = declared.is_none();
        let bytes = axum::body::Bytes::from_request(req, state).await?;
        if undeclared && !bytes.is_empty() {
            return Err(ApiError::UnsupportedMediaType);
        }
        serde_json::from_slice(&bytes)
            .map(JsonBody)
            .map_err(|err| ApiError::BadRequest(format!("invalid JSON body: {err}")))
    }
}

/// Whether a `content-type` value names JSON: `application/json` or
/// `application/<anything>+json`, any case, with or without parameters.
pub fn is_json_content_type(value: &str) -> bool {
    let essence = value.split(';').next().unwrap_or_default().trim();
    let Some((kind, subtype)) = essence.split_once('/') else {
        return false;
    };
    let subtype = subtype.to_ascii_lowercase();
    kind.eq_ignore_ascii_case("application")
        && (subtype == "json" || (subtype.len() > "+json".len() && subtype.ends_with("+json")))
}

/// Query parameters, with rejections mapped to [`ApiError`].
#[derive(Debug, Clone, Copy, Default)]
pub struct QueryParams<T>(pub T);

impl<S, T> FromRequestParts<S> for QueryParams<T>
where
    S: Send + Sync,
    T: DeserializeOwned,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let axum::extract::Query(value) =
            axum::extract::Query::<T>::from_request_parts(parts, state).await?;
        Ok(QueryParams(value))
    }
}

/// Path parameters, with rejections mapped to [`ApiError`].
#[derive(Debug, Clone, Copy, Default)]
pub struct PathParams<T>(pub T);

impl<S, T> FromRequestParts<S> for PathParams<T>
where
    S: Send + Sync,
    T: DeserializeOwned + Send,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let axum::extract::Path(value) =
            axum::extract::Path::<T>::from_request_parts(parts, state).await?;
        Ok(PathParams(value))
    }
}

/// Fallback for unknown routes.
pub async fn not_found() -> ApiError {
    ApiError::route_not_found()
}

/// Fallback for known routes called with the wrong method.
pub async fn method_not_allowed() -> ApiError {
    ApiError::MethodNotAllowed
}

#[cfg(test)]
mod tests;
