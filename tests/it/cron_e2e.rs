//! Cron end to end on the real binary: jobs over the API answer in a Telegram
//! chat of the fake Bot API, survive a restart, come from config.toml, and a
//! slot missed while the gateway was down fires once at start.

use std::time::Duration;

use lemon_core::cron::jobs::CronJobs;
use lemon_core::store::StoreHandle;
use lemon_tests::fake_telegram::ChatSpec;
use serde_json::{json, Value};

use crate::support::{failed_start, home_with, Gateway, PATIENCE};
use crate::telegram_e2e::{
    config as telegram_config, fake_telegram, start as start_telegram, USER,
};

impl Gateway {
    async fn cron_create(&self, body: Value) -> Value {
        let response = self.post("/v1/cron").json(&body).send().await.unwrap();
        assert_eq!(response.status(), 201, "create {body}");
        response.json().await.unwrap()
    }

    async fn cron_list(&self) -> Vec<Value> {
        let body: Value = self.get("/v1/cron").send().await.unwrap().json().await.unwrap();
        body["jobs"].as_array().unwrap().clone()
    }

    async fn cron_runs(&self, id: &str) -> Vec<Value> {
        let body: Value =
            self.get(&format!("/v1/cron/{id}/runs")).send().await.unwrap().json().await.unwrap();
        body["runs"].as_array().unwrap().clone()
    }

    /// The job's runs once `done` holds for them, checked as the store changes.
    async fn cron_runs_until(&self, id: &str, done: impl Fn(&[Value]) -> bool) -> Vec<Value> {
        let poll = async {
            loop {
                let runs = self.cron_runs(id).await;
                if done(&runs) {
                    return runs;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        tokio::time::timeout(PATIENCE, poll).await.expect("the cron runs in time")
    }
}

fn ended(runs: &[Value]) -> bool {
    !runs.is_empty()
        && runs.iter().all(|run| !matches!(run["status"].as_str(), Some("running" | "retrying")))
}

#[tokio::test]
async fn a_job_run_over_the_api_answers_in_its_telegram_chat() {
    let fake = fake_telegram().await;
    let chat = ChatSpec::private(USER);
    fake.add_chat(&chat);
    let config = telegram_config(&fake, "", "default_engine = \"echo\"\n");
    let gateway = start_telegram(&fake, &config).await;
    let session = format!("agent:default:telegram:{}:dm:{USER}", fake.bot_id());
    let job = gateway
        .cron_create(json!({"name": "morning", "schedule": "daily at 9am", "prompt": "good morning from cron", "sessionKey": session}))
        .await;
    let id = job["id"].as_str().unwrap();
    assert_eq!(job["schedule"], "0 9 * * *");
    let response = gateway.post(&format!("/v1/cron/{id}/run")).send().await.unwrap();
    assert_eq!(response.status(), 202);
    let what = "the cron answer in the chat";
    fake.wait_until(what, PATIENCE, |s| {
        s.messages(USER).iter().any(|m| m.text.contains("good morning from cron"))
    })
    .await;
    let runs = gateway.cron_runs_until(id, ended).await;
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0]["status"], "succeeded");
    assert_eq!(runs[0]["output"], "good morning from cron");
    let router_run = gateway.run(runs[0]["routerRunId"].as_str().unwrap()).await;
    assert_eq!(router_run["session_key"], session.as_str());
}

#[tokio::test]
async fn jobs_survive_a_restart_and_a_missed_slot_fires_once_at_start() {
    let dir = home_with("[gateway]\ndefault_engine = \"echo\"\n");
    let gateway = Gateway::start_in(dir.path()).await;
    let job = gateway
        .cron_create(json!({"name": "nightly", "schedule": "@daily", "prompt": "missed me", "session_key": "agent:ops:main"}))
        .await;
    let id = job["id"].as_str().unwrap().to_owned();
    gateway.terminate().await;

    // The gateway was down when the job was due, hours ago: many slots passed.
    let store = StoreHandle::open_sqlite(&dir.path().join("lemon.db")).unwrap();
    let jobs = CronJobs::new(store.clone());
    let mut stored = jobs.load().await.unwrap().into_iter().find(|job| job.id == id).unwrap();
    let now = lemon_core::clock::now_ms();
    stored.next_run_at_ms = Some(now - 3 * 24 * 3_600_000);
    jobs.put(&stored).await;
    store.close().await.unwrap();

    let gateway = Gateway::start_in(dir.path()).await;
    let listed = gateway.cron_list().await;
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0]["id"], id.as_str());
    assert_eq!(listed[0]["prompt"], "missed me");
    let runs = gateway.cron_runs_until(&id, ended).await;
    assert_eq!(runs.len(), 1, "one firing for every missed slot: {runs:?}");
    assert_eq!(runs[0]["trigger"], "schedule");
    assert_eq!(runs[0]["output"], "missed me");
    let job = &gateway.cron_list().await[0];
    assert!(job["nextRunAtMs"].as_i64().unwrap() > now, "{job}");
    assert!(job["lastRunAtMs"].as_i64().unwrap() >= now);
    gateway.terminate().await;

    // After another restart the job is still there, with its one run.
    let gateway = Gateway::start_in(dir.path()).await;
    assert_eq!(gateway.cron_runs(&id).await.len(), 1);
}

#[tokio::test]
async fn config_jobs_are_listed_and_bad_ones_refuse_to_start() {
    let config = "[gateway]\ndefault_engine = \"echo\"\n\n[[gateway.cron]]\nname = \"report\"\n\
                  schedule = \"weekdays at 09:30\"\nprompt = \"weekly report\"\ntimezone = \"Europe/Berlin\"\n";
    let gateway = Gateway::start(config).await;
    let jobs = gateway.cron_list().await;
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    assert_eq!(jobs[0]["name"], "report");
    assert_eq!(jobs[0]["source"], "config");
    assert_eq!(jobs[0]["schedule"], "30 9 * * 1-5");
    assert_eq!(jobs[0]["timezone"], "Europe/Berlin");
    assert_eq!(jobs[0]["sessionKey"], "agent:default:main");
    drop(gateway);

    let dir =
        home_with("[[gateway.cron]]\nname = \"x\"\nschedule = \"every 61m\"\nprompt = \"p\"\n");
    let (code, stderr) = failed_start(dir.path()).await;
    assert_ne!(code, Some(0));
    assert!(
        stderr
            .contains("config.toml:3:12: gateway.cron[0].schedule: invalid schedule \"every 61m\""),
        "{stderr}"
    );
}
