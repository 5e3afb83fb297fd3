//! How a listener treats its connections (timeouts and a cap), and the caps
//! derived from the process's descriptor limit. Plain data: `lemon-api` serves
//! with it, and every transport that listens gets it in its context.

use std::time::Duration;

use crate::net::Network;

/// The most connections one listener gets by default, however high the limit.
const MAX_LISTENER_CONNECTIONS: usize = 10_000;

/// The most connections the health listener gets by default.
const MAX_HEALTH_CONNECTIONS: usize = 64;

/// How a descriptor limit is shared out between the listeners.
///
/// An eighth of the descriptors (at least 32) stay free for the gateway's own
/// files: the database, logs, engine processes' pipes and outbound connections.
/// The health listener gets a sixteenth (between 4 and 64), and the control API
/// and the webhook listener each get half of the rest (at most 10 000). So even
/// with both of them full, the health listener and the gateway's own files still
/// find free descriptors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// The cap of the control API and of each transport's listener.
    pub listener: usize,
    /// The cap of the health listener.
    pub health: usize,
    /// Descriptors left for everything that is not a connection.
    pub reserved: usize,
}

impl ConnectionLimits {
    /// The caps for a process that may open `limit` descriptors.
    pub fn from_descriptor_limit(limit: u64) -> Self {
        let limit = usize::try_from(limit).unwrap_or(usize::MAX);
        let reserved = (limit / 8).max(32);
        let health = (limit / 16).clamp(4, MAX_HEALTH_CONNECTIONS);
        let listener =
            (limit.saturating_sub(reserved + health) / 2).clamp(1, MAX_LISTENER_CONNECTIONS);
        ConnectionLimits { listener, health, reserved }
    }
}

/// How one listener treats its connections.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServeConfig {
    /// How long a client has to send a complete request head, from the moment
    /// the server starts waiting for it.
    pub header_read_timeout: Duration,
    /// How long a connection with no request in flight may stay silent.
    pub idle_timeout: Duration,
    /// Connections open at once; more are refused with `503`.
    pub max_connections: usize,
    /// What one client may do (connections, request rate); off by default.
    pub clients: ClientLimits,
}

/// What one client of a listener may do. A client is its peer address: an
/// IPv4 address, or the /64 network of an IPv6 address (one host usually holds
/// a whole /64). Zero turns a limit off; the default turns both off.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientLimits {
    /// Connections one client may hold open at once; one more is answered
    /// `429` with `Retry-After` and closed.
    pub max_connections: usize,
    /// Requests a second one client may send, sustained; one more is
    /// answered `429` with `Retry-After` (the seconds until it may send again).
    pub requests_per_second: u32,
    /// Requests a client may send at once after a quiet spell (at least 1
    /// when a rate is set).
    pub burst: u32,
    /// Clients no limit applies to.
    pub exempt: Vec<Network>,
}

impl ClientLimits {
    /// Whether any limit is on.
    pub fn is_active(&self) -> bool {
        self.max_connections > 0 || self.requests_per_second > 0
    }
}

/// Default of [`ServeConfig::header_read_timeout`].
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Default of [`ServeConfig::idle_timeout`].
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(5);

impl Default for ServeConfig {
    /// The default timeouts, and the API's cap under a 1 024-descriptor limit.
    fn default() -> Self {
        ServeConfig {
            header_read_timeout: DEFAULT_HEADER_READ_TIMEOUT,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            max_connections: ConnectionLimits::from_descriptor_limit(1024).listener,
            clients: ClientLimits::default(),
        }
    }
}

impl ServeConfig {
    /// The same timeouts with another connection cap (at least 1).
    #[must_use]
    pub fn with_max_connections(mut self, max_connections: usize) -> Self {
        self.max_connections = max_connections.max(1);
        self
    }

    /// The same with other per-client limits.
    #[must_use]
    pub fn with_client_limits(mut self, clients: ClientLimits) -> Self {
        self.clients = clients;
        self
    }
}
