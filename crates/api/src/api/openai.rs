//! The OpenAI-compatible API: any OpenAI client library, IDE plugin or chat UI
//! talks to the gateway with its base URL set to `http://<api>/v1` and the API
//! token as its key.
//!
//! | method | path | success |
//! | --- | --- | --- |
//! | `POST` | `/v1/chat/completions` | `200` a `chat.completion`, or with `stream` SSE `chat.completion.chunk`s and `data: [DONE]` |
//! | `POST` | `/v1/responses` | `200` a `response`, or with `stream` SSE `response.created` … `response.completed` |
//! | `GET` | `/v1/models` | `200 {"object": "list", "data": [...]}`: the available engines |
//!
//! A request is a run submitted through the router like any other, so queue
//! modes, bindings (`transport = "openai"`, `chat_id` the session key) and
//! sessions work here too:
//! - `model` names the engine, with a model if it takes one (`claude:opus`);
//! - the session is the `X-Lemon-Session` header, else the `user` field (for
//!   responses also the session of `previous_response_id`), else a fresh one
//!   per request (`openai:<run id>`);
//! - the last user message is the prompt. The earlier messages are the
//!   client's copy of the conversation: when the session's engine already holds
//!   it (the session has the engine's resume token), only the newest message is
//!   sent; otherwise (a fresh session, or an engine that keeps none) they are
//!   written before the prompt as a transcript;
//! - the last user message's images (`image_url`, `input_image`) and files
//!   (`file`, `input_file`) become files of the run, as `POST /v1/runs`
//!   attachments do ([`crate::files`]); those of earlier messages are not
//!   sent again.
//!
//! Every error is OpenAI's `{"error": {"message", "type", "param", "code"}}`,
//! including a missing token (`401`) and overload (`429` with `Retry-After`).
//! A client that goes away mid-answer does not stop the run: it completes and
//! is recorded like every run.

mod chat;
pub(crate) mod error;
mod follow;
mod responses;
mod turns;

use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::Body;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use lemon_core::engine::{Availability, Field};
use lemon_core::ids::{EngineRef, RunId, SessionKey};
use lemon_core::router::resolve::parse_engine_ref;
use lemon_core::router::{ChannelRef, Origin, RequestFlags, RouteError, RunRequest, Submitted};
use serde::de::DeserializeOwned;
use serde_json::json;

use super::ApiState;
use crate::error::{is_json_content_type, read_body, ApiError, MAX_BODY_BYTES};
use crate::files::Staged;
use error::OpenAiError;
use turns::Turn;

/// The header that names the session of a request.
const SESSION_HEADER: HeaderName = HeaderName::from_static("x-lemon-session");
/// The header of a response that names the run behind it.
const RUN_HEADER: HeaderName = HeaderName::from_static("x-lemon-run-id");
/// The longest session key a request may name.
const MAX_SESSION_LEN: usize = 256;
/// The transport name bindings match requests of this API with.
const TRANSPORT: &str = "openai";

/// The routes, behind the bearer token with OpenAI's error shape for every
/// refusal (a missing token, an oversized body, a wrong method).
pub(super) fn router(state: ApiState) -> Router {
    let token = state.token.with_launch(state.launch_token.clone());
    let limits = (token, state.files.body_limit());
    Router::new()
        .route("/v1/chat/completions", post(chat::create))
        .route("/v1/responses", post(responses::create))
        .route("/v1/models", get(models))
        .route("/v1/models/{id}", get(model))
        .with_state(state)
        .method_not_allowed_fallback(|| async { OpenAiError::from(ApiError::MethodNotAllowed) })
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(middleware::from_fn_with_state(limits, require_bearer))
}

/// The token, and the body limit of the routes that take images and files
/// (see [`crate::files::body_limit`]); the others take [`MAX_BODY_BYTES`].
async fn require_bearer(
    State((expected, files_limit)): State<(super::ApiToken, usize)>,
    req: Request,
    next: Next,
) -> Response {
    if !expected.matches(req.headers()) {
        return OpenAiError::unauthorized().into_response();
    }
    let takes_files = req.method() == axum::http::Method::POST
        && matches!(req.uri().path(), "/v1/chat/completions" | "/v1/responses");
    let limit = if takes_files { files_limit } else { MAX_BODY_BYTES };
    // The body's declared length is judged before a byte of it is read.
    if crate::error::declared_too_large(req.headers(), limit) {
        return OpenAiError::from(ApiError::PayloadTooLarge { limit }).into_response();
    }
    next.run(req).await
}

/// Seconds since the Unix epoch, as OpenAI's `created` fields carry them.
fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |elapsed| elapsed.as_secs())
}

/// A JSON body of at most the limit of the routes that take files, with
/// every failure (no JSON content type, too large, not parseable) in
/// OpenAI's shape.
async fn json_body<T: DeserializeOwned>(
    state: &ApiState,
    headers: &HeaderMap,
    body: Body,
) -> Result<T, OpenAiError> {
    let declared = headers.get(header::CONTENT_TYPE).and_then(|value| value.to_str().ok());
    if !declared.is_some_and(is_json_content_type) {
        return Err(ApiError::UnsupportedMediaType.into());
    }
    let bytes = read_body(headers, body, state.files.body_limit())
        .await
        .map_err(|err| OpenAiError::from(ApiError::from(err)))?;
    crate::error::parse_json(&bytes).map_err(|err| OpenAiError::invalid(err.to_string()))
}

/// The description of these routes.
pub(super) fn doc() -> utoipa::openapi::OpenApi {
    #[derive(utoipa::OpenApi)]
    #[openapi(paths(chat::create, responses::create, models, model))]
    struct OpenAiDoc;
    <OpenAiDoc as utoipa::OpenApi>::openapi()
}

/// An engine as an OpenAI model.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
pub(crate) struct Model {
    /// Seconds since the epoch: when it was listed.
    pub(crate) created: u64,
    /// The engine id, what `model` names in a request.
    pub(crate) id: String,
    /// `model`.
    pub(crate) object: String,
    /// `lemon-gateway`.
    pub(crate) owned_by: String,
}

impl Model {
    fn new(id: &str, created: u64) -> Self {
        Model {
            created,
            id: id.to_owned(),
            object: "model".to_owned(),
            owned_by: "lemon-gateway".to_owned(),
        }
    }
}

/// `GET /v1/models`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
pub(crate) struct ModelList {
    /// The engines that can run now, in registration order.
    pub(crate) data: Vec<Model>,
    /// `list`.
    pub(crate) object: String,
}

/// `GET /v1/models`: every available engine as a model.
#[utoipa::path(
    get,
    path = "/v1/models",
    tag = "openai",
    responses(
        (status = 200, description = "The available engines.", body = ModelList),
        crate::openapi::OpenAiErrors,
    )
)]
async fn models(State(state): State<ApiState>) -> Json<ModelList> {
    let created = unix_now();
    let data = available_engines(&state).iter().map(|id| Model::new(id, created)).collect();
    Json(ModelList { data, object: "list".to_owned() })
}

/// `GET /v1/models/{id}`: one engine, or `404 model_not_found`.
#[utoipa::path(
    get,
    path = "/v1/models/{id}",
    tag = "openai",
    params(("id" = String, Path, description = "The engine id.")),
    responses(
        (status = 200, description = "The engine.", body = Model),
        crate::openapi::OpenAiErrors,
    )
)]
async fn model(
    State(state): State<ApiState>,
    axum::extract::Path(id): axum::extract::Path<String>,
) -> Result<Json<Model>, OpenAiError> {
    let engines = available_engines(&state);
    if engines.contains(&id) {
        return Ok(Json(Model::new(&id, unix_now())));
    }
    let mut error = OpenAiError::unknown_model(&id, &engines);
    error.status = axum::http::StatusCode::NOT_FOUND;
    Err(error)
}

/// The ids of the engines that can run now, in registration order.
fn available_engines(state: &ApiState) -> Vec<String> {
    state
        .runs
        .engines()
        .into_iter()
        .filter(|engine| matches!(engine.availability, Availability::Available))
        .map(|engine| engine.id)
        .collect()
}

/// Where a request goes: the engine, the session and the run's id.
#[derive(Debug, Clone)]
struct Target {
    engine: EngineRef,
    session: SessionKey,
    /// The session was made for this request: no engine holds its history.
    fresh: bool,
    run_id: RunId,
}

impl Target {
    /// The engine from `model`, the session from the header, then `user`, then
    /// `fallback` (a previous response's session), else a fresh one.
    ///
    /// # Errors
    /// A `400` for a missing or malformed model or session.
    fn resolve(
        model: Option<&str>,
        headers: &HeaderMap,
        user: Option<&str>,
        fallback: Option<SessionKey>,
    ) -> Result<Target, OpenAiError> {
        let model = model.map(str::trim).filter(|model| !model.is_empty()).ok_or_else(|| {
            OpenAiError::invalid("model is required: name an engine, as GET /v1/models lists them")
                .with_param("model")
        })?;
        let engine = parse_engine_ref(model, Field::Engine).map_err(|refusal| {
            OpenAiError::invalid(RouteError::from(refusal).to_string())
                .with_code("invalid_value")
                .with_param("model")
        })?;
        let run_id = RunId::generate();
        let header = match headers.get(&SESSION_HEADER) {
            None => None,
            Some(value) => Some(value.to_str().map_err(|_| {
                OpenAiError::invalid("invalid X-Lemon-Session: use printable text")
            })?),
        };
        let header = header.filter(|raw| !raw.trim().is_empty());
        let named = match (header, user) {
            (Some(raw), _) => Some(session_key(raw, "X-Lemon-Session")?),
            (None, Some(raw)) if !raw.trim().is_empty() => Some(session_key(raw, "user")?),
            _ => fallback,
        };
        let (session, fresh) = match named {
            Some(session) => (session, false),
            None => (SessionKey::from(format!("openai:{run_id}")), true),
        };
        Ok(Target { engine, session, fresh, run_id })
    }

    /// Whether the session's engine holds the conversation already: the
    /// session has a resume token of the engine the request names.
    async fn engine_has_history(&self, state: &ApiState) -> Result<bool, OpenAiError> {
        if self.fresh {
            return Ok(false);
        }
        let view = state.runs.session(&self.session).await?;
        Ok(view.chat_state.is_some_and(|chat| {
            !chat.last_resume_token.is_empty()
                && (self.engine.is(&chat.last_engine) || self.engine == chat.last_engine.as_str())
        }))
    }

    /// The prompt of `turns` for this target: the newest message, after the
    /// earlier ones unless the engine holds them.
    async fn prompt(
        &self,
        state: &ApiState,
        turns: &[Turn],
        param: &'static str,
    ) -> Result<String, OpenAiError> {
        let history = !self.engine_has_history(state).await?;
        turns::prompt(turns, history, param)
    }

    /// Submits `prompt` as this target's run, with the `staged` files; they
    /// are the run's once it is accepted, and removed if it is not.
    async fn submit(
        &self,
        state: &ApiState,
        prompt: String,
        staged: Staged,
    ) -> Result<Submitted, OpenAiError> {
        let mut meta = std::collections::BTreeMap::new();
        meta.insert("openai_api".to_owned(), json!(true));
        lemon_core::media::add_attachments(&mut meta, staged.attachments());
        let req = RunRequest {
            origin: Origin::ControlPlane,
            session_key: self.session.clone(),
            agent_id: None,
            prompt,
            queue_mode: None,
            engine: Some(self.engine.clone()),
            resume: None,
            cwd: None,
            model: None,
            flags: RequestFlags::default(),
            meta,
            run_id: Some(self.run_id.clone()),
            channel: Some(ChannelRef {
                transport: TRANSPORT.to_owned(),
                chat_id: Some(self.session.as_str().to_owned()),
                topic_id: None,
            }),
        };
        let submitted = state.router.submit(req).await.map_err(|err| match err {
            // Named by what `GET /v1/models` lists.
            RouteError::UnknownEngine { engine, .. } => {
                OpenAiError::unknown_model(&engine, &available_engines(state))
            }
            other => other.into(),
        })?;
        if matches!(&submitted, Submitted::Run(accepted, _) if !accepted.duplicate) {
            staged.hand_over();
        }
        Ok(submitted)
    }
}

/// Checks and stages the images and files of the last message (the
/// prompt's); those of earlier messages are not sent again.
///
/// # Errors
/// The first file refused, in OpenAI's shape with `param`.
async fn receive_files(
    state: &ApiState,
    turns: &mut [Turn],
    param: &'static str,
) -> Result<Staged, OpenAiError> {
    let files = turns.last_mut().map(|turn| std::mem::take(&mut turn.files)).unwrap_or_default();
    state
        .files
        .receive(files)
        .await
        .map_err(|err| OpenAiError::from(ApiError::from(err)).with_param(param))
}

/// A session key a client named.
fn session_key(raw: &str, field: &str) -> Result<SessionKey, OpenAiError> {
    let raw = raw.trim();
    if raw.chars().count() > MAX_SESSION_LEN {
        return Err(OpenAiError::invalid(format!(
            "invalid {field}: a session key has at most {MAX_SESSION_LEN} characters"
        )));
    }
    SessionKey::parse(raw).map_err(|_| {
        OpenAiError::invalid(format!("invalid {field}: control characters are not allowed"))
    })
}

/// The headers every answer carries: the run and the session, so a client can
/// continue the session or look the run up in the control API.
fn lemon_headers(response: &mut Response, run_id: &RunId, session: &SessionKey) {
    let headers = response.headers_mut();
    if let Ok(value) = HeaderValue::from_str(run_id.as_str()) {
        headers.insert(RUN_HEADER, value);
    }
    if let Ok(value) = HeaderValue::from_str(session.as_str()) {
        headers.insert(SESSION_HEADER, value);
    }
}

/// Usage in OpenAI's shape from what the engine reported: `None` when it
/// reported nothing.
fn reported_usage(usage: &serde_json::Value) -> Option<lemon_core::budget::usage::ReportedUsage> {
    if usage.is_null() {
        return None;
    }
    let reported = lemon_core::budget::usage::ReportedUsage::from_json(usage);
    let any = reported.input_tokens
        + reported.output_tokens
        + reported.cache_read_tokens
        + reported.cache_write_tokens;
    (any > 0).then_some(reported)
}

/// Input tokens as OpenAI counts them: cached ones included.
fn input_tokens(usage: &lemon_core::budget::usage::ReportedUsage) -> u64 {
    usage.input_tokens + usage.cache_read_tokens + usage.cache_write_tokens
}

#[cfg(test)]
mod tests;
