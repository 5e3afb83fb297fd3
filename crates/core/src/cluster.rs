//! Cluster mode's coordination primitives: several gateway nodes sharing one
//! PostgreSQL database agree, through rows in it, on who owns what.
//!
//! This module owns the cluster tables of the PostgreSQL schema (migration 2 in
//! `store::postgres::schema`) and nothing else: it does not read or write runs,
//! events or the journal, and it does not start or stop actors. The router and
//! the gateway use it to decide where a session lives, when a run may start and
//! when a node must stop writing.
//!
//! The rules every part keeps:
//! - Times come from the database's clock (`clock_timestamp()`), never a node's;
//!   a node only measures how long ago it last renewed, with its monotonic clock.
//! - A lease (a session's or a single-consumer channel's) is a row with a
//!   fencing epoch. The row is never deleted, so the epoch only grows; a write
//!   that checks `(node, epoch)` and an unexpired `expires_at` in its own
//!   transaction ([`Cluster::fenced_write`]) cannot land after another node
//!   took the lease over.
//! - The global cap is structural: a run holds one `run_slots` row while it
//!   runs, and there are as many rows as the cap allows.
//! - The table is the truth; a NOTIFY ([`listener`]) is only a hint to look.
//!
//! # Layout
//! - this file: [`NodeId`], [`Lease`], [`ClusterError`], the [`Cluster`] handle
//!   and node registration.
//! - [`leases`]: session and channel leases, renewal, the fenced transaction.
//! - [`slots`]: the run slots and the admission-ordered claims on them.
//! - [`control`]: cancel and steer requests between nodes, the cluster config row.
//! - [`listener`]: one dedicated connection that LISTENs and yields notifications.
//! - [`keeper`]: the task that renews a node's leases and fences it when it
//!   cannot.

pub mod control;
pub mod keeper;
pub mod leases;
pub mod listener;
pub mod node;
pub mod slots;

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use deadpool_postgres::{Object, Pool};

pub use control::{Control, ControlKind, SharedConfig};
pub use keeper::{KeeperConfig, LeaseKeeper};
pub use leases::{LeaseOwner, LostLease, RenewReport, StaleLease};
pub use listener::{Listener, Notice, Topic};
pub use node::{ClusterNode, ClusterSettings, Placement};
pub use slots::FreedSlot;

/// A node's id: 1 to 64 of `A-Z a-z 0-9 . _ -`, from the node's config or
/// [`NodeId::generate`]d. Two running nodes must never share one. Cheap to clone.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(Arc<str>);

/// Why [`NodeId::parse`] refused an id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NodeIdError {
    #[error("invalid node id: it must be 1 to 64 characters")]
    Length,
    #[error("invalid node id: only letters, digits, '.', '_' and '-' are allowed")]
    Character,
}

impl NodeId {
    /// The longest id.
    pub const MAX_LEN: usize = 64;

    /// An id from config.
    ///
    /// # Errors
    /// [`NodeIdError`] saying why the id was refused.
    pub fn parse(raw: &str) -> Result<Self, NodeIdError> {
        if raw.is_empty() || raw.len() > Self::MAX_LEN {
            return Err(NodeIdError::Length);
        }
        if !raw.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')) {
            return Err(NodeIdError::Character);
        }
        Ok(NodeId(raw.into()))
    }

    /// A fresh id, `node-` and 12 random hex digits, for a node whose config
    /// names none. A node that restarts with a generated id is a new node.
    pub fn generate() -> Self {
        let hex = uuid::Uuid::new_v4().simple().to_string();
        NodeId(format!("node-{}", &hex[..12]).into())
    }

    /// An id read back from the cluster tables, which only ever hold parsed ids.
    fn from_db(raw: String) -> Self {
        NodeId(raw.into())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "NodeId({})", self.0)
    }
}

/// What a lease gives its holder: a session (its router actor, its runs) or a
/// single-consumer channel (a Telegram poller, a Discord gateway connection).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LeaseKind {
    Session,
    Channel,
}

impl LeaseKind {
    pub fn as_str(self) -> &'static str {
        match self {
            LeaseKind::Session => "session",
            LeaseKind::Channel => "channel",
        }
    }
}

/// A lease this node holds: until `expires_at_ms` (the database's clock) and
/// for as long as it keeps renewing it, nobody else owns `key`. Every write made
/// under it names its `epoch`, which the next holder's is greater than.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub kind: LeaseKind,
    /// The session key or the channel name.
    pub key: String,
    pub node: NodeId,
    /// The fencing epoch: 1 for the first holder, one more at every takeover or
    /// re-acquisition after it lapsed or was released.
    pub epoch: i64,
    /// When it lapses unless renewed, in milliseconds since the Unix epoch by
    /// the database's clock, as of the last acquisition or renewal.
    pub expires_at_ms: i64,
    /// How long each acquisition or renewal extends it.
    pub term: Duration,
}

/// Why a cluster operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClusterError {
    /// The database could not be reached, the connection dropped or no pooled
    /// connection became free in time: worth retrying.
    #[error("cluster database unavailable: {message}")]
    Unavailable { message: String },
    /// The database refused a statement (`code` is its SQLSTATE).
    #[error("cluster database error: {message} ({code})")]
    Database { code: String, message: String },
    /// The lease is no longer this node's at this epoch (it lapsed, was
    /// released or was taken over): nothing was written.
    #[error("lease {key} at epoch {epoch} is no longer held")]
    Fenced { key: String, epoch: i64 },
    /// A compare-and-swap found another version than the caller expected.
    #[error("version conflict: expected {expected}, found {found}")]
    Conflict { expected: i64, found: i64 },
    /// A slot claim for a run that already holds a slot under another session.
    #[error("run {run_id} holds a slot for session {session_key}")]
    RunInOtherSession { run_id: String, session_key: String },
    /// This node has no row in `cluster_nodes` (never registered, or removed).
    #[error("node {node} is not registered")]
    NotRegistered { node: NodeId },
}

impl From<tokio_postgres::Error> for ClusterError {
    fn from(error: tokio_postgres::Error) -> Self {
        match error.as_db_error() {
            // Connection exceptions, operator intervention (a terminated
            // backend, a shutdown) and exhausted resources are the database
            // going away, not the statement being wrong.
            Some(db) => {
                let code = db.code().code();
                if code.starts_with("08") || code.starts_with("57P") || code.starts_with("53") {
                    ClusterError::Unavailable { message: format!("{} ({code})", db.message()) }
                } else {
                    ClusterError::Database {
                        code: code.to_owned(),
                        message: db.message().to_owned(),
                    }
                }
            }
            None => ClusterError::Unavailable { message: error_chain(&error) },
        }
    }
}

impl From<deadpool_postgres::PoolError> for ClusterError {
    fn from(error: deadpool_postgres::PoolError) -> Self {
        match error {
            deadpool_postgres::PoolError::Backend(e) => e.into(),
            deadpool_postgres::PoolError::Timeout(_) => ClusterError::Unavailable {
                message: "no database connection became free in time".to_owned(),
            },
            other => ClusterError::Unavailable { message: other.to_string() },
        }
    }
}

/// An error and its causes on one line. The driver never puts the connection
/// string in its errors.
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// What a node tells the others about itself when it registers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeInfo {
    /// The gateway's version.
    pub version: String,
    /// Where the node's API is reached, for status pages and forwarding.
    pub api_base_url: Option<String>,
    /// The single-consumer channels this node has the secrets for, so could own.
    pub channels: Vec<String>,
}

/// A node as `cluster_nodes` has it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeStatus {
    pub id: NodeId,
    pub info: NodeInfo,
    pub started_at_ms: i64,
    pub last_heartbeat_ms: i64,
    /// Whether its last heartbeat is within the window [`Cluster::nodes`] was
    /// asked about, by the database's clock.
    pub alive: bool,
}

/// The cluster as one node sees it: the shared database and this node's id.
/// Cheap to clone; clones share which leases this node believes it holds.
#[derive(Clone)]
pub struct Cluster {
    inner: Arc<ClusterInner>,
}

struct ClusterInner {
    pool: Pool,
    node: NodeId,
    /// The leases this node acquired and has not released or lost, with their
    /// epochs: what [`Cluster::renew_all`] renews. A row with this node's id
    /// that is not in here (a previous run of a node with the same id) is not
    /// renewed, and acquiring it again takes a new epoch.
    held: Mutex<HashMap<(LeaseKind, String), i64>>,
}

impl fmt::Debug for Cluster {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cluster").field("node", &self.inner.node).finish_non_exhaustive()
    }
}

/// A pooled connection while an operation uses it; see [`Cluster::with_client`].
struct InFlight(Option<Object>);

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Some(object) = self.0.take() {
            // Out of the pool: dropping the client closes the connection.
            drop(Object::take(object));
        }
    }
}

/// `x` (a `timestamptz` expression) in milliseconds since the Unix epoch.
macro_rules! sql_ms {
    ($x:literal) => {
        concat!("(extract(epoch FROM ", $x, ") * 1000)::bigint")
    };
}
pub(crate) use sql_ms;

/// A duration as the whole milliseconds a statement takes, at least 1.
fn millis(term: Duration) -> i64 {
    i64::try_from(term.as_millis()).unwrap_or(i64::MAX).max(1)
}

impl Cluster {
    /// The cluster through `pool` (the store's, [`crate::store::postgres::PostgresStore::pool`],
    /// which has applied the cluster migration), as node `node`.
    pub fn new(pool: Pool, node: NodeId) -> Self {
        Cluster { inner: Arc::new(ClusterInner { pool, node, held: Mutex::new(HashMap::new()) }) }
    }

    /// This node's id.
    pub fn node(&self) -> &NodeId {
        &self.inner.node
    }

    /// The shared database's pool.
    pub fn pool(&self) -> &Pool {
        &self.inner.pool
    }

    /// Runs `op` on a pooled connection. The connection goes back to the pool
    /// only when `op` finishes: one dropped mid-statement (a timed-out
    /// renewal, a cancelled caller) is closed instead, so nobody else waits
    /// behind a statement nobody reads, and its open transaction never commits.
    async fn with_client<T, E, F>(&self, op: F) -> Result<T, E>
    where
        F: for<'c> AsyncFnOnce(&'c mut Object) -> Result<T, E>,
        E: From<ClusterError>,
    {
        let object = self.inner.pool.get().await.map_err(ClusterError::from)?;
        let mut guard = InFlight(None);
        let result = op(guard.0.insert(object)).await;
        // Finished: back to the pool.
        guard.0 = None;
        result
    }

    /// Registers this node (or registers it again after a restart): its start
    /// time and first heartbeat are now.
    ///
    /// # Errors
    /// [`ClusterError::Unavailable`] or [`ClusterError::Database`].
    ///
    /// # Cancel safety
    /// Dropping the future may or may not leave the row written.
    pub async fn register_node(&self, info: &NodeInfo) -> Result<(), ClusterError> {
        self.with_client(async |client| {
            client
                .execute(
                    "INSERT INTO cluster_nodes
                        (node_id, started_at, last_heartbeat, version, api_base_url, channels)
                     VALUES ($1, clock_timestamp(), clock_timestamp(), $2, $3, $4)
                     ON CONFLICT (node_id) DO UPDATE SET
                        started_at = EXCLUDED.started_at,
                        last_heartbeat = EXCLUDED.last_heartbeat,
                        version = EXCLUDED.version,
                        api_base_url = EXCLUDED.api_base_url,
                        channels = EXCLUDED.channels",
                    &[&self.node().as_str(), &info.version, &info.api_base_url, &info.channels],
                )
                .await?;
            Ok(())
        })
        .await
    }

    /// Records that this node is alive; returns the database's clock, in
    /// milliseconds since the Unix epoch.
    ///
    /// # Errors
    /// [`ClusterError::NotRegistered`] when the node has no row (register it
    /// again), [`ClusterError::Unavailable`] or [`ClusterError::Database`].
    ///
    /// # Cancel safety
    /// Cancel safe: a heartbeat either lands or it does not.
    pub async fn heartbeat(&self) -> Result<i64, ClusterError> {
        self.with_client(async |client| {
            let row = client
                .query_opt(
                    concat!(
                        "UPDATE cluster_nodes SET last_heartbeat = clock_timestamp()
                         WHERE node_id = $1 RETURNING ",
                        sql_ms!("last_heartbeat")
                    ),
                    &[&self.node().as_str()],
                )
                .await?;
            match row {
                Some(row) => Ok(row.get(0)),
                None => Err(ClusterError::NotRegistered { node: self.node().clone() }),
            }
        })
        .await
    }

    /// Every registered node, oldest first; `alive` when its last heartbeat is
    /// less than `alive_within` old.
    ///
    /// # Errors
    /// [`ClusterError::Unavailable`] or [`ClusterError::Database`].
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn nodes(&self, alive_within: Duration) -> Result<Vec<NodeStatus>, ClusterError> {
        self.with_client(async |client| {
            let rows = client
                .query(
                    concat!(
                    "SELECT node_id, version, api_base_url, channels, ",
                    sql_ms!("started_at"),
                    ", ",
                    sql_ms!("last_heartbeat"),
                    ", last_heartbeat > clock_timestamp() - $1::bigint * interval '1 millisecond'
                         FROM cluster_nodes ORDER BY started_at, node_id"
                ),
                    &[&millis(alive_within)],
                )
                .await?;
            Ok(rows
                .into_iter()
                .map(|row| NodeStatus {
                    id: NodeId::from_db(row.get(0)),
                    info: NodeInfo {
                        version: row.get(1),
                        api_base_url: row.get(2),
                        channels: row.get(3),
                    },
                    started_at_ms: row.get(4),
                    last_heartbeat_ms: row.get(5),
                    alive: row.get(6),
                })
                .collect())
        })
        .await
    }

    /// Forgets a node (one that is gone for good); its leases lapse on their
    /// own. Returns whether there was such a node.
    ///
    /// # Errors
    /// [`ClusterError::Unavailable`] or [`ClusterError::Database`].
    ///
    /// # Cancel safety
    /// Dropping the future may or may not leave the row removed.
    pub async fn remove_node(&self, node: &NodeId) -> Result<bool, ClusterError> {
        self.with_client(async |client| {
            let n = client
                .execute("DELETE FROM cluster_nodes WHERE node_id = $1", &[&node.as_str()])
                .await?;
            Ok(n > 0)
        })
        .await
    }
}

#[cfg(test)]
mod tests;
