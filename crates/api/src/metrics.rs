//! Run metrics for `GET /metrics`: a collector that follows the event bus and
//! folds every run's events into counters and histograms, read at each scrape.
//!
//! The collector is a task of its own on the bus's firehose, so runs pay
//! nothing for it but the firehose send they make anyway. It writes atomics;
//! a scrape reads them ([`RunMetrics::render`]). A collector that falls behind
//! the bus loses the oldest events and counts them
//! (`lemon_metrics_events_lost_total`).
//!
//! The MCP servers' families ([`render_mcp`]) are read from the native
//! engine's MCP client at each scrape.
//!
//! Engine labels are the engine ids runs report, which come from the engine
//! table (configured ids, never a user's text); at most [`MAX_ENGINES`]
//! distinct ones, later ones are counted under `other`.
//!
//! # Layout
//! - [`text`]: the Prometheus text format 0.0.4.

pub mod text;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use lemon_core::budget::usage::{ReportedUsage, RunSpend};
use lemon_core::budget::{BudgetGuard, BudgetScope};
use lemon_core::bus::{EventKind, RecvError, RunStatus, Subscription};
use lemon_core::engine::{ActionKind, ActionPhase};
use lemon_core::ids::RunId;
use lemon_core::mcp::{McpServerState, McpServerStatus};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use text::{Exposition, Kind};

/// Distinct engine labels kept; runs of any further engine count as `other`.
pub const MAX_ENGINES: usize = 64;
/// Runs followed at once for their first delta; past this the oldest are
/// forgotten (a run's first-delta latency is then not observed).
const MAX_FOLLOWED: usize = 65_536;

/// Upper bounds (seconds) of the run-duration buckets.
pub const DURATION_BUCKETS: &[f64] =
    &[0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0];
/// Upper bounds (seconds) of the first-delta latency buckets.
pub const FIRST_DELTA_BUCKETS: &[f64] =
    &[0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0];

/// The outcomes a completed run is counted under, as [`RunStatus`] names them.
const OUTCOMES: [RunStatus; 3] = [RunStatus::Completed, RunStatus::Failed, RunStatus::Cancelled];
/// The token kinds spend is counted in.
const TOKEN_KINDS: [&str; 4] = ["input", "output", "cache_read", "cache_write"];

/// The read side of the collector: what runs did since the gateway started.
/// Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct RunMetrics {
    inner: Arc<Shared>,
}

#[derive(Debug, Default)]
struct Shared {
    /// Engine label → its figures. Locked to add an engine and to scrape.
    engines: Mutex<BTreeMap<String, Arc<EngineFigures>>>,
    /// Events the collector missed because it fell behind the bus.
    n_lost: AtomicU64,
    /// Settled approval requests by (decision, surface).
    approvals: Mutex<BTreeMap<(&'static str, &'static str), u64>>,
}

/// The surfaces an approval is counted under; any other as `other`.
const APPROVAL_SURFACES: [&str; 8] =
    ["api", "cli", "telegram", "discord", "sms", "email", "dashboard", "terminal"];

/// One engine's figures. Written by the collector only.
#[derive(Debug)]
struct EngineFigures {
    n_started: AtomicU64,
    /// Per [`OUTCOMES`] entry.
    n_completed: [AtomicU64; 3],
    duration: Histogram,
    first_delta: Histogram,
    /// Per [`TOKEN_KINDS`] entry.
    tokens: [AtomicU64; 4],
    /// US dollars as `f64` bits; one writer, so a load and a store suffice.
    usd_bits: AtomicU64,
}

impl EngineFigures {
    fn new() -> Self {
        EngineFigures {
            n_started: AtomicU64::new(0),
            n_completed: Default::default(),
            duration: Histogram::new(DURATION_BUCKETS),
            first_delta: Histogram::new(FIRST_DELTA_BUCKETS),
            tokens: Default::default(),
            usd_bits: AtomicU64::new(0f64.to_bits()),
        }
    }

    fn add_spend(&self, spend: &RunSpend) {
        let tokens = [
            spend.input_tokens,
            spend.output_tokens,
            spend.cache_read_tokens,
            spend.cache_write_tokens,
        ];
        for (counter, n) in self.tokens.iter().zip(tokens) {
            counter.fetch_add(n, Ordering::Relaxed);
        }
        if spend.usd.is_finite() && spend.usd > 0.0 {
            let usd = f64::from_bits(self.usd_bits.load(Ordering::Relaxed)) + spend.usd;
            self.usd_bits.store(usd.to_bits(), Ordering::Relaxed);
        }
    }
}

/// Fixed buckets: one count per bound plus the overflow, and the sum.
#[derive(Debug)]
struct Histogram {
    bounds: &'static [f64],
    counts: Vec<AtomicU64>,
    sum_ms: AtomicU64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Self {
        Histogram {
            bounds,
            counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum_ms: AtomicU64::new(0),
        }
    }

    fn observe_ms(&self, ms: u64) {
        let seconds = ms as f64 / 1000.0;
        let i = self.bounds.iter().position(|bound| seconds <= *bound).unwrap_or(self.bounds.len());
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        self.sum_ms.fetch_add(ms, Ordering::Relaxed);
    }

    fn render(&self, out: &mut Exposition, name: &str, labels: &[(&str, &str)]) {
        let counts: Vec<u64> = self.counts.iter().map(|c| c.load(Ordering::Relaxed)).collect();
        let sum = self.sum_ms.load(Ordering::Relaxed) as f64 / 1000.0;
        out.histogram(name, labels, self.bounds, &counts, sum);
    }
}

/// A run between its start and its completion, as the collector follows it.
#[derive(Debug)]
struct Followed {
    figures: Arc<EngineFigures>,
    model: Option<String>,
    started_ms: i64,
    /// Whether its first delta was seen (and timed).
    delta_seen: bool,
}

/// The collector task's own state.
struct Collector {
    metrics: RunMetrics,
    events: Subscription,
    /// Prices spend the way the budgets do; without one, the engine's own
    /// cost figure is the only dollars counted.
    pricing: Option<Arc<dyn BudgetGuard>>,
    /// Runs started and not completed yet, by id.
    followed: HashMap<RunId, Followed>,
    /// Engine figures by label, so the shared map is locked only for a new engine.
    engines: HashMap<String, Arc<EngineFigures>>,
}

impl RunMetrics {
    /// Starts the collector on `events` (the bus's firehose) on `tracker`,
    /// until `token` fires or the bus closes. `pricing` prices the usage runs
    /// report, as `[gateway.budgets.prices]` says.
    pub fn spawn(
        events: Subscription,
        pricing: Option<Arc<dyn BudgetGuard>>,
        token: CancellationToken,
        tracker: &TaskTracker,
    ) -> RunMetrics {
        let metrics = RunMetrics::default();
        let collector = Collector {
            metrics: metrics.clone(),
            events,
            pricing,
            followed: HashMap::new(),
            engines: HashMap::new(),
        };
        tracker.spawn(collector.run(token));
        metrics
    }

    fn figures(&self, engine: &str) -> Arc<EngineFigures> {
        let mut engines = self.inner.engines.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(figures) = engines.get(engine) {
            return figures.clone();
        }
        let label = if engines.len() < MAX_ENGINES { engine } else { "other" };
        engines.entry(label.to_owned()).or_insert_with(|| Arc::new(EngineFigures::new())).clone()
    }

    /// Writes the run families: started, completed, durations, first-delta
    /// latencies, spend, and the events the collector lost.
    pub fn render(&self, out: &mut Exposition) {
        let engines: Vec<(String, Arc<EngineFigures>)> = {
            let engines = self.inner.engines.lock().unwrap_or_else(|e| e.into_inner());
            engines.iter().map(|(label, figures)| (label.clone(), figures.clone())).collect()
        };
        out.family(
            "lemon_runs_started_total",
            Kind::Counter,
            "Runs that took a slot and called their engine, by engine.",
        );
        for (engine, figures) in &engines {
            out.sample(
                "lemon_runs_started_total",
                &[("engine", engine)],
                figures.n_started.load(Ordering::Relaxed),
            );
        }
        out.family(
            "lemon_runs_completed_total",
            Kind::Counter,
            "Runs that ended, by engine and outcome (completed, failed, cancelled).",
        );
        for (engine, figures) in &engines {
            for (outcome, n) in OUTCOMES.iter().zip(&figures.n_completed) {
                out.sample(
                    "lemon_runs_completed_total",
                    &[("engine", engine), ("outcome", outcome.as_str())],
                    n.load(Ordering::Relaxed),
                );
            }
        }
        out.family(
            "lemon_run_duration_seconds",
            Kind::Histogram,
            "Time from a run's start to its end, by engine.",
        );
        for (engine, figures) in &engines {
            figures.duration.render(out, "lemon_run_duration_seconds", &[("engine", engine)]);
        }
        out.family(
            "lemon_run_first_delta_seconds",
            Kind::Histogram,
            "Time from a run's start to the first piece of its answer, by engine.",
        );
        for (engine, figures) in &engines {
            figures.first_delta.render(out, "lemon_run_first_delta_seconds", &[("engine", engine)]);
        }
        out.family(
            "lemon_spend_usd_total",
            Kind::Counter,
            "US dollars runs spent as their engines reported or as configured prices give, by engine.",
        );
        for (engine, figures) in &engines {
            let usd = f64::from_bits(figures.usd_bits.load(Ordering::Relaxed));
            out.sample("lemon_spend_usd_total", &[("engine", engine)], usd);
        }
        out.family(
            "lemon_spend_tokens_total",
            Kind::Counter,
            "Tokens runs used as their engines reported them, by engine and kind (input, output, cache_read, cache_write).",
        );
        for (engine, figures) in &engines {
            for (kind, n) in TOKEN_KINDS.iter().zip(&figures.tokens) {
                out.sample(
                    "lemon_spend_tokens_total",
                    &[("engine", engine), ("kind", kind)],
                    n.load(Ordering::Relaxed),
                );
            }
        }
        out.family(
            "lemon_approvals_total",
            Kind::Counter,
            "Tool calls asked about and settled, by decision (approved, denied, expired, withdrawn) and the surface that answered (none for expired and withdrawn).",
        );
        let approvals = self.inner.approvals.lock().unwrap_or_else(|e| e.into_inner()).clone();
        for ((decision, via), n) in approvals {
            out.sample("lemon_approvals_total", &[("decision", decision), ("via", via)], n);
        }
        out.single(
            "lemon_metrics_events_lost_total",
            Kind::Counter,
            "Run events the metrics collector missed because it fell behind; the run figures undercount by these.",
            self.inner.n_lost.load(Ordering::Relaxed),
        );
    }
}

impl Collector {
    async fn run(mut self, token: CancellationToken) {
        loop {
            let event = tokio::select! {
                biased;
                () = token.cancelled() => return,
                event = self.events.recv() => event,
            };
            match event {
                Ok(event) => self.fold(&event),
                Err(RecvError::Lagged(n)) => {
                    self.metrics.inner.n_lost.fetch_add(n, Ordering::Relaxed);
                }
                Err(RecvError::Closed) => return,
            }
        }
    }

    fn figures(&mut self, engine: &str) -> Arc<EngineFigures> {
        if let Some(figures) = self.engines.get(engine) {
            return figures.clone();
        }
        let figures = self.metrics.figures(engine);
        self.engines.insert(engine.to_owned(), figures.clone());
        figures
    }

    fn fold(&mut self, event: &lemon_core::bus::BusEvent) {
        match &event.kind {
            EventKind::RunStarted { engine, model } => {
                let figures = self.figures(engine);
                figures.n_started.fetch_add(1, Ordering::Relaxed);
                if self.followed.len() >= MAX_FOLLOWED {
                    self.followed.clear();
                }
                let followed = Followed {
                    figures,
                    model: model.clone(),
                    started_ms: event.ts_ms,
                    delta_seen: false,
                };
                self.followed.insert(event.run_id.clone(), followed);
            }
            EventKind::Delta { .. } => {
                if let Some(run) = self.followed.get_mut(&event.run_id) {
                    if !run.delta_seen {
                        run.delta_seen = true;
                        let ms = u64::try_from(event.ts_ms - run.started_ms).unwrap_or(0);
                        run.figures.first_delta.observe_ms(ms);
                    }
                }
            }
            EventKind::RunCompleted { completion, engine, duration_ms } => {
                let followed = self.followed.remove(&event.run_id);
                let figures = self.figures(engine);
                let status = RunStatus::of(completion);
                if let Some(i) = OUTCOMES.iter().position(|outcome| *outcome == status) {
                    figures.n_completed[i].fetch_add(1, Ordering::Relaxed);
                }
                figures.duration.observe_ms(*duration_ms);
                if !completion.usage.is_null() {
                    let model = followed.as_ref().and_then(|run| run.model.as_deref());
                    let spend = match &self.pricing {
                        Some(pricing) => pricing.spend(
                            BudgetScope {
                                run_id: &event.run_id,
                                session_key: &event.session_key,
                                engine,
                                model: model.unwrap_or(""),
                            },
                            &completion.usage,
                        ),
                        None => RunSpend::from_reported(
                            &ReportedUsage::from_json(&completion.usage),
                            None,
                        ),
                    };
                    figures.add_spend(&spend);
                }
            }
            EventKind::EngineAction(action)
                if action.kind == ActionKind::Approval
                    && action.phase == ActionPhase::Completed =>
            {
                let key = approval_key(&action.detail["answer"]);
                let mut approvals =
                    self.metrics.inner.approvals.lock().unwrap_or_else(|e| e.into_inner());
                *approvals.entry(key).or_default() += 1;
            }
            _ => {}
        }
    }
}

/// The states an MCP server is counted in, as `lemon_mcp_server_state`
/// labels them.
const MCP_STATES: [McpServerState; 5] = [
    McpServerState::Disabled,
    McpServerState::Idle,
    McpServerState::Starting,
    McpServerState::Running,
    McpServerState::Failed,
];
/// The outcomes a tool call of an MCP server is counted under; any other as
/// `other`.
const MCP_CALL_OUTCOMES: [&str; 4] = ["ok", "error", "timeout", "cancelled"];

/// Writes the MCP server families: each configured server's state, its
/// offered tools, its starts and its tool calls by outcome. Labels are the
/// servers' configured names and fixed words, never a tool's or a user's
/// text.
pub fn render_mcp(out: &mut Exposition, servers: &[McpServerStatus]) {
    out.family(
        "lemon_mcp_server_state",
        Kind::Gauge,
        "1 for the state the MCP server is in (disabled, idle, starting, running, failed), else 0.",
    );
    for server in servers {
        for state in MCP_STATES {
            let state_name = state.to_string();
            out.sample(
                "lemon_mcp_server_state",
                &[("server", &server.name), ("state", &state_name)],
                u8::from(server.state == state),
            );
        }
    }
    out.family(
        "lemon_mcp_server_tools",
        Kind::Gauge,
        "Tools the MCP server offers runs (after its tools filter), as last listed.",
    );
    for server in servers {
        out.sample("lemon_mcp_server_tools", &[("server", &server.name)], server.tools.len());
    }
    out.family(
        "lemon_mcp_server_starts_total",
        Kind::Counter,
        "Times the MCP server was started or restarted since the gateway started.",
    );
    for server in servers {
        out.sample("lemon_mcp_server_starts_total", &[("server", &server.name)], server.starts);
    }
    out.family(
        "lemon_mcp_tool_calls_total",
        Kind::Counter,
        "Tool calls of the MCP server that finished, by outcome (ok, error, timeout, cancelled, other).",
    );
    for server in servers {
        for outcome in MCP_CALL_OUTCOMES {
            let n = server.calls.get(outcome).copied().unwrap_or(0);
            out.sample(
                "lemon_mcp_tool_calls_total",
                &[("server", &server.name), ("outcome", outcome)],
                n,
            );
        }
        let other: u64 = server
            .calls
            .iter()
            .filter(|(outcome, _)| !MCP_CALL_OUTCOMES.contains(&outcome.as_str()))
            .map(|(_, n)| n)
            .sum();
        if other > 0 {
            out.sample(
                "lemon_mcp_tool_calls_total",
                &[("server", &server.name), ("outcome", "other")],
                other,
            );
        }
    }
}

/// How an approval action's `answer` settled it: the decision and the
/// surface, both from fixed lists (a label never carries a user's text).
fn approval_key(answer: &serde_json::Value) -> (&'static str, &'static str) {
    if answer["expired"] == true {
        return ("expired", "none");
    }
    let Some(approved) = answer["approved"].as_bool() else { return ("withdrawn", "none") };
    let via = answer["via"].as_str().unwrap_or_default();
    let via = APPROVAL_SURFACES.into_iter().find(|known| *known == via).unwrap_or("other");
    (if approved { "approved" } else { "denied" }, via)
}

#[cfg(test)]
mod tests;
