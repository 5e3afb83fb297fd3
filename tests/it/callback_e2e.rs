//! Webhook callbacks across a restart, on the real binary: a callback whose
//! receiver is down when the gateway stops, and one whose run is still running
//! when it stops, are each delivered exactly once by the next start on the same
//! home.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use axum::http::StatusCode;
use axum::routing::post;
use axum::{Json, Router};
use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::support::{command, home_with, Gateway, PATIENCE};

const HOOK_TOKEN: &str = "hook-restart-token-51c2";

/// A callback receiver on 127.0.0.1: answers 503 while `up` is false, 200
/// otherwise; reports each attempt's status and hands over the bodies it took.
struct Receiver {
    url: String,
    up: Arc<AtomicBool>,
    taken: Arc<AtomicUsize>,
    attempts: mpsc::UnboundedReceiver<u16>,
    bodies: mpsc::UnboundedReceiver<Value>,
}

impl Receiver {
    async fn start(up: bool) -> Receiver {
        let up = Arc::new(AtomicBool::new(up));
        let taken = Arc::new(AtomicUsize::new(0));
        let (attempt_tx, attempts) = mpsc::unbounded_channel();
        let (body_tx, bodies) = mpsc::unbounded_channel();
        let state = (up.clone(), taken.clone());
        let app = Router::new().route(
            "/done",
            post(move |Json(body): Json<Value>| {
                let (up, taken) = state.clone();
                let (attempt_tx, body_tx) = (attempt_tx.clone(), body_tx.clone());
                async move {
                    let status = if up.load(Ordering::SeqCst) {
                        taken.fetch_add(1, Ordering::SeqCst);
                        let _ = body_tx.send(body);
                        StatusCode::OK
                    } else {
                        StatusCode::SERVICE_UNAVAILABLE
                    };
                    let _ = attempt_tx.send(status.as_u16());
                    status
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/done?sig=cb-secret-9f", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        Receiver { url, up, taken, attempts, bodies }
    }

    async fn next_attempt(&mut self) -> u16 {
        tokio::time::timeout(PATIENCE, self.attempts.recv())
            .await
            .expect("a callback attempt in time")
            .unwrap()
    }

    async fn next_body(&mut self) -> Value {
        tokio::time::timeout(PATIENCE, self.bodies.recv())
            .await
            .expect("the callback in time")
            .unwrap()
    }
}

fn config(callback_url: &str, extra: &str) -> String {
    format!(
        "[gateway]\nenable_webhook = true\nshutdown_grace_ms = 200\n{extra}\
         [gateway.webhook]\nport = 0\nallow_private_callback_hosts = true\n\
         callback_max_attempts = 50\ncallback_backoff_ms = 50\ncallback_backoff_max_ms = 100\n\
         [gateway.webhook.integrations.ci]\ntoken = \"{HOOK_TOKEN}\"\ncallback_url = \"{callback_url}\"\n"
    )
}

async fn post_hook(gateway: &Gateway, prompt: &str) -> String {
    let body = json!({ "prompt": prompt, "metadata": { "build": 7 } });
    let response = gateway.post_webhook("ci", HOOK_TOKEN, &body).await;
    assert_eq!(response.status(), 202);
    let accepted: Value = response.json().await.unwrap();
    accepted["run_id"].as_str().unwrap().to_owned()
}

/// Starts the gateway once more on `home` and stops it once its webhook is
/// up: whatever was still on record would be picked up by then.
async fn start_and_stop(home: &std::path::Path) {
    let gateway = Gateway::start_in(home).await;
    tokio::time::timeout(PATIENCE, async {
        loop {
            let status = gateway.status().await;
            if status["transports"]["webhook"]["state"] == "running" {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(25)).await;
        }
    })
    .await
    .expect("the webhook comes up in time");
    assert!(gateway.terminate().await.success());
}

#[tokio::test]
async fn a_callback_retried_at_a_stop_is_delivered_once_after_the_restart() {
    let mut receiver = Receiver::start(false).await;
    let home = home_with(&config(&receiver.url, ""));

    let log_path = home.path().join("first-run.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let gateway = Gateway::spawn_with_stderr(command(home.path()), home.path(), log.into()).await;
    let run_id = post_hook(&gateway, "deploy finished").await;
    assert_eq!(receiver.next_attempt().await, 503);
    assert_eq!(receiver.next_attempt().await, 503, "retried");
    let stopped = gateway.terminate().await;
    assert!(stopped.success(), "clean exit: {stopped}");
    let log = std::fs::read_to_string(&log_path).unwrap();
    assert!(log.contains("webhook callback failed"), "{log}");
    assert!(log.contains("127.0.0.1"), "the host is logged: {log}");
    assert!(!log.contains("cb-secret-9f"), "the callback URL is never logged: {log}");

    receiver.up.store(true, Ordering::SeqCst);
    let gateway = Gateway::start_in(home.path()).await;
    let delivered = receiver.next_body().await;
    assert_eq!(delivered["run_id"], run_id.as_str());
    assert_eq!(delivered["integration_id"], "ci");
    assert_eq!(delivered["completed"]["answer"], "deploy finished");
    assert_eq!(delivered["metadata"], json!({ "build": 7 }));
    assert!(gateway.terminate().await.success());

    start_and_stop(home.path()).await;
    assert_eq!(receiver.taken.load(Ordering::SeqCst), 1, "delivered exactly once");
}

#[tokio::test]
async fn a_run_still_running_at_a_stop_gets_its_callback_once_after_the_restart() {
    let mut receiver = Receiver::start(true).await;
    let home = home_with(&config(&receiver.url, "[gateway.engines.echo]\ndelay_ms = 50\n"));

    let gateway = Gateway::start_in(home.path()).await;
    let run_id = post_hook(&gateway, &vec!["w"; 400].join(" ")).await;
    // Wait until it is streaming, then stop the gateway.
    let mut events = gateway.get(&format!("/v1/runs/{run_id}/events")).send().await.unwrap();
    tokio::time::timeout(PATIENCE, async {
        while !String::from_utf8_lossy(&events.chunk().await.unwrap().unwrap()).contains("delta") {}
    })
    .await
    .expect("the run streams in time");
    let stopped = gateway.terminate().await;
    assert!(stopped.success(), "clean exit: {stopped}");

    let gateway = Gateway::start_in(home.path()).await;
    let record = gateway.wait(&run_id).await;
    let delivered = receiver.next_body().await;
    assert_eq!(delivered["run_id"], run_id.as_str());
    assert_eq!(delivered["completed"]["ok"], record["status"] == "completed", "{record}");
    assert!(gateway.terminate().await.success());

    start_and_stop(home.path()).await;
    assert_eq!(receiver.taken.load(Ordering::SeqCst), 1, "delivered exactly once");
}

/// The webhook transport's status detail, once `accept` takes it.
async fn webhook_detail(gateway: &Gateway, accept: impl Fn(&str) -> bool) -> String {
    tokio::time::timeout(PATIENCE, async {
        loop {
            let status = gateway.status().await;
            let detail =
                status["transports"]["webhook"]["detail"].as_str().unwrap_or("").to_owned();
            if accept(&detail) {
                return detail;
            }
            tokio::time::sleep(std::time::Duration::from_millis(25)).await;
        }
    })
    .await
    .expect("the webhook's status in time")
}

#[tokio::test]
async fn a_callback_given_up_on_shows_in_status_also_after_a_restart() {
    let mut receiver = Receiver::start(false).await;
    let config = config(&receiver.url, "")
        .replace("callback_max_attempts = 50", "callback_max_attempts = 2");
    let home = home_with(&config);
    let gateway = Gateway::start_in(home.path()).await;
    let addr = gateway.webhook.clone().unwrap();
    let plain = webhook_detail(&gateway, |d| !d.is_empty()).await;
    assert_eq!(plain, addr, "nothing given up yet");
    post_hook(&gateway, "nobody listens").await;
    assert_eq!(receiver.next_attempt().await, 503);
    assert_eq!(receiver.next_attempt().await, 503);
    let detail = webhook_detail(&gateway, |d| d.contains("given up")).await;
    assert_eq!(detail, format!("{addr}; 1 callback given up (see the log)"));
    assert!(gateway.terminate().await.success());

    // Still on record, so the next start says so too, and tries no more.
    let gateway = Gateway::start_in(home.path()).await;
    let addr = gateway.webhook.clone().unwrap();
    let detail = webhook_detail(&gateway, |d| !d.is_empty()).await;
    assert_eq!(detail, format!("{addr}; 1 callback given up (see the log)"));
    assert!(gateway.terminate().await.success());
    assert!(receiver.attempts.try_recv().is_err(), "no attempt after it was given up");
    assert_eq!(receiver.taken.load(Ordering::SeqCst), 0);
}
