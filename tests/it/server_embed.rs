//! `lemon-server` embedded in another program, as a desktop app does: start it
//! in-process on a private home, run a prompt through the router, shut it down.
//! No command line and no child gateway process are involved.

use std::collections::BTreeMap;

use lemon_core::bus::EventKind;
use lemon_core::ids::{RunId, SessionKey};
use lemon_core::router::{RunRequest, Submitted};
use lemon_core::tool::ToolContext;
use lemon_server::paths::Paths;
use lemon_server::ServeOptions;
use tokio_util::sync::CancellationToken;

use crate::support::{write_config, PATIENCE, TOKEN};

#[tokio::test]
async fn an_embedded_server_runs_a_prompt_and_shuts_down() {
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path(), "");
    let env = BTreeMap::from([("LEMON_API_TOKEN".to_owned(), TOKEN.to_owned())]);
    let paths = Paths::resolve(
        None,
        &BTreeMap::from([("LEMON_HOME".to_owned(), dir.path().display().to_string())]),
        None,
    );
    let running =
        lemon_server::start(ServeOptions { paths, env, user_home: None, launch_token: None })
            .await
            .unwrap();

    let run_id = RunId::parse("embedded-1").unwrap();
    let request =
        RunRequest { run_id: Some(run_id.clone()), ..RunRequest::new("desk", "hello from inside") };
    let (accepted, mut events) = match running.router.submit(request).await.unwrap() {
        Submitted::Run(accepted, events) => (accepted, events),
        other => panic!("{other:?}"),
    };
    assert_eq!(accepted.run_id, run_id);
    let answer = tokio::time::timeout(PATIENCE, async {
        loop {
            let event = events.next().await.unwrap();
            if let Some(EventKind::RunCompleted { completion, .. }) = event.event().map(|e| &e.kind)
            {
                return completion.answer.clone();
            }
        }
    })
    .await
    .expect("the run completes");
    assert_eq!(answer, "hello from inside");

    // Its control API answers too, on the address it bound.
    let status = reqwest::Client::new()
        .get(format!("http://{}/v1/runs/embedded-1", running.api_addr))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(status.status(), 200);
    let api = running.api_addr;
    tokio::time::timeout(PATIENCE, running.shutdown()).await.expect("drains in time").unwrap();
    assert!(reqwest::get(format!("http://{api}/v1/runs")).await.is_err(), "the listener is closed");
    let db = dir.path().join("lemon.db");
    assert!(db.exists(), "state is in the embedding program's home");
}

#[tokio::test]
async fn an_embedded_server_offers_the_gateway_tools() {
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path(), "");
    let env = BTreeMap::from([("LEMON_API_TOKEN".to_owned(), TOKEN.to_owned())]);
    let paths = Paths::resolve(
        None,
        &BTreeMap::from([("LEMON_HOME".to_owned(), dir.path().display().to_string())]),
        None,
    );
    let running =
        lemon_server::start(ServeOptions { paths, env, user_home: None, launch_token: None })
            .await
            .unwrap();
    let names: Vec<String> = running.tools.list().iter().map(|tool| tool.spec().name).collect();
    for name in [
        "discord_send_file",
        "sms_claim_message",
        "sms_get_inbox_number",
        "sms_list_messages",
        "sms_wait_for_code",
        "telegram_send_image",
    ] {
        assert!(names.iter().any(|n| n == name), "{name} in {names:?}");
    }
    let telegram = running.tools.get("telegram_send_image").unwrap();
    assert!(telegram.offered(&SessionKey::from("agent:main:telegram:9:dm:42")));
    assert!(!telegram.offered(&SessionKey::from("desk")));

    // No SMS inbox is configured: the tools say so.
    let ctx = ToolContext {
        run_id: RunId::parse("tool-1").unwrap(),
        session_key: SessionKey::from("desk"),
        call_id: "call_1".to_owned(),
        cwd: dir.path().to_path_buf(),
        workspace: None,
        off_limits: lemon_core::contain::OffLimits::none(),
        cancel: CancellationToken::new(),
    };
    let sms = running.tools.get("sms_wait_for_code").unwrap();
    let out = sms.execute(serde_json::json!({}), ctx).await;
    assert!(out.is_error);
    assert_eq!(out.text, "SMS is not configured on this gateway: no inbox receives messages.");
    tokio::time::timeout(PATIENCE, running.shutdown()).await.expect("drains in time").unwrap();
}
