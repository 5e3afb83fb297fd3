//! The gateway on nodes of a cluster: the cluster's run slots, a fenced node,
//! and cancel and steer of a run on another node. Each test runs two nodes (or
//! one) with their own stores on a fresh database of the PostgreSQL server
//! `LEMON_TEST_POSTGRES_URL` names, and skips itself when it is unset.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::bus::{EventBus, EventKind, RunStatus, Subscription};
use crate::cluster::node::remote::{ControlHandler, RemoteAnswer};
use crate::cluster::{ClusterError, ClusterNode, ClusterSettings, NodeId, NodeInfo, Placement};
use crate::engine::{
    Capabilities, Completion, Engine, EngineError, EngineEvent, EngineRegistry, EventSink,
    RunControl, RunError, StartRequest, SteerError,
};
use crate::gateway::{
    CancelOutcome, ExecutionRequest, GatewayDeps, GatewayHandle, RuntimeConfig, SubmitError,
};
use crate::ids::{EngineId, RunId};
use crate::store::postgres::testing::{fresh_database, server_url, URL_VAR};
use crate::store::postgres::{PostgresConfig, PostgresStore};
use crate::store::StoreHandle;
use crate::testing::within;

/// A term no lease outlives in these tests unless a test says so.
const LONG: Duration = Duration::from_secs(60);
/// Longer than any test waits: a run that needs the polling fallback to be
/// woken would time out, so what wakes it is a notification.
const SLOW_SWEEP: Duration = Duration::from_secs(30);

/// An engine whose runs start, then wait until the test releases them (they
/// complete ok) or they are cancelled. It logs `start:`, `end:`, `cancel:` and
/// `steer:` lines in order, across every node it is registered on.
#[derive(Debug, Clone)]
struct GateEngine {
    id: EngineId,
    inner: Arc<GateInner>,
}

#[derive(Debug)]
struct GateInner {
    log: watch::Sender<Vec<String>>,
    releases: Mutex<HashMap<String, CancellationToken>>,
    running: AtomicUsize,
    max_running: AtomicUsize,
}

impl GateEngine {
    fn new() -> Self {
        GateEngine {
            id: EngineId::parse("gate").unwrap(),
            inner: Arc::new(GateInner {
                log: watch::channel(Vec::new()).0,
                releases: Mutex::new(HashMap::new()),
                running: AtomicUsize::new(0),
                max_running: AtomicUsize::new(0),
            }),
        }
    }

    fn release_token(&self, prompt: &str) -> CancellationToken {
        let mut releases = self.inner.releases.lock().unwrap();
        releases.entry(prompt.to_owned()).or_default().clone()
    }

    /// Lets the run of `prompt` complete.
    fn release(&self, prompt: &str) {
        self.release_token(prompt).cancel();
    }

    fn note(&self, line: String) {
        self.inner.log.send_modify(|log| log.push(line));
    }

    fn log(&self) -> Vec<String> {
        self.inner.log.borrow().clone()
    }

    /// Waits until the log holds `line`.
    async fn logged(&self, line: &str) {
        let mut log = self.inner.log.subscribe();
        let what = format!("the engine to log {line:?}");
        within(&what, log.wait_for(|log| log.iter().any(|l| l == line))).await.unwrap();
    }

    fn running(&self) -> usize {
        self.inner.running.load(Ordering::SeqCst)
    }

    fn max_running(&self) -> usize {
        self.inner.max_running.load(Ordering::SeqCst)
    }
}

#[derive(Debug)]
struct GateControl {
    prompt: String,
    cancel: CancellationToken,
    engine: GateEngine,
}

#[async_trait]
impl RunControl for GateControl {
    fn cancel(&self) {
        self.cancel.cancel();
    }

    async fn steer(&self, text: &str) -> Result<(), SteerError> {
        if self.cancel.is_cancelled() {
            return Err(SteerError::Finished);
        }
        self.engine.note(format!("steer:{}:{text}", self.prompt));
        Ok(())
    }
}

#[async_trait]
impl Engine for GateEngine {
    fn id(&self) -> &EngineId {
        &self.id
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities { steer: true, redirect: false }
    }

    async fn start(
        &self,
        req: StartRequest,
        sink: EventSink,
    ) -> Result<Arc<dyn RunControl>, EngineError> {
        let prompt = req.prompt.clone();
        let now = self.inner.running.fetch_add(1, Ordering::SeqCst) + 1;
        self.inner.max_running.fetch_max(now, Ordering::SeqCst);
        self.note(format!("start:{prompt}"));
        let cancel = CancellationToken::new();
        let release = self.release_token(&prompt);
        let (engine, task_cancel, task_prompt) = (self.clone(), cancel.clone(), prompt.clone());
        tokio::spawn(async move {
            let started =
                EngineEvent::Started { resume: None, title: None, meta: serde_json::Value::Null };
            let _ = sink.send(started).await;
            tokio::select! {
                () = task_cancel.cancelled() => {
                    engine.inner.running.fetch_sub(1, Ordering::SeqCst);
                    engine.note(format!("cancel:{task_prompt}"));
                }
                () = release.cancelled() => {
                    // Counted out before the run can complete.
                    engine.inner.running.fetch_sub(1, Ordering::SeqCst);
                    engine.note(format!("end:{task_prompt}"));
                    let done = Completion::success(format!("{task_prompt} done"), None);
                    let _ = sink.send(EngineEvent::Completed(done)).await;
                }
            }
        });
        Ok(Arc::new(GateControl { prompt, cancel, engine: self.clone() }))
    }
}

/// One node: its store, cluster node, gateway and every event of its bus.
struct Node {
    store: Arc<PostgresStore>,
    node: Arc<ClusterNode>,
    gateway: GatewayHandle,
    events: Subscription,
}

impl Node {
    /// Places `session` here; it must not be held elsewhere.
    async fn own(&self, session: &str) {
        let placed = self.node.place_session(session).await.unwrap();
        assert!(matches!(placed, Placement::Here { .. }), "{session} placed {placed:?}");
    }

    async fn submit(&self, session: &str, prompt: &str) -> RunId {
        let req = ExecutionRequest::new(session, "gate".parse().unwrap(), prompt);
        self.gateway.submit(req).await.unwrap()
    }

    /// Every event of `run_id` on this node's bus, up to its `run_completed`.
    async fn events_of(&mut self, run_id: &RunId) -> Vec<EventKind> {
        let mut kinds = Vec::new();
        let what = format!("run {run_id} to complete");
        within(&what, async {
            loop {
                let event = self.events.recv().await.expect("no lag in tests");
                if &event.run_id != run_id {
                    continue;
                }
                let done = matches!(event.kind, EventKind::RunCompleted { .. });
                kinds.push(event.kind.clone());
                if done {
                    return;
                }
            }
        })
        .await;
        kinds
    }

    async fn completion_of(&mut self, run_id: &RunId) -> Completion {
        match self.events_of(run_id).await.pop() {
            Some(EventKind::RunCompleted { completion, .. }) => completion,
            other => panic!("run {run_id} ended with {other:?}"),
        }
    }

    async fn count(&self, sql: &str, run_id: &RunId) -> i64 {
        let client = self.store.pool().get().await.unwrap();
        client.query_one(sql, &[&run_id.as_str()]).await.unwrap().get(0)
    }

    /// Whether `run_id` waits in the cluster's queue for a slot.
    async fn claims(&self, run_id: &RunId) -> i64 {
        self.count("SELECT count(*) FROM slot_requests WHERE run_id = $1", run_id).await
    }

    /// Whether `run_id` holds a cluster slot.
    async fn holds_slot(&self, run_id: &RunId) -> i64 {
        self.count("SELECT count(*) FROM run_slots WHERE run_id = $1", run_id).await
    }
}

struct Cluster {
    url: String,
    engine: GateEngine,
    tracker: TaskTracker,
    token: CancellationToken,
}

impl Cluster {
    /// A fresh database, or `None` when the tests have no server.
    async fn new() -> Option<Self> {
        let Some(server) = server_url() else {
            note(&format!("skipped: {URL_VAR} is unset"));
            return None;
        };
        Some(Cluster {
            url: fresh_database(&server).await,
            engine: GateEngine::new(),
            tracker: TaskTracker::new(),
            token: CancellationToken::new(),
        })
    }

    async fn node(&self, id: &str, term: Duration, sweep: Duration) -> Node {
        let store = PostgresStore::connect(PostgresConfig {
            url: self.url.clone(),
            pool_size: 8,
            chat_state_ttl_ms: 60_000,
            exclusive: false,
        })
        .await
        .unwrap();
        let store = Arc::new(store);
        let settings = ClusterSettings {
            node: NodeId::parse(id).unwrap(),
            term,
            info: NodeInfo { version: "test".to_owned(), api_base_url: None, channels: vec![] },
            sweep,
        };
        let node =
            ClusterNode::start(&store, settings, &self.tracker, self.token.clone()).await.unwrap();
        let mut engines = EngineRegistry::new();
        engines.register(Arc::new(self.engine.clone())).unwrap();
        let bus = EventBus::new(65_536, 1024);
        let events = bus.subscribe_all();
        let config = RuntimeConfig { max_concurrent_runs: 4, ..RuntimeConfig::default() };
        let deps = GatewayDeps { config, engines, store: StoreHandle::new(store.clone()), bus };
        let gateway = GatewayHandle::start_clustered(
            deps,
            Some(node.clone()),
            self.token.clone(),
            &self.tracker,
        );
        Node { store, node, gateway, events }
    }

    async fn stop(self) {
        self.token.cancel();
        self.tracker.close();
        within("the nodes to stop", self.tracker.wait()).await;
    }
}

// The test log is where skips are meant to be read.
#[allow(clippy::print_stderr)]
fn note(text: &str) {
    eprintln!("{text}");
}

/// Polls `check` (a database read) until it holds.
async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    within(what, async {
        while !check().await {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_on_two_nodes_share_the_cluster_cap_and_start_in_turn() {
    let Some(cluster) = Cluster::new().await else { return };
    let mut a = cluster.node("node-a", LONG, SLOW_SWEEP).await;
    let mut b = cluster.node("node-b", LONG, SLOW_SWEEP).await;
    a.node.cluster().set_slot_count(1).await.unwrap();
    a.own("chat-a").await;
    b.own("chat-b").await;
    let engine = cluster.engine.clone();

    let first = a.submit("chat-a", "first").await;
    engine.logged("start:first").await;
    let second = b.submit("chat-b", "second").await;
    // The second waits in the cluster's queue, and is shown as queued.
    eventually("the second run's claim", || async { b.claims(&second).await == 1 }).await;
    let waiting = b.gateway.active_run(&second).await.unwrap().unwrap();
    assert_eq!((waiting.status, waiting.started_at_ms), (RunStatus::Queued, None));
    assert_eq!(engine.log(), ["start:first"]);

    engine.release("first");
    let done = a.completion_of(&first).await;
    assert!(done.ok, "{done:?}");
    // Woken by the freed slot's notification: the sweep is far away.
    engine.logged("start:second").await;
    let running = b.gateway.active_run(&second).await.unwrap().unwrap();
    assert_eq!(running.status, RunStatus::Running);
    assert_eq!(b.holds_slot(&second).await, 1);
    engine.release("second");
    let kinds = b.events_of(&second).await;
    assert!(matches!(kinds.first(), Some(EventKind::RunStarted { .. })), "{kinds:?}");
    assert!(
        matches!(kinds.last(), Some(EventKind::RunCompleted { completion, .. }) if completion.ok)
    );

    assert_eq!(engine.log(), ["start:first", "end:first", "start:second", "end:second"]);
    assert_eq!(engine.max_running(), 1);
    eventually("both slots freed", || async {
        a.node.cluster().slots_in_use().await.unwrap() == 0
    })
    .await;
    assert_eq!((a.claims(&first).await, b.claims(&second).await), (0, 0));
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_cancelled_while_it_waits_for_a_cluster_slot_completes_and_leaves_no_claim() {
    let Some(cluster) = Cluster::new().await else { return };
    let mut a = cluster.node("node-a", LONG, SLOW_SWEEP).await;
    let mut b = cluster.node("node-b", LONG, SLOW_SWEEP).await;
    a.node.cluster().set_slot_count(1).await.unwrap();
    a.own("chat-a").await;
    b.own("chat-b").await;
    let engine = cluster.engine.clone();

    let first = a.submit("chat-a", "first").await;
    engine.logged("start:first").await;
    let waiting = b.submit("chat-b", "waiting").await;
    eventually("the waiting run's claim", || async { b.claims(&waiting).await == 1 }).await;

    let outcome = b.gateway.cancel(&waiting, RunError::UserRequested).await.unwrap();
    assert_eq!(outcome, CancelOutcome::Cancelling);
    let kinds = b.events_of(&waiting).await;
    assert_eq!(kinds.len(), 1, "only its completion: {kinds:?}");
    let Some(EventKind::RunCompleted { completion, .. }) = kinds.last() else { unreachable!() };
    assert_eq!(completion.error, Some(RunError::UserRequested));
    assert_eq!((b.claims(&waiting).await, b.holds_slot(&waiting).await), (0, 0));
    let store = StoreHandle::new(b.store.clone());
    store.flush().await.unwrap();
    let stored = store.get_run(waiting.as_str()).await.unwrap().unwrap();
    assert_eq!(stored.status, RunStatus::Cancelled);
    assert!(b.gateway.active_run(&waiting).await.unwrap().is_none());

    // Nothing of it holds the queue up: the next run of node b gets the slot
    // the first run frees.
    let next = b.submit("chat-b", "next").await;
    eventually("the next run's claim", || async { b.claims(&next).await == 1 }).await;
    engine.release("first");
    assert!(a.completion_of(&first).await.ok);
    engine.logged("start:next").await;
    engine.release("next");
    assert!(b.completion_of(&next).await.ok);
    assert!(!engine.log().iter().any(|line| line.ends_with(":waiting")));

    // A session this node does not hold: the run fails without starting.
    let elsewhere = a.submit("chat-b", "elsewhere").await;
    let failed = a.completion_of(&elsewhere).await;
    match &failed.error {
        Some(RunError::StartFailed { detail }) => {
            assert_eq!(detail, "the session moved to another node");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(a.claims(&elsewhere).await, 0);
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_treats_runs_waiting_for_a_cluster_slot_as_queued() {
    let Some(cluster) = Cluster::new().await else { return };
    let mut a = cluster.node("node-a", LONG, SLOW_SWEEP).await;
    let mut b = cluster.node("node-b", LONG, SLOW_SWEEP).await;
    a.node.cluster().set_slot_count(1).await.unwrap();
    a.own("chat-a").await;
    b.own("chat-b").await;
    b.own("chat-c").await;
    let engine = cluster.engine.clone();
    let first = a.submit("chat-a", "first").await;
    engine.logged("start:first").await;

    let mut req = ExecutionRequest::new("chat-b", "gate".parse().unwrap(), "kept");
    req.journaled = true;
    let kept = b.gateway.submit(req).await.unwrap();
    let dropped = b.submit("chat-c", "dropped").await;
    eventually("both claims", || async {
        b.claims(&kept).await == 1 && b.claims(&dropped).await == 1
    })
    .await;

    within("node b to drain", b.gateway.drain(Duration::from_secs(60))).await.unwrap();
    // As a queued request: the journaled one stays queued for whichever node
    // runs its session next, the other completes as shutting down.
    let completion = b.completion_of(&dropped).await;
    assert_eq!(completion.error, Some(RunError::ShuttingDown));
    let store = StoreHandle::new(b.store.clone());
    store.flush().await.unwrap();
    let stored = store.get_run(kept.as_str()).await.unwrap().unwrap();
    assert_eq!(stored.status, RunStatus::Queued);
    assert!(store.run_events(kept.as_str()).await.unwrap().is_empty());
    for run in [&kept, &dropped] {
        assert_eq!((b.claims(run).await, b.holds_slot(run).await), (0, 0), "{run}");
    }
    assert_eq!(engine.log(), ["start:first"]);
    engine.release("first");
    assert!(a.completion_of(&first).await.ok);
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_node_stops_its_runs_and_refuses_new_ones() {
    let Some(cluster) = Cluster::new().await else { return };
    let term = Duration::from_millis(1500);
    let mut a = cluster.node("node-a", term, SLOW_SWEEP).await;
    a.node.cluster().set_slot_count(2).await.unwrap();
    a.own("chat-a").await;
    let engine = cluster.engine.clone();
    let held = a.submit("chat-a", "held").await;
    engine.logged("start:held").await;
    assert_eq!(a.holds_slot(&held).await, 1);

    // The lease row is locked away: renewals hang until the node is fenced.
    let mut blocker = a.store.pool().get().await.unwrap();
    let block = blocker.transaction().await.unwrap();
    block
        .execute("SELECT 1 FROM session_leases WHERE session_key = 'chat-a' FOR UPDATE", &[])
        .await
        .unwrap();
    within("the node to be fenced", a.node.fenced().cancelled()).await;

    let stopped = a.completion_of(&held).await;
    assert_eq!(stopped.error, Some(RunError::ShuttingDown));
    engine.logged("cancel:held").await;
    assert_eq!(engine.log(), ["start:held", "cancel:held"]);
    assert_eq!(engine.running(), 0);
    let refused = a.gateway.submit(ExecutionRequest::new("chat-a", "gate".parse().unwrap(), "no"));
    assert_eq!(refused.await, Err(SubmitError::ShuttingDown));
    block.rollback().await.unwrap();
    // A fenced node writes nothing more: its slot waits for a sweep to take it
    // back once its lease lapses.
    assert_eq!(a.holds_slot(&held).await, 1);
    cluster.stop().await;
}

/// Cancels and steers through a node's gateway, as the router does.
struct GatewayControls(GatewayHandle);

#[async_trait]
impl ControlHandler for GatewayControls {
    async fn cancel(&self, run_id: &RunId) -> RemoteAnswer {
        match self.0.cancel(run_id, RunError::UserRequested).await {
            Ok(CancelOutcome::Cancelling) => RemoteAnswer::Done,
            _ => RemoteAnswer::NotActive,
        }
    }

    async fn steer(&self, run_id: &RunId, text: &str) -> RemoteAnswer {
        match self.0.steer(run_id, text).await {
            Ok(()) => RemoteAnswer::Done,
            Err(SteerError::Finished) => RemoteAnswer::NotActive,
            Err(refused) => RemoteAnswer::Refused(refused.to_string()),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_is_steered_and_cancelled_from_another_node() {
    let Some(cluster) = Cluster::new().await else { return };
    let mut a = cluster.node("node-a", LONG, SLOW_SWEEP).await;
    let b = cluster.node("node-b", LONG, SLOW_SWEEP).await;
    a.node.cluster().set_slot_count(2).await.unwrap();
    for node in [&a, &b] {
        let handler = Arc::new(GatewayControls(node.gateway.clone()));
        node.node.serve_controls(handler, &cluster.tracker, cluster.token.clone());
    }
    a.own("chat-a").await;
    let engine = cluster.engine.clone();
    let run = a.submit("chat-a", "remote").await;
    engine.logged("start:remote").await;

    let steered = within("a remote steer", b.node.remote_steer(&run, "chat-a", "more")).await;
    assert_eq!(steered, Ok(RemoteAnswer::Done));
    assert_eq!(engine.log(), ["start:remote", "steer:remote:more"]);
    // The owner answers for a run it does not have.
    let unknown = RunId::parse("run_unknown").unwrap();
    let answer = within("a remote cancel", b.node.remote_cancel(&unknown, "chat-a")).await;
    assert_eq!(answer, Ok(RemoteAnswer::NotActive));
    let answer = within("a remote steer", b.node.remote_steer(&unknown, "chat-a", "x")).await;
    assert_eq!(answer, Ok(RemoteAnswer::NotActive));
    // No node asks itself, and nobody owns a session nobody placed.
    assert_eq!(a.node.remote_cancel(&run, "chat-a").await, Ok(RemoteAnswer::NotActive));
    assert_eq!(b.node.remote_cancel(&run, "chat-none").await, Ok(RemoteAnswer::NotActive));

    let cancelled = within("a remote cancel", b.node.remote_cancel(&run, "chat-a")).await;
    assert_eq!(cancelled, Ok(RemoteAnswer::Done));
    let completion = a.completion_of(&run).await;
    assert_eq!(completion.error, Some(RunError::UserRequested));
    engine.logged("cancel:remote").await;
    assert_eq!(engine.log(), ["start:remote", "steer:remote:more", "cancel:remote"]);
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_cancel_nobody_answers_gives_up() {
    let Some(cluster) = Cluster::new().await else { return };
    let a = cluster.node("node-a", LONG, SLOW_SWEEP).await;
    let b = cluster.node("node-b", LONG, Duration::from_millis(200)).await;
    a.own("chat-a").await;
    // Node a serves no controls.
    let run = RunId::parse("run_silent").unwrap();
    let started = tokio::time::Instant::now();
    let answer = within("the remote cancel to give up", b.node.remote_cancel(&run, "chat-a")).await;
    assert!(matches!(answer, Err(ClusterError::Unavailable { .. })), "{answer:?}");
    assert!(started.elapsed() >= crate::cluster::node::remote::ANSWER_WAIT);
    cluster.stop().await;
}
