//! The `connections` and `soak` scenarios: the real `lemon-gateway` binary
//! under many connections, and under hours of traffic compressed into a run at
//! high rate, with its resident memory and open descriptors sampled from
//! `/proc`.

use std::net::SocketAddr;
use std::time::Duration;

use lemon_tests::load::{self, client_address, Conn};
use tokio::time::Instant;

const API_TOKEN: &str = "bench-token-0123456789";
const HOOK_TOKEN: &str = "bench-hook-token-0123456789";

/// A gateway with the API and a webhook listener, per-client limits off.
async fn start(extra: &str) -> anyhow::Result<(tokio::process::Child, SocketAddr, SocketAddr)> {
    let home = tempfile::tempdir()?;
    std::fs::write(
        home.path().join("config.toml"),
        format!(
            "[gateway]\nenable_webhook = true\nmax_concurrent_runs = 64\n\
             http_idle_timeout_ms = 600000\nhttp_header_read_timeout_ms = 600000\n{extra}\n\
             [gateway.http_client_limits]\nmax_connections = 0\nrequests_per_second = 0\n\
             [gateway.api]\nport = 0\n[gateway.health]\nport = 0\n\
             [gateway.webhook]\nport = 0\nmode = \"async\"\n\
             [gateway.webhook.integrations.bench]\ntoken = \"{HOOK_TOKEN}\"\nallow_session_key = true\n\
             [gateway.webhook.integrations.sync]\ntoken = \"{HOOK_TOKEN}\"\nmode = \"sync\"\n"
        ),
    )?;
    let (child, ready) = super::spawn_server(home.path()).await?;
    // The home lives as long as the process: the gateway owns it until killed.
    std::mem::forget(home);
    let field = |name: &str| -> anyhow::Result<SocketAddr> {
        let url = ready
            .split_whitespace()
            .find_map(|w| w.strip_prefix(name))
            .ok_or_else(|| anyhow::anyhow!("no {name} in {ready:?}"))?;
        // `http://host:port/` and, for the webhook, its path after it.
        let authority = url.trim_start_matches("http://").split('/').next().unwrap_or_default();
        Ok(authority.parse()?)
    };
    Ok((child, field("api=")?, field("webhook=")?))
}

fn pid(child: &tokio::process::Child) -> anyhow::Result<u32> {
    child.id().ok_or_else(|| anyhow::anyhow!("server exited"))
}

/// What the gateway's memory grows by per idle connection and per event
/// stream: `idle` connections on each listener, then `streams` event streams
/// of queued runs on the API (intake paused), then all closed.
pub(super) async fn connections(idle: usize, streams: usize) -> anyhow::Result<serde_json::Value> {
    let want = 2 * idle + 2 * streams + 1024;
    let limit = load::raise_descriptor_limit(want as u64);
    anyhow::ensure!(limit as usize >= want, "{want} descriptors needed, the hard limit is {limit}");
    let (mut child, api, hook) =
        start(&format!("http_max_connections = {}\n", idle + 2 * streams + 100)).await?;
    let pid = pid(&child)?;
    let auth = format!("Bearer {API_TOKEN}");
    let mut control = Conn::open(client_address(0), api).await?;
    let response =
        control.request("POST", "/v1/intake/pause", &[("authorization", &auth)], b"").await?;
    anyhow::ensure!(response.status == 200, "pause answered {}", response.status);
    let (rss_before, _) = load::memory(pid)?;
    let fds_before = load::open_descriptors(pid)?;
    let began = Instant::now();
    let mut held = load::open_many(api, idle, 1, 200).await?;
    held.extend(load::open_many(hook, idle, 1 + idle / 200, 200).await?);
    // The gateway has accepted them all once it holds their descriptors.
    while load::open_descriptors(pid)? < fds_before + 2 * idle {
        anyhow::ensure!(began.elapsed() < Duration::from_secs(120), "connections not accepted");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let opened = began.elapsed();
    let (rss_idle, _) = load::memory(pid)?;
    // Streams of queued runs: each a submit, then its event stream held open.
    let mut submitters = load::open_many(api, streams, 20_000, 200).await?;
    let mut followers = load::open_many(api, streams, 40_000, 200).await?;
    let body = br#"{"prompt":"held open"}"#;
    let headers = [("authorization", auth.as_str()), ("content-type", "application/json")];
    let mut run_ids = Vec::with_capacity(streams);
    for conn in &mut submitters {
        let response = conn.request("POST", "/v1/runs", &headers, body).await?;
        anyhow::ensure!(response.status == 202, "submit answered {}", response.status);
        run_ids.push(response.json()["run_id"].as_str().unwrap_or_default().to_owned());
    }
    let (rss_submitted, _) = load::memory(pid)?;
    for (conn, run_id) in followers.iter_mut().zip(&run_ids) {
        let path = format!("/v1/runs/{run_id}/events");
        let (status, _) = conn.open_stream(&path, &[("authorization", auth.as_str())]).await?;
        anyhow::ensure!(status == 200, "stream answered {status}");
    }
    let (rss_streams, _) = load::memory(pid)?;
    let response =
        control.request("POST", "/v1/intake/resume", &[("authorization", &auth)], b"").await?;
    anyhow::ensure!(response.status == 200, "resume answered {}", response.status);
    for conn in &mut followers {
        while conn.read_chunk().await?.is_some() {}
    }
    drop((held, submitters, followers));
    let closed = Instant::now();
    while load::open_descriptors(pid)? > fds_before + 16 {
        anyhow::ensure!(closed.elapsed() < Duration::from_secs(60), "descriptors not returned");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (rss_after, hwm) = load::memory(pid)?;
    child.start_kill()?;
    let _ = child.wait().await;
    let per = |after: u64, before: u64, n: usize| {
        (after.saturating_sub(before) as f64 / n.max(1) as f64 / 1024.0 * 10.0).round() / 10.0
    };
    Ok(serde_json::json!({
        "scenario": "connections",
        "idle_connections": 2 * idle,
        "seconds_to_open": (opened.as_secs_f64() * 100.0).round() / 100.0,
        "rss_mb_before": load::mb(rss_before),
        "rss_mb_with_idle": load::mb(rss_idle),
        "kb_per_idle_connection": per(rss_idle, rss_before, 2 * idle),
        "queued_runs": streams,
        "kb_per_queued_run": per(rss_submitted, rss_idle, streams),
        "event_streams": streams,
        "kb_per_event_stream": per(rss_streams, rss_submitted, streams),
        "rss_mb_after_close": load::mb(rss_after),
        "rss_mb_high_water": load::mb(hwm),
    }))
}

/// `seconds` of the soak's traffic (see [`load::soak`]) on a fresh gateway.
pub(super) async fn soak(seconds: u64) -> anyhow::Result<serde_json::Value> {
    let (mut child, api, hook) = start("").await?;
    let target = load::SoakTarget {
        api,
        hook,
        pid: pid(&child)?,
        api_token: API_TOKEN.to_owned(),
        hook_token: HOOK_TOKEN.to_owned(),
        async_integration: "bench".to_owned(),
        sync_integration: "sync".to_owned(),
    };
    let report =
        load::soak(&target, Duration::from_secs(seconds), |line| eprintln!("{line}")).await;
    child.start_kill()?;
    let _ = child.wait().await;
    let mut json = serde_json::to_value(report?)?;
    json["scenario"] = "soak".into();
    Ok(json)
}
