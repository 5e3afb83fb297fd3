use super::*;

fn run(raw: &str) -> RunId {
    RunId::parse(raw).unwrap()
}

fn stamped(pairs: &[(Stage, i64)]) -> Stamps {
    let mut stamps = Stamps::default();
    for &(stage, at) in pairs {
        stamps.stamp(stage, at);
    }
    stamps
}

#[test]
fn the_first_stamp_of_a_stage_wins_and_merging_keeps_it() {
    let mut stamps = stamped(&[(Stage::Received, 10), (Stage::FirstVisible, 70)]);
    assert!(
        !stamps.stamp(Stage::FirstVisible, 90),
        "an edit after the first send is not the first"
    );
    assert_eq!(stamps.get(Stage::FirstVisible), Some(70));
    stamps.merge(&stamped(&[(Stage::Received, 5), (Stage::Delivered, 100)]));
    assert_eq!((stamps.get(Stage::Received), stamps.get(Stage::Delivered)), (Some(10), Some(100)));
}

#[test]
fn the_waterfall_is_in_time_order_and_its_steps_add_up_to_the_total() {
    // A non-streaming channel: its first visible write comes after the completion.
    let stamps = stamped(&[
        (Stage::Received, 1_000),
        (Stage::Journaled, 1_400),
        (Stage::Queued, 1_400),
        (Stage::SlotGranted, 1_500),
        (Stage::Spawned, 9_500),
        (Stage::FirstEvent, 59_500),
        (Stage::FirstDelta, 60_000),
        (Stage::Completed, 90_000),
        (Stage::FirstVisible, 91_000),
        (Stage::Delivered, 91_000),
    ]);
    let steps = stamps.steps();
    let order: Vec<Stage> = steps.iter().map(|step| step.stage).collect();
    assert_eq!(
        order,
        [
            Stage::Journaled,
            Stage::Queued,
            Stage::SlotGranted,
            Stage::Spawned,
            Stage::FirstEvent,
            Stage::FirstDelta,
            Stage::Completed,
            Stage::FirstVisible,
            Stage::Delivered,
        ]
    );
    assert_eq!(steps.iter().map(|step| step.took_us).sum::<u64>(), stamps.total_us());
    assert_eq!(stamps.total_us(), 90_000);
    let timing = RunTiming { run_id: run("r1"), channel: "api".into(), engine: "x".into(), stamps };
    let slowest = timing.slowest().unwrap();
    assert_eq!((slowest.stage, slowest.took_us), (Stage::FirstEvent, 50_000));
    assert_eq!(steps.last().map(|step| step.since_start_us), Some(90_000));
}

#[test]
fn stamps_read_back_from_their_stored_form_skipping_unknown_stages() {
    let stamps = stamped(&[(Stage::Received, 1), (Stage::SlotGranted, 3), (Stage::Delivered, 9)]);
    let mut json = stamps.to_json();
    assert_eq!(json, serde_json::json!({ "received": 1, "slot_granted": 3, "delivered": 9 }));
    json["reviewed_by_a_newer_build"] = 5.into();
    assert_eq!(Stamps::from_json(&json), stamps);
    assert!(Stamps::from_json(&serde_json::json!("garbage")).is_empty());
    for stage in Stage::ALL {
        assert_eq!(Stage::parse(stage.as_str()), Some(stage));
    }
}

#[tokio::test(start_paused = true)]
async fn a_run_closes_at_its_completion_unless_a_channel_delivers_it() {
    let timings = Timings::default();
    let mut closed = timings.subscribe();
    timings.describe(&run("plain"), "api", "echo", false);
    timings.stamp(&run("plain"), Stage::Received);
    tokio::time::advance(Duration::from_millis(40)).await;
    timings.stamp(&run("plain"), Stage::Completed);
    let plain = closed.try_recv().expect("closed at its completion");
    assert_eq!((plain.channel.as_str(), plain.engine.as_str()), ("api", "echo"));
    assert_eq!(plain.stamps.total_us(), 40_000);
    assert!(timings.open_stamps(&run("plain")).is_none());

    timings.describe(&run("chat"), "telegram", "claude", true);
    timings.stamp(&run("chat"), Stage::Received);
    timings.stamp(&run("chat"), Stage::Completed);
    assert!(closed.try_recv().is_err(), "a delivered run waits for its delivery");
    tokio::time::advance(Duration::from_millis(7)).await;
    timings.stamp(&run("chat"), Stage::FirstVisible);
    timings.stamp(&run("chat"), Stage::Delivered);
    let chat = closed.try_recv().expect("closed at its delivery");
    assert_eq!(chat.stamps.total_us(), 7_000);
    assert!(chat.stamps.get(Stage::FirstVisible).is_some());
    assert!(closed.try_recv().is_err(), "closed once");
}

#[tokio::test(start_paused = true)]
async fn a_delivery_that_never_comes_is_given_up_when_many_runs_are_open() {
    let timings = Timings::default();
    let mut closed = timings.subscribe();
    timings.describe(&run("lost"), "telegram", "echo", true);
    timings.stamp(&run("lost"), Stage::Completed);
    tokio::time::advance(DELIVERY_PATIENCE + Duration::from_secs(1)).await;
    for n in 0..SWEEP_AT {
        timings.stamp(&run(&format!("open{n}")), Stage::Received);
    }
    let lost = closed.try_recv().expect("closed without its delivery");
    assert_eq!(lost.run_id, run("lost"));
    assert_eq!(timings.cancels_overdue(), 0);
    timings.cancel_overdue();
    assert_eq!(timings.cancels_overdue(), 1);
}
