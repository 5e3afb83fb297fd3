//! One seed: the real router, runtime and delivery layer over the scripted
//! engine and destination, driven by random operations, one process
//! generation at a time. Each generation has its own paused current-thread
//! runtime; a restart drops that runtime with everything on it (tasks, the
//! engine's processes, the bus), as a crash would, and keeps only the store,
//! then starts again from it: the router recovers its journal and the channel
//! its delivery records.
//!
//! A SQLite store is opened inline ([`StoreHandle::open_sqlite_inline`]): its
//! batches and reads run on the task that needs them, so the runtime is never
//! idle waiting for a writer thread, paused time never jumps while the store
//! works, and a seed's trace does not depend on the machine.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use lemon_core::bus::{EventBus, EventKind, RecvError, Subscription};
use lemon_core::config::{DropPolicy, QueueMode};
use lemon_core::engine::{EngineRegistry, ResumeToken};
use lemon_core::gateway::{GatewayDeps, GatewayHandle, RuntimeConfig};
use lemon_core::ids::{RunId, SessionKey};
use lemon_core::router::{Limits, Origin, RouterConfig, RouterHandle, RunRequest, Submitted};
use lemon_core::store::StoreHandle;
use lemon_transports::delivery::plain_answer;

use crate::channel::Channel;
use crate::engine::{SimEngine, ENGINE, TOKENS};
use crate::state::{origin_of, Request, Seen, Shared, Traced};

const SESSIONS: u64 = 6;
/// Simulated seconds the end of a seed may take to settle before it fails.
const QUIET_WITHIN_S: u64 = 900;
/// How far time moves between two looks while a seed settles.
const QUIET_STEP_S: u64 = 3;
/// The generation of a completion read back from the store.
const FROM_STORE: usize = usize::MAX;

/// The settings a reload changes.
#[derive(Debug, Clone, Copy)]
struct Settings {
    max_concurrent_runs: usize,
    queue_cap: Option<usize>,
    drop: DropPolicy,
}

impl Settings {
    fn runtime(self) -> RuntimeConfig {
        RuntimeConfig {
            max_concurrent_runs: self.max_concurrent_runs,
            engine_lock_timeout: Duration::from_secs(30),
            run_inactivity_timeout: Duration::from_secs(3),
            engine_stop_timeout: Duration::from_secs(2),
            default_cwd: Some(std::env::temp_dir()),
            ..RuntimeConfig::default()
        }
    }

    fn router(self) -> RouterConfig {
        RouterConfig {
            default_engine: ENGINE.parse().expect("engine ref"),
            limits: Limits { cap: self.queue_cap, drop: Some(self.drop) },
            idle_watchdog: Some(Duration::from_secs(20)),
            ..RouterConfig::default()
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum Op {
    Submit {
        session: u8,
        mode: QueueMode,
        token: Option<usize>,
    },
    CancelSession {
        session: u8,
    },
    AbortSession {
        session: u8,
    },
    AbortRun {
        pick: usize,
    },
    CancelRun {
        pick: usize,
    },
    Advance {
        ms: u64,
    },
    Reload(Settings),
    DeliveryFails {
        chat: u8,
        calls: u32,
    },
    /// `settle`: at a quiet moment; else after only `polls` task polls.
    Restart {
        settle: bool,
        polls: u64,
    },
}

/// One process generation. Fields drop in order: handles first, the runtime last.
struct Generation {
    gateway: GatewayHandle,
    router: RouterHandle,
    channel: Channel,
    firehose: Subscription,
    /// The gateway's, router's and channel's tasks.
    tracker: TaskTracker,
    /// The engine's runs (its processes).
    engine_tasks: TaskTracker,
    _token: CancellationToken,
    runtime: tokio::runtime::Runtime,
}

pub(crate) struct Sim {
    shared: Shared,
    store: StoreHandle,
    _dir: Option<tempfile::TempDir>,
    settings: Settings,
    generation: Option<Generation>,
    next_message: usize,
    /// Tasks of a generation with nothing to do: the scheduler's, the router's
    /// and the outbox's.
    idle_tasks: Option<usize>,
}

type Outcome = Result<(), String>;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("a runtime")
}

/// Lets every task run until all wait, then moves time on by a millisecond
/// (paused time only advances once nothing can run).
async fn settle() {
    tokio::time::sleep(Duration::from_millis(1)).await;
}

fn chat(session: u8) -> SessionKey {
    SessionKey::from(format!("chat-{session}"))
}

impl Sim {
    /// Seed `seed`, its store in SQLite or in memory; `keep_trace` records its
    /// trace (see [`crate::state::Trace`]).
    pub(crate) fn new(seed: u64, sqlite: bool, keep_trace: bool) -> Self {
        let settings =
            Settings { max_concurrent_runs: 2, queue_cap: None, drop: DropPolicy::Oldest };
        let shared = Shared::new(seed, settings.max_concurrent_runs, keep_trace);
        let (store, dir) = if sqlite {
            // On a RAM disk where there is one: the file is real, the disk is not the point.
            let shm = std::path::Path::new("/dev/shm");
            let dir = if shm.is_dir() { tempfile::tempdir_in(shm) } else { tempfile::tempdir() };
            let dir = dir.expect("a temp dir");
            let store =
                StoreHandle::open_sqlite_inline(&dir.path().join("lemon.db")).expect("sqlite");
            (store, Some(dir))
        } else {
            (StoreHandle::memory(), None)
        };
        Sim {
            shared,
            store,
            _dir: dir,
            settings,
            generation: None,
            next_message: 0,
            idle_tasks: None,
        }
    }

    /// The whole seed: boot, `steps` operations with the invariants checked
    /// after each, then quiescence and the final checks; and its trace.
    pub(crate) fn run(&mut self) -> (Outcome, Traced) {
        let outcome = self.steps();
        let mut world = self.shared.lock();
        world.note(format_args!("outcome {outcome:?}"));
        let trace = world.trace.finish();
        (outcome, trace)
    }

    fn steps(&mut self) -> Outcome {
        self.boot();
        let steps = 6 + self.shared.lock().rng.below(18);
        for step in 0..steps {
            self.shared.lock().step = usize::try_from(step).unwrap_or(usize::MAX) + 1;
            let op = self.draw();
            self.apply(op);
            let checked = self.check_step();
            {
                let _runtime = self.generation().runtime.enter();
                let mut world = self.shared.lock();
                let rng = world.rng.clone();
                world.note(format_args!("step {step} {op:?}: {checked:?}, {rng:?}"));
            }
            checked.map_err(|e| format!("after step {step} ({op:?}): {e}"))?;
        }
        self.finish()
    }

    fn boot(&mut self) {
        let runtime = runtime();
        let (shared, store, settings) = (self.shared.clone(), self.store.clone(), self.settings);
        let generation = runtime.block_on(async move {
            shared.lock().booted();
            let _ = store.flush().await;
            let token = CancellationToken::new();
            let tracker = TaskTracker::new();
            let engine_tasks = TaskTracker::new();
            let mut engines = EngineRegistry::new();
            engines
                .register(Arc::new(SimEngine::new(shared.clone(), engine_tasks.clone())))
                .expect("one engine");
            // Drained after every step, which publishes far fewer events than this.
            let bus = EventBus::new(4096, 256);
            let firehose = bus.subscribe_all();
            let deps =
                GatewayDeps { config: settings.runtime(), engines, store: store.clone(), bus };
            let gateway = GatewayHandle::start(deps, token.clone(), &tracker);
            let router =
                RouterHandle::start(settings.router(), gateway.clone(), token.clone(), &tracker);
            let channel = Channel::start(&shared, router.clone(), store, token.clone(), &tracker);
            channel.recover().await;
            settle().await;
            (gateway, router, channel, firehose, tracker, engine_tasks, token)
        });
        let (gateway, router, channel, firehose, tracker, engine_tasks, token) = generation;
        if self.idle_tasks.is_none() {
            self.idle_tasks = Some(tracker.len());
        }
        self.generation = Some(Generation {
            gateway,
            router,
            channel,
            firehose,
            tracker,
            engine_tasks,
            _token: token,
            runtime,
        });
        self.collect();
    }

    fn draw(&mut self) -> Op {
        let mut world = self.shared.lock();
        let n_requests = world.requests.len().max(1);
        let rng = &mut world.rng;
        let session = rng.below(SESSIONS) as u8;
        match rng.below(100) {
            0..=44 => {
                let mode = rng.weighted(&[
                    (30, QueueMode::Collect),
                    (20, QueueMode::Followup),
                    (15, QueueMode::Steer),
                    (10, QueueMode::SteerBacklog),
                    (5, QueueMode::Redirect),
                    (20, QueueMode::Interrupt),
                ]);
                let token = rng.chance(15).then(|| rng.index(TOKENS.len()));
                Op::Submit { session, mode, token }
            }
            45..=59 => Op::Advance { ms: rng.below(1500) },
            60..=64 => Op::CancelSession { session },
            65..=68 => Op::AbortSession { session },
            69..=72 => Op::AbortRun { pick: rng.index(n_requests) },
            73..=76 => Op::CancelRun { pick: rng.index(n_requests) },
            77..=82 => Op::Reload(Settings {
                max_concurrent_runs: 1 + rng.index(4),
                queue_cap: rng.chance(50).then(|| 1 + rng.index(3)),
                drop: if rng.chance(50) { DropPolicy::Oldest } else { DropPolicy::Newest },
            }),
            83..=94 => Op::DeliveryFails { chat: session, calls: 1 + rng.below(3) as u32 },
            _ => Op::Restart { settle: rng.chance(70), polls: rng.below(40) },
        }
    }

    fn generation(&self) -> &Generation {
        self.generation.as_ref().expect("a running generation")
    }

    fn apply(&mut self, op: Op) {
        if let Op::Restart { settle: quiet, polls } = op {
            let generation = self.generation.take().expect("a running generation");
            generation.runtime.block_on(async {
                if quiet {
                    settle().await;
                } else {
                    for _ in 0..polls {
                        tokio::task::yield_now().await;
                    }
                }
            });
            self.generation = Some(generation);
            self.collect();
            // The crash: every task, process and buffer of the generation goes;
            // the store stays.
            drop(self.generation.take());
            let mut world = self.shared.lock();
            world.running.clear();
            world.generation += 1;
            drop(world);
            self.boot();
            return;
        }
        if let Op::Reload(settings) = op {
            self.settings = settings;
            let mut world = self.shared.lock();
            let step = world.step;
            world.caps.push((step, settings.max_concurrent_runs));
        }
        let text = format!("m{}", self.next_message);
        if matches!(op, Op::Submit { .. }) {
            self.next_message += 1;
        }
        let shared = self.shared.clone();
        let generation = self.generation();
        generation.runtime.block_on(async {
            act(&shared, generation, op, text).await;
            settle().await;
        });
        self.collect();
    }

    /// Reads what the bus published since the last look into the world.
    fn collect(&mut self) {
        let Some(generation) = self.generation.as_mut() else { return };
        let _guard = generation.runtime.enter();
        let mut world = self.shared.lock();
        let number = world.generation;
        while let Some(event) = generation.firehose.recv().now_or_never() {
            match event {
                Ok(event) => {
                    if let EventKind::RunCompleted { completion, .. } = &event.kind {
                        world.note(format_args!("{} completed {completion:?}", event.run_id));
                        let seen = Seen { completion: completion.clone(), generation: number };
                        let all = world.completions.entry(event.run_id.clone()).or_default();
                        // One read back from the store before the bus had it is
                        // the same completion (the store's count is checked
                        // at the end).
                        all.retain(|s| s.generation != FROM_STORE);
                        all.push(seen);
                    }
                }
                Err(RecvError::Lagged(n)) => {
                    world.violation(format!("the firehose lost {n} events"))
                }
                Err(RecvError::Closed) => break,
            }
        }
    }

    /// What must hold after every step.
    fn check_step(&self) -> Outcome {
        let world = self.shared.lock();
        if let Some(v) = world.violations.first() {
            return Err(v.clone());
        }
        for (run_id, seen) in &world.completions {
            if seen.len() > 1 {
                let generations: Vec<usize> = seen.iter().map(|s| s.generation).collect();
                return Err(format!(
                    "{run_id} completed {} times (generations {generations:?})",
                    seen.len()
                ));
            }
            if world.request_of(run_id.as_str()).is_none() {
                return Err(format!("{run_id} completed but was never accepted"));
            }
        }
        let mut delivered: HashMap<&str, usize> = HashMap::new();
        for (run_id, _) in &world.delivered {
            let n = delivered.entry(run_id.as_str()).or_default();
            *n += 1;
            if *n > 1 {
                return Err(format!("the answer of {run_id} was delivered {n} times"));
            }
        }
        Ok(())
    }

    /// Lets everything finish, then checks what must hold at quiescence.
    fn finish(&mut self) -> Outcome {
        self.shared.lock().failing.clear();
        self.quiesce(true)?;
        self.check_step()?;
        self.check_answers()?;
        self.check_steers_and_order()?;
        self.probe_locks()?;
        self.quiesce(false)?;
        self.check_step()?;
        self.check_product_idle()?;
        let generation = self.generation();
        let idle = self.idle_tasks.unwrap_or(0);
        if generation.tracker.len() != idle {
            return Err(format!(
                "{} gateway tasks left at the end, {idle} expected",
                generation.tracker.len()
            ));
        }
        if !generation.engine_tasks.is_empty() {
            return Err(format!("{} engine processes left", generation.engine_tasks.len()));
        }
        Ok(())
    }

    /// Advances time a few seconds at a time until nothing is owed.
    fn quiesce(&mut self, deliveries: bool) -> Outcome {
        let mut waiting = String::new();
        for _ in 0..QUIET_WITHIN_S / QUIET_STEP_S {
            self.collect();
            let shared = self.shared.clone();
            let generation = self.generation();
            let outstanding = generation.runtime.block_on(async {
                completions_from_store(&shared, generation).await;
                outstanding(&shared, generation, deliveries).await
            });
            match outstanding {
                None => return Ok(()),
                Some(what) => waiting = what,
            }
            generation
                .runtime
                .block_on(async { tokio::time::sleep(Duration::from_secs(QUIET_STEP_S)).await });
        }
        Err(format!("not quiet after {QUIET_WITHIN_S} simulated seconds: {waiting}"))
    }

    /// Each request: its one final completion, delivered once, with the text
    /// the engine streamed when it succeeded.
    fn check_answers(&self) -> Outcome {
        let world = self.shared.lock();
        let generation = self.generation();
        for request in world.requests.iter().filter(|r| !r.probe) {
            let final_run =
                final_run(&world.completions, &request.run_id).map_err(|(_, why)| why)?;
            let completion = &world.completions[&final_run][0].completion;
            if completion.ok {
                // A steer the engine took completes with the run it went into.
                let host = world.steers.iter().find(|(_, text)| *text == request.text);
                let producer = host.map_or(&final_run, |(host, _)| host);
                let emitted = world.emitted.get(producer).map_or("", String::as_str);
                if completion.answer != emitted {
                    return Err(format!(
                        "{} answered {:?}, the engine streamed {emitted:?} in {producer}",
                        request.run_id, completion.answer
                    ));
                }
            }
            let texts: Vec<&String> = world
                .delivered
                .iter()
                .filter(|(id, _)| *id == request.run_id.as_str())
                .map(|(_, text)| text)
                .collect();
            let expected = plain_answer(&generation.router, completion, true).unwrap_or_default();
            match texts.as_slice() {
                [text] if **text == expected => {}
                [text] => {
                    return Err(format!(
                        "{} delivered {text:?}, its completion reads {expected:?}",
                        request.run_id
                    ))
                }
                [] => return Err(format!("the answer of {} was never delivered", request.run_id)),
                more => {
                    return Err(format!(
                        "the answer of {} delivered {} times",
                        request.run_id,
                        more.len()
                    ))
                }
            }
        }
        Ok(())
    }

    /// No request ran (or was steered in) twice, every successful one ran or
    /// was steered in exactly once, a steer the engine took completed with
    /// the run it went into, and collected or followup requests of a
    /// conversation started in the order they were accepted.
    fn check_steers_and_order(&self) -> Outcome {
        let world = self.shared.lock();
        let first_runs: Vec<&crate::state::Start> = world
            .starts
            .iter()
            .filter(|s| origin_of(s.run_id.as_str()) == s.run_id.as_str())
            .collect();
        let mut first_start: HashMap<&str, usize> = HashMap::new();
        let mut n_started: HashMap<&str, usize> = HashMap::new();
        for (at, start) in first_runs.iter().enumerate() {
            for line in &start.lines {
                first_start.entry(line.as_str()).or_insert(at);
                *n_started.entry(line.as_str()).or_default() += 1;
            }
        }
        for request in world.requests.iter().filter(|r| !r.probe) {
            let steered: Vec<&RunId> = world
                .steers
                .iter()
                .filter(|(_, text)| *text == request.text)
                .map(|(host, _)| host)
                .collect();
            let started = n_started.get(request.text.as_str()).copied().unwrap_or(0);
            let times = started + steered.len();
            if times > 1 {
                return Err(format!(
                    "{} ({:?}) reached the engine {times} times: started {started}, steered into {steered:?}",
                    request.run_id, request.mode
                ));
            }
            let completion = &world.completions[&request.run_id][0].completion;
            if completion.ok && times == 0 {
                return Err(format!(
                    "{} ({:?}) completed ok but never reached the engine",
                    request.run_id, request.mode
                ));
            }
            if let [host] = steered.as_slice() {
                let Some(hosted) = world.completions.get(*host) else {
                    return Err(format!(
                        "{host}, which took the steer {}, never completed",
                        request.run_id
                    ));
                };
                let hosted = &hosted[0].completion;
                if hosted.ok != completion.ok || hosted.error != completion.error {
                    return Err(format!(
                        "{} was steered into {host} but completed {:?}/{:?}, the run {:?}/{:?}",
                        request.run_id, completion.ok, completion.error, hosted.ok, hosted.error
                    ));
                }
            }
        }
        let mut by_conversation: HashMap<&str, Vec<&Request>> = HashMap::new();
        for request in world
            .requests
            .iter()
            .filter(|r| !r.probe && matches!(r.mode, QueueMode::Collect | QueueMode::Followup))
        {
            by_conversation.entry(request.conversation.as_str()).or_default().push(request);
        }
        for (conversation, requests) in by_conversation {
            let mut last: Option<(&Request, usize)> = None;
            for request in requests {
                let Some(&at) = first_start.get(request.text.as_str()) else { continue };
                if let Some((before, before_at)) = last {
                    if at < before_at {
                        return Err(format!(
                            "in {conversation}, {} started before {}, which was accepted first",
                            request.run_id, before.run_id
                        ));
                    }
                }
                last = Some((request, at));
            }
        }
        Ok(())
    }

    /// The router, the scheduler, the journal and the store hold nothing.
    fn check_product_idle(&self) -> Outcome {
        let world = self.shared.lock();
        let mut ids: Vec<RunId> = world.requests.iter().map(|r| r.run_id.clone()).collect();
        ids.extend(world.completions.keys().cloned());
        drop(world);
        let generation = self.generation();
        let store = self.store.clone();
        generation.runtime.block_on(async {
            for session in 0..SESSIONS as u8 {
                let view =
                    generation.router.session(&chat(session)).await.map_err(|e| e.to_string())?;
                if !view.active.is_empty() || !view.queued.is_empty() || view.pending_steers > 0 {
                    return Err(format!("chat-{session} still holds {view:?}"));
                }
            }
            let snapshot = generation.gateway.snapshot().await.map_err(|e| e.to_string())?;
            if snapshot.in_flight != 0 || snapshot.queued != 0 || snapshot.conversations != 0 {
                return Err(format!("the scheduler still holds {snapshot:?}"));
            }
            let pending = store.journal_pending().await.map_err(|e| e.to_string())?;
            if let Some(entry) = pending.first() {
                return Err(format!(
                    "{} journaled requests left, {} first",
                    pending.len(),
                    entry.run_id
                ));
            }
            for run_id in &ids {
                let events = store.run_events(run_id.as_str()).await.map_err(|e| e.to_string())?;
                let n = events.iter().filter(|e| e.kind == "run_completed").count();
                if n != 1 {
                    return Err(format!("{run_id} has {n} stored completions"));
                }
                let record = store.get_run(run_id.as_str()).await.map_err(|e| e.to_string())?;
                match record {
                    Some(record) if record.status.is_terminal() => {}
                    Some(record) => {
                        return Err(format!("{run_id} is stored as {:?}", record.status))
                    }
                    None => return Err(format!("{run_id} has no stored run")),
                }
            }
            Ok(())
        })
    }

    /// A run on every session and every shared resume token: each must get a
    /// slot and its engine lock at once, so none was left held.
    fn probe_locks(&mut self) -> Outcome {
        // Every lock key the seed used: the sessions, and the shared tokens
        // (explicit, or reported by the engine and then resumed).
        let (sessions, tokens) = {
            let world = self.shared.lock();
            let sessions: BTreeSet<String> =
                world.requests.iter().map(|r| r.session_key.clone()).collect();
            let tokens: Vec<&str> =
                TOKENS.into_iter().filter(|t| world.reported.contains(*t)).collect();
            (sessions, tokens)
        };
        let mut probes: Vec<(RunRequest, String)> = sessions
            .into_iter()
            .map(|s| {
                let conversation = format!("session:{s}");
                (RunRequest::new(s, "probe"), conversation)
            })
            .collect();
        for token in tokens {
            let req = RunRequest {
                resume: Some(ResumeToken::new(ENGINE, token)),
                ..RunRequest::new(chat(0), "probe")
            };
            probes.push((req, format!("resume:{ENGINE}:{token}")));
        }
        let shared = self.shared.clone();
        let generation = self.generation();
        let accepted = generation.runtime.block_on(async {
            let mut accepted = Vec::new();
            for (n, (mut req, conversation)) in probes.into_iter().enumerate() {
                let run_id = RunId::parse(&format!("probe{n}")).expect("valid id");
                req.run_id = Some(run_id.clone());
                {
                    let mut world = shared.lock();
                    let step = world.step;
                    let at = world.requests.len();
                    world.by_id.insert(run_id.clone(), at);
                    world.requests.push(Request {
                        run_id: run_id.clone(),
                        session_key: "chat-0".to_owned(),
                        mode: QueueMode::Collect,
                        conversation,
                        text: String::new(),
                        step,
                        probe: true,
                    });
                }
                match generation.router.submit(req).await {
                    Ok(Submitted::Run(..)) => accepted.push(run_id),
                    Ok(other) => return Err(format!("probe answered {other:?}")),
                    Err(error) => return Err(format!("probe refused: {error}")),
                }
            }
            Ok(accepted)
        })?;
        self.quiesce(false)?;
        let world = self.shared.lock();
        for run_id in accepted {
            match world.completions.get(&run_id).map(|seen| &seen[0].completion) {
                Some(completion) if completion.ok => {}
                Some(completion) => {
                    return Err(format!("probe {run_id} failed: {:?}", completion.error))
                }
                None => return Err(format!("probe {run_id} never completed")),
            }
        }
        Ok(())
    }
}

/// The run whose completion answers `run_id` (its retry's, if it was retried).
fn final_run(
    completions: &std::collections::BTreeMap<RunId, Vec<Seen>>,
    run_id: &RunId,
) -> Result<RunId, (RunId, String)> {
    let mut at = run_id.clone();
    loop {
        let Some(seen) = completions.get(&at) else {
            let why = format!("{at} never completed");
            return Err((at, why));
        };
        match &seen[0].completion.retried_by {
            Some(next) => at = next.clone(),
            None => return Ok(at),
        }
    }
}

/// A crash between the store and the bus leaves a completion that only the
/// store has (a follower reads it there): the runs still waiting for theirs
/// get it from the store.
async fn completions_from_store(shared: &Shared, generation: &Generation) {
    let missing: Vec<RunId> = {
        let world = shared.lock();
        world
            .requests
            .iter()
            .filter_map(|r| final_run(&world.completions, &r.run_id).err().map(|(at, _)| at))
            .collect()
    };
    for run_id in missing {
        let mut follower = generation.router.follow(&run_id).without_retries();
        let wait = tokio::time::timeout(Duration::from_millis(1), follower.completion());
        if let Ok(Some(event)) = wait.await {
            if let EventKind::RunCompleted { completion, .. } = &event.kind {
                let seen = Seen { completion: completion.clone(), generation: FROM_STORE };
                let mut world = shared.lock();
                world.note(format_args!("{run_id} completed, read from the store {completion:?}"));
                let all = world.completions.entry(run_id).or_default();
                if all.is_empty() {
                    all.push(seen);
                }
            }
        }
    }
}

/// What is still owed, or `None` when everything is done.
async fn outstanding(shared: &Shared, generation: &Generation, deliveries: bool) -> Option<String> {
    {
        let world = shared.lock();
        for request in &world.requests {
            if let Err((_, why)) = final_run(&world.completions, &request.run_id) {
                return Some(why);
            }
        }
        if let Some(run_id) = world.running.keys().next() {
            return Some(format!("the engine still runs {run_id}"));
        }
        if deliveries {
            let delivered: BTreeSet<&str> =
                world.delivered.iter().map(|(id, _)| id.as_str()).collect();
            if let Some(r) =
                world.requests.iter().find(|r| !r.probe && !delivered.contains(r.run_id.as_str()))
            {
                return Some(format!("the answer of {} is not delivered", r.run_id));
            }
        }
    }
    if deliveries {
        if let Some(key) = generation.channel.owed().await.first() {
            return Some(format!("the delivery of {key} is still on record"));
        }
    }
    match generation.gateway.snapshot().await {
        Ok(s) if s.in_flight == 0 && s.queued == 0 => None,
        Ok(s) => Some(format!("the scheduler holds {s:?}")),
        Err(e) => Some(e.to_string()),
    }
}

/// Carries out one operation on a generation.
async fn act(shared: &Shared, generation: &Generation, op: Op, text: String) {
    let pick = |pick: usize| -> Option<RunId> {
        let world = shared.lock();
        world.requests.iter().filter(|r| !r.probe).nth(pick).map(|r| r.run_id.clone())
    };
    let router = &generation.router;
    match op {
        Op::Submit { session, mode, token } => {
            let run_id = RunId::parse(&format!("r{}", &text[1..])).expect("valid id");
            let conversation = match token {
                Some(t) => format!("resume:{ENGINE}:{}", TOKENS[t]),
                None => format!("session:chat-{session}"),
            };
            let req = RunRequest {
                origin: Origin::Channel,
                queue_mode: Some(mode),
                run_id: Some(run_id.clone()),
                resume: token.map(|t| ResumeToken::new(ENGINE, TOKENS[t])),
                ..RunRequest::new(chat(session), text.clone())
            };
            // Known before it is submitted: the engine may start it at once.
            {
                let mut world = shared.lock();
                let step = world.step;
                let at = world.requests.len();
                world.by_id.insert(run_id.clone(), at);
                world.requests.push(Request {
                    run_id: run_id.clone(),
                    session_key: format!("chat-{session}"),
                    mode,
                    conversation: conversation.clone(),
                    text,
                    step,
                    probe: false,
                });
            }
            let submitted = generation.channel.submit(session, req).await;
            shared.lock().note(format_args!("submit {run_id}: {submitted:?}"));
            match submitted {
                Ok(accepted) if accepted.conversation.to_string() == conversation => {}
                Ok(accepted) => shared.lock().violation(format!(
                    "{run_id} was put in {}, not {conversation}",
                    accepted.conversation
                )),
                Err(error) => shared.lock().violation(format!("{run_id} was refused: {error}")),
            }
        }
        Op::CancelSession { session } => {
            let done = router.cancel_session(&chat(session)).await;
            shared.lock().note(format_args!("cancel chat-{session}: {done:?}"));
        }
        Op::AbortSession { session } => {
            let done = router.abort_session(&chat(session)).await;
            shared.lock().note(format_args!("abort chat-{session}: {done:?}"));
        }
        Op::AbortRun { pick: n } => {
            if let Some(run_id) = pick(n) {
                let done = router.abort_run(&run_id).await;
                shared.lock().note(format_args!("abort {run_id}: {done:?}"));
            }
        }
        Op::CancelRun { pick: n } => {
            if let Some(run_id) = pick(n) {
                let done = router.cancel_run(&run_id).await;
                shared.lock().note(format_args!("cancel {run_id}: {done:?}"));
            }
        }
        Op::Advance { ms } => tokio::time::sleep(Duration::from_millis(ms)).await,
        Op::Reload(settings) => {
            let _ = generation.gateway.reload(settings.runtime()).await;
            let _ = router.reload(settings.router()).await;
        }
        Op::DeliveryFails { chat, calls } => {
            let mut world = shared.lock();
            let left = world.failing.entry(chat).or_default();
            *left = (*left).max(calls);
        }
        Op::Restart { .. } => unreachable!("restarts are carried out by the driver"),
    }
}
