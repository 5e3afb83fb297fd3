//! Usage and budgets end to end: the real gateway with the fake Claude Code CLI
//! replaying a run that reports $0.0123 and its tokens.

use serde_json::{json, Value};

use crate::support::Gateway;
use crate::telegram_e2e::{config as telegram_config, fake_telegram, start, wait_for_reply, USER};
use lemon_tests::fake_telegram::ChatSpec;

fn claude_section(args_file: &std::path::Path) -> String {
    let fixture =
        format!("{}/fixtures/cli/claude/synth_tool_use_success.jsonl", env!("CARGO_MANIFEST_DIR"));
    format!(
        "[gateway.engines.claude]\ncli_path = \"{}\"\nenv = {{ FAKE_CLI_FIXTURE = \"{fixture}\", FAKE_CLI_ARGS_FILE = \"{}\" }}\n",
        env!("CARGO_BIN_EXE_fake-cli"),
        args_file.display()
    )
}

async fn run(gateway: &Gateway, session: &str) -> Value {
    let body = json!({ "prompt": "how many tests?", "engine": "claude", "session_key": session });
    let run_id = gateway.submit(body).await;
    gateway.wait(&run_id).await;
    gateway.run(&run_id).await
}

fn argv(args_file: &std::path::Path) -> Vec<String> {
    let header: Value =
        serde_json::from_str(std::fs::read_to_string(args_file).unwrap().lines().next().unwrap())
            .unwrap();
    header["argv"].as_array().unwrap().iter().map(|a| a.as_str().unwrap().to_owned()).collect()
}

async fn get_json(gateway: &Gateway, path: &str) -> (u16, Value) {
    let response = gateway.get(path).send().await.unwrap();
    (response.status().as_u16(), response.json().await.unwrap())
}

#[tokio::test]
async fn a_session_over_its_daily_dollars_is_stopped_before_its_engine_starts_and_others_run() {
    let dir = tempfile::tempdir().unwrap();
    let args_file = dir.path().join("args");
    let config =
        format!("[gateway.budgets]\nsession_daily_usd = 0.02\n{}", claude_section(&args_file));
    let gateway = Gateway::start(&config).await;

    let first = run(&gateway, "alice").await;
    assert_eq!(first["status"], "completed", "{first}");
    assert_eq!(first["spend"]["usd"], 0.0123, "{first}");
    assert_eq!(first["spend"]["input_tokens"], 92);
    assert_eq!(first["spend"]["output_tokens"], 69);
    assert_eq!(first["spend"]["cache_read_tokens"], 2048);
    assert_eq!(first["usage"]["total_cost_usd"], 0.0123, "the engine's own usage is kept");
    // Nothing spent yet: Claude may spend the whole daily limit.
    assert!(
        argv(&args_file).contains(&"--max-budget-usd=0.0200".to_owned()),
        "{:?}",
        argv(&args_file)
    );

    let second = run(&gateway, "alice").await;
    assert_eq!(second["status"], "completed", "{second}");
    assert!(
        argv(&args_file).contains(&"--max-budget-usd=0.0077".to_owned()),
        "{:?}",
        argv(&args_file)
    );
    std::fs::remove_file(&args_file).unwrap();

    // $0.0246 spent today: the next run ends at once, and no CLI starts.
    let third = run(&gateway, "alice").await;
    assert_eq!(third["status"], "failed", "{third}");
    assert_eq!(third["error_code"], "budget_exceeded");
    let error = third["error"].as_str().unwrap();
    assert!(error.contains("session_daily_usd"), "names the limit: {error}");
    assert!(error.contains("$0.0246") && error.contains("$0.0200"), "what was spent: {error}");
    assert_eq!(third["started_at_ms"], Value::Null, "{third}");
    assert!(!args_file.exists(), "the engine never started");

    let other = run(&gateway, "bob").await;
    assert_eq!(other["status"], "completed", "another session still runs: {other}");

    let (status, usage) = get_json(&gateway, "/v1/usage").await;
    assert_eq!(status, 200, "{usage}");
    assert_eq!(usage["total"]["runs"], 4, "{usage}");
    let total_usd = usage["total"]["usd"].as_f64().unwrap();
    assert!((total_usd - 0.0369).abs() < 1e-9, "{usage}");
    assert_eq!(usage["total"]["input_tokens"], 92 * 3);
    assert_eq!(usage["engines"][0]["engine"], "claude", "{usage}");
    let sessions: Vec<(&str, u64)> = usage["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["session_key"].as_str().unwrap(), s["runs"].as_u64().unwrap()))
        .collect();
    assert_eq!(sessions, [("alice", 3), ("bob", 1)]);
    let (_, bob) = get_json(&gateway, "/v1/usage?session=bob&engine=claude&since=0").await;
    assert_eq!(bob["total"]["runs"], 1, "{bob}");
    let (_, later) = get_json(&gateway, "/v1/usage?since=2100-01-01T00:00:00Z").await;
    assert_eq!(later["total"]["runs"], 0, "{later}");
    for bad in ["/v1/usage?since=yesterday", "/v1/usage?since=-5", "/v1/usage?limit=3"] {
        let (status, body) = get_json(&gateway, bad).await;
        assert_eq!(status, 400, "{bad}: {body}");
        assert!(body["error"].is_string(), "{bad}: {body}");
    }
    let anonymous =
        reqwest::Client::new().get(format!("{}/v1/usage", gateway.api)).send().await.unwrap();
    assert_eq!(anonymous.status(), 401);

    // The session's own limit lifts it; it is kept in the store.
    let put = |body: Value| {
        gateway
            .http
            .put(format!("{}/v1/sessions/alice/budget", gateway.api))
            .bearer_auth(crate::support::TOKEN)
            .json(&body)
    };
    let refused = put(json!({ "session_daily_usd": -1 })).send().await.unwrap();
    assert_eq!(refused.status(), 400);
    let set = put(json!({ "session_daily_usd": 1.0 })).send().await.unwrap();
    assert_eq!(set.status(), 200);
    let (_, budget) = get_json(&gateway, "/v1/sessions/alice/budget").await;
    assert_eq!(budget["limits"]["session_daily_usd"], 1.0, "{budget}");
    assert_eq!(budget["session_override"]["session_daily_usd"], 1.0, "{budget}");
    assert_eq!(budget["today"]["runs"], 3, "{budget}");
    let fourth = run(&gateway, "alice").await;
    assert_eq!(fourth["status"], "completed", "{fourth}");
}

#[tokio::test]
async fn status_in_a_telegram_chat_shows_what_the_session_spent_today() {
    let dir = tempfile::tempdir().unwrap();
    let fake = fake_telegram().await;
    let extra = format!(
        "[gateway.budgets]\nsession_daily_usd = 5\n{}",
        claude_section(&dir.path().join("args"))
    );
    let _gateway = start(&fake, &telegram_config(&fake, "engine = \"claude\"", &extra)).await;
    let chat = ChatSpec::private(USER);
    let asked = fake.inject_text(&chat, USER, "how many tests?");
    wait_for_reply(&fake, USER, asked.message_id, "There are 2 test files.").await;
    let status = fake.inject_text(&chat, USER, "/status");
    let reply = wait_for_reply(&fake, USER, status.message_id, "Today (UTC)").await;
    assert!(reply.text.contains("161 tokens, $0.0123 in 1 run."), "{}", reply.text);
    assert!(reply.text.contains("Limits: $5.0000 per session per day."), "{}", reply.text);
}
