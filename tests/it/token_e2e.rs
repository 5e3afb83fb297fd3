//! Rotating the API token on a running gateway: through `PUT
//! /v1/secrets/lemon_api_token` and through `lemon-gateway secrets set
//! lemon_api_token` (the secrets file). The new token works, the old one gets
//! 401, a stream opened with the old one goes on, and neither token is logged.

use std::path::Path;
use std::process::Stdio;

use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;

use crate::support::{command, home_with, Gateway, PATIENCE};

const OLD: &str = "old-api-token-0123456789";
const NEW: &str = "new-api-token-9876543210";

/// The gateway on `home` with its token in the secrets file only, its log in
/// `log`.
async fn start_with_file_token(home: &Path, log: &Path) -> Gateway {
    use std::os::unix::fs::PermissionsExt;
    let secrets = home.join("secrets.toml");
    std::fs::write(&secrets, format!("lemon_api_token = \"{OLD}\"\n")).unwrap();
    std::fs::set_permissions(&secrets, std::fs::Permissions::from_mode(0o600)).unwrap();
    let mut cmd = command(home);
    cmd.env_remove("LEMON_API_TOKEN").env("LEMON_LOG", "info");
    let log = std::fs::File::create(log).unwrap();
    Gateway::spawn_with_stderr(cmd, home, Stdio::from(log)).await
}

async fn status_with(gateway: &Gateway, token: &str) -> u16 {
    let url = format!("{}/v1/status", gateway.api);
    gateway.http.get(url).bearer_auth(token).send().await.unwrap().status().as_u16()
}

/// Waits until `token` is the one in force (the change is applied on the
/// next secrets check, at most a couple of seconds later).
async fn wait_for_token(gateway: &Gateway, token: &str) {
    tokio::time::timeout(PATIENCE, async {
        while status_with(gateway, token).await != 200 {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the new token in force in time");
}

fn no_token_in(log: &Path) {
    let text = std::fs::read_to_string(log).unwrap();
    assert!(!text.contains(OLD) && !text.contains(NEW), "a token in the log:\n{text}");
}

#[tokio::test]
async fn a_token_set_through_the_api_takes_over_and_open_streams_go_on() {
    let home = home_with("[gateway.engines.echo]\ndelay_ms = 1\n");
    let log = home.path().join("gateway.log");
    let gateway = start_with_file_token(home.path(), &log).await;
    assert_eq!(status_with(&gateway, OLD).await, 200);
    assert_eq!(status_with(&gateway, NEW).await, 401);

    // A firehose stream opened with the old token, before the change.
    let mut stream = gateway
        .http
        .get(format!("{}/v1/events", gateway.api))
        .bearer_auth(OLD)
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status(), 200);

    let response = gateway
        .http
        .put(format!("{}/v1/secrets/lemon_api_token", gateway.api))
        .bearer_auth(OLD)
        .json(&json!({ "value": NEW }))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    wait_for_token(&gateway, NEW).await;
    assert_eq!(status_with(&gateway, OLD).await, 401);
    // The detailed health report follows the same token.
    let health = |token: &'static str| {
        let url = format!("{}/healthz", gateway.health);
        let request = gateway.http.get(url).bearer_auth(token);
        async move { request.send().await.unwrap().json::<Value>().await.unwrap() }
    };
    assert!(health(NEW).await.get("version").is_some());
    assert!(health(OLD).await.get("version").is_none());

    // A run started with the new token shows on the stream opened with the old one.
    let submitted = gateway
        .http
        .post(format!("{}/v1/runs", gateway.api))
        .bearer_auth(NEW)
        .json(&json!({ "prompt": "still streaming" }))
        .send()
        .await
        .unwrap();
    assert_eq!(submitted.status(), 202);
    let run_id = submitted.json::<Value>().await.unwrap()["run_id"].as_str().unwrap().to_owned();
    let mut parser = lemon_tests::event_stream::EventStream::default();
    tokio::time::timeout(PATIENCE, async {
        loop {
            let chunk = stream.chunk().await.unwrap().expect("the old stream stays open");
            for event in parser.push(&chunk) {
                if event.event == "run_completed" && event.data.contains(&run_id) {
                    return;
                }
            }
        }
    })
    .await
    .expect("the run's completion on the old stream");
    gateway.terminate().await;
    no_token_in(&log);
}

#[tokio::test]
async fn a_token_set_with_the_cli_in_the_secrets_file_takes_over() {
    let home = home_with("");
    let log = home.path().join("gateway.log");
    let gateway = start_with_file_token(home.path(), &log).await;
    assert_eq!(status_with(&gateway, OLD).await, 200);

    let mut set = command(home.path());
    set.env_remove("LEMON_API_TOKEN")
        .args(["secrets", "set", "lemon_api_token"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = set.spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(format!("{NEW}\n").as_bytes()).await.unwrap();
    drop(stdin);
    let output = tokio::time::timeout(PATIENCE, child.wait_with_output()).await.unwrap().unwrap();
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "{printed}");
    assert!(!printed.contains(NEW), "{printed}");

    wait_for_token(&gateway, NEW).await;
    assert_eq!(status_with(&gateway, OLD).await, 401);
    gateway.terminate().await;
    no_token_in(&log);
}
