//! A fake LLM provider on loopback speaking the three streaming protocols the
//! gateway's clients use: OpenAI Chat Completions (`/v1/chat/completions`),
//! OpenAI Responses (`/v1/responses`) and Anthropic Messages (`/v1/messages`),
//! each also without the `/v1`.
//!
//! A test scripts what the model does with [`Turn`]s: queued with
//! [`FakeLlm::push`] (one request each, in order), or chosen by a rule on the
//! request's last message ([`FakeLlm::rule`]). A request nothing was scripted
//! for is answered at once with its last message's text ("echo").
//!
//! Everything on the wire is written from the vendors' documented event shapes
//! as literal JSON, and requests are read with this module's own parsing, so
//! the fake checks the clients instead of agreeing with them. Every request is
//! recorded (path, headers, body) for assertions.
//!
//! Every completed turn reports a usage of [`FAKE_INPUT_TOKENS`] input tokens
//! and one output token per streamed piece.
//!
//! Images in a request are read in each protocol's documented form (Chat
//! Completions `image_url` parts with a `data:` URL, Responses `input_image`
//! parts whose `image_url` is one, Messages `image` blocks with a `base64`
//! source) and decoded: [`RecordedRequest::images`] gives them. A request
//! with an image part of another shape is refused with a 400, as a provider
//! would.

use std::collections::{BTreeMap, VecDeque};
use std::convert::Infallible;
use std::fmt;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use futures::StreamExt;
use serde_json::{json, Value};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// The input tokens every completed turn reports.
pub const FAKE_INPUT_TOKENS: u64 = 21;

/// The wire protocol of a request, from its path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    ChatCompletions,
    Responses,
    Messages,
}

/// One tool call a turn makes; its arguments are streamed in the given pieces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeToolCall {
    pub id: String,
    pub name: String,
    pub argument_chunks: Vec<String>,
    /// The Responses API's namespace of the tool (Codex offers an MCP
    /// server's tools as namespace `mcp__<server>`); the other APIs have none.
    pub namespace: Option<String>,
}

impl FakeToolCall {
    pub fn new(id: &str, name: &str, argument_chunks: &[&str]) -> Self {
        FakeToolCall {
            id: id.to_owned(),
            name: name.to_owned(),
            argument_chunks: argument_chunks.iter().map(|c| (*c).to_owned()).collect(),
            namespace: None,
        }
    }

    /// The same call of a tool of `namespace` (Responses only).
    pub fn in_namespace(mut self, namespace: &str) -> Self {
        self.namespace = Some(namespace.to_owned());
        self
    }

    /// The whole arguments text.
    pub fn arguments(&self) -> String {
        self.argument_chunks.concat()
    }
}

/// What the model does for one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Turn {
    /// Streams the text in these pieces and ends the turn.
    Text(Vec<String>),
    /// Calls these tools (in parallel when more than one), after an optional text.
    ToolCalls { text: Vec<String>, calls: Vec<FakeToolCall> },
    /// Streams reasoning (summary / thinking) pieces, then the text.
    Reasoning { reasoning: Vec<String>, text: Vec<String> },
    /// Answers 429 with `Retry-After: <secs>`.
    RateLimited { retry_after_secs: u64 },
    /// Streams the text, then a provider error event (a server error /
    /// overloaded) instead of the end of the turn.
    ErrorAfter(Vec<String>),
    /// Answers 400 with the provider's context-overflow error.
    ContextOverflow,
    /// Sends the headers and the text, then nothing until the client hangs up.
    Stall(Vec<String>),
    /// Answers `status` with the provider's error body carrying `message`.
    Status { status: u16, message: String },
    /// Streams the last message's text back word by word.
    Echo,
    /// Sends the headers and the text, then resets the connection mid-stream.
    Reset(Vec<String>),
    /// Sends the headers and the text, then events that are not the protocol's
    /// (a `data:` line cut off, one that is not JSON, a JSON value of no known
    /// shape, control characters), then closes the stream without ending the turn.
    Garbage(Vec<String>),
}

fn pieces(chunks: &[&str]) -> Vec<String> {
    chunks.iter().map(|c| (*c).to_owned()).collect()
}

impl Turn {
    pub fn text(chunks: &[&str]) -> Self {
        Turn::Text(pieces(chunks))
    }

    pub fn tool_calls(calls: Vec<FakeToolCall>) -> Self {
        Turn::ToolCalls { text: Vec::new(), calls }
    }

    pub fn reasoning(reasoning: &[&str], text: &[&str]) -> Self {
        Turn::Reasoning { reasoning: pieces(reasoning), text: pieces(text) }
    }

    pub fn error_after(chunks: &[&str]) -> Self {
        Turn::ErrorAfter(pieces(chunks))
    }

    pub fn stall(chunks: &[&str]) -> Self {
        Turn::Stall(pieces(chunks))
    }

    pub fn reset(chunks: &[&str]) -> Self {
        Turn::Reset(pieces(chunks))
    }

    pub fn garbage(chunks: &[&str]) -> Self {
        Turn::Garbage(pieces(chunks))
    }
}

/// One request the fake received.
#[derive(Debug, Clone)]
pub struct RecordedRequest {
    pub path: String,
    pub protocol: Protocol,
    /// Lowercase names; the last value of a repeated header.
    pub headers: BTreeMap<String, String>,
    pub body: Value,
}

/// An image a request carried, decoded from the wire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReceivedImage {
    /// The media type the request gave (`image/png`…).
    pub mime: String,
    pub bytes: Vec<u8>,
}

impl RecordedRequest {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(&name.to_lowercase()).map(String::as_str)
    }

    /// Every image the request carries, in order, decoded.
    ///
    /// # Panics
    /// When an image part is not in the protocol's form (such a request was
    /// refused with a 400).
    pub fn images(&self) -> Vec<ReceivedImage> {
        request_images(self.protocol, &self.body).unwrap_or_else(|why| panic!("{why}"))
    }

    /// The text of the request's last message: a user text, or a tool result.
    pub fn last_message_text(&self) -> String {
        last_message_text(self.protocol, &self.body)
    }
}

/// A started fake. Clones share the server; it stops when the last clone is
/// dropped.
#[derive(Clone)]
pub struct FakeLlm {
    shared: Arc<Shared>,
    server: Arc<Server>,
}

struct Shared {
    script: Mutex<Script>,
    changes: watch::Sender<u64>,
    stop: CancellationToken,
    /// The key a request must present, when the fake checks one.
    api_key: Option<String>,
}

#[derive(Default)]
struct Script {
    queue: VecDeque<Turn>,
    /// (needle, turn): the first rule whose needle the last message contains.
    rules: Vec<(String, Turn)>,
    /// (model, turn): a request for this model, before the needles and the queue.
    model_rules: Vec<(String, Turn)>,
    requests: Vec<RecordedRequest>,
}

struct Server {
    addr: SocketAddr,
    stop: CancellationToken,
    task: Mutex<Option<JoinHandle<()>>>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.cancel();
        if let Some(task) = lock(&self.task).take() {
            task.abort();
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl fmt::Debug for FakeLlm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FakeLlm")
            .field("addr", &self.server.addr)
            .field("checks_key", &self.shared.api_key.is_some())
            .finish_non_exhaustive()
    }
}

/// How to start a [`FakeLlm`].
#[derive(Debug, Clone, Default)]
pub struct FakeLlmBuilder {
    api_key: Option<String>,
}

impl FakeLlmBuilder {
    /// Requests must carry this key (`Authorization: Bearer` on the OpenAI
    /// paths, `x-api-key` on Anthropic's), or get the provider's 401.
    pub fn api_key(mut self, key: &str) -> Self {
        self.api_key = Some(key.to_owned());
        self
    }

    /// Binds `127.0.0.1:0` and serves.
    ///
    /// # Panics
    /// When loopback cannot be bound.
    pub async fn start(self) -> FakeLlm {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binding 127.0.0.1:0 for the fake LLM");
        let addr = listener.local_addr().expect("the fake LLM's address");
        let stop = CancellationToken::new();
        let shared = Arc::new(Shared {
            script: Mutex::new(Script::default()),
            changes: watch::Sender::new(0),
            stop: stop.clone(),
            api_key: self.api_key,
        });
        let router = Router::new()
            .route("/v1/chat/completions", post(handle))
            .route("/chat/completions", post(handle))
            .route("/v1/responses", post(handle))
            .route("/responses", post(handle))
            .route("/v1/messages", post(handle))
            .route("/messages", post(handle))
            .fallback(|| async { (StatusCode::NOT_FOUND, "no such endpoint on the fake LLM") })
            .with_state(shared.clone());
        let shutdown = stop.clone().cancelled_owned();
        // Every streamed piece goes out at once, as a provider's would, not
        // held back by Nagle until the client acknowledges the previous one.
        let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
            let _ = tcp.set_nodelay(true);
        });
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, router).with_graceful_shutdown(shutdown).await;
        });
        let server = Arc::new(Server { addr, stop, task: Mutex::new(Some(task)) });
        FakeLlm { shared, server }
    }
}

impl FakeLlm {
    pub fn builder() -> FakeLlmBuilder {
        FakeLlmBuilder::default()
    }

    /// A fake that checks no key.
    pub async fn start() -> FakeLlm {
        FakeLlm::builder().start().await
    }

    pub fn addr(&self) -> SocketAddr {
        self.server.addr
    }

    /// `http://127.0.0.1:<port>/v1`: the base URL of the OpenAI clients (and
    /// of Anthropic's, which then posts to `/v1/messages`).
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.server.addr)
    }

    /// `http://127.0.0.1:<port>`, the root (Anthropic's base URL form).
    pub fn root_url(&self) -> String {
        format!("http://{}", self.server.addr)
    }

    /// Queues `turn` for the next request no rule matches.
    pub fn push(&self, turn: Turn) {
        lock(&self.shared.script).queue.push_back(turn);
    }

    /// Answers every request whose last message contains `needle` with
    /// `turn` (before the queue; the earliest matching rule wins).
    pub fn rule(&self, needle: &str, turn: Turn) {
        lock(&self.shared.script).rules.push((needle.to_owned(), turn));
    }

    /// Answers every request whose `model` is `model` with `turn`, before the
    /// needle rules and the queue (e.g. a CLI's title requests to its small
    /// model, which come in any order beside the main ones).
    pub fn rule_for_model(&self, model: &str, turn: Turn) {
        lock(&self.shared.script).model_rules.push((model.to_owned(), turn));
    }

    /// Every request so far, in arrival order.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        lock(&self.shared.script).requests.clone()
    }

    /// The images of the last request, decoded; none before any request.
    pub fn last_images(&self) -> Vec<ReceivedImage> {
        self.requests().last().map(RecordedRequest::images).unwrap_or_default()
    }

    /// Turns queued and not yet served.
    pub fn queued(&self) -> usize {
        lock(&self.shared.script).queue.len()
    }

    /// Waits (bounded by the tests' patience) until `count` requests arrived.
    pub async fn wait_for_requests(&self, count: usize) -> Vec<RecordedRequest> {
        self.wait_for_requests_for(lemon_core::testing::PATIENCE, count).await
    }

    /// Waits until `count` requests arrived, at most `patience` (for clients
    /// that start slowly, such as the vendor CLIs).
    pub async fn wait_for_requests_for(
        &self,
        patience: std::time::Duration,
        count: usize,
    ) -> Vec<RecordedRequest> {
        let mut changes = self.shared.changes.subscribe();
        lemon_core::testing::within_for(
            patience,
            &format!("{count} requests to the fake LLM"),
            async {
                loop {
                    let requests = self.requests();
                    if requests.len() >= count {
                        return requests;
                    }
                    if changes.changed().await.is_err() {
                        return self.requests();
                    }
                }
            },
        )
        .await
    }
}

async fn handle(
    State(shared): State<Arc<Shared>>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = uri.path().to_owned();
    let protocol = if path.ends_with("/chat/completions") {
        Protocol::ChatCompletions
    } else if path.ends_with("/responses") {
        Protocol::Responses
    } else {
        Protocol::Messages
    };
    let Ok(body) = serde_json::from_slice::<Value>(&body) else {
        return error_response(protocol, 400, "invalid_request_error", "the body is not JSON");
    };
    let headers: BTreeMap<String, String> = headers
        .iter()
        .map(|(name, value)| {
            (name.as_str().to_owned(), String::from_utf8_lossy(value.as_bytes()).into_owned())
        })
        .collect();
    let request = RecordedRequest { path, protocol, headers, body };
    let turn = {
        let mut script = lock(&shared.script);
        script.requests.push(request.clone());
        let last = request.last_message_text();
        let model = request.body.get("model").and_then(Value::as_str).unwrap_or_default();
        let by_model = script.model_rules.iter().find(|(name, _)| name == model);
        let ruled = by_model
            .or_else(|| script.rules.iter().find(|(needle, _)| last.contains(needle.as_str())));
        match ruled {
            Some((_, turn)) => turn.clone(),
            None => script.queue.pop_front().unwrap_or(Turn::Echo),
        }
    };
    shared.changes.send_modify(|n| *n += 1);
    if let Some(refusal) = check_request(&shared, &request) {
        return refusal;
    }
    let model = request.body.get("model").and_then(Value::as_str).unwrap_or("fake").to_owned();
    let turn = match turn {
        Turn::Echo => {
            let text = request.last_message_text();
            Turn::Text(text.split_inclusive(' ').map(str::to_owned).collect())
        }
        other => other,
    };
    match turn {
        Turn::RateLimited { retry_after_secs } => {
            let mut response = rate_limited(protocol);
            response
                .headers_mut()
                .insert("retry-after", retry_after_secs.to_string().parse().expect("a number"));
            response
        }
        Turn::ContextOverflow => context_overflow(protocol),
        Turn::Status { status, message } => {
            let kind = match status {
                401 => "authentication_error",
                403 => "permission_error",
                429 => "rate_limit_error",
                529 => "overloaded_error",
                500..=599 => "api_error",
                _ => "invalid_request_error",
            };
            error_response(protocol, status, kind, &message)
        }
        Turn::Stall(text) => {
            let frames = match protocol {
                Protocol::ChatCompletions => chat::prefix(&model, &text),
                Protocol::Responses => responses::prefix(&model, &text),
                Protocol::Messages => messages::prefix(&model, &text),
            };
            stream_response(frames, Some(shared.stop.clone()))
        }
        Turn::Reset(text) => broken_stream_response(prefix(protocol, &model, &text)),
        Turn::Garbage(text) => {
            let mut frames = prefix(protocol, &model, &text);
            frames.extend(GARBAGE_EVENTS.iter().map(|event| (*event).to_owned()));
            stream_response(frames, None)
        }
        turn => {
            let frames = match protocol {
                Protocol::ChatCompletions => chat::frames(&model, &turn),
                Protocol::Responses => responses::frames(&model, &turn),
                Protocol::Messages => messages::frames(&model, &turn),
            };
            stream_response(frames, None)
        }
    }
}

/// The key check and the protocol's required fields.
fn check_request(shared: &Shared, request: &RecordedRequest) -> Option<Response> {
    let protocol = request.protocol;
    if protocol == Protocol::Messages && request.header("anthropic-version").is_none() {
        return Some(error_response(
            protocol,
            400,
            "invalid_request_error",
            "anthropic-version: header is required",
        ));
    }
    if let Some(key) = &shared.api_key {
        let presented = match protocol {
            Protocol::Messages => request.header("x-api-key").map(str::to_owned),
            _ => request
                .header("authorization")
                .and_then(|v| v.strip_prefix("Bearer "))
                .map(str::to_owned),
        };
        if presented.as_deref() != Some(key.as_str()) {
            // Like a careless provider, the refusal repeats the key it got, so
            // tests see that the client keeps it out of its errors.
            let message = match protocol {
                Protocol::Messages => format!("invalid x-api-key {}", presented.unwrap_or_default()),
                _ => format!(
                    "Incorrect API key provided: {}. You can find your API key at https://platform.openai.com/account/api-keys.",
                    presented.unwrap_or_default()
                ),
            };
            let kind = match protocol {
                Protocol::Messages => "authentication_error",
                _ => "invalid_request_error",
            };
            return Some(error_response(protocol, 401, kind, &message));
        }
    }
    if request.body.get("stream").and_then(Value::as_bool) != Some(true) {
        return Some(error_response(
            protocol,
            400,
            "invalid_request_error",
            "the fake LLM only streams: `stream` must be true",
        ));
    }
    if let Err(why) = request_images(protocol, &request.body) {
        return Some(error_response(protocol, 400, "invalid_request_error", &why));
    }
    if protocol == Protocol::Messages && request.body.get("max_tokens").is_none() {
        return Some(error_response(
            protocol,
            400,
            "invalid_request_error",
            "max_tokens: Field required",
        ));
    }
    None
}

/// A streamed 200. Each event goes out in two body frames split in its
/// middle, so clients see events cut across reads.
fn stream_response(events: Vec<String>, hang: Option<CancellationToken>) -> Response {
    let mut frames = Vec::with_capacity(events.len() * 2);
    for event in events {
        let bytes = Bytes::from(event);
        let half = bytes.len() / 2;
        frames.push(Ok::<_, Infallible>(bytes.slice(..half)));
        frames.push(Ok(bytes.slice(half..)));
    }
    let head = futures::stream::iter(frames);
    let body = match hang {
        None => Body::from_stream(head),
        Some(stop) => Body::from_stream(
            head.chain(
                futures::stream::once(async move { stop.cancelled_owned().await })
                    .filter_map(|()| async { None::<Result<Bytes, Infallible>> }),
            ),
        ),
    };
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(body)
        .expect("a valid response")
}

/// The start of a turn that streams `text` and has not ended.
fn prefix(protocol: Protocol, model: &str, text: &[String]) -> Vec<String> {
    match protocol {
        Protocol::ChatCompletions => chat::prefix(model, text),
        Protocol::Responses => responses::prefix(model, text),
        Protocol::Messages => messages::prefix(model, text),
    }
}

/// What a garbled stream sends after its text: none of it is an event of any
/// of the three protocols.
const GARBAGE_EVENTS: [&str; 4] = [
    "data: {\"choices\": [{\"delta\": \n\n",
    "event: content_block_delta\ndata: not json at all\n\n",
    "data: [1, 2, 3]\n\n",
    "data: \u{fffd}\u{0}\u{1}\n\n",
];

/// A streamed 200 whose body fails after `events`: the server resets the
/// connection in the middle of the stream.
fn broken_stream_response(events: Vec<String>) -> Response {
    let head = futures::stream::iter(events.into_iter().map(|e| Ok(Bytes::from(e))));
    let reset = futures::stream::once(async {
        Err::<Bytes, std::io::Error>(std::io::Error::other("connection reset by the fake"))
    });
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(head.chain(reset)))
        .expect("a valid response")
}

fn json_response(status: u16, body: Value) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (status, [(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
}

/// The provider's error body: OpenAI's `{"error": {message, type, param, code}}`
/// or Anthropic's `{"type": "error", "error": {type, message}, "request_id"}`.
fn error_response(protocol: Protocol, status: u16, kind: &str, message: &str) -> Response {
    let body = match protocol {
        Protocol::Messages => json!({
            "type": "error",
            "error": {"type": kind, "message": message},
            "request_id": "req_fake",
        }),
        _ => json!({"error": {"message": message, "type": kind, "param": null, "code": null}}),
    };
    json_response(status, body)
}

fn rate_limited(protocol: Protocol) -> Response {
    match protocol {
        Protocol::Messages => error_response(
            protocol,
            429,
            "rate_limit_error",
            "Number of request tokens has exceeded your per-minute rate limit",
        ),
        _ => json_response(
            429,
            json!({"error": {
                "message": "Rate limit reached for requests. Please try again in 1s.",
                "type": "requests",
                "param": null,
                "code": "rate_limit_exceeded",
            }}),
        ),
    }
}

fn context_overflow(protocol: Protocol) -> Response {
    match protocol {
        Protocol::ChatCompletions => json_response(
            400,
            json!({"error": {
                "message": "This model's maximum context length is 128000 tokens. However, your messages resulted in 130412 tokens. Please reduce the length of the messages.",
                "type": "invalid_request_error",
                "param": "messages",
                "code": "context_length_exceeded",
            }}),
        ),
        Protocol::Responses => json_response(
            400,
            json!({"error": {
                "message": "Your input exceeds the context window of this model. Please adjust your input and try again.",
                "type": "invalid_request_error",
                "param": "input",
                "code": "context_length_exceeded",
            }}),
        ),
        Protocol::Messages => error_response(
            protocol,
            400,
            "invalid_request_error",
            "prompt is too long: 208656 tokens > 200000 maximum",
        ),
    }
}

/// The text of a content value: a string, or the text parts of an array.
fn content_text(content: &Value) -> String {
    match content {
        Value::String(text) => text.clone(),
        Value::Array(parts) => parts
            .iter()
            .map(|part| match part.get("type").and_then(Value::as_str) {
                Some("tool_result") => part.get("content").map(content_text).unwrap_or_default(),
                _ => part.get("text").and_then(Value::as_str).unwrap_or_default().to_owned(),
            })
            .collect::<Vec<_>>()
            .join(""),
        _ => String::new(),
    }
}

fn last_message_text(protocol: Protocol, body: &Value) -> String {
    match protocol {
        Protocol::ChatCompletions | Protocol::Messages => body
            .get("messages")
            .and_then(Value::as_array)
            .and_then(|messages| messages.last())
            .and_then(|message| message.get("content"))
            .map(content_text)
            .unwrap_or_default(),
        Protocol::Responses => match body.get("input") {
            Some(Value::String(text)) => text.clone(),
            Some(Value::Array(items)) => items
                .last()
                .map(|item| match item.get("output") {
                    Some(output) => content_text(output),
                    None => item.get("content").map(content_text).unwrap_or_default(),
                })
                .unwrap_or_default(),
            _ => String::new(),
        },
    }
}

/// The images of a request's messages, in order, decoded; why not when an
/// image part is not in the protocol's form.
fn request_images(protocol: Protocol, body: &Value) -> Result<Vec<ReceivedImage>, String> {
    let list = |key: &str| body.get(key).and_then(Value::as_array).cloned().unwrap_or_default();
    let items = match protocol {
        Protocol::ChatCompletions | Protocol::Messages => list("messages"),
        Protocol::Responses => list("input"),
    };
    let mut images = Vec::new();
    for item in &items {
        let Some(Value::Array(parts)) = item.get("content") else { continue };
        for part in parts {
            let kind = part.get("type").and_then(Value::as_str).unwrap_or_default();
            let image = match (protocol, kind) {
                (Protocol::ChatCompletions, "image_url") => {
                    let url = part.pointer("/image_url/url").and_then(Value::as_str);
                    data_url(url.ok_or("an image_url part without image_url.url")?)?
                }
                (Protocol::Responses, "input_image") => {
                    let url = part.get("image_url").and_then(Value::as_str);
                    data_url(url.ok_or("an input_image part whose image_url is not a string")?)?
                }
                (Protocol::Messages, "image") => {
                    let source = part.get("source").ok_or("an image block without a source")?;
                    if source.get("type").and_then(Value::as_str) != Some("base64") {
                        return Err(format!("source.type: expected \"base64\" in {source}"));
                    }
                    let field = |key: &str| {
                        source
                            .get(key)
                            .and_then(Value::as_str)
                            .ok_or_else(|| format!("source.{key}: Field required"))
                    };
                    ReceivedImage {
                        mime: field("media_type")?.to_owned(),
                        bytes: base64(field("data")?)?,
                    }
                }
                (_, "image_url" | "input_image" | "image") => {
                    return Err(format!("a {kind} part is not an image of this API"));
                }
                _ => continue,
            };
            if !["image/png", "image/jpeg", "image/gif", "image/webp"]
                .contains(&image.mime.as_str())
            {
                return Err(format!("unsupported image type {}", image.mime));
            }
            images.push(image);
        }
    }
    Ok(images)
}

/// `data:<mime>;base64,<data>` decoded.
fn data_url(url: &str) -> Result<ReceivedImage, String> {
    let rest = url.strip_prefix("data:").ok_or("the image URL is not a data: URL")?;
    let (mime, data) = rest.split_once(";base64,").ok_or("the data: URL is not base64")?;
    Ok(ReceivedImage { mime: mime.to_owned(), bytes: base64(data)? })
}

fn base64(data: &str) -> Result<Vec<u8>, String> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD
        .decode(data)
        .map_err(|e| format!("invalid base64 image data: {e}"))
}

/// An SSE event with only `data:`.
fn data(value: &Value) -> String {
    format!("data: {value}\n\n")
}

/// An SSE event with `event:` and `data:`.
fn named(name: &str, value: &Value) -> String {
    format!("event: {name}\ndata: {value}\n\n")
}

/// The pieces a turn streams, for its usage.
fn output_count(turn: &Turn) -> u64 {
    let n = match turn {
        Turn::Text(text)
        | Turn::ErrorAfter(text)
        | Turn::Stall(text)
        | Turn::Reset(text)
        | Turn::Garbage(text) => text.len(),
        Turn::ToolCalls { text, calls } => {
            text.len() + calls.iter().map(|c| c.argument_chunks.len() + 1).sum::<usize>()
        }
        Turn::Reasoning { reasoning, text } => reasoning.len() + text.len(),
        _ => 0,
    };
    n as u64
}

/// OpenAI Chat Completions chunks: `data: {chat.completion.chunk}` lines,
/// `usage: null` on all but the extra usage chunk, then `data: [DONE]`.
mod chat {
    use super::*;

    fn chunk(model: &str, delta: Value, finish: Option<&str>) -> String {
        data(&json!({
            "id": "chatcmpl-fake",
            "object": "chat.completion.chunk",
            "created": 1_700_000_000,
            "model": model,
            "system_fingerprint": "fp_fake",
            "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}],
            "usage": null,
        }))
    }

    pub(super) fn prefix(model: &str, text: &[String]) -> Vec<String> {
        let mut out = vec![chunk(model, json!({"role": "assistant", "content": ""}), None)];
        out.extend(text.iter().map(|t| chunk(model, json!({"content": t}), None)));
        out
    }

    pub(super) fn frames(model: &str, turn: &Turn) -> Vec<String> {
        let (reasoning, text, calls): (&[String], &[String], &[FakeToolCall]) = match turn {
            Turn::Text(text) | Turn::ErrorAfter(text) => (&[], text, &[]),
            Turn::ToolCalls { text, calls } => (&[], text, calls),
            Turn::Reasoning { reasoning, text } => (reasoning, text, &[]),
            _ => (&[], &[], &[]),
        };
        let mut out = vec![chunk(model, json!({"role": "assistant", "content": ""}), None)];
        for piece in reasoning {
            out.push(chunk(model, json!({"reasoning_content": piece}), None));
        }
        for piece in text {
            out.push(chunk(model, json!({"content": piece}), None));
        }
        if let Turn::ErrorAfter(_) = turn {
            out.push(data(&json!({"error": {
                "message": "The server had an error while processing your request. Sorry about that!",
                "type": "server_error",
                "param": null,
                "code": null,
            }})));
            return out;
        }
        for (index, call) in calls.iter().enumerate() {
            out.push(chunk(
                model,
                json!({"tool_calls": [{
                    "index": index,
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": ""},
                }]}),
                None,
            ));
            for piece in &call.argument_chunks {
                out.push(chunk(
                    model,
                    json!({"tool_calls": [{"index": index, "function": {"arguments": piece}}]}),
                    None,
                ));
            }
        }
        let finish = if calls.is_empty() { "stop" } else { "tool_calls" };
        out.push(chunk(model, json!({}), Some(finish)));
        let output = output_count(turn);
        out.push(data(&json!({
            "id": "chatcmpl-fake",
            "object": "chat.completion.chunk",
            "created": 1_700_000_000,
            "model": model,
            "system_fingerprint": "fp_fake",
            "choices": [],
            "usage": {
                "prompt_tokens": FAKE_INPUT_TOKENS,
                "completion_tokens": output,
                "total_tokens": FAKE_INPUT_TOKENS + output,
            },
        })));
        out.push("data: [DONE]\n\n".to_owned());
        out
    }
}

/// OpenAI Responses events: `event: <type>` lines whose JSON carries the same
/// `type` and a `sequence_number`; no `[DONE]`.
mod responses {
    use super::*;

    struct Writer {
        out: Vec<String>,
        sequence: u64,
    }

    impl Writer {
        fn event(&mut self, kind: &str, mut body: Value) {
            body["type"] = json!(kind);
            body["sequence_number"] = json!(self.sequence);
            self.sequence += 1;
            self.out.push(named(kind, &body));
        }
    }

    fn response(model: &str, status: &str, output: Value, usage: Value) -> Value {
        json!({
            "id": "resp_fake",
            "object": "response",
            "created_at": 1_700_000_000,
            "status": status,
            "model": model,
            "output": output,
            "usage": usage,
        })
    }

    fn start(model: &str) -> Writer {
        let mut w = Writer { out: Vec::new(), sequence: 0 };
        w.event(
            "response.created",
            json!({"response": response(model, "in_progress", json!([]), Value::Null)}),
        );
        w.event(
            "response.in_progress",
            json!({"response": response(model, "in_progress", json!([]), Value::Null)}),
        );
        w
    }

    /// The message item's opening and its text deltas.
    fn text_open(w: &mut Writer, index: usize, text: &[String]) {
        w.event(
            "response.output_item.added",
            json!({"output_index": index, "item": {
                "id": "msg_fake", "type": "message", "status": "in_progress",
                "role": "assistant", "content": [],
            }}),
        );
        w.event(
            "response.content_part.added",
            json!({"item_id": "msg_fake", "output_index": index, "content_index": 0,
                   "part": {"type": "output_text", "text": "", "annotations": []}}),
        );
        for piece in text {
            w.event(
                "response.output_text.delta",
                json!({"item_id": "msg_fake", "output_index": index, "content_index": 0,
                       "delta": piece, "logprobs": []}),
            );
        }
    }

    fn text_close(w: &mut Writer, index: usize, text: &[String]) -> Value {
        let full = text.concat();
        w.event(
            "response.output_text.done",
            json!({"item_id": "msg_fake", "output_index": index, "content_index": 0,
                   "text": full, "logprobs": []}),
        );
        let part = json!({"type": "output_text", "text": full, "annotations": []});
        w.event(
            "response.content_part.done",
            json!({"item_id": "msg_fake", "output_index": index, "content_index": 0, "part": part}),
        );
        let item = json!({"id": "msg_fake", "type": "message", "status": "completed",
                          "role": "assistant", "content": [part]});
        w.event("response.output_item.done", json!({"output_index": index, "item": item}));
        item
    }

    pub(super) fn prefix(model: &str, text: &[String]) -> Vec<String> {
        let mut w = start(model);
        text_open(&mut w, 0, text);
        w.out
    }

    pub(super) fn frames(model: &str, turn: &Turn) -> Vec<String> {
        let mut w = start(model);
        let mut output = Vec::new();
        let (reasoning, text, calls): (&[String], &[String], &[FakeToolCall]) = match turn {
            Turn::Text(text) | Turn::ErrorAfter(text) => (&[], text, &[]),
            Turn::ToolCalls { text, calls } => (&[], text, calls),
            Turn::Reasoning { reasoning, text } => (reasoning, text, &[]),
            _ => (&[], &[], &[]),
        };
        if !reasoning.is_empty() {
            let index = output.len();
            w.event(
                "response.output_item.added",
                json!({"output_index": index, "item": {"id": "rs_fake", "type": "reasoning", "summary": []}}),
            );
            w.event(
                "response.reasoning_summary_part.added",
                json!({"item_id": "rs_fake", "output_index": index, "summary_index": 0,
                       "part": {"type": "summary_text", "text": ""}}),
            );
            for piece in reasoning {
                w.event(
                    "response.reasoning_summary_text.delta",
                    json!({"item_id": "rs_fake", "output_index": index, "summary_index": 0, "delta": piece}),
                );
            }
            let full = reasoning.concat();
            w.event(
                "response.reasoning_summary_text.done",
                json!({"item_id": "rs_fake", "output_index": index, "summary_index": 0, "text": full}),
            );
            let item = json!({"id": "rs_fake", "type": "reasoning",
                              "summary": [{"type": "summary_text", "text": full}]});
            w.event("response.output_item.done", json!({"output_index": index, "item": item}));
            output.push(item);
        }
        if !text.is_empty() || matches!(turn, Turn::ErrorAfter(_)) {
            let index = output.len();
            text_open(&mut w, index, text);
            if let Turn::ErrorAfter(_) = turn {
                w.event(
                    "error",
                    json!({"code": "server_error",
                           "message": "An error occurred while processing your request.",
                           "param": null}),
                );
                return w.out;
            }
            output.push(text_close(&mut w, index, text));
        }
        for (n, call) in calls.iter().enumerate() {
            let index = output.len();
            let item_id = format!("fc_fake_{n}");
            let mut added = json!({
                "id": item_id, "type": "function_call", "status": "in_progress",
                "arguments": "", "call_id": call.id, "name": call.name,
            });
            if let Some(namespace) = &call.namespace {
                added["namespace"] = json!(namespace);
            }
            w.event("response.output_item.added", json!({"output_index": index, "item": added}));
            for piece in &call.argument_chunks {
                w.event(
                    "response.function_call_arguments.delta",
                    json!({"item_id": item_id, "output_index": index, "delta": piece}),
                );
            }
            let arguments = call.arguments();
            w.event(
                "response.function_call_arguments.done",
                json!({"item_id": item_id, "output_index": index, "arguments": arguments}),
            );
            let mut item = json!({"id": item_id, "type": "function_call", "status": "completed",
                                  "arguments": arguments, "call_id": call.id, "name": call.name});
            if let Some(namespace) = &call.namespace {
                item["namespace"] = json!(namespace);
            }
            w.event("response.output_item.done", json!({"output_index": index, "item": item}));
            output.push(item);
        }
        let tokens = output_count(turn);
        let usage = json!({
            "input_tokens": FAKE_INPUT_TOKENS,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": FAKE_INPUT_TOKENS + tokens,
        });
        w.event(
            "response.completed",
            json!({"response": response(model, "completed", json!(output), usage)}),
        );
        w.out
    }
}

/// Anthropic Messages events: `event: <type>` lines whose JSON carries the
/// same `type`; `message_start`, content blocks, `message_delta`, `message_stop`.
mod messages {
    use super::*;

    fn start(model: &str) -> Vec<String> {
        vec![
            named(
                "message_start",
                &json!({"type": "message_start", "message": {
                    "id": "msg_fake", "type": "message", "role": "assistant", "content": [],
                    "model": model, "stop_reason": null, "stop_sequence": null,
                    "usage": {"input_tokens": FAKE_INPUT_TOKENS, "output_tokens": 1},
                }}),
            ),
            named("ping", &json!({"type": "ping"})),
        ]
    }

    fn block_start(index: usize, block: Value) -> String {
        named(
            "content_block_start",
            &json!({"type": "content_block_start", "index": index, "content_block": block}),
        )
    }

    fn block_delta(index: usize, delta: Value) -> String {
        named(
            "content_block_delta",
            &json!({"type": "content_block_delta", "index": index, "delta": delta}),
        )
    }

    fn block_stop(index: usize) -> String {
        named("content_block_stop", &json!({"type": "content_block_stop", "index": index}))
    }

    pub(super) fn prefix(model: &str, text: &[String]) -> Vec<String> {
        let mut out = start(model);
        out.push(block_start(0, json!({"type": "text", "text": ""})));
        for piece in text {
            out.push(block_delta(0, json!({"type": "text_delta", "text": piece})));
        }
        out
    }

    pub(super) fn frames(model: &str, turn: &Turn) -> Vec<String> {
        let (reasoning, text, calls): (&[String], &[String], &[FakeToolCall]) = match turn {
            Turn::Text(text) | Turn::ErrorAfter(text) => (&[], text, &[]),
            Turn::ToolCalls { text, calls } => (&[], text, calls),
            Turn::Reasoning { reasoning, text } => (reasoning, text, &[]),
            _ => (&[], &[], &[]),
        };
        let mut out = start(model);
        let mut index = 0;
        if !reasoning.is_empty() {
            out.push(block_start(
                index,
                json!({"type": "thinking", "thinking": "", "signature": ""}),
            ));
            for piece in reasoning {
                out.push(block_delta(index, json!({"type": "thinking_delta", "thinking": piece})));
            }
            out.push(block_delta(index, json!({"type": "signature_delta", "signature": "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds"})));
            out.push(block_stop(index));
            index += 1;
        }
        if !text.is_empty() || matches!(turn, Turn::ErrorAfter(_)) {
            out.push(block_start(index, json!({"type": "text", "text": ""})));
            for piece in text {
                out.push(block_delta(index, json!({"type": "text_delta", "text": piece})));
            }
            if let Turn::ErrorAfter(_) = turn {
                out.push(named(
                    "error",
                    &json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
                ));
                return out;
            }
            out.push(block_stop(index));
            index += 1;
        }
        for call in calls {
            out.push(block_start(
                index,
                json!({"type": "tool_use", "id": call.id, "name": call.name, "input": {}}),
            ));
            out.push(block_delta(index, json!({"type": "input_json_delta", "partial_json": ""})));
            for piece in &call.argument_chunks {
                out.push(block_delta(
                    index,
                    json!({"type": "input_json_delta", "partial_json": piece}),
                ));
            }
            out.push(block_stop(index));
            index += 1;
        }
        let stop = if calls.is_empty() { "end_turn" } else { "tool_use" };
        out.push(named(
            "message_delta",
            &json!({"type": "message_delta",
                    "delta": {"stop_reason": stop, "stop_sequence": null},
                    "usage": {"output_tokens": output_count(turn)}}),
        ));
        out.push(named("message_stop", &json!({"type": "message_stop"})));
        out
    }
}
