//! Cron end to end on the real binary: jobs over the API answer in a Telegram
//! chat of the fake Bot API and at a webhook integration's callback URL,
//! survive a restart, come from config.toml (also when it is edited while the
//! gateway runs), and a slot missed while the gateway was down fires once at
//! start.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::routing::post;
use axum::{Json, Router};
use tokio::sync::mpsc;

use lemon_core::cron::jobs::CronJobs;
use lemon_core::store::StoreHandle;
use lemon_tests::fake_telegram::ChatSpec;
use serde_json::{json, Value};

use crate::reload_e2e::Notices;
use crate::support::{failed_start, home_with, write_config, Gateway, PATIENCE};
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

/// A callback receiver on 127.0.0.1 that takes every POST with a 200, counts
/// them and hands their bodies over.
async fn callback_receiver() -> (String, Arc<AtomicUsize>, mpsc::UnboundedReceiver<Value>) {
    let taken = Arc::new(AtomicUsize::new(0));
    let (tx, rx) = mpsc::unbounded_channel();
    let counter = taken.clone();
    let app = Router::new().route(
        "/hook-answers",
        post(move |Json(body): Json<Value>| {
            let (counter, tx) = (counter.clone(), tx.clone());
            async move {
                counter.fetch_add(1, Ordering::SeqCst);
                let _ = tx.send(body);
                axum::http::StatusCode::OK
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook-answers?sig=cron-cb-7e1", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, taken, rx)
}

#[tokio::test]
async fn a_job_in_a_webhook_session_is_delivered_to_its_callback_once() {
    let (url, taken, mut bodies) = callback_receiver().await;
    let config = format!(
        "[gateway]\ndefault_engine = \"echo\"\nenable_webhook = true\n\
         [gateway.webhook]\nport = 0\nallow_private_callback_hosts = true\n\
         callback_backoff_ms = 20\n\
         [gateway.webhook.integrations.ci]\ntoken = \"cron-hook-token-3a9\"\ncallback_url = \"{url}\"\n"
    );
    let gateway = Gateway::start(&config).await;
    tokio::time::timeout(PATIENCE, async {
        while gateway.status().await["transports"]["webhook"]["state"] != "running" {
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    })
    .await
    .expect("the webhook comes up in time");
    let job = gateway
        .cron_create(json!({"name": "build report", "schedule": "every 30m", "prompt": "the nightly build is green", "sessionKey": "webhook:ci"}))
        .await;
    let id = job["id"].as_str().unwrap();
    let response = gateway.post(&format!("/v1/cron/{id}/run")).send().await.unwrap();
    assert_eq!(response.status(), 202);
    let body =
        tokio::time::timeout(PATIENCE, bodies.recv()).await.expect("the callback in time").unwrap();
    assert_eq!(body["integration_id"], "ci");
    assert_eq!(body["session_key"], "webhook:ci");
    assert_eq!(body["completed"]["ok"], true, "{body}");
    assert_eq!(body["completed"]["answer"], "the nightly build is green");
    let runs = gateway.cron_runs_until(id, ended).await;
    assert_eq!(runs.len(), 1);
    assert_eq!(body["run_id"], runs[0]["routerRunId"]);
    // A stop finishes what is under way: nothing was sent twice.
    assert!(gateway.terminate().await.success());
    assert_eq!(taken.load(Ordering::SeqCst), 1);
    assert!(bodies.try_recv().is_err());
}

/// Replaces config.toml in one step (a new file renamed over it), so the
/// gateway never reads half of it.
fn save_config(home: &std::path::Path, config: &str) {
    let staged = tempfile::tempdir_in(home).unwrap();
    write_config(staged.path(), config);
    std::fs::rename(staged.path().join("config.toml"), home.join("config.toml")).unwrap();
}

#[tokio::test]
async fn config_jobs_follow_edits_of_config_toml() {
    let job = |name: &str, prompt: &str| {
        format!("[[gateway.cron]]\nname = \"{name}\"\nschedule = \"daily at 9am\"\nprompt = \"{prompt}\"\n")
    };
    let base = "[gateway]\ndefault_engine = \"echo\"\n\n";
    let gateway = Gateway::start(&format!("{base}{}", job("report", "weekly report"))).await;
    let names = |jobs: &[Value]| {
        let mut names: Vec<String> =
            jobs.iter().map(|j| j["name"].as_str().unwrap().to_owned()).collect();
        names.sort();
        names
    };
    assert_eq!(names(&gateway.cron_list().await), ["report"]);
    // A job of the API's is not the config's to remove.
    gateway
        .cron_create(json!({"name": "mine", "schedule": "@daily", "prompt": "p", "session_key": "agent:ops:main"}))
        .await;

    let mut notices = Notices::subscribe(&gateway).await;
    let edited =
        format!("{base}{}{}", job("report", "weekly report"), job("digest", "daily digest"));
    save_config(&gateway.home, &edited);
    let (kind, data) = notices.next().await;
    assert_eq!(kind, "config_reloaded", "{data}");
    assert_eq!(data["applied"], json!(["cron"]));
    let jobs = gateway.cron_list().await;
    assert_eq!(names(&jobs), ["digest", "mine", "report"]);
    let digest = jobs.iter().find(|j| j["name"] == "digest").unwrap();
    assert_eq!(digest["source"], "config");
    assert_eq!(digest["prompt"], "daily digest");
    assert_eq!(digest["schedule"], "0 9 * * *");

    save_config(&gateway.home, &format!("{base}{}", job("digest", "daily digest")));
    let (kind, data) = notices.next().await;
    assert_eq!(kind, "config_reloaded", "{data}");
    assert_eq!(data["applied"], json!(["cron"]));
    assert_eq!(names(&gateway.cron_list().await), ["digest", "mine"]);
}
