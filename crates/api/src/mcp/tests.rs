//! The endpoint over real HTTP on 127.0.0.1, in front of a real router with
//! the echo engine, spoken to as MCP clients do: JSON-RPC over Streamable
//! HTTP, a session from `initialize`, then `tools/list` and `tools/call`.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use lemon_core::approvals::{ApprovalHub, Gate, Registration, Rules, RunTicket};
use lemon_core::config::{ApprovalAction, ApprovalRuleConfig, ApprovalsConfig};
use lemon_core::engine::{ActionPhase, EngineEvent, EngineRegistry, EventSink};
use lemon_core::gateway::{GatewayDeps, GatewayHandle, RuntimeConfig};
use lemon_core::ids::SessionKey;
use lemon_core::router::{RouterConfig, RouterHandle};
use lemon_core::store::StoreHandle;
use lemon_core::tool::{Tool, ToolContext, ToolOutput, ToolRegistry, ToolSpec};
use lemon_engines::echo::EchoEngine;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::{router, McpEndpoint, TOOLS_PER_PAGE};

const API_TOKEN: &str = "api-token-5d2e";
const TELEGRAM_CHAT: &str = "agent:main:telegram:bot:dm:42";
/// JSON-RPC's invalid params.
const INVALID_PARAMS: i64 = -32602;

/// A gateway (echo engine, memory store) with `/mcp` in front of it.
struct Endpoint {
    url: String,
    http: reqwest::Client,
    gate: Gate,
    hub: ApprovalHub,
    tools: ToolRegistry,
    router: RouterHandle,
    store: StoreHandle,
    tracker: TaskTracker,
    _shutdown: tokio_util::sync::DropGuard,
}

async fn serve(rules: Vec<ApprovalRuleConfig>) -> Endpoint {
    let shutdown = CancellationToken::new();
    let tracker = TaskTracker::new();
    let hub = ApprovalHub::default();
    let config =
        ApprovalsConfig { timeout_ms: 60_000, rules: Some(rules), ..ApprovalsConfig::default() };
    let gate = Gate::new(Rules::from_config(&config).unwrap(), hub.clone());
    let mut engines = EngineRegistry::new();
    engines.register(Arc::new(EchoEngine::new(Duration::ZERO, tracker.clone()))).unwrap();
    let store = StoreHandle::memory();
    let deps = GatewayDeps {
        config: RuntimeConfig::default(),
        engines,
        store: store.clone(),
        bus: lemon_core::bus::EventBus::default(),
    };
    let gateway = GatewayHandle::start(deps, shutdown.clone(), &tracker);
    let router_config =
        RouterConfig { default_engine: "echo".parse().unwrap(), ..RouterConfig::default() };
    let run_router = RouterHandle::start(router_config, gateway, shutdown.clone(), &tracker);
    let tools = ToolRegistry::new();
    let endpoint = McpEndpoint {
        gate: gate.clone(),
        token: API_TOKEN.into(),
        router: run_router.clone(),
        tools: tools.clone(),
        workspace: None,
        tracker: tracker.clone(),
    };
    let app = router(endpoint, &shutdown);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/mcp", listener.local_addr().unwrap());
    let stop = shutdown.clone();
    tracker.spawn(async move {
        axum::serve(listener, app).with_graceful_shutdown(stop.cancelled_owned()).await.unwrap();
    });
    Endpoint {
        url,
        http: reqwest::Client::new(),
        gate,
        hub,
        tools,
        router: run_router,
        store,
        tracker,
        _shutdown: shutdown.drop_guard(),
    }
}

impl Endpoint {
    fn register(&self, session_key: &str, meta: Value, sink: EventSink) -> Registration {
        self.register_engine("claude", session_key, meta, sink)
    }

    fn register_engine(
        &self,
        engine: &str,
        session_key: &str,
        meta: Value,
        sink: EventSink,
    ) -> Registration {
        let Value::Object(meta) = meta else { panic!("meta is an object") };
        self.gate.register(RunTicket {
            run_id: "run_1".into(),
            session_key: session_key.into(),
            engine: engine.into(),
            cwd: PathBuf::from("/work/proj"),
            meta: meta.into_iter().collect(),
            sink,
        })
    }
}

/// A client session: the token, headers and, after `initialize`, the session id.
struct Client<'a> {
    endpoint: &'a Endpoint,
    token: String,
    headers: Vec<(&'static str, String)>,
    session: Option<String>,
    next_id: u64,
}

impl<'a> Client<'a> {
    fn new(endpoint: &'a Endpoint, token: &str) -> Self {
        Client { endpoint, token: token.to_owned(), headers: Vec::new(), session: None, next_id: 1 }
    }

    fn post(&self, body: &Value) -> reqwest::RequestBuilder {
        let mut request = self
            .endpoint
            .http
            .post(&self.endpoint.url)
            .bearer_auth(&self.token)
            .header("accept", "application/json, text/event-stream")
            .json(body);
        for (name, value) in &self.headers {
            request = request.header(*name, value);
        }
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
        let capabilities = &answer["result"]["capabilities"]["tools"];
        assert_eq!(capabilities["listChanged"], true, "{answer}");
        let note = json!({ "jsonrpc": "2.0", "method": "notifications/initialized" });
        let response = self.post(&note).send().await.unwrap();
        assert_eq!(response.status(), 202);
    }

    /// Every tool's name, page after page.
    async fn tool_names(&mut self) -> Vec<String> {
        let mut names = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let params = match &cursor {
                Some(cursor) => json!({ "cursor": cursor }),
                None => json!({}),
            };
            let answer = self.call("tools/list", params).await;
            let page = answer["result"]["tools"].as_array().unwrap_or_else(|| panic!("{answer}"));
            assert!(page.len() <= TOOLS_PER_PAGE);
            names.extend(page.iter().map(|tool| tool["name"].as_str().unwrap().to_owned()));
            match answer["result"]["nextCursor"].as_str() {
                Some(next) => cursor = Some(next.to_owned()),
                None => return names,
            }
        }
    }

    /// `tools/call`; the JSON-RPC answer.
    async fn tool(&mut self, name: &str, arguments: Value) -> Value {
        self.call("tools/call", json!({ "name": name, "arguments": arguments })).await
    }

    /// `tools/call` of a control tool that answers JSON; `(isError, the JSON)`.
    async fn tool_json(&mut self, name: &str, arguments: Value) -> (bool, Value) {
        let answer = self.tool(name, arguments).await;
        let result = &answer["result"];
        let text = result["content"][0]["text"].as_str().unwrap_or_else(|| panic!("{answer}"));
        let body = serde_json::from_str(text).unwrap_or_else(|_| json!(text));
        (result["isError"] == true, body)
    }

    /// `approve` called for `tool`; the behavior JSON Claude reads.
    async fn approve(&mut self, tool: &str, input: Value) -> Value {
        let arguments = json!({ "tool_name": tool, "input": input, "tool_use_id": "toolu_1" });
        let answer = self.tool("approve", arguments).await;
        let content = &answer["result"]["content"];
        assert_eq!(content.as_array().map(Vec::len), Some(1), "one text block: {answer}");
        serde_json::from_str(content[0]["text"].as_str().unwrap()).unwrap()
    }
}

fn rule(tool: &str, pattern: &str, action: ApprovalAction) -> ApprovalRuleConfig {
    ApprovalRuleConfig { tool: tool.into(), pattern: Some(pattern.into()), action }
}

/// What a [`Recorder`] saw of its calls.
#[derive(Debug, Clone)]
struct Seen {
    run_id: String,
    session_key: String,
    cwd: PathBuf,
    args: Value,
}

/// A gateway tool that records its calls; offered to every session, or only
/// to Telegram's. With `wait`, it answers once its call is cancelled.
#[derive(Debug)]
struct Recorder {
    name: String,
    telegram_only: bool,
    wait: bool,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Recorder {
    fn new(name: &str) -> Self {
        Recorder { name: name.to_owned(), telegram_only: false, wait: false, seen: Arc::default() }
    }
}

#[async_trait]
impl Tool for Recorder {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: self.name.clone(),
            description: format!("records its calls ({})", self.name),
            parameters: json!({ "type": "object", "properties": { "text": { "type": "string" } } }),
        }
    }

    fn offered(&self, session: &SessionKey) -> bool {
        !self.telegram_only || session.starts_with("agent:main:telegram:")
    }

    async fn execute(&self, args: Value, ctx: ToolContext) -> ToolOutput {
        self.seen.lock().unwrap().push(Seen {
            run_id: ctx.run_id.to_string(),
            session_key: ctx.session_key.to_string(),
            cwd: ctx.cwd.clone(),
            args: args.clone(),
        });
        if self.wait {
            ctx.cancel.cancelled().await;
            return ToolOutput::error("stopped: the call was cancelled");
        }
        if args["text"] == "fail" {
            return ToolOutput::error("it failed, as asked");
        }
        let details = if args["text"] == "file" {
            json!({ "auto_send_files": [{ "path": "/work/proj/out.png" }] })
        } else {
            Value::Null
        };
        ToolOutput::ok(format!("recorded {}", args["text"].as_str().unwrap_or("")), details)
    }
}

#[tokio::test]
async fn only_a_live_runs_token_or_the_api_token_opens_the_endpoint() {
    let endpoint = serve(Vec::new()).await;
    let (sink, _events) = EventSink::channel(8);
    let registration = endpoint.register("agent:main:main", json!({}), sink);

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
    assert_eq!(client.tool_names().await, ["approve"]);

    // Once the run ends its token opens nothing, even mid-session.
    drop(registration);
    let response = client.post(&json!({ "jsonrpc": "2.0", "id": 9, "method": "tools/list" }));
    assert_eq!(response.send().await.unwrap().status(), 401);

    // A Lemon-Session header that is no session key is refused before the body.
    let mut owner = Client::new(&endpoint, API_TOKEN);
    owner.headers.push(("lemon-session", "a\tb".to_owned()));
    let response = owner.post(&initialize).send().await.unwrap();
    assert_eq!(response.status(), 400);
    let body: Value = response.json().await.unwrap();
    assert!(body["error"].as_str().unwrap().contains("Lemon-Session"), "{body}");
}

#[tokio::test]
async fn rules_answer_at_once_and_an_asked_call_waits_for_the_owner() {
    let rules = vec![
        rule("bash", "rm *", ApprovalAction::Deny),
        rule("read", "/work/proj/**", ApprovalAction::Allow),
        rule("*", "*", ApprovalAction::Ask),
    ];
    let endpoint = serve(rules).await;
    let (sink, mut events) = EventSink::channel(8);
    let registration = endpoint.register("agent:main:main", json!({}), sink);
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
            headers: Vec::new(),
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
        endpoint.hub.answer(&id, false, "@ann", "telegram").unwrap();
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

#[tokio::test]
async fn a_runs_call_of_a_gateway_tool_acts_for_the_runs_session() {
    let endpoint = serve(Vec::new()).await;
    let recorder = Recorder::new("note_down");
    let seen = recorder.seen.clone();
    endpoint.tools.register(Arc::new(recorder));
    endpoint.tools.register(Arc::new(Recorder { telegram_only: true, ..Recorder::new("tg_only") }));
    endpoint.tools.register(Arc::new(Recorder::new("filtered_out")));
    // The run's filter lets the two recorders through, not `filtered_out`.
    let meta = json!({ "tool_filter": [["note_down", "tg_*"]] });
    let (sink, mut events) = EventSink::channel(8);
    let registration = endpoint.register(TELEGRAM_CHAT, meta, sink);
    let mut client = Client::new(&endpoint, &registration.token);
    client.initialize().await;
    assert_eq!(client.tool_names().await, ["approve", "note_down", "tg_only"]);

    let answer = client.tool("note_down", json!({ "text": "file" })).await;
    assert_eq!(answer["result"]["content"][0]["text"], "recorded file", "{answer}");
    assert_ne!(answer["result"]["isError"], true, "{answer}");
    let calls = seen.lock().unwrap().clone();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].session_key, TELEGRAM_CHAT);
    assert_eq!(calls[0].run_id, "run_1");
    assert_eq!(calls[0].cwd, PathBuf::from("/work/proj"));
    assert_eq!(calls[0].args, json!({ "text": "file" }));
    // The call is an action of the run, whose result queues its files.
    let Some(EngineEvent::Action(started)) = events.recv().await else { panic!("started") };
    assert_eq!((started.title.as_str(), started.phase), ("note_down", ActionPhase::Started));
    let Some(EngineEvent::Action(done)) = events.recv().await else { panic!("completed") };
    assert_eq!(done.phase, ActionPhase::Completed);
    assert_eq!(done.ok, Some(true));
    assert_eq!(done.detail["auto_send_files"][0]["path"], "/work/proj/out.png");

    // A tool's own failure is a result with isError.
    let failed = client.tool("note_down", json!({ "text": "fail" })).await;
    assert_eq!(failed["result"]["isError"], true, "{failed}");
    assert_eq!(failed["result"]["content"][0]["text"], "it failed, as asked");

    // A tool the run is not offered, or that does not exist, is no tool.
    for name in ["filtered_out", "no_such_tool", "run"] {
        let refused = client.tool(name, json!({})).await;
        assert_eq!(refused["error"]["code"], INVALID_PARAMS, "{name}: {refused}");
    }
}

#[tokio::test]
async fn a_codex_runs_calls_are_judged_by_the_owners_rules_under_the_tools_own_name() {
    let rules = vec![
        rule("note_down", "*secret*", ApprovalAction::Deny),
        rule("note_down", "*", ApprovalAction::Allow),
    ];
    let endpoint = serve(rules).await;
    let recorder = Recorder::new("note_down");
    let seen = recorder.seen.clone();
    endpoint.tools.register(Arc::new(recorder));
    let (sink, _events) = EventSink::channel(8);
    let registration = endpoint.register_engine("codex", TELEGRAM_CHAT, json!({}), sink);
    let mut client = Client::new(&endpoint, &registration.token);
    client.initialize().await;

    let denied = client.tool("note_down", json!({ "text": "the secret plan" })).await;
    assert_eq!(denied["result"]["isError"], true, "{denied}");
    let message = denied["result"]["content"][0]["text"].as_str().unwrap();
    assert!(
        message.contains(r#"tool = "note_down", match = "*secret*", action = "deny""#),
        "{message}"
    );
    assert!(seen.lock().unwrap().is_empty(), "a denied call never runs");

    let allowed = client.tool("note_down", json!({ "text": "groceries" })).await;
    assert_ne!(allowed["result"]["isError"], true, "{allowed}");
    assert_eq!(seen.lock().unwrap().len(), 1);
}

#[tokio::test]
async fn only_claude_runs_are_offered_the_permission_tool() {
    let endpoint = serve(Vec::new()).await;
    endpoint.tools.register(Arc::new(Recorder::new("note_down")));
    let (sink, _events) = EventSink::channel(8);
    let registration = endpoint.register_engine("codex", TELEGRAM_CHAT, json!({}), sink);
    let mut client = Client::new(&endpoint, &registration.token);
    client.initialize().await;
    assert_eq!(client.tool_names().await, ["note_down"]);
    let refused = client.tool("approve", json!({ "tool_name": "bash", "input": {} })).await;
    assert_eq!(refused["error"]["code"], INVALID_PARAMS, "{refused}");
}

#[tokio::test]
async fn a_call_is_cancelled_when_its_run_ends_and_the_token_is_refused_after() {
    let endpoint = serve(Vec::new()).await;
    let waiter = Recorder { wait: true, ..Recorder::new("wait_here") };
    let seen = waiter.seen.clone();
    endpoint.tools.register(Arc::new(waiter));
    let (sink, mut events) = EventSink::channel(8);
    let registration = endpoint.register("agent:main:main", json!({}), sink);
    let mut client = Client::new(&endpoint, &registration.token);
    client.initialize().await;

    let call = client.tool("wait_here", json!({}));
    let end_the_run = async {
        let Some(EngineEvent::Action(started)) = events.recv().await else { panic!("started") };
        assert_eq!(started.phase, ActionPhase::Started);
        drop(registration);
    };
    let (answer, ()) =
        tokio::time::timeout(Duration::from_secs(10), async { tokio::join!(call, end_the_run) })
            .await
            .expect("the call ended with its run");
    assert_eq!(answer["result"]["content"][0]["text"], "stopped: the call was cancelled");
    assert_eq!(seen.lock().unwrap().len(), 1);
    let response = client.post(&json!({ "jsonrpc": "2.0", "id": 99, "method": "tools/list" }));
    assert_eq!(response.send().await.unwrap().status(), 401);
}

#[tokio::test]
async fn cron_made_by_a_run_answers_in_the_runs_chat() {
    let endpoint = serve(Vec::new()).await;
    let shutdown = CancellationToken::new();
    let cron = lemon_core::cron::CronHandle::start(
        lemon_core::cron::CronDeps {
            router: endpoint.router.clone(),
            store: endpoint.store.clone(),
            clock: Arc::new(lemon_core::cron::SystemClock),
        },
        Vec::new(),
        shutdown.clone(),
        &endpoint.tracker,
    );
    endpoint.tools.register(Arc::new(lemon_core::cron::tool::CronTool::new(cron.clone())));
    let (sink, _events) = EventSink::channel(8);
    let registration = endpoint.register(TELEGRAM_CHAT, json!({}), sink);
    let mut client = Client::new(&endpoint, &registration.token);
    client.initialize().await;

    let add = json!({
        "action": "add",
        "schedule": "daily at 9am",
        "prompt": "water the plants",
        "sessionKey": "agent:main:main",
    });
    let answer = client.tool("cron", add).await;
    assert_ne!(answer["result"]["isError"], true, "{answer}");
    let jobs = cron.list().await.unwrap();
    assert_eq!(jobs.len(), 1);
    assert_eq!(jobs[0].session_key, TELEGRAM_CHAT, "the model's session key is ignored");
    assert_eq!(jobs[0].prompt, "water the plants");
    shutdown.cancel();
}

#[tokio::test]
async fn the_api_token_gets_the_control_tools_and_runs_on_the_engines() {
    let endpoint = serve(Vec::new()).await;
    let recorder = Recorder::new("note_down");
    let seen = recorder.seen.clone();
    endpoint.tools.register(Arc::new(recorder));
    endpoint.tools.register(Arc::new(Recorder { telegram_only: true, ..Recorder::new("tg_only") }));
    let mut client = Client::new(&endpoint, API_TOKEN);
    client.initialize().await;
    assert_eq!(client.tool_names().await, ["cancel", "note_down", "run", "runs", "status"]);

    let (failed, run) = client.tool_json("run", json!({ "prompt": "hello over mcp" })).await;
    assert!(!failed, "{run}");
    assert_eq!(run["status"], "completed", "{run}");
    assert_eq!(run["answer"], "hello over mcp");
    assert_eq!(run["engine"], "echo");
    assert_eq!(run["session_key"], "default");
    let run_id = run["run_id"].as_str().unwrap().to_owned();

    let (_, status) = client.tool_json("status", json!({ "run_id": run_id })).await;
    assert_eq!(status["status"], "completed", "{status}");
    assert_eq!(status["answer"], "hello over mcp");
    let (_, runs) = client.tool_json("runs", json!({ "session_key": "default" })).await;
    assert_eq!(runs["runs"][0]["run_id"], run_id.as_str(), "{runs}");
    let (_, none) = client.tool_json("runs", json!({ "session_key": "elsewhere" })).await;
    assert_eq!(none["runs"], json!([]));
    let (_, cancelled) = client.tool_json("cancel", json!({ "run_id": run_id })).await;
    assert_eq!(cancelled, json!({ "run_id": run_id, "status": "completed" }));

    // Without waiting: the run's id at once.
    let (_, accepted) = client.tool_json("run", json!({ "prompt": "later", "wait": false })).await;
    assert_eq!(accepted["status"], "accepted", "{accepted}");

    // Bad arguments and refusals are results with isError, in the API's words.
    for (name, arguments, says) in [
        ("run", json!({}), "invalid argument prompt"),
        ("run", json!({ "prompt": 7 }), "invalid argument prompt: expected a string"),
        ("run", json!({ "prompt": "x", "wait": "yes" }), "invalid argument wait"),
        ("run", json!({ "prompt": "x", "timeout_ms": 0 }), "invalid argument timeout_ms"),
        ("run", json!({ "prompt": "x", "engine": "nope" }), "nope"),
        ("run", json!({ "prompt": "x", "cwd": "relative/dir" }), "invalid cwd"),
        ("status", json!({ "run_id": "run_missing" }), "run run_missing not found"),
        ("runs", json!({ "limit": 0 }), "invalid argument limit"),
    ] {
        let (failed, body) = client.tool_json(name, arguments.clone()).await;
        assert!(failed, "{name} {arguments}: {body}");
        assert!(body.as_str().is_some_and(|text| text.contains(says)), "{name}: {body}");
    }
    let unknown = client.tool("approve", json!({ "tool_name": "x", "input": {} })).await;
    assert_eq!(unknown["error"]["code"], INVALID_PARAMS, "{unknown}");

    // Gateway tools act for the session the Lemon-Session header names.
    let mut in_chat = Client::new(&endpoint, API_TOKEN);
    in_chat.headers.push(("lemon-session", TELEGRAM_CHAT.to_owned()));
    in_chat.initialize().await;
    let names = in_chat.tool_names().await;
    assert_eq!(names, ["cancel", "note_down", "run", "runs", "status", "tg_only"]);
    let answer = in_chat.tool("tg_only", json!({ "text": "file" })).await;
    // No run delivers the files its result queues.
    assert_eq!(answer["result"]["isError"], true, "{answer}");
    let text = answer["result"]["content"][0]["text"].as_str().unwrap();
    assert!(text.contains("belongs to no run"), "{text}");
    let answer = client.tool("note_down", json!({ "text": "y" })).await;
    assert_eq!(answer["result"]["content"][0]["text"], "recorded y", "{answer}");
    assert_ne!(answer["result"]["isError"], true, "{answer}");
    let calls = seen.lock().unwrap().clone();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].session_key, "default");
    assert!(calls[0].run_id.starts_with("mcp_"), "{}", calls[0].run_id);
}

#[tokio::test]
async fn tools_list_comes_in_pages_with_an_opaque_cursor() {
    let endpoint = serve(Vec::new()).await;
    let n = 60;
    for i in 0..n {
        endpoint.tools.register(Arc::new(Recorder::new(&format!("tool_{i:02}"))));
    }
    let mut client = Client::new(&endpoint, API_TOKEN);
    client.initialize().await;
    let first = client.call("tools/list", json!({})).await;
    assert_eq!(first["result"]["tools"].as_array().unwrap().len(), 50, "pages of 50 tools");
    let cursor = first["result"]["nextCursor"].as_str().unwrap().to_owned();
    assert!(!cursor.contains("tool_"), "the cursor is opaque: {cursor}");
    let second = client.call("tools/list", json!({ "cursor": cursor })).await;
    assert_eq!(second["result"]["tools"].as_array().unwrap().len(), n + 4 - 50);
    assert!(second["result"]["nextCursor"].is_null(), "{second}");

    let names = client.tool_names().await;
    let mut sorted = names.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(names, sorted, "every tool once, in name order");
    assert_eq!(names.len(), n + 4);

    for bad in ["not-a-cursor!", "dG9vbF8wMQ"] {
        let refused = client.call("tools/list", json!({ "cursor": bad })).await;
        assert_eq!(refused["error"]["code"], INVALID_PARAMS, "{bad}: {refused}");
    }
}

#[tokio::test]
async fn a_session_is_told_when_the_tools_change() {
    let endpoint = serve(Vec::new()).await;
    let mut client = Client::new(&endpoint, API_TOKEN);
    client.initialize().await;
    // The session's stream of server messages.
    let stream = endpoint
        .http
        .get(&endpoint.url)
        .bearer_auth(API_TOKEN)
        .header("accept", "text/event-stream")
        .header("mcp-session-id", client.session.clone().unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status(), 200);
    endpoint.tools.register(Arc::new(Recorder::new("new_tool")));
    let mut body = stream.bytes_stream();
    let mut text = String::new();
    let told = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(chunk) = body.next().await {
            text.push_str(&String::from_utf8_lossy(&chunk.unwrap()));
            if text.contains("notifications/tools/list_changed") {
                return;
            }
        }
        panic!("the stream ended: {text}");
    })
    .await;
    assert!(told.is_ok(), "no list_changed within 10 s");
    assert!(client.tool_names().await.contains(&"new_tool".to_owned()));
}
