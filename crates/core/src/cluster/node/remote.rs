//! Cancel and steer of a run another node owns.
//!
//! The asking node writes a control request for the run's owner
//! ([`Cluster::send_control`](crate::cluster::Cluster::send_control)); the
//! owner takes it, acts through its [`ControlHandler`] (the router) and
//! answers; the asker waits for the answer.

use async_trait::async_trait;

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
            other => RemoteAnswer::Refused(
                other.strip_prefix("refused:").unwrap_or(other).to_owned(),
            ),
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
