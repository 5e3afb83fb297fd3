//! The store under faults, with the real binary: its disk full (the home on a
//! small tmpfs, as root; skipped with a message where mounting is refused,
//! failed instead under `LEMON_REQUIRE_TMPFS=1`) and
//! its file locked by another process holding SQLite's write lock. A request
//! that cannot be journaled is refused with a clear error instead of being
//! accepted and lost, nothing already accepted is lost, and once the disk has
//! room or the lock is released the gateway accepts and answers again.
//!
//! With the disk full, the gateway's own log on that disk too (as a service
//! manager or `nohup` would write it) costs no answer: `/healthz` says 503
//! with the store check failing, runs are still listed, a submit is a 503
//! with a JSON error. A chat (Telegram, SMS) is told once per conversation,
//! in plain words, and answered again once there is room.

use std::process::Stdio;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader};

use lemon_tests::fake_telegram::ChatSpec;
use lemon_tests::fake_twilio::FakeTwilio;

use crate::sms_e2e::{
    deliver, inbound, sms_addr, sms_config, write_secrets, ACCOUNT_SID, AUTH_TOKEN, FRIEND,
};
use crate::support::{command, write_config, Gateway, PATIENCE, TOKEN};
use crate::telegram_e2e::{config as telegram_config, fake_telegram, wait_for_reply, USER};

/// Submits `body`; the status and the JSON answer.
async fn submit(gateway: &Gateway, body: &Value) -> (u16, Value) {
    let response = gateway.post("/v1/runs").json(body).timeout(PATIENCE).send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// A tmpfs of `size` mounted on a new directory, unmounted on drop.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(size: &str) -> Result<Tmpfs, String> {
        let dir = tempfile::tempdir().unwrap();
        let output = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size},mode=0700"), "tmpfs"])
            .arg(dir.path())
            .output()
            .map_err(|err| format!("mount could not run: {err}"))?;
        if !output.status.success() {
            return Err(String::from_utf8_lossy(&output.stderr).trim().to_owned());
        }
        Ok(Tmpfs { dir })
    }

    /// Takes every block still free with a file: no write on the disk can
    /// find room until it grows.
    fn fill(&self) {
        use std::io::Write;
        let mut filler = std::fs::File::create(self.dir.path().join("filler")).unwrap();
        let block = vec![0u8; 4096];
        loop {
            match filler.write(&block) {
                Ok(0) => return,
                Ok(_) => {}
                Err(err) if err.raw_os_error() == Some(libc::ENOSPC) => return,
                Err(err) => panic!("filling the disk: {err}"),
            }
        }
    }

    fn resize(&self, size: &str) {
        let status = std::process::Command::new("mount")
            .args(["-o", &format!("remount,size={size}")])
            .arg(self.dir.path())
            .status()
            .unwrap();
        assert!(status.success(), "remount with {size}");
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg("-l").arg(self.dir.path()).status();
    }
}

#[tokio::test]
async fn a_full_disk_refuses_new_requests_clearly_and_loses_no_accepted_one() {
    let test = "the full-disk test";
    let Some(tmpfs) = tmpfs_or_skip("3m", test) else { return };
    let home = tmpfs.dir.path();
    write_config(home, "[gateway]\nmax_concurrent_runs = 0\n");
    let gateway = Gateway::start_in(home).await;
    // Queued requests with big prompts fill the disk.
    let big = "x".repeat(64 * 1024);
    let mut accepted = Vec::new();
    let refused = tokio::time::timeout(PATIENCE, async {
        for n in 0..200 {
            let (status, body) = submit(
                &gateway,
                &json!({ "prompt": format!("{n} {big}"), "session_key": format!("s{n}") }),
            )
            .await;
            if status != 202 {
                return (status, body);
            }
            accepted.push(body["run_id"].as_str().unwrap().to_owned());
        }
        panic!("3 MiB took 200 prompts of 64 KiB");
    })
    .await
    .expect("the disk fills in time");
    let (status, body) = refused;
    assert_eq!(status, 503, "a full store is a temporary refusal: {body}");
    let error = body["error"].as_str().unwrap_or_default();
    assert!(error.contains("could not be stored"), "a clear error: {body}");
    assert!(!accepted.is_empty());

    // Room again: the gateway accepts, and every accepted request is there.
    tmpfs.resize("64m");
    let (status, body) = submit(&gateway, &json!({ "prompt": "after", "session_key": "t" })).await;
    assert_eq!(status, 202, "{body}");
    // Every accepted request is in the journal: after a restart each one is
    // there, waiting for its slot.
    gateway.terminate().await;
    let gateway = Gateway::start_in(home).await;
    for run_id in &accepted {
        let record = gateway.run(run_id).await;
        assert_eq!(record["run_id"], run_id.as_str(), "{record}");
        assert_eq!(record["status"], "queued", "{record}");
    }
    gateway.terminate().await;
}

/// Another process with SQLite's write lock on `db` until its stdin closes.
async fn hold_write_lock(db: &std::path::Path) -> tokio::process::Child {
    let script = "import sqlite3, sys\n\
                  c = sqlite3.connect(sys.argv[1], isolation_level=None)\n\
                  c.execute('BEGIN IMMEDIATE')\n\
                  print('locked', flush=True)\n\
                  sys.stdin.read()\n\
                  c.execute('ROLLBACK')\n";
    let mut child = tokio::process::Command::new("python3")
        .args(["-c", script])
        .arg(db)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(PATIENCE, lines.next_line()).await.unwrap().unwrap();
    assert_eq!(line.as_deref(), Some("locked"));
    child
}

#[tokio::test]
async fn a_store_locked_by_another_process_refuses_clearly_and_recovers_when_released() {
    let gateway = Gateway::start("[gateway.engines.echo]\ndelay_ms = 0\n").await;
    let before = gateway.submit(json!({ "prompt": "before the lock" })).await;
    assert_eq!(gateway.wait(&before).await["status"], "completed");

    let mut holder = hold_write_lock(&gateway.home.join("lemon.db")).await;
    let started = tokio::time::Instant::now();
    let (status, body) = submit(&gateway, &json!({ "prompt": "while locked" })).await;
    assert_eq!(status, 503, "{body}");
    assert!(body["error"].as_str().unwrap_or_default().contains("could not be stored"), "{body}");
    // Not at once: the store waited for the lock (its busy timeout) first.
    assert!(started.elapsed() >= Duration::from_secs(4), "{:?}", started.elapsed());

    drop(holder.stdin.take());
    let _ = tokio::time::timeout(PATIENCE, holder.wait()).await;
    let after = gateway.submit(json!({ "prompt": "after the lock" })).await;
    let record = gateway.wait(&after).await;
    assert_eq!(record["status"], "completed", "{record}");
    assert_eq!(record["answer"], "after the lock", "{record}");
    gateway.terminate().await;
}

/// A tmpfs of `size`, or `None` where mounting is refused (not root, or no
/// tmpfs here): the fault cannot be made, and `test` is skipped, or fails
/// under `LEMON_REQUIRE_TMPFS=1`.
fn tmpfs_or_skip(size: &str, test: &str) -> Option<Tmpfs> {
    match Tmpfs::mount(size) {
        Ok(tmpfs) => Some(tmpfs),
        Err(why) => {
            let need =
                format!("a tmpfs it mounts (as root) for {test}; mounting one failed: {why}");
            lemon_tests::host::lacks("LEMON_REQUIRE_TMPFS", &need);
            None
        }
    }
}

/// A request's status and JSON body; a dropped connection or a body that is
/// not JSON fails the test with `what`.
async fn answer(request: reqwest::RequestBuilder, what: &str) -> (u16, Value) {
    let response = request
        .timeout(PATIENCE)
        .send()
        .await
        .unwrap_or_else(|err| panic!("{what}: no answer (a dropped connection?): {err}"));
    let status = response.status().as_u16();
    let text = response.text().await.unwrap_or_else(|err| panic!("{what}: body cut: {err}"));
    let body = serde_json::from_str(&text).unwrap_or_else(|err| {
        panic!("{what}: {status} with a body that is not JSON ({err}): {text}")
    });
    (status, body)
}

/// `/healthz`, with the API token when `token`.
async fn healthz(gateway: &Gateway, token: bool) -> (u16, Value) {
    let mut request = gateway.http.get(format!("{}/healthz", gateway.health));
    if token {
        request = request.bearer_auth(TOKEN);
    }
    answer(request, "GET /healthz").await
}

/// The `store` check of a `/healthz` body.
fn store_check(body: &Value) -> &Value {
    body["checks"]
        .as_array()
        .and_then(|checks| checks.iter().find(|check| check["name"] == "store"))
        .unwrap_or_else(|| panic!("a store check: {body}"))
}

/// Fills the disk of a gateway whose intake is paused (so no run finishes
/// and frees a page the store could reuse) while requests come in: big ones
/// until the first is refused, a file over the rest, then small ones until
/// those are refused too and the health check's write fails. The ids of the
/// requests accepted on the way.
async fn fill_under_traffic(gateway: &Gateway, tmpfs: &Tmpfs) -> Vec<String> {
    let mut accepted = Vec::new();
    let big = "x".repeat(64 * 1024);
    let mut refused = None;
    for n in 0..200 {
        let body = json!({ "prompt": format!("{n} {big}"), "session_key": format!("s{n}") });
        let (status, body) = submit(gateway, &body).await;
        if status != 202 {
            refused = Some((status, body));
            break;
        }
        accepted.push(body["run_id"].as_str().unwrap().to_owned());
    }
    let (status, body) = refused.expect("3 MiB took 200 prompts of 64 KiB");
    assert_eq!(status, 503, "a full store is a temporary refusal: {body}");
    tmpfs.fill();
    // A refused write may leave room in the store's log that a smaller one fits in.
    let mut small_refused = false;
    for n in 0..1000 {
        let body = json!({ "prompt": format!("small {n}"), "session_key": format!("small{n}") });
        let (status, body) = submit(gateway, &body).await;
        if status != 202 {
            assert_eq!(status, 503, "{body}");
            small_refused = true;
            break;
        }
        accepted.push(body["run_id"].as_str().unwrap().to_owned());
    }
    assert!(small_refused, "small requests found room for 1000 prompts on a full disk");
    // Each passing health check writes too, so this ends.
    let mut failing = false;
    for _ in 0..1000 {
        if healthz(gateway, false).await.0 == 503 {
            failing = true;
            break;
        }
    }
    assert!(failing, "the store's health check passed 1000 times on a full disk");
    accepted
}

#[tokio::test]
async fn a_full_disk_that_holds_the_log_too_answers_every_request_and_recovers() {
    let test = "the full-disk test with the log on the disk";
    let Some(tmpfs) = tmpfs_or_skip("3m", test) else { return };
    let home = tmpfs.dir.path();
    write_config(home, "[gateway.engines.echo]\ndelay_ms = 0\n");
    let log = home.join("gateway.log");
    // Every request logs: the log is written all the time the disk is full.
    let mut gateway_command = command(home);
    gateway_command.env("LEMON_LOG", "info");
    let gateway = Gateway::spawn_logging_to(gateway_command, home, &log).await;
    let (status, body) = answer(gateway.post("/v1/intake/pause"), "pause").await;
    assert_eq!(status, 200, "{body}");
    let accepted = fill_under_traffic(&gateway, &tmpfs).await;
    assert!(!accepted.is_empty());

    // Full: every request is answered, in JSON.
    let (status, body) = healthz(&gateway, false).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["ok"], false, "{body}");
    assert_eq!(store_check(&body)["ok"], false, "{body}");
    let (status, body) = healthz(&gateway, true).await;
    assert_eq!(status, 503, "{body}");
    let check = store_check(&body);
    assert_eq!(check["ok"], false, "{body}");
    assert!(!check["error"].as_str().unwrap_or_default().is_empty(), "why, with the token: {body}");
    let (status, body) = answer(gateway.get("/v1/runs?limit=1000"), "GET /v1/runs").await;
    assert_eq!(status, 200, "{body}");
    let listed = body["runs"].as_array().unwrap().len();
    assert_eq!(listed, accepted.len(), "every accepted request is listed: {body}");
    let (status, body) = answer(
        gateway.post("/v1/runs").json(&json!({ "prompt": "while full", "session_key": "full" })),
        "POST /v1/runs",
    )
    .await;
    assert_eq!(status, 503, "{body}");
    assert!(body["error"].as_str().unwrap_or_default().contains("could not be stored"), "{body}");

    // Room again: the gateway accepts and answers, and says it is healthy.
    tmpfs.resize("64m");
    let (status, body) = answer(gateway.post("/v1/intake/resume"), "resume").await;
    assert_eq!(status, 200, "{body}");
    let after = gateway.submit(json!({ "prompt": "after the disk was full" })).await;
    let record = gateway.wait(&after).await;
    assert_eq!(record["answer"], "after the disk was full", "{record}");
    let (status, body) = healthz(&gateway, true).await;
    assert_eq!(status, 200, "{body}");
    // Nothing accepted before was lost or doubled: each ran once, to its end.
    for run_id in &accepted {
        let record = gateway.wait(run_id).await;
        assert_eq!(record["status"], "completed", "{record}");
    }
    let (_, body) = answer(gateway.get("/v1/runs?limit=1000"), "GET /v1/runs").await;
    let mut ids: Vec<&str> = body["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|run| run["run_id"].as_str().unwrap())
        .collect();
    ids.sort_unstable();
    let mut expected: Vec<&str> = accepted.iter().map(String::as_str).collect();
    expected.push(after.as_str());
    expected.sort_unstable();
    assert_eq!(ids, expected);
    gateway.terminate().await;
}

/// What a chat is told when the store cannot save its message.
const NOTICE: &str = "The gateway cannot save messages right now (its storage is failing), \
                      so nothing was accepted. Please send it again later.";

/// Waits until `log` holds `needle` `count` times.
async fn wait_for_log(log: &std::path::Path, needle: &str, count: usize) {
    let found = tokio::time::timeout(PATIENCE, async {
        while std::fs::read_to_string(log).unwrap_or_default().matches(needle).count() < count {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    let text = std::fs::read_to_string(log).unwrap_or_default();
    assert!(found.is_ok(), "{needle:?} {count} times in the log:\n{text}");
}

/// The prompts of the runs the gateway holds.
async fn prompts(gateway: &Gateway) -> Vec<String> {
    let (status, body) = answer(gateway.get("/v1/runs?limit=1000"), "GET /v1/runs").await;
    assert_eq!(status, 200, "{body}");
    body["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|run| run["prompt"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn a_chat_is_told_once_that_the_disk_is_full_and_answered_again_once_it_has_room() {
    let test = "the full-disk test of the chat channels";
    let Some(tmpfs) = tmpfs_or_skip("3m", test) else { return };
    let home = tmpfs.dir.path();
    let telegram = fake_telegram().await;
    telegram.add_chat(&ChatSpec::private(USER));
    let twilio = FakeTwilio::start(ACCOUNT_SID, AUTH_TOKEN).await;
    let config = format!(
        "{}\n{}",
        telegram_config(&telegram, "", "[gateway.engines.echo]\ndelay_ms = 0\n"),
        sms_config(&twilio, "reply_to_allowed = true\n")
    );
    write_config(home, &config);
    write_secrets(home, "");
    // The log off the full disk: it tells when each refused message was handled.
    let logs = tempfile::tempdir().unwrap();
    let log = logs.path().join("gateway.log");
    let gateway = Gateway::spawn_logging_to(command(home), home, &log).await;
    telegram.wait_until("the bot's commands", PATIENCE, |s| s.commands().len() == 4).await;
    let sms = sms_addr(&gateway).await;
    let (status, body) = answer(gateway.post("/v1/intake/pause"), "pause").await;
    assert_eq!(status, 200, "{body}");
    fill_under_traffic(&gateway, &tmpfs).await;

    // Two messages from each chat while the store fails: one notice each.
    // The messages are longer than the small requests the disk refused.
    let long = "please keep this in mind ".repeat(80);
    let first = telegram.inject_text(&ChatSpec::private(USER), USER, &format!("first {long}"));
    let second = telegram.inject_text(&ChatSpec::private(USER), USER, &format!("second {long}"));
    let notice = wait_for_reply(&telegram, USER, first.message_id, "cannot save").await;
    assert_eq!(notice.text, NOTICE);
    deliver(&sms, &inbound("SM00000000000000000000000000000001", FRIEND, &format!("one {long}")))
        .await;
    deliver(&sms, &inbound("SM00000000000000000000000000000002", FRIEND, &format!("two {long}")))
        .await;
    let texted = twilio.wait_for_requests(1, PATIENCE).await;
    assert_eq!(texted[0].field("Body"), Some(NOTICE), "{texted:?}");
    // Both messages of each chat were refused before the disk has room.
    wait_for_log(&log, "message not accepted", 2).await;
    wait_for_log(&log, "an SMS was not accepted", 2).await;

    // Room again: the next message of each chat is accepted and answered.
    tmpfs.resize("64m");
    let (status, body) = answer(gateway.post("/v1/intake/resume"), "resume").await;
    assert_eq!(status, 200, "{body}");
    let third = telegram.inject_text(&ChatSpec::private(USER), USER, "third, with room");
    wait_for_reply(&telegram, USER, third.message_id, "third, with room").await;
    deliver(&sms, &inbound("SM00000000000000000000000000000003", FRIEND, "three, with room")).await;
    let texted = twilio.wait_for_requests(2, PATIENCE).await;
    let bodies: Vec<&str> = texted.iter().filter_map(|r| r.field("Body")).collect();
    // The second message of each chat got no notice of its own.
    assert_eq!(bodies, [NOTICE, "three, with room"]);
    let notices = telegram.messages(USER).into_iter().filter(|m| m.text == NOTICE).count();
    assert_eq!(notices, 1, "{}", telegram.describe_calls());
    assert!(
        telegram.messages(USER).iter().all(|m| m.reply_to != Some(second.message_id)),
        "{}",
        telegram.describe_calls()
    );
    // The refused messages were not accepted; the ones with room were, once.
    let prompts = prompts(&gateway).await;
    for refused in ["first ", "second ", "one ", "two "] {
        assert!(!prompts.iter().any(|p| p.starts_with(refused)), "{refused}: {prompts:?}");
    }
    for taken in ["third, with room", "three, with room"] {
        assert_eq!(prompts.iter().filter(|p| *p == taken).count(), 1, "{taken}: {prompts:?}");
    }
    gateway.terminate().await;
}
