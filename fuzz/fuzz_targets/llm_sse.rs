//! The LLM clients' streamed answers: the SSE parser, and each protocol's
//! reading of the events (OpenAI Chat Completions, OpenAI Responses,
//! Anthropic Messages), driven the way a client drives a response body.
//!
//! Input: one byte choosing the protocol (`% 3`), one byte seeding where the
//! body is cut into chunks, then the body.
//! Properties: the SSE events and the turn do not depend on how the body is
//! chunked; a turn's errors come last and alone, `Done` at most once and last;
//! no error carries the API key.
#![no_main]

use std::sync::OnceLock;

use lemon_engines::fuzzing::{llm_turn_events, LlmProtocol};
use lemon_engines::llm::sse::SseParser;
use lemon_engines::llm::{LlmError, LlmEvent};
use libfuzzer_sys::fuzz_target;

const KEY: &str = "sk-fuzz-0123456789abcdef";

fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread().enable_time().build().expect("a runtime")
    })
}

/// `body` cut into chunks of lengths drawn from `seed`.
fn chunks(body: &[u8], seed: u8) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut state = u32::from(seed) | 1;
    let mut rest = body;
    while !rest.is_empty() {
        state ^= state << 13;
        state ^= state >> 17;
        state ^= state << 5;
        let len = (state as usize % 7 + 1).min(rest.len());
        out.push(rest[..len].to_vec());
        rest = &rest[len..];
    }
    out
}

fn sse(pieces: &[Vec<u8>]) -> Result<Vec<lemon_engines::llm::sse::SseEvent>, String> {
    let mut parser = SseParser::default();
    let mut events = Vec::new();
    for piece in pieces {
        parser.feed(piece, &mut events).map_err(|e| e.to_string())?;
    }
    parser.finish(&mut events).map_err(|e| e.to_string())?;
    Ok(events)
}

fn message(error: &LlmError) -> String {
    format!("{error} {error:?}")
}

fuzz_target!(|data: &[u8]| {
    let [choice, seed, body @ ..] = data else { return };
    let protocol = match choice % 3 {
        0 => LlmProtocol::OpenAiChat,
        1 => LlmProtocol::OpenAiResponses,
        _ => LlmProtocol::Anthropic,
    };
    let whole = vec![body.to_vec()];
    let cut = chunks(body, *seed);
    assert_eq!(sse(&whole), sse(&cut), "SSE events depend on the chunking");

    let (one, many) = runtime().block_on(async {
        (llm_turn_events(protocol, whole, KEY).await, llm_turn_events(protocol, cut, KEY).await)
    });
    assert_eq!(one, many, "the turn depends on the chunking");
    let errors: Vec<usize> =
        one.iter().enumerate().filter(|(_, r)| r.is_err()).map(|(i, _)| i).collect();
    assert!(errors.len() <= 1, "{one:#?}");
    if let Some(&at) = errors.first() {
        assert_eq!(at, one.len() - 1, "events after an error: {one:#?}");
    }
    let done: Vec<usize> = one
        .iter()
        .enumerate()
        .filter(|(_, r)| matches!(r, Ok(LlmEvent::Done(_))))
        .map(|(i, _)| i)
        .collect();
    assert!(done.len() <= 1, "{one:#?}");
    if let Some(&at) = done.first() {
        assert_eq!(at, one.len() - 1, "events after Done: {one:#?}");
    }
    for result in &one {
        if let Err(error) = result {
            assert!(!message(error).contains(KEY), "the key in an error: {error:?}");
        }
    }
});
