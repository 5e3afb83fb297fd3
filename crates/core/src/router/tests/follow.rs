//! The follower `RouterHandle::submit` hands back, and `RouterHandle::follow`.

use super::*;

/// Every event a follower yields, as (type, index, seen live), until it ends.
async fn drain(follower: &mut RunFollower) -> Vec<(String, u64, bool)> {
    crate::testing::within("the follower to end", async {
        let mut seen = Vec::new();
        while let Some(event) = follower.next().await {
            let live = matches!(event, Followed::Event(_));
            seen.push((event.type_name().to_owned(), event.index(), live));
        }
        seen
    })
    .await
}

fn answer(seen: &Arc<BusEvent>) -> String {
    match &seen.kind {
        EventKind::RunCompleted { completion, .. } => completion.answer.clone(),
        other => panic!("not a completion: {other:?}"),
    }
}

fn with_id(id: &str, prompt: &str) -> RunRequest {
    RunRequest { run_id: Some(RunId::parse(id).unwrap()), ..RunRequest::new("s", prompt) }
}

async fn submit_following(h: &Harness, req: RunRequest) -> (Accepted, RunFollower) {
    match h.router.submit(req).await.unwrap() {
        Submitted::Run(accepted, follower) => (accepted, follower),
        other => panic!("expected a run, got {other:?}"),
    }
}

fn indices_from_one(seen: &[(String, u64, bool)]) {
    let indices: Vec<u64> = seen.iter().map(|(_, index, _)| *index).collect();
    assert_eq!(indices, (1..=seen.len() as u64).collect::<Vec<_>>(), "{seen:?}");
    let completions = seen.iter().filter(|(kind, _, _)| kind == "run_completed").count();
    assert_eq!(completions, 1, "{seen:?}");
    assert_eq!(seen.last().map(|(kind, _, _)| kind.as_str()), Some("run_completed"));
}

#[tokio::test(start_paused = true)]
async fn a_submitted_run_is_followed_live_to_its_completion() {
    let h = harness(router_config()).await;
    let (accepted, mut follower) = submit_following(&h, with_id("f1", "ok one two")).await;
    assert_eq!(follower.run_id(), &accepted.run_id);
    let seen = drain(&mut follower).await;
    indices_from_one(&seen);
    assert!(seen.iter().all(|(_, _, live)| *live), "a new run's events all arrive live: {seen:?}");
    let deltas = seen.iter().filter(|(kind, _, _)| kind == "delta").count();
    assert_eq!(deltas, 2, "{seen:?}");
}

#[tokio::test(start_paused = true)]
async fn a_run_with_a_generated_id_is_followed_from_its_start() {
    let h = harness(router_config()).await;
    let (_, mut follower) = submit_following(&h, RunRequest::new("s", "ok one two")).await;
    let seen = drain(&mut follower).await;
    indices_from_one(&seen);
    assert_eq!(seen.first().map(|(kind, _, _)| kind.as_str()), Some("run_started"));
}

#[tokio::test(start_paused = true)]
async fn a_repeated_id_follows_the_finished_run_from_the_store() {
    let h = harness(router_config()).await;
    let (_, mut first) = submit_following(&h, with_id("f2", "ok done")).await;
    let completed = crate::testing::within("the run", first.completion()).await.unwrap();
    let (again, mut follower) = submit_following(&h, with_id("f2", "ok done")).await;
    assert!(again.duplicate);
    let seen = drain(&mut follower).await;
    indices_from_one(&seen);
    assert!(seen.iter().any(|(_, _, live)| !live), "read back from the store: {seen:?}");
    let mut again = h.router.follow(&again.run_id);
    let end = crate::testing::within("the stored completion", again.completion()).await.unwrap();
    assert_eq!((answer(&end), end.index), (answer(&completed), completed.index));
}

#[tokio::test(start_paused = true)]
async fn a_run_cancelled_while_queued_ends_with_the_routers_completion() {
    let h = harness(router_config()).await;
    let (_, mut busy) = submit_following(&h, with_id("f3", "hang")).await;
    let (queued, mut follower) = submit_following(&h, with_id("f4", "ok later")).await;
    assert_eq!(
        h.router.cancel_run(&queued.run_id).await.unwrap(),
        crate::gateway::CancelOutcome::Cancelling
    );
    let end = crate::testing::within("the cancelled run", follower.completion()).await.unwrap();
    let EventKind::RunCompleted { completion, .. } = &end.kind else { panic!("{end:?}") };
    assert_eq!(completion.error, Some(RunError::UserRequested));
    assert_eq!(end.index, 1);
    assert!(follower.next().await.is_none());

    // The active one is stopped at the gateway; its follower ends as well.
    let busy_id = busy.run_id().clone();
    assert_eq!(
        h.router.cancel_run(&busy_id).await.unwrap(),
        crate::gateway::CancelOutcome::Cancelling
    );
    let end = crate::testing::within("the cancelled run", busy.completion()).await.unwrap();
    let EventKind::RunCompleted { completion, .. } = &end.kind else { panic!("{end:?}") };
    assert_eq!(completion.error, Some(RunError::UserRequested));
    assert_eq!(
        h.router.cancel_run(&busy_id).await.unwrap(),
        crate::gateway::CancelOutcome::NotActive
    );
}
