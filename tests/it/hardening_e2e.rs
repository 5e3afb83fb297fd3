//! End-to-end checks of the gateway's defences on the real binary: private files,
//! shutdown and recovery of queued requests, working directories, reused run ids.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use serde_json::json;

use crate::support::{write_config, Gateway};

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o777
}

#[tokio::test]
async fn state_files_are_private_even_in_a_home_others_can_read() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    std::fs::create_dir(&home).unwrap();
    std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o755)).unwrap();
    // A database left readable by an older version or a careless copy.
    std::fs::write(home.join("lemon.db"), b"").unwrap();
    std::fs::set_permissions(home.join("lemon.db"), std::fs::Permissions::from_mode(0o644))
        .unwrap();
    write_config(&home, "");

    let gateway = Gateway::start_in(&home).await;
    let run_id = gateway.submit(json!({ "prompt": "a private answer" })).await;
    let record = gateway.wait(&run_id).await;
    assert_eq!(record["answer"], "a private answer", "{record}");

    assert_eq!(mode(&home), 0o700, "the home is tightened");
    for name in ["lemon.db", "lemon.db-wal", "lemon.db-shm"] {
        assert_eq!(mode(&home.join(name)), 0o600, "{name}");
    }
    gateway.terminate().await;
}

/// Starts a slow run on a one-slot gateway, queues `n` more behind it (half in
/// the router's queue of the busy session, half waiting for the slot), waits
/// until the slow one streams, and stops the gateway with SIGTERM.
async fn stop_with_queued_requests(home: &Path, n: usize) -> (String, Vec<(String, String)>) {
    let gateway = Gateway::start_in(home).await;
    let slow =
        gateway.submit(json!({ "prompt": vec!["w"; 400].join(" "), "session_key": "busy" })).await;
    let mut queued = Vec::new();
    for i in 0..n {
        let session = if i % 2 == 0 { "busy".to_owned() } else { format!("other-{i}") };
        let prompt = format!("queued {i}");
        let run_id = gateway.submit(json!({ "prompt": prompt, "session_key": session })).await;
        queued.push((run_id, prompt));
    }
    let mut first = gateway.get(&format!("/v1/runs/{slow}/events")).send().await.unwrap();
    tokio::time::timeout(crate::support::PATIENCE, async {
        while !String::from_utf8_lossy(&first.chunk().await.unwrap().unwrap()).contains("delta") {}
    })
    .await
    .expect("the slow run streams");
    let status = gateway.terminate().await;
    assert!(status.success(), "clean exit: {status}");
    (slow, queued)
}

const ONE_SLOT: &str = "[gateway]\nmax_concurrent_runs = 1\nshutdown_grace_ms = 200\n\
                        [gateway.engines.echo]\ndelay_ms = 50\n";

#[tokio::test]
async fn queued_requests_wait_for_the_next_start_instead_of_failing_at_shutdown() {
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path(), ONE_SLOT);
    let (slow, queued) = stop_with_queued_requests(dir.path(), 12).await;

    let gateway = Gateway::start_in(dir.path()).await;
    let slow = gateway.run(&slow).await;
    assert_eq!(slow["error_code"], "shutting_down", "cut off by the grace period: {slow}");
    for (run_id, prompt) in &queued {
        let record = gateway.wait(run_id).await;
        assert_eq!(record["status"], "completed", "{record}");
        assert_eq!(record["answer"], prompt.as_str(), "{record}");
    }
    gateway.terminate().await;
}

#[tokio::test]
async fn requests_left_queued_too_long_complete_expired_at_the_next_start() {
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path(), ONE_SLOT);
    let (_, queued) = stop_with_queued_requests(dir.path(), 4).await;

    let expiring = ONE_SLOT.replace("[gateway]\n", "[gateway]\nrecovered_max_age_ms = 1\n");
    write_config(dir.path(), &expiring);
    let gateway = Gateway::start_in(dir.path()).await;
    for (run_id, _) in &queued {
        let record = gateway.wait(run_id).await;
        assert_eq!(record["error_code"], "expired", "{record}");
        assert_eq!(record["answer"], "", "never ran: {record}");
    }
    gateway.terminate().await;
}

#[tokio::test]
async fn a_run_directory_must_be_absolute_existing_and_inside_the_allowed_roots() {
    let roots = tempfile::tempdir().unwrap();
    let inside = roots.path().join("project");
    std::fs::create_dir(&inside).unwrap();
    std::os::unix::fs::symlink("/", inside.join("escape")).unwrap();
    let config = format!("[gateway]\nallowed_cwd_roots = [{:?}]\n", roots.path().display());
    let gateway = Gateway::start(&config).await;

    for (cwd, expected) in [
        ("../../".to_owned(), "use an absolute path"),
        ("project".to_owned(), "use an absolute path"),
        ("/no/such/dir".to_owned(), "not an existing directory"),
        ("/".to_owned(), "outside allowed_cwd_roots"),
        (inside.join("escape").display().to_string(), "outside allowed_cwd_roots"),
    ] {
        let (status, body) =
            submit_raw(&gateway, &json!({ "prompt": "where am I", "cwd": cwd })).await;
        assert_eq!(status, 400, "{cwd}");
        let error = body["error"].as_str().unwrap();
        assert!(error.contains("cwd") && error.contains(expected), "{cwd}: {error}");
    }
    let (status, accepted) =
        submit_raw(&gateway, &json!({ "prompt": "where am I", "cwd": inside })).await;
    assert_eq!(status, 202, "{accepted}");
    let record = gateway.wait(accepted["run_id"].as_str().unwrap()).await;
    assert_eq!(record["status"], "completed", "{record}");
    let runs: serde_json::Value =
        gateway.get("/v1/runs").send().await.unwrap().json().await.unwrap();
    assert_eq!(runs["runs"].as_array().map(Vec::len), Some(1), "refused ones left nothing: {runs}");
}

async fn submit_raw(gateway: &Gateway, body: &serde_json::Value) -> (u16, serde_json::Value) {
    let response = gateway.post("/v1/runs").json(body).send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap())
}

#[tokio::test]
async fn a_reused_run_id_is_a_duplicate_only_for_the_same_request() {
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path(), "");
    let gateway = Gateway::start_in(dir.path()).await;
    let first = json!({ "prompt": "the first", "session_key": "s", "run_id": "order-17" });
    assert_eq!(submit_raw(&gateway, &first).await.0, 202);
    gateway.wait("order-17").await;
    let (status, again) = submit_raw(&gateway, &first).await;
    assert_eq!((status, &again["duplicate"]), (202, &json!(true)), "{again}");

    let others = [
        json!({ "prompt": "another prompt", "session_key": "s", "run_id": "order-17" }),
        json!({ "prompt": "the first", "session_key": "t", "run_id": "order-17" }),
    ];
    for body in &others {
        let (status, error) = submit_raw(&gateway, body).await;
        assert_eq!(status, 409, "{body}");
        assert_eq!(error["error"], "run_id order-17 already used for another request");
    }
    gateway.terminate().await;

    // The same holds once the first request is only in the store.
    let gateway = Gateway::start_in(dir.path()).await;
    let (status, again) = submit_raw(&gateway, &first).await;
    assert_eq!((status, &again["duplicate"]), (202, &json!(true)), "{again}");
    assert_eq!(submit_raw(&gateway, &others[0]).await.0, 409);
    gateway.terminate().await;
}
