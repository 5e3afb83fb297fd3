//! Webhooks end to end: the real binary with `[gateway.webhook]` enabled, a
//! prompt answered in sync mode, an async run's result delivered to a callback
//! receiver in the test, an idempotency key that holds across a restart, and a
//! webhook port already taken when the gateway starts.

use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;

use crate::support::{home_with, Gateway, PATIENCE};

const HOOK_TOKEN: &str = "hook-e2e-token-7a31";

/// A free port on loopback (bound, read, released), for a config that must
/// name its port before the gateway starts; another process can take it in
/// between, so a listener that must bind it gets `port = 0` where it can.
pub(crate) async fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    listener.local_addr().unwrap().port()
}

/// Accepts one HTTP request on `listener`, answers `200`, and returns its JSON body.
pub(crate) async fn receive_one(listener: TcpListener) -> Value {
    let (stream, _) = listener.accept().await.unwrap();
    let mut reader = BufReader::new(stream);
    let mut length = 0usize;
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).await.unwrap();
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if let Some((name, value)) = line.split_once(':') {
            if name.eq_ignore_ascii_case("content-length") {
                length = value.trim().parse().unwrap();
            }
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body).await.unwrap();
    let mut stream = reader.into_inner();
    stream
        .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    serde_json::from_slice(&body).unwrap()
}

#[tokio::test]
async fn webhooks_answer_in_sync_mode_and_call_back_in_async_mode() {
    let callback = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let callback_url = format!("http://{}/done", callback.local_addr().unwrap());
    let config = format!(
        "[gateway]\nenable_webhook = true\n\
         [gateway.webhook]\nport = 0\nallow_private_callback_hosts = true\n\
         [gateway.webhook.integrations.ci]\ntoken = \"{HOOK_TOKEN}\"\nmode = \"sync\"\n\
         [gateway.webhook.integrations.later]\ntoken = \"{HOOK_TOKEN}\"\ncallback_url = \"{callback_url}\"\n\
         [gateway.webhook.integrations.mine]\ntoken = \"{HOOK_TOKEN}\"\nmode = \"sync\"\nuntrusted = false\n"
    );
    let gateway = Gateway::start(&config).await;
    let url = |id: &str| gateway.webhook_url(id);

    let response =
        gateway.post_webhook("ci", HOOK_TOKEN, &json!({ "prompt": "build is green" })).await;
    assert_eq!(response.status(), 200);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["ok"], true, "{body}");
    assert_eq!(body["answer"], "build is green");
    assert_eq!(body["session_key"], "webhook:ci");
    // A payload is outside text unless its integration says it is the owner's.
    let run_of = |body: &Value| format!("/v1/runs/{}", body["run_id"].as_str().unwrap());
    let run: Value = gateway.get(&run_of(&body)).send().await.unwrap().json().await.unwrap();
    assert_eq!(run["untrusted"], "webhook ci", "{run}");
    assert_eq!(run["meta"]["untrusted"], json!({ "source": "webhook ci" }));
    let response = gateway.post_webhook("mine", HOOK_TOKEN, &json!({ "prompt": "mine" })).await;
    let body: Value = response.json().await.unwrap();
    let run: Value = gateway.get(&run_of(&body)).send().await.unwrap().json().await.unwrap();
    assert_eq!(run["untrusted"], Value::Null, "{run}");

    let unauthorized =
        gateway.http.post(url("ci")).bearer_auth("nope").json(&json!({ "prompt": "x" }));
    assert_eq!(unauthorized.send().await.unwrap().status(), 401);

    let response = gateway
        .http
        .post(url("later"))
        .header("x-webhook-token", HOOK_TOKEN)
        .json(&json!({
            "text": "deploy finished",
            "metadata": { "build": 42 },
            "urls": ["https://ci.example/builds/42"],
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 202);
    let accepted: Value = response.json().await.unwrap();
    let delivered = tokio::time::timeout(PATIENCE, receive_one(callback))
        .await
        .expect("callback delivered in time");
    assert_eq!(delivered["run_id"], accepted["run_id"]);
    assert_eq!(delivered["integration_id"], "later");
    assert_eq!(
        delivered["completed"]["answer"],
        "deploy finished\n\nAttachments:\n- https://ci.example/builds/42"
    );
    assert_eq!(delivered["metadata"], json!({ "build": 42 }));
    assert_eq!(
        delivered["attachments"],
        json!([{ "source": "urls", "url": "https://ci.example/builds/42" }])
    );

    let record = gateway.run(accepted["run_id"].as_str().unwrap()).await;
    assert_eq!(record["status"], "completed", "{record}");
    assert_eq!(record["meta"]["origin"], "webhook", "{record}");
    assert_eq!(record["meta"]["webhook"]["request"]["remote_ip"], "127.0.0.1", "{record}");
    let status = gateway.status().await;
    assert_eq!(
        status["transports"]["webhook"],
        json!({ "state": "running", "detail": gateway.webhook.as_deref().unwrap() })
    );
    gateway.terminate().await;
}

/// The webhook's entry in `/v1/status` once `wanted` accepts it. The gateway
/// publishes transport states only through status, so this polls, bounded by
/// `PATIENCE`.
async fn webhook_status(gateway: &Gateway, wanted: impl Fn(&Value) -> bool) -> Value {
    tokio::time::timeout(PATIENCE, async {
        loop {
            let status = gateway.status().await;
            let webhook = &status["transports"]["webhook"];
            if wanted(webhook) {
                return webhook.clone();
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    })
    .await
    .expect("the webhook reaches the state in time")
}

async fn health(gateway: &Gateway) -> (u16, Value) {
    let response = gateway.http.get(format!("{}/healthz", gateway.health)).send().await.unwrap();
    (response.status().as_u16(), response.json().await.unwrap())
}

#[tokio::test]
async fn an_idempotency_key_holds_across_a_restart() {
    let config = format!(
        "[gateway]\nenable_webhook = true\n\
         [gateway.webhook]\nport = 0\n\
         [gateway.webhook.integrations.ci]\ntoken = \"{HOOK_TOKEN}\"\n"
    );
    let home = home_with(&config);
    let post = |gateway: &Gateway| {
        gateway
            .http
            .post(gateway.webhook_url("ci"))
            .bearer_auth(HOOK_TOKEN)
            .header("idempotency-key", "release-1.4.0")
            .json(&json!({ "prompt": "announce the release" }))
            .send()
    };

    let gateway = Gateway::start_in(home.path()).await;
    let response = post(&gateway).await.unwrap();
    assert_eq!(response.status(), 202);
    let first: Value = response.json().await.unwrap();
    let run_id = first["run_id"].as_str().unwrap().to_owned();
    gateway.wait(&run_id).await;
    assert!(gateway.terminate().await.success());

    let gateway = Gateway::start_in(home.path()).await;
    let response = post(&gateway).await.unwrap();
    assert_eq!(response.status(), 202);
    let again: Value = response.json().await.unwrap();
    assert_eq!(again["duplicate"], true, "{again}");
    assert_eq!(again["run_id"], first["run_id"]);
    let runs: Value = gateway.get("/v1/runs").send().await.unwrap().json().await.unwrap();
    assert_eq!(runs["runs"].as_array().unwrap().len(), 1, "one run: {runs}");
    gateway.terminate().await;
}

#[tokio::test]
async fn a_taken_webhook_port_is_reported_and_the_webhook_comes_up_once_it_is_free() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let config = format!(
        "[gateway]\nenable_webhook = true\n\
         [gateway.webhook]\nport = {}\n\
         [gateway.webhook.integrations.ci]\ntoken = \"{HOOK_TOKEN}\"\n",
        addr.port()
    );
    // The gateway starts anyway, and says why the webhook is not serving.
    let gateway = Gateway::start(&config).await;
    let failing = webhook_status(&gateway, |w| w["state"] == "failing").await;
    let reason = failing["reason"].as_str().unwrap();
    assert!(reason.contains(&format!("could not listen on {addr}")), "{failing}");
    assert!(failing["retry_in_ms"].as_u64().is_some(), "{failing}");
    assert!(!failing.to_string().contains(HOOK_TOKEN));
    let (code, body) = health(&gateway).await;
    assert_eq!((code, &body["status"]), (200, &json!("degraded")), "{body}");
    assert_eq!(body["transports"]["webhook"]["state"], "failing");

    drop(taken);
    let running = webhook_status(&gateway, |w| w["state"] == "running").await;
    assert_eq!(running, json!({ "state": "running", "detail": addr.to_string() }));
    let response = gateway
        .http
        .post(format!("http://{addr}/webhooks/ci"))
        .header("x-webhook-token", HOOK_TOKEN)
        .json(&json!({ "prompt": "now it listens" }))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 202);
    let (code, body) = health(&gateway).await;
    assert_eq!((code, &body["status"]), (200, &json!("healthy")), "{body}");
    gateway.terminate().await;
}
