//! Anthropic Messages streaming (`POST {base_url}/v1/messages`, or
//! `{base_url}/messages` when the base URL already ends in `/v1`), with
//! `x-api-key` and `anthropic-version`.
//!
//! A turn is `message_start` (input usage), content blocks (`text`,
//! `tool_use`, `thinking`) opened by `content_block_start`, streamed by
//! `content_block_delta` (`text_delta`, `input_json_delta`, `thinking_delta`)
//! and closed by `content_block_stop`, then `message_delta` (stop reason,
//! output usage) and `message_stop`. `ping` may come anywhere; an `error`
//! event (`overloaded_error`, …) ends the turn.
//!
//! A user message's images go first, each as an `image` block with a
//! `base64` source (`media_type`, `data`), then its text block.

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use lemon_core::tool::ToolSpec;
use serde::ser::SerializeMap;
use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::Value;

use super::http::{self, Decoder, Endpoint};
use super::sse::SseEvent;
use super::tools_json::{self, ToolsJson};
use super::{
    Base64, ChatMessage, LlmClient, LlmError, LlmEvent, LlmRequest, LlmStream, LlmUsage,
    StopReason, ToolCall,
};

/// What `max_tokens` is when the request sets none: Anthropic requires it.
pub const DEFAULT_MAX_TOKENS: u32 = 8192;

/// A Messages client for one base URL and key.
#[derive(Debug, Clone)]
pub struct AnthropicClient {
    endpoint: Endpoint,
    tools: Arc<ToolsJson>,
}

impl AnthropicClient {
    /// A client of `{base}/v1/messages`, or `{base}/messages` for a `base`
    /// ending in `/v1` (`base` without a trailing `/`).
    pub(crate) fn new(base: &str, mut endpoint: Endpoint) -> Self {
        endpoint.url = if base.ends_with("/v1") {
            format!("{base}/messages")
        } else {
            format!("{base}/v1/messages")
        };
        AnthropicClient { endpoint, tools: Arc::new(ToolsJson::new(wire_tools)) }
    }
}

#[async_trait]
impl LlmClient for AnthropicClient {
    async fn stream(&self, request: LlmRequest) -> Result<LlmStream, LlmError> {
        let tools = self.tools.of(&request.tools);
        let body = request_body(&request, tools.as_deref());
        self.endpoint.stream(&body, MessagesDecoder::default()).await
    }
}

/// The wire request for `request`, serialised straight from the request's
/// own fields (no JSON tree is built, no text copied), with its `tools` array
/// already serialised.
pub(crate) fn request_body<'a>(
    request: &'a LlmRequest,
    tools: Option<&'a RawValue>,
) -> MessagesBody<'a> {
    let mut messages: Vec<WireMessage<'a>> = Vec::with_capacity(request.messages.len());
    for message in &request.messages {
        match message {
            ChatMessage::User { text, images } => {
                // An empty text block is refused; the images alone are not.
                let text = (!text.is_empty() || images.is_empty()).then_some(Block::Text { text });
                let images = images.iter().map(|image| Block::Image {
                    source: ImageSource {
                        kind: "base64",
                        media_type: &image.mime,
                        data: Base64(&image.data),
                    },
                });
                push_blocks(&mut messages, "user", images.chain(text));
            }
            ChatMessage::Assistant { text, tool_calls } => {
                let text = (!text.is_empty()).then_some(Block::Text { text });
                let calls = tool_calls.iter().map(|call| Block::ToolUse {
                    id: &call.id,
                    name: &call.name,
                    input: ToolInput::of(&call.arguments),
                });
                push_blocks(&mut messages, "assistant", text.into_iter().chain(calls));
            }
            ChatMessage::ToolResult { call_id, content, is_error, .. } => {
                let block =
                    Block::ToolResult { tool_use_id: call_id, content, is_error: *is_error };
                push_blocks(&mut messages, "user", [block]);
            }
        }
    }
    MessagesBody {
        model: &request.model,
        max_tokens: request.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS),
        messages,
        stream: true,
        system: request.system.as_deref(),
        tools,
        temperature: request.temperature,
    }
}

/// Adds `blocks` as a message of `role`, merged into the previous message when
/// it has the same role (tool results and a user text after them are one user
/// turn).
fn push_blocks<'a>(
    messages: &mut Vec<WireMessage<'a>>,
    role: &'static str,
    blocks: impl IntoIterator<Item = Block<'a>>,
) {
    let mut blocks = blocks.into_iter().peekable();
    if blocks.peek().is_none() {
        return;
    }
    match messages.last_mut() {
        Some(last) if last.role == role => last.content.extend(blocks),
        _ => messages.push(WireMessage { role, content: blocks.collect() }),
    }
}

/// `specs` as the request's `tools` array.
fn wire_tools(specs: &[ToolSpec]) -> Option<Box<RawValue>> {
    tools_json::array(specs, |tool| WireTool {
        name: &tool.name,
        description: &tool.description,
        input_schema: &tool.parameters,
    })
}

/// A Messages request as sent.
#[derive(Debug, Serialize)]
pub(crate) struct MessagesBody<'a> {
    model: &'a str,
    max_tokens: u32,
    messages: Vec<WireMessage<'a>>,
    stream: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    system: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tools: Option<&'a RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f32>,
}

#[derive(Debug, Serialize)]
struct WireMessage<'a> {
    role: &'static str,
    content: Vec<Block<'a>>,
}

#[derive(Debug, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Block<'a> {
    Text {
        text: &'a str,
    },
    Image {
        source: ImageSource<'a>,
    },
    ToolUse {
        id: &'a str,
        name: &'a str,
        input: ToolInput<'a>,
    },
    ToolResult {
        tool_use_id: &'a str,
        content: &'a str,
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        is_error: bool,
    },
}

/// An image's `source`: `{"type": "base64", "media_type", "data"}`.
#[derive(Debug, Serialize)]
struct ImageSource<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    media_type: &'a str,
    data: Base64<'a>,
}

/// A tool call's arguments as the object the API takes back. The model wrote
/// them as JSON text; text that is not an object goes back as `{}`.
#[derive(Debug)]
struct ToolInput<'a>(Option<&'a RawValue>);

impl<'a> ToolInput<'a> {
    fn of(arguments: &'a str) -> Self {
        let raw = serde_json::from_str::<&RawValue>(arguments).ok();
        ToolInput(raw.filter(|raw| raw.get().starts_with('{')))
    }
}

impl Serialize for ToolInput<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self.0 {
            Some(raw) => raw.serialize(serializer),
            None => serializer.serialize_map(Some(0))?.end(),
        }
    }
}

#[derive(Debug, Serialize)]
struct WireTool<'a> {
    name: &'a str,
    description: &'a str,
    input_schema: &'a Value,
}

/// Reads Messages events.
#[derive(Debug, Default)]
pub(crate) struct MessagesDecoder {
    /// Open `tool_use` blocks by index, with their partial JSON so far.
    tools: HashMap<u64, ToolCall>,
    usage: LlmUsage,
    stop: Option<StopReason>,
}

fn text<'a>(value: &'a Value, key: &str) -> Option<&'a str> {
    value.get(key).and_then(Value::as_str)
}

fn stop_reason(reason: &str) -> StopReason {
    match reason {
        "end_turn" | "stop_sequence" => StopReason::EndTurn,
        "tool_use" => StopReason::ToolUse,
        "max_tokens" | "model_context_window_exceeded" => StopReason::MaxTokens,
        other => StopReason::Other(other.to_owned()),
    }
}

impl Decoder for MessagesDecoder {
    fn event(&mut self, event: SseEvent, out: &mut Vec<LlmEvent>) -> Result<bool, LlmError> {
        let value: Value = serde_json::from_str(&event.data).map_err(|error| {
            LlmError::Invalid { message: format!("a message event is not valid JSON: {error}") }
        })?;
        let kind = text(&value, "type").or(event.event.as_deref()).unwrap_or_default();
        let index = value.get("index").and_then(Value::as_u64).unwrap_or(0);
        let count = |usage: &Value, key| usage.get(key).and_then(Value::as_u64);
        match kind {
            "message_start" => {
                if let Some(usage) = value.pointer("/message/usage") {
                    self.usage.input_tokens = count(usage, "input_tokens").unwrap_or(0);
                    self.usage.output_tokens = count(usage, "output_tokens").unwrap_or(0);
                }
            }
            "content_block_start" => {
                let block = value.get("content_block").unwrap_or(&Value::Null);
                match text(block, "type") {
                    Some("tool_use") => {
                        self.tools.insert(
                            index,
                            ToolCall {
                                id: text(block, "id").unwrap_or_default().to_owned(),
                                name: text(block, "name").unwrap_or_default().to_owned(),
                                arguments: String::new(),
                            },
                        );
                    }
                    Some("text") => {
                        if let Some(start) = text(block, "text").filter(|t| !t.is_empty()) {
                            out.push(LlmEvent::TextDelta(start.to_owned()));
                        }
                    }
                    Some("thinking") => {
                        if let Some(start) = text(block, "thinking").filter(|t| !t.is_empty()) {
                            out.push(LlmEvent::ReasoningDelta(start.to_owned()));
                        }
                    }
                    _ => {}
                }
            }
            "content_block_delta" => {
                let delta = value.get("delta").unwrap_or(&Value::Null);
                match text(delta, "type") {
                    Some("text_delta") => {
                        if let Some(piece) = text(delta, "text").filter(|t| !t.is_empty()) {
                            out.push(LlmEvent::TextDelta(piece.to_owned()));
                        }
                    }
                    Some("thinking_delta") => {
                        if let Some(piece) = text(delta, "thinking").filter(|t| !t.is_empty()) {
                            out.push(LlmEvent::ReasoningDelta(piece.to_owned()));
                        }
                    }
                    Some("input_json_delta") => {
                        if let Some(call) = self.tools.get_mut(&index) {
                            call.arguments
                                .push_str(text(delta, "partial_json").unwrap_or_default());
                        }
                    }
                    _ => {}
                }
            }
            "content_block_stop" => {
                if let Some(mut call) = self.tools.remove(&index) {
                    if call.arguments.trim().is_empty() {
                        call.arguments = "{}".to_owned();
                    }
                    out.push(LlmEvent::ToolCall(call));
                }
            }
            "message_delta" => {
                if let Some(reason) = value.pointer("/delta/stop_reason").and_then(Value::as_str) {
                    self.stop = Some(stop_reason(reason));
                }
                if let Some(usage) = value.get("usage") {
                    if let Some(input) = count(usage, "input_tokens") {
                        self.usage.input_tokens = input;
                    }
                    if let Some(output) = count(usage, "output_tokens") {
                        self.usage.output_tokens = output;
                    }
                }
            }
            "message_stop" => {
                out.push(LlmEvent::Usage(self.usage));
                out.push(LlmEvent::Done(self.stop.take().unwrap_or(StopReason::EndTurn)));
                return Ok(true);
            }
            "error" => return Err(http::stream_error(&value)),
            _ => {}
        }
        Ok(false)
    }

    fn end(&mut self, _out: &mut Vec<LlmEvent>) -> Result<(), LlmError> {
        Err(LlmError::Network {
            message: "the stream ended before the message was complete".to_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::llm::http::{decode_all, ok};
    use crate::llm::ImageInput;

    #[test]
    fn thinking_text_tool_use_and_usage() {
        let stream = concat!(
            "event: message_start\n",
            "data: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":\"claude-sonnet-4-5\",\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":472,\"output_tokens\":2}}}\n\n",
            "event: ping\n",
            "data: {\"type\": \"ping\"}\n\n",
            "event: content_block_start\n",
            "data: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"thinking\",\"thinking\":\"\",\"signature\":\"\"}}\n\n",
            "event: content_block_delta\n",
            "data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"thinking_delta\",\"thinking\":\"Let me check.\"}}\n\n",
            "event: content_block_delta\n",
            "data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"signature_delta\",\"signature\":\"EqQBCgIYAhIM\"}}\n\n",
            "event: content_block_stop\n",
            "data: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
            "event: content_block_start\n",
            "data: {\"type\":\"content_block_start\",\"index\":1,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
            "event: content_block_delta\n",
            "data: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"text_delta\",\"text\":\"Okay\"}}\n\n",
            "event: content_block_stop\n",
            "data: {\"type\":\"content_block_stop\",\"index\":1}\n\n",
            "event: content_block_start\n",
            "data: {\"type\":\"content_block_start\",\"index\":2,\"content_block\":{\"type\":\"tool_use\",\"id\":\"toolu_01\",\"name\":\"get_weather\",\"input\":{}}}\n\n",
            "event: content_block_delta\n",
            "data: {\"type\":\"content_block_delta\",\"index\":2,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"\"}}\n\n",
            "event: content_block_delta\n",
            "data: {\"type\":\"content_block_delta\",\"index\":2,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{\\\"location\\\": \\\"San Fra\"}}\n\n",
            "event: content_block_delta\n",
            "data: {\"type\":\"content_block_delta\",\"index\":2,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"ncisco\\\"}\"}}\n\n",
            "event: content_block_stop\n",
            "data: {\"type\":\"content_block_stop\",\"index\":2}\n\n",
            "event: content_block_start\n",
            "data: {\"type\":\"content_block_start\",\"index\":3,\"content_block\":{\"type\":\"tool_use\",\"id\":\"toolu_02\",\"name\":\"list\",\"input\":{}}}\n\n",
            "event: content_block_stop\n",
            "data: {\"type\":\"content_block_stop\",\"index\":3}\n\n",
            "event: message_delta\n",
            "data: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"tool_use\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":89}}\n\n",
            "event: message_stop\n",
            "data: {\"type\":\"message_stop\"}\n\n",
        );
        assert_eq!(
            ok(decode_all(MessagesDecoder::default(), stream)),
            vec![
                LlmEvent::ReasoningDelta("Let me check.".to_owned()),
                LlmEvent::TextDelta("Okay".to_owned()),
                LlmEvent::ToolCall(ToolCall {
                    id: "toolu_01".to_owned(),
                    name: "get_weather".to_owned(),
                    arguments: "{\"location\": \"San Francisco\"}".to_owned(),
                }),
                LlmEvent::ToolCall(ToolCall {
                    id: "toolu_02".to_owned(),
                    name: "list".to_owned(),
                    arguments: "{}".to_owned(),
                }),
                LlmEvent::Usage(LlmUsage { input_tokens: 472, output_tokens: 89 }),
                LlmEvent::Done(StopReason::ToolUse),
            ]
        );
    }

    #[test]
    fn stop_reasons() {
        for (wire, reason) in [
            ("end_turn", StopReason::EndTurn),
            ("max_tokens", StopReason::MaxTokens),
            ("model_context_window_exceeded", StopReason::MaxTokens),
            ("refusal", StopReason::Other("refusal".to_owned())),
        ] {
            let stream = format!(
                "event: message_delta\ndata: {{\"type\":\"message_delta\",\"delta\":{{\"stop_reason\":\"{wire}\"}},\"usage\":{{\"output_tokens\":1}}}}\n\nevent: message_stop\ndata: {{\"type\":\"message_stop\"}}\n\n"
            );
            let events = ok(decode_all(MessagesDecoder::default(), &stream));
            assert_eq!(events.last(), Some(&LlmEvent::Done(reason)), "{wire}");
        }
    }

    #[test]
    fn error_events_are_typed() {
        let overloaded = "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n";
        assert_eq!(
            decode_all(MessagesDecoder::default(), overloaded),
            vec![Err(LlmError::Server { status: 529, message: "Overloaded".to_owned() })]
        );
        let long = "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"invalid_request_error\",\"message\":\"prompt is too long: 208656 tokens > 200000 maximum\"}}\n\n";
        assert!(matches!(
            decode_all(MessagesDecoder::default(), long)[0],
            Err(LlmError::ContextOverflow { .. })
        ));
        let cut = "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"a\"}}\n\n";
        let events = decode_all(MessagesDecoder::default(), cut);
        assert_eq!(events[0], Ok(LlmEvent::TextDelta("a".to_owned())));
        assert!(matches!(events[1], Err(LlmError::Network { .. })));
    }

    #[test]
    fn a_user_message_with_images_sends_image_blocks_before_its_text() {
        let png: &[u8] = b"\x89PNG\r\n\x1a\n\xfb\xef\xff\xbf\x00";
        let request = LlmRequest {
            model: "claude-sonnet-4-5".to_owned(),
            system: None,
            messages: vec![
                ChatMessage::Assistant {
                    text: String::new(),
                    tool_calls: vec![ToolCall {
                        id: "t1".to_owned(),
                        name: "read".to_owned(),
                        arguments: "{}".to_owned(),
                    }],
                },
                ChatMessage::ToolResult {
                    call_id: "t1".to_owned(),
                    name: "read".to_owned(),
                    content: "ok".to_owned(),
                    is_error: false,
                },
                ChatMessage::User {
                    text: "what is this?".to_owned(),
                    images: vec![
                        ImageInput::new("image/png", png),
                        ImageInput::new("image/gif", &b"GIF89a"[..]),
                    ],
                },
                ChatMessage::User {
                    text: String::new(),
                    images: vec![ImageInput::new("image/png", png)],
                },
            ],
            tools: [].into(),
            max_tokens: Some(10),
            temperature: None,
        };
        let image = |media_type: &str, data: &str| json!({"type": "image", "source": {"type": "base64", "media_type": media_type, "data": data}});
        assert_eq!(
            serde_json::to_value(request_body(&request, None)).unwrap()["messages"],
            json!([
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "read", "input": {}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "t1", "content": "ok"},
                    image("image/png", "iVBORw0KGgr77/+/AA=="),
                    image("image/gif", "R0lGODlh"),
                    {"type": "text", "text": "what is this?"},
                    image("image/png", "iVBORw0KGgr77/+/AA=="),
                ]},
            ])
        );
    }

    #[test]
    fn the_request_maps_history_and_tools() {
        let call = |id: &str| ToolCall {
            id: id.to_owned(),
            name: "read".to_owned(),
            arguments: "{\"path\":\"a\"}".to_owned(),
        };
        let result = |id: &str, is_error| ChatMessage::ToolResult {
            call_id: id.to_owned(),
            name: "read".to_owned(),
            content: format!("result {id}"),
            is_error,
        };
        let request = LlmRequest {
            model: "claude-sonnet-4-5".to_owned(),
            system: Some("be brief".to_owned()),
            messages: vec![
                ChatMessage::user("read a twice"),
                ChatMessage::Assistant {
                    text: "Reading.".to_owned(),
                    tool_calls: vec![call("t1"), call("t2")],
                },
                result("t1", false),
                result("t2", true),
                ChatMessage::user("and now?"),
                ChatMessage::Assistant {
                    text: String::new(),
                    tool_calls: vec![
                        ToolCall { arguments: " {\"path\": \"b\"} ".to_owned(), ..call("t3") },
                        ToolCall { arguments: "{\"path\":".to_owned(), ..call("t4") },
                        ToolCall { arguments: "[\"a\"]".to_owned(), ..call("t5") },
                    ],
                },
            ],
            tools: [ToolSpec {
                name: "read".to_owned(),
                description: "Reads a file".to_owned(),
                parameters: json!({"type": "object"}),
            }]
            .into(),
            max_tokens: None,
            temperature: Some(0.25),
        };
        let tools = ToolsJson::new(wire_tools).of(&request.tools);
        assert_eq!(
            serde_json::to_value(request_body(&request, tools.as_deref())).unwrap(),
            json!({
                "model": "claude-sonnet-4-5",
                "max_tokens": DEFAULT_MAX_TOKENS,
                "messages": [
                    {"role": "user", "content": [{"type": "text", "text": "read a twice"}]},
                    {"role": "assistant", "content": [
                        {"type": "text", "text": "Reading."},
                        {"type": "tool_use", "id": "t1", "name": "read", "input": {"path": "a"}},
                        {"type": "tool_use", "id": "t2", "name": "read", "input": {"path": "a"}},
                    ]},
                    {"role": "user", "content": [
                        {"type": "tool_result", "tool_use_id": "t1", "content": "result t1"},
                        {"type": "tool_result", "tool_use_id": "t2", "content": "result t2", "is_error": true},
                        {"type": "text", "text": "and now?"},
                    ]},
                    {"role": "assistant", "content": [
                        {"type": "tool_use", "id": "t3", "name": "read", "input": {"path": "b"}},
                        {"type": "tool_use", "id": "t4", "name": "read", "input": {}},
                        {"type": "tool_use", "id": "t5", "name": "read", "input": {}},
                    ]},
                ],
                "stream": true,
                "system": "be brief",
                "tools": [{"name": "read", "description": "Reads a file", "input_schema": {"type": "object"}}],
                "temperature": 0.25,
            })
        );
    }
}
