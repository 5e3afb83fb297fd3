//! The scheduler actor: slots, conversations and the table of live runs.
//!
//! A conversation entry is the "worker" of a conversation: it exists while the
//! conversation has queued or running work, holds its FIFO queue, runs at most one
//! request at a time and waits in the slot queue at most once. It is removed when
//! drained and created again by the next submit. Slots are granted in FIFO order
//! of request; `max = 0` queues everything.
//!
//! The actor never waits on a run. Runs report back with `RunFinished` through the
//! same bounded channel the handles use, so channels form no cycle.
//!
//! On a node of a cluster a granted run also claims one of the cluster's slots
//! before its engine starts (see `run`); until it has one it is shown as
//! queued, and a shutdown treats it as queued. Once the node is fenced the
//! scheduler stops every run as a shutdown does, starts nothing more and
//! refuses new requests.

use std::collections::{HashMap, VecDeque};

use foldhash::fast::RandomState;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::lock::EngineLock;
use super::run::{self, ClusterRun, OnFinished, RunContext, RunShared};
use super::{
    ActiveRun, CancelOutcome, ExecutionRequest, GatewayDeps, RuntimeConfig, SchedulerSnapshot,
    SubmitError,
};
use crate::bus::{EventBus, RunStatus};
use crate::clock::now_ms;
use crate::cluster::ClusterNode;
use crate::engine::{Completion, EngineRegistry, RunControl, RunError};
use crate::ids::{ConversationKey, EngineRef, RunId, SessionKey};
use crate::store::{NewRun, StoreHandle};

/// How many queued messages the actor takes per wake-up.
const MAX_MESSAGES_PER_WAKE: usize = 128;

#[derive(Debug)]
pub(super) enum SchedulerMsg {
    Submit {
        req: ExecutionRequest,
        reply: oneshot::Sender<Result<RunId, SubmitError>>,
    },
    Cancel {
        run_id: RunId,
        reason: RunError,
        reply: oneshot::Sender<CancelOutcome>,
    },
    Control {
        run_id: RunId,
        reply: oneshot::Sender<Option<Arc<dyn RunControl>>>,
    },
    ActiveRun {
        run_id: RunId,
        reply: oneshot::Sender<Option<ActiveRun>>,
    },
    ActiveRuns {
        reply: oneshot::Sender<Vec<ActiveRun>>,
    },
    Snapshot {
        reply: oneshot::Sender<SchedulerSnapshot>,
    },
    /// The directory a run asking for `requested` would work in.
    RunDir {
        requested: Option<PathBuf>,
        reply: oneshot::Sender<Result<PathBuf, String>>,
    },
    /// The gateway's own state, which no run (and no `/file` command) reaches.
    OffLimits {
        reply: oneshot::Sender<crate::contain::OffLimits>,
    },
    SetMax {
        max: usize,
    },
    /// Intake paused (`true`) or resumed: while paused, requests are accepted
    /// and queued but no new run starts.
    SetPaused {
        paused: bool,
    },
    /// A new generation of the settings: runs granted from now on use it.
    Reload {
        config: Box<RuntimeConfig>,
    },
    Drain {
        grace: Duration,
        reply: oneshot::Sender<()>,
    },
    /// From a run task, after it published `run_completed` and wrote the store.
    RunFinished {
        run_id: RunId,
        status: RunStatus,
    },
}

/// One conversation with queued or running work.
#[derive(Debug)]
struct Conversation {
    /// Most conversations hold one request at a time, so the queue starts with
    /// room for one.
    queue: VecDeque<RunId>,
    running: Option<RunId>,
    /// Whether the conversation sits in the slot queue.
    waiting: bool,
}

impl Default for Conversation {
    fn default() -> Self {
        Conversation { queue: VecDeque::with_capacity(1), running: None, waiting: false }
    }
}

/// A queued or running request. Kept small: a gateway may hold a great many
/// queued requests (one per waiting conversation), so the table holds a pointer
/// to each request rather than the request itself.
#[derive(Debug)]
struct RunEntry {
    created_at_ms: i64,
    stage: Stage,
}

#[derive(Debug)]
enum Stage {
    /// Waiting for a slot: the request as it will run (a blank session key is
    /// already the `default` session).
    Queued(Box<ExecutionRequest>),
    /// Holding a slot; the request went to the run task.
    Running(Box<Running>),
}

/// What the table keeps of a run that holds a slot.
#[derive(Debug)]
struct Running {
    session_key: SessionKey,
    conversation: ConversationKey,
    engine: EngineRef,
    started_at_ms: i64,
    shared: Arc<RunShared>,
}

impl RunEntry {
    fn session_key(&self) -> &SessionKey {
        match &self.stage {
            Stage::Queued(req) => &req.session_key,
            Stage::Running(running) => &running.session_key,
        }
    }

    fn conversation(&self) -> &ConversationKey {
        match &self.stage {
            Stage::Queued(req) => &req.conversation,
            Stage::Running(running) => &running.conversation,
        }
    }

    fn engine(&self) -> &EngineRef {
        match &self.stage {
            Stage::Queued(req) => &req.engine,
            Stage::Running(running) => &running.engine,
        }
    }

    fn shared(&self) -> Option<&Arc<RunShared>> {
        match &self.stage {
            Stage::Queued(_) => None,
            Stage::Running(running) => Some(&running.shared),
        }
    }

    fn view(&self, run_id: &RunId) -> ActiveRun {
        ActiveRun {
            run_id: run_id.clone(),
            session_key: self.session_key().clone(),
            conversation: self.conversation().clone(),
            engine: self.engine().clone(),
            status: match self.shared() {
                None => RunStatus::Queued,
                Some(shared) if shared.is_waiting_for_slot() => RunStatus::Queued,
                Some(shared) if shared.is_cancelling() => RunStatus::Cancelling,
                Some(_) => RunStatus::Running,
            },
            created_at_ms: self.created_at_ms,
            started_at_ms: match &self.stage {
                Stage::Queued(_) => None,
                Stage::Running(running) if running.shared.is_waiting_for_slot() => None,
                Stage::Running(running) => Some(running.started_at_ms),
            },
        }
    }
}

/// A shutdown in progress.
#[derive(Debug)]
struct Draining {
    /// When running runs get cancelled.
    deadline: Instant,
    replies: Vec<oneshot::Sender<()>>,
}

#[derive(Debug)]
pub(super) struct Scheduler {
    rx: mpsc::Receiver<SchedulerMsg>,
    /// Given to run tasks so they can report back.
    tx: mpsc::Sender<SchedulerMsg>,
    config: Arc<RuntimeConfig>,
    engines: EngineRegistry,
    store: StoreHandle,
    bus: EventBus,
    /// This node's cluster, in cluster mode.
    cluster: Option<Arc<ClusterNode>>,
    lock: EngineLock,
    /// Where runs without a cwd run; resolved once, as it needs file system checks.
    fallback_cwd: Arc<std::path::Path>,
    token: CancellationToken,
    tracker: TaskTracker,
    max: usize,
    in_flight: usize,
    /// Conversations waiting for a slot, oldest request first. May hold keys of
    /// conversations that were emptied by cancels; those are skipped.
    waitq: VecDeque<ConversationKey>,
    conversations: HashMap<ConversationKey, Conversation, RandomState>,
    runs: HashMap<RunId, RunEntry, RandomState>,
    n_queued: usize,
    /// Intake paused: no slot is granted, so queued runs wait.
    paused: bool,
    draining: Option<Draining>,
    /// The cluster node was fenced: every run was stopped, and nothing starts
    /// or is accepted any more.
    fenced: bool,
}

/// Where runs without a directory run: the configured default, else the
/// user's home, moved to the spare directory when it would hold the gateway's
/// own state (the move is logged once here, naming both).
fn fallback_cwd(config: &RuntimeConfig) -> Arc<std::path::Path> {
    let default = run::resolve_cwd(None, config);
    match run::away_from_state(&default, config) {
        Ok(None) => default.into(),
        Ok(Some(spare)) => {
            tracing::info!(
                default = %default.display(),
                cwd = %spare.display(),
                "the default run directory holds the gateway's own state; runs without a directory work in the spare directory"
            );
            spare.into()
        }
        Err(detail) => {
            // Runs then fail to start in it rather than work beside the state.
            tracing::warn!(default = %default.display(), "{detail}");
            config.spare_cwd.clone().unwrap_or(default).into()
        }
    }
}

impl Scheduler {
    pub(super) fn new(
        deps: GatewayDeps,
        cluster: Option<Arc<ClusterNode>>,
        rx: mpsc::Receiver<SchedulerMsg>,
        tx: mpsc::Sender<SchedulerMsg>,
        token: CancellationToken,
        tracker: TaskTracker,
    ) -> Self {
        let lock = EngineLock::new(deps.config.engine_lock_max_age);
        let fallback_cwd = fallback_cwd(&deps.config);
        Scheduler {
            rx,
            tx,
            max: deps.config.max_concurrent_runs,
            config: Arc::new(deps.config),
            engines: deps.engines,
            store: deps.store,
            bus: deps.bus,
            cluster,
            lock,
            fallback_cwd,
            token,
            tracker,
            in_flight: 0,
            waitq: VecDeque::new(),
            conversations: HashMap::default(),
            runs: HashMap::default(),
            n_queued: 0,
            paused: false,
            draining: None,
            fenced: false,
        }
    }

    pub(super) async fn run(mut self) {
        let reap_every = self
            .config
            .engine_lock_max_age
            .min(Duration::from_secs(30))
            .max(Duration::from_millis(10));
        let mut reap = tokio::time::interval_at(Instant::now() + reap_every, reap_every);
        let mut inbox = Vec::with_capacity(MAX_MESSAGES_PER_WAKE);
        let fence = self.cluster.as_ref().map(|node| node.fenced());
        loop {
            let drain_deadline = self.draining.as_ref().map(|d| d.deadline);
            tokio::select! {
                biased;
                () = self.token.cancelled() => break,
                () = cancelled_opt(fence.as_ref()), if !self.fenced => self.on_fenced().await,
                // Several messages per wake-up: under load this halves the actor's
                // scheduling overhead, and each message is still handled in order.
                n = self.rx.recv_many(&mut inbox, MAX_MESSAGES_PER_WAKE) => {
                    if n == 0 {
                        break;
                    }
                    for msg in inbox.drain(..) {
                        self.handle(msg).await;
                    }
                }
                () = sleep_until_opt(drain_deadline) => self.cancel_running(RunError::ShuttingDown),
                _ = reap.tick() => {
                    self.lock.reap_stale();
                }
            }
        }
        // Hard stop: queued requests the router journaled wait for the next start;
        // the others still end in exactly one completion. Running runs see the
        // cancelled token and complete themselves.
        self.stop_queued(RunError::ShuttingDown).await;
    }

    async fn handle(&mut self, msg: SchedulerMsg) {
        match msg {
            SchedulerMsg::Submit { req, reply } => {
                let result = self.submit(req).await;
                let _ = reply.send(result);
                self.grant_until_full();
            }
            SchedulerMsg::Cancel { run_id, reason, reply } => {
                let outcome = self.cancel(&run_id, reason).await;
                let _ = reply.send(outcome);
            }
            SchedulerMsg::Control { run_id, reply } => {
                let control =
                    self.runs.get(&run_id).and_then(RunEntry::shared).and_then(|s| s.control());
                let _ = reply.send(control);
            }
            SchedulerMsg::ActiveRun { run_id, reply } => {
                let _ = reply.send(self.runs.get(&run_id).map(|entry| entry.view(&run_id)));
            }
            SchedulerMsg::ActiveRuns { reply } => {
                let mut all: Vec<ActiveRun> =
                    self.runs.iter().map(|(id, entry)| entry.view(id)).collect();
                all.sort_by(|a, b| {
                    a.created_at_ms.cmp(&b.created_at_ms).then_with(|| a.run_id.cmp(&b.run_id))
                });
                let _ = reply.send(all);
            }
            SchedulerMsg::Snapshot { reply } => {
                let _ = reply.send(self.snapshot());
            }
            SchedulerMsg::RunDir { requested, reply } => {
                let dir =
                    super::run::working_dir(requested.as_deref(), &self.fallback_cwd, &self.config);
                let _ = reply.send(dir.map(|(dir, _)| dir));
            }
            SchedulerMsg::OffLimits { reply } => {
                let _ = reply.send(self.config.off_limits.clone());
            }
            SchedulerMsg::SetMax { max } => {
                tracing::info!(from = self.max, to = max, "max_concurrent_runs changed");
                self.max = max;
                self.grant_until_full();
            }
            SchedulerMsg::SetPaused { paused } => {
                if paused != self.paused {
                    tracing::info!(paused, "intake {}", if paused { "paused" } else { "resumed" });
                }
                self.paused = paused;
                self.grant_until_full();
            }
            SchedulerMsg::Reload { config } => {
                if config.max_concurrent_runs != self.max {
                    tracing::info!(
                        from = self.max,
                        to = config.max_concurrent_runs,
                        "max_concurrent_runs changed"
                    );
                }
                self.max = config.max_concurrent_runs;
                self.fallback_cwd = fallback_cwd(&config);
                self.config = Arc::new(*config);
                self.grant_until_full();
            }
            SchedulerMsg::Drain { grace, reply } => {
                self.start_drain(grace, reply).await;
            }
            SchedulerMsg::RunFinished { run_id, status } => {
                self.run_finished(&run_id, status);
                self.grant_until_full();
                self.maybe_finish_drain();
            }
        }
    }

    fn snapshot(&self) -> SchedulerSnapshot {
        SchedulerSnapshot {
            in_flight: self.in_flight,
            waitq: self.waitq.len(),
            max: self.max,
            conversations: self.conversations.len(),
            queued: self.n_queued,
            paused: self.paused,
        }
    }

    async fn submit(&mut self, mut req: ExecutionRequest) -> Result<RunId, SubmitError> {
        if self.draining.is_some() || self.fenced {
            return Err(SubmitError::ShuttingDown);
        }
        let run_id = req.run_id.take().unwrap_or_else(RunId::generate);
        if self.runs.contains_key(&run_id) {
            return Err(SubmitError::DuplicateRunId { run_id: run_id.to_string() });
        }
        if self.n_queued >= self.config.max_pending_runs {
            return Err(SubmitError::Overloaded { pending: self.n_queued });
        }
        let created_at_ms = now_ms();
        self.bus.timings().stamp(&run_id, crate::timing::Stage::Queued);
        if req.session_key.trim().is_empty() {
            req.session_key = "default".into();
        }
        // The row goes to the store before any event of the run can.
        let meta = serde_json::Value::Object(
            req.meta.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
        );
        self.store
            .insert_run(NewRun {
                run_id: run_id.clone(),
                session_key: req.session_key.clone(),
                conversation: req.conversation.to_string(),
                engine: req.engine.to_string(),
                prompt: req.prompt.clone(),
                meta,
                resumed_from: req.resume.clone(),
                created_at_ms,
            })
            .await;
        let conversation_key = req.conversation.clone();
        let entry = RunEntry { created_at_ms, stage: Stage::Queued(Box::new(req)) };
        self.runs.insert(run_id.clone(), entry);
        self.n_queued += 1;
        let conversation = self.conversations.entry(conversation_key.clone()).or_default();
        conversation.queue.push_back(run_id.clone());
        if conversation.running.is_none() && !conversation.waiting {
            conversation.waiting = true;
            self.waitq.push_back(conversation_key);
        }
        Ok(run_id)
    }

    /// Grants free slots to waiting conversations, oldest first.
    fn grant_until_full(&mut self) {
        if self.draining.is_some() || self.paused || self.fenced {
            return;
        }
        while self.in_flight < self.max {
            let Some(key) = self.waitq.pop_front() else { return };
            let Some(conversation) = self.conversations.get_mut(&key) else { continue };
            conversation.waiting = false;
            if conversation.running.is_some() {
                continue;
            }
            let Some(run_id) = conversation.queue.pop_front() else {
                self.conversations.remove(&key);
                continue;
            };
            conversation.running = Some(run_id.clone());
            self.start_run(run_id);
        }
    }

    fn start_run(&mut self, run_id: RunId) {
        let Some(entry) = self.runs.get_mut(&run_id) else { return };
        let Stage::Queued(req) = &entry.stage else { return };
        let shared = Arc::new(RunShared::new(self.token.child_token(), self.cluster.is_some()));
        let running = Running {
            session_key: req.session_key.clone(),
            conversation: req.conversation.clone(),
            engine: req.engine.clone(),
            started_at_ms: now_ms(),
            shared: shared.clone(),
        };
        let accepted_at_ms = entry.created_at_ms;
        let Stage::Queued(req) =
            std::mem::replace(&mut entry.stage, Stage::Running(Box::new(running)))
        else {
            return;
        };
        self.n_queued -= 1;
        self.in_flight += 1;
        let ctx = RunContext {
            run_id,
            session_key: req.session_key.clone(),
            req: *req,
            shared,
            config: self.config.clone(),
            engines: self.engines.clone(),
            store: self.store.clone(),
            bus: self.bus.clone(),
            lock: self.lock.clone(),
            finished: self.on_finished(),
            fallback_cwd: self.fallback_cwd.clone(),
            cluster: self.cluster.as_ref().map(|node| ClusterRun {
                node: node.clone(),
                accepted_at_ms,
                tracker: self.tracker.clone(),
                stop: self.token.clone(),
            }),
        };
        self.tracker.spawn(run::execute(ctx));
    }

    /// How a run reports back: `RunFinished` through the handles' channel.
    fn on_finished(&self) -> OnFinished {
        let tx = self.tx.clone();
        OnFinished::new(move |run_id, status| {
            Box::pin(async move {
                let _ = tx.send(SchedulerMsg::RunFinished { run_id, status }).await;
            })
        })
    }

    fn run_finished(&mut self, run_id: &RunId, status: RunStatus) {
        let Some(entry) = self.runs.remove(run_id) else {
            tracing::warn!(%run_id, "finish of an unknown run ignored");
            return;
        };
        tracing::trace!(%run_id, status = status.as_str(), "slot released");
        self.in_flight = self.in_flight.saturating_sub(1);
        let key = entry.conversation().clone();
        let Some(conversation) = self.conversations.get_mut(&key) else { return };
        conversation.running = None;
        if conversation.queue.is_empty() {
            if !conversation.waiting {
                self.conversations.remove(&key);
            }
        } else if !conversation.waiting {
            conversation.waiting = true;
            self.waitq.push_back(key);
        }
    }

    async fn cancel(&mut self, run_id: &RunId, reason: RunError) -> CancelOutcome {
        let Some(entry) = self.runs.get(run_id) else { return CancelOutcome::NotActive };
        if let Some(shared) = entry.shared() {
            shared.cancel(reason);
            return CancelOutcome::Cancelling;
        }
        // Queued: take it out of its conversation and complete it here.
        let Some(entry) = self.runs.remove(run_id) else { return CancelOutcome::NotActive };
        let Stage::Queued(req) = entry.stage else { return CancelOutcome::NotActive };
        self.n_queued -= 1;
        if let Some(conversation) = self.conversations.get_mut(&req.conversation) {
            conversation.queue.retain(|id| id != run_id);
            if conversation.queue.is_empty()
                && conversation.running.is_none()
                && !conversation.waiting
            {
                self.conversations.remove(&req.conversation);
            }
        }
        let ExecutionRequest { session_key, engine, resume, .. } = *req;
        let completion = Completion::failure(reason, resume);
        run::complete_unstarted(
            &self.bus,
            &self.store,
            run_id,
            &session_key,
            &engine.to_string(),
            completion,
        )
        .await;
        CancelOutcome::Cancelling
    }

    /// At shutdown, takes every request still waiting for a slot out of the queues.
    /// A journaled one is left as it is stored (`queued`), so the router's journal
    /// runs it at the next start; any other completes with `error`. A run waiting
    /// for one of the cluster's slots is stopped with `error` and does the same
    /// itself.
    async fn stop_queued(&mut self, error: RunError) {
        for shared in self.runs.values().filter_map(RunEntry::shared) {
            if shared.is_waiting_for_slot() {
                shared.cancel(error.clone());
            }
        }
        let queued: Vec<(RunId, bool)> = self
            .runs
            .iter()
            .filter_map(|(id, e)| match &e.stage {
                Stage::Queued(req) => Some((id.clone(), req.journaled)),
                Stage::Running(_) => None,
            })
            .collect();
        let mut left = 0usize;
        for (run_id, journaled) in queued {
            if journaled {
                self.unqueue(&run_id);
                left += 1;
            } else {
                self.cancel(&run_id, error.clone()).await;
            }
        }
        self.waitq.clear();
        if left > 0 {
            tracing::info!(queued = left, "queued requests left for the next start");
        }
    }

    /// Forgets a request that is waiting for a slot, without completing it.
    fn unqueue(&mut self, run_id: &RunId) {
        let Some(entry) = self.runs.remove(run_id) else { return };
        self.n_queued -= 1;
        let key = entry.conversation();
        if let Some(conversation) = self.conversations.get_mut(key) {
            conversation.queue.retain(|id| id != run_id);
            if conversation.queue.is_empty() && conversation.running.is_none() {
                self.conversations.remove(key);
            }
        }
    }

    fn cancel_running(&mut self, error: RunError) {
        if let Some(draining) = &mut self.draining {
            // Far future: the deadline fired once.
            draining.deadline = Instant::now() + Duration::from_secs(86_400 * 365);
        }
        for shared in self.runs.values().filter_map(RunEntry::shared) {
            shared.cancel(error.clone());
        }
    }

    /// The cluster node was fenced: its leases may be another node's in a third
    /// of a term. Every run stops now, as at a hard shutdown (engines cancelled,
    /// process groups killed); nothing more starts or is accepted.
    async fn on_fenced(&mut self) {
        tracing::error!(
            in_flight = self.in_flight,
            queued = self.n_queued,
            "cluster node fenced: stopping every run"
        );
        self.fenced = true;
        self.cancel_running(RunError::ShuttingDown);
        self.stop_queued(RunError::ShuttingDown).await;
    }

    async fn start_drain(&mut self, grace: Duration, reply: oneshot::Sender<()>) {
        match &mut self.draining {
            Some(draining) => draining.replies.push(reply),
            None => {
                tracing::info!(in_flight = self.in_flight, queued = self.n_queued, "draining runs");
                self.draining =
                    Some(Draining { deadline: Instant::now() + grace, replies: vec![reply] });
            }
        }
        self.stop_queued(RunError::ShuttingDown).await;
        self.maybe_finish_drain();
    }

    fn maybe_finish_drain(&mut self) {
        if self.in_flight > 0 {
            return;
        }
        if let Some(draining) = &mut self.draining {
            for reply in draining.replies.drain(..) {
                let _ = reply.send(());
            }
        }
    }
}

/// Resolves when `token` is cancelled; never without one.
async fn cancelled_opt(token: Option<&CancellationToken>) {
    match token {
        Some(token) => token.cancelled().await,
        None => std::future::pending().await,
    }
}

async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
#[path = "tests/cluster_tests.rs"]
mod cluster_tests;
