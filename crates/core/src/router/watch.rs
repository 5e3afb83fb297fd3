//! Follows one dispatched run on its bus topic: publishes the `dispatched` and
//! `streaming` phases, marks the journal entry started, runs the idle watchdog,
//! and reports the run's completion to the router.
//!
//! The subscription is taken before the run is submitted, so no event is missed;
//! `run_completed` is the topic's last event and survives a lag.

use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::actor::{publish_phase, RouterMsg};
use super::journal::Journal;
use crate::bus::{EventBus, EventKind, RecvError, RunPhase, Subscription};
use crate::engine::{Completion, RunError};
use crate::gateway::GatewayHandle;
use crate::ids::{ConversationKey, RunId, SessionKey};

/// One run's watcher, moved into its task.
#[derive(Debug)]
pub(super) struct Watch {
    pub(super) run_id: RunId,
    pub(super) session_key: SessionKey,
    pub(super) conversation: ConversationKey,
    pub(super) events: Subscription,
    pub(super) router: mpsc::Sender<RouterMsg>,
    pub(super) gateway: GatewayHandle,
    pub(super) journal: Journal,
    pub(super) bus: EventBus,
    pub(super) idle_watchdog: Option<Duration>,
    pub(super) suppress_phases: bool,
    pub(super) token: CancellationToken,
}

impl Watch {
    fn phase(&self, phase: RunPhase) {
        if !self.suppress_phases {
            publish_phase(&self.bus, &self.run_id, &self.session_key, phase);
        }
    }

    pub(super) async fn run(mut self) {
        let mut streaming = false;
        // Armed when the run starts: time spent waiting for a slot is not idleness.
        let mut deadline: Option<Instant> = None;
        let (completion, engine) = loop {
            tokio::select! {
                biased;
                () = self.token.cancelled() => return,
                event = self.events.recv() => match event {
                    Ok(event) => {
                        if matches!(event.kind, EventKind::Phase(_)) {
                            continue;
                        }
                        if let Some(idle) = self.idle_watchdog {
                            deadline = Some(Instant::now() + idle);
                        }
                        match &event.kind {
                            EventKind::RunStarted { .. } => {
                                self.journal.mark_started(&self.run_id).await;
                                self.phase(RunPhase::Dispatched);
                            }
                            EventKind::RunCompleted { completion, engine, .. } => {
                                break (completion.clone(), engine.clone());
                            }
                            _ if !streaming => {
                                streaming = true;
                                self.phase(RunPhase::Streaming);
                            }
                            _ => {}
                        }
                    }
                    Err(RecvError::Lagged(_)) => {}
                    Err(RecvError::Closed) => break self.completion_from_store().await,
                },
                () = sleep_until_opt(deadline) => {
                    deadline = None;
                    tracing::info!(run_id = %self.run_id, "idle watchdog cancels the run");
                    let _ = self.gateway.cancel(&self.run_id, RunError::IdleWatchdog).await;
                }
            }
        };
        let msg = RouterMsg::RunEnded {
            run_id: self.run_id.clone(),
            conversation: self.conversation.clone(),
            completion,
            engine,
        };
        let _ = self.router.send(msg).await;
    }

    /// The topic closed without a completion (the bus went away): the store knows
    /// how the run ended, or it is reported as crashed so the conversation moves on.
    async fn completion_from_store(&self) -> (Completion, String) {
        let record = self.gateway.store().get_run(self.run_id.as_str()).await.ok().flatten();
        match record {
            Some(record) if record.status.is_terminal() => {
                let completion = Completion {
                    ok: record.status == crate::bus::RunStatus::Completed,
                    answer: record.answer.unwrap_or_default(),
                    error: record
                        .error
                        .map(|text| RunError::from_stored(record.error_code.as_deref(), text)),
                    resume: record.resume,
                    usage: record.usage,
                };
                (completion, record.engine)
            }
            _ => {
                let detail = "the run's events stopped before its completion".to_owned();
                (Completion::failure(RunError::EngineCrashed { detail }, None), String::new())
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
