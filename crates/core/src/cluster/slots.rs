//! Run slots: the global cap on concurrent runs as rows, and the waiting
//! claims that hand freed slots out in admission order across the cluster.
//!
//! `run_slots` has one row per slot; a run holds a row (its `run_id`, unique)
//! from its claim to its completion, so no more runs than rows can ever run.
//! Rows above a lowered count are `retired`: no claim takes them, and they go
//! when their run frees them.
//!
//! Order: a claim that finds no slot for it leaves a row in `slot_requests`
//! (its admission time and a sequence number) and the caller tries again when
//! a slot is freed (the `lemon_slots` notification, or its polling fallback).
//! A claim may take a free slot only while fewer live claims are older than it
//! than there are free slots, so when slots free one at a time the oldest
//! waiting run gets each. Claims are counted only while their session lease is
//! live at their epoch, so a dead node's claims never hold the queue up. What
//! this cannot order: a claim still inside its first, uncommitted transaction
//! is invisible to the others, and `SKIP LOCKED` lets a newer claim take a slot
//! an older one is about to lock; those are the only out-of-order grants.

use super::listener::Topic;
use super::{Cluster, ClusterError, Lease, LeaseKind, NodeId};

/// The advisory lock that makes concurrent [`Cluster::set_slot_count`] calls
/// take turns.
const SLOT_COUNT_LOCK: i64 = i64::from_be_bytes(*b"lemslots");

/// A slot [`Cluster::free_slots_of_expired`] took back from a run whose session
/// lease lapsed or moved on: the run is for its session's new owner to recover.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FreedSlot {
    pub slot: u32,
    pub run_id: String,
    pub session_key: String,
    pub node: NodeId,
    pub epoch: i64,
}

fn slot_number(slot: i32) -> u32 {
    // The schema refuses negative slots.
    u32::try_from(slot).unwrap_or(0)
}

fn notify_slots() -> String {
    format!("SELECT pg_notify('{}', '')", Topic::Slots.channel())
}

/// A slot granted marks the run's journal entry started in the same
/// transaction: from then on its engine may start, so a node that takes the
/// session over (this one partitioned right after the grant, say) completes
/// it as `interrupted` rather than starting a second engine for it.
const MARK_STARTED: &str = "UPDATE journal SET state = 'started' WHERE run_id = $1";

impl Cluster {
    /// Claims a slot for `run_id` of `lease`'s session, admitted at
    /// `admitted_at_ms` (the database's clock, milliseconds since the Unix
    /// epoch): `Some(slot)` when the run may start, `None` when it must wait
    /// (its claim stays queued; call again when a slot is freed). A run that
    /// already holds a slot gets it back, now under this lease's epoch.
    ///
    /// One transaction, fenced by the lease as [`Cluster::fenced_write`] is: a
    /// stale holder writes nothing.
    ///
    /// # Errors
    /// [`ClusterError::Fenced`], [`ClusterError::RunInOtherSession`],
    /// [`ClusterError::Unavailable`] or [`ClusterError::Database`].
    ///
    /// # Cancel safety
    /// Dropping the future before the commit leaves nothing written; after it,
    /// the slot is held and the next call returns it.
    pub async fn claim_slot(
        &self,
        lease: &Lease,
        run_id: &str,
        admitted_at_ms: i64,
    ) -> Result<Option<u32>, ClusterError> {
        if lease.kind != LeaseKind::Session {
            return Err(ClusterError::Fenced { key: lease.key.clone(), epoch: lease.epoch });
        }
        let node = lease.node.as_str();
        self.with_client(async |client| {
            let tx = client.transaction().await?;
            self.check_fence(&tx, lease).await?;

            let held = tx
                .query_opt(
                    "SELECT slot, session_key FROM run_slots WHERE run_id = $1 FOR UPDATE",
                    &[&run_id],
                )
                .await?;
            if let Some(row) = held {
                let session_key: String = row.get(1);
                if session_key != lease.key {
                    return Err(ClusterError::RunInOtherSession {
                        run_id: run_id.to_owned(),
                        session_key,
                    });
                }
                let slot: i32 = row.get(0);
                tx.execute(
                    "UPDATE run_slots SET node_id = $2, epoch = $3 WHERE slot = $1",
                    &[&slot, &node, &lease.epoch],
                )
                .await?;
                tx.execute("DELETE FROM slot_requests WHERE run_id = $1", &[&run_id]).await?;
                tx.execute(MARK_STARTED, &[&run_id]).await?;
                tx.commit().await?;
                return Ok(Some(slot_number(slot)));
            }

            // The claim joins the queue, or refreshes its place in it: the first
            // admission time and sequence number stay.
            tx.execute(
                "INSERT INTO slot_requests
                    (run_id, session_key, node_id, epoch, admitted_at, requested_at)
                 VALUES ($1, $2, $3, $4, to_timestamp($5::bigint / 1000.0::float8), clock_timestamp())
                 ON CONFLICT (run_id) DO UPDATE SET
                    session_key = EXCLUDED.session_key,
                    node_id = EXCLUDED.node_id,
                    epoch = EXCLUDED.epoch,
                    requested_at = EXCLUDED.requested_at",
                &[&run_id, &lease.key, &node, &lease.epoch, &admitted_at_ms],
            )
            .await?;
            let gate = tx
                .query_one(
                    "SELECT
                        (SELECT count(*) FROM run_slots WHERE run_id IS NULL AND NOT retired),
                        (SELECT count(*) FROM slot_requests r
                         JOIN session_leases l ON l.session_key = r.session_key
                            AND l.node_id = r.node_id AND l.epoch = r.epoch
                         WHERE l.released_at IS NULL AND l.expires_at > clock_timestamp()
                           AND (r.admitted_at, r.seq)
                             < (SELECT admitted_at, seq FROM slot_requests WHERE run_id = $1))",
                    &[&run_id],
                )
                .await?;
            let (free, older): (i64, i64) = (gate.get(0), gate.get(1));
            if older >= free {
                tx.commit().await?;
                return Ok(None);
            }
            let taken = tx
                .query_opt(
                    "UPDATE run_slots SET run_id = $1, session_key = $2, node_id = $3, epoch = $4,
                        admitted_at = (SELECT admitted_at FROM slot_requests WHERE run_id = $1),
                        claimed_at = clock_timestamp()
                     WHERE run_id IS NULL AND slot = (
                        SELECT slot FROM run_slots WHERE run_id IS NULL AND NOT retired
                        ORDER BY slot LIMIT 1 FOR UPDATE SKIP LOCKED)
                     RETURNING slot",
                    &[&run_id, &lease.key, &node, &lease.epoch],
                )
                .await?;
            let Some(taken) = taken else {
                // Every free slot is being taken right now; the claim stays queued.
                tx.commit().await?;
                return Ok(None);
            };
            tx.execute("DELETE FROM slot_requests WHERE run_id = $1", &[&run_id]).await?;
            tx.execute(MARK_STARTED, &[&run_id]).await?;
            tx.commit().await?;
            Ok(Some(slot_number(taken.get(0))))
        })
        .await
    }

    /// Frees `run_id`'s slot (its completion), or withdraws its waiting claim
    /// (cancelled before it started), fenced by `lease`. Returns whether there
    /// was either. A run that finishes or is cancelled must call this, or its
    /// claim holds the queue up for as long as the session's lease lives.
    ///
    /// # Errors
    /// [`ClusterError::Fenced`] (nothing freed), [`ClusterError::Unavailable`]
    /// or [`ClusterError::Database`].
    ///
    /// # Cancel safety
    /// Dropping the future before the commit leaves the slot held.
    pub async fn free_slot(&self, lease: &Lease, run_id: &str) -> Result<bool, ClusterError> {
        if lease.kind != LeaseKind::Session {
            return Err(ClusterError::Fenced { key: lease.key.clone(), epoch: lease.epoch });
        }
        self.with_client(async |client| {
            let tx = client.transaction().await?;
            self.check_fence(&tx, lease).await?;
            let freed = tx
                .query_opt(
                    "UPDATE run_slots SET run_id = NULL, session_key = NULL, node_id = NULL,
                        epoch = NULL, admitted_at = NULL, claimed_at = NULL
                     WHERE run_id = $1 AND session_key = $2
                     RETURNING slot",
                    &[&run_id, &lease.key],
                )
                .await?;
            if let Some(row) = &freed {
                let slot: i32 = row.get(0);
                tx.execute("DELETE FROM run_slots WHERE slot = $1 AND retired", &[&slot]).await?;
                tx.batch_execute(&notify_slots()).await?;
            }
            let withdrawn = tx
                .execute(
                    "DELETE FROM slot_requests WHERE run_id = $1 AND session_key = $2",
                    &[&run_id, &lease.key],
                )
                .await?;
            tx.commit().await?;
            Ok(freed.is_some() || withdrawn > 0)
        })
        .await
    }

    /// Frees every slot held under a session lease that is no longer live at
    /// the slot's epoch (it lapsed, was released or was taken over), and drops
    /// the queued claims made under such leases; returns the freed slots, for
    /// the sessions' new owners to recover those runs. Slots being claimed or
    /// freed right now are left for the next call.
    ///
    /// # Errors
    /// [`ClusterError::Unavailable`] or [`ClusterError::Database`].
    ///
    /// # Cancel safety
    /// Dropping the future before the commit frees nothing.
    pub async fn free_slots_of_expired(&self) -> Result<Vec<FreedSlot>, ClusterError> {
        self.with_client(async |client| {
            let tx = client.transaction().await?;
            let rows = tx
                .query(
                    "WITH dead AS (
                        SELECT slot, run_id, session_key, node_id, epoch FROM run_slots s
                        WHERE run_id IS NOT NULL AND NOT EXISTS (
                            SELECT 1 FROM session_leases l
                            WHERE l.session_key = s.session_key AND l.node_id = s.node_id
                              AND l.epoch = s.epoch AND l.released_at IS NULL
                              AND l.expires_at > clock_timestamp())
                        FOR UPDATE SKIP LOCKED
                     ), freed AS (
                        UPDATE run_slots s SET run_id = NULL, session_key = NULL, node_id = NULL,
                            epoch = NULL, admitted_at = NULL, claimed_at = NULL
                        FROM dead WHERE s.slot = dead.slot
                     )
                     SELECT slot, run_id, session_key, node_id, epoch FROM dead ORDER BY slot",
                    &[],
                )
                .await?;
            tx.execute("DELETE FROM run_slots WHERE retired AND run_id IS NULL", &[]).await?;
            tx.execute(
                "DELETE FROM slot_requests r WHERE NOT EXISTS (
                    SELECT 1 FROM session_leases l
                    WHERE l.session_key = r.session_key AND l.node_id = r.node_id
                      AND l.epoch = r.epoch AND l.released_at IS NULL
                      AND l.expires_at > clock_timestamp())",
                &[],
            )
            .await?;
            if !rows.is_empty() {
                tx.batch_execute(&notify_slots()).await?;
            }
            tx.commit().await?;
            Ok(rows
                .into_iter()
                .map(|row| FreedSlot {
                    slot: slot_number(row.get(0)),
                    run_id: row.get(1),
                    session_key: row.get(2),
                    node: NodeId::from_db(row.get(3)),
                    epoch: row.get(4),
                })
                .collect())
        })
        .await
    }

    /// Makes the cluster's cap `n` slots (`max_concurrent_runs`, from the
    /// cluster config). Growing adds free slots at once; shrinking removes the
    /// free slots above `n` and retires the occupied ones, which go when their
    /// runs free them. Returns how many occupied slots are left above `n`.
    ///
    /// # Errors
    /// [`ClusterError::Unavailable`] or [`ClusterError::Database`].
    ///
    /// # Cancel safety
    /// Dropping the future before the commit changes nothing.
    pub async fn set_slot_count(&self, n: u32) -> Result<u32, ClusterError> {
        let n = i32::try_from(n).unwrap_or(i32::MAX);
        self.with_client(async |client| {
            let tx = client.transaction().await?;
            tx.execute("SELECT pg_advisory_xact_lock($1)", &[&SLOT_COUNT_LOCK]).await?;
            tx.execute(
                "INSERT INTO run_slots (slot) SELECT generate_series(0, $1 - 1)
                 ON CONFLICT (slot) DO UPDATE SET retired = false WHERE run_slots.retired",
                &[&n],
            )
            .await?;
            tx.execute("DELETE FROM run_slots WHERE slot >= $1 AND run_id IS NULL", &[&n]).await?;
            tx.execute(
                "UPDATE run_slots SET retired = true WHERE slot >= $1 AND NOT retired",
                &[&n],
            )
            .await?;
            let draining: i64 =
                tx.query_one("SELECT count(*) FROM run_slots WHERE retired", &[]).await?.get(0);
            tx.batch_execute(&notify_slots()).await?;
            tx.commit().await?;
            Ok(u32::try_from(draining).unwrap_or(u32::MAX))
        })
        .await
    }

    /// How many slots runs hold now, across the cluster (retired ones too).
    ///
    /// # Errors
    /// [`ClusterError::Unavailable`] or [`ClusterError::Database`].
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn slots_in_use(&self) -> Result<u32, ClusterError> {
        self.with_client(async |client| {
            let n: i64 = client
                .query_one("SELECT count(*) FROM run_slots WHERE run_id IS NOT NULL", &[])
                .await?
                .get(0);
            Ok(u32::try_from(n).unwrap_or(u32::MAX))
        })
        .await
    }
}
