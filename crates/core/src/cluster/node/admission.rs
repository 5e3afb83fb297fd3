//! A run's slot, claimed before its engine starts and freed when it ends.
//!
//! In cluster mode a run the local scheduler granted a slot also needs one of
//! the cluster's `run_slots` rows ([`Cluster::claim_slot`]), claimed under its
//! session's lease so that a node that lost the session cannot hold a slot for
//! it. A run that finds none waits, its claim queued in admission order, and
//! tries again when a slot is freed (a [`Topic::Slots`] notice, a resync, or
//! every sweep when notices are missed). Its slot is freed when it ends; a
//! slot that cannot be freed then (the database is down) is freed in the
//! background, and the slots of a dead node's runs are taken back by the
//! other nodes' sweeps ([`Cluster::free_slots_of_expired`]).
//!
//! [`Cluster::claim_slot`]: crate::cluster::Cluster::claim_slot
//! [`Cluster::free_slots_of_expired`]: crate::cluster::Cluster::free_slots_of_expired

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::broadcast::{self, error::RecvError};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::ClusterNode;
use crate::clock::now_ms;
use crate::cluster::{sql_ms, ClusterError, Lease, Notice, Topic};

/// The first wait before trying again after a database error; each next one
/// is twice as long, up to [`RETRY_MAX`].
const RETRY_FIRST: Duration = Duration::from_millis(100);
/// The longest wait between two attempts.
const RETRY_MAX: Duration = Duration::from_secs(5);
/// How long a run's end waits for its slot to be freed before leaving it to
/// the background, so a database that hangs does not hold the completion up.
const FREE_INLINE: Duration = Duration::from_secs(2);

/// A cluster slot a run holds, under its session's lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotHeld {
    pub lease: Lease,
    pub slot: u32,
}

/// Why a run got no cluster slot.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdmissionError {
    /// This node no longer holds the run's session.
    #[error("the session moved to another node")]
    SessionMoved,
    /// The session's lease was lost (lapsed or taken over) while the run
    /// waited.
    #[error("the session moved to another node: {0}")]
    LeaseLost(ClusterError),
    /// The run was cancelled while it waited; its claim is withdrawn.
    #[error("cancelled while waiting for a run slot")]
    Cancelled,
    /// The database refused the claim.
    #[error("no run slot: {0}")]
    Cluster(ClusterError),
}

/// Whether an error of a claim or a free is worth trying again: the database
/// was out of reach, or it rolled the transaction back (a serialization
/// failure, a deadlock).
fn transient(error: &ClusterError) -> bool {
    match error {
        ClusterError::Unavailable { .. } => true,
        ClusterError::Database { code, .. } => code.starts_with("40"),
        _ => false,
    }
}

fn next_backoff(backoff: Duration) -> Duration {
    (backoff * 2).min(RETRY_MAX)
}

/// Returns once a slot may have been freed: a [`Topic::Slots`] notice, a
/// resync or a lag (notices were missed), or `sweep` passed.
async fn slot_freed(notices: &mut broadcast::Receiver<Notice>, sweep: Duration) {
    let poll = tokio::time::sleep(sweep);
    tokio::pin!(poll);
    loop {
        tokio::select! {
            () = &mut poll => return,
            notice = notices.recv() => match notice {
                Ok(Notice::Notified { topic: Topic::Slots, .. } | Notice::Resync)
                | Err(RecvError::Lagged(_)) => return,
                Ok(Notice::Notified { .. }) => {}
                Err(RecvError::Closed) => {
                    // Nothing more will be heard: poll.
                    (&mut poll).await;
                    return;
                }
            },
        }
    }
}

impl ClusterNode {
    /// Claims a cluster slot for run `run_id` of session `session_key`,
    /// accepted at `accepted_at_ms` (this node's clock; the claim is ordered
    /// by it translated to the database's), waiting as long as every slot is
    /// taken. Database errors worth retrying are retried with a backoff.
    ///
    /// When `cancel` is cancelled while the run waits, its claim is withdrawn
    /// (in the background on `tracker` until `stop`, if the database is out of
    /// reach now) and [`AdmissionError::Cancelled`] returned.
    ///
    /// # Errors
    /// [`AdmissionError`]: the session is not this node's (any more), the
    /// run was cancelled, or the database refused the claim.
    pub async fn claim_slot_for(
        self: &Arc<Self>,
        session_key: &str,
        run_id: &str,
        accepted_at_ms: i64,
        cancel: &CancellationToken,
        tracker: &TaskTracker,
        stop: &CancellationToken,
    ) -> Result<SlotHeld, AdmissionError> {
        let Some(lease) = self.session_lease(session_key) else {
            return Err(AdmissionError::SessionMoved);
        };
        // Subscribed before the first claim: a slot freed after it is heard.
        let mut notices = self.subscribe();
        let sweep = self.settings.sweep;
        let mut admitted_at_ms = None;
        let mut backoff = RETRY_FIRST;
        loop {
            let attempt = async {
                let admitted = match admitted_at_ms {
                    Some(ms) => ms,
                    None => self.database_time_of(accepted_at_ms).await?,
                };
                admitted_at_ms = Some(admitted);
                self.cluster.claim_slot(&lease, run_id, admitted).await
            };
            let claimed = tokio::select! {
                biased;
                () = cancel.cancelled() => None,
                claimed = attempt => Some(claimed),
            };
            let Some(claimed) = claimed else {
                // Withdrawn, with the slot an attempt cut short may have taken.
                self.free_slot_of(&lease, run_id, tracker, stop).await;
                return Err(AdmissionError::Cancelled);
            };
            let error = match claimed {
                Ok(Some(slot)) => {
                    tracing::debug!(run_id, slot, session_key, "run slot claimed");
                    return Ok(SlotHeld { lease, slot });
                }
                Ok(None) => {
                    backoff = RETRY_FIRST;
                    tokio::select! {
                        () = cancel.cancelled() => {}
                        () = slot_freed(&mut notices, sweep) => {}
                    }
                    continue;
                }
                Err(error) => error,
            };
            if transient(&error) {
                tracing::warn!(%error, run_id, "run slot claim failed; trying again");
                tokio::select! {
                    () = cancel.cancelled() => {}
                    () = tokio::time::sleep(backoff) => {}
                }
                backoff = next_backoff(backoff);
                continue;
            }
            // A claim may be queued from an earlier attempt.
            self.free_slot_of(&lease, run_id, tracker, stop).await;
            return Err(match error {
                ClusterError::Fenced { .. } => AdmissionError::LeaseLost(error),
                other => AdmissionError::Cluster(other),
            });
        }
    }

    /// Frees `run_id`'s slot (the run ended) or withdraws its waiting claim,
    /// under `lease`. When the database cannot be reached now the slot is
    /// freed in the background on `tracker`, until it is, the lease is no
    /// longer this node's (the slot is then taken back by a sweep), the node
    /// is fenced, or `stop` is cancelled. A fenced node frees nothing: it
    /// writes nothing more, and its slots are taken back once its leases
    /// lapse.
    pub async fn free_slot_of(
        self: &Arc<Self>,
        lease: &Lease,
        run_id: &str,
        tracker: &TaskTracker,
        stop: &CancellationToken,
    ) {
        if self.is_fenced() {
            return;
        }
        let first = tokio::time::timeout(FREE_INLINE, self.cluster.free_slot(lease, run_id)).await;
        let error = match first {
            Ok(Ok(_)) => return,
            Ok(Err(error)) if !transient(&error) => {
                // Fenced: the lease is gone, and its slot with it at the next sweep.
                tracing::debug!(%error, run_id, "run slot not freed; a sweep takes it back");
                return;
            }
            Ok(Err(error)) => error,
            Err(_) => ClusterError::Unavailable {
                message: "the database did not answer in time".to_owned(),
            },
        };
        tracing::warn!(%error, run_id, "run slot not freed; trying again in the background");
        let node = self.clone();
        let (lease, run_id, stop) = (lease.clone(), run_id.to_owned(), stop.clone());
        tracker.spawn(async move {
            let fenced = node.fenced();
            let mut backoff = RETRY_FIRST;
            loop {
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = fenced.cancelled() => return,
                    () = tokio::time::sleep(backoff) => {}
                }
                if !node.cluster.holds(&lease) {
                    return;
                }
                match node.cluster.free_slot(&lease, &run_id).await {
                    Ok(_) => {
                        tracing::info!(run_id, "run slot freed");
                        return;
                    }
                    Err(error) if transient(&error) => backoff = next_backoff(backoff),
                    Err(error) => {
                        tracing::debug!(%error, run_id, "run slot not freed; a sweep takes it back");
                        return;
                    }
                }
            }
        });
    }

    /// `local_ms` (this node's clock) by the database's clock: shifted by how
    /// far the two clocks are apart now.
    async fn database_time_of(&self, local_ms: i64) -> Result<i64, ClusterError> {
        let asked = Instant::now();
        let before = now_ms();
        let database_ms: i64 = self
            .cluster
            .with_client(async |client| {
                let row =
                    client.query_one(concat!("SELECT ", sql_ms!("clock_timestamp()")), &[]).await?;
                Ok::<_, ClusterError>(row.get(0))
            })
            .await?;
        // The database read its clock about halfway through the round trip.
        let half_trip = i64::try_from(asked.elapsed().as_millis() / 2).unwrap_or(0);
        Ok(local_ms + (database_ms - (before + half_trip)))
    }
}
