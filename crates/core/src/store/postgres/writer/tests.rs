//! Fenced writes and event notifications, on the PostgreSQL server
//! `LEMON_TEST_POSTGRES_URL` names (skipped when it is unset).

use std::collections::HashMap;

use serde_json::json;

use crate::bus::RunStatus;
use crate::cluster::listener::{Listener, Notice, Topic};
use crate::cluster::node::relay::testing::{
    completed, delta, new_run, run_id, store, two_nodes, within, TwoNodes, LONG,
};
use crate::engine::Completion;
use crate::ids::{RunId, SessionKey};
use crate::store::{FinishedRun, StoreHandle};

/// The text of each stored delta of `run`, in index order (`None`: another kind).
async fn stored_texts(store: &StoreHandle, run: &RunId) -> Vec<(u64, Option<String>)> {
    let events = store.run_events(run.as_str()).await.unwrap();
    events
        .into_iter()
        .map(|e| (e.index, e.data.get("text").and_then(|t| t.as_str()).map(str::to_owned)))
        .collect()
}

async fn status(store: &StoreHandle, run: &RunId) -> RunStatus {
    store.get_run(run.as_str()).await.unwrap().expect("the run is stored").status
}

fn finished(run: &RunId) -> FinishedRun {
    FinishedRun {
        run_id: run.clone(),
        engine: "echo".to_owned(),
        completion: Completion::success("done", None),
        completed_at_ms: 10,
        duration_ms: 3,
        spend: Default::default(),
    }
}

/// A listener on [`Topic::Events`] of the nodes' database, listening.
async fn events_listener(nodes: &TwoNodes) -> Listener {
    let (pg, tls) = nodes.a.store.connection_settings();
    let mut listener =
        Listener::spawn(pg, tls, &[Topic::Events], &nodes.tracker, nodes.token.clone());
    assert_eq!(within("listening", listener.recv()).await, Some(Notice::Resync));
    listener
}

async fn next_payload(listener: &mut Listener) -> String {
    match within("a notification", listener.recv()).await {
        Some(Notice::Notified { topic: Topic::Events, payload }) => payload,
        other => panic!("expected an events notification, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_writes_only_while_its_node_holds_the_session_lease() {
    let Some(nodes) = two_nodes(LONG).await else { return };
    let (a, b) = (&nodes.a, &nodes.b);
    let session = SessionKey::from("s");
    let run = run_id("r1");
    let lease_a = a.hold("s").await;
    a.node.register_run(run.as_str(), &lease_a);
    a.handle.insert_run(new_run(&run, "s")).await;
    a.handle.append_event(delta(&run, "s", 1, "a1")).await;
    a.handle.put_chat_state(&session, "echo", "token-a", 1).await;
    a.handle.flush().await.unwrap();
    assert_eq!(stored_texts(&a.handle, &run).await, [(1, Some("a1".to_owned()))]);
    assert_eq!(status(&a.handle, &run).await, RunStatus::Queued);

    // A stops renewing; B takes the session over at the next epoch.
    nodes.expire_session("s").await;
    let lease_b = b.hold("s").await;
    assert_eq!(lease_b.epoch, lease_a.epoch + 1);
    b.node.register_run(run.as_str(), &lease_b);

    // A still runs the run as far as it knows: none of its writes land, but
    // an unfenced write queued with them does.
    a.handle.append_event(delta(&run, "s", 2, "a2")).await;
    a.handle.mark_running(run.clone(), "echo".to_owned(), 5).await;
    a.handle.delete_chat_state(&session).await;
    a.handle.kv_put("ns", "k", json!("from a"), None).await;
    a.handle.finalize_run(finished(&run)).await;
    a.handle.flush().await.unwrap();
    assert_eq!(stored_texts(&a.handle, &run).await, [(1, Some("a1".to_owned()))]);
    assert_eq!(status(&a.handle, &run).await, RunStatus::Queued);
    let state = a.handle.get_chat_state(&session, 2).await.unwrap();
    assert_eq!(state.map(|s| s.last_resume_token).as_deref(), Some("token-a"));
    assert_eq!(a.handle.kv_get("ns", "k", 2).await.unwrap(), Some(json!("from a")));

    // B's land.
    b.handle.append_event(delta(&run, "s", 2, "b2")).await;
    b.handle.append_event(completed(&run, "s", 3, "done")).await;
    b.handle.finalize_run(finished(&run)).await;
    b.handle.put_chat_state(&session, "echo", "token-b", 3).await;
    b.handle.flush().await.unwrap();
    assert_eq!(
        stored_texts(&b.handle, &run).await,
        [(1, Some("a1".to_owned())), (2, Some("b2".to_owned())), (3, None)]
    );
    assert_eq!(status(&b.handle, &run).await, RunStatus::Completed);
    let state = b.handle.get_chat_state(&session, 4).await.unwrap();
    assert_eq!(state.map(|s| s.last_resume_token).as_deref(), Some("token-b"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_released_lease_drops_the_writes_of_its_runs() {
    let Some(nodes) = two_nodes(LONG).await else { return };
    let a = &nodes.a;
    let run = run_id("r1");
    let lease = a.hold("s").await;
    a.node.register_run(run.as_str(), &lease);
    a.handle.insert_run(new_run(&run, "s")).await;
    a.handle.flush().await.unwrap();
    assert!(a.node.cluster().release_session(&lease).await.unwrap());
    a.handle.append_event(delta(&run, "s", 1, "late")).await;
    a.handle.flush().await.unwrap();
    assert_eq!(stored_texts(&a.handle, &run).await, []);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_node_drops_its_runs_writes_without_asking_the_database() {
    let Some(nodes) = two_nodes(LONG).await else { return };
    let a = &nodes.a;
    let run = run_id("r1");
    let lease = a.hold("s").await;
    a.node.register_run(run.as_str(), &lease);
    a.handle.insert_run(new_run(&run, "s")).await;
    a.handle.append_event(delta(&run, "s", 1, "before")).await;
    a.handle.flush().await.unwrap();

    // The lease row locked: a fenced write that asked the database would
    // wait for it.
    let mut client = nodes.client().await;
    let lock = client.transaction().await.unwrap();
    let n = lock
        .execute("SELECT 1 FROM session_leases WHERE session_key = 's' FOR UPDATE", &[])
        .await
        .unwrap();
    assert_eq!(n, 1);

    a.store.fences().fence_all();
    a.handle.append_event(delta(&run, "s", 2, "after")).await;
    a.handle.finalize_run(finished(&run)).await;
    a.handle.kv_put("ns", "k", json!(1), None).await;
    within("a flush that does not wait for the lease row", a.handle.flush()).await.unwrap();
    lock.rollback().await.unwrap();

    assert_eq!(stored_texts(&a.handle, &run).await, [(1, Some("before".to_owned()))]);
    assert_eq!(status(&a.handle, &run).await, RunStatus::Queued);
    assert_eq!(
        a.handle.kv_get("ns", "k", 2).await.unwrap(),
        Some(json!(1)),
        "unfenced writes land"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_batch_notifies_each_run_once_with_its_highest_index() {
    let Some(nodes) = two_nodes(LONG).await else { return };
    let a = &nodes.a;
    let mut listener = events_listener(&nodes).await;

    // A store that is no cluster node notifies nothing.
    let quiet = StoreHandle::new(store(&nodes.url).await);
    quiet.append_event(delta(&run_id("quiet"), "q", 1, "x")).await;
    quiet.flush().await.unwrap();

    // The writer stuck on a fenced write (its lease row locked) while the
    // next events queue up behind it: they are one batch.
    let (r0, r1, r2) = (run_id("r0"), run_id("r:1"), run_id("r2"));
    let lease = a.hold("s").await;
    a.node.register_run(r0.as_str(), &lease);
    let mut client = nodes.client().await;
    let lock = client.transaction().await.unwrap();
    lock.execute("SELECT 1 FROM session_leases WHERE session_key = 's' FOR UPDATE", &[])
        .await
        .unwrap();
    a.handle.append_event(delta(&r0, "s", 1, "x")).await;
    for index in 1..=3 {
        a.handle.append_event(delta(&r1, "t", index, "x")).await;
    }
    for index in 1..=2 {
        a.handle.append_event(delta(&r2, "t", index, "x")).await;
    }
    lock.rollback().await.unwrap();
    a.handle.flush().await.unwrap();

    let mut seen: HashMap<String, Vec<String>> = HashMap::new();
    for _ in 0..3 {
        let payload = next_payload(&mut listener).await;
        let (run, _) = payload.rsplit_once(':').unwrap();
        seen.entry(run.to_owned()).or_default().push(payload.clone());
    }
    let expected: HashMap<String, Vec<String>> = [
        ("r0".to_owned(), vec!["r0:1".to_owned()]),
        ("r:1".to_owned(), vec!["r:1:3".to_owned()]),
        ("r2".to_owned(), vec!["r2:2".to_owned()]),
    ]
    .into();
    assert_eq!(seen, expected);

    // Nothing else was sent: the next notification is the next batch's.
    a.handle.append_event(completed(&r2, "t", 3, "done")).await;
    a.handle.flush().await.unwrap();
    assert_eq!(next_payload(&mut listener).await, "r2:3");
}
