//! The config in force, as the gateway reports it: which generation, what is
//! waiting for a restart, and why the file on disk was last refused.

use std::sync::{Arc, RwLock};

/// A refused edit of the config file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    /// `<file>:<line>:<column>: <key>: <message>`; never a secret's value.
    pub error: String,
    /// Wall-clock milliseconds.
    pub at_ms: i64,
}

/// What `GET /v1/config` and the health report show about the config.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ConfigReport {
    /// 1 for the config read at start, one more for each applied edit.
    pub generation: u64,
    /// The settings in force, defaults filled in, secrets redacted.
    pub effective: serde_json::Value,
    /// Settings edited in the file that take effect at the next start
    /// (dotted keys with the value in force and the one in the file).
    pub pending_restart: Vec<PendingRestart>,
    /// Set while the file on disk is refused: the last good config stays.
    pub rejected: Option<Rejection>,
    /// Set while the file is missing: the running config stays.
    pub missing: bool,
    /// Edits applied since the start (one generation each).
    pub n_applied: u64,
    /// Edits refused since the start.
    pub n_rejected: u64,
}

/// A setting whose edit waits for a restart.
#[derive(Debug, Clone, PartialEq)]
pub struct PendingRestart {
    pub key: String,
    pub running: serde_json::Value,
    pub file: serde_json::Value,
}

/// The shared, current [`ConfigReport`]. Cheap to clone; every clone sees
/// the latest report.
#[derive(Debug, Clone, Default)]
pub struct ConfigStatus {
    inner: Arc<RwLock<ConfigReport>>,
}

impl ConfigStatus {
    /// A status starting with `report`.
    pub fn new(report: ConfigReport) -> Self {
        ConfigStatus { inner: Arc::new(RwLock::new(report)) }
    }

    /// The current report.
    pub fn get(&self) -> ConfigReport {
        self.inner.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Changes the report in place.
    pub fn update(&self, change: impl FnOnce(&mut ConfigReport)) {
        change(&mut self.inner.write().unwrap_or_else(|e| e.into_inner()));
    }
}
