//! The vendor CLIs' JSONL output (Claude Code, Codex, OpenCode, Pi, Droid),
//! translated by the runner's own translator into engine events.
//!
//! Input: one byte choosing the vendor and how the run ends (`byte % 5`:
//! claude, codex, opencode, pi, droid; `byte / 5 % 4`: exit 0, exit 1,
//! killed, timed out; `byte / 20 % 2`: a resumed run), then stdout, one line
//! a line; the last line is the stderr.
//! Properties: the run starts exactly once, before anything else, and
//! completes exactly once, last; a completion is ok exactly when it has no
//! error; the resume tokens of the start and the completion are the vendor's.
#![no_main]

use lemon_core::engine::EngineEvent;
use lemon_engines::cli::{describe, Vendor};
use lemon_engines::fuzzing::{cli_run, CliEnd};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&choice, rest)) = data.split_first() else { return };
    let vendor = Vendor::ALL[usize::from(choice % 5)];
    let end = match choice / 5 % 4 {
        0 => CliEnd::Exit(0),
        1 => CliEnd::Exit(1),
        2 => CliEnd::Signal(9),
        _ => CliEnd::Timeout,
    };
    let resume = (choice / 20 % 2 == 1).then_some("resumed-session-1");
    let text = String::from_utf8_lossy(rest);
    let mut lines: Vec<&str> = text.split('\n').collect();
    let stderr = if lines.len() > 1 { lines.pop().unwrap_or_default() } else { "" };
    let oversized = [(lines.len() / 2, 5_000)];
    let events = cli_run(vendor, resume, &lines, &oversized, stderr, end);

    let shown: Vec<String> = events.iter().map(describe).collect();
    let starts = events.iter().filter(|e| matches!(e, EngineEvent::Started { .. })).count();
    let completions = events.iter().filter(|e| matches!(e, EngineEvent::Completed(_))).count();
    assert_eq!(starts, 1, "{shown:#?}");
    assert_eq!(completions, 1, "{shown:#?}");
    assert!(matches!(events.first(), Some(EngineEvent::Started { .. })), "{shown:#?}");
    assert!(matches!(events.last(), Some(EngineEvent::Completed(_))), "{shown:#?}");
    if let Some(EngineEvent::Started { resume: Some(token), .. }) = events.first() {
        assert_eq!(token.engine, vendor.id(), "{shown:#?}");
    }
    if resume.is_some() {
        assert!(matches!(events.first(), Some(EngineEvent::Started { resume: Some(_), .. })));
    }
    if let Some(EngineEvent::Completed(completion)) = events.last() {
        assert_eq!(completion.ok, completion.error.is_none(), "{shown:#?}");
        if let Some(token) = &completion.resume {
            assert_eq!(token.engine, vendor.id(), "{shown:#?}");
        }
    }
});
