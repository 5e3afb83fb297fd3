//! The merge window under paused time, driven the way the bot's poll loop
//! drives it: sleep until the next batch is due, then take what is due.

use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::{advance, sleep_until, Instant};

use super::Debouncer;

const WINDOW: Duration = Duration::from_millis(1000);

/// Feeds `(after, chat, text)` messages (each `after` the previous one) into
/// a debouncer as the poll loop does, and returns the prompts submitted, with
/// how long after the first message each went out.
async fn submitted(messages: Vec<(u64, i64, &'static str)>) -> Vec<(Duration, i64, String)> {
    let (tx, mut rx) = mpsc::channel(16);
    tokio::spawn(async move {
        for (after, chat, text) in messages {
            tokio::time::sleep(Duration::from_millis(after)).await;
            tx.send((chat, text)).await.unwrap();
        }
    });
    let start = Instant::now();
    let mut debouncer: Debouncer<i64, &str> = Debouncer::new(WINDOW);
    let mut out = Vec::new();
    let mut open = true;
    while open || debouncer.next_due().is_some() {
        let due = debouncer.next_due();
        tokio::select! {
            message = rx.recv(), if open => match message {
                Some((chat, text)) => {
                    debouncer.push(chat, text, Instant::now());
                }
                None => open = false,
            },
            () = sleep_until(due.unwrap_or_else(Instant::now)), if due.is_some() => {
                for (chat, batch) in debouncer.take_due(Instant::now()) {
                    out.push((start.elapsed(), chat, batch.items.join("\n")));
                }
            }
        }
    }
    out
}

#[tokio::test(start_paused = true)]
async fn quick_messages_of_a_chat_are_one_prompt_in_order() {
    let out =
        submitted(vec![(0, 1, "fix the bug"), (300, 1, "in parser.rs"), (300, 1, "thanks")]).await;
    assert_eq!(out, [(Duration::from_millis(1600), 1, "fix the bug\nin parser.rs\nthanks".into())]);
}

#[tokio::test(start_paused = true)]
async fn a_message_after_the_window_is_a_prompt_of_its_own() {
    let out = submitted(vec![(0, 1, "first"), (1500, 1, "second")]).await;
    assert_eq!(
        out,
        [
            (Duration::from_millis(1000), 1, "first".to_owned()),
            (Duration::from_millis(2500), 1, "second".to_owned()),
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn chats_are_merged_apart() {
    let out = submitted(vec![(0, 1, "a1"), (100, 2, "b1"), (100, 1, "a2")]).await;
    assert_eq!(
        out,
        [
            (Duration::from_millis(1100), 2, "b1".to_owned()),
            (Duration::from_millis(1200), 1, "a1\na2".to_owned()),
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_command_takes_the_waiting_batch_at_once() {
    let mut debouncer: Debouncer<i64, &str> = Debouncer::new(WINDOW);
    debouncer.push(1, "one", Instant::now());
    advance(Duration::from_millis(200)).await;
    debouncer.push(1, "two", Instant::now());
    let batch = debouncer.take(&1).expect("waiting");
    assert_eq!(batch.items, ["one", "two"]);
    assert_eq!(debouncer.next_due(), None, "nothing left to submit");
    assert!(debouncer.take(&1).is_none());
}

#[tokio::test(start_paused = true)]
async fn a_restored_batch_is_due_at_once_and_a_zero_window_merges_nothing() {
    let mut debouncer: Debouncer<i64, &str> = Debouncer::new(WINDOW);
    let now = Instant::now();
    debouncer.restore(1, vec!["left over"], now);
    debouncer.restore(2, Vec::new(), now);
    assert_eq!(debouncer.next_due(), Some(now));
    let due = debouncer.take_due(now);
    assert_eq!(due.len(), 1);
    assert_eq!(due[0].1.items, ["left over"]);
    assert!(!Debouncer::<i64, &str>::new(Duration::ZERO).merges());
    assert!(debouncer.merges());
}
