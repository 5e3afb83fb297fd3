//! Requests between nodes (cancel or steer a run that lives on another node)
//! and the one row of cluster-wide configuration.
//!
//! A control request is a `cluster_control` row for the node that owns the run,
//! plus a `lemon_control` notification naming that node. The owner takes its
//! rows (on the notification, or on its polling fallback), acts, and answers;
//! the sender reads the answer (on `lemon_control_answer`, or by polling).

use std::time::Duration;

use super::listener::Topic;
use super::{millis, sql_ms, Cluster, ClusterError, NodeId};

/// What a control request asks the run's owner to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ControlKind {
    /// Cancel the run.
    Cancel,
    /// Give the running run more input (the body).
    Steer,
}

impl ControlKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ControlKind::Cancel => "cancel",
            ControlKind::Steer => "steer",
        }
    }

    /// The kind a row names; `None` for one this build does not know (written
    /// by a newer node).
    pub fn parse(raw: &str) -> Option<Self> {
        match raw {
            "cancel" => Some(ControlKind::Cancel),
            "steer" => Some(ControlKind::Steer),
            _ => None,
        }
    }
}

/// A control request this node took.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Control {
    pub id: i64,
    pub run_id: String,
    pub kind: ControlKind,
    pub body: String,
    pub created_at_ms: i64,
}

/// The cluster-wide configuration and its version (0 before anyone wrote it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedConfig {
    pub version: i64,
    /// As its writer gave it (the gateway keeps TOML here). Never a secret.
    pub body: String,
    pub updated_at_ms: i64,
    pub updated_by: Option<NodeId>,
}

impl Cluster {
    /// Asks node `target` to do `kind` to run `run_id`, and notifies it;
    /// returns the request's id, for [`Cluster::control_answer`].
    ///
    /// # Errors
    /// [`ClusterError::Unavailable`] or [`ClusterError::Database`].
    ///
    /// # Cancel safety
    /// Dropping the future may or may not leave the request sent.
    pub async fn send_control(
        &self,
        target: &NodeId,
        run_id: &str,
        kind: ControlKind,
        body: &str,
    ) -> Result<i64, ClusterError> {
        self.with_client(async |client| {
            // One statement, so the row and its notification go together.
            let row = client
                .query_one(
                    "WITH c AS (
                        INSERT INTO cluster_control (run_id, target_node, kind, body, created_at)
                        VALUES ($1, $2, $3, $4, clock_timestamp()) RETURNING id
                     )
                     SELECT id, pg_notify($5, $2) FROM c",
                    &[&run_id, &target.as_str(), &kind.as_str(), &body, &Topic::Control.channel()],
                )
                .await?;
            Ok(row.get(0))
        })
        .await
    }

    /// Takes every request for this node nobody took yet, oldest first. A
    /// request is taken once: a node that crashes after taking it loses it,
    /// and its sender sees no answer.
    ///
    /// # Errors
    /// [`ClusterError::Unavailable`] or [`ClusterError::Database`].
    ///
    /// # Cancel safety
    /// Not cancel safe: dropped after the database answered, the requests are
    /// taken but never acted on.
    pub async fn take_controls(&self) -> Result<Vec<Control>, ClusterError> {
        self.with_client(async |client| {
            let rows = client
                .query(
                    concat!(
                        "UPDATE cluster_control SET taken_at = clock_timestamp()
                         WHERE id IN (
                            SELECT id FROM cluster_control
                            WHERE target_node = $1 AND taken_at IS NULL
                            ORDER BY id FOR UPDATE SKIP LOCKED)
                         RETURNING id, run_id, kind, body, ",
                        sql_ms!("created_at")
                    ),
                    &[&self.node().as_str()],
                )
                .await?;
            let mut controls: Vec<Control> = rows
                .into_iter()
                .filter_map(|row| {
                    let id: i64 = row.get(0);
                    let raw: &str = row.get(2);
                    let Some(kind) = ControlKind::parse(raw) else {
                        tracing::warn!(
                            control_id = id,
                            kind = raw,
                            "control request of unknown kind"
                        );
                        return None;
                    };
                    Some(Control {
                        id,
                        run_id: row.get(1),
                        kind,
                        body: row.get(3),
                        created_at_ms: row.get(4),
                    })
                })
                .collect();
            controls.sort_by_key(|c| c.id);
            Ok(controls)
        })
        .await
    }

    /// Answers request `id` and notifies the sender. Only the first answer
    /// counts; returns whether this was it.
    ///
    /// # Errors
    /// [`ClusterError::Unavailable`] or [`ClusterError::Database`].
    ///
    /// # Cancel safety
    /// Dropping the future may or may not leave the answer written.
    pub async fn answer_control(&self, id: i64, answer: &str) -> Result<bool, ClusterError> {
        self.with_client(async |client| {
            let rows = client
                .query(
                    "WITH a AS (
                        UPDATE cluster_control SET answered_at = clock_timestamp(), answer = $2
                        WHERE id = $1 AND answered_at IS NULL RETURNING id
                     )
                     SELECT pg_notify($3, a.id::text) FROM a",
                    &[&id, &answer, &Topic::ControlAnswer.channel()],
                )
                .await?;
            Ok(!rows.is_empty())
        })
        .await
    }

    /// The answer to request `id`; `None` until there is one (or when there is
    /// no such request).
    ///
    /// # Errors
    /// [`ClusterError::Unavailable`] or [`ClusterError::Database`].
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn control_answer(&self, id: i64) -> Result<Option<String>, ClusterError> {
        self.with_client(async |client| {
            let row = client
                .query_opt(
                    "SELECT answer FROM cluster_control WHERE id = $1 AND answered_at IS NOT NULL",
                    &[&id],
                )
                .await?;
            Ok(row.map(|row| row.get(0)))
        })
        .await
    }

    /// Deletes control requests older than `older_than`; returns how many.
    ///
    /// # Errors
    /// [`ClusterError::Unavailable`] or [`ClusterError::Database`].
    ///
    /// # Cancel safety
    /// Dropping the future may or may not leave them deleted.
    pub async fn prune_controls(&self, older_than: Duration) -> Result<u64, ClusterError> {
        self.with_client(async |client| {
            Ok(client
                .execute(
                    "DELETE FROM cluster_control
                     WHERE created_at < clock_timestamp() - $1::bigint * interval '1 millisecond'",
                    &[&millis(older_than)],
                )
                .await?)
        })
        .await
    }

    /// The cluster-wide configuration.
    ///
    /// # Errors
    /// [`ClusterError::Unavailable`] or [`ClusterError::Database`].
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn config(&self) -> Result<SharedConfig, ClusterError> {
        self.with_client(async |client| {
            let row = client
                .query_one(
                    concat!(
                        "SELECT version, body, ",
                        sql_ms!("updated_at"),
                        ", updated_by FROM cluster_config WHERE id = 1"
                    ),
                    &[],
                )
                .await?;
            Ok(SharedConfig {
                version: row.get(0),
                body: row.get(1),
                updated_at_ms: row.get(2),
                updated_by: row.get::<_, Option<String>>(3).map(NodeId::from_db),
            })
        })
        .await
    }

    /// Replaces the cluster-wide configuration if it is still at
    /// `expected_version`, and notifies every node; returns the new version.
    ///
    /// # Errors
    /// [`ClusterError::Conflict`] with the version found when another write
    /// came first (nothing written), [`ClusterError::Unavailable`] or
    /// [`ClusterError::Database`].
    ///
    /// # Cancel safety
    /// Dropping the future may or may not leave the config written.
    pub async fn put_config(&self, expected_version: i64, body: &str) -> Result<i64, ClusterError> {
        self.with_client(async |client| {
            let row = client
                .query_opt(
                    "WITH w AS (
                        UPDATE cluster_config SET version = version + 1, body = $2,
                            updated_at = clock_timestamp(), updated_by = $3
                        WHERE id = 1 AND version = $1 RETURNING version
                     )
                     SELECT version, pg_notify($4, version::text) FROM w",
                    &[&expected_version, &body, &self.node().as_str(), &Topic::Config.channel()],
                )
                .await?;
            if let Some(row) = row {
                return Ok(row.get(0));
            }
            let found: i64 = client
                .query_one("SELECT version FROM cluster_config WHERE id = 1", &[])
                .await?
                .get(0);
            Err(ClusterError::Conflict { expected: expected_version, found })
        })
        .await
    }
}
