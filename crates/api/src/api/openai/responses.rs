//! `POST /v1/responses`: a `response` object, or with `stream: true` the
//! Responses API's events: `response.created`, `response.in_progress`, the
//! message item and its text part added, `response.output_text.delta`s (the
//! engine's tool calls as text lines among them), the text, part and item done,
//! and `response.completed` with the usage, or `response.failed`.
//!
//! `previous_response_id` continues that response's session: the id is
//! `resp_<run id>`.

use std::collections::BTreeMap;
use std::convert::Infallible;

use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::Event;
use axum::response::{IntoResponse, Response};
use axum::Json;
use lemon_core::engine::Completion;
use lemon_core::ids::{RunId, SessionKey};
use lemon_core::router::Submitted;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::chat::{answer_of, sse_of, Content};
use super::error::{OpenAiError, OpenAiErrorBody};
use super::follow::{rendered, AnswerStream, Render};
use super::turns::{Role, Turn};
use super::{
    input_tokens, json_body, lemon_headers, receive_files, reported_usage, unix_now, Target,
};
use crate::api::ApiState;

/// The request body; fields an engine has no use for (`temperature`, `tools`,
/// `reasoning`…) are accepted and ignored.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
pub(super) struct ResponsesRequest {
    /// The engine, with a model if it takes one (`claude:opus`).
    model: Option<String>,
    /// The user's message as text, or a list of messages; the last is the
    /// user's, the prompt.
    input: Option<Input>,
    /// A system message before the input.
    instructions: Option<String>,
    /// Answer with the Responses API's Server-Sent Events.
    stream: Option<bool>,
    /// The session, unless `X-Lemon-Session` names one.
    user: Option<String>,
    /// An earlier response (`resp_…`) whose session this one continues.
    previous_response_id: Option<String>,
}

/// `POST /v1/responses` without `stream`: a `response`; also the `response`
/// of the stream's `response.created`, `response.completed` and
/// `response.failed` events.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub(crate) struct ResponseObject {
    /// Seconds since the epoch.
    pub(crate) created_at: u64,
    /// Why it failed (`response.failed` only); `null` otherwise.
    #[schema(required = true)]
    pub(crate) error: Option<ResponseError>,
    /// `resp_<run id>`: what `previous_response_id` names to continue.
    pub(crate) id: String,
    /// Always `null`.
    #[schema(required = true, value_type = Option<Object>)]
    pub(crate) incomplete_details: Option<Value>,
    /// The request's `instructions`.
    #[schema(required = true)]
    pub(crate) instructions: Option<String>,
    /// Always `{}`.
    pub(crate) metadata: BTreeMap<String, String>,
    /// The engine, as the request named it.
    pub(crate) model: String,
    /// `response`.
    pub(crate) object: String,
    /// The assistant's message, once there is one.
    pub(crate) output: Vec<OutputMessage>,
    /// `false`.
    pub(crate) parallel_tool_calls: bool,
    /// `completed`, `in_progress` or `failed`.
    pub(crate) status: String,
    /// `none`.
    pub(crate) tool_choice: String,
    /// Always `[]`.
    #[schema(value_type = Vec<Object>)]
    pub(crate) tools: Vec<Value>,
    /// `null` until it completed, or when the engine reported none.
    #[schema(required = true)]
    pub(crate) usage: Option<ResponseUsage>,
}

/// The error of a failed response.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub(crate) struct ResponseError {
    /// `timeout`, `context_length_exceeded`, `engine_exited`…
    #[schema(required = true)]
    pub(crate) code: Option<String>,
    pub(crate) message: String,
}

/// The assistant's message: the one output item.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub(crate) struct OutputMessage {
    pub(crate) content: Vec<OutputText>,
    /// `msg_<run id>`.
    pub(crate) id: String,
    /// `assistant`.
    pub(crate) role: String,
    /// `in_progress` or `completed`.
    pub(crate) status: String,
    /// `message`.
    #[serde(rename = "type")]
    pub(crate) kind: String,
}

/// The text of the assistant's message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub(crate) struct OutputText {
    /// Always `[]`.
    #[schema(value_type = Vec<Object>)]
    pub(crate) annotations: Vec<Value>,
    pub(crate) text: String,
    /// `output_text`.
    #[serde(rename = "type")]
    pub(crate) kind: String,
}

/// A response's token counts, OpenAI's way: input tokens include the
/// cached ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub(crate) struct ResponseUsage {
    /// Input tokens, cached ones included.
    pub(crate) input_tokens: u64,
    pub(crate) input_tokens_details: InputTokensDetails,
    /// Tokens of the answer.
    pub(crate) output_tokens: u64,
    pub(crate) output_tokens_details: OutputTokensDetails,
    /// Input and output tokens.
    pub(crate) total_tokens: u64,
}

/// Cached input tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub(crate) struct InputTokensDetails {
    /// Input tokens read from the engine's cache.
    pub(crate) cached_tokens: u64,
}

/// Reasoning tokens: `0`, engines do not report them apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub(crate) struct OutputTokensDetails {
    pub(crate) reasoning_tokens: u64,
}

/// The input: a user message as text, or a list of message items.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
enum Input {
    Text(String),
    Items(Vec<InputItem>),
}

/// One message of the input.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
struct InputItem {
    /// `message` (other item types are refused).
    #[serde(rename = "type")]
    kind: Option<String>,
    /// `system`, `developer`, `user`, `assistant` or `tool`.
    role: Option<String>,
    /// Text, or a list of parts (text, images, files).
    content: Option<Content>,
}

impl ResponsesRequest {
    fn turns(&self) -> Result<Vec<Turn>, OpenAiError> {
        let mut turns = Vec::new();
        if let Some(instructions) = &self.instructions {
            turns.push(Turn { role: Role::System, text: instructions.clone(), files: Vec::new() });
        }
        match &self.input {
            None => {}
            Some(Input::Text(text)) => {
                turns.push(Turn { role: Role::User, text: text.clone(), files: Vec::new() })
            }
            Some(Input::Items(items)) => {
                for item in items {
                    if let Some(kind) = item.kind.as_deref().filter(|kind| *kind != "message") {
                        return Err(OpenAiError::invalid(format!(
                            "input items of type {kind:?} are not supported: send messages"
                        ))
                        .with_param("input"));
                    }
                    let role = item.role.as_deref().ok_or_else(|| {
                        OpenAiError::invalid("every input message needs a role").with_param("input")
                    })?;
                    let (text, files) = match &item.content {
                        Some(content) => content.split("input")?,
                        None => (String::new(), Vec::new()),
                    };
                    turns.push(Turn { role: Role::parse(role)?, text, files });
                }
            }
        }
        Ok(turns)
    }
}

/// `POST /v1/responses`: OpenAI's response, answered by a run of the engine
/// `model` names; with `stream`, the Responses API's events.
#[utoipa::path(
    post,
    path = "/v1/responses",
    operation_id = "create_response",
    tag = "openai",
    request_body = ResponsesRequest,
    params(("X-Lemon-Session" = Option<String>, Header, description = "The session of the request.")),
    responses(
        (status = 200, description = "A `response`, or with `stream` Server-Sent Events from `response.created` to `response.completed`.",
            content(
                (ResponseObject = "application/json"),
                (crate::openapi::schema::SseEvent = "text/event-stream"),
            )),
        crate::openapi::OpenAiErrors,
        (status = 403, description = "Files are not accepted (`[gateway.files] enabled = false`).", body = OpenAiErrorBody),
        (status = 413, description = "The body is larger than its limit (one file of `[gateway.files] max_download_bytes` in base64, at least 1 MiB), or an image or file is larger than `max_download_bytes`.", body = OpenAiErrorBody),
        (status = 422, description = "An image or file URL could not be fetched, or points at a private or loopback address.", body = OpenAiErrorBody),
    )
)]
pub(super) async fn create(
    State(state): State<ApiState>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, OpenAiError> {
    let request: ResponsesRequest = json_body(&state, &headers, body).await?;
    let mut turns = request.turns()?;
    let previous = match request.previous_response_id.as_deref() {
        Some(id) => Some(previous_session(&state, id).await?),
        None => None,
    };
    let target =
        Target::resolve(request.model.as_deref(), &headers, request.user.as_deref(), previous)?;
    let prompt = target.prompt(&state, &turns, "input").await?;
    let staged = receive_files(&state, &mut turns, "input").await?;
    let shape = Shape {
        id: format!("resp_{}", target.run_id),
        message_id: format!("msg_{}", target.run_id),
        model: target.engine.to_string(),
        created_at: unix_now(),
        instructions: request.instructions.clone(),
    };
    let stream = request.stream.unwrap_or(false);
    let mut response = match target.submit(&state, prompt, staged).await? {
        Submitted::Command { reply, .. } => {
            if stream {
                let mut events = Events::new(shape);
                let mut out = events.start();
                out.push(events.delta(&reply));
                out.extend(events.finish(&Completion::success(reply, None)));
                sse_of(futures::stream::iter(out.into_iter().map(Ok)))
            } else {
                Json(shape.completed(&reply, None)).into_response()
            }
        }
        Submitted::Run(_, follower) => {
            let answer = AnswerStream::new(state.router.clone(), follower, state.shutdown.clone());
            if stream {
                let mut events = Events::new(shape);
                let start = events.start().into_iter().map(Ok).collect();
                sse_of(rendered(start, events, answer))
            } else {
                let completion = answer_of(answer).await?;
                let usage = reported_usage(&completion.usage).map(|u| response_usage(&u));
                Json(shape.completed(&completion.answer, usage)).into_response()
            }
        }
    };
    lemon_headers(&mut response, &target.run_id, &target.session);
    Ok(response)
}

/// The session of an earlier response, from its id `resp_<run id>`.
async fn previous_session(state: &ApiState, id: &str) -> Result<SessionKey, OpenAiError> {
    let not_found = || {
        OpenAiError::invalid(format!("previous response {id:?} not found"))
            .with_code("previous_response_not_found")
            .with_param("previous_response_id")
    };
    let run_id = id.strip_prefix("resp_").and_then(RunId::parse).ok_or_else(not_found)?;
    let record = state.runs.get(&run_id).await.map_err(crate::error::ApiError::from)?;
    let record = record.ok_or_else(not_found)?;
    Ok(record.session_key)
}

/// What the response object and every event share.
#[derive(Debug, Clone)]
struct Shape {
    id: String,
    message_id: String,
    model: String,
    created_at: u64,
    instructions: Option<String>,
}

impl Shape {
    fn response(
        &self,
        status: &str,
        output: Vec<OutputMessage>,
        usage: Option<ResponseUsage>,
    ) -> ResponseObject {
        ResponseObject {
            created_at: self.created_at,
            error: None,
            id: self.id.clone(),
            incomplete_details: None,
            instructions: self.instructions.clone(),
            metadata: BTreeMap::new(),
            model: self.model.clone(),
            object: "response".to_owned(),
            output,
            parallel_tool_calls: false,
            status: status.to_owned(),
            tool_choice: "none".to_owned(),
            tools: Vec::new(),
            usage,
        }
    }

    fn text_part(text: &str) -> OutputText {
        OutputText {
            annotations: Vec::new(),
            text: text.to_owned(),
            kind: "output_text".to_owned(),
        }
    }

    fn message(&self, status: &str, content: Vec<OutputText>) -> OutputMessage {
        OutputMessage {
            content,
            id: self.message_id.clone(),
            role: "assistant".to_owned(),
            status: status.to_owned(),
            kind: "message".to_owned(),
        }
    }

    fn completed(&self, text: &str, usage: Option<ResponseUsage>) -> ResponseObject {
        let message = self.message("completed", vec![Shape::text_part(text)]);
        self.response("completed", vec![message], usage)
    }
}

fn response_usage(usage: &lemon_core::budget::usage::ReportedUsage) -> ResponseUsage {
    let input = input_tokens(usage);
    ResponseUsage {
        input_tokens: input,
        input_tokens_details: InputTokensDetails { cached_tokens: usage.cache_read_tokens },
        output_tokens: usage.output_tokens,
        output_tokens_details: OutputTokensDetails { reasoning_tokens: 0 },
        total_tokens: input + usage.output_tokens,
    }
}

/// The events of one response, numbered as they are made.
#[derive(Debug)]
struct Events {
    shape: Shape,
    sequence: u64,
    /// The text streamed so far, for the `done` events.
    text: String,
}

impl Events {
    fn new(shape: Shape) -> Self {
        Events { shape, sequence: 0, text: String::new() }
    }

    fn event(&mut self, kind: &str, mut body: Value) -> Event {
        body["type"] = json!(kind);
        body["sequence_number"] = json!(self.sequence);
        self.sequence += 1;
        Event::default().event(kind).data(body.to_string())
    }

    fn item_ref(&self) -> Value {
        json!({ "item_id": self.shape.message_id, "output_index": 0, "content_index": 0 })
    }

    /// From `response.created` to the empty text part.
    fn start(&mut self) -> Vec<Event> {
        let response = self.shape.response("in_progress", Vec::new(), None);
        let item = self.shape.message("in_progress", Vec::new());
        let mut part = self.item_ref();
        part["part"] = json!(Shape::text_part(""));
        vec![
            self.event("response.created", json!({ "response": response })),
            self.event("response.in_progress", json!({ "response": response })),
            self.event("response.output_item.added", json!({ "output_index": 0, "item": item })),
            self.event("response.content_part.added", part),
        ]
    }

    fn delta(&mut self, text: &str) -> Event {
        self.text.push_str(text);
        let mut body = self.item_ref();
        body["delta"] = json!(text);
        body["logprobs"] = json!([]);
        self.event("response.output_text.delta", body)
    }

    /// The text, part and item done, then `response.completed`; or
    /// `response.failed` with the run's error.
    fn finish(&mut self, completion: &Completion) -> Vec<Event> {
        if let Some(error) = OpenAiError::of_completion(completion) {
            let mut response = self.shape.response("failed", Vec::new(), None);
            response.error = Some(ResponseError { code: error.code, message: error.message });
            return vec![self.event("response.failed", json!({ "response": response }))];
        }
        let text = self.text.clone();
        let part = Shape::text_part(&text);
        let item = self.shape.message("completed", vec![part.clone()]);
        let usage = reported_usage(&completion.usage).map(|u| response_usage(&u));
        let response = self.shape.response("completed", vec![item.clone()], usage);
        let mut text_done = self.item_ref();
        text_done["text"] = json!(text);
        text_done["logprobs"] = json!([]);
        let mut part_done = self.item_ref();
        part_done["part"] = json!(part);
        vec![
            self.event("response.output_text.done", text_done),
            self.event("response.content_part.done", part_done),
            self.event("response.output_item.done", json!({ "output_index": 0, "item": item })),
            self.event("response.completed", json!({ "response": response })),
        ]
    }
}

impl Render for Events {
    type Item = Result<Event, Infallible>;

    fn text(&mut self, text: &str) -> Vec<Self::Item> {
        vec![Ok(self.delta(text))]
    }

    fn end(&mut self, completion: &Completion) -> Vec<Self::Item> {
        self.finish(completion).into_iter().map(Ok).collect()
    }
}
