//! A conversation flooded past its queue cap, on the real binary with the
//! default `[gateway.queue]`: a request to a full conversation is refused
//! before it is accepted (429 with `Retry-After` and `{"error": …}`, on the
//! API and on a webhook), and every request that was accepted runs and
//! answers.

use serde_json::{json, Value};

use crate::support::{Gateway, PATIENCE};

const HOOK_TOKEN: &str = "hook-flood-token-2b9e";

/// The README's default: `[gateway.queue] cap = 100`.
const DEFAULT_CAP: usize = 100;

async fn assert_refused(response: reqwest::Response, what: &str) {
    assert_eq!(response.status(), 429, "{what}");
    let retry_after = response.headers().get("retry-after").map(|v| v.to_str().unwrap().to_owned());
    assert_eq!(retry_after.as_deref(), Some("5"), "{what}");
    let body: Value = response.json().await.unwrap();
    let error = body["error"].as_str().unwrap_or_default();
    assert!(error.contains("100 requests waiting"), "{what}: {body}");
}

#[tokio::test]
async fn a_full_conversation_refuses_more_and_runs_everything_it_accepted() {
    let config = format!(
        "[gateway]\nenable_webhook = true\n\
         [gateway.webhook]\nport = 0\n\
         [gateway.webhook.integrations.flood]\ntoken = \"{HOOK_TOKEN}\"\nsession_key = \"flood\"\n"
    );
    let gateway = Gateway::start(&config).await;
    // Nothing starts while paused: the first request holds the conversation,
    // the rest wait behind it.
    assert_eq!(gateway.post("/v1/intake/pause").send().await.unwrap().status(), 200);
    let mut accepted = Vec::new();
    for i in 0..=DEFAULT_CAP {
        let prompt = format!("flood {i}");
        let run_id = gateway.submit(json!({ "prompt": prompt, "session_key": "flood" })).await;
        accepted.push((run_id, prompt));
    }

    let response = gateway
        .post("/v1/runs")
        .json(&json!({ "prompt": "one too many", "session_key": "flood" }))
        .send()
        .await
        .unwrap();
    assert_refused(response, "the API").await;
    let response = gateway
        .http
        .post(gateway.webhook_url("flood"))
        .bearer_auth(HOOK_TOKEN)
        .json(&json!({ "prompt": "one too many" }))
        .timeout(PATIENCE)
        .send()
        .await
        .unwrap();
    assert_refused(response, "the webhook").await;
    // Another conversation is not affected.
    let other = gateway.submit(json!({ "prompt": "elsewhere", "session_key": "calm" })).await;

    assert_eq!(gateway.post("/v1/intake/resume").send().await.unwrap().status(), 200);
    for (run_id, prompt) in &accepted {
        let run = gateway.wait(run_id).await;
        assert_eq!(run["status"], "completed", "{run}");
        assert_eq!(run["answer"], prompt.as_str(), "{run}");
    }
    assert_eq!(gateway.wait(&other).await["answer"], "elsewhere");
    let runs: Value = gateway.get("/v1/runs?limit=200").send().await.unwrap().json().await.unwrap();
    let prompts = runs.to_string();
    assert!(!prompts.contains("one too many"), "a refused request left a run: {prompts}");
    gateway.terminate().await;
}

/// The README's default: `max_pending_runs = 10000`.
const DEFAULT_MAX_PENDING: usize = 10_000;

/// With the defaults, 10 000 unfinished requests (100 conversations, each with
/// one held while intake is paused and 99 waiting) are accepted, the next is
/// refused with 429, and what they hold stays small (the figure is printed).
#[tokio::test]
#[allow(clippy::print_stderr)]
async fn ten_thousand_waiting_requests_are_the_default_limit_and_cost_little_memory() {
    let gateway = Gateway::start("").await;
    assert_eq!(gateway.post("/v1/intake/pause").send().await.unwrap().status(), 200);
    let pid = u32::try_from(gateway.pid()).unwrap();
    let (idle, _) = lemon_tests::load::memory(pid).unwrap();
    let sessions = DEFAULT_MAX_PENDING / DEFAULT_CAP;
    // A prompt of a typical chat message's size.
    let text = "please look at the failing test in the parser and fix it ".repeat(4);
    let mut accepted = 0;
    for n in 0..DEFAULT_CAP {
        let submits = (0..sessions).map(|s| {
            let body =
                json!({ "prompt": format!("{text}{s}/{n}"), "session_key": format!("s{s}") });
            let request = gateway.post("/v1/runs").json(&body);
            async move { request.send().await.unwrap().status() }
        });
        for status in futures::future::join_all(submits).await {
            assert_eq!(status, 202);
            accepted += 1;
        }
    }
    // The first of each conversation holds it; the rest wait behind.
    let response = gateway
        .post("/v1/runs")
        .json(&json!({ "prompt": "one more", "session_key": "s0" }))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 429);
    assert_eq!(response.headers()["retry-after"], "1");
    let (held, _) = lemon_tests::load::memory(pid).unwrap();
    let per_request = held.saturating_sub(idle) / u64::try_from(accepted).unwrap();
    eprintln!(
        "{accepted} requests waiting: RSS {:.1} MB idle, {:.1} MB held, {per_request} bytes each",
        lemon_tests::load::mb(idle),
        lemon_tests::load::mb(held)
    );
    assert!(per_request < 8_000, "{per_request} bytes per waiting request");
    gateway.terminate().await;
}
