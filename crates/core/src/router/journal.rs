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
    /// An error means the store could not confirm it: the write was dropped,
    /// or it is still held and lands once the store is back (a database that
    /// went away). It is not taken back, since a caller told to try again may
    /// already have found it landed and been told it is accepted; a request
    /// that lands after all is taken up like any other journaled one, and a
    /// retry with the same run id is the same run.
    pub(super) async fn admit(&self, entry: JournalEntry) -> Result<(), StoreError> {
        self.store.journal_admit(entry).await;
        self.store.flush().await
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
