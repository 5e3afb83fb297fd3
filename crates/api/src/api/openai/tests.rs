//! The OpenAI-compatible routes against a real gateway with the echo engine:
//! the exact shapes of objects, chunks and events, sessions, history, and every
//! refusal in OpenAI's error shape; and the text a run is shown as.

use std::time::Duration;

use axum::body::Body;
use axum::http::{header, HeaderMap, Method, Request, StatusCode};
use lemon_core::bus::EventBus;
use lemon_core::engine::{Action, ActionKind, ActionPhase, Completion};
use lemon_core::gateway::RuntimeConfig;
use lemon_core::testing::within;
use serde_json::{json, Value};
use tower::ServiceExt;

use super::follow::Rendering;
use super::turns::{prompt, Role, Turn};
use crate::api::tests::TestGateway;

const TOKEN: &str = "test-token-6f1c";

/// A response: status, headers and the whole body as text.
async fn send(gw: &TestGateway, req: Request<Body>) -> (StatusCode, HeaderMap, String) {
    let what = format!("{} {}", req.method(), req.uri());
    let response = within(&what, gw.router().oneshot(req)).await.unwrap();
    let (parts, body) = response.into_parts();
    let bytes = within(&what, axum::body::to_bytes(body, usize::MAX)).await.unwrap();
    (parts.status, parts.headers, String::from_utf8(bytes.to_vec()).unwrap())
}

fn post(uri: &str, body: &Value) -> Request<Body> {
    Request::builder()
        .method(Method::POST)
        .uri(uri)
        .header(header::AUTHORIZATION, format!("Bearer {TOKEN}"))
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_string()))
        .unwrap()
}

async fn post_json(gw: &TestGateway, uri: &str, body: Value) -> (StatusCode, HeaderMap, Value) {
    let (status, headers, text) = send(gw, post(uri, &body)).await;
    let value = serde_json::from_str(&text).unwrap_or_else(|_| panic!("not JSON: {text}"));
    (status, headers, value)
}

/// The `data:` payloads of an SSE body, with their `event:` names.
fn frames(body: &str) -> Vec<(Option<String>, String)> {
    body.split("\n\n")
        .filter(|frame| !frame.trim().is_empty())
        .filter_map(|frame| {
            let mut event = None;
            let mut data = Vec::new();
            for line in frame.lines() {
                if let Some(name) = line.strip_prefix("event: ") {
                    event = Some(name.to_owned());
                } else if let Some(value) = line.strip_prefix("data: ") {
                    data.push(value);
                }
            }
            (!data.is_empty()).then(|| (event, data.join("\n")))
        })
        .collect()
}

fn user(text: &str) -> Value {
    json!({ "role": "user", "content": text })
}

/// Checks `body` is OpenAI's error with `status`, `type` and `code`.
fn check_error(status: StatusCode, body: &Value, want: (StatusCode, &str, Option<&str>)) {
    assert_eq!(status, want.0, "{body}");
    let error = &body["error"];
    assert!(error["message"].as_str().is_some_and(|m| !m.is_empty()), "{body}");
    assert_eq!(error["type"], want.1, "{body}");
    assert_eq!(error["code"], json!(want.2), "{body}");
    assert!(error.as_object().unwrap().contains_key("param"), "{body}");
}

#[tokio::test]
async fn a_chat_completion_answers_with_the_last_user_message_as_the_prompt() {
    let gw = TestGateway::start(Duration::ZERO);
    let body = json!({ "model": "echo", "messages": [user("hello there")], "temperature": 0.2 });
    let (status, headers, completion) = post_json(&gw, "/v1/chat/completions", body).await;
    assert_eq!(status, StatusCode::OK, "{completion}");
    let run_id = headers["x-lemon-run-id"].to_str().unwrap();
    assert_eq!(completion["id"], format!("chatcmpl-{run_id}"));
    assert_eq!(headers["x-lemon-session"].to_str().unwrap(), format!("openai:{run_id}"));
    assert_eq!(completion["object"], "chat.completion");
    assert_eq!(completion["model"], "echo");
    assert!(completion["created"].as_u64().unwrap() > 1_700_000_000);
    assert_eq!(
        completion["choices"],
        json!([{
            "index": 0,
            "message": { "role": "assistant", "content": "hello there", "refusal": null },
            "logprobs": null,
            "finish_reason": "stop",
        }])
    );
    // Echo reports no usage.
    assert_eq!(completion["usage"], Value::Null);
    // The run is a run like any other.
    let record = gw.state.runs.get(&lemon_core::ids::RunId::parse(run_id).unwrap()).await;
    let record = record.unwrap().unwrap();
    assert_eq!(record.prompt, "hello there");
    assert_eq!(record.answer.as_deref(), Some("hello there"));
}

#[tokio::test]
async fn a_streamed_chat_completion_is_role_then_content_then_finish_then_done() {
    let gw = TestGateway::start(Duration::ZERO);
    let body = json!({
        "model": "echo",
        "messages": [user("one two three")],
        "stream": true,
        "stream_options": { "include_usage": true },
    });
    let (status, headers, text) = send(&gw, post("/v1/chat/completions", &body)).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    assert!(headers[header::CONTENT_TYPE].to_str().unwrap().starts_with("text/event-stream"));
    let run_id = headers["x-lemon-run-id"].to_str().unwrap().to_owned();
    let frames = frames(&text);
    let (last, chunks) = frames.split_last().unwrap();
    assert_eq!(last, &(None, "[DONE]".to_owned()));
    let chunks: Vec<Value> =
        chunks.iter().map(|(_, data)| serde_json::from_str(data).unwrap()).collect();
    for chunk in &chunks {
        assert_eq!(chunk["id"], format!("chatcmpl-{run_id}"));
        assert_eq!(chunk["object"], "chat.completion.chunk");
        assert_eq!(chunk["model"], "echo");
        // Asked for usage: every chunk carries `usage: null` (echo reports none,
        // so there is no usage chunk).
        assert_eq!(chunk["usage"], Value::Null, "{chunk}");
        assert!(chunk.as_object().unwrap().contains_key("usage"));
    }
    assert_eq!(
        chunks[0]["choices"],
        json!([{ "index": 0, "delta": { "role": "assistant", "content": "" }, "logprobs": null, "finish_reason": null }])
    );
    let (finish, content) = chunks[1..].split_last().unwrap();
    assert_eq!(
        finish["choices"],
        json!([{ "index": 0, "delta": {}, "logprobs": null, "finish_reason": "stop" }])
    );
    assert!(content.len() >= 2, "streamed in pieces: {content:?}");
    let streamed: String = content
        .iter()
        .map(|chunk| {
            assert_eq!(chunk["choices"][0]["finish_reason"], Value::Null);
            chunk["choices"][0]["delta"]["content"].as_str().unwrap().to_owned()
        })
        .collect();
    assert_eq!(streamed, "one two three");
}

#[tokio::test]
async fn earlier_messages_go_before_the_prompt_until_the_session_holds_them() {
    let gw = TestGateway::start(Duration::ZERO);
    let messages = json!([
        { "role": "system", "content": "Be brief." },
        user("first"),
        { "role": "assistant", "content": [{ "type": "text", "text": "an answer" }] },
        user("second"),
    ]);
    let transcript = "<conversation so far>\nsystem: Be brief.\nuser: first\nassistant: an answer\n</conversation so far>\n\nsecond";

    // A fresh session: the engine has nothing, so it gets the transcript.
    let body = json!({ "model": "echo", "messages": messages });
    let (status, _, completion) = post_json(&gw, "/v1/chat/completions", body).await;
    assert_eq!(status, StatusCode::OK, "{completion}");
    assert_eq!(completion["choices"][0]["message"]["content"], transcript);

    // A named session: the first request sends the history, and once the
    // engine holds the session only the newest message is sent.
    let body = json!({ "model": "echo", "messages": messages, "user": "alice" });
    let (_, headers, first) = post_json(&gw, "/v1/chat/completions", body.clone()).await;
    assert_eq!(first["choices"][0]["message"]["content"], transcript);
    assert_eq!(headers["x-lemon-session"], "alice");
    let (_, _, second) = post_json(&gw, "/v1/chat/completions", body).await;
    assert_eq!(second["choices"][0]["message"]["content"], "second");

    // The header names the session too, and wins over `user`.
    let mut req = post(
        "/v1/chat/completions",
        &json!({ "model": "echo", "messages": messages, "user": "bob" }),
    );
    req.headers_mut().insert("x-lemon-session", "alice".parse().unwrap());
    let (_, headers, text) = send(&gw, req).await;
    assert_eq!(headers["x-lemon-session"], "alice");
    let reply: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(reply["choices"][0]["message"]["content"], "second");

    // A blank header names nothing: `user` does.
    let mut req = post(
        "/v1/chat/completions",
        &json!({ "model": "echo", "messages": messages, "user": "alice" }),
    );
    req.headers_mut().insert("x-lemon-session", " ".parse().unwrap());
    let (_, headers, _) = send(&gw, req).await;
    assert_eq!(headers["x-lemon-session"], "alice");
}

#[tokio::test]
async fn a_slash_command_is_answered_as_the_assistant() {
    let gw = TestGateway::start(Duration::ZERO);
    let body = json!({ "model": "echo", "messages": [user("/status")], "user": "carol" });
    let (status, _, completion) = post_json(&gw, "/v1/chat/completions", body).await;
    assert_eq!(status, StatusCode::OK, "{completion}");
    let content = completion["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(!content.is_empty(), "{completion}");
    let body = json!({ "model": "echo", "messages": [user("/status")], "stream": true });
    let (_, _, text) = send(&gw, post("/v1/chat/completions", &body)).await;
    let frames = frames(&text);
    assert_eq!(frames.len(), 4, "{text}");
    assert_eq!(frames[3].1, "[DONE]");
}

#[tokio::test]
async fn models_are_the_available_engines() {
    let gw = TestGateway::start(Duration::ZERO);
    let req = Request::builder()
        .uri("/v1/models")
        .header(header::AUTHORIZATION, format!("Bearer {TOKEN}"))
        .body(Body::empty())
        .unwrap();
    let (status, _, text) = send(&gw, req).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let list: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(list["object"], "list");
    let data = list["data"].as_array().unwrap();
    assert_eq!(data.len(), 1, "{list}");
    assert_eq!(data[0]["id"], "echo");
    assert_eq!(data[0]["object"], "model");
    assert_eq!(data[0]["owned_by"], "lemon-gateway");
    assert!(data[0]["created"].is_u64());

    let one = |id: &str| {
        Request::builder()
            .uri(format!("/v1/models/{id}"))
            .header(header::AUTHORIZATION, format!("Bearer {TOKEN}"))
            .body(Body::empty())
            .unwrap()
    };
    let (status, _, text) = send(&gw, one("echo")).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let (status, _, text) = send(&gw, one("nonesuch")).await;
    let body: Value = serde_json::from_str(&text).unwrap();
    check_error(
        status,
        &body,
        (StatusCode::NOT_FOUND, "invalid_request_error", Some("model_not_found")),
    );
}

#[tokio::test]
async fn bad_requests_are_400s_in_openai_error_shape() {
    let gw = TestGateway::start(Duration::ZERO);
    let invalid = (StatusCode::BAD_REQUEST, "invalid_request_error", None);
    let cases = [
        (
            json!({ "model": "nonesuch", "messages": [user("hi")] }),
            (StatusCode::BAD_REQUEST, "invalid_request_error", Some("model_not_found")),
        ),
        (json!({ "messages": [user("hi")] }), invalid),
        (
            json!({ "model": "echo:-rf", "messages": [user("hi")] }),
            (StatusCode::BAD_REQUEST, "invalid_request_error", Some("invalid_value")),
        ),
        (
            json!({ "model": "Echo!", "messages": [user("hi")] }),
            (StatusCode::BAD_REQUEST, "invalid_request_error", Some("invalid_value")),
        ),
        (json!({ "model": "echo", "messages": [] }), invalid),
        (json!({ "model": "echo" }), invalid),
        (
            json!({ "model": "echo", "messages": [user("hi"), { "role": "assistant", "content": "x" }] }),
            invalid,
        ),
        (json!({ "model": "echo", "messages": [user("  ")] }), invalid),
        (json!({ "model": "echo", "messages": [{ "role": "wizard", "content": "x" }] }), invalid),
        (
            json!({ "model": "echo", "messages": [{ "role": "user", "content": [{ "type": "image_url", "image_url": { "url": "http://x" } }] }] }),
            invalid,
        ),
        (json!({ "model": "echo", "messages": "hi" }), invalid),
        (json!({ "model": "echo", "messages": [user("hi")], "user": "a\u{7}b" }), invalid),
        (json!({ "model": "echo", "messages": [user("hi")], "user": "x".repeat(300) }), invalid),
    ];
    for (body, want) in cases {
        let (status, _, error) = post_json(&gw, "/v1/chat/completions", body.clone()).await;
        check_error(status, &error, want);
    }
    let unknown = json!({ "model": "nonesuch", "messages": [user("hi")] });
    let (_, _, error) = post_json(&gw, "/v1/chat/completions", unknown).await;
    assert!(
        error["error"]["message"].as_str().unwrap().ends_with("the models are echo"),
        "names the models: {error}"
    );
    assert_eq!(error["error"]["param"], "model");

    // Not JSON, by its content type or its text.
    let mut req = post("/v1/chat/completions", &json!({}));
    req.headers_mut().insert(header::CONTENT_TYPE, "text/plain".parse().unwrap());
    let (status, _, text) = send(&gw, req).await;
    let body: Value = serde_json::from_str(&text).unwrap();
    check_error(status, &body, (StatusCode::UNSUPPORTED_MEDIA_TYPE, "invalid_request_error", None));
    let mut req = post("/v1/responses", &json!({}));
    *req.body_mut() = Body::from("{not json");
    let (status, _, text) = send(&gw, req).await;
    let body: Value = serde_json::from_str(&text).unwrap();
    check_error(status, &body, invalid);
    // Too large.
    let huge =
        json!({ "model": "echo", "messages": [user(&"x".repeat(crate::error::MAX_BODY_BYTES))] });
    let (status, _, body) = post_json(&gw, "/v1/chat/completions", huge).await;
    check_error(status, &body, (StatusCode::PAYLOAD_TOO_LARGE, "invalid_request_error", None));
    // A session header with a control character.
    let mut req =
        post("/v1/chat/completions", &json!({ "model": "echo", "messages": [user("hi")] }));
    req.headers_mut().insert("x-lemon-session", "a\tb".parse().unwrap());
    let (status, _, text) = send(&gw, req).await;
    let body: Value = serde_json::from_str(&text).unwrap();
    check_error(status, &body, invalid);
    // The wrong method.
    let req = Request::builder()
        .method(Method::GET)
        .uri("/v1/chat/completions")
        .header(header::AUTHORIZATION, format!("Bearer {TOKEN}"))
        .body(Body::empty())
        .unwrap();
    let (status, _, text) = send(&gw, req).await;
    let body: Value = serde_json::from_str(&text).unwrap();
    check_error(status, &body, (StatusCode::METHOD_NOT_ALLOWED, "invalid_request_error", None));

    // Nothing was run.
    let runs = gw.state.runs.list(lemon_core::store::RunFilter { status: None, limit: 10 }).await;
    assert!(runs.unwrap().is_empty());
}

#[tokio::test]
async fn a_missing_or_wrong_token_is_401_in_openai_error_shape() {
    let gw = TestGateway::start(Duration::ZERO);
    for auth in [None, Some("Bearer wrong"), Some("Basic dGVzdA==")] {
        for uri in ["/v1/chat/completions", "/v1/responses", "/v1/models"] {
            let mut builder = Request::builder().method(Method::POST).uri(uri);
            if uri == "/v1/models" {
                builder = builder.method(Method::GET);
            }
            if let Some(auth) = auth {
                builder = builder.header(header::AUTHORIZATION, auth);
            }
            let req = builder
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from(json!({ "model": "echo", "input": "hi" }).to_string()))
                .unwrap();
            let (status, headers, text) = send(&gw, req).await;
            let body: Value = serde_json::from_str(&text).unwrap();
            check_error(
                status,
                &body,
                (StatusCode::UNAUTHORIZED, "invalid_request_error", Some("invalid_api_key")),
            );
            assert_eq!(headers[header::WWW_AUTHENTICATE], "Bearer");
            assert!(!text.contains(TOKEN));
        }
    }
    // The control API keeps its own shape.
    let req = Request::builder().uri("/v1/runs").body(Body::empty()).unwrap();
    let (status, _, text) = send(&gw, req).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(serde_json::from_str::<Value>(&text).unwrap()["error"].is_string(), "{text}");
}

#[tokio::test]
async fn an_overloaded_gateway_is_429_with_retry_after() {
    let config = RuntimeConfig { max_pending_runs: 0, ..RuntimeConfig::default() };
    let gw = TestGateway::with_config(Duration::ZERO, config, EventBus::default());
    for (uri, body) in [
        ("/v1/chat/completions", json!({ "model": "echo", "messages": [user("hi")] })),
        ("/v1/responses", json!({ "model": "echo", "input": "hi", "stream": true })),
    ] {
        let (status, headers, error) = post_json(&gw, uri, body).await;
        check_error(
            status,
            &error,
            (StatusCode::TOO_MANY_REQUESTS, "rate_limit_error", Some("rate_limit_exceeded")),
        );
        assert_eq!(headers[header::RETRY_AFTER], "1");
        // Nothing ran: the client may try again.
        assert!(!headers.contains_key("x-should-retry"));
    }
}

#[tokio::test]
async fn a_response_is_the_answer_as_one_message_item() {
    let gw = TestGateway::start(Duration::ZERO);
    let body = json!({ "model": "echo", "input": "say this", "instructions": "Be brief." });
    let (status, headers, response) = post_json(&gw, "/v1/responses", body).await;
    assert_eq!(status, StatusCode::OK, "{response}");
    let run_id = headers["x-lemon-run-id"].to_str().unwrap();
    let transcript = "<conversation so far>\nsystem: Be brief.\n</conversation so far>\n\nsay this";
    assert_eq!(response["id"], format!("resp_{run_id}"));
    assert_eq!(response["object"], "response");
    assert_eq!(response["status"], "completed");
    assert_eq!(response["model"], "echo");
    assert_eq!(response["instructions"], "Be brief.");
    assert_eq!(response["error"], Value::Null);
    assert_eq!(
        response["output"],
        json!([{
            "id": format!("msg_{run_id}"),
            "type": "message",
            "status": "completed",
            "role": "assistant",
            "content": [{ "type": "output_text", "text": transcript, "annotations": [] }],
        }])
    );

    // Input as message items, continuing that response's session.
    let body = json!({
        "model": "echo",
        "input": [{ "type": "message", "role": "user", "content": [{ "type": "input_text", "text": "next" }] }],
        "previous_response_id": response["id"],
    });
    let (status, headers, next) = post_json(&gw, "/v1/responses", body).await;
    assert_eq!(status, StatusCode::OK, "{next}");
    assert_eq!(headers["x-lemon-session"].to_str().unwrap(), format!("openai:{run_id}"));
    assert_eq!(next["output"][0]["content"][0]["text"], "next");

    let body =
        json!({ "model": "echo", "input": "x", "previous_response_id": "resp_run_nonesuch" });
    let (status, _, error) = post_json(&gw, "/v1/responses", body).await;
    check_error(
        status,
        &error,
        (StatusCode::BAD_REQUEST, "invalid_request_error", Some("previous_response_not_found")),
    );
    // Instructions alone are not a prompt.
    let body = json!({ "model": "echo", "instructions": "Be brief." });
    let (status, _, error) = post_json(&gw, "/v1/responses", body).await;
    check_error(status, &error, (StatusCode::BAD_REQUEST, "invalid_request_error", None));
    assert_eq!(error["error"]["param"], "input");
    let body = json!({ "model": "echo", "input": [{ "type": "function_call_output", "call_id": "c", "output": "1" }] });
    let (status, _, error) = post_json(&gw, "/v1/responses", body).await;
    check_error(status, &error, (StatusCode::BAD_REQUEST, "invalid_request_error", None));
}

#[tokio::test]
async fn a_streamed_response_is_the_responses_event_sequence() {
    let gw = TestGateway::start(Duration::ZERO);
    let body = json!({ "model": "echo", "input": "alpha beta", "stream": true });
    let (status, headers, text) = send(&gw, post("/v1/responses", &body)).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let run_id = headers["x-lemon-run-id"].to_str().unwrap();
    let (item_id, response_id) = (format!("msg_{run_id}"), format!("resp_{run_id}"));
    let events: Vec<(String, Value)> = frames(&text)
        .into_iter()
        .map(|(name, data)| {
            (name.expect("every event is named"), serde_json::from_str(&data).unwrap())
        })
        .collect();
    for (index, (name, data)) in events.iter().enumerate() {
        assert_eq!(&data["type"], name, "the name mirrors the type");
        assert_eq!(data["sequence_number"], index, "{data}");
    }
    let names: Vec<&str> = events.iter().map(|(name, _)| name.as_str()).collect();
    let deltas = names.iter().filter(|name| **name == "response.output_text.delta").count();
    assert!(deltas >= 2, "{names:?}");
    let mut want = vec![
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ];
    want.extend(std::iter::repeat_n("response.output_text.delta", deltas));
    want.extend([
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]);
    assert_eq!(names, want);
    let created = &events[0].1["response"];
    assert_eq!(created["id"], response_id);
    assert_eq!(created["status"], "in_progress");
    assert_eq!(created["output"], json!([]));
    assert_eq!(
        events[2].1["item"],
        json!({ "id": item_id, "type": "message", "status": "in_progress", "role": "assistant", "content": [] })
    );
    let text: String = events[4..4 + deltas]
        .iter()
        .map(|(_, data)| {
            assert_eq!(data["item_id"], item_id);
            assert_eq!(data["output_index"], 0);
            assert_eq!(data["content_index"], 0);
            data["delta"].as_str().unwrap().to_owned()
        })
        .collect();
    assert_eq!(text, "alpha beta");
    assert_eq!(events[4 + deltas].1["text"], "alpha beta");
    let completed = &events.last().unwrap().1["response"];
    assert_eq!(completed["status"], "completed");
    assert_eq!(completed["output"][0]["content"][0]["text"], "alpha beta");
    assert_eq!(completed["output"][0]["status"], "completed");
}

fn action(id: &str, kind: ActionKind, phase: ActionPhase, title: &str) -> Action {
    Action {
        id: id.to_owned(),
        kind,
        title: title.to_owned(),
        detail: Value::Null,
        phase,
        ok: (phase == ActionPhase::Completed).then_some(true),
        message: None,
        level: None,
        result_meta: Value::Null,
    }
}

#[test]
fn tool_calls_are_lines_of_their_own_between_the_answers_text() {
    let mut text = Rendering::default();
    let mut shown = String::new();
    let mut show = |piece: Option<String>| shown.push_str(&piece.unwrap_or_default());
    show(text.delta("Let me look."));
    show(text.action(&action("1", ActionKind::Command, ActionPhase::Started, "ls\ntest")));
    show(text.action(&action("1", ActionKind::Command, ActionPhase::Completed, "ls test")));
    show(text.action(&action("r", ActionKind::Reasoning, ActionPhase::Started, "thinking")));
    let mut failed = action("2", ActionKind::Tool, ActionPhase::Completed, "Read a.txt");
    failed.ok = Some(false);
    failed.message = Some("no such\nfile".to_owned());
    show(text.action(&failed));
    show(text.delta("\n\n"));
    show(text.delta("\nThere are 2."));
    // The answer is what was streamed: nothing more to show.
    let done = Completion::success("Let me look.\n\n\nThere are 2.", None);
    assert_eq!(text.rest(&done), None);
    assert_eq!(shown, "Let me look.\n▸ ls test\n✗ Read a.txt: no such file\n\nThere are 2.");
}

#[test]
fn an_answer_not_streamed_is_shown_at_the_end() {
    let mut text = Rendering::default();
    assert_eq!(text.rest(&Completion::success("all of it", None)), Some("all of it".to_owned()));
    let mut text = Rendering::default();
    text.delta("the start");
    assert_eq!(
        text.rest(&Completion::success("the start and the end", None)),
        Some(" and the end".to_owned())
    );
    let mut text = Rendering::default();
    let failed = Completion::failure(lemon_core::engine::RunError::Timeout, None);
    assert_eq!(text.rest(&failed), None);
}

fn turn(role: Role, text: &str) -> Turn {
    Turn { role, text: text.to_owned(), files: Vec::new() }
}

#[test]
fn the_prompt_is_the_last_user_message_after_the_history_when_wanted() {
    let turns = [
        turn(Role::System, "sys"),
        turn(Role::Tool, ""),
        turn(Role::User, "q1"),
        turn(Role::Assistant, "a1\nmore\n"),
        turn(Role::User, "q2"),
    ];
    assert_eq!(prompt(&turns, false, "messages").unwrap(), "q2");
    assert_eq!(
        prompt(&turns, true, "messages").unwrap(),
        "<conversation so far>\nsystem: sys\nuser: q1\nassistant: a1\nmore\n</conversation so far>\n\nq2"
    );
    assert_eq!(prompt(&turns[4..], true, "messages").unwrap(), "q2");
    assert!(prompt(&[], true, "messages").is_err());
    assert!(prompt(&turns[..4], true, "messages").is_err());
    assert_eq!(prompt(&[turn(Role::User, " ")], true, "input").unwrap_err().param, Some("input"));
}

/// A gateway taking files whose runs work in a project directory of their own.
fn with_project() -> (TestGateway, tempfile::TempDir) {
    let project = tempfile::tempdir().unwrap();
    let config =
        RuntimeConfig { default_cwd: Some(project.path().to_owned()), ..RuntimeConfig::default() };
    let files = lemon_core::media::FilesConfig::default();
    (TestGateway::with_files(Duration::ZERO, config, EventBus::default(), files), project)
}

fn base64_of(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

const PNG: &[u8] = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR\0\0\0\x01\0\0\0\x01";

#[tokio::test]
async fn a_chat_image_becomes_a_file_of_the_run_named_in_its_prompt() {
    let (gw, project) = with_project();
    let image = format!("data:image/png;base64,{}", base64_of(PNG));
    let body = json!({
        "model": "echo",
        "messages": [{ "role": "user", "content": [
            { "type": "text", "text": "what is in this picture?" },
            { "type": "image_url", "image_url": { "url": image, "detail": "low" } },
        ] }],
    });
    let (status, _, completion) = post_json(&gw, "/v1/chat/completions", body).await;
    assert_eq!(status, StatusCode::OK, "{completion}");
    let answer = completion["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(answer.starts_with("what is in this picture?\n\n[Files sent"), "{answer}");
    assert!(answer.contains(".lemon/uploads/attachment-1.png (image, image/png,"), "{answer}");
    let saved = project.path().join(".lemon/uploads/attachment-1.png");
    assert_eq!(std::fs::read(saved).unwrap(), PNG);
}

#[tokio::test]
async fn responses_take_input_images_and_files() {
    let (gw, project) = with_project();
    let body = json!({
        "model": "echo",
        "input": [{ "role": "user", "content": [
            { "type": "input_text", "text": "compare these" },
            { "type": "input_image", "image_url": format!("data:image/png;base64,{}", base64_of(PNG)) },
            { "type": "input_file", "filename": "notes.txt",
              "file_data": format!("data:text/plain;base64,{}", base64_of(b"line one\n")) },
        ] }],
    });
    let (status, _, response) = post_json(&gw, "/v1/responses", body).await;
    assert_eq!(status, StatusCode::OK, "{response}");
    let answer = response["output"][0]["content"][0]["text"].as_str().unwrap();
    assert!(answer.contains(".lemon/uploads/attachment-1.png (image"), "{answer}");
    assert!(answer.contains(".lemon/uploads/notes.txt (file, text/plain"), "{answer}");
    let uploads = project.path().join(".lemon/uploads");
    assert_eq!(std::fs::read(uploads.join("notes.txt")).unwrap(), b"line one\n");
}

#[tokio::test]
async fn refused_images_and_files_answer_in_openais_shape() {
    let (gw, project) = with_project();
    let chat = |part: Value| {
        json!({ "model": "echo", "messages": [{ "role": "user", "content": [
            { "type": "text", "text": "look" }, part,
        ] }] })
    };
    let invalid = (StatusCode::BAD_REQUEST, "invalid_request_error", None);
    let cases = [
        (
            chat(
                json!({ "type": "image_url", "image_url": { "url": "data:image/png;base64,@@@" } }),
            ),
            invalid,
            "content[1]: it is not base64",
        ),
        (
            chat(json!({ "type": "file", "file": { "file_id": "file-abc" } })),
            invalid,
            "file_id is not supported",
        ),
        (
            chat(json!({ "type": "input_audio", "input_audio": { "data": "", "format": "wav" } })),
            invalid,
            "not supported",
        ),
        (
            chat(
                json!({ "type": "file", "file": { "filename": "../x.txt", "file_data": base64_of(b"x") } }),
            ),
            invalid,
            "content[1] (../x.txt): the file name",
        ),
        (
            chat(
                json!({ "type": "image_url", "image_url": { "url": "http://127.0.0.1:9/cat.png" } }),
            ),
            (StatusCode::UNPROCESSABLE_ENTITY, "invalid_request_error", None),
            "private or loopback",
        ),
    ];
    for (body, want, text) in cases {
        let (status, _, error) = post_json(&gw, "/v1/chat/completions", body).await;
        check_error(status, &error, want);
        assert_eq!(error["error"]["param"], "messages", "{error}");
        assert!(error["error"]["message"].as_str().unwrap().contains(text), "{error}");
    }
    assert!(!project.path().join(".lemon").exists(), "nothing was saved");
    let filter = lemon_core::store::RunFilter { status: None, limit: 10 };
    let runs = gw.state.runs.list(filter).await.unwrap();
    assert!(runs.is_empty(), "nothing ran: {runs:?}");
}
