//! Parsing entry points for the fuzz targets in `fuzz/`: the vendor CLIs'
//! JSONL translation and the LLM clients' event-stream reading, each the
//! code a run uses, reachable without a process or a socket.
//!
//! Not a stable interface: nothing but the fuzz targets calls it.

use futures::StreamExt as _;
use lemon_core::engine::{EngineEvent, ResumeToken};
use lemon_core::secrets::SecretValue;

use crate::cli::process::Exit;
use crate::cli::runner::parser;
use crate::cli::translate::{ParseContext, Translator};
use crate::cli::Vendor;
use crate::llm::http::drive;
use crate::llm::{anthropic, openai_chat, openai_responses, LlmError, LlmEvent, LlmStream};

/// How a CLI run ends after its lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CliEnd {
    /// The process exited with this status.
    Exit(i32),
    /// The process was killed by this signal.
    Signal(i32),
    /// No output for the inactivity timeout.
    Timeout,
}

/// The events a `vendor` run whose stdout is `lines` produces, through the
/// runner's own translator: `resume` is the token the run was asked to
/// continue, `oversized` the positions of lines too long to read (in bytes),
/// `stderr` what the process wrote there, `end` how it ended.
pub fn cli_run(
    vendor: Vendor,
    resume: Option<&str>,
    lines: &[&str],
    oversized: &[(usize, usize)],
    stderr: &str,
    end: CliEnd,
) -> Vec<EngineEvent> {
    let ctx = ParseContext {
        cwd: Some("/home/ana/project".into()),
        home: Some("/home/ana".to_owned()),
        model: Some("model-1".to_owned()),
        provider: (vendor == Vendor::Pi).then(|| "provider-1".to_owned()),
    };
    let new_session =
        (vendor == Vendor::Pi && resume.is_none()).then(|| "/tmp/pi-session.jsonl".to_owned());
    let parser = parser(vendor, ctx, new_session, resume.is_some());
    let requested = resume.map(|value| ResumeToken::new(vendor.id(), value));
    let mut translator = Translator::new(vendor, parser, requested);
    let mut events = Vec::new();
    for (at, line) in lines.iter().enumerate() {
        for &(_, bytes) in oversized.iter().filter(|(before, _)| *before == at) {
            events.extend(translator.oversized(bytes, 1024));
        }
        events.extend(translator.line(line));
        if at % 7 == 6 {
            translator.steered();
        }
    }
    events.extend(match end {
        CliEnd::Exit(code) => {
            translator.exited(Exit { code: Some(code), signal: None }, stderr, false)
        }
        CliEnd::Signal(signal) => {
            translator.exited(Exit { code: None, signal: Some(signal) }, stderr, true)
        }
        CliEnd::Timeout => translator.timed_out(),
    });
    events
}

/// The wire protocols of the LLM clients.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LlmProtocol {
    /// OpenAI's Chat Completions (and the compatible providers).
    OpenAiChat,
    /// OpenAI's Responses API.
    OpenAiResponses,
    /// Anthropic's Messages API.
    Anthropic,
}

/// The turn a streamed body of `chunks` (as they arrive) becomes, read the way
/// a client reads a provider's answer; `api_key` is the key redacted from
/// errors. Call inside a Tokio runtime with time enabled.
pub fn llm_turn(protocol: LlmProtocol, chunks: Vec<Vec<u8>>, api_key: &str) -> LlmStream {
    let body = futures::stream::iter(chunks.into_iter().map(|chunk| Ok(bytes::Bytes::from(chunk))))
        .boxed();
    let stall = std::time::Duration::from_secs(60);
    let key = SecretValue::new(api_key);
    match protocol {
        LlmProtocol::OpenAiChat => drive(body, openai_chat::ChatDecoder::default(), stall, key),
        LlmProtocol::OpenAiResponses => {
            drive(body, openai_responses::ResponsesDecoder::default(), stall, key)
        }
        LlmProtocol::Anthropic => drive(body, anthropic::MessagesDecoder::default(), stall, key),
    }
}

/// [`llm_turn`] read to its end.
pub async fn llm_turn_events(
    protocol: LlmProtocol,
    chunks: Vec<Vec<u8>>,
    api_key: &str,
) -> Vec<Result<LlmEvent, LlmError>> {
    llm_turn(protocol, chunks, api_key).collect().await
}
