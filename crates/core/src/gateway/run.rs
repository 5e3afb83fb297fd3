//! One run: from a granted slot to exactly one `run_completed`.
//!
//! The run takes the engine lock, resolves the working directory, publishes
//! `run_started`, starts the engine and relays its events (numbering deltas 1, 2,
//! 3…), until the engine completes, the run is cancelled, the engine goes quiet
//! for the inactivity timeout, or the engine dies (its event channel closes, or
//! the run panics). A cancelled or timed-out run first waits (bounded by
//! `engine_stop_timeout`) until its engine has stopped, as `cancelling`, so its
//! process is gone before its lock, slot and conversation are free again.
//! Whatever happens, [`execute`] then finalizes once, in order:
//! lock released (the guard is dropped with the body) → the final row and
//! `run_completed` queued for the store → `run_completed` published → slot
//! released and the conversation notified. Every event is queued for the store
//! before it is published, so a reader that sees an event can read it back.
//!
//! On a node of a cluster the run first claims one of the cluster's slots,
//! waiting (still `queued`) while every slot is taken; cancelled meanwhile, it
//! withdraws its claim and completes without starting. It frees the slot once
//! its completion is queued for the store, before `run_completed` is published.

use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use futures::future::BoxFuture;
use futures::FutureExt;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::lock::{EngineLock, LockKey};
use super::retry;
use super::{ExecutionRequest, RuntimeConfig};
use crate::artifacts::{ArtifactCollector, ArtifactRoots};
use crate::budget::usage::{ReportedUsage, RunSpend};
use crate::budget::BudgetScope;
use crate::bus::{BusEvent, EventBus, EventKind, RunStatus};
use crate::clock::now_ms;
use crate::cluster::node::admission::{AdmissionError, SlotHeld};
use crate::cluster::ClusterNode;
use crate::engine::{
    Availability, Completion, EngineError, EngineEvent, EngineRegistry, EventSink, ResumeToken,
    RunControl, RunError, StartRequest,
};
use crate::ids::{RunId, SessionKey};
use crate::log_text;
use crate::media::{self, Attachment};
use crate::store::{FinishedRun, StoreHandle};
use crate::timing::Stage;

/// What the scheduler and the run share: how to cancel it and how to steer it.
#[derive(Debug, Default)]
pub(super) struct RunShared {
    token: CancellationToken,
    /// Why the run was cancelled; the first reason wins.
    reason: Mutex<Option<RunError>>,
    /// Set once the engine started.
    control: OnceLock<Arc<dyn RunControl>>,
    /// Set while a cancelled run waits for its engine to stop.
    cancelling: AtomicBool,
    /// Set while the run waits for one of the cluster's slots.
    waiting_for_slot: AtomicBool,
}

impl RunShared {
    /// `waiting_for_slot`: the run needs one of the cluster's slots first.
    pub(super) fn new(token: CancellationToken, waiting_for_slot: bool) -> Self {
        RunShared {
            token,
            reason: Mutex::new(None),
            control: OnceLock::new(),
            cancelling: AtomicBool::new(false),
            waiting_for_slot: AtomicBool::new(waiting_for_slot),
        }
    }

    pub(super) fn cancel(&self, reason: RunError) {
        let mut slot = self.reason.lock().unwrap_or_else(|e| e.into_inner());
        if slot.is_none() {
            *slot = Some(reason);
        }
        drop(slot);
        self.token.cancel();
    }

    pub(super) fn control(&self) -> Option<Arc<dyn RunControl>> {
        self.control.get().cloned()
    }

    /// Whether the run was stopped and waits for its engine to let go.
    pub(super) fn is_cancelling(&self) -> bool {
        self.cancelling.load(Ordering::Relaxed)
    }

    /// Whether the run still waits for one of the cluster's slots: it has not
    /// started, and a shutdown treats it as queued.
    pub(super) fn is_waiting_for_slot(&self) -> bool {
        self.waiting_for_slot.load(Ordering::Relaxed)
    }

    fn reason(&self) -> RunError {
        let slot = self.reason.lock().unwrap_or_else(|e| e.into_inner());
        slot.clone().unwrap_or(RunError::ShuttingDown)
    }
}

/// Everything a run task needs, moved into it.
#[derive(Debug)]
pub(super) struct RunContext {
    pub(super) run_id: RunId,
    pub(super) req: ExecutionRequest,
    pub(super) session_key: SessionKey,
    pub(super) shared: Arc<RunShared>,
    pub(super) config: Arc<RuntimeConfig>,
    pub(super) engines: EngineRegistry,
    pub(super) store: StoreHandle,
    pub(super) bus: EventBus,
    pub(super) lock: EngineLock,
    /// Told once the run has completed, so its slot can be freed.
    pub(super) finished: OnFinished,
    /// The working directory of requests without one, resolved once at start.
    pub(super) fallback_cwd: Arc<Path>,
    /// In cluster mode: where the run claims its cluster slot.
    pub(super) cluster: Option<ClusterRun>,
}

/// What a run of a cluster node needs to claim and free its cluster slot.
#[derive(Debug, Clone)]
pub(super) struct ClusterRun {
    pub(super) node: Arc<ClusterNode>,
    /// When the scheduler accepted the run (this node's clock): the claim's
    /// place in the cluster's queue.
    pub(super) accepted_at_ms: i64,
    /// Where a slot that could not be freed at once is freed later.
    pub(super) tracker: TaskTracker,
    /// The gateway's shutdown: background frees stop then.
    pub(super) stop: CancellationToken,
}

/// The run's report to whoever granted its slot: called once, after
/// `run_completed` is published, with the run's terminal status. The run knows
/// nothing else of its supervisor.
pub(super) struct OnFinished(
    Box<dyn FnOnce(RunId, RunStatus) -> BoxFuture<'static, ()> + Send + Sync>,
);

impl OnFinished {
    pub(super) fn new(
        report: impl FnOnce(RunId, RunStatus) -> BoxFuture<'static, ()> + Send + Sync + 'static,
    ) -> Self {
        OnFinished(Box::new(report))
    }
}

impl std::fmt::Debug for OnFinished {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OnFinished")
    }
}

/// What the run has seen so far; survives a panic of the body.
#[derive(Debug, Default)]
struct RunState {
    index: u64,
    seq: u64,
    text: String,
    last_resume: Option<ResumeToken>,
    engine: String,
    /// The working directory the engine was started in.
    cwd: Option<PathBuf>,
    /// Files the run's actions asked to send.
    artifacts: ArtifactCollector,
    /// The model the run asked for, if any (prices are by model).
    model: Option<String>,
    /// The engine sent an event.
    engine_spoke: bool,
}

/// Why a run of a cluster node got no cluster slot.
enum Unadmitted {
    /// Stopped by a shutdown while it waited, and journaled: left queued, as
    /// a queued request is, for whichever node runs the session next.
    LeftQueued,
    /// It ends with this completion without starting.
    Ended(Completion),
}

fn event(run_id: &RunId, session: &SessionKey, index: u64, kind: EventKind) -> Arc<BusEvent> {
    Arc::new(BusEvent {
        run_id: run_id.clone(),
        session_key: session.clone(),
        index,
        ts_ms: now_ms(),
        kind,
    })
}

/// Queues one event of a run for the store, then publishes it on the bus. In that
/// order, a reader that subscribes and then reads the store (which flushes) misses
/// nothing: an event published before the subscription was queued before the read.
async fn publish(
    bus: &EventBus,
    store: &StoreHandle,
    run_id: &RunId,
    session: &SessionKey,
    index: u64,
    kind: EventKind,
) {
    let event = event(run_id, session, index, kind);
    store.append_event(event.clone()).await;
    bus.publish(event);
}

impl RunContext {
    async fn publish(&self, state: &mut RunState, kind: EventKind) {
        state.index += 1;
        publish(&self.bus, &self.store, &self.run_id, &self.session_key, state.index, kind).await;
    }
}

/// Runs the request to its single completion.
pub(super) async fn execute(ctx: RunContext) {
    let started = Instant::now();
    let mut state = RunState {
        last_resume: ctx.req.resume.clone(),
        engine: ctx.req.engine.to_string(),
        ..RunState::default()
    };
    let admitted = match &ctx.cluster {
        None => Ok(None),
        Some(cluster) => admit(&ctx, cluster).await.map(Some),
    };
    let (completion, slot) = match admitted {
        Ok(slot) => {
            let body = AssertUnwindSafe(drive(&ctx, &mut state)).catch_unwind().await;
            let completion = body.unwrap_or_else(|panic| {
                let detail = panic
                    .downcast_ref::<&str>()
                    .map(|s| (*s).to_owned())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "run panicked".to_owned());
                Completion::failure(
                    RunError::EngineCrashed { detail: format!("panic: {detail}") },
                    state.last_resume.clone(),
                )
            });
            (completion, slot)
        }
        Err(Unadmitted::Ended(completion)) => (completion, None),
        Err(Unadmitted::LeftQueued) => {
            tracing::debug!(run_id = %ctx.run_id, "run left queued at shutdown while it waited for a run slot");
            (ctx.finished.0)(ctx.run_id, RunStatus::Queued).await;
            return;
        }
    };
    let spend = spend_of(&ctx, &state, &completion);
    let RunContext { run_id, session_key, store, bus, finished, config, req, cluster, .. } = ctx;
    let status = RunStatus::of(&completion);
    // Only the router can resubmit, so only its requests are retried.
    let request = req.journaled.then_some(&req);
    let staged = media::attachments_of(&req.meta);
    let end = Ending {
        run_id: run_id.clone(),
        session_key,
        config: &config,
        started,
        spend,
        request,
        staged,
    };
    let completed = finalize(&store, end, &mut state, completion).await;
    // The slot is freed once the completion is queued for the store, and
    // before it is published: whoever sees the run end (the router, which
    // may then let the session go) finds the slot free.
    if let (Some(cluster), Some(slot)) = (cluster, slot) {
        cluster
            .node
            .free_slot_of(&slot.lease, run_id.as_str(), &cluster.tracker, &cluster.stop)
            .await;
    }
    bus.timings().stamp(&run_id, Stage::Completed);
    bus.publish(completed);
    (finished.0)(run_id, status).await;
}

/// Claims the run's cluster slot, waiting while every slot is taken; the run
/// stays `queued` meanwhile (its phase stays `waiting_for_slot`).
async fn admit(ctx: &RunContext, cluster: &ClusterRun) -> Result<SlotHeld, Unadmitted> {
    let claimed = cluster
        .node
        .claim_slot_for(
            &ctx.session_key,
            ctx.run_id.as_str(),
            cluster.accepted_at_ms,
            &ctx.shared.token,
            &cluster.tracker,
            &cluster.stop,
        )
        .await;
    ctx.shared.waiting_for_slot.store(false, Ordering::Relaxed);
    match claimed {
        Ok(held) => Ok(held),
        Err(AdmissionError::Cancelled) => {
            let reason = ctx.shared.reason();
            if matches!(reason, RunError::ShuttingDown) && ctx.req.journaled {
                return Err(Unadmitted::LeftQueued);
            }
            Err(Unadmitted::Ended(Completion::failure(reason, ctx.req.resume.clone())))
        }
        Err(refused) => {
            tracing::warn!(run_id = %ctx.run_id, error = %refused, "run got no run slot");
            let detail = refused.to_string();
            Err(Unadmitted::Ended(Completion::failure(
                RunError::StartFailed { detail },
                ctx.req.resume.clone(),
            )))
        }
    }
}

/// What the run spent, priced by the budget guard when there is one; the guard
/// forgets the run.
fn spend_of(ctx: &RunContext, state: &RunState, completion: &Completion) -> RunSpend {
    let Some(guard) = &ctx.config.budget else {
        return RunSpend::from_reported(&ReportedUsage::from_json(&completion.usage), None);
    };
    let model = state.model.clone().unwrap_or_default();
    let scope = BudgetScope {
        run_id: &ctx.run_id,
        session_key: &ctx.session_key,
        engine: &state.engine,
        model: &model,
    };
    let spend = guard.spend(scope, &completion.usage);
    guard.finish(&ctx.run_id);
    spend
}

fn cancelled(ctx: &RunContext, state: &RunState) -> Completion {
    Completion::failure(ctx.shared.reason(), state.last_resume.clone())
}

/// Everything between the grant and the completion. The lock guard lives here,
/// so it is released before finalization starts, even on panic.
async fn drive(ctx: &RunContext, state: &mut RunState) -> Completion {
    ctx.bus.timings().stamp(&ctx.run_id, Stage::SlotGranted);
    let token = &ctx.shared.token;
    let _guard = if ctx.config.require_engine_lock {
        let key = match &ctx.req.resume {
            Some(resume) => LockKey::Resume(resume.value.clone()),
            None => LockKey::Session(ctx.session_key.clone()),
        };
        tokio::select! {
            biased;
            () = token.cancelled() => return cancelled(ctx, state),
            acquired = ctx.lock.acquire(key, ctx.config.engine_lock_timeout) => match acquired {
                Ok(guard) => Some(guard),
                Err(_) => return Completion::failure(RunError::LockTimeout, state.last_resume.clone()),
            },
        }
    } else {
        None
    };

    let Some(engine) = ctx.engines.engine(ctx.req.engine.id()) else {
        return Completion::failure(
            RunError::UnknownEngine { engine: ctx.req.engine.to_string() },
            None,
        );
    };
    state.engine = engine.id().to_string();
    let model = ctx.req.engine.model().or(ctx.req.model.as_ref()).map(|m| m.as_str().to_owned());
    let requested = ctx.req.cwd.as_deref().filter(|p| !p.as_os_str().is_empty());
    let cwd = match working_dir(requested, &ctx.fallback_cwd, &ctx.config) {
        Ok((cwd, None)) => cwd,
        Ok((spare, Some(asked))) => {
            // The fallback's move was logged once, at start.
            if requested.is_some() {
                tracing::info!(
                    run_id = %ctx.run_id,
                    requested = %asked.display(),
                    cwd = %spare.display(),
                    "the run's directory holds the gateway's own state; the run works in the spare directory"
                );
            }
            spare
        }
        Err(detail) => return Completion::failure(RunError::StartFailed { detail }, None),
    };
    state.model.clone_from(&model);
    let (prompt, attachments) = place_attachments(ctx, &cwd).await;
    // CLI engines cannot be stopped between model turns, so a session already
    // at a limit is refused here, before its engine starts.
    if let Some(guard) = &ctx.config.budget {
        let model = model.clone().unwrap_or_default();
        let scope = BudgetScope {
            run_id: &ctx.run_id,
            session_key: &ctx.session_key,
            engine: &state.engine,
            model: &model,
        };
        if let Err(exceeded) = guard.admit(scope, ctx.req.budget.as_deref()).await {
            let detail = exceeded.detail();
            return Completion::failure(
                RunError::BudgetExceeded { detail },
                state.last_resume.clone(),
            );
        }
    }
    // A node that was stopped past its renewals (and may have lost the
    // session meanwhile) starts nothing until it knows: another node may be
    // running this request already. Once fenced, nothing it writes lands.
    // (The slot's grant marked the run started in the database, so a node
    // that takes the session over from here on completes it as interrupted
    // and never starts a second engine for it.)
    if let Some(cluster) = &ctx.cluster {
        if !cluster.node.leases_live().await {
            return cancelled(ctx, state);
        }
    }
    ctx.publish(
        state,
        EventKind::RunStarted { engine: state.engine.clone(), model: model.clone() },
    )
    .await;
    ctx.store.mark_running(ctx.run_id.clone(), state.engine.clone(), now_ms()).await;

    if let Availability::Unavailable { reason } = engine.availability() {
        return Completion::failure(
            RunError::EngineUnavailable {
                engine: state.engine.clone(),
                reason: reason.to_string(),
            },
            None,
        );
    }
    // A token of another engine never reaches this one.
    let resume = ctx.req.resume.clone().filter(|token| token.engine == state.engine);
    state.cwd = Some(cwd.clone());
    let (sink, mut events) = EventSink::channel(ctx.config.engine_event_buffer);
    let start = StartRequest {
        run_id: ctx.run_id.clone(),
        session_key: ctx.session_key.clone(),
        prompt,
        resume,
        cwd,
        model,
        meta: ctx.req.meta.clone(),
        workspace: ctx.config.workspace_dir.clone(),
        off_limits: ctx.config.off_limits.clone(),
        attachments,
    };
    let control = tokio::select! {
        biased;
        () = token.cancelled() => return cancelled(ctx, state),
        started = engine.start(start, sink) => match started {
            Ok(control) => {
                ctx.bus.timings().stamp(&ctx.run_id, Stage::Spawned);
                control
            }
            Err(EngineError::Unavailable { engine, reason }) => {
                return Completion::failure(RunError::EngineUnavailable { engine, reason }, None)
            }
            Err(EngineError::Start(detail)) => {
                return Completion::failure(RunError::StartFailed { detail }, state.last_resume.clone())
            }
        },
    };
    let _ = ctx.shared.control.set(control.clone());

    let inactivity = ctx.config.run_inactivity_timeout;
    let quiet = tokio::time::sleep(inactivity);
    tokio::pin!(quiet);
    // Approval actions open and not yet completed: the run waits for its
    // owner, not for its engine, so the inactivity timeout is paused.
    let mut waiting_for_owner: std::collections::HashSet<String> = Default::default();
    loop {
        tokio::select! {
            biased;
            () = token.cancelled() => {
                stop_engine(ctx, state, &*control, &mut events).await;
                return cancelled(ctx, state);
            }
            event = events.recv() => {
                let Some(event) = event else {
                    let detail = "the engine stopped without a completion".to_owned();
                    return Completion::failure(RunError::EngineCrashed { detail }, state.last_resume.clone());
                };
                quiet.as_mut().reset(Instant::now() + inactivity);
                if let EngineEvent::Action(action) = &event {
                    if action.kind == crate::engine::ActionKind::Approval {
                        if action.phase == crate::engine::ActionPhase::Completed {
                            waiting_for_owner.remove(&action.id);
                        } else {
                            waiting_for_owner.insert(action.id.clone());
                        }
                    }
                }
                if let Some(completion) = relay(ctx, state, event).await {
                    return completion;
                }
            }
            () = &mut quiet, if waiting_for_owner.is_empty() => {
                stop_engine(ctx, state, &*control, &mut events).await;
                return Completion::failure(RunError::Timeout, state.last_resume.clone());
            }
        }
    }
}

/// Cancels the engine and waits until it has let go of everything (a CLI's
/// process group is reaped), for at most `engine_stop_timeout`. An engine that
/// stops at once is not waited for; otherwise the run is `cancelling` meanwhile,
/// in the store and as a `run_status` event. Events the engine still sends are
/// dropped: the run is over. The lock guard and the slot stay held until this returns.
async fn stop_engine(
    ctx: &RunContext,
    state: &mut RunState,
    control: &dyn RunControl,
    events: &mut mpsc::Receiver<EngineEvent>,
) {
    control.cancel();
    let stopped = control.stopped();
    tokio::pin!(stopped);
    if stopped.as_mut().now_or_never().is_some() {
        return;
    }
    ctx.shared.cancelling.store(true, Ordering::Relaxed);
    ctx.store.mark_cancelling(ctx.run_id.clone()).await;
    ctx.publish(state, EventKind::Status(RunStatus::Cancelling)).await;
    let drain = async {
        while events.recv().await.is_some() {}
        std::future::pending::<()>().await;
    };
    let bound = ctx.config.engine_stop_timeout;
    tokio::select! {
        () = &mut stopped => {}
        () = drain => {}
        () = tokio::time::sleep(bound) => {
            tracing::warn!(
                run_id = %ctx.run_id,
                engine = %state.engine,
                bound_ms = bound.as_millis() as u64,
                "engine did not stop after cancel; completing the run anyway"
            );
            ctx.bus.timings().cancel_overdue();
        }
    }
}

/// Publishes one engine event; returns the completion when it is the last.
async fn relay(ctx: &RunContext, state: &mut RunState, event: EngineEvent) -> Option<Completion> {
    if !state.engine_spoke {
        state.engine_spoke = true;
        ctx.bus.timings().stamp(&ctx.run_id, Stage::FirstEvent);
    }
    match event {
        EngineEvent::Started { resume, title, meta } => {
            if resume.is_some() {
                state.last_resume.clone_from(&resume);
            }
            ctx.publish(state, EventKind::EngineStarted { resume, title, meta }).await;
            None
        }
        EngineEvent::Action(action) => {
            state.artifacts.action(&action);
            ctx.publish(state, EventKind::EngineAction(action)).await;
            None
        }
        EngineEvent::Delta(text) => {
            if state.seq == 0 {
                ctx.bus.timings().stamp(&ctx.run_id, Stage::FirstDelta);
            }
            state.seq += 1;
            state.text.push_str(&text);
            let seq = state.seq;
            ctx.publish(state, EventKind::Delta { seq, text }).await;
            None
        }
        EngineEvent::Completed(mut completion) => {
            if completion.resume.is_some() {
                state.last_resume.clone_from(&completion.resume);
            } else {
                completion.resume.clone_from(&state.last_resume);
            }
            ctx.publish(state, EventKind::EngineCompleted(completion.clone())).await;
            Some(completion)
        }
    }
}

/// The request's prompt with a note naming the files sent with it, once
/// they are moved from the stage into the run's uploads directory.
async fn place_attachments(ctx: &RunContext, cwd: &Path) -> (String, Vec<Attachment>) {
    let sent = media::attachments_of(&ctx.req.meta);
    let Some(stage) = ctx.config.media_stage.clone().filter(|_| !sent.is_empty()) else {
        return (ctx.req.prompt.clone(), Vec::new());
    };
    let (cwd, off_limits) = (cwd.to_path_buf(), ctx.config.off_limits.clone());
    let placing = move || {
        let placed = media::place(&sent, &stage, &cwd, &off_limits);
        // Placed paths are resolved; so is the directory they are shown from.
        let note = placed.note(&cwd.canonicalize().unwrap_or(cwd));
        (placed.attachments, note)
    };
    match tokio::task::spawn_blocking(placing).await {
        Ok((attachments, Some(note))) => {
            (format!("{}\n\n{note}", ctx.req.prompt.trim_end()), attachments)
        }
        Ok((attachments, None)) => (ctx.req.prompt.clone(), attachments),
        Err(error) => {
            tracing::warn!(run_id = %ctx.run_id, %error, "the run's files could not be placed");
            (ctx.req.prompt.clone(), Vec::new())
        }
    }
}

/// The directory a run works in: the one it asks for (else the fallback),
/// moved to the spare directory when it holds the gateway's state (the
/// directory asked for is then returned too), and checked against
/// `allowed_cwd_roots`.
///
/// # Errors
/// Why no directory is allowed, as the run's start failure says it.
pub(super) fn working_dir(
    requested: Option<&Path>,
    fallback: &Path,
    config: &RuntimeConfig,
) -> Result<(PathBuf, Option<PathBuf>), String> {
    let requested = requested.filter(|p| !p.as_os_str().is_empty());
    let cwd = match requested {
        Some(requested) => resolve_cwd(Some(requested), config),
        None => fallback.to_path_buf(),
    };
    let (cwd, moved_from) = match away_from_state(&cwd, config)? {
        None => (cwd, None),
        Some(spare) => (spare, Some(cwd)),
    };
    if !crate::config::cwd_allowed(&config.allowed_cwd_roots, &cwd) {
        return Err(format!("working directory {} is outside allowed_cwd_roots", cwd.display()));
    }
    Ok((cwd, moved_from))
}

/// The working directory: the request's (with `~` expanded), else the configured
/// default if it is a directory, else the home directory, else the process's.
pub(super) fn resolve_cwd(requested: Option<&Path>, config: &RuntimeConfig) -> PathBuf {
    let expand = |path: &Path| -> PathBuf {
        match (path.strip_prefix("~"), &config.home_dir) {
            (Ok(rest), Some(home)) => home.join(rest),
            _ => path.to_owned(),
        }
    };
    if let Some(path) = requested.filter(|p| !p.as_os_str().is_empty()) {
        return expand(path);
    }
    config
        .default_cwd
        .as_deref()
        .map(expand)
        .filter(|p| p.is_dir())
        .or_else(|| config.home_dir.clone().filter(|p| p.is_dir()))
        .or_else(|| std::env::current_dir().ok())
        .unwrap_or_else(|| PathBuf::from("/"))
}

/// Where a run whose directory is `dir` works instead: `None` when `dir`
/// may be used, else the spare directory (created now), because `dir` holds
/// the gateway's own state or is inside it. A run never works in `$HOME` when
/// the gateway's home is `$HOME/.lemon`, so a command it runs finds no
/// secrets beside it.
///
/// # Errors
/// The spare directory cannot be created.
pub(super) fn away_from_state(
    dir: &Path,
    config: &RuntimeConfig,
) -> Result<Option<PathBuf>, String> {
    let Some(spare) = &config.spare_cwd else { return Ok(None) };
    if !config.off_limits.overlaps(dir) {
        return Ok(None);
    }
    if config.off_limits.overlaps(spare) {
        return Err(format!(
            "{} holds the gateway's own state, and so does {}: no directory is left for the run",
            dir.display(),
            spare.display()
        ));
    }
    std::fs::create_dir_all(spare)
        .map_err(|err| format!("cannot create the run directory {}: {err}", spare.display()))?;
    Ok(Some(spare.clone()))
}

/// Who a run's end is written for, and what it spent.
struct Ending<'a> {
    run_id: RunId,
    session_key: SessionKey,
    config: &'a RuntimeConfig,
    started: Instant,
    spend: RunSpend,
    /// The request, when a failure without an answer may be retried.
    request: Option<&'a ExecutionRequest>,
    /// The files sent with the request: removed from the stage unless the
    /// run is retried (the retry places them again).
    staged: Vec<Attachment>,
}

/// Writes the run's completion (queued for the store) and returns its
/// `run_completed`, for the caller to publish.
async fn finalize(
    store: &StoreHandle,
    end: Ending<'_>,
    state: &mut RunState,
    mut completion: Completion,
) -> Arc<BusEvent> {
    let Ending { run_id, session_key, config, started, spend, request, staged } = end;
    if completion.answer.is_empty() {
        completion.answer = std::mem::take(&mut state.text);
    }
    if let Some(cwd) = &state.cwd {
        let roots = ArtifactRoots {
            cwd,
            workspace: config.workspace_dir.as_deref(),
            off_limits: &config.off_limits,
            generated_images: config.auto_send_generated_images,
        };
        let collected = std::mem::take(&mut state.artifacts).finish(&completion.answer, roots);
        for refused in &collected.refused {
            tracing::warn!(
                %run_id,
                path = %log_text::escape(&refused.path),
                reason = %refused.reason,
                "file not sent with the answer"
            );
        }
        completion.answer = collected.answer;
        completion.artifacts = collected.artifacts;
    }
    if request.is_some_and(|req| retry::should_retry(&completion, &req.prompt, &req.meta)) {
        completion.retried_by = Some(retry::retry_run_id(&run_id));
    }
    if let (Some(stage), false) = (config.media_stage.clone(), staged.is_empty()) {
        if completion.retried_by.is_none() {
            let _ = tokio::task::spawn_blocking(move || stage.discard(&staged)).await;
        }
    }
    let duration_ms = started.elapsed().as_millis() as u64;
    match &completion.error {
        None => tracing::debug!(%run_id, engine = %state.engine, duration_ms, "run completed"),
        Some(error) if error.is_abort() => {
            tracing::info!(%run_id, engine = %state.engine, code = error.code(), "run aborted")
        }
        Some(error) => {
            // The text is the engine's (a CLI's stderr): one escaped field, never raw lines.
            let error = log_text::escape(&error.to_string());
            tracing::warn!(%run_id, engine = %state.engine, %error, "run failed")
        }
    }
    state.index += 1;
    let end = RunEnd {
        run_id,
        session_key,
        index: state.index,
        engine: state.engine.clone(),
        completion,
        duration_ms,
        spend,
    };
    write_completion(store, end).await
}

/// A run's completion, as [`complete`] writes it.
#[derive(Debug)]
pub(crate) struct RunEnd {
    pub(crate) run_id: RunId,
    pub(crate) session_key: SessionKey,
    /// The index of `run_completed`: one past the run's last event.
    pub(crate) index: u64,
    pub(crate) engine: String,
    pub(crate) completion: Completion,
    pub(crate) duration_ms: u64,
    /// What the run spent (nothing, for a request that never ran).
    pub(crate) spend: RunSpend,
}

/// The one place a run's completion is written, for runs that ran and for
/// requests that never did (cancelled while queued, dropped, merged, recovered):
/// `run_completed` and the final row are queued for the store, then
/// `run_completed` is published, so whoever sees the completion reads the
/// finished run.
pub(crate) async fn complete(bus: &EventBus, store: &StoreHandle, end: RunEnd) {
    let completed = write_completion(store, end).await;
    bus.timings().stamp(&completed.run_id, Stage::Completed);
    bus.publish(completed);
}

/// Queues a run's `run_completed` and final row for the store; returns the
/// event, to be published next.
async fn write_completion(store: &StoreHandle, end: RunEnd) -> Arc<BusEvent> {
    let RunEnd { run_id, session_key, index, engine, completion, duration_ms, spend } = end;
    let kind = EventKind::RunCompleted {
        completion: completion.clone(),
        engine: engine.clone(),
        duration_ms,
    };
    let completed = event(&run_id, &session_key, index, kind);
    let finished =
        FinishedRun { run_id, engine, completion, completed_at_ms: now_ms(), duration_ms, spend };
    store.append_event(completed.clone()).await;
    store.finalize_run(finished).await;
    completed
}

/// Completes a request that never started (cancelled or dropped while queued).
pub(super) async fn complete_unstarted(
    bus: &EventBus,
    store: &StoreHandle,
    run_id: &RunId,
    session_key: &SessionKey,
    engine: &str,
    completion: Completion,
) {
    let end = RunEnd {
        run_id: run_id.clone(),
        session_key: session_key.clone(),
        index: 1,
        engine: engine.to_owned(),
        completion,
        duration_ms: 0,
        spend: RunSpend::default(),
    };
    complete(bus, store, end).await;
}
