//! The routes' answers against the OpenAPI document. A walk through every
//! route of the API, on a gateway running the echo engine, checks each
//! answer's status is one its route documents and each JSON body has the
//! documented shape (no key missing, none added, every type right), written
//! with its keys in order: the bytes the API wrote before its bodies had
//! types. The response types the walk cannot reach (a cluster node's) are
//! checked from samples, and those whose JSON core also writes (cron jobs,
//! transport states, approvals, MCP servers, artifacts) write the same.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use axum::Router;
use lemon_core::testing::within;
use serde::Serialize;
use serde_json::{json, Value};
use tower::ServiceExt;

use super::openapi_tests::secrets_routes;
use super::router_with;
use super::tests::{FakeMcp, MemoryConfig, TestGateway};
use crate::openapi::{conformance, document, routes};

const TOKEN: &str = "test-token-6f1c";

/// Routes the walk does not answer with a success, and why.
const NOT_WALKED: [(&str, &str); 3] = [
    ("GET /v1/events", "the firehose never ends; its events are described as SSE frames"),
    (
        "GET /v1/cluster/config",
        "a cluster node needs PostgreSQL; its types are checked from samples",
    ),
    (
        "PUT /v1/cluster/config",
        "a cluster node needs PostgreSQL; its types are checked from samples",
    ),
];

/// What one answer was.
struct Answer {
    status: StatusCode,
    content_type: String,
    bytes: Vec<u8>,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.bytes).unwrap_or(Value::Null)
    }
}

/// A walk through the routes, collecting what disagrees with the document.
struct Walk {
    app: Router,
    doc: Value,
    /// `"GET /v1/runs/{id}"` of every success seen.
    succeeded: BTreeSet<String>,
    problems: Vec<String>,
}

impl Walk {
    fn new(app: Router) -> Self {
        let doc = serde_json::to_value(document()).unwrap();
        Walk { app, doc, succeeded: BTreeSet::new(), problems: Vec::new() }
    }

    /// `method uri` (the route `template`) with `body`, checked against the
    /// document. `token`: whether it carries the bearer token.
    async fn send(
        &mut self,
        method: Method,
        template: &str,
        uri: &str,
        body: Option<Value>,
        token: bool,
    ) -> Answer {
        let mut request = Request::builder().method(method.clone()).uri(uri);
        if token {
            request = request.header(header::AUTHORIZATION, format!("Bearer {TOKEN}"));
        }
        let body = match body {
            Some(body) => {
                request = request.header(header::CONTENT_TYPE, "application/json");
                Body::from(body.to_string())
            }
            None => Body::empty(),
        };
        let what = format!("{method} {uri}");
        let response =
            within(&what, self.app.clone().oneshot(request.body(body).unwrap())).await.unwrap();
        let status = response.status();
        let content_type = response
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|value| value.to_str().ok())
            .map(|value| value.split(';').next().unwrap_or_default().trim().to_owned())
            .unwrap_or_default();
        let bytes = within(&what, axum::body::to_bytes(response.into_body(), usize::MAX))
            .await
            .unwrap()
            .to_vec();
        let answer = Answer { status, content_type, bytes };
        self.judge(&method, template, &what, &answer);
        answer
    }

    async fn call(&mut self, method: Method, uri: &str, body: Option<Value>) -> Answer {
        let template = template_of(uri);
        self.send(method, &template, uri, body, true).await
    }

    fn judge(&mut self, method: &Method, template: &str, what: &str, answer: &Answer) {
        let operation = format!("{method} {template}");
        let status = answer.status.as_u16();
        let method = method.as_str().to_ascii_lowercase();
        let documented = self.doc["paths"][template][&method]["responses"][status.to_string()]
            .as_object()
            .is_some();
        if !documented {
            self.problems.push(format!("{what}: status {status} is not documented"));
            return;
        }
        if answer.status.is_success() {
            self.succeeded.insert(operation);
        }
        let Some(schema) = conformance::response_schema(
            &self.doc,
            &method,
            template,
            status,
            &answer.content_type,
        ) else {
            if !answer.bytes.is_empty() {
                self.problems.push(format!(
                    "{what}: {status} in {:?} is not a content type the document gives",
                    answer.content_type
                ));
            }
            return;
        };
        if answer.content_type != "application/json" {
            return;
        }
        let Ok(body) = serde_json::from_slice::<Value>(&answer.bytes) else {
            self.problems.push(format!("{what}: {status} is not JSON"));
            return;
        };
        for problem in conformance::problems(&self.doc, schema, &body) {
            self.problems.push(format!("{what}: {status}: {problem}"));
        }
        // The document is written by utoipa in its own order, as it always was.
        let written_in_order =
            template == "/v1/openapi.json" || serde_json::to_vec(&body).unwrap() == answer.bytes;
        if !written_in_order {
            let text = String::from_utf8_lossy(&answer.bytes);
            let start: String = text.chars().take(160).collect();
            self.problems.push(format!("{what}: {status}: keys not in order: {start}"));
        }
    }
}

/// The route of `uri`: its query dropped, and the value of its path
/// parameter (the walk's routes have one at most) replaced by the parameter.
fn template_of(uri: &str) -> String {
    let path = uri.split('?').next().unwrap_or(uri);
    let mut segments: Vec<&str> = path.split('/').collect();
    let parameter = match segments.get(2).copied() {
        Some("runs" | "cron" | "models" | "approvals") => "{id}",
        Some("sessions") => "{key}",
        Some("secrets") => "{name}",
        _ => return path.to_owned(),
    };
    if let Some(value) = segments.get_mut(3) {
        *value = parameter;
    }
    segments.join("/")
}

/// A gateway whose every optional part is on: an MCP client, a config file,
/// a store location, transports, secrets, a sandbox, a waiting approval.
fn walked_gateway() -> (TestGateway, tempfile::TempDir) {
    use lemon_core::mcp::{McpServerState, McpServerStatus, McpTransportKind};
    use lemon_core::transport::TransportState;
    let mut gw = TestGateway::start(Duration::ZERO);
    let dir = tempfile::tempdir().unwrap();
    gw.state.mcp = Some(Arc::new(FakeMcp(vec![McpServerStatus {
        name: "github".into(),
        transport: McpTransportKind::Http,
        state: McpServerState::Running,
        tools: vec!["github__search".into()],
        error: None,
        calls: [("ok".to_owned(), 2)].into(),
        starts: 1,
    }])));
    gw.state.config_file = Some(Arc::new(MemoryConfig::default()));
    gw.state.database =
        Some(lemon_core::store::StoreLocation::File(dir.path().join("lemon.db").into()));
    gw.state.transports.set("telegram", TransportState::Running { detail: Some("@bot".into()) });
    gw.state.transports.set(
        "webhook",
        TransportState::Failing { reason: "port in use".into(), attempts: 2, retry_in_ms: None },
    );
    gw.state.transports.set("discord", TransportState::Disabled);
    gw.state.secret_sources = Arc::from([(
        "telegram_bot_token".to_owned(),
        lemon_core::secrets::SecretOrigin {
            source: "the secrets file".into(),
            overrides: vec!["the environment variable TELEGRAM_BOT_TOKEN".into()],
        },
    )]);
    gw.state.sandbox = json!({
        "mode": "auto", "landlock_abi": null, "enforced": false,
        "detail": "no Landlock on this kernel: bash runs with the gateway's own access",
    });
    gw.state.upkeep.pruned(lemon_core::store::upkeep::PrunePass {
        at_ms: 1_700_000_000_000,
        took_ms: 12,
        removed: [("runs", 3)].into(),
        error: None,
    });
    gw.state.upkeep.backed_up(lemon_core::store::upkeep::Backup {
        at_ms: 1_700_000_000_000,
        path: dir.path().join("backup.db"),
    });
    (gw, dir)
}

#[tokio::test]
async fn every_answer_of_every_route_has_the_documented_shape() {
    let (gw, dir) = walked_gateway();
    let waiting = gw.state.approvals.ask(lemon_core::approvals::ApprovalRequest {
        run_id: "walk-2".into(),
        session_key: "walk".into(),
        tool: "bash".into(),
        subject: "rm -rf build".into(),
        rule: "ask for bash".into(),
        untrusted: Some("webhook ci".into()),
        timeout: Duration::from_secs(3600),
    });
    let approval_id = waiting.request.id.clone();
    let app = router_with(gw.state.clone(), secrets_routes(dir.path()));
    let mut walk = Walk::new(app);

    // Runs.
    let one = json!({ "prompt": "walk one", "run_id": "walk-1", "session_key": "walk" });
    assert_eq!(walk.call(Method::POST, "/v1/runs", Some(one)).await.status, StatusCode::ACCEPTED);
    let two = json!({ "prompt": "walk two", "run_id": "walk-2", "session_key": "walk" });
    let waited = walk.call(Method::POST, "/v1/runs?wait=true", Some(two.clone())).await;
    assert_eq!((waited.status, &waited.json()["status"]), (StatusCode::OK, &json!("completed")));
    assert_eq!(walk.call(Method::POST, "/v1/runs", Some(two)).await.json()["duplicate"], true);
    let slash = json!({ "prompt": "/status", "session_key": "walk" });
    assert_eq!(walk.call(Method::POST, "/v1/runs", Some(slash)).await.json()["command"], "status");
    walk.call(Method::POST, "/v1/runs", Some(json!({ "prompt": "" }))).await;
    walk.call(Method::GET, "/v1/runs?limit=5", None).await;
    walk.call(Method::GET, "/v1/runs/walk-2", None).await;
    walk.call(Method::GET, "/v1/runs/nowhere", None).await;
    walk.call(Method::POST, "/v1/runs/walk-2/cancel", None).await;
    walk.call(Method::POST, "/v1/runs/walk-2/steer", Some(json!({ "text": "faster" }))).await;
    let events = walk.call(Method::GET, "/v1/runs/walk-2/events", None).await;
    assert!(String::from_utf8_lossy(&events.bytes).contains("run_completed"));

    // Sessions, budgets and usage.
    walk.call(Method::GET, "/v1/sessions/walk", None).await;
    walk.call(Method::POST, "/v1/sessions/walk/cancel", None).await;
    walk.call(Method::POST, "/v1/sessions/walk/abort", None).await;
    walk.call(Method::GET, "/v1/sessions/walk/export", None).await;
    walk.call(Method::GET, "/v1/sessions/walk/budget", None).await;
    let limits = json!({ "run_usd": 1.5, "session_daily_tokens": 100_000 });
    walk.call(Method::PUT, "/v1/sessions/walk/budget", Some(limits)).await;
    walk.call(Method::GET, "/v1/usage", None).await;

    // Status, intake, approvals.
    let status = walk.call(Method::GET, "/v1/status", None).await.json();
    assert!(status["store"].is_object() && status["mcp_servers"][0].is_object(), "{status}");
    walk.call(Method::POST, "/v1/intake/pause", None).await;
    walk.call(Method::POST, "/v1/intake/resume", None).await;
    let listed = walk.call(Method::GET, "/v1/approvals", None).await.json();
    assert_eq!(listed["approvals"][0]["id"], approval_id.as_str());
    let decide = json!({ "decision": "deny" });
    walk.call(Method::POST, &format!("/v1/approvals/{approval_id}"), Some(decide)).await;
    drop(waiting);

    // Config.
    walk.call(Method::GET, "/v1/config", None).await;
    let good = "[gateway]\nmax_concurrent_runs = 2\n";
    walk.call(Method::PUT, "/v1/config", Some(json!({ "text": good }))).await;
    walk.call(Method::PUT, "/v1/config", Some(json!({ "text": "[gateway\n" }))).await;
    walk.call(Method::GET, "/v1/config/file", None).await;
    walk.call(Method::GET, "/v1/cluster/config", None).await;

    // Cron.
    let job = json!({ "schedule": "@daily", "prompt": "walk cron", "timezone": "Europe/Paris" });
    let created = walk.call(Method::POST, "/v1/cron", Some(job)).await.json();
    let id = created["id"].as_str().unwrap().to_owned();
    walk.call(Method::GET, "/v1/cron", None).await;
    walk.call(Method::PATCH, &format!("/v1/cron/{id}"), Some(json!({ "name": "walked" }))).await;
    let mut updates = gw.state.cron.subscribe_runs();
    walk.call(Method::POST, &format!("/v1/cron/{id}/run"), None).await;
    within("the cron run ends", async {
        while updates.recv().await.unwrap().status.is_active() {}
    })
    .await;
    walk.call(Method::GET, &format!("/v1/cron/{id}/runs"), None).await;
    walk.call(Method::DELETE, &format!("/v1/cron/{id}"), None).await;

    // Secrets.
    walk.call(Method::PUT, "/v1/secrets/walk_secret", Some(json!({ "value": "v-1234" }))).await;
    walk.call(Method::GET, "/v1/secrets", None).await;
    walk.call(Method::DELETE, "/v1/secrets/walk_secret", None).await;

    // The OpenAI-compatible routes.
    walk.call(Method::GET, "/v1/models", None).await;
    walk.call(Method::GET, "/v1/models/echo", None).await;
    walk.call(Method::GET, "/v1/models/nowhere", None).await;
    let messages = json!([{ "role": "user", "content": "hello chat" }]);
    let chat = json!({ "model": "echo", "messages": messages });
    let completion = walk.call(Method::POST, "/v1/chat/completions", Some(chat)).await.json();
    assert_eq!(completion["choices"][0]["message"]["content"], "hello chat");
    let chat = json!({ "model": "echo", "messages": messages, "stream": true });
    walk.call(Method::POST, "/v1/chat/completions", Some(chat)).await;
    let response = walk
        .call(Method::POST, "/v1/responses", Some(json!({ "model": "echo", "input": "hi" })))
        .await;
    assert_eq!(response.json()["status"], "completed");
    let streamed = json!({ "model": "echo", "input": "hi", "stream": true });
    walk.call(Method::POST, "/v1/responses", Some(streamed)).await;

    // The document, and refusals in both error shapes.
    walk.call(Method::GET, "/v1/openapi.json", None).await;
    let refused = walk.send(Method::GET, "/v1/runs", "/v1/runs", None, false).await;
    assert_eq!(refused.status, StatusCode::UNAUTHORIZED);
    let refused = walk.send(Method::GET, "/v1/models", "/v1/models", None, false).await;
    assert_eq!(refused.status, StatusCode::UNAUTHORIZED);

    assert!(walk.problems.is_empty(), "answers off the document:\n{}", walk.problems.join("\n"));
    let exempt: BTreeSet<&str> = NOT_WALKED.iter().map(|(route, _)| *route).collect();
    let unwalked: Vec<String> = routes::documented(&document())
        .into_iter()
        .filter(|route| !walk.succeeded.contains(route) && !exempt.contains(route.as_str()))
        .collect();
    assert!(unwalked.is_empty(), "routes the walk never answered with a success: {unwalked:?}");
}

/// The walk finds a body that differs from its route's description.
#[tokio::test]
async fn the_walk_finds_an_answer_off_the_document() {
    let app = Router::new()
        .route("/v1/status", axum::routing::get(|| async { axum::Json(json!({ "paused": 1 })) }))
        .route(
            "/v1/intake/pause",
            axum::routing::post(|| async {
                ([(header::CONTENT_TYPE, "application/json")], "{\"paused\":true,\"a\":1}")
            }),
        )
        .route("/v1/usage", axum::routing::get(|| async { (StatusCode::IM_A_TEAPOT, "") }));
    let mut walk = Walk::new(app);
    walk.call(Method::GET, "/v1/status", None).await;
    walk.call(Method::POST, "/v1/intake/pause", None).await;
    walk.call(Method::GET, "/v1/usage", None).await;
    let found = walk.problems.join("\n");
    for expected in [
        "GET /v1/status: 200: /: required key \"version\" is missing",
        "GET /v1/status: 200: /paused: 1 is not of type boolean",
        "POST /v1/intake/pause: 200: /: key \"a\" is not in the document",
        "POST /v1/intake/pause: 200: keys not in order",
        "GET /v1/usage: status 418 is not documented",
    ] {
        assert!(found.contains(expected), "{expected:?} not found in:\n{found}");
    }
}

/// `value`, a `T`, conforms to `T`'s schema in the document, and is written
/// with its keys in order.
fn conforms<T: Serialize + utoipa::ToSchema>(value: &T) -> String {
    let doc = serde_json::to_value(document()).unwrap();
    let name = T::name();
    assert!(
        doc["components"]["schemas"][name.as_ref()].is_object(),
        "{name} is not in the document"
    );
    let schema = json!({ "$ref": format!("#/components/schemas/{name}") });
    let body = serde_json::to_value(value).unwrap();
    let problems = conformance::problems(&doc, &schema, &body);
    assert!(problems.is_empty(), "{name}: {problems:#?}");
    let written = serde_json::to_string(value).unwrap();
    assert_eq!(written, body.to_string(), "{name}: keys not in order");
    written
}

#[test]
fn a_cluster_nodes_answers_have_their_documented_shape() {
    use crate::cluster::{
        ClusterChannel, ClusterConfigVersions, ClusterNodeStatus, ClusterSlots, ClusterStatus,
    };
    let config = ClusterConfigVersions { applied_version: Some(3), error: None, version: Some(4) };
    let read = ClusterStatus {
        channels: Some(vec![ClusterChannel {
            channel: "telegram:bot".into(),
            epoch: 2,
            live: true,
            node: "node-a".into(),
        }]),
        config: config.clone(),
        error: None,
        fenced: false,
        node: "node-a".into(),
        nodes: Some(vec![ClusterNodeStatus {
            alive: true,
            api_base_url: Some("http://10.0.0.2:4040".into()),
            channels: vec!["telegram:bot".into()],
            id: "node-a".into(),
            last_heartbeat_ms: 1_700_000_000_500,
            started_at_ms: 1_700_000_000_000,
            version: "1.2.3".into(),
        }]),
        sessions_here: 4,
        slots: Some(ClusterSlots { in_use: 1, total: 8 }),
        term_ms: 15_000,
    };
    conforms(&read);
    let unread = ClusterStatus {
        channels: None,
        error: Some("no answer within 2 s".into()),
        nodes: None,
        slots: None,
        ..read
    };
    let written = conforms(&unread);
    assert!(!written.contains("\"nodes\"") && written.contains("\"error\""), "{written}");
    conforms(&super::cluster_config::ClusterConfigRow {
        applied_version: Some(4),
        body: "[gateway]\nmax_concurrent_runs = 4\n".into(),
        updated_at_ms: 1_700_000_000_000,
        updated_by: Some("node-a".into()),
        version: 4,
    });
    conforms(&super::cluster_config::ClusterConfigRefused {
        column: Some(3),
        error: "gateway.api: unknown key".into(),
        key: Some("gateway.api".into()),
        line: Some(2),
    });
    conforms(&super::cluster_config::ClusterConfigConflict {
        error: "the cluster config is at version 5, not 4".into(),
        version: 5,
    });
}

#[test]
fn a_run_with_every_field_set_has_its_documented_shape() {
    use super::transfer::{Artifact, Compacted, ResumeBody, Run, RunStatusName, Spend};
    let token = ResumeBody { engine: "claude".into(), value: "sess-1".into() };
    conforms(&Run {
        answer: Some("done".into()),
        artifacts: Some(vec![Artifact {
            caption: Some("the chart".into()),
            filename: "chart.png".into(),
            mime: "image/png".into(),
            path: "/work/proj/chart.png".into(),
            size: 2048,
        }]),
        compacted: Some(Compacted {
            actions: vec![json!({ "kind": "command", "title": "ls", "ok": true, "message": null })],
            at_ms: 1_700_000_100_000,
            events: 42,
        }),
        completed_at_ms: Some(1_700_000_001_000),
        created_at_ms: 1_700_000_000_000,
        duration_ms: Some(900),
        engine: "claude:opus".into(),
        error: None,
        error_code: None,
        meta: json!({ "origin": "test" }),
        prompt: "chart it".into(),
        resume: Some(token.clone()),
        resume_line: Some("claude --resume sess-1".into()),
        resumed_from: Some(token),
        run_id: "run-1".into(),
        session_key: "default".into(),
        spend: Spend {
            cache_read_tokens: 1,
            cache_write_tokens: 2,
            input_tokens: 3,
            output_tokens: 4,
            usd: 0.25,
        },
        started_at_ms: Some(1_700_000_000_100),
        status: RunStatusName::Completed,
        untrusted: Some("webhook ci".into()),
        usage: json!({ "input_tokens": 3 }),
    });
}

#[test]
fn the_types_core_also_writes_are_written_the_same() {
    use lemon_core::transport::TransportState;
    // Cron jobs and runs: the `cron` tool writes core's form.
    let job = lemon_core::cron::CronJob {
        id: "cron_1".into(),
        name: "daily".into(),
        schedule: "0 9 * * 1-5".into(),
        prompt: "report".into(),
        session_key: "agent:ops:main".into(),
        agent_id: "ops".into(),
        memory_file: Some("notes.md".into()),
        timezone: "Europe/Paris".into(),
        enabled: true,
        jitter_sec: 30,
        timeout_ms: 300_000,
        max_retries: 1,
        retry_backoff_ms: 30_000,
        meta: json!({ "k": 1 }),
        source: lemon_core::cron::JobSource::Config,
        created_at_ms: 1,
        updated_at_ms: 2,
        last_run_at_ms: None,
        next_run_at_ms: Some(3),
    };
    assert_eq!(conforms(&super::cron::CronJob::from(&job)), job.to_json().to_string());
    for trigger in [lemon_core::cron::Trigger::Manual, lemon_core::cron::Trigger::Schedule] {
        let run = lemon_core::cron::CronRun {
            id: "crun_1".into(),
            job_id: "cron_1".into(),
            router_run_id: Some("run-9".into()),
            status: lemon_core::cron::CronRunStatus::TimedOut,
            trigger,
            attempt: 2,
            started_at_ms: 5,
            ended_at_ms: None,
            output: Some("too slow".into()),
        };
        assert_eq!(conforms(&super::cron::CronRun::from(&run)), run.to_json().to_string());
    }
    // Transport states: `/healthz` and the dashboard write core's form.
    for state in [
        TransportState::Disabled,
        TransportState::Starting,
        TransportState::Running { detail: None },
        TransportState::Running { detail: Some("@bot".into()) },
        TransportState::Failing { reason: "refused".into(), attempts: 3, retry_in_ms: Some(800) },
        TransportState::Failing { reason: "fatal".into(), attempts: 1, retry_in_ms: None },
        TransportState::Stopped,
    ] {
        let ours = conforms(&super::status::TransportStatus::from(&state));
        assert_eq!(ours, state.to_json().to_string());
    }
    // Approvals and MCP servers: the dashboard's live page reads core's form.
    for untrusted in [None, Some("email from ann@example.com".to_owned())] {
        let pending = lemon_core::approvals::PendingApproval {
            id: "apr_1".into(),
            code: "4821".into(),
            run_id: "run-1".into(),
            session_key: "default".into(),
            tool: "bash".into(),
            subject: "rm -rf build".into(),
            rule: "ask for bash".into(),
            untrusted,
            requested_at_ms: 1,
            expires_at_ms: 2,
        };
        let core = serde_json::to_value(&pending).unwrap().to_string();
        assert_eq!(conforms(&super::approvals::PendingApproval::from(pending)), core);
    }
    let server = lemon_core::mcp::McpServerStatus {
        name: "fs".into(),
        transport: lemon_core::mcp::McpTransportKind::Stdio,
        state: lemon_core::mcp::McpServerState::Failed,
        tools: vec!["fs__read".into()],
        error: Some("npx is not on the PATH".into()),
        calls: [("error".to_owned(), 1)].into(),
        starts: 3,
    };
    let core = serde_json::to_value(&server).unwrap().to_string();
    assert_eq!(conforms(&super::status::McpServerStatus::from(server)), core);
    // Artifacts: the stored `run_completed` and SSE write core's form.
    let artifact = lemon_core::artifacts::Artifact {
        path: "/work/proj/chart.png".into(),
        filename: "chart.png".into(),
        caption: None,
        size: 2048,
    };
    let core = serde_json::to_value(lemon_core::bus::ArtifactJson(&artifact)).unwrap();
    assert_eq!(conforms(&super::transfer::Artifact::from(&artifact)), core.to_string());
}
