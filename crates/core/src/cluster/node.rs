//! One node of a cluster at run time: the shared database, this node's leases
//! and the notifications it hears, as the router, the gateway and the server
//! use them.
//!
//! A [`ClusterNode`] registers the node, keeps its leases ([`LeaseKeeper`]),
//! listens on every cluster topic over one connection and fans the notices
//! out ([`ClusterNode::subscribe`]), and tells the store which writes are
//! fenced by which lease ([`Fences`]). Once the node cannot renew its leases in
//! time it is fenced for good: every registered write is dropped, and the
//! gateway stops its engines; a fenced node is expected to exit and start
//! again as a new member.
//!
//! Sessions: [`ClusterNode::place_session`] says whether a session runs here
//! (this node holds its lease, or just acquired it) or on which node it does;
//! the router hands requests for sessions owned elsewhere to their owner
//! through the journal and a [`Topic::Handoff`] notification, and releases a
//! session's lease when the session has no work left.
//!
//! # Layout
//! - this file: start-up, notices, session placement, run fences, sweeps.
//! - [`admission`]: a run's slot, claimed before its engine starts.
//! - [`remote`]: cancel and steer of a run another node owns.
//! - [`relay`]: events of runs on other nodes, for local followers.
//! - [`status`]: the cluster as status pages show it.
//! - [`channels`]: single-consumer channels owned through channel leases.

pub mod admission;
pub mod channels;
pub mod relay;
pub mod remote;
pub mod status;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::keeper::{KeeperConfig, LeaseKeeper};
use super::listener::{Listener, Notice, Topic};
use super::{Cluster, ClusterError, Lease, LeaseKind, NodeId, NodeInfo};
use crate::store::postgres::fence::Fences;
use crate::store::postgres::PostgresStore;

/// Notices waiting for a slow subscriber before it lags (and must resync).
const NOTICE_QUEUE: usize = 1024;

/// How often a node looks for sessions nobody owns, at the least.
pub const DEFAULT_SWEEP: Duration = Duration::from_secs(1);

/// A node's cluster settings, from `[gateway.cluster]`.
#[derive(Debug, Clone)]
pub struct ClusterSettings {
    pub node: NodeId,
    /// Every lease's term: a dead node's sessions move after at most this long.
    pub term: Duration,
    /// What the node tells the others about itself.
    pub info: NodeInfo,
    /// How often the node sweeps for orphaned sessions and polls what a missed
    /// notification would have told it.
    pub sweep: Duration,
}

/// Where a session runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement {
    /// On this node, under `lease`. `acquired`: the lease was just taken, so
    /// whatever the session's journal holds from before is this node's to
    /// adopt (requeue what never started, interrupt what was running).
    Here { lease: Lease, acquired: bool },
    /// On `node`, which holds the session's lease.
    Elsewhere { node: NodeId },
}

/// This node's view of the cluster. Shared as `Arc<ClusterNode>`.
#[derive(Debug)]
pub struct ClusterNode {
    cluster: Cluster,
    fences: Fences,
    settings: ClusterSettings,
    keeper: LeaseKeeper,
    notices: broadcast::Sender<Notice>,
    /// The session leases this node holds.
    sessions: Mutex<HashMap<String, Lease>>,
}

impl ClusterNode {
    /// Joins the cluster in `store`'s database: registers the node, starts
    /// keeping its leases and listening, and turns fencing on in the store.
    /// Everything it starts stops when `token` is cancelled.
    ///
    /// # Errors
    /// [`ClusterError`] when the node cannot be registered.
    pub async fn start(
        store: &PostgresStore,
        settings: ClusterSettings,
        tracker: &TaskTracker,
        token: CancellationToken,
    ) -> Result<Arc<ClusterNode>, ClusterError> {
        let cluster = Cluster::new(store.pool().clone(), settings.node.clone());
        cluster.register_node(&settings.info).await?;
        let fences = store.fences().clone();
        fences.enable(settings.node.as_str());
        let keeper_config = KeeperConfig { term: settings.term, info: settings.info.clone() };
        let keeper = LeaseKeeper::spawn(cluster.clone(), keeper_config, tracker, token.clone());

        let (pg, tls) = store.connection_settings();
        let mut listener = Listener::spawn(pg, tls, &Topic::ALL, tracker, token.clone());
        let (notices, _) = broadcast::channel(NOTICE_QUEUE);
        let fan_out = notices.clone();
        tracker.spawn(async move {
            while let Some(notice) = listener.recv().await {
                let _ = fan_out.send(notice);
            }
        });

        let fenced = keeper.fenced();
        let fence_writes = fences.clone();
        let node_id = settings.node.clone();
        let stop = token.clone();
        tracker.spawn(async move {
            tokio::select! {
                () = fenced.cancelled() => {
                    fence_writes.fence_all();
                    tracing::error!(node = %node_id, "cluster node fenced: its leases could not be renewed in time; it writes nothing more");
                }
                () = stop.cancelled() => {}
            }
        });
        tracing::info!(node = %settings.node, term_ms = settings.term.as_millis(), "joined the cluster");
        Ok(Arc::new(ClusterNode {
            cluster,
            fences,
            settings,
            keeper,
            notices,
            sessions: Mutex::new(HashMap::new()),
        }))
    }

    /// The coordination handle.
    pub fn cluster(&self) -> &Cluster {
        &self.cluster
    }

    /// This node's id.
    pub fn id(&self) -> &NodeId {
        self.cluster.node()
    }

    pub fn settings(&self) -> &ClusterSettings {
        &self.settings
    }

    /// The store's fences.
    pub fn fences(&self) -> &Fences {
        &self.fences
    }

    /// Cancelled once the node is fenced: stop every engine, write nothing.
    pub fn fenced(&self) -> CancellationToken {
        self.keeper.fenced()
    }

    /// Waits until the node may begin work under its leases (see
    /// [`LeaseKeeper::live`]); `false` once it is fenced.
    pub async fn leases_live(&self) -> bool {
        self.keeper.live().await
    }

    /// Whether the node is fenced.
    pub fn is_fenced(&self) -> bool {
        self.keeper.fenced().is_cancelled()
    }

    /// Every notification from now on. A receiver that lags (or sees
    /// [`Notice::Resync`]) may have missed some: it reads the tables again.
    pub fn subscribe(&self) -> broadcast::Receiver<Notice> {
        self.notices.subscribe()
    }

    fn sessions(&self) -> MutexGuard<'_, HashMap<String, Lease>> {
        self.sessions.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The lease this node holds on session `key`, if it still believes it
    /// holds one (the database is the truth; fenced writes check it there).
    pub fn session_lease(&self, key: &str) -> Option<Lease> {
        let lease = self.sessions().get(key).cloned()?;
        if self.cluster.holds(&lease) {
            return Some(lease);
        }
        self.sessions().remove(key);
        self.fences.set_session(key, None);
        None
    }

    /// How many sessions this node holds.
    pub fn sessions_held(&self) -> usize {
        self.sessions().len()
    }

    /// The keys of the sessions this node holds.
    pub fn held_sessions(&self) -> Vec<String> {
        self.sessions().keys().cloned().collect()
    }

    /// Where session `key` runs: here when this node holds its lease or could
    /// take it (free, released or lapsed), else on its owner.
    ///
    /// # Errors
    /// [`ClusterError`] when the database could not say; the caller refuses
    /// the request then.
    pub async fn place_session(&self, key: &str) -> Result<Placement, ClusterError> {
        if let Some(lease) = self.session_lease(key) {
            return Ok(Placement::Here { lease, acquired: false });
        }
        if self.is_fenced() {
            return Err(ClusterError::Fenced { key: key.to_owned(), epoch: 0 });
        }
        // The owner may let the session go between the two statements: look
        // again then.
        for _ in 0..3 {
            if let Some(lease) = self.cluster.acquire_session(key, self.settings.term).await? {
                self.fences.set_session(key, Some(lease.epoch));
                self.sessions().insert(key.to_owned(), lease.clone());
                return Ok(Placement::Here { lease, acquired: true });
            }
            match self.cluster.owner_of(LeaseKind::Session, key).await? {
                Some(owner) if owner.live && &owner.node != self.id() => {
                    return Ok(Placement::Elsewhere { node: owner.node });
                }
                _ => continue,
            }
        }
        Err(ClusterError::Unavailable {
            message: format!("session {key:?} changed hands three times while placing it"),
        })
    }

    /// Gives session `key` up (it has no work left here), so the next request
    /// for it runs wherever it arrives.
    pub async fn release_session(&self, key: &str) {
        let Some(lease) = self.sessions().remove(key) else { return };
        self.fences.set_session(key, None);
        if let Err(error) = self.cluster.release_session(&lease).await {
            tracing::debug!(%error, session_key = key, "session lease not released; it lapses");
        }
    }

    /// Gives every session up, at a planned stop once the node's runs have
    /// ended and its writes are durable: the other nodes adopt what the
    /// journal still holds for them at their next sweep instead of waiting
    /// for the leases to lapse. Returns how many were given up.
    pub async fn release_all_sessions(&self) -> usize {
        let keys = self.held_sessions();
        for key in &keys {
            self.release_session(key).await;
        }
        keys.len()
    }

    /// Tells `owner` that a request for session `session_key` waits in the
    /// journal for it. Only a hint: owners also sweep.
    ///
    /// # Errors
    /// [`ClusterError`] when the notification could not be sent.
    pub async fn hand_off(&self, owner: &NodeId, session_key: &str) -> Result<(), ClusterError> {
        let payload = format!("{owner}\t{session_key}");
        self.cluster
            .with_client(async |client| {
                client
                    .execute("SELECT pg_notify($1, $2)", &[&Topic::Handoff.channel(), &payload])
                    .await?;
                Ok::<_, ClusterError>(())
            })
            .await
    }

    /// Journaled requests, as `(session key, run id)`, whose session has no
    /// live owner (never leased, released, or lapsed) or whose lease names
    /// this node (held now, or by an earlier life of a node with this id), up
    /// to `limit`, after taking back the slots of runs whose session lease
    /// lapsed. Any node may take the ownerless sessions over; the owner adopts
    /// the requests it does not know yet.
    ///
    /// # Errors
    /// [`ClusterError`] when the database could not be read.
    pub async fn journal_candidates(
        &self,
        limit: u32,
    ) -> Result<Vec<(String, String)>, ClusterError> {
        let freed = self.cluster.free_slots_of_expired().await?;
        for slot in &freed {
            tracing::info!(run_id = %slot.run_id, node = %slot.node, slot = slot.slot, "slot of a lapsed session taken back");
        }
        self.cluster
            .with_client(async |client| {
                let rows = client
                    .query(
                        "SELECT j.session_key, j.run_id FROM journal j
                         LEFT JOIN session_leases l ON l.session_key = j.session_key
                         WHERE l.session_key IS NULL OR l.released_at IS NOT NULL
                            OR l.expires_at <= clock_timestamp() OR l.node_id = $2
                         ORDER BY j.accepted_at_ms, j.seq
                         LIMIT $1",
                        &[&i64::from(limit), &self.id().as_str()],
                    )
                    .await?;
                Ok::<_, ClusterError>(
                    rows.into_iter().map(|row| (row.get(0), row.get(1))).collect(),
                )
            })
            .await
    }

    /// Whether the journal holds a request for session `session_key`.
    ///
    /// # Errors
    /// [`ClusterError`] when the database could not be read.
    pub async fn has_journaled(&self, session_key: &str) -> Result<bool, ClusterError> {
        self.cluster
            .with_client(async |client| {
                let row = client
                    .query_opt(
                        "SELECT 1 FROM journal WHERE session_key = $1 LIMIT 1",
                        &[&session_key],
                    )
                    .await?;
                Ok::<_, ClusterError>(row.is_some())
            })
            .await
    }

    /// Writes of `run_id` land only under `lease`.
    pub fn register_run(&self, run_id: &str, lease: &Lease) {
        self.fences.register(run_id, &lease.key, lease.epoch);
    }

    /// `run_id` completed and its last write is queued.
    pub fn forget_run(&self, run_id: &str) {
        self.fences.forget(run_id);
    }

    /// Parses a [`Topic::Handoff`] payload: the session key when it is for
    /// this node.
    pub fn handoff_for_me(&self, payload: &str) -> Option<String> {
        let (node, session) = payload.split_once('\t')?;
        (node == self.id().as_str()).then(|| session.to_owned())
    }
}
