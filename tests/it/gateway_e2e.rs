//! The headless gateway end to end: the real binary, its API, its CLI and its
//! shutdown, on ephemeral ports with a private `LEMON_HOME`.

use std::process::Stdio;

use serde_json::json;

use crate::support::{command, home_with, write_config, Gateway, PATIENCE, TOKEN};

fn ms(record: &serde_json::Value, key: &str) -> i64 {
    record[key].as_i64().unwrap_or_else(|| panic!("{key} in {record}"))
}

#[tokio::test]
async fn a_prompt_streams_back_over_sse_and_is_stored() {
    let gateway = Gateway::start("").await;
    let run_id = gateway.submit(json!({ "prompt": "hello big world", "engine": "echo" })).await;
    let events = gateway.events(&run_id).await;
    let types: Vec<&str> = events.iter().map(|(t, _)| t.as_str()).collect();
    assert_eq!(
        types,
        [
            "run_started",
            "engine_started",
            "delta",
            "delta",
            "delta",
            "engine_completed",
            "run_completed"
        ]
    );
    let seqs: Vec<u64> = events
        .iter()
        .filter(|(t, _)| t == "delta")
        .map(|(_, d)| d["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(seqs, [1, 2, 3]);
    let record = gateway.wait(&run_id).await;
    assert_eq!(record["status"], "completed");
    assert_eq!(record["answer"], "hello big world");
    assert_eq!(record["resume"]["engine"], "echo");

    // Replay after the fact gives the same events.
    let replay = gateway.events(&run_id).await;
    assert_eq!(replay, events);
    assert!(std::path::Path::new(&gateway.home).join("lemon.db").exists());
}

#[tokio::test]
async fn one_session_runs_in_order_and_the_limit_holds() {
    let gateway = Gateway::start(
        "[gateway]\nmax_concurrent_runs = 1\n[gateway.engines.echo]\ndelay_ms = 20\n",
    )
    .await;
    let a = gateway.submit(json!({ "prompt": "first one here", "session_key": "s1" })).await;
    let b = gateway.submit(json!({ "prompt": "second", "session_key": "s1" })).await;
    let c = gateway.submit(json!({ "prompt": "other session", "session_key": "s2" })).await;
    let (a, b, c) = (gateway.wait(&a).await, gateway.wait(&b).await, gateway.wait(&c).await);
    // Same session: b starts after a completed.
    assert!(ms(&b, "started_at_ms") >= ms(&a, "completed_at_ms"), "{a} {b}");
    // One slot: no two runs overlap at all.
    let mut spans = [a, b, c].map(|r| (ms(&r, "started_at_ms"), ms(&r, "completed_at_ms")));
    spans.sort();
    assert!(spans.windows(2).all(|w| w[1].0 >= w[0].1), "{spans:?}");
}

#[tokio::test]
async fn cancel_and_steer_on_a_live_run() {
    let gateway = Gateway::start("[gateway.engines.echo]\ndelay_ms = 50\n").await;
    let words = vec!["word"; 200].join(" ");
    let run_id = gateway.submit(json!({ "prompt": words })).await;
    let steer = gateway
        .post(&format!("/v1/runs/{run_id}/steer"))
        .json(&json!({ "text": "faster" }))
        .send()
        .await
        .unwrap();
    let steer: serde_json::Value = steer.json().await.unwrap();
    assert_eq!(steer["accepted"], false, "echo cannot be steered: {steer}");
    let cancel = gateway.post(&format!("/v1/runs/{run_id}/cancel")).send().await.unwrap();
    assert_eq!(cancel.status(), 202);
    let record = gateway.wait(&run_id).await;
    assert_eq!(record["status"], "cancelled");
    assert_eq!(record["error_code"], "user_requested");
    let again = gateway.post(&format!("/v1/runs/{run_id}/cancel")).send().await.unwrap();
    assert_eq!(again.status(), 202, "cancel is idempotent");
    let unknown = gateway.post("/v1/runs/run_nope/cancel").send().await.unwrap();
    assert_eq!(unknown.status(), 404);
}

#[tokio::test]
async fn bad_requests_get_json_errors() {
    let gateway = Gateway::start("").await;
    let no_token = gateway.http.get(format!("{}/v1/status", gateway.api)).send().await.unwrap();
    assert_eq!(no_token.status(), 401);
    let body: serde_json::Value = no_token.json().await.unwrap();
    assert!(body["error"].is_string());
    let malformed = gateway
        .post("/v1/runs")
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(malformed.status(), 400);
    assert!(malformed.json::<serde_json::Value>().await.unwrap()["error"].is_string());
    let unknown_engine = gateway
        .post("/v1/runs")
        .json(&json!({ "prompt": "x", "engine": "nope" }))
        .send()
        .await
        .unwrap();
    assert_eq!(unknown_engine.status(), 400);
    let health = gateway.http.get(format!("{}/healthz", gateway.health)).send().await.unwrap();
    assert_eq!(health.status(), 200);
    let health: serde_json::Value = health.json().await.unwrap();
    assert_eq!(health["ok"], true);
}

#[tokio::test]
async fn session_keys_with_control_characters_are_refused_with_a_json_400() {
    let gateway = Gateway::start("").await;
    let submitted = gateway
        .post("/v1/runs")
        .json(&json!({ "prompt": "x", "session_key": "me\nINFO forged line" }))
        .send()
        .await
        .unwrap();
    assert_eq!(submitted.status(), 400);
    let body: serde_json::Value = submitted.json().await.unwrap();
    assert!(body["error"].as_str().unwrap().contains("invalid session_key"), "{body}");
    let looked_up = gateway.get("/v1/sessions/me%0Aforged").send().await.unwrap();
    assert_eq!(looked_up.status(), 400);
    let body: serde_json::Value = looked_up.json().await.unwrap();
    assert!(body["error"].as_str().unwrap().contains("invalid session_key"), "{body}");
    // A well-formed key is still the caller's own.
    let run_id = gateway.submit(json!({ "prompt": "fine", "session_key": "me" })).await;
    assert_eq!(gateway.wait(&run_id).await["session_key"], json!("me"));
}

#[tokio::test]
async fn sigterm_drains_runs_and_nothing_is_lost_across_a_restart() {
    let dir =
        home_with("[gateway]\nshutdown_grace_ms = 300\n[gateway.engines.echo]\ndelay_ms = 50\n");
    let gateway = Gateway::start_in(dir.path()).await;
    let quick = gateway.submit(json!({ "prompt": "ok", "session_key": "q" })).await;
    gateway.wait(&quick).await;
    let slow =
        gateway.submit(json!({ "prompt": vec!["w"; 400].join(" "), "session_key": "slow" })).await;
    // Wait until it is streaming, then stop the gateway.
    let mut first = gateway.get(&format!("/v1/runs/{slow}/events")).send().await.unwrap();
    tokio::time::timeout(PATIENCE, async {
        while !String::from_utf8_lossy(&first.chunk().await.unwrap().unwrap()).contains("delta") {}
    })
    .await
    .expect("the slow run streams a delta in time");
    let status = gateway.terminate().await;
    assert!(status.success(), "clean exit: {status}");

    let gateway = Gateway::start_in(dir.path()).await;
    let quick = gateway.run(&quick).await;
    assert_eq!(quick["status"], "completed");
    let slow_record = gateway.run(&slow).await;
    assert_eq!(slow_record["status"], "cancelled");
    assert_eq!(slow_record["error_code"], "shutting_down");
    let events = gateway.events(&slow).await;
    assert_eq!(
        events.last().unwrap().0,
        "run_completed",
        "the stored events end with the completion"
    );
}

#[tokio::test]
async fn the_cli_runs_a_prompt_and_prints_the_resume_line() {
    let gateway = Gateway::start("").await;
    let output = command(&gateway.home)
        .args(["run", "--url", &gateway.api, "--session", "cli", "hello", "from", "the", "cli"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output();
    let output = tokio::time::timeout(PATIENCE, output).await.unwrap().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout} {}", String::from_utf8_lossy(&output.stderr));
    assert_eq!(stdout, "hello from the cli\n", "the answer alone on stdout");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.lines().any(|l| l.starts_with("echo resume run_")),
        "the resume line on stderr: {stderr}"
    );

    let status = command(&gateway.home).args(["status", "--json", "--url", &gateway.api]).output();
    let status = tokio::time::timeout(PATIENCE, status).await.unwrap().unwrap();
    assert!(status.status.success());
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(status["scheduler"]["max"], 2);
    assert!(!String::from_utf8_lossy(&output.stderr).contains(TOKEN), "the token is never printed");
}

#[tokio::test]
async fn a_config_error_names_file_line_and_column() {
    let dir = home_with("[gateway]\nmax_concurrent_runs = \"two\"\n");
    let (code, stderr) = crate::support::failed_start(dir.path()).await;
    assert_eq!(code, Some(5));
    let expected = format!("{}:2:23", dir.path().join("config.toml").display());
    assert!(stderr.contains(&expected), "{stderr}");
    assert!(stderr.contains("max_concurrent_runs"), "{stderr}");
}

#[tokio::test]
async fn an_engine_section_error_stops_the_start_naming_file_line_and_column() {
    let dir = home_with(
        "[gateway]\nmax_concurrent_runs = 2\n[gateway.engines.echo]\ndelay_ms = \"fast\"\n",
    );
    let (code, stderr) = crate::support::failed_start(dir.path()).await;
    assert_eq!(code, Some(5), "a configuration error");
    let expected = format!(
        "{}:4:12: gateway.engines.echo.delay_ms: invalid type: string \"fast\", expected a whole number, 0 or more",
        dir.path().join("config.toml").display()
    );
    assert!(stderr.contains(&expected), "{stderr}");
}

#[tokio::test]
async fn editing_the_config_resizes_the_slots_live() {
    let gateway = Gateway::start("[gateway]\nmax_concurrent_runs = 2\n").await;
    write_config(&gateway.home, "[gateway]\nmax_concurrent_runs = 7\n");
    let max = tokio::time::timeout(PATIENCE, async {
        loop {
            let status = gateway.status().await;
            if status["scheduler"]["max"] == 7 {
                return 7;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    })
    .await
    .expect("the new limit is applied");
    assert_eq!(max, 7);
}

fn fake_cli_config(fixture: &str, extra_env: &str) -> String {
    let fixture = format!("{}/fixtures/cli/claude/{fixture}", env!("CARGO_MANIFEST_DIR"));
    format!(
        "[gateway.engines.claude]\ncli_path = \"{}\"\nenv = {{ FAKE_CLI_FIXTURE = \"{fixture}\", FAKE_CLI_LINE_DELAY_MS = \"5\"{extra_env} }}\n",
        env!("CARGO_BIN_EXE_fake-cli")
    )
}

#[tokio::test]
async fn claude_code_streams_actions_and_text_and_ends_with_its_resume_line() {
    let gateway = Gateway::start(&fake_cli_config("synth_tool_use_success.jsonl", "")).await;
    let run_id = gateway.submit(json!({ "prompt": "how many tests?", "engine": "claude" })).await;
    let events = gateway.events(&run_id).await;
    let types: Vec<&str> = events.iter().map(|(t, _)| t.as_str()).collect();
    assert_eq!(types.first(), Some(&"run_started"));
    assert!(types.contains(&"engine_action"), "{types:?}");
    let deltas: String = events
        .iter()
        .filter(|(t, _)| t == "delta")
        .map(|(_, d)| d["text"].as_str().unwrap())
        .collect();
    assert_eq!(deltas, "Let me look at the tests.\n\nThere are 2 test files.");
    let record = gateway.wait(&run_id).await;
    assert_eq!(record["status"], "completed", "{record}");
    assert_eq!(record["answer"], "There are 2 test files.");
    assert_eq!(record["resume_line"], "claude --resume 5b1c7a52-8f0e-4d7b-9c1a-2f3e4d5c6b7a");
}

#[tokio::test]
async fn an_engine_process_that_dies_completes_the_run_as_failed_with_its_stderr() {
    let env =
        ", FAKE_CLI_EXIT_CODE = \"139\", FAKE_CLI_STDERR = \"Segmentation fault (core dumped)\"";
    let gateway = Gateway::start(&fake_cli_config("synth_resumed_no_result.jsonl", env)).await;
    let run_id = gateway.submit(json!({ "prompt": "go", "engine": "claude" })).await;
    let record = gateway.wait(&run_id).await;
    assert_eq!(record["status"], "failed", "{record}");
    let error = record["error"].as_str().unwrap();
    assert!(error.contains("Segmentation fault"), "{error}");
    // The gateway is still serving: the next run on the same session works.
    let next = gateway.submit(json!({ "prompt": "still here", "engine": "echo" })).await;
    assert_eq!(gateway.wait(&next).await["status"], "completed");
    let status = gateway.status().await;
    assert_eq!(status["scheduler"]["in_flight"], 0);
}

#[tokio::test]
async fn a_missing_cli_is_reported_not_crashed() {
    let gateway =
        Gateway::start("[gateway.engines.codex]\ncli_path = \"/nonexistent/codex\"\n").await;
    let status = gateway.status().await;
    let codex =
        status["engines"].as_array().unwrap().iter().find(|e| e["id"] == "codex").unwrap().clone();
    assert_eq!(codex["available"], false);
    assert!(codex["reason"].as_str().unwrap().contains("/nonexistent/codex"), "{codex}");
    // Naming it is refused before anything is accepted, with what fixes it.
    let refused = gateway
        .post("/v1/runs")
        .json(&json!({ "prompt": "x", "engine": "codex" }))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 409);
    let body: serde_json::Value = refused.json().await.unwrap();
    let error = body["error"].as_str().unwrap();
    assert!(error.starts_with("engine codex is unavailable: "), "{error}");
    assert!(error.contains("/nonexistent/codex") && error.contains("cli_path"), "{error}");
    let runs = gateway.get("/v1/runs").send().await.unwrap().json::<serde_json::Value>().await;
    assert_eq!(runs.unwrap()["runs"], json!([]), "no run was recorded");

    // A directive in the prompt that routes to it still fails its run with the reason.
    let directive = gateway.submit(json!({ "prompt": "/codex x" })).await;
    let record = gateway.wait(&directive).await;
    assert_eq!(record["status"], "failed");
    assert!(record["error"].as_str().unwrap().starts_with("engine_unavailable: codex"), "{record}");
}

#[tokio::test]
async fn a_claude_directive_runs_the_claude_cli_on_path_and_streams_over_sse() {
    let fake = lemon_tests::fake_cli::FakeCliDir::install(std::path::Path::new(env!(
        "CARGO_BIN_EXE_fake-cli"
    )))
    .unwrap();
    let path = format!("{}:{}", fake.path().display(), std::env::var("PATH").unwrap_or_default());
    let fixture =
        format!("{}/fixtures/cli/claude/synth_tool_use_success.jsonl", env!("CARGO_MANIFEST_DIR"));
    let config =
        format!("[gateway.engines.claude]\nenv = {{ FAKE_CLI_FIXTURE = \"{fixture}\" }}\n");
    let gateway = Gateway::start_with_path(&config, &path).await;
    let run_id =
        gateway.submit(json!({ "prompt": "/claude how many tests?", "session_key": "dev" })).await;
    let events = gateway.events(&run_id).await;
    let started = events.iter().find(|(t, _)| t == "run_started").unwrap();
    assert_eq!(started.1["engine"], "claude");
    let deltas: Vec<&str> = events
        .iter()
        .filter(|(t, _)| t == "delta")
        .map(|(_, d)| d["text"].as_str().unwrap())
        .collect();
    assert_eq!(deltas, ["Let me look at the tests.", "\n\nThere are 2 test files."]);
    let record = gateway.wait(&run_id).await;
    assert_eq!(record["prompt"], "how many tests?", "the directive is stripped");
    assert_eq!(record["resume_line"], "claude --resume 5b1c7a52-8f0e-4d7b-9c1a-2f3e4d5c6b7a");

    // A slash command from the CLI client is answered by the router, not run.
    let output = command(&gateway.home)
        .args(["run", "--url", &gateway.api, "/status"])
        .stdout(Stdio::piped())
        .output();
    let output = tokio::time::timeout(PATIENCE, output).await.unwrap().unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert!(!output.stdout.is_empty(), "the slash command's reply is printed");
}

#[tokio::test]
async fn a_new_lemon_home_is_created_private_to_the_user() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("nested").join("lemon");
    let config = dir.path().join("config.toml");
    std::fs::write(&config, "[gateway.api]\nport = 0\n[gateway.health]\nport = 0\n").unwrap();
    let mut child = command(&home)
        .env("LEMON_CONFIG", &config)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut lines = tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(stdout));
    let ready = tokio::time::timeout(PATIENCE, lines.next_line()).await.unwrap().unwrap();
    assert!(ready.is_some_and(|line| line.starts_with("lemon-gateway ready")));
    let mode = std::fs::metadata(&home).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700, "{}", home.display());
    assert!(home.join("lemon.db").exists());
    child.kill().await.unwrap();
}

#[tokio::test]
async fn a_run_shows_the_session_it_resumed_from() {
    let gateway = Gateway::start("").await;
    let first = gateway.submit(json!({ "prompt": "start here", "session_key": "s-first" })).await;
    let first = gateway.wait(&first).await;
    assert_eq!(first.get("resumed_from"), Some(&serde_json::Value::Null), "{first}");
    let first_id = first["run_id"].as_str().unwrap();

    // A resume line continues the session it names, from any chat.
    let line = format!("echo resume {first_id}\ncarry on");
    let resumed = gateway.submit(json!({ "prompt": line, "session_key": "s-elsewhere" })).await;
    let resumed = gateway.wait(&resumed).await;
    assert_eq!(resumed["status"], "completed", "{resumed}");
    assert_eq!(resumed["resumed_from"], json!({ "engine": "echo", "value": first_id }));

    // The next prompt of the first chat continues its stored session by itself.
    let again = gateway.submit(json!({ "prompt": "and again", "session_key": "s-first" })).await;
    let again = gateway.wait(&again).await;
    assert_eq!(first["resume"]["engine"], "echo", "{first}");
    assert_eq!(again["resumed_from"], first["resume"], "{again}");
}

#[tokio::test]
async fn the_runtime_runs_on_one_thread_less_than_the_cpus_unless_configured() {
    let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    let gateway = Gateway::start("").await;
    let status = gateway.status().await;
    assert_eq!(status["worker_threads"], json!(cpus.saturating_sub(1).max(1)), "{status}");
    let gateway = Gateway::start("[gateway]\nworker_threads = 3\n").await;
    let status = gateway.status().await;
    assert_eq!(status["worker_threads"], json!(3), "{status}");
    // It still serves runs on any number of threads.
    let run_id = gateway.submit(json!({ "prompt": "hello" })).await;
    assert_eq!(gateway.wait(&run_id).await["answer"], "hello");
}
