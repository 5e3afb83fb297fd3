//! `POST /v1/chat/completions`: a `chat.completion`, or with `stream: true`
//! Server-Sent Events of `chat.completion.chunk`s: the assistant's role, the
//! content in pieces (the engine's tool calls as text lines among them), a last
//! chunk with `finish_reason`, the usage chunk when asked for
//! (`stream_options.include_usage`) and reported, then `data: [DONE]`.

use std::convert::Infallible;

use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use lemon_core::engine::Completion;
use lemon_core::router::Submitted;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::error::{OpenAiError, OpenAiErrorBody};
use super::follow::{rendered, AnswerStream, Render, Step};
use super::turns::{Role, Turn};
use super::{
    input_tokens, json_body, lemon_headers, receive_files, reported_usage, unix_now, Target,
};
use crate::api::ApiState;
use crate::files::{FileSource, IncomingFile};

/// The request body; fields OpenAI defines that an engine has no use for
/// (`temperature`, `max_tokens`, `tools`…) are accepted and ignored.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
pub(super) struct ChatRequest {
    /// The engine, with a model if it takes one (`claude:opus`).
    model: Option<String>,
    /// The conversation; the last message is the user's, the prompt.
    messages: Option<Vec<Message>>,
    /// Answer with Server-Sent Events of `chat.completion.chunk`s.
    stream: Option<bool>,
    stream_options: Option<StreamOptions>,
    /// The session, unless `X-Lemon-Session` names one.
    user: Option<String>,
}

/// What a stream carries besides the answer.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
struct StreamOptions {
    /// A last chunk with the usage, when the engine reported it.
    include_usage: Option<bool>,
}

/// One message of a chat.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
struct Message {
    /// `system`, `developer`, `user`, `assistant` or `tool`.
    role: String,
    /// Text, or a list of parts (text, images, files).
    content: Option<Content>,
}

/// A message's content: text, or a list of parts: text, images and files.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
pub(super) enum Content {
    Text(String),
    Parts(Vec<Part>),
}

/// One part of a message's content.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
pub(super) struct Part {
    /// `text` (`input_text`, `output_text`); `image_url` (`input_image`) and
    /// `file` (`input_file`) in the last user message become files of the run.
    /// Other parts (audio) are refused.
    #[serde(rename = "type")]
    kind: String,
    text: Option<String>,
    /// An image: `{"url"}` (Chat Completions) or the URL itself (Responses);
    /// a base64 `data:` URL or an `http(s)` one the gateway downloads.
    image_url: Option<ImageUrl>,
    /// Chat Completions' `file` part: `{"file_data", "filename"}`.
    file: Option<FilePart>,
    /// Responses' `input_file`: base64, or a base64 `data:` URL.
    file_data: Option<String>,
    /// Responses' `input_file`: where to download the file from.
    file_url: Option<String>,
    /// The file's name (`input_file`).
    filename: Option<String>,
    /// Files uploaded to OpenAI are not known here: refused.
    file_id: Option<String>,
}

/// An image's URL, as either API writes it.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
pub(super) enum ImageUrl {
    Url(String),
    Object { url: String },
}

/// Chat Completions' file.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
pub(super) struct FilePart {
    /// Base64, or a base64 `data:` URL.
    file_data: Option<String>,
    filename: Option<String>,
    /// Refused: files uploaded to OpenAI are not known here.
    file_id: Option<String>,
}

/// `POST /v1/chat/completions` without `stream`: a `chat.completion`.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub(crate) struct ChatCompletion {
    /// The one choice: the run's answer.
    pub(crate) choices: Vec<ChatChoice>,
    /// Seconds since the epoch.
    pub(crate) created: u64,
    /// `chatcmpl-<run id>`.
    pub(crate) id: String,
    /// The engine, as the request named it.
    pub(crate) model: String,
    /// `chat.completion`.
    pub(crate) object: String,
    /// Always `null`.
    #[schema(required = true)]
    pub(crate) system_fingerprint: Option<String>,
    /// `null` when the engine reported none.
    #[schema(required = true)]
    pub(crate) usage: Option<ChatUsage>,
}

/// The one choice of a chat completion.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub(crate) struct ChatChoice {
    /// `stop`.
    pub(crate) finish_reason: String,
    /// `0`.
    pub(crate) index: u32,
    /// Always `null`.
    #[schema(required = true, value_type = Option<Object>)]
    pub(crate) logprobs: Option<Value>,
    pub(crate) message: ChatMessage,
}

/// The assistant's message in a chat completion.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub(crate) struct ChatMessage {
    /// The answer.
    pub(crate) content: String,
    /// Always `null`.
    #[schema(required = true)]
    pub(crate) refusal: Option<String>,
    /// `assistant`.
    pub(crate) role: String,
}

/// A chat completion's token counts, OpenAI's way: prompt tokens include
/// the cached ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub(crate) struct ChatUsage {
    /// Tokens of the answer.
    pub(crate) completion_tokens: u64,
    /// Prompt tokens, cached ones included.
    pub(crate) prompt_tokens: u64,
    pub(crate) prompt_tokens_details: PromptTokensDetails,
    /// Prompt and completion tokens.
    pub(crate) total_tokens: u64,
}

/// Cached prompt tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub(crate) struct PromptTokensDetails {
    /// Prompt tokens read from the engine's cache.
    pub(crate) cached_tokens: u64,
}

/// Base64 text or a `data:` URL as a file's source.
fn inline_source(data: String) -> FileSource {
    if crate::files::parse_data_url(&data).is_some() {
        FileSource::Url(data)
    } else {
        FileSource::Base64(data)
    }
}

impl Content {
    /// The text of the content (the text parts joined by newlines) and its
    /// images and files.
    ///
    /// # Errors
    /// A `400` for a part that is neither (audio), or a file without content.
    pub(super) fn split(
        &self,
        param: &'static str,
    ) -> Result<(String, Vec<IncomingFile>), OpenAiError> {
        let parts = match self {
            Content::Text(text) => return Ok((text.clone(), Vec::new())),
            Content::Parts(parts) => parts,
        };
        let mut texts = Vec::with_capacity(parts.len());
        let mut files = Vec::new();
        let invalid = |message: String| OpenAiError::invalid(message).with_param(param);
        for (index, part) in parts.iter().enumerate() {
            let label = format!("content[{index}]");
            let unknown_file = || {
                invalid(format!(
                    "{label}: file_id is not supported: send the file as file_data or file_url"
                ))
            };
            match (part.kind.as_str(), &part.text) {
                ("text" | "input_text" | "output_text", Some(text)) => texts.push(text.as_str()),
                ("image_url" | "input_image", _) => {
                    let url = match &part.image_url {
                        Some(ImageUrl::Url(url) | ImageUrl::Object { url }) => url.clone(),
                        None if part.file_id.is_some() => return Err(unknown_file()),
                        None => return Err(invalid(format!("{label}: image_url is required"))),
                    };
                    files.push(IncomingFile {
                        label,
                        name: None,
                        mime: None,
                        source: FileSource::Url(url),
                    });
                }
                ("file" | "input_file", _) => {
                    let nested = part.file.as_ref();
                    let data = nested.and_then(|f| f.file_data.clone()).or(part.file_data.clone());
                    let name = nested.and_then(|f| f.filename.clone()).or(part.filename.clone());
                    let source = match (data, &part.file_url) {
                        (Some(data), _) => inline_source(data),
                        (None, Some(url)) => FileSource::Url(url.clone()),
                        (None, None) => {
                            if nested
                                .and_then(|f| f.file_id.as_ref())
                                .or(part.file_id.as_ref())
                                .is_some()
                            {
                                return Err(unknown_file());
                            }
                            return Err(invalid(format!(
                                "{label}: file_data or file_url is required"
                            )));
                        }
                    };
                    files.push(IncomingFile { label, name, mime: None, source });
                }
                (kind, _) => {
                    return Err(invalid(format!(
                        "content of type {kind:?} is not supported: send text, images or files"
                    )))
                }
            }
        }
        Ok((texts.join("\n"), files))
    }
}

impl ChatRequest {
    fn turns(&self) -> Result<Vec<Turn>, OpenAiError> {
        let messages = self.messages.as_deref().unwrap_or_default();
        messages
            .iter()
            .map(|message| {
                let role = Role::parse(&message.role)?;
                let (text, files) = match &message.content {
                    Some(content) => content.split("messages")?,
                    None => (String::new(), Vec::new()),
                };
                Ok(Turn { role, text, files })
            })
            .collect()
    }
}

/// `POST /v1/chat/completions`: OpenAI's chat completion, answered by a run
/// of the engine `model` names; with `stream`, its chunks as Server-Sent
/// Events.
#[utoipa::path(
    post,
    path = "/v1/chat/completions",
    operation_id = "create_chat_completion",
    tag = "openai",
    request_body = ChatRequest,
    params(("X-Lemon-Session" = Option<String>, Header, description = "The session of the request.")),
    responses(
        (status = 200, description = "A `chat.completion`, or with `stream` Server-Sent Events of `chat.completion.chunk`s ending with `data: [DONE]`.",
            content(
                (ChatCompletion = "application/json"),
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
    let request: ChatRequest = json_body(&state, &headers, body).await?;
    let mut turns = request.turns()?;
    let target =
        Target::resolve(request.model.as_deref(), &headers, request.user.as_deref(), None)?;
    let prompt = target.prompt(&state, &turns, "messages").await?;
    let staged = receive_files(&state, &mut turns, "messages").await?;
    let model = target.engine.to_string();
    let id = format!("chatcmpl-{}", target.run_id);
    let created = unix_now();
    let include_usage =
        request.stream_options.as_ref().and_then(|options| options.include_usage).unwrap_or(false);
    let stream = request.stream.unwrap_or(false);
    let chunks = Chunks { id, model, created, include_usage };
    let mut response = match target.submit(&state, prompt, staged).await? {
        Submitted::Command { reply, .. } => {
            if stream {
                sse_of(futures::stream::iter(chunks.whole(&reply)))
            } else {
                Json(chunks.completion(&reply, None)).into_response()
            }
        }
        Submitted::Run(_, follower) => {
            let answer = AnswerStream::new(state.router.clone(), follower, state.shutdown.clone());
            if stream {
                let role = vec![Ok(chunks.role())];
                sse_of(rendered(role, chunks, answer))
            } else {
                let completion = answer_of(answer).await?;
                let usage = reported_usage(&completion.usage).map(|u| chat_usage(&u));
                Json(chunks.completion(&completion.answer, usage)).into_response()
            }
        }
    };
    lemon_headers(&mut response, &target.run_id, &target.session);
    Ok(response)
}

/// The run's completion, once it succeeded; its error in OpenAI's shape if not.
pub(super) async fn answer_of(mut answer: AnswerStream) -> Result<Completion, OpenAiError> {
    while let Some(step) = answer.next().await {
        if let Step::End(completion) = step {
            return match OpenAiError::of_completion(&completion) {
                None => Ok(completion),
                Some(error) => Err(error),
            };
        }
    }
    Err(crate::error::ApiError::ShuttingDown.into())
}

/// What every chunk and the whole completion share.
#[derive(Debug, Clone)]
struct Chunks {
    id: String,
    model: String,
    created: u64,
    include_usage: bool,
}

impl Chunks {
    fn chunk(&self, delta: Value, finish_reason: Option<&str>) -> Value {
        let mut chunk = json!({
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": null,
            "choices": [{
                "index": 0,
                "delta": delta,
                "logprobs": null,
                "finish_reason": finish_reason,
            }],
        });
        if self.include_usage {
            chunk["usage"] = Value::Null;
        }
        chunk
    }

    fn role(&self) -> Event {
        data(&self.chunk(json!({ "role": "assistant", "content": "" }), None))
    }

    fn content(&self, text: &str) -> Event {
        data(&self.chunk(json!({ "content": text }), None))
    }

    fn finish(&self) -> Event {
        data(&self.chunk(json!({}), Some("stop")))
    }

    fn usage(&self, usage: ChatUsage) -> Event {
        data(&json!({
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": null,
            "choices": [],
            "usage": usage,
        }))
    }

    /// A whole answer known at once (a slash command's reply), as a stream.
    fn whole(&self, text: &str) -> Vec<Result<Event, Infallible>> {
        [self.role(), self.content(text), self.finish(), done()].into_iter().map(Ok).collect()
    }
}

fn data(value: &impl Serialize) -> Event {
    // The bodies here are objects with string keys: they always serialise.
    Event::default().data(serde_json::to_string(value).unwrap_or_default())
}

fn done() -> Event {
    Event::default().data("[DONE]")
}

impl Chunks {
    /// The non-streamed object.
    fn completion(&self, content: &str, usage: Option<ChatUsage>) -> ChatCompletion {
        ChatCompletion {
            choices: vec![ChatChoice {
                finish_reason: "stop".to_owned(),
                index: 0,
                logprobs: None,
                message: ChatMessage {
                    content: content.to_owned(),
                    refusal: None,
                    role: "assistant".to_owned(),
                },
            }],
            created: self.created,
            id: self.id.clone(),
            model: self.model.clone(),
            object: "chat.completion".to_owned(),
            system_fingerprint: None,
            usage,
        }
    }
}

fn chat_usage(usage: &lemon_core::budget::usage::ReportedUsage) -> ChatUsage {
    let prompt = input_tokens(usage);
    ChatUsage {
        completion_tokens: usage.output_tokens,
        prompt_tokens: prompt,
        prompt_tokens_details: PromptTokensDetails { cached_tokens: usage.cache_read_tokens },
        total_tokens: prompt + usage.output_tokens,
    }
}

/// The chunks of a followed run, ending with `[DONE]`; a failed run ends with
/// an error object instead, as OpenAI's stream does.
impl Render for Chunks {
    type Item = Result<Event, Infallible>;

    fn text(&mut self, text: &str) -> Vec<Self::Item> {
        vec![Ok(self.content(text))]
    }

    fn end(&mut self, completion: &Completion) -> Vec<Self::Item> {
        if let Some(error) = OpenAiError::of_completion(completion) {
            return vec![Ok(data(&error.body()))];
        }
        let mut out = vec![Ok(self.finish())];
        let usage = reported_usage(&completion.usage);
        if let Some(usage) = usage.filter(|_| self.include_usage) {
            out.push(Ok(self.usage(chat_usage(&usage))));
        }
        out.push(Ok(done()));
        out
    }
}

pub(super) fn sse_of<S>(stream: S) -> Response
where
    S: futures::Stream<Item = Result<Event, Infallible>> + Send + 'static,
{
    Sse::new(stream).keep_alive(KeepAlive::default()).into_response()
}
