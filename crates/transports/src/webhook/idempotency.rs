//! Idempotency keys, in memory with a TTL: the same key for the same integration
//! answers with the first request's response instead of submitting again.
//! Keys do not survive a restart.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::StatusCode;
use serde_json::Value;
use tokio::time::Instant;

type Key = (String, String);

#[derive(Debug)]
enum Slot {
    /// Claimed by a request that has not submitted yet.
    Pending,
    /// The response to replay.
    Done { status: StatusCode, body: Value },
}

#[derive(Debug)]
struct Entry {
    claimed_at: Instant,
    slot: Slot,
}

type Map = Arc<Mutex<HashMap<Key, Entry>>>;

/// Every key seen within the TTL.
#[derive(Debug)]
pub(super) struct IdempotencyKeys {
    ttl: Duration,
    map: Map,
}

/// What claiming a key found.
#[derive(Debug)]
pub(super) enum Claim {
    /// First use: go ahead; the guard records the response or releases the key.
    New(Guard),
    /// Seen before: replay this.
    Duplicate { status: StatusCode, body: Value },
    /// Claimed by a request that has not submitted yet.
    InProgress,
}

/// A claimed key. Dropped without a recorded response, it releases the key, so a
/// request that failed before submitting can be retried.
#[derive(Debug)]
pub(super) struct Guard {
    map: Map,
    key: Key,
    recorded: bool,
}

impl IdempotencyKeys {
    pub(super) fn new(ttl: Duration) -> Self {
        IdempotencyKeys { ttl, map: Arc::default() }
    }

    /// Checks and reserves `key` in one step, so concurrent duplicates submit once.
    pub(super) fn claim(&self, integration: &str, key: &str) -> Claim {
        let now = Instant::now();
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        map.retain(|_, entry| now.duration_since(entry.claimed_at) < self.ttl);
        let key = (integration.to_owned(), key.to_owned());
        match map.get(&key) {
            Some(Entry { slot: Slot::Pending, .. }) => Claim::InProgress,
            Some(Entry { slot: Slot::Done { status, body }, .. }) => {
                Claim::Duplicate { status: *status, body: body.clone() }
            }
            None => {
                map.insert(key.clone(), Entry { claimed_at: now, slot: Slot::Pending });
                Claim::New(Guard { map: self.map.clone(), key, recorded: false })
            }
        }
    }
}

impl Guard {
    fn record(&mut self, status: StatusCode, body: Value) {
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(entry) = map.get_mut(&self.key) {
            entry.slot = Slot::Done { status, body };
        }
        self.recorded = true;
    }

    /// The run was submitted: duplicates get this answer from now on.
    pub(super) fn submitted(mut self, status: StatusCode, body: Value) -> Guard {
        self.record(status, body);
        self
    }

    /// The final answer.
    pub(super) fn complete(mut self, status: StatusCode, body: Value) {
        self.record(status, body);
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if !self.recorded {
            let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
            map.remove(&self.key);
        }
    }
}
