//! The engine lock: a per-key mutex with FIFO waiters, so two runs never drive the
//! same engine session at once even when they come from different conversations.
//!
//! Ownership is a [`LockGuard`]: dropping it (normal end, panic unwinding, task
//! abort) releases the lock and hands it to the next live waiter. A waiter that
//! gave up (timeout, cancel) is skipped. A lock held longer than `max_age` is
//! reclaimed by [`EngineLock::reap_stale`] and its old guard's release is ignored
//! (generations tell them apart). Acquiring awaits; it never blocks other runs.

use std::collections::{HashMap, VecDeque};

use foldhash::fast::RandomState;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::ids::SessionKey;

/// What a lock protects: a resume token's session, else a gateway session.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum LockKey {
    Resume(String),
    Session(SessionKey),
}

/// The lock was not granted in time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("engine lock not granted in time")]
pub struct LockTimeout;

/// The lock table. Cheap to clone.
#[derive(Debug, Clone)]
pub struct EngineLock {
    inner: Arc<Mutex<Table>>,
    max_age: Duration,
}

#[derive(Debug, Default)]
struct Table {
    held: HashMap<LockKey, Held, RandomState>,
    next_generation: u64,
}

#[derive(Debug)]
struct Held {
    generation: u64,
    since: Instant,
    waiters: VecDeque<oneshot::Sender<u64>>,
}

impl Table {
    fn next(&mut self) -> u64 {
        self.next_generation += 1;
        self.next_generation
    }

    /// Hands `key` to its first waiter that is still waiting, or frees it.
    fn pass_on(&mut self, key: &LockKey, now: Instant) {
        let generation = self.next();
        let Some(held) = self.held.get_mut(key) else { return };
        while let Some(waiter) = held.waiters.pop_front() {
            if waiter.send(generation).is_ok() {
                held.generation = generation;
                held.since = now;
                return;
            }
        }
        self.held.remove(key);
    }
}

impl EngineLock {
    pub fn new(max_age: Duration) -> Self {
        EngineLock { inner: Arc::new(Mutex::new(Table::default())), max_age }
    }

    fn table(&self) -> MutexGuard<'_, Table> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits up to `timeout` for `key`.
    ///
    /// # Errors
    /// [`LockTimeout`] when the lock was not granted in time.
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped acquire gives back a lock granted in the meantime.
    pub async fn acquire(&self, key: LockKey, timeout: Duration) -> Result<LockGuard, LockTimeout> {
        let rx = {
            let mut table = self.table();
            let generation = table.next();
            match table.held.get_mut(&key) {
                None => {
                    let held = Held { generation, since: Instant::now(), waiters: VecDeque::new() };
                    table.held.insert(key.clone(), held);
                    return Ok(LockGuard { lock: self.clone(), key, generation });
                }
                Some(held) => {
                    let (tx, rx) = oneshot::channel();
                    held.waiters.push_back(tx);
                    rx
                }
            }
        };
        let mut pending = PendingGrant { lock: self.clone(), key: Some(key), rx };
        match tokio::time::timeout(timeout, &mut pending.rx).await {
            Ok(Ok(generation)) => {
                let key = pending.key.take().expect("key present until granted");
                Ok(LockGuard { lock: self.clone(), key, generation })
            }
            // The sender was dropped: the table went away. Treat as not granted.
            Ok(Err(_)) | Err(_) => Err(LockTimeout),
        }
    }

    fn release(&self, key: &LockKey, generation: u64) {
        let mut table = self.table();
        if table.held.get(key).is_some_and(|held| held.generation == generation) {
            table.pass_on(key, Instant::now());
        }
    }

    /// Reclaims every lock held longer than `max_age`, handing it to the next
    /// waiter. Returns how many were reclaimed.
    pub fn reap_stale(&self) -> usize {
        let now = Instant::now();
        let mut table = self.table();
        let stale: Vec<LockKey> = table
            .held
            .iter()
            .filter(|(_, held)| now.duration_since(held.since) > self.max_age)
            .map(|(key, _)| key.clone())
            .collect();
        for key in &stale {
            tracing::warn!(
                ?key,
                max_age_ms = self.max_age.as_millis() as u64,
                "reclaiming stale engine lock"
            );
            table.pass_on(key, now);
        }
        stale.len()
    }

    /// Number of keys currently held.
    pub fn n_held(&self) -> usize {
        self.table().held.len()
    }

    /// Number of waiters queued on `key`.
    pub fn n_waiting(&self, key: &LockKey) -> usize {
        self.table().held.get(key).map_or(0, |held| held.waiters.len())
    }
}

/// A wait for a grant; if dropped after the grant arrived, releases it.
#[derive(Debug)]
struct PendingGrant {
    lock: EngineLock,
    key: Option<LockKey>,
    rx: oneshot::Receiver<u64>,
}

impl Drop for PendingGrant {
    fn drop(&mut self) {
        if let Some(key) = self.key.take() {
            // Close first so no grant can slip in after the check below.
            self.rx.close();
            if let Ok(generation) = self.rx.try_recv() {
                self.lock.release(&key, generation);
            }
        }
    }
}

/// A held lock; dropping it releases the lock.
#[derive(Debug)]
pub struct LockGuard {
    lock: EngineLock,
    key: LockKey,
    generation: u64,
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        self.lock.release(&self.key, self.generation);
    }
}
