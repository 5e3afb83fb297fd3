//! Follows one dispatched run: publishes the `dispatched` and `streaming`
//! phases, marks the journal entry started, runs the idle watchdog, and returns
//! the run's completion for the router.
//!
//! The follower subscribed before the run was submitted, so no event is missed;
//! a lag is resynchronised from the store.

use std::time::Duration;

use tokio::time::Instant;

use super::follow::RunFollower;
use super::journal::Journal;
use crate::bus::{BusEvent, EventBus, EventKind, RunPhase};
use crate::clock::now_ms;
use crate::engine::{Completion, RunError};
use crate::gateway::GatewayHandle;
use std::sync::Arc;

use crate::ids::{RunId, SessionKey};

/// Publishes a phase on the run's topic. Phases are hints for UIs: they are not
/// stored and carry index 0, so they never take an index of the run's own events.
pub(super) fn publish_phase(
    bus: &EventBus,
    run_id: &RunId,
    session_key: &SessionKey,
    phase: RunPhase,
) {
    bus.publish(Arc::new(BusEvent {
        run_id: run_id.clone(),
        session_key: session_key.clone(),
        index: 0,
        ts_ms: now_ms(),
        kind: EventKind::Phase(phase),
    }));
}

/// One run's watcher, moved into its task.
#[derive(Debug)]
pub(super) struct Watch {
    pub(super) run_id: RunId,
    pub(super) session_key: SessionKey,
    pub(super) events: RunFollower,
    pub(super) gateway: GatewayHandle,
    pub(super) journal: Journal,
    pub(super) bus: EventBus,
    pub(super) idle_watchdog: Option<Duration>,
    pub(super) suppress_phases: bool,
}

impl Watch {
    fn phase(&self, phase: RunPhase) {
        if !self.suppress_phases {
            publish_phase(&self.bus, &self.run_id, &self.session_key, phase);
        }
    }

    /// Follows the run to its end: its completion and engine.
    pub(super) async fn run(mut self) -> (Completion, String) {
        let mut streaming = false;
        // Armed when the run starts: time spent waiting for a slot is not idleness.
        let mut deadline: Option<Instant> = None;
        loop {
            tokio::select! {
                biased;
                event = self.events.next() => {
                    let Some(event) = event else {
                        // The bus went away and the store holds no completion.
                        let detail = "the run's events stopped before its completion".to_owned();
                        let crashed = RunError::EngineCrashed { detail };
                        return (Completion::failure(crashed, None), String::new());
                    };
                    if let Some(idle) = self.idle_watchdog {
                        deadline = Some(Instant::now() + idle);
                    }
                    if let Some(completed) = event.completed() {
                        if let EventKind::RunCompleted { completion, engine, .. } = &completed.kind {
                            return (completion.clone(), engine.clone());
                        }
                    }
                    match event.type_name() {
                        "run_started" => {
                            self.journal.mark_started(&self.run_id).await;
                            self.phase(RunPhase::Dispatched);
                        }
                        _ if !streaming => {
                            streaming = true;
                            self.phase(RunPhase::Streaming);
                        }
                        _ => {}
                    }
                },
                () = sleep_until_opt(deadline) => {
                    deadline = None;
                    tracing::info!(run_id = %self.run_id, "idle watchdog cancels the run");
                    let _ = self.gateway.cancel(&self.run_id, RunError::IdleWatchdog).await;
                }
            }
        }
    }
}

async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}
