//! `/metrics` on the real binary, read with a strict Prometheus text reader
//! (with the API token, and once without it: no session keys then):
//! runs on echo and on the fake CLI by engine and outcome, their histograms
//! and spend, config reloads applied and refused, the Telegram transport's
//! state and its outbox's backlog, the MCP servers' states and calls.

use serde_json::json;

use crate::support::{write_config, Gateway, PATIENCE, TOKEN};
use crate::telegram_e2e::{config as telegram_config, fake_telegram, start};
use lemon_tests::fake_cli::fixture;
use lemon_tests::prometheus::Scrape;

/// `/metrics` with the API token (sessions are named), checked whole.
async fn scrape(gateway: &Gateway) -> Scrape {
    let url = format!("{}/metrics", gateway.health);
    let response = gateway.http.get(url).bearer_auth(TOKEN).send().await.unwrap();
    assert_eq!(response.status(), 200);
    let content_type = response.headers()["content-type"].to_str().unwrap().to_owned();
    assert_eq!(content_type, "text/plain; version=0.0.4; charset=utf-8");
    let text = response.text().await.unwrap();
    Scrape::parse(&text).unwrap_or_else(|error| panic!("{error}\n{text}"))
}

/// Scrapes until `done` holds for a scrape, within the tests' patience.
async fn scrape_until(gateway: &Gateway, what: &str, done: impl Fn(&Scrape) -> bool) -> Scrape {
    tokio::time::timeout(PATIENCE, async {
        loop {
            let scrape = scrape(gateway).await;
            if done(&scrape) {
                return scrape;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("metrics never showed {what}"))
}

fn completed(scrape: &Scrape, engine: &str, outcome: &str) -> f64 {
    scrape
        .value("lemon_runs_completed_total", &[("engine", engine), ("outcome", outcome)])
        .unwrap_or(0.0)
}

/// Engines on the fake CLI: `claude` answers (and reports $0.0123), `codex`
/// fails its turn, `droid` starts and never ends until cancelled.
fn engines(hang_fixture: &std::path::Path) -> String {
    let cli = env!("CARGO_BIN_EXE_fake-cli");
    format!(
        "[gateway.engines.echo]\ndelay_ms = 1\n\
         [gateway.engines.claude]\ncli_path = \"{cli}\"\nenv = {{ FAKE_CLI_FIXTURE = \"{}\" }}\n\
         [gateway.engines.codex]\ncli_path = \"{cli}\"\nenv = {{ FAKE_CLI_FIXTURE = \"{}\" }}\n\
         [gateway.engines.droid]\ncli_path = \"{cli}\"\nenv = {{ FAKE_CLI_FIXTURE = \"{}\", FAKE_CLI_HANG = \"1\" }}\n{}",
        fixture("claude", "synth_tool_use_success.jsonl").display(),
        fixture("codex", "synth_reconnect_then_turn_failed.jsonl").display(),
        hang_fixture.display(),
        crate::support::ALLOW_EVERY_CALL,
    )
}

#[tokio::test]
async fn metrics_count_runs_reloads_and_show_the_transport_and_its_backlog() {
    let dir = tempfile::tempdir().unwrap();
    let hang = dir.path().join("nothing.jsonl");
    std::fs::write(&hang, "").unwrap();
    let fake = fake_telegram().await;
    let config = telegram_config(&fake, "", &engines(&hang));
    let gateway = start(&fake, &config).await;

    let before = scrape(&gateway).await;
    for family in [
        ("lemon_runs_started_total", "counter"),
        ("lemon_runs_completed_total", "counter"),
        ("lemon_run_duration_seconds", "histogram"),
        ("lemon_run_first_delta_seconds", "histogram"),
        ("lemon_runs_in_flight", "gauge"),
        ("lemon_runs_waiting", "gauge"),
        ("lemon_session_queue_length", "gauge"),
        ("lemon_session_queue_rest", "gauge"),
        ("lemon_transport_state", "gauge"),
        ("lemon_transport_errors_total", "counter"),
        ("lemon_outbox_backlog", "gauge"),
        ("lemon_config_reloads_total", "counter"),
        ("lemon_spend_usd_total", "counter"),
        ("lemon_spend_tokens_total", "counter"),
        ("lemon_store_bytes", "gauge"),
    ] {
        assert_eq!(before.types.get(family.0).map(String::as_str), Some(family.1), "{family:?}");
    }
    assert_eq!(
        before.value("lemon_transport_state", &[("transport", "telegram"), ("state", "running")]),
        Some(1.0)
    );
    assert_eq!(
        before.value("lemon_transport_state", &[("transport", "telegram"), ("state", "failing")]),
        Some(0.0)
    );
    assert_eq!(
        before.value("lemon_transport_errors_total", &[("transport", "telegram")]),
        Some(0.0)
    );
    assert_eq!(before.value("lemon_outbox_backlog", &[("transport", "telegram")]), Some(0.0));
    assert_eq!(before.value("lemon_runs_in_flight", &[]), Some(0.0));
    // The store's file and log as they are on disk, as /v1/status has them.
    let stored = before.value("lemon_store_bytes", &[]).unwrap();
    let status: serde_json::Value =
        gateway.get("/v1/status").send().await.unwrap().json().await.unwrap();
    let store = &status["store"];
    assert_eq!(store["path"], gateway.home.join("lemon.db").display().to_string(), "{status}");
    assert!(store["bytes"].as_u64().unwrap() > 0, "{status}");
    let on_disk = std::fs::metadata(gateway.home.join("lemon.db")).unwrap().len();
    assert!(stored >= on_disk as f64, "{stored} of {on_disk}");

    // One run each: echo and claude answer, codex fails, droid is cancelled.
    for (engine, status) in [("echo", "completed"), ("claude", "completed"), ("codex", "failed")] {
        let run_id = gateway.submit(json!({ "prompt": "hello", "engine": engine })).await;
        let record = gateway.wait(&run_id).await;
        assert_eq!(record["status"], status, "{engine}: {record}");
        if status == "failed" {
            // Its zero-answer retry runs next; it must be done before the slots
            // are counted below.
            gateway.wait_for_submitted(&format!("{run_id}.retry")).await;
        }
    }
    let hanging = gateway
        .submit(json!({ "prompt": "hello", "engine": "droid", "session_key": "hangs" }))
        .await;
    // A second request in the same session waits behind the hanging run.
    let queued = gateway
        .submit(json!({ "prompt": "later", "engine": "droid", "session_key": "hangs" }))
        .await;
    let busy = scrape_until(&gateway, "the droid run holding a slot", |s| {
        s.value("lemon_runs_started_total", &[("engine", "droid")]) == Some(1.0)
            && s.value("lemon_session_queue_length", &[("session", "hangs")]) == Some(1.0)
    })
    .await;
    assert_eq!(busy.value("lemon_runs_in_flight", &[]), Some(1.0));
    // Without the token no session key is named; the queued request is still counted.
    let url = format!("{}/metrics", gateway.health);
    let text = gateway.http.get(url).send().await.unwrap().text().await.unwrap();
    let public = Scrape::parse(&text).unwrap_or_else(|error| panic!("{error}\n{text}"));
    assert!(!text.contains("hangs"), "{text}");
    assert!(public.find("lemon_session_queue_length", &[("session", "hangs")]).is_empty());
    assert_eq!(public.value("lemon_session_queue_rest", &[]), Some(1.0));
    assert_eq!(public.value("lemon_sessions_queued", &[]), Some(1.0));
    for run_id in [&queued, &hanging] {
        let response = gateway.post(&format!("/v1/runs/{run_id}/cancel")).send().await.unwrap();
        assert_eq!(response.status(), 202);
        let record = gateway.wait(run_id).await;
        assert_eq!(record["status"], "cancelled", "{record}");
    }

    // A run that failed with no answer is retried once, and fails again.
    let after = scrape_until(&gateway, "every run completed", |s| {
        completed(s, "droid", "cancelled") == 2.0 && completed(s, "codex", "failed") == 2.0
    })
    .await;
    for (engine, outcome, n) in [
        ("echo", "completed", 1.0),
        ("echo", "failed", 0.0),
        ("claude", "completed", 1.0),
        ("codex", "failed", 2.0),
        ("codex", "completed", 0.0),
        ("droid", "cancelled", 2.0),
    ] {
        assert_eq!(completed(&after, engine, outcome), n, "{engine} {outcome}");
    }
    for (engine, n) in [("echo", 1.0), ("claude", 1.0), ("codex", 2.0), ("droid", 1.0)] {
        assert_eq!(after.value("lemon_runs_started_total", &[("engine", engine)]), Some(n));
    }
    // The histograms count every completion; echo's first delta is timed.
    for (engine, n) in [("echo", 1.0), ("claude", 1.0), ("codex", 2.0), ("droid", 2.0)] {
        let count = after.value("lemon_run_duration_seconds_count", &[("engine", engine)]);
        assert_eq!(count, Some(n), "{engine}");
    }
    assert_eq!(
        after.value("lemon_run_first_delta_seconds_count", &[("engine", "echo")]),
        Some(1.0)
    );
    assert_eq!(after.value("lemon_spend_usd_total", &[("engine", "claude")]), Some(0.0123));
    assert_eq!(
        after.value("lemon_spend_tokens_total", &[("engine", "claude"), ("kind", "input")]),
        Some(92.0)
    );
    assert_eq!(after.value("lemon_runs_in_flight", &[]), Some(0.0));
    assert!(after.find("lemon_session_queue_length", &[("session", "hangs")]).is_empty());
    assert_eq!(after.value("lemon_metrics_events_lost_total", &[]), Some(0.0));

    // An edit applied, then one refused.
    let reloads = |s: &Scrape, outcome: &str| {
        s.value("lemon_config_reloads_total", &[("outcome", outcome)]).unwrap_or(-1.0)
    };
    assert_eq!((reloads(&after, "applied"), reloads(&after, "rejected")), (0.0, 0.0));
    let edited = config.replace("delay_ms = 1", "delay_ms = 2");
    write_config(&gateway.home, &edited);
    scrape_until(&gateway, "the applied edit", |s| reloads(s, "applied") == 1.0).await;
    write_config(&gateway.home, &format!("{edited}\n[gateway\n"));
    let refused =
        scrape_until(&gateway, "the refused edit", |s| reloads(s, "rejected") == 1.0).await;
    assert_eq!(reloads(&refused, "applied"), 1.0);
    assert_eq!(refused.value("lemon_config_rejected", &[]), Some(1.0));
}

/// The MCP servers of `[[gateway.mcp_servers]]` before any run started
/// one: a disabled server and an idle one, no calls, no tools yet.
#[tokio::test]
async fn metrics_show_each_mcp_servers_state_and_calls() {
    let gateway = Gateway::start(
        "[[gateway.mcp_servers]]\nname = \"docs\"\nurl = \"https://mcp.example.test/mcp\"\nenabled = false\n\n\
         [[gateway.mcp_servers]]\nname = \"fs\"\ncommand = \"lemon-no-such-mcp-server\"\n",
    )
    .await;
    let scrape = scrape(&gateway).await;
    let value = |name: &str, labels: &[(&str, &str)]| {
        scrape.value(name, labels).unwrap_or_else(|| panic!("{name} {labels:?}"))
    };
    assert_eq!(value("lemon_mcp_server_state", &[("server", "docs"), ("state", "disabled")]), 1.0);
    assert_eq!(value("lemon_mcp_server_state", &[("server", "docs"), ("state", "running")]), 0.0);
    assert_eq!(value("lemon_mcp_server_state", &[("server", "fs"), ("state", "idle")]), 1.0);
    assert_eq!(value("lemon_mcp_server_tools", &[("server", "fs")]), 0.0);
    assert_eq!(value("lemon_mcp_server_starts_total", &[("server", "fs")]), 0.0);
    for outcome in ["ok", "error", "timeout", "cancelled"] {
        let labels = [("server", "fs"), ("outcome", outcome)];
        assert_eq!(value("lemon_mcp_tool_calls_total", &labels), 0.0, "{outcome}");
    }
    gateway.terminate().await;
}
