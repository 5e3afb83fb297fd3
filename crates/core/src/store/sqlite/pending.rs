//! Chat-state writes on their way to the file, so a lookup of a session's
//! chat state needs neither the writer nor a flush.
//!
//! A put or delete is noted here before it is queued and forgotten once the
//! batch that holds it has committed (or failed to). So at every moment a
//! session's newest chat state is either noted here or in the file for any read
//! transaction that starts now, and a lookup answers from here or runs its query
//! on the calling task. The router reads chat state for every request it
//! accepts; before this, each read was a round trip to the writer thread (and a
//! wake-up of both threads).

use std::collections::HashMap;
use std::sync::Mutex;

use foldhash::fast::RandomState;

use super::super::ChatState;
use crate::ids::SessionKey;

/// Chat-state writes queued and not yet committed, by session.
#[derive(Debug, Default)]
pub(super) struct PendingChatStates {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// Numbers each noted write, so a commit forgets only the write it holds,
    /// not a newer one for the same session.
    next_version: u64,
    /// The newest write of each session: its number and the state it leaves
    /// (`None`: deleted).
    by_session: HashMap<SessionKey, (u64, Option<ChatState>), RandomState>,
}

impl PendingChatStates {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Notes a write about to be queued; its number, for [`Self::committed`].
    pub(super) fn note(&self, session_key: &SessionKey, state: Option<ChatState>) -> u64 {
        let mut inner = self.lock();
        inner.next_version += 1;
        let version = inner.next_version;
        inner.by_session.insert(session_key.clone(), (version, state));
        version
    }

    /// The state a queued write leaves the session in; `None` when no write of
    /// it is on its way, so the file has the answer.
    pub(super) fn get(&self, session_key: &SessionKey) -> Option<Option<ChatState>> {
        self.lock().by_session.get(session_key).map(|(_, state)| state.clone())
    }

    /// Forgets the writes of a batch that has ended (committed, or failed and
    /// rolled back: then the file's state is the one to show). Takes the list
    /// and leaves it empty.
    pub(super) fn committed(&self, done: &mut Vec<(SessionKey, u64)>) {
        if done.is_empty() {
            return;
        }
        let mut inner = self.lock();
        for (session_key, version) in done.drain(..) {
            if inner.by_session.get(&session_key).is_some_and(|(newest, _)| *newest == version) {
                inner.by_session.remove(&session_key);
            }
        }
    }
}
