//! Chat states the store knows without asking the file: writes on their way to
//! it, and the committed state of the sessions looked up or written last.
//!
//! A put or delete is noted here before it is queued and forgotten as pending
//! once the batch that holds it has ended. So at every moment a session's
//! newest chat state is either pending here or in the file for any read
//! transaction that starts now. The router reads chat state for every request
//! it accepts; before this, each read was a round trip to the writer thread
//! (and a wake-up of both threads).
//!
//! A batch that committed cleanly leaves the states it wrote here as known,
//! and a lookup that had to read the file leaves what it found, for up to
//! [`KNOWN_SESSIONS`] sessions. A read of the file was most of a lookup's cost:
//! every commit in between makes SQLite drop the connection's page cache and
//! read the index again. The store is the file's only writer, so what it
//! committed is what the file holds; a batch with any failed write forgets
//! what it touched, and the file has the answer again.

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::sync::Mutex;

use foldhash::fast::RandomState;

use super::super::ChatState;
use crate::ids::SessionKey;

/// Sessions whose committed chat state is kept; past that the known states
/// are dropped and gathered again from the file (a few hundred bytes each).
pub(super) const KNOWN_SESSIONS: usize = 4096;

/// The number [`ChatStates::ended`] takes for a write that was never noted
/// (the removal of an expired state): the session's known state is forgotten.
pub(super) const FORGET: u64 = 0;

/// Committed chat states by session.
type KnownStates = HashMap<SessionKey, Option<ChatState>, RandomState>;

/// A session's chat state as the store knows it: queued writes first, then
/// the committed states of sessions used lately.
#[derive(Debug, Default)]
pub(super) struct ChatStates {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// Numbers each noted write (from 1), so a commit forgets only the write
    /// it holds, not a newer one for the same session.
    next_version: u64,
    /// The newest queued write of each session: its number and the state it
    /// leaves (`None`: deleted).
    pending: HashMap<SessionKey, (u64, Option<ChatState>), RandomState>,
    /// What the file holds for sessions used lately (`None`: no row).
    known: KnownStates,
    /// Counts ended batches that wrote chat state, so a file read that raced
    /// with one does not keep what it read.
    batches: u64,
}

/// The answer of [`ChatStates::get`].
#[derive(Debug, PartialEq)]
pub(super) enum Known {
    /// The session's newest state (`None`: it has none).
    State(Option<ChatState>),
    /// Only the file knows; pass `mark` to [`ChatStates::remember`] with what
    /// it said.
    Unknown { mark: u64 },
}

impl ChatStates {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Notes a write about to be queued; its number, for [`Self::ended`].
    pub(super) fn note(&self, session_key: &SessionKey, state: Option<ChatState>) -> u64 {
        let mut inner = self.lock();
        inner.next_version += 1;
        let version = inner.next_version;
        inner.pending.insert(session_key.clone(), (version, state));
        version
    }

    /// The session's state when a queued write or a recent commit or read
    /// tells it.
    pub(super) fn get(&self, session_key: &SessionKey) -> Known {
        let inner = self.lock();
        if let Some((_, state)) = inner.pending.get(session_key) {
            return Known::State(state.clone());
        }
        match inner.known.get(session_key) {
            Some(state) => Known::State(state.clone()),
            None => Known::Unknown { mark: inner.batches },
        }
    }

    /// Keeps what the file said of a session after [`Self::get`] gave `mark`,
    /// unless a batch writing chat state ended in between (the read may have
    /// seen the file before it) or a write of the session is queued.
    pub(super) fn remember(&self, session_key: &SessionKey, state: Option<ChatState>, mark: u64) {
        let mut inner = self.lock();
        if inner.batches != mark || inner.pending.contains_key(session_key) {
            return;
        }
        keep(&mut inner.known, session_key.clone(), state);
    }

    /// Forgets the writes of a batch that has ended as pending. When it
    /// committed with no failed write (`clean`), their states are what the
    /// file holds and stay known; otherwise the file has the last word on
    /// them. Takes the list and leaves it empty.
    pub(super) fn ended(&self, done: &mut Vec<(SessionKey, u64)>, clean: bool) {
        if done.is_empty() {
            return;
        }
        let inner = &mut *self.lock();
        inner.batches += 1;
        for (session_key, version) in done.drain(..) {
            match inner.pending.entry(session_key) {
                Entry::Occupied(entry) if entry.get().0 == version => {
                    let (session_key, (_, state)) = entry.remove_entry();
                    if clean {
                        keep(&mut inner.known, session_key, state);
                    } else {
                        inner.known.remove(&session_key);
                    }
                }
                // A newer write is queued and answers lookups until its own
                // batch ends, or this was a removal the file alone knows of.
                other => {
                    inner.known.remove(other.key());
                }
            }
        }
    }
}

/// Keeps `state` as known for `session_key`, within [`KNOWN_SESSIONS`].
fn keep(known: &mut KnownStates, session_key: SessionKey, state: Option<ChatState>) {
    if known.len() >= KNOWN_SESSIONS && !known.contains_key(&session_key) {
        known.clear();
    }
    known.insert(session_key, state);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> SessionKey {
        SessionKey::parse(name).unwrap()
    }

    fn state(token: &str) -> Option<ChatState> {
        Some(ChatState {
            last_engine: "echo".to_owned(),
            last_resume_token: token.to_owned(),
            updated_at_ms: 1,
            expires_at_ms: 10,
        })
    }

    #[test]
    fn a_clean_commit_stays_known_and_a_failed_one_sends_lookups_to_the_file() {
        let states = ChatStates::default();
        let v1 = states.note(&key("a"), state("t1"));
        let v2 = states.note(&key("b"), state("t2"));
        assert_eq!(states.get(&key("a")), Known::State(state("t1")), "queued");
        states.ended(&mut vec![(key("a"), v1)], true);
        assert_eq!(states.get(&key("a")), Known::State(state("t1")), "committed");
        states.ended(&mut vec![(key("b"), v2)], false);
        assert!(matches!(states.get(&key("b")), Known::Unknown { .. }), "the file decides");
        // A failed batch also forgets what an earlier one left known.
        let v3 = states.note(&key("a"), state("t3"));
        states.ended(&mut vec![(key("a"), v3)], false);
        assert!(matches!(states.get(&key("a")), Known::Unknown { .. }));
    }

    #[test]
    fn a_newer_write_answers_until_its_own_batch_ends() {
        let states = ChatStates::default();
        let old = states.note(&key("a"), state("old"));
        let new = states.note(&key("a"), None);
        states.ended(&mut vec![(key("a"), old)], true);
        assert_eq!(states.get(&key("a")), Known::State(None), "the delete is still queued");
        states.ended(&mut vec![(key("a"), new)], true);
        assert_eq!(states.get(&key("a")), Known::State(None), "deleted, and known to be");
    }

    #[test]
    fn removing_an_expired_state_forgets_what_was_known() {
        let states = ChatStates::default();
        let v = states.note(&key("a"), state("t1"));
        states.ended(&mut vec![(key("a"), v), (key("a"), FORGET)], true);
        assert!(matches!(states.get(&key("a")), Known::Unknown { .. }));
    }

    #[test]
    fn a_file_read_is_kept_unless_a_batch_ended_or_a_write_was_queued_meanwhile() {
        let states = ChatStates::default();
        let Known::Unknown { mark } = states.get(&key("a")) else { panic!("nothing known") };
        states.remember(&key("a"), state("read"), mark);
        assert_eq!(states.get(&key("a")), Known::State(state("read")));

        // A batch ends while `b` is read: what the read saw may be older.
        let Known::Unknown { mark } = states.get(&key("b")) else { panic!("nothing known") };
        let v = states.note(&key("b"), state("written"));
        states.ended(&mut vec![(key("b"), v)], true);
        states.remember(&key("b"), state("stale"), mark);
        assert_eq!(states.get(&key("b")), Known::State(state("written")));

        // A write of `c` is queued while `c` is read.
        let Known::Unknown { mark } = states.get(&key("c")) else { panic!("nothing known") };
        states.note(&key("c"), state("queued"));
        states.remember(&key("c"), None, mark);
        assert_eq!(states.get(&key("c")), Known::State(state("queued")));
    }

    #[test]
    fn known_sessions_stay_bounded() {
        let states = ChatStates::default();
        for n in 0..=KNOWN_SESSIONS {
            let Known::Unknown { mark } = states.get(&key(&format!("s{n}"))) else {
                panic!("s{n} was not read yet")
            };
            states.remember(&key(&format!("s{n}")), None, mark);
        }
        assert!(states.lock().known.len() <= KNOWN_SESSIONS);
        assert_eq!(states.get(&key(&format!("s{KNOWN_SESSIONS}"))), Known::State(None));
    }
}
