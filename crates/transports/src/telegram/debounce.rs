//! `debounce_ms`: messages one chat sends in quick succession become one prompt.
//!
//! Each chat (or forum topic) has at most one batch waiting. A message joins
//! its chat's batch and restarts the batch's window, so a batch is due once
//! the chat has been quiet for the whole window; its prompt is the messages'
//! texts joined with line breaks, in the order they came.
//!
//! This is plain state: the bot's poll loop owns it, sleeps until
//! [`Debouncer::next_due`] and submits what [`Debouncer::take_due`] hands
//! back. It never submits, sleeps or stores anything itself.

use std::collections::HashMap;
use std::hash::Hash;
use std::time::Duration;

use tokio::time::Instant;

/// The batches waiting for their chat to go quiet, by chat.
#[derive(Debug)]
pub struct Debouncer<K, T> {
    window: Duration,
    batches: HashMap<K, Batch<T>>,
}

/// The messages of one chat waiting to be submitted together.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch<T> {
    /// Oldest first.
    pub items: Vec<T>,
    /// When the chat will have been quiet for the whole window.
    pub due: Instant,
}

impl<K: Eq + Hash + Clone, T> Debouncer<K, T> {
    /// Merges messages less than `window` apart; a zero window merges nothing
    /// ([`Debouncer::merges`] is false and the caller submits at once).
    pub fn new(window: Duration) -> Self {
        Debouncer { window, batches: HashMap::new() }
    }

    /// Whether messages wait at all.
    pub fn merges(&self) -> bool {
        !self.window.is_zero()
    }

    /// Adds `item` to `key`'s batch (a new one if it has none) and restarts
    /// that batch's window at `now`. Returns the batch as it now stands.
    pub fn push(&mut self, key: K, item: T, now: Instant) -> &Batch<T> {
        let due = now + self.window;
        let batch = self.batches.entry(key).or_insert_with(|| Batch { items: Vec::new(), due });
        batch.items.push(item);
        batch.due = due;
        batch
    }

    /// Puts back a batch found after a restart, due at once.
    pub fn restore(&mut self, key: K, items: Vec<T>, now: Instant) {
        if !items.is_empty() {
            self.batches.insert(key, Batch { items, due: now });
        }
    }

    /// When the next batch is due, if any is waiting.
    pub fn next_due(&self) -> Option<Instant> {
        self.batches.values().map(|batch| batch.due).min()
    }

    /// Takes the batches due by `now`, the earliest first.
    pub fn take_due(&mut self, now: Instant) -> Vec<(K, Batch<T>)> {
        let due: Vec<K> = self
            .batches
            .iter()
            .filter(|(_, batch)| batch.due <= now)
            .map(|(key, _)| key.clone())
            .collect();
        let mut taken: Vec<(K, Batch<T>)> =
            due.into_iter().filter_map(|key| self.take(&key).map(|batch| (key, batch))).collect();
        taken.sort_by_key(|(_, batch)| batch.due);
        taken
    }

    /// Takes `key`'s batch whether it is due or not (a command came).
    pub fn take(&mut self, key: &K) -> Option<Batch<T>> {
        self.batches.remove(key)
    }
}

#[cfg(test)]
mod tests;
