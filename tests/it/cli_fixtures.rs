//! Every recorded vendor stream (`tests/fixtures/cli`), replayed by the fake CLI
//! through the real process path, gives the events the fixtures' README expects.
//!
//! Differences from the README's notation, all deliberate: streamed text appears as
//! `D(…)` deltas; thinking and reasoning are `reasoning` actions (the README says
//! `note`); a codex turn is a `note` action that completes when the turn ends (and
//! closes a pending reconnect note); a stream with events before the vendor's own
//! start gets a `Started` first; a non-zero exit reads `<cli> exited with status N:
//! <stderr>`.

use lemon_core::engine::{EngineEvent, ResumeToken};
use lemon_engines::cli::Vendor;
use serde_json::json;

use crate::cli_support::{describe_all, read_args, request, section, start, Harness};

/// One replay and what it must produce.
struct Case {
    vendor: Vendor,
    file: &'static str,
    /// The run continues this session.
    resume: Option<&'static str>,
    /// The fixture's `/home/dev/proj` is the run's cwd, so paths show relative to it.
    in_project: bool,
    exit_code: Option<u8>,
    stderr: Option<&'static str>,
    expected: &'static [&'static str],
}

const fn case(vendor: Vendor, file: &'static str, expected: &'static [&'static str]) -> Case {
    Case { vendor, file, resume: None, in_project: false, exit_code: None, stderr: None, expected }
}

/// Replays the case and checks the rendered events; returns them for more checks.
async fn replay(case: &Case) -> (Harness, Vec<EngineEvent>) {
    let harness = Harness::new();
    let fixture = harness.fixture(case.vendor, case.file, case.in_project, None);
    let mut vars = vec![
        ("FAKE_CLI_FIXTURE", fixture.to_string_lossy().into_owned()),
        ("FAKE_CLI_ARGS_FILE", harness.file("args").to_string_lossy().into_owned()),
    ];
    if let Some(code) = case.exit_code {
        vars.push(("FAKE_CLI_EXIT_CODE", code.to_string()));
    }
    if let Some(stderr) = case.stderr {
        vars.push(("FAKE_CLI_STDERR", stderr.to_owned()));
    }
    let engine = harness.engine(case.vendor, &section(&vars));
    let resume = case.resume.map(|value| ResumeToken::new(case.vendor.id(), value));
    let mut run = start(&engine, request("Do the thing", &harness.cwd(), resume)).await;
    let events = run.until_closed().await;
    assert_eq!(
        describe_all(&events),
        case.expected,
        "{} {} (exit {:?})",
        case.vendor,
        case.file,
        case.exit_code
    );
    (harness, events)
}

fn completion(events: &[EngineEvent]) -> &lemon_core::engine::Completion {
    match events.last() {
        Some(EngineEvent::Completed(completion)) => completion,
        other => panic!("the last event is the completion, not {other:?}"),
    }
}

fn started_meta(events: &[EngineEvent]) -> &serde_json::Value {
    match events.first() {
        Some(EngineEvent::Started { meta, .. }) => meta,
        other => panic!("the first event is Started, not {other:?}"),
    }
}

fn action_detail<'a>(events: &'a [EngineEvent], id: &str, phase: &str) -> &'a serde_json::Value {
    events
        .iter()
        .find_map(|event| match event {
            EngineEvent::Action(a) if a.id == id && a.phase.as_str() == phase => Some(&a.detail),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no {phase} action {id}"))
}

#[tokio::test]
async fn claude_schema_samples_end_at_the_first_result() {
    let (_h, events) = replay(&case(
        Vendor::Claude,
        "test_schema_samples.jsonl",
        &[
            "S(claude:sess_123)",
            r#"D("Hello world")"#,
            r#"A(completed claude.thinking.0 reasoning "Let me analyze..." true)"#,
            r#"A(started toolu_123 command "ls -la" -)"#,
            r#"D("\n\nI'll run a command")"#,
            r#"A(started t1 command "echo hi" -)"#,
            r#"A(completed toolu_123 command "ls -la" true)"#,
            r#"A(completed t1 command "echo hi" false)"#,
            r#"C(ok=true, answer "Final answer", resume claude:sess_123)"#,
        ],
    ))
    .await;
    assert_eq!(
        *started_meta(&events),
        json!({"cwd": "/home/user", "model": "claude-opus-4", "tools": ["Bash", "Read"]})
    );
    assert_eq!(
        completion(&events).usage,
        json!({"duration_ms": 5000, "num_turns": 3, "usage": {
            "input_tokens": 100, "output_tokens": 50, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}})
    );
}

#[tokio::test]
async fn claude_tool_use_success() {
    let (harness, events) = replay(&case(
        Vendor::Claude,
        "synth_tool_use_success.jsonl",
        &[
            "S(claude:5b1c7a52-8f0e-4d7b-9c1a-2f3e4d5c6b7a)",
            r#"A(completed claude.thinking.0 reasoning "The user wants the test count. I should list the test directory first." true)"#,
            r#"D("Let me look at the tests.")"#,
            r#"A(started toolu_01 command "ls test" -)"#,
            r#"A(completed toolu_01 command "ls test" true)"#,
            r#"A(started toolu_02 tool "read: `/home/dev/proj/test/a_test.exs`" -)"#,
            r#"A(completed toolu_02 tool "read: `/home/dev/proj/test/a_test.exs`" true)"#,
            r#"D("\n\nThere are 2 test files.")"#,
            r#"C(ok=true, answer "There are 2 test files.", resume claude:5b1c7a52-8f0e-4d7b-9c1a-2f3e4d5c6b7a)"#,
        ],
    ))
    .await;
    assert_eq!(
        completion(&events).usage,
        json!({"total_cost_usd": 0.0123, "duration_ms": 8123, "duration_api_ms": 7001, "num_turns": 3, "usage": {
            "input_tokens": 92, "output_tokens": 69, "cache_creation_input_tokens": 1024, "cache_read_input_tokens": 2048}})
    );
    let thinking = action_detail(&events, "claude.thinking.0", "completed");
    assert_eq!(thinking["reasoning"]["source"], "claude_thinking");
    assert_eq!(thinking["signature"], "sig_abc");
    let meta = started_meta(&events);
    assert_eq!(meta["model"], "claude-sonnet-4-5");
    assert_eq!(meta["permission_mode"], "bypassPermissions");
    // The prompt went on stdin, not on the command line.
    let recorded = read_args(&harness.file("args"));
    assert_eq!(
        recorded.argv,
        ["-p", "--output-format", "stream-json", "--input-format", "text", "--verbose"]
    );
    assert_eq!(recorded.stdin, "Do the thing\n");
    assert_eq!(recorded.cwd, harness.cwd().to_string_lossy());
}

#[tokio::test]
async fn claude_tool_use_success_in_the_project_shows_relative_paths() {
    let mut case = case(
        Vendor::Claude,
        "synth_tool_use_success.jsonl",
        &[
            "S(claude:5b1c7a52-8f0e-4d7b-9c1a-2f3e4d5c6b7a)",
            r#"A(completed claude.thinking.0 reasoning "The user wants the test count. I should list the test directory first." true)"#,
            r#"D("Let me look at the tests.")"#,
            r#"A(started toolu_01 command "ls test" -)"#,
            r#"A(completed toolu_01 command "ls test" true)"#,
            r#"A(started toolu_02 tool "read: `test/a_test.exs`" -)"#,
            r#"A(completed toolu_02 tool "read: `test/a_test.exs`" true)"#,
            r#"D("\n\nThere are 2 test files.")"#,
            r#"C(ok=true, answer "There are 2 test files.", resume claude:5b1c7a52-8f0e-4d7b-9c1a-2f3e4d5c6b7a)"#,
        ],
    );
    case.in_project = true;
    replay(&case).await;
}

#[tokio::test]
async fn claude_permission_error_result() {
    let (_h, events) = replay(&case(
        Vendor::Claude,
        "synth_permission_error_result.jsonl",
        &[
            "S(claude:9d8e7f60-1111-4222-8333-444455556666)",
            r#"A(started toolu_11 file_change "/etc/hosts" -)"#,
            r#"A(completed toolu_11 file_change "/etc/hosts" false)"#,
            r#"A(completed note_0 warning "Permission denied: Permission denied: cannot write /etc/hosts" false level=warning)"#,
            r#"C(ok=false, answer "Could not update /etc/hosts", error "Could not update /etc/hosts", resume claude:9d8e7f60-1111-4222-8333-444455556666)"#,
        ],
    ))
    .await;
    // Unlike the reference, a failed result keeps its cost and usage.
    assert_eq!(completion(&events).usage["total_cost_usd"], json!(0.001));
}

const CLAUDE_RESUMED: &str = "5b1c7a52-8f0e-4d7b-9c1a-2f3e4d5c6b7a";

#[tokio::test]
async fn claude_resumed_stream_without_result_fails_on_clean_exit() {
    let mut case = case(
        Vendor::Claude,
        "synth_resumed_no_result.jsonl",
        &[
            "S(claude:5b1c7a52-8f0e-4d7b-9c1a-2f3e4d5c6b7a)",
            r#"D("Continuing where we left off.")"#,
            r#"C(ok=false, answer "Continuing where we left off.", error "claude finished without a result event", resume claude:5b1c7a52-8f0e-4d7b-9c1a-2f3e4d5c6b7a)"#,
        ],
    );
    case.resume = Some(CLAUDE_RESUMED);
    let (harness, _) = replay(&case).await;
    let argv = read_args(&harness.file("args")).argv;
    assert_eq!(argv.last(), Some(&format!("--resume={CLAUDE_RESUMED}")));
}

#[tokio::test]
async fn claude_resumed_stream_without_result_fails_with_the_exit_status_and_stderr() {
    let mut case = case(
        Vendor::Claude,
        "synth_resumed_no_result.jsonl",
        &[
            "S(claude:5b1c7a52-8f0e-4d7b-9c1a-2f3e4d5c6b7a)",
            r#"D("Continuing where we left off.")"#,
            r#"C(ok=false, answer "Continuing where we left off.", error "claude exited with status 1: API Error: overloaded", resume claude:5b1c7a52-8f0e-4d7b-9c1a-2f3e4d5c6b7a)"#,
        ],
    );
    case.resume = Some(CLAUDE_RESUMED);
    case.exit_code = Some(1);
    case.stderr = Some("API Error: overloaded\n");
    replay(&case).await;
}

#[tokio::test]
async fn claude_task_subagent_nesting() {
    let (_h, events) = replay(&case(
        Vendor::Claude,
        "synth_task_subagent_nesting.jsonl",
        &[
            "S(claude:c0ffee00-aaaa-4bbb-8ccc-dddddddddddd)",
            r#"A(started toolu_task subagent "Survey repo" -)"#,
            r#"A(started toolu_child tool "glob: `*`" -)"#,
            r#"A(completed toolu_child tool "glob: `*`" true)"#,
            r#"A(completed toolu_task subagent "Survey repo" true)"#,
            r#"D("The repo has apps/ and config/.")"#,
            r#"C(ok=true, answer "The repo has apps/ and config/.", resume claude:c0ffee00-aaaa-4bbb-8ccc-dddddddddddd)"#,
        ],
    ))
    .await;
    assert_eq!(
        action_detail(&events, "toolu_child", "started")["parent_tool_use_id"],
        "toolu_task"
    );
    assert_eq!(action_detail(&events, "toolu_task", "started")["parent_tool_use_id"], json!(null));
}

#[tokio::test]
async fn codex_full_lifecycle() {
    let (harness, events) = replay(&case(
        Vendor::Codex,
        "test_full_lifecycle.jsonl",
        &[
            "S(codex:full_lifecycle)",
            r#"A(started turn_0 note "turn started" -)"#,
            r#"A(started cmd_1 command "echo test" -)"#,
            r#"A(completed cmd_1 command "echo test" true)"#,
            r#"D("Task completed")"#,
            r#"A(completed turn_0 note "turn started" true)"#,
            r#"C(ok=true, answer "Task completed", resume codex:full_lifecycle)"#,
        ],
    ))
    .await;
    assert_eq!(
        completion(&events).usage,
        json!({"input_tokens": 100, "cached_input_tokens": 0, "output_tokens": 50})
    );
    let detail = action_detail(&events, "cmd_1", "completed");
    assert_eq!((&detail["exit_code"], &detail["status"]), (&json!(0), &json!("completed")));
    let recorded = read_args(&harness.file("args"));
    assert_eq!(
        recorded.argv,
        [
            "exec",
            "--json",
            "--skip-git-repo-check",
            "--color=never",
            "-c",
            "model_auto_compact_token_limit=170000",
            "-"
        ]
    );
    assert_eq!(recorded.stdin, "Do the thing\n");
}

#[tokio::test]
async fn codex_fake_cli_pong() {
    let (_h, events) = replay(&case(
        Vendor::Codex,
        "test_fake_cli_pong.jsonl",
        &[
            "S(codex:fake-thread)",
            r#"D("pong")"#,
            r#"C(ok=true, answer "pong", resume codex:fake-thread)"#,
        ],
    ))
    .await;
    assert_eq!(
        completion(&events).usage,
        json!({"input_tokens": 0, "cached_input_tokens": 0, "output_tokens": 0})
    );
}

#[tokio::test]
async fn codex_invalid_json_line_is_a_warning() {
    let (_h, events) = replay(&case(
        Vendor::Codex,
        "test_invalid_json_line.jsonl",
        &[
            "S(codex:invalid_json_test)",
            r#"A(completed decode_error_0 warning "Invalid JSONL line" false level=warning)"#,
            r#"C(ok=true, answer "", resume codex:invalid_json_test)"#,
        ],
    ))
    .await;
    assert_eq!(
        action_detail(&events, "decode_error_0", "completed")["line"],
        "this is not valid json"
    );
}

#[tokio::test]
async fn codex_schema_samples_end_at_the_first_turn_completion() {
    let (_h, events) = replay(&case(
        Vendor::Codex,
        "test_schema_samples.jsonl",
        &[
            "S(codex:abc123)",
            r#"A(started turn_0 note "turn started" -)"#,
            r#"A(completed turn_0 note "turn started" true)"#,
            r#"C(ok=true, answer "", resume codex:abc123)"#,
        ],
    ))
    .await;
    assert_eq!(
        completion(&events).usage,
        json!({"input_tokens": 100, "cached_input_tokens": 50, "output_tokens": 200})
    );
}

#[tokio::test]
async fn codex_all_item_types() {
    let (_h, events) = replay(&case(
        Vendor::Codex,
        "synth_all_item_types.jsonl",
        &[
            "S(codex:0199a213-81c0-7800-8aa1-bbab2a035a53)",
            r#"A(started turn_0 note "turn started" -)"#,
            r#"A(completed item_0 reasoning "**Inspecting the repository**\n\nI'll list files and then patch the README." true)"#,
            r#"A(started item_1 command "bash -lc 'ls -1'" -)"#,
            r#"A(completed item_1 command "bash -lc 'ls -1'" true)"#,
            r#"A(started item_2 note "1/2 tasks" -)"#,
            r#"A(started item_3 tool "docs.search" -)"#,
            r#"A(completed item_3 tool "docs.search" true)"#,
            r#"A(started item_4 web_search "elixir readme conventions" -)"#,
            r#"A(completed item_4 web_search "elixir readme conventions" true)"#,
            r#"A(completed item_5 file_change "1 file changed" true)"#,
            r#"A(started item_6 command "bash -lc 'mix test'" -)"#,
            r#"A(completed item_6 command "bash -lc 'mix test'" false)"#,
            r#"A(updated item_2 note "2/2 tasks" -)"#,
            r#"A(completed item_2 note "2/2 tasks" true)"#,
            r#"A(completed item_7 warning "command timed out after 10s" false level=warning)"#,
            r#"D("Fixed the typo in README.md; one test still fails.")"#,
            r#"A(completed turn_0 note "turn started" true)"#,
            r#"C(ok=true, answer "Fixed the typo in README.md; one test still fails.", resume codex:0199a213-81c0-7800-8aa1-bbab2a035a53)"#,
        ],
    ))
    .await;
    assert_eq!(
        completion(&events).usage,
        json!({"input_tokens": 24763, "cached_input_tokens": 24448, "output_tokens": 122})
    );
    assert_eq!(
        action_detail(&events, "item_0", "completed")["reasoning"]["source"],
        "codex_reasoning"
    );
    assert_eq!(
        action_detail(&events, "item_3", "completed")["result_summary"],
        "No style guide found"
    );
    assert_eq!(
        action_detail(&events, "item_5", "completed")["changes"],
        json!([{"path": "/home/dev/proj/README.md", "kind": "update"}])
    );
    let failed = action_detail(&events, "item_6", "completed");
    assert_eq!((&failed["exit_code"], &failed["status"]), (&json!(1), &json!("failed")));
}

#[tokio::test]
async fn codex_reconnect_then_turn_failed() {
    let mut case = case(
        Vendor::Codex,
        "synth_reconnect_then_turn_failed.jsonl",
        &[
            "S(codex:0199a213-9999-7000-8000-000000000abc)",
            r#"A(started turn_0 note "turn started" -)"#,
            r#"A(started codex.reconnect note "Reconnecting... 1/5" - level=info)"#,
            r#"A(updated codex.reconnect note "Reconnecting... 2/5" - level=info)"#,
            r#"A(completed note_0 warning "stream disconnected before completion" false level=warning)"#,
            r#"A(completed codex.reconnect note "Reconnecting... 2/5" false)"#,
            r#"A(completed turn_0 note "turn started" false)"#,
            r#"C(ok=false, answer "", error "stream disconnected before completion: Transport error", resume codex:0199a213-9999-7000-8000-000000000abc)"#,
        ],
    );
    case.resume = Some("0199a213-9999-7000-8000-000000000abc");
    let (harness, events) = replay(&case).await;
    assert_eq!(action_detail(&events, "codex.reconnect", "updated")["attempt"], 2);
    let argv = read_args(&harness.file("args")).argv;
    assert_eq!(
        argv[argv.len() - 4..],
        ["resume", "--", "0199a213-9999-7000-8000-000000000abc", "-"]
    );
}

#[tokio::test]
async fn droid_decode_samples_run() {
    let (harness, events) = replay(&case(
        Vendor::Droid,
        "test_decode_samples_run.jsonl",
        &[
            "S(droid:sess_1)",
            r#"D("pong")"#,
            r#"A(started r_1 reasoning "Let me think..." -)"#,
            r#"A(started tc_1 tool "grep: pong" -)"#,
            r#"A(completed tc_1 tool "grep: pong" true)"#,
            r#"A(completed r_1 reasoning "Let me think..." true)"#,
            r#"C(ok=true, answer "pong", resume droid:sess_1)"#,
        ],
    ))
    .await;
    assert_eq!(*started_meta(&events), json!({"cwd": "/tmp", "model": "droid-pro", "tools": []}));
    assert_eq!(completion(&events).usage, json!({"num_turns": 1, "duration_ms": 25}));
    assert_eq!(action_detail(&events, "tc_1", "completed")["result_summary"], "1 match");
    let recorded = read_args(&harness.file("args"));
    let cwd = harness.cwd().to_string_lossy().into_owned();
    assert_eq!(recorded.argv, ["exec", "-o", "stream-json", "--cwd", cwd.as_str(), "Do the thing"]);
    assert_eq!(recorded.stdin, "", "stdin is /dev/null");
}

#[tokio::test]
async fn droid_unknown_type_without_session_fails() {
    replay(&case(
        Vendor::Droid,
        "test_unknown_type.jsonl",
        &[
            "S(-)",
            r#"A(completed decode_error_0 warning "Invalid JSONL line" false level=warning)"#,
            r#"C(ok=false, answer "", error "droid exec finished but no session_id was captured", resume -)"#,
        ],
    ))
    .await;
}

#[tokio::test]
async fn droid_reasoning_tools_completion() {
    let mut case = case(
        Vendor::Droid,
        "synth_reasoning_tools_completion.jsonl",
        &[
            "S(droid:a7c3e9f1-2b4d-4c6e-8f0a-1b2c3d4e5f60)",
            r#"A(started rs_1 reasoning "Need to find the failing test." -)"#,
            r#"A(updated rs_1 reasoning "Need to find the failing test. Grep for 'assert'." -)"#,
            r#"A(started call_1 tool "Execute" -)"#,
            r#"A(completed call_1 tool "Execute" false)"#,
            r#"A(started call_2 file_change "test/a_test.exs" -)"#,
            r#"A(completed call_2 file_change "test/a_test.exs" true)"#,
            r#"D("Fixed the assertion in test/a_test.exs.")"#,
            r#"A(completed rs_1 reasoning "Need to find the failing test. Grep for 'assert'." true)"#,
            r#"C(ok=true, answer "Fixed the assertion in test/a_test.exs.", resume droid:a7c3e9f1-2b4d-4c6e-8f0a-1b2c3d4e5f60)"#,
        ],
    );
    case.in_project = true;
    let (_h, events) = replay(&case).await;
    assert_eq!(completion(&events).usage, json!({"num_turns": 3, "duration_ms": 4200}));
    assert_eq!(action_detail(&events, "rs_1", "started")["reasoning"]["source"], "droid_reasoning");
}

#[tokio::test]
async fn opencode_runner_structs() {
    let (harness, _) = replay(&case(
        Vendor::Opencode,
        "synth_from_runner_test_structs.jsonl",
        &[
            "S(opencode:ses_abc)",
            r#"A(started call_1 command "ls -la" -)"#,
            r#"A(completed call_1 command "ls -la" true)"#,
            r#"D("Hello")"#,
            r#"D(" world")"#,
            r#"C(ok=true, answer "Hello world", resume opencode:ses_abc)"#,
        ],
    ))
    .await;
    let recorded = read_args(&harness.file("args"));
    assert_eq!(recorded.argv, ["run", "--format", "json", "--", "Do the thing"]);
}

#[tokio::test]
async fn opencode_edit_then_api_error() {
    let mut case = case(
        Vendor::Opencode,
        "synth_edit_then_api_error.jsonl",
        &[
            "S(opencode:ses_7c1e2f3a4b5cXyZ)",
            r#"A(started call_edit file_change "lib/app.ex" -)"#,
            r#"A(completed call_edit file_change "lib/app.ex" true)"#,
            r#"A(completed call_test command "mix test" false)"#,
            r#"A(completed call_read tool "read: `missing.ex`" false)"#,
            r#"D("Renamed foo to bar; one test fails.")"#,
            r#"C(ok=false, answer "Renamed foo to bar; one test fails.", error "Rate limit exceeded", resume opencode:ses_7c1e2f3a4b5cXyZ)"#,
        ],
    );
    case.in_project = true;
    let (harness, events) = replay(&case).await;
    let path = harness.cwd().join("lib/app.ex").to_string_lossy().into_owned();
    assert_eq!(
        action_detail(&events, "call_edit", "started")["changes"],
        json!([{"path": path, "kind": "update"}])
    );
}

#[tokio::test]
async fn pi_new_session_is_promoted_to_the_session_id() {
    let (harness, events) = replay(&case(
        Vendor::Pi,
        "synth_from_runner_test_structs.jsonl",
        &[
            "S(pi:abcd-1234)",
            r#"A(started t1 command "ls" -)"#,
            r#"A(completed t1 command "ls" true)"#,
            r#"D("Hello")"#,
            r#"C(ok=true, answer "Hello", resume pi:abcd-1234)"#,
        ],
    ))
    .await;
    assert_eq!(*started_meta(&events), json!({"cwd": harness.cwd().to_string_lossy()}));
    assert_eq!(completion(&events).usage, json!({"input_tokens": 1, "output_tokens": 2}));
    // A new session is a fresh session file under $HOME/.pi/agent/sessions.
    let argv = read_args(&harness.file("args")).argv;
    assert_eq!(argv[..3], ["--print", "--mode", "json"]);
    assert_eq!(argv[3], "--session");
    let sessions = harness.home().join(".pi/agent/sessions").to_string_lossy().into_owned();
    assert!(argv[4].starts_with(&sessions) && argv[4].ends_with(".jsonl"), "{argv:?}");
    assert!(std::path::Path::new(&argv[4]).parent().is_some_and(std::path::Path::is_dir));
    assert_eq!(argv[5], "Do the thing");
}

#[tokio::test]
async fn pi_resumed_edit_failure_with_stop_reason_error() {
    let mut case = case(
        Vendor::Pi,
        "synth_edit_failure_stop_reason_error.jsonl",
        &[
            "S(pi:3f2a9c1e)",
            r#"A(started toolu_r1 tool "read: `mix.exs`" -)"#,
            r#"A(completed toolu_r1 tool "read: `mix.exs`" true)"#,
            r#"A(started toolu_e1 file_change "mix.exs" -)"#,
            r#"A(completed toolu_e1 file_change "mix.exs" false)"#,
            r#"D("I could not apply the edit.")"#,
            r#"C(ok=false, answer "I could not apply the edit.", error "overloaded_error: Overloaded", resume pi:3f2a9c1e)"#,
        ],
    );
    case.resume = Some("3f2a9c1e");
    case.in_project = true;
    let (harness, events) = replay(&case).await;
    assert_eq!(
        completion(&events).usage,
        json!({"input": 900, "output": 40, "cacheRead": 0, "cacheWrite": 0, "totalTokens": 940})
    );
    assert!(action_detail(&events, "toolu_e1", "started")["changes"].is_array());
    let argv = read_args(&harness.file("args")).argv;
    assert_eq!(argv[argv.len() - 3..], ["--session", "3f2a9c1e", "Do the thing"]);
}

// What the real CLIs printed (captured by tests/it/real_cli.rs), replayed:
// a call of the CLI's shell tool and the answer after it.

#[tokio::test]
async fn claude_real_capture_tool_call() {
    let case = Case {
        in_project: true,
        ..case(
            Vendor::Claude,
            "real_2.1.332_tool_call.jsonl",
            &[
                "S(claude:0aa8aae9-2b59-4f1a-844f-6e52148c719a)",
                r#"A(started call_lemon_1 command "echo lemon-$((6*7))" -)"#,
                r#"A(completed call_lemon_1 command "echo lemon-$((6*7))" true)"#,
                r#"D("The tool said 42.")"#,
                r#"C(ok=true, answer "The tool said 42.", resume claude:0aa8aae9-2b59-4f1a-844f-6e52148c719a)"#,
            ],
        )
    };
    replay(&case).await;
}

#[tokio::test]
async fn codex_real_capture_tool_call() {
    let case = Case {
        in_project: true,
        ..case(
            Vendor::Codex,
            "real_0.171.0_tool_call.jsonl",
            &[
                "S(codex:01a23429-7ea1-7f53-b7f1-7484fcd5af5b)",
                r#"A(completed item_0 warning "Model metadata for `fake-model` not found. Defaulting to fallback metadata; this can degrade performance and cause issues." false level=warning)"#,
                r#"A(started turn_0 note "turn started" -)"#,
                r#"A(started item_1 command "/bin/bash -lc 'echo lemon-$((6*7))'" -)"#,
                r#"A(completed item_1 command "/bin/bash -lc 'echo lemon-$((6*7))'" true)"#,
                r#"D("The tool said 42.")"#,
                r#"A(completed turn_0 note "turn started" true)"#,
                r#"C(ok=true, answer "The tool said 42.", resume codex:01a23429-7ea1-7f53-b7f1-7484fcd5af5b)"#,
            ],
        )
    };
    replay(&case).await;
}

#[tokio::test]
async fn opencode_real_capture_tool_call() {
    let case = Case {
        in_project: true,
        ..case(
            Vendor::Opencode,
            "real_1.18.33_tool_call.jsonl",
            &[
                "S(opencode:ses_dcbd5ccebffe5J7dYc7Pwr2Tfn)",
                r#"A(completed call_lemon_1 command "echo lemon-$((6*7))" true)"#,
                r#"D("The tool said 42.")"#,
                r#"C(ok=true, answer "The tool said 42.", resume opencode:ses_dcbd5ccebffe5J7dYc7Pwr2Tfn)"#,
            ],
        )
    };
    replay(&case).await;
}

#[tokio::test]
async fn pi_real_capture_tool_call() {
    let case = Case {
        in_project: true,
        ..case(
            Vendor::Pi,
            "real_0.73.1_tool_call.jsonl",
            &[
                "S(pi:01a2342a-20a0-7582-b877-a238123b3db4)",
                r#"A(started call_lemon_1 command "echo lemon-$((6*7))" -)"#,
                r#"A(completed call_lemon_1 command "echo lemon-$((6*7))" true)"#,
                r#"D("The tool said 42.")"#,
                r#"C(ok=true, answer "The tool said 42.", resume pi:01a2342a-20a0-7582-b877-a238123b3db4)"#,
            ],
        )
    };
    replay(&case).await;
}

#[tokio::test]
async fn droid_real_capture_answer() {
    let case = Case {
        in_project: true,
        ..case(
            Vendor::Droid,
            "real_0.225.1_answer.jsonl",
            &[
                "S(droid:525324a8-c2c6-45a0-a60d-947c21097b75)",
                r#"D("Hello from the fake.")"#,
                r#"C(ok=true, answer "Hello from the fake.", resume droid:525324a8-c2c6-45a0-a60d-947c21097b75)"#,
            ],
        )
    };
    replay(&case).await;
}
