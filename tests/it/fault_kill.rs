//! `kill -9` of the real binary: right after a submit is acknowledged (the
//! request was flushed to the journal before the answer went out), and at random
//! points of a workload across the control API, a webhook with callbacks and a
//! Telegram chat (the fake Bot API), restarting on the same home each time.
//! Every accepted run ends with exactly one completion, every answer reaches
//! its channel, no process of an earlier gateway is left, and memory stays
//! bounded.
//!
//! The workload runs 200 requests with 3 kills; `LEMON_LONG_TESTS=1` runs 1 000
//! with 10. `LEMON_FAULT_SEED` replays one schedule (every failure names its
//! seed); `LEMON_FAULT_FIGURES=<file>` writes what was measured there as JSON.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::routing::post;
use axum::{Json, Router};
use lemon_tests::fake_telegram::{ChatSpec, FakeTelegram};
use serde_json::{json, Value};

use crate::fault_support::{live_with_env, rss_kib};
use crate::support::{home_with, Gateway, PATIENCE};

const HOOK_TOKEN: &str = "hook-kill-token-7d1e";
const BOT_TOKEN: &str = "515151:kill-test-bot-token";
const BOT_ID: i64 = 515_151;
/// The first Telegram chat; each message of the workload is in a private
/// chat of its own (so none is merged into another's run).
const FIRST_CHAT: i64 = 20_000;
/// Most deliveries a kill can catch between the channel's write and its
/// record (the webhook's and Telegram's in flight at once).
const IN_FLIGHT_PER_KILL: usize = 16;

#[tokio::test]
async fn a_run_acknowledged_just_before_a_kill_is_there_after_the_restart_and_completes_once() {
    let home = home_with("[gateway.engines.echo]\ndelay_ms = 20\n");
    let mut accepted = Vec::new();
    for n in 0..5 {
        let mut gateway = Gateway::start_in(home.path()).await;
        let run_id = format!("acked-{n}");
        let body = json!({ "prompt": format!("acknowledged {n}"), "run_id": run_id });
        let response = gateway.post("/v1/runs").json(&body).send().await.unwrap();
        // SIGKILL the moment the acknowledgement's status line has arrived.
        gateway.child.start_kill().unwrap();
        assert_eq!(response.status(), 202, "{run_id} accepted");
        gateway.child.wait().await.unwrap();
        accepted.push(run_id);
    }
    let gateway = Gateway::start_in(home.path()).await;
    for run_id in &accepted {
        let events = gateway.events(run_id).await;
        let completions: Vec<&Value> =
            events.iter().filter(|(kind, _)| kind == "run_completed").map(|(_, d)| d).collect();
        assert_eq!(completions.len(), 1, "{run_id}: {events:?}");
        let record = gateway.run(run_id).await;
        let finished = record["status"] == "completed"
            || (record["status"] == "cancelled" && record["error_code"] == "interrupted");
        assert!(
            finished,
            "{run_id} ran after the restart, or was interrupted by the kill: {record}"
        );
    }
}

/// A callback receiver counting the deliveries of each run.
#[derive(Clone, Default)]
struct Callbacks {
    counts: Arc<Mutex<HashMap<String, usize>>>,
}

impl Callbacks {
    async fn start(&self) -> String {
        let counts = self.counts.clone();
        let app = Router::new().route(
            "/done",
            post(move |Json(body): Json<Value>| {
                let counts = counts.clone();
                async move {
                    let run_id = body["run_id"].as_str().unwrap_or_default().to_owned();
                    *counts.lock().unwrap().entry(run_id).or_default() += 1;
                    axum::http::StatusCode::OK
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/done", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        url
    }

    fn count(&self, run_id: &str) -> usize {
        self.counts.lock().unwrap().get(run_id).copied().unwrap_or(0)
    }
}

/// A small deterministic generator (xorshift), so a schedule can be replayed.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// The workload's gateway; the Telegram chats of its `runs` messages are listed.
fn workload_config(callback_url: &str, fake: &FakeTelegram, runs: u64) -> String {
    let chats: Vec<String> =
        (0..runs).map(|n| (FIRST_CHAT + i64::try_from(n).unwrap()).to_string()).collect();
    format!(
        "[gateway]\nenable_webhook = true\nenable_telegram = true\nmax_concurrent_runs = 4\n\
         [gateway.engines.echo]\ndelay_ms = 3\n\
         [gateway.webhook]\nport = 0\nallow_private_callback_hosts = true\n\
         callback_max_attempts = 50\ncallback_backoff_ms = 50\ncallback_backoff_max_ms = 200\n\
         [gateway.webhook.integrations.ci]\ntoken = \"{HOOK_TOKEN}\"\ncallback_url = \"{callback_url}\"\n\
         allow_session_key = true\nqueue_mode = \"followup\"\n\
         [gateway.telegram]\nbot_token = \"{BOT_TOKEN}\"\napi_base_url = \"{}\"\npoll_timeout_s = 1\n\
         queue_mode = \"followup\"\nprogress_delay_ms = 600000\nallowed_chat_ids = [{}]\n",
        fake.base_url(),
        chats.join(", ")
    )
}

/// One accepted request and the channel it came from.
#[derive(Debug)]
enum Accepted {
    Api { run_id: String },
    Webhook { run_id: String },
    Telegram { chat: i64, message_id: i64, token: String },
}

/// The bot's final replies to one message: its answer (the token), or the
/// notice of a run the kill interrupted.
fn telegram_answers(fake: &FakeTelegram, chat: i64, message_id: i64, token: &str) -> usize {
    fake.messages(chat)
        .iter()
        .filter(|m| m.reply_to == Some(message_id))
        .filter(|m| m.text.contains(token) || m.text.contains("Interrupted."))
        .count()
}

#[tokio::test]
async fn kill_9_at_random_points_of_a_workload_loses_and_repeats_nothing() {
    let long = std::env::var("LEMON_LONG_TESTS").is_ok_and(|v| v == "1");
    let (runs, kills) = if long { (1000u64, 10u64) } else { (200, 3) };
    let seed =
        std::env::var("LEMON_FAULT_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| u64::from(d.subsec_nanos()) | 1)
        });
    let ctx = format!("LEMON_FAULT_SEED={seed}");
    let mut rng = Rng(seed);
    let mut kill_at: Vec<u64> = (0..kills).map(|_| 1 + rng.below(runs - 1)).collect();
    kill_at.sort_unstable();
    kill_at.dedup();

    let fake = FakeTelegram::start(&[(BOT_TOKEN, BOT_ID, "lemon_kill_bot")]).await;
    let callbacks = Callbacks::default();
    let callback_url = callbacks.start().await;
    let home = home_with(&workload_config(&callback_url, &fake, runs));
    let home_entry = format!("LEMON_HOME={}", home.path().display());
    let mut gateway = Gateway::start_in(home.path()).await;
    let mut accepted = Vec::new();
    let mut max_rss_kib = rss_kib(gateway.pid());
    let mut killed_pids = Vec::new();
    for n in 0..runs {
        let token = format!("w{n}x");
        let prompt = format!("{token} a b c d e f g h");
        match rng.below(3) {
            0 => {
                let body = json!({ "prompt": prompt, "session_key": format!("api-{n}") });
                let response = gateway.post("/v1/runs").json(&body).send().await.unwrap();
                assert_eq!(response.status(), 202, "{ctx}: api submit {n}");
                let accepted_body: Value = response.json().await.unwrap();
                let run_id = accepted_body["run_id"].as_str().unwrap().to_owned();
                accepted.push(Accepted::Api { run_id });
            }
            1 => {
                let response = gateway
                    .http
                    .post(gateway.webhook_url("ci"))
                    .bearer_auth(HOOK_TOKEN)
                    .json(&json!({ "prompt": prompt, "session_key": format!("hook-{n}") }))
                    .timeout(PATIENCE)
                    .send()
                    .await
                    .unwrap();
                assert_eq!(response.status(), 202, "{ctx}: webhook {n}");
                let accepted_body: Value = response.json().await.unwrap();
                let run_id = accepted_body["run_id"].as_str().unwrap().to_owned();
                accepted.push(Accepted::Webhook { run_id });
            }
            _ => {
                let chat = FIRST_CHAT + i64::try_from(n).unwrap();
                let injected = fake.inject_text(&ChatSpec::private(chat), chat, &prompt);
                accepted.push(Accepted::Telegram { chat, message_id: injected.message_id, token });
            }
        }
        if kill_at.contains(&n) {
            max_rss_kib = max_rss_kib.max(rss_kib(gateway.pid()));
            let pid = gateway.pid();
            gateway.child.kill().await.unwrap();
            killed_pids.push(pid);
            gateway = Gateway::start_in(home.path()).await;
        }
    }

    // Every answer reaches its channel; a kill between a delivery and its
    // record can repeat that one delivery, never more.
    let mut duplicates = 0;
    for request in &accepted {
        match request {
            Accepted::Api { .. } => {}
            Accepted::Webhook { run_id } => {
                let wait = async {
                    while callbacks.count(run_id) == 0 {
                        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                    }
                };
                tokio::time::timeout(PATIENCE, wait)
                    .await
                    .unwrap_or_else(|_| panic!("{ctx}: the callback of {run_id} in time"));
                duplicates += callbacks.count(run_id) - 1;
            }
            Accepted::Telegram { chat, message_id, token } => {
                let what = format!("{ctx}: the answer to message {message_id} in chat {chat}");
                let (chat, message_id) = (*chat, *message_id);
                fake.wait_until(&what, PATIENCE, |s| {
                    s.messages(chat).iter().any(|m| {
                        m.reply_to == Some(message_id)
                            && (m.text.contains(token.as_str()) || m.text.contains("Interrupted."))
                    })
                })
                .await;
                duplicates += telegram_answers(&fake, chat, message_id, token) - 1;
            }
        }
    }
    // Every accepted request reaches exactly one completion.
    let mut interrupted = 0;
    for request in &accepted {
        let run_id = match request {
            Accepted::Api { run_id } | Accepted::Webhook { run_id } => run_id.clone(),
            Accepted::Telegram { chat, message_id, .. } => {
                format!("tg_{BOT_ID}_{chat}_{message_id}")
            }
        };
        let events = gateway.events(&run_id).await;
        let n = events.iter().filter(|(kind, _)| kind == "run_completed").count();
        assert_eq!(n, 1, "{ctx}: {run_id} completes once: {events:?}");
        let record = gateway.run(&run_id).await;
        match (record["status"].as_str(), record["error_code"].as_str()) {
            (Some("completed"), _) => {}
            (Some("cancelled"), Some("interrupted")) => interrupted += 1,
            _ => panic!("{ctx}: {run_id} neither completed nor interrupted by a kill: {record}"),
        }
    }
    let bound = kill_at.len() * IN_FLIGHT_PER_KILL;
    assert!(duplicates <= bound, "{ctx}: {duplicates} repeated deliveries");
    assert!(fake.violations().is_empty(), "{ctx}: flood limits: {:?}", fake.violations());

    // No earlier gateway survives, and nothing else runs on this home.
    for pid in &killed_pids {
        assert!(!crate::fault_support::alive(*pid), "{ctx}: gateway {pid} is gone");
    }
    assert_eq!(live_with_env(&home_entry), [gateway.pid()], "{ctx}: one gateway on the home");
    let final_rss_kib = rss_kib(gateway.pid());
    max_rss_kib = max_rss_kib.max(final_rss_kib);
    assert!(max_rss_kib < 256 * 1024, "{ctx}: RSS peaked at {max_rss_kib} KiB");

    if let Ok(path) = std::env::var("LEMON_FAULT_FIGURES") {
        let figures = json!({
            "seed": seed,
            "runs": runs,
            "kills": kill_at.len(),
            "kill_points": kill_at,
            "interrupted": interrupted,
            "repeated_deliveries": duplicates,
            "max_rss_kib": max_rss_kib,
            "final_rss_kib": final_rss_kib,
        });
        std::fs::write(path, figures.to_string()).unwrap();
    }
}
