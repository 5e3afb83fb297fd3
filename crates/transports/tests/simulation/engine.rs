//! The scripted engine. At each start it draws what this run does from the
//! seed: stream some words and finish, fail, crash (its event stream ends
//! without a completion), or hang until cancelled; after a cancel it may take a
//! while to stop, like a CLI finishing its grace period. Steers are accepted or
//! refused by the seed too. It records, in the shared world, every start, every
//! steer it took, the text it streamed and which runs are alive, and it checks
//! at each start that the run is alone in its conversation and on its engine
//! lock and that the global cap holds.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use lemon_core::engine::{
    Capabilities, Completion, Engine, EngineError, EngineEvent, EventSink, ResumeToken, RunControl,
    RunError, StartRequest, SteerError,
};
use lemon_core::ids::{EngineId, RunId};

use crate::state::{Live, Shared, Start};

pub(crate) const ENGINE: &str = "sim";
/// Resume tokens shared between sessions, so the engine lock is contended.
pub(crate) const TOKENS: [&str; 3] = ["tok-a", "tok-b", "tok-c"];

#[derive(Debug, Clone, Copy)]
enum Script {
    Finish { words: u64, pace_ms: u64 },
    Fail { words: u64 },
    Crash { words: u64 },
    Hang,
}

/// The engine of one process generation: its runs are tasks on `tracker`,
/// all dropped when the generation ends (the processes die with the gateway).
#[derive(Debug)]
pub(crate) struct SimEngine {
    id: EngineId,
    shared: Shared,
    tracker: TaskTracker,
}

impl SimEngine {
    pub(crate) fn new(shared: Shared, tracker: TaskTracker) -> Self {
        SimEngine { id: EngineId::parse(ENGINE).expect("valid id"), shared, tracker }
    }
}

#[derive(Debug)]
struct SimControl {
    run_id: RunId,
    cancel: CancellationToken,
    /// Cancelled once the run's process is gone.
    dead: CancellationToken,
    shared: Shared,
}

#[async_trait]
impl RunControl for SimControl {
    fn cancel(&self) {
        self.cancel.cancel();
    }

    async fn stopped(&self) {
        self.dead.cancelled().await;
    }

    async fn steer(&self, text: &str) -> Result<(), SteerError> {
        let mut world = self.shared.lock();
        if self.cancel.is_cancelled() || !world.running.contains_key(&self.run_id) {
            return Err(SteerError::Finished);
        }
        if world.rng.chance(30) {
            world.note(format_args!("{} refused the steer {text}", self.run_id));
            return Err(SteerError::Failed("busy".to_owned()));
        }
        world.note(format_args!("{} took the steer {text}", self.run_id));
        world.steers.push((self.run_id.clone(), text.to_owned()));
        Ok(())
    }
}

/// The request lines of a prompt (merged followups and retries carry several).
pub(crate) fn request_lines(prompt: &str) -> Vec<String> {
    prompt
        .lines()
        .map(str::trim)
        .filter(|l| l.len() > 1 && l.starts_with('m') && l[1..].bytes().all(|b| b.is_ascii_digit()))
        .map(str::to_owned)
        .collect()
}

#[async_trait]
impl Engine for SimEngine {
    fn id(&self) -> &EngineId {
        &self.id
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities { steer: true, redirect: false }
    }

    async fn start(
        &self,
        req: StartRequest,
        sink: EventSink,
    ) -> Result<Arc<dyn RunControl>, EngineError> {
        let probe = req.prompt.starts_with("probe");
        let session = format!("session:{}", req.session_key.as_str());
        let lock_key = match &req.resume {
            Some(token) => format!("resume:{}", token.value),
            None => session.clone(),
        };
        let (script, linger_ms, reported) = {
            let mut world = self.shared.lock();
            let (conversation, since) = match world.request_of(req.run_id.as_str()) {
                Some(request) => (request.conversation.clone(), request.step),
                None => (session.clone(), 0),
            };
            for (other, live) in &world.running.clone() {
                if live.conversation == conversation {
                    world.violation(format!(
                        "{} started while {other} of the same conversation {conversation} runs",
                        req.run_id
                    ));
                }
                if live.lock_key == lock_key {
                    world.violation(format!(
                        "{} started while {other} holds the engine lock {lock_key}",
                        req.run_id
                    ));
                }
            }
            world
                .running
                .insert(req.run_id.clone(), Live { conversation, lock_key: lock_key.clone() });
            let oldest = world
                .running
                .keys()
                .map(|id| world.request_of(id.as_str()).map_or(0, |r| r.step))
                .min()
                .unwrap_or(since);
            let bound = world.cap_bound(oldest);
            if world.running.len() > bound {
                let n = world.running.len();
                world.violation(format!(
                    "{} started as the {n}th run at once; max_concurrent_runs was at most {bound}",
                    req.run_id
                ));
            }
            world
                .starts
                .push(Start { run_id: req.run_id.clone(), lines: request_lines(&req.prompt) });
            let rng = &mut world.rng;
            let script = if probe {
                Script::Finish { words: 1, pace_ms: 0 }
            } else {
                match rng.below(100) {
                    0..=44 => Script::Finish { words: rng.below(4), pace_ms: rng.below(400) },
                    45..=61 => Script::Fail { words: rng.below(2) },
                    62..=76 => Script::Crash { words: rng.below(2) },
                    _ => Script::Hang,
                }
            };
            let linger_ms = if rng.chance(30) { rng.below(1500) } else { 0 };
            let reported = if rng.chance(40) {
                TOKENS[rng.index(TOKENS.len())].to_owned()
            } else {
                format!("{}-s", req.run_id)
            };
            world.reported.insert(reported.clone());
            if let Some(token) = &req.resume {
                world.reported.insert(token.value.clone());
            }
            world.note(format_args!(
                "start {} on {lock_key}: {:?} {script:?}, lingers {linger_ms} ms, reports {reported}",
                req.run_id,
                request_lines(&req.prompt)
            ));
            (script, linger_ms, reported)
        };
        let cancel = CancellationToken::new();
        let dead = CancellationToken::new();
        let control = Arc::new(SimControl {
            run_id: req.run_id.clone(),
            cancel: cancel.clone(),
            dead: dead.clone(),
            shared: self.shared.clone(),
        });
        let shared = self.shared.clone();
        let run_id = req.run_id.clone();
        let resume = Some(ResumeToken::new(ENGINE, reported));
        self.tracker.spawn(async move {
            let body = play(&shared, &run_id, script, sink, resume, &dead);
            tokio::select! {
                biased;
                () = cancel.cancelled() => {
                    tokio::time::sleep(Duration::from_millis(linger_ms)).await;
                    exit(&shared, &run_id, &dead);
                }
                () = body => {}
            }
        });
        Ok(control)
    }
}

/// The process is gone: no longer alive, and `stopped` resolves.
fn exit(shared: &Shared, run_id: &RunId, dead: &CancellationToken) {
    let mut world = shared.lock();
    world.note(format_args!("{run_id} exits"));
    world.running.remove(run_id);
    drop(world);
    dead.cancel();
}

async fn play(
    shared: &Shared,
    run_id: &RunId,
    script: Script,
    sink: EventSink,
    resume: Option<ResumeToken>,
    dead: &CancellationToken,
) {
    let started =
        EngineEvent::Started { resume: resume.clone(), title: None, meta: serde_json::Value::Null };
    if sink.send(started).await.is_err() {
        return std::future::pending().await;
    }
    let (words, pace_ms) = match script {
        Script::Finish { words, pace_ms } => (words, pace_ms),
        Script::Fail { words } | Script::Crash { words } => (words, 0),
        Script::Hang => return std::future::pending().await,
    };
    for n in 0..words {
        tokio::time::sleep(Duration::from_millis(pace_ms)).await;
        let word = format!("{run_id}w{n} ");
        if sink.send(EngineEvent::Delta(word.clone())).await.is_err() {
            return std::future::pending().await;
        }
        let mut world = shared.lock();
        world.note(format_args!("{run_id} streamed {word}"));
        world.emitted.entry(run_id.clone()).or_default().push_str(&word);
    }
    let completion = match script {
        Script::Finish { .. } => Completion::success(String::new(), resume),
        Script::Fail { .. } => {
            Completion::failure(RunError::Engine { message: "boom".to_owned() }, resume)
        }
        // The stream ends without a completion.
        Script::Crash { .. } | Script::Hang => {
            exit(shared, run_id, dead);
            return;
        }
    };
    // Gone before the completion is out: the gateway may start the next run
    // on this lock as soon as it reads it.
    exit(shared, run_id, dead);
    let _ = sink.send(EngineEvent::Completed(completion)).await;
}
