//! The OpenAI-compatible API end to end on the real binary: the echo engine
//! and the fake Claude Code and Codex CLIs behind `/v1/chat/completions`,
//! `/v1/responses` and `/v1/models`, read by a raw HTTP client that checks the
//! exact chunk shapes, and by the official `openai` Python client.

use std::path::{Path, PathBuf};

use futures::StreamExt;
use serde_json::{json, Value};

use crate::support::{Gateway, PATIENCE, TOKEN};

/// The `openai` package scripts/test installs, pinned.
const OPENAI_PY_VERSION: &str = "3.51.0";

/// The claude session of the tool-use fixture.
const CLAUDE_SESSION: &str = "5b1c7a52-8f0e-4d7b-9c1a-2f3e4d5c6b7a";

fn fixture(vendor: &str, name: &str) -> String {
    lemon_tests::fake_cli::fixture(vendor, name).display().to_string()
}

/// Echo, Claude Code replaying a run with two tool calls and its usage, and
/// Codex replaying a run that fails.
fn config(args_file: &Path, echo_delay_ms: u64) -> String {
    let cli = env!("CARGO_BIN_EXE_fake-cli");
    format!(
        "[gateway.engines.echo]\ndelay_ms = {echo_delay_ms}\n\
         [gateway.engines.claude]\ncli_path = \"{cli}\"\nenv = {{ FAKE_CLI_FIXTURE = \"{}\", FAKE_CLI_ARGS_FILE = \"{}\" }}\n\
         [gateway.engines.codex]\ncli_path = \"{cli}\"\nenv = {{ FAKE_CLI_FIXTURE = \"{}\" }}\n{}",
        fixture("claude", "synth_tool_use_success.jsonl"),
        args_file.display(),
        fixture("codex", "synth_reconnect_then_turn_failed.jsonl"),
        crate::support::ALLOW_EVERY_CALL,
    )
}

async fn start(echo_delay_ms: u64) -> (Gateway, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let gateway = Gateway::start(&config(&dir.path().join("claude-args"), echo_delay_ms)).await;
    (gateway, dir)
}

fn chat(gateway: &Gateway, body: &Value) -> reqwest::RequestBuilder {
    gateway.post("/v1/chat/completions").json(body).timeout(PATIENCE)
}

/// The SSE events of a response until its end: (event name, data).
async fn sse(response: reqwest::Response) -> Vec<(String, String)> {
    assert_eq!(response.status(), 200);
    let content_type = response.headers()["content-type"].to_str().unwrap().to_owned();
    assert!(content_type.starts_with("text/event-stream"), "{content_type}");
    let mut parser = lemon_tests::event_stream::EventStream::default();
    let mut out = Vec::new();
    let mut body = response.bytes_stream();
    tokio::time::timeout(PATIENCE, async {
        while let Some(chunk) = body.next().await {
            out.extend(parser.push(&chunk.unwrap()).into_iter().map(|e| (e.event, e.data)));
        }
    })
    .await
    .expect("the stream ends in time");
    out
}

/// The chunks of a streamed chat completion, checking it ends with `[DONE]`.
async fn chunks(response: reqwest::Response) -> Vec<Value> {
    let events = sse(response).await;
    let (last, chunks) = events.split_last().expect("events");
    assert_eq!(last.1, "[DONE]", "{events:?}");
    chunks.iter().map(|(_, data)| serde_json::from_str(data).unwrap()).collect()
}

/// A chunk without its `created` time, which is checked apart.
fn shape(chunk: &Value) -> Value {
    let mut chunk = chunk.clone();
    let created = chunk.as_object_mut().unwrap().remove("created").expect("created");
    assert!(created.as_u64().unwrap() > 1_700_000_000);
    chunk
}

fn content_of(chunks: &[Value]) -> String {
    chunks.iter().filter_map(|chunk| chunk["choices"][0]["delta"]["content"].as_str()).collect()
}

#[tokio::test]
async fn chat_completions_stream_and_answer_on_echo_with_the_exact_chunk_shapes() {
    let (gateway, _dir) = start(0).await;
    let body = json!({ "model": "echo", "messages": [{ "role": "user", "content": "red green" }], "stream": true });
    let response = chat(&gateway, &body).send().await.unwrap();
    let run_id = response.headers()["x-lemon-run-id"].to_str().unwrap().to_owned();
    let id = format!("chatcmpl-{run_id}");
    let chunks = chunks(response).await;
    let chunk = |delta: Value, finish: Value| {
        json!({
            "id": id,
            "object": "chat.completion.chunk",
            "model": "echo",
            "system_fingerprint": null,
            "choices": [{ "index": 0, "delta": delta, "logprobs": null, "finish_reason": finish }],
        })
    };
    let shapes: Vec<Value> = chunks.iter().map(shape).collect();
    assert_eq!(
        shapes,
        vec![
            chunk(json!({ "role": "assistant", "content": "" }), Value::Null),
            chunk(json!({ "content": "red " }), Value::Null),
            chunk(json!({ "content": "green" }), Value::Null),
            chunk(json!({}), json!("stop")),
        ]
    );
    // The run is recorded as every run is.
    let record = gateway.run(&run_id).await;
    assert_eq!(record["status"], "completed", "{record}");
    assert_eq!(record["answer"], "red green");
    assert_eq!(record["session_key"], format!("openai:{run_id}"));

    let body = json!({ "model": "echo", "messages": [{ "role": "user", "content": "red green" }] });
    let response = chat(&gateway, &body).send().await.unwrap();
    assert_eq!(response.status(), 200);
    let run_id = response.headers()["x-lemon-run-id"].to_str().unwrap().to_owned();
    let completion: Value = response.json().await.unwrap();
    assert_eq!(
        shape(&completion),
        json!({
            "id": format!("chatcmpl-{run_id}"),
            "object": "chat.completion",
            "model": "echo",
            "system_fingerprint": null,
            "choices": [{
                "index": 0,
                "message": { "role": "assistant", "content": "red green", "refusal": null },
                "logprobs": null,
                "finish_reason": "stop",
            }],
            "usage": null,
        })
    );
}

#[tokio::test]
async fn a_cli_engine_streams_its_tool_calls_as_lines_and_reports_usage_and_keeps_the_session() {
    let (gateway, dir) = start(0).await;
    let args_file = dir.path().join("claude-args");
    let messages = json!([
        { "role": "system", "content": "You count tests." },
        { "role": "user", "content": "how many tests?" },
    ]);
    let body = json!({
        "model": "claude:opus",
        "messages": messages,
        "stream": true,
        "stream_options": { "include_usage": true },
    });
    let response = chat(&gateway, &body).header("x-lemon-session", "ide-42").send().await.unwrap();
    assert_eq!(response.headers()["x-lemon-session"], "ide-42");
    let chunks = chunks(response).await;
    assert_eq!(chunks[0]["choices"][0]["delta"], json!({ "role": "assistant", "content": "" }));
    let content = content_of(&chunks);
    let lines: Vec<&str> = content.lines().collect();
    assert!(
        lines.iter().any(|line| line.starts_with("▸ ") && line.contains("ls test")),
        "{content}"
    );
    assert!(
        lines.iter().any(|line| line.starts_with("▸ ") && line.contains("a_test.exs")),
        "{content}"
    );
    assert!(content.ends_with("There are 2 test files."), "{content}");
    // The finish chunk, then the usage chunk: input counts the cached tokens.
    let (usage, rest) = chunks.split_last().unwrap();
    assert_eq!(rest.last().unwrap()["choices"][0]["finish_reason"], "stop");
    assert_eq!(rest.last().unwrap()["usage"], Value::Null);
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(
        usage["usage"],
        json!({
            "prompt_tokens": 92 + 1024 + 2048,
            "completion_tokens": 69,
            "total_tokens": 92 + 1024 + 2048 + 69,
            "prompt_tokens_details": { "cached_tokens": 2048 },
        })
    );
    // The model reached the CLI, and the first turn carried the system message.
    let first = std::fs::read_to_string(&args_file).unwrap();
    assert!(first.lines().next().unwrap().contains("--model=opus"), "{first}");
    assert!(first.contains("system: You count tests."), "{first}");
    assert!(!first.contains("--resume"), "{first}");

    // The next turn of the session: the engine holds the conversation, so only
    // the newest message is sent, and the session is resumed.
    let mut messages = messages.as_array().unwrap().clone();
    messages.push(json!({ "role": "assistant", "content": "There are 2 test files." }));
    messages.push(json!({ "role": "user", "content": "and now?" }));
    let body = json!({ "model": "claude", "messages": messages, "user": "ide-42" });
    let response = chat(&gateway, &body).send().await.unwrap();
    assert_eq!(response.status(), 200);
    let completion: Value = response.json().await.unwrap();
    assert_eq!(completion["choices"][0]["message"]["content"], "There are 2 test files.");
    assert_eq!(completion["model"], "claude");
    assert_eq!(completion["usage"]["completion_tokens"], 69);
    let second = std::fs::read_to_string(&args_file).unwrap();
    assert!(
        second.lines().next().unwrap().contains(&format!("--resume={CLAUDE_SESSION}")),
        "{second}"
    );
    assert!(second.contains("and now?"), "{second}");
    assert!(!second.contains("You count tests."), "{second}");
}

#[tokio::test]
async fn a_failed_run_is_an_openai_error_and_is_not_retried_by_the_client() {
    let (gateway, _dir) = start(0).await;
    let body = json!({ "model": "codex", "messages": [{ "role": "user", "content": "fix it" }] });
    let response = chat(&gateway, &body).send().await.unwrap();
    assert_eq!(response.status(), 502);
    assert_eq!(response.headers()["x-should-retry"], "false");
    let error: Value = response.json().await.unwrap();
    assert_eq!(error["error"]["type"], "server_error", "{error}");
    assert_eq!(error["error"]["code"], "engine_error", "{error}");
    assert!(!error["error"]["message"].as_str().unwrap().is_empty());

    // In a stream the error is the last event, in OpenAI's shape, without `[DONE]`.
    let body = json!({ "model": "codex", "messages": [{ "role": "user", "content": "fix it" }], "stream": true });
    let events = sse(chat(&gateway, &body).send().await.unwrap()).await;
    let last: Value = serde_json::from_str(&events.last().unwrap().1).unwrap();
    assert_eq!(last["error"]["code"], "engine_error", "{events:?}");
    assert!(events.iter().all(|(_, data)| data != "[DONE]"));

    // A response fails as the Responses API does: `response.failed` with the error.
    let body = json!({ "model": "codex", "input": "fix it", "stream": true });
    let response =
        gateway.post("/v1/responses").json(&body).timeout(PATIENCE).send().await.unwrap();
    let events = sse(response).await;
    let (name, data) = events.last().unwrap();
    assert_eq!(name, "response.failed", "{events:?}");
    let failed: Value = serde_json::from_str(data).unwrap();
    assert_eq!(failed["response"]["status"], "failed", "{failed}");
    assert_eq!(failed["response"]["error"]["code"], "engine_error", "{failed}");
    let body = json!({ "model": "codex", "input": "fix it" });
    let response =
        gateway.post("/v1/responses").json(&body).timeout(PATIENCE).send().await.unwrap();
    assert_eq!(response.status(), 502);

    let body = json!({ "model": "gemini", "messages": [{ "role": "user", "content": "hi" }] });
    let response = chat(&gateway, &body).send().await.unwrap();
    assert_eq!(response.status(), 400);
    let error: Value = response.json().await.unwrap();
    assert_eq!(error["error"]["code"], "model_not_found", "{error}");
    // It names the models there are, as `GET /v1/models` lists them: not the
    // engines whose CLI is missing.
    let message = error["error"]["message"].as_str().unwrap();
    assert!(message.contains("claude") && message.contains("echo"), "{message}");
    assert!(!message.contains("opencode"), "{message}");
}

#[tokio::test]
async fn responses_stream_the_event_sequence_on_the_real_binary() {
    let (gateway, _dir) = start(0).await;
    let body = json!({ "model": "echo", "input": "blue sky", "stream": true });
    let response =
        gateway.post("/v1/responses").json(&body).timeout(PATIENCE).send().await.unwrap();
    let run_id = response.headers()["x-lemon-run-id"].to_str().unwrap().to_owned();
    let events = sse(response).await;
    let names: Vec<&str> = events.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(
        names,
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed",
        ]
    );
    let data: Vec<Value> =
        events.iter().map(|(_, data)| serde_json::from_str(data).unwrap()).collect();
    let item_id = format!("msg_{run_id}");
    assert_eq!(
        data[4],
        json!({
            "type": "response.output_text.delta",
            "sequence_number": 4,
            "item_id": item_id,
            "output_index": 0,
            "content_index": 0,
            "delta": "blue ",
            "logprobs": [],
        })
    );
    let completed = &data[9]["response"];
    assert_eq!(completed["id"], format!("resp_{run_id}"));
    assert_eq!(completed["status"], "completed");
    assert_eq!(completed["output"][0]["content"][0]["text"], "blue sky");
}

#[tokio::test]
async fn a_client_that_disconnects_mid_stream_does_not_lose_the_run() {
    let (gateway, _dir) = start(40).await;
    let prompt: String =
        (1..=20).map(|i| format!("w{i} ")).collect::<String>().trim_end().to_owned();
    let body = json!({ "model": "echo", "messages": [{ "role": "user", "content": prompt }], "stream": true });
    let response = chat(&gateway, &body).send().await.unwrap();
    let run_id = response.headers()["x-lemon-run-id"].to_str().unwrap().to_owned();
    let mut parser = lemon_tests::event_stream::EventStream::default();
    let mut body = response.bytes_stream();
    // Read until the first piece of content, then go away.
    tokio::time::timeout(PATIENCE, async {
        loop {
            let chunk = body.next().await.expect("more of the stream").unwrap();
            let events = parser.push(&chunk);
            if events.iter().any(|event| event.data.contains("\"content\":\"w1 \"")) {
                return;
            }
        }
    })
    .await
    .expect("the first content in time");
    drop(body);
    let record = gateway.wait(&run_id).await;
    assert_eq!(record["status"], "completed", "{record}");
    assert_eq!(record["answer"], prompt);
}

/// A Python with the pinned `openai` package: `LEMON_OPENAI_PYTHON`, else the
/// virtual environment scripts/test makes. `None` only when there is no Python.
fn openai_python() -> Option<PathBuf> {
    crate::support::cached_python_tool(
        "LEMON_OPENAI_PYTHON",
        &format!("openai-{OPENAI_PY_VERSION}/bin/python"),
        "the openai client",
    )
}

#[tokio::test]
async fn the_official_openai_python_client_talks_to_the_gateway() {
    let Some(python) = openai_python() else {
        let need = "python3, to run the official openai client (scripts/test installs it)";
        lemon_tests::host::lacks("LEMON_REQUIRE_PYTHON", need);
        return;
    };
    let (gateway, _dir) = start(0).await;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("it/openai_client.py");
    let output = tokio::process::Command::new(&python)
        .arg(&script)
        .env("LEMON_BASE_URL", format!("{}/v1", gateway.api))
        .env("LEMON_API_KEY", TOKEN)
        .env("OPENAI_PY_VERSION", OPENAI_PY_VERSION)
        .kill_on_drop(true)
        .output();
    let output =
        tokio::time::timeout(PATIENCE, output).await.expect("the client ends in time").unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "the client failed: {stderr}");
    let results: Value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|_| panic!("not JSON: {}", String::from_utf8_lossy(&output.stdout)));
    assert_eq!(results["version"], OPENAI_PY_VERSION);
    let models: Vec<&str> =
        results["models"].as_array().unwrap().iter().map(|m| m.as_str().unwrap()).collect();
    for model in ["echo", "claude", "codex"] {
        assert!(models.contains(&model), "{models:?}");
    }
    assert_eq!(
        results["chat"],
        json!({ "content": "hello from python", "finish_reason": "stop", "object": "chat.completion", "role": "assistant" })
    );
    assert_eq!(results["chat_stream"]["text"], "streamed from python");
    assert_eq!(results["chat_stream"]["roles"], json!(["assistant"]));
    assert_eq!(results["chat_stream"]["finish_reason"], "stop");
    assert_eq!(results["response"], json!({ "output_text": "a response", "status": "completed" }));
    assert_eq!(results["response_stream"]["text"], "a streamed response");
    assert_eq!(results["response_stream"]["completed_text"], "a streamed response");
    assert_eq!(results["response_stream"]["first"], "response.created");
    assert_eq!(results["response_stream"]["last"], "response.completed");
    assert_eq!(results["response_helper"], "the stream helper");
    assert_eq!(results["claude"]["content"], "There are 2 test files.");
    assert_eq!(results["claude"]["usage"]["completion_tokens"], 69);
    assert_eq!(results["claude"]["usage"]["prompt_tokens"], 92 + 1024 + 2048);
    assert!(results["claude_stream"].as_str().unwrap().contains("▸ "), "{results}");
    assert_eq!(
        results["unknown_model"],
        json!({ "status": 400, "code": "model_not_found", "type": "invalid_request_error" })
    );
    assert_eq!(results["bad_key"], json!({ "status": 401, "code": "invalid_api_key" }));
    assert_eq!(results["failed_stream"]["error"], "APIError");
    assert!(results["failed_stream"]["text"].is_string());
}

#[tokio::test]
async fn a_binding_sets_the_queue_mode_and_merged_followups_share_one_answer() {
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "{}[[gateway.bindings]]\ntransport = \"openai\"\nchat_id = \"team\"\nqueue_mode = \"followup\"\n",
        config(&dir.path().join("claude-args"), 40)
    );
    let gateway = Gateway::start(&config).await;
    let ask = |text: &str, stream: bool| {
        let body = json!({ "model": "echo", "messages": [{ "role": "user", "content": text }], "stream": stream });
        chat(&gateway, &body).header("x-lemon-session", "team").send()
    };
    // A long answer keeps the session busy while two more messages come.
    let long: String = (1..=30).map(|i| format!("a{i} ")).collect::<String>().trim_end().to_owned();
    let first = ask(&long, true).await.unwrap();
    let mut parser = lemon_tests::event_stream::EventStream::default();
    let mut body = first.bytes_stream();
    let mut streamed = Vec::new();
    tokio::time::timeout(PATIENCE, async {
        while !streamed.iter().any(|data: &String| data.contains("\"content\":\"a1 \"")) {
            let chunk = body.next().await.expect("more of the stream").unwrap();
            streamed.extend(parser.push(&chunk).into_iter().map(|event| event.data));
        }
    })
    .await
    .expect("the first answer starts in time");
    let (bee, sea) = tokio::join!(ask("bee", false), ask("sea", false));
    let (bee, sea): (Value, Value) =
        (bee.unwrap().json().await.unwrap(), sea.unwrap().json().await.unwrap());
    let answer = |completion: &Value| {
        completion["choices"][0]["message"]["content"].as_str().unwrap().to_owned()
    };
    // The two followups were merged into one turn, which answers both.
    assert_eq!(answer(&bee), answer(&sea));
    let merged = answer(&bee);
    assert!(merged == "bee\nsea" || merged == "sea\nbee", "{merged}");
    // The first answer was not disturbed.
    tokio::time::timeout(PATIENCE, async {
        while let Some(chunk) = body.next().await {
            streamed.extend(parser.push(&chunk.unwrap()).into_iter().map(|event| event.data));
        }
    })
    .await
    .expect("the first answer ends in time");
    assert_eq!(streamed.last().unwrap(), "[DONE]");
    let text: String = streamed
        .iter()
        .filter_map(|data| serde_json::from_str::<Value>(data).ok())
        .filter_map(|chunk| chunk["choices"][0]["delta"]["content"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(text, long);
}
