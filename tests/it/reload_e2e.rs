//! Live edits of config.toml on the real binary: what applies at once, what
//! waits for a restart, what is refused, and how each is reported
//! (`config_reloaded` / `config_rejected` on `/v1/events`, `GET /v1/config`,
//! `/healthz`).

use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};

use crate::support::{command, write_config, Gateway, PATIENCE, TOKEN};
use crate::telegram_e2e::{self, USER};
use crate::webhook_e2e::free_port;
use lemon_tests::fake_telegram::ChatSpec;

/// The gateway-wide events of `/v1/events`, subscribed before an edit is made.
pub(crate) struct Notices {
    response: reqwest::Response,
    parser: lemon_tests::event_stream::EventStream,
    ready: std::collections::VecDeque<(String, Value)>,
}

impl Notices {
    /// Subscribes; once this returns, every later notice is seen.
    pub(crate) async fn subscribe(gateway: &Gateway) -> Notices {
        let response = gateway.get("/v1/events").send().await.unwrap();
        assert_eq!(response.status(), 200);
        Notices {
            response,
            parser: lemon_tests::event_stream::EventStream::default(),
            ready: std::collections::VecDeque::new(),
        }
    }

    /// The next `config_*` event: its type and data.
    pub(crate) async fn next(&mut self) -> (String, Value) {
        tokio::time::timeout(PATIENCE, async {
            loop {
                while let Some((kind, data)) = self.ready.pop_front() {
                    if kind.starts_with("config_") {
                        return (kind, data);
                    }
                }
                let chunk = self.response.chunk().await.unwrap().expect("event stream open");
                for event in self.parser.push(&chunk) {
                    let data: Value = serde_json::from_str(&event.data).unwrap();
                    self.ready.push_back((event.event, data));
                }
            }
        })
        .await
        .expect("a config event in time")
    }
}

async fn config_report(gateway: &Gateway) -> Value {
    let response = gateway.get("/v1/config").send().await.unwrap();
    assert_eq!(response.status(), 200);
    response.json().await.unwrap()
}

async fn health(gateway: &Gateway, detailed: bool) -> Value {
    let mut request = gateway.http.get(format!("{}/healthz", gateway.health));
    if detailed {
        request = request.bearer_auth(TOKEN);
    }
    request.send().await.unwrap().json().await.unwrap()
}

/// Replaces config.toml the way editors do: a new file renamed over the old one.
fn save_by_rename(home: &Path, text: &str) {
    let temp = home.join(".config.toml.swp");
    std::fs::write(&temp, text).unwrap();
    std::fs::rename(&temp, home.join("config.toml")).unwrap();
}

#[tokio::test]
async fn raising_the_cap_starts_queued_runs_and_reports_a_new_generation() {
    let gateway = Gateway::start(
        "[gateway]\nmax_concurrent_runs = 0\n[gateway.engines.echo]\ndelay_ms = 1\n",
    )
    .await;
    assert_eq!(config_report(&gateway).await["generation"], 1);
    let first = gateway.submit(json!({ "prompt": "one", "session_key": "a" })).await;
    let second = gateway.submit(json!({ "prompt": "two", "session_key": "b" })).await;
    assert_eq!(gateway.status().await["scheduler"]["queued"], 2, "no slot: both wait");

    let mut notices = Notices::subscribe(&gateway).await;
    write_config(
        &gateway.home,
        "[gateway]\nmax_concurrent_runs = 2\n[gateway.engines.echo]\ndelay_ms = 1\n",
    );
    let (kind, data) = notices.next().await;
    assert_eq!(kind, "config_reloaded", "{data}");
    assert_eq!(data["generation"], 2);
    assert_eq!(data["applied"], json!(["max_concurrent_runs"]));
    assert_eq!(data["pending_restart"], json!([]));

    assert_eq!(gateway.wait(&first).await["answer"], "one");
    assert_eq!(gateway.wait(&second).await["answer"], "two");
    let report = config_report(&gateway).await;
    assert_eq!(report["generation"], 2);
    assert_eq!(report["effective"]["max_concurrent_runs"], 2);
    assert_eq!(gateway.status().await["scheduler"]["max"], 2);
}

#[tokio::test]
async fn an_engine_section_added_live_is_used_by_the_next_run() {
    let gateway = Gateway::start("[gateway]\ndefault_engine = \"echo\"\n").await;
    let before = gateway.post("/v1/runs").json(&json!({ "prompt": "hi", "engine": "claude" }));
    let response = before.send().await.unwrap();
    if response.status() == 202 {
        let accepted: Value = response.json().await.unwrap();
        let record = gateway.wait(accepted["run_id"].as_str().unwrap()).await;
        assert_ne!(record["status"], "completed", "no claude CLI yet: {record}");
    }

    let fixture =
        format!("{}/fixtures/cli/claude/synth_tool_use_success.jsonl", env!("CARGO_MANIFEST_DIR"));
    let edited = format!(
        "[gateway]\ndefault_engine = \"claude\"\n\
         [gateway.engines.claude]\ncli_path = \"{}\"\nenv = {{ FAKE_CLI_FIXTURE = \"{fixture}\", FAKE_CLI_LINE_DELAY_MS = \"5\" }}\n",
        env!("CARGO_BIN_EXE_fake-cli")
    );
    let mut notices = Notices::subscribe(&gateway).await;
    write_config(&gateway.home, &edited);
    let (kind, data) = notices.next().await;
    assert_eq!(kind, "config_reloaded", "{data}");
    assert_eq!(data["applied"], json!(["default_engine", "engines"]));

    // No engine named: the new default engine, the CLI the new section points at.
    let run_id = gateway.submit(json!({ "prompt": "how many tests?" })).await;
    let record = gateway.wait(&run_id).await;
    assert_eq!(record["status"], "completed", "{record}");
    assert_eq!(record["engine"], "claude", "{record}");
    assert_eq!(record["answer"], "There are 2 test files.");
    assert_eq!(gateway.status().await["default_engine"], "claude");
    // The environment of an engine may hold keys: never shown.
    let report = config_report(&gateway).await;
    assert_eq!(report["effective"]["engines"]["claude"]["env"]["FAKE_CLI_FIXTURE"], "[REDACTED]");
}

#[tokio::test]
async fn a_new_webhook_token_is_accepted_and_the_old_one_refused() {
    let config = |token: &str| {
        format!(
            "[gateway.webhook]\nenabled = true\nport = 0\n\
             [gateway.webhook.integrations.ci]\ntoken = \"{token}\"\nmode = \"sync\"\n"
        )
    };
    let (old, new) = ("webhook-old-token-1234", "webhook-new-token-5678");
    let gateway = Gateway::start(&config(old)).await;
    let post = |url: String, token: &str| {
        gateway
            .http
            .post(url)
            .bearer_auth(token)
            .json(&json!({ "prompt": "ping" }))
            .timeout(PATIENCE)
            .send()
    };
    let response = post(gateway.webhook_url("ci"), old).await.unwrap();
    assert_eq!(response.status(), 200);

    let mut notices = Notices::subscribe(&gateway).await;
    write_config(&gateway.home, &config(new));
    let (kind, data) = notices.next().await;
    assert_eq!(kind, "config_reloaded", "{data}");
    assert_eq!(data["applied"], json!(["webhook"]));
    // The restarted listener binds a port of its own; status names it.
    let (url, accepted) = tokio::time::timeout(PATIENCE, async {
        loop {
            let webhook = gateway.status().await["transports"]["webhook"].clone();
            if let (Some("running"), Some(addr)) =
                (webhook["state"].as_str(), webhook["detail"].as_str())
            {
                let url = format!("http://{addr}/webhooks/ci");
                if let Ok(response) = post(url.clone(), new).await {
                    // 401 is the old listener, not restarted yet.
                    if response.status() != 401 {
                        assert_eq!(response.status(), 200);
                        return (url, response);
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the restarted webhook takes the new token");
    let body: Value = accepted.json().await.unwrap();
    assert_eq!(body["answer"], "ping");
    assert_eq!(post(url, old).await.unwrap().status(), 401, "the old token is refused");
    let report = config_report(&gateway).await;
    assert_eq!(report["effective"]["webhook"]["integrations"]["ci"]["token"], "[REDACTED]");
    assert!(!report.to_string().contains(new), "{report}");
}

#[tokio::test]
async fn telegram_takes_a_new_allowed_chat_list_live() {
    const STRANGER: i64 = 666;
    let fake = telegram_e2e::fake_telegram().await;
    let allowed =
        |ids: &str| telegram_e2e::config(&fake, &format!("allowed_chat_ids = [{ids}]"), "");
    let gateway = telegram_e2e::start(&fake, &allowed(&USER.to_string())).await;
    let user = ChatSpec::private(USER);
    let stranger = ChatSpec::private(STRANGER);
    fake.inject_text(&stranger, STRANGER, "let me in");
    let asked = fake.inject_text(&user, USER, "first");
    telegram_e2e::wait_for_reply(&fake, USER, asked.message_id, "first").await;
    assert!(fake.messages(STRANGER).is_empty(), "not allowed yet");

    let mut notices = Notices::subscribe(&gateway).await;
    write_config(&gateway.home, &allowed(&format!("{USER}, {STRANGER}")));
    let (kind, data) = notices.next().await;
    assert_eq!(kind, "config_reloaded", "{data}");
    assert_eq!(data["applied"], json!(["telegram"]));
    let asked = fake.inject_text(&stranger, STRANGER, "now?");
    telegram_e2e::wait_for_reply(&fake, STRANGER, asked.message_id, "now?").await;
    // The user's chat goes on working through the restart.
    let asked = fake.inject_text(&user, USER, "second");
    telegram_e2e::wait_for_reply(&fake, USER, asked.message_id, "second").await;
    assert!(!config_report(&gateway).await.to_string().contains("test-bot-token"));
}

#[tokio::test]
async fn an_invalid_edit_is_refused_with_its_location_and_the_gateway_keeps_serving() {
    let gateway = Gateway::start("[gateway]\nmax_concurrent_runs = 3\n").await;
    let mut notices = Notices::subscribe(&gateway).await;
    write_config(&gateway.home, "[gateway]\nmax_concurrent_runs = 99999999999999\n");
    let (kind, data) = notices.next().await;
    assert_eq!(kind, "config_rejected", "{data}");
    let error = data["error"].as_str().unwrap();
    assert!(error.contains("config.toml:2:23: gateway.max_concurrent_runs"), "{error}");
    assert!(error.contains("must be at most 4096"), "{error}");

    let report = config_report(&gateway).await;
    assert_eq!(report["generation"], 1, "the last good config stays");
    assert_eq!(report["effective"]["max_concurrent_runs"], 3);
    assert!(report["rejected"]["error"].as_str().unwrap().contains(":2:23:"), "{report}");
    assert_eq!(gateway.status().await["scheduler"]["max"], 3);
    let detailed = health(&gateway, true).await;
    assert_eq!(detailed["status"], "degraded", "{detailed}");
    assert!(detailed["config"]["reason"].as_str().unwrap().contains(":2:23:"), "{detailed}");
    let public = health(&gateway, false).await;
    assert_eq!(public["status"], "degraded", "{public}");
    assert_eq!(public["config"], json!({ "state": "rejected" }), "no detail without the token");
    let run_id = gateway.submit(json!({ "prompt": "still here" })).await;
    assert_eq!(gateway.wait(&run_id).await["answer"], "still here");

    // Fixed: applied, and healthy again.
    write_config(&gateway.home, "[gateway]\nmax_concurrent_runs = 4\n");
    let (kind, data) = notices.next().await;
    assert_eq!(kind, "config_reloaded", "{data}");
    assert_eq!(data["generation"], 2);
    assert_eq!(config_report(&gateway).await["rejected"], Value::Null);
    assert_eq!(health(&gateway, false).await["status"], "healthy");
}

#[tokio::test]
async fn a_save_by_rename_and_an_edit_keeping_size_and_mtime_are_both_picked_up() {
    let gateway = Gateway::start("[gateway]\nmax_concurrent_runs = 3\n").await;
    let mut notices = Notices::subscribe(&gateway).await;
    let mut text = std::fs::read_to_string(gateway.home.join("config.toml")).unwrap();
    text = text.replace("max_concurrent_runs = 3", "max_concurrent_runs = 5");
    save_by_rename(&gateway.home, &text);
    let (kind, data) = notices.next().await;
    assert_eq!(kind, "config_reloaded", "{data}");
    assert_eq!(gateway.status().await["scheduler"]["max"], 5);

    // Same length, modification time put back: only the contents differ.
    let path = gateway.home.join("config.toml");
    let mtime = std::fs::metadata(&path).unwrap().modified().unwrap();
    let edited = text.replace("max_concurrent_runs = 5", "max_concurrent_runs = 6");
    assert_eq!(edited.len(), text.len());
    std::fs::write(&path, &edited).unwrap();
    std::fs::File::options().write(true).open(&path).unwrap().set_modified(mtime).unwrap();
    let (kind, data) = notices.next().await;
    assert_eq!(kind, "config_reloaded", "{data}");
    assert_eq!(data["generation"], 3);
    assert_eq!(gateway.status().await["scheduler"]["max"], 6);
}

#[tokio::test]
async fn a_port_edit_waits_for_a_restart_and_grace_applies_live() {
    let gateway = Gateway::start("[gateway]\nshutdown_grace_ms = 1000\n").await;
    let port = free_port().await;
    let mut notices = Notices::subscribe(&gateway).await;
    write_config(
        &gateway.home,
        &format!("[gateway]\nshutdown_grace_ms = 1000\n[gateway.api]\nport = {port}\n"),
    );
    let (kind, data) = notices.next().await;
    assert_eq!(kind, "config_pending_restart", "nothing applied: {data}");
    assert_eq!(data["applied"], json!([]));
    assert_eq!(data["pending_restart"], json!(["gateway.api.port"]));
    let report = config_report(&gateway).await;
    assert_eq!(report["generation"], 1);
    assert_eq!(
        report["pending_restart"],
        json!([{ "key": "gateway.api.port", "running": 0, "file": port }])
    );
    // Still served where it was.
    assert_eq!(gateway.status().await["scheduler"]["max"], 2);

    write_config(
        &gateway.home,
        &format!("[gateway]\nshutdown_grace_ms = 250\n[gateway.api]\nport = {port}\n"),
    );
    let (kind, data) = notices.next().await;
    assert_eq!(kind, "config_reloaded", "{data}");
    assert_eq!(data["applied"], json!(["shutdown_grace_ms"]));
    assert_eq!(data["pending_restart"], json!(["gateway.api.port"]));
    assert_eq!(config_report(&gateway).await["effective"]["shutdown_grace_ms"], 250);
}

#[tokio::test]
async fn deleting_the_file_keeps_the_running_config() {
    let gateway = Gateway::start("[gateway]\nmax_concurrent_runs = 3\n").await;
    std::fs::remove_file(gateway.home.join("config.toml")).unwrap();
    let report = tokio::time::timeout(PATIENCE, async {
        loop {
            let report = config_report(&gateway).await;
            if report["file_missing"] == true {
                return report;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the deletion is noticed");
    assert_eq!(report["generation"], 1);
    assert_eq!(report["effective"]["max_concurrent_runs"], 3);
    assert_eq!(gateway.status().await["scheduler"]["max"], 3, "not reset to the default");
    assert_eq!(health(&gateway, false).await["status"], "healthy");

    let mut notices = Notices::subscribe(&gateway).await;
    write_config(&gateway.home, "[gateway]\nmax_concurrent_runs = 4\n");
    let (kind, _) = notices.next().await;
    assert_eq!(kind, "config_reloaded");
    assert_eq!(config_report(&gateway).await["file_missing"], false);
}

#[tokio::test]
async fn a_file_emptied_for_good_falls_back_to_the_defaults() {
    let gateway = Gateway::start("[gateway]\nmax_concurrent_runs = 3\n").await;
    let mut notices = Notices::subscribe(&gateway).await;
    std::fs::write(gateway.home.join("config.toml"), "").unwrap();
    let (kind, data) = notices.next().await;
    assert_eq!(kind, "config_reloaded", "{data}");
    assert_eq!(data["applied"], json!(["max_concurrent_runs"]));
    assert_eq!(gateway.status().await["scheduler"]["max"], 2, "the default");
    // The listeners keep the ports they were started on.
    let pending = data["pending_restart"].as_array().unwrap();
    assert!(pending.contains(&json!("gateway.api.port")), "{data}");
}

#[tokio::test]
async fn config_check_and_config_path_on_the_command_line() {
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path(), "[gateway]\nmax_concurrent_runs = 2\n");
    let output = command(dir.path()).args(["config", "path"]).output().await.unwrap();
    assert!(output.status.success());
    let printed = String::from_utf8(output.stdout).unwrap();
    assert_eq!(printed.trim(), dir.path().join("config.toml").display().to_string());

    let output = command(dir.path()).args(["config", "check"]).output().await.unwrap();
    assert!(output.status.success(), "{output:?}");
    let printed = String::from_utf8(output.stdout).unwrap();
    assert!(printed.ends_with("config.toml: ok\n"), "{printed}");
    assert!(
        printed.starts_with(
            "approvals: 3 rules (the defaults) for your runs, 3 rules (the defaults) for untrusted runs\n  \
             see which rule a call hits: lemon-gateway approvals test 'bash: rm -rf build'\n"
        ),
        "{printed}"
    );
    write_config(
        dir.path(),
        "[gateway.approvals]\nrules = []\n[gateway.approvals.engines]\ncodex = [{ tool = \"bash\", action = \"ask\" }]\n",
    );
    let output = command(dir.path()).args(["config", "check"]).output().await.unwrap();
    let printed = String::from_utf8(output.stdout).unwrap();
    assert!(
        printed.starts_with("approvals: 0 rules for your runs, 3 rules (the defaults) for untrusted runs; tried first: engine codex\n"),
        "{printed}"
    );

    let bad = dir.path().join("other.toml");
    std::fs::write(
        &bad,
        "[gateway.webhook]\nenabled = true\n[gateway.webhook.integrations.ci]\nmode = \"sync\"\n",
    )
    .unwrap();
    let output = command(dir.path()).args(["config", "check"]).arg(&bad).output().await.unwrap();
    assert_eq!(output.status.code(), Some(5));
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(stderr.contains("other.toml:"), "{stderr}");
    assert!(stderr.contains("set token or token_secret"), "{stderr}");

    // A misspelt section is not a warning beside an `ok`: all of it would be ignored.
    std::fs::write(&bad, "[gatway]\nmax_concurrent_runs = 4\n").unwrap();
    let output = command(dir.path()).args(["config", "check"]).arg(&bad).output().await.unwrap();
    assert_eq!(output.status.code(), Some(5));
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(
        stderr.contains("other.toml:1:2: gatway: unknown section; did you mean `gateway`?"),
        "{stderr}"
    );
    assert!(!String::from_utf8(output.stdout).unwrap().contains(": ok"));
}

#[tokio::test]
async fn config_check_reads_the_engine_sections() {
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path(), "[gateway.engines.claude]\nmodel = \"opus\"\ntimeout_ms = 600000\n");
    let output = command(dir.path()).args(["config", "check"]).output().await.unwrap();
    assert!(output.status.success(), "{output:?}");

    let bad = dir.path().join("other.toml");
    std::fs::write(&bad, "[gateway.engines.claude]\nmodel = \"--yolo\"\n").unwrap();
    let output = command(dir.path()).args(["config", "check"]).arg(&bad).output().await.unwrap();
    assert_eq!(output.status.code(), Some(5), "a configuration error");
    let stderr = String::from_utf8(output.stderr).unwrap();
    let expected = format!(
        "{}:2:9: gateway.engines.claude.model: invalid model: it starts with '-'",
        bad.display()
    );
    assert!(stderr.contains(&expected), "{stderr}");
}

#[tokio::test]
async fn an_engine_edit_is_checked_by_the_engines_and_shown_as_they_read_it() {
    let gateway = Gateway::start("[gateway.engines.echo]\ndelay_ms = 1\n").await;
    let report = config_report(&gateway).await;
    assert_eq!(report["effective"]["engines"]["echo"]["delay_ms"], 1, "{report}");
    assert_eq!(report["effective"]["engines"]["echo"]["extra_args"], json!([]), "{report}");

    let mut notices = Notices::subscribe(&gateway).await;
    write_config(&gateway.home, "[gateway.engines.echo]\ndelay_ms = 99999999999999\n");
    let (kind, data) = notices.next().await;
    assert_eq!(kind, "config_rejected", "{data}");
    let error = data["error"].as_str().unwrap();
    assert!(
        error.contains(
            "config.toml:2:12: gateway.engines.echo.delay_ms: 99999999999999 is too large"
        ),
        "{error}"
    );

    write_config(&gateway.home, "[gateway.engines.echo]\ndelay_ms = 2\nsteering = false\n");
    let (kind, data) = notices.next().await;
    assert_eq!(kind, "config_reloaded", "{data}");
    assert_eq!(data["applied"], json!(["engines"]));
    let report = config_report(&gateway).await;
    assert_eq!(report["effective"]["engines"]["echo"]["delay_ms"], 2, "{report}");
    assert_eq!(report["effective"]["engines"]["echo"]["steering"], false, "{report}");
    assert!(report["rejected"].is_null(), "{report}");
    let run_id = gateway.submit(json!({ "prompt": "still here" })).await;
    assert_eq!(gateway.wait(&run_id).await["answer"], "still here");
}

#[tokio::test]
async fn an_engine_section_the_engines_refuse_is_rejected_with_its_location() {
    let gateway = Gateway::start("[gateway]\nmax_concurrent_runs = 2\n").await;
    let mut notices = Notices::subscribe(&gateway).await;
    write_config(
        &gateway.home,
        "[gateway]\nmax_concurrent_runs = 3\n[gateway.engines.codex]\nmax_line_bytes = \"lots\"\n",
    );
    let (kind, data) = notices.next().await;
    assert_eq!(kind, "config_rejected", "{data}");
    let error = data["error"].as_str().unwrap();
    assert!(
        error.contains("config.toml:4:18: gateway.engines.codex.max_line_bytes: `max_line_bytes`"),
        "{error}"
    );
    assert_eq!(gateway.status().await["scheduler"]["max"], 2, "nothing of the edit applied");
}

/// After an edit the gateway refused, the command line still finds it (the
/// gateway says where it listens in its home) and `status` says the edit was
/// refused, with a warning naming the bad line.
#[tokio::test]
async fn after_a_refused_edit_the_command_line_finds_the_gateway_and_status_says_so() {
    let gateway = Gateway::start("[gateway]\nmax_concurrent_runs = 2\n").await;
    let mut notices = Notices::subscribe(&gateway).await;
    write_config(&gateway.home, "[gateway]\nmax_concurrent_runs = \"many\"\n");
    let (kind, data) = notices.next().await;
    assert_eq!(kind, "config_rejected", "{data}");

    let mut status = command(&gateway.home);
    status.env_remove("LEMON_URL").arg("status");
    let output = tokio::time::timeout(PATIENCE, status.output()).await.unwrap().unwrap();
    let (stdout, stderr) =
        (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success(), "{stdout}{stderr}");
    assert!(stdout.contains("slots     0 of 2 in use"), "the last good config runs: {stdout}");
    assert!(stdout.contains("config    edit refused at "), "{stdout}");
    assert!(stdout.contains("config.toml:2:23: gateway.max_concurrent_runs"), "{stdout}");
    assert!(stderr.contains("the file has an edit the gateway refused"), "{stderr}");
    gateway.terminate().await;
}
