//! Explicit resume lines of every engine the server registers, as the router
//! reads them out of a message: each vendor's own format picks that vendor's
//! engine and token, and the line is taken out of the prompt.

use std::sync::Arc;
use std::time::Duration;

use lemon_core::engine::{EngineRegistry, ResumeToken};
use lemon_core::router::resolve::{extract_resume_line, ExtractedResume, CONTINUE_PROMPT};
use lemon_engines::cli::{build_cli_engines, CliContext};
use lemon_engines::echo::EchoEngine;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// The engines the server registers: echo and every vendor CLI.
fn server_engines() -> EngineRegistry {
    let tracker = TaskTracker::new();
    let ctx = CliContext {
        base_env: Default::default(),
        search_path: Some("/nonexistent".to_owned()),
        tracker: tracker.clone(),
        shutdown: CancellationToken::new(),
        api_keys: Default::default(),
        recorder: None,
        ..CliContext::default()
    };
    let mut engines = EngineRegistry::new();
    engines.register(Arc::new(EchoEngine::new(Duration::ZERO, tracker))).unwrap();
    for engine in build_cli_engines(&Default::default(), &ctx) {
        engines.register(engine).unwrap();
    }
    engines
}

fn check(message: &str, engine: &str, token: &str, rest: &str) {
    let found = extract_resume_line(&server_engines(), message);
    let expected =
        ExtractedResume { token: ResumeToken::new(engine, token), prompt: rest.to_owned() };
    assert_eq!(found, Some(expected), "message {message:?}");
}

#[test]
fn every_engine_resume_format_is_recognised_and_stripped() {
    check("claude --resume abc-1\nfix the test", "claude", "abc-1", "fix the test");
    check("`codex resume 019a-ff`\nand the docs", "codex", "019a-ff", "and the docs");
    check("opencode --session ses_9Ab\ncontinue", "opencode", "ses_9Ab", "continue");
    check("opencode run -s ses_9Ab", "opencode", "ses_9Ab", CONTINUE_PROMPT);
    check("pi --session s1\nmore", "pi", "s1", "more");
    check("droid exec -s d-42\nship it", "droid", "d-42", "ship it");
    check("echo resume e1\nsay hi", "echo", "e1", "say hi");
    check("lemon resume n1\nhello", "lemon", "n1", "hello");
}

#[test]
fn resume_commands_inside_sentences_are_text() {
    let engines = server_engines();
    for message in ["please run claude --resume abc for me", "what does codex resume do?"] {
        assert_eq!(extract_resume_line(&engines, message), None, "{message}");
    }
}
