//! The router over a real gateway and the fake engine, in paused time: queue
//! modes end to end, resume and chat state, engine selection, slash commands,
//! cancels, the idle watchdog and phases.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::*;
use crate::bus::{BusEvent, EventBus, EventKind, RecvError, RunPhase, Subscription};
use crate::engine::{
    Completion, Engine, EngineError, EngineEvent, EngineRegistry, EventSink, RunControl, RunError,
    StartRequest,
};
use crate::gateway::{GatewayDeps, RuntimeConfig};
use crate::ids::EngineId;
use crate::store::StoreHandle;
use crate::testing::{poll_until, FakeEngine};

mod cluster;
mod follow;
mod properties;
mod retry;
mod timing;

/// Always fails as if the model's context overflowed, after reporting a session.
#[derive(Debug)]
struct OverflowEngine {
    id: EngineId,
}

#[derive(Debug)]
struct NoControl;

/// An engine whose program is not installed.
#[derive(Debug)]
struct MissingEngine {
    id: EngineId,
}

#[async_trait]
impl Engine for MissingEngine {
    fn id(&self) -> &EngineId {
        &self.id
    }

    fn availability(&self) -> crate::engine::Availability {
        crate::engine::Availability::Unavailable {
            reason: crate::engine::UnavailableReason::NotFound {
                program: "missing".to_owned(),
                search_path: "/usr/bin".to_owned(),
            },
        }
    }

    async fn start(
        &self,
        _req: StartRequest,
        _sink: EventSink,
    ) -> Result<Arc<dyn RunControl>, EngineError> {
        Err(EngineError::Start("not installed".to_owned()))
    }
}

impl RunControl for NoControl {
    fn cancel(&self) {}
}

#[async_trait]
impl Engine for OverflowEngine {
    fn id(&self) -> &EngineId {
        &self.id
    }

    async fn start(
        &self,
        req: StartRequest,
        sink: EventSink,
    ) -> Result<Arc<dyn RunControl>, EngineError> {
        let resume = Some(ResumeToken::new("overflow", format!("{}-session", req.run_id)));
        let error = RunError::ContextOverflow {
            message: "Codex error: context_length_exceeded".to_owned(),
        };
        tokio::spawn(async move {
            let _ = sink.send(EngineEvent::Completed(Completion::failure(error, resume))).await;
        });
        Ok(Arc::new(NoControl))
    }
}

pub(super) struct Harness {
    pub(super) router: RouterHandle,
    pub(super) fake: FakeEngine,
    pub(super) store: StoreHandle,
    pub(super) events: Subscription,
    pub(super) gateway: GatewayHandle,
    token: CancellationToken,
    tracker: TaskTracker,
}

impl Harness {
    /// Stops everything at once, as a crash would, and waits until every task
    /// has ended; the store and the fake engine stay for the next start.
    pub(super) async fn stop(&mut self) {
        self.token.cancel();
        self.tracker.close();
        crate::testing::within("the harness to stop", self.tracker.wait()).await;
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        self.token.cancel();
    }
}

pub(super) fn router_config() -> RouterConfig {
    RouterConfig { default_engine: "fake".parse().unwrap(), ..RouterConfig::default() }
}

pub(super) async fn harness(config: RouterConfig) -> Harness {
    harness_with(config, FakeEngine::new("fake").with_steering(), StoreHandle::memory()).await
}

pub(super) async fn harness_with(
    config: RouterConfig,
    fake: FakeEngine,
    store: StoreHandle,
) -> Harness {
    let mut engines = EngineRegistry::new();
    engines.register(Arc::new(fake.clone())).unwrap();
    engines.register(Arc::new(FakeEngine::new("plain"))).unwrap();
    engines
        .register(Arc::new(OverflowEngine { id: EngineId::parse("overflow").unwrap() }))
        .unwrap();
    engines.register(Arc::new(MissingEngine { id: EngineId::parse("missing").unwrap() })).unwrap();
    let bus = EventBus::new(65_536, 1024);
    let events = bus.subscribe_all();
    let token = CancellationToken::new();
    let tracker = TaskTracker::new();
    let runtime = RuntimeConfig { max_concurrent_runs: 4, ..RuntimeConfig::default() };
    let deps = GatewayDeps { config: runtime, engines, store: store.clone(), bus };
    let gateway = GatewayHandle::start(deps, token.clone(), &tracker);
    let router = RouterHandle::start(config, gateway.clone(), token.clone(), &tracker);
    Harness { router, fake, store, events, gateway, token, tracker }
}

pub(super) fn request(session: &str, prompt: &str, mode: Option<QueueMode>) -> RunRequest {
    RunRequest { queue_mode: mode, ..RunRequest::new(session, prompt) }
}

impl Harness {
    pub(super) async fn submit(
        &self,
        session: &str,
        prompt: &str,
        mode: Option<QueueMode>,
    ) -> RunId {
        self.submit_req(request(session, prompt, mode)).await
    }

    pub(super) async fn submit_req(&self, req: RunRequest) -> RunId {
        match self.router.submit(req).await.unwrap() {
            Submitted::Run(accepted, _) => accepted.run_id,
            other => panic!("expected a run, got {other:?}"),
        }
    }

    async fn command(&self, session: &str, text: &str) -> String {
        match self.router.submit(RunRequest::new(session, text)).await.unwrap() {
            Submitted::Command { reply, .. } => reply,
            other => panic!("expected a command reply, got {other:?}"),
        }
    }

    /// Waits for the first event matching `wanted` on the firehose.
    pub(super) async fn until(&mut self, wanted: impl Fn(&BusEvent) -> bool) -> Arc<BusEvent> {
        let wait = async {
            loop {
                match self.events.recv().await {
                    Ok(event) if wanted(&event) => return event,
                    Ok(_) => {}
                    Err(RecvError::Lagged(n)) => panic!("test subscriber lagged by {n}"),
                    Err(RecvError::Closed) => panic!("bus closed"),
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(24 * 3600), wait).await.expect("event arrives")
    }

    /// Waits for `n` completions and returns them by run id, in order of arrival.
    pub(super) async fn completions(&mut self, n: usize) -> Vec<(RunId, Completion)> {
        let mut out = Vec::new();
        while out.len() < n {
            let event = self.until(|e| matches!(e.kind, EventKind::RunCompleted { .. })).await;
            if let EventKind::RunCompleted { completion, .. } = &event.kind {
                out.push((event.run_id.clone(), completion.clone()));
            }
        }
        out
    }

    pub(super) async fn completion_of(&mut self, run_id: &RunId) -> Completion {
        let event = self
            .until(|e| &e.run_id == run_id && matches!(e.kind, EventKind::RunCompleted { .. }))
            .await;
        match &event.kind {
            EventKind::RunCompleted { completion, .. } => completion.clone(),
            _ => unreachable!("filtered above"),
        }
    }

    /// Waits until the router has handled the end of a run it dispatched (its
    /// terminal phase is published while the router records the session).
    pub(super) async fn settled(&mut self, run_id: &RunId) {
        self.until(|e| {
            &e.run_id == run_id
                && matches!(
                    e.kind,
                    EventKind::Phase(RunPhase::Completed | RunPhase::Failed | RunPhase::Aborted)
                )
        })
        .await;
    }

    async fn started(&mut self, run_id: &RunId) {
        self.until(|e| &e.run_id == run_id && matches!(e.kind, EventKind::EngineStarted { .. }))
            .await;
    }
}

fn code(completion: &Completion) -> Option<&str> {
    completion.error.as_ref().map(RunError::code)
}

#[tokio::test(start_paused = true)]
async fn collect_runs_messages_one_after_another_in_order() {
    let mut h = harness(router_config()).await;
    let first = h.submit("s", "sleep:100 one", None).await;
    let second = h.submit("s", "ok two", None).await;
    let third = h.submit("s", "ok three", None).await;
    let done = h.completions(3).await;
    let order: Vec<&RunId> = done.iter().map(|(id, _)| id).collect();
    assert_eq!(order, [&first, &second, &third]);
    assert!(done.iter().all(|(_, c)| c.ok));
    assert_eq!(h.fake.started(), ["sleep:100 one", "ok two", "ok three"]);
    assert_eq!(h.fake.max_per_session(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_queued_run_is_visible_as_queued_before_it_starts() {
    let mut h = harness(router_config()).await;
    let busy = h.submit("s", "hang", None).await;
    let waiting = h.submit("s", "ok later", None).await;
    let record =
        h.store.get_run(waiting.as_str()).await.unwrap().expect("row written at acceptance");
    assert_eq!(record.status, crate::bus::RunStatus::Queued);
    assert_eq!(
        h.router.session(&SessionKey::from("s")).await.unwrap().queued,
        std::slice::from_ref(&waiting)
    );
    assert!(h.router.abort_run(&busy).await.unwrap());
    assert!(h.completion_of(&waiting).await.ok);
}

#[tokio::test(start_paused = true)]
async fn phases_follow_the_graph_for_an_immediate_and_a_queued_run() {
    let mut h = harness(router_config()).await;
    let first = h.submit("s", "sleep:10 a b", None).await;
    let second = h.submit("s", "ok c", None).await;
    let mut phases: HashMap<RunId, Vec<RunPhase>> = HashMap::new();
    loop {
        let event = h.until(|e| matches!(e.kind, EventKind::Phase(_))).await;
        if let EventKind::Phase(phase) = event.kind {
            phases.entry(event.run_id.clone()).or_default().push(phase);
            if event.run_id == second && phase == RunPhase::Completed {
                break;
            }
        }
    }
    use RunPhase::*;
    assert_eq!(phases[&first], [Accepted, WaitingForSlot, Dispatched, Streaming, Completed]);
    assert_eq!(
        phases[&second],
        [Accepted, QueuedInSession, WaitingForSlot, Dispatched, Streaming, Completed]
    );
    let stored = h.store.run_events(first.as_str()).await.unwrap();
    assert!(stored.iter().all(|e| e.kind != "run_phase"), "phases are not stored");
}

#[tokio::test(start_paused = true)]
async fn followups_sent_together_become_one_turn() {
    let mut h = harness(router_config()).await;
    let busy = h.submit("s", "hang", None).await;
    let first = h.submit("s", "ok fix the test", Some(QueueMode::Followup)).await;
    let second = h.submit("s", "and the docs", Some(QueueMode::Followup)).await;
    let merged = h.completion_of(&first).await;
    assert_eq!(code(&merged), Some("merged"));
    assert_eq!(merged.error, Some(RunError::Merged { into: second.clone() }));
    h.router.abort_run(&busy).await.unwrap();
    assert!(h.completion_of(&second).await.ok);
    assert_eq!(h.fake.started(), ["hang", "ok fix the test\nand the docs"]);
}

#[tokio::test(start_paused = true)]
async fn steer_goes_into_the_live_run_and_completes_with_it() {
    let mut h = harness(router_config()).await;
    let busy = h.submit("s", "hang", None).await;
    h.started(&busy).await;
    let steer = h.submit("s", "also check the logs", Some(QueueMode::Steer)).await;
    h.until(|e| e.run_id == steer && matches!(e.kind, EventKind::Phase(RunPhase::Accepted))).await;
    // Wait until the router has the engine's answer: the session shows no pending steer.
    poll_until("the engine's answer to the steer", || async {
        h.router.session(&SessionKey::from("s")).await.unwrap().pending_steers == 0
    })
    .await;
    assert_eq!(h.fake.steered(), ["also check the logs"]);
    h.router.abort_run(&busy).await.unwrap();
    let done = h.completions(2).await;
    let ids: Vec<&RunId> = done.iter().map(|(id, _)| id).collect();
    assert_eq!(ids, [&busy, &steer]);
    assert_eq!(code(&done[1].1), Some("user_requested"), "the steer shares its run's end");
    assert_eq!(h.fake.started(), ["hang"], "a taken steer never runs on its own");
}

#[tokio::test(start_paused = true)]
async fn a_refused_steer_runs_as_a_followup() {
    let mut h = harness(router_config()).await;
    let busy = h
        .submit_req(RunRequest {
            engine: Some("plain".parse().unwrap()),
            ..request("s", "hang", None)
        })
        .await;
    h.started(&busy).await;
    let steer = h.submit("s", "ok instead", Some(QueueMode::Steer)).await;
    poll_until("the refused steer to be queued", || async {
        h.router.session(&SessionKey::from("s")).await.unwrap().queued
            == std::slice::from_ref(&steer)
    })
    .await;
    h.router.abort_run(&busy).await.unwrap();
    assert!(h.completion_of(&steer).await.ok);
}

#[tokio::test(start_paused = true)]
async fn interrupt_cancels_the_active_run_and_runs_next_keeping_the_queue() {
    let mut h = harness(router_config()).await;
    let busy = h.submit("s", "hang", None).await;
    let queued = h.submit("s", "ok queued", None).await;
    let urgent = h.submit("s", "ok urgent", Some(QueueMode::Interrupt)).await;
    let done = h.completions(3).await;
    assert_eq!(done[0].0, busy);
    assert_eq!(code(&done[0].1), Some("interrupted"));
    assert_eq!((&done[1].0, &done[2].0), (&urgent, &queued));
    assert_eq!(h.fake.started(), ["hang", "ok urgent", "ok queued"]);
}

#[tokio::test(start_paused = true)]
async fn a_full_queue_drops_with_queue_overflow() {
    let config = RouterConfig {
        limits: Limits { cap: Some(1), drop: Some(crate::config::DropPolicy::Oldest) },
        ..router_config()
    };
    let mut h = harness(config).await;
    let busy = h.submit("s", "hang", None).await;
    let old = h.submit("s", "ok old", None).await;
    let new = h.submit("s", "ok new", None).await;
    let dropped = h.completion_of(&old).await;
    assert_eq!(code(&dropped), Some("queue_overflow"));
    assert!(!dropped.ok);
    h.router.abort_run(&busy).await.unwrap();
    assert!(h.completion_of(&new).await.ok);
}

#[tokio::test(start_paused = true)]
async fn sessions_continue_automatically_until_new() {
    let mut h = harness(router_config()).await;
    let first = h.submit("s", "ok hello", None).await;
    let done = h.completion_of(&first).await;
    h.settled(&first).await;
    let token = done.resume.clone().expect("fake reports a session");
    let state = h
        .store
        .get_chat_state(&SessionKey::from("s"), crate::clock::now_ms())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (state.last_engine.as_str(), state.last_resume_token.as_str()),
        ("fake", token.value.as_str())
    );
    let second = h.submit("s", "ok again", None).await;
    h.completion_of(&second).await;
    let record = h.store.get_run(second.as_str()).await.unwrap().unwrap();
    assert_eq!(record.meta["resume_source"], "auto");
    assert_eq!(h.command("s", "/new").await, "The next message starts a new session.");
    let third = h.submit("s", "ok fresh", None).await;
    h.completion_of(&third).await;
    let record = h.store.get_run(third.as_str()).await.unwrap().unwrap();
    assert!(record.meta.get("resume_source").is_none());
}

#[tokio::test(start_paused = true)]
async fn a_queued_message_continues_the_session_its_predecessor_started() {
    let mut h = harness(router_config()).await;
    let first = h.submit("s", "sleep:50 hello", None).await;
    let second = h.submit("s", "ok again", None).await;
    h.completions(2).await;
    let record = h.store.get_run(second.as_str()).await.unwrap().unwrap();
    assert_eq!(record.meta["resume_source"], "auto", "resume is read when {first} is done");
}

#[tokio::test(start_paused = true)]
async fn disable_auto_resume_starts_fresh() {
    let mut h = harness(router_config()).await;
    let first = h.submit("s", "ok hello", None).await;
    h.completion_of(&first).await;
    let mut req = request("s", "ok fresh", None);
    req.flags.no_auto_resume = true;
    let second = h.submit_req(req).await;
    h.completion_of(&second).await;
    let record = h.store.get_run(second.as_str()).await.unwrap().unwrap();
    assert!(record.meta.get("resume_source").is_none());
}

#[tokio::test(start_paused = true)]
async fn an_explicit_resume_line_continues_that_session_on_its_engine() {
    let mut h = harness(router_config()).await;
    let req = RunRequest {
        engine: Some("plain".parse().unwrap()),
        ..request("s", "fake resume abc\nok go on", None)
    };
    let run = match h.router.submit(req).await.unwrap() {
        Submitted::Run(accepted, _) => accepted,
        other => panic!("{other:?}"),
    };
    assert_eq!(run.conversation.as_str(), "resume:fake:abc");
    assert_eq!(run.engine, "fake", "the token's engine wins over a hint");
    h.completion_of(&run.run_id).await;
    assert_eq!(h.fake.started(), ["ok go on"]);
    let record = h.store.get_run(run.run_id.as_str()).await.unwrap().unwrap();
    assert_eq!(record.meta["resume_source"], "explicit");
}

#[tokio::test(start_paused = true)]
async fn a_context_overflow_forgets_the_session() {
    let mut h = harness(router_config()).await;
    let first = h.submit("s", "ok hello", None).await;
    h.settled(&first).await;
    assert!(h
        .store
        .get_chat_state(&SessionKey::from("s"), crate::clock::now_ms())
        .await
        .unwrap()
        .is_some());
    let req = RunRequest {
        flags: RequestFlags { no_auto_resume: true, ..RequestFlags::default() },
        ..request("s", "/overflow too much", None)
    };
    let second = h.submit_req(req).await;
    let done = h.completion_of(&second).await;
    assert!(done.resume.is_some(), "the engine reported a session");
    h.settled(&second).await;
    // The router handles the run's end completely before the next message.
    let _ = h.command("s", "/status").await;
    assert_eq!(
        h.store.get_chat_state(&SessionKey::from("s"), crate::clock::now_ms()).await.unwrap(),
        None
    );
}

#[tokio::test(start_paused = true)]
async fn directives_and_sticky_engines_pick_the_engine() {
    let mut h = harness(router_config()).await;
    let accepted = match h.router.submit(RunRequest::new("s", "/plain ok hi")).await.unwrap() {
        Submitted::Run(accepted, _) => accepted,
        other => panic!("{other:?}"),
    };
    assert_eq!(accepted.engine, "plain");
    h.completion_of(&accepted.run_id).await;
    // The list of engines is new in the answer to an unknown one.
    assert_eq!(
        h.command("s", "/engine nope").await,
        "Unknown engine nope. The engines are fake, missing, overflow, plain."
    );
    assert_eq!(
        h.command("s", "/engine missing").await,
        "missing is not available: not found on PATH; set cli_path. This session keeps plain."
    );
    assert_eq!(h.command("s", "/engine plain").await, "This session now uses plain.");
    assert_eq!(
        h.command("s", "/engine").await,
        "This session uses plain.\nEngines:\nfake: available\nmissing: not available (not found on PATH; set cli_path)\noverflow: available\nplain: available\nChoose one with /engine <name>."
    );
    let next = match h.router.submit(RunRequest::new("s", "ok again")).await.unwrap() {
        Submitted::Run(accepted, _) => accepted,
        other => panic!("{other:?}"),
    };
    assert_eq!(next.engine, "plain");
    h.completion_of(&next.run_id).await;
    assert!(h.fake.started().is_empty(), "the default engine ran nothing");
}

#[tokio::test(start_paused = true)]
async fn an_unknown_engine_is_refused_with_its_name() {
    let h = harness(router_config()).await;
    let err = h
        .router
        .submit(RunRequest { engine: Some("nope".parse().unwrap()), ..RunRequest::new("s", "hi") })
        .await
        .map(drop);
    // The engines there are are listed (new with the list).
    let known: Vec<String> =
        ["fake", "missing", "overflow", "plain"].into_iter().map(str::to_owned).collect();
    assert_eq!(
        err,
        Err(RouteError::UnknownEngine { engine: "nope".to_owned(), known: known.clone() })
    );
    let err = h.router.submit(RunRequest::new("s", "/claude fix it")).await.map(drop);
    assert_eq!(err, Err(RouteError::UnknownEngine { engine: "claude".to_owned(), known }));
    assert_eq!(
        err.unwrap_err().to_string(),
        "unknown engine \"claude\"; the engines are fake, missing, overflow, plain"
    );
}

#[tokio::test(start_paused = true)]
async fn native_only_refuses_vendor_resume_lines() {
    let config = RouterConfig { native_only: true, ..router_config() };
    let h = harness(config).await;
    let err = h.router.submit(RunRequest::new("s", "fake resume abc")).await.unwrap_err();
    assert_eq!(err.to_string(), resolve::NATIVE_ONLY_RESUME_MESSAGE);
}

#[tokio::test(start_paused = true)]
async fn a_caller_run_id_submitted_twice_is_one_run() {
    let mut h = harness(router_config()).await;
    let id = RunId::parse("job-1").unwrap();
    let req = RunRequest { run_id: Some(id.clone()), ..RunRequest::new("s", "sleep:10 once") };
    let first = h.router.submit(req.clone()).await.unwrap();
    let second = h.router.submit(req).await.unwrap();
    let (Submitted::Run(first, _), Submitted::Run(second, _)) = (first, second) else {
        panic!("runs")
    };
    assert!(!first.duplicate);
    assert!(second.duplicate);
    assert_eq!(second.run_id, id);
    h.completion_of(&id).await;
    assert_eq!(h.fake.started(), ["sleep:10 once"]);
}

/// A submit the store could not confirm is refused, but the store may keep
/// it and commit it later (a database that went away and came back). The
/// caller's retry with the same run id is then that run: accepted, it runs
/// and answers once.
#[tokio::test(start_paused = true)]
async fn a_retry_after_an_unconfirmed_admission_is_the_same_run_and_runs_once() {
    let memory =
        Arc::new(crate::store::memory::MemoryStore::new(crate::store::DEFAULT_CHAT_STATE_TTL_MS));
    let store = StoreHandle::new(memory.clone());
    let mut h = harness_with(router_config(), FakeEngine::new("fake"), store.clone()).await;
    // An idle conversation and a busy one take different paths to the journal.
    h.submit("busy", "sleep:50 first", None).await;
    for session in ["idle", "busy"] {
        let id = RunId::parse(&format!("job-{session}")).unwrap();
        let req = RunRequest {
            run_id: Some(id.clone()),
            ..RunRequest::new(session, format!("ok once {session}"))
        };
        memory.fail_next_flushes(1);
        let refused = h.router.submit(req.clone()).await;
        assert!(refused.is_err(), "an unconfirmed admission is refused: {refused:?}");
        let Submitted::Run(again, _) = h.router.submit(req).await.unwrap() else { panic!("a run") };
        assert_eq!(again.run_id, id);
        let completion = h.completion_of(&id).await;
        assert!(completion.ok, "{completion:?}");
        assert!(store.journal_pending().await.unwrap().iter().all(|e| e.run_id != id));
    }
    let started = h.fake.started();
    for prompt in ["ok once idle", "ok once busy"] {
        assert_eq!(started.iter().filter(|p| *p == prompt).count(), 1, "{started:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn slash_cancel_and_status() {
    let mut h = harness(router_config()).await;
    assert_eq!(h.command("s", "/cancel").await, "Nothing is running.");
    let busy = h.submit("s", "hang", None).await;
    let queued = h.submit("s", "ok next", None).await;
    let status = h.command("s", "/status").await;
    assert!(status.contains(busy.as_str()) && status.contains("1 queued"), "{status}");
    assert_eq!(h.command("s", "/cancel").await, "Cancelling the current run.");
    assert_eq!(code(&h.completion_of(&busy).await), Some("user_requested"));
    assert!(h.completion_of(&queued).await.ok, "the queue is kept");
}

/// A session-wide abort that reaches several conversations completes what it
/// dropped in conversation-key order, the same order every time, whatever
/// order the router's table keeps them in.
#[tokio::test(start_paused = true)]
async fn a_session_wide_abort_completes_its_conversations_in_key_order() {
    let mut h = harness(router_config()).await;
    let tokens = ["t-h", "t-c", "t-f", "t-a", "t-g", "t-b", "t-e", "t-d"];
    let mut queued = Vec::new();
    for token in tokens {
        let req = |prompt| RunRequest {
            resume: Some(ResumeToken::new("fake", token)),
            ..request("s", prompt, None)
        };
        h.submit_req(req("hang")).await;
        queued.push((token, h.submit_req(req("ok dropped")).await));
    }
    let summary = h.router.abort_session(&SessionKey::from("s")).await.unwrap();
    assert_eq!(summary.dropped, tokens.len());
    let done = h.completions(2 * tokens.len()).await;
    let dropped: Vec<&RunId> =
        done.iter().map(|(id, _)| id).filter(|id| queued.iter().any(|(_, q)| q == *id)).collect();
    queued.sort();
    let in_key_order: Vec<&RunId> = queued.iter().map(|(_, id)| id).collect();
    assert_eq!(dropped, in_key_order);
}

#[tokio::test(start_paused = true)]
async fn cancel_and_abort_variants() {
    let mut h = harness(router_config()).await;
    // Cancel a session: the active run only.
    let a1 = h.submit("a", "hang", None).await;
    let a2 = h.submit("a", "ok kept", None).await;
    let summary = h.router.cancel_session(&SessionKey::from("a")).await.unwrap();
    assert_eq!(summary, CancelSummary { dropped: 0, cancelled: 1 });
    assert_eq!(code(&h.completion_of(&a1).await), Some("user_requested"));
    assert!(h.completion_of(&a2).await.ok);
    // Abort a session: queue and active.
    let b1 = h.submit("b", "hang", None).await;
    let b2 = h.submit("b", "ok dropped", None).await;
    let summary = h.router.abort_session(&SessionKey::from("b")).await.unwrap();
    assert_eq!(summary, CancelSummary { dropped: 1, cancelled: 1 });
    let done = h.completions(2).await;
    let ids: Vec<&RunId> = done.iter().map(|(id, _)| id).collect();
    assert!(ids.contains(&&b1) && ids.contains(&&b2));
    assert!(done.iter().all(|(_, c)| code(c) == Some("user_requested")));
    // Abort a queued run before it starts.
    let c1 = h.submit("c", "hang", None).await;
    let c2 = h.submit("c", "ok never", None).await;
    assert!(h.router.abort_run(&c2).await.unwrap());
    assert_eq!(code(&h.completion_of(&c2).await), Some("user_requested"));
    // Cancel the conversation: everything.
    let c3 = h.submit("c", "ok also never", None).await;
    let summary = h.router.cancel_conversation(&ConversationKey::session("c")).await.unwrap();
    assert_eq!(summary, CancelSummary { dropped: 1, cancelled: 1 });
    let done = h.completions(2).await;
    let ids: Vec<&RunId> = done.iter().map(|(id, _)| id).collect();
    assert!(ids.contains(&&c1) && ids.contains(&&c3));
    h.settled(&c1).await;
    assert!(!h.router.abort_run(&c1).await.unwrap(), "finished runs are not held");
    assert!(!h.fake.started().iter().any(|p| p.contains("never") || p.contains("dropped")));
}

#[tokio::test(start_paused = true)]
async fn the_idle_watchdog_cancels_a_silent_run() {
    let config = RouterConfig { idle_watchdog: Some(Duration::from_secs(60)), ..router_config() };
    let mut h = harness(config).await;
    let run = h.submit("s", "hang", None).await;
    let done = h.completion_of(&run).await;
    assert_eq!(code(&done), Some("run_idle_watchdog_timeout"));
}

#[tokio::test(start_paused = true)]
async fn conversations_are_forgotten_when_idle() {
    let mut h = harness(router_config()).await;
    let run = h.submit("s", "ok hi", None).await;
    h.settled(&run).await;
    let view = h.router.session(&SessionKey::from("s")).await.unwrap();
    assert!(view.active.is_empty() && view.queued.is_empty());
}

pub(super) fn journaled(
    id: &str,
    seq: u64,
    prompt: &str,
    state: crate::store::JournalState,
) -> crate::store::JournalEntry {
    crate::store::JournalEntry {
        seq,
        run_id: RunId::parse(id).unwrap(),
        session_key: "s".into(),
        conversation: "session:s".to_owned(),
        prompt: prompt.to_owned(),
        engine: "fake".to_owned(),
        resume: None,
        cwd: None,
        meta: serde_json::json!({ "origin": "control_plane" }),
        route: crate::store::JournalRoute {
            queue_mode: Some("collect".to_owned()),
            auto_resume: true,
            fallback_engine: Some("fake".to_owned()),
            ..Default::default()
        },
        state,
        // Accepted a moment ago, well within `recovered_max_age`.
        accepted_at_ms: crate::clock::now_ms() - 1_000 + seq as i64,
    }
}

pub(super) async fn leave_row(store: &StoreHandle, entry: &crate::store::JournalEntry) {
    store.insert_run(entry.new_run()).await;
    store.journal_admit(entry.clone()).await;
}

/// What a process killed mid-work leaves behind: a started run with a session,
/// two requests that never started, and one whose completion was written but whose
/// journal entry was not yet removed.
#[tokio::test(start_paused = true)]
async fn recovery_requeues_unstarted_requests_and_interrupts_started_ones() {
    use crate::store::JournalState;
    let store = StoreHandle::memory();
    let running = journaled("r-running", 1, "hang", JournalState::Started);
    leave_row(&store, &running).await;
    store.mark_running(running.run_id.clone(), "fake".to_owned(), 1_001).await;
    for (index, kind) in [
        (1, EventKind::RunStarted { engine: "fake".to_owned(), model: None }),
        (
            2,
            EventKind::EngineStarted {
                resume: Some(ResumeToken::new("fake", "sess-9")),
                title: None,
                meta: serde_json::Value::Null,
            },
        ),
    ] {
        let event = BusEvent {
            run_id: running.run_id.clone(),
            session_key: "s".into(),
            index,
            ts_ms: 1_002,
            kind,
        };
        store.append_event(Arc::new(event)).await;
    }
    let first = journaled("r-first", 2, "ok first", JournalState::Queued);
    let second = journaled("r-second", 3, "ok second", JournalState::Queued);
    let done = journaled("r-done", 4, "ok done", JournalState::Started);
    for entry in [&first, &second, &done] {
        leave_row(&store, entry).await;
    }
    store
        .finalize_run(crate::store::FinishedRun {
            run_id: done.run_id.clone(),
            engine: "fake".to_owned(),
            completion: Completion::success("answer", None),
            completed_at_ms: 1_010,
            duration_ms: 1,
            spend: Default::default(),
        })
        .await;

    let mut h = harness_with(router_config(), FakeEngine::new("fake"), store.clone()).await;
    let finished = h.completions(3).await;
    let ids: Vec<&str> = finished.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(ids, ["r-running", "r-first", "r-second"], "each once, queued ones in order");
    let interrupted = &finished[0].1;
    assert_eq!(code(interrupted), Some("interrupted"));
    assert_eq!(interrupted.resume, Some(ResumeToken::new("fake", "sess-9")));
    assert!(finished[1].1.ok && finished[2].1.ok);
    assert_eq!(h.fake.started(), ["ok first", "ok second"], "nothing that started runs again");
    let events = store.run_events("r-running").await.unwrap();
    assert_eq!(events.last().map(|e| (e.index, e.kind.as_str())), Some((3, "run_completed")));
    let first_run = store.get_run("r-first").await.unwrap().unwrap();
    assert_eq!(first_run.meta["resume_source"], "auto", "the interrupted session continues");
    h.settled(&RunId::parse("r-second").unwrap()).await;
    assert_eq!(store.journal_pending().await.unwrap(), []);
}

/// A node that stored a run's `run_completed` and lost the rest of its
/// completion (the final row, the journal's removal: a fence or a crash cut
/// its writes between two batches): recovery finishes the run from the stored
/// completion instead of writing a second one.
#[tokio::test(start_paused = true)]
async fn recovery_finishes_a_run_from_its_stored_completion_and_writes_no_second() {
    use crate::store::JournalState;
    let store = StoreHandle::memory();
    let cut = journaled("r-cut", 1, "ok cut", JournalState::Started);
    leave_row(&store, &cut).await;
    store.mark_running(cut.run_id.clone(), "fake".to_owned(), 1_001).await;
    for (index, kind) in [
        (1, EventKind::RunStarted { engine: "fake".to_owned(), model: None }),
        (
            2,
            EventKind::RunCompleted {
                completion: Completion::success("the answer", None),
                engine: "fake".to_owned(),
                duration_ms: 7,
            },
        ),
    ] {
        let event = BusEvent {
            run_id: cut.run_id.clone(),
            session_key: "s".into(),
            index,
            ts_ms: 1_002,
            kind,
        };
        store.append_event(Arc::new(event)).await;
    }

    let mut h = harness_with(router_config(), FakeEngine::new("fake"), store.clone()).await;
    // Recovery is done before the router takes a new request.
    let next = h.submit("t", "ok next", None).await;
    h.completion_of(&next).await;
    let events = store.run_events("r-cut").await.unwrap();
    let completions = events.iter().filter(|e| e.kind == "run_completed").count();
    assert_eq!(completions, 1, "{events:?}");
    let record = store.get_run("r-cut").await.unwrap().unwrap();
    assert_eq!(record.status, crate::bus::RunStatus::Completed, "{record:?}");
    assert_eq!(record.answer.as_deref(), Some("the answer"));
    assert_eq!(h.fake.started(), ["ok next"], "the run is not started again");
    assert!(store.journal_pending().await.unwrap().iter().all(|e| e.run_id != cut.run_id));
}

#[tokio::test(start_paused = true)]
async fn accepted_requests_are_journaled_until_they_complete() {
    let mut h = harness(router_config()).await;
    let busy = h.submit("s", "hang", None).await;
    let queued = h.submit("s", "ok later", None).await;
    let pending: Vec<RunId> =
        h.store.journal_pending().await.unwrap().into_iter().map(|e| e.run_id).collect();
    assert_eq!(pending, [busy.clone(), queued.clone()]);
    h.router.abort_run(&busy).await.unwrap();
    h.settled(&busy).await;
    h.settled(&queued).await;
    assert_eq!(h.store.journal_pending().await.unwrap(), []);
}

#[test]
fn origins_are_journaled_by_a_name_that_parses_back() {
    for origin in Origin::ALL {
        assert_eq!(Origin::parse(origin.as_str()), Some(origin), "{origin:?}");
    }
    assert_eq!(Origin::Webhook.as_str(), "webhook");
    assert_eq!(Origin::parse("Webhook"), None);
}

#[tokio::test(start_paused = true)]
async fn a_webhook_request_is_journaled_and_stored_with_its_origin() {
    let mut h = harness(router_config()).await;
    let busy = h.submit("s", "hang", None).await;
    let from_hook = RunRequest { origin: Origin::Webhook, ..request("s", "ok from a hook", None) };
    let queued = h.submit_req(from_hook).await;
    let pending = h.store.journal_pending().await.unwrap();
    let entry = pending.iter().find(|e| e.run_id == queued).unwrap();
    assert_eq!(entry.meta["origin"], "webhook");
    assert_eq!(entry.route.origin.as_deref(), Some("webhook"));
    h.router.abort_run(&busy).await.unwrap();
    assert!(h.completion_of(&queued).await.ok);
    let record = h.store.get_run(queued.as_str()).await.unwrap().unwrap();
    assert_eq!(record.meta["origin"], "webhook");
}

#[tokio::test(start_paused = true)]
async fn a_channel_binding_gives_project_cwd_agent_engine_and_queue_mode() {
    let loaded = crate::config::load_str(
        r#"
        [gateway.projects.app]
        root = "/srv/app"
        default_engine = "plain"

        [[gateway.bindings]]
        transport = "telegram"
        chat_id = 42
        project = "app"
        agent_id = "helper"
        queue_mode = "followup"
        "#,
        std::path::Path::new("config.toml"),
    )
    .unwrap();
    let config = RouterConfig { gateway: Arc::new(loaded.config.gateway), ..router_config() };
    let mut h = harness(config).await;
    let channel =
        ChannelRef { transport: "telegram".into(), chat_id: Some("42".into()), topic_id: None };
    let from_chat = |prompt: &str| RunRequest {
        origin: Origin::Channel,
        channel: Some(channel.clone()),
        ..RunRequest::new("tg:42", prompt)
    };
    let busy = h.submit_req(from_chat("hang")).await;
    let first = h.submit_req(from_chat("ok one")).await;
    let second = h.submit_req(from_chat("ok two")).await;
    let pending = h.store.journal_pending().await.unwrap();
    let queued: Vec<_> = pending.iter().filter(|e| e.run_id != busy).collect();
    assert_eq!(queued.len(), 1, "the binding's followup mode merged the two: {queued:?}");
    let entry = queued[0];
    assert_eq!(entry.run_id, second);
    assert_eq!(entry.prompt, "ok one\nok two");
    assert_eq!(entry.engine, "plain", "the project's engine");
    assert_eq!(entry.cwd.as_deref(), Some(std::path::Path::new("/srv/app")));
    assert_eq!(entry.meta["agent_id"], "helper");
    assert_eq!(entry.meta["origin"], "channel");
    assert_eq!(code(&h.completion_of(&first).await), Some("merged"));
    h.router.abort_run(&busy).await.unwrap();
    assert!(h.completion_of(&second).await.ok);
}

#[tokio::test(start_paused = true)]
async fn the_binding_the_project_and_the_request_narrow_the_tools_and_are_journaled() {
    use crate::mcp::ToolFilter;
    let loaded = crate::config::load_str(
        r#"
        [gateway.projects.app]
        root = "/srv/app"
        tools = ["bash", "read", "github__*"]

        [[gateway.bindings]]
        transport = "telegram"
        chat_id = 42
        project = "app"
        tools = ["bash", "github__*"]
        "#,
        std::path::Path::new("config.toml"),
    )
    .unwrap();
    let config = RouterConfig { gateway: Arc::new(loaded.config.gateway), ..router_config() };
    let mut h = harness(config).await;
    let busy = h.submit("tg:42", "hang", None).await;
    let channel =
        ChannelRef { transport: "telegram".into(), chat_id: Some("42".into()), topic_id: None };
    let mut from_chat = RunRequest {
        origin: Origin::Channel,
        channel: Some(channel),
        ..RunRequest::new("tg:42", "ok from the chat")
    };
    ToolFilter::narrow_meta(&mut from_chat.meta, &["github__search".to_owned(), "read".to_owned()]);
    let chat_run = h.submit_req(from_chat).await;
    // Queued behind `busy` too, so the journal still holds them.
    let in_project =
        RunRequest { cwd: Some("/srv/app/src".into()), ..RunRequest::new("tg:42", "ok in app") };
    let project_run = h.submit_req(in_project).await;
    let elsewhere = h.submit_req(RunRequest::new("tg:42", "ok elsewhere")).await;

    let pending = h.store.journal_pending().await.unwrap();
    let journaled = |run_id: &RunId| {
        let entry = pending.iter().find(|e| &e.run_id == run_id).expect("journaled");
        let meta: BTreeMap<String, serde_json::Value> =
            entry.meta.as_object().unwrap().clone().into_iter().collect();
        ToolFilter::from_meta(&meta)
    };
    let filter = journaled(&chat_run);
    assert_eq!(filter.lists().len(), 3, "the request's, the project's, the binding's");
    assert!(filter.allows("github__search"));
    assert!(!filter.allows("read"), "the binding leaves read out");
    assert!(!filter.allows("bash"), "the request leaves bash out");
    let filter = journaled(&project_run);
    assert!(filter.allows("read") && !filter.allows("write"), "the project's list, by cwd");
    assert!(journaled(&elsewhere).is_all(), "no project, no binding: every tool");

    h.router.abort_run(&busy).await.unwrap();
    assert!(h.completion_of(&chat_run).await.ok);
    let record = h.store.get_run(chat_run.as_str()).await.unwrap().unwrap();
    let meta = record.meta.as_object().unwrap().clone().into_iter().collect();
    let filter = ToolFilter::from_meta(&meta);
    assert!(filter.allows("github__search") && !filter.allows("read"), "kept with the run");
}

#[tokio::test(start_paused = true)]
async fn redirect_falls_back_to_a_followup_when_the_engine_cannot_redirect() {
    let mut h = harness(router_config()).await;
    let busy = h.submit("s", "hang", None).await;
    h.started(&busy).await;
    let redirect = h.submit("s", "ok do this instead", Some(QueueMode::Redirect)).await;
    poll_until("the refused redirect to be queued", || async {
        h.router.session(&SessionKey::from("s")).await.unwrap().queued
            == std::slice::from_ref(&redirect)
    })
    .await;
    h.router.abort_run(&busy).await.unwrap();
    assert!(h.completion_of(&redirect).await.ok);
    assert_eq!(h.fake.started(), ["hang", "ok do this instead"]);
    assert!(h.fake.steered().is_empty());
}

#[tokio::test(start_paused = true)]
async fn native_only_runs_lemon_and_keeps_a_stored_vendor_session_unused() {
    let config = RouterConfig { native_only: true, ..router_config() };
    let mut h = harness_with(config, FakeEngine::new("lemon"), StoreHandle::memory()).await;
    let accepted = match h.router.submit(RunRequest::new("d", "/plain ok hi")).await.unwrap() {
        Submitted::Run(accepted, _) => accepted,
        other => panic!("{other:?}"),
    };
    assert_eq!(accepted.engine, "lemon", "directives are ignored");
    h.settled(&accepted.run_id).await;

    h.store
        .put_chat_state(&SessionKey::from("s"), "codex", "vendor-1", crate::clock::now_ms())
        .await;
    let run = h.submit("s", "hang", None).await;
    h.started(&run).await;
    // Until a native session replaces it, the vendor session stays stored.
    let kept = h
        .store
        .get_chat_state(&SessionKey::from("s"), crate::clock::now_ms())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(kept.last_resume_token, "vendor-1", "quarantined, not deleted");
    let record = h.store.get_run(run.as_str()).await.unwrap().unwrap();
    assert!(record.meta.get("resume_source").is_none(), "the vendor session was not continued");
    h.router.abort_run(&run).await.unwrap();
    h.settled(&run).await;

    let accepted =
        match h.router.submit(RunRequest::new("s", "lemon resume n-1\nok go")).await.unwrap() {
            Submitted::Run(accepted, _) => accepted,
            other => panic!("{other:?}"),
        };
    assert_eq!(accepted.conversation.as_str(), "resume:lemon:n-1");
}

/// A request the journal held for longer than `recovered_max_age` completes
/// `expired` without running; a fresh one beside it still runs.
#[tokio::test(start_paused = true)]
async fn recovery_expires_requests_older_than_the_recovered_max_age() {
    use crate::store::JournalState;
    let store = StoreHandle::memory();
    let mut stale = journaled("r-stale", 1, "ok stale", JournalState::Queued);
    stale.accepted_at_ms = crate::clock::now_ms() - 2 * 60 * 60 * 1000;
    let fresh = journaled("r-fresh", 2, "ok fresh", JournalState::Queued);
    for entry in [&stale, &fresh] {
        leave_row(&store, entry).await;
    }
    let config = RouterConfig { recovered_max_age: Duration::from_secs(3600), ..router_config() };
    let mut h = harness_with(config, FakeEngine::new("fake"), store.clone()).await;
    let finished = h.completions(2).await;
    let ids: Vec<&str> = finished.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(ids, ["r-stale", "r-fresh"]);
    assert_eq!(code(&finished[0].1), Some("expired"));
    assert!(finished[1].1.ok);
    assert_eq!(h.fake.started(), ["ok fresh"], "the expired one never ran");
    let stale_run = store.get_run("r-stale").await.unwrap().unwrap();
    assert_eq!(stale_run.error_code.as_deref(), Some("expired"));
}

#[tokio::test(start_paused = true)]
async fn values_that_could_be_options_are_refused_naming_their_field_and_nothing_runs() {
    let mut h = harness(router_config()).await;
    let dash = "--dangerously-skip-permissions";
    let invalid = |req: RunRequest| {
        let router = h.router.clone();
        async move {
            match router.submit(req).await {
                Err(RouteError::Invalid { field, what, .. }) => (field.as_str(), what),
                other => panic!("expected a refusal, got {other:?}"),
            }
        }
    };
    let cases = [
        (
            RunRequest {
                resume: Some(ResumeToken::new("fake", dash)),
                ..RunRequest::new("s", "hi")
            },
            ("resume.value", "invalid resume token for fake"),
        ),
        (
            RunRequest {
                resume: Some(ResumeToken::new(format!("fake:{dash}"), "abc")),
                ..RunRequest::new("s", "hi")
            },
            ("resume.engine", "invalid model for fake"),
        ),
        (RunRequest::new("s", format!("/fake:{dash} hi")), ("prompt", "invalid model for fake")),
        (
            RunRequest::new("s", format!("fake resume {dash}\nok hi")),
            ("prompt", "invalid resume token for fake"),
        ),
        (
            RunRequest {
                model: Some("--allowedTools=Bash".to_owned()),
                ..RunRequest::new("s", "hi")
            },
            ("meta.model", "invalid model for fake"),
        ),
    ];
    for (req, (field, what)) in cases {
        assert_eq!(invalid(req).await, (field, what.to_owned()));
    }
    // A request's engine is parsed where it enters (the API, a webhook), so an
    // engine reference with a bad model never reaches the router.
    let refused = super::resolve::parse_engine_ref(&format!("fake:{dash}"), Field::Engine)
        .map_err(RouteError::from)
        .unwrap_err();
    let RouteError::Invalid { field, what, .. } = refused else { panic!("{refused:?}") };
    assert_eq!((field.as_str(), what), ("engine", "invalid model for fake".to_owned()));
    let err = h
        .router
        .submit(RunRequest {
            resume: Some(ResumeToken::new("fake", dash)),
            ..RunRequest::new("s", "hi")
        })
        .await
        .unwrap_err();
    assert_eq!(err.chat_reply(), "Invalid resume token for fake.");
    assert!(!err.to_string().contains(dash), "the value is not repeated: {err}");
    assert_eq!(h.command("s", &format!("/engine fake:{dash}")).await, "Invalid model for fake.");
    // The sticky engine did not change, and nothing above ran.
    let ok = h.submit("s", "ok fine", None).await;
    h.completion_of(&ok).await;
    assert_eq!(h.fake.started(), ["ok fine"]);
    assert_eq!(
        h.store
            .list_runs(crate::store::RunFilter { status: None, limit: 100 })
            .await
            .unwrap()
            .len(),
        1
    );
}

#[tokio::test(start_paused = true)]
async fn a_stored_session_token_its_engine_would_refuse_is_ignored() {
    let mut h = harness(router_config()).await;
    h.store.put_chat_state(&SessionKey::from("s"), "fake", "--yolo", crate::clock::now_ms()).await;
    let run = h.submit("s", "ok hi", None).await;
    let done = h.completion_of(&run).await;
    assert!(done.ok);
    let record = h.store.get_run(run.as_str()).await.unwrap().unwrap();
    assert!(record.meta.get("resume_source").is_none(), "a new session: {:?}", record.meta);
    assert!(record.resume.as_ref().is_some_and(|t| t.value != "--yolo"), "{:?}", record.resume);
}
