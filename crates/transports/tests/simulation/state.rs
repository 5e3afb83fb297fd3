//! What the simulation knows, shared by its driver, the scripted engine and the
//! fake destination, and kept across restarts (it is the outside world: the
//! engine's processes, the chat, the person who sent the messages). The
//! invariants are checked against this record, never against the product's own
//! bookkeeping.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, Mutex, MutexGuard};

use lemon_core::config::QueueMode;
use lemon_core::engine::Completion;
use lemon_core::ids::RunId;

use crate::rng::Rng;

/// One request the simulated user submitted and the router accepted.
#[derive(Debug, Clone)]
pub(crate) struct Request {
    pub(crate) run_id: RunId,
    pub(crate) session_key: String,
    pub(crate) mode: QueueMode,
    /// `session:<key>` or `resume:sim:<token>`, as the router's documentation
    /// says it must be for this request.
    pub(crate) conversation: String,
    /// The request's one line of text (`m<n>`), unique in the seed.
    pub(crate) text: String,
    /// The step it was accepted at.
    pub(crate) step: usize,
    /// A probe of the final check, submitted past the channel (nothing delivered).
    pub(crate) probe: bool,
}

/// An engine run that has started and not stopped yet: its process is alive.
#[derive(Debug, Clone)]
pub(crate) struct Live {
    pub(crate) conversation: String,
    pub(crate) lock_key: String,
}

/// One start of the engine.
#[derive(Debug, Clone)]
pub(crate) struct Start {
    pub(crate) run_id: RunId,
    /// The request lines (`m<n>`) its prompt carried.
    pub(crate) lines: Vec<String>,
}

/// One completion as the bus published it.
#[derive(Debug, Clone)]
pub(crate) struct Seen {
    pub(crate) completion: Completion,
    pub(crate) generation: usize,
}

/// What a seed did, as one hash (and, when asked, the lines it hashed): each
/// step's operation and the generator's state after it, every engine start
/// with its script, every steer, word, exit, delivery attempt and completion,
/// each with the paused time it happened at. Two runs of one seed must give
/// the same trace, whatever the machine is doing. Kept only when asked for:
/// writing it costs more than the rest of a memory seed.
#[derive(Debug)]
pub(crate) struct Trace {
    hash: DefaultHasher,
    /// Paused time when the current generation booted.
    epoch: Option<tokio::time::Instant>,
    /// `None` when the trace is not kept.
    lines: Option<Vec<String>>,
}

/// A finished trace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Traced {
    pub(crate) hash: u64,
    pub(crate) lines: Vec<String>,
}

impl Trace {
    fn new(keep: bool) -> Self {
        Trace { hash: DefaultHasher::new(), epoch: None, lines: keep.then(Vec::new) }
    }

    fn note(&mut self, generation: usize, what: fmt::Arguments<'_>) {
        let Some(lines) = &mut self.lines else { return };
        // Paused time only means something inside the generation's runtime.
        let at = match (self.epoch, tokio::runtime::Handle::try_current()) {
            (Some(epoch), Ok(_)) => {
                format!("+{}ms", tokio::time::Instant::now().duration_since(epoch).as_millis())
            }
            _ => "outside".to_owned(),
        };
        let line = format!("g{generation} {at} {what}");
        line.hash(&mut self.hash);
        lines.push(line);
    }

    /// The trace (empty when it was not kept).
    pub(crate) fn finish(&mut self) -> Traced {
        Traced { hash: self.hash.finish(), lines: self.lines.take().unwrap_or_default() }
    }
}

#[derive(Debug)]
pub(crate) struct World {
    pub(crate) rng: Rng,
    /// The driver's step counter.
    pub(crate) step: usize,
    /// The process generation (restarts so far).
    pub(crate) generation: usize,
    /// `max_concurrent_runs` from the step it was set at.
    pub(crate) caps: Vec<(usize, usize)>,
    pub(crate) requests: Vec<Request>,
    /// Run ids of requests, by id, into `requests`.
    pub(crate) by_id: HashMap<RunId, usize>,
    /// The engine's processes that are alive, by run.
    pub(crate) running: HashMap<RunId, Live>,
    pub(crate) starts: Vec<Start>,
    /// Steers the engine took: (the run, the text).
    pub(crate) steers: Vec<(RunId, String)>,
    /// Resume tokens the engine reported or was started with.
    pub(crate) reported: std::collections::HashSet<String>,
    /// The text each run streamed.
    pub(crate) emitted: HashMap<RunId, String>,
    /// Every `run_completed` the bus published, by run.
    pub(crate) completions: BTreeMap<RunId, Vec<Seen>>,
    /// Messages the destination accepted: (run id, text).
    pub(crate) delivered: Vec<(String, String)>,
    /// Calls each destination still refuses.
    pub(crate) failing: HashMap<u8, u32>,
    /// Broken invariants seen by the engine, the destination or the collector.
    pub(crate) violations: Vec<String>,
    pub(crate) trace: Trace,
}

/// The shared world. Cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct Shared(Arc<Mutex<World>>);

impl Shared {
    pub(crate) fn new(seed: u64, cap: usize, keep_trace: bool) -> Self {
        Shared(Arc::new(Mutex::new(World {
            rng: Rng::new(seed),
            step: 0,
            generation: 0,
            caps: vec![(0, cap)],
            requests: Vec::new(),
            by_id: HashMap::new(),
            running: HashMap::new(),
            starts: Vec::new(),
            steers: Vec::new(),
            reported: std::collections::HashSet::new(),
            emitted: HashMap::new(),
            completions: BTreeMap::new(),
            delivered: Vec::new(),
            failing: HashMap::new(),
            violations: Vec::new(),
            trace: Trace::new(keep_trace),
        })))
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, World> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The run a (possibly retried) run answers for: `r1.retry` → `r1`.
pub(crate) fn origin_of(run_id: &str) -> &str {
    let mut id = run_id;
    while let Some(base) = id.strip_suffix(".retry") {
        id = base;
    }
    id
}

impl World {
    /// The most slots that can be held now by runs accepted at or after `since`:
    /// the cap in force at that step or any set later.
    pub(crate) fn cap_bound(&self, since: usize) -> usize {
        let mut bound = 0;
        for (i, (step, cap)) in self.caps.iter().enumerate() {
            let next = self.caps.get(i + 1).map_or(usize::MAX, |(s, _)| *s);
            if next > since || *step >= since {
                bound = bound.max(*cap);
            }
        }
        bound
    }

    /// The request a run answers for (itself, or the request it is a retry of).
    pub(crate) fn request_of(&self, run_id: &str) -> Option<&Request> {
        self.by_id.get(origin_of(run_id)).map(|&i| &self.requests[i])
    }

    pub(crate) fn violation(&mut self, what: String) {
        self.note(format_args!("violation {what}"));
        self.violations.push(what);
    }

    /// Adds `what` to the trace, at the current paused time.
    pub(crate) fn note(&mut self, what: fmt::Arguments<'_>) {
        let generation = self.generation;
        self.trace.note(generation, what);
    }

    /// A generation booted: paused time in the trace counts from now (call on
    /// its runtime).
    pub(crate) fn booted(&mut self) {
        self.trace.epoch = Some(tokio::time::Instant::now());
        self.note(format_args!("booted"));
    }
}
