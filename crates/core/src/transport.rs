//! The transport contract: a channel that brings messages in through the router
//! and takes answers back out (webhooks, Telegram, …).
//!
//! A transport runs until the gateway shuts down. When it fails (a bad token, a
//! port in use) it returns an error: the [`TransportRegistry`] reports it as
//! failing, waits, and starts it again when the error is worth retrying. A
//! failing transport never takes the gateway down.
//!
//! Whether a transport runs at all is decided by [`enabled`], the one rule every
//! transport uses.

pub mod listener;
mod registry;

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::router::RouterHandle;
use crate::store::StoreHandle;
use async_trait::async_trait;
use serde_json::{json, Map, Value};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use registry::{RestartPolicy, RunningTransports, TransportDeps, TransportRegistry};

/// A channel.
#[async_trait]
pub trait Transport: Send + Sync + fmt::Debug + 'static {
    /// Lowercase, `^[a-z][a-z0-9_-]*$`; names the transport in status and logs.
    fn id(&self) -> &str;

    /// Runs until `ctx.shutdown` fires (then returns `Ok`). Calls
    /// `ctx.status.running(..)` once it is serving.
    ///
    /// # Errors
    /// Why it stopped serving; [`TransportError::retry`] says whether starting it
    /// again can help.
    async fn run(&self, ctx: TransportContext) -> Result<(), TransportError>;
}

/// What a transport gets to work with.
#[derive(Debug, Clone)]
pub struct TransportContext {
    /// Every message goes through the router, which hands back a follower of
    /// each run it accepts (`RouterHandle::follow` follows any other).
    pub router: RouterHandle,
    /// For the transport's small durable records (`kv_*`): offsets, keys, deliveries.
    pub store: StoreHandle,
    /// Fires when the gateway shuts down; `run` then returns `Ok`.
    pub shutdown: CancellationToken,
    /// For tasks that must finish before the gateway exits (deliveries).
    pub tracker: TaskTracker,
    /// This transport's entry in the status map.
    pub status: StatusHandle,
    /// Timeouts and connection cap for a listener the transport serves with
    /// `lemon_api::serve_with`.
    pub http: listener::ServeConfig,
    /// Tool calls waiting for the owner's answer: a chat channel offers them
    /// to the chat whose run asked, and takes the answer.
    pub approvals: crate::approvals::ApprovalHub,
    /// Where a channel keeps the files it receives until their run starts
    /// (see [`crate::media`]).
    pub media: crate::media::MediaStage,
}

/// Why a transport stopped serving. The message is shown in `/v1/status` and
/// `/healthz`, so it never holds a secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct TransportError {
    /// What went wrong, naming what is involved (an address, a bot), never a secret.
    pub message: String,
    /// Whether starting again later can succeed (a port in use, a network
    /// error); false for errors only a config change can fix.
    pub retry: bool,
}

impl TransportError {
    /// An error worth retrying later.
    pub fn retryable(message: impl Into<String>) -> Self {
        TransportError { message: message.into(), retry: true }
    }

    /// An error only a config change can fix; the transport is not restarted.
    pub fn fatal(message: impl Into<String>) -> Self {
        TransportError { message: message.into(), retry: false }
    }
}

/// What a transport is doing, as status reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TransportState {
    /// Configured but switched off.
    Disabled,
    /// Started, not serving yet.
    Starting,
    /// Serving; `detail` says where (an address, a bot name).
    Running {
        /// Where it serves, shown in status.
        detail: Option<String>,
    },
    /// Stopped by an error; `retry_in_ms` is `None` when it will not be retried.
    Failing {
        /// The error's message.
        reason: String,
        /// Failures in a row (reset once it has run a while).
        attempts: u32,
        /// When it is started again, or `None` for never.
        retry_in_ms: Option<u64>,
    },
    /// Returned after shutdown.
    Stopped,
}

impl TransportState {
    /// `disabled`, `starting`, `running`, `failing` or `stopped`.
    pub fn as_str(&self) -> &'static str {
        match self {
            TransportState::Disabled => "disabled",
            TransportState::Starting => "starting",
            TransportState::Running { .. } => "running",
            TransportState::Failing { .. } => "failing",
            TransportState::Stopped => "stopped",
        }
    }

    /// `{"state", "detail"?}`, or for a failing one
    /// `{"state", "reason", "attempts", "retry_in_ms"}` (`null`: not retried).
    pub fn to_json(&self) -> Value {
        match self {
            TransportState::Running { detail: Some(detail) } => {
                json!({ "state": self.as_str(), "detail": detail })
            }
            TransportState::Failing { reason, attempts, retry_in_ms } => json!({
                "state": self.as_str(),
                "reason": reason,
                "attempts": attempts,
                "retry_in_ms": retry_in_ms,
            }),
            _ => json!({ "state": self.as_str() }),
        }
    }

    /// Whether it is stopped by an error.
    pub fn is_failing(&self) -> bool {
        matches!(self, TransportState::Failing { .. })
    }
}

/// Every transport's state, shared by the registry (writer) and status routes
/// (readers). Cheap to clone. Readers can also wait for a change.
#[derive(Debug, Clone)]
pub struct TransportStatuses {
    inner: Arc<watch::Sender<BTreeMap<String, TransportState>>>,
    /// For metrics: per transport, how often it was set failing, and the
    /// backlog its outbox reports. Locked only for a map lookup.
    counts: Arc<Mutex<BTreeMap<String, TransportCounts>>>,
}

/// One transport's figures beside its state.
#[derive(Debug, Default)]
struct TransportCounts {
    n_failures: u64,
    backlog: Option<Backlog>,
}

impl Default for TransportStatuses {
    fn default() -> Self {
        TransportStatuses {
            inner: Arc::new(watch::Sender::new(BTreeMap::new())),
            counts: Arc::default(),
        }
    }
}

/// What a transport's outbox holds (sends and edits queued or in flight) and
/// how its calls went so far. The outbox writes it, metrics read it. Cheap to
/// clone; clones share the counts.
#[derive(Debug, Clone, Default)]
pub struct Backlog(Arc<OutboxCounts>);

#[derive(Debug, Default)]
struct OutboxCounts {
    held: AtomicU64,
    sent: AtomicU64,
    retried: AtomicU64,
    rate_limited: AtomicU64,
    failed: AtomicU64,
}

/// How one call of an outbox went, as [`Backlog::count`] counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallOutcome {
    /// A message was sent.
    Sent,
    /// A call failed in a way worth another attempt, which is made after a backoff.
    Retried,
    /// The service asked for a pause, which is waited out before the call is made again.
    RateLimited,
    /// A send or an edit was given up on.
    Failed,
}

/// The calls an outbox made so far, by how they went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OutboxCalls {
    pub n_sent: u64,
    pub n_retried: u64,
    pub n_rate_limited: u64,
    pub n_failed: u64,
}

impl Backlog {
    /// Sets the count.
    pub fn set(&self, n: u64) {
        self.0.held.store(n, Ordering::Relaxed);
    }

    /// The count now.
    pub fn get(&self) -> u64 {
        self.0.held.load(Ordering::Relaxed)
    }

    /// Counts one call that went as `outcome`.
    pub fn count(&self, outcome: CallOutcome) {
        let counter = match outcome {
            CallOutcome::Sent => &self.0.sent,
            CallOutcome::Retried => &self.0.retried,
            CallOutcome::RateLimited => &self.0.rate_limited,
            CallOutcome::Failed => &self.0.failed,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// The calls counted so far.
    pub fn calls(&self) -> OutboxCalls {
        OutboxCalls {
            n_sent: self.0.sent.load(Ordering::Relaxed),
            n_retried: self.0.retried.load(Ordering::Relaxed),
            n_rate_limited: self.0.rate_limited.load(Ordering::Relaxed),
            n_failed: self.0.failed.load(Ordering::Relaxed),
        }
    }
}

/// One transport's figures for metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TransportFigures {
    /// Times it stopped on an error since the gateway started.
    pub n_failures: u64,
    /// Its outbox's backlog; `None` for a transport without an outbox.
    pub backlog: Option<u64>,
    /// Its outbox's calls since the transport (re)started; `None` without an outbox.
    pub outbox_calls: Option<OutboxCalls>,
}

impl TransportStatuses {
    /// Sets `id`'s state and wakes whoever waits for a change. A failing
    /// state counts as one more failure of `id`.
    pub fn set(&self, id: &str, state: TransportState) {
        if state.is_failing() {
            let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
            counts.entry(id.to_owned()).or_default().n_failures += 1;
        }
        self.inner.send_modify(|map| {
            map.insert(id.to_owned(), state);
        });
    }

    /// Reports `backlog` as `id`'s outbox backlog from now on (a restarted
    /// transport's new outbox replaces the old one's).
    pub fn track_backlog(&self, id: &str, backlog: Backlog) {
        let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        counts.entry(id.to_owned()).or_default().backlog = Some(backlog);
    }

    /// Id → failures and backlog, sorted by id, for every transport that
    /// has failed or has an outbox.
    pub fn figures(&self) -> BTreeMap<String, TransportFigures> {
        let counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        counts
            .iter()
            .map(|(id, counts)| {
                let figures = TransportFigures {
                    n_failures: counts.n_failures,
                    backlog: counts.backlog.as_ref().map(Backlog::get),
                    outbox_calls: counts.backlog.as_ref().map(Backlog::calls),
                };
                (id.clone(), figures)
            })
            .collect()
    }

    /// `id`'s state, if it is registered.
    pub fn get(&self, id: &str) -> Option<TransportState> {
        self.inner.borrow().get(id).cloned()
    }

    /// Id → state, sorted by id.
    pub fn snapshot(&self) -> BTreeMap<String, TransportState> {
        self.inner.borrow().clone()
    }

    /// `{"<id>": {"state", …}, …}` (see [`TransportState::to_json`]).
    pub fn to_json(&self) -> Value {
        states_json(&self.inner.borrow())
    }

    /// A writer for one transport's entry.
    pub fn handle(&self, id: &str) -> StatusHandle {
        StatusHandle { id: id.into(), statuses: self.clone() }
    }

    /// Waits until `done` holds for the map (checked now, then on every change)
    /// and returns the map it held for.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn wait_for(
        &self,
        mut done: impl FnMut(&BTreeMap<String, TransportState>) -> bool,
    ) -> BTreeMap<String, TransportState> {
        let mut changes = self.inner.subscribe();
        // The sender lives in `self`, so the channel cannot close while this waits.
        let found = changes.wait_for(|map| done(map)).await.map(|map| map.clone());
        found.unwrap_or_else(|_| self.snapshot())
    }
}

/// Id → state as JSON, as status and health show it.
pub fn states_json(states: &BTreeMap<String, TransportState>) -> Value {
    Value::Object(
        states.iter().map(|(id, state)| (id.clone(), state.to_json())).collect::<Map<_, _>>(),
    )
}

/// One transport's entry in [`TransportStatuses`].
#[derive(Debug, Clone)]
pub struct StatusHandle {
    id: Arc<str>,
    statuses: TransportStatuses,
}

impl StatusHandle {
    /// The transport's id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The transport is serving.
    pub fn running(&self, detail: Option<String>) {
        self.statuses.set(&self.id, TransportState::Running { detail });
    }

    /// Sets the transport's state.
    pub fn set(&self, state: TransportState) {
        self.statuses.set(&self.id, state);
    }

    /// The transport's state.
    pub fn get(&self) -> Option<TransportState> {
        self.statuses.get(&self.id)
    }

    /// Reports `backlog` as this transport's outbox backlog (see
    /// [`TransportStatuses::track_backlog`]).
    pub fn track_backlog(&self, backlog: Backlog) {
        self.statuses.track_backlog(&self.id, backlog);
    }
}

/// Whether a transport is switched on: `[gateway.<id>] enabled` when the section
/// sets it (to a boolean), else `[gateway] enable_<id>` (`flag`), else off. So
/// the section's flag wins when both are set, and a section without `enabled`
/// does not switch a transport on by itself.
pub fn enabled(flag: Option<bool>, section: Option<&toml::Table>) -> bool {
    let own = section.and_then(|table| table.get("enabled")).and_then(toml::Value::as_bool);
    own.or(flag).unwrap_or(false)
}

/// A token given inline (`<key> = "…"`) or by the name of a secret
/// (`<key>_secret = "name"`); the inline value wins when it is not blank.
///
/// # Errors
/// Which key is wrong: `<key>_secret` names a secret that is not set or cannot
/// be read, neither is given, or the token is blank. Never the value.
pub fn inline_or_secret(
    key: &str,
    inline: Option<&str>,
    secret: Option<&str>,
    secrets: &crate::secrets::SecretStore,
) -> Result<String, String> {
    let token = match (inline.map(str::trim), secret) {
        (Some(token), _) if !token.is_empty() => token.to_owned(),
        (_, Some(name)) => match secrets.get(name) {
            Ok(Some(value)) => value.expose().trim().to_owned(),
            Ok(None) => return Err(format!("{key}_secret: {}", secrets.not_set_message(name))),
            Err(err) => return Err(format!("{key}_secret: {err}")),
        },
        _ => return Err(format!("{key}: set {key} or {key}_secret")),
    };
    if token.is_empty() {
        return Err(format!("{key}: the token is blank"));
    }
    Ok(token)
}

/// Ids status and config cannot use for a transport.
pub const RESERVED_TRANSPORT_IDS: [&str; 2] = ["default", "all"];

/// A transport id the registry refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransportIdError {
    /// Not `^[a-z][a-z0-9_-]*$`.
    #[error(
        "transport id {0:?} is invalid: use lowercase letters, digits, '-' and '_', starting with a letter"
    )]
    Invalid(String),
    /// `default` or `all`.
    #[error("transport id {0:?} is reserved")]
    Reserved(String),
    /// Added twice.
    #[error("transport {0:?} is registered twice")]
    Duplicate(String),
}

/// Checks a transport id: `^[a-z][a-z0-9_-]*$` and not reserved.
///
/// # Errors
/// [`TransportIdError::Invalid`] or [`TransportIdError::Reserved`].
pub fn validate_id(id: &str) -> Result<(), TransportIdError> {
    let mut chars = id.chars();
    let well_formed = chars.next().is_some_and(|c| c.is_ascii_lowercase())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_');
    if !well_formed {
        return Err(TransportIdError::Invalid(id.to_owned()));
    }
    if RESERVED_TRANSPORT_IDS.contains(&id) {
        return Err(TransportIdError::Reserved(id.to_owned()));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
