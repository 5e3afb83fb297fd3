//! The execution runtime: a global limit of concurrent runs, strict FIFO per
//! conversation, the engine lock, and exactly-once completion of every accepted
//! request.
//!
//! [`GatewayHandle`] is the only way in. Behind it a scheduler actor owns the
//! conversation table (one entry per conversation with queued or running work,
//! created on demand and removed when drained), the FIFO of conversations waiting
//! for a slot, and the table of queued and running runs. Each granted slot becomes a
//! run task (`run`), which takes the engine lock ([`EngineLock`]), drives the engine,
//! publishes every event on the bus, writes the store, and reports back to the
//! scheduler. The gateway knows nothing of queue modes; the router decides what to
//! submit.

mod lock;
pub mod retry;
mod run;
mod scheduler;

pub use lock::{EngineLock, LockGuard, LockKey, LockTimeout};
pub(crate) use run::{complete, RunEnd};

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::budget::BudgetGuard;
use crate::bus::{EventBus, RunStatus};
use crate::cluster::ClusterNode;
use crate::config::SessionLimits;
use crate::contain::OffLimits;
use crate::engine::{EngineRegistry, ResumeToken, RunError, SteerError};
use crate::ids::{ConversationKey, EngineRef, Model, RunId, SessionKey};
use crate::store::StoreHandle;

use scheduler::{Scheduler, SchedulerMsg};

/// Runtime settings, built by the app from `[gateway]`.
#[derive(Debug, Clone)]
pub struct RuntimeConfig {
    pub max_concurrent_runs: usize,
    pub require_engine_lock: bool,
    pub engine_lock_timeout: Duration,
    /// A lock held longer than this is handed to the next waiter.
    pub engine_lock_max_age: Duration,
    pub run_inactivity_timeout: Duration,
    /// Requests waiting across all conversations before submits are refused.
    pub max_pending_runs: usize,
    pub default_cwd: Option<PathBuf>,
    /// The user's home directory, the fallback working directory.
    pub home_dir: Option<PathBuf>,
    /// When not empty, a run whose working directory is outside all of these
    /// fails to start (`[gateway] allowed_cwd_roots`).
    pub allowed_cwd_roots: Vec<PathBuf>,
    /// Capacity of each run's engine event channel.
    pub engine_event_buffer: usize,
    /// How long a cancelled (or timed-out) run waits for its engine to stop
    /// ([`RunControl::stopped`](crate::engine::RunControl::stopped)) before it
    /// completes anyway: a safety bound, so a broken engine cannot hold a slot
    /// forever. It must exceed the engines' own SIGTERM → SIGKILL grace.
    pub engine_stop_timeout: Duration,
    /// `[gateway] workspace_dir`, expanded: files a run sends back may also be here.
    pub workspace_dir: Option<PathBuf>,
    /// The gateway's own state (home, config, secrets, keychain files): no
    /// run's tools, artifacts or directory reach it.
    pub off_limits: OffLimits,
    /// Where a run goes whose directory (the default, a project's root, a
    /// request's `cwd`) would hold the gateway's state or be inside it:
    /// created when first used. `None` leaves such a run where it was asked
    /// to run (its file tools and artifacts still keep out of the state).
    pub spare_cwd: Option<PathBuf>,
    /// `[gateway] auto_send_generated_images`: images a run added through its file
    /// changes are sent with the answer.
    pub auto_send_generated_images: bool,
    /// Where channels keep received files until their run starts; `None`:
    /// files sent with a request are not placed (the run gets no note).
    pub media_stage: Option<crate::media::MediaStage>,
    /// Checked before every run starts (a session at its limit completes
    /// `budget_exceeded` without starting its engine) and asked what a
    /// finished run spent; `None`: no limits, and no prices.
    pub budget: Option<Arc<dyn BudgetGuard>>,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            max_concurrent_runs: 2,
            require_engine_lock: true,
            engine_lock_timeout: Duration::from_millis(60_000),
            engine_lock_max_age: Duration::from_millis(300_000),
            run_inactivity_timeout: Duration::from_millis(300_000),
            max_pending_runs: 10_000,
            default_cwd: None,
            home_dir: None,
            allowed_cwd_roots: Vec::new(),
            engine_event_buffer: 64,
            engine_stop_timeout: Duration::from_millis(30_000),
            workspace_dir: None,
            off_limits: OffLimits::none(),
            spare_cwd: None,
            auto_send_generated_images: false,
            media_stage: None,
            budget: None,
        }
    }
}

/// A request the gateway runs as is: the router has already chosen the engine,
/// the resume token and the conversation.
#[derive(Debug, Clone)]
pub struct ExecutionRequest {
    /// A caller-supplied id, or `None` for a generated one.
    pub run_id: Option<RunId>,
    pub conversation: ConversationKey,
    pub session_key: SessionKey,
    pub prompt: String,
    /// The engine, with the model it names when composite (`claude:opus`).
    pub engine: EngineRef,
    pub resume: Option<ResumeToken>,
    pub cwd: Option<PathBuf>,
    /// The model to run with when the engine names none (`claude:opus` does).
    pub model: Option<Model>,
    pub meta: BTreeMap<String, serde_json::Value>,
    /// The caller keeps the request in a durable journal and runs it again after a
    /// restart (the router does). At shutdown such a request, if it is still
    /// waiting for a slot, is left queued rather than completed `shutting_down`.
    pub journaled: bool,
    /// The limits of the binding the request's channel matched.
    pub budget: Option<Box<SessionLimits>>,
}

impl ExecutionRequest {
    /// A request on the session's own conversation with no extras.
    pub fn new(
        session_key: impl Into<SessionKey>,
        engine: EngineRef,
        prompt: impl Into<String>,
    ) -> Self {
        let session_key = session_key.into();
        ExecutionRequest {
            run_id: None,
            conversation: ConversationKey::session(&session_key),
            session_key,
            prompt: prompt.into(),
            engine,
            resume: None,
            cwd: None,
            model: None,
            meta: BTreeMap::new(),
            journaled: false,
            budget: None,
        }
    }
}

/// Why a request was not accepted. Nothing was queued and no event was published.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SubmitError {
    #[error("the gateway is shutting down")]
    ShuttingDown,
    #[error("unknown engine {engine:?}")]
    UnknownEngine { engine: String },
    #[error("run id {run_id} is already in use")]
    DuplicateRunId { run_id: String },
    #[error("the gateway is overloaded: {pending} requests are already waiting")]
    Overloaded { pending: usize },
}

/// The gateway is gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the gateway is shutting down")]
pub struct ShuttingDown;

/// What a cancel did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelOutcome {
    /// The run was queued or running and is now being cancelled.
    Cancelling,
    /// The gateway holds no queued or running run with that id (it may have finished).
    NotActive,
}

/// A queued or running run, as the scheduler sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct ActiveRun {
    pub run_id: RunId,
    pub session_key: SessionKey,
    pub conversation: ConversationKey,
    pub engine: EngineRef,
    pub status: RunStatus,
    pub created_at_ms: i64,
    pub started_at_ms: Option<i64>,
}

/// The scheduler's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SchedulerSnapshot {
    /// Runs holding a slot.
    pub in_flight: usize,
    /// Conversations waiting for a slot.
    pub waitq: usize,
    pub max: usize,
    /// Conversations with queued or running work.
    pub conversations: usize,
    /// Requests accepted and not yet started.
    pub queued: usize,
    /// Intake paused ([`GatewayHandle::set_paused`]): requests queue, no run starts.
    pub paused: bool,
}

/// Everything a gateway needs from outside.
#[derive(Debug, Clone)]
pub struct GatewayDeps {
    pub config: RuntimeConfig,
    pub engines: EngineRegistry,
    pub store: StoreHandle,
    pub bus: EventBus,
}

/// The handle to a running gateway. Cheap to clone.
#[derive(Debug, Clone)]
pub struct GatewayHandle {
    tx: mpsc::Sender<SchedulerMsg>,
    engines: EngineRegistry,
    store: StoreHandle,
    bus: EventBus,
    /// This node's cluster, in cluster mode.
    cluster: Option<Arc<ClusterNode>>,
}

impl GatewayHandle {
    /// Starts the scheduler on `tracker`; it stops when `token` is cancelled.
    pub fn start(deps: GatewayDeps, token: CancellationToken, tracker: &TaskTracker) -> Self {
        Self::start_clustered(deps, None, token, tracker)
    }

    /// [`GatewayHandle::start`] for a node of a cluster (`Some`): every run
    /// claims one of the cluster's slots before its engine starts, and the
    /// node's engines stop once it is fenced.
    pub fn start_clustered(
        deps: GatewayDeps,
        cluster: Option<Arc<ClusterNode>>,
        token: CancellationToken,
        tracker: &TaskTracker,
    ) -> Self {
        let (tx, rx) = mpsc::channel(1024);
        let handle = GatewayHandle {
            tx: tx.clone(),
            engines: deps.engines.clone(),
            store: deps.store.clone(),
            bus: deps.bus.clone(),
            cluster: cluster.clone(),
        };
        tracker.spawn(keep_timings(deps.bus.clone(), deps.store.clone(), token.clone()));
        let scheduler = Scheduler::new(deps, cluster, rx, tx, token, tracker.clone());
        tracker.spawn(scheduler.run());
        handle
    }

    /// Accepts a request: stores it as queued and hands it to its conversation.
    ///
    /// # Errors
    /// [`SubmitError`] when the request was not accepted.
    ///
    /// # Cancel safety
    /// Not cancel safe: a cancelled call may or may not have queued the request.
    pub async fn submit(&self, req: ExecutionRequest) -> Result<RunId, SubmitError> {
        if self.engines.engine(req.engine.id()).is_none() {
            return Err(SubmitError::UnknownEngine { engine: req.engine.to_string() });
        }
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(SchedulerMsg::Submit { req, reply })
            .await
            .map_err(|_| SubmitError::ShuttingDown)?;
        rx.await.map_err(|_| SubmitError::ShuttingDown)?
    }

    /// Cancels a queued or running run. Idempotent.
    ///
    /// # Errors
    /// [`ShuttingDown`] when the gateway is gone.
    pub async fn cancel(
        &self,
        run_id: &RunId,
        reason: RunError,
    ) -> Result<CancelOutcome, ShuttingDown> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(SchedulerMsg::Cancel { run_id: run_id.clone(), reason, reply })
            .await
            .map_err(|_| ShuttingDown)?;
        rx.await.map_err(|_| ShuttingDown)
    }

    /// Sends more input into a running run.
    ///
    /// # Errors
    /// [`SteerError`] when the run is not running or its engine refused.
    pub async fn steer(&self, run_id: &RunId, text: &str) -> Result<(), SteerError> {
        self.control(run_id).await?.steer(text).await
    }

    /// Redirects a running run.
    ///
    /// # Errors
    /// [`SteerError`] when the run is not running or its engine refused.
    pub async fn redirect(&self, run_id: &RunId, text: &str) -> Result<(), SteerError> {
        self.control(run_id).await?.redirect(text).await
    }

    async fn control(
        &self,
        run_id: &RunId,
    ) -> Result<Arc<dyn crate::engine::RunControl>, SteerError> {
        let (reply, rx) = oneshot::channel();
        let msg = SchedulerMsg::Control { run_id: run_id.clone(), reply };
        self.tx.send(msg).await.map_err(|_| SteerError::Finished)?;
        rx.await.map_err(|_| SteerError::Finished)?.ok_or(SteerError::Finished)
    }

    /// A queued or running run.
    ///
    /// # Errors
    /// [`ShuttingDown`] when the gateway is gone.
    pub async fn active_run(&self, run_id: &RunId) -> Result<Option<ActiveRun>, ShuttingDown> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(SchedulerMsg::ActiveRun { run_id: run_id.clone(), reply })
            .await
            .map_err(|_| ShuttingDown)?;
        rx.await.map_err(|_| ShuttingDown)
    }

    /// Every queued or running run, oldest first.
    ///
    /// # Errors
    /// [`ShuttingDown`] when the gateway is gone.
    pub async fn active_runs(&self) -> Result<Vec<ActiveRun>, ShuttingDown> {
        let (reply, rx) = oneshot::channel();
        self.tx.send(SchedulerMsg::ActiveRuns { reply }).await.map_err(|_| ShuttingDown)?;
        rx.await.map_err(|_| ShuttingDown)
    }

    /// # Errors
    /// [`ShuttingDown`] when the gateway is gone.
    pub async fn snapshot(&self) -> Result<SchedulerSnapshot, ShuttingDown> {
        let (reply, rx) = oneshot::channel();
        self.tx.send(SchedulerMsg::Snapshot { reply }).await.map_err(|_| ShuttingDown)?;
        rx.await.map_err(|_| ShuttingDown)
    }

    /// The directory a run asking for `requested` (`None`: the default)
    /// would work in now, as the run itself would choose it.
    ///
    /// # Errors
    /// [`ShuttingDown`] when the gateway is gone; the inner error says why no
    /// directory is allowed (outside `allowed_cwd_roots`, no spare directory).
    pub async fn run_dir(
        &self,
        requested: Option<PathBuf>,
    ) -> Result<Result<PathBuf, String>, ShuttingDown> {
        let (reply, rx) = oneshot::channel();
        let msg = SchedulerMsg::RunDir { requested, reply };
        self.tx.send(msg).await.map_err(|_| ShuttingDown)?;
        rx.await.map_err(|_| ShuttingDown)
    }

    /// The gateway's own state (home, config, secrets): what no run reaches,
    /// and what a channel's `/file put` and `/file get` keep out of.
    ///
    /// # Errors
    /// [`ShuttingDown`] when the gateway is gone.
    pub async fn off_limits(&self) -> Result<OffLimits, ShuttingDown> {
        let (reply, rx) = oneshot::channel();
        self.tx.send(SchedulerMsg::OffLimits { reply }).await.map_err(|_| ShuttingDown)?;
        rx.await.map_err(|_| ShuttingDown)
    }

    /// Changes the number of slots; extra runs finish, freed slots go to waiters.
    ///
    /// # Errors
    /// [`ShuttingDown`] when the gateway is gone.
    pub async fn set_max_concurrent_runs(&self, max: usize) -> Result<(), ShuttingDown> {
        self.tx.send(SchedulerMsg::SetMax { max }).await.map_err(|_| ShuttingDown)
    }

    /// Pauses intake (`true`) or resumes it. While paused, requests are still
    /// accepted and queued, runs already started go on, and no new run starts;
    /// resuming starts the queued ones in their order. A drain still completes
    /// the queued requests as shutting down.
    ///
    /// # Errors
    /// [`ShuttingDown`] when the gateway is gone.
    pub async fn set_paused(&self, paused: bool) -> Result<(), ShuttingDown> {
        self.tx.send(SchedulerMsg::SetPaused { paused }).await.map_err(|_| ShuttingDown)
    }

    /// Puts a new generation of the settings in force: runs that start from now
    /// on use it (slots, timeouts, the engine lock, working directories), runs
    /// already started keep the one they started with.
    ///
    /// # Errors
    /// [`ShuttingDown`] when the gateway is gone.
    pub async fn reload(&self, config: RuntimeConfig) -> Result<(), ShuttingDown> {
        let msg = SchedulerMsg::Reload { config: Box::new(config) };
        self.tx.send(msg).await.map_err(|_| ShuttingDown)
    }

    /// Stops accepting, lets running runs finish for up to `grace`, then cancels
    /// them with `shutting_down`; queued requests complete with `shutting_down`.
    /// Returns when every run has completed.
    ///
    /// # Errors
    /// [`ShuttingDown`] when the gateway was already gone.
    pub async fn drain(&self, grace: Duration) -> Result<(), ShuttingDown> {
        let (reply, rx) = oneshot::channel();
        self.tx.send(SchedulerMsg::Drain { grace, reply }).await.map_err(|_| ShuttingDown)?;
        rx.await.map_err(|_| ShuttingDown)
    }

    pub(crate) fn bus(&self) -> &EventBus {
        &self.bus
    }

    pub(crate) fn store(&self) -> &StoreHandle {
        &self.store
    }

    pub(crate) fn engines(&self) -> &EngineRegistry {
        &self.engines
    }

    /// This node's cluster, in cluster mode.
    pub fn cluster(&self) -> Option<&Arc<ClusterNode>> {
        self.cluster.as_ref()
    }
}

/// Writes each run's stage stamps to its row as its timing closes.
async fn keep_timings(bus: EventBus, store: StoreHandle, token: CancellationToken) {
    let mut closed = bus.timings().subscribe();
    loop {
        let timing = tokio::select! {
            () = token.cancelled() => return,
            timing = closed.recv() => timing,
        };
        match timing {
            Ok(timing) => store.runs().merge_stages(timing.run_id.clone(), timing.stamps).await,
            Err(tokio::sync::broadcast::error::RecvError::Lagged(missed)) => {
                tracing::debug!(missed, "run timings not kept: the store fell behind");
            }
            Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
        }
    }
}

#[cfg(test)]
mod tests;
