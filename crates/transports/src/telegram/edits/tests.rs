//! Progress edits under paused time, driven as the run's follower drives the
//! pacer: a change either edits now or waits until the pacer is due.

use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::{sleep_until, Instant};

use super::EditPacer;

/// The times (from the start) of the edits made for changes arriving every
/// `every` for `changes` times, with the message first shown at the start.
async fn edits(interval: Duration, every: Duration, changes: usize) -> Vec<Duration> {
    let (tx, mut rx) = mpsc::channel(4);
    tokio::spawn(async move {
        for n in 0..changes {
            tokio::time::sleep(every).await;
            tx.send(n).await.unwrap();
        }
    });
    let start = Instant::now();
    let mut pacer = EditPacer::new(interval);
    pacer.shown(start);
    let mut made = Vec::new();
    let mut open = true;
    while open || pacer.due().is_some() {
        let due = pacer.due();
        tokio::select! {
            change = rx.recv(), if open => match change {
                Some(_) => if pacer.changed(Instant::now()) {
                    made.push(start.elapsed());
                },
                None => open = false,
            },
            () = sleep_until(due.unwrap_or_else(Instant::now)), if due.is_some() => {
                if pacer.fire(Instant::now()) {
                    made.push(start.elapsed());
                }
            }
        }
    }
    made
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[tokio::test(start_paused = true)]
async fn changes_within_the_interval_become_one_edit_when_it_is_over() {
    // Ten changes 100 ms apart, an interval of 3 s: one edit at 3 s, with the
    // newest text (the follower renders it when the edit is made).
    assert_eq!(edits(ms(3000), ms(100), 10).await, [ms(3000)]);
}

#[tokio::test(start_paused = true)]
async fn steady_changes_are_edited_once_per_interval() {
    // A change every 300 ms for 2.7 s with a 1 s interval: the waiting ones
    // go out as each interval ends, the last one too.
    let made = edits(ms(1000), ms(300), 9).await;
    assert_eq!(made, [ms(1000), ms(2000), ms(3000)]);
    for pair in made.windows(2) {
        assert!(pair[1] - pair[0] >= ms(1000), "{made:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_change_after_a_quiet_interval_is_edited_at_once() {
    assert_eq!(edits(ms(1000), ms(1500), 3).await, [ms(1500), ms(3000), ms(4500)]);
}

#[tokio::test(start_paused = true)]
async fn a_zero_interval_edits_every_change() {
    assert_eq!(edits(Duration::ZERO, ms(10), 3).await, [ms(10), ms(20), ms(30)]);
}
