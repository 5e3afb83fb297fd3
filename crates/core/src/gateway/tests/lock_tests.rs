//! The engine lock on its own.

use std::time::Duration;

use super::{EngineLock, LockKey};
use crate::testing::poll_until;

fn key(name: &str) -> LockKey {
    LockKey::Session(name.into())
}

const LONG: Duration = Duration::from_secs(60);

#[tokio::test(start_paused = true)]
async fn a_free_key_is_granted_and_released_on_drop() {
    let lock = EngineLock::new(Duration::from_secs(300));
    let guard = lock.acquire(key("a"), LONG).await.unwrap();
    let other = lock.acquire(key("b"), LONG).await.unwrap();
    assert_eq!(lock.n_held(), 2);
    drop(guard);
    drop(other);
    assert_eq!(lock.n_held(), 0);
    let _again = lock.acquire(key("a"), Duration::from_millis(1)).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn waiters_are_served_in_fifo_order() {
    let lock = EngineLock::new(Duration::from_secs(300));
    let first = lock.acquire(key("a"), LONG).await.unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut tasks = Vec::new();
    for i in 0..3 {
        let task_lock = lock.clone();
        let tx = tx.clone();
        tasks.push(tokio::spawn(async move {
            let guard = task_lock.acquire(key("a"), LONG).await.unwrap();
            tx.send(i).unwrap();
            drop(guard);
        }));
        // Queue them in order.
        poll_until("the waiter to queue", || async { lock.n_waiting(&key("a")) > i }).await;
    }
    drop(first);
    let mut order = Vec::new();
    for _ in 0..3 {
        order.push(rx.recv().await.unwrap());
    }
    assert_eq!(order, [0, 1, 2]);
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(lock.n_held(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_waiter_times_out_and_leaves_the_queue() {
    let lock = EngineLock::new(Duration::from_secs(300));
    let held = lock.acquire(key("a"), LONG).await.unwrap();
    assert!(lock.acquire(key("a"), Duration::from_millis(50)).await.is_err());
    drop(held);
    assert_eq!(lock.n_held(), 0, "the timed-out waiter is skipped, the key is freed");
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_acquire_gives_the_lock_back() {
    let lock = EngineLock::new(Duration::from_secs(300));
    let held = lock.acquire(key("a"), LONG).await.unwrap();
    let waiting = {
        let lock = lock.clone();
        tokio::spawn(async move { lock.acquire(key("a"), LONG).await.map(drop) })
    };
    poll_until("the waiter to queue", || async { lock.n_waiting(&key("a")) > 0 }).await;
    waiting.abort();
    let _ = waiting.await;
    drop(held);
    assert_eq!(lock.n_held(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_stale_lock_is_reclaimed_and_its_old_guard_is_ignored() {
    let lock = EngineLock::new(Duration::from_millis(120));
    let old = lock.acquire(key("a"), LONG).await.unwrap();
    assert_eq!(lock.reap_stale(), 0, "a fresh lock is kept");
    assert!(lock.acquire(key("a"), Duration::from_millis(30)).await.is_err());
    tokio::time::advance(Duration::from_millis(150)).await;
    let waiter = {
        let lock = lock.clone();
        tokio::spawn(async move { lock.acquire(key("a"), LONG).await })
    };
    poll_until("the waiter to queue", || async { lock.n_waiting(&key("a")) > 0 }).await;
    assert_eq!(lock.reap_stale(), 1);
    let new = waiter.await.unwrap().unwrap();
    drop(old);
    assert_eq!(lock.n_held(), 1, "the old guard's release does not free the new owner's lock");
    drop(new);
    assert_eq!(lock.n_held(), 0);
}
