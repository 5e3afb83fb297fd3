use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::lock::{EngineLock, LockKey};
use super::*;
use crate::bus::{BusEvent, EventKind, RunStatus, Subscription};
use crate::engine::Completion;
use crate::testing::{poll_until, FakeEngine};

mod cancel_tests;
mod lock_tests;
mod properties;

struct Harness {
    gateway: GatewayHandle,
    fake: FakeEngine,
    events: Subscription,
    token: CancellationToken,
    tracker: TaskTracker,
}

fn harness(config: RuntimeConfig) -> Harness {
    harness_with(config, FakeEngine::new("fake"))
}

fn harness_with(config: RuntimeConfig, fake: FakeEngine) -> Harness {
    let mut engines = EngineRegistry::new();
    engines.register(Arc::new(fake.clone())).unwrap();
    let bus = EventBus::new(65_536, 1024);
    let events = bus.subscribe_all();
    let token = CancellationToken::new();
    let tracker = TaskTracker::new();
    let deps = GatewayDeps { config, engines, store: StoreHandle::memory(), bus };
    let gateway = GatewayHandle::start(deps, token.clone(), &tracker);
    Harness { gateway, fake, events, token, tracker }
}

fn config(max: usize) -> RuntimeConfig {
    RuntimeConfig { max_concurrent_runs: max, ..RuntimeConfig::default() }
}

fn engine(raw: &str) -> crate::ids::EngineRef {
    raw.parse().unwrap()
}

fn request(session: &str, prompt: &str) -> ExecutionRequest {
    ExecutionRequest::new(session, engine("fake"), prompt)
}

/// Every event per run, until `n` runs have completed.
async fn collect(events: &mut Subscription, n: usize) -> HashMap<RunId, Vec<Arc<BusEvent>>> {
    let mut by_run: HashMap<RunId, Vec<Arc<BusEvent>>> = HashMap::new();
    let mut done = 0;
    while done < n {
        let event = tokio::time::timeout(Duration::from_secs(3600), events.recv())
            .await
            .expect("runs complete")
            .expect("no lag in tests");
        if matches!(event.kind, EventKind::RunCompleted { .. }) {
            done += 1;
        }
        by_run.entry(event.run_id.clone()).or_default().push(event);
    }
    by_run
}

fn completion(events: &[Arc<BusEvent>]) -> Completion {
    let completed: Vec<&Completion> = events
        .iter()
        .filter_map(|e| {
            if let EventKind::RunCompleted { completion, .. } = &e.kind {
                Some(completion)
            } else {
                None
            }
        })
        .collect();
    assert_eq!(completed.len(), 1, "exactly one run_completed");
    completed[0].clone()
}

fn types(events: &[Arc<BusEvent>]) -> Vec<&'static str> {
    events.iter().map(|e| e.kind.type_name()).collect()
}

fn error_code(completion: &Completion) -> Option<&str> {
    completion.error.as_ref().map(|e| e.code())
}

#[tokio::test(start_paused = true)]
async fn a_run_streams_its_events_in_order_and_answers_with_the_deltas() {
    let mut h = harness(config(2));
    let run_id = h.gateway.submit(request("s1", "ok hello big world")).await.unwrap();
    let events = collect(&mut h.events, 1).await.remove(&run_id).unwrap();
    assert_eq!(
        types(&events),
        [
            "run_started",
            "engine_started",
            "delta",
            "delta",
            "delta",
            "engine_completed",
            "run_completed"
        ]
    );
    let indices: Vec<u64> = events.iter().map(|e| e.index).collect();
    assert_eq!(indices, (1..=7).collect::<Vec<_>>());
    let seqs: Vec<u64> = events
        .iter()
        .filter_map(|e| if let EventKind::Delta { seq, .. } = e.kind { Some(seq) } else { None })
        .collect();
    assert_eq!(seqs, [1, 2, 3]);
    let done = completion(&events);
    assert!(done.ok);
    assert_eq!(done.answer, "hello big world ");
    assert_eq!(done.resume, Some(ResumeToken::new("fake", format!("{run_id}-session"))));

    let stored = h.gateway.store().get_run(run_id.as_str()).await.unwrap().unwrap();
    assert_eq!(stored.status, RunStatus::Completed);
    assert_eq!(stored.answer.as_deref(), Some("hello big world "));
    assert_eq!(h.gateway.store().run_events(run_id.as_str()).await.unwrap().len(), 7);
    assert_eq!(
        h.gateway.snapshot().await.unwrap().conversations,
        0,
        "drained conversation is gone"
    );
}

#[tokio::test(start_paused = true)]
async fn one_conversation_runs_in_submission_order_one_at_a_time() {
    let mut h = harness(config(10));
    let mut ids = Vec::new();
    for (i, delay) in [300, 100, 200, 0].iter().enumerate() {
        ids.push(h.gateway.submit(request("same", &format!("sleep:{delay} n{i}"))).await.unwrap());
    }
    let events = collect(&mut h.events, 4).await;
    assert_eq!(h.fake.started(), ["sleep:300 n0", "sleep:100 n1", "sleep:200 n2", "sleep:0 n3"]);
    assert_eq!(h.fake.max_per_session(), 1);
    for id in &ids {
        assert!(completion(&events[id]).ok);
    }
}

#[tokio::test(start_paused = true)]
async fn the_global_limit_caps_concurrent_runs() {
    let mut h = harness(config(2));
    for i in 0..10 {
        h.gateway.submit(request(&format!("s{i}"), "sleep:100 x")).await.unwrap();
    }
    let snapshot = h.gateway.snapshot().await.unwrap();
    assert_eq!((snapshot.in_flight, snapshot.max), (2, 2));
    assert_eq!(snapshot.queued, 8);
    collect(&mut h.events, 10).await;
    assert_eq!(h.fake.max_running(), 2);
    assert_eq!(h.fake.started().len(), 10);
}

#[tokio::test(start_paused = true)]
async fn zero_slots_queue_everything_until_resized() {
    let mut h = harness(config(0));
    let run_id = h.gateway.submit(request("s", "ok a")).await.unwrap();
    let snapshot = h.gateway.snapshot().await.unwrap();
    assert_eq!((snapshot.in_flight, snapshot.waitq, snapshot.queued), (0, 1, 1));
    let active = h.gateway.active_run(&run_id).await.unwrap().unwrap();
    assert_eq!(active.status, RunStatus::Queued);
    assert!(h.fake.started().is_empty());
    h.gateway.set_max_concurrent_runs(1).await.unwrap();
    let events = collect(&mut h.events, 1).await;
    assert!(completion(&events[&run_id]).ok);
}

#[tokio::test(start_paused = true)]
async fn paused_intake_queues_new_runs_lets_running_ones_finish_and_resume_starts_them_in_order() {
    let mut h = harness(config(4));
    let running = h.gateway.submit(request("a", "sleep:1000 first")).await.unwrap();
    h.gateway.set_paused(true).await.unwrap();
    let mut later = Vec::new();
    for (session, prompt) in [("a", "ok second"), ("b", "ok third"), ("c", "ok fourth")] {
        later.push(h.gateway.submit(request(session, prompt)).await.unwrap());
    }
    let snapshot = h.gateway.snapshot().await.unwrap();
    assert!(snapshot.paused);
    assert_eq!((snapshot.in_flight, snapshot.queued), (1, 3));
    // The run that had started finishes; nothing else starts, however long it waits.
    let events = collect(&mut h.events, 1).await;
    assert!(completion(&events[&running]).ok);
    tokio::time::sleep(Duration::from_secs(3600)).await;
    assert_eq!(h.fake.started(), ["sleep:1000 first"]);
    for id in &later {
        let active = h.gateway.active_run(id).await.unwrap().unwrap();
        assert_eq!(active.status, RunStatus::Queued);
    }
    h.gateway.set_paused(false).await.unwrap();
    let events = collect(&mut h.events, 3).await;
    for id in &later {
        assert!(completion(&events[id]).ok);
    }
    let mut resumed = h.fake.started()[1..].to_vec();
    resumed.sort();
    assert_eq!(resumed, ["ok fourth", "ok second", "ok third"]);
    assert!(!h.gateway.snapshot().await.unwrap().paused);
}

#[tokio::test(start_paused = true)]
async fn a_drain_while_paused_completes_the_queued_runs_as_shutting_down() {
    let mut h = harness(config(2));
    h.gateway.set_paused(true).await.unwrap();
    let queued = h.gateway.submit(request("a", "ok never")).await.unwrap();
    h.gateway.drain(Duration::from_secs(10)).await.unwrap();
    let events = collect(&mut h.events, 1).await;
    assert_eq!(error_code(&completion(&events[&queued])), Some("shutting_down"));
    assert!(h.fake.started().is_empty());
}

#[tokio::test(start_paused = true)]
async fn cancel_works_for_queued_and_running_runs_and_is_idempotent() {
    let mut h = harness(config(1));
    let running = h.gateway.submit(request("a", "hang")).await.unwrap();
    let queued = h.gateway.submit(request("b", "ok never")).await.unwrap();
    assert_eq!(
        h.gateway.cancel(&queued, RunError::UserRequested).await.unwrap(),
        CancelOutcome::Cancelling
    );
    assert_eq!(
        h.gateway.cancel(&queued, RunError::UserRequested).await.unwrap(),
        CancelOutcome::NotActive
    );
    let queued_events = collect(&mut h.events, 1).await.remove(&queued).unwrap();
    assert_eq!(types(&queued_events), ["run_completed"]);
    assert_eq!(error_code(&completion(&queued_events)), Some("user_requested"));

    // Wait until the hanging run is running, then cancel it.
    poll_until("the hanging run to be running", || async {
        h.gateway.active_run(&running).await.unwrap().unwrap().status == RunStatus::Running
    })
    .await;
    h.gateway.cancel(&running, RunError::UserRequested).await.unwrap();
    h.gateway.cancel(&running, RunError::Interrupted).await.unwrap();
    let events = collect(&mut h.events, 1).await.remove(&running).unwrap();
    let done = completion(&events);
    assert_eq!(error_code(&done), Some("user_requested"), "the first reason wins");
    assert!(!h.fake.started().contains(&"ok never".to_owned()));
    assert_eq!(
        h.gateway.store().get_run(queued.as_str()).await.unwrap().unwrap().status,
        RunStatus::Cancelled
    );
    assert_eq!(h.gateway.snapshot().await.unwrap().in_flight, 0);
}

#[tokio::test(start_paused = true)]
async fn an_engine_that_dies_still_completes_once_and_frees_its_slot() {
    let mut h = harness(config(1));
    let cases = [
        ("crash a b", "engine_crashed"),
        ("taskpanic", "engine_crashed"),
        ("panic", "engine_crashed"),
        ("startfail", "start_failed"),
        ("fail x", "engine_error"),
    ];
    let mut ids = Vec::new();
    for (prompt, _) in cases {
        ids.push(h.gateway.submit(request("s", prompt)).await.unwrap());
    }
    let after = h.gateway.submit(request("s", "ok still works")).await.unwrap();
    let events = collect(&mut h.events, cases.len() + 1).await;
    for (id, (prompt, code)) in ids.iter().zip(cases) {
        let done = completion(&events[id]);
        assert!(!done.ok, "{prompt}");
        assert_eq!(error_code(&done), Some(code), "{prompt}");
    }
    assert_eq!(completion(&events[&ids[0]]).answer, "a b ", "partial text is the answer");
    assert!(completion(&events[&after]).ok);
    assert_eq!(h.gateway.snapshot().await.unwrap().in_flight, 0);
}

#[tokio::test(start_paused = true)]
async fn a_silent_engine_times_out() {
    let mut h =
        harness(RuntimeConfig { run_inactivity_timeout: Duration::from_secs(5), ..config(1) });
    let run_id = h.gateway.submit(request("s", "hang")).await.unwrap();
    let done = completion(&collect(&mut h.events, 1).await[&run_id]);
    assert_eq!(error_code(&done), Some("timeout"));
    assert_eq!(h.fake.running(), 0, "the engine was cancelled");
}

#[tokio::test(start_paused = true)]
async fn a_run_waiting_for_its_owner_does_not_time_out() {
    let mut h =
        harness(RuntimeConfig { run_inactivity_timeout: Duration::from_secs(5), ..config(1) });
    // Ten minutes with an approval open and no other event, then done.
    let run_id = h.gateway.submit(request("s", "approval:600000 done")).await.unwrap();
    let done = completion(&collect(&mut h.events, 1).await[&run_id]);
    assert!(done.ok, "{done:?}");
    assert_eq!(done.answer, "done ");
}

fn resumed(session: &str, prompt: &str, token: &str) -> ExecutionRequest {
    let mut req = request(session, prompt);
    req.resume = Some(ResumeToken::new("fake", token));
    req
}

#[tokio::test(start_paused = true)]
async fn the_engine_lock_serialises_runs_sharing_a_resume_token() {
    let mut h = harness(config(10));
    h.gateway.submit(resumed("a", "sleep:100 x", "tok")).await.unwrap();
    h.gateway.submit(resumed("b", "sleep:100 y", "tok")).await.unwrap();
    collect(&mut h.events, 2).await;
    assert_eq!(h.fake.max_running(), 1);

    let mut h = harness(RuntimeConfig { require_engine_lock: false, ..config(10) });
    h.gateway.submit(resumed("a", "sleep:100 x", "tok")).await.unwrap();
    h.gateway.submit(resumed("b", "sleep:100 y", "tok")).await.unwrap();
    collect(&mut h.events, 2).await;
    assert_eq!(h.fake.max_running(), 2, "require_engine_lock = false is honoured");
}

#[tokio::test(start_paused = true)]
async fn a_lock_wait_times_out_without_blocking_other_runs() {
    let config = RuntimeConfig { engine_lock_timeout: Duration::from_millis(50), ..config(10) };
    let mut h = harness(config);
    let holder = h.gateway.submit(resumed("a", "hang", "tok")).await.unwrap();
    let waiter = h.gateway.submit(resumed("b", "ok y", "tok")).await.unwrap();
    let other = h.gateway.submit(request("c", "ok z")).await.unwrap();
    let events = collect(&mut h.events, 2).await;
    assert_eq!(types(&events[&waiter]), ["run_completed"], "no run_started without the lock");
    assert_eq!(error_code(&completion(&events[&waiter])), Some("lock_timeout"));
    assert!(completion(&events[&other]).ok);
    h.gateway.cancel(&holder, RunError::UserRequested).await.unwrap();
    collect(&mut h.events, 1).await;
}

#[tokio::test(start_paused = true)]
async fn steering_reaches_engines_that_support_it() {
    let mut h = harness(config(2));
    let run_id = h.gateway.submit(request("s", "hang")).await.unwrap();
    poll_until("the engine to start", || async { h.fake.running() > 0 }).await;
    assert_eq!(h.gateway.steer(&run_id, "more").await, Err(SteerError::Unsupported));
    h.gateway.cancel(&run_id, RunError::UserRequested).await.unwrap();
    collect(&mut h.events, 1).await;
    assert_eq!(h.gateway.steer(&run_id, "late").await, Err(SteerError::Finished));

    let mut h = harness_with(config(2), FakeEngine::new("fake").with_steering());
    let run_id = h.gateway.submit(request("s", "hang")).await.unwrap();
    poll_until("the engine to start", || async { h.fake.running() > 0 }).await;
    // The control is registered right after start returns.
    let mut outcome = h.gateway.steer(&run_id, "more").await;
    for _ in 0..crate::testing::MAX_POLLS {
        if outcome != Err(SteerError::Finished) {
            break;
        }
        tokio::task::yield_now().await;
        outcome = h.gateway.steer(&run_id, "more").await;
    }
    assert_eq!(outcome, Ok(()));
    assert_eq!(h.fake.steered(), ["more"]);
    h.gateway.cancel(&run_id, RunError::UserRequested).await.unwrap();
    collect(&mut h.events, 1).await;
}

#[tokio::test(start_paused = true)]
async fn submit_errors_are_typed_and_queue_nothing() {
    let h = harness(RuntimeConfig { max_pending_runs: 1, ..config(0) });
    let unknown = ExecutionRequest::new("s", engine("nope"), "x");
    assert_eq!(
        h.gateway.submit(unknown).await,
        Err(SubmitError::UnknownEngine { engine: "nope".into() })
    );
    let mut first = request("s", "ok");
    first.run_id = RunId::parse("mine");
    assert_eq!(h.gateway.submit(first.clone()).await.unwrap().as_str(), "mine");
    assert_eq!(
        h.gateway.submit(first).await,
        Err(SubmitError::DuplicateRunId { run_id: "mine".into() })
    );
    assert_eq!(
        h.gateway.submit(request("t", "ok")).await,
        Err(SubmitError::Overloaded { pending: 1 })
    );
    assert_eq!(h.gateway.snapshot().await.unwrap().queued, 1);
}

#[tokio::test(start_paused = true)]
async fn composite_engine_ids_resolve_to_their_prefix() {
    let mut h = harness(config(1));
    let run_id =
        h.gateway.submit(ExecutionRequest::new("s", engine("fake:big"), "ok a")).await.unwrap();
    let events = collect(&mut h.events, 1).await.remove(&run_id).unwrap();
    assert!(
        matches!(&events[0].kind, EventKind::RunStarted { engine, model } if engine == "fake" && model.as_deref() == Some("big"))
    );
}

#[tokio::test(start_paused = true)]
async fn drain_lets_runs_finish_within_the_grace_then_cancels_the_rest() {
    let mut h = harness(config(2));
    let quick = h.gateway.submit(request("a", "sleep:100 done")).await.unwrap();
    let stuck = h.gateway.submit(request("b", "hang")).await.unwrap();
    let queued = h.gateway.submit(request("c", "ok never")).await.unwrap();
    h.gateway.drain(Duration::from_secs(10)).await.unwrap();
    let events = collect(&mut h.events, 3).await;
    assert!(completion(&events[&quick]).ok);
    assert_eq!(error_code(&completion(&events[&stuck])), Some("shutting_down"));
    assert_eq!(error_code(&completion(&events[&queued])), Some("shutting_down"));
    assert_eq!(h.gateway.submit(request("d", "ok")).await, Err(SubmitError::ShuttingDown));
    h.token.cancel();
    h.tracker.close();
    h.tracker.wait().await;
    assert_eq!(h.fake.running(), 0);
    assert_eq!(h.gateway.snapshot().await, Err(ShuttingDown));
}

/// A request its caller journaled (the router's) is left queued by a drain, to run
/// at the next start; one nobody journaled still completes `shutting_down`.
#[tokio::test(start_paused = true)]
async fn drain_leaves_journaled_requests_queued_for_the_next_start() {
    let mut h = harness(config(1));
    let running = h.gateway.submit(request("a", "sleep:100 done")).await.unwrap();
    let kept = h
        .gateway
        .submit(ExecutionRequest { journaled: true, ..request("b", "ok later") })
        .await
        .unwrap();
    let unjournaled = h.gateway.submit(request("c", "ok never")).await.unwrap();
    h.gateway.drain(Duration::from_secs(10)).await.unwrap();
    let events = collect(&mut h.events, 2).await;
    assert!(completion(&events[&running]).ok);
    assert_eq!(error_code(&completion(&events[&unjournaled])), Some("shutting_down"));
    assert!(!events.contains_key(&kept));
    h.token.cancel();
    h.tracker.close();
    h.tracker.wait().await;
    while let Ok(Some(event)) = h.events.try_recv() {
        assert_ne!(event.run_id, kept, "no event for the kept request: {:?}", event.kind);
    }
    let row = h.gateway.store().get_run(kept.as_str()).await.unwrap().unwrap();
    assert_eq!(row.status, RunStatus::Queued);
    assert_eq!(h.fake.started(), ["sleep:100 done"]);
}

#[tokio::test(start_paused = true)]
async fn a_slow_subscriber_lags_but_never_blocks_runs() {
    let mut engines = EngineRegistry::new();
    engines.register(Arc::new(FakeEngine::new("fake"))).unwrap();
    let bus = EventBus::new(4, 4);
    let mut slow = bus.subscribe_all();
    let mut watcher = bus.subscribe_all();
    let tracker = TaskTracker::new();
    let deps = GatewayDeps { config: config(4), engines, store: StoreHandle::memory(), bus };
    let gateway = GatewayHandle::start(deps, CancellationToken::new(), &tracker);
    let run_id = gateway.submit(request("s", "ok a b c d e f g h")).await.unwrap();
    // The watcher reads as fast as it can; the run completes regardless.
    let mut completed = false;
    while !completed {
        match watcher.recv().await {
            Ok(event) => completed = matches!(event.kind, EventKind::RunCompleted { .. }),
            Err(crate::bus::RecvError::Lagged(_)) => {}
            Err(crate::bus::RecvError::Closed) => panic!("bus closed"),
        }
    }
    assert!(matches!(slow.recv().await, Err(crate::bus::RecvError::Lagged(_))));
    assert_eq!(
        gateway.store().get_run(run_id.as_str()).await.unwrap().unwrap().status,
        RunStatus::Completed
    );
}

#[test]
fn cwd_falls_back_from_request_to_default_to_home() {
    let dir = std::env::temp_dir();
    let home = dir.join("lemon-home-for-cwd-test");
    let config = RuntimeConfig { home_dir: Some(dir.clone()), ..RuntimeConfig::default() };
    assert_eq!(run::resolve_cwd(Some(std::path::Path::new("~/x")), &config), dir.join("x"));
    assert_eq!(
        run::resolve_cwd(Some(std::path::Path::new("/abs")), &config),
        PathBuf::from("/abs")
    );
    let with_default = RuntimeConfig { default_cwd: Some(dir.clone()), ..config.clone() };
    assert_eq!(run::resolve_cwd(None, &with_default), dir);
    let missing_default =
        RuntimeConfig { default_cwd: Some(home.join("missing")), ..config.clone() };
    assert_eq!(run::resolve_cwd(None, &missing_default), dir, "missing default falls back to home");
}

#[test]
fn an_unused_lock_table_is_empty() {
    let lock = EngineLock::new(Duration::from_secs(1));
    assert_eq!(lock.n_held(), 0);
    assert_eq!(lock.n_waiting(&LockKey::Session("s".into())), 0);
}

#[tokio::test]
async fn files_sent_with_a_request_land_in_the_runs_uploads_and_the_prompt_names_them() {
    let tmp = tempfile::tempdir().unwrap();
    let (home, project) = (tmp.path().join("home"), tmp.path().join("project"));
    std::fs::create_dir_all(&project).unwrap();
    let stage = crate::media::MediaStage::new(home.join("media"));
    let config = RuntimeConfig {
        default_cwd: Some(project.clone()),
        off_limits: crate::contain::OffLimits::new([home.clone()], []),
        media_stage: Some(stage.clone()),
        ..config(1)
    };
    let mut h = harness(config);
    let files = crate::media::FilesConfig::default();
    let pdf = stage.keep(&files, Some("report.pdf"), "x", None, b"%PDF-1.7").unwrap();
    let staged = pdf.path.clone();
    let mut req = request("s1", "ok read it");
    crate::media::add_attachments(&mut req.meta, &[pdf]);
    let run_id = h.gateway.submit(req).await.unwrap();
    let events = collect(&mut h.events, 1).await.remove(&run_id).unwrap();
    assert!(completion(&events).ok);
    let prompt = h.fake.started().remove(0);
    assert!(
        prompt.starts_with("ok read it\n\n[Files sent with this message")
            && prompt.contains("- .lemon/uploads/report.pdf (file, application/pdf, 8 bytes)"),
        "{prompt}"
    );
    assert_eq!(std::fs::read(project.join(".lemon/uploads/report.pdf")).unwrap(), b"%PDF-1.7");
    assert!(!staged.exists(), "the stage keeps nothing once the file is placed");
    // Channels learn the same directory for `/file get`.
    let dir = h.gateway.run_dir(None).await.unwrap().unwrap();
    assert_eq!(dir, project);
}
