//! LLM clients the native engine talks to: one provider-neutral request and
//! event model ([`LlmRequest`], [`LlmEvent`], [`LlmError`]) and the
//! [`LlmClient`] trait each wire protocol implements.
//!
//! A client streams one model turn: text deltas as they arrive, reasoning,
//! each tool call once its arguments are complete, the usage, then `Done`.

use std::fmt;
use std::pin::Pin;
use std::time::Duration;

use async_trait::async_trait;
use futures::Stream;
use lemon_core::tool::ToolSpec;

/// One tool call the model asked for; `arguments` is the raw JSON text the
/// model produced (assembled from every delta), not yet parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    pub arguments: String,
}

/// One message of a conversation, in the order the model saw them.
#[derive(Debug, Clone, PartialEq)]
pub enum ChatMessage {
    User {
        text: String,
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

/// One model turn to stream.
#[derive(Debug, Clone, PartialEq)]
pub struct LlmRequest {
    pub model: String,
    pub system: Option<String>,
    pub messages: Vec<ChatMessage>,
    pub tools: Vec<ToolSpec>,
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
