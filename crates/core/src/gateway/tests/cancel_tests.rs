//! A cancelled run completes only once its engine has stopped: until then it is
//! `cancelling`, holds its slot, its engine lock and its conversation.

use tokio::time::Instant;

use super::*;

/// The next event of `run_id`, skipping other runs' events.
async fn next_of(events: &mut Subscription, run_id: &RunId) -> Arc<BusEvent> {
    loop {
        let event = tokio::time::timeout(Duration::from_secs(3600), events.recv())
            .await
            .expect("an event comes")
            .expect("no lag in tests");
        if &event.run_id == run_id {
            return event;
        }
    }
}

/// Skips events of `run_id` until one of type `kind`.
async fn until_type(events: &mut Subscription, run_id: &RunId, kind: &str) -> Arc<BusEvent> {
    loop {
        let event = next_of(events, run_id).await;
        if event.kind.type_name() == kind {
            return event;
        }
    }
}

async fn status(h: &Harness, run_id: &RunId) -> (Option<RunStatus>, RunStatus) {
    let active = h.gateway.active_run(run_id).await.unwrap().map(|run| run.status);
    let stored = h.gateway.store().get_run(run_id.as_str()).await.unwrap().unwrap().status;
    (active, stored)
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_run_is_cancelling_until_its_engine_stops_and_holds_its_session_meanwhile() {
    let mut h = harness(config(4));
    let lingering = h.gateway.submit(request("s", "linger:1500")).await.unwrap();
    let next = h.gateway.submit(request("s", "ok after")).await.unwrap();
    until_type(&mut h.events, &lingering, "engine_started").await;

    let cancelled_at = Instant::now();
    h.gateway.cancel(&lingering, RunError::UserRequested).await.unwrap();
    let status_event = until_type(&mut h.events, &lingering, "run_status").await;
    assert_eq!(status_event.kind, EventKind::Status(RunStatus::Cancelling));
    assert_eq!(status(&h, &lingering).await, (Some(RunStatus::Cancelling), RunStatus::Cancelling));
    // The session's next run waits: same conversation, and the slot is still taken.
    assert_eq!(status(&h, &next).await, (Some(RunStatus::Queued), RunStatus::Queued));
    assert_eq!(h.gateway.snapshot().await.unwrap().in_flight, 1);
    assert_eq!(h.fake.running(), 1, "the engine has not stopped yet");

    let completed = until_type(&mut h.events, &lingering, "run_completed").await;
    assert_eq!(cancelled_at.elapsed(), Duration::from_millis(1500), "completes when it stopped");
    assert_eq!(h.fake.running(), 0, "the engine stopped before the completion");
    let EventKind::RunCompleted { completion, .. } = &completed.kind else { unreachable!() };
    assert_eq!(error_code(completion), Some("user_requested"));
    assert_eq!(RunStatus::of(completion), RunStatus::Cancelled);
    assert_eq!(status(&h, &lingering).await, (None, RunStatus::Cancelled));

    let after = completion_of(&mut h.events, &next).await;
    assert!(after.ok);
    assert_eq!(h.fake.started(), ["linger:1500", "ok after"]);
    assert_eq!(h.fake.max_per_session(), 1, "never two runs of the session at once");
}

async fn completion_of(events: &mut Subscription, run_id: &RunId) -> Completion {
    let event = until_type(events, run_id, "run_completed").await;
    let EventKind::RunCompleted { completion, .. } = &event.kind else { unreachable!() };
    completion.clone()
}

#[tokio::test(start_paused = true)]
async fn an_engine_that_stops_at_once_completes_at_once_without_cancelling() {
    let mut h = harness(config(1));
    let run_id = h.gateway.submit(request("s", "hang")).await.unwrap();
    until_type(&mut h.events, &run_id, "engine_started").await;
    let cancelled_at = Instant::now();
    h.gateway.cancel(&run_id, RunError::UserRequested).await.unwrap();
    let event = next_of(&mut h.events, &run_id).await;
    assert_eq!(event.kind.type_name(), "run_completed", "no run_status before it");
    assert_eq!(cancelled_at.elapsed(), Duration::ZERO);
}

#[tokio::test(start_paused = true)]
async fn an_engine_that_never_stops_is_given_up_on_after_the_safety_bound() {
    let bound = Duration::from_secs(20);
    let mut h = harness(RuntimeConfig { engine_stop_timeout: bound, ..config(1) });
    let stuck = h.gateway.submit(request("s", "linger:forever")).await.unwrap();
    let next = h.gateway.submit(request("t", "ok other")).await.unwrap();
    until_type(&mut h.events, &stuck, "engine_started").await;
    let cancelled_at = Instant::now();
    h.gateway.cancel(&stuck, RunError::UserRequested).await.unwrap();
    let done = completion_of(&mut h.events, &stuck).await;
    assert_eq!(cancelled_at.elapsed(), bound);
    assert_eq!(error_code(&done), Some("user_requested"));
    // The slot is free again: the run waiting for it runs.
    assert!(completion_of(&mut h.events, &next).await.ok);
}

#[tokio::test(start_paused = true)]
async fn a_timed_out_run_also_waits_for_its_engine_to_stop() {
    let inactivity = Duration::from_secs(5);
    let mut h = harness(RuntimeConfig { run_inactivity_timeout: inactivity, ..config(1) });
    let started_at = Instant::now();
    let run_id = h.gateway.submit(request("s", "linger:1500")).await.unwrap();
    let status_event = until_type(&mut h.events, &run_id, "run_status").await;
    assert_eq!(status_event.kind, EventKind::Status(RunStatus::Cancelling));
    let done = completion_of(&mut h.events, &run_id).await;
    assert_eq!(error_code(&done), Some("timeout"));
    assert_eq!(started_at.elapsed(), inactivity + Duration::from_millis(1500));
    assert_eq!(h.fake.running(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_shutdown_waits_for_a_lingering_engine_before_the_drain_ends() {
    let mut h = harness(config(1));
    let run_id = h.gateway.submit(request("s", "linger:1500")).await.unwrap();
    until_type(&mut h.events, &run_id, "engine_started").await;
    let draining_at = Instant::now();
    h.gateway.drain(Duration::from_secs(1)).await.unwrap();
    assert_eq!(draining_at.elapsed(), Duration::from_millis(2500), "grace, then the linger");
    assert_eq!(h.fake.running(), 0, "nothing is left running when the drain returns");
    let done = completion_of(&mut h.events, &run_id).await;
    assert_eq!(error_code(&done), Some("shutting_down"));
}
