//! The cluster as status pages show it: the nodes and their heartbeats, the
//! run slots, who owns each single-consumer channel, and how many sessions
//! this node holds.
//!
//! Every figure is read from the cluster tables when asked (the tables are
//! the truth), except the sessions this node holds, which it counts itself.

use std::time::Duration;

use super::ClusterNode;
use crate::cluster::{ClusterError, NodeId, NodeStatus};

/// The run slots across the cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotFigures {
    /// Slots runs may claim: the cluster's cap on concurrent runs.
    pub total: u32,
    /// Slots runs hold now (a retired slot still held counts too).
    pub in_use: u32,
}

/// Who holds a single-consumer channel, as its lease row says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChannelOwner {
    /// `<transport>:<account>`, such as `telegram:mybot`.
    pub channel: String,
    /// The node that holds it, or held it last.
    pub node: NodeId,
    pub epoch: i64,
    /// Neither released nor lapsed, by the database's clock: `node` runs it.
    pub live: bool,
}

/// The cluster as one node sees it, from [`ClusterNode::status`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterStatus {
    /// This node.
    pub node: NodeId,
    /// The lease term.
    pub term: Duration,
    /// Whether this node is fenced (it writes nothing and is stopping).
    pub fenced: bool,
    /// Every registered node, oldest first; alive when it heartbeat within
    /// the lease term.
    pub nodes: Vec<NodeStatus>,
    pub slots: SlotFigures,
    /// Every channel ever leased, by name.
    pub channels: Vec<ChannelOwner>,
    /// Sessions whose lease this node holds.
    pub sessions_here: usize,
}

impl ClusterStatus {
    /// How many nodes are alive.
    pub fn nodes_alive(&self) -> usize {
        self.nodes.iter().filter(|n| n.alive).count()
    }
}

impl ClusterNode {
    /// The cluster now, read from its tables.
    ///
    /// # Errors
    /// [`ClusterError`] when the database could not be read.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn status(&self) -> Result<ClusterStatus, ClusterError> {
        let term = self.settings.term;
        let nodes = self.cluster.nodes(term).await?;
        let in_use = self.cluster.slots_in_use().await?;
        let (total, channels) = self
            .cluster
            .with_client(async |client| {
                let total: i64 = client
                    .query_one("SELECT count(*) FROM run_slots WHERE NOT retired", &[])
                    .await?
                    .get(0);
                let rows = client
                    .query(
                        "SELECT channel, node_id, epoch,
                            released_at IS NULL AND expires_at > clock_timestamp()
                         FROM channel_leases ORDER BY channel",
                        &[],
                    )
                    .await?;
                let channels = rows
                    .into_iter()
                    .map(|row| ChannelOwner {
                        channel: row.get(0),
                        node: NodeId::from_db(row.get(1)),
                        epoch: row.get(2),
                        live: row.get(3),
                    })
                    .collect();
                Ok::<_, ClusterError>((total, channels))
            })
            .await?;
        Ok(ClusterStatus {
            node: self.id().clone(),
            term,
            fenced: self.is_fenced(),
            nodes,
            slots: SlotFigures { total: u32::try_from(total).unwrap_or(u32::MAX), in_use },
            channels,
            sessions_here: self.sessions_held(),
        })
    }
}
