//! OpenAI's error shape: `{"error": {"message", "type", "param", "code"}}` with
//! the status OpenAI's clients expect, so their own error classes (bad request,
//! authentication, rate limit) are raised.

use crate::error::ApiError;
use axum::http::{header, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use lemon_core::engine::RunError;
use lemon_core::router::RouteError;

/// OpenAI's client retries some statuses by itself unless told not to; a run
/// that was executed and failed is not retried (it would run the agent again).
const SHOULD_RETRY: HeaderName = HeaderName::from_static("x-should-retry");

/// `{"error": {...}}`: every error of the OpenAI-compatible routes, and the
/// last event of a stream whose run failed.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
pub(crate) struct OpenAiErrorBody {
    pub(crate) error: OpenAiErrorDetail,
}

/// OpenAI's error object.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
pub(crate) struct OpenAiErrorDetail {
    /// What OpenAI's clients branch on (`model_not_found`,
    /// `context_length_exceeded`, `rate_limit_exceeded`…), when there is one.
    pub(crate) code: Option<String>,
    /// What went wrong, for a person.
    pub(crate) message: String,
    /// The request field at fault (`model`, `messages`, `input`…), when one is.
    pub(crate) param: Option<String>,
    /// `invalid_request_error`, `authentication_error`, `rate_limit_error`,
    /// `insufficient_quota`, `cancelled` or `server_error`.
    #[serde(rename = "type")]
    pub(crate) kind: String,
}

/// An error of the OpenAI-compatible routes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct OpenAiError {
    pub(crate) status: StatusCode,
    pub(crate) message: String,
    /// `invalid_request_error`, `authentication_error`, `rate_limit_error`, `server_error`…
    pub(crate) kind: &'static str,
    pub(crate) code: Option<String>,
    pub(crate) param: Option<&'static str>,
    /// `Retry-After` in seconds, on overload.
    pub(crate) retry_after: Option<u32>,
    /// The request reached an engine: asking again runs it again.
    pub(crate) ran: bool,
}

impl OpenAiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        OpenAiError {
            status,
            message: message.into(),
            kind,
            code: None,
            param: None,
            retry_after: None,
            ran: false,
        }
    }

    /// A `400 invalid_request_error`.
    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        OpenAiError::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    pub(crate) fn with_code(mut self, code: &str) -> Self {
        self.code = Some(code.to_owned());
        self
    }

    pub(crate) fn with_param(mut self, param: &'static str) -> Self {
        self.param = Some(param);
        self
    }

    /// `400 model_not_found`, naming the models there are.
    pub(crate) fn unknown_model(model: &str, known: &[String]) -> Self {
        OpenAiError::invalid(format!(
            "The model {model:?} does not exist; the models are {}",
            known.join(", ")
        ))
        .with_code("model_not_found")
        .with_param("model")
    }

    pub(crate) fn unauthorized() -> Self {
        OpenAiError::new(
            StatusCode::UNAUTHORIZED,
            "invalid_request_error",
            "Missing or invalid API key: send the gateway's API token as the bearer token",
        )
        .with_code("invalid_api_key")
    }

    /// The JSON body: `{"error": {...}}`, also the form of an error in a stream.
    pub(crate) fn body(&self) -> OpenAiErrorBody {
        OpenAiErrorBody {
            error: OpenAiErrorDetail {
                code: self.code.clone(),
                message: self.message.clone(),
                param: self.param.map(str::to_owned),
                kind: self.kind.to_owned(),
            },
        }
    }

    /// The error of a completion that did not succeed; `None` for one that did.
    pub(crate) fn of_completion(completion: &lemon_core::engine::Completion) -> Option<Self> {
        if completion.ok {
            return None;
        }
        let unnamed = RunError::Engine { message: "the run failed".to_owned() };
        Some(OpenAiError::from_run(completion.error.as_ref().unwrap_or(&unnamed)))
    }

    /// The error of a run that completed without an answer: its status follows
    /// what went wrong (the engine's own error is a `502`, a timeout a `504`, a
    /// context overflow OpenAI's own `400 context_length_exceeded`).
    pub(crate) fn from_run(error: &RunError) -> Self {
        let message = error.to_string();
        let (status, kind) = match error {
            RunError::ContextOverflow { .. } => (StatusCode::BAD_REQUEST, "invalid_request_error"),
            RunError::UnknownEngine { .. } => (StatusCode::BAD_REQUEST, "invalid_request_error"),
            RunError::BudgetExceeded { .. } => {
                (StatusCode::TOO_MANY_REQUESTS, "insufficient_quota")
            }
            RunError::Timeout | RunError::IdleWatchdog | RunError::LockTimeout => {
                (StatusCode::GATEWAY_TIMEOUT, "server_error")
            }
            RunError::EngineUnavailable { .. } | RunError::ShuttingDown => {
                (StatusCode::SERVICE_UNAVAILABLE, "server_error")
            }
            RunError::UserRequested
            | RunError::Interrupted
            | RunError::Cancelled { .. }
            | RunError::Merged { .. }
            | RunError::QueueOverflow
            | RunError::Expired => (StatusCode::CONFLICT, "cancelled"),
            RunError::EngineCrashed { .. }
            | RunError::StartFailed { .. }
            | RunError::Engine { .. } => (StatusCode::BAD_GATEWAY, "server_error"),
        };
        let code = match error {
            RunError::ContextOverflow { .. } => "context_length_exceeded",
            RunError::UnknownEngine { .. } => "model_not_found",
            other => other.code(),
        };
        OpenAiError { ran: true, ..OpenAiError::new(status, kind, message).with_code(code) }
    }
}

impl From<ApiError> for OpenAiError {
    fn from(err: ApiError) -> Self {
        let status = err.status();
        let message = err.to_string();
        match err {
            ApiError::Unauthorized => OpenAiError::unauthorized(),
            ApiError::BadRequest(_)
            | ApiError::UnsupportedMediaType
            | ApiError::PayloadTooLarge { .. }
            | ApiError::Attachment(_) => OpenAiError::new(status, "invalid_request_error", message),
            ApiError::NotFound(_) | ApiError::MethodNotAllowed | ApiError::Conflict(_) => {
                OpenAiError::new(status, "invalid_request_error", message)
            }
            ApiError::Overloaded { .. } => OpenAiError {
                retry_after: Some(1),
                ..OpenAiError::new(status, "rate_limit_error", message)
                    .with_code("rate_limit_exceeded")
            },
            ApiError::QueueFull { .. } => OpenAiError {
                retry_after: Some(5),
                ..OpenAiError::new(status, "rate_limit_error", message)
                    .with_code("rate_limit_exceeded")
            },
            ApiError::ShuttingDown => OpenAiError {
                retry_after: Some(1),
                ..OpenAiError::new(status, "server_error", message).with_code("shutting_down")
            },
            ApiError::StoreUnavailable(detail) => {
                tracing::warn!(error = %detail, "request refused: the store cannot write");
                OpenAiError {
                    retry_after: Some(5),
                    ..OpenAiError::new(status, "server_error", message)
                        .with_code("store_unavailable")
                }
            }
            ApiError::Internal(detail) => {
                // Logged once with its detail; the client gets the generic text.
                tracing::error!(error = %detail, "request failed");
                OpenAiError::new(status, "server_error", message)
            }
        }
    }
}

impl From<RouteError> for OpenAiError {
    fn from(err: RouteError) -> Self {
        match err {
            RouteError::UnknownEngine { engine, known } => {
                OpenAiError::unknown_model(&engine, &known)
            }
            RouteError::Invalid { .. } => {
                OpenAiError::invalid(err.to_string()).with_code("invalid_value")
            }
            other => ApiError::from(other).into(),
        }
    }
}

impl IntoResponse for OpenAiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, Json(self.body())).into_response();
        let headers = response.headers_mut();
        if self.status == StatusCode::UNAUTHORIZED {
            headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        if let Some(seconds) = self.retry_after {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        if self.ran {
            headers.insert(SHOULD_RETRY, HeaderValue::from_static("false"));
        }
        response
    }
}
