//! LLM clients the native engine talks to: one provider-neutral request and
//! event model ([`LlmRequest`], [`LlmEvent`], [`LlmError`]) and the
//! [`LlmClient`] trait each wire protocol implements.
//!
//! A client streams one model turn: text deltas as they arrive, reasoning,
//! each tool call once its arguments are complete, the usage, then `Done`.
//!
//! # Layout
//! - [`sse`]: the incremental Server-Sent Events parser all three read with.
//! - [`openai_chat`], [`openai_responses`], [`anthropic`]: the wire protocols.
//! - [`retry`]: retries before any output, with backoff and `Retry-After`.
//! - `tools_json`: each client's `tools` array, serialised once per set of specs.
//! - [`build_client`]: a [`Provider`] and [`ClientOptions`] to a retrying client.
//!
//! The API key travels in a sensitive header only: `Debug` of every client
//! prints `SecretValue(***)` and error messages have it replaced by `***`.
//!
//! A user message may carry images ([`ImageInput`]); each protocol sends them
//! in its own form (a `data:` URL for OpenAI's two, a base64 source block for
//! Anthropic's), and a message without images goes out exactly as before.

use std::fmt;
use std::path::PathBuf;
use std::pin::Pin;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use base64::display::Base64Display;
use base64::engine::general_purpose::STANDARD;
use futures::Stream;
use lemon_core::secrets::SecretValue;
use lemon_core::tool::ToolSpec;
use serde::Serialize;

pub mod anthropic;
pub(crate) mod http;
pub mod openai_chat;
pub mod openai_responses;
pub mod retry;
pub mod sse;
mod tools_json;

pub use anthropic::AnthropicClient;
pub use http::is_context_overflow;
pub use openai_chat::OpenAiChatClient;
pub use openai_responses::OpenAiResponsesClient;
pub use retry::{RetryPolicy, RetryingClient};

/// One tool call the model asked for; `arguments` is the raw JSON text the
/// model produced (assembled from every delta), not yet parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    pub arguments: String,
}

/// An image shown to the model with a user message: PNG, JPEG, GIF or WebP.
#[derive(Clone, PartialEq, Eq)]
pub struct ImageInput {
    /// `image/png`, `image/jpeg`, `image/gif` or `image/webp`.
    pub mime: String,
    /// The image's bytes, base64-encoded on the wire. Shared: every request
    /// of a run carries the whole history.
    pub data: bytes::Bytes,
    /// The file the image was read from. A session keeps this reference
    /// instead of the bytes; an image without a file is not kept.
    pub path: Option<PathBuf>,
}

impl ImageInput {
    pub fn new(mime: impl Into<String>, data: impl Into<bytes::Bytes>) -> Self {
        ImageInput { mime: mime.into(), data: data.into(), path: None }
    }

    /// `data:<mime>;base64,<data>`, the form both OpenAI protocols take.
    pub fn data_url(&self) -> String {
        DataUrl(self).to_string()
    }
}

impl fmt::Debug for ImageInput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ImageInput")
            .field("mime", &self.mime)
            .field("bytes", &self.data.len())
            .field("path", &self.path)
            .finish()
    }
}

/// An image's bytes in standard base64, written straight into the request
/// body (no copy of the encoded text is made).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Base64<'a>(pub(crate) &'a [u8]);

impl Serialize for Base64<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(&Base64Display::new(self.0, &STANDARD))
    }
}

/// An image as a `data:` URL, written straight into the request body.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DataUrl<'a>(pub(crate) &'a ImageInput);

impl fmt::Display for DataUrl<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let image = self.0;
        write!(f, "data:{};base64,{}", image.mime, Base64Display::new(&image.data, &STANDARD))
    }
}

impl Serialize for DataUrl<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

/// One message of a conversation, in the order the model saw them. A user
/// message carries the images sent with it (most have none).
#[derive(Debug, Clone, PartialEq)]
pub enum ChatMessage {
    User {
        text: String,
        images: Vec<ImageInput>,
    },
    /// What the model answered in one turn: its text and the tools it called.
    Assistant {
        text: String,
        tool_calls: Vec<ToolCall>,
    },
    /// The result of one tool call, sent back with the call's id.
    ToolResult {
        call_id: String,
        name: String,
        content: String,
        is_error: bool,
    },
}

impl ChatMessage {
    /// A user message of text alone.
    pub fn user(text: impl Into<String>) -> Self {
        ChatMessage::User { text: text.into(), images: Vec::new() }
    }

    /// The images the message carries: a user message's, none for the rest.
    pub fn images(&self) -> &[ImageInput] {
        match self {
            ChatMessage::User { images, .. } => images,
            _ => &[],
        }
    }
}

/// One model turn to stream.
#[derive(Debug, Clone, PartialEq)]
pub struct LlmRequest {
    pub model: String,
    pub system: Option<String>,
    pub messages: Vec<ChatMessage>,
    /// Shared with the run, which offers the same tools in every turn.
    pub tools: Arc<[ToolSpec]>,
    pub max_tokens: Option<u32>,
    pub temperature: Option<f32>,
}

/// Tokens as the provider counts them for one turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LlmUsage {
    pub input_tokens: u64,
    pub output_tokens: u64,
}

/// Why the model stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopReason {
    /// The answer is complete.
    EndTurn,
    /// The model wants the tool calls it sent run.
    ToolUse,
    /// `max_tokens` cut the answer.
    MaxTokens,
    /// Any other reason the provider gave, verbatim.
    Other(String),
}

/// What a streamed turn produces, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum LlmEvent {
    TextDelta(String),
    /// Reasoning / thinking text, shown as a `reasoning` action.
    ReasoningDelta(String),
    /// A tool call whose arguments are complete.
    ToolCall(ToolCall),
    Usage(LlmUsage),
    /// The last event of a turn.
    Done(StopReason),
}

/// Why a turn failed. `RateLimited`, `Server`, `Network` and `Stalled` are
/// retryable before any output was streamed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LlmError {
    #[error("authentication failed: {message}")]
    Auth { message: String },
    #[error("rate limited: {message}")]
    RateLimited { retry_after: Option<Duration>, message: String },
    /// The request does not fit the model's context window.
    #[error("context overflow: {message}")]
    ContextOverflow { message: String },
    #[error("server error {status}: {message}")]
    Server { status: u16, message: String },
    #[error("network error: {message}")]
    Network { message: String },
    /// No byte arrived for the stall timeout.
    #[error("the stream stalled")]
    Stalled,
    /// The provider sent something this client cannot read, or refused the
    /// request (a 4xx that is none of the above).
    #[error("{message}")]
    Invalid { message: String },
}

impl LlmError {
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            LlmError::RateLimited { .. }
                | LlmError::Server { .. }
                | LlmError::Network { .. }
                | LlmError::Stalled
        )
    }
}

/// The events of one turn.
pub type LlmStream = Pin<Box<dyn Stream<Item = Result<LlmEvent, LlmError>> + Send>>;

/// A provider's wire protocol.
#[async_trait]
pub trait LlmClient: Send + Sync + fmt::Debug + 'static {
    /// Sends `request` and streams the turn. Dropping the stream stops it.
    ///
    /// # Errors
    /// [`LlmError`] when the request was refused before anything streamed.
    async fn stream(&self, request: LlmRequest) -> Result<LlmStream, LlmError>;
}

/// The wire protocol a client speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Provider {
    /// OpenAI Chat Completions, and every OpenAI-compatible server.
    OpenAi,
    /// OpenAI Responses.
    OpenAiResponses,
    /// Anthropic Messages.
    Anthropic,
}

impl Provider {
    /// Every provider, in the order of their config names.
    pub const ALL: [Provider; 3] =
        [Provider::OpenAi, Provider::OpenAiResponses, Provider::Anthropic];

    /// The config name: `openai`, `openai-responses` or `anthropic`.
    pub fn as_str(self) -> &'static str {
        match self {
            Provider::OpenAi => "openai",
            Provider::OpenAiResponses => "openai-responses",
            Provider::Anthropic => "anthropic",
        }
    }

    /// Where the provider's API lives when no `base_url` is given.
    pub fn default_base_url(self) -> &'static str {
        match self {
            Provider::OpenAi | Provider::OpenAiResponses => "https://api.openai.com/v1",
            Provider::Anthropic => "https://api.anthropic.com",
        }
    }

    /// The secret the API key is read from when none is named.
    pub fn default_key_secret(self) -> &'static str {
        match self {
            Provider::OpenAi | Provider::OpenAiResponses => "openai_api_key",
            Provider::Anthropic => "anthropic_api_key",
        }
    }
}

impl fmt::Display for Provider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A provider name that is none of `openai`, `openai-responses`, `anthropic`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown provider `{name}`: expected `openai`, `openai-responses` or `anthropic`")]
pub struct UnknownProvider {
    pub name: String,
}

impl FromStr for Provider {
    type Err = UnknownProvider;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        Provider::ALL
            .into_iter()
            .find(|provider| provider.as_str() == name)
            .ok_or_else(|| UnknownProvider { name: name.to_owned() })
    }
}

/// How to reach a provider. `Debug` shows no key.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// The API root (`https://api.openai.com/v1`, `http://127.0.0.1:11434/v1`, …);
    /// the provider's own when `None`.
    pub base_url: Option<String>,
    /// Sent as `Authorization: Bearer` (OpenAI) or `x-api-key` (Anthropic);
    /// an empty key sends no header, for local servers that need none.
    pub api_key: SecretValue,
    /// No byte for this long, before or during a stream, is [`LlmError::Stalled`].
    pub stall_timeout: Duration,
    /// The longest wait for a TCP (and TLS) connection.
    pub connect_timeout: Duration,
    pub retry: RetryPolicy,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            base_url: None,
            api_key: SecretValue::new(""),
            stall_timeout: Duration::from_secs(120),
            connect_timeout: Duration::from_secs(10),
            retry: RetryPolicy::default(),
        }
    }
}

/// The client for `provider`, retrying under `options.retry`.
pub fn build_client(provider: Provider, options: ClientOptions) -> Arc<dyn LlmClient> {
    let base = options.base_url.as_deref().unwrap_or(provider.default_base_url());
    let base = base.trim_end_matches('/').to_owned();
    let client = reqwest::Client::builder()
        .connect_timeout(options.connect_timeout)
        .build()
        .unwrap_or_default();
    let endpoint = |key_header| http::Endpoint {
        client,
        url: String::new(),
        api_key: options.api_key.clone(),
        key_header,
        stall_timeout: options.stall_timeout,
    };
    let inner: Arc<dyn LlmClient> = match provider {
        Provider::OpenAi => {
            Arc::new(OpenAiChatClient::new(&base, endpoint(http::KeyHeader::Bearer)))
        }
        Provider::OpenAiResponses => {
            Arc::new(OpenAiResponsesClient::new(&base, endpoint(http::KeyHeader::Bearer)))
        }
        Provider::Anthropic => {
            Arc::new(AnthropicClient::new(&base, endpoint(http::KeyHeader::Anthropic)))
        }
    };
    Arc::new(RetryingClient::new(inner, options.retry))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn providers_parse_from_their_config_names() {
        for provider in Provider::ALL {
            assert_eq!(provider.as_str().parse::<Provider>(), Ok(provider));
        }
        let error = "gemini".parse::<Provider>().expect_err("not a provider");
        assert!(error.to_string().contains("`gemini`"), "{error}");
    }

    #[test]
    fn debug_of_a_client_shows_no_key() {
        for provider in Provider::ALL {
            let options = ClientOptions {
                api_key: SecretValue::new("sk-very-secret"),
                ..ClientOptions::default()
            };
            assert!(!format!("{options:?}").contains("sk-very-secret"));
            let client = build_client(provider, options);
            let debug = format!("{client:?}");
            assert!(!debug.contains("sk-very-secret"), "{debug}");
            assert!(debug.contains("SecretValue(***)"), "{debug}");
        }
    }
}
