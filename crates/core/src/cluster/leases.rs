//! Session and channel leases: acquiring, renewing all of a node's at once,
//! releasing, who owns what, and the transaction fenced by a lease.
//!
//! One lease row per key (`session_leases`, `channel_leases`), never deleted:
//! a release or a lapse leaves the row, so the next holder's epoch is one more
//! than the last one's and a stale holder's epoch never matches again.
//!
//! Locks: a fenced transaction holds its lease row `FOR KEY SHARE`. Renewing
//! only moves `expires_at`, which does not conflict with that lock, so renewals
//! never wait for a node's own writes. A takeover changes `epoch`, which is a
//! key column (the `(key, epoch)` unique index), so it takes the row's
//! exclusive lock and waits until every write fenced by the old epoch has
//! committed or rolled back: nothing fenced by the old epoch lands after the
//! new holder starts.

use std::collections::HashMap;
use std::sync::{MutexGuard, PoisonError};
use std::time::Duration;

use deadpool_postgres::Transaction;

use super::{millis, sql_ms, Cluster, ClusterError, Lease, LeaseKind, NodeId};

/// A lease this node renewed, or believed it held and has not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenewReport {
    /// Every lease still held, with its new expiry.
    pub renewed: Vec<Lease>,
    /// Leases this node held that lapsed, were taken over or released
    /// elsewhere: whatever runs under them must stop.
    pub lost: Vec<LostLease>,
}

/// A lease [`Cluster::renew_all`] could not renew.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LostLease {
    pub kind: LeaseKind,
    pub key: String,
    pub epoch: i64,
}

/// Who holds a key, as the lease row says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseOwner {
    pub node: NodeId,
    pub epoch: i64,
    /// Neither released nor lapsed, by the database's clock.
    pub live: bool,
    pub expires_at_ms: i64,
}

/// A session lease that lapsed without being released: its node stopped
/// renewing, and another node should take the session over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StaleLease {
    pub key: String,
    pub node: NodeId,
    pub epoch: i64,
    pub expired_at_ms: i64,
}

/// The table and key column of a kind of lease.
fn table(kind: LeaseKind) -> (&'static str, &'static str) {
    match kind {
        LeaseKind::Session => ("session_leases", "session_key"),
        LeaseKind::Channel => ("channel_leases", "channel"),
    }
}

impl Cluster {
    pub(super) fn held(&self) -> MutexGuard<'_, HashMap<(LeaseKind, String), i64>> {
        self.inner.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Forgets every lease this node believes it holds: after it was fenced,
    /// none of them may be renewed, and acquiring one again takes a new epoch.
    pub(super) fn forget_all(&self) {
        self.held().clear();
    }

    /// Whether this node still believes it holds `lease` at its epoch (the
    /// last renewal did not report it lost). The database is the truth: a
    /// fenced write checks it there.
    pub fn holds(&self, lease: &Lease) -> bool {
        self.held().get(&(lease.kind, lease.key.clone())) == Some(&lease.epoch)
    }

    /// Acquires session `key` for `term`: a new lease at epoch 1, a lapsed or
    /// released one taken over at its epoch plus one, or this node's own
    /// renewed at the same epoch. `None` while another node holds it.
    ///
    /// # Errors
    /// [`ClusterError::Unavailable`] or [`ClusterError::Database`].
    ///
    /// # Cancel safety
    /// Not cancel safe: dropped after the database answered, the lease is held
    /// in the database but this node does not know it (it lapses after `term`).
    pub async fn acquire_session(
        &self,
        key: &str,
        term: Duration,
    ) -> Result<Option<Lease>, ClusterError> {
        self.acquire(LeaseKind::Session, key, term).await
    }

    /// Acquires the single-consumer channel `name` for `term`, as
    /// [`Cluster::acquire_session`] does a session. Only nodes that have the
    /// channel's secret should ask.
    ///
    /// # Errors
    /// [`ClusterError::Unavailable`] or [`ClusterError::Database`].
    ///
    /// # Cancel safety
    /// As [`Cluster::acquire_session`].
    pub async fn acquire_channel(
        &self,
        name: &str,
        term: Duration,
    ) -> Result<Option<Lease>, ClusterError> {
        self.acquire(LeaseKind::Channel, name, term).await
    }

    async fn acquire(
        &self,
        kind: LeaseKind,
        key: &str,
        term: Duration,
    ) -> Result<Option<Lease>, ClusterError> {
        let (t, k) = table(kind);
        // The epoch this node holds the key at, or 0 (never an epoch): only
        // that epoch, still live, is renewed in place; anything else this node
        // finds under its own id is a previous run's and gets a new epoch.
        let held_epoch = self.held().get(&(kind, key.to_owned())).copied().unwrap_or(0);
        let same = format!(
            "{t}.node_id = $2 AND {t}.epoch = $4 AND {t}.released_at IS NULL
             AND {t}.expires_at > clock_timestamp()"
        );
        // Take the row over (or renew it) when it is free or this node's, or
        // else insert it. Not `INSERT .. ON CONFLICT DO UPDATE`: a racing
        // insert would conflict on the `(key, epoch)` index too, which only a
        // target-less `DO NOTHING` absorbs.
        let sql = format!(
            "WITH taken AS (
                UPDATE {t} SET
                    epoch = CASE WHEN {same} THEN epoch ELSE epoch + 1 END,
                    acquired_at = CASE WHEN {same} THEN acquired_at ELSE clock_timestamp() END,
                    node_id = $2,
                    expires_at = clock_timestamp() + $3::bigint * interval '1 millisecond',
                    released_at = NULL
                WHERE {k} = $1 AND (node_id = $2 OR released_at IS NOT NULL
                    OR expires_at <= clock_timestamp())
                RETURNING epoch, expires_at
             ), inserted AS (
                INSERT INTO {t} ({k}, node_id, epoch, acquired_at, expires_at)
                SELECT $1, $2, 1, clock_timestamp(),
                    clock_timestamp() + $3::bigint * interval '1 millisecond'
                WHERE NOT EXISTS (SELECT 1 FROM taken)
                ON CONFLICT DO NOTHING
                RETURNING epoch, expires_at
             )
             SELECT epoch, {expires} FROM taken
             UNION ALL SELECT epoch, {expires} FROM inserted",
            expires = sql_ms!("expires_at"),
        );
        self.with_client(async |client| {
            let row = client
                .query_opt(&sql, &[&key, &self.node().as_str(), &millis(term), &held_epoch])
                .await?;
            let Some(row) = row else { return Ok(None) };
            let lease = Lease {
                kind,
                key: key.to_owned(),
                node: self.node().clone(),
                epoch: row.get(0),
                expires_at_ms: row.get(1),
                term,
            };
            self.held().insert((kind, key.to_owned()), lease.epoch);
            Ok(Some(lease))
        })
        .await
    }

    /// Renews every lease this node holds, sessions and channels, in one
    /// statement, for `term` from now by the database's clock. A lease that
    /// lapsed (even one nobody took over yet), was released or was taken over
    /// is reported lost and forgotten.
    ///
    /// # Errors
    /// [`ClusterError::Unavailable`] or [`ClusterError::Database`]: nothing is
    /// known about the leases then, and they keep lapsing.
    ///
    /// # Cancel safety
    /// Cancel safe: a renewal that landed only extends leases this node holds.
    pub async fn renew_all(&self, term: Duration) -> Result<RenewReport, ClusterError> {
        let snapshot: Vec<((LeaseKind, String), i64)> =
            self.held().iter().map(|(key, epoch)| (key.clone(), *epoch)).collect();
        let column = |kind: LeaseKind| -> (Vec<&str>, Vec<i64>) {
            snapshot
                .iter()
                .filter(|((k, _), _)| *k == kind)
                .map(|((_, key), epoch)| (key.as_str(), *epoch))
                .unzip()
        };
        let (session_keys, session_epochs) = column(LeaseKind::Session);
        let (channel_keys, channel_epochs) = column(LeaseKind::Channel);
        let rows = self
            .with_client(async |client| {
                let tx = client.transaction().await?;
                // A renewal stuck behind a lock must not land long after the keeper
                // gave up on it (and fenced the node): the server drops it instead.
                tx.batch_execute(&format!(
                    "SET LOCAL statement_timeout = {}",
                    millis(term * 2 / 3)
                ))
                .await?;
                let rows = tx
                    .query(
                        concat!(
                            "WITH s AS (
                        UPDATE session_leases l
                        SET expires_at = clock_timestamp() + $2::bigint * interval '1 millisecond'
                        FROM unnest($3::text[], $4::bigint[]) AS h(key, epoch)
                        WHERE l.session_key = h.key AND l.epoch = h.epoch AND l.node_id = $1
                          AND l.released_at IS NULL AND l.expires_at > clock_timestamp()
                        RETURNING true AS session, l.session_key AS key, l.epoch, ",
                            sql_ms!("l.expires_at"),
                            " AS expires
                    ), c AS (
                        UPDATE channel_leases l
                        SET expires_at = clock_timestamp() + $2::bigint * interval '1 millisecond'
                        FROM unnest($5::text[], $6::bigint[]) AS h(key, epoch)
                        WHERE l.channel = h.key AND l.epoch = h.epoch AND l.node_id = $1
                          AND l.released_at IS NULL AND l.expires_at > clock_timestamp()
                        RETURNING false AS session, l.channel AS key, l.epoch, ",
                            sql_ms!("l.expires_at"),
                            " AS expires
                    )
                    SELECT session, key, epoch, expires FROM s
                    UNION ALL SELECT session, key, epoch, expires FROM c"
                        ),
                        &[
                            &self.node().as_str(),
                            &millis(term),
                            &session_keys,
                            &session_epochs,
                            &channel_keys,
                            &channel_epochs,
                        ],
                    )
                    .await?;
                tx.commit().await?;
                Ok::<_, ClusterError>(rows)
            })
            .await?;
        let renewed: Vec<Lease> = rows
            .into_iter()
            .map(|row| {
                let session: bool = row.get(0);
                Lease {
                    kind: if session { LeaseKind::Session } else { LeaseKind::Channel },
                    key: row.get(1),
                    node: self.node().clone(),
                    epoch: row.get(2),
                    expires_at_ms: row.get(3),
                    term,
                }
            })
            .collect();
        let mut lost = Vec::new();
        let mut held = self.held();
        for ((kind, key), epoch) in snapshot {
            let kept = renewed.iter().any(|l| l.kind == kind && l.key == key && l.epoch == epoch);
            if kept {
                continue;
            }
            // Acquired again while the renewal ran: that newer lease stays.
            if held.get(&(kind, key.clone())) == Some(&epoch) {
                held.remove(&(kind, key.clone()));
            }
            lost.push(LostLease { kind, key, epoch });
        }
        drop(held);
        lost.sort_by(|a, b| (a.kind, &a.key).cmp(&(b.kind, &b.key)));
        Ok(RenewReport { renewed, lost })
    }

    /// Gives a session up (its actor retired): another node may take it at
    /// once. Only the holder at this epoch can; returns whether it did.
    ///
    /// # Errors
    /// [`ClusterError::Unavailable`] or [`ClusterError::Database`].
    ///
    /// # Cancel safety
    /// Dropping the future may or may not leave the lease released; it lapses
    /// after its term either way.
    pub async fn release_session(&self, lease: &Lease) -> Result<bool, ClusterError> {
        self.release(LeaseKind::Session, lease).await
    }

    /// Gives a channel up, as [`Cluster::release_session`] does a session.
    ///
    /// # Errors
    /// [`ClusterError::Unavailable`] or [`ClusterError::Database`].
    ///
    /// # Cancel safety
    /// As [`Cluster::release_session`].
    pub async fn release_channel(&self, lease: &Lease) -> Result<bool, ClusterError> {
        self.release(LeaseKind::Channel, lease).await
    }

    async fn release(&self, kind: LeaseKind, lease: &Lease) -> Result<bool, ClusterError> {
        if lease.kind != kind {
            return Ok(false);
        }
        {
            let mut held = self.held();
            if held.get(&(kind, lease.key.clone())) == Some(&lease.epoch) {
                held.remove(&(kind, lease.key.clone()));
            }
        }
        let (t, k) = table(kind);
        self.with_client(async |client| {
            let n = client
                .execute(
                    &format!(
                        "UPDATE {t} SET released_at = clock_timestamp(),
                            expires_at = LEAST(expires_at, clock_timestamp())
                         WHERE {k} = $1 AND node_id = $2 AND epoch = $3 AND released_at IS NULL"
                    ),
                    &[&lease.key, &lease.node.as_str(), &lease.epoch],
                )
                .await?;
            Ok(n > 0)
        })
        .await
    }

    /// Who holds `key` of `kind`, if anyone ever did.
    ///
    /// # Errors
    /// [`ClusterError::Unavailable`] or [`ClusterError::Database`].
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn owner_of(
        &self,
        kind: LeaseKind,
        key: &str,
    ) -> Result<Option<LeaseOwner>, ClusterError> {
        let (t, k) = table(kind);
        self.with_client(async |client| {
            let row = client
                .query_opt(
                    &format!(
                        "SELECT node_id, epoch,
                            released_at IS NULL AND expires_at > clock_timestamp(), {expires}
                         FROM {t} WHERE {k} = $1",
                        expires = sql_ms!("expires_at"),
                    ),
                    &[&key],
                )
                .await?;
            Ok(row.map(|row| LeaseOwner {
                node: NodeId::from_db(row.get(0)),
                epoch: row.get(1),
                live: row.get(2),
                expires_at_ms: row.get(3),
            }))
        })
        .await
    }

    /// Up to `limit` session leases that lapsed without being released, the
    /// longest lapsed first: sessions whose node stopped renewing, for another
    /// node to take over ([`Cluster::acquire_session`]) and recover.
    ///
    /// # Errors
    /// [`ClusterError::Unavailable`] or [`ClusterError::Database`].
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn expired_sessions(&self, limit: u32) -> Result<Vec<StaleLease>, ClusterError> {
        self.with_client(async |client| {
            let rows = client
                .query(
                    concat!(
                        "SELECT session_key, node_id, epoch, ",
                        sql_ms!("expires_at"),
                        " FROM session_leases
                         WHERE released_at IS NULL AND expires_at <= clock_timestamp()
                         ORDER BY expires_at, session_key LIMIT $1"
                    ),
                    &[&i64::from(limit)],
                )
                .await?;
            Ok(rows
                .into_iter()
                .map(|row| StaleLease {
                    key: row.get(0),
                    node: NodeId::from_db(row.get(1)),
                    epoch: row.get(2),
                    expired_at_ms: row.get(3),
                })
                .collect())
        })
        .await
    }

    /// Runs `write` in a transaction that first checks, and holds until it
    /// ends, that `lease` is still its node's at its epoch and unexpired by the
    /// database's clock. The transaction commits when `write` returns `Ok`,
    /// and rolls back when it returns `Err`.
    ///
    /// `write` must not touch lease rows: the check's lock on this one is what
    /// keeps a takeover waiting until the transaction ends.
    ///
    /// # Errors
    /// [`ClusterError::Fenced`] (nothing ran; also without asking the database
    /// when this handle no longer holds the lease: lost at a renewal, released,
    /// or the node was fenced), a database error of the check or the commit,
    /// or what `write` returned.
    ///
    /// # Cancel safety
    /// Dropping the future before the commit rolls everything back.
    pub async fn fenced_write<T, E, F>(&self, lease: &Lease, write: F) -> Result<T, E>
    where
        F: for<'a, 'b> AsyncFnOnce(&'a Transaction<'b>) -> Result<T, E>,
        E: From<ClusterError>,
    {
        self.with_client(async |client| {
            let tx = client.transaction().await.map_err(ClusterError::from)?;
            self.check_fence(&tx, lease).await?;
            let value = write(&tx).await?;
            tx.commit().await.map_err(ClusterError::from)?;
            Ok(value)
        })
        .await
    }
}

impl Cluster {
    /// Fails with [`ClusterError::Fenced`] unless this handle still holds
    /// `lease` and the database has it live at its epoch; holds its row `FOR
    /// KEY SHARE` for the rest of `tx`.
    pub(super) async fn check_fence(
        &self,
        tx: &Transaction<'_>,
        lease: &Lease,
    ) -> Result<(), ClusterError> {
        if !self.holds(lease) {
            return Err(ClusterError::Fenced { key: lease.key.clone(), epoch: lease.epoch });
        }
        check_fence(tx, lease).await
    }
}

/// Fails with [`ClusterError::Fenced`] unless `lease` is live at its epoch, and
/// holds its row `FOR KEY SHARE` for the rest of `tx`.
async fn check_fence(tx: &Transaction<'_>, lease: &Lease) -> Result<(), ClusterError> {
    let (t, k) = table(lease.kind);
    let row = tx
        .query_opt(
            &format!(
                "SELECT 1 FROM {t}
                 WHERE {k} = $1 AND node_id = $2 AND epoch = $3
                   AND released_at IS NULL AND expires_at > clock_timestamp()
                 FOR KEY SHARE"
            ),
            &[&lease.key, &lease.node.as_str(), &lease.epoch],
        )
        .await?;
    match row {
        Some(_) => Ok(()),
        None => Err(ClusterError::Fenced { key: lease.key.clone(), epoch: lease.epoch }),
    }
}
