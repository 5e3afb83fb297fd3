//! Every action and message of the `cron` tool, over the real actor.

use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use super::*;
use crate::cron::scheduler::tests::{harness, Harness};
use crate::ids::{RunId, SessionKey};

const SESSION: &str = "agent:ops:telegram:1:group:-100:thread:7";

fn ctx(session: &str) -> ToolContext {
    ToolContext {
        run_id: RunId::generate(),
        session_key: SessionKey::from(session),
        call_id: "call_1".to_owned(),
        cwd: std::env::temp_dir(),
        workspace: None,
        off_limits: crate::contain::OffLimits::none(),
        cancel: CancellationToken::new(),
    }
}

async fn call(tool: &CronTool, args: Value) -> ToolOutput {
    tool.execute(args, ctx(SESSION)).await
}

/// A successful call: the title, and the payload both in the text and as details.
async fn ok(tool: &CronTool, args: Value, title: &str) -> Value {
    let out = call(tool, args.clone()).await;
    assert!(!out.is_error, "{args}: {}", out.text);
    let (first, rest) = out.text.split_once('\n').unwrap();
    assert_eq!(first, title);
    assert_eq!(serde_json::from_str::<Value>(rest).unwrap(), out.details);
    out.details
}

async fn refused(tool: &CronTool, args: Value, message: &str) {
    let out = call(tool, args.clone()).await;
    assert!(out.is_error, "{args} should be refused");
    assert_eq!(out.text, message, "{args}");
    assert_eq!(out.details, json!({"error": true}));
}

fn tool(h: &Harness) -> CronTool {
    CronTool::new(h.cron.clone())
}

#[tokio::test(start_paused = true)]
async fn the_spec_names_every_action() {
    let h = harness().await;
    let spec = tool(&h).spec();
    assert_eq!(spec.name, "cron");
    assert_eq!(spec.parameters["properties"]["action"]["enum"], json!(ACTIONS));
    assert_eq!(spec.parameters["required"], json!(["action"]));
}

#[tokio::test(start_paused = true)]
async fn add_list_update_pause_resume_run_runs_remove() {
    let mut h = harness().await;
    let t = tool(&h);
    let added = ok(
        &t,
        json!({"action": "add", "name": "digest", "schedule": "every 5 minutes", "message": "ok digest",
               "maxRetries": 1, "retryBackoffMs": 1000, "sessionKey": "agent:other:main"}),
        "Cron job added",
    )
    .await;
    let id = added["id"].as_str().unwrap().to_owned();
    assert_eq!(added["name"], "digest");
    assert_eq!(added["schedule"], "*/5 * * * *");
    assert_eq!(added["maxRetries"], 1);
    assert_eq!(added["retryBackoffMs"], 1000);
    // The running session wins over the model's key.
    assert_eq!(added["sessionKey"], SESSION);
    assert_eq!(added["agentId"], "ops");
    assert_eq!(added["timeoutMs"], 300_000);

    let listed = ok(&t, json!({"action": "list"}), "Cron jobs").await;
    assert_eq!(listed["jobs"].as_array().unwrap().len(), 1);
    assert_eq!(listed["jobs"][0]["id"], id.as_str());
    let other = ok(&t, json!({"action": "list", "agentId": "nobody"}), "Cron jobs").await;
    assert_eq!(other["jobs"], json!([]));

    let updated = ok(
        &t,
        json!({"action": "update", "jobId": id, "patch": {"enabled": false, "maxRetries": 2, "retryBackoffMs": 2000}}),
        "Cron job updated",
    )
    .await;
    assert_eq!(updated, json!({"id": id, "updated": true, "nextRunAtMs": null}));
    let listed = ok(&t, json!({"action": "list"}), "Cron jobs").await;
    assert_eq!(listed["jobs"], json!([]), "paused jobs are left out");
    let listed = ok(&t, json!({"action": "list", "includeDisabled": true}), "Cron jobs").await;
    assert_eq!(
        (listed["jobs"][0]["maxRetries"].clone(), listed["jobs"][0]["retryBackoffMs"].clone()),
        (json!(2), json!(2000))
    );

    let resumed = ok(&t, json!({"action": "resume", "id": id}), "Cron job resumed").await;
    assert_eq!(
        (resumed["resumed"].clone(), resumed["enabled"].clone()),
        (json!(true), json!(true))
    );
    assert!(resumed["nextRunAtMs"].is_i64());
    let paused = ok(&t, json!({"action": "pause", "id": id}), "Cron job paused").await;
    assert_eq!(paused, json!({"id": id, "paused": true, "enabled": false, "nextRunAtMs": null}));

    let status = ok(&t, json!({"action": "status"}), "Cron status").await;
    assert_eq!(
        status,
        json!({"enabled": true, "jobCount": 1, "activeJobs": 0, "nextRunAtMs": null})
    );

    let triggered = ok(&t, json!({"action": "run", "id": id}), "Cron job triggered").await;
    assert_eq!(
        (triggered["triggered"].clone(), triggered["jobId"].clone()),
        (json!(true), json!(id))
    );
    let ended = h.ended().await;
    assert_eq!(ended.id, triggered["runId"].as_str().unwrap());
    let runs = ok(&t, json!({"action": "runs", "id": id}), "Cron runs").await;
    assert_eq!(runs["jobId"], id.as_str());
    assert_eq!(runs["runs"][0]["status"], "succeeded");
    assert_eq!(runs["runs"][0]["output"], "digest");
    let none = ok(&t, json!({"action": "runs", "id": id, "limit": 0}), "Cron runs").await;
    assert_eq!(none["runs"], json!([]));

    let removed = ok(&t, json!({"action": "remove", "id": id}), "Cron job removed").await;
    assert_eq!(removed, json!({"removed": true, "id": id}));
    refused(&t, json!({"action": "run", "id": id}), &format!("Cron job not found: {id}")).await;
}

#[tokio::test(start_paused = true)]
async fn abort_stops_an_active_run() {
    let mut h = harness().await;
    let t = tool(&h);
    let added =
        ok(&t, json!({"action": "add", "schedule": "@daily", "prompt": "hang"}), "Cron job added")
            .await;
    assert_eq!(added["name"], "Cron hang");
    let triggered = ok(&t, json!({"action": "run", "id": added["id"]}), "Cron job triggered").await;
    let run_id = triggered["runId"].as_str().unwrap().to_owned();
    let started = h.updates.recv().await.unwrap();
    let aborted = ok(&t, json!({"action": "abort", "cronRunId": run_id}), "Cron run aborted").await;
    assert_eq!(
        aborted,
        json!({"aborted": true, "runId": run_id, "jobId": added["id"], "status": "aborted", "routerRunId": started.router_run_id})
    );
    assert_eq!(h.ended().await.status, crate::cron::CronRunStatus::Aborted);
    refused(&t, json!({"action": "abort", "runId": run_id}), "Cron run is not active").await;
    refused(&t, json!({"action": "abort", "runId": "cronrun_x"}), "Cron run not found").await;
    refused(&t, json!({"action": "abort"}), "runId (or cronRunId) is required").await;
}

#[tokio::test(start_paused = true)]
async fn every_refusal_has_its_message() {
    let h = harness().await;
    let t = tool(&h);
    refused(&t, json!({}), "action is required").await;
    refused(&t, json!({"action": "  "}), "action is required").await;
    refused(
        &t,
        json!({"action": "explode"}),
        "Unknown action 'explode'. Supported: status, list, add, update, pause, resume, abort, remove, run, runs",
    )
    .await;
    refused(&t, json!({"action": "add", "prompt": "p"}), "schedule is required for action=add")
        .await;
    refused(
        &t,
        json!({"action": "add", "schedule": "@daily"}),
        "prompt is required for action=add",
    )
    .await;
    refused(
        &t,
        json!({"action": "add", "schedule": "every 90m", "prompt": "p"}),
        "Invalid schedule: `every 90m`: minutes must be 1 to 59 (use hours for longer)",
    )
    .await;
    refused(
        &t,
        json!({"action": "add", "schedule": "@daily", "prompt": "p", "sessionKey": "a\nb"}),
        "sessionKey must be a valid Lemon session key",
    )
    .await;
    refused(
        &t,
        json!({"action": "add", "schedule": "@daily", "prompt": "p", "timezone": "Mars/Base"}),
        "Failed to add cron job: timezone: unknown time zone `Mars/Base` (use an IANA name such as Europe/Berlin or UTC)",
    )
    .await;
    for action in ["update", "pause", "resume", "remove", "run", "runs"] {
        refused(
            &t,
            json!({"action": action}),
            &format!("id (or jobId) is required for action={action}"),
        )
        .await;
    }
    refused(&t, json!({"action": "update", "id": "cron_x"}), "No update fields were provided")
        .await;
    refused(
        &t,
        json!({"action": "update", "id": "cron_x", "enabled": true}),
        "Cron job not found: cron_x",
    )
    .await;
    refused(&t, json!({"action": "pause", "id": "cron_x"}), "Cron job not found: cron_x").await;
    refused(&t, json!({"action": "runs", "jobId": "cron_x"}), "Cron job not found: cron_x").await;
    refused(&t, json!({"action": "remove", "job_id": "cron_x"}), "Cron job not found: cron_x")
        .await;
}

#[tokio::test(start_paused = true)]
async fn a_job_wrapper_and_a_session_less_run() {
    let h = harness().await;
    let t = tool(&h);
    let out = t
        .execute(json!({"action": "add", "job": {"schedule": "daily at 9am", "prompt": "p", "agent_id": "ops"}}), ctx(""))
        .await;
    assert!(!out.is_error, "{}", out.text);
    assert_eq!(out.details["sessionKey"], "agent:ops:main");
    assert_eq!(out.details["schedule"], "0 9 * * *");
    let out = t
        .execute(json!({"action": "add", "name": "n2", "schedule": "@daily", "prompt": "p", "sessionKey": "agent:x:y"}), ctx(""))
        .await;
    assert_eq!(out.details["sessionKey"], "agent:x:y");
    assert_eq!(out.details["agentId"], "x");
    h.stop().await;
    let out = t.execute(json!({"action": "status"}), ctx(SESSION)).await;
    assert!(out.is_error);
    assert!(out.text.starts_with("Cron scheduler is unavailable"), "{}", out.text);
}

#[tokio::test(start_paused = true)]
async fn a_memory_file_in_the_gateways_state_is_refused() {
    let h = harness().await;
    let t = tool(&h);
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join(".lemon");
    std::fs::create_dir_all(&home).unwrap();
    std::os::unix::fs::symlink(home.join("secrets.toml"), dir.path().join("notes.md")).unwrap();
    let ctx = ToolContext {
        cwd: dir.path().to_owned(),
        off_limits: crate::contain::OffLimits::new([home], []),
        ..ctx(SESSION)
    };
    for memory in [".lemon/config.toml", "notes.md"] {
        let args =
            json!({"action": "add", "schedule": "@daily", "prompt": "p", "memoryFile": memory});
        let out = t.execute(args, ctx.clone()).await;
        assert!(out.is_error, "{memory}: {}", out.text);
        assert!(out.text.contains("the gateway's own state"), "{}", out.text);
    }
    let args =
        json!({"action": "add", "schedule": "@daily", "prompt": "p", "memoryFile": "mine.md"});
    let added = t.execute(args, ctx.clone()).await;
    assert!(!added.is_error, "{}", added.text);
    let id = added.details["id"].as_str().unwrap().to_owned();
    let out =
        t.execute(json!({"action": "update", "id": id, "memoryFile": ".lemon/x.md"}), ctx).await;
    assert!(out.is_error && out.text.contains("the gateway's own state"), "{}", out.text);
}
