//! Tests of the webhook transport against a real gateway and router running the
//! echo engine, with callbacks delivered to a local server.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use axum::Router;
use futures::future::BoxFuture;
use lemon_core::bus::{EventBus, EventKind, Subscription};
use lemon_core::engine::EngineRegistry;
use lemon_core::gateway::{GatewayDeps, GatewayHandle, RuntimeConfig};
use lemon_core::router::{RouterConfig, RouterHandle};
use lemon_core::secrets::SecretStore;
use lemon_core::store::{RunFilter, StoreHandle};
use lemon_engines::echo::EchoEngine;
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt;

use super::callback::is_private;
use super::idempotency::{Claim, IdempotencyKeys};
use super::{router, Resolve, WebhookConfig, WebhookDeps, WebhookState};

const TOKEN: &str = "hook-token-5d2e";
/// A safety net: every wait ends on an event long before this.
const PATIENCE: Duration = Duration::from_secs(20);

async fn within<F: Future>(what: &str, fut: F) -> F::Output {
    match tokio::time::timeout(PATIENCE, fut).await {
        Ok(output) => output,
        Err(_) => panic!("timed out waiting for {what}"),
    }
}

/// Answers fixed addresses for names, without DNS.
#[derive(Debug, Default)]
struct MapResolver(HashMap<String, Vec<IpAddr>>);

impl Resolve for MapResolver {
    fn resolve<'a>(
        &'a self,
        host: &'a str,
        port: u16,
    ) -> BoxFuture<'a, std::io::Result<Vec<SocketAddr>>> {
        let addrs = self
            .0
            .get(host)
            .map(|ips| ips.iter().map(|ip| SocketAddr::new(*ip, port)).collect())
            .unwrap_or_default();
        Box::pin(async move { Ok(addrs) })
    }
}

struct TestHook {
    state: WebhookState,
    gateway: GatewayHandle,
    _token: CancellationToken,
}

impl Drop for TestHook {
    fn drop(&mut self) {
        self._token.cancel();
    }
}

impl TestHook {
    /// A gateway with the echo engine (`word_delay` per word) and the webhook
    /// configured by `toml` (a `[gateway.webhook]` body).
    fn start(toml: &str, word_delay: Duration, resolver: MapResolver) -> Self {
        let tracker = TaskTracker::new();
        let token = CancellationToken::new();
        let mut engines = EngineRegistry::new();
        engines.register(Arc::new(EchoEngine::new(word_delay, tracker.clone()))).unwrap();
        let deps = GatewayDeps {
            config: RuntimeConfig::default(),
            engines,
            store: StoreHandle::memory(),
            bus: EventBus::default(),
        };
        let gateway = GatewayHandle::start(deps, token.clone(), &tracker);
        let router_config =
            RouterConfig { default_engine: "echo".to_owned(), ..RouterConfig::default() };
        let router = RouterHandle::start(router_config, gateway.clone(), token.clone(), &tracker);
        let table: toml::Table = toml::from_str(toml).unwrap();
        let config = WebhookConfig::parse(&table).unwrap();
        let tokens = config
            .integrations
            .iter()
            .map(|(id, i)| (id.clone(), i.token.clone().unwrap()))
            .collect::<BTreeMap<_, _>>();
        let state = WebhookState::new(WebhookDeps {
            config,
            tokens,
            gateway: gateway.clone(),
            router,
            resolver: Arc::new(resolver),
            tracker,
            shutdown: token.clone(),
        });
        TestHook { state, gateway, _token: token }
    }

    fn simple(extra: &str) -> Self {
        let toml = format!("{extra}\n[integrations.zap]\ntoken = \"{TOKEN}\"\n");
        TestHook::start(&toml, Duration::ZERO, MapResolver::default())
    }

    fn router(&self) -> Router {
        router(self.state.clone())
    }

    async fn send(&self, req: Request<Body>) -> (StatusCode, Value) {
        let what = format!("{} {}", req.method(), req.uri());
        let response = within(&what, self.router().oneshot(req)).await.unwrap();
        let (parts, body) = response.into_parts();
        let bytes = within(&what, axum::body::to_bytes(body, usize::MAX)).await.unwrap();
        let body = serde_json::from_slice(&bytes).unwrap_or_else(|_| {
            panic!("{what}: body is not JSON: {}", String::from_utf8_lossy(&bytes))
        });
        (parts.status, body)
    }

    /// POSTs `body` to `/webhooks/zap` with the bearer token.
    async fn post(&self, body: Value) -> (StatusCode, Value) {
        self.send(
            post("/webhooks/zap")
                .header("authorization", format!("Bearer {TOKEN}"))
                .body(Body::from(body.to_string()))
                .unwrap(),
        )
        .await
    }

    async fn run_count(&self) -> usize {
        let filter = RunFilter { status: None, limit: 100 };
        self.gateway.store().list_runs(filter).await.unwrap().len()
    }
}

fn post(uri: &str) -> axum::http::request::Builder {
    Request::builder().method("POST").uri(uri).header(header::CONTENT_TYPE, "application/json")
}

/// The answer of `run_id`'s `run_completed` on the firehose.
async fn completed_answer(events: &mut Subscription, run_id: &str) -> String {
    within("run_completed", async {
        loop {
            let event = events.recv().await.unwrap();
            if event.run_id.as_str() != run_id {
                continue;
            }
            if let EventKind::RunCompleted { completion, .. } = &event.kind {
                return completion.answer.clone();
            }
        }
    })
    .await
}

/// A callback receiver on 127.0.0.1 that fails the first `failures` attempts
/// with a 500 and hands every accepted body over.
async fn callback_server(
    failures: usize,
) -> (SocketAddr, Arc<AtomicUsize>, mpsc::UnboundedReceiver<Value>) {
    let attempts = Arc::new(AtomicUsize::new(0));
    let (tx, rx) = mpsc::unbounded_channel();
    let counter = attempts.clone();
    let app = Router::new().route(
        "/cb",
        axum::routing::post(move |axum::Json(body): axum::Json<Value>| {
            let counter = counter.clone();
            let tx = tx.clone();
            async move {
                let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
                if n <= failures {
                    StatusCode::INTERNAL_SERVER_ERROR
                } else {
                    let _ = tx.send(body);
                    StatusCode::OK
                }
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (addr, attempts, rx)
}

#[tokio::test]
async fn tokens_in_either_header_are_accepted_and_a_wrong_one_is_401() {
    let hook = TestHook::simple("");
    let (status, body) = hook.post(json!({ "prompt": "hi" })).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    assert_eq!(body["status"], "accepted");
    assert_eq!(body["session_key"], "webhook:zap");

    let req = post("/webhooks/zap").header("x-webhook-token", TOKEN);
    let (status, _) = hook.send(req.body(Body::from(r#"{"text":"hi"}"#)).unwrap()).await;
    assert_eq!(status, StatusCode::ACCEPTED);

    for (name, value) in [("authorization", "Bearer wrong"), ("x-webhook-token", "hook-token-5d2f")]
    {
        let req = post("/webhooks/zap").header(name, value);
        let (status, body) = hook.send(req.body(Body::from(r#"{"prompt":"x"}"#)).unwrap()).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        assert_eq!(body, json!({ "error": "unauthorized" }));
    }
    let (status, _) =
        hook.send(post("/webhooks/zap").body(Body::from(r#"{"prompt":"x"}"#)).unwrap()).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn query_and_payload_tokens_work_only_when_allowed() {
    let hook = TestHook::simple("");
    let uri = format!("/webhooks/zap?token={TOKEN}");
    let (status, _) = hook.send(post(&uri).body(Body::from(r#"{"prompt":"x"}"#)).unwrap()).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let body = json!({ "prompt": "x", "token": TOKEN }).to_string();
    let (status, _) =
        hook.send(post("/webhooks/zap").body(Body::from(body.clone())).unwrap()).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);

    let toml = format!(
        "[integrations.zap]\ntoken = \"{TOKEN}\"\nallow_query_token = true\nallow_payload_token = true\n"
    );
    let hook = TestHook::start(&toml, Duration::ZERO, MapResolver::default());
    let (status, _) = hook.send(post(&uri).body(Body::from(r#"{"prompt":"x"}"#)).unwrap()).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let (status, _) = hook.send(post("/webhooks/zap").body(Body::from(body)).unwrap()).await;
    assert_eq!(status, StatusCode::ACCEPTED);
}

#[tokio::test]
async fn bad_requests_get_json_errors() {
    let hook = TestHook::simple("max_body_bytes = 64");
    let req = post("/webhooks/nope").header("authorization", format!("Bearer {TOKEN}"));
    let (status, body) = hook.send(req.body(Body::from(r#"{"prompt":"x"}"#)).unwrap()).await;
    assert_eq!(
        (status, body),
        (StatusCode::NOT_FOUND, json!({ "error": "integration not found" }))
    );

    let req = post("/webhooks/zap").header("authorization", format!("Bearer {TOKEN}"));
    let (status, body) = hook.send(req.body(Body::from("{not json")).unwrap()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(body["error"].as_str().unwrap().contains("invalid JSON"), "{body}");

    let (status, body) = hook.post(json!({ "prompt": "  ", "metadata": {} })).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(body["error"].as_str().unwrap().contains("missing prompt"), "{body}");

    let (status, body) = hook.post(json!({ "prompt": "x".repeat(100) })).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(body["error"], "request body is larger than 64 bytes");

    let req = Request::builder().method("GET").uri("/webhooks/zap").body(Body::empty()).unwrap();
    let (status, _) = hook.send(req).await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(hook.run_count().await, 0);
}

#[tokio::test]
async fn async_requests_are_accepted_and_the_run_completes() {
    let hook = TestHook::simple("");
    let mut events = hook.gateway.bus().subscribe_all();
    let (status, body) =
        hook.post(json!({ "message": "hello from zapier", "metadata": { "k": 1 } })).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let run_id = body["run_id"].as_str().unwrap();
    assert_eq!(completed_answer(&mut events, run_id).await, "hello from zapier");
    let record = hook.gateway.store().get_run(run_id).await.unwrap().unwrap();
    assert_eq!(record.session_key, "webhook:zap");
}

#[tokio::test]
async fn sync_requests_answer_with_the_result() {
    let hook = TestHook::simple("mode = \"sync\"");
    let (status, body) =
        hook.post(json!({ "prompt": "echo this back", "session_key": "s1" })).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["ok"], true);
    assert_eq!(body["answer"], "echo this back");
    assert_eq!(body["session_key"], "s1");
    assert!(body["run_id"].as_str().is_some());
    assert_eq!(body["error"], Value::Null);
    assert_eq!(body["resume"]["engine"], "echo");
}

#[tokio::test]
async fn a_sync_request_that_outlives_its_timeout_is_504_and_the_run_goes_on() {
    let toml =
        format!("mode = \"sync\"\ntimeout_ms = 30\n[integrations.zap]\ntoken = \"{TOKEN}\"\n");
    let hook = TestHook::start(&toml, Duration::from_secs(600), MapResolver::default());
    let (status, body) = hook.post(json!({ "prompt": "slow words here" })).await;
    assert_eq!(status, StatusCode::GATEWAY_TIMEOUT, "{body}");
    assert_eq!(body["error"], "run timed out");
    let run_id = body["run_id"].as_str().unwrap();
    let record = hook.gateway.store().get_run(run_id).await.unwrap().unwrap();
    assert!(!record.status.is_terminal(), "{:?}", record.status);
}

#[tokio::test]
async fn an_idempotency_key_submits_once() {
    let hook = TestHook::simple("");
    let req = || {
        post("/webhooks/zap")
            .header("authorization", format!("Bearer {TOKEN}"))
            .header("idempotency-key", "order-17")
            .body(Body::from(r#"{"prompt":"once"}"#))
            .unwrap()
    };
    let (first, second) = tokio::join!(hook.send(req()), hook.send(req()));
    // Concurrent duplicates submit once: the other one replays the first answer
    // or is told that the key is being processed.
    let (winner, loser) = if first.1.get("duplicate").is_none() && first.0 == StatusCode::ACCEPTED {
        (first, second)
    } else {
        (second, first)
    };
    assert_eq!(winner.0, StatusCode::ACCEPTED, "{}", winner.1);
    assert!(winner.1.get("duplicate").is_none(), "{}", winner.1);
    match loser.0 {
        StatusCode::ACCEPTED => {
            assert_eq!(loser.1["duplicate"], true);
            assert_eq!(loser.1["run_id"], winner.1["run_id"]);
        }
        status => assert_eq!(status, StatusCode::CONFLICT, "{}", loser.1),
    }
    let (status, again) = hook.send(req()).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{again}");
    assert_eq!(again["duplicate"], true);
    assert_eq!(again["run_id"], winner.1["run_id"]);
    // The payload key is a fallback for the header; another key is another run.
    let (status, other) =
        hook.post(json!({ "prompt": "twice", "idempotency_key": "order-18" })).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    assert!(other.get("duplicate").is_none());
    assert_eq!(hook.run_count().await, 2);
}

#[tokio::test]
async fn a_request_that_fails_before_submitting_releases_its_key() {
    let hook = TestHook::simple("");
    let body = json!({ "prompt": "x", "engine": "nope", "idempotency_key": "k1" });
    let (status, _) = hook.post(body).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, body) = hook.post(json!({ "prompt": "x", "idempotency_key": "k1" })).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    assert!(body.get("duplicate").is_none(), "{body}");
    assert_eq!(hook.run_count().await, 1);
}

#[tokio::test]
async fn callbacks_are_retried_until_delivered() {
    let (addr, attempts, mut received) = callback_server(2).await;
    let toml = format!(
        "callback_backoff_ms = 1\ncallback_backoff_max_ms = 2\nallow_private_callback_hosts = true\n\
         [integrations.zap]\ntoken = \"{TOKEN}\"\ncallback_url = \"http://{addr}/cb\"\n"
    );
    let hook = TestHook::start(&toml, Duration::ZERO, MapResolver::default());
    let (status, body) =
        hook.post(json!({ "prompt": "call me back", "metadata": { "id": 7 } })).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let delivered = within("the callback", received.recv()).await.unwrap();
    assert_eq!(attempts.load(Ordering::SeqCst), 3);
    assert_eq!(delivered["run_id"], body["run_id"]);
    assert_eq!(delivered["integration_id"], "zap");
    assert_eq!(delivered["completed"]["answer"], "call me back");
    assert_eq!(delivered["completed"]["ok"], true);
    assert_eq!(delivered["metadata"], json!({ "id": 7 }));
}

#[tokio::test]
async fn callbacks_to_private_hosts_are_refused_unless_allowed() {
    let (addr, _, mut received) = callback_server(0).await;
    let resolver = || {
        let mut map = HashMap::new();
        map.insert("hooks.example.test".to_owned(), vec![IpAddr::from([127, 0, 0, 1])]);
        MapResolver(map)
    };
    let url = format!("http://Hooks.Example.Test.:{}/cb", addr.port());
    let toml = format!("allow_callback_override = true\n[integrations.zap]\ntoken = \"{TOKEN}\"\n");
    let hook = TestHook::start(&toml, Duration::ZERO, resolver());
    for url in [
        url.as_str(),
        "http://127.0.0.1/cb",
        "http://localhost/cb",
        "http://[::ffff:10.0.0.1]/cb",
        "ftp://example.test/",
    ] {
        let (status, body) = hook.post(json!({ "prompt": "x", "callback_url": url })).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{url}: {body}");
        assert!(body["error"].as_str().unwrap().starts_with("invalid callback url"), "{body}");
    }
    assert_eq!(hook.run_count().await, 0);

    let toml = format!(
        "allow_callback_override = true\n[integrations.zap]\ntoken = \"{TOKEN}\"\nallow_private_callback_hosts = true\n"
    );
    let hook = TestHook::start(&toml, Duration::ZERO, resolver());
    let (status, body) = hook.post(json!({ "prompt": "pinned", "callback_url": url })).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let delivered = within("the callback", received.recv()).await.unwrap();
    assert_eq!(delivered["completed"]["answer"], "pinned");
}

#[tokio::test]
async fn a_callback_url_in_the_body_needs_the_override() {
    let hook = TestHook::simple("");
    let (status, body) =
        hook.post(json!({ "prompt": "x", "callback_url": "https://example.com/" })).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
}

#[test]
fn private_addresses() {
    for ip in [
        "10.1.2.3",
        "127.0.0.1",
        "169.254.1.1",
        "172.20.0.1",
        "192.168.1.1",
        "100.64.0.1",
        "0.0.0.0",
        "::1",
        "::",
        "fd00::1",
        "fe80::1",
        "::ffff:127.0.0.1",
    ] {
        assert!(is_private(ip.parse().unwrap()), "{ip}");
    }
    for ip in ["93.184.216.34", "172.32.0.1", "2606:4700::1111"] {
        assert!(!is_private(ip.parse().unwrap()), "{ip}");
    }
}

#[test]
fn config_defaults_enablement_and_errors() {
    assert_eq!(WebhookConfig::from_gateway(None, None).unwrap().map(|c| c.port), None);
    let config = WebhookConfig::from_gateway(Some(true), None).unwrap().unwrap();
    assert_eq!((config.port, config.timeout_ms, config.callback_max_attempts), (4046, 30_000, 3));
    assert_eq!(config.addr(), "127.0.0.1:4046");
    let table: toml::Table = toml::from_str("enabled = true\nbind = \"any\"\nport = 9000").unwrap();
    let config = WebhookConfig::from_gateway(None, Some(&table)).unwrap().unwrap();
    assert_eq!(config.addr(), "0.0.0.0:9000");

    let bad = |text: &str| {
        let table: toml::Table = toml::from_str(text).unwrap();
        WebhookConfig::parse(&table).unwrap_err().to_string()
    };
    let err = bad("port = \"x\"");
    assert!(err.contains("`port`") && err.starts_with("invalid [gateway.webhook]"), "{err}");
    assert!(!err.contains('\n'), "{err}");
    assert!(bad("mode = \"later\"").contains("mode"));
    assert!(bad("prot = 1").contains("prot"));
    assert!(bad("[integrations.a]\nqueue_mode = \"collect\"").contains("integrations.a"));
    assert!(bad("[integrations.a]\ntoken = \"t\"\nqueue_mode = \"fifo\"").contains("queue_mode"));
}

#[test]
fn tokens_come_inline_or_from_a_secret() {
    let table: toml::Table = toml::from_str(
        "[integrations.a]\ntoken = \" inline \"\n[integrations.b]\ntoken_secret = \"hook_b\"\n",
    )
    .unwrap();
    let config = WebhookConfig::parse(&table).unwrap();
    let missing = std::env::temp_dir().join("lemon-webhook-tests-no-such-secrets.toml");
    let env = BTreeMap::from([("HOOK_B".to_owned(), "from-env".to_owned())]);
    let tokens = config.resolve_tokens(&SecretStore::new(env, missing.clone())).unwrap();
    assert_eq!(tokens["a"], "inline");
    assert_eq!(tokens["b"], "from-env");
    let err = config.resolve_tokens(&SecretStore::new(BTreeMap::new(), missing)).unwrap_err();
    assert!(err.to_string().contains("integrations.b.token_secret"), "{err}");
    assert!(!format!("{config:?}").contains("inline"), "the token is redacted");
}

#[tokio::test(start_paused = true)]
async fn idempotency_keys_expire_after_their_ttl() {
    let keys = IdempotencyKeys::new(Duration::from_secs(60));
    let Claim::New(guard) = keys.claim("zap", "k") else { panic!("first claim") };
    guard.complete(StatusCode::OK, json!({ "run_id": "r1" }));
    assert!(matches!(keys.claim("zap", "k"), Claim::Duplicate { .. }));
    assert!(matches!(keys.claim("other", "k"), Claim::New(_)), "keys are per integration");
    tokio::time::advance(Duration::from_secs(61)).await;
    assert!(matches!(keys.claim("zap", "k"), Claim::New(_)));
    let Claim::New(_pending) = keys.claim("zap", "p") else { panic!("claim") };
    assert!(matches!(keys.claim("zap", "p"), Claim::InProgress));
}
