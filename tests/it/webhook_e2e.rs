//! Webhooks end to end: the real binary with `[gateway.webhook]` enabled, a
//! prompt answered in sync mode, and an async run's result delivered to a
//! callback receiver in the test.

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;

use crate::support::{Gateway, PATIENCE};

const HOOK_TOKEN: &str = "hook-e2e-token-7a31";

/// A free port on loopback (bound, read, released: a small race acceptable in tests).
async fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    listener.local_addr().unwrap().port()
}

/// Accepts one HTTP request on `listener`, answers `200`, and returns its JSON body.
async fn receive_one(listener: TcpListener) -> Value {
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
    let port = free_port().await;
    let callback = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let callback_url = format!("http://{}/done", callback.local_addr().unwrap());
    let config = format!(
        "[gateway]\nenable_webhook = true\n\
         [gateway.webhook]\nport = {port}\nallow_private_callback_hosts = true\n\
         [gateway.webhook.integrations.ci]\ntoken = \"{HOOK_TOKEN}\"\nmode = \"sync\"\n\
         [gateway.webhook.integrations.later]\ntoken = \"{HOOK_TOKEN}\"\ncallback_url = \"{callback_url}\"\n"
    );
    let gateway = Gateway::start(&config).await;
    let url = |id: &str| format!("http://127.0.0.1:{port}/webhooks/{id}");

    let response = gateway
        .http
        .post(url("ci"))
        .bearer_auth(HOOK_TOKEN)
        .json(&json!({ "prompt": "build is green" }))
        .timeout(PATIENCE)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["ok"], true, "{body}");
    assert_eq!(body["answer"], "build is green");
    assert_eq!(body["session_key"], "webhook:ci");

    let unauthorized =
        gateway.http.post(url("ci")).bearer_auth("nope").json(&json!({ "prompt": "x" }));
    assert_eq!(unauthorized.send().await.unwrap().status(), 401);

    let response = gateway
        .http
        .post(url("later"))
        .header("x-webhook-token", HOOK_TOKEN)
        .json(&json!({ "text": "deploy finished", "metadata": { "build": 42 } }))
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
    assert_eq!(delivered["completed"]["answer"], "deploy finished");
    assert_eq!(delivered["metadata"], json!({ "build": 42 }));

    let record = gateway.run(accepted["run_id"].as_str().unwrap()).await;
    assert_eq!(record["status"], "completed", "{record}");
    gateway.terminate().await;
}
