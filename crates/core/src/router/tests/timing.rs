//! Each stage of a run stamped where it happens, on paused time: the wait
//! behind a busy conversation, the engine's own time, the channel's delivery.

use super::*;
use crate::timing::{now_us, Stage, Stamps};

async fn kept_stages(store: &StoreHandle, run_id: &RunId) -> Stamps {
    crate::testing::within("the stages to be kept", async {
        loop {
            let stamps = store.runs().run_stages(run_id.as_str()).await.unwrap();
            if !stamps.is_empty() {
                return stamps;
            }
            tokio::task::yield_now().await;
        }
    })
    .await
}

#[tokio::test(start_paused = true)]
async fn each_stage_is_stamped_when_it_happens_and_the_run_keeps_them() {
    let h = harness(router_config()).await;
    let mut closed = h.gateway.bus().timings().subscribe();
    let first = h.submit("s", "sleep:1000 first", None).await;
    let started_first = now_us();

    let arrived = now_us() - 2_000;
    let mut req = request("s", "sleep:300 second answer", None);
    req.flags.received_at_us = Some(arrived);
    let second = h.submit_req(req).await;
    let journaled = now_us();

    let mut timings = Vec::new();
    while timings.len() < 2 {
        timings.push(crate::testing::within("a timing", closed.recv()).await.unwrap());
    }
    assert_eq!((&timings[0].run_id, &timings[1].run_id), (&first, &second));
    let one = timings[0].stamps;
    let two = timings[1].stamps;
    let at = |stamps: Stamps, stage| stamps.get(stage).unwrap_or_else(|| panic!("{stage} stamped"));
    assert_eq!(at(two, Stage::Received), arrived, "the channel's own time");
    assert_eq!(at(two, Stage::Journaled), journaled);
    // It waited behind its conversation until the first run completed, a second in.
    assert_eq!(at(one, Stage::Completed) - started_first, 1_000_000);
    assert_eq!(at(two, Stage::Queued), at(one, Stage::Completed));
    assert_eq!(at(two, Stage::SlotGranted), at(two, Stage::Queued));
    assert_eq!(at(two, Stage::Spawned), at(two, Stage::SlotGranted));
    // The engine said it started at once, then thought 300 ms before it answered.
    assert_eq!(at(two, Stage::FirstEvent), at(two, Stage::Spawned));
    assert_eq!(at(two, Stage::FirstDelta) - at(two, Stage::FirstEvent), 300_000);
    assert_eq!(at(two, Stage::Completed), at(two, Stage::FirstDelta));
    assert_eq!(two.get(Stage::Delivered), None, "nobody delivered it");
    assert_eq!(two.total_us(), 2_000 + 1_000_000 + 300_000);
    assert_eq!((timings[1].channel.as_str(), timings[1].engine.as_str()), ("api", "fake"));
    assert_eq!(kept_stages(&h.store, &second).await, two);
}

#[tokio::test(start_paused = true)]
async fn a_delivered_run_closes_at_its_delivery_with_the_channels_stamps() {
    let h = harness(router_config()).await;
    let timings = h.gateway.bus().timings();
    let mut closed = timings.subscribe();
    let mut req = request("chat", "sleep:50 hello there", None);
    req.flags.delivers = true;
    req.channel = Some(ChannelRef {
        transport: "telegram".into(),
        chat_id: Some("1".into()),
        topic_id: None,
    });
    let run = match h.router.submit(req).await.unwrap() {
        Submitted::Run(accepted, mut follower) => {
            crate::testing::within("the answer", follower.completion()).await.unwrap();
            accepted.run_id
        }
        other => panic!("expected a run, got {other:?}"),
    };
    assert!(closed.try_recv().is_err(), "open until its delivery");
    tokio::time::advance(Duration::from_millis(20)).await;
    timings.stamp(&run, Stage::FirstVisible);
    tokio::time::advance(Duration::from_millis(5)).await;
    timings.stamp(&run, Stage::Delivered);
    let timing = closed.try_recv().expect("closed at its delivery");
    assert_eq!(timing.channel, "telegram");
    let stamps = timing.stamps;
    let completed = stamps.get(Stage::Completed).unwrap();
    assert_eq!(stamps.get(Stage::FirstVisible), Some(completed + 20_000));
    assert_eq!(stamps.get(Stage::Delivered), Some(completed + 25_000));
    assert_eq!(kept_stages(&h.store, &run).await, stamps);
}
