//! The relay, on the PostgreSQL server `LEMON_TEST_POSTGRES_URL` names
//! (skipped when it is unset): followers on node A of runs node B runs.

use std::time::Duration;

use super::testing::{
    completed, delta, new_run, run_id, two_nodes, within, Member, TwoNodes, LONG,
};
use super::*;
use crate::cluster::listener::APPLICATION_NAME;
use crate::router::{Followed, RunFollower};

/// Runs `run` on `node` as the gateway does: its events stored, then
/// published on the node's own bus.
async fn emit(node: &Member, event: Arc<BusEvent>) {
    node.handle.append_event(event.clone()).await;
    node.bus.publish(event);
}

/// Stores `events` with no notification, as if their notifications were lost.
async fn store_silently(nodes: &TwoNodes, events: &[Arc<BusEvent>]) {
    let client = nodes.client().await;
    for event in events {
        let data = serde_json::to_string(&event.json()).unwrap();
        client
            .execute(
                "INSERT INTO run_events (run_id, idx, kind, data) VALUES ($1, $2, $3, $4)",
                &[
                    &event.run_id.as_str(),
                    &i64::try_from(event.index).unwrap(),
                    &event.kind.type_name(),
                    &data,
                ],
            )
            .await
            .unwrap();
    }
}

/// A follower on node `a` of `run`, which it does not run, made before the
/// run stored anything (as for a request handed to the run's node): it reads
/// the store only when the live events show a gap.
fn follow(a: &Member, run: &RunId) -> RunFollower {
    RunFollower::new(run.clone(), a.bus.subscribe_run(run), a.handle.clone(), true)
}

/// Every event the follower hands out until its end, as `(index, type, live)`.
async fn rest(follower: &mut RunFollower) -> Vec<(u64, String, bool)> {
    let mut seen = Vec::new();
    while let Some(event) = within("the run's next event", follower.next()).await {
        seen.push(seen_as(&event));
    }
    seen
}

fn seen_as(event: &Followed) -> (u64, String, bool) {
    (event.index(), event.type_name().to_owned(), matches!(event, Followed::Event(_)))
}

/// A run of session `s` that node `b` runs.
async fn run_on_b(nodes: &TwoNodes, run: &RunId) {
    let lease = nodes.b.hold("s").await;
    nodes.b.node.register_run(run.as_str(), &lease);
    nodes.b.handle.insert_run(new_run(run, "s")).await;
}

/// Starts the relay on `a` and a follower there of a run `b` runs, and
/// waits for the run's first event to be relayed on its notification: from
/// then on `a` listens and the relay has read what the listener's first
/// resync asked for.
async fn following(nodes: &TwoNodes, run: &RunId) -> RunFollower {
    let (a, b) = (&nodes.a, &nodes.b);
    spawn_relay(a.node.clone(), a.bus.clone(), &nodes.tracker, nodes.token.clone());
    run_on_b(nodes, run).await;
    let mut follower = follow(a, run);
    emit(b, delta(run, "s", 1, "one")).await;
    b.handle.flush().await.unwrap();
    let first = within("the first event", follower.next()).await.unwrap();
    assert_eq!(seen_as(&first), (1, "delta".to_owned(), true));
    let published = delta(run, "s", 1, "one");
    assert_eq!(first.event().map(|e| &**e), Some(&*published), "relayed as it was published");
    follower
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_sees_a_run_on_another_node_once_in_order_to_its_completion() {
    // Sweeps too rare to matter: notifications carry the events.
    let Some(nodes) = two_nodes(LONG).await else { return };
    let (a, b) = (&nodes.a, &nodes.b);
    let run = run_id("run-on-b");
    let mut follower = following(&nodes, &run).await;

    for index in 2..=4 {
        emit(b, delta(&run, "s", index, "more")).await;
    }
    b.handle.flush().await.unwrap();
    emit(b, delta(&run, "s", 5, "last")).await;
    emit(b, completed(&run, "s", 6, "one more last")).await;
    b.handle.flush().await.unwrap();

    let mut seen = Vec::new();
    while let Some(event) = within("the run's next event", follower.next()).await {
        if let Followed::Event(live) = &event {
            assert_eq!(live.session_key.as_str(), "s");
        }
        seen.push(event);
    }
    let indexes: Vec<(u64, String, bool)> = seen.iter().map(seen_as).collect();
    let expected: Vec<(u64, String, bool)> = (2..=5)
        .map(|index| (index, "delta".to_owned(), true))
        .chain([(6, "run_completed".to_owned(), true)])
        .collect();
    assert_eq!(indexes, expected);
    let completion = seen.last().and_then(Followed::completed).expect("typed completion");
    assert_eq!(*completion, completed(&run, "s", 6, "one more last"));
    assert_eq!(a.bus.n_topics(), 0, "the completion closed the run's topic");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_whose_notifications_were_missed_arrive_with_the_next_sweep() {
    let Some(nodes) = two_nodes(Duration::from_millis(100)).await else { return };
    let run = run_id("run-on-b");
    let mut follower = following(&nodes, &run).await;
    let waiting = tokio::spawn(async move { rest(&mut follower).await });

    store_silently(&nodes, &[delta(&run, "s", 2, "two"), delta(&run, "s", 3, "three")]).await;
    store_silently(&nodes, &[completed(&run, "s", 4, "done")]).await;

    let seen = within("the follower", waiting).await.unwrap();
    assert_eq!(
        seen,
        [
            (2, "delta".to_owned(), true),
            (3, "delta".to_owned(), true),
            (4, "run_completed".to_owned(), true)
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listener_that_connects_again_makes_the_relay_read_what_it_missed() {
    // Sweeps too rare to matter.
    let Some(nodes) = two_nodes(LONG).await else { return };
    let run = run_id("run-on-b");
    let mut follower = following(&nodes, &run).await;
    let waiting = tokio::spawn(async move { rest(&mut follower).await });

    store_silently(&nodes, &[delta(&run, "s", 2, "two"), completed(&run, "s", 3, "done")]).await;
    let killed: i64 = nodes
        .client()
        .await
        .query_one(
            "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity
             WHERE datname = current_database() AND application_name = $1) t",
            &[&APPLICATION_NAME],
        )
        .await
        .unwrap()
        .get(0);
    assert!(killed >= 1, "node a's listener was killed");

    let seen = within("the follower", waiting).await.unwrap();
    assert_eq!(seen, [(2, "delta".to_owned(), true), (3, "run_completed".to_owned(), true)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_of_this_node_are_not_relayed() {
    let Some(nodes) = two_nodes(LONG).await else { return };
    let (a, b) = (&nodes.a, &nodes.b);
    spawn_relay(a.node.clone(), a.bus.clone(), &nodes.tracker, nodes.token.clone());
    let (here, there) = (run_id("run-on-a"), run_id("run-on-b"));
    let lease = a.hold("t").await;
    a.node.register_run(here.as_str(), &lease);
    run_on_b(&nodes, &there).await;
    let mut mine = a.bus.subscribe_run(&here);
    let mut theirs = a.bus.subscribe_run(&there);

    // Stored, not published: only the relay could bring it to the topic.
    a.handle.append_event(delta(&here, "t", 1, "here")).await;
    a.handle.flush().await.unwrap();
    emit(b, delta(&there, "s", 1, "there")).await;
    b.handle.flush().await.unwrap();

    // Notifications come in commit order: once the later one is relayed,
    // the earlier one has been handled.
    let relayed = within("the other node's event", theirs.recv()).await.unwrap();
    assert_eq!(relayed.run_id, there);
    assert_eq!(mine.try_recv(), Ok(None));
}
