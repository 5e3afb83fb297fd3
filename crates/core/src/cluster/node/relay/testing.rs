//! Two cluster nodes on one fresh database, for the tests of fenced writes,
//! event notifications and the relay.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::bus::{BusEvent, EventBus, EventKind};
use crate::cluster::{ClusterNode, ClusterSettings, LeaseKind, NodeId, NodeInfo};
use crate::engine::Completion;
use crate::ids::RunId;
use crate::store::postgres::testing::{fresh_database, server_url, URL_VAR};
use crate::store::postgres::{PostgresConfig, PostgresStore};
use crate::store::{NewRun, StoreHandle};

/// A term no lease in these tests reaches unless a test says so.
pub(crate) const LONG: Duration = Duration::from_secs(60);

/// The longest any wait in these tests may take.
pub(crate) const PATIENCE: Duration = Duration::from_secs(5);

/// One node: its store (as a handle too), its cluster runtime and its bus.
pub(crate) struct Member {
    pub(crate) store: Arc<PostgresStore>,
    pub(crate) handle: StoreHandle,
    pub(crate) node: Arc<ClusterNode>,
    pub(crate) bus: EventBus,
}

/// Two nodes, `a` and `b`, sharing a database at `url`; their tasks stop
/// when this is dropped.
pub(crate) struct TwoNodes {
    pub(crate) url: String,
    pub(crate) a: Member,
    pub(crate) b: Member,
    pub(crate) tracker: TaskTracker,
    pub(crate) token: CancellationToken,
}

impl Drop for TwoNodes {
    fn drop(&mut self) {
        self.token.cancel();
    }
}

/// A store on `url` that is not a cluster node (yet).
pub(crate) async fn store(url: &str) -> Arc<PostgresStore> {
    let config = PostgresConfig {
        url: url.to_owned(),
        pool_size: 8,
        chat_state_ttl_ms: 60_000,
        exclusive: false,
    };
    Arc::new(PostgresStore::connect(config).await.unwrap())
}

/// Two nodes on a fresh database, sweeping every `sweep`; `None` (and a
/// note) when the tests have no PostgreSQL server.
pub(crate) async fn two_nodes(sweep: Duration) -> Option<TwoNodes> {
    let Some(server) = server_url() else {
        note(&format!("skipped: {URL_VAR} is unset"));
        return None;
    };
    let url = fresh_database(&server).await;
    let tracker = TaskTracker::new();
    let token = CancellationToken::new();
    let mut members = Vec::new();
    for id in ["a", "b"] {
        let store = store(&url).await;
        let settings = ClusterSettings {
            node: NodeId::parse(id).unwrap(),
            term: LONG,
            info: NodeInfo { version: "test".to_owned(), api_base_url: None, channels: vec![] },
            sweep,
        };
        let node = ClusterNode::start(&store, settings, &tracker, token.clone()).await.unwrap();
        let handle = StoreHandle::new(Arc::clone(&store));
        members.push(Member { store, handle, node, bus: EventBus::default() });
    }
    let b = members.pop().unwrap();
    let a = members.pop().unwrap();
    Some(TwoNodes { url, a, b, tracker, token })
}

impl TwoNodes {
    /// A connection of the test's own.
    pub(crate) async fn client(&self) -> deadpool_postgres::Object {
        self.a.store.pool().get().await.unwrap()
    }

    /// Moves session `key`'s lease expiry into the past, as if its node
    /// stopped renewing it.
    pub(crate) async fn expire_session(&self, key: &str) {
        let n = self
            .client()
            .await
            .execute(
                "UPDATE session_leases SET expires_at = clock_timestamp() - interval '1 second'
                 WHERE session_key = $1",
                &[&key],
            )
            .await
            .unwrap();
        assert_eq!(n, 1, "no lease on session {key}");
    }
}

impl Member {
    /// Places session `key` here and returns its lease.
    pub(crate) async fn hold(&self, key: &str) -> crate::cluster::Lease {
        match self.node.place_session(key).await.unwrap() {
            crate::cluster::Placement::Here { lease, .. } => {
                assert_eq!(lease.kind, LeaseKind::Session);
                lease
            }
            elsewhere => panic!("session {key} is not placed here: {elsewhere:?}"),
        }
    }
}

// The test log is where skips are meant to be read.
#[allow(clippy::print_stderr)]
fn note(text: &str) {
    eprintln!("{text}");
}

pub(crate) async fn within<T>(what: &str, future: impl Future<Output = T>) -> T {
    match tokio::time::timeout(PATIENCE, future).await {
        Ok(value) => value,
        Err(_) => panic!("timed out waiting for {what}"),
    }
}

pub(crate) fn run_id(raw: &str) -> RunId {
    RunId::parse(raw).unwrap()
}

/// The row of a run of session `session` queued now.
pub(crate) fn new_run(run: &RunId, session: &str) -> NewRun {
    NewRun {
        run_id: run.clone(),
        session_key: session.into(),
        conversation: "c".to_owned(),
        engine: "echo".to_owned(),
        prompt: "hi".to_owned(),
        meta: serde_json::json!({}),
        resumed_from: None,
        created_at_ms: 1,
    }
}

/// Event `index` of `run` in session `session`: a delta saying `text`.
pub(crate) fn delta(run: &RunId, session: &str, index: u64, text: &str) -> Arc<BusEvent> {
    event(run, session, index, EventKind::Delta { seq: index, text: text.to_owned() })
}

/// The `run_completed` of `run`, at `index`, answering `answer`.
pub(crate) fn completed(run: &RunId, session: &str, index: u64, answer: &str) -> Arc<BusEvent> {
    let kind = EventKind::RunCompleted {
        completion: Completion::success(answer, None),
        engine: "echo".to_owned(),
        duration_ms: 3,
    };
    event(run, session, index, kind)
}

pub(crate) fn event(run: &RunId, session: &str, index: u64, kind: EventKind) -> Arc<BusEvent> {
    Arc::new(BusEvent {
        run_id: run.clone(),
        session_key: session.into(),
        index,
        ts_ms: 1_700_000_000_000 + i64::try_from(index).unwrap(),
        kind,
    })
}
