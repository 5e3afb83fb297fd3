//! Tests of the webhook transport against a real gateway and router running the
//! echo engine, with callbacks delivered to a local server.

use lemon_core::testing::within;
use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use axum::response::IntoResponse;
use axum::Router;
use futures::future::BoxFuture;
use lemon_core::bus::{EventBus, EventKind, Subscription};
use lemon_core::engine::EngineRegistry;
use lemon_core::gateway::{GatewayDeps, GatewayHandle, RuntimeConfig};
use lemon_core::router::{RouterConfig, RouterHandle};
use lemon_core::secrets::SecretStore;
use lemon_core::store::{RunFilter, StoreHandle};
use lemon_core::transport::{RestartPolicy, TransportDeps, TransportRegistry, TransportState};
use lemon_engines::echo::EchoEngine;
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt;

use super::callback::{check, delivered};
use super::idempotency::{Claim, IdempotencyKeys};
use super::payload::Payload;
use super::request_info::redact_query;
use super::{
    constant_time_eq, router, CallbackError, Resolve, WebhookConfig, WebhookDeps, WebhookState,
    WebhookTransport,
};

const TOKEN: &str = "hook-token-5d2e";

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
    /// The stage files wait in for their run.
    media: tempfile::TempDir,
    bus: EventBus,
    store: StoreHandle,
    router: RouterHandle,
    tracker: TaskTracker,
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
        TestHook::start_on(StoreHandle::memory(), toml, word_delay, resolver)
    }

    /// As [`TestHook::start`], on `store`.
    fn start_on(
        store: StoreHandle,
        toml: &str,
        word_delay: Duration,
        resolver: MapResolver,
    ) -> Self {
        let tracker = TaskTracker::new();
        let token = CancellationToken::new();
        let mut engines = EngineRegistry::new();
        engines.register(Arc::new(EchoEngine::new(word_delay, tracker.clone()))).unwrap();
        let bus = EventBus::default();
        let media = tempfile::tempdir().unwrap();
        let stage = lemon_core::media::MediaStage::new(media.path().join("stage"));
        let deps = GatewayDeps {
            config: RuntimeConfig { media_stage: Some(stage.clone()), ..RuntimeConfig::default() },
            engines,
            store: store.clone(),
            bus: bus.clone(),
        };
        let gateway = GatewayHandle::start(deps, token.clone(), &tracker);
        let router_config =
            RouterConfig { default_engine: "echo".parse().unwrap(), ..RouterConfig::default() };
        let router = RouterHandle::start(router_config, gateway, token.clone(), &tracker);
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
            router: router.clone(),
            store: store.clone(),
            resolver: Arc::new(resolver),
            tracker: tracker.clone(),
            shutdown: token.clone(),
            status: None,
            media: stage,
        });
        TestHook { state, media, bus, store, router, tracker, _token: token }
    }

    /// Shuts the gateway down and waits for every task to end.
    async fn stop(self) {
        self._token.cancel();
        self.tracker.close();
        within("the gateway to stop", self.tracker.wait()).await;
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
        self.store.list_runs(filter).await.unwrap().len()
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
    callback_server_answering(vec![StatusCode::INTERNAL_SERVER_ERROR; failures]).await
}

/// A callback receiver that answers attempt n with `answers[n - 1]`, then `200`
/// and hands the bodies of the attempts it answered with a 2xx over.
async fn callback_server_answering(
    answers: Vec<StatusCode>,
) -> (SocketAddr, Arc<AtomicUsize>, mpsc::UnboundedReceiver<Value>) {
    let attempts = Arc::new(AtomicUsize::new(0));
    let (tx, rx) = mpsc::unbounded_channel();
    let counter = attempts.clone();
    let answers = Arc::new(answers);
    let app = Router::new().route(
        "/cb",
        axum::routing::post(move |axum::Json(body): axum::Json<Value>| {
            let counter = counter.clone();
            let tx = tx.clone();
            let answers = answers.clone();
            async move {
                let n = counter.fetch_add(1, Ordering::SeqCst);
                let status = answers.get(n).copied().unwrap_or(StatusCode::OK);
                if status.is_success() {
                    let _ = tx.send(body);
                }
                let mut response = status.into_response();
                if status.is_redirection() {
                    response.headers_mut().insert(header::LOCATION, "/cb".parse().unwrap());
                }
                response
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
    // An unknown integration and a wrong token get the same answer.
    let req = post("/webhooks/nope").header("authorization", format!("Bearer {TOKEN}"));
    let unknown = hook.send(req.body(Body::from(r#"{"prompt":"x"}"#)).unwrap()).await;
    let req = post("/webhooks/zap").header("authorization", "Bearer not-the-token");
    let wrong = hook.send(req.body(Body::from(r#"{"prompt":"x"}"#)).unwrap()).await;
    assert_eq!(unknown, (StatusCode::UNAUTHORIZED, json!({ "error": "unauthorized" })));
    assert_eq!(wrong, unknown);

    // A declared length over the limit is refused before the body is read
    // (this body never ends: reading it would hang).
    let (_tx, never_ends) = futures::channel::mpsc::channel::<Result<Vec<u8>, std::io::Error>>(1);
    let req = post("/webhooks/zap")
        .header("authorization", format!("Bearer {TOKEN}"))
        .header("content-length", "65");
    let (status, body) = hook.send(req.body(Body::from_stream(never_ends)).unwrap()).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(body["error"], "request body is larger than 64 bytes");

    // Nesting past 64 levels is a 400, however small the body.
    let deep = format!("{{\"prompt\":{}{}}}", "[".repeat(65), "]".repeat(65));
    assert!(deep.len() <= 150);
    let hook_deep = TestHook::simple("");
    let req = post("/webhooks/zap").header("authorization", format!("Bearer {TOKEN}"));
    let (status, body) = hook_deep.send(req.body(Body::from(deep)).unwrap()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(body["error"].as_str().unwrap().contains("deeper than 64 levels"), "{body}");

    let req = post("/webhooks/zap").header("authorization", format!("Bearer {TOKEN}"));
    let (status, body) = hook.send(req.body(Body::from("{not json")).unwrap()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(body["error"].as_str().unwrap().contains("invalid JSON"), "{body}");

    let (status, body) = hook.post(json!({ "prompt": "  ", "metadata": {} })).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(body["error"], "invalid request payload", "{body}");
    assert!(body["detail"].as_str().unwrap().contains("missing prompt"), "{body}");

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
    let mut events = hook.bus.subscribe_all();
    let (status, body) =
        hook.post(json!({ "message": "hello from zapier", "metadata": { "k": 1 } })).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let run_id = body["run_id"].as_str().unwrap();
    assert_eq!(completed_answer(&mut events, run_id).await, "hello from zapier");
    let record = hook.store.get_run(run_id).await.unwrap().unwrap();
    assert_eq!(record.session_key, "webhook:zap");
}

#[tokio::test]
async fn sync_requests_answer_with_the_result() {
    let hook = TestHook::simple("mode = \"sync\"");
    let (status, body) = hook.post(json!({ "prompt": "echo this back" })).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["ok"], true);
    assert_eq!(body["answer"], "echo this back");
    assert_eq!(body["session_key"], "webhook:zap");
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
    let record = hook.store.get_run(run_id).await.unwrap().unwrap();
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
    // Another key is another run.
    let other = post("/webhooks/zap")
        .header("authorization", format!("Bearer {TOKEN}"))
        .header("idempotency-key", "order-18")
        .body(Body::from(r#"{"prompt":"twice"}"#))
        .unwrap();
    let (status, other) = hook.send(other).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    assert!(other.get("duplicate").is_none());
    assert_eq!(hook.run_count().await, 2);
}

#[tokio::test]
async fn a_request_that_fails_before_submitting_releases_its_key() {
    let hook = TestHook::simple("allow_payload_idempotency_key = true");
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
fn config_defaults_enablement_and_errors() {
    assert_eq!(WebhookConfig::from_gateway(None, None).unwrap().map(|c| c.port), None);
    let config = WebhookConfig::from_gateway(Some(true), None).unwrap().unwrap();
    assert_eq!((config.port, config.timeout_ms, config.callback_max_attempts), (4046, 30_000, 3));
    assert_eq!(config.addr(), "127.0.0.1:4046");
    let table: toml::Table = toml::from_str("enabled = true\nbind = \"any\"\nport = 9000").unwrap();
    let config = WebhookConfig::from_gateway(None, Some(&table)).unwrap().unwrap();
    assert_eq!(config.addr(), "0.0.0.0:9000");
    // The section's `enabled` wins over the flag; a section alone enables nothing.
    let off: toml::Table = toml::from_str("enabled = false").unwrap();
    assert!(WebhookConfig::from_gateway(Some(true), Some(&off)).unwrap().is_none());
    let silent: toml::Table = toml::from_str("port = 9000").unwrap();
    assert!(WebhookConfig::from_gateway(None, Some(&silent)).unwrap().is_none());
    // A disabled section is still checked.
    let broken: toml::Table = toml::from_str(
        "enabled = false
port = \"x\"",
    )
    .unwrap();
    assert!(WebhookConfig::from_gateway(None, Some(&broken)).is_err());

    let bad = |text: &str| {
        let table: toml::Table = toml::from_str(text).unwrap();
        WebhookConfig::parse(&table).unwrap_err().to_string()
    };
    let err = bad("port = \"x\"");
    assert!(err.contains("`port`") && err.starts_with("invalid [gateway.webhook]"), "{err}");
    assert!(!err.contains('\n'), "{err}");
    assert!(bad("mode = \"later\"").contains("mode"));
    // An unknown key is ignored with a suggestion (it stopped the gateway before).
    let typo: toml::Table = toml::from_str("prot = 1").unwrap();
    let (_, unknown) = WebhookConfig::parse_with_unknown_keys(&typo).unwrap();
    assert_eq!(
        unknown,
        [lemon_core::config::UnknownKey {
            path: vec!["prot".into()],
            suggestion: Some("port".into())
        }]
    );
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

#[tokio::test]
async fn idempotency_keys_expire_after_their_ttl() {
    let now = Arc::new(AtomicI64::new(1_000_000));
    let clock = now.clone();
    let keys = IdempotencyKeys::new(
        StoreHandle::memory(),
        60_000,
        Arc::new(move || clock.load(Ordering::SeqCst)),
    );
    let claim = |integration: &'static str, key: &'static str| keys.claim(integration, key);
    let Claim::New(guard) = claim("zap", "k").await.unwrap() else { panic!("first claim") };
    guard.complete(StatusCode::OK, json!({ "run_id": "r1" })).await;
    match claim("zap", "k").await.unwrap() {
        Claim::Duplicate { status, body } => {
            assert_eq!((status, body), (StatusCode::OK, json!({ "run_id": "r1" })));
        }
        other => panic!("expected a duplicate, got {other:?}"),
    }
    assert!(
        matches!(claim("other", "k").await.unwrap(), Claim::New(_)),
        "keys are per integration"
    );
    now.fetch_add(59_999, Ordering::SeqCst);
    assert!(matches!(claim("zap", "k").await.unwrap(), Claim::Duplicate { .. }));
    now.fetch_add(1, Ordering::SeqCst);
    assert!(matches!(claim("zap", "k").await.unwrap(), Claim::New(_)), "expired");

    // A claim being processed makes a concurrent one wait its turn; dropping it
    // without an answer frees the key.
    let Claim::New(pending) = claim("zap", "p").await.unwrap() else { panic!("claim") };
    assert!(matches!(claim("zap", "p").await.unwrap(), Claim::InProgress));
    drop(pending);
    assert!(matches!(claim("zap", "p").await.unwrap(), Claim::New(_)));
}

// Normalising bodies: text, attachments, metadata.

/// Normalises `body` and compares the prompt and attachments with `expected`.
#[track_caller]
fn check_payload(body: Value, expected_prompt: &str, expected_attachments: Value) {
    let payload = Payload::from_body(&body).unwrap();
    assert_eq!(payload.prompt, expected_prompt, "{body}");
    assert_eq!(payload.attachments_json(), expected_attachments, "{body}");
}

#[test]
fn text_files_and_urls_make_a_prompt_with_an_attachments_section() {
    let body = json!({
        "content": { "text": "Ship this" },
        "files": [{ "name": "spec.pdf", "url": "https://files.example/spec.pdf" }],
        "urls": ["https://example.com/board"],
        "metadata": { "ticket": 7 },
    });
    let payload = Payload::from_body(&body).unwrap();
    assert_eq!(
        payload.prompt,
        "Ship this\n\nAttachments:\n- spec.pdf (https://files.example/spec.pdf)\n- https://example.com/board"
    );
    assert_eq!(payload.attachments.len(), 2);
    assert_eq!(payload.metadata, json!({ "ticket": 7 }));
}

#[test]
fn text_comes_from_the_first_non_blank_field() {
    check_payload(
        json!({ "prompt": " ", "text": "from text", "message": "m" }),
        "from text",
        json!([]),
    );
    check_payload(json!({ "input": "zapier input" }), "zapier input", json!([]));
    check_payload(json!({ "body": { "text": "nested body" } }), "nested body", json!([]));
    check_payload(json!({ "content.text": "literal key" }), "literal key", json!([]));
    check_payload(json!({ "message": "  trimmed  " }), "trimmed", json!([]));
}

#[test]
fn attachment_shapes_are_normalised() {
    // Objects with other key names, strings holding JSON, plain URL strings,
    // wrappers, duplicates and empty entries.
    check_payload(
        json!({
            "text": "see",
            "attachments": [
                { "href": "https://a.example/1", "filename": "one.png", "mime_type": "image/png", "bytes": "12" },
                "[{\"uri\": \"https://a.example/2\", \"title\": \"two\"}]",
                { "file": { "url": "https://a.example/3" } },
                { "href": "https://a.example/1", "filename": "one.png", "mime_type": "image/png", "bytes": 12 },
                { "size": 5 },
                "",
                null,
            ],
            "files": "https://a.example/4",
            "urls": "[\"https://a.example/5\"]",
        }),
        "see\n\nAttachments:\n- one.png (https://a.example/1)\n- two (https://a.example/2)\n\
         - https://a.example/3\n- https://a.example/4\n- https://a.example/5",
        json!([
            { "source": "attachments", "url": "https://a.example/1", "name": "one.png", "content_type": "image/png", "size": 12 },
            { "source": "attachments", "url": "https://a.example/2", "name": "two" },
            { "source": "attachments", "url": "https://a.example/3" },
            { "source": "files", "url": "https://a.example/4" },
            { "source": "urls", "url": "https://a.example/5" },
        ]),
    );
    // Attachments alone make the prompt; a name without a URL is listed by name.
    check_payload(
        json!({ "attachments": [{ "name": "notes.txt" }] }),
        "Attachments:\n- notes.txt",
        json!([{ "source": "attachments", "name": "notes.txt" }]),
    );
}

#[test]
fn bodies_without_text_or_attachments_and_bad_metadata_are_refused() {
    let refused = |body: Value| Payload::from_body(&body).unwrap_err().to_string();
    assert!(refused(json!({ "prompt": "  ", "urls": [] })).starts_with("missing prompt"));
    assert!(refused(json!({ "files": [{ "size": 3 }] })).starts_with("missing prompt"));
    assert!(refused(json!({ "prompt": "x", "metadata": [1] })).starts_with("metadata must be"));
    assert!(
        refused(json!({ "prompt": "x", "metadata": "not json" })).starts_with("metadata must be")
    );
    let many: Vec<String> =
        (0..=super::payload::MAX_ATTACHMENTS).map(|n| format!("https://a.example/{n}")).collect();
    assert!(refused(json!({ "prompt": "x", "urls": many })).starts_with("too many attachments"));
    // Metadata sent as a JSON string (Zapier, Make) is read as the object.
    let payload = Payload::from_body(&json!({ "prompt": "x", "metadata": "{\"k\":1}" })).unwrap();
    assert_eq!(payload.metadata, json!({ "k": 1 }));
}

#[tokio::test]
async fn runs_record_attachments_metadata_and_the_request_with_secrets_redacted() {
    let toml = format!("[integrations.zap]\ntoken = \"{TOKEN}\"\nallow_query_token = true\n");
    let hook = TestHook::start(&toml, Duration::ZERO, MapResolver::default());
    let mut req = post(&format!(
        "/webhooks/zap?token={TOKEN}&api_key=k-123&foo=bar&X-Amz-Signature=s1&Password=p"
    ))
    .header("user-agent", "Zapier")
    .header("x-request-id", "req-42")
    .body(Body::from(
        json!({
            "text": "Summarise",
            "urls": ["https://example.com/a"],
            "metadata": { "zap": "intake" },
        })
        .to_string(),
    ))
    .unwrap();
    let peer: SocketAddr = "[::ffff:203.0.113.9]:55000".parse().unwrap();
    req.extensions_mut().insert(axum::extract::connect_info::ConnectInfo(peer));
    let (status, body) = hook.send(req).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let record = hook.store.get_run(body["run_id"].as_str().unwrap()).await.unwrap().unwrap();
    assert_eq!(record.prompt, "Summarise\n\nAttachments:\n- https://example.com/a");
    assert_eq!(record.meta["origin"], "webhook");
    let webhook = &record.meta["webhook"];
    assert_eq!(webhook["integration_id"], "zap");
    assert_eq!(webhook["metadata"], json!({ "zap": "intake" }));
    assert_eq!(
        webhook["attachments"],
        json!([{ "source": "urls", "url": "https://example.com/a" }])
    );
    assert_eq!(
        webhook["request"],
        json!({
            "method": "POST",
            "path": "/webhooks/zap",
            "query": "token=[REDACTED]&api_key=[REDACTED]&foo=bar&X-Amz-Signature=[REDACTED]&Password=[REDACTED]",
            "remote_ip": "203.0.113.9",
            "user_agent": "Zapier",
            "request_id": "req-42",
        })
    );
    assert!(!record.meta.to_string().contains(TOKEN), "the token is not stored");
}

#[test]
fn query_redaction_covers_secret_looking_keys_and_keeps_the_rest() {
    let check = |raw: &str, expected: Option<&str>| {
        assert_eq!(redact_query(raw).as_deref(), expected, "{raw}");
    };
    check("foo=bar&token=t1&api_key=k", Some("foo=bar&token=[REDACTED]&api_key=[REDACTED]"));
    check(
        "webhook_token=a&client_secret=b&apikey=c&sig=d&oauth=e&page=2",
        Some("webhook_token=[REDACTED]&client_secret=[REDACTED]&apikey=[REDACTED]&sig=[REDACTED]&oauth=[REDACTED]&page=2"),
    );
    // Percent-encoded keys are decoded before matching; values stay as sent.
    check("%74oken=x&q=a%20b", Some("%74oken=[REDACTED]&q=a%20b"));
    check("flag&&", Some("flag"));
    check("", None);
}

#[test]
fn secure_compare_needs_equal_bytes_and_length() {
    assert!(constant_time_eq(b"secret-token", b"secret-token"));
    assert!(!constant_time_eq(b"secret-token", b"secret-tokem"));
    assert!(!constant_time_eq(b"secret-token", b"secret-token-longer"));
    assert!(!constant_time_eq(b"", b"secret-token"));
    assert!(!constant_time_eq(b"secret-token", b""));
}

#[tokio::test]
async fn a_blank_token_never_authenticates() {
    let hook = TestHook::simple("");
    for (name, value) in [("authorization", "Bearer "), ("x-webhook-token", "   ")] {
        let req = post("/webhooks/zap").header(name, value);
        let (status, _) = hook.send(req.body(Body::from(r#"{"prompt":"x"}"#)).unwrap()).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{name}");
    }
}

// Callbacks.

#[test]
fn only_2xx_answers_count_as_delivered() {
    for status in [200, 201, 204, 299] {
        assert!(delivered(status), "{status}");
    }
    for status in [100, 199, 300, 302, 404, 500] {
        assert!(!delivered(status), "{status}");
    }
}

#[tokio::test]
async fn a_redirect_is_not_followed_and_counts_as_a_failed_attempt() {
    let (addr, attempts, mut received) =
        callback_server_answering(vec![StatusCode::FOUND, StatusCode::MULTIPLE_CHOICES]).await;
    let toml = format!(
        "callback_backoff_ms = 1\ncallback_backoff_max_ms = 2\nallow_private_callback_hosts = true\n\
         [integrations.zap]\ntoken = \"{TOKEN}\"\ncallback_url = \"http://{addr}/cb\"\n"
    );
    let hook = TestHook::start(&toml, Duration::ZERO, MapResolver::default());
    let (status, body) = hook
        .post(json!({
            "prompt": "with files",
            "files": [{ "name": "a.txt", "url": "https://example.com/a.txt" }],
            "metadata": { "k": "v" },
        }))
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let delivered = within("the callback", received.recv()).await.unwrap();
    assert_eq!(attempts.load(Ordering::SeqCst), 3, "302 and 300 failed, the third got 200");
    assert_eq!(delivered["run_id"], body["run_id"]);
    assert_eq!(delivered["metadata"], json!({ "k": "v" }));
    assert_eq!(
        delivered["attachments"],
        json!([{ "source": "files", "name": "a.txt", "url": "https://example.com/a.txt" }])
    );
}

fn resolver(entries: &[(&str, &[&str])]) -> MapResolver {
    MapResolver(
        entries
            .iter()
            .map(|(host, ips)| {
                ((*host).to_owned(), ips.iter().map(|ip| ip.parse().unwrap()).collect())
            })
            .collect(),
    )
}

#[tokio::test]
async fn callback_urls_are_canonicalised_and_private_hosts_refused_unless_allowed() {
    let resolver = resolver(&[
        ("example.test", &["93.184.216.34"]),
        ("mixed.example.test", &["93.184.216.34", "10.1.2.3"]),
    ]);
    let canonical = |raw: &'static str, allow_private: bool| {
        let resolver = &resolver;
        async move { check(raw, resolver, allow_private).await.map(|t| t.url().to_string()) }
    };
    assert_eq!(
        canonical("https://EXAMPLE.TEST./callback", false).await.unwrap(),
        "https://example.test/callback"
    );
    assert!(matches!(
        canonical("ftp://example.test/callback", false).await,
        Err(CallbackError::InvalidUrl(_))
    ));
    assert!(matches!(canonical("not a url", false).await, Err(CallbackError::InvalidUrl(_))));
    for private in [
        "http://localhost./callback",
        "http://api.localhost/callback",
        "http://127.0.0.1/callback",
        "http://[::ffff:127.0.0.1]/callback",
        "http://[::1]:8080/callback",
        "https://Mixed.Example.Test./callback",
    ] {
        assert!(
            matches!(canonical(private, false).await, Err(CallbackError::PrivateHost(_))),
            "{private}"
        );
    }
    assert_eq!(
        canonical("http://127.0.0.1/callback", true).await.unwrap(),
        "http://127.0.0.1/callback"
    );
    assert_eq!(
        canonical("https://Mixed.Example.Test./callback", true).await.unwrap(),
        "https://mixed.example.test/callback"
    );
    let unresolved = canonical("https://nowhere.example.test/", false).await;
    assert!(matches!(unresolved, Err(CallbackError::Resolve { .. })), "{unresolved:?}");
}

// Idempotency keys.

#[tokio::test]
async fn a_body_idempotency_key_counts_only_where_allowed() {
    let hook = TestHook::simple("");
    let body = json!({ "prompt": "x", "idempotency_key": "payload-idem" });
    let (_, first) = hook.post(body.clone()).await;
    let (_, second) = hook.post(body.clone()).await;
    assert!(second.get("duplicate").is_none(), "ignored by default: {second}");
    assert_ne!(first["run_id"], second["run_id"]);
    for key in [json!({ "idempotencyKey": "camel" }), json!({ "idempotency": { "key": "nested" } })]
    {
        let mut body = key;
        body["prompt"] = json!("x");
        let (_, again) = hook.post(body).await;
        assert!(again.get("duplicate").is_none(), "{again}");
    }
    assert_eq!(hook.run_count().await, 4);

    let toml =
        format!("[integrations.zap]\ntoken = \"{TOKEN}\"\nallow_payload_idempotency_key = true\n");
    let hook = TestHook::start(&toml, Duration::ZERO, MapResolver::default());
    let (_, first) = hook.post(body.clone()).await;
    let (status, second) = hook.post(body).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    assert_eq!(second["duplicate"], true, "{second}");
    assert_eq!(second["run_id"], first["run_id"]);
    let nested = json!({ "prompt": "x", "idempotency": { "key": "payload-idem" } });
    let (_, third) = hook.post(nested).await;
    assert_eq!(third["run_id"], first["run_id"], "the nested form names the same key");
    assert_eq!(hook.run_count().await, 1);
}

#[tokio::test]
async fn an_overlong_idempotency_key_is_refused() {
    let hook = TestHook::simple("");
    let req = post("/webhooks/zap")
        .header("authorization", format!("Bearer {TOKEN}"))
        .header("idempotency-key", "k".repeat(257))
        .body(Body::from(r#"{"prompt":"x"}"#))
        .unwrap();
    let (status, body) = hook.send(req).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(body["error"].as_str().unwrap().contains("idempotency key"), "{body}");
    assert_eq!(hook.run_count().await, 0);
}

#[tokio::test]
async fn idempotency_answers_survive_a_restart_on_the_same_store() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("lemon.db");
    let toml = format!("mode = \"sync\"\n[integrations.zap]\ntoken = \"{TOKEN}\"\n");
    let keyed = || {
        post("/webhooks/zap")
            .header("authorization", format!("Bearer {TOKEN}"))
            .header("idempotency-key", "deploy-9")
            .body(Body::from(r#"{"prompt":"only once"}"#))
            .unwrap()
    };
    let store = StoreHandle::open_sqlite(&path).unwrap();
    let hook = TestHook::start_on(store.clone(), &toml, Duration::ZERO, MapResolver::default());
    let (status, first) = hook.send(keyed()).await;
    assert_eq!(status, StatusCode::OK, "{first}");
    hook.stop().await;
    store.close().await.unwrap();

    let store = StoreHandle::open_sqlite(&path).unwrap();
    let hook = TestHook::start_on(store.clone(), &toml, Duration::ZERO, MapResolver::default());
    let (status, again) = hook.send(keyed()).await;
    assert_eq!(status, StatusCode::OK, "{again}");
    assert_eq!(again["duplicate"], true);
    assert_eq!(again["run_id"], first["run_id"]);
    assert_eq!(again["answer"], "only once", "the final answer is replayed");
    assert_eq!(hook.run_count().await, 1);
    hook.stop().await;
    store.close().await.unwrap();
}

// The webhook as a transport.

#[tokio::test]
async fn the_webhook_transport_reports_a_port_in_use_and_comes_up_once_it_is_free() {
    let hook = TestHook::simple("");
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let table: toml::Table = toml::from_str(&format!(
        "port = {}
[integrations.zap]
token = \"{TOKEN}\"\n",
        addr.port()
    ))
    .unwrap();
    let config = WebhookConfig::parse(&table).unwrap();
    let tokens = BTreeMap::from([("zap".to_owned(), TOKEN.to_owned())]);
    let transport = WebhookTransport::new(config, tokens, Arc::new(MapResolver::default()));
    assert!(!format!("{transport:?}").contains(TOKEN));
    let policy = RestartPolicy {
        initial_backoff: Duration::from_millis(5),
        max_backoff: Duration::from_millis(20),
        reset_after: Duration::from_secs(60),
    };
    let mut registry = TransportRegistry::default().with_policy(policy);
    registry.add(Arc::new(transport)).unwrap();
    let deps = TransportDeps {
        http: lemon_api::http::ServeConfig::default(),
        approvals: lemon_core::approvals::ApprovalHub::default(),
        media: lemon_core::media::MediaStage::new(std::env::temp_dir().join("lemon-media-test")),
        router: hook.router.clone(),
        store: hook.store.clone(),
        shutdown: hook._token.clone(),
        tracker: hook.tracker.clone(),
    };
    let statuses = registry.start(&deps);
    let failing =
        within("webhook failing", statuses.wait_for(|map| map["webhook"].is_failing())).await;
    let TransportState::Failing { reason, retry_in_ms, .. } = &failing["webhook"] else {
        unreachable!()
    };
    assert!(reason.starts_with(&format!("could not listen on {addr}")), "{reason}");
    assert!(retry_in_ms.is_some(), "a port in use is retried");
    assert!(!reason.contains(TOKEN));

    drop(taken);
    let running = within(
        "webhook running",
        statuses.wait_for(|map| matches!(map["webhook"], TransportState::Running { .. })),
    )
    .await;
    assert_eq!(running["webhook"], TransportState::Running { detail: Some(addr.to_string()) });
    let response = reqwest::Client::new()
        .post(format!("http://{addr}/webhooks/zap"))
        .bearer_auth(TOKEN)
        .json(&json!({ "prompt": "over a real socket" }))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 202);
    let body: Value = response.json().await.unwrap();
    let record = hook.store.get_run(body["run_id"].as_str().unwrap()).await.unwrap().unwrap();
    assert_eq!(record.meta["webhook"]["request"]["remote_ip"], "127.0.0.1", "the peer is recorded");
    hook.stop().await;
    assert_eq!(statuses.get("webhook"), Some(TransportState::Stopped));
}

// The templates in docs/webhooks send what the normaliser reads.

/// `text` with every `{{ … }}` placeholder of the tools replaced by `value`.
fn fill_placeholders(text: &str, value: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(start) = rest.find("{{") {
        out.push_str(&rest[..start]);
        let end = rest[start..].find("}}").map(|e| start + e + 2).unwrap_or(rest.len());
        out.push_str(value);
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

#[track_caller]
fn check_template(name: &str, body: &str, attachment_source: &str) {
    let body: Value = serde_json::from_str(&fill_placeholders(body, "https://files.example/x"))
        .unwrap_or_else(|err| panic!("{name}: the body is not JSON: {err}"));
    let payload = Payload::from_body(&body).unwrap_or_else(|err| panic!("{name}: {err}"));
    let (text, section) = payload
        .prompt
        .split_once("\n\nAttachments:\n")
        .unwrap_or_else(|| panic!("{name}: text and attachments expected in {:?}", payload.prompt));
    assert!(!text.trim().is_empty(), "{name}");
    assert!(section.starts_with("- "), "{name}: {section}");
    assert!(payload.attachments.iter().all(|a| a.source == attachment_source), "{name}");
    assert!(payload.metadata.as_object().is_some_and(|m| !m.is_empty()), "{name}: metadata");
}

#[test]
fn the_documented_templates_send_text_attachments_and_metadata() {
    let docs = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/webhooks/");
    let read = |file: &str| std::fs::read_to_string(format!("{docs}{file}")).unwrap();

    let make: Value = serde_json::from_str(&read("make.json")).unwrap();
    check_template("make.json", make["mapper"]["data"].as_str().unwrap(), "attachments");
    let headers = make["mapper"]["headers"].to_string().to_ascii_lowercase();
    assert!(headers.contains("x-webhook-token") && headers.contains("idempotency-key"));

    let n8n: Value = serde_json::from_str(&read("n8n.json")).unwrap();
    let request = &n8n["nodes"][1]["parameters"];
    let body = request["jsonBody"].as_str().unwrap().trim_start_matches('=');
    check_template("n8n.json", body, "urls");
    let headers = request["headerParameters"].to_string().to_ascii_lowercase();
    assert!(headers.contains("bearer") && headers.contains("idempotency-key"));

    let zapier = read("zapier.md");
    let json_block = zapier
        .split("```json")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("zapier.md has a JSON body");
    check_template("zapier.md", json_block, "files");
    let curl = zapier.split("-d '").nth(1).and_then(|rest| rest.split('\'').next()).unwrap();
    check_template("zapier.md (curl)", curl, "files");
}

#[tokio::test]
async fn a_client_that_hangs_up_mid_request_still_gets_its_answer_on_retry() {
    let toml = format!("mode = \"sync\"\n[integrations.zap]\ntoken = \"{TOKEN}\"\n");
    let hook = TestHook::start(&toml, Duration::from_millis(20), MapResolver::default());
    let req = || {
        post("/webhooks/zap")
            .header("authorization", format!("Bearer {TOKEN}"))
            .header("idempotency-key", "hang-up-1")
            .body(Body::from(r#"{"prompt":"one two three four"}"#))
            .unwrap()
    };
    let mut events = hook.bus.subscribe_all();
    let request = tokio::spawn(hook.router().oneshot(req()));
    within("the run to start", async {
        while !matches!(events.recv().await.unwrap().kind, EventKind::RunStarted { .. }) {}
    })
    .await;
    // The client hangs up while its run is going.
    request.abort();
    within("the run to complete", async {
        while !matches!(events.recv().await.unwrap().kind, EventKind::RunCompleted { .. }) {}
    })
    .await;
    // The answer is recorded by the request's own task right after the
    // completion; until then the key is still being processed (409).
    let (status, body) = within("the recorded answer", async {
        loop {
            let (status, body) = hook.send(req()).await;
            if status != StatusCode::CONFLICT {
                return (status, body);
            }
            tokio::task::yield_now().await;
        }
    })
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["duplicate"], true, "{body}");
    assert_eq!(body["answer"], "one two three four");
    assert_eq!(hook.run_count().await, 1, "the retry did not run again");
}

#[tokio::test]
async fn a_payload_chooses_no_session_unless_the_integration_allows_it() {
    let hook = TestHook::simple("");
    let telegram_chat = "agent:default:telegram:bot:dm:42";
    let (status, body) = hook.post(json!({ "prompt": "hi", "session_key": telegram_chat })).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(body["error"].as_str().unwrap().contains("allow_session_key"), "{body}");
    assert_eq!(hook.run_count().await, 0);
}

#[tokio::test]
async fn an_allowed_payload_session_stays_under_the_integration() {
    let toml = format!("[integrations.zap]\ntoken = \"{TOKEN}\"\nallow_session_key = true\n");
    let hook = TestHook::start(&toml, Duration::ZERO, MapResolver::default());
    let cases = [
        ("customer-42", "webhook:zap:customer-42"),
        ("webhook:zap:customer-42", "webhook:zap:customer-42"),
        ("agent:default:telegram:bot:dm:42", "webhook:zap:agent:default:telegram:bot:dm:42"),
        ("webhook:other:x", "webhook:zap:webhook:other:x"),
    ];
    for (chosen, expected) in cases {
        let (status, body) = hook.post(json!({ "prompt": "hi", "session_key": chosen })).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{chosen}: {body}");
        assert_eq!(body["session_key"], expected, "{chosen}");
        let record = hook.store.get_run(body["run_id"].as_str().unwrap()).await;
        assert_eq!(record.unwrap().unwrap().session_key, expected, "{chosen}");
    }
    for bad in ["with space", "line\nbreak", &"x".repeat(201), "webhook:zap:"] {
        let (status, body) = hook.post(json!({ "prompt": "hi", "session_key": bad })).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad:?}: {body}");
        assert!(body["error"].as_str().unwrap().contains("invalid session_key"), "{body}");
    }
}

/// The callback record of `run_id` once `wanted` accepts it (polled, bounded).
async fn callback_record(
    store: &StoreHandle,
    run_id: &str,
    wanted: impl Fn(&Value) -> bool,
) -> Value {
    within("the callback record", async {
        loop {
            let now = lemon_core::clock::now_ms();
            let record = store.kv_get("webhook.callback", run_id, now).await.unwrap();
            if let Some(record) = record.filter(|r| wanted(r)) {
                return record;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
}

#[tokio::test]
async fn a_callback_pending_at_a_stop_is_delivered_once_after_a_restart() {
    let (addr, attempts, mut received) = callback_server(1).await;
    let hook_toml = |backoff_ms: u64| {
        format!(
            "callback_max_attempts = 3\ncallback_backoff_ms = {backoff_ms}\n\
             allow_private_callback_hosts = true\n\
             [integrations.zap]\ntoken = \"{TOKEN}\"\ncallback_url = \"http://{addr}/cb?key=s3cr3t\"\n"
        )
    };
    let store = StoreHandle::memory();
    // A long wait after the first failure: the stop comes while it waits.
    let hook = TestHook::start_on(
        store.clone(),
        &hook_toml(600_000),
        Duration::ZERO,
        MapResolver::default(),
    );
    let (status, body) =
        hook.post(json!({ "prompt": "after the restart", "metadata": { "n": 1 } })).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let run_id = body["run_id"].as_str().unwrap().to_owned();
    let record = callback_record(&store, &run_id, |r| r["attempts"] == 1).await;
    assert_eq!(record["url"], format!("http://{addr}/cb?key=s3cr3t"));
    assert_eq!(record["integration_id"], "zap");
    assert_eq!(record["metadata"], json!({ "n": 1 }));
    hook.stop().await;
    assert_eq!(attempts.load(Ordering::SeqCst), 1);

    let hook =
        TestHook::start_on(store.clone(), &hook_toml(1), Duration::ZERO, MapResolver::default());
    assert_eq!(hook.state.recover_callbacks().await, 1);
    let delivered = within("the callback", received.recv()).await.unwrap();
    assert_eq!(delivered["run_id"], run_id.as_str());
    assert_eq!(delivered["completed"]["answer"], "after the restart");
    assert_eq!(delivered["metadata"], json!({ "n": 1 }));
    hook.stop().await;
    assert_eq!(attempts.load(Ordering::SeqCst), 2, "delivered by the second attempt");
    let now = lemon_core::clock::now_ms();
    assert_eq!(store.kv_get("webhook.callback", &run_id, now).await.unwrap(), None);

    // Nothing is left for a third start.
    let hook = TestHook::start_on(store, &hook_toml(1), Duration::ZERO, MapResolver::default());
    assert_eq!(hook.state.recover_callbacks().await, 0);
    hook.stop().await;
    assert!(received.try_recv().is_err(), "delivered once");
}

#[tokio::test]
async fn attempts_are_counted_across_restarts_and_a_callback_out_of_them_is_given_up() {
    let (addr, attempts, _received) = callback_server(10).await;
    let toml = format!(
        "callback_max_attempts = 2\ncallback_backoff_ms = 1\nallow_private_callback_hosts = true\n\
         [integrations.zap]\ntoken = \"{TOKEN}\"\ncallback_url = \"http://{addr}/cb\"\n"
    );
    let store = StoreHandle::memory();
    let hook = TestHook::start_on(store.clone(), &toml, Duration::ZERO, MapResolver::default());
    let (status, body) = hook.post(json!({ "prompt": "nobody listens" })).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let run_id = body["run_id"].as_str().unwrap().to_owned();
    let record = callback_record(&store, &run_id, |r| !r["failed"].is_null()).await;
    assert_eq!(record["attempts"], 2);
    assert_eq!(record["failed"], "unexpected status 500");
    hook.stop().await;
    assert_eq!(attempts.load(Ordering::SeqCst), 2);

    // Given up on: kept on record, not tried again.
    let hook = TestHook::start_on(store, &toml, Duration::ZERO, MapResolver::default());
    assert_eq!(hook.state.recover_callbacks().await, 0);
    hook.stop().await;
    assert_eq!(attempts.load(Ordering::SeqCst), 2);
}

/// A callback receiver that answers every attempt with a 500 and reports the
/// (paused) time of each.
async fn refusing_callback_server() -> (SocketAddr, mpsc::UnboundedReceiver<tokio::time::Instant>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let app = Router::new().route(
        "/cb",
        axum::routing::post(move || {
            let _ = tx.send(tokio::time::Instant::now());
            async { StatusCode::INTERNAL_SERVER_ERROR }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (addr, rx)
}

/// The waits between the callback attempts of a run submitted to a hook
/// configured by `retry` (keys of `[gateway.webhook]`), once it has made
/// `attempts` of them and given up.
async fn waits_between_callback_attempts(retry: &str, attempts: usize) -> Vec<Duration> {
    let (addr, mut times) = refusing_callback_server().await;
    let toml = format!(
        "{retry}allow_private_callback_hosts = true\n\
         [integrations.zap]\ntoken = \"{TOKEN}\"\ncallback_url = \"http://{addr}/cb\"\n"
    );
    let store = StoreHandle::memory();
    let hook = TestHook::start_on(store.clone(), &toml, Duration::ZERO, MapResolver::default());
    let (status, body) = hook.post(json!({ "prompt": "nobody listens" })).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let run_id = body["run_id"].as_str().unwrap().to_owned();
    let mut seen = Vec::new();
    for _ in 0..attempts {
        let patience = Duration::from_secs(600);
        seen.push(
            lemon_core::testing::within_for(patience, "an attempt", times.recv()).await.unwrap(),
        );
    }
    let record = callback_record(&store, &run_id, |r| !r["failed"].is_null()).await;
    assert_eq!(record["attempts"], attempts, "{record}");
    hook.stop().await;
    assert!(times.try_recv().is_err(), "no attempt after the last");
    seen.windows(2).map(|pair| pair[1] - pair[0]).collect()
}

/// The documented defaults: a callback is tried 3 times, 500 ms after the
/// first failure, then twice as long.
#[tokio::test(start_paused = true)]
async fn by_default_a_callback_is_tried_3_times_500_ms_then_1000_ms_apart() {
    let waits = waits_between_callback_attempts("", 3).await;
    assert_eq!(waits, [Duration::from_millis(500), Duration::from_millis(1000)]);
}

/// The documented default of `callback_backoff_max_ms`: the wait doubles up to 5000 ms.
#[tokio::test(start_paused = true)]
async fn by_default_the_wait_between_callback_attempts_doubles_up_to_5000_ms() {
    let waits = waits_between_callback_attempts("callback_max_attempts = 8\n", 8).await;
    let ms: Vec<u128> = waits.iter().map(Duration::as_millis).collect();
    assert_eq!(ms, [500, 1000, 2000, 4000, 5000, 5000, 5000]);
}

/// The documented default of `max_body_bytes`: a body of 1 MiB is taken, one
/// byte more is a `413`, declared or found while reading.
#[tokio::test]
async fn by_default_a_webhook_body_of_1_mib_is_taken_and_one_byte_more_is_413() {
    let hook = TestHook::simple("");
    let body = |len: usize| {
        let mut body = br#"{"prompt": "padded"}"#.to_vec();
        body.resize(len, b' ');
        body
    };
    let request = |len: usize, declared: bool| {
        let mut request = post("/webhooks/zap").header("authorization", format!("Bearer {TOKEN}"));
        if declared {
            request = request.header("content-length", len.to_string());
        }
        request.body(Body::from(body(len))).unwrap()
    };
    for declared in [true, false] {
        let (status, answer) = hook.send(request(1_048_576, declared)).await;
        assert_eq!(status, StatusCode::ACCEPTED, "declared {declared}: {answer}");
        let (status, answer) = hook.send(request(1_048_577, declared)).await;
        assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "declared {declared}");
        assert_eq!(answer, json!({ "error": "request body is larger than 1048576 bytes" }));
    }
}

/// The reference's per-integration retry keys win over the section's.
#[tokio::test]
async fn an_integration_s_callback_retry_settings_win_over_the_section_s() {
    let (addr, attempts, _received) = callback_server(10).await;
    let toml = format!(
        "callback_max_attempts = 5\ncallback_backoff_ms = 60000\nallow_private_callback_hosts = true\n\
         [integrations.zap]\ntoken = \"{TOKEN}\"\ncallback_url = \"http://{addr}/cb\"\n\
         callback_max_attempts = 2\ncallback_backoff_ms = 1\ncallback_backoff_max_ms = 2\n"
    );
    let store = StoreHandle::memory();
    let hook = TestHook::start_on(store.clone(), &toml, Duration::ZERO, MapResolver::default());
    let (status, body) = hook.post(json!({ "prompt": "nobody listens" })).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let run_id = body["run_id"].as_str().unwrap().to_owned();
    let record = callback_record(&store, &run_id, |r| !r["failed"].is_null()).await;
    assert_eq!(record["attempts"], 2);
    hook.stop().await;
    assert_eq!(attempts.load(Ordering::SeqCst), 2);
}

/// The reference's `callback_wait_timeout_ms`: a run that outlasts it gets no
/// callback, and the callback is on record as given up.
#[tokio::test]
async fn a_run_that_outlasts_callback_wait_timeout_ms_gets_no_callback() {
    let (addr, attempts, _received) = callback_server(0).await;
    let toml = format!(
        "callback_wait_timeout_ms = 600000\nallow_private_callback_hosts = true\n\
         [integrations.zap]\ntoken = \"{TOKEN}\"\ncallback_url = \"http://{addr}/cb\"\n\
         callback_wait_timeout_ms = 20\n"
    );
    let store = StoreHandle::memory();
    // A word a minute: the run is still going when the wait is over.
    let hook =
        TestHook::start_on(store.clone(), &toml, Duration::from_secs(60), MapResolver::default());
    let (status, body) = hook.post(json!({ "prompt": "a long job" })).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let run_id = body["run_id"].as_str().unwrap().to_owned();
    let record = callback_record(&store, &run_id, |r| !r["failed"].is_null()).await;
    assert_eq!(record["failed"], "the run did not finish within callback_wait_timeout_ms (20 ms)");
    assert_eq!(record["attempts"], 0);
    hook.stop().await;
    assert_eq!(attempts.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_request_the_router_refuses_leaves_no_callback_record() {
    let (addr, attempts, _received) = callback_server(0).await;
    let toml = format!(
        "allow_private_callback_hosts = true\n\
         [integrations.zap]\ntoken = \"{TOKEN}\"\ncallback_url = \"http://{addr}/cb\"\n"
    );
    let hook = TestHook::start(&toml, Duration::ZERO, MapResolver::default());
    let (status, body) = hook.post(json!({ "prompt": "x", "engine": "no-such-engine" })).await;
    assert!(status.is_client_error(), "{status} {body}");
    let now = lemon_core::clock::now_ms();
    assert_eq!(hook.store.kv_list("webhook.callback", now).await.unwrap(), vec![]);
    hook.stop().await;
    assert_eq!(attempts.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn configured_callback_urls_are_checked_once_at_start() {
    use super::{check_callback_urls, CallbackUrlProblem};
    let resolver = MapResolver(HashMap::from([
        ("hooks.example.com".to_owned(), vec!["93.184.216.34".parse().unwrap()]),
        ("intranet.example.com".to_owned(), vec!["10.0.0.7".parse().unwrap()]),
    ]));
    let config = WebhookConfig::parse(
        &toml::from_str(
            "callback_url = \"https://hooks.example.com/in\"\n\
             [integrations.ok]\ntoken = \"t\"\n\
             [integrations.bad]\ntoken = \"t\"\ncallback_url = \"ftp://hooks.example.com/\"\n\
             [integrations.private]\ntoken = \"t\"\ncallback_url = \"http://intranet.example.com/\"\n\
             [integrations.allowed]\ntoken = \"t\"\ncallback_url = \"http://intranet.example.com/\"\nallow_private_callback_hosts = true\n\
             [integrations.gone]\ntoken = \"t\"\ncallback_url = \"https://nowhere.example.com/?key=s3cr3t\"\n",
        )
        .unwrap(),
    )
    .unwrap();
    let problems = check_callback_urls(&config, &resolver).await;
    let key = |id: &str| vec!["integrations".to_owned(), id.to_owned(), "callback_url".to_owned()];
    assert_eq!(
        problems,
        [
            CallbackUrlProblem::Invalid {
                key: key("bad"),
                message: "invalid callback url: the scheme must be http or https".into()
            },
            CallbackUrlProblem::Unresolved {
                key: key("gone"),
                message: "the host \"nowhere.example.com\" does not resolve now; callbacks fail until it does".into()
            },
            CallbackUrlProblem::Invalid {
                key: key("private"),
                message: "10.0.0.7 is a private or loopback address; set allow_private_callback_hosts = true to allow it".into()
            },
        ]
    );
}

/// Submits `prompt` in `session` the way a cron firing does (not through the
/// webhook) and returns the run id.
async fn submit_elsewhere(hook: &TestHook, session: &str, prompt: &str) -> String {
    let mut req = lemon_core::router::RunRequest::new(session, prompt);
    req.origin = lemon_core::router::Origin::Cron;
    match hook.router.submit(req).await.unwrap() {
        lemon_core::router::Submitted::Run(accepted, _) => accepted.run_id.as_str().to_owned(),
        other => panic!("not a run: {other:?}"),
    }
}

/// Starts delivering the runs of the integrations' sessions that others submit.
fn watch_others(hook: &TestHook) {
    let others = hook.router.subscribe_all();
    let state = hook.state.clone();
    hook.tracker.spawn(async move { state.deliver_others(others).await });
}

#[test]
fn sessions_belong_to_the_integration_they_are_of() {
    let toml = format!(
        "[integrations.ci]\ntoken = \"{TOKEN}\"\n[integrations.\"ci:eu\"]\ntoken = \"{TOKEN}\"\n\
         [integrations.ops]\ntoken = \"{TOKEN}\"\nsession_key = \"agent:ops:main\"\n"
    );
    let config = WebhookConfig::parse(&toml::from_str(&toml).unwrap()).unwrap();
    let of = |key: &str| super::integration_of(&config, &key.into()).map(|(id, _)| id.to_owned());
    assert_eq!(of("webhook:ci").as_deref(), Some("ci"));
    assert_eq!(of("webhook:ci:nightly").as_deref(), Some("ci"));
    assert_eq!(of("webhook:ci:eu").as_deref(), Some("ci:eu"));
    assert_eq!(of("webhook:ci:eu:x").as_deref(), Some("ci:eu"));
    assert_eq!(of("agent:ops:main").as_deref(), Some("ops"));
    assert_eq!(of("webhook:cix"), None);
    assert_eq!(of("webhook:ops").as_deref(), Some("ops"));
    assert_eq!(of("agent:default:main"), None);
    assert_eq!(of("webhook:"), None);
}

#[tokio::test]
async fn a_run_started_elsewhere_in_an_integration_session_gets_its_callback() {
    let (addr, attempts, mut received) = callback_server(1).await;
    let toml = format!(
        "callback_backoff_ms = 1\ncallback_backoff_max_ms = 2\nallow_private_callback_hosts = true\n\
         [integrations.zap]\ntoken = \"{TOKEN}\"\ncallback_url = \"http://{addr}/cb\"\n"
    );
    let hook = TestHook::start(&toml, Duration::ZERO, MapResolver::default());
    watch_others(&hook);
    let run_id = submit_elsewhere(&hook, "webhook:zap", "from the schedule").await;
    let delivered = within("the callback", received.recv()).await.unwrap();
    assert_eq!(delivered["run_id"], run_id.as_str());
    assert_eq!(delivered["integration_id"], "zap");
    assert_eq!(delivered["session_key"], "webhook:zap");
    assert_eq!(delivered["completed"]["answer"], "from the schedule");
    assert_eq!(delivered["completed"]["ok"], true);
    assert_eq!(attempts.load(Ordering::SeqCst), 2, "retried like the webhook's own");
    let now = lemon_core::clock::now_ms();
    within("the record to go", async {
        while hook.store.kv_get("webhook.callback", &run_id, now).await.unwrap().is_some() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;

    // The webhook's own run is delivered once, not again as someone else's;
    // a run in another session is not the integration's.
    let (status, body) = hook.post(json!({ "prompt": "my own" })).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let own = within("the own callback", received.recv()).await.unwrap();
    assert_eq!(own["run_id"], body["run_id"]);
    assert_eq!(own["completed"]["answer"], "my own");
    let mut events = hook.bus.subscribe_all();
    let elsewhere = submit_elsewhere(&hook, "agent:default:main", "not a hook session").await;
    assert_eq!(completed_answer(&mut events, &elsewhere).await, "not a hook session");
    let last = submit_elsewhere(&hook, "webhook:zap:later", "the last one").await;
    let next = within("the last callback", received.recv()).await.unwrap();
    assert_eq!(next["run_id"], last.as_str(), "nothing in between (not {elsewhere})");
    assert_eq!(next["session_key"], "webhook:zap:later");
    hook.stop().await;
    assert!(received.try_recv().is_err(), "each delivered once");
    assert_eq!(attempts.load(Ordering::SeqCst), 4);
}

#[tokio::test]
async fn an_integration_without_a_callback_url_delivers_runs_from_elsewhere_nowhere() {
    let hook = TestHook::simple("");
    watch_others(&hook);
    let mut events = hook.bus.subscribe_all();
    let run_id = submit_elsewhere(&hook, "webhook:zap", "nowhere to go").await;
    assert_eq!(completed_answer(&mut events, &run_id).await, "nowhere to go");
    let second = submit_elsewhere(&hook, "webhook:zap", "still nowhere").await;
    assert_eq!(completed_answer(&mut events, &second).await, "still nowhere");
    // The watcher has seen the runs once the integration is noted as told.
    within("the integration noted", async {
        while !hook.state.inner.told_no_callback.lock().unwrap().contains("zap") {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    let now = lemon_core::clock::now_ms();
    assert_eq!(hook.store.kv_list("webhook.callback", now).await.unwrap().len(), 0);
    hook.stop().await;
}

// Files a payload carries: saved for the run where the integration takes
// files, refused as bad input otherwise.

const PDF: &[u8] = b"%PDF-1.7\n1 0 obj <<>> endobj\n%%EOF\n";

fn base64_of(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// A webhook whose integration `zap` answers in sync mode and runs in
/// `project`, with `files` (a `[files]` body, or none).
fn hook_with_files(files: &str, project: &std::path::Path) -> TestHook {
    let toml = format!(
        "{files}\n[integrations.zap]\ntoken = \"{TOKEN}\"\nmode = \"sync\"\ncwd = {:?}\n",
        project.display().to_string()
    );
    TestHook::start(&toml, Duration::ZERO, MapResolver::default())
}

/// How many files wait in the hook's stage.
fn staged_files(hook: &TestHook) -> usize {
    std::fs::read_dir(hook.media.path().join("stage")).map_or(0, Iterator::count)
}

/// A server on loopback answering `GET /report.pdf` with [`PDF`].
async fn pdf_server() -> SocketAddr {
    let app = Router::new().route(
        "/report.pdf",
        axum::routing::get(|| async { ([(header::CONTENT_TYPE, "application/pdf")], PDF) }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

#[test]
fn content_in_a_payload_is_a_file_never_written_in_the_prompt_or_the_record() {
    let png = format!("data:image/png;base64,{}", base64_of(b"\x89PNG\r\n\x1a\n"));
    let body = json!({
        "message": "have a look",
        "attachments": [
            { "name": "report.pdf", "mime_type": "application/pdf", "data": base64_of(PDF) },
            png,
            { "url": png, "name": "dot.png" },
        ],
    });
    check_payload(
        body.clone(),
        "have a look\n\nAttachments:\n- report.pdf\n- (a file without a name)\n- dot.png",
        json!([
            { "source": "attachments", "name": "report.pdf", "content_type": "application/pdf" },
            { "source": "attachments" },
            { "source": "attachments", "name": "dot.png" },
        ]),
    );
    let payload = Payload::from_body(&body).unwrap();
    assert!(payload.attachments.iter().all(|a| a.data.is_some() && a.url.is_none()));
}

#[tokio::test]
async fn a_base64_attachment_is_saved_in_the_runs_directory_and_named_in_its_prompt() {
    let project = tempfile::tempdir().unwrap();
    let hook = hook_with_files("[files]\nmax_download_bytes = 4096\n", project.path());
    let (status, body) = hook
        .post(json!({
            "message": "summarise",
            "attachments": [{ "name": "report.pdf", "data": base64_of(PDF) }],
        }))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let answer = body["answer"].as_str().unwrap();
    assert!(
        answer.starts_with("summarise\n\nAttachments:\n- report.pdf\n\n[Files sent"),
        "{answer}"
    );
    assert!(answer.contains(".lemon/uploads/report.pdf (file, application/pdf"), "{answer}");
    assert_eq!(std::fs::read(project.path().join(".lemon/uploads/report.pdf")).unwrap(), PDF);
    assert_eq!(staged_files(&hook), 0);
    hook.stop().await;
}

#[tokio::test]
async fn a_url_attachment_is_fetched_only_from_hosts_the_section_allows() {
    let addr = pdf_server().await;
    let url = format!("http://{addr}/report.pdf");
    let project = tempfile::tempdir().unwrap();
    let hook = hook_with_files("[files]\n", project.path());
    let (status, body) = hook.post(json!({ "text": "read", "urls": [url] })).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(
        body["error"],
        "urls[0]: the file could not be fetched: 127.0.0.1 is a private or loopback address (allow_private_hosts is off)"
    );
    assert_eq!(hook.run_count().await, 0);
    hook.stop().await;

    let hook = hook_with_files("[files]\nallow_private_hosts = true\n", project.path());
    let (status, body) = hook.post(json!({ "text": "read", "urls": [url] })).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(body["answer"].as_str().unwrap().contains(".lemon/uploads/report.pdf"), "{body}");
    assert_eq!(std::fs::read(project.path().join(".lemon/uploads/report.pdf")).unwrap(), PDF);
    hook.stop().await;
}

#[tokio::test]
async fn refused_files_are_4xx_json_and_nothing_runs() {
    let project = tempfile::tempdir().unwrap();
    // No `[files]`: links are listed, content is refused.
    let hook = hook_with_files("", project.path());
    let (status, body) =
        hook.post(json!({ "text": "x", "files": [{ "name": "a.txt", "data": "QQ==" }] })).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(body, json!({ "error": "files[0] (a.txt): files are not accepted here" }));
    let (status, body) = hook.post(json!({ "text": "x", "urls": ["https://a.example/1"] })).await;
    assert_eq!(status, StatusCode::OK, "links alone still run: {body}");
    hook.stop().await;

    let files = "max_body_bytes = 64\n[files]\nmax_download_bytes = 8\n";
    let hook = hook_with_files(files, project.path());
    let cases = [
        (
            json!({ "name": "../../.bashrc", "data": "QQ==" }),
            StatusCode::BAD_REQUEST,
            "it holds a directory",
        ),
        (
            json!({ "name": "big.txt", "data": base64_of(b"0123456789") }),
            StatusCode::PAYLOAD_TOO_LARGE,
            "the limit is 8 bytes",
        ),
        (json!({ "name": "x.txt", "data": "@@@@" }), StatusCode::BAD_REQUEST, "it is not base64"),
    ];
    for (attachment, want, text) in cases {
        let ok = json!({ "name": "ok.txt", "data": "QQ==" });
        let (status, body) =
            hook.post(json!({ "text": "x", "attachments": [ok, attachment] })).await;
        assert_eq!(status, want, "{body}");
        let error = body["error"].as_str().unwrap();
        assert!(error.starts_with("attachments[1] (") && error.contains(text), "{error}");
    }
    assert_eq!(hook.run_count().await, 0);
    assert_eq!(staged_files(&hook), 0, "the good file of each refused request is gone");
    assert!(!project.path().join(".lemon").exists());
    hook.stop().await;
}

#[tokio::test]
async fn an_integrations_files_section_replaces_the_sections() {
    let project = tempfile::tempdir().unwrap();
    let toml = format!(
        "[files]\n[integrations.zap]\ntoken = \"{TOKEN}\"\nmode = \"sync\"\ncwd = {:?}\n\
         [integrations.zap.files]\nenabled = false\n",
        project.path().display().to_string()
    );
    let hook = TestHook::start(&toml, Duration::ZERO, MapResolver::default());
    let (status, body) = hook
        .post(json!({ "text": "x", "attachments": [{ "name": "a.txt", "data": "QQ==" }] }))
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    hook.stop().await;

    let unknown = toml::from_str::<toml::Table>("[files]\nmax_dowload_bytes = 1\n").unwrap();
    let (_, ignored) = WebhookConfig::parse_with_unknown_keys(&unknown).unwrap();
    assert_eq!(ignored[0].suggestion.as_deref(), Some("max_download_bytes"), "{ignored:?}");
    let bad = toml::from_str::<toml::Table>("[files]\nmax_download_bytes = 0\n").unwrap();
    let err = WebhookConfig::parse(&bad).unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid [gateway.webhook]: files.max_download_bytes: must be more than 0"
    );
}
