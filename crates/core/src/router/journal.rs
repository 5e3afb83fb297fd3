//! The admission journal: every accepted request, written (and flushed) before the
//! caller hears "accepted", and removed when its `run_completed` is out. After a
//! crash the entries left are exactly the requests that were accepted and never
//! completed; [`super::RouterHandle::start`] handles each once.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use crate::engine::ResumeToken;
use crate::ids::RunId;
use crate::store::StoreError;

/// Whether a journaled request reached its engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JournalState {
    /// Accepted, possibly waiting at the gateway, never started.
    Queued,
    /// The gateway started it.
    Started,
}

impl JournalState {
    pub fn as_str(self) -> &'static str {
        match self {
            JournalState::Queued => "queued",
            JournalState::Started => "started",
        }
    }

    pub fn parse(raw: &str) -> Option<Self> {
        match raw {
            "queued" => Some(JournalState::Queued),
            "started" => Some(JournalState::Started),
            _ => None,
        }
    }
}

/// One accepted request, with everything needed to submit it again.
#[derive(Debug, Clone, PartialEq)]
pub struct JournalEntry {
    /// Acceptance order; recovery re-queues in this order.
    pub seq: u64,
    pub run_id: RunId,
    pub session_key: String,
    pub conversation: String,
    pub prompt: String,
    pub engine: String,
    pub resume: Option<ResumeToken>,
    pub cwd: Option<PathBuf>,
    /// Request metadata (JSON object).
    pub meta: serde_json::Value,
    /// The router's own fields: origin, queue mode, engine choice (JSON object).
    pub route: serde_json::Value,
    pub state: JournalState,
    pub accepted_at_ms: i64,
}

/// Where the router keeps its journal.
#[derive(Debug, Clone, Default)]
pub(super) struct Journal {
    entries: Arc<Mutex<BTreeMap<String, JournalEntry>>>,
}

impl Journal {
    pub(super) fn new() -> Self {
        Journal::default()
    }

    fn entries(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, JournalEntry>> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Writes (or rewrites) an entry and waits until it is durable.
    pub(super) async fn admit(&self, entry: JournalEntry) -> Result<(), StoreError> {
        self.entries().insert(entry.run_id.to_string(), entry);
        Ok(())
    }

    pub(super) async fn mark_started(&self, run_id: &RunId) {
        if let Some(entry) = self.entries().get_mut(run_id.as_str()) {
            entry.state = JournalState::Started;
        }
    }

    pub(super) async fn complete(&self, run_id: &RunId) {
        self.entries().remove(run_id.as_str());
    }

    /// Every entry not completed, in acceptance order.
    pub(super) async fn pending(&self) -> Result<Vec<JournalEntry>, StoreError> {
        let mut all: Vec<JournalEntry> = self.entries().values().cloned().collect();
        all.sort_by_key(|e| e.seq);
        Ok(all)
    }
}
