//! The scheduler actor.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::{ActiveRun, CancelOutcome, ExecutionRequest, GatewayDeps, SchedulerSnapshot, SubmitError};
use crate::engine::{RunControl, RunError};
use crate::ids::RunId;

#[derive(Debug)]
pub(super) enum SchedulerMsg {
    Submit { req: ExecutionRequest, reply: oneshot::Sender<Result<RunId, SubmitError>> },
    Cancel { run_id: RunId, reason: RunError, reply: oneshot::Sender<CancelOutcome> },
    Control { run_id: RunId, reply: oneshot::Sender<Option<Arc<dyn RunControl>>> },
    ActiveRun { run_id: RunId, reply: oneshot::Sender<Option<ActiveRun>> },
    ActiveRuns { reply: oneshot::Sender<Vec<ActiveRun>> },
    Snapshot { reply: oneshot::Sender<SchedulerSnapshot> },
    SetMax { max: usize },
    Drain { grace: Duration, reply: oneshot::Sender<()> },
}

#[derive(Debug)]
pub(super) struct Scheduler {
    rx: mpsc::Receiver<SchedulerMsg>,
}

impl Scheduler {
    pub(super) fn new(
        _deps: GatewayDeps,
        rx: mpsc::Receiver<SchedulerMsg>,
        _tx: mpsc::Sender<SchedulerMsg>,
        _token: CancellationToken,
        _tracker: TaskTracker,
    ) -> Self {
        Scheduler { rx }
    }

    pub(super) async fn run(mut self) {
        while self.rx.recv().await.is_some() {}
    }
}
