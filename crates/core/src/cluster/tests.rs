//! Tests of the cluster primitives. All but the node-id and keeper-timing ones
//! run against the PostgreSQL server `LEMON_TEST_POSTGRES_URL` names, each in
//! a database of its own, and skip themselves when it is unset.

use std::collections::{BTreeSet, VecDeque};
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::{timeout, Instant};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::keeper::Renewer;
use super::listener::APPLICATION_NAME;
use super::*;
use crate::store::postgres::testing::{fresh_database, server_url, URL_VAR};
use crate::store::postgres::{PostgresConfig, PostgresStore};

/// A long term: leases in tests lapse when a test says so, not on their own.
const LONG: Duration = Duration::from_secs(60);

/// The longest any wait in these tests may take.
const PATIENCE: Duration = Duration::from_secs(4);

struct Db {
    url: String,
    store: PostgresStore,
}

impl Db {
    fn node(&self, id: &str) -> Cluster {
        Cluster::new(self.store.pool().clone(), NodeId::parse(id).unwrap())
    }

    async fn client(&self) -> deadpool_postgres::Object {
        self.store.pool().get().await.unwrap()
    }

    /// Moves a lease's expiry into the past, as if its node stopped renewing.
    async fn expire(&self, kind: LeaseKind, key: &str) {
        let (table, column) = match kind {
            LeaseKind::Session => ("session_leases", "session_key"),
            LeaseKind::Channel => ("channel_leases", "channel"),
        };
        let n = self
            .client()
            .await
            .execute(
                &format!(
                    "UPDATE {table} SET expires_at = clock_timestamp() - interval '1 second'
                     WHERE {column} = $1"
                ),
                &[&key],
            )
            .await
            .unwrap();
        assert_eq!(n, 1, "no lease {key}");
    }

    /// The database's clock, in milliseconds since the Unix epoch.
    async fn now_ms(&self) -> i64 {
        self.count("SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint").await
    }

    async fn count(&self, sql: &str) -> i64 {
        self.client().await.query_one(sql, &[]).await.unwrap().get(0)
    }
}

/// A fresh, migrated database, or `None` (and a note) when the tests have no
/// server.
async fn db() -> Option<Db> {
    let Some(server) = server_url() else {
        note(&format!("skipped: {URL_VAR} is unset"));
        return None;
    };
    let url = fresh_database(&server).await;
    let store = PostgresStore::connect(PostgresConfig {
        url: url.clone(),
        pool_size: 24,
        chat_state_ttl_ms: 60_000,
        exclusive: false,
    })
    .await
    .unwrap();
    Some(Db { url, store })
}

// The test log is where skips and measurements are meant to be read.
#[allow(clippy::print_stderr)]
fn note(text: &str) {
    eprintln!("{text}");
}

async fn within<T>(what: &str, future: impl Future<Output = T>) -> T {
    match timeout(PATIENCE, future).await {
        Ok(value) => value,
        Err(_) => panic!("timed out waiting for {what}"),
    }
}

/// Polls `check` until it holds, for at most [`PATIENCE`].
async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let start = Instant::now();
    while !check().await {
        assert!(start.elapsed() < PATIENCE, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn info(version: &str) -> NodeInfo {
    NodeInfo {
        version: version.to_owned(),
        api_base_url: Some("http://10.0.0.1:7878".to_owned()),
        channels: vec!["telegram".to_owned()],
    }
}

#[test]
fn node_ids_are_checked() {
    assert_eq!(NodeId::parse("gw-1.eu_west").unwrap().as_str(), "gw-1.eu_west");
    assert_eq!(NodeId::parse(&"a".repeat(64)).unwrap().as_str().len(), 64);
    assert_eq!(NodeId::parse(""), Err(NodeIdError::Length));
    assert_eq!(NodeId::parse(&"a".repeat(65)), Err(NodeIdError::Length));
    for bad in ["gw 1", "gw/1", "gw:1", "gé", "gw\n1"] {
        assert_eq!(NodeId::parse(bad), Err(NodeIdError::Character), "{bad:?}");
    }
    let generated = NodeId::generate();
    assert_eq!(NodeId::parse(generated.as_str()).as_ref(), Ok(&generated));
    assert_ne!(generated, NodeId::generate());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_register_heartbeat_and_are_removed() {
    let Some(db) = db().await else { return };
    let a = db.node("node-a");
    let b = db.node("node-b");
    assert_eq!(a.heartbeat().await, Err(ClusterError::NotRegistered { node: a.node().clone() }));
    a.register_node(&info("1.0.0")).await.unwrap();
    b.register_node(&info("1.0.1")).await.unwrap();
    let before = a.heartbeat().await.unwrap();
    let after = a.heartbeat().await.unwrap();
    assert!(after >= before);

    // node-b's heartbeat is made old by the database's clock.
    db.client()
        .await
        .execute(
            "UPDATE cluster_nodes SET last_heartbeat = clock_timestamp() - interval '1 minute'
             WHERE node_id = 'node-b'",
            &[],
        )
        .await
        .unwrap();
    let nodes = a.nodes(Duration::from_secs(10)).await.unwrap();
    let summary: Vec<(&str, &str, bool)> =
        nodes.iter().map(|n| (n.id.as_str(), n.info.version.as_str(), n.alive)).collect();
    assert_eq!(summary, [("node-a", "1.0.0", true), ("node-b", "1.0.1", false)]);
    assert_eq!(nodes[0].info, info("1.0.0"));
    assert_eq!(nodes[0].last_heartbeat_ms, after);

    assert!(a.remove_node(b.node()).await.unwrap());
    assert!(!a.remove_node(b.node()).await.unwrap());
    assert_eq!(a.nodes(Duration::from_secs(10)).await.unwrap().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_racing_for_a_session_get_exactly_one_holder_every_time() {
    let Some(db) = db().await else { return };
    let a = db.node("node-a");
    let b = db.node("node-b");
    let keys: Vec<String> = (0..50).map(|i| format!("chat-{i}")).collect();

    let race = |epoch: i64| {
        let (a, b, keys) = (a.clone(), b.clone(), keys.clone());
        async move {
            let races = keys.iter().map(|key| {
                let (a, b) = (a.clone(), b.clone());
                async move {
                    let (won_a, won_b) =
                        tokio::join!(a.acquire_session(key, LONG), b.acquire_session(key, LONG));
                    (key.clone(), won_a.unwrap(), won_b.unwrap())
                }
            });
            for (key, won_a, won_b) in futures::future::join_all(races).await {
                let winner = match (won_a, won_b) {
                    (Some(lease), None) | (None, Some(lease)) => lease,
                    (a, b) => panic!("{key}: node-a got {a:?}, node-b got {b:?}"),
                };
                assert_eq!(winner.epoch, epoch, "{key}");
                let owner = a.owner_of(LeaseKind::Session, &key).await.unwrap().unwrap();
                assert_eq!((owner.node, owner.epoch, owner.live), (winner.node, epoch, true));
            }
        }
    };
    race(1).await;

    // Every lease lapses; both nodes race to take each over.
    db.client()
        .await
        .execute("UPDATE session_leases SET expires_at = clock_timestamp()", &[])
        .await
        .unwrap();
    assert_eq!(a.expired_sessions(100).await.unwrap().len(), 50);
    race(2).await;
    assert!(a.expired_sessions(100).await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_renews_in_place_and_another_node_waits() {
    let Some(db) = db().await else { return };
    let a = db.node("node-a");
    let b = db.node("node-b");
    let first = a.acquire_session("chat", Duration::from_secs(5)).await.unwrap().unwrap();
    assert_eq!(first.epoch, 1);
    let again = a.acquire_session("chat", LONG).await.unwrap().unwrap();
    assert_eq!(again.epoch, 1);
    assert!(again.expires_at_ms > first.expires_at_ms);
    assert_eq!(b.acquire_session("chat", LONG).await.unwrap(), None);

    // A second run of node-a (same id, nothing held) takes a new epoch.
    let restarted = db.node("node-a");
    assert_eq!(restarted.acquire_session("chat", LONG).await.unwrap().unwrap().epoch, 2);
    let report = a.renew_all(LONG).await.unwrap();
    assert_eq!(
        report.lost,
        [LostLease { kind: LeaseKind::Session, key: "chat".to_owned(), epoch: 1 }]
    );
    assert!(report.renewed.is_empty());

    // Released, it goes to the next node at once, one epoch on.
    let held = restarted.renew_all(LONG).await.unwrap().renewed;
    assert_eq!(held.len(), 1);
    assert!(restarted.release_session(&held[0]).await.unwrap());
    assert!(!restarted.release_session(&held[0]).await.unwrap());
    let owner = a.owner_of(LeaseKind::Session, "chat").await.unwrap().unwrap();
    assert!(!owner.live);
    assert!(a.expired_sessions(10).await.unwrap().is_empty(), "a released lease needs no takeover");
    assert_eq!(b.acquire_session("chat", LONG).await.unwrap().unwrap().epoch, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lapsed_lease_is_taken_over_and_its_old_holder_writes_nothing() {
    let Some(db) = db().await else { return };
    db.client().await.batch_execute("CREATE TABLE probe (what TEXT NOT NULL)").await.unwrap();
    let a = db.node("node-a");
    let b = db.node("node-b");
    a.set_slot_count(3).await.unwrap();
    let old = a.acquire_session("chat", LONG).await.unwrap().unwrap();
    let now = db.now_ms().await;
    assert_eq!(a.claim_slot(&old, "run-1", now).await.unwrap(), Some(0));

    db.expire(LeaseKind::Session, "chat").await;
    let stale = a.expired_sessions(10).await.unwrap();
    assert_eq!(stale.len(), 1);
    assert_eq!(
        (stale[0].key.as_str(), stale[0].node.as_str(), stale[0].epoch),
        ("chat", "node-a", 1)
    );
    let new = b.acquire_session("chat", LONG).await.unwrap().unwrap();
    assert_eq!(new.epoch, old.epoch + 1);

    let fenced = ClusterError::Fenced { key: "chat".to_owned(), epoch: 1 };
    let wrote = a
        .fenced_write(&old, async |tx| {
            tx.execute("INSERT INTO probe (what) VALUES ('stale')", &[]).await?;
            Ok::<_, ClusterError>(())
        })
        .await;
    assert_eq!(wrote, Err(fenced.clone()));
    assert_eq!(a.claim_slot(&old, "run-2", now).await, Err(fenced.clone()));
    assert_eq!(a.free_slot(&old, "run-1").await, Err(fenced.clone()));
    assert_eq!(db.count("SELECT count(*) FROM probe").await, 0);
    assert_eq!(db.count("SELECT count(*) FROM slot_requests").await, 0);
    assert_eq!(a.slots_in_use().await.unwrap(), 1, "the stale holder freed nothing");

    // The new owner writes; the old run's slot is taken back for recovery.
    b.fenced_write(&new, async |tx| {
        tx.execute("INSERT INTO probe (what) VALUES ('new')", &[]).await?;
        Ok::<_, ClusterError>(())
    })
    .await
    .unwrap();
    assert_eq!(db.count("SELECT count(*) FROM probe").await, 1);
    let freed = b.free_slots_of_expired().await.unwrap();
    assert_eq!(freed.len(), 1);
    assert_eq!(
        (freed[0].run_id.as_str(), freed[0].node.as_str(), freed[0].epoch),
        ("run-1", "node-a", 1)
    );
    assert_eq!(b.slots_in_use().await.unwrap(), 0);
    assert!(b.free_slots_of_expired().await.unwrap().is_empty());

    let report = a.renew_all(LONG).await.unwrap();
    assert_eq!(
        report.lost,
        [LostLease { kind: LeaseKind::Session, key: "chat".to_owned(), epoch: 1 }]
    );
    assert!(!a.holds(&old));
    assert!(b.holds(&new));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_takeover_waits_for_writes_fenced_by_the_old_epoch_but_renewals_do_not() {
    let Some(db) = db().await else { return };
    db.client().await.batch_execute("CREATE TABLE probe (what TEXT NOT NULL)").await.unwrap();
    let a = db.node("node-a");
    let b = db.node("node-b");
    let lease = a.acquire_session("chat", LONG).await.unwrap().unwrap();

    let (inside_tx, inside) = oneshot::channel::<()>();
    let (go, go_rx) = oneshot::channel::<()>();
    let writer = {
        let (a, lease) = (a.clone(), lease.clone());
        tokio::spawn(async move {
            a.fenced_write(&lease, async |tx| {
                tx.execute("INSERT INTO probe (what) VALUES ('old epoch')", &[]).await?;
                // Renewing on another connection does not wait for this one.
                let report = a.renew_all(LONG).await?;
                assert_eq!(report.renewed.len(), 1);
                inside_tx.send(()).unwrap();
                go_rx.await.unwrap();
                Ok::<_, ClusterError>(())
            })
            .await
        })
    };
    within("the fenced write to start", inside).await.unwrap();

    // The lease lapses while the write is open; the takeover waits for it.
    db.expire(LeaseKind::Session, "chat").await;
    let taker = {
        let b = b.clone();
        tokio::spawn(async move { b.acquire_session("chat", LONG).await })
    };
    eventually("the takeover to wait on the lease row", || async {
        db.count(
            "SELECT count(*) FROM pg_stat_activity
             WHERE datname = current_database() AND wait_event_type = 'Lock'",
        )
        .await
            == 1
    })
    .await;
    assert!(!taker.is_finished());
    go.send(()).unwrap();
    within("the fenced write", writer).await.unwrap().unwrap();
    let new = within("the takeover", taker).await.unwrap().unwrap().unwrap();
    assert_eq!(new.epoch, 2);
    assert_eq!(db.count("SELECT count(*) FROM probe").await, 1);
}

/// Claims a slot for `run`, trying again whenever `freed` moves (or, as the
/// gateway's polling fallback would, after half a second; counted in
/// `fallbacks`).
async fn wait_for_slot(
    cluster: &Cluster,
    lease: &Lease,
    run: &str,
    admitted_at_ms: i64,
    mut freed: watch::Receiver<u64>,
    fallbacks: &AtomicUsize,
) -> u32 {
    loop {
        freed.borrow_and_update();
        if let Some(slot) = cluster.claim_slot(lease, run, admitted_at_ms).await.unwrap() {
            return slot;
        }
        if timeout(Duration::from_millis(500), freed.changed()).await.is_err() {
            fallbacks.fetch_add(1, Ordering::Relaxed);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forty_claimers_on_three_slots_never_hold_more_than_three_and_all_get_one() {
    let Some(db) = db().await else { return };
    let nodes = [db.node("node-a"), db.node("node-b")];
    nodes[0].set_slot_count(3).await.unwrap();
    let mut leases = Vec::new();
    for i in 0..4 {
        let node = &nodes[i % 2];
        leases.push((
            node.clone(),
            node.acquire_session(&format!("chat-{i}"), LONG).await.unwrap().unwrap(),
        ));
    }
    let now = db.now_ms().await;
    let (freed, _) = watch::channel(0u64);
    let freed = Arc::new(freed);
    let fallbacks = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..40)
        .map(|i| {
            let (cluster, lease) = leases[i % 4].clone();
            let (freed, fallbacks, most) = (freed.clone(), fallbacks.clone(), most.clone());
            tokio::spawn(async move {
                let run = format!("run-{i}");
                let slot = wait_for_slot(
                    &cluster,
                    &lease,
                    &run,
                    now + i as i64,
                    freed.subscribe(),
                    &fallbacks,
                )
                .await;
                assert!(slot < 3);
                let in_use = cluster.slots_in_use().await.unwrap() as usize;
                assert!((1..=3).contains(&in_use), "{in_use} slots in use");
                most.fetch_max(in_use, Ordering::Relaxed);
                tokio::task::yield_now().await;
                assert!(cluster.free_slot(&lease, &run).await.unwrap());
                freed.send_modify(|n| *n += 1);
            })
        })
        .collect();
    within("every claimer", futures::future::try_join_all(tasks)).await.unwrap();
    assert!(most.load(Ordering::Relaxed) <= 3);
    assert_eq!(nodes[0].slots_in_use().await.unwrap(), 0);
    assert_eq!(db.count("SELECT count(*) FROM run_slots").await, 3);
    assert_eq!(db.count("SELECT count(*) FROM slot_requests").await, 0);
    note(&format!(
        "40 claimers on 3 slots: at most {} in use, {} polling fallbacks",
        most.load(Ordering::Relaxed),
        fallbacks.load(Ordering::Relaxed)
    ));
}

/// How many grants went to a claim while an older one still waited, and the
/// furthest a claim was granted after its place in admission order.
fn out_of_order(grants: &[usize]) -> (usize, usize) {
    let mut waiting: BTreeSet<usize> = grants.iter().copied().collect();
    let mut skipped = 0;
    let mut furthest = 0;
    for (position, &rank) in grants.iter().enumerate() {
        if waiting.first() != Some(&rank) {
            skipped += 1;
        }
        waiting.remove(&rank);
        furthest = furthest.max(position.saturating_sub(rank));
    }
    (skipped, furthest)
}

#[test]
fn out_of_order_counts_grants_that_pass_an_older_claim() {
    assert_eq!(out_of_order(&[0, 1, 2, 3]), (0, 0));
    assert_eq!(out_of_order(&[1, 0, 2, 3]), (1, 1));
    assert_eq!(out_of_order(&[3, 0, 1, 2]), (1, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn freed_slots_go_to_waiting_claims_in_admission_order() {
    let Some(db) = db().await else { return };
    let a = db.node("node-a");
    let b = db.node("node-b");
    a.set_slot_count(3).await.unwrap();
    let lease_a = a.acquire_session("chat-a", LONG).await.unwrap().unwrap();
    let lease_b = b.acquire_session("chat-b", LONG).await.unwrap().unwrap();
    let base = db.now_ms().await;
    for i in 0..3 {
        assert!(a.claim_slot(&lease_a, &format!("first-{i}"), base).await.unwrap().is_some());
    }
    let (freed, _) = watch::channel(0u64);
    let freed = Arc::new(freed);
    let fallbacks = Arc::new(AtomicUsize::new(0));

    // One at a time: every waiting claim is queued before the first slot is
    // freed, and each slot is freed only once the last one was granted.
    let (granted_tx, mut granted) = mpsc::channel::<usize>(64);
    let n = 20;
    for i in (0..n).map(|i| (i * 7) % n) {
        let (cluster, lease) =
            if i % 2 == 0 { (a.clone(), lease_a.clone()) } else { (b.clone(), lease_b.clone()) };
        let (freed, fallbacks, granted_tx) = (freed.clone(), fallbacks.clone(), granted_tx.clone());
        tokio::spawn(async move {
            let admitted = base + 10 + i as i64;
            wait_for_slot(
                &cluster,
                &lease,
                &format!("wait-{i}"),
                admitted,
                freed.subscribe(),
                &fallbacks,
            )
            .await;
            granted_tx.send(i).await.unwrap();
        });
    }
    eventually("every claim to be queued", || async {
        db.count("SELECT count(*) FROM slot_requests").await == n as i64
    })
    .await;
    let mut order = Vec::new();
    let mut holders: VecDeque<(Cluster, Lease, String)> =
        (0..3).map(|i| (a.clone(), lease_a.clone(), format!("first-{i}"))).collect();
    while order.len() < n {
        let (cluster, lease, run) = holders.pop_front().unwrap();
        assert!(cluster.free_slot(&lease, &run).await.unwrap());
        freed.send_modify(|v| *v += 1);
        let rank = within("a grant", granted.recv()).await.unwrap();
        order.push(rank);
        let (cluster, lease) =
            if rank % 2 == 0 { (a.clone(), lease_a.clone()) } else { (b.clone(), lease_b.clone()) };
        holders.push_back((cluster, lease, format!("wait-{rank}")));
        assert_eq!(a.slots_in_use().await.unwrap(), 3);
    }
    let (skipped, furthest) = out_of_order(&order);
    note(&format!("FIFO, slots freed one at a time: {skipped} of {n} grants out of order (furthest {furthest})"));
    assert_eq!(order, (0..n).collect::<Vec<_>>());
    for (cluster, lease, run) in holders {
        assert!(cluster.free_slot(&lease, &run).await.unwrap());
    }

    // Claims arriving while slots are being freed: every granted run frees its
    // slot at once, and a claim that finds a free slot and nobody older queued
    // takes it, whatever its admission time.
    let sessions = [(a.clone(), lease_a.clone()), (b.clone(), lease_b.clone())];
    let base = db.now_ms().await;
    let mut granted = spawn_busy_waiters(n, "busy", base, &sessions, &freed, &fallbacks);
    let order = collect_grants(n, &mut granted).await;
    let (skipped, furthest) = out_of_order(&order);
    note(&format!(
        "FIFO, claims arriving while slots free: {skipped} of {n} grants passed an older claim \
         (furthest {furthest})"
    ));
    eventually("every slot to be freed", || async { a.slots_in_use().await.unwrap() == 0 }).await;

    // Queued first, then freed concurrently: the three holders free their
    // slots at once and every granted run frees its slot at once, so grants
    // race each other only through SKIP LOCKED and statement snapshots.
    let base = db.now_ms().await;
    for i in 0..3 {
        assert!(a.claim_slot(&lease_a, &format!("hold-{i}"), base).await.unwrap().is_some());
    }
    let mut granted = spawn_busy_waiters(n, "queued", base + 10, &sessions, &freed, &fallbacks);
    eventually("every claim to be queued", || async {
        db.count("SELECT count(*) FROM slot_requests").await == n as i64
    })
    .await;
    let frees = (0..3).map(|i| {
        let (a, lease_a) = (a.clone(), lease_a.clone());
        async move { a.free_slot(&lease_a, &format!("hold-{i}")).await.unwrap() }
    });
    assert!(futures::future::join_all(frees).await.into_iter().all(|freed| freed));
    freed.send_modify(|v| *v += 1);
    let order = collect_grants(n, &mut granted).await;
    let (skipped, furthest) = out_of_order(&order);
    note(&format!(
        "FIFO, queued claims with concurrent frees: {skipped} of {n} grants passed an older \
         claim (furthest {furthest}); {} polling fallbacks in all",
        fallbacks.load(Ordering::Relaxed)
    ));
    eventually("every slot to be freed", || async { a.slots_in_use().await.unwrap() == 0 }).await;
}

/// Starts `n` runs (`<prefix>-<rank>`, admitted at `base + rank`, in a
/// scrambled order) that each wait for a slot, report their rank, and free
/// the slot at once.
fn spawn_busy_waiters(
    n: usize,
    prefix: &str,
    base: i64,
    sessions: &[(Cluster, Lease); 2],
    freed: &Arc<watch::Sender<u64>>,
    fallbacks: &Arc<AtomicUsize>,
) -> mpsc::Receiver<usize> {
    let (granted_tx, granted) = mpsc::channel::<usize>(64);
    for i in (0..n).map(|i| (i * 7) % n) {
        let (cluster, lease) = sessions[i % 2].clone();
        let (freed, fallbacks, granted_tx) = (freed.clone(), fallbacks.clone(), granted_tx.clone());
        let run = format!("{prefix}-{i}");
        tokio::spawn(async move {
            wait_for_slot(&cluster, &lease, &run, base + i as i64, freed.subscribe(), &fallbacks)
                .await;
            granted_tx.send(i).await.unwrap();
            assert!(cluster.free_slot(&lease, &run).await.unwrap());
            freed.send_modify(|v| *v += 1);
        });
    }
    granted
}

/// The ranks of `n` grants, in the order they came.
async fn collect_grants(n: usize, granted: &mut mpsc::Receiver<usize>) -> Vec<usize> {
    let mut order = Vec::new();
    while order.len() < n {
        order.push(within("a grant", granted.recv()).await.unwrap());
    }
    assert_eq!(order.iter().copied().collect::<BTreeSet<_>>().len(), n, "one grant each");
    order
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_of_a_dead_session_does_not_hold_the_queue_up() {
    let Some(db) = db().await else { return };
    let a = db.node("node-a");
    let b = db.node("node-b");
    a.set_slot_count(1).await.unwrap();
    let lease_a = a.acquire_session("chat-a", LONG).await.unwrap().unwrap();
    let lease_b = b.acquire_session("chat-b", LONG).await.unwrap().unwrap();
    let base = db.now_ms().await;
    assert_eq!(a.claim_slot(&lease_a, "running", base).await.unwrap(), Some(0));
    assert_eq!(a.claim_slot(&lease_a, "older", base + 1).await.unwrap(), None);
    assert_eq!(b.claim_slot(&lease_b, "newer", base + 2).await.unwrap(), None);
    assert!(a.free_slot(&lease_a, "running").await.unwrap());
    assert_eq!(
        b.claim_slot(&lease_b, "newer", base + 2).await.unwrap(),
        None,
        "the older claim is first"
    );

    // node-a dies: its queued claim no longer counts.
    db.expire(LeaseKind::Session, "chat-a").await;
    assert_eq!(b.claim_slot(&lease_b, "newer", base + 2).await.unwrap(), Some(0));
    b.free_slots_of_expired().await.unwrap();
    assert_eq!(db.count("SELECT count(*) FROM slot_requests").await, 0);

    // A claim made again keeps its slot, and one from another session is refused.
    assert_eq!(b.claim_slot(&lease_b, "newer", base + 2).await.unwrap(), Some(0));
    let lease_c = b.acquire_session("chat-c", LONG).await.unwrap().unwrap();
    assert_eq!(
        b.claim_slot(&lease_c, "newer", base).await,
        Err(ClusterError::RunInOtherSession {
            run_id: "newer".to_owned(),
            session_key: "chat-b".to_owned()
        })
    );
    // A withdrawn claim leaves the queue.
    assert_eq!(b.claim_slot(&lease_c, "queued", base).await.unwrap(), None);
    assert!(b.free_slot(&lease_c, "queued").await.unwrap());
    assert!(!b.free_slot(&lease_c, "queued").await.unwrap());
    assert_eq!(db.count("SELECT count(*) FROM slot_requests").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shrinking_the_slot_count_drains_occupied_slots_and_growing_adds_free_ones() {
    let Some(db) = db().await else { return };
    let a = db.node("node-a");
    let lease = a.acquire_session("chat", LONG).await.unwrap().unwrap();
    assert_eq!(a.set_slot_count(3).await.unwrap(), 0);
    let now = db.now_ms().await;
    for i in 0..3 {
        assert_eq!(a.claim_slot(&lease, &format!("run-{i}"), now).await.unwrap(), Some(i));
    }
    let slots = || db.count("SELECT count(*) FROM run_slots");

    // Down to one: the two occupied slots above it drain, nothing is freed.
    assert_eq!(a.set_slot_count(1).await.unwrap(), 2);
    assert_eq!(a.slots_in_use().await.unwrap(), 3);
    assert_eq!(a.claim_slot(&lease, "late", now + 1).await.unwrap(), None);
    assert!(a.free_slot(&lease, "run-2").await.unwrap());
    assert_eq!(slots().await, 2, "a drained slot goes once freed");
    assert_eq!(
        a.claim_slot(&lease, "late", now + 1).await.unwrap(),
        None,
        "slot 1 is still busy draining"
    );
    assert!(a.free_slot(&lease, "run-0").await.unwrap());
    assert_eq!(a.claim_slot(&lease, "late", now + 1).await.unwrap(), Some(0));
    assert_eq!(a.claim_slot(&lease, "later", now + 2).await.unwrap(), None);

    // Back up to four: the draining slot counts again, the rest are new.
    assert_eq!(a.set_slot_count(4).await.unwrap(), 0);
    assert_eq!(slots().await, 4);
    assert_eq!(a.claim_slot(&lease, "later", now + 2).await.unwrap(), Some(2));
    assert!(a.free_slot(&lease, "run-1").await.unwrap());
    assert_eq!(slots().await, 4, "slot 1 is not draining any more");
    assert_eq!(a.slots_in_use().await.unwrap(), 2);

    assert_eq!(a.set_slot_count(0).await.unwrap(), 2);
    assert_eq!(a.claim_slot(&lease, "never", now + 3).await.unwrap(), None);
    assert!(a.free_slot(&lease, "late").await.unwrap());
    assert!(a.free_slot(&lease, "later").await.unwrap());
    assert_eq!(slots().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_channel_has_one_owner_at_a_time() {
    let Some(db) = db().await else { return };
    let a = db.node("node-a");
    let b = db.node("node-b");
    for round in 0..10 {
        let name = format!("telegram-{round}");
        let (won_a, won_b) =
            tokio::join!(a.acquire_channel(&name, LONG), b.acquire_channel(&name, LONG));
        let winners = u8::from(won_a.unwrap().is_some()) + u8::from(won_b.unwrap().is_some());
        assert_eq!(winners, 1, "{name}");
    }
    let lease = a.acquire_channel("telegram", LONG).await.unwrap().unwrap();
    assert_eq!(lease.kind, LeaseKind::Channel);
    assert_eq!(b.acquire_channel("telegram", LONG).await.unwrap(), None);
    // A session of the same name is another lease.
    assert!(b.acquire_session("telegram", LONG).await.unwrap().is_some());
    let renewed = a.renew_all(LONG).await.unwrap();
    assert!(renewed.renewed.iter().any(|l| l.kind == LeaseKind::Channel && l.key == "telegram"));

    assert!(a.release_channel(&lease).await.unwrap());
    let taken = b.acquire_channel("telegram", LONG).await.unwrap().unwrap();
    assert_eq!(taken.epoch, 2);
    let wrote = a.fenced_write(&lease, async |_tx| Ok::<_, ClusterError>(())).await;
    assert_eq!(wrote, Err(ClusterError::Fenced { key: "telegram".to_owned(), epoch: 1 }));
    b.fenced_write(&taken, async |_tx| Ok::<_, ClusterError>(())).await.unwrap();

    db.expire(LeaseKind::Channel, "telegram").await;
    let report = b.renew_all(LONG).await.unwrap();
    assert_eq!(
        report.lost,
        [LostLease { kind: LeaseKind::Channel, key: "telegram".to_owned(), epoch: 2 }]
    );
    assert_eq!(a.acquire_channel("telegram", LONG).await.unwrap().unwrap().epoch, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_control_request_reaches_its_node_and_its_answer_comes_back() {
    let Some(db) = db().await else { return };
    let a = db.node("node-a");
    let b = db.node("node-b");
    let cancel = a.send_control(b.node(), "run-1", ControlKind::Cancel, "").await.unwrap();
    let steer =
        a.send_control(b.node(), "run-2", ControlKind::Steer, "also check the logs").await.unwrap();
    assert!(a.take_controls().await.unwrap().is_empty(), "not for node-a");

    let taken = b.take_controls().await.unwrap();
    let summary: Vec<(i64, &str, ControlKind, &str)> =
        taken.iter().map(|c| (c.id, c.run_id.as_str(), c.kind, c.body.as_str())).collect();
    assert_eq!(
        summary,
        [
            (cancel, "run-1", ControlKind::Cancel, ""),
            (steer, "run-2", ControlKind::Steer, "also check the logs")
        ]
    );
    assert!(b.take_controls().await.unwrap().is_empty(), "a request is taken once");

    assert_eq!(a.control_answer(cancel).await.unwrap(), None);
    assert!(b.answer_control(cancel, "cancelled").await.unwrap());
    assert!(!b.answer_control(cancel, "again").await.unwrap());
    assert_eq!(a.control_answer(cancel).await.unwrap().as_deref(), Some("cancelled"));
    assert_eq!(a.control_answer(steer).await.unwrap(), None);

    assert_eq!(a.prune_controls(Duration::from_secs(60)).await.unwrap(), 0);
    db.client()
        .await
        .execute("UPDATE cluster_control SET created_at = created_at - interval '2 minutes'", &[])
        .await
        .unwrap();
    assert_eq!(a.prune_controls(Duration::from_secs(60)).await.unwrap(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cluster_config_is_a_compare_and_swap() {
    let Some(db) = db().await else { return };
    let a = db.node("node-a");
    let b = db.node("node-b");
    let empty = a.config().await.unwrap();
    assert_eq!((empty.version, empty.body.as_str(), empty.updated_by), (0, "", None));
    assert_eq!(a.put_config(0, "max_concurrent_runs = 3").await.unwrap(), 1);
    assert_eq!(
        b.put_config(0, "max_concurrent_runs = 9").await,
        Err(ClusterError::Conflict { expected: 0, found: 1 })
    );
    let config = b.config().await.unwrap();
    assert_eq!((config.version, config.body.as_str()), (1, "max_concurrent_runs = 3"));
    assert_eq!(config.updated_by.as_ref(), Some(a.node()));

    let writers = (0..10).map(|i| {
        let node = if i % 2 == 0 { a.clone() } else { b.clone() };
        async move { node.put_config(1, &format!("max_concurrent_runs = {i}")).await }
    });
    let results = futures::future::join_all(writers).await;
    assert_eq!(results.iter().filter(|r| r.is_ok()).count(), 1);
    assert!(results
        .iter()
        .all(|r| matches!(r, Ok(2) | Err(ClusterError::Conflict { expected: 1, found: 2 }))));
    assert_eq!(a.config().await.unwrap().version, 2);
}

/// The next notification that is not a resync.
async fn next_notified(listener: &mut Listener) -> (Topic, String) {
    loop {
        match within("a notification", listener.recv()).await.unwrap() {
            Notice::Notified { topic, payload } => return (topic, payload),
            Notice::Resync => {}
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_listener_yields_notifications_and_resyncs_after_its_connection_is_killed() {
    let Some(db) = db().await else { return };
    let a = db.node("node-a");
    let tracker = TaskTracker::new();
    let token = CancellationToken::new();
    let pg: tokio_postgres::Config = db.url.parse().unwrap();
    let mut listener = Listener::spawn(
        pg,
        tokio_postgres::NoTls,
        &[Topic::Control, Topic::Config],
        &tracker,
        token.clone(),
    );
    assert_eq!(within("listening", listener.recv()).await, Some(Notice::Resync));

    a.send_control(&NodeId::parse("node-b").unwrap(), "run-1", ControlKind::Cancel, "")
        .await
        .unwrap();
    assert_eq!(next_notified(&mut listener).await, (Topic::Control, "node-b".to_owned()));
    a.set_slot_count(2).await.unwrap(); // on a topic not listened to
    a.put_config(0, "x = 1").await.unwrap();
    assert_eq!(next_notified(&mut listener).await, (Topic::Config, "1".to_owned()));

    let killed = db
        .count(&format!(
            "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity
             WHERE datname = current_database() AND application_name = '{APPLICATION_NAME}') t"
        ))
        .await;
    assert_eq!(killed, 1);
    assert_eq!(within("a resync", listener.recv()).await, Some(Notice::Resync));
    a.put_config(1, "x = 2").await.unwrap();
    assert_eq!(next_notified(&mut listener).await, (Topic::Config, "2".to_owned()));

    token.cancel();
    tracker.close();
    within("the listener to stop", tracker.wait()).await;
    assert_eq!(listener.recv().await, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_keeper_renews_leases_and_fences_the_node_before_they_can_lapse() {
    let Some(db) = db().await else { return };
    let a = db.node("node-a");
    a.register_node(&info("1.0.0")).await.unwrap();
    let term = Duration::from_millis(900);
    let tracker = TaskTracker::new();
    let token = CancellationToken::new();
    let keeper = LeaseKeeper::spawn(
        a.clone(),
        KeeperConfig { term, info: info("1.0.0") },
        &tracker,
        token.clone(),
    );
    let mut lost = keeper.subscribe_lost();
    let lease = a.acquire_session("chat", term).await.unwrap().unwrap();
    let other = a.acquire_session("other", term).await.unwrap().unwrap();

    // Renewed past its first expiry, and still live after it.
    eventually("a renewal", || async {
        a.owner_of(LeaseKind::Session, "chat").await.unwrap().unwrap().expires_at_ms
            > lease.expires_at_ms
    })
    .await;
    // A lease taken away is reported lost.
    db.expire(LeaseKind::Session, "other").await;
    let gone = within("a lost lease", lost.recv()).await.unwrap();
    assert_eq!((gone.key.as_str(), gone.epoch), ("other", other.epoch));
    assert!(!keeper.fenced().is_cancelled());

    // The lease row is locked away: renewals hang, and the node is fenced
    // before the lease lapses by the database's clock.
    let mut blocker = db.client().await;
    let block = blocker.transaction().await.unwrap();
    block
        .execute("SELECT 1 FROM session_leases WHERE session_key = 'chat' FOR UPDATE", &[])
        .await
        .unwrap();
    let blocked_at = Instant::now();
    within("the node to be fenced", keeper.fenced().cancelled()).await;
    let fenced_after = blocked_at.elapsed();
    let db_now = db.now_ms().await;
    // The last renewal that landed, read past the lock.
    let expires = a.owner_of(LeaseKind::Session, "chat").await.unwrap().unwrap().expires_at_ms;
    block.rollback().await.unwrap();
    note(&format!(
        "keeper fenced {fenced_after:?} after renewals blocked, {} ms before the lease lapsed",
        expires - db_now
    ));
    assert!(fenced_after < term * 2 / 3 + Duration::from_millis(200), "{fenced_after:?}");
    assert!(db_now < expires, "fenced at {db_now}, the lease lapsed at {expires}");
    assert!(!a.holds(&lease));
    within("the keeper to stop", async {
        tracker.close();
        tracker.wait().await;
    })
    .await;
    // Forgotten: a renewal now renews nothing, and acquiring again is a new epoch.
    assert!(a.renew_all(term).await.unwrap().renewed.is_empty());
    assert_eq!(a.acquire_session("chat", term).await.unwrap().unwrap().epoch, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_keeper_fences_the_node_when_its_database_is_gone() {
    let Some(server) = server_url() else {
        note(&format!("skipped: {URL_VAR} is unset"));
        return;
    };
    let Some(db) = db().await else { return };
    let a = db.node("node-a");
    a.register_node(&info("1.0.0")).await.unwrap();
    let term = Duration::from_millis(600);
    let tracker = TaskTracker::new();
    let keeper = LeaseKeeper::spawn(
        a.clone(),
        KeeperConfig { term, info: info("1.0.0") },
        &tracker,
        CancellationToken::new(),
    );
    a.acquire_session("chat", term).await.unwrap().unwrap();

    let name: String =
        db.client().await.query_one("SELECT current_database()", &[]).await.unwrap().get(0);
    let (admin, connection) =
        tokio_postgres::connect(&server, tokio_postgres::NoTls).await.unwrap();
    let driver = tokio::spawn(connection);
    admin.batch_execute(&format!("DROP DATABASE {name} WITH (FORCE)")).await.unwrap();
    let dropped_at = Instant::now();
    within("the node to be fenced", keeper.fenced().cancelled()).await;
    assert!(
        dropped_at.elapsed() < term * 2 / 3 + Duration::from_millis(200),
        "{:?}",
        dropped_at.elapsed()
    );
    tracker.close();
    within("the keeper to stop", tracker.wait()).await;
    drop(admin);
    let _ = driver.await;
}

/// One answer of a [`FakeRenewer`].
#[derive(Clone)]
enum Step {
    Renewed(Vec<LostLease>),
    Failed,
    Hangs,
}

/// A renewer that answers from a script (the last step repeats), records
/// when it was called and whether it was fenced.
#[derive(Clone, Default)]
struct FakeRenewer {
    script: Arc<Mutex<VecDeque<Step>>>,
    calls: Arc<Mutex<Vec<Instant>>>,
    fenced: Arc<AtomicUsize>,
}

impl FakeRenewer {
    fn new(steps: impl IntoIterator<Item = Step>) -> Self {
        let fake = FakeRenewer::default();
        fake.script.lock().unwrap().extend(steps);
        fake
    }

    fn calls_after(&self, start: Instant) -> Vec<u64> {
        self.calls.lock().unwrap().iter().map(|t| (*t - start).as_millis() as u64).collect()
    }
}

#[async_trait::async_trait]
impl Renewer for FakeRenewer {
    async fn renew_all(&self, _term: Duration) -> Result<RenewReport, ClusterError> {
        self.calls.lock().unwrap().push(Instant::now());
        let step = {
            let mut script = self.script.lock().unwrap();
            if script.len() > 1 {
                script.pop_front()
            } else {
                script.front().cloned()
            }
        };
        match step.unwrap_or(Step::Renewed(Vec::new())) {
            Step::Renewed(lost) => Ok(RenewReport { renewed: Vec::new(), lost }),
            Step::Failed => Err(ClusterError::Unavailable { message: "refused".to_owned() }),
            Step::Hangs => std::future::pending().await,
        }
    }

    async fn heartbeat(&self) -> Result<(), ClusterError> {
        Ok(())
    }

    fn fence(&self) {
        self.fenced.fetch_add(1, Ordering::Relaxed);
    }
}

/// Runs a keeper with `term` over `fake` until it fences the node; returns
/// when that was, after the start.
async fn fenced_after(fake: &FakeRenewer, term: Duration) -> Duration {
    let tracker = TaskTracker::new();
    let start = Instant::now();
    let keeper = LeaseKeeper::spawn_with(fake.clone(), term, &tracker, CancellationToken::new());
    keeper.fenced().cancelled().await;
    let at = start.elapsed();
    tracker.close();
    tracker.wait().await;
    assert_eq!(fake.fenced.load(Ordering::Relaxed), 1);
    at
}

#[tokio::test(start_paused = true)]
async fn the_keeper_fences_two_thirds_of_a_term_after_its_last_renewal_when_renewals_fail() {
    let ok = || Step::Renewed(Vec::new());
    let fake = FakeRenewer::new([ok(), ok(), ok(), Step::Failed]);
    let start = Instant::now();
    let term = Duration::from_millis(900);
    assert_eq!(fenced_after(&fake, term).await, Duration::from_millis(600 + 600));
    // Every third of the term, then once more at the deadline.
    assert_eq!(fake.calls_after(start), [0, 300, 600, 900, 1200]);
}

#[tokio::test(start_paused = true)]
async fn the_keeper_fences_at_the_deadline_when_a_renewal_hangs() {
    let fake =
        FakeRenewer::new([Step::Renewed(Vec::new()), Step::Renewed(Vec::new()), Step::Hangs]);
    let start = Instant::now();
    assert_eq!(
        fenced_after(&fake, Duration::from_millis(900)).await,
        Duration::from_millis(300 + 600)
    );
    assert_eq!(fake.calls_after(start), [0, 300, 600]);
}

#[tokio::test(start_paused = true)]
async fn the_keeper_survives_failures_shorter_than_two_thirds_of_a_term() {
    let ok = || Step::Renewed(Vec::new());
    let fake = FakeRenewer::new([ok(), Step::Failed, ok(), Step::Failed, ok()]);
    let tracker = TaskTracker::new();
    let token = CancellationToken::new();
    let keeper =
        LeaseKeeper::spawn_with(fake.clone(), Duration::from_millis(900), &tracker, token.clone());
    tokio::time::sleep(Duration::from_millis(8_950)).await;
    assert!(!keeper.fenced().is_cancelled());
    assert_eq!(fake.calls.lock().unwrap().len(), 30);

    // Shutting down is not being fenced.
    token.cancel();
    tracker.close();
    tracker.wait().await;
    assert!(!keeper.fenced().is_cancelled());
    assert_eq!(fake.fenced.load(Ordering::Relaxed), 0);
}

#[tokio::test(start_paused = true)]
async fn the_keeper_publishes_lost_leases() {
    let lost = LostLease { kind: LeaseKind::Session, key: "chat".to_owned(), epoch: 4 };
    let fake = FakeRenewer::new([
        Step::Renewed(Vec::new()),
        Step::Renewed(vec![lost.clone()]),
        Step::Renewed(Vec::new()),
    ]);
    let tracker = TaskTracker::new();
    let token = CancellationToken::new();
    let keeper = LeaseKeeper::spawn_with(fake, Duration::from_millis(900), &tracker, token.clone());
    let mut subscriber = keeper.subscribe_lost();
    assert_eq!(subscriber.recv().await.unwrap(), lost);
    token.cancel();
    tracker.close();
    tracker.wait().await;
}
