//! Load on the real binary: 10 000 connections open at once, half on the
//! control API and half on the webhook listener — idle sockets, event-stream
//! subscribers and submitters, from hundreds of client addresses (every
//! address in 127.0.0.0/8 is this machine) — while intake is paused so the
//! work piles up past `max_pending_runs`. Submits over the cap are answered
//! `429` with `Retry-After` and made again after it; once intake resumes every
//! accepted run completes exactly once, each stream sees its one
//! `run_completed`, and the gateway's memory and descriptors are measured at
//! the peak and after the load is gone. A client over its connection share or
//! its request rate is answered `429` with `Retry-After` while the others are
//! served; and one conversation flooded past its queue cap answers every
//! message once, the oldest with `queue_overflow`. The soak runs mixed
//! traffic for a minute (`LEMON_SOAK_SECONDS`) and fails when memory or
//! descriptors grow after the warm-up.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use lemon_tests::load::{self, client_address, Conn};
use serde_json::{json, Value};
use tokio::sync::Barrier;

use crate::support::{command, home_with, Gateway, PATIENCE, TOKEN};

const HOOK_TOKEN: &str = "load-hook-token-0123456789";

/// Connections on each listener that stay idle.
const IDLE_PER_LISTENER: usize = 2_000;
/// Submitters on the control API; each also follows its run's event stream
/// on a second connection.
const API_SUBMITTERS: usize = 1_500;
/// Submitters on the webhook listener.
const HOOK_SUBMITTERS: usize = 3_000;
/// Idle connections per client address, and submitters per client address.
const IDLE_PER_CLIENT: usize = 200;
const SUBMITTERS_PER_CLIENT: usize = 10;
/// Work the gateway holds before it answers `429`.
const MAX_PENDING: usize = 3_000;
/// The per-client limits the gateway runs with.
const CLIENT_CONNECTIONS: usize = 400;
const CLIENT_RATE: u32 = 20;
const CLIENT_BURST: u32 = 40;
/// Connections open at once at the peak: each listener's share.
const PER_LISTENER: usize = IDLE_PER_LISTENER + 2 * API_SUBMITTERS;
/// Resident memory the gateway may use at the peak.
const MAX_PEAK_RSS: u64 = 1024 * 1024 * 1024;

fn config() -> String {
    format!(
        "[gateway]\nenable_webhook = true\nmax_concurrent_runs = 64\n\
         max_pending_runs = {MAX_PENDING}\nhttp_max_connections = 12000\n\
         http_idle_timeout_ms = 600000\nhttp_header_read_timeout_ms = 600000\n\
         [gateway.http_client_limits]\nmax_connections = {CLIENT_CONNECTIONS}\n\
         requests_per_second = {CLIENT_RATE}\nburst = {CLIENT_BURST}\nexempt = [\"127.0.0.1\"]\n\
         [gateway.api]\nport = 0\n[gateway.health]\nport = 0\n\
         [gateway.webhook]\nport = 0\nmode = \"async\"\n\
         [gateway.webhook.integrations.load]\ntoken = \"{HOOK_TOKEN}\"\nallow_session_key = true\n"
    )
}

/// Calls `check` every 50 ms until it gives a value or `patience` is over.
async fn poll<T, F, Fut>(patience: Duration, mut check: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + patience;
    loop {
        if let Some(value) = check().await {
            return Some(value);
        }
        if tokio::time::Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn address(url: &str) -> SocketAddr {
    url.trim_start_matches("http://").trim_end_matches('/').parse().unwrap()
}

/// What one submitter saw.
#[derive(Debug, Default)]
struct Outcome {
    run_id: String,
    prompt: String,
    /// `429` answers before the submit was accepted.
    refused: usize,
    /// `run_completed` events its stream carried (API submitters only).
    completions: Option<usize>,
}

/// Submits `body` on `conn` until it is accepted, waiting each `429`'s
/// `Retry-After`; the accepted run's id and the refusals.
async fn submit_until_accepted(
    conn: &mut Conn,
    path: &str,
    token: &str,
    body: &Value,
    answered: &AtomicUsize,
) -> (String, usize) {
    let auth = format!("Bearer {token}");
    let body = body.to_string();
    let mut refused = 0;
    loop {
        let headers = [("authorization", auth.as_str()), ("content-type", "application/json")];
        let response = conn.request("POST", path, &headers, body.as_bytes()).await.unwrap();
        if refused == 0 {
            answered.fetch_add(1, Ordering::SeqCst);
        }
        match response.status {
            200 | 202 => {
                let run_id = response.json()["run_id"].as_str().unwrap().to_owned();
                return (run_id, refused);
            }
            429 => {
                refused += 1;
                let retry: u64 = response
                    .header("retry-after")
                    .and_then(|v| v.parse().ok())
                    .expect("a 429 says when to retry");
                assert!(retry >= 1, "{response:?}");
                assert!(response.json()["error"].is_string(), "{response:?}");
                assert!(refused < 200, "refused too often: {response:?}");
                tokio::time::sleep(Duration::from_secs(retry)).await;
            }
            status => {
                panic!("submit answered {status}: {}", String::from_utf8_lossy(&response.body))
            }
        }
    }
}

/// Follows `run_id`'s event stream to its end; the `run_completed` events seen.
async fn follow(conn: &mut Conn, run_id: &str) -> usize {
    let auth = format!("Bearer {TOKEN}");
    let path = format!("/v1/runs/{run_id}/events");
    let (status, _) = conn.open_stream(&path, &[("authorization", auth.as_str())]).await.unwrap();
    assert_eq!(status, 200, "stream of {run_id}");
    let mut text = String::new();
    while let Some(chunk) = conn.read_chunk().await.unwrap() {
        text.push_str(&String::from_utf8_lossy(&chunk));
    }
    text.lines().filter(|line| *line == "event: run_completed").count()
}

// It prints the figures RELIABILITY.md reports.
#[allow(clippy::print_stderr)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_connections_at_once_lose_nothing_and_memory_stays_bounded() {
    // The client's sockets, and the gateway's (it raises its own soft limit).
    let want = 2 * PER_LISTENER as u64 + 1024;
    let limit = load::raise_descriptor_limit(want);
    if limit < want {
        let need = format!("{want} file descriptors, and the hard limit is {limit} (ulimit -Hn)");
        lemon_tests::host::lacks("LEMON_REQUIRE_DESCRIPTORS", &need);
        return;
    }
    let home = home_with(&config());
    let gateway = Gateway::spawn(command(home.path()), home.path()).await;
    let pid = gateway.pid() as u32;
    let api = address(&gateway.api);
    let hook: SocketAddr = gateway.webhook.as_deref().unwrap().parse().unwrap();
    let baseline_fds = load::open_descriptors(pid).unwrap();
    let (baseline_rss, _) = load::memory(pid).unwrap();

    // Work piles up: nothing starts until intake resumes.
    let paused = gateway.post("/v1/intake/pause").send().await.unwrap();
    assert_eq!(paused.status(), 200);

    // Idle sockets on both listeners, from their own client addresses.
    let idle_clients = IDLE_PER_LISTENER / IDLE_PER_CLIENT;
    let idle_api =
        load::open_many(api, IDLE_PER_LISTENER, 0, IDLE_PER_CLIENT).await.expect("connect");
    let idle_hook = load::open_many(hook, IDLE_PER_LISTENER, idle_clients, IDLE_PER_CLIENT)
        .await
        .expect("connect");

    // Submitters: on the API each with a second connection for its stream.
    let first = 2 * idle_clients;
    let api_submit =
        load::open_many(api, API_SUBMITTERS, first, SUBMITTERS_PER_CLIENT).await.expect("connect");
    let api_stream =
        load::open_many(api, API_SUBMITTERS, first, SUBMITTERS_PER_CLIENT).await.expect("connect");
    let first = first + API_SUBMITTERS / SUBMITTERS_PER_CLIENT;
    let hook_submit = load::open_many(hook, HOOK_SUBMITTERS, first, SUBMITTERS_PER_CLIENT)
        .await
        .expect("connect");

    // Every connection is open at the gateway at once.
    let open = 2 * PER_LISTENER;
    let held = poll(PATIENCE, || async {
        let fds = load::open_descriptors(pid).unwrap();
        (fds >= baseline_fds + open).then_some(fds)
    })
    .await
    .unwrap_or_else(|| {
        panic!(
            "the gateway holds {} descriptors, not {baseline_fds} + {open}",
            load::open_descriptors(pid).unwrap()
        )
    });

    // Everyone submits at once; the accepted API runs are followed at once.
    let barrier = Arc::new(Barrier::new(API_SUBMITTERS + HOOK_SUBMITTERS));
    let answered = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for (i, (mut submit, mut stream)) in api_submit.into_iter().zip(api_stream).enumerate() {
        let (barrier, answered) = (barrier.clone(), answered.clone());
        tasks.push(tokio::spawn(async move {
            let prompt = format!("api load {i}");
            let body = json!({ "prompt": prompt, "session_key": format!("load:api:{i}") });
            barrier.wait().await;
            let (run_id, refused) =
                submit_until_accepted(&mut submit, "/v1/runs", TOKEN, &body, &answered).await;
            let completions = Some(follow(&mut stream, &run_id).await);
            Outcome { run_id, prompt, refused, completions }
        }));
    }
    for (i, mut submit) in hook_submit.into_iter().enumerate() {
        let (barrier, answered) = (barrier.clone(), answered.clone());
        tasks.push(tokio::spawn(async move {
            let prompt = format!("webhook load {i}");
            let body = json!({ "prompt": prompt, "session_key": format!("load:hook:{i}") });
            barrier.wait().await;
            let (run_id, refused) =
                submit_until_accepted(&mut submit, "/webhooks/load", HOOK_TOKEN, &body, &answered)
                    .await;
            Outcome { run_id, prompt, refused, completions: None }
        }));
    }

    // Every submit has had its first answer: the gateway holds exactly
    // MAX_PENDING and has refused the rest.
    let everyone = API_SUBMITTERS + HOOK_SUBMITTERS;
    let first_answers =
        poll(PATIENCE, || async { (answered.load(Ordering::SeqCst) >= everyone).then_some(()) })
            .await;
    assert!(
        first_answers.is_some(),
        "{} of {everyone} submits answered",
        answered.load(Ordering::SeqCst)
    );
    let status = gateway.status().await;
    assert_eq!(status["scheduler"]["queued"], MAX_PENDING, "{status}");
    let (peak_rss, _) = load::memory(pid).unwrap();
    let peak_fds = load::open_descriptors(pid).unwrap();

    // A client over its connection share is refused with 429, the others not.
    let crowded = client_address(60_000);
    let mut share = load::open_many(api, CLIENT_CONNECTIONS, 60_000, CLIENT_CONNECTIONS)
        .await
        .expect("connect");
    let mut over = Conn::open(crowded, api).await.unwrap();
    let (status, headers) = over.read_head().await.unwrap();
    assert_eq!(status, 429, "one connection over the client's share");
    assert!(headers.iter().any(|(n, v)| n == "retry-after" && v == "1"), "{headers:?}");
    over.closed().await.unwrap();
    // A client over its request rate is answered 429 and keeps its connection.
    let auth = format!("Bearer {TOKEN}");
    let mut statuses = Vec::new();
    for _ in 0..(CLIENT_BURST as usize + 20) {
        let response =
            share[0].request("GET", "/v1/status", &[("authorization", &auth)], b"").await.unwrap();
        if response.status == 429 {
            assert!(response.header("retry-after").is_some(), "{response:?}");
            let error = response.json()["error"].as_str().unwrap_or_default().to_owned();
            assert!(error.contains("too many requests from this address"), "{error}");
        }
        statuses.push(response.status);
    }
    let limited = statuses.iter().filter(|s| **s == 429).count();
    assert!(limited >= 1, "a client sending past its burst was never limited: {statuses:?}");
    assert!(statuses[..CLIENT_BURST as usize].iter().all(|s| *s == 200), "{statuses:?}");
    // Another client is served meanwhile.
    let mut other = Conn::open(client_address(60_500), api).await.unwrap();
    let response =
        other.request("GET", "/v1/status", &[("authorization", &auth)], b"").await.unwrap();
    assert_eq!(response.status, 200);
    share.clear();

    // Intake resumes: everything queued runs, the refused are made again.
    let resumed = gateway.post("/v1/intake/resume").send().await.unwrap();
    assert_eq!(resumed.status(), 200);
    let outcomes = tokio::time::timeout(Duration::from_secs(600), futures::future::join_all(tasks))
        .await
        .expect("every submit is accepted and every stream ends");
    let outcomes: Vec<Outcome> = outcomes.into_iter().map(|o| o.unwrap()).collect();

    let refused: usize = outcomes.iter().map(|o| o.refused).sum();
    let first_refusals = outcomes.iter().filter(|o| o.refused > 0).count();
    assert_eq!(
        first_refusals,
        API_SUBMITTERS + HOOK_SUBMITTERS - MAX_PENDING,
        "submits refused at first, with {MAX_PENDING} pending"
    );
    let ids: HashSet<&str> = outcomes.iter().map(|o| o.run_id.as_str()).collect();
    assert_eq!(ids.len(), outcomes.len(), "two submits got the same run");
    for outcome in &outcomes {
        if let Some(completions) = outcome.completions {
            assert_eq!(completions, 1, "run {} completed {completions} times", outcome.run_id);
        }
    }
    // Every accepted run completed once, with its own answer.
    let quiet = poll(PATIENCE, || async {
        let status = gateway.status().await;
        let scheduler = &status["scheduler"];
        (scheduler["queued"] == 0 && scheduler["in_flight"] == 0).then_some(())
    })
    .await;
    assert!(quiet.is_some(), "work is left: {}", gateway.status().await);
    // Read with a client of their own, whose pooled connections are gone
    // before the descriptors are counted below.
    let reader = reqwest::Client::new();
    let record = |run_id: &str| {
        let request = reader.get(format!("{}/v1/runs/{run_id}", gateway.api)).bearer_auth(TOKEN);
        async move { request.send().await.unwrap().json::<Value>().await.unwrap() }
    };
    let mut unfinished = Vec::new();
    for batch in outcomes.chunks(64) {
        let records = futures::future::join_all(batch.iter().map(|o| record(&o.run_id))).await;
        for (outcome, record) in batch.iter().zip(records) {
            if record["status"] != "completed" || record["answer"] != outcome.prompt.as_str() {
                unfinished.push(record);
            }
        }
    }
    assert!(
        unfinished.is_empty(),
        "{} runs did not complete with their answer: {:?}",
        unfinished.len(),
        &unfinished[..unfinished.len().min(3)]
    );

    // The load is gone: descriptors come back, memory does not keep growing.
    drop(reader);
    drop(idle_api);
    drop(idle_hook);
    drop(other);
    let after = poll(PATIENCE, || async {
        let fds = load::open_descriptors(pid).unwrap();
        (fds <= baseline_fds + 16).then_some(fds)
    })
    .await;
    let (after_rss, hwm) = load::memory(pid).unwrap();
    let mb = |bytes: u64| bytes as f64 / (1024.0 * 1024.0);
    eprintln!(
        "load: {open} connections held at once ({held} descriptors, {peak_fds} when the cap was full), \
         {} runs, {refused} refusals of the pending cap; RSS {:.1} MB idle, {:.1} MB at the peak \
         ({:.1} KB a connection), {:.1} MB after, high-water {:.1} MB",
        outcomes.len(),
        mb(baseline_rss),
        mb(peak_rss),
        (peak_rss.saturating_sub(baseline_rss)) as f64 / open as f64 / 1024.0,
        mb(after_rss),
        mb(hwm),
    );
    assert!(after.is_some(), "descriptors stayed at {}", load::open_descriptors(pid).unwrap());
    assert!(hwm < MAX_PEAK_RSS, "the gateway's memory peaked at {:.1} MB", mb(hwm));
}

/// How long the soak runs: `LEMON_SOAK_SECONDS`, 60 s by default (the
/// compressed day is `LEMON_SOAK_SECONDS=1800`).
fn soak_duration() -> Duration {
    let seconds = std::env::var("LEMON_SOAK_SECONDS").ok().and_then(|v| v.parse().ok());
    Duration::from_secs(seconds.unwrap_or(60))
}

// It prints its samples and figures for RELIABILITY.md.
#[allow(clippy::print_stderr)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_soak_of_mixed_traffic_keeps_memory_and_descriptors_flat() {
    let config = format!(
        "[gateway]\nenable_webhook = true\nmax_concurrent_runs = 64\n\
         [gateway.http_client_limits]\nmax_connections = 0\nrequests_per_second = 0\n\
         [gateway.api]\nport = 0\n[gateway.health]\nport = 0\n\
         [gateway.webhook]\nport = 0\nmode = \"async\"\n\
         [gateway.webhook.integrations.soak]\ntoken = \"{HOOK_TOKEN}\"\nallow_session_key = true\n\
         [gateway.webhook.integrations.sync]\ntoken = \"{HOOK_TOKEN}\"\nmode = \"sync\"\n"
    );
    let gateway = Gateway::start(&config).await;
    let target = load::SoakTarget {
        api: address(&gateway.api),
        hook: gateway.webhook.as_deref().unwrap().parse().unwrap(),
        pid: gateway.pid() as u32,
        api_token: TOKEN.to_owned(),
        hook_token: HOOK_TOKEN.to_owned(),
        async_integration: "soak".to_owned(),
        sync_integration: "sync".to_owned(),
    };
    let duration = soak_duration();
    let report = tokio::time::timeout(
        duration + PATIENCE,
        load::soak(&target, duration, |line| {
            eprintln!("{line}");
        }),
    )
    .await
    .expect("the soak ends")
    .expect("every request answered as a healthy gateway answers");
    eprintln!("{}", serde_json::to_string(&report).unwrap());
    assert!(report.runs > 0);
    assert!(
        report.flat,
        "memory or descriptors grew: RSS {} MB midway, {} MB at the end; descriptors {} midway, {} at the end",
        report.rss_mb_middle,
        report.rss_mb_late,
        report.descriptors_middle,
        report.descriptors_max_late
    );
    // Nothing is left behind: every run it started has finished.
    let quiet = poll(PATIENCE, || async {
        let status = gateway.status().await;
        (status["scheduler"]["queued"] == 0 && status["scheduler"]["in_flight"] == 0).then_some(())
    })
    .await;
    assert!(quiet.is_some(), "work is left after the soak: {}", gateway.status().await);
}

#[tokio::test]
async fn one_conversation_flooded_past_its_queue_cap_answers_every_message_once() {
    const MESSAGES: usize = 200;
    const CAP: usize = 20;
    let config = format!(
        "[gateway]\nmax_concurrent_runs = 4\n\
         [gateway.queue]\nmode = \"collect\"\ncap = {CAP}\ndrop = \"oldest\"\n\
         [gateway.api]\nport = 0\n[gateway.health]\nport = 0\n"
    );
    let gateway = Gateway::start(&config).await;
    assert_eq!(gateway.post("/v1/intake/pause").send().await.unwrap().status(), 200);
    let mut run_ids = Vec::with_capacity(MESSAGES);
    for i in 0..MESSAGES {
        run_ids.push(
            gateway.submit(json!({ "prompt": format!("flood {i}"), "session_key": "flood" })).await,
        );
    }
    assert_eq!(gateway.post("/v1/intake/resume").send().await.unwrap().status(), 200);
    let mut completed = Vec::new();
    let mut overflowed = 0;
    for (i, run_id) in run_ids.iter().enumerate() {
        // Its stream carries exactly one completion.
        let events = gateway.events(run_id).await;
        let ends = events.iter().filter(|(name, _)| name == "run_completed").count();
        assert_eq!(ends, 1, "run {i} ended {ends} times");
        let record = gateway.run(run_id).await;
        match (record["status"].as_str(), record["error_code"].as_str()) {
            (Some("completed"), _) => completed.push(i),
            (_, Some("queue_overflow")) => overflowed += 1,
            other => panic!("run {i} ended as {other:?}: {record}"),
        }
    }
    // The first started, the newest CAP waited their turn, the older were dropped.
    assert_eq!(overflowed, MESSAGES - 1 - CAP, "completed: {completed:?}");
    let newest: Vec<usize> = std::iter::once(0).chain(MESSAGES - CAP..MESSAGES).collect();
    assert_eq!(completed, newest);
}
