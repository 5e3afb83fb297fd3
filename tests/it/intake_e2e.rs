//! Paused intake on the real binary: `POST /v1/intake/pause` holds every new
//! run in the queue (accepted, not started) while `/v1/status` says `paused`;
//! `POST /v1/intake/resume` starts them; a shutdown while paused still ends.

use std::time::Duration;

use serde_json::json;

use crate::support::{Gateway, PATIENCE};

#[tokio::test]
async fn paused_intake_holds_new_runs_until_resumed() {
    let gateway = Gateway::start("").await;
    let paused = gateway.post("/v1/intake/pause").send().await.unwrap();
    assert_eq!(paused.status(), 200);
    assert_eq!(paused.json::<serde_json::Value>().await.unwrap(), json!({ "paused": true }));
    let run_id = gateway.submit(json!({ "prompt": "after the pause", "run_id": "intake-1" })).await;
    let status = tokio::time::timeout(PATIENCE, async {
        loop {
            let status = gateway.status().await;
            if status["scheduler"]["queued"] == json!(1) {
                return status;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the run reaches the queue");
    assert_eq!(status["paused"], json!(true));
    assert_eq!(status["scheduler"]["in_flight"], json!(0));
    assert_eq!(gateway.run(&run_id).await["status"], json!("queued"));

    let resumed = gateway.post("/v1/intake/resume").send().await.unwrap();
    assert_eq!(resumed.json::<serde_json::Value>().await.unwrap(), json!({ "paused": false }));
    let run = gateway.wait(&run_id).await;
    assert_eq!(
        (run["status"].clone(), run["answer"].clone()),
        (json!("completed"), json!("after the pause"))
    );
    assert_eq!(gateway.status().await["paused"], json!(false));

    // Without the token the intake cannot be touched.
    let refused = reqwest::Client::new()
        .post(format!("{}/v1/intake/pause", gateway.api))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 401);

    // Paused again with a run waiting, the gateway still stops at once on SIGTERM.
    gateway.post("/v1/intake/pause").send().await.unwrap();
    gateway.submit(json!({ "prompt": "never started", "run_id": "intake-2" })).await;
    assert!(gateway.terminate().await.success());
}
