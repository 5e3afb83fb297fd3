//! The real binary on a PostgreSQL store (`[gateway.store] backend =
//! "postgres"`), against the tests' own server (`scripts/postgres`, named by
//! `LEMON_TEST_POSTGRES_URL`): runs, `kill -9` and the restart's recovery
//! behave as on SQLite; status, metrics and `doctor` name the database
//! without its login; a wrong login stops the start with a clear error; the
//! connection string's password is never logged.

use std::path::Path;
use std::process::Stdio;

use lemon_core::store::postgres::testing::{fresh_database, server_url};
use serde_json::{json, Value};

use crate::support::{command, home_with, output_text, Gateway};

/// The secret that holds the connection string.
const URL_SECRET: &str = "store_url";

/// A home whose store is a fresh database on the tests' server, with `extra`
/// config; `None` (the test is skipped) when no server is configured, which
/// `LEMON_REQUIRE_POSTGRES=1` (set by `scripts/test`) turns into a failure.
async fn postgres_home(extra: &str) -> Option<(tempfile::TempDir, String)> {
    let server = server_url()?;
    let url = fresh_database(&server).await;
    let home = home_with(&format!(
        "[gateway.store]\nbackend = \"postgres\"\nurl_secret = \"{URL_SECRET}\"\npool_size = 4\n{extra}"
    ));
    write_secret(home.path(), &url);
    Some((home, url))
}

fn write_secret(home: &Path, url: &str) {
    use std::os::unix::fs::PermissionsExt;
    let path = home.join("secrets.toml");
    std::fs::write(&path, format!("{URL_SECRET} = \"{url}\"\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

/// The password in a `postgresql://user:password@host…` string.
fn password_of(url: &str) -> String {
    let login = url.split("://").nth(1).unwrap().split('@').next().unwrap();
    login.split(':').nth(1).expect("the tests' server has a password").to_owned()
}

/// `postgres://host:port/database` of a connection string: what the gateway shows.
fn target_of(url: &str) -> String {
    let rest = url.split('@').nth(1).unwrap();
    format!("postgres://{}", rest.split('?').next().unwrap())
}

#[tokio::test]
async fn a_gateway_on_postgres_recovers_acknowledged_runs_after_kill_9_and_never_logs_the_password()
{
    let Some((home, url)) = postgres_home("[gateway.engines.echo]\ndelay_ms = 20\n").await else {
        return;
    };
    // One log a start: each is searched for its own ready line.
    let log = |n: usize| home.path().join(format!("gateway-{n}.log"));
    let mut accepted = Vec::new();
    for n in 0..4 {
        let mut gateway =
            Gateway::spawn_logging_to(command(home.path()), home.path(), &log(n)).await;
        let run_id = format!("pg-acked-{n}");
        let body = json!({ "prompt": format!("acknowledged {n}"), "run_id": run_id });
        let response = gateway.post("/v1/runs").json(&body).send().await.unwrap();
        // SIGKILL the moment the acknowledgement's status line has arrived.
        gateway.child.start_kill().unwrap();
        assert_eq!(response.status(), 202, "{run_id} accepted");
        gateway.child.wait().await.unwrap();
        accepted.push(run_id);
    }
    let gateway = Gateway::spawn_logging_to(command(home.path()), home.path(), &log(4)).await;
    for run_id in &accepted {
        let events = gateway.events(run_id).await;
        let completions = events.iter().filter(|(kind, _)| kind == "run_completed").count();
        assert_eq!(completions, 1, "{run_id}: {events:?}");
        let record = gateway.run(run_id).await;
        let finished = record["status"] == "completed"
            || (record["status"] == "cancelled" && record["error_code"] == "interrupted");
        assert!(finished, "{run_id} ran after the restart, or was interrupted: {record}");
    }
    // A new run on the recovered gateway, start to end.
    let run_id = gateway.submit(json!({ "prompt": "after the kills" })).await;
    let events = gateway.events(&run_id).await;
    let (_, completed) = events.last().unwrap();
    assert_eq!(completed["answer"], "after the kills", "{completed}");

    let status = gateway.status().await;
    let store = &status["store"];
    assert_eq!(store["backend"], "postgres", "{store}");
    assert_eq!(store["path"], target_of(&url), "{store}");
    assert_eq!(store["writable"], true, "{store}");
    assert!(store["bytes"].as_u64().unwrap() > 0, "{store}");
    assert_eq!(store["log_bytes"], Value::Null, "{store}");
    assert!(store["rows"]["runs"].as_u64().unwrap() >= 5, "{store}");
    let metrics =
        reqwest::get(format!("{}/metrics", gateway.health)).await.unwrap().text().await.unwrap();
    let bytes = metrics
        .lines()
        .find_map(|line| line.strip_prefix("lemon_store_bytes "))
        .expect("lemon_store_bytes in /metrics");
    assert!(bytes.parse::<u64>().unwrap() > 0, "{bytes}");

    let password = password_of(&url);
    for n in 0..5 {
        let logged = std::fs::read_to_string(log(n)).unwrap();
        assert!(!logged.contains(&password), "the log of start {n} holds the database password");
    }
}

#[tokio::test]
async fn a_wrong_password_stops_the_start_naming_the_database_and_not_the_login() {
    let Some((home, url)) = postgres_home("").await else { return };
    let password = password_of(&url);
    let wrong = url.replacen(&format!(":{password}@"), ":not-the-password-5e1f@", 1);
    write_secret(home.path(), &wrong);
    let (code, stderr) = crate::support::failed_start(home.path()).await;
    assert_ne!(code, Some(0), "{stderr}");
    assert!(stderr.contains(&target_of(&url)), "{stderr}");
    assert!(stderr.contains("the server refused the login: wrong password"), "{stderr}");
    assert!(!stderr.contains("not-the-password-5e1f"), "{stderr}");
    assert!(!stderr.contains(&password), "{stderr}");

    // `doctor` says the same, as a failed check.
    let mut doctor = command(home.path());
    doctor.env("NO_COLOR", "1").arg("doctor");
    let (ok, report) = output_text(doctor).await;
    assert!(!ok, "{report}");
    let line = report.lines().find(|line| line.contains("store")).expect("a store line");
    assert!(line.contains("the server refused the login: wrong password"), "{report}");
    assert!(!report.contains("not-the-password-5e1f"), "{report}");
}

#[tokio::test]
async fn doctor_reports_a_reachable_postgres_store_and_backup_points_at_pg_dump() {
    let Some((home, url)) = postgres_home("").await else { return };
    let mut doctor = command(home.path());
    doctor.env("NO_COLOR", "1").arg("doctor");
    let (_, report) = output_text(doctor).await;
    let line = report.lines().find(|line| line.contains("takes writes")).unwrap_or_else(|| {
        panic!("no store line in the report:\n{report}");
    });
    assert!(line.contains(&format!("postgres {}", target_of(&url))), "{line}");
    assert!(!report.contains(&password_of(&url)), "{report}");

    // Beside the gateway that holds the database, doctor still gets in.
    let gateway = Gateway::start_in(home.path()).await;
    let mut doctor = command(home.path());
    doctor.env("NO_COLOR", "1").arg("doctor");
    let (_, report) = output_text(doctor).await;
    assert!(report.contains("takes writes"), "{report}");
    drop(gateway);

    let mut backup = command(home.path());
    backup.arg("backup").arg(home.path().join("copy.db")).stdin(Stdio::null());
    let (ok, text) = output_text(backup).await;
    assert!(!ok, "{text}");
    assert!(text.contains("the store is PostgreSQL"), "{text}");
    assert!(text.contains("pg_dump"), "{text}");
    assert!(!home.path().join("copy.db").exists());
}

#[tokio::test]
async fn a_second_gateway_on_the_same_database_is_refused_while_the_first_runs() {
    let Some((first_home, url)) = postgres_home("").await else { return };
    let first = Gateway::start_in(first_home.path()).await;
    let second_home = home_with(&format!(
        "[gateway.store]\nbackend = \"postgres\"\nurl_secret = \"{URL_SECRET}\"\n"
    ));
    write_secret(second_home.path(), &url);
    let (code, stderr) = crate::support::failed_start(second_home.path()).await;
    assert_ne!(code, Some(0), "{stderr}");
    assert!(stderr.contains("another gateway uses this database"), "{stderr}");
    assert!(stderr.contains(&target_of(&url)), "{stderr}");
    assert!(!stderr.contains(&password_of(&url)), "{stderr}");
    // The first still serves.
    let run_id = first.submit(json!({ "prompt": "still here" })).await;
    let events = first.events(&run_id).await;
    assert_eq!(events.last().unwrap().1["answer"], "still here");
}

/// A PostgreSQL server of the test's own (`scripts/postgres`), so that it can
/// be restarted without touching the other tests' server; stopped on drop.
struct OwnServer {
    dir: tempfile::TempDir,
    url: String,
}

impl OwnServer {
    async fn start() -> OwnServer {
        let dir = tempfile::tempdir().unwrap();
        let output = tokio::process::Command::new(postgres_script())
            .arg("start")
            .arg(dir.path().join("pg"))
            .output()
            .await
            .unwrap();
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        let url = String::from_utf8(output.stdout).unwrap().trim().to_owned();
        OwnServer { dir, url }
    }

    /// `pg_ctl restart -m immediate`: every connection is cut, and the server
    /// recovers from its log as after a crash.
    async fn restart_immediately(&self) {
        let status = tokio::process::Command::new(postgres_script())
            .arg("restart")
            .arg(self.dir.path().join("pg"))
            .status()
            .await
            .unwrap();
        assert!(status.success());
    }
}

impl Drop for OwnServer {
    fn drop(&mut self) {
        let _ = std::process::Command::new(postgres_script())
            .arg("stop")
            .arg(self.dir.path().join("pg"))
            .status();
    }
}

fn postgres_script() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/postgres")
}

/// The server restarts (`-m immediate`) while messages arrive and runs write
/// their events: a submit the store could not make durable is refused with
/// 503 and never runs; every one acknowledged completes exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_restart_mid_traffic_loses_and_repeats_nothing() {
    if server_url().is_none() {
        return;
    }
    let server = OwnServer::start().await;
    let home = home_with(&format!(
        "[gateway]\nmax_concurrent_runs = 4\n[gateway.store]\nbackend = \"postgres\"\nurl_secret = \"{URL_SECRET}\"\n[gateway.engines.echo]\ndelay_ms = 30\n"
    ));
    write_secret(home.path(), &server.url);
    let gateway = Gateway::start_in(home.path()).await;
    let (mut accepted, mut refused) = (Vec::new(), 0);
    for n in 0..60 {
        if n == 20 {
            server.restart_immediately().await;
        }
        let body = json!({ "prompt": format!("message {n}"), "run_id": format!("pg-restart-{n}") });
        let response = gateway.post("/v1/runs").json(&body).send().await.unwrap();
        match response.status().as_u16() {
            202 => accepted.push(format!("pg-restart-{n}")),
            503 => {
                let error: Value = response.json().await.unwrap();
                assert!(error["error"].as_str().is_some_and(|e| !e.is_empty()), "{error}");
                refused += 1;
            }
            other => panic!("submit {n}: {other} {}", response.text().await.unwrap()),
        }
    }
    assert!(accepted.len() >= 20, "accepted {} of 60, refused {refused}", accepted.len());
    for run_id in &accepted {
        let events = gateway.events(run_id).await;
        let completions = events.iter().filter(|(kind, _)| kind == "run_completed").count();
        assert_eq!(completions, 1, "{run_id}: {events:?}");
    }
    // Durable, and only what was acknowledged: once the store says it saves
    // (a write behind everything queued committed), a kill and a restart
    // recover nothing again and no refused submit runs.
    let status = gateway.status().await;
    assert_eq!(status["store"]["writable"], true, "{status}");
    let mut gateway = gateway;
    gateway.child.kill().await.unwrap();
    let gateway = Gateway::start_in(home.path()).await;
    let runs: Value = gateway.get("/v1/runs?limit=200").send().await.unwrap().json().await.unwrap();
    for run in runs["runs"].as_array().unwrap() {
        let id = run["run_id"].as_str().unwrap();
        if accepted.iter().any(|a| a == id) {
            assert_eq!(run["status"], "completed", "{run}");
        } else {
            assert_ne!(run["status"], "completed", "a refused submit ran: {run}");
            assert_ne!(run["status"], "running", "a refused submit runs: {run}");
        }
    }
    let status = gateway.status().await;
    assert_eq!(status["store"]["writable"], true, "{status}");
}
