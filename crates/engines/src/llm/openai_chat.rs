//! OpenAI Chat Completions streaming (`POST {base_url}/chat/completions`), the
//! protocol every OpenAI-compatible server (Ollama, vLLM, llama.cpp's server,
//! OpenRouter) speaks.
//!
//! Chunks are read leniently: compatible servers leave out fields, send
//! `choices: null` or an empty `finish_reason`. Tool calls are assembled from
//! their `delta.tool_calls[i]` fragments by index and given once the turn's
//! `finish_reason` arrives; usage comes in the extra chunk
//! `stream_options.include_usage` asks for.
//!
//! A user message with images has an array of parts as its `content`: the
//! text (`{"type":"text"}`), then each image as
//! `{"type":"image_url","image_url":{"url":"data:<mime>;base64,…"}}`. One
//! without images keeps the plain string.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use lemon_core::tool::ToolSpec;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::{json, Value};

use super::http::{self, Decoder, Endpoint};
use super::sse::SseEvent;
use super::tools_json::{self, ToolsJson};
use super::{
    ChatMessage, DataUrl, ImageInput, LlmClient, LlmError, LlmEvent, LlmRequest, LlmStream,
    LlmUsage, StopReason, ToolCall,
};

/// A Chat Completions client for one base URL and key.
#[derive(Debug, Clone)]
pub struct OpenAiChatClient {
    endpoint: Endpoint,
    /// `max_completion_tokens` (OpenAI itself) or `max_tokens` (compatible servers).
    max_tokens_field: &'static str,
    tools: Arc<ToolsJson>,
}

impl OpenAiChatClient {
    /// A client of `{base}/chat/completions` (`base` without a trailing `/`).
    pub(crate) fn new(base: &str, mut endpoint: Endpoint) -> Self {
        let max_tokens_field =
            if base.contains("://api.openai.com") { "max_completion_tokens" } else { "max_tokens" };
        endpoint.url = format!("{base}/chat/completions");
        OpenAiChatClient { endpoint, max_tokens_field, tools: Arc::new(ToolsJson::new(wire_tools)) }
    }
}

#[async_trait]
impl LlmClient for OpenAiChatClient {
    async fn stream(&self, request: LlmRequest) -> Result<LlmStream, LlmError> {
        let tools = self.tools.of(&request.tools);
        let body = request_body(&request, self.max_tokens_field, tools.as_deref());
        self.endpoint.stream(&body, ChatDecoder::default()).await
    }
}

/// `specs` as the request's `tools` array.
fn wire_tools(specs: &[ToolSpec]) -> Option<Box<RawValue>> {
    tools_json::array(specs, |tool| WireTool {
        kind: "function",
        function: WireToolFunction {
            name: &tool.name,
            description: &tool.description,
            parameters: &tool.parameters,
        },
    })
}

/// The wire request for `request`, serialised straight from the request's
/// own fields (no JSON tree is built, no schema copied), with its `tools`
/// array already serialised.
pub(crate) fn request_body<'a>(
    request: &'a LlmRequest,
    max_tokens_field: &str,
    tools: Option<&'a RawValue>,
) -> ChatBody<'a> {
    let system = request.system.as_deref().map(|content| WireMessage::System { content });
    let messages = system
        .into_iter()
        .chain(request.messages.iter().map(|message| {
            match message {
                ChatMessage::User { text, images } => {
                    WireMessage::User { content: user_content(text, images) }
                }
                ChatMessage::Assistant { text, tool_calls } => WireMessage::Assistant {
                    content: (!text.is_empty() || tool_calls.is_empty()).then_some(text.as_str()),
                    tool_calls: tool_calls
                        .iter()
                        .map(|call| WireCall {
                            id: &call.id,
                            kind: "function",
                            function: WireFunction { name: &call.name, arguments: &call.arguments },
                        })
                        .collect(),
                },
                ChatMessage::ToolResult { call_id, content, .. } => {
                    WireMessage::Tool { tool_call_id: call_id, content }
                }
            }
        }))
        .collect();
    let openai = max_tokens_field == "max_completion_tokens";
    ChatBody {
        model: &request.model,
        messages,
        stream: true,
        stream_options: StreamOptions { include_usage: true },
        tools,
        max_completion_tokens: request.max_tokens.filter(|_| openai),
        max_tokens: request.max_tokens.filter(|_| !openai),
        temperature: request.temperature,
    }
}

/// A user message's `content`: the text alone as a string, as always; with
/// images, the text part (unless empty) and an `image_url` part each.
fn user_content<'a>(text: &'a str, images: &'a [ImageInput]) -> UserContent<'a> {
    if images.is_empty() {
        return UserContent::Text(text);
    }
    let text = (!text.is_empty()).then_some(ContentPart::Text { text });
    let images = images
        .iter()
        .map(|image| ContentPart::ImageUrl { image_url: ImageUrl { url: DataUrl(image) } });
    UserContent::Parts(text.into_iter().chain(images).collect())
}

/// A Chat Completions request as sent.
#[derive(Debug, Serialize)]
pub(crate) struct ChatBody<'a> {
    model: &'a str,
    messages: Vec<WireMessage<'a>>,
    stream: bool,
    stream_options: StreamOptions,
    #[serde(skip_serializing_if = "Option::is_none")]
    tools: Option<&'a RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_completion_tokens: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_tokens: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f32>,
}

#[derive(Debug, Serialize)]
struct StreamOptions {
    include_usage: bool,
}

#[derive(Debug, Serialize)]
#[serde(tag = "role", rename_all = "lowercase")]
enum WireMessage<'a> {
    System {
        content: &'a str,
    },
    User {
        content: UserContent<'a>,
    },
    Assistant {
        /// `null` when the turn only called tools.
        content: Option<&'a str>,
        #[serde(skip_serializing_if = "Vec::is_empty")]
        tool_calls: Vec<WireCall<'a>>,
    },
    Tool {
        tool_call_id: &'a str,
        content: &'a str,
    },
}

#[derive(Debug, Serialize)]
#[serde(untagged)]
enum UserContent<'a> {
    Text(&'a str),
    Parts(Vec<ContentPart<'a>>),
}

#[derive(Debug, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum ContentPart<'a> {
    Text { text: &'a str },
    ImageUrl { image_url: ImageUrl<'a> },
}

#[derive(Debug, Serialize)]
struct ImageUrl<'a> {
    url: DataUrl<'a>,
}

#[derive(Debug, Serialize)]
struct WireCall<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    function: WireFunction<'a>,
}

#[derive(Debug, Serialize)]
struct WireFunction<'a> {
    name: &'a str,
    arguments: &'a str,
}

#[derive(Debug, Serialize)]
struct WireTool<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    function: WireToolFunction<'a>,
}

#[derive(Debug, Serialize)]
struct WireToolFunction<'a> {
    name: &'a str,
    description: &'a str,
    parameters: &'a Value,
}

#[derive(Debug, Deserialize)]
struct Chunk {
    #[serde(default)]
    choices: Option<Vec<Choice>>,
    #[serde(default)]
    usage: Option<Usage>,
    #[serde(default)]
    error: Option<Value>,
}

#[derive(Debug, Deserialize)]
struct Choice {
    #[serde(default)]
    delta: Option<Delta>,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
struct Delta {
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    reasoning_content: Option<String>,
    #[serde(default)]
    reasoning: Option<String>,
    #[serde(default)]
    tool_calls: Option<Vec<ToolCallDelta>>,
}

#[derive(Debug, Deserialize)]
struct ToolCallDelta {
    #[serde(default)]
    index: Option<u32>,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    function: Option<FunctionDelta>,
}

#[derive(Debug, Deserialize)]
struct FunctionDelta {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    arguments: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Usage {
    #[serde(default)]
    prompt_tokens: u64,
    #[serde(default)]
    completion_tokens: u64,
}

/// Reads Chat Completions chunks.
#[derive(Debug, Default)]
pub(crate) struct ChatDecoder {
    /// Tool calls by their index, as their fragments arrive.
    calls: BTreeMap<u32, ToolCall>,
    /// Whether tool calls were given this turn.
    called: bool,
    /// The finish reason, once a chunk gave it.
    finish: Option<StopReason>,
    usage_sent: bool,
}

impl ChatDecoder {
    /// Gives the assembled tool calls: their arguments are complete once the
    /// finish reason came.
    fn flush_calls(&mut self, out: &mut Vec<LlmEvent>) {
        for (_, mut call) in std::mem::take(&mut self.calls) {
            if call.arguments.trim().is_empty() {
                call.arguments = "{}".to_owned();
            }
            self.called = true;
            out.push(LlmEvent::ToolCall(call));
        }
    }

    fn finish_turn(&mut self, out: &mut Vec<LlmEvent>) {
        self.flush_calls(out);
        let reason = match self.finish.take() {
            // Some compatible servers end a tool-calling turn with `stop`.
            Some(StopReason::EndTurn) | None if self.called => StopReason::ToolUse,
            Some(reason) => reason,
            None => StopReason::EndTurn,
        };
        out.push(LlmEvent::Done(reason));
    }
}

fn stop_reason(reason: &str) -> StopReason {
    match reason {
        "stop" => StopReason::EndTurn,
        "tool_calls" | "function_call" => StopReason::ToolUse,
        "length" => StopReason::MaxTokens,
        other => StopReason::Other(other.to_owned()),
    }
}

impl Decoder for ChatDecoder {
    fn event(&mut self, event: SseEvent, out: &mut Vec<LlmEvent>) -> Result<bool, LlmError> {
        if event.is_done() {
            self.finish_turn(out);
            return Ok(true);
        }
        let chunk: Chunk =
            serde_json::from_str(&event.data).map_err(|error| LlmError::Invalid {
                message: format!("a chat completion chunk is not valid JSON: {error}"),
            })?;
        if let Some(error) = chunk.error.filter(|e| !e.is_null()) {
            let wrapped = json!({ "error": error });
            let (message, kind, code) = http::error_fields(&wrapped);
            return Err(http::error_from_kind(kind.as_deref(), code.as_deref(), &message));
        }
        for choice in chunk.choices.unwrap_or_default() {
            let delta = choice.delta.unwrap_or_default();
            for reasoning in [delta.reasoning_content, delta.reasoning].into_iter().flatten() {
                if !reasoning.is_empty() {
                    out.push(LlmEvent::ReasoningDelta(reasoning));
                }
            }
            if let Some(text) = delta.content.filter(|t| !t.is_empty()) {
                out.push(LlmEvent::TextDelta(text));
            }
            for fragment in delta.tool_calls.unwrap_or_default() {
                let index = fragment.index.unwrap_or(0);
                let call = self.calls.entry(index).or_insert_with(|| ToolCall {
                    id: String::new(),
                    name: String::new(),
                    arguments: String::new(),
                });
                if let Some(id) = fragment.id.filter(|id| !id.is_empty()) {
                    call.id = id;
                }
                if let Some(function) = fragment.function {
                    if let Some(name) = function.name.filter(|n| !n.is_empty()) {
                        call.name = name;
                    }
                    if let Some(arguments) = function.arguments {
                        call.arguments.push_str(&arguments);
                    }
                }
            }
            if let Some(reason) = choice.finish_reason.filter(|r| !r.is_empty()) {
                self.finish = Some(stop_reason(&reason));
                self.flush_calls(out);
            }
        }
        if let Some(usage) = chunk.usage {
            if !self.usage_sent {
                self.usage_sent = true;
                out.push(LlmEvent::Usage(LlmUsage {
                    input_tokens: usage.prompt_tokens,
                    output_tokens: usage.completion_tokens,
                }));
            }
        }
        Ok(false)
    }

    fn end(&mut self, out: &mut Vec<LlmEvent>) -> Result<(), LlmError> {
        // Without `[DONE]` a turn is complete only if its finish reason came.
        if self.finish.is_some() {
            self.finish_turn(out);
            Ok(())
        } else {
            Err(LlmError::Network {
                message: "the stream ended before the turn was complete".to_owned(),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llm::http::{decode_all, ok};

    #[test]
    fn text_deltas_usage_and_stop() {
        let stream = concat!(
            "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gpt-4o\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"logprobs\":null,\"finish_reason\":null}],\"usage\":null}\n\n",
            "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gpt-4o\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hel\"},\"logprobs\":null,\"finish_reason\":null}],\"usage\":null}\n\n",
            "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gpt-4o\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"lo\"},\"logprobs\":null,\"finish_reason\":null}],\"usage\":null}\n\n",
            "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gpt-4o\",\"choices\":[{\"index\":0,\"delta\":{},\"logprobs\":null,\"finish_reason\":\"stop\"}],\"usage\":null}\n\n",
            "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gpt-4o\",\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":2,\"total_tokens\":14}}\n\n",
            "data: [DONE]\n\n",
        );
        assert_eq!(
            ok(decode_all(ChatDecoder::default(), stream)),
            vec![
                LlmEvent::TextDelta("Hel".to_owned()),
                LlmEvent::TextDelta("lo".to_owned()),
                LlmEvent::Usage(LlmUsage { input_tokens: 12, output_tokens: 2 }),
                LlmEvent::Done(StopReason::EndTurn),
            ]
        );
    }

    #[test]
    fn parallel_tool_calls_are_assembled_by_index() {
        let stream = concat!(
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"index\":0,\"id\":\"call_a\",\"type\":\"function\",\"function\":{\"name\":\"read\",\"arguments\":\"\"}}]},\"finish_reason\":null}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"{\\\"pa\"}}]},\"finish_reason\":null}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":1,\"id\":\"call_b\",\"type\":\"function\",\"function\":{\"name\":\"list\",\"arguments\":\"\"}}]},\"finish_reason\":null}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"th\\\":\\\"a.txt\\\"}\"}}]},\"finish_reason\":null}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":1,\"function\":{\"arguments\":\"{}\"}}]},\"finish_reason\":null}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"tool_calls\"}]}\n\n",
            "data: [DONE]\n\n",
        );
        assert_eq!(
            ok(decode_all(ChatDecoder::default(), stream)),
            vec![
                LlmEvent::ToolCall(ToolCall {
                    id: "call_a".to_owned(),
                    name: "read".to_owned(),
                    arguments: "{\"path\":\"a.txt\"}".to_owned(),
                }),
                LlmEvent::ToolCall(ToolCall {
                    id: "call_b".to_owned(),
                    name: "list".to_owned(),
                    arguments: "{}".to_owned(),
                }),
                LlmEvent::Done(StopReason::ToolUse),
            ]
        );
    }

    #[test]
    fn reasoning_deltas_of_compatible_servers() {
        let stream = concat!(
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"reasoning_content\":\"think\"}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"reasoning\":\"ing\"}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"ok\"},\"finish_reason\":\"length\"}]}\n\n",
            "data: [DONE]\n\n",
        );
        assert_eq!(
            ok(decode_all(ChatDecoder::default(), stream)),
            vec![
                LlmEvent::ReasoningDelta("think".to_owned()),
                LlmEvent::ReasoningDelta("ing".to_owned()),
                LlmEvent::TextDelta("ok".to_owned()),
                LlmEvent::Done(StopReason::MaxTokens),
            ]
        );
    }

    #[test]
    fn lenient_chunks_and_a_missing_done() {
        let stream = concat!(
            "data: {\"choices\":null}\n\n",
            "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"},\"finish_reason\":\"\"}]}\n\n",
            "data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1}}\n\n",
        );
        assert_eq!(
            ok(decode_all(ChatDecoder::default(), stream)),
            vec![
                LlmEvent::TextDelta("hi".to_owned()),
                LlmEvent::Usage(LlmUsage { input_tokens: 3, output_tokens: 1 }),
                LlmEvent::Done(StopReason::EndTurn),
            ]
        );
    }

    #[test]
    fn a_stream_cut_before_its_end_is_a_network_error() {
        let stream = "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n";
        let events = decode_all(ChatDecoder::default(), stream);
        assert_eq!(events[0], Ok(LlmEvent::TextDelta("hi".to_owned())));
        assert!(matches!(events[1], Err(LlmError::Network { .. })));
    }

    #[test]
    fn a_mid_stream_error_is_typed() {
        let stream = concat!(
            "data: {\"choices\":[{\"delta\":{\"content\":\"par\"}}]}\n\n",
            "data: {\"error\":{\"message\":\"The server had an error while processing your request.\",\"type\":\"server_error\",\"param\":null,\"code\":null}}\n\n",
        );
        let events = decode_all(ChatDecoder::default(), stream);
        assert_eq!(events[0], Ok(LlmEvent::TextDelta("par".to_owned())));
        assert!(matches!(&events[1], Err(LlmError::Server { status: 500, .. })));
        let overflow = "data: {\"error\":{\"message\":\"too long\",\"type\":\"invalid_request_error\",\"code\":\"context_length_exceeded\"}}\n\n";
        assert!(matches!(
            decode_all(ChatDecoder::default(), overflow)[0],
            Err(LlmError::ContextOverflow { .. })
        ));
    }

    #[test]
    fn a_compatible_server_gets_max_tokens_and_an_answer_with_calls_keeps_its_text() {
        let request = LlmRequest {
            model: "llama3".to_owned(),
            system: None,
            messages: vec![ChatMessage::Assistant {
                text: "looking".to_owned(),
                tool_calls: vec![ToolCall {
                    id: "call_1".to_owned(),
                    name: "list".to_owned(),
                    arguments: "{}".to_owned(),
                }],
            }],
            tools: [].into(),
            max_tokens: Some(64),
            temperature: None,
        };
        assert_eq!(
            serde_json::to_value(request_body(&request, "max_tokens", None)).unwrap(),
            json!({
                "model": "llama3",
                "messages": [
                    {"role": "assistant", "content": "looking", "tool_calls": [
                        {"id": "call_1", "type": "function", "function": {"name": "list", "arguments": "{}"}}
                    ]},
                ],
                "stream": true,
                "stream_options": {"include_usage": true},
                "max_tokens": 64,
            })
        );
    }

    /// PNG bytes whose base64 has `+`, `/` and padding in it.
    const PNG: &[u8] = b"\x89PNG\r\n\x1a\n\xfb\xef\xff\xbf\x00";
    const PNG_BASE64: &str = "iVBORw0KGgr77/+/AA==";

    #[test]
    fn a_user_message_with_images_sends_text_and_image_url_parts() {
        let request = LlmRequest {
            model: "gpt-4o".to_owned(),
            system: None,
            messages: vec![
                ChatMessage::User {
                    text: "what is in these?".to_owned(),
                    images: vec![
                        ImageInput::new("image/png", PNG),
                        ImageInput::new("image/jpeg", &b"\xff\xd8\xff\xe0\x00\x10JFIF"[..]),
                    ],
                },
                ChatMessage::User {
                    text: String::new(),
                    images: vec![ImageInput::new("image/png", PNG)],
                },
                ChatMessage::user("and without?"),
            ],
            tools: [].into(),
            max_tokens: None,
            temperature: None,
        };
        assert_eq!(
            serde_json::to_value(request_body(&request, "max_completion_tokens", None)).unwrap()
                ["messages"],
            json!([
                {"role": "user", "content": [
                    {"type": "text", "text": "what is in these?"},
                    {"type": "image_url", "image_url": {"url": format!("data:image/png;base64,{PNG_BASE64}")}},
                    {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,/9j/4AAQSkZJRg=="}},
                ]},
                {"role": "user", "content": [
                    {"type": "image_url", "image_url": {"url": format!("data:image/png;base64,{PNG_BASE64}")}},
                ]},
                {"role": "user", "content": "and without?"},
            ])
        );
    }

    #[test]
    fn the_request_maps_history_and_tools() {
        let request = LlmRequest {
            model: "gpt-4o".to_owned(),
            system: Some("be brief".to_owned()),
            messages: vec![
                ChatMessage::user("list files"),
                ChatMessage::Assistant {
                    text: String::new(),
                    tool_calls: vec![ToolCall {
                        id: "call_1".to_owned(),
                        name: "list".to_owned(),
                        arguments: "{}".to_owned(),
                    }],
                },
                ChatMessage::ToolResult {
                    call_id: "call_1".to_owned(),
                    name: "list".to_owned(),
                    content: "a.txt".to_owned(),
                    is_error: false,
                },
            ],
            tools: [ToolSpec {
                name: "list".to_owned(),
                description: "Lists files".to_owned(),
                parameters: json!({"type": "object", "properties": {}}),
            }]
            .into(),
            max_tokens: Some(100),
            temperature: Some(0.5),
        };
        let tools = ToolsJson::new(wire_tools).of(&request.tools);
        assert_eq!(
            serde_json::to_value(request_body(&request, "max_completion_tokens", tools.as_deref()))
                .unwrap(),
            json!({
                "model": "gpt-4o",
                "messages": [
                    {"role": "system", "content": "be brief"},
                    {"role": "user", "content": "list files"},
                    {"role": "assistant", "content": null, "tool_calls": [
                        {"id": "call_1", "type": "function", "function": {"name": "list", "arguments": "{}"}}
                    ]},
                    {"role": "tool", "tool_call_id": "call_1", "content": "a.txt"},
                ],
                "stream": true,
                "stream_options": {"include_usage": true},
                "tools": [{"type": "function", "function": {
                    "name": "list", "description": "Lists files",
                    "parameters": {"type": "object", "properties": {}}
                }}],
                "max_completion_tokens": 100,
                "temperature": 0.5,
            })
        );
    }
}
