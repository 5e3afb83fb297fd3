//! Tests of the health router against a real gateway.

use lemon_core::testing::within;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use lemon_core::bus::EventBus;
use lemon_core::engine::EngineRegistry;
use lemon_core::gateway::{GatewayDeps, GatewayHandle, RuntimeConfig};
use lemon_core::router::{RouterConfig, RouterHandle};
use lemon_core::store::StoreHandle;
use lemon_engines::echo::EchoEngine;
use serde_json::{json, Value};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt;

use super::{health_router, HealthCheck, HealthState};
use lemon_core::transport::{TransportState, TransportStatuses};

struct TestGateway {
    router: RouterHandle,
    store: StoreHandle,
    token: CancellationToken,
    tracker: TaskTracker,
}

impl TestGateway {
    fn start() -> Self {
        let tracker = TaskTracker::new();
        let token = CancellationToken::new();
        let mut engines = EngineRegistry::new();
        engines.register(Arc::new(EchoEngine::new(Duration::ZERO, tracker.clone()))).unwrap();
        let store = StoreHandle::memory();
        let deps = GatewayDeps {
            config: RuntimeConfig { max_concurrent_runs: 4, ..RuntimeConfig::default() },
            engines,
            store: store.clone(),
            bus: EventBus::default(),
        };
        let gateway = GatewayHandle::start(deps, token.clone(), &tracker);
        let config =
            RouterConfig { default_engine: "echo".parse().unwrap(), ..RouterConfig::default() };
        let router = RouterHandle::start(config, gateway, token.clone(), &tracker);
        TestGateway { router, store, token, tracker }
    }

    /// The state the server builds: detail for requests with [`DETAIL_TOKEN`].
    fn state(&self) -> HealthState {
        HealthState::new(self.router.query(), "9.9.9", Instant::now())
            .with_detail_token(DETAIL_TOKEN)
    }

    async fn shut_down(&self) {
        self.token.cancel();
        self.tracker.close();
        within("the gateway to stop", self.tracker.wait()).await;
    }
}

impl Drop for TestGateway {
    fn drop(&mut self) {
        self.token.cancel();
    }
}

/// The API token, which unlocks the detailed health report.
const DETAIL_TOKEN: &str = "health-detail-token-0123";

/// `path` with the API token: the detailed report.
async fn get(state: HealthState, method: Method, path: &str) -> (StatusCode, String, String) {
    get_with(state, method, path, Some(DETAIL_TOKEN)).await
}

async fn get_with(
    state: HealthState,
    method: Method,
    path: &str,
    bearer: Option<&str>,
) -> (StatusCode, String, String) {
    let mut req = Request::builder().method(method).uri(path);
    if let Some(token) = bearer {
        req = req.header(header::AUTHORIZATION, format!("Bearer {token}"));
    }
    let req = req.body(Body::empty()).unwrap();
    let response = within(path, health_router(state).oneshot(req)).await.unwrap();
    let status = response.status();
    let content_type = response.headers()[header::CONTENT_TYPE].to_str().unwrap().to_owned();
    let bytes = within(path, axum::body::to_bytes(response.into_body(), usize::MAX)).await.unwrap();
    (status, content_type, String::from_utf8(bytes.to_vec()).unwrap())
}

async fn get_json(state: HealthState, path: &str) -> (StatusCode, Value) {
    let (status, _, body) = get(state, Method::GET, path).await;
    (status, serde_json::from_str(&body).unwrap_or_else(|_| panic!("{path}: not JSON: {body}")))
}

fn check<'a>(body: &'a Value, name: &str) -> &'a Value {
    body["checks"].as_array().unwrap().iter().find(|c| c["name"] == json!(name)).unwrap()
}

/// A check that never answers.
#[derive(Debug)]
struct Hangs;

#[async_trait]
impl HealthCheck for Hangs {
    fn name(&self) -> &str {
        "hangs"
    }

    async fn check(&self) -> Result<Value, String> {
        futures::future::pending().await
    }
}

/// A check that passes with a detail.
#[derive(Debug)]
struct Fine;

#[async_trait]
impl HealthCheck for Fine {
    fn name(&self) -> &str {
        "fine"
    }

    async fn check(&self) -> Result<Value, String> {
        Ok(json!({ "mode": "test" }))
    }
}

#[tokio::test]
async fn healthy_gateway_reports_three_passing_checks() {
    let gw = TestGateway::start();
    for path in ["/healthz", "/health"] {
        let (status, body) = get_json(gw.state(), path).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(body["ok"], json!(true));
        assert_eq!(body["app"], json!("lemon_gateway"));
        assert_eq!(body["version"], json!("9.9.9"));
        let timestamp = body["timestamp"].as_str().unwrap();
        assert!(
            timestamp.len() == 24 && timestamp.ends_with('Z') && timestamp.as_bytes()[10] == b'T',
            "{timestamp}"
        );
        let names: Vec<&str> = body["checks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["scheduler", "store", "runs"]);
        for entry in body["checks"].as_array().unwrap() {
            assert_eq!(entry["ok"], json!(true), "{entry}");
            assert!(entry["duration_ms"].is_u64(), "{entry}");
            assert!(entry.get("error").is_none(), "{entry}");
        }
        assert_eq!(
            check(&body, "scheduler")["detail"],
            json!({ "in_flight": 0, "waitq": 0, "max": 4 })
        );
        assert_eq!(check(&body, "store")["detail"], Value::Null);
        assert_eq!(check(&body, "runs")["detail"], json!({ "active": 0 }));
        assert_eq!(body["status"], json!("healthy"));
        assert_eq!(body["transports"], json!({}));
    }
}

#[tokio::test]
async fn a_failing_transport_makes_the_gateway_degraded_but_not_down() {
    let gw = TestGateway::start();
    let transports = TransportStatuses::default();
    transports.set("webhook", TransportState::Running { detail: Some("127.0.0.1:4046".into()) });
    transports.set("telegram", TransportState::Disabled);
    let state = || gw.state().with_transports(transports.clone());
    let (status, body) = get_json(state(), "/healthz").await;
    assert_eq!((status, &body["status"]), (StatusCode::OK, &json!("healthy")), "{body}");
    assert_eq!(
        body["transports"],
        json!({
            "telegram": { "state": "disabled" },
            "webhook": { "state": "running", "detail": "127.0.0.1:4046" },
        })
    );

    transports.set(
        "webhook",
        TransportState::Failing {
            reason: "could not listen on 127.0.0.1:4046: Address in use".into(),
            attempts: 3,
            retry_in_ms: Some(4000),
        },
    );
    for path in ["/healthz", "/health"] {
        let (status, body) = get_json(state(), path).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(body["ok"], json!(true));
        assert_eq!(body["status"], json!("degraded"));
        assert_eq!(body["transports"]["webhook"]["state"], json!("failing"));
        assert_eq!(body["transports"]["webhook"]["attempts"], json!(3));
    }
    let (_, _, text) = get(state(), Method::GET, "/metrics").await;
    assert!(
        text.lines().any(|l| l == "lemon_transport_running{transport=\"webhook\"} 0"),
        "{text}"
    );
    assert!(
        text.lines().any(|l| l == "lemon_transport_running{transport=\"telegram\"} 0"),
        "{text}"
    );

    // A failed check still wins: unhealthy and 503.
    gw.store.close().await.unwrap();
    let (status, body) = get_json(state(), "/healthz").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["status"], json!("unhealthy"));
}

#[tokio::test]
async fn stopped_gateway_is_unhealthy() {
    let gw = TestGateway::start();
    gw.shut_down().await;
    let (status, body) = get_json(gw.state(), "/healthz").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["ok"], json!(false));
    let scheduler = check(&body, "scheduler");
    assert_eq!(scheduler["ok"], json!(false));
    assert_eq!(scheduler["error"], json!("the gateway is shutting down"));
    assert!(scheduler.get("detail").is_none(), "{scheduler}");
    assert_eq!(check(&body, "store")["ok"], json!(true));
    assert_eq!(check(&body, "runs")["ok"], json!(false));
}

#[tokio::test]
async fn closed_store_is_unhealthy() {
    let gw = TestGateway::start();
    gw.store.close().await.unwrap();
    let (status, body) = get_json(gw.state(), "/healthz").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(check(&body, "store")["error"], json!("store is closed"));
    assert_eq!(check(&body, "scheduler")["ok"], json!(true));
}

#[tokio::test]
async fn extra_checks_follow_and_a_hanging_one_times_out() {
    let gw = TestGateway::start();
    let mut state = gw.state().with_check(Arc::new(Fine)).with_check(Arc::new(Hangs));
    state.check_timeout = Duration::from_millis(50);
    let (status, body) = get_json(state, "/healthz").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    let names: Vec<&str> =
        body["checks"].as_array().unwrap().iter().map(|c| c["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["scheduler", "store", "runs", "fine", "hangs"]);
    assert_eq!(check(&body, "fine")["detail"], json!({ "mode": "test" }));
    let hangs = check(&body, "hangs");
    assert_eq!(hangs["ok"], json!(false));
    assert_eq!(hangs["error"], json!("timed out after 50 ms"));
    assert!(hangs["duration_ms"].as_u64().unwrap() >= 50, "{hangs}");
}

#[tokio::test]
async fn metrics_expose_scheduler_counters_and_uptime() {
    let gw = TestGateway::start();
    let (status, content_type, text) = get(gw.state(), Method::GET, "/metrics").await;
    assert_eq!(status, StatusCode::OK);
    assert!(content_type.starts_with("text/plain"), "{content_type}");
    for line in [
        "lemon_up 1",
        "lemon_runs_in_flight 0",
        "lemon_runs_waiting 0",
        "lemon_runs_max 4",
        "lemon_conversations 0",
        "lemon_runs_queued 0",
        "# TYPE lemon_uptime_seconds gauge",
    ] {
        assert!(text.lines().any(|l| l == line), "{line:?} missing from:\n{text}");
    }
    assert!(text.lines().any(|l| l.starts_with("lemon_uptime_seconds ")), "{text}");

    gw.shut_down().await;
    let (status, _, text) = get(gw.state(), Method::GET, "/metrics").await;
    assert_eq!(status, StatusCode::OK);
    assert!(text.lines().any(|l| l == "lemon_up 0"), "{text}");
    assert!(!text.contains("lemon_runs_max"), "{text}");
}

#[tokio::test]
async fn unknown_paths_and_methods_are_json_errors() {
    let gw = TestGateway::start();
    let (status, body) = get_json(gw.state(), "/nope").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(body, json!({ "error": "not found" }));
    let (status, _, body) = get(gw.state(), Method::POST, "/healthz").await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap(),
        json!({ "error": "method not allowed" })
    );
}

#[tokio::test]
async fn without_the_token_health_names_checks_and_states_only() {
    let gw = TestGateway::start();
    let transports = TransportStatuses::default();
    transports.set(
        "webhook",
        TransportState::Failing {
            reason: "could not listen on 127.0.0.1:4046: Address in use".into(),
            attempts: 3,
            retry_in_ms: Some(4000),
        },
    );
    transports.set("telegram", TransportState::Running { detail: Some("@my_bot".into()) });
    let state = || gw.state().with_transports(transports.clone());
    gw.store.close().await.unwrap();

    for bearer in [None, Some("wrong-token-0123456789"), Some("")] {
        for path in ["/healthz", "/health"] {
            let (status, _, text) = get_with(state(), Method::GET, path, bearer).await;
            assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{text}");
            let body: Value = serde_json::from_str(&text).unwrap();
            assert_eq!(
                body,
                json!({
                    "ok": false,
                    "status": "unhealthy",
                    "checks": [
                        { "name": "scheduler", "ok": true },
                        { "name": "store", "ok": false },
                        { "name": "runs", "ok": true },
                    ],
                    "transports": {
                        "telegram": { "state": "running" },
                        "webhook": { "state": "failing" },
                    },
                }),
                "{bearer:?} {path}"
            );
            for secret in ["127.0.0.1", "@my_bot", "9.9.9", "store is closed", "in_flight"] {
                assert!(!text.contains(secret), "{secret} in {text}");
            }
        }
    }

    // With the token: everything, as before.
    let (_, body) = get_json(state(), "/healthz").await;
    assert_eq!(body["version"], json!("9.9.9"));
    assert_eq!(check(&body, "store")["error"], json!("store is closed"));
    assert_eq!(check(&body, "scheduler")["detail"]["max"], json!(4));
    assert_eq!(
        body["transports"]["webhook"]["reason"],
        json!("could not listen on 127.0.0.1:4046: Address in use")
    );
    assert_eq!(body["transports"]["telegram"]["detail"], json!("@my_bot"));

    // A state without a token never shows the detail.
    let anonymous_state = HealthState::new(gw.router.query(), "9.9.9", Instant::now());
    let (_, _, text) = get(anonymous_state, Method::GET, "/healthz").await;
    assert!(!text.contains("9.9.9") && !text.contains("store is closed"), "{text}");

    // Metrics need no token and carry no addresses, names or error texts.
    let (status, _, text) = get_with(state(), Method::GET, "/metrics", None).await;
    assert_eq!(status, StatusCode::OK);
    for secret in ["127.0.0.1", "@my_bot", "Address in use", "9.9.9"] {
        assert!(!text.contains(secret), "{secret} in {text}");
    }
    assert!(
        text.lines().any(|l| l == "lemon_transport_running{transport=\"webhook\"} 0"),
        "{text}"
    );
}

#[tokio::test]
async fn a_refused_config_edit_makes_health_degraded_with_the_reason_behind_the_token() {
    let gw = TestGateway::start();
    let config = lemon_core::config::ConfigStatus::default();
    let state = || gw.state().with_config(config.clone());
    let (status, _, text) = get_with(state(), Method::GET, "/healthz", None).await;
    assert_eq!(status, StatusCode::OK);
    let body: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(body["status"], "healthy", "{text}");

    config.update(|report| {
        report.rejected = Some(lemon_core::config::Rejection {
            error: "/h/config.toml:2:23: gateway.max_concurrent_runs: too large".into(),
            at_ms: 1,
        });
    });
    let (status, _, text) = get_with(state(), Method::GET, "/healthz", None).await;
    assert_eq!(status, StatusCode::OK, "the gateway serves on the last good config");
    let body: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(body["status"], "degraded", "{text}");
    assert_eq!(body["config"], json!({ "state": "rejected" }), "no reason without the token");
    let (_, _, text) = get_with(state(), Method::GET, "/healthz", Some(DETAIL_TOKEN)).await;
    let body: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(body["status"], "degraded", "{text}");
    assert_eq!(body["config"]["state"], "rejected");
    assert!(body["config"]["reason"].as_str().unwrap().contains("config.toml:2:23"), "{text}");
}

#[test]
fn session_queues_name_the_longest_twenty_and_sum_the_rest() {
    use lemon_core::bus::RunStatus;
    use lemon_core::gateway::ActiveRun;
    use lemon_core::ids::{ConversationKey, EngineId, EngineRef, RunId, SessionKey};
    let run = |session: &str, status: RunStatus| ActiveRun {
        run_id: RunId::generate(),
        session_key: SessionKey::parse(session).unwrap(),
        conversation: ConversationKey::session(session),
        engine: EngineRef::new(EngineId::builtin("echo")),
        status,
        created_at_ms: 0,
        started_at_ms: None,
    };
    let mut active = Vec::new();
    // Session i has i + 1 queued runs (s00 one, s24 twenty-five) and one running.
    for i in 0..25 {
        let session = format!("s{i:02}");
        active.push(run(&session, RunStatus::Running));
        for _ in 0..=i {
            active.push(run(&session, RunStatus::Queued));
        }
    }
    // The odd key's one request waits at the router.
    let routed = [(SessionKey::parse("odd \"key\"").unwrap(), 1)];
    let mut out = crate::metrics::text::Exposition::default();
    super::session_queues(&mut out, &active, &routed, true);
    let text = out.finish();
    let named: Vec<&str> =
        text.lines().filter(|l| l.starts_with("lemon_session_queue_length{")).collect();
    assert_eq!(named.len(), 20, "{text}");
    assert_eq!(named[0], "lemon_session_queue_length{session=\"s24\"} 25");
    assert_eq!(named[19], "lemon_session_queue_length{session=\"s05\"} 6");
    // s00..s04 (1 + 2 + 3 + 4 + 5) and the odd key's 1 are summed.
    assert!(text.lines().any(|l| l == "lemon_session_queue_rest 16"), "{text}");
    assert!(text.lines().any(|l| l == "lemon_sessions_queued 26"), "{text}");
    assert!(text.contains("# TYPE lemon_session_queue_length gauge"), "{text}");

    // Without the token no session is named: all 26 sessions' 326 runs are summed.
    let mut out = crate::metrics::text::Exposition::default();
    super::session_queues(&mut out, &active, &routed, false);
    let text = out.finish();
    assert!(!text.contains("lemon_session_queue_length{"), "{text}");
    assert!(!text.contains("s24") && !text.contains("odd"), "{text}");
    assert!(text.lines().any(|l| l == "lemon_session_queue_rest 326"), "{text}");
    assert!(text.lines().any(|l| l == "lemon_sessions_queued 26"), "{text}");
}

#[tokio::test]
async fn metrics_show_transport_states_errors_backlog_and_reloads() {
    let gw = TestGateway::start();
    let transports = TransportStatuses::default();
    transports.set("telegram", TransportState::Running { detail: Some("@bot".into()) });
    for attempts in 1..=2 {
        let reason = "port 4046 taken".to_owned();
        transports.set("webhook", TransportState::Failing { reason, attempts, retry_in_ms: None });
    }
    let backlog = lemon_core::transport::Backlog::default();
    backlog.set(7);
    backlog.count(lemon_core::transport::CallOutcome::Sent);
    backlog.count(lemon_core::transport::CallOutcome::Retried);
    backlog.count(lemon_core::transport::CallOutcome::Retried);
    transports.track_backlog("telegram", backlog);
    let config = lemon_core::config::ConfigStatus::default();
    config.update(|report| {
        report.n_applied = 3;
        report.n_rejected = 1;
    });
    let state = gw.state().with_transports(transports).with_config(config);
    let (_, _, text) = get_with(state, Method::GET, "/metrics", None).await;
    for line in [
        "lemon_transport_state{transport=\"telegram\",state=\"running\"} 1",
        "lemon_transport_state{transport=\"telegram\",state=\"failing\"} 0",
        "lemon_transport_state{transport=\"webhook\",state=\"failing\"} 1",
        "lemon_transport_errors_total{transport=\"webhook\"} 2",
        "lemon_transport_errors_total{transport=\"telegram\"} 0",
        "lemon_outbox_backlog{transport=\"telegram\"} 7",
        "lemon_outbox_calls_total{transport=\"telegram\",outcome=\"sent\"} 1",
        "lemon_outbox_calls_total{transport=\"telegram\",outcome=\"retried\"} 2",
        "lemon_outbox_calls_total{transport=\"telegram\",outcome=\"rate_limited\"} 0",
        "lemon_outbox_calls_total{transport=\"telegram\",outcome=\"failed\"} 0",
        "# TYPE lemon_outbox_calls_total counter",
        "lemon_config_reloads_total{outcome=\"applied\"} 3",
        "lemon_config_reloads_total{outcome=\"rejected\"} 1",
        "# TYPE lemon_config_reloads_total counter",
    ] {
        assert!(text.lines().any(|l| l == line), "{line:?} missing from:\n{text}");
    }
    assert!(!text.contains("@bot") && !text.contains("4046"), "{text}");
}

/// MCP servers as the native engine's client would report them.
#[derive(Debug)]
struct FakeMcp(Vec<lemon_core::mcp::McpServerStatus>);

impl lemon_core::mcp::McpStatusSource for FakeMcp {
    fn servers(&self) -> Vec<lemon_core::mcp::McpServerStatus> {
        self.0.clone()
    }
}

fn mcp_server(
    name: &str,
    state: lemon_core::mcp::McpServerState,
    tools: &[&str],
    calls: &[(&str, u64)],
) -> lemon_core::mcp::McpServerStatus {
    lemon_core::mcp::McpServerStatus {
        name: name.to_owned(),
        transport: lemon_core::mcp::McpTransportKind::Stdio,
        state,
        tools: tools.iter().map(|tool| format!("{name}__{tool}")).collect(),
        error: Some("secret-looking error text sk-123".to_owned()),
        calls: calls.iter().map(|(outcome, n)| ((*outcome).to_owned(), *n)).collect(),
        starts: 2,
    }
}

#[tokio::test]
async fn metrics_show_mcp_servers_states_tools_starts_and_calls() {
    use lemon_core::mcp::McpServerState;
    let gw = TestGateway::start();
    let (_, _, text) = get_with(gw.state(), Method::GET, "/metrics", None).await;
    assert!(!text.contains("lemon_mcp_"), "no MCP client, no MCP families:\n{text}");

    let fake = FakeMcp(vec![
        mcp_server(
            "github",
            McpServerState::Running,
            &["search", "get_issue"],
            &[("ok", 5), ("timeout", 1), ("strange", 2)],
        ),
        mcp_server("fs", McpServerState::Failed, &[], &[]),
    ]);
    let state = gw.state().with_mcp(Arc::new(fake));
    let (_, _, text) = get_with(state, Method::GET, "/metrics", None).await;
    for line in [
        "# TYPE lemon_mcp_server_state gauge",
        "lemon_mcp_server_state{server=\"github\",state=\"running\"} 1",
        "lemon_mcp_server_state{server=\"github\",state=\"failed\"} 0",
        "lemon_mcp_server_state{server=\"fs\",state=\"failed\"} 1",
        "lemon_mcp_server_state{server=\"fs\",state=\"idle\"} 0",
        "lemon_mcp_server_tools{server=\"github\"} 2",
        "lemon_mcp_server_tools{server=\"fs\"} 0",
        "# TYPE lemon_mcp_server_starts_total counter",
        "lemon_mcp_server_starts_total{server=\"github\"} 2",
        "# TYPE lemon_mcp_tool_calls_total counter",
        "lemon_mcp_tool_calls_total{server=\"github\",outcome=\"ok\"} 5",
        "lemon_mcp_tool_calls_total{server=\"github\",outcome=\"error\"} 0",
        "lemon_mcp_tool_calls_total{server=\"github\",outcome=\"timeout\"} 1",
        "lemon_mcp_tool_calls_total{server=\"github\",outcome=\"cancelled\"} 0",
        "lemon_mcp_tool_calls_total{server=\"github\",outcome=\"other\"} 2",
        "lemon_mcp_tool_calls_total{server=\"fs\",outcome=\"ok\"} 0",
    ] {
        assert!(text.lines().any(|l| l == line), "{line:?} missing from:\n{text}");
    }
    assert!(!text.contains("fs\",outcome=\"other\""), "no other outcome without calls:\n{text}");
    assert!(!text.contains("sk-123") && !text.contains("get_issue"), "{text}");
}

/// A cluster node: `/healthz` has a `cluster` check, which fails with the
/// reason once the node is fenced; `/metrics` has the `lemon_cluster_*`
/// families. Against the PostgreSQL server `LEMON_TEST_POSTGRES_URL` names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_cluster_node_is_unhealthy_and_says_why() {
    use lemon_core::cluster::node::DEFAULT_SWEEP;
    use lemon_core::cluster::{ClusterNode, ClusterSettings, NodeId, NodeInfo};
    use lemon_core::store::postgres::testing::{fresh_database, server_url};
    use lemon_core::store::postgres::{PostgresConfig, PostgresStore};

    let Some(server) = server_url() else { return };
    let url = fresh_database(&server).await;
    let connect = || {
        PostgresStore::connect(PostgresConfig {
            url: url.clone(),
            pool_size: 4,
            chat_state_ttl_ms: 60_000,
            exclusive: false,
        })
    };
    let (store, other) = (connect().await.unwrap(), connect().await.unwrap());
    let gw = TestGateway::start();
    let settings = ClusterSettings {
        node: NodeId::parse("node-h").unwrap(),
        term: Duration::from_millis(1500),
        info: NodeInfo { version: "9.9.9".to_owned(), api_base_url: None, channels: vec![] },
        sweep: DEFAULT_SWEEP,
    };
    let node = ClusterNode::start(&store, settings, &gw.tracker, gw.token.clone()).await.unwrap();
    node.cluster().set_slot_count(3).await.unwrap();
    let state = gw.state().with_cluster(node.clone());

    let (status, _, body) = get(state.clone(), Method::GET, "/healthz").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let report: Value = serde_json::from_str(&body).unwrap();
    let cluster = report["checks"].as_array().unwrap().iter().find(|c| c["name"] == "cluster");
    assert_eq!(cluster.unwrap()["detail"]["node"], "node-h", "{body}");
    let (_, _, metrics) = get(state.clone(), Method::GET, "/metrics").await;
    for line in [
        "lemon_cluster_nodes_alive 1",
        "lemon_cluster_slots_total 3",
        "lemon_cluster_slots_in_use 0",
        "lemon_cluster_sessions_owned 0",
        "lemon_cluster_fenced 0",
    ] {
        assert!(metrics.lines().any(|l| l == line), "{line} missing:\n{metrics}");
    }

    // Another connection locks the lease tables: renewals wait, time out,
    // and after two thirds of the term the node is fenced.
    let mut holder = other.pool().get().await.unwrap();
    let lock = holder.transaction().await.unwrap();
    lock.batch_execute("LOCK TABLE session_leases, channel_leases IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    within("the node to be fenced", node.fenced().cancelled()).await;

    // Without the token too: a prober learns why.
    let (status, _, body) = get_with(state.clone(), Method::GET, "/healthz", None).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    let report: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(report["status"], "unhealthy", "{body}");
    assert_eq!(report["reason"], crate::cluster::FENCED_REASON, "{body}");
    let (status, _, body) = get(state.clone(), Method::GET, "/healthz").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    let report: Value = serde_json::from_str(&body).unwrap();
    let cluster = report["checks"].as_array().unwrap().iter().find(|c| c["name"] == "cluster");
    assert_eq!(cluster.unwrap()["error"], crate::cluster::FENCED_REASON, "{body}");
    lock.rollback().await.unwrap();
    let (_, _, metrics) = get(state, Method::GET, "/metrics").await;
    assert!(metrics.lines().any(|l| l == "lemon_cluster_fenced 1"), "{metrics}");
    gw.shut_down().await;
}
