//! OpenAI Responses streaming (`POST {base_url}/responses`).
//!
//! Events are named by their `type`: text arrives in
//! `response.output_text.delta`, reasoning summaries in
//! `response.reasoning_summary_text.delta`, a function call opens with
//! `response.output_item.added`, streams `response.function_call_arguments.delta`
//! and is complete at `response.output_item.done`. The turn ends at
//! `response.completed` (with usage), `response.incomplete`,
//! `response.failed` or an `error` event; there is no `[DONE]`, though one a
//! proxy adds is accepted.
//!
//! A user message's images follow its `input_text` as `input_image` parts,
//! each with a `data:` URL as its `image_url` and `detail: "auto"`.

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use lemon_core::tool::ToolSpec;
use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};

use super::http::{self, Decoder, Endpoint};
use super::sse::SseEvent;
use super::tools_json::{self, ToolsJson};
use super::{
    ChatMessage, DataUrl, LlmClient, LlmError, LlmEvent, LlmRequest, LlmStream, LlmUsage,
    StopReason, ToolCall,
};

/// A Responses client for one base URL and key.
#[derive(Debug, Clone)]
pub struct OpenAiResponsesClient {
    endpoint: Endpoint,
    tools: Arc<ToolsJson>,
}

impl OpenAiResponsesClient {
    /// A client of `{base}/responses` (`base` without a trailing `/`).
    pub(crate) fn new(base: &str, mut endpoint: Endpoint) -> Self {
        endpoint.url = format!("{base}/responses");
        OpenAiResponsesClient { endpoint, tools: Arc::new(ToolsJson::new(wire_tools)) }
    }
}

#[async_trait]
impl LlmClient for OpenAiResponsesClient {
    async fn stream(&self, request: LlmRequest) -> Result<LlmStream, LlmError> {
        let tools = self.tools.of(&request.tools);
        let body = request_body(&request, tools.as_deref());
        self.endpoint.stream(&body, ResponsesDecoder::default()).await
    }
}

/// The wire request for `request`, serialised straight from the request's
/// own fields, with its `tools` array already serialised. Nothing is stored
/// on the provider's side (`store: false`): the whole history is sent every
/// turn.
pub(crate) fn request_body<'a>(
    request: &'a LlmRequest,
    tools: Option<&'a RawValue>,
) -> ResponsesBody<'a> {
    let mut input = Vec::with_capacity(request.messages.len());
    for message in &request.messages {
        match message {
            ChatMessage::User { text, images } => {
                let text =
                    (!text.is_empty() || images.is_empty()).then_some(Content::InputText { text });
                let images = images
                    .iter()
                    .map(|image| Content::InputImage { image_url: DataUrl(image), detail: "auto" });
                input.push(Item::Message {
                    role: "user",
                    content: text.into_iter().chain(images).collect(),
                })
            }
            ChatMessage::Assistant { text, tool_calls } => {
                if !text.is_empty() {
                    input.push(Item::Message {
                        role: "assistant",
                        content: vec![Content::OutputText { text }],
                    });
                }
                input.extend(tool_calls.iter().map(|call| Item::FunctionCall {
                    call_id: &call.id,
                    name: &call.name,
                    arguments: &call.arguments,
                }));
            }
            ChatMessage::ToolResult { call_id, content, .. } => {
                input.push(Item::FunctionCallOutput { call_id, output: content });
            }
        }
    }
    ResponsesBody {
        model: &request.model,
        input,
        stream: true,
        store: false,
        instructions: request.system.as_deref(),
        tools,
        max_output_tokens: request.max_tokens,
        temperature: request.temperature,
    }
}

/// `specs` as the request's `tools` array.
fn wire_tools(specs: &[ToolSpec]) -> Option<Box<RawValue>> {
    tools_json::array(specs, |tool| WireTool {
        kind: "function",
        name: &tool.name,
        description: &tool.description,
        parameters: &tool.parameters,
    })
}

/// A Responses request as sent.
#[derive(Debug, Serialize)]
pub(crate) struct ResponsesBody<'a> {
    model: &'a str,
    input: Vec<Item<'a>>,
    stream: bool,
    store: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    instructions: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tools: Option<&'a RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_output_tokens: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f32>,
}

#[derive(Debug, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Item<'a> {
    Message { role: &'static str, content: Vec<Content<'a>> },
    FunctionCall { call_id: &'a str, name: &'a str, arguments: &'a str },
    FunctionCallOutput { call_id: &'a str, output: &'a str },
}

#[derive(Debug, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Content<'a> {
    InputText { text: &'a str },
    InputImage { image_url: DataUrl<'a>, detail: &'static str },
    OutputText { text: &'a str },
}

#[derive(Debug, Serialize)]
struct WireTool<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    name: &'a str,
    description: &'a str,
    parameters: &'a Value,
}

/// Reads Responses events.
#[derive(Debug, Default)]
pub(crate) struct ResponsesDecoder {
    /// Function calls by item id, with the arguments streamed so far.
    calls: HashMap<String, ToolCall>,
    /// Whether a tool call was given this turn.
    called: bool,
}

fn text<'a>(value: &'a Value, key: &str) -> Option<&'a str> {
    value.get(key).and_then(Value::as_str)
}

fn usage(response: &Value) -> Option<LlmUsage> {
    let usage = response.get("usage").filter(|u| u.is_object())?;
    let count = |key| usage.get(key).and_then(Value::as_u64).unwrap_or(0);
    Some(LlmUsage { input_tokens: count("input_tokens"), output_tokens: count("output_tokens") })
}

impl ResponsesDecoder {
    fn tool_call(&mut self, item: &Value, out: &mut Vec<LlmEvent>) {
        let item_id = text(item, "id").unwrap_or_default();
        let streamed = self.calls.remove(item_id);
        let arguments = text(item, "arguments")
            .filter(|a| !a.is_empty())
            .map(str::to_owned)
            .or_else(|| streamed.as_ref().map(|c| c.arguments.clone()))
            .filter(|a| !a.trim().is_empty())
            .unwrap_or_else(|| "{}".to_owned());
        let id = text(item, "call_id")
            .map(str::to_owned)
            .or_else(|| streamed.as_ref().map(|c| c.id.clone()))
            .unwrap_or_else(|| item_id.to_owned());
        let name = text(item, "name")
            .map(str::to_owned)
            .or_else(|| streamed.map(|c| c.name))
            .unwrap_or_default();
        self.called = true;
        out.push(LlmEvent::ToolCall(ToolCall { id, name, arguments }));
    }
}

impl Decoder for ResponsesDecoder {
    fn event(&mut self, event: SseEvent, out: &mut Vec<LlmEvent>) -> Result<bool, LlmError> {
        if event.is_done() {
            return Err(LlmError::Network {
                message: "the stream ended before the response was complete".to_owned(),
            });
        }
        let value: Value = serde_json::from_str(&event.data).map_err(|error| {
            LlmError::Invalid { message: format!("a response event is not valid JSON: {error}") }
        })?;
        let kind = text(&value, "type").or(event.event.as_deref()).unwrap_or_default();
        match kind {
            "response.output_text.delta"
            | "response.reasoning_summary_text.delta"
            | "response.reasoning_text.delta" => {
                let delta = text(&value, "delta").unwrap_or_default();
                if !delta.is_empty() {
                    out.push(if kind == "response.output_text.delta" {
                        LlmEvent::TextDelta(delta.to_owned())
                    } else {
                        LlmEvent::ReasoningDelta(delta.to_owned())
                    });
                }
            }
            "response.output_item.added" => {
                let item = value.get("item").unwrap_or(&Value::Null);
                if text(item, "type") == Some("function_call") {
                    let item_id = text(item, "id").unwrap_or_default().to_owned();
                    self.calls.insert(
                        item_id.clone(),
                        ToolCall {
                            id: text(item, "call_id").map_or(item_id, str::to_owned),
                            name: text(item, "name").unwrap_or_default().to_owned(),
                            arguments: text(item, "arguments").unwrap_or_default().to_owned(),
                        },
                    );
                }
            }
            "response.function_call_arguments.delta" => {
                let item_id = text(&value, "item_id").unwrap_or_default();
                if let Some(call) = self.calls.get_mut(item_id) {
                    call.arguments.push_str(text(&value, "delta").unwrap_or_default());
                }
            }
            "response.function_call_arguments.done" => {
                let item_id = text(&value, "item_id").unwrap_or_default();
                if let (Some(call), Some(arguments)) =
                    (self.calls.get_mut(item_id), text(&value, "arguments"))
                {
                    arguments.clone_into(&mut call.arguments);
                }
            }
            "response.output_item.done" => {
                let item = value.get("item").unwrap_or(&Value::Null);
                if text(item, "type") == Some("function_call") {
                    self.tool_call(item, out);
                }
            }
            "response.completed" | "response.incomplete" => {
                let response = value.get("response").unwrap_or(&Value::Null);
                if let Some(usage) = usage(response) {
                    out.push(LlmEvent::Usage(usage));
                }
                let reason = if kind == "response.completed" {
                    if self.called {
                        StopReason::ToolUse
                    } else {
                        StopReason::EndTurn
                    }
                } else {
                    match response.pointer("/incomplete_details/reason").and_then(Value::as_str) {
                        Some("max_output_tokens") | None => StopReason::MaxTokens,
                        Some(other) => StopReason::Other(other.to_owned()),
                    }
                };
                out.push(LlmEvent::Done(reason));
                return Ok(true);
            }
            "response.failed" => {
                let error = value.pointer("/response/error").cloned().unwrap_or(Value::Null);
                let (message, kind, code) = http::error_fields(&json!({ "error": error }));
                let message =
                    if message.is_empty() { "the response failed".to_owned() } else { message };
                return Err(http::error_from_kind(kind.as_deref(), code.as_deref(), &message));
            }
            "error" => return Err(http::stream_error(&value)),
            _ => {}
        }
        Ok(false)
    }

    fn end(&mut self, _out: &mut Vec<LlmEvent>) -> Result<(), LlmError> {
        Err(LlmError::Network {
            message: "the stream ended before the response was complete".to_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llm::http::{decode_all, ok};
    use crate::llm::ImageInput;

    #[test]
    fn text_reasoning_and_usage() {
        let stream = concat!(
            "event: response.created\n",
            "data: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"resp_1\",\"object\":\"response\",\"status\":\"in_progress\",\"output\":[],\"usage\":null}}\n\n",
            "event: response.reasoning_summary_text.delta\n",
            "data: {\"type\":\"response.reasoning_summary_text.delta\",\"sequence_number\":1,\"item_id\":\"rs_1\",\"output_index\":0,\"summary_index\":0,\"delta\":\"Thinking\"}\n\n",
            "event: response.output_text.delta\n",
            "data: {\"type\":\"response.output_text.delta\",\"sequence_number\":2,\"item_id\":\"msg_1\",\"output_index\":1,\"content_index\":0,\"delta\":\"Hi\"}\n\n",
            "event: response.output_text.delta\n",
            "data: {\"type\":\"response.output_text.delta\",\"sequence_number\":3,\"item_id\":\"msg_1\",\"output_index\":1,\"content_index\":0,\"delta\":\" there\"}\n\n",
            "event: response.completed\n",
            "data: {\"type\":\"response.completed\",\"sequence_number\":4,\"response\":{\"id\":\"resp_1\",\"status\":\"completed\",\"usage\":{\"input_tokens\":36,\"input_tokens_details\":{\"cached_tokens\":0},\"output_tokens\":87,\"output_tokens_details\":{\"reasoning_tokens\":0},\"total_tokens\":123}}}\n\n",
        );
        assert_eq!(
            ok(decode_all(ResponsesDecoder::default(), stream)),
            vec![
                LlmEvent::ReasoningDelta("Thinking".to_owned()),
                LlmEvent::TextDelta("Hi".to_owned()),
                LlmEvent::TextDelta(" there".to_owned()),
                LlmEvent::Usage(LlmUsage { input_tokens: 36, output_tokens: 87 }),
                LlmEvent::Done(StopReason::EndTurn),
            ]
        );
    }

    #[test]
    fn function_calls_from_argument_deltas() {
        let stream = concat!(
            "event: response.output_item.added\n",
            "data: {\"type\":\"response.output_item.added\",\"output_index\":0,\"item\":{\"id\":\"fc_1\",\"type\":\"function_call\",\"status\":\"in_progress\",\"arguments\":\"\",\"call_id\":\"call_1\",\"name\":\"get_weather\"}}\n\n",
            "event: response.function_call_arguments.delta\n",
            "data: {\"type\":\"response.function_call_arguments.delta\",\"item_id\":\"fc_1\",\"output_index\":0,\"delta\":\"{\\\"loc\"}\n\n",
            "event: response.function_call_arguments.delta\n",
            "data: {\"type\":\"response.function_call_arguments.delta\",\"item_id\":\"fc_1\",\"output_index\":0,\"delta\":\"ation\\\":\\\"Paris\\\"}\"}\n\n",
            "event: response.output_item.added\n",
            "data: {\"type\":\"response.output_item.added\",\"output_index\":1,\"item\":{\"id\":\"fc_2\",\"type\":\"function_call\",\"arguments\":\"\",\"call_id\":\"call_2\",\"name\":\"list\"}}\n\n",
            "event: response.function_call_arguments.done\n",
            "data: {\"type\":\"response.function_call_arguments.done\",\"item_id\":\"fc_1\",\"output_index\":0,\"arguments\":\"{\\\"location\\\":\\\"Paris\\\"}\"}\n\n",
            "event: response.output_item.done\n",
            "data: {\"type\":\"response.output_item.done\",\"output_index\":0,\"item\":{\"id\":\"fc_1\",\"type\":\"function_call\",\"status\":\"completed\",\"arguments\":\"{\\\"location\\\":\\\"Paris\\\"}\",\"call_id\":\"call_1\",\"name\":\"get_weather\"}}\n\n",
            "event: response.output_item.done\n",
            "data: {\"type\":\"response.output_item.done\",\"output_index\":1,\"item\":{\"id\":\"fc_2\",\"type\":\"function_call\",\"status\":\"completed\",\"call_id\":\"call_2\",\"name\":\"list\"}}\n\n",
            "event: response.completed\n",
            "data: {\"type\":\"response.completed\",\"response\":{\"status\":\"completed\",\"usage\":{\"input_tokens\":5,\"output_tokens\":9}}}\n\n",
        );
        assert_eq!(
            ok(decode_all(ResponsesDecoder::default(), stream)),
            vec![
                LlmEvent::ToolCall(ToolCall {
                    id: "call_1".to_owned(),
                    name: "get_weather".to_owned(),
                    arguments: "{\"location\":\"Paris\"}".to_owned(),
                }),
                LlmEvent::ToolCall(ToolCall {
                    id: "call_2".to_owned(),
                    name: "list".to_owned(),
                    arguments: "{}".to_owned(),
                }),
                LlmEvent::Usage(LlmUsage { input_tokens: 5, output_tokens: 9 }),
                LlmEvent::Done(StopReason::ToolUse),
            ]
        );
    }

    #[test]
    fn incomplete_failed_and_error_events() {
        let incomplete = "event: response.incomplete\ndata: {\"type\":\"response.incomplete\",\"response\":{\"status\":\"incomplete\",\"incomplete_details\":{\"reason\":\"max_output_tokens\"},\"usage\":{\"input_tokens\":1,\"output_tokens\":2}}}\n\n";
        assert_eq!(
            ok(decode_all(ResponsesDecoder::default(), incomplete)),
            vec![
                LlmEvent::Usage(LlmUsage { input_tokens: 1, output_tokens: 2 }),
                LlmEvent::Done(StopReason::MaxTokens),
            ]
        );
        let failed = "event: response.failed\ndata: {\"type\":\"response.failed\",\"response\":{\"status\":\"failed\",\"error\":{\"code\":\"context_length_exceeded\",\"message\":\"Your input exceeds the context window of this model. Please adjust your input and try again.\"}}}\n\n";
        assert!(matches!(
            &decode_all(ResponsesDecoder::default(), failed)[0],
            Err(LlmError::ContextOverflow { message }) if message.starts_with("Your input exceeds")
        ));
        let error = "event: error\ndata: {\"type\":\"error\",\"code\":\"server_is_overloaded\",\"message\":\"Our servers are currently overloaded.\",\"param\":null,\"sequence_number\":3}\n\n";
        assert_eq!(
            decode_all(ResponsesDecoder::default(), error),
            vec![Err(LlmError::Server {
                status: 503,
                message: "Our servers are currently overloaded.".to_owned()
            })]
        );
        let cut = "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"a\"}\n\n";
        let events = decode_all(ResponsesDecoder::default(), cut);
        assert_eq!(events[0], Ok(LlmEvent::TextDelta("a".to_owned())));
        assert!(matches!(events[1], Err(LlmError::Network { .. })));
    }

    #[test]
    fn a_user_message_with_images_sends_input_image_parts_after_its_text() {
        let png: &[u8] = b"\x89PNG\r\n\x1a\n\xfb\xef\xff\xbf\x00";
        let request = LlmRequest {
            model: "gpt-5".to_owned(),
            system: None,
            messages: vec![
                ChatMessage::User {
                    text: "describe".to_owned(),
                    images: vec![
                        ImageInput::new("image/png", png),
                        ImageInput::new("image/webp", &b"RIFF\x00\x00\x00\x00WEBP"[..]),
                    ],
                },
                ChatMessage::User {
                    text: String::new(),
                    images: vec![ImageInput::new("image/png", png)],
                },
            ],
            tools: [].into(),
            max_tokens: None,
            temperature: None,
        };
        let image = |url: &str| json!({"type": "input_image", "image_url": url, "detail": "auto"});
        assert_eq!(
            serde_json::to_value(request_body(&request, None)).unwrap()["input"],
            json!([
                {"type": "message", "role": "user", "content": [
                    {"type": "input_text", "text": "describe"},
                    image("data:image/png;base64,iVBORw0KGgr77/+/AA=="),
                    image("data:image/webp;base64,UklGRgAAAABXRUJQ"),
                ]},
                {"type": "message", "role": "user", "content": [
                    image("data:image/png;base64,iVBORw0KGgr77/+/AA=="),
                ]},
            ])
        );
    }

    #[test]
    fn the_request_maps_history_and_tools() {
        let request = LlmRequest {
            model: "gpt-5".to_owned(),
            system: Some("be brief".to_owned()),
            messages: vec![
                ChatMessage::user("weather?"),
                ChatMessage::Assistant {
                    text: "Looking.".to_owned(),
                    tool_calls: vec![ToolCall {
                        id: "call_1".to_owned(),
                        name: "get_weather".to_owned(),
                        arguments: "{\"location\":\"Paris\"}".to_owned(),
                    }],
                },
                ChatMessage::ToolResult {
                    call_id: "call_1".to_owned(),
                    name: "get_weather".to_owned(),
                    content: "sunny".to_owned(),
                    is_error: false,
                },
            ],
            tools: [ToolSpec {
                name: "get_weather".to_owned(),
                description: "Weather".to_owned(),
                parameters: json!({"type": "object"}),
            }]
            .into(),
            max_tokens: Some(50),
            temperature: None,
        };
        let tools = ToolsJson::new(wire_tools).of(&request.tools);
        assert_eq!(
            serde_json::to_value(request_body(&request, tools.as_deref())).unwrap(),
            json!({
                "model": "gpt-5",
                "input": [
                    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "weather?"}]},
                    {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Looking."}]},
                    {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"location\":\"Paris\"}"},
                    {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
                ],
                "stream": true,
                "store": false,
                "instructions": "be brief",
                "tools": [{"type": "function", "name": "get_weather", "description": "Weather", "parameters": {"type": "object"}}],
                "max_output_tokens": 50,
            })
        );
    }
}
