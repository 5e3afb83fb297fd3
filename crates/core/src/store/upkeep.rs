//! What the store's upkeep did last (retention's passes, backups), shared by
//! the tasks that do it and the status and metrics that show it.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

/// The record of the store's upkeep. Cheap to clone; clones share it.
#[derive(Debug, Clone, Default)]
pub struct Upkeep {
    inner: Arc<Mutex<UpkeepState>>,
}

/// What [`Upkeep`] holds.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct UpkeepState {
    /// The last retention pass, once one ran.
    pub last_prune: Option<PrunePass>,
    /// Removed since the gateway started, by step kind
    /// ([`PruneStep::kind`](super::PruneStep::kind)).
    pub pruned_total: BTreeMap<&'static str, u64>,
    /// The newest backup known to have succeeded.
    pub last_backup: Option<Backup>,
    /// Why the last scheduled backup failed, until one succeeds.
    pub backup_error: Option<String>,
}

/// One retention pass.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PrunePass {
    /// When it ended (ms since the epoch).
    pub at_ms: i64,
    pub took_ms: u64,
    /// What it removed, by step kind; kinds that removed nothing are left out.
    pub removed: BTreeMap<&'static str, u64>,
    /// The step that failed and why; the pass stopped there.
    pub error: Option<String>,
}

/// A backup that was made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Backup {
    /// When (ms since the epoch).
    pub at_ms: i64,
    pub path: PathBuf,
}

impl Upkeep {
    /// A copy of what it holds now.
    pub fn snapshot(&self) -> UpkeepState {
        self.lock().clone()
    }

    /// Records a retention pass and adds what it removed to the totals.
    pub fn pruned(&self, pass: PrunePass) {
        let mut state = self.lock();
        for (kind, n) in &pass.removed {
            *state.pruned_total.entry(kind).or_default() += n;
        }
        state.last_prune = Some(pass);
    }

    /// Records a backup made at `at_ms` (a newer one than known replaces it).
    pub fn backed_up(&self, backup: Backup) {
        let mut state = self.lock();
        if state.last_backup.as_ref().is_none_or(|last| last.at_ms <= backup.at_ms) {
            state.last_backup = Some(backup);
        }
        state.backup_error = None;
    }

    /// Records why a scheduled backup failed.
    pub fn backup_failed(&self, error: String) {
        self.lock().backup_error = Some(error);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, UpkeepState> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_add_up_over_passes_and_the_newest_backup_stays() {
        let upkeep = Upkeep::default();
        upkeep.pruned(PrunePass { removed: [("runs", 3)].into(), ..PrunePass::default() });
        upkeep.pruned(PrunePass {
            at_ms: 9,
            removed: [("runs", 2), ("events", 5)].into(),
            ..PrunePass::default()
        });
        let state = upkeep.snapshot();
        assert_eq!(state.pruned_total, [("events", 5), ("runs", 5)].into());
        assert_eq!(state.last_prune.map(|pass| pass.at_ms), Some(9));

        upkeep.backup_failed("disk full".to_owned());
        upkeep.backed_up(Backup { at_ms: 20, path: "/b/2".into() });
        upkeep.backed_up(Backup { at_ms: 10, path: "/b/1".into() });
        let state = upkeep.snapshot();
        assert_eq!(state.last_backup.map(|b| b.path), Some(PathBuf::from("/b/2")));
        assert_eq!(state.backup_error, None);
    }
}
