//! The cluster config between two real gateway nodes on one PostgreSQL
//! database: written through one node's `PUT /v1/cluster/config`, applied
//! live by both (cap, cluster slots, queue, bindings), put over each node's
//! own file (an edit of the file changes the node-local keys only), and
//! refused, with where, when it is stale, names a node-local key, is not
//! TOML or names an engine the nodes lack.

use std::time::Duration;

use lemon_core::store::postgres::testing::{fresh_database, server_url};
use serde_json::{json, Value};

use crate::support::{home_with, write_config, Gateway, PATIENCE};

const URL_SECRET: &str = "store_url";
const CAP: usize = 3;

fn node_config(node: &str, extra: &str) -> String {
    format!(
        "[gateway]\nmax_concurrent_runs = {CAP}\n{extra}\
         [gateway.store]\nbackend = \"postgres\"\nurl_secret = \"{URL_SECRET}\"\npool_size = 4\n\
         [gateway.cluster]\nenabled = true\nnode_id = \"{node}\"\nlease_term_ms = 2000\n"
    )
}

fn node_home(url: &str, node: &str) -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let home = home_with(&node_config(node, ""));
    let path = home.path().join("secrets.toml");
    std::fs::write(&path, format!("{URL_SECRET} = \"{url}\"\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    home
}

async fn get_config(gateway: &Gateway) -> Value {
    let response = gateway.get("/v1/cluster/config").send().await.unwrap();
    assert_eq!(response.status(), 200);
    response.json().await.unwrap()
}

async fn put_config(gateway: &Gateway, expected: i64, body: &str) -> (u16, Value) {
    let response = gateway
        .http
        .put(format!("{}/v1/cluster/config", gateway.api))
        .bearer_auth(crate::support::TOKEN)
        .json(&json!({ "expected_version": expected, "body": body }))
        .send()
        .await
        .unwrap();
    (response.status().as_u16(), response.json().await.unwrap())
}

/// Polls `what` of `gateway` (a `GET` path) until `check` holds.
async fn until(gateway: &Gateway, path: &str, what: &str, check: impl Fn(&Value) -> bool) -> Value {
    let started = tokio::time::Instant::now();
    loop {
        let body: Value = gateway.get(path).send().await.unwrap().json().await.unwrap();
        if check(&body) {
            return body;
        }
        assert!(started.elapsed() < PATIENCE, "timed out waiting for {what}: {body}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until `gateway` runs version `version` of the cluster config with a
/// cap of `cap`, on its own scheduler and as the cluster's slot count.
async fn applied(gateway: &Gateway, version: i64, cap: usize) -> Value {
    until(gateway, "/v1/status", &format!("version {version} with cap {cap}"), |s| {
        s["cluster"]["config"]["applied_version"] == version
            && s["scheduler"]["max"] == cap
            && s["cluster"]["slots"]["total"] == cap
    })
    .await
}

#[tokio::test]
async fn a_cluster_config_written_on_one_node_is_applied_live_on_every_node() {
    let Some(server) = server_url() else { return };
    let url = fresh_database(&server).await;
    let (home_a, home_b) = (node_home(&url, "node-a"), node_home(&url, "node-b"));
    let a = Gateway::start_in(home_a.path()).await;
    let b = Gateway::start_in(home_b.path()).await;

    // Nobody wrote it yet: version 0, empty, the files in force.
    let row = get_config(&a).await;
    assert_eq!(row["version"], 0, "{row}");
    assert_eq!(row["body"], "", "{row}");
    assert_eq!(row["applied_version"], 0, "{row}");
    let status = b.status().await;
    assert_eq!(
        status["cluster"]["config"],
        json!({ "version": 0, "applied_version": 0, "error": null })
    );

    // Written on A: the cap, the queue and a binding.
    let body = "[gateway]\nmax_concurrent_runs = 5\n\n[gateway.queue]\ncap = 7\n\n\
                [[gateway.bindings]]\ntransport = \"webhook\"\nchat_id = \"ops\"\n\
                default_engine = \"echo\"\n";
    let (code, written) = put_config(&a, 0, body).await;
    assert_eq!(code, 200, "{written}");
    assert_eq!(written["version"], 1, "{written}");
    assert_eq!(written["body"], body, "{written}");
    assert_eq!(written["updated_by"], "node-a", "{written}");

    // B applies it live: its scheduler, the cluster's slots, its queue and
    // bindings; so does A.
    let status = applied(&b, 1, 5).await;
    assert_eq!(status["cluster"]["config"]["version"], 1, "{status}");
    let effective = b.get("/v1/config").send().await.unwrap().json::<Value>().await.unwrap();
    let effective = &effective["effective"];
    assert_eq!(effective["queue"]["cap"], 7, "{effective}");
    assert_eq!(effective["bindings"][0]["chat_id"], "ops", "{effective}");
    assert_eq!(effective["bindings"][0]["default_engine"], "echo", "{effective}");
    applied(&a, 1, 5).await;
    let row = get_config(&b).await;
    assert_eq!((row["version"].clone(), row["applied_version"].clone()), (json!(1), json!(1)));

    // Stale: B edits from version 0 after A wrote 1.
    let (code, answer) = put_config(&b, 0, "[gateway]\nmax_concurrent_runs = 9\n").await;
    assert_eq!(code, 409, "{answer}");
    assert_eq!(answer["version"], 1, "{answer}");
    assert!(answer["error"].as_str().unwrap().contains("version 1"), "{answer}");

    // A node-local key is refused, named where it is.
    let (code, answer) =
        put_config(&b, 1, "[gateway]\nmax_concurrent_runs = 4\n\n[gateway.api]\nport = 4999\n")
            .await;
    assert_eq!(code, 422, "{answer}");
    assert_eq!(answer["key"], "gateway.api", "{answer}");
    assert_eq!(answer["line"], 4, "{answer}");
    assert!(answer["column"].as_u64().is_some(), "{answer}");
    assert!(answer["error"].as_str().unwrap().contains("stays in each node's config.toml"));

    // Not TOML: where.
    let (code, answer) = put_config(&b, 1, "[gateway]\nmax_concurrent_runs = = 4\n").await;
    assert_eq!(code, 400, "{answer}");
    assert_eq!(answer["line"], 2, "{answer}");
    assert!(answer["column"].as_u64().is_some(), "{answer}");
    assert!(answer["error"].as_str().unwrap().starts_with("cluster config:2:"), "{answer}");

    // An engine no node has, checked merged over the node's own config and
    // placed in the body.
    let unknown = "[[gateway.bindings]]\ntransport = \"webhook\"\nchat_id = \"ops\"\n\
                   default_engine = \"nope\"\n";
    let (code, answer) = put_config(&b, 1, unknown).await;
    assert_eq!(code, 422, "{answer}");
    assert_eq!(answer["line"], 4, "{answer}");
    assert!(answer["error"].as_str().unwrap().contains("unknown engine \"nope\""), "{answer}");
    // Nothing refused was written.
    assert_eq!(get_config(&a).await["version"], 1);

    // An edit of B's file: its node-local keys apply, the cluster's cap stays.
    let before = b.get("/v1/config").send().await.unwrap().json::<Value>().await.unwrap();
    write_config(
        home_b.path(),
        &node_config("node-b", "run_inactivity_timeout_ms = 123456\n")
            .replace(&format!("max_concurrent_runs = {CAP}"), "max_concurrent_runs = 2"),
    );
    let after = until(&b, "/v1/config", "the file edit applied", |c| {
        c["generation"] != before["generation"]
    })
    .await;
    assert_eq!(after["effective"]["run_inactivity_timeout_ms"], 123456, "{after}");
    assert_eq!(after["effective"]["max_concurrent_runs"], 5, "{after}");
    assert_eq!(b.status().await["scheduler"]["max"], 5);

    // Emptied from B: every key back to each node's file.
    let (code, written) = put_config(&b, 1, "").await;
    assert_eq!(code, 200, "{written}");
    assert_eq!(written["version"], 2, "{written}");
    assert_eq!(written["updated_by"], "node-b", "{written}");
    // Each node is back at its own file's cap (A's says 3, B's now 2); the
    // cluster's slot count is that of whichever applied last.
    let back = |cap: usize| {
        move |s: &Value| {
            s["cluster"]["config"]["applied_version"] == 2 && s["scheduler"]["max"] == cap
        }
    };
    let status = until(&a, "/v1/status", "A back at its file's cap", back(CAP)).await;
    assert_eq!(status["cluster"]["config"]["version"], 2, "{status}");
    until(&b, "/v1/status", "B back at its file's cap", back(2)).await;
    let total = a.status().await["cluster"]["slots"]["total"].clone();
    assert!(total == 2 || total == CAP, "{total}");
    let effective = a.get("/v1/config").send().await.unwrap().json::<Value>().await.unwrap();
    assert_eq!(effective["effective"]["bindings"], json!([]), "{effective}");
    assert_eq!(effective["effective"]["queue"]["cap"], 100, "{effective}");
    drop((a, b));
}

#[tokio::test]
async fn a_node_starting_after_a_write_starts_with_the_cluster_config() {
    let Some(server) = server_url() else { return };
    let url = fresh_database(&server).await;
    let home_a = node_home(&url, "node-a");
    let a = Gateway::start_in(home_a.path()).await;
    let (code, written) =
        put_config(&a, 0, "[gateway]\nmax_concurrent_runs = 6\n[gateway.queue]\ncap = 9\n").await;
    assert_eq!(code, 200, "{written}");
    applied(&a, 1, 6).await;

    let home_b = node_home(&url, "node-b");
    let b = Gateway::start_in(home_b.path()).await;
    let status = b.status().await;
    assert_eq!(status["cluster"]["config"]["applied_version"], 1, "{status}");
    assert_eq!(status["scheduler"]["max"], 6, "{status}");
    // B's start set the slots from the cluster config, not its file's 3.
    assert_eq!(status["cluster"]["slots"]["total"], 6, "{status}");
    let effective = b.get("/v1/config").send().await.unwrap().json::<Value>().await.unwrap();
    assert_eq!(effective["effective"]["queue"]["cap"], 9, "{effective}");

    // A row no node can take (written past the API, as a newer node with a
    // key this one does not know might): every node says so and keeps
    // version 1 in force.
    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    client
        .batch_execute(
            "UPDATE cluster_config SET version = 2, body = E'[gateway]\\nmax_concurrent_runs = \"six\"\\n' \
             WHERE id = 1; NOTIFY lemon_config, '2'",
        )
        .await
        .unwrap();
    for node in [&a, &b] {
        let status = until(node, "/v1/status", "version 2 refused", |s| {
            s["cluster"]["config"]["version"] == 2 && s["cluster"]["config"]["error"].is_string()
        })
        .await;
        let config = &status["cluster"]["config"];
        assert_eq!(config["applied_version"], 1, "{status}");
        assert!(config["error"].as_str().unwrap().contains("max_concurrent_runs"), "{status}");
        assert_eq!(status["scheduler"]["max"], 6, "{status}");
    }
    // The next good version is taken, and the refusal is gone.
    let (code, written) = put_config(&b, 2, "[gateway]\nmax_concurrent_runs = 4\n").await;
    assert_eq!(code, 200, "{written}");
    let status = applied(&a, 3, 4).await;
    assert_eq!(status["cluster"]["config"]["error"], Value::Null, "{status}");
    drop((a, b));
}

#[tokio::test]
async fn the_dashboard_edits_the_cluster_config_on_the_cluster_panel() {
    let Some(server) = server_url() else { return };
    let home_dir = std::env::var("HOME").ok();
    let modules = match std::env::var("LEMON_PLAYWRIGHT_DIR") {
        Ok(dir) => std::path::PathBuf::from(dir),
        Err(_) => std::path::Path::new(home_dir.as_deref().unwrap_or("."))
            .join(".cache/lemon-tests/node/node_modules"),
    };
    let playwright = modules.join("playwright-core");
    let chromium = std::env::var("LEMON_CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    assert!(
        playwright.join("package.json").exists() && std::path::Path::new(&chromium).exists(),
        "the dashboard test needs playwright-core at {} and Chromium at {chromium}: \
         run scripts/test once (it installs both)",
        playwright.display()
    );
    let url = fresh_database(&server).await;
    let home = node_home(&url, "node-a");
    let gateway = Gateway::start_in(home.path()).await;
    let shots = std::env::current_exe()
        .unwrap()
        .ancestors()
        .nth(3)
        .expect("the test binary is under <target>/debug/deps")
        .join("dashboard-screenshots");
    let script = format!("{}/dashboard/cluster_config.test.mjs", env!("CARGO_MANIFEST_DIR"));
    let node = tokio::process::Command::new("node")
        .arg(&script)
        .env("DASHBOARD_URL", format!("{}/", gateway.api))
        .env("DASHBOARD_TOKEN", crate::support::TOKEN)
        .env("DASHBOARD_SCREENSHOTS", &shots)
        .env("PLAYWRIGHT_CORE", &playwright)
        .env("CHROMIUM", &chromium)
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(PATIENCE, node)
        .await
        .expect("the dashboard script ends in time")
        .expect("node runs (install Node.js)");
    let (stdout, stderr) =
        (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(
        output.status.success() && stdout.contains("CLUSTER CONFIG OK"),
        "cluster config script failed ({}):\n{stdout}\n{stderr}",
        output.status
    );
    // What the page did is what the node has.
    let row = get_config(&gateway).await;
    assert_eq!(row["version"], 2, "{row}");
    applied(&gateway, 2, 5).await;
}
