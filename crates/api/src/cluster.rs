//! A cluster node as the status routes show it: `cluster` in `/v1/status`,
//! the `cluster` check of `/healthz`, the `lemon_cluster_*` families of
//! `/metrics`.
//!
//! `/v1/status` `cluster` (`null` when the gateway is not a cluster node):
//! `{"node", "term_ms", "fenced", "nodes": [{"id", "alive", "started_at_ms",
//! "last_heartbeat_ms", "api_base_url", "version", "channels"}], "slots":
//! {"total", "in_use"}, "channels": [{"channel", "node", "epoch", "live"}],
//! "sessions_here", "config": {"version", "applied_version", "error"}}`, read
//! from the cluster tables when asked; when they cannot be read, `{"node",
//! "term_ms", "fenced", "sessions_here", "config", "error"}`. `config` is the
//! cluster config's version in the database, the one this node applied, and
//! why this node refused a later one (`null` unless it did).
//!
//! [`ClusterConfig`] is this node's side of the cluster config, for
//! `/v1/cluster/config` and `/v1/status`: the version it applied and a check
//! of a body as it would apply it.

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use lemon_core::cluster::ClusterNode;
use lemon_core::config::ConfigError;
use serde_json::{json, Value};

use crate::health::HealthCheck;
use crate::metrics::text::{Exposition, Kind};

/// What `/healthz` and its callers say about a fenced node.
pub const FENCED_REASON: &str = "this cluster node is fenced: it could not renew its leases in \
     time, writes nothing more and is stopping";

/// The cluster, in `/v1/status`, as this node sees it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
pub struct ClusterStatus {
    /// Who owns each single-consumer channel (absent when the cluster tables
    /// could not be read).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub channels: Option<Vec<ClusterChannel>>,
    /// The cluster config: its version and the one this node applied.
    pub config: ClusterConfigVersions,
    /// Why the cluster tables could not be read (absent when they were).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Whether this node is fenced (it writes nothing more and is stopping).
    pub fenced: bool,
    /// This node's id.
    pub node: String,
    /// Every registered node, oldest first (absent when the cluster tables
    /// could not be read).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nodes: Option<Vec<ClusterNodeStatus>>,
    /// Sessions whose lease this node holds.
    pub sessions_here: usize,
    /// The cluster's run slots (absent when the cluster tables could not be read).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slots: Option<ClusterSlots>,
    /// The lease term.
    pub term_ms: u64,
}

/// A node of the cluster.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
pub struct ClusterNodeStatus {
    /// Its last heartbeat is within the lease term.
    pub alive: bool,
    /// Where its API is reached.
    #[schema(required = true)]
    pub api_base_url: Option<String>,
    /// The single-consumer channels it could own.
    pub channels: Vec<String>,
    pub id: String,
    pub last_heartbeat_ms: i64,
    pub started_at_ms: i64,
    /// The gateway's version on that node.
    pub version: String,
}

/// The cluster's run slots.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
pub struct ClusterSlots {
    /// Slots runs hold now.
    pub in_use: u32,
    /// The cap on concurrent runs across the cluster.
    pub total: u32,
}

/// A single-consumer channel's lease.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
pub struct ClusterChannel {
    /// `<transport>:<account>`.
    pub channel: String,
    pub epoch: i64,
    /// Held now: `node` runs the channel.
    pub live: bool,
    /// The node holding it (or that held it last).
    pub node: String,
}

/// `config` of the cluster in `/v1/status`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
pub struct ClusterConfigVersions {
    /// The version in force on this node (0: none, its file alone).
    #[schema(required = true)]
    pub applied_version: Option<i64>,
    /// Why this node refused a later version (it keeps the one it applied).
    #[schema(required = true)]
    pub error: Option<String>,
    /// The version in the database; `null` when it could not be read.
    #[schema(required = true)]
    pub version: Option<i64>,
}

impl ClusterStatus {
    /// `status`, read from the cluster tables, with `config`.
    pub fn of(
        status: &lemon_core::cluster::node::status::ClusterStatus,
        config: ClusterConfigVersions,
    ) -> Self {
        ClusterStatus {
            channels: Some(
                status
                    .channels
                    .iter()
                    .map(|c| ClusterChannel {
                        channel: c.channel.clone(),
                        epoch: c.epoch,
                        live: c.live,
                        node: c.node.as_str().to_owned(),
                    })
                    .collect(),
            ),
            config,
            error: None,
            fenced: status.fenced,
            node: status.node.as_str().to_owned(),
            nodes: Some(
                status
                    .nodes
                    .iter()
                    .map(|n| ClusterNodeStatus {
                        alive: n.alive,
                        api_base_url: n.info.api_base_url.clone(),
                        channels: n.info.channels.clone(),
                        id: n.id.as_str().to_owned(),
                        last_heartbeat_ms: n.last_heartbeat_ms,
                        started_at_ms: n.started_at_ms,
                        version: n.info.version.clone(),
                    })
                    .collect(),
            ),
            sessions_here: status.sessions_here,
            slots: Some(ClusterSlots { in_use: status.slots.in_use, total: status.slots.total }),
            term_ms: millis(status.term),
        }
    }
}

/// The cluster as `/v1/status` shows it, read within `timeout`; what this
/// node knows by itself, and the `error`, when the tables cannot be read.
/// `applied` is what this node did with the cluster config.
pub async fn cluster_status(
    node: &ClusterNode,
    applied: Option<&AppliedConfig>,
    timeout: Duration,
) -> ClusterStatus {
    let read = async { tokio::join!(node.status(), node.cluster().config()) };
    let (status, row) = match tokio::time::timeout(timeout, read).await {
        Ok((status, row)) => (status.map_err(|e| e.to_string()), row.ok()),
        Err(_) => (Err(format!("no answer within {} s", timeout.as_secs())), None),
    };
    let applied = applied.map(AppliedConfig::get);
    let config = ClusterConfigVersions {
        applied_version: applied.as_ref().map(|a| a.version),
        error: applied.and_then(|a| a.refused).map(|r| r.error),
        version: row.map(|row| row.version),
    };
    match status {
        Ok(status) => ClusterStatus::of(&status, config),
        Err(error) => ClusterStatus {
            channels: None,
            config,
            error: Some(error),
            fenced: node.is_fenced(),
            node: node.id().as_str().to_owned(),
            nodes: None,
            sessions_here: node.sessions_held(),
            slots: None,
            term_ms: millis(node.settings().term),
        },
    }
}

/// What this node did with the cluster config: the version it applied, and
/// a later one it refused.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Applied {
    /// The version in force here (0: none; the file alone).
    pub version: i64,
    /// A later version this node could not apply, and why; it keeps
    /// `version` meanwhile.
    pub refused: Option<Refused>,
}

/// A version of the cluster config a node refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    pub version: i64,
    pub error: String,
}

/// [`Applied`], shared by the node's reload path (which sets it) and the API.
/// Cheap to clone; clones share it.
#[derive(Debug, Clone, Default)]
pub struct AppliedConfig(Arc<Mutex<Applied>>);

impl AppliedConfig {
    pub fn get(&self) -> Applied {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Version `version` is in force here.
    pub fn applied(&self, version: i64) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = Applied { version, refused: None };
    }

    /// Version `version` was refused here for `error`; the one in force stays.
    pub fn refused(&self, version: i64, error: String) {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).refused =
            Some(Refused { version, error });
    }
}

/// Checks a cluster config body as this node would apply it: the body alone
/// ([`lemon_core::config::SharedSettings::parse`]), then merged over this
/// node's config and checked as an edit of its file is (engines named,
/// channels built). The server implements it.
#[async_trait]
pub trait SharedConfigCheck: Send + Sync + fmt::Debug {
    /// # Errors
    /// Why this node would refuse `body`: placed in the body (file
    /// `cluster config`) when the problem is in it, in this node's file when
    /// it is there.
    async fn check(&self, body: &str) -> Result<(), ConfigError>;
}

/// This node's side of the cluster config.
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    pub applied: AppliedConfig,
    /// `None`: a body is checked alone.
    pub check: Option<Arc<dyn SharedConfigCheck>>,
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The `lemon_cluster_*` families: the cluster's nodes and slots (when
/// `status` could be read) and the sessions this node owns.
pub fn render_metrics(
    out: &mut Exposition,
    node: &ClusterNode,
    status: Option<&lemon_core::cluster::node::status::ClusterStatus>,
) {
    if let Some(status) = status {
        out.single(
            "lemon_cluster_nodes_alive",
            Kind::Gauge,
            "Cluster nodes whose last heartbeat is within the lease term.",
            status.nodes_alive(),
        );
        out.single(
            "lemon_cluster_slots_in_use",
            Kind::Gauge,
            "Run slots held by runs across the cluster.",
            status.slots.in_use,
        );
        out.single(
            "lemon_cluster_slots_total",
            Kind::Gauge,
            "Run slots of the cluster: its cap on concurrent runs.",
            status.slots.total,
        );
    }
    out.single(
        "lemon_cluster_sessions_owned",
        Kind::Gauge,
        "Sessions whose lease this node holds.",
        node.sessions_held(),
    );
    out.single(
        "lemon_cluster_fenced",
        Kind::Gauge,
        "1 once this node is fenced (it stops and exits), else 0.",
        u8::from(node.is_fenced()),
    );
}

/// The `cluster` check of `/healthz`: fails once the node is fenced. It asks
/// the database nothing (the store check does), only the node.
#[derive(Debug)]
pub struct ClusterCheck {
    pub node: Arc<ClusterNode>,
}

#[async_trait]
impl HealthCheck for ClusterCheck {
    fn name(&self) -> &str {
        "cluster"
    }

    async fn check(&self) -> Result<Value, String> {
        if self.node.is_fenced() {
            return Err(FENCED_REASON.to_owned());
        }
        Ok(json!({ "node": self.node.id().as_str(), "sessions_here": self.node.sessions_held() }))
    }
}
