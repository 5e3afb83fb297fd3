//! Media groups: photos and files sent together (an album) arrive as one
//! message each, sharing a `media_group_id`. They become one message once
//! none has come for `media_group_debounce_ms`.
//!
//! This is plain state behind a small lock (never held across an await):
//! the first message of an album starts a waiter ([`collect`]) that sleeps
//! until the album has been quiet for the whole window and takes it; the
//! later ones only join it and push its deadline back.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// The albums still coming in, by key (chat and `media_group_id`).
#[derive(Debug)]
pub struct Albums<T> {
    window: Duration,
    pending: HashMap<String, Album<T>>,
}

#[derive(Debug)]
struct Album<T> {
    /// In the order they came.
    items: Vec<T>,
    /// When the album will have been quiet for the whole window.
    due: Instant,
}

impl<T> Albums<T> {
    pub fn new(window: Duration) -> Self {
        Albums { window, pending: HashMap::new() }
    }

    /// Adds `item` to album `key` and restarts its window at `now`; true
    /// when it is the album's first item (the caller starts its waiter).
    pub fn push(&mut self, key: &str, item: T, now: Instant) -> bool {
        let due = now + self.window;
        match self.pending.get_mut(key) {
            Some(album) => {
                album.items.push(item);
                album.due = due;
                false
            }
            None => {
                self.pending.insert(key.to_owned(), Album { items: vec![item], due });
                true
            }
        }
    }

    /// Album `key`'s items once it is due by `now`; else when it will be
    /// (`None`: no such album).
    pub fn take_if_due(&mut self, key: &str, now: Instant) -> Result<Vec<T>, Option<Instant>> {
        match self.pending.get(key) {
            Some(album) if album.due <= now => {
                Ok(self.pending.remove(key).map(|album| album.items).unwrap_or_default())
            }
            Some(album) => Err(Some(album.due)),
            None => Err(None),
        }
    }
}

/// Waits until album `key` has been quiet for its window, then takes it
/// (empty when there is no such album).
///
/// # Cancel safety
/// Cancel safe: the album stays until a waiter takes it.
pub async fn collect<T>(albums: &Mutex<Albums<T>>, key: &str) -> Vec<T> {
    loop {
        let taken = albums
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take_if_due(key, Instant::now());
        match taken {
            Ok(items) => return items,
            Err(Some(due)) => tokio::time::sleep_until(due).await,
            Err(None) => return Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests;
