//! The router in cluster mode: two nodes over one PostgreSQL database, each
//! with its own store, gateway and fake engine. Sessions run on the node that
//! holds their lease; a request that arrives elsewhere is handed over through
//! the journal; a node that stops loses its sessions to the other.
//!
//! These run against the server `LEMON_TEST_POSTGRES_URL` names and skip
//! themselves when it is unset (`scripts/test` sets it and requires it).

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::request;
use crate::bus::EventBus;
use crate::cluster::{ClusterNode, ClusterSettings, LeaseKind, NodeId, NodeInfo};
use crate::engine::EngineRegistry;
use crate::gateway::{GatewayDeps, GatewayHandle, RuntimeConfig};
use crate::ids::RunId;
use crate::router::{RouterConfig, RouterHandle, Submitted};
use crate::store::postgres::testing::{fresh_database, server_url, URL_VAR};
use crate::store::postgres::{PostgresConfig, PostgresStore};
use crate::store::StoreHandle;
use crate::testing::{within, FakeEngine};

/// Leases in these tests lapse when a test says so, not on their own.
const TERM: Duration = Duration::from_secs(60);

/// One gateway node: its store on the shared database, its cluster handle,
/// gateway, router and engine.
struct Node {
    store: StoreHandle,
    node: Arc<ClusterNode>,
    router: RouterHandle,
    fake: FakeEngine,
    token: CancellationToken,
    tracker: TaskTracker,
}

impl Node {
    async fn start(url: &str, id: &str) -> Node {
        let pg = PostgresStore::connect(PostgresConfig {
            url: url.to_owned(),
            pool_size: 8,
            chat_state_ttl_ms: 60_000,
            exclusive: false,
        })
        .await
        .unwrap();
        let token = CancellationToken::new();
        let tracker = TaskTracker::new();
        let settings = ClusterSettings {
            node: NodeId::parse(id).unwrap(),
            term: TERM,
            info: NodeInfo { version: "test".to_owned(), api_base_url: None, channels: vec![] },
            sweep: Duration::from_millis(50),
        };
        let node = ClusterNode::start(&pg, settings, &tracker, token.clone()).await.unwrap();
        node.cluster().set_slot_count(4).await.unwrap();
        let store = StoreHandle::new(Arc::new(pg));
        let fake = FakeEngine::new("fake");
        let mut engines = EngineRegistry::new();
        engines.register(Arc::new(fake.clone())).unwrap();
        let deps = GatewayDeps {
            config: RuntimeConfig { max_concurrent_runs: 4, ..RuntimeConfig::default() },
            engines,
            store: store.clone(),
            bus: EventBus::new(4096, 256),
        };
        let gateway =
            GatewayHandle::start_clustered(deps, Some(node.clone()), token.clone(), &tracker);
        let config = RouterConfig {
            default_engine: crate::ids::EngineRef::parse("fake").unwrap(),
            ..RouterConfig::default()
        };
        let router = RouterHandle::start(config, gateway, token.clone(), &tracker);
        node.serve_controls(Arc::new(router.clone()), &tracker, token.clone());
        Node { store, node, router, fake, token, tracker }
    }

    async fn submit(&self, session: &str, prompt: &str) -> RunId {
        match self.router.submit(request(session, prompt, None)).await.unwrap() {
            Submitted::Run(accepted, _) => {
                assert!(!accepted.duplicate);
                accepted.run_id
            }
            other => panic!("expected a run, got {other:?}"),
        }
    }

    /// Waits until this node's router has `run_id` started or finished.
    async fn completion_of(&self, run_id: &RunId) -> String {
        let mut follower =
            self.router.follow(run_id).check_store_when_quiet(Duration::from_millis(50));
        let event = within("the run's completion", follower.completion()).await.unwrap();
        event.to_json()["status"].as_str().unwrap_or_default().to_owned()
    }

    async fn stop(self) {
        self.token.cancel();
        self.tracker.close();
        self.tracker.wait().await;
        let _ = self.store.close().await;
    }
}

async fn database() -> Option<String> {
    let Some(server) = server_url() else {
        // The test log is where skips are meant to be read.
        #[allow(clippy::print_stderr)]
        {
            eprintln!("skipped: {URL_VAR} is unset");
        }
        return None;
    };
    Some(fresh_database(&server).await)
}

/// How many `run_completed` events the store has for `run_id`.
async fn completions(store: &StoreHandle, run_id: &RunId) -> usize {
    let events = store.run_events(run_id.as_str()).await.unwrap();
    events.iter().filter(|e| e.kind == "run_completed").count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_arrives_at_another_node_runs_on_the_sessions_node_in_order() {
    let Some(url) = database().await else { return };
    let a = Node::start(&url, "node-a").await;
    let b = Node::start(&url, "node-b").await;

    // B takes the session with a run that holds it.
    let first = b.submit("s1", "hang").await;
    within("B starts the first run", async {
        while b.fake.running() == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    let owner = b.node.cluster().owner_of(LeaseKind::Session, "s1").await.unwrap().unwrap();
    assert_eq!(owner.node.as_str(), "node-b");

    // A accepts a request for it and hands it over; B queues it behind its run.
    let second = a.submit("s1", "ok second").await;
    within("B adopts the handed-over request", async {
        loop {
            let view = b.router.session(&"s1".into()).await.unwrap();
            if view.queued.contains(&second) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert_eq!(a.fake.started(), Vec::<String>::new(), "A ran nothing of B's session");

    // Cancelled from A: the request goes to B, which answers.
    let outcome = a.router.cancel_run(&first).await.unwrap();
    assert_eq!(outcome, crate::gateway::CancelOutcome::Cancelling);
    assert_eq!(b.completion_of(&first).await, "cancelled");
    assert_eq!(b.completion_of(&second).await, "completed");
    assert_eq!(b.fake.started(), vec!["hang".to_owned(), "ok second".to_owned()]);
    // Read through B's store, whose reads wait for its own queued writes.
    assert_eq!(completions(&b.store, &first).await, 1);
    assert_eq!(completions(&b.store, &second).await, 1);

    // Idle, the session is let go of, and the next request runs where it arrives.
    within("B lets the idle session go", async {
        loop {
            let owner = a.node.cluster().owner_of(LeaseKind::Session, "s1").await.unwrap();
            if owner.is_some_and(|o| !o.live) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    let third = a.submit("s1", "ok third").await;
    assert_eq!(a.completion_of(&third).await, "completed");
    assert_eq!(a.fake.started(), vec!["ok third".to_owned()]);

    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sessions_of_a_node_that_stopped_renewing_are_taken_over_and_recovered() {
    let Some(url) = database().await else { return };
    let a = Node::start(&url, "node-a").await;
    let b = Node::start(&url, "node-b").await;

    let running = b.submit("s2", "hang").await;
    let queued = b.submit("s2", "ok queued").await;
    within("B starts the first run", async {
        while b.fake.running() == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    let b_store = b.store.clone();
    let b_cluster = b.node.cluster().clone();
    // B stops without letting anything go, then its lease lapses.
    b.token.cancel();
    b.tracker.close();
    b.tracker.wait().await;
    let client = b_cluster.pool().get().await.unwrap();
    client
        .execute(
            "UPDATE session_leases SET expires_at = clock_timestamp() - interval '1 second'
             WHERE session_key = 's2'",
            &[],
        )
        .await
        .unwrap();

    // A takes the session over: the request that never started runs on A,
    // and the one that was running ends once.
    assert_eq!(a.completion_of(&queued).await, "completed");
    assert_eq!(a.fake.started(), vec!["ok queued".to_owned()]);
    let owner = a.node.cluster().owner_of(LeaseKind::Session, "s2").await.unwrap().unwrap();
    assert_eq!(owner.node.as_str(), "node-a");
    assert!(owner.epoch >= 2, "a takeover takes a new epoch");
    within("the interrupted run's completion", async {
        while completions(&a.store, &running).await == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert_eq!(completions(&a.store, &running).await, 1);
    assert_eq!(completions(&a.store, &queued).await, 1);
    let _ = b_store.close().await;
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_stops_as_planned_hands_its_sessions_on_at_once() {
    let Some(url) = database().await else { return };
    let a = Node::start(&url, "node-a").await;
    let b = Node::start(&url, "node-b").await;

    let running = b.submit("s3", "hang").await;
    let queued = b.submit("s3", "ok after the stop").await;
    within("B starts the first run", async {
        while b.fake.running() == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    // A planned stop: B stops, its writes are flushed, its sessions go.
    b.token.cancel();
    b.tracker.close();
    b.tracker.wait().await;
    b.store.flush().await.unwrap();
    assert_eq!(b.node.release_all_sessions().await, 1);

    // No lease had to lapse: A adopts the queued request at its next sweep.
    assert_eq!(a.completion_of(&queued).await, "completed");
    assert_eq!(a.fake.started(), vec!["ok after the stop".to_owned()]);
    within("the stopped run's one completion", async {
        while completions(&a.store, &running).await == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert_eq!(completions(&a.store, &running).await, 1);
    let _ = b.store.close().await;
    a.stop().await;
}
