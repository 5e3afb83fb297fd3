//! Tests of the rules every parser shares: event order, warnings, exits and timeouts.

use super::*;

/// A parser that maps a few words to emitter calls, to test the shared rules.
#[derive(Debug, Default)]
struct Script;

impl StreamParser for Script {
    fn line(&mut self, line: &str, out: &mut Emitter) -> Result<(), DecodeError> {
        match line.split_once(' ').unwrap_or((line, "")) {
            ("start", session) => out.started(Some(session), "Script", Value::Null),
            ("tool", id) => {
                out.start_action(id, ActionKind::Tool, format!("tool {id}"), json!({"a": 1}))
            }
            ("done", id) => {
                out.complete_action(
                    id,
                    true,
                    json!({"b": 2}),
                    (ActionKind::Tool, "tool result".to_owned()),
                );
            }
            ("text", text) => out.paragraph(text),
            ("note", text) => out.note(text, false),
            ("finish", answer) => out.complete_ok(answer.to_owned(), Value::Null),
            _ => return Err(DecodeError(format!("unknown line {line}"))),
        }
        Ok(())
    }

    fn partial_answer(&self) -> String {
        "partial".to_owned()
    }

    fn clean_end(&self, out: &Emitter) -> Result<String, String> {
        match out.found() {
            Some(_) => Err("script ended early".to_owned()),
            None => Err("script never started".to_owned()),
        }
    }
}

fn translator(resume: Option<&str>) -> Translator {
    Translator::new(
        Vendor::Claude,
        Box::new(Script),
        resume.map(|value| ResumeToken::new("claude", value)),
    )
}

fn feed(t: &mut Translator, lines: &[&str]) -> Vec<String> {
    lines.iter().flat_map(|line| t.line(line)).map(|event| describe(&event)).collect()
}

#[test]
fn started_comes_first_exactly_once() {
    let mut t = translator(None);
    assert_eq!(
        feed(&mut t, &["tool t1", "start s-1", "start s-2", "done t1"]),
        ["S(-)", r#"A(started t1 tool "tool t1" -)"#, r#"A(completed t1 tool "tool t1" true)"#,]
    );
    // A later start still names the session the run completes with.
    assert_eq!(feed(&mut t, &["finish ok"]), [r#"C(ok=true, answer "ok", resume claude:s-2)"#]);
}

#[test]
fn a_resumed_run_starts_with_the_requested_token_until_the_stream_names_one() {
    let mut t = translator(Some("old"));
    assert_eq!(feed(&mut t, &["text hi"]), ["S(claude:old)", r#"D("hi")"#]);
    let exited = t.exited(Exit { code: Some(0), signal: None }, "", false);
    assert_eq!(
        exited.iter().map(describe).collect::<Vec<_>>(),
        [r#"C(ok=false, answer "partial", error "script never started", resume claude:old)"#]
    );
}

#[test]
fn nothing_follows_the_completion() {
    let mut t = translator(None);
    feed(&mut t, &["start s", "finish a"]);
    assert!(t.is_done());
    assert!(feed(&mut t, &["tool t2", "garbage"]).is_empty());
    assert!(t.oversized(100, 10).is_empty());
    assert!(t.exited(Exit { code: Some(1), signal: None }, "boom", false).is_empty());
    assert!(t.timed_out().is_empty());
}

#[test]
fn completion_merges_the_pending_detail_and_unknown_ids_use_the_fallback() {
    let mut t = translator(None);
    t.line("start s");
    t.line("tool t1");
    let done = t.line("done t1");
    let EngineEvent::Action(action) = &done[0] else { panic!("an action") };
    assert_eq!(action.detail, json!({"a": 1, "b": 2}));
    assert_eq!(feed(&mut t, &["done nope"]), [r#"A(completed nope tool "tool result" true)"#]);
}

#[test]
fn at_most_three_bad_lines_become_warnings() {
    let mut t = translator(None);
    let events =
        feed(&mut t, &["start s", "bad 1", "bad 2", "bad 3", "bad 4", "bad 5", "   ", "\r"]);
    assert_eq!(
        events,
        [
            "S(claude:s)",
            r#"A(completed decode_error_0 warning "Invalid JSONL line" false level=warning)"#,
            r#"A(completed decode_error_1 warning "Invalid JSONL line" false level=warning)"#,
            r#"A(completed decode_error_2 warning "Invalid JSONL line" false level=warning)"#,
        ]
    );
    let warnings: Vec<String> =
        (0..5).flat_map(|_| t.oversized(1 << 20, 1024)).map(|e| describe(&e)).collect();
    assert_eq!(warnings.len(), 3);
    assert_eq!(
        warnings[0],
        r#"A(completed oversized_line_0 warning "Oversized JSONL line skipped" false level=warning)"#
    );
}

#[test]
fn paragraphs_are_separated_and_notes_are_numbered() {
    let mut t = translator(None);
    assert_eq!(
        feed(&mut t, &["start s", "text one", "text  ", "text two", "note careful", "note again"]),
        [
            "S(claude:s)",
            r#"D("one")"#,
            r#"D("\n\ntwo")"#,
            r#"A(completed note_0 warning "careful" false level=warning)"#,
            r#"A(completed note_1 warning "again" false level=warning)"#,
        ]
    );
}

#[test]
fn exits_and_timeouts_complete_the_run_once() {
    let check = |exit: Exit, stderr: &str, expected: &[&str]| {
        let mut t = translator(None);
        t.line("start s");
        let events: Vec<String> = t.exited(exit, stderr, false).iter().map(describe).collect();
        assert_eq!(events, expected);
    };
    check(
        Exit { code: Some(2), signal: None },
        "  something broke\n",
        &[
            r#"C(ok=false, answer "partial", error "claude exited with status 2: something broke", resume claude:s)"#,
        ],
    );
    check(
        Exit { code: None, signal: Some(9) },
        "",
        &[
            r#"C(ok=false, answer "partial", error "claude was killed by signal 9", resume claude:s)"#,
        ],
    );
    check(
        Exit { code: Some(0), signal: None },
        "a warning",
        &[
            r#"A(completed cli.stderr warning "CLI stderr output" false level=warning)"#,
            r#"C(ok=false, answer "partial", error "script ended early", resume claude:s)"#,
        ],
    );
    let mut t = translator(None);
    t.line("start s");
    let events: Vec<String> = t.timed_out().iter().map(describe).collect();
    assert_eq!(events, [r#"C(ok=false, answer "partial", error "timeout", resume claude:s)"#]);
}

#[test]
fn long_stderr_is_cut_to_its_tail() {
    let stderr = format!("{}END", "é".repeat(5000));
    let message = exit_message("codex", Exit { code: Some(1), signal: None }, &stderr);
    assert!(message.starts_with("codex exited with status 1: é"));
    assert!(message.ends_with("END"));
    assert_eq!(
        message.chars().count(),
        "codex exited with status 1: ".len() + STDERR_IN_ERROR_CHARS
    );
    assert_eq!(tail_chars("abc", 5), "abc");
    assert_eq!(tail_chars("abcdef", 2), "ef");
    assert_eq!(head_chars("abcdef", 2), "ab");
}

/// The completion a vendor's parser makes of `lines`.
fn vendor_completion(vendor: Vendor, lines: &[&str]) -> Completion {
    let ctx = ParseContext::default();
    let parser: Box<dyn StreamParser> = match vendor {
        Vendor::Claude => Box::new(super::super::claude::Parser::new(ctx)),
        Vendor::Codex => Box::new(super::super::codex::Parser::new(ctx)),
        Vendor::Opencode => Box::new(super::super::opencode::Parser::new(ctx)),
        Vendor::Pi => Box::new(super::super::pi::Parser::new(ctx, None, false)),
        Vendor::Droid => Box::new(super::super::droid::Parser::new(ctx)),
    };
    let mut t = Translator::new(vendor, parser, None);
    let mut events: Vec<EngineEvent> = lines.iter().flat_map(|line| t.line(line)).collect();
    events.extend(t.exited(Exit { code: Some(1), signal: None }, "", false));
    events
        .into_iter()
        .find_map(|event| match event {
            EngineEvent::Completed(completion) => Some(completion),
            _ => None,
        })
        .expect("every run completes")
}

#[test]
fn each_vendor_classifies_its_own_context_overflow() {
    let overflow = |message: &str| Some(RunError::ContextOverflow { message: message.to_owned() });
    let engine = |message: &str| Some(RunError::Engine { message: message.to_owned() });
    let codex = |message: &str| {
        let line = json!({"type": "turn.failed", "error": {"message": message}}).to_string();
        vendor_completion(Vendor::Codex, &[r#"{"type":"thread.started","thread_id":"t1"}"#, &line])
            .error
    };
    let text = "Codex error: context_length_exceeded";
    assert_eq!(codex(text), overflow(text));
    assert_eq!(codex("Something went wrong"), engine("Something went wrong"));

    let claude = |message: &str| {
        let line = json!({"type": "result", "subtype": "error", "is_error": true, "result": message, "session_id": "s1"}).to_string();
        vendor_completion(Vendor::Claude, &[&line]).error
    };
    assert_eq!(claude("HTTP 413 Payload Too Large"), overflow("HTTP 413 Payload Too Large"));
    assert_eq!(claude("Something went wrong"), engine("Something went wrong"));

    let opencode = |message: &str| {
        let line = json!({"type": "error", "sessionID": "ses_1", "error": {"name": "APIError", "data": {"message": message}}}).to_string();
        vendor_completion(Vendor::Opencode, &[&line]).error
    };
    let text = "模型输入过长：上下文长度超过限制";
    assert_eq!(opencode(text), overflow(text));
    assert_eq!(opencode("Rate limit exceeded"), engine("Rate limit exceeded"));

    let pi = |message: &str| {
        let reply = json!({"role": "assistant", "content": [], "stopReason": "error", "errorMessage": message});
        let line = json!({"type": "agent_end", "messages": [reply]}).to_string();
        vendor_completion(Vendor::Pi, &[&line]).error
    };
    let text = "400 Invalid 'input[12].content': string too long";
    assert_eq!(pi(text), overflow(text));
    assert_eq!(pi("overloaded_error: Overloaded"), engine("overloaded_error: Overloaded"));

    // Droid reports failures only by its exit and stderr.
    let mut t = Translator::new(
        Vendor::Droid,
        Box::new(super::super::droid::Parser::new(ParseContext::default())),
        None,
    );
    let exit = Exit { code: Some(1), signal: None };
    let events = t.exited(exit, "request entity too large", false);
    let text = "droid exited with status 1: request entity too large";
    assert!(
        matches!(&events[..], [_, EngineEvent::Completed(c)] if c.error == overflow(text)),
        "{events:?}"
    );
    assert_eq!(vendor_completion(Vendor::Droid, &[]).error, engine("droid exited with status 1"));
}

#[test]
fn a_cli_without_credentials_fails_with_the_fix() {
    for message in [
        "Not logged in · Please run /login",
        "Invalid API key · Fix external API key",
        "codex exited with status 1: stream error: unexpected status 401 Unauthorized",
    ] {
        let RunError::Engine { message: text } =
            classify_failure_for(Vendor::Claude, message.to_owned())
        else {
            panic!("{message} is an engine error")
        };
        assert!(text.starts_with(message), "the vendor's words first: {text}");
        assert!(text.contains("api_key_secret = \"anthropic_api_key\""), "{text}");
        assert!(text.contains("secrets.toml") && text.contains("ANTHROPIC_API_KEY"), "{text}");
        assert!(text.contains("env_passthrough = [\"ANTHROPIC_*\"]"), "{text}");
    }
    let RunError::Engine { message } = classify_failure_for(Vendor::Codex, "Not logged in".into())
    else {
        panic!("engine error")
    };
    assert!(message.contains("openai_api_key") && message.contains("OPENAI_*"), "{message}");
    assert_eq!(
        classify_failure_for(Vendor::Claude, "tool crashed".into()),
        RunError::Engine { message: "tool crashed".into() }
    );
}

fn failed(kind: ActionKind, detail: Value) -> Action {
    action("a1", kind, "step".to_owned(), detail, ActionPhase::Completed, Some(false))
}

#[test]
fn a_failed_command_keeps_its_exit_code_and_timeout_as_result_meta() {
    let command = failed(
        ActionKind::Command,
        json!({"exit_code": 124, "status": "failed", "output": "secret text", "input": {"timeout": 5000, "command": "sleep 9"}}),
    );
    assert_eq!(
        result_meta(&command),
        json!({"error_type": "nonzero_exit", "exit_code": 124, "timeout_ms": 5000})
    );
    let declined = failed(ActionKind::Command, json!({"exit_code": null, "status": "declined"}));
    assert_eq!(result_meta(&declined), json!({"error_type": "declined"}));
    let tool = failed(ActionKind::Tool, json!({"is_error": true, "result": "/etc/passwd: denied"}));
    assert_eq!(result_meta(&tool), json!({"error_type": "tool_error"}));
}

#[test]
fn steps_that_did_not_fail_warnings_and_notes_have_no_result_meta() {
    let mut ok = failed(ActionKind::Command, json!({"exit_code": 0}));
    ok.ok = Some(true);
    assert_eq!(result_meta(&ok), Value::Null);
    let mut started = failed(ActionKind::Command, json!({"exit_code": 1}));
    started.phase = ActionPhase::Started;
    assert_eq!(result_meta(&started), Value::Null);
    assert_eq!(result_meta(&failed(ActionKind::Warning, json!({"exit_code": 1}))), Value::Null);
    assert_eq!(result_meta(&failed(ActionKind::Note, Value::Null)), Value::Null);
}

#[test]
fn the_emitter_fills_result_meta_of_failed_completions() {
    let mut out = Emitter::new(Vendor::Codex, None);
    out.completed_action(
        "c1",
        ActionKind::Command,
        "ls".to_owned(),
        json!({"exit_code": 2}),
        false,
    );
    let done = out
        .take()
        .into_iter()
        .find_map(|event| match event {
            EngineEvent::Action(action) => Some(action),
            _ => None,
        })
        .expect("the action");
    assert_eq!(done.result_meta, json!({"error_type": "nonzero_exit", "exit_code": 2}));
}

/// The usage every vendor's parser puts in its completion, as the budgets read it.
fn reported_usage(vendor: Vendor, stream: &str) -> lemon_core::budget::usage::ReportedUsage {
    let lines: Vec<&str> = stream.lines().collect();
    let completion = vendor_completion(vendor, &lines);
    lemon_core::budget::usage::ReportedUsage::from_json(&completion.usage)
}

#[test]
fn each_vendor_reports_usage_that_normalises_to_tokens_and_dollars() {
    use lemon_core::budget::usage::ReportedUsage;
    let claude =
        include_str!("../../../../../tests/fixtures/cli/claude/synth_tool_use_success.jsonl");
    assert_eq!(
        reported_usage(Vendor::Claude, claude),
        ReportedUsage {
            input_tokens: 92,
            output_tokens: 69,
            cache_read_tokens: 2048,
            cache_write_tokens: 1024,
            usd: Some(0.0123),
        }
    );
    // Codex counts its cached tokens inside the input tokens.
    let codex = include_str!("../../../../../tests/fixtures/cli/codex/synth_all_item_types.jsonl");
    assert_eq!(
        reported_usage(Vendor::Codex, codex),
        ReportedUsage {
            input_tokens: 24763 - 24448,
            output_tokens: 122,
            cache_read_tokens: 24448,
            ..ReportedUsage::default()
        }
    );
    let pi = include_str!(
        "../../../../../tests/fixtures/cli/pi/synth_edit_failure_stop_reason_error.jsonl"
    );
    assert_eq!(
        reported_usage(Vendor::Pi, pi),
        ReportedUsage { input_tokens: 900, output_tokens: 40, ..ReportedUsage::default() }
    );
    // The fixture's tool-calls step with the run's final `stop`.
    let opencode = concat!(
        r#"{"type":"step_start","sessionID":"ses_7c1e2f3a4b5cXyZ","part":{"type":"step-start"}}"#,
        "\n",
        r#"{"type":"step_finish","sessionID":"ses_7c1e2f3a4b5cXyZ","part":{"type":"step-finish","reason":"stop","cost":0.0042,"tokens":{"input":1200,"output":80,"reasoning":20,"cache":{"read":300,"write":10}}}}"#,
    );
    assert_eq!(
        reported_usage(Vendor::Opencode, opencode),
        ReportedUsage {
            input_tokens: 1200,
            output_tokens: 100,
            cache_read_tokens: 300,
            cache_write_tokens: 10,
            usd: Some(0.0042),
        }
    );
    // Droid reports turns and time, no tokens.
    let droid = include_str!(
        "../../../../../tests/fixtures/cli/droid/synth_reasoning_tools_completion.jsonl"
    );
    assert_eq!(reported_usage(Vendor::Droid, droid), ReportedUsage::default());
}
