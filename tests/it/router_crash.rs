//! The crash guarantee of the admission journal, with the real binary: a gateway
//! killed with SIGKILL while runs are running and queued loses nothing it had
//! accepted. After a restart on the same `LEMON_HOME`, every accepted run id
//! reaches exactly one `run_completed`: running ones as `interrupted` (with their
//! session, which the next message continues), queued ones by running, in order.

use serde_json::json;

use crate::support::{home_with, Gateway};

/// Words of a run long enough to still be streaming when the process is killed.
fn long_prompt() -> String {
    vec!["w"; 400].join(" ")
}

/// Waits until the run's event stream shows a delta: the engine is running.
async fn until_streaming(gateway: &Gateway, run_id: &str) {
    let mut events = gateway.get(&format!("/v1/runs/{run_id}/events")).send().await.unwrap();
    tokio::time::timeout(crate::support::PATIENCE, async {
        while !String::from_utf8_lossy(&events.chunk().await.unwrap().unwrap()).contains("delta") {}
    })
    .await
    .expect("the run streams a delta in time");
}

#[tokio::test]
async fn sigkill_loses_no_accepted_run_and_runs_none_twice() {
    let dir =
        home_with("[gateway]\nmax_concurrent_runs = 2\n[gateway.engines.echo]\ndelay_ms = 50\n");
    let mut gateway = Gateway::start_in(dir.path()).await;
    let done = gateway.submit(json!({ "prompt": "before the crash", "session_key": "a" })).await;
    gateway.wait(&done).await;

    let mut running = Vec::new();
    let mut queued = Vec::new();
    for session in ["a", "b"] {
        let long = json!({ "prompt": long_prompt(), "session_key": session, "run_id": format!("long-{session}") });
        running.push(gateway.submit(long).await);
        for n in 1..=3 {
            let body = json!({
                "prompt": format!("queued {session} {n}"),
                "session_key": session,
                "run_id": format!("queued-{session}-{n}"),
            });
            queued.push(gateway.submit(body).await);
        }
    }
    for run_id in &running {
        until_streaming(&gateway, run_id).await;
    }
    // A queued request is visible as queued before the crash.
    assert_eq!(gateway.run("queued-a-1").await["status"], "queued");
    gateway.child.kill().await.unwrap();

    let gateway = Gateway::start_in(dir.path()).await;
    for run_id in &running {
        let record = gateway.wait(run_id).await;
        assert_eq!(record["status"], "cancelled", "{record}");
        assert_eq!(record["error_code"], "interrupted", "{record}");
        assert_eq!(record["resume"]["engine"], "echo", "the session is kept: {record}");
    }
    for run_id in &queued {
        let record = gateway.wait(run_id).await;
        assert_eq!(record["status"], "completed", "{record}");
        let n = run_id.rsplit('-').next().unwrap();
        let session = &run_id["queued-".len().."queued-".len() + 1];
        assert_eq!(record["answer"], format!("queued {session} {n}"), "{record}");
    }
    // Exactly one completion each, and the queue kept its order.
    for run_id in running.iter().chain(&queued).chain([&done]) {
        let events = gateway.events(run_id).await;
        let completions = events.iter().filter(|(kind, _)| kind == "run_completed").count();
        assert_eq!(completions, 1, "{run_id}: {events:?}");
    }
    for session in ["a", "b"] {
        let mut started = Vec::new();
        for n in 1..=3 {
            let record = gateway.run(&format!("queued-{session}-{n}")).await;
            started.push(record["started_at_ms"].as_i64().unwrap());
        }
        assert!(started.windows(2).all(|w| w[0] <= w[1]), "{session}: {started:?}");
    }
    // The first request after the crash continued the interrupted session.
    let first_after = gateway.run("queued-b-1").await;
    assert_eq!(first_after["meta"]["resume_source"], "auto", "{first_after}");
    // The same request again is the same run, not a new one.
    let again = gateway
        .post("/v1/runs")
        .json(&json!({ "prompt": "queued a 1", "session_key": "a", "run_id": "queued-a-1" }))
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), 202);
    let again: serde_json::Value = again.json().await.unwrap();
    assert_eq!(again["duplicate"], true);
    // The interrupted session continues with the next message.
    let next = gateway.submit(json!({ "prompt": "carry on", "session_key": "b" })).await;
    let record = gateway.wait(&next).await;
    assert_eq!(record["meta"]["resume_source"], "auto", "{record}");
}
