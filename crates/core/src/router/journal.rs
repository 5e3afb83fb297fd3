//! The admission journal, as the router uses it: every accepted request is
//! written and flushed before the caller hears "accepted", and removed when its
//! `run_completed` is out. After a crash the entries left are exactly the
//! requests that were accepted and never completed; the router handles each once
//! before it takes new requests.

use crate::ids::RunId;
use crate::store::{JournalEntry, StoreError, StoreHandle};

/// The journal over the gateway's store. Cheap to clone.
#[derive(Debug, Clone)]
pub(super) struct Journal {
    store: StoreHandle,
}

impl Journal {
    pub(super) fn new(store: StoreHandle) -> Self {
        Journal { store }
    }

    /// Writes (or rewrites) an entry and waits until it is durable, so a crash
    /// right after the caller's acknowledgement cannot lose it.
    ///
    /// When it cannot be made durable the caller is refused, so the entry is
    /// withdrawn too: a store that keeps the write and commits it later (one
    /// that was briefly unreachable) must not hand a refused request to the
    /// next start's recovery.
    pub(super) async fn admit(&self, entry: JournalEntry) -> Result<(), StoreError> {
        let run_id = entry.run_id.clone();
        self.store.journal_admit(entry).await;
        let flushed = self.store.flush().await;
        if flushed.is_err() {
            self.store.journal_complete(&run_id).await;
        }
        flushed
    }

    pub(super) async fn mark_started(&self, run_id: &RunId) {
        self.store.journal_mark_started(run_id).await;
    }

    pub(super) async fn complete(&self, run_id: &RunId) {
        self.store.journal_complete(run_id).await;
    }

    /// Every entry not completed, in acceptance order.
    pub(super) async fn pending(&self) -> Result<Vec<JournalEntry>, StoreError> {
        self.store.journal_pending().await
    }
}
