//! Where each run's time goes: a stamp per stage, from the moment its message
//! reached the channel to the moment its answer was delivered.
//!
//! Each part of the path stamps its own stage on the bus's [`Timings`]: the
//! channel (or the API) when the message arrived and when its sender first saw
//! something and the whole answer, the router when it journaled the request,
//! the scheduler when the conversation handed it on and when a slot was
//! granted, the run when its engine started, sent its first event and its first
//! piece of text, and the completion. The first stamp of a stage wins, so a
//! stage stamped twice (a retried write, an edit after a send) keeps its
//! earliest time.
//!
//! A run's timing closes at its completion, or, when a channel delivers its
//! answer ([`crate::router::RequestFlags::delivers`]), at its delivery. A closed
//! timing is published once ([`Timings::subscribe`]: metrics, the store) and
//! warned about when its total passes `slow_run_warn_ms`. Stamps are taken on
//! tokio's clock from one wall-clock base, so paused-time tests stamp exact
//! times and a process's stamps never go backwards.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio::sync::broadcast;

use crate::ids::RunId;

/// The stages of a run, in the order they usually happen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Stage {
    /// The message reached the channel's edge (a fetched update, an HTTP request).
    Received,
    /// The router journaled the request: from now on a crash does not lose it.
    Journaled,
    /// Its conversation was free and the request went to the scheduler (the
    /// time before this is the time it waited behind its conversation).
    Queued,
    /// A run slot was granted (the time before this waited for a slot).
    SlotGranted,
    /// The engine was started: a CLI's process spawned, an in-process agent called.
    Spawned,
    /// The engine's first event.
    FirstEvent,
    /// The first piece of the answer's text.
    FirstDelta,
    /// The first thing its sender saw: the first send or edit the channel made for it.
    FirstVisible,
    /// The engine finished and the run was completed.
    Completed,
    /// The final answer was delivered to the channel.
    Delivered,
}

impl Stage {
    pub const ALL: [Stage; 10] = [
        Stage::Received,
        Stage::Journaled,
        Stage::Queued,
        Stage::SlotGranted,
        Stage::Spawned,
        Stage::FirstEvent,
        Stage::FirstDelta,
        Stage::FirstVisible,
        Stage::Completed,
        Stage::Delivered,
    ];

    /// The stable name: in the store, the API, metrics labels and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Stage::Received => "received",
            Stage::Journaled => "journaled",
            Stage::Queued => "queued",
            Stage::SlotGranted => "slot_granted",
            Stage::Spawned => "spawned",
            Stage::FirstEvent => "first_event",
            Stage::FirstDelta => "first_delta",
            Stage::FirstVisible => "first_visible",
            Stage::Completed => "completed",
            Stage::Delivered => "delivered",
        }
    }

    pub fn parse(name: &str) -> Option<Stage> {
        Stage::ALL.into_iter().find(|stage| stage.as_str() == name)
    }

    fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for Stage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Microseconds since the Unix epoch on tokio's clock: the wall clock read
/// once, then tokio's monotonic time since. Paused-time tests advance it
/// exactly; it never goes backwards within a process.
pub fn now_us() -> i64 {
    static BASE: OnceLock<(i64, tokio::time::Instant)> = OnceLock::new();
    let (wall_us, at) = *BASE.get_or_init(|| {
        let wall = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
            .unwrap_or(0);
        (wall, tokio::time::Instant::now())
    });
    let since = tokio::time::Instant::now().saturating_duration_since(at);
    wall_us.saturating_add(i64::try_from(since.as_micros()).unwrap_or(i64::MAX))
}

/// A run's stamps: microseconds since the Unix epoch, per stage.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stamps([Option<i64>; 10]);

impl Stamps {
    pub fn get(&self, stage: Stage) -> Option<i64> {
        self.0[stage.index()]
    }

    /// Stamps `stage` at `at_us` unless it was stamped already; whether it was new.
    pub fn stamp(&mut self, stage: Stage, at_us: i64) -> bool {
        let slot = &mut self.0[stage.index()];
        if slot.is_some() {
            return false;
        }
        *slot = Some(at_us);
        true
    }

    /// Adds the stages `other` has and `self` lacks.
    pub fn merge(&mut self, other: &Stamps) {
        for stage in Stage::ALL {
            if let Some(at) = other.get(stage) {
                self.stamp(stage, at);
            }
        }
    }

    pub fn is_empty(&self) -> bool {
        self.0.iter().all(Option::is_none)
    }

    /// The stamped stages in the order they happened (stage order among equal times).
    pub fn in_order(&self) -> Vec<(Stage, i64)> {
        let mut stamped: Vec<(Stage, i64)> =
            Stage::ALL.into_iter().filter_map(|s| self.get(s).map(|at| (s, at))).collect();
        stamped.sort_by_key(|&(stage, at)| (at, stage));
        stamped
    }

    /// The waterfall: each stamped stage after the first with the time since
    /// the stage before it, in the order they happened. The steps add up to
    /// [`Stamps::total_us`].
    pub fn steps(&self) -> Vec<Step> {
        let stamped = self.in_order();
        let Some(&(_, start)) = stamped.first() else { return Vec::new() };
        let mut previous = start;
        stamped
            .into_iter()
            .skip(1)
            .map(|(stage, at)| {
                let step = Step {
                    stage,
                    at_us: at,
                    since_start_us: at.saturating_sub(start).max(0).unsigned_abs(),
                    took_us: at.saturating_sub(previous).max(0).unsigned_abs(),
                };
                previous = at;
                step
            })
            .collect()
    }

    /// From the first stamp to the last.
    pub fn total_us(&self) -> u64 {
        let stamped = self.in_order();
        match (stamped.first(), stamped.last()) {
            (Some(&(_, first)), Some(&(_, last))) => {
                last.saturating_sub(first).max(0).unsigned_abs()
            }
            _ => 0,
        }
    }

    /// The stamps as a JSON object, stage name to microseconds: the store's form.
    pub fn to_json(&self) -> serde_json::Value {
        let map: serde_json::Map<String, serde_json::Value> = Stage::ALL
            .into_iter()
            .filter_map(|s| self.get(s).map(|at| (s.as_str().to_owned(), at.into())))
            .collect();
        serde_json::Value::Object(map)
    }

    /// Reads [`Stamps::to_json`]'s form; names this build does not know are skipped.
    pub fn from_json(value: &serde_json::Value) -> Stamps {
        let mut stamps = Stamps::default();
        if let Some(map) = value.as_object() {
            for (name, at) in map {
                if let (Some(stage), Some(at)) = (Stage::parse(name), at.as_i64()) {
                    stamps.stamp(stage, at);
                }
            }
        }
        stamps
    }
}

/// One bar of the waterfall.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Step {
    pub stage: Stage,
    pub at_us: i64,
    /// From the run's first stamp (usually `received`).
    pub since_start_us: u64,
    /// From the stage before it.
    pub took_us: u64,
}

/// A run's timing once it closed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunTiming {
    pub run_id: RunId,
    /// The channel it came from (`telegram`, `api`, `webhook`, `cron`, …).
    pub channel: String,
    /// The engine's id (`claude`, `echo`, …).
    pub engine: String,
    pub stamps: Stamps,
}

impl RunTiming {
    /// The step that took longest, if the run has two stamps or more.
    pub fn slowest(&self) -> Option<Step> {
        self.stamps.steps().into_iter().max_by_key(|step| step.took_us)
    }
}

/// How long a timing waits for its delivery after its completion before it
/// closes without one (the channel stopped, or delivers elsewhere).
const DELIVERY_PATIENCE: Duration = Duration::from_secs(600);

/// Open timings beyond this are swept for ones past their patience; after a
/// sweep, the next comes when twice as many are open as were left.
const SWEEP_AT: usize = 1024;

#[derive(Debug)]
struct OpenRuns {
    runs: HashMap<RunId, Open>,
    sweep_at: usize,
}

#[derive(Debug, Default)]
struct Open {
    stamps: Stamps,
    channel: String,
    engine: String,
    delivers: bool,
}

/// The stamps of every open run, shared by the channels, the router, the
/// scheduler and the runs (through the bus). Stamping never waits.
#[derive(Debug)]
pub struct Timings {
    open: Mutex<OpenRuns>,
    closed: broadcast::Sender<Arc<RunTiming>>,
    /// `[gateway] slow_run_warn_ms`; 0: no warning.
    slow_run_warn_ms: AtomicU64,
    cancel_overdue: AtomicU64,
}

impl Default for Timings {
    fn default() -> Self {
        Timings {
            open: Mutex::new(OpenRuns { runs: HashMap::new(), sweep_at: SWEEP_AT }),
            closed: broadcast::channel(4096).0,
            slow_run_warn_ms: AtomicU64::new(0),
            cancel_overdue: AtomicU64::new(0),
        }
    }
}

impl Timings {
    /// Stamps `stage` of `run_id` now.
    pub fn stamp(&self, run_id: &RunId, stage: Stage) {
        self.stamp_at(run_id, stage, now_us());
    }

    /// Stamps `stage` of `run_id` at `at_us` (the first stamp of a stage wins).
    /// `completed` closes a run no channel delivers, `delivered` any run.
    pub fn stamp_at(&self, run_id: &RunId, stage: Stage, at_us: i64) {
        let closed = {
            let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
            if open.runs.len() >= open.sweep_at && !open.runs.contains_key(run_id) {
                self.sweep(&mut open.runs, at_us);
                open.sweep_at = (open.runs.len() * 2).max(SWEEP_AT);
            }
            let open = &mut open.runs;
            let entry = open.entry(run_id.clone()).or_default();
            entry.stamps.stamp(stage, at_us);
            let closes = match stage {
                Stage::Delivered => true,
                Stage::Completed => !entry.delivers,
                _ => false,
            };
            closes.then(|| open.remove(run_id)).flatten()
        };
        if let Some(entry) = closed {
            self.close(run_id.clone(), entry);
        }
    }

    /// Names the run's channel and engine (its metrics labels) and whether a
    /// channel will deliver its answer; called when the request is journaled.
    pub fn describe(&self, run_id: &RunId, channel: &str, engine: &str, delivers: bool) {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let entry = open.runs.entry(run_id.clone()).or_default();
        entry.channel = channel.to_owned();
        entry.engine = engine.to_owned();
        entry.delivers = delivers;
    }

    /// The stamps of a run still open.
    pub fn open_stamps(&self, run_id: &RunId) -> Option<Stamps> {
        let open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        open.runs.get(run_id).map(|entry| entry.stamps)
    }

    /// Every timing as it closes.
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<RunTiming>> {
        self.closed.subscribe()
    }

    /// `[gateway] slow_run_warn_ms`; 0 turns the warning off.
    pub fn set_slow_run_warn_ms(&self, ms: u64) {
        self.slow_run_warn_ms.store(ms, Ordering::Relaxed);
    }

    /// A cancel whose engine did not stop within the gateway's stop bound.
    pub fn cancel_overdue(&self) {
        self.cancel_overdue.fetch_add(1, Ordering::Relaxed);
    }

    /// How many cancels were overdue since start (`lemon_cancel_overdue_total`).
    pub fn cancels_overdue(&self) -> u64 {
        self.cancel_overdue.load(Ordering::Relaxed)
    }

    /// Closes the completed runs that waited for a delivery longer than
    /// [`DELIVERY_PATIENCE`].
    fn sweep(&self, open: &mut HashMap<RunId, Open>, now_us: i64) {
        let patience = i64::try_from(DELIVERY_PATIENCE.as_micros()).unwrap_or(i64::MAX);
        let stale: Vec<RunId> = open
            .iter()
            .filter(|(_, entry)| {
                entry.stamps.get(Stage::Completed).is_some_and(|at| now_us - at > patience)
            })
            .map(|(run_id, _)| run_id.clone())
            .collect();
        for run_id in stale {
            if let Some(entry) = open.remove(&run_id) {
                self.close(run_id, entry);
            }
        }
    }

    fn close(&self, run_id: RunId, entry: Open) {
        let timing = RunTiming {
            run_id,
            channel: entry.channel,
            engine: entry.engine,
            stamps: entry.stamps,
        };
        let warn_ms = self.slow_run_warn_ms.load(Ordering::Relaxed);
        let total_ms = timing.stamps.total_us() / 1000;
        if warn_ms > 0 && total_ms > warn_ms {
            if let Some(slowest) = timing.slowest() {
                tracing::warn!(
                    run_id = %timing.run_id,
                    channel = %timing.channel,
                    engine = %timing.engine,
                    total_ms,
                    slowest_stage = slowest.stage.as_str(),
                    slowest_ms = slowest.took_us / 1000,
                    "slow run: {} took longest",
                    slowest.stage
                );
            }
        }
        let _ = self.closed.send(Arc::new(timing));
    }
}

#[cfg(test)]
mod tests;
