//! Which writes of a cluster node are fenced, and by which lease.
//!
//! In cluster mode every write of a run (its row, its events, its completion,
//! its journal entry) lands only while the node still holds the run's session
//! lease at the epoch the run started under. The node registers each run it
//! owns here ([`Fences::register`]); a write picks its fence up when it is
//! queued, and the writer checks every fence of a batch in the batch's own
//! transaction (the lease rows `FOR KEY SHARE`, live, this node's, that epoch)
//! and drops the writes whose fence failed. A run nobody registered (a request
//! this node journaled for a session another node owns) is written unfenced.
//!
//! Once the node is fenced ([`Fences::fence_all`]) every registered run's
//! writes are dropped without asking the database: those queued from then on
//! at once, and those the writer still holds before its next batch.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// The lease a write is conditional on.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Fence {
    pub session_key: String,
    pub node: String,
    pub epoch: i64,
}

/// The runs a cluster node writes under a lease. Cheap to clone; clones share.
#[derive(Debug, Clone, Default)]
pub struct Fences {
    inner: Arc<Shared>,
}

#[derive(Debug, Default)]
struct Shared {
    /// Whether cluster mode is on: read for every write, so without a lock.
    enabled: AtomicBool,
    state: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// This node's id once cluster mode is on.
    node: Option<String>,
    /// Set once the node could not renew its leases in time.
    fenced: bool,
    runs: HashMap<String, Arc<Fence>>,
    /// Sessions this node holds, with their epochs: chat state is fenced by them.
    sessions: HashMap<String, i64>,
}

/// What a write carries from the moment it is queued.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WriteFence {
    /// Not a cluster write, or a run this node does not own: written as is.
    None,
    /// Written only while the lease is live at the epoch.
    Lease(Arc<Fence>),
    /// The node was fenced: dropped.
    Refused,
}

impl Fences {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Turns cluster mode on for node `node`.
    pub fn enable(&self, node: &str) {
        self.lock().node = Some(node.to_owned());
        self.inner.enabled.store(true, Ordering::Release);
    }

    /// Whether cluster mode is on.
    pub fn enabled(&self) -> bool {
        self.inner.enabled.load(Ordering::Acquire)
    }

    /// Writes of `run_id` land only under session `session_key`'s lease at `epoch`.
    pub fn register(&self, run_id: &str, session_key: &str, epoch: i64) {
        let mut inner = self.lock();
        let Some(node) = inner.node.clone() else { return };
        let fence = Fence { session_key: session_key.to_owned(), node, epoch };
        inner.runs.insert(run_id.to_owned(), Arc::new(fence));
    }

    /// The run completed and its last write is queued.
    pub fn forget(&self, run_id: &str) {
        self.lock().runs.remove(run_id);
    }

    /// This node holds session `session_key` at `epoch` (`None`: no longer).
    pub fn set_session(&self, session_key: &str, epoch: Option<i64>) {
        let mut inner = self.lock();
        match epoch {
            Some(epoch) => inner.sessions.insert(session_key.to_owned(), epoch),
            None => inner.sessions.remove(session_key),
        };
    }

    /// The node could not renew its leases: no write of any run it registered,
    /// or of any session it held, lands any more.
    pub fn fence_all(&self) {
        self.lock().fenced = true;
    }

    /// Whether [`Fences::fence_all`] was called.
    pub fn is_fenced(&self) -> bool {
        self.lock().fenced
    }

    /// Whether this node registered run `run_id` (it runs here) and has not
    /// forgotten it yet.
    pub fn has_run(&self, run_id: &str) -> bool {
        self.enabled() && self.lock().runs.contains_key(run_id)
    }

    /// The fence of a write of run `run_id`.
    pub fn of_run(&self, run_id: &str) -> WriteFence {
        if !self.enabled() {
            return WriteFence::None;
        }
        let inner = self.lock();
        match inner.runs.get(run_id) {
            None => WriteFence::None,
            Some(_) if inner.fenced => WriteFence::Refused,
            Some(fence) => WriteFence::Lease(Arc::clone(fence)),
        }
    }

    /// The fence of a write of session `session_key`'s own state (chat state).
    pub fn of_session(&self, session_key: &str) -> WriteFence {
        if !self.enabled() {
            return WriteFence::None;
        }
        let inner = self.lock();
        let Some(node) = inner.node.clone() else { return WriteFence::None };
        match inner.sessions.get(session_key) {
            None => WriteFence::None,
            Some(_) if inner.fenced => WriteFence::Refused,
            Some(epoch) => WriteFence::Lease(Arc::new(Fence {
                session_key: session_key.to_owned(),
                node,
                epoch: *epoch,
            })),
        }
    }

    /// How many runs are registered (for status).
    pub fn runs(&self) -> usize {
        self.lock().runs.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_registered_run_is_fenced_by_its_lease_until_forgotten() {
        let fences = Fences::default();
        fences.register("r1", "s", 1);
        assert_eq!(fences.of_run("r1"), WriteFence::None, "off until cluster mode is on");
        fences.enable("node-a");
        fences.register("r1", "s", 3);
        let expected = Fence { session_key: "s".into(), node: "node-a".into(), epoch: 3 };
        assert_eq!(fences.of_run("r1"), WriteFence::Lease(Arc::new(expected)));
        assert!(fences.has_run("r1") && !fences.has_run("r2"));
        assert_eq!(fences.of_run("r2"), WriteFence::None);
        fences.fence_all();
        assert_eq!(fences.of_run("r1"), WriteFence::Refused);
        fences.forget("r1");
        assert_eq!(fences.of_run("r1"), WriteFence::None);
    }

    #[test]
    fn session_state_is_fenced_while_the_session_is_held() {
        let fences = Fences::default();
        fences.enable("node-a");
        assert_eq!(fences.of_session("s"), WriteFence::None);
        fences.set_session("s", Some(2));
        assert!(matches!(fences.of_session("s"), WriteFence::Lease(f) if f.epoch == 2));
        fences.set_session("s", None);
        assert_eq!(fences.of_session("s"), WriteFence::None);
    }
}
