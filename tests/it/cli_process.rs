//! What the CLI engines put on the command line and stdin, Claude steering through
//! a kept-open stdin, and config turned into engines.

use lemon_core::engine::{Engine, EngineError, EngineEvent, EventSink, ResumeToken, SteerError};
use lemon_engines::cli::{build_cli_engines, Vendor};
use lemon_engines::config::EngineSection;

use crate::cli_support::{
    describe_all, read_args, request, section, sections_from, start, Harness,
};

fn engines_from(config: &str, harness: &Harness) -> Vec<std::sync::Arc<dyn Engine>> {
    build_cli_engines(&sections_from(config), &harness.context())
}

#[tokio::test]
async fn claude_steering_writes_a_second_user_message_into_the_live_session() {
    let harness = Harness::new();
    let fixture = harness.fixture(Vendor::Claude, "steer_two_turns.jsonl", false, None);
    let args = harness.file("args");
    let mut section = section(&[
        ("FAKE_CLI_FIXTURE", fixture.to_string_lossy().into_owned()),
        ("FAKE_CLI_ARGS_FILE", args.to_string_lossy().into_owned()),
    ]);
    section.steering = Some(true);
    let engine = harness.engine(Vendor::Claude, &section);
    assert!(engine.capabilities().steer);

    let mut run = start(&engine, request("first request", &harness.cwd(), None)).await;
    // The fake now waits for a second line on stdin before it answers.
    let mut events = run.until(|event| matches!(event, EngineEvent::Delta(_))).await;
    run.control.steer("and also this").await.expect("the steer is accepted");
    events.extend(run.until_closed().await);
    assert_eq!(
        describe_all(&events),
        [
            "S(claude:steer-0001)",
            r#"D("Working on the first request.")"#,
            r#"D("\n\nNow the steered request.")"#,
            r#"C(ok=true, answer "Second answer.", resume claude:steer-0001)"#,
        ]
    );

    let recorded = read_args(&args);
    assert_eq!(
        recorded.argv[..6],
        ["-p", "--output-format", "stream-json", "--input-format", "stream-json", "--verbose"]
    );
    let messages: Vec<serde_json::Value> = recorded
        .stdin
        .lines()
        .map(|line| serde_json::from_str(line).expect("a JSON line"))
        .collect();
    let texts: Vec<&str> = messages
        .iter()
        .map(|m| m["message"]["content"][0]["text"].as_str().expect("user text"))
        .collect();
    assert_eq!(texts, ["first request", "and also this"]);
    assert!(messages.iter().all(|m| m["type"] == "user" && m["message"]["role"] == "user"));

    assert_eq!(run.control.steer("too late").await, Err(SteerError::Finished));
}

#[tokio::test]
async fn config_keys_reach_each_vendors_command_line() {
    let harness = Harness::new();
    let config = r#"
        [gateway.engines.claude]
        model = "sonnet"
        dangerously_skip_permissions = true
        allowed_tools = ["Bash", "Read"]
        extra_args = ["--max-turns", "3"]

        [gateway.engines.codex]
        dangerously_skip_permissions = true
        extra_args = ["-c", "notify=[]"]

        [gateway.engines.opencode]
        model = "anthropic/claude-sonnet-4-5"
        extra_args = ["--agent", "build"]

        [gateway.engines.pi]
        provider = "anthropic"
        model = "claude-sonnet-4-5"
        extra_args = ["--thinking", "low"]

        [gateway.engines.droid]
        dangerously_skip_permissions = true
        reasoning_effort = "high"
        extra_args = ["--auto", "medium"]
    "#;
    let sections = sections_from(config);
    let cwd = harness.cwd().to_string_lossy().into_owned();
    for vendor in Vendor::ALL {
        let mut section: EngineSection = sections.get(vendor.id()).expect("a section").clone();
        let fixture =
            harness.fixture(vendor, crate::cli_support::success_fixture(vendor), false, None);
        let args = harness.file(&format!("{vendor}.args"));
        section.env.insert("FAKE_CLI_FIXTURE".to_owned(), fixture.to_string_lossy().into_owned());
        section.env.insert("FAKE_CLI_ARGS_FILE".to_owned(), args.to_string_lossy().into_owned());
        let engine = harness.engine(vendor, &section);
        let resume = ResumeToken::new(
            vendor.id(),
            if vendor == Vendor::Opencode { "ses_prev1" } else { "prev-1" },
        );
        let mut req = request("-v is a prompt, not a flag", &harness.cwd(), Some(resume));
        if vendor == Vendor::Codex {
            req.model = Some("openai:gpt-5-codex".to_owned());
        }
        let mut run = start(&engine, req).await;
        let events = run.until_closed().await;
        assert!(
            matches!(events.last(), Some(EngineEvent::Completed(c)) if c.ok),
            "{vendor}: {:#?}",
            describe_all(&events)
        );
        let argv = read_args(&args).argv;
        let expected: Vec<&str> = match vendor {
            Vendor::Claude => vec![
                "-p",
                "--output-format",
                "stream-json",
                "--input-format",
                "text",
                "--verbose",
                "--dangerously-skip-permissions",
                "--allowedTools",
                "Bash",
                "Read",
                "--model=sonnet",
                "--max-turns",
                "3",
                "--resume=prev-1",
            ],
            Vendor::Codex => vec![
                "-c",
                "notify=[]",
                "exec",
                "--model=gpt-5-codex",
                "--json",
                "--skip-git-repo-check",
                "--color=never",
                "--dangerously-bypass-approvals-and-sandbox",
                "-c",
                "model_auto_compact_token_limit=170000",
                "resume",
                "--",
                "prev-1",
                "-",
            ],
            Vendor::Opencode => vec![
                "run",
                "--format",
                "json",
                "--session=ses_prev1",
                "--model=anthropic/claude-sonnet-4-5",
                "--agent",
                "build",
                "--",
                "-v is a prompt, not a flag",
            ],
            Vendor::Pi => vec![
                "--thinking",
                "low",
                "--print",
                "--mode",
                "json",
                "--provider",
                "anthropic",
                "--model",
                "claude-sonnet-4-5",
                "--session",
                "prev-1",
                " -v is a prompt, not a flag",
            ],
            Vendor::Droid => vec![
                "exec",
                "-o",
                "stream-json",
                "--skip-permissions-unsafe",
                "-s",
                "prev-1",
                "--reasoning-effort",
                "high",
                "--auto",
                "medium",
                "--cwd",
                cwd.as_str(),
                " -v is a prompt, not a flag",
            ],
        };
        assert_eq!(argv, expected, "{vendor}");
    }
}

#[tokio::test]
async fn a_resume_token_of_another_engine_starts_a_new_session() {
    let harness = Harness::new();
    let fixture = harness.fixture(Vendor::Claude, "synth_tool_use_success.jsonl", false, None);
    let args = harness.file("args");
    let engine = harness.engine(
        Vendor::Claude,
        &section(&[
            ("FAKE_CLI_FIXTURE", fixture.to_string_lossy().into_owned()),
            ("FAKE_CLI_ARGS_FILE", args.to_string_lossy().into_owned()),
        ]),
    );
    let foreign = ResumeToken::new("codex", "thread-9");
    let mut run = start(&engine, request("hi", &harness.cwd(), Some(foreign))).await;
    run.until_closed().await;
    let argv = read_args(&args).argv;
    assert!(
        !argv.iter().any(|arg| arg.starts_with("--resume") || arg.contains("thread-9")),
        "{argv:?}"
    );
}

#[tokio::test]
async fn a_missing_working_directory_is_a_start_error() {
    let harness = Harness::new();
    let engine = harness.engine(Vendor::Codex, &EngineSection::default());
    let (sink, mut rx) = EventSink::channel(8);
    let missing = harness.file("no-such-dir");
    let err = engine.start(request("hi", &missing, None), sink).await.expect_err("no cwd");
    let EngineError::Start(message) = err else { panic!("a start error") };
    assert!(message.contains("no-such-dir"), "{message}");
    assert_eq!(rx.recv().await, None);
}

#[tokio::test]
async fn every_vendor_is_built_unless_disabled() {
    let harness = Harness::new();
    let all: Vec<String> = engines_from("", &harness).iter().map(|e| e.id().to_string()).collect();
    assert_eq!(all, ["claude", "codex", "opencode", "pi", "droid"]);

    let config = "[gateway.engines.codex]\nenabled = false\n[gateway.engines.pi]\nenabled = true\n[gateway.engines.echo]\ndelay_ms = 5\n";
    let some: Vec<String> =
        engines_from(config, &harness).iter().map(|e| e.id().to_string()).collect();
    assert_eq!(some, ["claude", "opencode", "pi", "droid"]);
}
