//! Deterministic simulation of the router, the runtime and the delivery layer
//! (in the style of FoundationDB's and TigerBeetle's): paused time, one seeded
//! random generator deciding every choice, a scripted engine and destination,
//! the store in memory (and in a real SQLite file for one seed in 100, one in
//! 10 with `LEMON_SIM_SQLITE=1`), and random submits
//! in every queue mode, cancels, aborts, engine crashes and hangs, reloads,
//! delivery failures and restarts from the journal, with the invariants
//! checked after every step and at the end (see ARCHITECTURE.md, Simulation).
//!
//! `LEMON_SIM_SEEDS=N` runs seeds 0..N (10 000 by default), `LEMON_SIM_SEED=N`
//! only seed N; a failing seed is reported with the one command that reruns it.
//!
//! A seed is deterministic: each run of it gives the same trace (every step,
//! draw, engine start, delivery and completion, at the same paused time),
//! whatever the machine's load. The SQLite store is opened inline (no writer
//! thread), or paused time would jump ahead whenever the runtime waited idle
//! for the writer; a second test replays seeds of both stores on a machine
//! loaded on purpose and compares their traces.

mod channel;
mod driver;
mod engine;
mod rng;
mod state;

use state::Traced;

use std::cell::RefCell;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, Once};

const DEFAULT_SEEDS: u64 = 10_000;
/// One seed in this many keeps its store in SQLite (slower: a real file).
const SQLITE_EVERY: u64 = 100;
/// With `LEMON_SIM_SQLITE=1`, one seed in this many.
const MORE_SQLITE_EVERY: u64 = 10;
/// Rounds of 10 000 multiplications a load thread spins at most.
const MAX_LOAD_ROUNDS: u64 = 3_000_000;
/// SQLite seeds the replay test runs twice: the first ones of the default run.
const SQLITE_REPLAYED: u64 = 16;
/// Memory seeds the replay test runs twice: the first ones, and 85, which once
/// replayed differently (a session-wide abort completed its conversations in
/// the router's hash order).
const MEMORY_REPLAYED: [std::ops::Range<u64>; 2] = [0..24, 85..86];

fn more_sqlite() -> bool {
    std::env::var("LEMON_SIM_SQLITE").is_ok_and(|v| v == "1")
}

/// Whether seed `seed` keeps its store in SQLite (every seed the default run
/// gives SQLite keeps it with `LEMON_SIM_SQLITE=1` too).
fn is_sqlite(seed: u64) -> bool {
    seed % SQLITE_EVERY == SQLITE_EVERY - 1
        || (more_sqlite() && seed % MORE_SQLITE_EVERY == MORE_SQLITE_EVERY - 1)
}

thread_local! {
    /// Panics on this thread since the seed began (a product task that
    /// panicked is caught by tokio; this is how the seed hears of it).
    static PANICS: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
}

fn record_panics() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            PANICS.with(|p| p.borrow_mut().push(info.to_string().replace('\n', " ")));
            default(info);
        }));
    });
}

fn env_u64(name: &str) -> Option<u64> {
    let raw = std::env::var(name).ok()?;
    Some(raw.trim().parse().unwrap_or_else(|_| panic!("{name} must be a number, not {raw:?}")))
}

/// Runs one seed; the reason it failed, on one line.
fn run_seed(seed: u64) -> Result<(), String> {
    trace_seed(seed, is_sqlite(seed), false).0
}

/// Runs one seed with its store in SQLite or in memory: the reason it failed,
/// on one line, and its trace (none if it panicked).
fn trace_seed(seed: u64, sqlite: bool, keep_trace: bool) -> (Result<(), String>, Option<Traced>) {
    PANICS.with(|p| p.borrow_mut().clear());
    let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| {
        driver::Sim::new(seed, sqlite, keep_trace).run()
    }));
    let panics = PANICS.with(|p| std::mem::take(&mut *p.borrow_mut()));
    let store = if sqlite { "sqlite" } else { "memory" };
    match outcome {
        _ if !panics.is_empty() => (Err(format!("[{store}] a task panicked: {}", panics[0])), None),
        Ok((Ok(()), trace)) => (Ok(()), Some(trace)),
        Ok((Err(reason), trace)) => {
            (Err(format!("[{store}] {}", reason.replace('\n', " "))), Some(trace))
        }
        Err(_) => (Err(format!("[{store}] the simulation panicked")), None),
    }
}

fn repro(seed: u64) -> String {
    let more = seed % SQLITE_EVERY != SQLITE_EVERY - 1 && is_sqlite(seed);
    let sqlite = if more { "LEMON_SIM_SQLITE=1 " } else { "" };
    format!("{sqlite}LEMON_SIM_SEED={seed} cargo test -p lemon-transports --test simulation")
}

#[test]
fn router_runtime_and_delivery_keep_their_guarantees_under_random_faults() {
    record_panics();
    if let Some(seed) = env_u64("LEMON_SIM_SEED") {
        if let Err(reason) = run_seed(seed) {
            panic!("simulation seed {seed} failed: {reason} -- rerun: {}", repro(seed));
        }
        return;
    }
    let seeds = env_u64("LEMON_SIM_SEEDS").unwrap_or(DEFAULT_SEEDS);
    let next = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    let failures: Mutex<Vec<(u64, String)>> = Mutex::new(Vec::new());
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get()).clamp(1, 4);
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    let seed = next.fetch_add(1, Ordering::Relaxed);
                    if seed >= seeds {
                        return;
                    }
                    if let Err(reason) = run_seed(seed) {
                        failures.lock().unwrap().push((seed, reason));
                        stop.store(true, Ordering::Relaxed);
                    }
                }
            });
        }
    });
    let mut failures = failures.into_inner().unwrap();
    failures.sort();
    if let Some((seed, reason)) = failures.first() {
        panic!("simulation seed {seed} failed: {reason} -- rerun: {}", repro(*seed));
    }
}

/// Threads that keep every core busy until stopped (or for a few million
/// rounds at most, a few minutes), so that anything waiting for another
/// thread waits longer than usual.
struct Load {
    stop: std::sync::Arc<AtomicBool>,
    spins: std::sync::Arc<AtomicU64>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Load {
    fn start() -> Load {
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let spins = std::sync::Arc::new(AtomicU64::new(0));
        let n = 2 * std::thread::available_parallelism().map_or(2, |n| n.get()).min(8);
        let threads = (0..n)
            .map(|_| {
                let (stop, spins) = (stop.clone(), spins.clone());
                std::thread::spawn(move || {
                    let mut x = 1_u64;
                    for _ in 0..MAX_LOAD_ROUNDS {
                        if stop.load(Ordering::Relaxed) {
                            break;
                        }
                        for _ in 0..10_000 {
                            x = std::hint::black_box(
                                x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1),
                            );
                        }
                        spins.fetch_add(1, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        Load { stop, spins, threads }
    }

    /// Stops the threads; how many rounds they spun.
    fn stop(mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
        self.spins.load(Ordering::Relaxed)
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Where two traces of one seed part: each one's lines leading up to it.
fn first_difference(a: &Traced, b: &Traced) -> String {
    let at = a.lines.iter().zip(&b.lines).position(|(x, y)| x != y);
    let at = at.unwrap_or(a.lines.len().min(b.lines.len()));
    let context =
        |t: &Traced| t.lines[at.saturating_sub(30)..(at + 3).min(t.lines.len())].join("\n");
    format!("at line {at}; the first run:\n{}\nagain:\n{}", context(a), context(b))
}

#[test]
fn seeds_replay_the_same_trace_when_the_machine_is_loaded() {
    record_panics();
    let sqlite = (0..SQLITE_REPLAYED).map(|n| (n * SQLITE_EVERY + SQLITE_EVERY - 1, true));
    let memory = MEMORY_REPLAYED.into_iter().flatten().map(|n| (n, false));
    let seeds: Vec<(u64, bool)> = sqlite.chain(memory).collect();
    let first: Vec<_> =
        seeds.iter().map(|&(seed, sqlite)| trace_seed(seed, sqlite, true)).collect();
    let load = Load::start();
    let again: Vec<_> =
        seeds.iter().map(|&(seed, sqlite)| trace_seed(seed, sqlite, true)).collect();
    assert!(load.stop() > 0, "the load threads never ran");
    for ((&(seed, sqlite), (outcome, trace)), (outcome_again, trace_again)) in
        seeds.iter().zip(&first).zip(&again)
    {
        let store = if sqlite { "sqlite" } else { "memory" };
        let (Some(trace), Some(trace_again)) = (trace, trace_again) else {
            panic!("[{store}] seed {seed} panicked: {outcome:?} / {outcome_again:?}");
        };
        assert!(trace.lines.len() > 10, "[{store}] seed {seed} traced only {:?}", trace.lines);
        assert_eq!(
            trace.hash,
            trace_again.hash,
            "[{store}] seed {seed} gave another trace under load, {}",
            first_difference(trace, trace_again)
        );
        assert_eq!(outcome, outcome_again, "[{store}] seed {seed}");
    }
}
