//! Tests of the progress renderer and the final messages.

use std::sync::Arc;

use lemon_core::bus::{BusEvent, EventKind, RunPhase};
use lemon_core::engine::{Action, ActionKind, ActionPhase, Completion, ResumeToken, RunError};
use lemon_core::ids::RunId;
use proptest::prelude::*;

use super::{ProgressRenderer, RenderStyle, ResumeFormat};
use crate::telegram::format::tests::{annotate, entity_problem};
use crate::telegram::format::utf16_len;
use crate::telegram::types::{FormattedText, MAX_TEXT_UTF16};

fn resume_format() -> ResumeFormat {
    Arc::new(|token: &ResumeToken| format!("`{} --resume {}`", token.engine, token.value))
}

fn renderer() -> ProgressRenderer {
    ProgressRenderer::new(resume_format())
}

fn event(kind: EventKind) -> BusEvent {
    BusEvent {
        run_id: RunId::parse("run_1").unwrap(),
        session_key: "telegram:1".into(),
        index: 0,
        ts_ms: 0,
        kind,
    }
}

fn action(id: &str, title: &str, phase: ActionPhase, ok: Option<bool>) -> BusEvent {
    event(EventKind::EngineAction(Action {
        id: id.to_owned(),
        kind: ActionKind::Command,
        title: title.to_owned(),
        detail: serde_json::Value::Null,
        phase,
        ok,
        message: None,
        level: None,
        result_meta: serde_json::Value::Null,
    }))
}

fn started(engine: &str) -> BusEvent {
    event(EventKind::RunStarted { engine: engine.to_owned(), model: None })
}

fn engine_started(resume: &str) -> BusEvent {
    event(EventKind::EngineStarted {
        resume: Some(ResumeToken::new("claude", resume)),
        title: None,
        meta: serde_json::Value::Null,
    })
}

fn completed(completion: Completion) -> BusEvent {
    event(EventKind::RunCompleted { completion, engine: "claude".to_owned(), duration_ms: 5 })
}

fn check_progress(events: &[BusEvent], expected: &str) {
    let mut renderer = renderer();
    for event in events {
        renderer.apply(event);
    }
    let progress = renderer.progress();
    assert_eq!(entity_problem(&progress), None);
    assert_eq!(annotate(&progress), expected);
}

fn check_final(events: &[BusEvent], completion: &Completion, expected: &[&str]) {
    let mut renderer = renderer();
    for event in events {
        renderer.apply(event);
    }
    let messages = renderer.final_messages(completion);
    for message in &messages {
        assert_eq!(entity_problem(message), None);
        assert!(utf16_len(&message.text) <= MAX_TEXT_UTF16);
    }
    let shown: Vec<String> = messages.iter().map(annotate).collect();
    assert_eq!(shown, expected);
}

#[test]
fn a_new_run_is_running() {
    check_progress(&[], "Running…");
    check_progress(&[started("claude")], "Running… (claude)");
}

#[test]
fn actions_are_listed_in_first_seen_order_with_their_phase() {
    check_progress(
        &[
            started("codex"),
            action("a", "Read src/main.rs", ActionPhase::Started, None),
            action("b", "cargo test", ActionPhase::Started, None),
            action("a", "Read src/main.rs", ActionPhase::Completed, Some(true)),
            action("c", "rm -rf /", ActionPhase::Completed, Some(false)),
            action("b", "cargo test", ActionPhase::Updated, None),
        ],
        "Running… (codex)\n\n- Read src/main.rs: done\n- cargo test: running\n- rm -rf /: failed",
    );
}

#[test]
fn an_action_title_is_one_line_and_never_empty() {
    check_progress(
        &[action("a", "  echo one\n   echo two ", ActionPhase::Started, None)],
        "Running…\n\n- echo one echo two: running",
    );
    check_progress(
        &[action("a", " \n", ActionPhase::Started, None)],
        "Running…\n\n- command: running",
    );
}

#[test]
fn a_long_title_is_cut() {
    let mut renderer = renderer();
    renderer.apply(&action("a", &"x".repeat(500), ActionPhase::Started, None));
    let expected = format!("Running…\n\n- {}…: running", "x".repeat(80));
    assert_eq!(renderer.progress().text, expected);
}

#[test]
fn the_resume_command_is_shown_as_code_once_known() {
    check_progress(
        &[started("claude"), engine_started("abc-123")],
        "Running… (claude)\n\n<code>claude --resume abc-123</code>",
    );
    check_progress(
        &[started("claude"), action("a", "ls", ActionPhase::Started, None), engine_started("x")],
        "Running… (claude)\n\n- ls: running\n\n<code>claude --resume x</code>",
    );
}

#[test]
fn deltas_and_phases_do_not_change_the_progress() {
    let mut renderer = renderer();
    assert!(renderer.apply(&started("claude")));
    assert!(!renderer.apply(&event(EventKind::Delta { seq: 1, text: "Hel".to_owned() })));
    assert!(!renderer.apply(&event(EventKind::Delta { seq: 2, text: "lo".to_owned() })));
    assert!(!renderer.apply(&event(EventKind::Phase(RunPhase::Streaming))));
    assert_eq!(renderer.progress().text, "Running… (claude)");
}

#[test]
fn apply_reports_only_real_changes() {
    let mut renderer = renderer();
    assert!(renderer.apply(&action("a", "ls", ActionPhase::Started, None)));
    assert!(!renderer.apply(&action("a", "ls", ActionPhase::Updated, None)));
    assert!(!renderer.apply(&action("a", "ls", ActionPhase::Started, None)));
    assert!(renderer.apply(&action("a", "ls", ActionPhase::Completed, Some(true))));
    assert!(renderer.apply(&engine_started("r1")));
    assert!(!renderer.apply(&engine_started("r1")));
}

#[test]
fn the_state_line_follows_the_completion() {
    let ls = action("a", "ls", ActionPhase::Completed, Some(true));
    check_progress(
        &[ls.clone(), completed(Completion::success("hi", None))],
        "Done.\n\n- ls: done",
    );
    check_progress(&[completed(Completion::failure(RunError::UserRequested, None))], "Cancelled.");
    let failure = Completion::failure(
        RunError::Engine { message: "boom".to_owned() },
        Some(ResumeToken::new("claude", "r9")),
    );
    check_progress(
        &[ls, completed(failure)],
        "Error.\n\n- ls: done\n\n<code>claude --resume r9</code>",
    );
}

#[test]
fn many_actions_keep_the_newest_and_count_the_rest() {
    let mut events = Vec::new();
    for i in 0..25 {
        events.push(action(&format!("a{i}"), &format!("step {i}"), ActionPhase::Started, None));
    }
    let mut expected = "Running…\n\n(5 earlier steps not shown)".to_owned();
    for i in 5..25 {
        expected.push_str(&format!("\n- step {i}: running"));
    }
    check_progress(&events, &expected);
}

#[test]
fn progress_stays_well_under_the_limit_with_huge_titles() {
    let mut renderer = renderer();
    renderer.apply(&started(&"e".repeat(5000)));
    for i in 0..300 {
        renderer.apply(&action(&i.to_string(), &"🙂".repeat(2000), ActionPhase::Started, None));
    }
    renderer.apply(&engine_started(&"r".repeat(400)));
    let progress = renderer.progress();
    assert!(utf16_len(&progress.text) < 3500, "{} units", utf16_len(&progress.text));
    assert!(progress.text.contains("earlier steps not shown"));
    assert!(progress.text.ends_with(&format!("claude --resume {}", "r".repeat(400))));
}

#[test]
fn the_answer_is_converted_and_the_resume_command_follows_it() {
    check_final(
        &[engine_started("abc")],
        &Completion::success("Use `ls`:\n\n```sh\nls -la\n```", None),
        &["Use <code>ls</code>:\n\n<pre sh>ls -la</pre>\n\n<code>claude --resume abc</code>"],
    );
}

#[test]
fn the_completion_resume_token_wins() {
    check_final(
        &[engine_started("old")],
        &Completion::success("ok", Some(ResumeToken::new("claude", "new"))),
        &["ok\n\n<code>claude --resume new</code>"],
    );
}

#[test]
fn an_empty_answer_says_done() {
    check_final(&[], &Completion::success("  \n", None), &["Done."]);
    check_final(&[], &Completion::success("```\n```", None), &["Done."]);
}

#[test]
fn a_failed_run_says_error_with_the_message() {
    check_final(
        &[engine_started("r")],
        &Completion::failure(RunError::Engine { message: "quota exceeded".to_owned() }, None),
        &["Error: quota exceeded\n\n<code>claude --resume r</code>"],
    );
    check_final(&[], &Completion::failure(RunError::Timeout, None), &["Error: timeout"]);
}

#[test]
fn a_stopped_run_says_why() {
    let stopped = |error| Completion::failure(error, None);
    check_final(&[], &stopped(RunError::UserRequested), &["Cancelled."]);
    check_final(&[], &stopped(RunError::Interrupted), &["Interrupted."]);
    check_final(&[], &stopped(RunError::ShuttingDown), &["Stopped: the gateway shut down."]);
    check_final(
        &[],
        &stopped(RunError::QueueOverflow),
        &["Dropped: too many messages are waiting in this chat."],
    );
    check_final(
        &[],
        &stopped(RunError::Cancelled { reason: "stopped by the API".into() }),
        &["Cancelled: stopped by the API."],
    );
    let into = lemon_core::ids::RunId::parse("r2").unwrap();
    check_final(&[], &stopped(RunError::Merged { into }), &["Added to the next job."]);
}

#[test]
fn a_long_answer_is_split_and_the_resume_command_goes_last() {
    let paragraph = format!("{}\n\n", "word ".repeat(150).trim_end());
    let answer = paragraph.repeat(12);
    let mut renderer = renderer();
    renderer.apply(&engine_started("r"));
    let messages = renderer.final_messages(&Completion::success(answer.clone(), None));
    assert!(messages.len() >= 3, "{} messages", messages.len());
    for message in &messages {
        assert!(utf16_len(&message.text) <= MAX_TEXT_UTF16);
        assert_eq!(entity_problem(message), None);
    }
    let words: usize = messages.iter().map(|m| m.text.matches("word").count()).sum();
    assert_eq!(words, 150 * 12);
    let last = messages.last().unwrap();
    assert!(last.text.ends_with("\n\nclaude --resume r"), "{:?}", last.text);
    assert_eq!(last.entities.last().unwrap().kind, "code");
}

#[test]
fn the_resume_command_gets_its_own_message_when_the_last_one_is_full() {
    let answer = "x".repeat(MAX_TEXT_UTF16 - 5);
    let mut renderer = renderer();
    renderer.apply(&engine_started("r"));
    let messages = renderer.final_messages(&Completion::success(answer.clone(), None));
    let shown: Vec<String> = messages.iter().map(annotate).collect();
    assert_eq!(shown, [answer, "<code>claude --resume r</code>".to_owned()]);
}

#[test]
fn a_resume_format_without_backticks_is_used_as_is() {
    let mut renderer =
        ProgressRenderer::new(Arc::new(|token: &ResumeToken| format!("resume {}", token.value)));
    renderer.apply(&engine_started("q"));
    assert_eq!(annotate(&renderer.progress()), "Running…\n\n<code>resume q</code>");
}

#[test]
fn leading_whitespace_of_code_is_kept() {
    check_final(
        &[],
        &Completion::success("```\n  indented\n```\n\n", None),
        &["<pre>  indented</pre>"],
    );
}

fn answer() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        6 => "[a-zA-Z ]{1,40}",
        1 => Just("\n".to_owned()),
        1 => Just("\n\n".to_owned()),
        1 => Just("\n```rust\n".to_owned()),
        1 => Just("\n```\n".to_owned()),
        1 => Just("`code`".to_owned()),
        1 => Just("🙂".to_owned()),
        1 => Just("  ".to_owned()),
    ];
    let long = prop::collection::vec(piece, 0..600).prop_map(|pieces| pieces.concat());
    prop_oneof![long, any::<String>()]
}

fn visible(text: &str) -> String {
    text.chars().filter(|c| !c.is_whitespace() && *c != '`').collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn final_messages_fit_and_keep_the_answer(answer in answer(), resume in any::<bool>()) {
        let mut renderer = renderer();
        if resume {
            renderer.apply(&engine_started("tok"));
        }
        let messages = renderer.final_messages(&Completion::success(answer.clone(), None));
        prop_assert!(!messages.is_empty());
        for message in &messages {
            prop_assert!(utf16_len(&message.text) <= MAX_TEXT_UTF16);
            prop_assert!(!message.text.trim().is_empty());
            prop_assert_eq!(entity_problem(message), None);
        }
        let mut texts: Vec<&str> = messages.iter().map(|m| m.text.as_str()).collect();
        if resume {
            let last = texts.pop().unwrap();
            let kept = last.strip_suffix("claude --resume tok").unwrap();
            texts.push(kept);
        }
        // Without info strings every character but whitespace and backticks stays.
        if !answer.contains("```rust") && !answer.trim().is_empty() {
            let shown: String = texts.iter().map(|t| visible(t)).collect();
            let expected = visible(&answer);
            if !expected.is_empty() {
                prop_assert_eq!(shown, expected);
            }
        }
    }

    #[test]
    fn progress_always_fits(titles in prop::collection::vec(any::<String>(), 0..60)) {
        let mut renderer = renderer();
        renderer.apply(&engine_started("tok"));
        for (i, title) in titles.iter().enumerate() {
            renderer.apply(&action(&i.to_string(), title, ActionPhase::Started, None));
        }
        let progress: FormattedText = renderer.progress();
        prop_assert!(utf16_len(&progress.text) < 3500);
        prop_assert_eq!(entity_problem(&progress), None);
    }
}

#[test]
fn an_ending_read_back_from_the_store_finishes_the_progress_too() {
    let mut renderer = renderer();
    renderer.apply(&action("a1", "ls", ActionPhase::Started, None));
    let cut_off =
        Completion::failure(RunError::Interrupted, Some(ResumeToken::new("claude", "s9")));
    assert!(renderer.complete(&cut_off));
    assert_eq!(
        annotate(&renderer.progress()),
        "Cancelled.\n\n- ls: running\n\n<code>claude --resume s9</code>"
    );
    assert!(!renderer.complete(&cut_off), "the same ending twice changes nothing");
}

/// The final messages and the last progress text of a run that started
/// session `abc` and answered `answer`, rendered in `style`.
fn styled(style: RenderStyle, answer: &str) -> (Vec<FormattedText>, FormattedText) {
    let mut renderer = ProgressRenderer::with_style(resume_format(), style);
    renderer.apply(&started("claude"));
    renderer.apply(&engine_started("abc"));
    let completion = Completion::success(answer, None);
    renderer.apply(&completed(completion.clone()));
    (renderer.final_messages(&completion), renderer.progress())
}

#[test]
fn without_the_resume_line_the_answer_and_progress_end_with_the_answer() {
    let style = RenderStyle { resume_line: false, markdown: true };
    let (messages, progress) = styled(style, "Use `ls`.");
    let shown: Vec<String> = messages.iter().map(annotate).collect();
    assert_eq!(shown, ["Use <code>ls</code>."]);
    assert_eq!(annotate(&progress), "Done.");
    // The session is still known, for the bot to keep on record.
    let mut renderer = ProgressRenderer::with_style(resume_format(), style);
    renderer.apply(&engine_started("abc"));
    let done = Completion::success("x", None);
    assert_eq!(renderer.resume_token(&done), Some(&ResumeToken::new("claude", "abc")));
}

#[test]
fn without_markdown_the_answer_is_sent_as_written_with_no_entities() {
    let style = RenderStyle { resume_line: true, markdown: false };
    let (messages, progress) = styled(style, "Use `ls`:\n\n```sh\nls -la\n```\n");
    assert_eq!(messages.len(), 1);
    assert_eq!(messages[0].text, "Use `ls`:\n\n```sh\nls -la\n```\n\nclaude --resume abc");
    assert!(messages[0].entities.is_empty(), "{:?}", messages[0].entities);
    assert_eq!(progress.text, "Done.\n\nclaude --resume abc");
    assert!(progress.entities.is_empty());
    let neither = RenderStyle { resume_line: false, markdown: false };
    let (messages, _) = styled(neither, "  plain *text*  ");
    assert_eq!(messages, [FormattedText::plain("plain *text*")]);
}

#[test]
fn a_long_plain_answer_is_split_within_the_limit() {
    let style = RenderStyle { resume_line: true, markdown: false };
    let answer = "word ".repeat(2000);
    let (messages, _) = styled(style, &answer);
    assert!(messages.len() >= 2);
    for message in &messages {
        assert!(utf16_len(&message.text) <= MAX_TEXT_UTF16);
        assert!(message.entities.is_empty());
    }
    assert!(messages.last().unwrap().text.ends_with("claude --resume abc"));
}
