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
