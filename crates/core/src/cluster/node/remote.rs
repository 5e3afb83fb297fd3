//! Cancel and steer of a run another node owns.
//!
//! The asking node writes a control request for the run's owner
//! ([`Cluster::send_control`](crate::cluster::Cluster::send_control)); the
//! owner takes it, acts through its [`ControlHandler`] (the router) and
//! answers; the asker waits for the answer.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::broadcast::{self, error::RecvError};
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::ClusterNode;
use crate::cluster::{ClusterError, Control, ControlKind, LeaseKind, Notice, Topic};
use crate::ids::RunId;

/// What the owner of a run said to a remote cancel or steer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RemoteAnswer {
    /// Done: cancelling, or the steer reached the engine.
    Done,
    /// The run is not active there (finished, or never started).
    NotActive,
    /// The owner refused, with why (a steer the engine did not take).
    Refused(String),
}

impl RemoteAnswer {
    /// The answer as its row stores it.
    pub fn encode(&self) -> String {
        match self {
            RemoteAnswer::Done => "done".to_owned(),
            RemoteAnswer::NotActive => "not_active".to_owned(),
            RemoteAnswer::Refused(why) => format!("refused:{why}"),
        }
    }

    /// An answer as its row stores it; an unknown one reads as refused.
    pub fn decode(raw: &str) -> Self {
        match raw {
            "done" => RemoteAnswer::Done,
            "not_active" => RemoteAnswer::NotActive,
            other => {
                RemoteAnswer::Refused(other.strip_prefix("refused:").unwrap_or(other).to_owned())
            }
        }
    }
}

/// How the owner of a run acts on a request from another node: the router,
/// which also drops a run it still holds queued.
#[async_trait]
pub trait ControlHandler: Send + Sync + 'static {
    async fn cancel(&self, run_id: &RunId) -> RemoteAnswer;
    async fn steer(&self, run_id: &RunId, text: &str) -> RemoteAnswer;
}

/// How long the asking node waits for the owner's answer.
pub const ANSWER_WAIT: Duration = Duration::from_secs(10);
/// How often a node prunes old control requests.
const PRUNE_EVERY: Duration = Duration::from_secs(600);
/// Control requests older than this are pruned: long answered, or lost.
const PRUNE_AFTER: Duration = Duration::from_secs(3600);
/// The first wait before answering again after a database error.
const RETRY_FIRST: Duration = Duration::from_millis(100);

impl ClusterNode {
    /// Cancels run `run_id` of session `session_key` on the node that owns the
    /// session, and returns its answer. [`RemoteAnswer::NotActive`] when no
    /// live node owns the session, or this node does (the caller has already
    /// looked here).
    ///
    /// # Errors
    /// [`ClusterError::Unavailable`] when the owner did not answer within
    /// [`ANSWER_WAIT`] or the database could not be reached;
    /// [`ClusterError::Fenced`] when this node is fenced.
    pub async fn remote_cancel(
        &self,
        run_id: &RunId,
        session_key: &str,
    ) -> Result<RemoteAnswer, ClusterError> {
        self.remote_control(run_id, session_key, ControlKind::Cancel, "").await
    }

    /// Steers run `run_id` of session `session_key` with `text` on the node
    /// that owns the session; see [`ClusterNode::remote_cancel`].
    ///
    /// # Errors
    /// As [`ClusterNode::remote_cancel`].
    pub async fn remote_steer(
        &self,
        run_id: &RunId,
        session_key: &str,
        text: &str,
    ) -> Result<RemoteAnswer, ClusterError> {
        self.remote_control(run_id, session_key, ControlKind::Steer, text).await
    }

    async fn remote_control(
        &self,
        run_id: &RunId,
        session_key: &str,
        kind: ControlKind,
        body: &str,
    ) -> Result<RemoteAnswer, ClusterError> {
        if self.is_fenced() {
            return Err(ClusterError::Fenced { key: session_key.to_owned(), epoch: 0 });
        }
        let owner = match self.cluster.owner_of(LeaseKind::Session, session_key).await? {
            Some(owner) if owner.live && &owner.node != self.id() => owner.node,
            _ => return Ok(RemoteAnswer::NotActive),
        };
        // Subscribed before sending: the answer's notice cannot come first.
        let mut notices = self.subscribe();
        let id = self.cluster.send_control(&owner, run_id.as_str(), kind, body).await?;
        let wanted = id.to_string();
        let deadline = Instant::now() + ANSWER_WAIT;
        let sweep = self.settings.sweep;
        let mut last_error = None;
        loop {
            let poll = tokio::time::sleep(sweep);
            tokio::pin!(poll);
            // Waits for a reason to look: the answer's notice, a resync or
            // lag, or the polling interval.
            loop {
                tokio::select! {
                    () = tokio::time::sleep_until(deadline) => {
                        let why = last_error.map_or_else(String::new, |e: ClusterError| format!(" ({e})"));
                        return Err(ClusterError::Unavailable {
                            message: format!(
                                "node {owner} did not answer a {} of run {run_id} within {} s{why}",
                                kind.as_str(),
                                ANSWER_WAIT.as_secs()
                            ),
                        });
                    }
                    () = &mut poll => break,
                    notice = notices.recv() => match notice {
                        Ok(Notice::Notified { topic: Topic::ControlAnswer, payload }) if payload == wanted => break,
                        Ok(Notice::Resync) | Err(RecvError::Lagged(_)) => break,
                        Ok(Notice::Notified { .. }) => {}
                        Err(RecvError::Closed) => {
                            (&mut poll).await;
                            break;
                        }
                    },
                }
            }
            match self.cluster.control_answer(id).await {
                Ok(Some(answer)) => return Ok(RemoteAnswer::decode(&answer)),
                Ok(None) => {}
                Err(error) => last_error = Some(error),
            }
        }
    }

    /// Serves the control requests other nodes send this node until `token`
    /// is cancelled or the node is fenced: takes them (on a [`Topic::Control`]
    /// notice naming this node, on a resync or lag, and every sweep), acts on
    /// each through `handler` in a task of its own on `tracker`, so a slow
    /// steer holds no other request up, and answers. Now and then it prunes
    /// requests older than an hour.
    pub fn serve_controls(
        self: &Arc<Self>,
        handler: Arc<dyn ControlHandler>,
        tracker: &TaskTracker,
        token: CancellationToken,
    ) {
        // Subscribed now: a request sent from here on is heard.
        let notices = self.subscribe();
        let server = ControlServer { node: self.clone(), handler, tracker: tracker.clone(), token };
        tracker.spawn(server.run(notices));
    }
}

/// The task behind [`ClusterNode::serve_controls`].
struct ControlServer {
    node: Arc<ClusterNode>,
    handler: Arc<dyn ControlHandler>,
    tracker: TaskTracker,
    token: CancellationToken,
}

impl ControlServer {
    async fn run(self, mut notices: broadcast::Receiver<Notice>) {
        let fenced = self.node.fenced();
        let me = self.node.id().as_str().to_owned();
        let mut sweep = tokio::time::interval(self.node.settings.sweep);
        sweep.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut next_prune = Instant::now();
        loop {
            // The first tick is at once: requests sent while the node was away.
            tokio::select! {
                () = self.token.cancelled() => return,
                () = fenced.cancelled() => return,
                notice = notices.recv() => match notice {
                    Ok(Notice::Notified { topic: Topic::Control, payload }) if payload == me => {}
                    Ok(Notice::Resync) | Err(RecvError::Lagged(_)) => {}
                    Ok(Notice::Notified { .. }) => continue,
                    Err(RecvError::Closed) => {
                        notices = self.node.subscribe();
                        continue;
                    }
                },
                _ = sweep.tick() => {}
            }
            self.take().await;
            if Instant::now() >= next_prune {
                next_prune = Instant::now() + PRUNE_EVERY;
                match self.node.cluster.prune_controls(PRUNE_AFTER).await {
                    Ok(0) => {}
                    Ok(n) => tracing::debug!(pruned = n, "old control requests pruned"),
                    Err(error) => tracing::debug!(%error, "control requests not pruned"),
                }
            }
        }
    }

    /// Takes every request waiting for this node and acts on each.
    async fn take(&self) {
        let controls = match self.node.cluster.take_controls().await {
            Ok(controls) => controls,
            Err(error) => {
                tracing::warn!(%error, "control requests not taken; trying again");
                return;
            }
        };
        for control in controls {
            let (node, handler) = (self.node.clone(), self.handler.clone());
            let token = self.token.clone();
            self.tracker.spawn(async move {
                let answer = act(&*handler, &control).await;
                answer_control(&node, control.id, &answer, &token).await;
            });
        }
    }
}

/// What the handler says to one request.
async fn act(handler: &dyn ControlHandler, control: &Control) -> RemoteAnswer {
    // A run id this build cannot parse names no run here.
    let Some(run_id) = RunId::parse(&control.run_id) else { return RemoteAnswer::NotActive };
    let answer = match control.kind {
        ControlKind::Cancel => handler.cancel(&run_id).await,
        ControlKind::Steer => handler.steer(&run_id, &control.body).await,
    };
    tracing::debug!(%run_id, kind = control.kind.as_str(), answer = %answer.encode(), "control request served");
    answer
}

/// Answers request `id`, trying again while the database is out of reach, for
/// as long as the asker waits.
async fn answer_control(
    node: &ClusterNode,
    id: i64,
    answer: &RemoteAnswer,
    token: &CancellationToken,
) {
    let deadline = Instant::now() + ANSWER_WAIT;
    let mut backoff = RETRY_FIRST;
    loop {
        match node.cluster.answer_control(id, &answer.encode()).await {
            Ok(_) => return,
            Err(error) if Instant::now() + backoff >= deadline => {
                tracing::warn!(%error, control_id = id, "control request not answered");
                return;
            }
            Err(error) => {
                tracing::debug!(%error, control_id = id, "control answer failed; trying again")
            }
        }
        tokio::select! {
            () = token.cancelled() => return,
            () = tokio::time::sleep(backoff) => {}
        }
        backoff *= 2;
    }
}
