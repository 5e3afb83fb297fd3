//! The three LLM clients (`lemon_engines::llm`) against the fake provider
//! speaking each wire protocol over real loopback HTTP: streamed text, tool
//! calls assembled from split arguments, parallel calls, reasoning, usage,
//! retries of 429s, typed errors, stalls and the key kept out of errors.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use lemon_core::secrets::SecretValue;
use lemon_core::testing::within;
use lemon_core::tool::ToolSpec;
use lemon_engines::llm::{
    build_client, ChatMessage, ClientOptions, LlmClient, LlmError, LlmEvent, LlmRequest, LlmUsage,
    Provider, RetryPolicy, StopReason, ToolCall,
};
use lemon_tests::fake_llm::{FakeLlm, FakeToolCall, Protocol, Turn, FAKE_INPUT_TOKENS};
use serde_json::json;
use tokio::time::Instant;

/// Retries that wait next to nothing, so tests take the time of the
/// `Retry-After` they check and no more.
fn quick_retries(max_attempts: u32) -> RetryPolicy {
    RetryPolicy {
        max_attempts,
        initial_delay: Duration::from_millis(1),
        max_delay: Duration::from_millis(5),
        max_retry_after: Duration::from_secs(5),
        jitter: false,
    }
}

fn base_url(fake: &FakeLlm, provider: Provider) -> String {
    match provider {
        Provider::Anthropic => fake.root_url(),
        Provider::OpenAi | Provider::OpenAiResponses => fake.base_url(),
    }
}

fn options(fake: &FakeLlm, provider: Provider) -> ClientOptions {
    ClientOptions {
        base_url: Some(base_url(fake, provider)),
        api_key: SecretValue::new("sk-test-key"),
        stall_timeout: Duration::from_secs(20),
        connect_timeout: Duration::from_secs(5),
        retry: quick_retries(3),
    }
}

fn client(fake: &FakeLlm, provider: Provider) -> Arc<dyn LlmClient> {
    build_client(provider, options(fake, provider))
}

fn request(text: &str) -> LlmRequest {
    LlmRequest {
        model: "fake-model".to_owned(),
        system: Some("You are terse.".to_owned()),
        messages: vec![ChatMessage::user(text)],
        tools: [ToolSpec {
            name: "read".to_owned(),
            description: "Reads a file".to_owned(),
            parameters: json!({"type": "object", "properties": {"path": {"type": "string"}}}),
        }]
        .into(),
        max_tokens: Some(256),
        temperature: None,
    }
}

fn protocol(provider: Provider) -> Protocol {
    match provider {
        Provider::OpenAi => Protocol::ChatCompletions,
        Provider::OpenAiResponses => Protocol::Responses,
        Provider::Anthropic => Protocol::Messages,
    }
}

/// The events of one turn, and the error it ended in, if any.
async fn turn(
    client: &Arc<dyn LlmClient>,
    request: LlmRequest,
) -> Result<(Vec<LlmEvent>, Option<LlmError>), LlmError> {
    within("an LLM turn", async {
        let mut stream = client.stream(request).await?;
        let mut events = Vec::new();
        while let Some(item) = stream.next().await {
            match item {
                Ok(event) => events.push(event),
                Err(error) => return Ok((events, Some(error))),
            }
        }
        Ok((events, None))
    })
    .await
}

/// The events of a turn that must succeed.
async fn answer(client: &Arc<dyn LlmClient>, request: LlmRequest) -> Vec<LlmEvent> {
    match turn(client, request).await {
        Ok((events, None)) => events,
        other => panic!("the turn failed: {other:?}"),
    }
}

fn texts(events: &[LlmEvent]) -> Vec<&str> {
    events
        .iter()
        .filter_map(|e| match e {
            LlmEvent::TextDelta(t) => Some(t.as_str()),
            _ => None,
        })
        .collect()
}

fn usage(output_tokens: u64) -> LlmEvent {
    LlmEvent::Usage(LlmUsage { input_tokens: FAKE_INPUT_TOKENS, output_tokens })
}

#[tokio::test]
async fn text_streams_in_order_with_usage_and_the_request_on_the_wire() {
    for provider in Provider::ALL {
        let fake = FakeLlm::start().await;
        fake.push(Turn::text(&["Hel", "lo, w\u{f6}rld ", "\u{1f34b}"]));
        let events = answer(&client(&fake, provider), request("say hello")).await;
        assert_eq!(
            events,
            vec![
                LlmEvent::TextDelta("Hel".to_owned()),
                LlmEvent::TextDelta("lo, w\u{f6}rld ".to_owned()),
                LlmEvent::TextDelta("\u{1f34b}".to_owned()),
                usage(3),
                LlmEvent::Done(StopReason::EndTurn),
            ],
            "{provider}"
        );
        let requests = fake.requests();
        assert_eq!(requests.len(), 1, "{provider}");
        let sent = &requests[0];
        assert_eq!(sent.protocol, protocol(provider), "{provider}");
        assert_eq!(sent.body["model"], "fake-model", "{provider}");
        assert_eq!(sent.body["stream"], true, "{provider}");
        assert_eq!(sent.last_message_text(), "say hello", "{provider}");
        match provider {
            Provider::OpenAi => {
                assert_eq!(sent.path, "/v1/chat/completions");
                assert_eq!(sent.body["stream_options"]["include_usage"], true);
                assert_eq!(sent.body["messages"][0]["role"], "system");
                assert_eq!(sent.body["max_tokens"], 256);
                assert_eq!(sent.body["tools"][0]["function"]["name"], "read");
                assert_eq!(sent.header("authorization"), Some("Bearer sk-test-key"));
            }
            Provider::OpenAiResponses => {
                assert_eq!(sent.path, "/v1/responses");
                assert_eq!(sent.body["instructions"], "You are terse.");
                assert_eq!(sent.body["max_output_tokens"], 256);
                assert_eq!(sent.body["tools"][0]["name"], "read");
                assert_eq!(sent.header("authorization"), Some("Bearer sk-test-key"));
            }
            Provider::Anthropic => {
                assert_eq!(sent.path, "/v1/messages");
                assert_eq!(sent.body["system"], "You are terse.");
                assert_eq!(sent.body["max_tokens"], 256);
                assert_eq!(sent.body["tools"][0]["input_schema"]["type"], "object");
                assert_eq!(sent.header("x-api-key"), Some("sk-test-key"));
                assert_eq!(sent.header("anthropic-version"), Some("2023-06-01"));
                assert_eq!(sent.header("authorization"), None);
            }
        }
    }
}

#[tokio::test]
async fn tool_call_arguments_split_across_chunks_are_assembled() {
    for provider in Provider::ALL {
        let fake = FakeLlm::start().await;
        fake.push(Turn::tool_calls(vec![FakeToolCall::new(
            "call_1",
            "read",
            &["{\"pa", "th\": \"no", "tes/\u{e9}t\u{e9}.txt\"}"],
        )]));
        let events = answer(&client(&fake, provider), request("read the notes")).await;
        assert_eq!(
            events,
            vec![
                LlmEvent::ToolCall(ToolCall {
                    id: "call_1".to_owned(),
                    name: "read".to_owned(),
                    arguments: "{\"path\": \"notes/\u{e9}t\u{e9}.txt\"}".to_owned(),
                }),
                usage(4),
                LlmEvent::Done(StopReason::ToolUse),
            ],
            "{provider}"
        );
    }
}

#[tokio::test]
async fn parallel_tool_calls_come_in_order_after_the_text() {
    for provider in Provider::ALL {
        let fake = FakeLlm::start().await;
        fake.push(Turn::ToolCalls {
            text: vec!["Reading both.".to_owned()],
            calls: vec![
                FakeToolCall::new("call_a", "read", &["{\"path\":", "\"a.txt\"}"]),
                FakeToolCall::new("call_b", "read", &["{\"path\":\"b", ".txt\"}"]),
            ],
        });
        let events = answer(&client(&fake, provider), request("read a and b")).await;
        let call = |id: &str, path: &str| {
            LlmEvent::ToolCall(ToolCall {
                id: id.to_owned(),
                name: "read".to_owned(),
                arguments: format!("{{\"path\":\"{path}\"}}"),
            })
        };
        assert_eq!(
            events,
            vec![
                LlmEvent::TextDelta("Reading both.".to_owned()),
                call("call_a", "a.txt"),
                call("call_b", "b.txt"),
                usage(7),
                LlmEvent::Done(StopReason::ToolUse),
            ],
            "{provider}"
        );
    }
}

#[tokio::test]
async fn reasoning_streams_before_the_text() {
    for provider in Provider::ALL {
        let fake = FakeLlm::start().await;
        fake.push(Turn::reasoning(&["The user ", "greets."], &["Hi!"]));
        let events = answer(&client(&fake, provider), request("hello")).await;
        assert_eq!(
            events,
            vec![
                LlmEvent::ReasoningDelta("The user ".to_owned()),
                LlmEvent::ReasoningDelta("greets.".to_owned()),
                LlmEvent::TextDelta("Hi!".to_owned()),
                usage(3),
                LlmEvent::Done(StopReason::EndTurn),
            ],
            "{provider}"
        );
    }
}

#[tokio::test]
async fn a_429_is_retried_after_its_retry_after_then_succeeds() {
    for provider in Provider::ALL {
        let fake = FakeLlm::start().await;
        fake.push(Turn::RateLimited { retry_after_secs: 1 });
        fake.push(Turn::text(&["after the wait"]));
        let started = Instant::now();
        let events = answer(&client(&fake, provider), request("hi")).await;
        assert!(started.elapsed() >= Duration::from_secs(1), "{provider}: {:?}", started.elapsed());
        assert_eq!(texts(&events), ["after the wait"], "{provider}");
        assert_eq!(fake.requests().len(), 2, "{provider}");
    }
}

#[tokio::test]
async fn a_429_on_every_attempt_is_rate_limited() {
    for provider in Provider::ALL {
        let fake = FakeLlm::start().await;
        for _ in 0..3 {
            fake.push(Turn::RateLimited { retry_after_secs: 0 });
        }
        let error = turn(&client(&fake, provider), request("hi")).await.expect_err("limited");
        assert!(
            matches!(&error, LlmError::RateLimited { retry_after: Some(wait), .. } if wait.is_zero()),
            "{provider}: {error:?}"
        );
        assert_eq!(fake.requests().len(), 3, "{provider}");
    }
}

#[tokio::test]
async fn a_context_overflow_is_typed_and_not_retried() {
    for provider in Provider::ALL {
        let fake = FakeLlm::start().await;
        fake.push(Turn::ContextOverflow);
        let error = turn(&client(&fake, provider), request("huge")).await.expect_err("overflow");
        assert!(matches!(error, LlmError::ContextOverflow { .. }), "{provider}: {error:?}");
        assert_eq!(fake.requests().len(), 1, "{provider}");
    }
}

#[tokio::test]
async fn an_error_after_output_is_typed_and_not_retried() {
    for provider in Provider::ALL {
        let fake = FakeLlm::start().await;
        fake.push(Turn::error_after(&["Half an ", "answer"]));
        fake.push(Turn::text(&["a second answer"]));
        let (events, error) =
            turn(&client(&fake, provider), request("hi")).await.expect("streamed");
        assert_eq!(texts(&events), ["Half an ", "answer"], "{provider}");
        let expected_status = if provider == Provider::Anthropic { 529 } else { 500 };
        assert!(
            matches!(error, Some(LlmError::Server { status, .. }) if status == expected_status),
            "{provider}: {error:?}"
        );
        assert_eq!(fake.requests().len(), 1, "{provider}");
        assert_eq!(fake.queued(), 1, "{provider}");
    }
}

#[tokio::test]
async fn a_stalled_stream_ends_in_stalled() {
    for provider in Provider::ALL {
        let fake = FakeLlm::start().await;
        fake.push(Turn::stall(&["I was saying"]));
        let options =
            ClientOptions { stall_timeout: Duration::from_millis(300), ..options(&fake, provider) };
        let client = build_client(provider, options);
        let (events, error) = turn(&client, request("hi")).await.expect("streamed");
        assert_eq!(texts(&events), ["I was saying"], "{provider}");
        assert_eq!(error, Some(LlmError::Stalled), "{provider}");
        assert_eq!(fake.requests().len(), 1, "{provider}");
    }
}

#[tokio::test]
async fn a_stall_before_any_output_is_retried() {
    for provider in Provider::ALL {
        let fake = FakeLlm::start().await;
        fake.push(Turn::stall(&[]));
        fake.push(Turn::text(&["second try"]));
        let options =
            ClientOptions { stall_timeout: Duration::from_millis(300), ..options(&fake, provider) };
        let events = answer(&build_client(provider, options), request("hi")).await;
        assert_eq!(texts(&events), ["second try"], "{provider}");
        assert_eq!(fake.requests().len(), 2, "{provider}");
    }
}

#[tokio::test]
async fn a_wrong_key_is_auth_without_the_key_in_the_message() {
    for provider in Provider::ALL {
        let fake = FakeLlm::builder().api_key("sk-the-right-one").start().await;
        let wrong = ClientOptions {
            api_key: SecretValue::new("sk-wrong-key-0123456789"),
            ..options(&fake, provider)
        };
        let error = turn(&build_client(provider, wrong), request("hi")).await.expect_err("refused");
        let LlmError::Auth { message } = &error else {
            panic!("{provider}: not an auth error: {error:?}");
        };
        assert!(!message.contains("sk-wrong-key-0123456789"), "{provider}: {message}");
        assert!(!format!("{error:?} {error}").contains("sk-wrong"), "{provider}");
        assert!(message.contains("***"), "{provider}: the provider's message is kept: {message}");
        assert_eq!(fake.requests().len(), 1, "{provider}: auth errors are not retried");

        let right = ClientOptions {
            api_key: SecretValue::new("sk-the-right-one"),
            ..options(&fake, provider)
        };
        let events = answer(&build_client(provider, right), request("with the right key")).await;
        assert_eq!(texts(&events).concat(), "with the right key", "{provider}");
    }
}

#[tokio::test]
async fn a_tool_round_trip_sends_the_history_back() {
    for provider in Provider::ALL {
        let fake = FakeLlm::start().await;
        fake.rule(
            "weather",
            Turn::tool_calls(vec![FakeToolCall::new("call_w", "read", &["{\"path\":\"w.txt\"}"])]),
        );
        let client = client(&fake, provider);
        let mut request = request("what is the weather?");
        let events = answer(&client, request.clone()).await;
        let Some(LlmEvent::ToolCall(call)) = events.first().cloned() else {
            panic!("{provider}: no tool call first: {events:?}");
        };
        request
            .messages
            .push(ChatMessage::Assistant { text: String::new(), tool_calls: vec![call] });
        request.messages.push(ChatMessage::ToolResult {
            call_id: "call_w".to_owned(),
            name: "read".to_owned(),
            content: "sunny and warm".to_owned(),
            is_error: false,
        });
        // Nothing scripted matches the tool result: the fake echoes it.
        let events = answer(&client, request).await;
        assert_eq!(texts(&events).concat(), "sunny and warm", "{provider}");
        let sent = &fake.wait_for_requests(2).await[1];
        let body = &sent.body;
        match provider {
            Provider::OpenAi => {
                assert_eq!(body["messages"][2]["tool_calls"][0]["id"], "call_w");
                assert_eq!(body["messages"][3]["role"], "tool");
                assert_eq!(body["messages"][3]["tool_call_id"], "call_w");
            }
            Provider::OpenAiResponses => {
                assert_eq!(body["input"][1]["type"], "function_call");
                assert_eq!(body["input"][1]["call_id"], "call_w");
                assert_eq!(body["input"][2]["type"], "function_call_output");
                assert_eq!(body["input"][2]["output"], "sunny and warm");
            }
            Provider::Anthropic => {
                assert_eq!(body["messages"][1]["content"][0]["type"], "tool_use");
                assert_eq!(body["messages"][1]["content"][0]["input"]["path"], "w.txt");
                assert_eq!(body["messages"][2]["content"][0]["type"], "tool_result");
                assert_eq!(body["messages"][2]["content"][0]["tool_use_id"], "call_w");
            }
        }
    }
}

#[tokio::test]
async fn anthropic_takes_a_base_url_with_or_without_v1() {
    let fake = FakeLlm::start().await;
    for base in [fake.root_url(), fake.base_url(), format!("{}/", fake.base_url())] {
        let options =
            ClientOptions { base_url: Some(base.clone()), ..options(&fake, Provider::Anthropic) };
        let events = answer(&build_client(Provider::Anthropic, options), request("ping")).await;
        assert_eq!(texts(&events), ["ping"], "{base}");
    }
    let paths: Vec<String> = fake.requests().into_iter().map(|r| r.path).collect();
    assert_eq!(paths, ["/v1/messages"; 3]);
}

#[tokio::test]
async fn nothing_listening_is_a_network_error() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    let addr = listener.local_addr().expect("its address");
    drop(listener);
    for provider in Provider::ALL {
        let options = ClientOptions {
            base_url: Some(format!("http://{addr}/v1")),
            api_key: SecretValue::new("sk-test-key"),
            retry: quick_retries(2),
            ..ClientOptions::default()
        };
        let error =
            turn(&build_client(provider, options), request("hi")).await.expect_err("no server");
        assert!(matches!(error, LlmError::Network { .. }), "{provider}: {error:?}");
        assert!(!error.to_string().contains("sk-test-key"), "{provider}");
    }
}
