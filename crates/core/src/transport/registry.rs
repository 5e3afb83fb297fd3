//! The registry: the transports the gateway knows, and one supervisor task per
//! enabled transport that runs it, reports its state and restarts it after
//! retryable failures.
//!
//! A supervisor's loop: `starting` → (the transport reports `running`) → the
//! transport returns. An error worth retrying (or a panic, or returning while
//! the gateway is not shutting down) makes it `failing` with the time until the
//! next start; the wait starts at [`RestartPolicy::initial_backoff`] and doubles
//! up to [`RestartPolicy::max_backoff`], and starts over once the transport has
//! been running for [`RestartPolicy::reset_after`]. A fatal error leaves it
//! `failing` without a retry. Shutdown ends the loop at any point and leaves it
//! `stopped`.

use std::any::Any;
use std::fmt;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use super::listener::ServeConfig;
use crate::router::RouterHandle;
use crate::store::StoreHandle;
use futures::FutureExt;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::{
    validate_id, Transport, TransportContext, TransportError, TransportIdError, TransportState,
    TransportStatuses,
};

/// When a failed transport is started again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RestartPolicy {
    /// The wait after the first failure.
    pub initial_backoff: Duration,
    /// The longest wait; each failure in a row doubles it up to this.
    pub max_backoff: Duration,
    /// A transport that fails after running at least this long starts over
    /// with `initial_backoff` and a count of one.
    pub reset_after: Duration,
}

impl Default for RestartPolicy {
    /// 1 s doubling to 5 min, reset after a minute of running.
    fn default() -> Self {
        RestartPolicy {
            initial_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(5 * 60),
            reset_after: Duration::from_secs(60),
        }
    }
}

/// What every transport's context is made of.
#[derive(Debug, Clone)]
pub struct TransportDeps {
    /// Every message goes through it.
    pub router: RouterHandle,
    /// The gateway's store.
    pub store: StoreHandle,
    /// The gateway's shutdown.
    pub shutdown: CancellationToken,
    /// The gateway's tracker: supervisors and the transports' own tasks run on it.
    pub tracker: TaskTracker,
    /// How transports that listen for HTTP serve their connections.
    pub http: ServeConfig,
    /// Tool calls waiting for the owner's answer, which chats may give.
    pub approvals: crate::approvals::ApprovalHub,
    /// Where received files wait for their run.
    pub media: crate::media::MediaStage,
}

/// A registered transport.
enum Entry {
    Enabled(Arc<dyn Transport>),
    Disabled(String),
}

impl Entry {
    fn id(&self) -> &str {
        match self {
            Entry::Enabled(transport) => transport.id(),
            Entry::Disabled(id) => id,
        }
    }
}

/// The transports the gateway knows, in the order they were added.
pub struct TransportRegistry {
    entries: Vec<Entry>,
    statuses: TransportStatuses,
    policy: RestartPolicy,
}

impl fmt::Debug for TransportRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TransportRegistry")
            .field("ids", &self.ids())
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

impl Default for TransportRegistry {
    fn default() -> Self {
        TransportRegistry::new(TransportStatuses::default())
    }
}

impl TransportRegistry {
    /// An empty registry reporting into `statuses`, with the default restart policy.
    pub fn new(statuses: TransportStatuses) -> Self {
        TransportRegistry { entries: Vec::new(), statuses, policy: RestartPolicy::default() }
    }

    /// Uses `policy` for every transport.
    #[must_use]
    pub fn with_policy(mut self, policy: RestartPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// Adds an enabled transport.
    ///
    /// # Errors
    /// Its id is malformed, reserved, or already registered.
    pub fn add(&mut self, transport: Arc<dyn Transport>) -> Result<(), TransportIdError> {
        self.check_new(transport.id())?;
        self.entries.push(Entry::Enabled(transport));
        Ok(())
    }

    /// Adds a transport that is switched off: status shows it as `disabled`.
    ///
    /// # Errors
    /// As [`TransportRegistry::add`].
    pub fn add_disabled(&mut self, id: &str) -> Result<(), TransportIdError> {
        self.check_new(id)?;
        self.entries.push(Entry::Disabled(id.to_owned()));
        Ok(())
    }

    fn check_new(&self, id: &str) -> Result<(), TransportIdError> {
        validate_id(id)?;
        if self.entries.iter().any(|entry| entry.id() == id) {
            return Err(TransportIdError::Duplicate(id.to_owned()));
        }
        Ok(())
    }

    /// Every registered id, in order.
    pub fn ids(&self) -> Vec<&str> {
        self.entries.iter().map(Entry::id).collect()
    }

    /// Ids of the enabled transports, in order.
    pub fn enabled_ids(&self) -> Vec<&str> {
        self.entries
            .iter()
            .filter_map(|entry| match entry {
                Entry::Enabled(transport) => Some(transport.id()),
                Entry::Disabled(_) => None,
            })
            .collect()
    }

    /// Where states are reported.
    pub fn statuses(&self) -> &TransportStatuses {
        &self.statuses
    }

    /// Marks disabled transports `disabled` and enabled ones `starting`, then
    /// starts a supervisor for each enabled one on `deps.tracker`. Returns at
    /// once; the statuses tell how each is doing.
    pub fn start(self, deps: &TransportDeps) -> TransportStatuses {
        self.start_supervised(deps).statuses().clone()
    }

    /// As [`TransportRegistry::start`], keeping the supervisors so that one
    /// transport can be restarted with new settings while the others run on.
    pub fn start_supervised(self, deps: &TransportDeps) -> RunningTransports {
        for entry in &self.entries {
            let state = match entry {
                Entry::Enabled(_) => TransportState::Starting,
                Entry::Disabled(_) => TransportState::Disabled,
            };
            self.statuses.set(entry.id(), state);
        }
        let running = RunningTransports {
            deps: deps.clone(),
            statuses: self.statuses,
            policy: self.policy,
            supervisors: Arc::new(tokio::sync::Mutex::new(Vec::new())),
        };
        let mut supervisors = Vec::new();
        for entry in self.entries {
            let Entry::Enabled(transport) = entry else { continue };
            supervisors.push(running.spawn(transport));
        }
        if let Ok(mut slot) = running.supervisors.try_lock() {
            *slot = supervisors;
        }
        running
    }
}

/// One transport's supervisor while it runs.
#[derive(Debug)]
struct Supervisor {
    id: String,
    stop: CancellationToken,
    done: tokio::task::JoinHandle<()>,
}

/// The supervisors of a started registry. Cheap to clone.
#[derive(Clone)]
pub struct RunningTransports {
    deps: TransportDeps,
    statuses: TransportStatuses,
    policy: RestartPolicy,
    supervisors: Arc<tokio::sync::Mutex<Vec<Supervisor>>>,
}

impl fmt::Debug for RunningTransports {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RunningTransports").field("policy", &self.policy).finish_non_exhaustive()
    }
}

impl RunningTransports {
    /// Where states are reported.
    pub fn statuses(&self) -> &TransportStatuses {
        &self.statuses
    }

    fn spawn(&self, transport: Arc<dyn Transport>) -> Supervisor {
        let id = transport.id().to_owned();
        // The transport sees its own stop as the gateway's shutdown; the
        // gateway's shutdown still stops it.
        let stop = self.deps.shutdown.child_token();
        let ctx = TransportContext {
            router: self.deps.router.clone(),
            store: self.deps.store.clone(),
            shutdown: stop.clone(),
            tracker: self.deps.tracker.clone(),
            status: self.statuses.handle(&id),
            http: self.deps.http.clone(),
            approvals: self.deps.approvals.clone(),
            media: self.deps.media.clone(),
        };
        let done = self.deps.tracker.spawn(supervise(transport, ctx, self.policy));
        Supervisor { id, stop, done }
    }

    /// Stops the transport with this id (if it runs) and waits until it has
    /// stopped; its status becomes `disabled`. Other transports are untouched.
    pub async fn stop(&self, id: &str) {
        let mut supervisors = self.supervisors.lock().await;
        Self::stop_locked(&mut supervisors, id).await;
        self.statuses.set(id, TransportState::Disabled);
    }

    async fn stop_locked(supervisors: &mut Vec<Supervisor>, id: &str) {
        if let Some(at) = supervisors.iter().position(|s| s.id == id) {
            let supervisor = supervisors.remove(at);
            supervisor.stop.cancel();
            if let Err(error) = supervisor.done.await {
                tracing::warn!(transport = %id, %error, "transport supervisor ended abnormally");
            }
        }
    }

    /// Stops the running transport with `transport`'s id, waits until it has
    /// stopped (its listener is closed), and starts `transport` in its place;
    /// a transport that was not running is started. Other transports are
    /// untouched.
    ///
    /// # Errors
    /// Its id is malformed or reserved.
    pub async fn restart(&self, transport: Arc<dyn Transport>) -> Result<(), TransportIdError> {
        let id = transport.id().to_owned();
        validate_id(&id)?;
        let mut supervisors = self.supervisors.lock().await;
        Self::stop_locked(&mut supervisors, &id).await;
        if self.deps.shutdown.is_cancelled() {
            return Ok(());
        }
        self.statuses.set(&id, TransportState::Starting);
        supervisors.push(self.spawn(transport));
        tracing::info!(transport = %id, "transport restarted with new settings");
        Ok(())
    }
}

/// Runs `transport` until shutdown, restarting it as [`RestartPolicy`] says.
async fn supervise(transport: Arc<dyn Transport>, ctx: TransportContext, policy: RestartPolicy) {
    let id = transport.id().to_owned();
    let status = ctx.status.clone();
    let shutdown = ctx.shutdown.clone();
    let mut attempts: u32 = 0;
    let mut backoff = policy.initial_backoff;
    while !shutdown.is_cancelled() {
        status.set(TransportState::Starting);
        let started = Instant::now();
        // A panic inside `run` is this transport's failure, not the gateway's.
        let outcome = AssertUnwindSafe(transport.run(ctx.clone())).catch_unwind().await;
        if shutdown.is_cancelled() {
            if let Ok(Err(error)) = &outcome {
                tracing::debug!(transport = %id, %error, "transport ended with an error at shutdown");
            }
            break;
        }
        let error = match outcome {
            Ok(Ok(())) => TransportError::retryable("stopped without an error"),
            Ok(Err(error)) => error,
            Err(panic) => TransportError::retryable(format!("panicked: {}", panic_text(&*panic))),
        };
        let ran_a_while = started.elapsed() >= policy.reset_after
            && matches!(status.get(), Some(TransportState::Running { .. }));
        if ran_a_while {
            attempts = 0;
            backoff = policy.initial_backoff;
        }
        attempts = attempts.saturating_add(1);
        if !error.retry {
            tracing::error!(transport = %id, reason = %error.message, attempts, "transport failed; not retried");
            status.set(TransportState::Failing {
                reason: error.message,
                attempts,
                retry_in_ms: None,
            });
            shutdown.cancelled().await;
            break;
        }
        let retry_in_ms = u64::try_from(backoff.as_millis()).unwrap_or(u64::MAX);
        tracing::warn!(transport = %id, reason = %error.message, attempts, retry_in_ms, "transport failed; retrying");
        status.set(TransportState::Failing {
            reason: error.message,
            attempts,
            retry_in_ms: Some(retry_in_ms),
        });
        tokio::select! {
            () = shutdown.cancelled() => break,
            () = tokio::time::sleep(backoff) => {}
        }
        backoff = backoff.saturating_mul(2).min(policy.max_backoff);
    }
    status.set(TransportState::Stopped);
    tracing::debug!(transport = %id, "transport stopped");
}

/// A panic's message, when it has one.
fn panic_text(payload: &(dyn Any + Send)) -> String {
    if let Some(text) = payload.downcast_ref::<&str>() {
        (*text).to_owned()
    } else if let Some(text) = payload.downcast_ref::<String>() {
        text.clone()
    } else {
        "no message".to_owned()
    }
}
