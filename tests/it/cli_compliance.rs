//! The engine contract, checked against every engine: echo, and the five vendor CLI
//! engines driven by the fake CLI through real processes.
//!
//! Exactly one `Started` first and one `Completed` last; a cancel at any point stops
//! the run without a `Completed` and leaves no process of the CLI's group (the
//! grandchild included); the inactivity timeout, a SIGTERM-ignoring CLI, a non-zero
//! exit, an oversized line, a missing executable, environment scrubbing, resume lines
//! and steering all behave the same for every vendor.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use lemon_core::engine::{
    Availability, Engine, EngineError, EngineEvent, ResumeToken, RunError, SteerError,
};
use lemon_engines::cli::{build_cli_engines, CliContext, Vendor};
use lemon_engines::config::EngineSection;
use lemon_engines::echo::EchoEngine;
use tokio_util::task::TaskTracker;

use crate::cli_support::{
    assert_group_gone, assert_well_ordered, describe_all, is_completed, is_started, read_pids,
    request, section, start, success_fixture, Harness, GATEWAY_SECRET, PATIENCE,
};

fn lines_of(path: &Path) -> usize {
    std::fs::read_to_string(path).expect("fixture").lines().count()
}

/// The fake's instructions for a run: replay `fixture` (only its first `lines`
/// lines), record pids, start a grandchild, plus `extra`.
fn fake_vars(
    harness: &Harness,
    vendor: Vendor,
    lines: Option<usize>,
    extra: &[(&'static str, &str)],
) -> Vec<(&'static str, String)> {
    let fixture = harness.fixture(vendor, success_fixture(vendor), false, lines);
    let mut vars = vec![
        ("FAKE_CLI_FIXTURE", fixture.to_string_lossy().into_owned()),
        (
            "FAKE_CLI_PID_FILE",
            harness.file(&format!("{vendor}.pids")).to_string_lossy().into_owned(),
        ),
        ("FAKE_CLI_GRANDCHILD", "1".to_owned()),
    ];
    vars.extend(extra.iter().map(|(k, v)| (*k, (*v).to_owned())));
    vars
}

/// All but the terminal line of the vendor's success fixture.
fn without_terminal_line(vendor: Vendor) -> usize {
    lines_of(&lemon_tests::fake_cli::fixture(vendor.id(), success_fixture(vendor))) - 1
}

fn completion(events: &[EngineEvent]) -> &lemon_core::engine::Completion {
    match events.last() {
        Some(EngineEvent::Completed(completion)) => completion,
        other => panic!("last event is a completion, not {other:?}"),
    }
}

fn echo() -> EchoEngine {
    EchoEngine::new(Duration::ZERO, TaskTracker::new())
}

#[tokio::test]
async fn every_engine_starts_once_and_completes_once_in_order() {
    let mut run = start(&echo(), request("hello there world", Path::new("/"), None)).await;
    let events = run.until_closed().await;
    assert_well_ordered(&events, true);
    assert!(completion(&events).ok);

    for vendor in Vendor::ALL {
        let harness = Harness::new();
        let engine = harness.engine(vendor, &section(&fake_vars(&harness, vendor, None, &[])));
        let mut run = start(&engine, request("hi", &harness.cwd(), None)).await;
        let events = run.until_closed().await;
        assert_well_ordered(&events, true);
        assert!(completion(&events).ok, "{vendor}: {:#?}", describe_all(&events));
        assert!(completion(&events)
            .resume
            .as_ref()
            .is_some_and(|token| token.engine == vendor.id()));
        // The completion comes after the CLI (and what it left running) is gone.
        assert_group_gone(read_pids(&harness.file(&format!("{vendor}.pids")))).await;
    }
}

#[tokio::test]
async fn cancel_after_started_stops_every_engine_without_a_completion() {
    let engine = EchoEngine::new(Duration::from_millis(50), TaskTracker::new());
    let mut run =
        start(&engine, request("one two three four five six", Path::new("/"), None)).await;
    let mut events = run.until(is_started).await;
    run.control.cancel();
    events.extend(run.until_closed().await);
    assert_well_ordered(&events, false);

    for vendor in Vendor::ALL {
        let harness = Harness::new();
        let lines = without_terminal_line(vendor);
        let vars = fake_vars(
            &harness,
            vendor,
            Some(lines),
            &[("FAKE_CLI_LINE_DELAY_MS", "30"), ("FAKE_CLI_HANG", "1")],
        );
        let engine = harness.engine(vendor, &section(&vars));
        let mut run = start(&engine, request("hi", &harness.cwd(), None)).await;
        let mut events = run.until(is_started).await;
        run.control.cancel();
        run.control.cancel();
        events.extend(run.until_closed().await);
        assert_well_ordered(&events, false);
        assert_group_gone(read_pids(&harness.file(&format!("{vendor}.pids")))).await;
        run.control.cancel();
    }
}

#[tokio::test]
async fn cancel_mid_stream_stops_every_engine_without_a_completion() {
    let engine = EchoEngine::new(Duration::from_millis(50), TaskTracker::new());
    let mut run =
        start(&engine, request("one two three four five six", Path::new("/"), None)).await;
    let mut events = run.until(|event| matches!(event, EngineEvent::Delta(_))).await;
    run.control.cancel();
    events.extend(run.until_closed().await);
    assert_well_ordered(&events, false);

    for vendor in Vendor::ALL {
        let harness = Harness::new();
        let lines = without_terminal_line(vendor);
        let vars = fake_vars(
            &harness,
            vendor,
            Some(lines),
            &[("FAKE_CLI_LINE_DELAY_MS", "30"), ("FAKE_CLI_HANG", "1")],
        );
        let engine = harness.engine(vendor, &section(&vars));
        let mut run = start(&engine, request("hi", &harness.cwd(), None)).await;
        let mut events = run.until(is_started).await;
        events.extend(run.until(|_| true).await);
        run.control.cancel();
        events.extend(run.until_closed().await);
        assert_well_ordered(&events, false);
        assert!(
            events.len() >= 2,
            "{vendor}: cancelled after the stream began: {:#?}",
            describe_all(&events)
        );
        assert_group_gone(read_pids(&harness.file(&format!("{vendor}.pids")))).await;
    }
}

#[tokio::test]
async fn cancel_while_the_cli_hangs_kills_its_group_and_grandchild() {
    for vendor in Vendor::ALL {
        let harness = Harness::new();
        let vars = fake_vars(&harness, vendor, Some(1), &[("FAKE_CLI_HANG", "1")]);
        let engine = harness.engine(vendor, &section(&vars));
        let mut run = start(&engine, request("hi", &harness.cwd(), None)).await;
        let mut events = run.until(is_started).await;
        let pids = read_pids(&harness.file(&format!("{vendor}.pids")));
        assert!(pids.grandchild.is_some());
        run.control.cancel();
        events.extend(run.until_closed().await);
        assert_well_ordered(&events, false);
        assert_group_gone(pids).await;
    }
}

#[tokio::test]
async fn gateway_shutdown_stops_live_runs_and_drains_the_tracker() {
    let harness = Harness::new();
    let mut runs = Vec::new();
    for vendor in Vendor::ALL {
        let vars = fake_vars(&harness, vendor, Some(1), &[("FAKE_CLI_HANG", "1")]);
        let engine = harness.engine(vendor, &section(&vars));
        let mut run = start(&engine, request("hi", &harness.cwd(), None)).await;
        run.until(is_started).await;
        runs.push((vendor, run));
    }
    harness.shutdown.cancel();
    for (vendor, mut run) in runs {
        let rest = run.until_closed().await;
        assert!(!rest.iter().any(is_completed), "{vendor}: no completion after shutdown");
        assert_group_gone(read_pids(&harness.file(&format!("{vendor}.pids")))).await;
    }
    harness.tracker.close();
    tokio::time::timeout(PATIENCE, harness.tracker.wait())
        .await
        .expect("every supervisor and stdin writer ends");
}

#[tokio::test]
async fn inactivity_timeout_kills_the_group_and_fails_with_timeout() {
    for vendor in Vendor::ALL {
        let harness = Harness::new();
        let vars = fake_vars(&harness, vendor, Some(1), &[("FAKE_CLI_HANG", "1")]);
        let mut section = section(&vars);
        section.timeout_ms = Some(200);
        let engine = harness.engine(vendor, &section);
        let mut run = start(&engine, request("hi", &harness.cwd(), None)).await;
        let events = run.until_closed().await;
        assert_well_ordered(&events, true);
        let completed = completion(&events);
        assert!(!completed.ok);
        assert_eq!(completed.error, Some(RunError::Timeout), "{vendor}");
        assert_group_gone(read_pids(&harness.file(&format!("{vendor}.pids")))).await;
    }
}

#[tokio::test]
async fn a_cli_ignoring_sigterm_is_killed_after_the_grace() {
    for vendor in Vendor::ALL {
        let harness = Harness::new();
        let vars = fake_vars(
            &harness,
            vendor,
            Some(1),
            &[("FAKE_CLI_HANG", "1"), ("FAKE_CLI_IGNORE_SIGTERM", "1")],
        );
        let mut section = section(&vars);
        section.cancel_grace_ms = Some(100);
        let engine = harness.engine(vendor, &section);
        let mut run = start(&engine, request("hi", &harness.cwd(), None)).await;
        let mut events = run.until(is_started).await;
        run.control.cancel();
        events.extend(run.until_closed().await);
        assert_well_ordered(&events, false);
        // Only SIGKILL stops the fake (and its grandchild, which blocks SIGTERM too).
        assert_group_gone(read_pids(&harness.file(&format!("{vendor}.pids")))).await;
    }
}

#[tokio::test]
async fn a_non_zero_exit_fails_with_the_stderr_tail() {
    let long_stderr = format!("{}\nfatal: model not available", "progress...\n".repeat(2000));
    for vendor in Vendor::ALL {
        let harness = Harness::new();
        let lines = without_terminal_line(vendor);
        let vars = fake_vars(
            &harness,
            vendor,
            Some(lines),
            &[("FAKE_CLI_EXIT_CODE", "3"), ("FAKE_CLI_STDERR", long_stderr.as_str())],
        );
        let engine = harness.engine(vendor, &section(&vars));
        let mut run = start(&engine, request("hi", &harness.cwd(), None)).await;
        let events = run.until_closed().await;
        assert_well_ordered(&events, true);
        let completed = completion(&events);
        assert!(!completed.ok);
        let Some(RunError::Engine { message }) = &completed.error else {
            panic!("{vendor}: an engine error, not {:?}", completed.error)
        };
        assert!(message.starts_with(&format!("{vendor} exited with status 3: ")), "{message}");
        assert!(message.ends_with("fatal: model not available"), "{message}");
        assert!(message.len() < 4 * 1024, "only the tail of stderr: {} bytes", message.len());
        assert_group_gone(read_pids(&harness.file(&format!("{vendor}.pids")))).await;
    }
}

#[tokio::test]
async fn an_oversized_line_is_a_warning_and_the_run_still_completes() {
    for vendor in Vendor::ALL {
        let harness = Harness::new();
        let config = format!("[gateway.engines.{vendor}]\nmax_line_bytes = 4096\n");
        let sections = crate::cli_support::sections_from(&config);
        let mut section = sections.get(vendor.id()).expect("a section").clone();
        section.env =
            fake_vars(&harness, vendor, None, &[("FAKE_CLI_OVERSIZED_LINE_BYTES", "1000000")])
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v))
                .collect();
        let engine = harness.engine(vendor, &section);
        let mut run = start(&engine, request("hi", &harness.cwd(), None)).await;
        let events = run.until_closed().await;
        assert_well_ordered(&events, true);
        let rendered = describe_all(&events);
        assert!(
            rendered.contains(&r#"A(completed oversized_line_0 warning "Oversized JSONL line skipped" false level=warning)"#.to_owned()),
            "{vendor}: {rendered:#?}"
        );
        assert!(completion(&events).ok, "{vendor}: {rendered:#?}");
    }
}

#[tokio::test]
async fn resume_lines_round_trip_for_every_engine() {
    let harness = Harness::new();
    let mut engines: Vec<Arc<dyn Engine>> = vec![Arc::new(echo())];
    engines.extend(build_cli_engines(&Default::default(), &harness.context()));
    assert_eq!(engines.len(), 6);
    for engine in &engines {
        let id = engine.id().to_string();
        let value = if id == "opencode" { "ses_7c1e2f3a4b5cXyZ" } else { "abc-123_XYZ" };
        let token = ResumeToken::new(id.clone(), value);
        let line = engine.format_resume(&token);
        assert!(line.starts_with('`') && line.ends_with('`'), "{id}: {line}");
        assert_eq!(engine.extract_resume(&line), Some(token.clone()), "{id}: {line}");
        assert_eq!(
            engine.extract_resume(&format!("To continue, run {line} later.")),
            Some(token.clone()),
            "{id}"
        );
        assert!(engine.is_resume_line(&line), "{id}: {line}");
        assert!(engine.is_resume_line(&format!("  {}  ", line.trim_matches('`'))), "{id}: {line}");
        assert!(!engine.is_resume_line(&format!("please {line}")), "{id}: {line}");
        assert!(!engine.is_resume_line(&format!("{line} now")), "{id}: {line}");
        for other in &engines {
            if other.id() != engine.id() {
                assert_eq!(
                    other.extract_resume(&line),
                    None,
                    "{} claims {id}'s line {line}",
                    other.id()
                );
            }
        }
    }
}

#[tokio::test]
async fn children_get_a_scrubbed_environment() {
    for vendor in Vendor::ALL {
        let mut harness = Harness::new();
        harness
            .api_keys
            .insert(vendor.id().to_owned(), lemon_engines::cli::ApiKey::new("sk-test-key"));
        let env_file = harness.file("env.json");
        let mut vars = fake_vars(
            &harness,
            vendor,
            None,
            &[("FAKE_CLI_ENV_FILE", &env_file.to_string_lossy())],
        );
        vars.push(("EXTRA_SETTING", "on".to_owned()));
        let args_file = harness.file("args");
        vars.push(("FAKE_CLI_ARGS_FILE", args_file.to_string_lossy().into_owned()));
        let engine = harness.engine(vendor, &section(&vars));
        let mut run = start(&engine, request("hi", &harness.cwd(), None)).await;
        run.until_closed().await;
        let env: std::collections::BTreeMap<String, String> =
            serde_json::from_str(&std::fs::read_to_string(&env_file).expect("env dump"))
                .expect("env JSON");
        assert!(
            !env.contains_key(GATEWAY_SECRET.0),
            "{vendor}: the gateway's secret leaked: {env:?}"
        );
        assert_eq!(env.get("PATH"), Some(&harness.fake.search_path()), "{vendor}");
        assert_eq!(
            env.get("HOME").map(String::as_str),
            Some(harness.home().to_string_lossy().as_ref())
        );
        assert_eq!(
            env.get("EXTRA_SETTING").map(String::as_str),
            Some("on"),
            "{vendor}: configured env"
        );
        let key_var = match vendor {
            Vendor::Claude => Some("ANTHROPIC_API_KEY"),
            Vendor::Codex => Some("OPENAI_API_KEY"),
            Vendor::Droid => Some("FACTORY_API_KEY"),
            Vendor::Opencode | Vendor::Pi => None,
        };
        if let Some(var) = key_var {
            assert_eq!(env.get(var).map(String::as_str), Some("sk-test-key"), "{vendor}");
        }
        if vendor == Vendor::Pi {
            assert_eq!(
                (env.get("NO_COLOR"), env.get("CI")),
                (Some(&"1".to_owned()), Some(&"1".to_owned()))
            );
        }
        let args = std::fs::read_to_string(&args_file).expect("args file");
        assert!(
            !args.contains("sk-test-key"),
            "{vendor}: the key is not on the command line or stdin"
        );
    }
}

#[tokio::test]
async fn a_missing_cli_is_unavailable_and_refuses_to_start() {
    let harness = Harness::new();
    let empty = tempfile::tempdir().expect("empty dir");
    let search_path = format!("{}:/nonexistent/bin", empty.path().display());
    let ctx = CliContext { search_path: Some(search_path.clone()), ..harness.context() };
    for engine in build_cli_engines(&Default::default(), &ctx) {
        let id = engine.id().to_string();
        let Availability::Unavailable { reason } = engine.availability() else {
            panic!("{id} is unavailable without its CLI")
        };
        let reason = reason.to_string();
        assert!(reason.contains(&format!("{id} not found on PATH")), "{reason}");
        assert!(reason.contains(&search_path), "the reason names where it looked: {reason}");
        let (sink, mut rx) = lemon_core::engine::EventSink::channel(8);
        let err = engine
            .start(request("hi", &harness.cwd(), None), sink)
            .await
            .expect_err("cannot start");
        assert!(
            matches!(&err, EngineError::Unavailable { engine, .. } if *engine == id),
            "{err:?}"
        );
        assert_eq!(rx.recv().await, None, "nothing was sent");
    }

    // A configured path that does not exist says so.
    let section =
        EngineSection { cli_path: Some("/opt/nowhere/claude".into()), ..EngineSection::default() };
    let engine = harness.engine(Vendor::Claude, &section);
    let Availability::Unavailable { reason } = engine.availability() else { panic!("unavailable") };
    let reason = reason.to_string();
    assert!(reason.contains("/opt/nowhere/claude"), "{reason}");
    // A bare name on the harness PATH is found.
    assert_eq!(
        harness.engine(Vendor::Codex, &EngineSection::default()).availability(),
        Availability::Available
    );
}

#[tokio::test]
async fn steer_is_unsupported_unless_configured() {
    let mut run = start(
        &EchoEngine::new(Duration::from_millis(50), TaskTracker::new()),
        request("a b c", Path::new("/"), None),
    )
    .await;
    assert_eq!(run.control.steer("more").await, Err(SteerError::Unsupported));
    run.control.cancel();
    run.until_closed().await;

    for vendor in Vendor::ALL {
        let harness = Harness::new();
        let vars = fake_vars(&harness, vendor, Some(1), &[("FAKE_CLI_HANG", "1")]);
        let mut section = section(&vars);
        // Steering is a Claude feature; other vendors ignore the key.
        section.steering = Some(vendor != Vendor::Claude);
        let engine = harness.engine(vendor, &section);
        assert!(!engine.capabilities().steer, "{vendor}");
        let mut run = start(&engine, request("hi", &harness.cwd(), None)).await;
        run.until(is_started).await;
        assert_eq!(run.control.steer("more").await, Err(SteerError::Unsupported), "{vendor}");
        run.control.cancel();
        run.until_closed().await;
    }
}
