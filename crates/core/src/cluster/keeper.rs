//! The task that keeps a node's leases: it renews them all (and heartbeats)
//! every third of the lease term and, when it has not renewed for two thirds
//! of the term, fences the node.
//!
//! Why two thirds: a lease lapses one term after the database last extended
//! it. The keeper counts from the moment it *sent* its last successful
//! renewal, which is no later than the moment the database extended the
//! leases, so fencing at two thirds of the term leaves the node a third of the
//! term (by its own clock) to stop its engines before any other node may take
//! a session over. Once fenced, the node forgets its leases: none of them is
//! renewed again, and acquiring one again takes a new epoch.
//!
//! The same two thirds bound what the node may still begin: a process that
//! was stopped (`SIGSTOP`, a VM paused) and resumes finds its last renewal
//! older than that before the keeper has run again, and starts no engine
//! until a renewal succeeds or the node is fenced ([`LeaseKeeper::live`]).

use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::{broadcast, watch};
use tokio::time::{sleep_until, timeout_at, Instant};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::{Cluster, ClusterError, LostLease, NodeInfo, RenewReport};

/// Lost-lease notices waiting for a slow subscriber before it lags.
const LOST_QUEUE: usize = 256;

/// How a [`LeaseKeeper`] keeps a node's leases.
#[derive(Debug, Clone)]
pub struct KeeperConfig {
    /// The term every lease is renewed for; the keeper renews every third of
    /// it and fences the node after two thirds without a renewal.
    pub term: Duration,
    /// What the node registers again with if its row went missing.
    pub info: NodeInfo,
}

/// The handle of the task that renews a node's leases.
#[derive(Debug, Clone)]
pub struct LeaseKeeper {
    fenced: CancellationToken,
    lost: broadcast::Sender<LostLease>,
    /// Until when the last successful renewal lets the node begin work.
    good_until: watch::Receiver<Instant>,
}

impl LeaseKeeper {
    /// Starts keeping `cluster`'s leases until `token` is cancelled (which
    /// does not fence) or the node is fenced. Start it before acquiring the
    /// first lease.
    pub fn spawn(
        cluster: Cluster,
        config: KeeperConfig,
        tracker: &TaskTracker,
        token: CancellationToken,
    ) -> LeaseKeeper {
        let renewer = ClusterRenewer { cluster, info: config.info };
        Self::spawn_with(renewer, config.term, tracker, token)
    }

    pub(super) fn spawn_with(
        renewer: impl Renewer,
        term: Duration,
        tracker: &TaskTracker,
        token: CancellationToken,
    ) -> LeaseKeeper {
        let fenced = CancellationToken::new();
        let (lost, _) = broadcast::channel(LOST_QUEUE);
        // Started before the first lease: what the node holds is as fresh as
        // its start until the first renewal says more.
        let (renewed, good_until) = watch::channel(Instant::now() + term * 2 / 3);
        let keeper =
            Keeper { renewer, term, token, fenced: fenced.clone(), lost: lost.clone(), renewed };
        tracker.spawn(keeper.run());
        LeaseKeeper { fenced, lost, good_until }
    }

    /// Waits until the node may begin work under its leases: `true` at once
    /// while its last renewal is younger than two thirds of the term, else
    /// once a renewal succeeds; `false` once the node is fenced.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn live(&self) -> bool {
        let mut good_until = self.good_until.clone();
        loop {
            if self.fenced.is_cancelled() {
                return false;
            }
            if Instant::now() < *good_until.borrow_and_update() {
                return true;
            }
            tokio::select! {
                () = self.fenced.cancelled() => return false,
                changed = good_until.changed() => {
                    if changed.is_err() {
                        // The keeper stopped (shutdown): nothing renews any more.
                        return false;
                    }
                }
            }
        }
    }

    /// Cancelled when the node could not renew its leases in time: it must
    /// stop its engines and write nothing more under any lease it held.
    pub fn fenced(&self) -> CancellationToken {
        self.fenced.clone()
    }

    /// Leases a renewal found lost (lapsed, released or taken over): whatever
    /// runs under them must stop. A subscriber that lags asks
    /// [`Cluster::holds`] about each lease it has.
    pub fn subscribe_lost(&self) -> broadcast::Receiver<LostLease> {
        self.lost.subscribe()
    }
}

/// What the keeper does with the database; a fake in the timing tests.
#[async_trait]
pub(super) trait Renewer: Send + Sync + 'static {
    async fn renew_all(&self, term: Duration) -> Result<RenewReport, ClusterError>;
    async fn heartbeat(&self) -> Result<(), ClusterError>;
    /// The node is fenced: forget every lease.
    fn fence(&self);
}

struct ClusterRenewer {
    cluster: Cluster,
    info: NodeInfo,
}

#[async_trait]
impl Renewer for ClusterRenewer {
    async fn renew_all(&self, term: Duration) -> Result<RenewReport, ClusterError> {
        self.cluster.renew_all(term).await
    }

    async fn heartbeat(&self) -> Result<(), ClusterError> {
        match self.cluster.heartbeat().await {
            Err(ClusterError::NotRegistered { .. }) => self.cluster.register_node(&self.info).await,
            other => other.map(drop),
        }
    }

    fn fence(&self) {
        self.cluster.forget_all();
    }
}

/// The keeping task.
struct Keeper<R> {
    renewer: R,
    term: Duration,
    /// Shutdown: stop renewing, without fencing.
    token: CancellationToken,
    /// Cancelled by this task, once, when it fences the node.
    fenced: CancellationToken,
    lost: broadcast::Sender<LostLease>,
    renewed: watch::Sender<Instant>,
}

impl<R: Renewer> Keeper<R> {
    async fn run(self) {
        let every = self.term / 3;
        let grace = self.term * 2 / 3;
        let mut deadline = Instant::now() + grace;
        loop {
            let attempt = Instant::now();
            let renewed = tokio::select! {
                () = self.token.cancelled() => return,
                r = timeout_at(deadline, self.renewer.renew_all(self.term)) => r,
            };
            match renewed {
                Ok(Ok(report)) => {
                    deadline = attempt + grace;
                    self.renewed.send_replace(deadline);
                    for lost in report.lost {
                        tracing::warn!(kind = lost.kind.as_str(), key = %lost.key, epoch = lost.epoch, "lease lost");
                        let _ = self.lost.send(lost);
                    }
                }
                Ok(Err(e)) => tracing::warn!(error = %e, "lease renewal failed"),
                Err(_) => tracing::warn!("lease renewal did not finish in time"),
            }
            if Instant::now() >= deadline {
                tracing::error!(
                    term_ms = self.term.as_millis() as u64,
                    "leases not renewed within two thirds of their term: node fenced"
                );
                self.renewer.fence();
                self.fenced.cancel();
                return;
            }
            let next = (attempt + every).min(deadline);
            let beat = tokio::select! {
                () = self.token.cancelled() => return,
                r = timeout_at(next, self.renewer.heartbeat()) => r,
            };
            if let Ok(Err(e)) = beat {
                tracing::warn!(error = %e, "heartbeat failed");
            }
            tokio::select! {
                () = self.token.cancelled() => return,
                () = sleep_until(next) => {}
            }
        }
    }
}
