//! Deterministic simulation of the router, the runtime and the delivery layer
//! (in the style of FoundationDB's and TigerBeetle's): paused time, one seeded
//! random generator deciding every choice, a scripted engine and destination,
//! the store in memory (and in SQLite for one seed in 100 with
//! `LEMON_SIM_SQLITE=1`), and random submits
//! in every queue mode, cancels, aborts, engine crashes and hangs, reloads,
//! delivery failures and restarts from the journal, with the invariants
//! checked after every step and at the end (see ARCHITECTURE.md, Simulation).
//!
//! `LEMON_SIM_SEEDS=N` runs seeds 0..N (10 000 by default), `LEMON_SIM_SEED=N`
//! only seed N; a failing seed is reported with the one command that reruns it.
//!
//! SQLite seeds are not in the default run: the store's writer is a thread of
//! its own, and while a seed's runtime waits for it, paused time jumps to the
//! next timer, so a slow machine turns a write into minutes of simulated time
//! and the seed's outcome depends on the machine's load, not on the seed.

mod channel;
mod driver;
mod engine;
mod rng;
mod state;

use std::cell::RefCell;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, Once};

const DEFAULT_SEEDS: u64 = 10_000;
/// With `LEMON_SIM_SQLITE=1`, one seed in this many keeps its store in SQLite
/// (slower: a real file).
const SQLITE_EVERY: u64 = 100;

fn sqlite_seeds() -> bool {
    std::env::var("LEMON_SIM_SQLITE").is_ok_and(|v| v == "1")
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
    PANICS.with(|p| p.borrow_mut().clear());
    let sqlite = sqlite_seeds() && seed % SQLITE_EVERY == SQLITE_EVERY - 1;
    let outcome =
        std::panic::catch_unwind(AssertUnwindSafe(|| driver::Sim::new(seed, sqlite).run()));
    let panics = PANICS.with(|p| std::mem::take(&mut *p.borrow_mut()));
    let store = if sqlite { "sqlite" } else { "memory" };
    match outcome {
        _ if !panics.is_empty() => Err(format!("[{store}] a task panicked: {}", panics[0])),
        Ok(Ok(())) => Ok(()),
        Ok(Err(reason)) => Err(format!("[{store}] {}", reason.replace('\n', " "))),
        Err(_) => Err(format!("[{store}] the simulation panicked")),
    }
}

fn repro(seed: u64) -> String {
    let sqlite = if sqlite_seeds() { "LEMON_SIM_SQLITE=1 " } else { "" };
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
