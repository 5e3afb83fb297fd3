//! Two real gateway nodes in cluster mode on one PostgreSQL database, as their
//! status surfaces show them: `/v1/status` `cluster`, `/metrics`, `/healthz`,
//! `lemon-gateway status` and `doctor` (which reads the cluster without
//! joining it, and names a second live node with this node's id). A node
//! that stops heartbeating is shown gone; nodes whose leases cannot be renewed
//! are fenced and exit with code 75 for their supervisor.

use std::path::Path;
use std::time::Duration;

use lemon_core::store::postgres::testing::{fresh_database, server_url};
use serde_json::Value;

use crate::support::{command, home_with, output_text, Gateway, PATIENCE};

const URL_SECRET: &str = "store_url";
/// Short, so a dead node is seen gone and a fenced one stops quickly.
const TERM_MS: u64 = 2000;
const CAP: usize = 3;

fn node_home(url: &str, node: &str) -> tempfile::TempDir {
    let home = home_with(&format!(
        "[gateway]\nmax_concurrent_runs = {CAP}\n\
         [gateway.store]\nbackend = \"postgres\"\nurl_secret = \"{URL_SECRET}\"\npool_size = 4\n\
         [gateway.cluster]\nenabled = true\nnode_id = \"{node}\"\nlease_term_ms = {TERM_MS}\n\
         api_base_url = \"http://{node}.internal:4040\"\n"
    ));
    write_secret(home.path(), url);
    home
}

fn write_secret(home: &Path, url: &str) {
    use std::os::unix::fs::PermissionsExt;
    let path = home.join("secrets.toml");
    std::fs::write(&path, format!("{URL_SECRET} = \"{url}\"\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

/// Polls `gateway`'s `/v1/status` until `check` holds for its `cluster`.
async fn cluster_until(gateway: &Gateway, what: &str, check: impl Fn(&Value) -> bool) -> Value {
    let started = tokio::time::Instant::now();
    loop {
        let cluster = gateway.status().await["cluster"].clone();
        if check(&cluster) {
            return cluster;
        }
        assert!(started.elapsed() < PATIENCE, "timed out waiting for {what}: {cluster}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn node<'a>(cluster: &'a Value, id: &str) -> &'a Value {
    let nodes = cluster["nodes"].as_array().expect("nodes");
    nodes.iter().find(|n| n["id"] == id).unwrap_or_else(|| panic!("no {id} in {cluster}"))
}

#[tokio::test]
async fn two_nodes_show_the_cluster_in_status_metrics_health_and_doctor() {
    let Some(server) = server_url() else { return };
    let url = fresh_database(&server).await;
    let (home_a, home_b) = (node_home(&url, "node-a"), node_home(&url, "node-b"));
    let a = Gateway::start_in(home_a.path()).await;
    let mut b = Gateway::start_in(home_b.path()).await;

    // Each node sees both, with what they registered; the cluster's slots are
    // the cap; a run through A frees its slot when it ends.
    let cluster = cluster_until(&a, "both nodes alive", |c| {
        c["nodes"].as_array().is_some_and(|n| n.len() == 2 && n.iter().all(|n| n["alive"] == true))
    })
    .await;
    assert_eq!(cluster["node"], "node-a", "{cluster}");
    assert_eq!(cluster["term_ms"], TERM_MS, "{cluster}");
    assert_eq!(cluster["fenced"], false, "{cluster}");
    assert_eq!(node(&cluster, "node-b")["api_base_url"], "http://node-b.internal:4040");
    assert_eq!(node(&cluster, "node-b")["version"], env!("CARGO_PKG_VERSION"));
    let run_id = a.submit(serde_json::json!({ "prompt": "through node a" })).await;
    let record = a.wait(&run_id).await;
    assert_eq!(record["status"], "completed", "{record}");
    let cluster = b.status().await["cluster"].clone();
    assert_eq!(cluster["node"], "node-b", "{cluster}");
    assert_eq!(cluster["slots"], serde_json::json!({ "total": CAP, "in_use": 0 }), "{cluster}");
    // No chat channel is configured: the one channel lease is the scheduler's,
    // held by one of the two nodes.
    let channels = cluster["channels"].as_array().expect("channels").clone();
    assert_eq!(channels.len(), 1, "{cluster}");
    assert_eq!(channels[0]["channel"], "cron", "{cluster}");
    assert!(
        ["node-a", "node-b"].contains(&channels[0]["node"].as_str().unwrap_or("")),
        "{cluster}"
    );

    let metrics =
        reqwest::get(format!("{}/metrics", b.health)).await.unwrap().text().await.unwrap();
    for line in [
        "lemon_cluster_nodes_alive 2".to_owned(),
        format!("lemon_cluster_slots_total {CAP}"),
        "lemon_cluster_slots_in_use 0".to_owned(),
        "lemon_cluster_fenced 0".to_owned(),
    ] {
        assert!(metrics.lines().any(|l| l == line), "{line} missing:\n{metrics}");
    }
    assert!(metrics.lines().any(|l| l.starts_with("lemon_cluster_sessions_owned ")), "{metrics}");
    let health: Value =
        reqwest::get(format!("{}/healthz", a.health)).await.unwrap().json().await.unwrap();
    assert_eq!(health["status"], "healthy", "{health}");
    let check = health["checks"].as_array().unwrap().iter().find(|c| c["name"] == "cluster");
    assert_eq!(check.expect("a cluster check")["ok"], true, "{health}");

    let (ok, text) = output_text({
        let mut status = command(home_a.path());
        status.env("LEMON_URL", &a.api).arg("status");
        status
    })
    .await;
    assert!(ok, "{text}");
    let line = text.lines().find(|l| l.starts_with("cluster")).unwrap_or_else(|| panic!("{text}"));
    // The session of the run may still be held here, or already given up.
    let expected =
        format!("cluster   node node-a, 2 of 2 nodes alive, 0 of {CAP} cluster slots in use, sessions here: ");
    assert!(line.starts_with(&expected), "{line}");

    // Doctor beside the running node-a: that id is this home's gateway. From
    // a home that is not running and names node-b: another node has that id.
    let doctor = |home: &Path| {
        let mut doctor = command(home);
        doctor.arg("doctor");
        output_text(doctor)
    };
    let (_, text) = doctor(home_a.path()).await;
    let line = text.lines().find(|l| l.contains("cluster")).unwrap_or_else(|| panic!("{text}"));
    assert!(line.contains("2 of 2 registered nodes alive"), "{line}");
    assert!(line.contains("node-a is this home's gateway, which is running"), "{line}");
    let home_c = node_home(&url, "node-b");
    let (ok, text) = doctor(home_c.path()).await;
    assert!(!ok, "a clash fails the doctor:\n{text}");
    assert!(text.contains("another live node is registered as node-b"), "{text}");
    // Doctor took no lease and registered nothing.
    let cluster = a.status().await["cluster"].clone();
    assert_eq!(cluster["nodes"].as_array().unwrap().len(), 2, "{cluster}");

    // B dies: A shows it gone once its heartbeat is older than the term.
    b.child.start_kill().unwrap();
    b.child.wait().await.unwrap();
    let cluster = cluster_until(&a, "node-b gone", |c| node(c, "node-b")["alive"] == false).await;
    assert_eq!(node(&cluster, "node-a")["alive"], true, "{cluster}");
    let metrics =
        reqwest::get(format!("{}/metrics", a.health)).await.unwrap().text().await.unwrap();
    assert!(metrics.lines().any(|l| l == "lemon_cluster_nodes_alive 1"), "{metrics}");
    drop(a);
}

#[tokio::test]
async fn a_node_that_cannot_renew_its_leases_is_fenced_and_exits_with_75() {
    let Some(server) = server_url() else { return };
    let url = fresh_database(&server).await;
    let home = node_home(&url, "node-f");
    let log = home.path().join("gateway.log");
    let mut gateway = Gateway::spawn_logging_to(command(home.path()), home.path(), &log).await;
    // Another client holds the lease tables: every renewal waits past its
    // deadline, and after two thirds of the term the node is fenced.
    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    client
        .batch_execute("BEGIN; LOCK TABLE session_leases, channel_leases IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    let exit = tokio::time::timeout(PATIENCE, gateway.child.wait())
        .await
        .expect("the fenced node exits")
        .unwrap();
    let logged = std::fs::read_to_string(&log).unwrap();
    assert_eq!(exit.code(), Some(75), "{logged}");
    assert!(logged.contains("this cluster node is fenced"), "{logged}");
}
