//! `lemon-bench`: the gateway's speed and memory, one JSON object per scenario.
//!
//! ```text
//! cargo run --release -p lemon-tests --bin lemon-bench -- [api-store|cluster|throughput|throughput-postgres|latency|latency-prune|latency-postgres|conversations|startup|telegram|native|voice|connections|soak[:SECONDS]]…
//! ```
//! No argument runs them all but `connections` (10 000 connections: it needs
//! a descriptor limit above 12 000) and `soak` (30 minutes; `soak:120` for two). `LEMON_BENCH_METRICS=off` runs the in-process
//! scenarios without the metrics collector the server runs on the bus.
//! The `-postgres` scenarios, `api-store` and `cluster` need `LEMON_BENCH_POSTGRES_URL`: a server on
//! which each makes a database of its own (`scripts/postgres start DIR`); `cluster`
//! starts real nodes in cluster mode on one database.
//! Figures are measured in this process on the echo
//! engine; `startup`, `telegram`, `native` and `voice` start the real
//! `lemon-gateway` binary next to this one (`telegram` against a fake Bot API,
//! `native` against a fake LLM provider, `voice` against fake Twilio, Deepgram
//! and ElevenLabs, all served from this process).

// The benchmark reports on stdout and starts the server binary it measures.
#![allow(clippy::print_stdout, clippy::print_stderr, clippy::disallowed_methods)]

use std::collections::HashMap;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use lemon_core::bus::{EventBus, EventKind};
use lemon_core::engine::EngineRegistry;
use lemon_core::gateway::{ExecutionRequest, GatewayDeps, GatewayHandle, RuntimeConfig};
use lemon_core::ids::{EngineId, EngineRef, RunId};
use lemon_core::store::StoreHandle;
use lemon_engines::echo::EchoEngine;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

#[path = "lemon_bench/load.rs"]
mod load;

// The same allocator as the server binary.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const SUBMITTERS: usize = 64;

struct Bench {
    gateway: GatewayHandle,
    store: StoreHandle,
    token: CancellationToken,
    tracker: TaskTracker,
    _dir: Option<tempfile::TempDir>,
}

/// The PostgreSQL server the `postgres` store variants use: a fresh database
/// is made on it for each.
const POSTGRES_VAR: &str = "LEMON_BENCH_POSTGRES_URL";

async fn start(store: &str, max: usize, bus: EventBus) -> anyhow::Result<Bench> {
    let tracker = TaskTracker::new();
    let token = CancellationToken::new();
    let mut engines = EngineRegistry::new();
    engines.register(Arc::new(EchoEngine::new(Duration::ZERO, tracker.clone())))?;
    let (store, dir) = match store {
        "sqlite" => {
            let dir = tempfile::tempdir()?;
            (StoreHandle::open_sqlite(&dir.path().join("bench.db"))?, Some(dir))
        }
        "postgres" => {
            let url = bench_database().await?;
            let config = lemon_core::store::postgres::PostgresConfig {
                url,
                pool_size: 16,
                chat_state_ttl_ms: lemon_core::store::DEFAULT_CHAT_STATE_TTL_MS,
                exclusive: true,
            };
            (StoreHandle::open_postgres(config).await?, None)
        }
        _ => (StoreHandle::memory(), None),
    };
    let config = RuntimeConfig {
        max_concurrent_runs: max,
        max_pending_runs: usize::MAX,
        ..RuntimeConfig::default()
    };
    // The server's metrics collector follows the bus as it does in production;
    // `LEMON_BENCH_METRICS=off` leaves it out, to measure what it costs.
    if std::env::var("LEMON_BENCH_METRICS").as_deref() != Ok("off") {
        let _metrics = lemon_api::metrics::RunMetrics::spawn(
            bus.subscribe_all(),
            None,
            token.clone(),
            &tracker,
        );
    }
    let deps = GatewayDeps { config, engines, store: store.clone(), bus };
    let gateway = GatewayHandle::start(deps, token.clone(), &tracker);
    Ok(Bench { gateway, store, token, tracker, _dir: dir })
}

impl Bench {
    async fn stop(self) {
        let _ = self.store.close().await;
        self.token.cancel();
        self.tracker.close();
        self.tracker.wait().await;
    }

    /// Waits until nothing is queued or running and the store has it all.
    async fn settle(&self) -> anyhow::Result<()> {
        loop {
            let snapshot = self.gateway.snapshot().await?;
            if snapshot.in_flight == 0 && snapshot.queued == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        self.store.flush().await?;
        Ok(())
    }
}

/// Parsed once, as the router parses its `default_engine`, and shared by every request.
static ECHO: LazyLock<EngineRef> = LazyLock::new(|| EngineRef::new(EngineId::builtin("echo")));

fn request(conversation: usize) -> ExecutionRequest {
    ExecutionRequest::new(format!("bench:{conversation}"), ECHO.clone(), "hello from the benchmark")
}

async fn throughput(
    store: &str,
    runs: usize,
    conversations: usize,
) -> anyhow::Result<serde_json::Value> {
    let bench = start(store, 64, EventBus::default()).await?;
    let began = Instant::now();
    let mut submitters = Vec::new();
    for worker in 0..SUBMITTERS {
        let gateway = bench.gateway.clone();
        submitters.push(tokio::spawn(async move {
            let mut i = worker;
            while i < runs {
                gateway.submit(request(i % conversations)).await?;
                i += SUBMITTERS;
            }
            anyhow::Ok(())
        }));
    }
    for submitter in submitters {
        submitter.await??;
    }
    bench.settle().await?;
    let elapsed = began.elapsed();
    bench.stop().await;

    // The floor: the same number of spawn + channel round trips, as concurrently.
    let began = Instant::now();
    let mut floor = Vec::new();
    for worker in 0..SUBMITTERS {
        floor.push(tokio::spawn(async move {
            let mut i = worker;
            while i < runs {
                let (tx, rx) = tokio::sync::oneshot::channel();
                tokio::spawn(async move {
                    let _ = tx.send(i);
                });
                let _ = rx.await;
                i += SUBMITTERS;
            }
        }));
    }
    for task in floor {
        task.await?;
    }
    let floor_elapsed = began.elapsed();
    Ok(serde_json::json!({
        "scenario": "throughput",
        "store": store,
        "runs": runs,
        "conversations": conversations,
        "max_concurrent_runs": 64,
        "elapsed_ms": elapsed.as_secs_f64() * 1e3,
        "runs_per_sec": (runs as f64 / elapsed.as_secs_f64()).round(),
        "floor_ms": floor_elapsed.as_secs_f64() * 1e3,
        "floor_ratio": (elapsed.as_secs_f64() / floor_elapsed.as_secs_f64() * 100.0).round() / 100.0,
    }))
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

async fn latency(runs: usize, per_sec: u64) -> anyhow::Result<serde_json::Value> {
    latency_on("memory", runs, per_sec, None).await
}

/// Finished runs, each with a command, a delta and its end, completed `age`
/// ago and before: what retention finds in an old gateway's store.
async fn seed_old_runs(store: &StoreHandle, prefix: &str, n: usize, age: Duration) {
    use lemon_core::engine::{Action, ActionKind, ActionPhase, Completion};
    let completed_at_ms = lemon_core::clock::now_ms() - age.as_millis() as i64;
    for i in 0..n {
        let run_id = RunId::parse(&format!("{prefix}_{i}")).expect("a valid run id");
        store
            .insert_run(lemon_core::store::NewRun {
                run_id: run_id.clone(),
                session_key: format!("old:{}", i % 100).into(),
                conversation: format!("old:{}", i % 100),
                engine: "echo".to_owned(),
                prompt: "an old prompt".to_owned(),
                meta: serde_json::json!({}),
                resumed_from: None,
                created_at_ms: completed_at_ms - 1_000 - i as i64,
            })
            .await;
        let completion = Completion::success("an old answer", None);
        let action = Action {
            id: "a".to_owned(),
            kind: ActionKind::Command,
            title: "make".to_owned(),
            detail: serde_json::Value::Null,
            phase: ActionPhase::Completed,
            ok: Some(true),
            message: None,
            level: None,
            result_meta: serde_json::Value::Null,
        };
        for (index, kind) in [
            EventKind::EngineAction(action),
            EventKind::Delta { seq: 1, text: "an old answer".to_owned() },
            EventKind::RunCompleted {
                completion: completion.clone(),
                engine: "echo".to_owned(),
                duration_ms: 5,
            },
        ]
        .into_iter()
        .enumerate()
        {
            let event = lemon_core::bus::BusEvent {
                run_id: run_id.clone(),
                session_key: "old".into(),
                index: index as u64 + 1,
                ts_ms: completed_at_ms,
                kind,
            };
            store.append_event(Arc::new(event)).await;
        }
        store
            .finalize_run(lemon_core::store::FinishedRun {
                run_id,
                engine: "echo".to_owned(),
                completion,
                completed_at_ms: completed_at_ms - i as i64,
                duration_ms: 5,
                spend: Default::default(),
            })
            .await;
    }
}

/// Latency on `store`; with `prune: Some(n)`, `n` runs 60 days old are
/// stored first and a retention pass with the default settings (which
/// deletes half of them and compacts the other half) runs beside the load.
async fn latency_on(
    store: &str,
    runs: usize,
    per_sec: u64,
    prune: Option<usize>,
) -> anyhow::Result<serde_json::Value> {
    let bus = EventBus::new(1 << 16, 1024);
    let mut events = bus.subscribe_all();
    let bench = start(store, 64, bus).await?;
    let pruning = match prune {
        Some(n) => {
            // Half are older than `runs_days`, half only past `events_days`.
            seed_old_runs(&bench.store, "expired", n / 2, Duration::from_secs(60 * 86_400)).await;
            seed_old_runs(&bench.store, "aged", n - n / 2, Duration::from_secs(10 * 86_400)).await;
            bench.store.flush().await?;
            let retention = lemon_server::retention::Retention {
                store: bench.store.clone(),
                database: bench._dir.as_ref().map(|dir| dir.path().join("bench.db")),
                upkeep: Default::default(),
                media: None,
            };
            Some(tokio::spawn(async move {
                let config = lemon_core::config::RetentionConfig::default();
                retention.pass(&config, lemon_core::clock::now_ms()).await
            }))
        }
        None => None,
    };
    let (submitted_tx, mut submitted_rx) =
        tokio::sync::mpsc::unbounded_channel::<(RunId, Instant)>();
    let observer = tokio::spawn(async move {
        let mut submitted: HashMap<RunId, Instant> = HashMap::new();
        let mut first_delta: HashMap<RunId, Instant> = HashMap::new();
        let (mut to_delta, mut to_done) = (Vec::new(), Vec::new());
        while to_done.len() < runs {
            let event = events.recv().await?;
            let now = Instant::now();
            while let Ok((id, at)) = submitted_rx.try_recv() {
                submitted.insert(id, at);
            }
            match &event.kind {
                EventKind::Delta { seq: 1, .. } => {
                    first_delta.insert(event.run_id.clone(), now);
                }
                EventKind::RunCompleted { .. } => {
                    // A run can complete before its submit time arrives here.
                    while !submitted.contains_key(&event.run_id) {
                        let Some((id, at)) = submitted_rx.recv().await else { break };
                        submitted.insert(id, at);
                    }
                    let Some(start) = submitted.get(&event.run_id) else { continue };
                    if let Some(delta) = first_delta.remove(&event.run_id) {
                        to_delta.push(delta.duration_since(*start).as_micros() as u64);
                    }
                    to_done.push(now.duration_since(*start).as_micros() as u64);
                }
                _ => {}
            }
        }
        anyhow::Ok((to_delta, to_done))
    });
    let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / per_sec));
    for i in 0..runs {
        tick.tick().await;
        let at = Instant::now();
        let run_id = bench.gateway.submit(request(i)).await?;
        submitted_tx.send((run_id, at))?;
    }
    let (mut to_delta, mut to_done) = observer.await??;
    // Whether the pass was still going when the load ended.
    let pass_running = pruning.as_ref().map(|pass| !pass.is_finished());
    let pass = match pruning {
        Some(pass) => Some(pass.await?),
        None => None,
    };
    bench.stop().await;
    to_delta.sort_unstable();
    to_done.sort_unstable();
    Ok(serde_json::json!({
        "scenario": "latency",
        "store": store,
        "prune_beside": pass.map(|pass| serde_json::json!({
            "removed": pass.removed,
            "took_ms": pass.took_ms,
            "error": pass.error,
            "outlasted_the_load": pass_running,
        })),
        "runs": runs,
        "rate_per_sec": per_sec,
        "first_delta_p50_us": percentile(&to_delta, 0.50),
        "first_delta_p99_us": percentile(&to_delta, 0.99),
        "completed_p50_us": percentile(&to_done, 0.50),
        "completed_p99_us": percentile(&to_done, 0.99),
    }))
}

fn rss_bytes(pid: &str) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kb = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|kb| kb.parse::<u64>().ok())
        .ok_or_else(|| anyhow::anyhow!("no VmRSS in /proc/{pid}/status"))?;
    Ok(kb * 1024)
}

async fn conversations(n: usize) -> anyhow::Result<serde_json::Value> {
    // No slots: every request waits, each in its own conversation.
    let bench = start("sqlite", 0, EventBus::default()).await?;
    // Warm up allocator and store so the baseline includes their fixed cost.
    for i in 0..1000 {
        bench.gateway.submit(request(n + i)).await?;
    }
    bench.store.flush().await?;
    let before = rss_bytes("self")?;
    for i in 0..n {
        bench.gateway.submit(request(i)).await?;
    }
    bench.store.flush().await?;
    let after = rss_bytes("self")?;
    let snapshot = bench.gateway.snapshot().await?;
    anyhow::ensure!(snapshot.conversations == n + 1000, "every conversation holds its request");
    bench.gateway.drain(Duration::ZERO).await?;
    bench.stop().await;
    Ok(serde_json::json!({
        "scenario": "conversations",
        "conversations": n,
        "rss_before_bytes": before,
        "rss_after_bytes": after,
        "bytes_per_conversation": after.saturating_sub(before) / n as u64,
    }))
}

/// Starts the real server binary on `home` and waits for its ready line.
async fn spawn_server(home: &std::path::Path) -> anyhow::Result<(tokio::process::Child, String)> {
    let exe = std::env::current_exe()?;
    let server = exe.with_file_name("lemon-gateway");
    anyhow::ensure!(server.exists(), "build the server first: {} is missing", server.display());
    let mut child = tokio::process::Command::new(&server)
        .env("LEMON_HOME", home)
        .env("LEMON_API_TOKEN", "bench-token-0123456789")
        .env("LEMON_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()?;
    let stdout = child.stdout.take().ok_or_else(|| anyhow::anyhow!("no stdout"))?;
    let mut lines = tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(stdout));
    let ready = loop {
        let line = lines
            .next_line()
            .await?
            .ok_or_else(|| anyhow::anyhow!("server exited before ready"))?;
        if line.starts_with("lemon-gateway ready") {
            break line;
        }
    };
    Ok((child, ready))
}

/// The address the ready line gives after `name` (`api=`, `health=`, `webhook=`).
fn ready_address(ready: &str, name: &str) -> anyhow::Result<String> {
    ready
        .split_whitespace()
        .find_map(|w| w.strip_prefix(name))
        .map(str::to_owned)
        .ok_or_else(|| anyhow::anyhow!("no {name} address in {ready:?}"))
}

/// Writes the gateway home's secrets file, private to its owner as the
/// gateway requires.
fn write_secrets(home: &std::path::Path, text: &str) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let secrets = home.join("secrets.toml");
    std::fs::write(&secrets, text)?;
    std::fs::set_permissions(&secrets, std::fs::Permissions::from_mode(0o600))?;
    Ok(())
}

/// A fresh database on the server `LEMON_BENCH_POSTGRES_URL` names.
async fn bench_database() -> anyhow::Result<String> {
    let Ok(server) = std::env::var(POSTGRES_VAR) else {
        anyhow::bail!(
            "set {POSTGRES_VAR} to a PostgreSQL server's URL (scripts/postgres start DIR prints one)"
        );
    };
    Ok(lemon_core::store::postgres::testing::fresh_database(&server).await)
}

async fn startup() -> anyhow::Result<serde_json::Value> {
    let home = tempfile::tempdir()?;
    std::fs::write(
        home.path().join("config.toml"),
        "[gateway.api]\nport = 0\n[gateway.health]\nport = 0\n",
    )?;
    let began = Instant::now();
    let (mut child, ready) = spawn_server(home.path()).await?;
    let health = ready_address(&ready, "health=")?;
    let client = reqwest::Client::new();
    loop {
        if client
            .get(format!("{health}/healthz"))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success())
        {
            break;
        }
    }
    let to_healthy = began.elapsed();
    // Idle: give it a moment with nothing to do, then read its resident memory.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let pid = child.id().ok_or_else(|| anyhow::anyhow!("server exited"))?.to_string();
    let idle_rss = rss_bytes(&pid)?;
    child.start_kill()?;
    let _ = child.wait().await;
    Ok(serde_json::json!({
        "scenario": "startup",
        "start_to_healthy_ms": (to_healthy.as_secs_f64() * 1e4).round() / 10.0,
        "idle_rss_bytes": idle_rss,
    }))
}

/// The real binary's control API on `store` (`sqlite`, or `postgres` on a
/// fresh database of the server `LEMON_BENCH_POSTGRES_URL` names): `runs`
/// echo runs, `concurrency` callers each posting one and following its events
/// to `run_completed`, then the next. Each is timed from its POST (which
/// returns once the journal entry is durable) to its completion on the stream.
async fn api_store(
    store: &str,
    runs: usize,
    concurrency: usize,
) -> anyhow::Result<serde_json::Value> {
    let home = tempfile::tempdir()?;
    let mut config = format!(
        "[gateway]\nmax_concurrent_runs = {concurrency}\n[gateway.api]\nport = 0\n[gateway.health]\nport = 0\n"
    );
    if store == "postgres" {
        let url = bench_database().await?;
        config.push_str("[gateway.store]\nbackend = \"postgres\"\nurl_secret = \"store_url\"\n");
        write_secrets(home.path(), &format!("store_url = \"{url}\"\n"))?;
    }
    std::fs::write(home.path().join("config.toml"), config)?;
    let (mut child, ready) = spawn_server(home.path()).await?;
    let api = ready_address(&ready, "api=")?;
    let client = reqwest::Client::new();
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let began = Instant::now();
    let mut callers = Vec::new();
    for _ in 0..concurrency {
        let (client, api, next) = (client.clone(), api.clone(), next.clone());
        callers.push(tokio::spawn(async move {
            let mut took = Vec::new();
            loop {
                let n = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if n >= runs {
                    return anyhow::Ok(took);
                }
                let at = Instant::now();
                run_to_completion(&client, &api, &format!("bench-{n}"), &format!("bench {n}"))
                    .await?;
                took.push(at.elapsed().as_micros() as u64);
            }
        }));
    }
    let mut took = Vec::with_capacity(runs);
    for caller in callers {
        took.extend(caller.await??);
    }
    let elapsed = began.elapsed();
    child.start_kill()?;
    let _ = child.wait().await;
    took.sort_unstable();
    Ok(serde_json::json!({
        "scenario": "api-store",
        "store": store,
        "runs": runs,
        "concurrency": concurrency,
        "runs_per_sec": (runs as f64 / elapsed.as_secs_f64()).round(),
        "submit_to_completed_p50_us": percentile(&took, 0.50),
        "submit_to_completed_p99_us": percentile(&took, 0.99),
    }))
}

/// `nodes` real binaries in cluster mode on one fresh database of the server
/// `LEMON_BENCH_POSTGRES_URL` names, the echo engine, lease term `term_ms`;
/// `extra` config; the homes, the processes and each node's API address.
async fn cluster_nodes(
    nodes: usize,
    max: usize,
    term_ms: u64,
    extra: &str,
) -> anyhow::Result<(Vec<tempfile::TempDir>, Vec<tokio::process::Child>, Vec<String>)> {
    let url = bench_database().await?;
    let (mut homes, mut children, mut apis) = (Vec::new(), Vec::new(), Vec::new());
    for n in 1..=nodes {
        let home = tempfile::tempdir()?;
        std::fs::write(
            home.path().join("config.toml"),
            format!(
                "[gateway]\nmax_concurrent_runs = {max}\n[gateway.api]\nport = 0\n[gateway.health]\nport = 0\n\
                 [gateway.store]\nbackend = \"postgres\"\nurl_secret = \"store_url\"\n\
                 [gateway.cluster]\nenabled = true\nnode_id = \"node-{n}\"\nlease_term_ms = {term_ms}\n{extra}"
            ),
        )?;
        write_secrets(home.path(), &format!("store_url = \"{url}\"\n"))?;
        let (child, ready) = spawn_server(home.path()).await?;
        apis.push(ready_address(&ready, "api=")?);
        homes.push(home);
        children.push(child);
    }
    Ok((homes, children, apis))
}

/// Posts one echo run in `session` to `api` and follows its events on the
/// same node to `run_completed`.
async fn run_to_completion(
    client: &reqwest::Client,
    api: &str,
    session: &str,
    prompt: &str,
) -> anyhow::Result<()> {
    use futures::StreamExt;
    let accepted: serde_json::Value = client
        .post(format!("{api}/v1/runs"))
        .bearer_auth("bench-token-0123456789")
        .json(&serde_json::json!({ "prompt": prompt, "session_key": session }))
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    let run_id = accepted["run_id"].as_str().unwrap_or_default().to_owned();
    let events = client
        .get(format!("{api}/v1/runs/{run_id}/events"))
        .bearer_auth("bench-token-0123456789")
        .send()
        .await?
        .error_for_status()?;
    let mut stream = events.bytes_stream();
    let mut seen = String::new();
    while let Some(chunk) = stream.next().await {
        seen.push_str(&String::from_utf8_lossy(&chunk?));
        if seen.contains("event: run_completed") {
            return Ok(());
        }
    }
    anyhow::bail!("the events of {run_id} ended before run_completed")
}

/// Cluster mode: `runs` echo runs through `nodes` real nodes on one
/// PostgreSQL (each caller posts to the nodes in turn, a session of its own
/// per run), timed from the POST to `run_completed`.
async fn cluster(
    nodes: usize,
    runs: usize,
    concurrency: usize,
) -> anyhow::Result<serde_json::Value> {
    let (_homes, mut children, apis) = cluster_nodes(nodes, concurrency, 10_000, "").await?;
    let client = reqwest::Client::new();
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let apis = Arc::new(apis);
    let began = Instant::now();
    let mut callers = Vec::new();
    for _ in 0..concurrency {
        let (client, apis, next) = (client.clone(), apis.clone(), next.clone());
        callers.push(tokio::spawn(async move {
            let mut took = Vec::new();
            loop {
                let n = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if n >= runs {
                    return anyhow::Ok(took);
                }
                let at = Instant::now();
                let api = &apis[n % apis.len()];
                run_to_completion(&client, api, &format!("bench-{n}"), &format!("bench {n}"))
                    .await?;
                took.push(at.elapsed().as_micros() as u64);
            }
        }));
    }
    let mut took = Vec::with_capacity(runs);
    for caller in callers {
        took.extend(caller.await??);
    }
    let elapsed = began.elapsed();
    for child in &mut children {
        child.start_kill()?;
        let _ = child.wait().await;
    }
    took.sort_unstable();
    Ok(serde_json::json!({
        "scenario": "cluster",
        "nodes": nodes,
        "runs": runs,
        "concurrency": concurrency,
        "runs_per_sec": (runs as f64 / elapsed.as_secs_f64()).round(),
        "submit_to_completed_p50_us": percentile(&took, 0.50),
        "submit_to_completed_p99_us": percentile(&took, 0.99),
    }))
}

/// Failover: three nodes with lease term `term_ms` and an echo engine taking
/// `ECHO_MS` a run; each of `sessions` sessions is given a run through the
/// nodes in turn (the node that takes it holds the session while it runs),
/// then node 1 is killed (`SIGKILL`) and every session is sent another run
/// through node 2. Each session's time from the kill to that run's
/// completion, less the run's own `ECHO_MS`: the slowest is the failover time
/// (node 1's sessions wait for its leases to lapse and another node to adopt them).
async fn cluster_failover(sessions: usize, term_ms: u64) -> anyhow::Result<serde_json::Value> {
    const ECHO_MS: u64 = 500;
    let extra = format!("[gateway.engines.echo]\ndelay_ms = {ECHO_MS}\n");
    let (_homes, mut children, apis) = cluster_nodes(3, sessions * 2, term_ms, &extra).await?;
    let client = reqwest::Client::new();
    for n in 0..sessions {
        client
            .post(format!("{}/v1/runs", apis[n % apis.len()]))
            .bearer_auth("bench-token-0123456789")
            .json(&serde_json::json!({ "prompt": "held", "session_key": format!("failover-{n}") }))
            .send()
            .await?
            .error_for_status()?;
    }
    let killed = Instant::now();
    children[0].start_kill()?;
    let _ = children[0].wait().await;
    let mut answers = Vec::new();
    for n in 0..sessions {
        let (client, api) = (client.clone(), apis[1].clone());
        answers.push(tokio::spawn(async move {
            run_to_completion(&client, &api, &format!("failover-{n}"), "after the kill").await?;
            anyhow::Ok((killed.elapsed().as_micros() as u64).saturating_sub(ECHO_MS * 1_000))
        }));
    }
    let mut took = Vec::with_capacity(sessions);
    for answer in answers {
        took.push(answer.await??);
    }
    for child in &mut children[1..] {
        child.start_kill()?;
        let _ = child.wait().await;
    }
    took.sort_unstable();
    Ok(serde_json::json!({
        "scenario": "cluster-failover",
        "nodes": 3,
        "sessions": sessions,
        "lease_term_ms": term_ms,
        "echo_ms": ECHO_MS,
        "kill_to_answer_p50_ms": percentile(&took, 0.50) / 1_000,
        "failover_ms": took.last().copied().unwrap_or(0) / 1_000,
    }))
}

/// The Telegram bot against a fake Bot API in this process: first the time from
/// a message to its answer in a quiet chat, then a burst of one message in each
/// of `chats` chats, paced by the outbox within Telegram's limits.
async fn telegram(lone: usize, chats: usize) -> anyhow::Result<serde_json::Value> {
    use lemon_tests::fake_telegram::{ChatSpec, FakeTelegram};
    let fake = FakeTelegram::start(&[("1:bench-bot-token", 1, "bench_bot")]).await;
    let home = tempfile::tempdir()?;
    // The lone chats (10_000…) and the burst's (20_000…) are listed.
    let allowed: Vec<String> = (0..lone)
        .map(|n| 10_000 + n as i64)
        .chain((0..chats).map(|n| 20_000 + n as i64))
        .map(|chat| chat.to_string())
        .collect();
    std::fs::write(
        home.path().join("config.toml"),
        format!(
            "[gateway]\nenable_telegram = true\nmax_concurrent_runs = 64\n\
             [gateway.api]\nport = 0\n[gateway.health]\nport = 0\n\
             [gateway.telegram]\nbot_token = \"1:bench-bot-token\"\napi_base_url = \"{}\"\n\
             allowed_chat_ids = [{}]\n",
            fake.base_url(),
            allowed.join(", ")
        ),
    )?;
    let (mut child, _ready) = spawn_server(home.path()).await?;
    let patience = Duration::from_secs(120);
    fake.wait_until("the bot to poll", patience, |s| s.waiting_polls() > 0).await;
    // Past the outbox's quiet start.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let answered = |chat: i64, text: &str| {
        let text = text.to_owned();
        move |s: &lemon_tests::fake_telegram::Snapshot<'_>| {
            s.messages(chat).iter().any(|m| m.text.starts_with(&text))
        }
    };
    let mut latencies = Vec::with_capacity(lone);
    for n in 0..lone {
        let chat = 10_000 + n as i64;
        let text = format!("lone message {n}");
        let began = Instant::now();
        fake.inject_text(&ChatSpec::private(chat), chat, &text);
        fake.wait_until("a lone answer", patience, answered(chat, &text)).await;
        latencies.push(began.elapsed());
    }
    latencies.sort();
    let calls_before = fake.calls().len();
    let began = Instant::now();
    for n in 0..chats {
        let chat = 20_000 + n as i64;
        fake.inject_text(&ChatSpec::private(chat), chat, &format!("burst message {n}"));
    }
    fake.wait_until("every burst answer", patience, |s| {
        (0..chats).all(|n| {
            let chat = 20_000 + n as i64;
            s.messages(chat).iter().any(|m| m.text.starts_with("burst message"))
        })
    })
    .await;
    let burst = began.elapsed();
    let writes = fake.calls()[calls_before..]
        .iter()
        .filter(|c| matches!(c.method.as_str(), "sendMessage" | "editMessageText"))
        .count();
    child.start_kill()?;
    let _ = child.wait().await;
    let ms = |d: Duration| (d.as_secs_f64() * 1e4).round() / 10.0;
    Ok(serde_json::json!({
        "scenario": "telegram",
        "lone_messages": lone,
        "message_to_answer_p50_ms": ms(latencies[lone / 2]),
        "message_to_answer_max_ms": ms(latencies[lone - 1]),
        "burst_chats": chats,
        "burst_seconds": (burst.as_secs_f64() * 100.0).round() / 100.0,
        "burst_answers_per_second": (chats as f64 / burst.as_secs_f64()).round(),
        "telegram_writes_per_message": (writes as f64 / chats as f64 * 100.0).round() / 100.0,
        "flood_limit_violations": fake.violations().len(),
    }))
}

/// Sync webhook turns on the native engine against a fake LLM in this process
/// that answers at once: `text` turns answered with their own text, then
/// `tools` turns where the model calls `list` once and then answers. Each turn
/// is a fresh conversation, sent one after the other; the gateway's CPU time is
/// read from `/proc` around each phase.
async fn native(text: usize, tools: usize) -> anyhow::Result<serde_json::Value> {
    use lemon_tests::fake_llm::{FakeLlm, FakeToolCall, Turn};
    const HOOK_TOKEN: &str = "bench-hook-token-0123456789";
    const LIST_PROMPT: &str = "please call the list tool";
    let llm = FakeLlm::start().await;
    llm.rule(LIST_PROMPT, Turn::tool_calls(vec![FakeToolCall::new("call_list", "list", &["{}"])]));
    let home = tempfile::tempdir()?;
    let workdir = tempfile::tempdir()?;
    for name in ["Cargo.toml", "README.md", "main.rs"] {
        std::fs::write(workdir.path().join(name), "bench\n")?;
    }
    std::fs::write(
        home.path().join("config.toml"),
        format!(
            "[gateway]\nenable_webhook = true\nmax_concurrent_runs = 64\ndefault_cwd = \"{}\"\n\
             [gateway.api]\nport = 0\n[gateway.health]\nport = 0\n\
             [gateway.webhook]\nport = 0\nmode = \"sync\"\n\
             [gateway.webhook.integrations.bench]\ntoken = \"{HOOK_TOKEN}\"\nallow_session_key = true\nuntrusted = false\n\
             [gateway.engines.lemon]\nbase_url = \"{}\"\nmodel = \"bench-model\"\n",
            workdir.path().display(),
            llm.base_url()
        ),
    )?;
    write_secrets(home.path(), "openai_api_key = \"sk-bench-key\"\n")?;
    let (mut child, ready) = spawn_server(home.path()).await?;
    let hook = ready_address(&ready, "webhook=")?;
    let pid = child.id().ok_or_else(|| anyhow::anyhow!("server exited"))?;
    let client = reqwest::Client::new();
    let mut turn = 0usize;
    let mut send = |prompt: String, engine: &str| {
        turn += 1;
        let body = serde_json::json!({
            "prompt": prompt,
            "session_key": format!("t{turn}"),
            "engine": engine,
        });
        let request = client.post(format!("{hook}bench")).bearer_auth(HOOK_TOKEN).json(&body);
        async move {
            let began = Instant::now();
            let response = request.send().await?;
            anyhow::ensure!(response.status() == 200, "webhook answered {}", response.status());
            let answer: serde_json::Value = response.json().await?;
            let elapsed = began.elapsed();
            anyhow::ensure!(answer["ok"] == true, "the run failed: {answer}");
            anyhow::Ok((elapsed, answer))
        }
    };
    // Warm-up: connections, the store, the allocator.
    for n in 0..50 {
        send(format!("warm-up {n}"), "lemon").await?;
        send(format!("warm-up {n}"), "echo").await?;
    }
    // The gateway's CPU time and thread sleeps so far.
    let usage = || -> anyhow::Result<(Duration, u64)> {
        Ok((lemon_tests::load::cpu_time(pid)?, lemon_tests::load::voluntary_switches(pid)?))
    };
    let phase = |latencies: Vec<Duration>, before: (Duration, u64)| -> anyhow::Result<_> {
        let (cpu, switches) = usage()?;
        let (cpu, switches) = (cpu.saturating_sub(before.0), switches.saturating_sub(before.1));
        let mut us: Vec<u64> = latencies.iter().map(|d| d.as_micros() as u64).collect();
        us.sort_unstable();
        let turns = us.len().max(1) as f64;
        Ok(serde_json::json!({
            "turns": us.len(),
            "request_to_answer_p50_us": percentile(&us, 0.50),
            "request_to_answer_p99_us": percentile(&us, 0.99),
            "gateway_cpu_per_turn_us": (cpu.as_secs_f64() * 1e6 / turns).round(),
            "gateway_thread_sleeps_per_turn": (switches as f64 / turns * 10.0).round() / 10.0,
        }))
    };
    // The same path with the echo engine: what the webhook, router, runtime
    // and store cost without the native engine and its model request.
    let before = usage()?;
    let mut latencies = Vec::with_capacity(text);
    for n in 0..text {
        let prompt = format!("hello from the benchmark {n}");
        let (elapsed, answer) = send(prompt.clone(), "echo").await?;
        anyhow::ensure!(answer["answer"] == prompt.as_str(), "an echoed answer: {answer}");
        latencies.push(elapsed);
    }
    let echo_phase = phase(latencies, before)?;
    let before = usage()?;
    let mut latencies = Vec::with_capacity(text);
    for n in 0..text {
        let prompt = format!("hello from the benchmark {n}");
        let (elapsed, answer) = send(prompt.clone(), "lemon").await?;
        anyhow::ensure!(answer["answer"] == prompt.as_str(), "an echoed answer: {answer}");
        latencies.push(elapsed);
    }
    let text_phase = phase(latencies, before)?;
    let requests_before = llm.requests().len();
    let before = usage()?;
    let mut latencies = Vec::with_capacity(tools);
    for n in 0..tools {
        let (elapsed, answer) = send(format!("{LIST_PROMPT} ({n})"), "lemon").await?;
        let text = answer["answer"].as_str().unwrap_or_default();
        anyhow::ensure!(text.contains("README.md"), "the list went back: {answer}");
        latencies.push(elapsed);
    }
    let tool_phase = phase(latencies, before)?;
    let model_requests = llm.requests().len() - requests_before;
    anyhow::ensure!(model_requests == 2 * tools, "two model turns per tool turn");
    child.start_kill()?;
    let _ = child.wait().await;
    Ok(serde_json::json!({
        "scenario": "native",
        "echo": echo_phase,
        "text": text_phase,
        "tool": tool_phase,
    }))
}

/// A phone call against instant fakes (Deepgram, ElevenLabs, Twilio's media
/// stream, all in this process): `turns` caller turns, each a final
/// transcript answered by the echo engine with one spoken sentence. The
/// gateway's share of a turn is from Deepgram's final transcript to the first
/// audio frame sent to Twilio: measured here (transcript sent → frame
/// received, both fakes' sockets included) and as the gateway reports it in
/// the call's record. The first turn after connect is reported apart.
async fn voice(turns: usize) -> anyhow::Result<serde_json::Value> {
    use lemon_tests::fake_deepgram::{results, FakeDeepgram};
    use lemon_tests::fake_elevenlabs::FakeElevenLabs;
    use lemon_tests::fake_twilio_voice::{sign, FakeTwilioRest, MediaClient};
    let (token, sid, key) = ("bench-auth-token", "CA0123456789abcdef0123456789abcdef", "bench-key");
    let deepgram = FakeDeepgram::start(key).await;
    let elevenlabs = FakeElevenLabs::start(key).await;
    let rest = FakeTwilioRest::start("ACbench", token, Vec::new(), 0).await;
    let port = tokio::net::TcpListener::bind("127.0.0.1:0").await?.local_addr()?.port();
    let public_url = format!("http://127.0.0.1:{port}");
    let home = tempfile::tempdir()?;
    std::fs::write(
        home.path().join("config.toml"),
        format!(
            "[gateway.api]\nport = 0\n[gateway.health]\nport = 0\n\
             [gateway.voice]\nenabled = true\nport = {port}\npublic_url = \"{public_url}\"\n\
             deepgram_base_url = \"{}\"\nelevenlabs_base_url = \"{}\"\ntwilio_api_base_url = \"{}\"\n\
             engine = \"echo\"\ngreeting = \"\"\nsilence_timeout_ms = 600000\n\
             allowed_callers = [\"+15551230100\"]\n",
            deepgram.base_url, elevenlabs.base_url, rest.base_url
        ),
    )?;
    write_secrets(
        home.path(),
        &format!(
            "twilio_auth_token = \"{token}\"\ntwilio_account_sid = \"ACbench\"\n\
             deepgram_api_key = \"{key}\"\nelevenlabs_api_key = \"{key}\"\n"
        ),
    )?;
    let (mut child, ready) = spawn_server(home.path()).await?;
    let api = ready_address(&ready, "api=")?;
    let client = reqwest::Client::new();
    let hook = format!("{public_url}/webhooks/twilio/voice");
    let params = [("CallSid", sid), ("From", "+15551230100"), ("To", "+15551239999")];
    let twiml = client
        .post(&hook)
        .header("X-Twilio-Signature", sign(token, &hook, &params))
        .form(&params)
        .send()
        .await?
        .text()
        .await?;
    let attr = |name: &str| -> anyhow::Result<String> {
        let start = twiml.find(&format!("{name}=\"")).ok_or_else(|| anyhow::anyhow!("{twiml}"))?
            + name.len()
            + 2;
        let end = twiml[start..].find('"').ok_or_else(|| anyhow::anyhow!("{twiml}"))?;
        Ok(twiml[start..start + end].to_owned())
    };
    deepgram.wait_for("a stream", |s| s.streams == 1).await;
    let media = MediaClient::connect(&attr("url")?, sid, &attr("value")?).await;
    let mut measured = Vec::with_capacity(turns);
    for turn in 1..=turns {
        let before = media.log().audio().len();
        let began = Instant::now();
        deepgram.say(results(&format!("This is turn number {turn} of the call."), true, true));
        media.wait_for("the answer's first frame", |l| l.audio().len() > before).await;
        measured.push(began.elapsed().as_micros() as u64);
        // The answer played (its mark came back) before the caller speaks again.
        media.wait_for("the answer's mark", |l| l.marks() >= turn).await;
    }
    // The gateway's own figures, from the call's record.
    let call: serde_json::Value = client
        .get(format!("{api}/v1/calls/{sid}"))
        .bearer_auth("bench-token-0123456789")
        .send()
        .await?
        .json()
        .await?;
    let reported: Vec<u64> = call["turns"]
        .as_array()
        .map(|turns| {
            turns
                .iter()
                .filter_map(|t| t["timings"]["transcript_final_to_first_audio_ms"].as_f64())
                .map(|ms| (ms * 1000.0) as u64)
                .collect()
        })
        .unwrap_or_default();
    media.stop(sid);
    child.start_kill()?;
    let _ = child.wait().await;
    let summary = |all: &[u64]| {
        let first = all.first().copied().unwrap_or(0);
        let mut rest: Vec<u64> = all.iter().skip(1).copied().collect();
        rest.sort_unstable();
        serde_json::json!({
            "first_turn_ms": first as f64 / 1000.0,
            "p50_ms": percentile(&rest, 0.50) as f64 / 1000.0,
            "p99_ms": percentile(&rest, 0.99) as f64 / 1000.0,
        })
    };
    Ok(serde_json::json!({
        "scenario": "voice",
        "turns": turns,
        "transcript_to_first_frame_seen_by_twilio": summary(&measured),
        "transcript_final_to_first_audio_reported": summary(&reported),
    }))
}

async fn scenario(name: &str) -> anyhow::Result<Vec<serde_json::Value>> {
    Ok(match name {
        "throughput" => vec![
            throughput("memory", 200_000, 10_000).await?,
            throughput("sqlite", 200_000, 10_000).await?,
        ],
        "throughput-memory" => vec![throughput("memory", 200_000, 10_000).await?],
        "throughput-sqlite" => vec![throughput("sqlite", 200_000, 10_000).await?],
        // The same on a PostgreSQL store (a server named by LEMON_BENCH_POSTGRES_URL).
        "throughput-postgres" => vec![throughput("postgres", 50_000, 5_000).await?],
        // The real binary over HTTP, one node on each store.
        "api-store" => vec![
            api_store("sqlite", 300, 1).await?,
            api_store("postgres", 300, 1).await?,
            api_store("sqlite", 2_000, 16).await?,
            api_store("postgres", 2_000, 16).await?,
        ],
        // Cluster mode on one PostgreSQL: one node, then three; and how long
        // a killed node's sessions take to answer again on another.
        "cluster" => vec![
            cluster(1, 2_000, 16).await?,
            cluster(3, 2_000, 16).await?,
            cluster_failover(12, 3_000).await?,
        ],
        "latency-postgres" => vec![
            latency_on("sqlite", 5_000, 1_000, None).await?,
            latency_on("postgres", 5_000, 1_000, None).await?,
        ],
        "latency" => vec![latency(5_000, 1_000).await?],
        // The same load on SQLite, alone and with a retention pass beside it
        // over 200 000 old runs (it outlasts the load).
        "latency-prune" => vec![
            latency_on("sqlite", 5_000, 1_000, None).await?,
            latency_on("sqlite", 5_000, 1_000, Some(200_000)).await?,
        ],
        "conversations" => vec![conversations(100_000).await?],
        "startup" => vec![startup().await?],
        "telegram" => vec![telegram(20, 150).await?],
        "native" => vec![native(2_000, 500).await?],
        "voice" => vec![voice(20).await?],
        "connections" => vec![load::connections(4_000, 1_000).await?],
        "soak" => vec![load::soak(30 * 60).await?],
        other => match other.strip_prefix("soak:").map(str::parse::<u64>) {
            Some(Ok(seconds)) => vec![load::soak(seconds).await?],
            _ => anyhow::bail!(
                "unknown scenario {other:?}: use api-store, cluster, throughput, throughput-postgres, latency, latency-prune, latency-postgres, conversations, startup, telegram, native, voice, connections or soak[:SECONDS]"
            ),
        },
    })
}

fn main() -> anyhow::Result<()> {
    let mut names: Vec<String> = std::env::args().skip(1).collect();
    if names.is_empty() {
        names =
            ["throughput", "latency", "conversations", "startup", "telegram", "native", "voice"]
                .map(str::to_owned)
                .to_vec();
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    for name in names {
        for result in runtime.block_on(scenario(&name))? {
            println!("{result}");
        }
    }
    Ok(())
}
