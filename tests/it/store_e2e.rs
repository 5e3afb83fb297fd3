//! The store's file on the real binary: `backup` while the gateway runs,
//! `restore` refused while it runs and taken once it stopped.

use serde_json::json;

use crate::support::{command, home_with, output_text, Gateway};

async fn cli(home: &std::path::Path, args: &[&std::ffi::OsStr]) -> (bool, String) {
    let mut command = command(home);
    command.args(args);
    output_text(command).await
}

#[tokio::test]
async fn a_backup_taken_while_running_restores_once_the_gateway_stopped() {
    let home = home_with("[gateway.engines.echo]\ndelay_ms = 0\n");
    let gateway = Gateway::start_in(home.path()).await;
    let mut kept = Vec::new();
    for n in 0..5 {
        let run_id = gateway.submit(json!({ "prompt": format!("kept {n}") })).await;
        gateway.wait(&run_id).await;
        kept.push(run_id);
    }
    let scratch = tempfile::tempdir().unwrap();
    let file = scratch.path().join("lemon-backup.db");
    let (ok, text) = cli(home.path(), &["backup".as_ref(), file.as_os_str()]).await;
    assert!(ok, "{text}");
    assert!(text.starts_with("backed up 5 runs ("), "{text}");
    let (ok, text) = cli(home.path(), &["backup".as_ref(), file.as_os_str()]).await;
    assert!(!ok && text.contains("already exists"), "{text}");
    // A run after the backup is not in it.
    let later = gateway.submit(json!({ "prompt": "after the backup" })).await;
    gateway.wait(&later).await;

    let (ok, text) = cli(home.path(), &["restore".as_ref(), file.as_os_str()]).await;
    assert!(!ok, "a restore under a running gateway is refused: {text}");
    assert!(text.contains("a gateway is running on"), "{text}");
    assert!(text.contains("stop it, then restore"), "{text}");
    gateway.terminate().await;

    let (ok, text) = cli(home.path(), &["restore".as_ref(), file.as_os_str()]).await;
    assert!(ok, "{text}");
    assert!(text.starts_with("restored 5 runs ("), "{text}");
    assert!(home.path().join("lemon.db.before-restore").exists());
    let gateway = Gateway::start_in(home.path()).await;
    for run_id in &kept {
        assert_eq!(gateway.run(run_id).await["status"], "completed", "{run_id}");
    }
    let response = gateway.get(&format!("/v1/runs/{later}")).send().await.unwrap();
    assert_eq!(response.status(), 404, "the run after the backup is gone with the restore");
    gateway.terminate().await;
}

/// A session's export reads back in order: each run's prompt, answer, engine
/// and completed actions (a tool the CLI ran), as JSON lines and Markdown;
/// the CLI prints the same.
#[tokio::test]
async fn a_sessions_export_reads_back_its_runs_in_order_with_their_actions() {
    let cli_path = env!("CARGO_BIN_EXE_fake-cli");
    let fixture = lemon_tests::fake_cli::fixture("claude", "synth_tool_use_success.jsonl");
    let home = home_with(&format!(
        "[gateway.engines.echo]\ndelay_ms = 0\n[gateway.engines.claude]\ncli_path = \"{cli_path}\"\nenv = {{ FAKE_CLI_FIXTURE = \"{}\" }}\n{}",
        fixture.display(),
        crate::support::ALLOW_EVERY_CALL
    ));
    let gateway = Gateway::start_in(home.path()).await;
    let session = "export:chat-1";
    let mut runs = Vec::new();
    for (engine, prompt) in
        [("echo", "first question"), ("claude", "use a tool"), ("echo", "last one")]
    {
        let run_id = gateway
            .submit(json!({ "prompt": prompt, "engine": engine, "session_key": session }))
            .await;
        let record = gateway.wait(&run_id).await;
        assert_eq!(record["status"], "completed", "{record}");
        runs.push((run_id, record));
    }
    // Another session's run is not in the export.
    let other = gateway.submit(json!({ "prompt": "elsewhere", "session_key": "other" })).await;
    gateway.wait(&other).await;

    let response = gateway.get("/v1/sessions/export:chat-1/export").send().await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "application/x-ndjson");
    let text = response.text().await.unwrap();
    let lines: Vec<serde_json::Value> =
        text.lines().map(|line| serde_json::from_str(line).unwrap()).collect();
    assert_eq!(lines.len(), 3, "{text}");
    for (line, (run_id, record)) in lines.iter().zip(&runs) {
        assert_eq!(line["run_id"], run_id.as_str());
        assert_eq!(line["prompt"], record["prompt"]);
        assert_eq!(line["answer"], record["answer"]);
        assert_eq!(line["engine"], record["engine"]);
    }
    let tool = lines[1]["actions"].as_array().unwrap();
    assert!(!tool.is_empty(), "the CLI's tool call is in the export: {}", lines[1]);
    assert!(tool.iter().all(|action| action["ok"] == true), "{tool:?}");
    assert_eq!(lines[0]["actions"], json!([]));

    let markdown = gateway
        .get("/v1/sessions/export:chat-1/export?format=markdown")
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(markdown.starts_with("# Session export:chat-1\n\n## "), "{markdown}");
    let first = markdown.find("> first question").unwrap();
    let tool_use = markdown.find("> use a tool").unwrap();
    let last = markdown.find("> last one").unwrap();
    assert!(first < tool_use && tool_use < last, "in order: {markdown}");
    assert!(markdown.contains("- ✓ "), "the tool is listed: {markdown}");
    assert!(!markdown.contains("elsewhere"), "{markdown}");

    let refused = gateway.get("/v1/sessions/export:chat-1/export?format=pdf").send().await.unwrap();
    assert_eq!(refused.status(), 400);
    let body: serde_json::Value = refused.json().await.unwrap();
    assert_eq!(body["error"], "format: must be jsonl or markdown");

    let mut export = command(home.path());
    export.env("LEMON_URL", &gateway.api).args([
        "export",
        "--session",
        session,
        "--format",
        "jsonl",
    ]);
    let (ok, printed) = output_text(export).await;
    assert!(ok, "{printed}");
    assert_eq!(printed, text, "the command prints what the API gives");
    gateway.terminate().await;
}

/// `[gateway.backup]`: a folder with no copy newer than the last slot gets
/// one at start, and only the newest `keep` copies stay.
#[tokio::test]
async fn a_scheduled_backup_makes_up_a_missed_slot_at_start_and_keeps_the_newest() {
    let copies = tempfile::tempdir().unwrap();
    for day in 1..=4 {
        std::fs::write(copies.path().join(format!("lemon-2020010{day}T030000Z.db")), "old")
            .unwrap();
    }
    let home = home_with(&format!(
        "[gateway.engines.echo]\ndelay_ms = 0\n[gateway.backup]\nevery = \"daily at 3am\"\ndir = \"{}\"\nkeep = 3\n",
        copies.path().display()
    ));
    let gateway = Gateway::start_in(home.path()).await;
    let names = || {
        let mut names: Vec<String> = std::fs::read_dir(copies.path())
            .unwrap()
            .map(|entry| entry.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        names
    };
    let listed = tokio::time::timeout(crate::support::PATIENCE, async {
        loop {
            let names = names();
            if names.len() == 3 && names.iter().any(|name| !name.starts_with("lemon-2020")) {
                return names;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no backup at start: {:?}", names()));
    assert_eq!(
        listed[..2],
        ["lemon-20200103T030000Z.db", "lemon-20200104T030000Z.db"],
        "{listed:?}"
    );
    let made = copies.path().join(&listed[2]);
    let head = std::fs::read(&made).unwrap();
    assert!(head.starts_with(b"SQLite format 3\0"), "the copy is a database");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&made).unwrap().permissions().mode() & 0o777, 0o600);
    gateway.terminate().await;
}

/// Polls `/v1/status` (bounded) until the store shows a retention pass that
/// ended after `after_ms`; returns the pass.
async fn prune_after(gateway: &Gateway, after_ms: i64) -> serde_json::Value {
    let found = tokio::time::timeout(crate::support::PATIENCE, async {
        loop {
            let pass = gateway.status().await["store"]["last_prune"].clone();
            if pass["at_ms"].as_i64().is_some_and(|at| at > after_ms) {
                return pass;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    })
    .await;
    found.expect("a retention pass in time")
}

/// Retention on the real binary: a pass at start shows in `/v1/status`,
/// `status` and `/metrics`, and an edit of `[gateway.retention]` runs another
/// at once, which keeps a run that just finished.
#[tokio::test]
async fn retention_passes_at_start_and_again_when_its_section_is_edited() {
    let config = "[gateway.engines.echo]\ndelay_ms = 0\n";
    let home = home_with(config);
    let gateway = Gateway::start_in(home.path()).await;
    let run_id = gateway.submit(json!({ "prompt": "kept" })).await;
    gateway.wait(&run_id).await;
    let first = prune_after(&gateway, 0).await;
    assert_eq!(first["error"], serde_json::Value::Null, "{first}");
    let store = gateway.status().await["store"].clone();
    assert_eq!(store["rows"]["runs"], 1, "{store}");
    assert!(store["rows"]["run_events"].as_u64().is_some_and(|n| n >= 1), "{store}");

    crate::support::write_config(
        home.path(),
        &format!("{config}[gateway.retention]\nruns_days = 1\nevents_days = 1\n"),
    );
    let second = prune_after(&gateway, first["at_ms"].as_i64().unwrap()).await;
    assert_eq!(second["error"], serde_json::Value::Null, "{second}");
    let run = gateway.run(&run_id).await;
    assert_eq!(
        (run["status"].as_str(), &run["compacted"]),
        (Some("completed"), &serde_json::Value::Null)
    );

    let mut status = command(home.path());
    status.env("LEMON_URL", &gateway.api).arg("status");
    let (ok, text) = output_text(status).await;
    assert!(ok, "{text}");
    assert!(text.contains("rows: "), "{text}");
    assert!(text.contains("last prune "), "{text}");
    assert!(text.contains("last backup: none"), "{text}");
    let url = format!("{}/metrics", gateway.health);
    let metrics = reqwest::get(url).await.unwrap().text().await.unwrap();
    assert!(metrics.contains("lemon_store_rows{table=\"runs\"} 1"), "{metrics}");
    assert!(metrics.contains("# TYPE lemon_store_pruned_total counter"), "{metrics}");
    gateway.terminate().await;
}
