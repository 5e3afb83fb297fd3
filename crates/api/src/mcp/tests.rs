//! The endpoint over real HTTP on 127.0.0.1, spoken to as Claude Code does:
//! JSON-RPC over Streamable HTTP, a session from `initialize`, then
//! `tools/list` and `tools/call`.

use std::path::PathBuf;

use lemon_core::approvals::{ApprovalHub, Gate, Rules, RunTicket};
use lemon_core::config::{ApprovalAction, ApprovalRuleConfig, ApprovalsConfig};
use lemon_core::engine::{EngineEvent, EventSink};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use super::router;

struct Endpoint {
    url: String,
    http: reqwest::Client,
    _shutdown: tokio_util::sync::DropGuard,
}

async fn serve(gate: Gate) -> Endpoint {
    let shutdown = CancellationToken::new();
    let app = router(gate, &shutdown);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/mcp", listener.local_addr().unwrap());
    let stop = shutdown.clone();
    tokio::spawn(async move {
        axum::serve(listener, app).with_graceful_shutdown(stop.cancelled_owned()).await.unwrap();
    });
    Endpoint { url, http: reqwest::Client::new(), _shutdown: shutdown.drop_guard() }
}

fn gate(rules: Vec<ApprovalRuleConfig>, hub: &ApprovalHub) -> Gate {
    let config =
        ApprovalsConfig { timeout_ms: 60_000, rules: Some(rules), ..ApprovalsConfig::default() };
    Gate::new(Rules::from_config(&config).unwrap(), hub.clone())
}

fn ticket(sink: EventSink) -> RunTicket {
    RunTicket {
        run_id: "run_1".into(),
        session_key: "agent:main:main".into(),
        engine: "claude".into(),
        cwd: PathBuf::from("/work/proj"),
        meta: Default::default(),
        sink,
    }
}

/// A client session: the token and, after `initialize`, the session id.
struct Client<'a> {
    endpoint: &'a Endpoint,
    token: String,
    session: Option<String>,
    next_id: u64,
}

impl<'a> Client<'a> {
    fn new(endpoint: &'a Endpoint, token: &str) -> Self {
        Client { endpoint, token: token.to_owned(), session: None, next_id: 1 }
    }

    fn post(&self, body: &Value) -> reqwest::RequestBuilder {
        let mut request = self
            .endpoint
            .http
            .post(&self.endpoint.url)
            .bearer_auth(&self.token)
            .header("accept", "application/json, text/event-stream")
            .json(body);
        if let Some(session) = &self.session {
            request = request.header("mcp-session-id", session);
        }
        request
    }

    /// Sends a request; its JSON-RPC response (from JSON or the SSE stream).
    async fn call(&mut self, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        let body = json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params });
        let response = self.post(&body).send().await.unwrap();
        assert_eq!(response.status(), 200, "{method}");
        if let Some(session) = response.headers().get("mcp-session-id") {
            self.session = Some(session.to_str().unwrap().to_owned());
        }
        let text = response.text().await.unwrap();
        let messages: Vec<Value> = if text.trim_start().starts_with('{') {
            vec![serde_json::from_str(&text).unwrap()]
        } else {
            text.lines()
                .filter_map(|line| line.strip_prefix("data:"))
                .filter(|data| !data.trim().is_empty())
                .map(|data| serde_json::from_str(data.trim()).unwrap())
                .collect()
        };
        messages
            .into_iter()
            .find(|message| message["id"] == id)
            .unwrap_or_else(|| panic!("no response to {method} in {text}"))
    }

    async fn initialize(&mut self) {
        let params = json!({
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": { "name": "claude-code", "version": "2.1.332" },
        });
        let answer = self.call("initialize", params).await;
        assert_eq!(answer["result"]["serverInfo"]["name"], "lemon-gateway", "{answer}");
        let note = json!({ "jsonrpc": "2.0", "method": "notifications/initialized" });
        let response = self.post(&note).send().await.unwrap();
        assert_eq!(response.status(), 202);
    }

    /// `approve` called for `tool`; the behavior JSON Claude reads.
    async fn approve(&mut self, tool: &str, input: Value) -> Value {
        let params = json!({
            "name": "approve",
            "arguments": { "tool_name": tool, "input": input, "tool_use_id": "toolu_1" },
        });
        let answer = self.call("tools/call", params).await;
        let content = &answer["result"]["content"];
        assert_eq!(content.as_array().map(Vec::len), Some(1), "one text block: {answer}");
        serde_json::from_str(content[0]["text"].as_str().unwrap()).unwrap()
    }
}

fn rule(tool: &str, pattern: &str, action: ApprovalAction) -> ApprovalRuleConfig {
    ApprovalRuleConfig { tool: tool.into(), pattern: Some(pattern.into()), action }
}

#[tokio::test]
async fn only_a_live_runs_token_opens_the_endpoint() {
    let hub = ApprovalHub::default();
    let gate = gate(Vec::new(), &hub);
    let endpoint = serve(gate.clone()).await;
    let (sink, _events) = EventSink::channel(8);
    let registration = gate.register(ticket(sink));

    let initialize = json!({ "jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {} });
    for token in [None, Some("not-a-run-token"), Some(&registration.token[..32])] {
        let mut request = endpoint.http.post(&endpoint.url).json(&initialize);
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        let response = request.send().await.unwrap();
        assert_eq!(response.status(), 401, "{token:?}");
        let body: Value = response.json().await.unwrap();
        assert!(body["error"].is_string(), "{body}");
    }

    let mut client = Client::new(&endpoint, &registration.token);
    client.initialize().await;
    let tools = client.call("tools/list", json!({})).await;
    let names: Vec<&str> = tools["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|tool| tool["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["approve"]);

    // Once the run ends its token opens nothing, even mid-session.
    let token = registration.token.clone();
    drop(registration);
    let response = client.post(&json!({ "jsonrpc": "2.0", "id": 9, "method": "tools/list" }));
    assert_eq!(response.send().await.unwrap().status(), 401, "{}", token.len());
}

#[tokio::test]
async fn rules_answer_at_once_and_an_asked_call_waits_for_the_owner() {
    let hub = ApprovalHub::default();
    let rules = vec![
        rule("bash", "rm *", ApprovalAction::Deny),
        rule("read", "/work/proj/**", ApprovalAction::Allow),
        rule("*", "*", ApprovalAction::Ask),
    ];
    let gate = gate(rules, &hub);
    let endpoint = serve(gate.clone()).await;
    let (sink, mut events) = EventSink::channel(8);
    let registration = gate.register(ticket(sink));
    let mut client = Client::new(&endpoint, &registration.token);
    client.initialize().await;

    let read = json!({ "file_path": "src/main.rs" });
    let allowed = client.approve("Read", read.clone()).await;
    assert_eq!(allowed, json!({ "behavior": "allow", "updatedInput": read }));
    let denied = client.approve("Bash", json!({ "command": "rm -rf build" })).await;
    assert_eq!(denied["behavior"], "deny", "{denied}");
    let message = denied["message"].as_str().unwrap();
    assert!(message.contains(r#"tool = "bash", match = "rm *", action = "deny""#), "{message}");

    // No rule: the owner is asked, and the call waits for the answer.
    let write = json!({ "file_path": "notes.md", "content": "hi" });
    let asked = {
        let mut client = Client {
            endpoint: &endpoint,
            token: client.token.clone(),
            session: client.session.clone(),
            next_id: 50,
        };
        let write = write.clone();
        async move { client.approve("Write", write).await }
    };
    let answer = async {
        let Some(EngineEvent::Action(started)) = events.recv().await else { panic!("asked") };
        assert_eq!(started.detail["approval"]["subject"], "/work/proj/notes.md");
        let id = started.detail["approval"]["id"].as_str().unwrap().to_owned();
        hub.answer(&id, false, "@ann", "telegram").unwrap();
    };
    let (decision, ()) = tokio::join!(asked, answer);
    assert_eq!(
        decision,
        json!({
            "behavior": "deny",
            "message": "The owner denied this call (@ann via telegram); it was not run."
        })
    );
    let Some(EngineEvent::Action(settled)) = events.recv().await else { panic!("settled") };
    assert_eq!(settled.message.as_deref(), Some("denied by @ann via telegram"));
}
