//! The transport contract: a channel that brings messages in through the router
//! and takes answers back out (webhooks, Telegram, …).
//!
//! A transport runs until the gateway shuts down. When it fails (a bad token, a
//! port in use) it returns an error: the registry reports it as failing, waits,
//! and starts it again when the error is worth retrying. A failing transport
//! never takes the gateway down.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, RwLock};

use async_trait::async_trait;
use lemon_core::router::RouterHandle;
use lemon_core::store::StoreHandle;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

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
    pub router: RouterHandle,
    pub store: StoreHandle,
    pub shutdown: CancellationToken,
    /// For tasks that must finish before the gateway exits (deliveries).
    pub tracker: TaskTracker,
    pub status: StatusHandle,
}

/// Why a transport stopped serving. The message is shown in `/v1/status` and
/// `/healthz`, so it never holds a secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct TransportError {
    pub message: String,
    /// Whether starting again later can succeed (a port in use, a network
    /// error); false for errors only a config change can fix.
    pub retry: bool,
}

impl TransportError {
    pub fn retryable(message: impl Into<String>) -> Self {
        TransportError { message: message.into(), retry: true }
    }

    pub fn fatal(message: impl Into<String>) -> Self {
        TransportError { message: message.into(), retry: false }
    }
}

/// What a transport is doing, as status reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TransportState {
    /// Configured but switched off.
    Disabled,
    Starting,
    /// Serving; `detail` says where (an address, a bot name).
    Running {
        detail: Option<String>,
    },
    /// Stopped by an error; `retry_in_ms` is `None` when it will not be retried.
    Failing {
        reason: String,
        attempts: u32,
        retry_in_ms: Option<u64>,
    },
    /// Returned after shutdown.
    Stopped,
}

impl TransportState {
    pub fn as_str(&self) -> &'static str {
        match self {
            TransportState::Disabled => "disabled",
            TransportState::Starting => "starting",
            TransportState::Running { .. } => "running",
            TransportState::Failing { .. } => "failing",
            TransportState::Stopped => "stopped",
        }
    }

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
}

/// Every transport's state, shared by the registry (writer) and status routes
/// (readers). Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct TransportStatuses {
    inner: Arc<RwLock<BTreeMap<String, TransportState>>>,
}

impl TransportStatuses {
    pub fn set(&self, id: &str, state: TransportState) {
        let mut map = self.inner.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        map.insert(id.to_owned(), state);
    }

    pub fn get(&self, id: &str) -> Option<TransportState> {
        let map = self.inner.read().unwrap_or_else(std::sync::PoisonError::into_inner);
        map.get(id).cloned()
    }

    /// Id → state, sorted by id.
    pub fn snapshot(&self) -> BTreeMap<String, TransportState> {
        self.inner.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// A writer for one transport's entry.
    pub fn handle(&self, id: &str) -> StatusHandle {
        StatusHandle { id: id.into(), statuses: self.clone() }
    }
}

/// One transport's entry in [`TransportStatuses`].
#[derive(Debug, Clone)]
pub struct StatusHandle {
    id: Arc<str>,
    statuses: TransportStatuses,
}

impl StatusHandle {
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The transport is serving.
    pub fn running(&self, detail: Option<String>) {
        self.statuses.set(&self.id, TransportState::Running { detail });
    }

    pub fn set(&self, state: TransportState) {
        self.statuses.set(&self.id, state);
    }
}
