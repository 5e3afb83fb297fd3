//! Test support: [`FakeEngine`], an engine whose behaviour is chosen by the prompt.
//!
//! The first word of the prompt picks the behaviour; the rest is the answer text,
//! streamed one word per delta:
//! - `ok …`: started, deltas, completed ok (the default for any other word too);
//! - `sleep:<ms> …`: like `ok`, after waiting `ms` (use paused time);
//! - `hang`: started, then nothing until cancelled;
//! - `linger:<ms>`: like `hang`, but after a cancel it takes `ms` more to stop
//!   ([`RunControl::stopped`] resolves then), like a CLI that ignores SIGTERM until
//!   its grace ends; `linger:forever` never stops;
//! - `crash …`: started, the deltas, then the event channel closes with no completion;
//! - `taskpanic`: the engine's task panics after `started`;
//! - `panic`: `start` itself panics;
//! - `startfail`: `start` returns an error;
//! - `fail …`: completes with `ok: false` and the engine error `boom`.
//!
//! It counts runs in progress so tests can check concurrency limits, and records
//! prompts in start order.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;

use crate::engine::{
    Capabilities, Completion, Engine, EngineError, EngineEvent, EventSink, ResumeToken, RunControl,
    RunError, StartRequest, SteerError,
};
use crate::ids::{EngineId, SessionKey};

/// A scriptable engine. Cheap to clone; clones share counters.
#[derive(Debug, Clone)]
pub struct FakeEngine {
    id: EngineId,
    steer: bool,
    stats: Arc<Stats>,
}

#[derive(Debug, Default)]
struct Stats {
    running: AtomicUsize,
    max_running: AtomicUsize,
    started: Mutex<Vec<String>>,
    /// Runs in progress per session, to prove per-conversation exclusivity.
    per_session: Mutex<HashMap<SessionKey, usize>>,
    max_per_session: AtomicUsize,
    steered: Mutex<Vec<String>>,
}

impl FakeEngine {
    pub fn new(id: &str) -> Self {
        FakeEngine {
            id: EngineId::parse(id).expect("valid engine id"),
            steer: false,
            stats: Arc::default(),
        }
    }

    /// A fake that accepts steering.
    pub fn with_steering(mut self) -> Self {
        self.steer = true;
        self
    }

    /// Most runs ever in progress at once.
    pub fn max_running(&self) -> usize {
        self.stats.max_running.load(Ordering::SeqCst)
    }

    /// Runs in progress now.
    pub fn running(&self) -> usize {
        self.stats.running.load(Ordering::SeqCst)
    }

    /// Most runs of one session ever in progress at once.
    pub fn max_per_session(&self) -> usize {
        self.stats.max_per_session.load(Ordering::SeqCst)
    }

    /// Prompts in the order their runs started.
    pub fn started(&self) -> Vec<String> {
        self.stats.started.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Texts steered into runs.
    pub fn steered(&self) -> Vec<String> {
        self.stats.steered.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// Decrements the in-progress counters when the run's task ends, however it ends.
#[derive(Debug)]
struct InProgress {
    stats: Arc<Stats>,
    session: SessionKey,
}

impl InProgress {
    fn enter(stats: &Arc<Stats>, session: &SessionKey) -> Self {
        let now = stats.running.fetch_add(1, Ordering::SeqCst) + 1;
        stats.max_running.fetch_max(now, Ordering::SeqCst);
        let mut per = stats.per_session.lock().unwrap_or_else(|e| e.into_inner());
        let count = per.entry(session.clone()).or_default();
        *count += 1;
        stats.max_per_session.fetch_max(*count, Ordering::SeqCst);
        InProgress { stats: stats.clone(), session: session.clone() }
    }
}

impl Drop for InProgress {
    fn drop(&mut self) {
        self.stats.running.fetch_sub(1, Ordering::SeqCst);
        let mut per = self.stats.per_session.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(count) = per.get_mut(&self.session) {
            *count -= 1;
        }
    }
}

#[derive(Debug)]
struct FakeControl {
    token: CancellationToken,
    steer: bool,
    stats: Arc<Stats>,
    /// For `linger`: cancelled when the run's task has ended.
    stopped: Option<CancellationToken>,
}

#[async_trait]
impl RunControl for FakeControl {
    fn cancel(&self) {
        self.token.cancel();
    }

    async fn stopped(&self) {
        if let Some(stopped) = &self.stopped {
            stopped.cancelled().await;
        }
    }

    async fn steer(&self, text: &str) -> Result<(), SteerError> {
        if !self.steer {
            return Err(SteerError::Unsupported);
        }
        if self.token.is_cancelled() {
            return Err(SteerError::Finished);
        }
        self.stats.steered.lock().unwrap_or_else(|e| e.into_inner()).push(text.to_owned());
        Ok(())
    }
}

#[async_trait]
impl Engine for FakeEngine {
    fn id(&self) -> &EngineId {
        &self.id
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities { steer: self.steer, redirect: false }
    }

    async fn start(
        &self,
        req: StartRequest,
        sink: EventSink,
    ) -> Result<Arc<dyn RunControl>, EngineError> {
        let mut words = req.prompt.split_whitespace();
        let command = words.next().unwrap_or("ok").to_owned();
        let rest: Vec<String> = words.map(|w| format!("{w} ")).collect();
        match command.as_str() {
            "panic" => panic!("fake engine panicked in start"),
            "startfail" => return Err(EngineError::Start("fake start failure".to_owned())),
            _ => {}
        }
        self.stats.started.lock().unwrap_or_else(|e| e.into_inner()).push(req.prompt.clone());
        let token = CancellationToken::new();
        let guard = InProgress::enter(&self.stats, &req.session_key);
        let resume = Some(ResumeToken::new(self.id.as_str(), format!("{}-session", req.run_id)));
        let task_token = token.clone();
        let linger = command.strip_prefix("linger:").map(|ms| ms.parse::<u64>().ok());
        let stopped = linger.map(|_| CancellationToken::new());
        let task_stopped = stopped.clone();
        tokio::spawn(async move {
            // Dropped last: the run counts as stopped once it is no longer in progress.
            let _stopped = task_stopped.map(CancellationToken::drop_guard);
            let _guard = guard;
            let run = script(command, rest, sink, resume);
            tokio::select! {
                () = task_token.cancelled() => {}
                () = run => {}
            }
            match linger {
                Some(Some(ms)) => tokio::time::sleep(Duration::from_millis(ms)).await,
                Some(None) => std::future::pending().await,
                None => {}
            }
        });
        Ok(Arc::new(FakeControl { token, steer: self.steer, stats: self.stats.clone(), stopped }))
    }
}

async fn script(command: String, rest: Vec<String>, sink: EventSink, resume: Option<ResumeToken>) {
    let started = EngineEvent::Started {
        resume: resume.clone(),
        title: Some("Fake".to_owned()),
        meta: serde_json::Value::Null,
    };
    if sink.send(started).await.is_err() {
        return;
    }
    if let Some(ms) = command.strip_prefix("sleep:").and_then(|ms| ms.parse::<u64>().ok()) {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    // `approval:<ms>`: an approval action open for that long, then closed.
    if let Some(ms) = command.strip_prefix("approval:").and_then(|ms| ms.parse::<u64>().ok()) {
        use crate::engine::{Action, ActionKind, ActionPhase};
        let approval = |phase| {
            EngineEvent::Action(Action {
                id: "approval_1".to_owned(),
                kind: ActionKind::Approval,
                title: "approval: bash".to_owned(),
                detail: serde_json::Value::Null,
                phase,
                ok: None,
                message: None,
                level: None,
                result_meta: serde_json::Value::Null,
            })
        };
        if sink.send(approval(ActionPhase::Started)).await.is_err() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(ms)).await;
        if sink.send(approval(ActionPhase::Completed)).await.is_err() {
            return;
        }
    }
    match command.as_str() {
        "hang" => return std::future::pending().await,
        linger if linger.starts_with("linger:") => return std::future::pending().await,
        "taskpanic" => panic!("fake engine task panicked"),
        _ => {}
    }
    for word in rest {
        if sink.send(EngineEvent::Delta(word)).await.is_err() {
            return;
        }
    }
    let completion = match command.as_str() {
        "crash" => return,
        "fail" => Completion::failure(RunError::Engine { message: "boom".to_owned() }, resume),
        _ => Completion::success(String::new(), resume),
    };
    let _ = sink.send(EngineEvent::Completed(completion)).await;
}

/// A safety net for tests: every wait ends on an event long before this.
pub const PATIENCE: std::time::Duration = std::time::Duration::from_secs(20);

/// `fut`, or a panic naming `what` after `patience`.
pub async fn within_for<F: std::future::Future>(
    patience: std::time::Duration,
    what: &str,
    fut: F,
) -> F::Output {
    match tokio::time::timeout(patience, fut).await {
        Ok(output) => output,
        Err(_) => panic!("timed out waiting for {what}"),
    }
}

/// `fut`, or a panic naming `what` after [`PATIENCE`].
pub async fn within<F: std::future::Future>(what: &str, fut: F) -> F::Output {
    within_for(PATIENCE, what, fut).await
}

/// Most polls [`poll_until`] makes before it gives up.
pub const MAX_POLLS: usize = 10_000;

/// Polls `check`, letting every other task run between two polls, until it
/// holds; panics naming `what` after [`MAX_POLLS`] polls. A yield does not move
/// paused time on, so a loop of yields is bounded by its count, not by a
/// timeout (which would never fire while the loop keeps the runtime busy).
pub async fn poll_until<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    for _ in 0..MAX_POLLS {
        if check().await {
            return;
        }
        tokio::task::yield_now().await;
    }
    panic!("{what} did not happen within {MAX_POLLS} polls");
}
