//! The one error type of the HTTP edge, extractors whose rejections use it,
//! and the bounded reading and parsing every listener's bodies go through.
//!
//! Bodies are bounded twice before they cost memory: a request whose
//! `Content-Length` is over its listener's limit is refused before a byte of
//! it is read ([`declared_too_large`]), and one without a length is read only
//! up to the limit ([`read_body`]). JSON is parsed with a depth bound
//! ([`MAX_JSON_DEPTH`], checked by a scan of the bytes before serde sees them),
//! so per-request memory follows the limit and nesting cannot exhaust the stack.
//! Each listener checks its token or signature header before it calls these.
//!
//! Every error response is JSON `{"error": "..."}` with a fitting status, so
//! clients never have to parse axum's plain-text rejection bodies. Errors caused by
//! bad input are not logged; internal errors are logged once, here, with their
//! detail, and the response body stays generic.

use axum::body::{Body, Bytes};
use axum::extract::rejection::{BytesRejection, PathRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use lemon_core::gateway::{ShuttingDown, SubmitError};
use lemon_core::store::StoreError;
use serde::de::DeserializeOwned;

/// Largest request body accepted, in bytes.
pub const MAX_BODY_BYTES: usize = 1024 * 1024;

/// Deepest nesting of arrays and objects a JSON body may have. serde_json
/// stops at 128 by itself; the bound is stated here, lower, and checked
/// before parsing, so every listener answers a deeper body with the same
/// `400` and no parse ever recurses further.
pub const MAX_JSON_DEPTH: usize = 64;

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
    /// The body is longer than the route's limit ([`MAX_BODY_BYTES`], more on
    /// the routes that take files).
    #[error("request body is larger than {limit} bytes")]
    PayloadTooLarge { limit: usize },
    /// A file sent with the request was refused; nothing of it was accepted.
    #[error(transparent)]
    Attachment(crate::files::AttachmentError),
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

/// `{"error": "..."}`: the body of every refusal of the control API, and of
/// every listener that answers with the same errors.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
pub struct ErrorBody {
    /// What went wrong, for a person.
    pub error: String,
}

impl ErrorBody {
    /// `{"error": message}`.
    pub fn new(message: impl Into<String>) -> Self {
        ErrorBody { error: message.into() }
    }
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
            ApiError::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::Attachment(err) => err.status(),
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
        let mut response = (self.status(), Json(ErrorBody::new(self.to_string()))).into_response();
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
            // The routes that read bodies this way have the default limit.
            ApiError::PayloadTooLarge { limit: MAX_BODY_BYTES }
        } else {
            ApiError::BadRequest(format!("could not read request body: {}", rejection.body_text()))
        }
    }
}

impl From<crate::files::AttachmentError> for ApiError {
    /// A file that could not be saved is the gateway's fault: logged, and
    /// answered as an internal error.
    fn from(err: crate::files::AttachmentError) -> Self {
        if err.is_internal() {
            ApiError::Internal(err.to_string())
        } else {
            ApiError::Attachment(err)
        }
    }
}

impl From<BodyError> for ApiError {
    fn from(err: BodyError) -> Self {
        match err {
            BodyError::TooLarge { limit } => ApiError::PayloadTooLarge { limit },
            BodyError::Unreadable(_) => ApiError::BadRequest(err.to_string()),
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
        parse_json(&bytes).map(JsonBody).map_err(|err| ApiError::BadRequest(err.to_string()))
    }
}

/// A JSON body of at most `limit` bytes, as [`JsonBody`] takes it (the same
/// content-type rules), for a route whose limit is not the router's.
///
/// # Errors
/// `415` for a body that is not JSON by its type, `413` past `limit`, `400`
/// for one that does not parse as a `T`.
pub async fn read_json<T: DeserializeOwned>(
    headers: &HeaderMap,
    body: Body,
    limit: usize,
) -> Result<T, ApiError> {
    let declared = match headers.get(header::CONTENT_TYPE) {
        Some(value) => Some(value.to_str().map_err(|_| ApiError::UnsupportedMediaType)?),
        None => None,
    };
    if declared.is_some_and(|value| !is_json_content_type(value)) {
        return Err(ApiError::UnsupportedMediaType);
    }
    let bytes = read_body(headers, body, limit).await?;
    if declared.is_none() && !bytes.is_empty() {
        return Err(ApiError::UnsupportedMediaType);
    }
    parse_json(&bytes).map_err(|err| ApiError::BadRequest(err.to_string()))
}

/// Why a JSON body was not parsed.
#[derive(Debug, thiserror::Error)]
pub enum JsonBodyError {
    /// Arrays and objects nested deeper than [`MAX_JSON_DEPTH`].
    #[error("invalid JSON body: nested deeper than {MAX_JSON_DEPTH} levels")]
    TooDeep,
    /// Not JSON, or not the shape expected.
    #[error("invalid JSON body: {0}")]
    Invalid(#[from] serde_json::Error),
}

/// Parses `bytes` (already bounded in size) as `T`, refusing nesting deeper
/// than [`MAX_JSON_DEPTH`] before serde reads it.
///
/// # Errors
/// Too deep, not JSON, or not a `T`.
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, JsonBodyError> {
    if json_depth_exceeds(bytes, MAX_JSON_DEPTH) {
        return Err(JsonBodyError::TooDeep);
    }
    Ok(serde_json::from_slice(bytes)?)
}

/// Whether arrays and objects in `bytes` nest deeper than `max`, counting
/// brackets outside strings. A scan of the bytes: it never allocates and
/// needs no valid JSON (the parse that follows judges that).
pub fn json_depth_exceeds(bytes: &[u8], max: usize) -> bool {
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    for &byte in bytes {
        if in_string {
            match byte {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match byte {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > max {
                    return true;
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    false
}

/// Whether the request says (`Content-Length`) its body is longer than
/// `limit`: such a request is answered `413` before its body is read.
pub fn declared_too_large(headers: &HeaderMap, limit: usize) -> bool {
    headers
        .get(header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.trim().parse::<u64>().ok())
        .is_some_and(|length| length > limit as u64)
}

/// Why a body was not read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BodyError {
    /// Declared or found longer than the listener's limit.
    #[error("request body is larger than {limit} bytes")]
    TooLarge { limit: usize },
    /// The client stopped sending, or sent a malformed chunk.
    #[error("could not read request body: {0}")]
    Unreadable(String),
}

impl BodyError {
    /// `413` or `400`.
    pub fn status(&self) -> StatusCode {
        match self {
            BodyError::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            BodyError::Unreadable(_) => StatusCode::BAD_REQUEST,
        }
    }
}

impl IntoResponse for BodyError {
    fn into_response(self) -> Response {
        (self.status(), Json(ErrorBody::new(self.to_string()))).into_response()
    }
}

/// Reads a request body of at most `limit` bytes: refused before reading when
/// its `Content-Length` says more, and stopped at the first chunk past the
/// limit otherwise, so it never holds more than `limit` bytes. Callers check
/// the request's credentials first.
///
/// # Errors
/// [`BodyError::TooLarge`] past the limit; [`BodyError::Unreadable`] when the
/// client's body fails.
///
/// # Cancel safety
/// Dropping the future drops what was read.
pub async fn read_body(headers: &HeaderMap, body: Body, limit: usize) -> Result<Bytes, BodyError> {
    use futures::StreamExt as _;
    if declared_too_large(headers, limit) {
        return Err(BodyError::TooLarge { limit });
    }
    let mut stream = body.into_data_stream();
    let mut read = Vec::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|error| BodyError::Unreadable(error.to_string()))?;
        if read.len() + chunk.len() > limit {
            return Err(BodyError::TooLarge { limit });
        }
        read.extend_from_slice(&chunk);
    }
    Ok(Bytes::from(read))
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
