//! Tests of the control API against a real gateway running the echo engine:
//! request and response through `oneshot`, event streams over a real socket.

use lemon_core::testing::within;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, HeaderMap, Method, Request, StatusCode};
use axum::Router;
use futures::{Stream, StreamExt};
use lemon_core::bus::{BusEvent, EventBus, EventKind, RecvError, Subscription};
use lemon_core::engine::{Completion, EngineRegistry};
use lemon_core::gateway::{GatewayDeps, GatewayHandle, RuntimeConfig};
use lemon_core::ids::RunId;
use lemon_core::media::{FilesConfig, MediaStage};
use lemon_core::router::{RouterConfig, RouterHandle};
use lemon_core::store::{FinishedRun, NewRun, StoreHandle};
use lemon_engines::echo::EchoEngine;
use serde_json::{json, Value};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt;

use super::{router, router_with, ApiState};
use lemon_core::transport::{TransportState, TransportStatuses};

const TOKEN: &str = "test-token-6f1c";
/// The desktop app's token for one launch, accepted beside [`TOKEN`].
const LAUNCH_TOKEN: &str = "launch-token-93ad";
/// Per-word delay of the slow echo engine.
const SLOW: Duration = Duration::from_millis(20);

/// A prompt of `n` words.
fn words(n: usize) -> String {
    (1..=n).map(|i| format!("word{i}")).collect::<Vec<_>>().join(" ")
}

/// A gateway with the echo engine and an API state over it.
pub(super) struct TestGateway {
    pub(super) state: ApiState,
    /// The stage files wait in for their run.
    pub(super) media: tempfile::TempDir,
    bus: EventBus,
    store: StoreHandle,
    /// The gateway's own token; cancelled on drop.
    token: CancellationToken,
    tracker: TaskTracker,
}

impl TestGateway {
    pub(super) fn start(word_delay: Duration) -> Self {
        TestGateway::with_max(word_delay, 2)
    }

    fn with_max(word_delay: Duration, max_concurrent_runs: usize) -> Self {
        TestGateway::with_bus(word_delay, max_concurrent_runs, EventBus::default())
    }

    fn with_bus(word_delay: Duration, max_concurrent_runs: usize, bus: EventBus) -> Self {
        let config = RuntimeConfig { max_concurrent_runs, ..RuntimeConfig::default() };
        TestGateway::with_config(word_delay, config, bus)
    }

    pub(super) fn with_config(word_delay: Duration, config: RuntimeConfig, bus: EventBus) -> Self {
        // Small enough that a body over the default limit is still refused.
        let files = FilesConfig { max_download_bytes: 64 * 1024, ..FilesConfig::default() };
        TestGateway::with_files(word_delay, config, bus, files)
    }

    /// A gateway whose API takes files by `files`.
    pub(super) fn with_files(
        word_delay: Duration,
        mut config: RuntimeConfig,
        bus: EventBus,
        files: FilesConfig,
    ) -> Self {
        let media = tempfile::tempdir().unwrap();
        let stage = MediaStage::new(media.path().join("stage"));
        config.media_stage.get_or_insert_with(|| stage.clone());
        let tracker = TaskTracker::new();
        let token = CancellationToken::new();
        let mut engines = EngineRegistry::new();
        engines.register(Arc::new(EchoEngine::new(word_delay, tracker.clone()))).unwrap();
        let store = StoreHandle::memory();
        let deps = GatewayDeps { config, engines, store: store.clone(), bus: bus.clone() };
        let gateway = GatewayHandle::start(deps, token.clone(), &tracker);
        let router_config =
            RouterConfig { default_engine: "echo".parse().unwrap(), ..RouterConfig::default() };
        let router = RouterHandle::start(router_config, gateway, token.clone(), &tracker);
        let cron_deps = lemon_core::cron::CronDeps {
            router: router.clone(),
            store: store.clone(),
            clock: Arc::new(lemon_core::cron::SystemClock),
        };
        let cron =
            lemon_core::cron::CronHandle::start(cron_deps, Vec::new(), token.clone(), &tracker);
        let state = ApiState {
            runs: router.query(),
            router,
            token: TOKEN.into(),
            launch_token: Some(LAUNCH_TOKEN.into()),
            default_engine: super::DefaultChoice::new("echo", "no openai_api_key set"),
            version: "1.2.3-test".into(),
            started_at: Instant::now(),
            shutdown: CancellationToken::new(),
            transports: TransportStatuses::default(),
            config: lemon_core::config::ConfigStatus::default(),
            secret_sources: Arc::from([]),
            cron,
            budget: Arc::new(lemon_core::budget::store_guard::StoreBudgetGuard::new(
                store.clone(),
                lemon_core::config::BudgetsConfig::default(),
            )),
            config_file: None,
            sandbox: serde_json::json!({ "mode": "off", "enforced": false }),
            approvals: lemon_core::approvals::ApprovalHub::default(),
            database: None,
            upkeep: Default::default(),
            files: crate::files::FileIntake::new(stage, files),
            mcp: None,
            cluster: None,
            cluster_config: None,
        };
        TestGateway { state, media, bus, store, token, tracker }
    }

    pub(super) fn router(&self) -> Router {
        router(self.state.clone())
    }

    /// Sends a request with the right token.
    async fn call(&self, method: Method, uri: &str, body: Option<Value>) -> (StatusCode, Value) {
        let body = body.map_or_else(Body::empty, |body| Body::from(body.to_string()));
        let req = Request::builder()
            .method(method)
            .uri(uri)
            .header(header::AUTHORIZATION, format!("Bearer {TOKEN}"))
            .header(header::CONTENT_TYPE, "application/json")
            .body(body)
            .unwrap();
        let (status, _, body) = self.send(req).await;
        (status, body)
    }

    async fn send(&self, req: Request<Body>) -> (StatusCode, HeaderMap, Value) {
        let what = format!("{} {}", req.method(), req.uri());
        let response = within(&what, self.router().oneshot(req)).await.unwrap();
        let (parts, body) = response.into_parts();
        let bytes = within(&what, axum::body::to_bytes(body, usize::MAX)).await.unwrap();
        let body = serde_json::from_slice(&bytes).unwrap_or_else(|_| {
            panic!("{what}: body is not JSON: {}", String::from_utf8_lossy(&bytes))
        });
        (parts.status, parts.headers, body)
    }

    /// Submits a run with a chosen id and waits for its `run_completed`.
    async fn run_to_completion(&self, run_id: &str, prompt: &str) -> Arc<BusEvent> {
        let mut events = self.bus.subscribe_run(&RunId::parse(run_id).unwrap());
        let (status, body) = self
            .call(Method::POST, "/v1/runs", Some(json!({ "prompt": prompt, "run_id": run_id })))
            .await;
        assert_eq!(status, StatusCode::ACCEPTED, "{body}");
        until_completed(&mut events, run_id).await
    }

    /// Serves the API on `127.0.0.1:0` until the state's shutdown token fires.
    async fn serve(&self) -> (SocketAddr, tokio::task::JoinHandle<std::io::Result<()>>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server =
            tokio::spawn(crate::serve(listener, self.router(), self.state.shutdown.clone()));
        (addr, server)
    }
}

impl Drop for TestGateway {
    fn drop(&mut self) {
        self.token.cancel();
        self.state.shutdown.cancel();
    }
}

/// The first event of `run_id` that matches `wanted`.
async fn until_event(
    events: &mut Subscription,
    run_id: &str,
    wanted: impl Fn(&EventKind) -> bool,
) -> Arc<BusEvent> {
    within("a bus event", async {
        loop {
            match events.recv().await {
                Ok(event) if event.run_id.as_str() == run_id && wanted(&event.kind) => {
                    return event
                }
                Ok(_) | Err(RecvError::Lagged(_)) => {}
                Err(RecvError::Closed) => panic!("topic of {run_id} closed before the event"),
            }
        }
    })
    .await
}

async fn until_completed(events: &mut Subscription, run_id: &str) -> Arc<BusEvent> {
    until_event(events, run_id, |kind| matches!(kind, EventKind::RunCompleted { .. })).await
}

async fn until_first_delta(events: &mut Subscription, run_id: &str) -> Arc<BusEvent> {
    until_event(events, run_id, |kind| matches!(kind, EventKind::Delta { .. })).await
}

/// One Server-Sent Event.
#[derive(Debug, Clone, PartialEq)]
struct SseFrame {
    event: String,
    id: Option<u64>,
    data: Value,
}

type ByteStream = Pin<Box<dyn Stream<Item = Result<Vec<u8>, String>> + Send>>;

/// Reads SSE frames from a body, skipping keep-alive comments.
struct SseReader {
    body: ByteStream,
    buf: Vec<u8>,
}

impl SseReader {
    fn from_axum(body: Body) -> Self {
        let body = body
            .into_data_stream()
            .map(|chunk| chunk.map(|b| b.to_vec()).map_err(|e| e.to_string()));
        SseReader { body: Box::pin(body), buf: Vec::new() }
    }

    fn from_reqwest(response: reqwest::Response) -> Self {
        let body = response
            .bytes_stream()
            .map(|chunk| chunk.map(|b| b.to_vec()).map_err(|e| e.to_string()));
        SseReader { body: Box::pin(body), buf: Vec::new() }
    }

    /// The next frame, or `None` when the stream ended.
    async fn next(&mut self) -> Option<SseFrame> {
        loop {
            if let Some(end) = self.buf.windows(2).position(|w| w == b"\n\n") {
                let raw: Vec<u8> = self.buf.drain(..end + 2).collect();
                if let Some(frame) = parse_frame(std::str::from_utf8(&raw).unwrap()) {
                    return Some(frame);
                }
                continue;
            }
            match within("an SSE chunk", self.body.next()).await {
                Some(Ok(bytes)) => self.buf.extend_from_slice(&bytes),
                Some(Err(err)) => panic!("SSE body failed: {err}"),
                None => {
                    assert!(self.buf.iter().all(u8::is_ascii_whitespace), "stream ended mid-frame");
                    return None;
                }
            }
        }
    }

    /// Every frame until the stream ends.
    async fn collect(&mut self) -> Vec<SseFrame> {
        let mut frames = Vec::new();
        while let Some(frame) = self.next().await {
            frames.push(frame);
        }
        frames
    }
}

fn parse_frame(raw: &str) -> Option<SseFrame> {
    let (mut event, mut id, mut data) = (String::from("message"), None, None::<String>);
    for line in raw.lines() {
        let (field, value) = line.split_once(':').unwrap_or((line, ""));
        let value = value.strip_prefix(' ').unwrap_or(value);
        match field {
            "event" => event = value.to_owned(),
            "id" => id = Some(value.parse().unwrap()),
            "data" => {
                data = Some(data.map_or_else(|| value.to_owned(), |d| format!("{d}\n{value}")))
            }
            _ => {} // comments (keep-alive) and blank lines
        }
    }
    let data = serde_json::from_str(&data?).unwrap();
    Some(SseFrame { event, id, data })
}

/// Checks a run's complete event sequence: indices exactly 1..=N in order,
/// `run_started` first, deltas numbered 1..=n that spell the prompt, and
/// `run_completed` last.
fn check_complete_run(frames: &[SseFrame], run_id: &str, prompt: &str) {
    let kinds: Vec<&str> = frames.iter().map(|f| f.event.as_str()).collect();
    let indices: Vec<u64> =
        frames.iter().map(|f| f.id.expect("every run event has an id")).collect();
    let expected: Vec<u64> = (1..=frames.len() as u64).collect();
    assert_eq!(indices, expected, "indices of {kinds:?}");
    assert_eq!(kinds.first(), Some(&"run_started"), "{kinds:?}");
    assert_eq!(kinds.last(), Some(&"run_completed"), "{kinds:?}");
    assert!(kinds.contains(&"engine_started"), "{kinds:?}");
    for frame in frames {
        assert_eq!(frame.data["run_id"], json!(run_id));
        assert_eq!(frame.data["type"], json!(frame.event));
        assert_eq!(frame.data["index"], json!(frame.id.unwrap()));
    }
    let deltas: Vec<&SseFrame> = frames.iter().filter(|f| f.event == "delta").collect();
    let seqs: Vec<u64> = deltas.iter().map(|f| f.data["seq"].as_u64().unwrap()).collect();
    assert_eq!(seqs, (1..=deltas.len() as u64).collect::<Vec<_>>());
    let text: String = deltas.iter().map(|f| f.data["text"].as_str().unwrap()).collect();
    assert_eq!(text, prompt);
    let last = &frames.last().unwrap().data;
    assert_eq!(last["status"], json!("completed"));
    assert_eq!(last["answer"], json!(prompt));
}

fn error_of(body: &Value) -> &str {
    body["error"].as_str().unwrap_or_else(|| panic!("no error message in {body}"))
}

#[tokio::test]
async fn requests_need_the_bearer_token() {
    let gw = TestGateway::start(Duration::ZERO);
    let with_auth = |auth: Option<&str>| {
        let mut req = Request::builder().uri("/v1/runs");
        if let Some(auth) = auth {
            req = req.header(header::AUTHORIZATION, auth);
        }
        req.body(Body::empty()).unwrap()
    };
    for auth in [
        None,
        Some("Bearer wrong"),
        Some(&*format!("Basic {TOKEN}")),
        Some("Bearer"),
        Some("Bearer "),
    ] {
        let (status, headers, body) = gw.send(with_auth(auth)).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{auth:?}");
        assert_eq!(body, json!({ "error": "missing or invalid bearer token" }));
        assert_eq!(headers[header::WWW_AUTHENTICATE], "Bearer");
    }
    // Unknown routes are hidden behind the token too.
    let (status, _, _) =
        gw.send(Request::builder().uri("/nope").body(Body::empty()).unwrap()).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);

    let (status, _, body) = gw.send(with_auth(Some(&format!("Bearer {TOKEN}")))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body, json!({ "runs": [] }));
    let (status, _, _) = gw.send(with_auth(Some(&format!("bearer {TOKEN}")))).await;
    assert_eq!(status, StatusCode::OK, "the scheme is case-insensitive");
}

#[tokio::test]
async fn the_launch_token_is_accepted_beside_the_configured_one() {
    let gw = TestGateway::start(Duration::ZERO);
    let req = |auth: &str| {
        Request::builder()
            .uri("/v1/runs")
            .header(header::AUTHORIZATION, auth)
            .body(Body::empty())
            .unwrap()
    };
    let (status, _, body) = gw.send(req(&format!("Bearer {LAUNCH_TOKEN}"))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, _, _) = gw.send(req(&format!("Bearer {LAUNCH_TOKEN}x"))).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    // Without a launch token only the configured one opens the API.
    let mut without = gw.state.clone();
    without.launch_token = None;
    let response =
        within("GET /v1/runs", router(without).oneshot(req(&format!("Bearer {LAUNCH_TOKEN}"))))
            .await
            .unwrap();
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn paused_intake_queues_runs_until_resumed_and_status_shows_it() {
    let gw = TestGateway::start(Duration::ZERO);
    let (status, body) = gw.call(Method::GET, "/v1/status", None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["paused"], json!(false));
    let (status, body) = gw.call(Method::POST, "/v1/intake/pause", None).await;
    assert_eq!((status, body), (StatusCode::OK, json!({ "paused": true })));
    let mut events = gw.bus.subscribe_run(&RunId::parse("paused-1").unwrap());
    let (status, body) = gw
        .call(Method::POST, "/v1/runs", Some(json!({ "prompt": "held", "run_id": "paused-1" })))
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    // The router hands the request to the gateway, which queues it and starts nothing.
    let body = within("the run queued at the gateway", async {
        loop {
            let (_, body) = gw.call(Method::GET, "/v1/status", None).await;
            if body["scheduler"]["queued"] == json!(1) {
                break body;
            }
            tokio::task::yield_now().await;
        }
    })
    .await;
    assert_eq!(body["paused"], json!(true));
    assert_eq!(body["scheduler"]["in_flight"], json!(0));
    let (_, run) = gw.call(Method::GET, "/v1/runs/paused-1", None).await;
    assert_eq!(run["status"], json!("queued"), "{run}");
    let (status, body) = gw.call(Method::POST, "/v1/intake/resume", None).await;
    assert_eq!((status, body), (StatusCode::OK, json!({ "paused": false })));
    let completed = until_completed(&mut events, "paused-1").await;
    assert!(
        matches!(&completed.kind, EventKind::RunCompleted { completion, .. } if completion.ok),
        "{completed:?}"
    );
    // Behind the token like every route.
    let req = Request::builder()
        .method(Method::POST)
        .uri("/v1/intake/pause")
        .body(Body::empty())
        .unwrap();
    let (status, _, _) = gw.send(req).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn submitted_run_completes_with_the_echoed_answer() {
    let gw = TestGateway::start(Duration::ZERO);
    let mut all = gw.bus.subscribe_all();
    let (status, body) = gw
        .call(
            Method::POST,
            "/v1/runs",
            Some(json!({ "prompt": "hello echo world", "meta": { "origin": "test" } })),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    assert_eq!(body["status"], json!("accepted"));
    assert_eq!(body["session_key"], json!("default"));
    let run_id = body["run_id"].as_str().unwrap().to_owned();
    assert!(run_id.starts_with("run_"), "{run_id}");

    until_completed(&mut all, &run_id).await;
    let (status, run) = gw.call(Method::GET, &format!("/v1/runs/{run_id}"), None).await;
    assert_eq!(status, StatusCode::OK, "{run}");
    assert_eq!(run["run_id"], json!(run_id));
    assert_eq!(run["status"], json!("completed"));
    assert_eq!(run["answer"], json!("hello echo world"));
    assert_eq!(run["prompt"], json!("hello echo world"));
    assert_eq!(run["engine"], json!("echo"));
    assert_eq!(run["session_key"], json!("default"));
    assert_eq!(run["meta"], json!({ "origin": "test" }));
    assert_eq!(run["error"], Value::Null);
    assert_eq!(run["error_code"], Value::Null);
    assert_eq!(run["resume"], json!({ "engine": "echo", "value": run_id }));
    assert_eq!(run["resume_line"], json!(format!("echo resume {run_id}")));
    for field in ["created_at_ms", "started_at_ms", "completed_at_ms", "duration_ms"] {
        assert!(run[field].is_number(), "{field} in {run}");
    }
}

#[tokio::test]
async fn submit_with_wait_answers_with_the_finished_run() {
    let gw = TestGateway::start(Duration::ZERO);
    let body = json!({ "prompt": "wait for me", "session_key": "s-wait", "run_id": "wait-1" });
    let (status, run) = gw.call(Method::POST, "/v1/runs?wait=true", Some(body)).await;
    assert_eq!(status, StatusCode::OK, "{run}");
    assert_eq!(run["run_id"], json!("wait-1"));
    assert_eq!(run["session_key"], json!("s-wait"));
    assert_eq!(run["status"], json!("completed"));
    assert_eq!(run["answer"], json!("wait for me"));
    assert_eq!(run["resume"], json!({ "engine": "echo", "value": "wait-1" }));

    // The same request again is the same run, even though that run has finished.
    let body = json!({ "prompt": "wait for me", "session_key": "s-wait", "run_id": "wait-1" });
    let (status, again) = gw.call(Method::POST, "/v1/runs", Some(body.clone())).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{again}");
    assert_eq!(again["run_id"], json!("wait-1"));
    assert_eq!(again["duplicate"], json!(true));
    let (status, run) = gw.call(Method::POST, "/v1/runs?wait=true", Some(body)).await;
    assert_eq!(status, StatusCode::OK, "{run}");
    assert_eq!(run["answer"], json!("wait for me"), "the first request's run, not a new one");

    // Another request under the same id is a conflict, not a silent duplicate.
    let body = json!({ "prompt": "again", "session_key": "s-wait", "run_id": "wait-1" });
    let (status, error) = gw.call(Method::POST, "/v1/runs", Some(body)).await;
    assert_eq!(status, StatusCode::CONFLICT, "{error}");
    assert_eq!(error, json!({ "error": "run_id wait-1 already used for another request" }));
}

#[tokio::test]
async fn duplicate_id_of_an_active_run_is_the_same_run() {
    let gw = TestGateway::start(SLOW);
    let mut events = gw.bus.subscribe_run(&RunId::parse("dup-1").unwrap());
    let body = json!({ "prompt": words(200), "run_id": "dup-1" });
    let (status, _) = gw.call(Method::POST, "/v1/runs", Some(body.clone())).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let (status, again) = gw.call(Method::POST, "/v1/runs", Some(body)).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{again}");
    assert_eq!(again["duplicate"], json!(true));
    let (_, list) = gw.call(Method::GET, "/v1/runs", None).await;
    assert_eq!(list["runs"].as_array().unwrap().len(), 1, "one run: {list}");
    gw.call(Method::POST, "/v1/runs/dup-1/cancel", None).await;
    until_completed(&mut events, "dup-1").await;
}

#[tokio::test]
async fn bad_submissions_are_400_with_a_json_error() {
    let gw = TestGateway::start(Duration::ZERO);
    let raw = |body: &str| {
        Request::builder()
            .method(Method::POST)
            .uri("/v1/runs")
            .header(header::AUTHORIZATION, format!("Bearer {TOKEN}"))
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(body.to_owned()))
            .unwrap()
    };
    for (body, needle) in [
        ("{not json", "invalid JSON body"),
        ("", "invalid JSON body"),
        ("[1, 2]", "invalid JSON body"),
        (r#"{"prompt": 5}"#, "invalid JSON body"),
        (r#"{"prompt": "hi", "meta": "not an object"}"#, "invalid JSON body"),
        ("{}", "prompt is required"),
        (r#"{"prompt": "  "}"#, "prompt is required"),
        (r#"{"prompt": "hi", "run_id": "white space"}"#, "invalid run_id"),
    ] {
        let (status, _, error) = gw.send(raw(body)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {error}");
        assert!(error_of(&error).contains(needle), "{body}: {error}");
    }
    let (status, error) =
        gw.call(Method::POST, "/v1/runs?wait=maybe", Some(json!({ "prompt": "hi" }))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{error}");

    // Nothing was accepted.
    let (_, list) = gw.call(Method::GET, "/v1/runs", None).await;
    assert_eq!(list, json!({ "runs": [] }));
}

#[tokio::test]
async fn a_bad_tools_pattern_is_400_naming_the_field_and_good_ones_narrow_the_run() {
    let gw = TestGateway::start(Duration::ZERO);
    for tools in [json!(["bash", "rm -rf"]), json!([""]), json!(["a.b"])] {
        let (status, error) = gw
            .call(Method::POST, "/v1/runs", Some(json!({ "prompt": "hi", "tools": tools })))
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{tools}: {error}");
        assert!(error_of(&error).starts_with("tools: "), "{tools}: {error}");
        assert!(error_of(&error).contains("not a tool name or pattern"), "{tools}: {error}");
    }
    let (status, error) =
        gw.call(Method::POST, "/v1/runs", Some(json!({ "prompt": "hi", "tools": "bash" }))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "not a list: {error}");
    let (_, list) = gw.call(Method::GET, "/v1/runs", None).await;
    assert_eq!(list, json!({ "runs": [] }), "nothing was accepted");

    // The caller's own filter in `meta` stays, and `tools` narrows it further.
    let body = json!({
        "prompt": "narrowed",
        "run_id": "tools-1",
        "tools": ["github__*", "bash"],
        "meta": { "tool_filter": [["github__search", "bash", "read"]] },
    });
    let (status, run) = gw.call(Method::POST, "/v1/runs?wait=true", Some(body)).await;
    assert_eq!(status, StatusCode::OK, "{run}");
    assert_eq!(
        run["meta"]["tool_filter"],
        json!([["github__search", "bash", "read"], ["github__*", "bash"]]),
        "{run}"
    );
    let (_, run) = gw
        .call(Method::POST, "/v1/runs?wait=true", Some(json!({ "prompt": "all", "tools": [] })))
        .await;
    assert_eq!(run["meta"]["tool_filter"], json!([[]]), "[]: no tool at all: {run}");
}

#[tokio::test]
async fn unknown_engine_is_400_naming_the_engine() {
    let gw = TestGateway::start(Duration::ZERO);
    let (status, error) = gw
        .call(Method::POST, "/v1/runs", Some(json!({ "prompt": "hi", "engine": "nonesuch" })))
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{error}");
    assert!(error_of(&error).contains("nonesuch"), "{error}");
}

#[tokio::test]
async fn overloaded_gateway_is_429_with_retry_after() {
    let config = RuntimeConfig { max_pending_runs: 0, ..RuntimeConfig::default() };
    let gw = TestGateway::with_config(Duration::ZERO, config, EventBus::default());
    let req = Request::builder()
        .method(Method::POST)
        .uri("/v1/runs")
        .header(header::AUTHORIZATION, format!("Bearer {TOKEN}"))
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(json!({ "prompt": "one too many" }).to_string()))
        .unwrap();
    let (status, headers, error) = gw.send(req).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{error}");
    assert!(error_of(&error).contains("overloaded"), "{error}");
    assert_eq!(headers[header::RETRY_AFTER], "1");
}

#[tokio::test]
async fn oversized_body_is_413_with_a_json_error() {
    let gw = TestGateway::start(Duration::ZERO);
    let prompt = "x".repeat(crate::error::MAX_BODY_BYTES);
    let (status, error) =
        gw.call(Method::POST, "/v1/runs", Some(json!({ "prompt": prompt }))).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{error}");
    assert!(error_of(&error).contains("larger than"), "{error}");
}

/// `{"run_usd": 1}` followed by spaces up to `len` bytes: valid JSON of any length.
fn budget_body_of(len: usize) -> Vec<u8> {
    let mut body = br#"{"run_usd": 1}"#.to_vec();
    body.resize(len, b' ');
    body
}

/// The documented limit: a body is at most 1 MiB (routes without files).
/// Exactly 1 MiB is taken; one byte more is a `413` with a JSON error, both
/// when the length is declared and when it is only found by reading.
#[tokio::test]
async fn a_body_of_1_mib_is_taken_and_one_byte_more_is_413() {
    let gw = TestGateway::start(Duration::ZERO);
    let (addr, _server) = gw.serve().await;
    let client = reqwest::Client::new();
    let put = |len: usize| {
        client
            .put(format!("http://{addr}/v1/sessions/s/budget"))
            .bearer_auth(TOKEN)
            .header(header::CONTENT_TYPE, "application/json")
            .body(budget_body_of(len))
            .send()
    };
    let taken = within("a 1 MiB body", put(1_048_576)).await.unwrap();
    assert_eq!(taken.status(), reqwest::StatusCode::OK);
    let taken: Value = taken.json().await.unwrap();
    assert_eq!(taken["limits"]["run_usd"], 1.0, "{taken}");
    let refused = within("a body of 1 MiB and a byte", put(1_048_577)).await.unwrap();
    assert_eq!(refused.status(), reqwest::StatusCode::PAYLOAD_TOO_LARGE);
    let refused: Value = refused.json().await.unwrap();
    assert_eq!(refused, json!({ "error": "request body is larger than 1048576 bytes" }));

    // No declared length: the limit is found while reading.
    let undeclared = |len: usize| {
        Request::builder()
            .method(Method::PUT)
            .uri("/v1/sessions/s/budget")
            .header(header::AUTHORIZATION, format!("Bearer {TOKEN}"))
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(budget_body_of(len)))
            .unwrap()
    };
    let (status, _, body) = gw.send(undeclared(1_048_576)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, _, body) = gw.send(undeclared(1_048_577)).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(body, json!({ "error": "request body is larger than 1048576 bytes" }));
}

#[tokio::test]
async fn unknown_routes_and_wrong_methods_are_json_errors() {
    let gw = TestGateway::start(Duration::ZERO);
    let (status, error) = gw.call(Method::GET, "/v1/nothing-here", None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(error, json!({ "error": "not found" }));

    let req = Request::builder()
        .method(Method::DELETE)
        .uri("/v1/runs")
        .header(header::AUTHORIZATION, format!("Bearer {TOKEN}"))
        .body(Body::empty())
        .unwrap();
    let (status, headers, error) = gw.send(req).await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(error, json!({ "error": "method not allowed" }));
    let allow = headers[header::ALLOW].to_str().unwrap();
    assert!(allow.contains("GET") && allow.contains("POST"), "{allow}");

    let (status, error) = gw.call(Method::GET, "/v1/runs/x/cancel", None).await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED, "{error}");
}

#[tokio::test]
async fn merged_routes_sit_behind_the_token_and_share_the_json_fallbacks() {
    let gw = TestGateway::start(Duration::ZERO);
    let extra = Router::new()
        .route("/v1/extra", axum::routing::get(|| async { axum::Json(json!({ "extra": true })) }));
    let app = router_with(gw.state.clone(), extra);
    let send = |method: Method, auth: bool| {
        let mut req = Request::builder().method(method).uri("/v1/extra");
        if auth {
            req = req.header(header::AUTHORIZATION, format!("Bearer {TOKEN}"));
        }
        app.clone().oneshot(req.body(Body::empty()).unwrap())
    };
    let status_and_body = |response: axum::response::Response| async move {
        let status = response.status();
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap();
        (status, serde_json::from_slice::<Value>(&bytes).unwrap())
    };
    let (status, body) =
        status_and_body(within("GET", send(Method::GET, true)).await.unwrap()).await;
    assert_eq!((status, body), (StatusCode::OK, json!({ "extra": true })));
    let (status, body) =
        status_and_body(within("no token", send(Method::GET, false)).await.unwrap()).await;
    assert_eq!(
        (status, body),
        (StatusCode::UNAUTHORIZED, json!({ "error": "missing or invalid bearer token" }))
    );
    let (status, body) =
        status_and_body(within("POST", send(Method::POST, true)).await.unwrap()).await;
    assert_eq!(
        (status, body),
        (StatusCode::METHOD_NOT_ALLOWED, json!({ "error": "method not allowed" }))
    );
    // The API's own routes are still there.
    let req = Request::builder()
        .uri("/v1/runs")
        .header(header::AUTHORIZATION, format!("Bearer {TOKEN}"))
        .body(Body::empty())
        .unwrap();
    let (status, body) =
        status_and_body(within("runs", app.clone().oneshot(req)).await.unwrap()).await;
    assert_eq!((status, body), (StatusCode::OK, json!({ "runs": [] })));
}

#[tokio::test]
async fn unknown_runs_are_404() {
    let gw = TestGateway::start(Duration::ZERO);
    let (status, error) = gw.call(Method::GET, "/v1/runs/run_missing", None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(error, json!({ "error": "run run_missing not found" }));
    let (status, _) = gw.call(Method::POST, "/v1/runs/run_missing/cancel", None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) =
        gw.call(Method::POST, "/v1/runs/run_missing/steer", Some(json!({ "text": "hi" }))).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, error) = gw.call(Method::GET, "/v1/runs/run_missing/events", None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(error, json!({ "error": "run run_missing not found" }));
}

#[tokio::test]
async fn list_filters_by_status_and_limit_newest_first() {
    let gw = TestGateway::start(Duration::ZERO);
    for id in ["list-1", "list-2", "list-3"] {
        gw.run_to_completion(id, &format!("prompt of {id}")).await;
    }
    let ids = |body: &Value| -> Vec<String> {
        body["runs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|run| run["run_id"].as_str().unwrap().to_owned())
            .collect()
    };
    let (status, all) = gw.call(Method::GET, "/v1/runs", None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(ids(&all), ["list-3", "list-2", "list-1"]);
    assert_eq!(all["runs"][0]["answer"], json!("prompt of list-3"));

    let (_, two) = gw.call(Method::GET, "/v1/runs?status=completed&limit=2", None).await;
    assert_eq!(ids(&two), ["list-3", "list-2"]);
    let (_, failed) = gw.call(Method::GET, "/v1/runs?status=failed", None).await;
    assert_eq!(ids(&failed), Vec::<String>::new());

    let (status, error) = gw.call(Method::GET, "/v1/runs?status=finished", None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(error_of(&error).contains("invalid status"), "{error}");
    let (status, _) = gw.call(Method::GET, "/v1/runs?limit=lots", None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn cancelling_a_running_run_ends_it_cancelled() {
    let gw = TestGateway::start(SLOW);
    let mut events = gw.bus.subscribe_run(&RunId::parse("slow-1").unwrap());
    let (status, _) = gw
        .call(Method::POST, "/v1/runs", Some(json!({ "prompt": words(500), "run_id": "slow-1" })))
        .await;
    assert_eq!(status, StatusCode::ACCEPTED);
    until_first_delta(&mut events, "slow-1").await;

    let (status, body) = gw.call(Method::POST, "/v1/runs/slow-1/cancel", None).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    assert_eq!(body, json!({ "run_id": "slow-1", "status": "cancelling" }));
    until_completed(&mut events, "slow-1").await;

    let (_, run) = gw.call(Method::GET, "/v1/runs/slow-1", None).await;
    assert_eq!(run["status"], json!("cancelled"));
    assert_eq!(run["error_code"], json!("user_requested"));

    // Cancelling again is fine and reports where the run ended.
    let (status, body) = gw.call(Method::POST, "/v1/runs/slow-1/cancel", None).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    assert_eq!(body, json!({ "run_id": "slow-1", "status": "cancelled" }));
}

#[tokio::test]
async fn steering_echo_is_not_accepted() {
    let gw = TestGateway::start(SLOW);
    let mut events = gw.bus.subscribe_run(&RunId::parse("steer-1").unwrap());
    let (status, _) = gw
        .call(Method::POST, "/v1/runs", Some(json!({ "prompt": words(500), "run_id": "steer-1" })))
        .await;
    assert_eq!(status, StatusCode::ACCEPTED);
    until_first_delta(&mut events, "steer-1").await;

    let (status, body) =
        gw.call(Method::POST, "/v1/runs/steer-1/steer", Some(json!({ "text": "go left" }))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["accepted"], json!(false));
    assert!(body["reason"].as_str().unwrap().contains("does not support"), "{body}");

    let (status, error) =
        gw.call(Method::POST, "/v1/runs/steer-1/steer", Some(json!({ "text": "" }))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{error}");

    gw.call(Method::POST, "/v1/runs/steer-1/cancel", None).await;
    until_completed(&mut events, "steer-1").await;
    let (status, body) =
        gw.call(Method::POST, "/v1/runs/steer-1/steer", Some(json!({ "text": "late" }))).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["accepted"], json!(false));
}

#[tokio::test]
async fn event_stream_replays_a_finished_run_and_ends() {
    let gw = TestGateway::start(Duration::ZERO);
    let prompt = "replay these few words please";
    gw.run_to_completion("replay-1", prompt).await;

    let req = Request::builder()
        .uri("/v1/runs/replay-1/events")
        .header(header::AUTHORIZATION, format!("Bearer {TOKEN}"))
        .body(Body::empty())
        .unwrap();
    let response = within("the events response", gw.router().oneshot(req)).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()[header::CONTENT_TYPE], "text/event-stream");
    let frames = SseReader::from_axum(response.into_body()).collect().await;
    check_complete_run(&frames, "replay-1", prompt);

    // Resuming after an index replays only what follows it.
    let req = Request::builder()
        .uri("/v1/runs/replay-1/events")
        .header(header::AUTHORIZATION, format!("Bearer {TOKEN}"))
        .header("last-event-id", "3")
        .body(Body::empty())
        .unwrap();
    let response = within("the events response", gw.router().oneshot(req)).await.unwrap();
    let rest = SseReader::from_axum(response.into_body()).collect().await;
    assert_eq!(rest, frames[3..]);
}

#[tokio::test]
async fn event_stream_of_a_live_run_joins_stored_and_live_events() {
    let gw = TestGateway::start(SLOW);
    let (addr, _server) = gw.serve().await;
    let prompt = words(40);
    let mut events = gw.bus.subscribe_run(&RunId::parse("live-1").unwrap());
    let (status, _) = gw
        .call(Method::POST, "/v1/runs", Some(json!({ "prompt": prompt, "run_id": "live-1" })))
        .await;
    assert_eq!(status, StatusCode::ACCEPTED);
    // Connect mid-run: some events are stored already, the rest arrive live.
    until_first_delta(&mut events, "live-1").await;

    let response = within(
        "the events response",
        reqwest::Client::new()
            .get(format!("http://{addr}/v1/runs/live-1/events"))
            .bearer_auth(TOKEN)
            .send(),
    )
    .await
    .unwrap();
    assert_eq!(response.status(), reqwest::StatusCode::OK);
    let frames = SseReader::from_reqwest(response).collect().await;
    check_complete_run(&frames, "live-1", &prompt);
    assert_eq!(frames.iter().filter(|f| f.event == "delta").count(), 40);
}

#[tokio::test]
async fn event_stream_that_lags_catches_up_from_the_store() {
    // Run topics hold 4 events, so a reader that waits falls behind.
    let gw = TestGateway::with_bus(SLOW, 2, EventBus::new(4096, 4));
    let prompt = words(30);
    let mut all = gw.bus.subscribe_all();
    let (status, _) = gw
        .call(Method::POST, "/v1/runs", Some(json!({ "prompt": prompt, "run_id": "lag-1" })))
        .await;
    assert_eq!(status, StatusCode::ACCEPTED);
    until_first_delta(&mut all, "lag-1").await;

    let req = Request::builder()
        .uri("/v1/runs/lag-1/events")
        .header(header::AUTHORIZATION, format!("Bearer {TOKEN}"))
        .body(Body::empty())
        .unwrap();
    let response = within("the events response", gw.router().oneshot(req)).await.unwrap();
    // The stream is subscribed but not read until the run is over.
    until_completed(&mut all, "lag-1").await;
    let frames = SseReader::from_axum(response.into_body()).collect().await;
    check_complete_run(&frames, "lag-1", &prompt);
}

/// The documented default of `run_idle_watchdog_ms`: a run with no event for
/// two hours is cancelled with `run_idle_watchdog_timeout`.
#[tokio::test(start_paused = true)]
async fn a_run_silent_for_two_hours_is_cancelled_by_the_idle_watchdog() {
    // Three hours between words, and the engine's own inactivity timeout
    // further still: only the watchdog ends the run.
    let config = RuntimeConfig {
        run_inactivity_timeout: Duration::from_secs(10 * 60 * 60),
        ..RuntimeConfig::default()
    };
    let gw =
        TestGateway::with_config(Duration::from_secs(3 * 60 * 60), config, EventBus::default());
    let mut events = gw.bus.subscribe_run(&RunId::parse("silent-1").unwrap());
    let (status, body) = gw
        .call(Method::POST, "/v1/runs", Some(json!({ "prompt": "one two", "run_id": "silent-1" })))
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    until_event(&mut events, "silent-1", |kind| matches!(kind, EventKind::RunStarted { .. })).await;
    let started = Instant::now();
    // Not `until_completed`: its patience is shorter than the wait.
    let completed =
        lemon_core::testing::within_for(Duration::from_secs(3 * 60 * 60), "the watchdog", async {
            loop {
                match events.recv().await {
                    Ok(event) if matches!(event.kind, EventKind::RunCompleted { .. }) => {
                        return event
                    }
                    Ok(_) | Err(RecvError::Lagged(_)) => {}
                    Err(RecvError::Closed) => panic!("the run's topic closed before it completed"),
                }
            }
        })
        .await;
    let silent = started.elapsed();
    let EventKind::RunCompleted { completion, .. } = &completed.kind else { unreachable!() };
    let code = completion.error.as_ref().map(|error| error.code().to_owned());
    assert_eq!(code.as_deref(), Some("run_idle_watchdog_timeout"), "{completion:?}");
    assert!(silent >= Duration::from_secs(2 * 60 * 60), "cancelled after {silent:?}");
    assert!(silent < Duration::from_secs(2 * 60 * 60 + 1), "cancelled after {silent:?}");
}

#[tokio::test(start_paused = true)]
async fn quiet_event_stream_rereads_the_store() {
    // Events that reach the store without passing the run's topic (published
    // before the stream subscribed, stored after its first read) still arrive
    // once the run's row says it has finished.
    let gw = TestGateway::start(Duration::ZERO);
    let store = &gw.store;
    let run_id = RunId::parse("quiet-1").unwrap();
    store
        .insert_run(NewRun {
            run_id: run_id.clone(),
            session_key: "default".into(),
            conversation: "session:default".to_owned(),
            engine: "echo".to_owned(),
            prompt: "hi".to_owned(),
            meta: json!({}),
            resumed_from: None,
            created_at_ms: 1,
        })
        .await;
    let event = |index: u64, kind: EventKind| {
        Arc::new(BusEvent {
            run_id: run_id.clone(),
            session_key: "default".into(),
            index,
            ts_ms: 1,
            kind,
        })
    };
    store
        .append_event(event(1, EventKind::RunStarted { engine: "echo".to_owned(), model: None }))
        .await;

    let req = Request::builder()
        .uri("/v1/runs/quiet-1/events")
        .header(header::AUTHORIZATION, format!("Bearer {TOKEN}"))
        .body(Body::empty())
        .unwrap();
    let response = within("the events response", gw.router().oneshot(req)).await.unwrap();
    let completed = EventKind::RunCompleted {
        completion: Completion::success("hi", None),
        engine: "echo".to_owned(),
        duration_ms: 1,
    };
    store.append_event(event(2, completed)).await;
    let finished = FinishedRun {
        run_id: run_id.clone(),
        engine: "echo".to_owned(),
        completion: Completion::success("hi", None),
        completed_at_ms: 2,
        duration_ms: 1,
        spend: Default::default(),
    };
    store.finalize_run(finished).await;

    let frames = SseReader::from_axum(response.into_body()).collect().await;
    let seen: Vec<(&str, Option<u64>)> = frames.iter().map(|f| (f.event.as_str(), f.id)).collect();
    assert_eq!(seen, [("run_started", Some(1)), ("run_completed", Some(2))]);
}

#[tokio::test]
async fn firehose_reports_lag_and_carries_on() {
    // The firehose holds 4 events; run topics are large.
    let gw = TestGateway::with_bus(Duration::ZERO, 2, EventBus::new(4, 1024));
    let req = Request::builder()
        .uri("/v1/events")
        .header(header::AUTHORIZATION, format!("Bearer {TOKEN}"))
        .body(Body::empty())
        .unwrap();
    let response = within("the firehose response", gw.router().oneshot(req)).await.unwrap();
    gw.run_to_completion("flood-1", &words(20)).await;

    let mut reader = SseReader::from_axum(response.into_body());
    let first = reader.next().await.unwrap();
    assert_eq!(first.event, "lagged");
    assert!(first.data["skipped"].as_u64().unwrap() > 0, "{first:?}");
    assert_eq!(first.id, None);
    let mut last = reader.next().await.unwrap();
    while last.event != "run_completed" {
        last = reader.next().await.unwrap();
    }
    assert_eq!(last.data["run_id"], json!("flood-1"));
}

#[tokio::test]
async fn firehose_carries_events_of_every_run() {
    let gw = TestGateway::start(Duration::ZERO);
    let (addr, _server) = gw.serve().await;
    let response = within(
        "the firehose response",
        reqwest::Client::new().get(format!("http://{addr}/v1/events")).bearer_auth(TOKEN).send(),
    )
    .await
    .unwrap();
    assert_eq!(response.status(), reqwest::StatusCode::OK);
    // The firehose subscribed before answering, so both runs are seen whole.
    for (id, session) in [("fire-a", "s-a"), ("fire-b", "s-b")] {
        let body =
            json!({ "prompt": format!("hello from {id}"), "run_id": id, "session_key": session });
        let (status, _) = gw.call(Method::POST, "/v1/runs", Some(body)).await;
        assert_eq!(status, StatusCode::ACCEPTED);
    }
    let mut reader = SseReader::from_reqwest(response);
    let mut seen: std::collections::BTreeMap<String, Vec<SseFrame>> = Default::default();
    while seen
        .values()
        .filter(|frames| frames.last().is_some_and(|f| f.event == "run_completed"))
        .count()
        < 2
    {
        let frame = reader.next().await.expect("the firehose does not end by itself");
        // Router phases are hints for UIs, outside the runs' own event numbering.
        if frame.event == "run_phase" {
            continue;
        }
        seen.entry(frame.data["run_id"].as_str().unwrap().to_owned()).or_default().push(frame);
    }
    assert_eq!(seen.keys().collect::<Vec<_>>(), ["fire-a", "fire-b"]);
    for (id, frames) in &seen {
        let indices: Vec<u64> = frames.iter().map(|f| f.data["index"].as_u64().unwrap()).collect();
        assert_eq!(indices, (1..=frames.len() as u64).collect::<Vec<_>>(), "{id}");
        assert_eq!(frames[0].event, "run_started");
        assert_eq!(frames.last().unwrap().data["answer"], json!(format!("hello from {id}")));
    }
}

#[tokio::test]
async fn shutdown_ends_open_event_streams_and_the_server() {
    let gw = TestGateway::start(SLOW);
    let (addr, server) = gw.serve().await;
    let client = reqwest::Client::new();
    let mut events = gw.bus.subscribe_run(&RunId::parse("held-1").unwrap());
    let (status, _) = gw
        .call(Method::POST, "/v1/runs", Some(json!({ "prompt": words(1000), "run_id": "held-1" })))
        .await;
    assert_eq!(status, StatusCode::ACCEPTED);
    until_first_delta(&mut events, "held-1").await;

    let firehose = within(
        "firehose",
        client.get(format!("http://{addr}/v1/events")).bearer_auth(TOKEN).send(),
    )
    .await
    .unwrap();
    let run_stream = within(
        "run events",
        client.get(format!("http://{addr}/v1/runs/held-1/events")).bearer_auth(TOKEN).send(),
    )
    .await
    .unwrap();
    let mut run_reader = SseReader::from_reqwest(run_stream);
    assert_eq!(run_reader.next().await.unwrap().event, "run_started");

    gw.state.shutdown.cancel();
    let mut firehose_reader = SseReader::from_reqwest(firehose);
    while firehose_reader.next().await.is_some() {}
    while run_reader.next().await.is_some() {}
    within("the server to stop", server).await.unwrap().unwrap();
}

#[tokio::test]
async fn status_reports_scheduler_and_engines() {
    let gw = TestGateway::with_max(Duration::ZERO, 3);
    let (status, body) = gw.call(Method::GET, "/v1/status", None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["version"], json!("1.2.3-test"));
    assert!(body["uptime_ms"].is_u64(), "{body}");
    assert_eq!(
        body["scheduler"],
        json!({ "in_flight": 0, "waitq": 0, "max": 3, "conversations": 0, "queued": 0 })
    );
    assert_eq!(
        body["engines"],
        json!([{ "id": "echo", "available": true, "steer": false, "redirect": false }])
    );
    assert_eq!(body["default_engine"], json!("echo"));
    assert_eq!(body["transports"], json!({}));
}

/// MCP servers as the native engine's client would report them.
#[derive(Debug)]
pub(super) struct FakeMcp(pub(super) Vec<lemon_core::mcp::McpServerStatus>);

impl lemon_core::mcp::McpStatusSource for FakeMcp {
    fn servers(&self) -> Vec<lemon_core::mcp::McpServerStatus> {
        self.0.clone()
    }
}

#[tokio::test]
async fn status_lists_the_mcp_servers_by_name() {
    use lemon_core::mcp::{McpServerState, McpServerStatus, McpTransportKind};
    let mut gw = TestGateway::start(Duration::ZERO);
    let (_, body) = gw.call(Method::GET, "/v1/status", None).await;
    assert_eq!(body["mcp_servers"], json!([]), "no MCP client: {body}");

    let github = McpServerStatus {
        name: "github".into(),
        transport: McpTransportKind::Http,
        state: McpServerState::Running,
        tools: vec!["github__get_issue".into(), "github__search".into()],
        error: None,
        calls: [("ok".to_owned(), 4), ("timeout".to_owned(), 1)].into(),
        starts: 1,
    };
    let fs = McpServerStatus {
        name: "fs".into(),
        transport: McpTransportKind::Stdio,
        state: McpServerState::Failed,
        tools: Vec::new(),
        error: Some("MCP server fs could not be started: npx is not on the PATH".into()),
        calls: Default::default(),
        starts: 3,
    };
    gw.state.mcp = Some(Arc::new(FakeMcp(vec![github, fs])));
    let (status, body) = gw.call(Method::GET, "/v1/status", None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        body["mcp_servers"],
        json!([
            {
                "name": "fs", "transport": "stdio", "state": "failed", "tools": [],
                "error": "MCP server fs could not be started: npx is not on the PATH",
                "calls": {}, "starts": 3,
            },
            {
                "name": "github", "transport": "http", "state": "running",
                "tools": ["github__get_issue", "github__search"], "error": null,
                "calls": { "ok": 4, "timeout": 1 }, "starts": 1,
            },
        ])
    );
}

#[tokio::test]
async fn status_reports_every_transport_state() {
    let gw = TestGateway::start(Duration::ZERO);
    let transports = &gw.state.transports;
    transports.set("webhook", TransportState::Running { detail: Some("127.0.0.1:4046".into()) });
    transports.set(
        "telegram",
        TransportState::Failing {
            reason: "getMe: 401".into(),
            attempts: 2,
            retry_in_ms: Some(2000),
        },
    );
    transports.set("sms", TransportState::Disabled);
    let (status, body) = gw.call(Method::GET, "/v1/status", None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        body["transports"],
        json!({
            "webhook": { "state": "running", "detail": "127.0.0.1:4046" },
            "telegram": { "state": "failing", "reason": "getMe: 401", "attempts": 2, "retry_in_ms": 2000 },
            "sms": { "state": "disabled" },
        })
    );
}

#[tokio::test]
async fn shut_down_gateway_answers_503() {
    let gw = TestGateway::start(Duration::ZERO);
    gw.token.cancel();
    gw.tracker.close();
    within("the gateway to stop", gw.tracker.wait()).await;
    let (status, error) =
        gw.call(Method::POST, "/v1/runs", Some(json!({ "prompt": "too late" }))).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{error}");
    assert_eq!(error, json!({ "error": "the gateway is shutting down" }));
    let (status, _) = gw.call(Method::GET, "/v1/status", None).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
}

#[test]
fn token_comparison_checks_every_byte() {
    assert!(super::constant_time_eq(b"abc", b"abc"));
    assert!(!super::constant_time_eq(b"abc", b"abd"));
    assert!(!super::constant_time_eq(b"abc", b"abcd"));
    assert!(!super::constant_time_eq(b"", b"a"));
}

#[tokio::test]
async fn debug_output_hides_the_token() {
    let gw = TestGateway::start(Duration::ZERO);
    let debug = format!("{:?}", gw.state);
    assert!(!debug.contains(TOKEN), "{debug}");
}

/// Submits `prompt` on `session` with a chosen id and more fields; asserts `202`.
async fn submit_as(gw: &TestGateway, run_id: &str, session: &str, prompt: &str, extra: Value) {
    let mut body = json!({ "prompt": prompt, "session_key": session, "run_id": run_id });
    if let (Some(body), Some(extra)) = (body.as_object_mut(), extra.as_object()) {
        body.extend(extra.clone());
    }
    let (status, answer) = gw.call(Method::POST, "/v1/runs", Some(body)).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{answer}");
}

#[tokio::test]
async fn a_session_shows_its_active_run_queue_and_chat_state() {
    let gw = TestGateway::start(SLOW);
    let mut all = gw.bus.subscribe_all();
    submit_as(&gw, "sess-1", "s", &words(200), json!({})).await;
    submit_as(&gw, "sess-2", "s", "queued one", json!({})).await;
    let (_, queued) = gw.call(Method::GET, "/v1/runs/sess-2", None).await;
    assert_eq!(queued["status"], json!("queued"), "{queued}");
    let (status, session) = gw.call(Method::GET, "/v1/sessions/s", None).await;
    assert_eq!(status, StatusCode::OK, "{session}");
    assert_eq!(session["active_run"], json!("sess-1"));
    assert_eq!(session["queue"], json!(["sess-2"]));
    assert_eq!(session["queue_length"], json!(1));

    // Cancelling the session stops its run; the queue runs next and keeps the session.
    let (status, summary) = gw.call(Method::POST, "/v1/sessions/s/cancel", None).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{summary}");
    assert_eq!(summary, json!({ "session_key": "s", "dropped": 0, "cancelled": 1 }));
    until_completed(&mut all, "sess-1").await;
    until_completed(&mut all, "sess-2").await;
    let (_, run) = gw.call(Method::GET, "/v1/runs/sess-2", None).await;
    assert_eq!(run["status"], json!("completed"), "{run}");
    assert_eq!(run["resume"], json!({ "engine": "echo", "value": "sess-1" }), "continued: {run}");
    // The router writes chat state as it handles the end; poll the session for it.
    // The queued run continued the cancelled run's session, which stays the session's.
    let session = within("chat state", async {
        loop {
            let (_, session) = gw.call(Method::GET, "/v1/sessions/s", None).await;
            if session["chat_state"]["resume_token"] == json!("sess-1") {
                return session;
            }
            tokio::task::yield_now().await;
        }
    })
    .await;
    assert_eq!(session["chat_state"]["engine"], json!("echo"));
}

#[tokio::test]
async fn a_session_key_with_control_characters_is_400_naming_the_field() {
    let gw = TestGateway::start(Duration::ZERO);
    let (status, error) = gw
        .call(Method::POST, "/v1/runs", Some(json!({ "prompt": "hi", "session_key": "a\nforged" })))
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{error}");
    assert!(error_of(&error).contains("invalid session_key"), "{error}");
    assert!(!error.to_string().contains("forged"), "the key is not repeated: {error}");
    for (method, path) in [
        (Method::GET, "/v1/sessions/a%0Ab"),
        (Method::POST, "/v1/sessions/a%0Ab/cancel"),
        (Method::POST, "/v1/sessions/a%09b/abort"),
    ] {
        let (status, error) = gw.call(method, path, None).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path}: {error}");
        assert!(error_of(&error).contains("invalid session_key"), "{path}: {error}");
    }
    // Nothing was accepted.
    let (_, list) = gw.call(Method::GET, "/v1/runs", None).await;
    assert_eq!(list, json!({ "runs": [] }));
}

#[tokio::test]
async fn aborting_a_session_drops_its_queue() {
    let gw = TestGateway::start(SLOW);
    let topic = |id: &str| gw.bus.subscribe_run(&RunId::parse(id).unwrap());
    let mut topics = [("ab-1", topic("ab-1")), ("ab-2", topic("ab-2"))];
    submit_as(&gw, "ab-1", "s", &words(200), json!({})).await;
    submit_as(&gw, "ab-2", "s", "never runs", json!({})).await;
    let (status, summary) = gw.call(Method::POST, "/v1/sessions/s/abort", None).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{summary}");
    assert_eq!(summary, json!({ "session_key": "s", "dropped": 1, "cancelled": 1 }));
    for (run_id, events) in &mut topics {
        let done = until_completed(events, run_id).await;
        assert_eq!(done.to_json()["error_code"], json!("user_requested"), "{run_id}");
    }
    let (_, run) = gw.call(Method::GET, "/v1/runs/ab-2", None).await;
    assert_eq!(run["status"], json!("cancelled"), "{run}");
}

#[tokio::test]
async fn a_run_queued_in_its_session_can_be_cancelled_before_it_starts() {
    let gw = TestGateway::start(SLOW);
    let mut all = gw.bus.subscribe_all();
    submit_as(&gw, "qc-1", "s", &words(200), json!({})).await;
    submit_as(&gw, "qc-2", "s", "cancel me", json!({})).await;
    let (status, body) = gw.call(Method::POST, "/v1/runs/qc-2/cancel", None).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    assert_eq!(body["status"], json!("cancelling"));
    until_completed(&mut all, "qc-2").await;
    let (_, run) = gw.call(Method::GET, "/v1/runs/qc-2", None).await;
    assert_eq!(run["status"], json!("cancelled"), "{run}");
    assert_eq!(run["started_at_ms"], Value::Null, "it never started");
    gw.call(Method::POST, "/v1/runs/qc-1/cancel", None).await;
    until_completed(&mut all, "qc-1").await;
}

#[tokio::test]
async fn interrupt_mode_over_the_api_cancels_the_live_run() {
    let gw = TestGateway::start(SLOW);
    let mut all = gw.bus.subscribe_all();
    submit_as(&gw, "int-1", "s", &words(200), json!({})).await;
    until_first_delta(&mut all, "int-1").await;
    submit_as(&gw, "int-2", "s", "right now", json!({ "queue_mode": "interrupt" })).await;
    let done = until_completed(&mut all, "int-1").await;
    assert_eq!(done.to_json()["error_code"], json!("interrupted"));
    let done = until_completed(&mut all, "int-2").await;
    assert_eq!(done.to_json()["answer"], json!("right now"));
}

#[tokio::test]
async fn slash_commands_and_resume_lines_go_through_the_router() {
    let gw = TestGateway::start(Duration::ZERO);
    let (status, body) = gw
        .call(Method::POST, "/v1/runs", Some(json!({ "prompt": "/status", "session_key": "s" })))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["command"], json!("status"));
    assert!(body["reply"].as_str().unwrap().contains("idle"), "{body}");

    let body = json!({ "prompt": "echo resume prior-1\nhello again", "session_key": "s" });
    let (status, accepted) = gw.call(Method::POST, "/v1/runs?wait=true", Some(body)).await;
    assert_eq!(status, StatusCode::OK, "{accepted}");
    assert_eq!(accepted["prompt"], json!("hello again"), "the resume line is taken out");
    assert_eq!(accepted["meta"]["resume_source"], json!("explicit"));

    let body = json!({ "prompt": "hi", "queue_mode": "sideways" });
    let (status, error) = gw.call(Method::POST, "/v1/runs", Some(body)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{error}");
    assert!(error_of(&error).contains("queue_mode"), "{error}");
}

#[tokio::test]
async fn a_run_shows_the_session_it_resumed() {
    let gw = TestGateway::start(Duration::ZERO);
    let body = json!({ "prompt": "first", "session_key": "s-from", "run_id": "from-1" });
    let (status, first) = gw.call(Method::POST, "/v1/runs?wait=true", Some(body)).await;
    assert_eq!(status, StatusCode::OK, "{first}");
    assert_eq!(first["resumed_from"], Value::Null, "a new session continues nothing");

    let body = json!({
        "prompt": "second",
        "session_key": "s-other",
        "run_id": "from-2",
        "resume": { "engine": "echo", "value": "from-1" },
    });
    let (status, second) = gw.call(Method::POST, "/v1/runs?wait=true", Some(body)).await;
    assert_eq!(status, StatusCode::OK, "{second}");
    let (status, run) = gw.call(Method::GET, "/v1/runs/from-2", None).await;
    assert_eq!(status, StatusCode::OK, "{run}");
    assert_eq!(run["resumed_from"], json!({ "engine": "echo", "value": "from-1" }));
    let (_, first) = gw.call(Method::GET, "/v1/runs/from-1", None).await;
    assert_eq!(first.get("resumed_from"), Some(&Value::Null), "shown as null: {first}");
}

#[test]
fn bearer_tokens_are_compared_after_the_same_trimming() {
    let headers = |value: &str| {
        let mut headers = HeaderMap::new();
        headers.insert(header::AUTHORIZATION, value.parse().unwrap());
        headers
    };
    let expected = "  expected-token-0123 \n";
    let check = |value: &str, matches: bool| {
        assert_eq!(super::bearer_matches(&headers(value), expected), matches, "{value:?}");
    };
    check("Bearer expected-token-0123", true);
    check("bearer   expected-token-0123  ", true);
    check("BEARER expected-token-0123", true);
    check("Bearer expected-token-012", false);
    check("Bearer expected-token-01234", false);
    check("Basic expected-token-0123", false);
    check("expected-token-0123", false);
    assert!(!super::bearer_matches(&HeaderMap::new(), expected));
    // A blank expected token lets nothing through, not even a blank bearer.
    assert!(!super::bearer_matches(&headers("Bearer "), "  "));
}

#[tokio::test]
async fn meta_switches_still_act_on_the_run() {
    let gw = TestGateway::start(Duration::ZERO);
    let first = gw.run_to_completion("first", "hello").await;
    assert!(first.to_json()["ok"].as_bool().unwrap(), "{:?}", first.to_json());
    let continued = gw.run_to_completion("continued", "again").await;
    assert!(continued.to_json()["ok"].as_bool().unwrap());
    let (_, run) = gw.call(Method::GET, "/v1/runs/continued", None).await;
    assert_eq!(run["meta"]["resume_source"], json!("auto"), "{run}");

    let mut events = gw.bus.subscribe_run(&RunId::parse("fresh").unwrap());
    let body = json!({"prompt": "anew", "run_id": "fresh", "meta": {"disable_auto_resume": true}});
    let (status, answer) = gw.call(Method::POST, "/v1/runs", Some(body)).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{answer}");
    until_completed(&mut events, "fresh").await;
    let (_, run) = gw.call(Method::GET, "/v1/runs/fresh", None).await;
    assert_eq!(run["meta"], json!({"disable_auto_resume": true, "origin": "control_plane"}));
    assert_eq!(run["resume"], json!({"engine": "echo", "value": "fresh"}), "a new session");

    let body = json!({"prompt": "hi", "meta": {"model": "--yolo"}});
    let (status, answer) = gw.call(Method::POST, "/v1/runs", Some(body)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
    assert!(error_of(&answer).starts_with("meta.model"), "{answer}");
}

#[tokio::test]
async fn cron_jobs_are_created_listed_changed_run_and_removed() {
    let gw = TestGateway::start(Duration::ZERO);
    let (status, job) = gw
        .call(
            Method::POST,
            "/v1/cron",
            Some(json!({"name": "digest", "schedule": "weekdays at 09:30", "prompt": "hello cron",
                        "session_key": "agent:ops:main", "timezone": "Europe/Berlin", "maxRetries": 1})),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{job}");
    let id = job["id"].as_str().unwrap().to_owned();
    assert_eq!(job["schedule"], "30 9 * * 1-5");
    assert_eq!(job["sessionKey"], "agent:ops:main");
    assert_eq!(job["agentId"], "ops");
    assert_eq!(job["maxRetries"], 1);
    assert!(job["nextRunAtMs"].is_i64());

    let (status, list) = gw.call(Method::GET, "/v1/cron", None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(list["jobs"][0]["id"], id.as_str());

    let (status, changed) =
        gw.call(Method::PATCH, &format!("/v1/cron/{id}"), Some(json!({"enabled": false}))).await;
    assert_eq!(status, StatusCode::OK, "{changed}");
    assert_eq!(
        (changed["enabled"].clone(), changed["nextRunAtMs"].clone()),
        (json!(false), Value::Null)
    );

    let mut updates = gw.state.cron.subscribe_runs();
    let (status, run) = gw.call(Method::POST, &format!("/v1/cron/{id}/run"), None).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{run}");
    assert_eq!(run["jobId"], id.as_str());
    assert_eq!(run["trigger"], "manual");
    let ended = within("the cron run ends", async {
        loop {
            let run = updates.recv().await.unwrap();
            if !run.status.is_active() {
                return run;
            }
        }
    })
    .await;
    assert_eq!(ended.output.as_deref(), Some("hello cron"));
    let (status, runs) = gw.call(Method::GET, &format!("/v1/cron/{id}/runs?limit=5"), None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(runs["jobId"], id.as_str());
    assert_eq!(runs["runs"][0]["status"], "succeeded");
    assert_eq!(runs["runs"][0]["output"], "hello cron");
    let router_run = runs["runs"][0]["routerRunId"].as_str().unwrap();
    let (status, routed) = gw.call(Method::GET, &format!("/v1/runs/{router_run}"), None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(routed["session_key"], "agent:ops:main");

    let (status, removed) = gw.call(Method::DELETE, &format!("/v1/cron/{id}"), None).await;
    assert_eq!((status, removed), (StatusCode::OK, json!({"removed": true, "id": id})));
    let (status, body) = gw.call(Method::DELETE, &format!("/v1/cron/{id}"), None).await;
    assert_eq!(
        (status, body),
        (StatusCode::NOT_FOUND, json!({"error": format!("cron job not found: {id}")}))
    );
}

#[tokio::test]
async fn bad_cron_input_is_a_json_4xx() {
    let gw = TestGateway::start(Duration::ZERO);
    let check = |status: StatusCode, body: Value, expected_status: StatusCode, expected: &str| {
        assert_eq!(status, expected_status, "{body}");
        assert_eq!(body, json!({ "error": expected }));
    };
    let (s, b) = gw.call(Method::POST, "/v1/cron", Some(json!({"prompt": "p"}))).await;
    check(s, b, StatusCode::BAD_REQUEST, "schedule is required");
    let (s, b) = gw.call(Method::POST, "/v1/cron", Some(json!({"schedule": "@daily"}))).await;
    check(s, b, StatusCode::BAD_REQUEST, "prompt is required");
    let (s, b) = gw
        .call(Method::POST, "/v1/cron", Some(json!({"schedule": "every 0m", "prompt": "p"})))
        .await;
    check(
        s,
        b,
        StatusCode::BAD_REQUEST,
        "invalid schedule \"every 0m\": `every 0m`: minutes must be 1 to 59 (use hours for longer)",
    );
    let body = json!({"schedule": "@daily", "prompt": "p", "sessionKey": "a\nb"});
    let (s, b) = gw.call(Method::POST, "/v1/cron", Some(body)).await;
    check(s, b, StatusCode::BAD_REQUEST, "sessionKey must be a valid Lemon session key");
    let (s, b) = gw.call(Method::POST, "/v1/cron", Some(json!(["x"]))).await;
    check(s, b, StatusCode::BAD_REQUEST, "body must be a JSON object");
    let body = json!({"schedule": "@daily", "prompt": "p", "timeoutMs": "soon"});
    let (s, b) = gw.call(Method::POST, "/v1/cron", Some(body)).await;
    check(s, b, StatusCode::BAD_REQUEST, "timeoutMs must be a non-negative integer");
    let (s, b) = gw
        .call(
            Method::POST,
            "/v1/cron",
            Some(json!({"name": "n", "schedule": "@daily", "prompt": "p"})),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    let id = b["id"].as_str().unwrap();
    let (s, b) = gw
        .call(
            Method::POST,
            "/v1/cron",
            Some(json!({"name": "n", "schedule": "@daily", "prompt": "p"})),
        )
        .await;
    check(s, b, StatusCode::CONFLICT, "a cron job named \"n\" already exists");
    let (s, b) = gw.call(Method::PATCH, &format!("/v1/cron/{id}"), Some(json!({}))).await;
    check(s, b, StatusCode::BAD_REQUEST, "no job fields to change in the body");
    let (s, b) = gw
        .call(Method::PATCH, &format!("/v1/cron/{id}"), Some(json!({"timezone": "Nope/Nope"})))
        .await;
    check(
        s,
        b,
        StatusCode::BAD_REQUEST,
        "timezone: unknown time zone `Nope/Nope` (use an IANA name such as Europe/Berlin or UTC)",
    );
    let (s, b) = gw.call(Method::PATCH, "/v1/cron/cron_x", Some(json!({"enabled": true}))).await;
    check(s, b, StatusCode::NOT_FOUND, "cron job not found: cron_x");
    let (s, b) = gw.call(Method::POST, "/v1/cron/cron_x/run", None).await;
    check(s, b, StatusCode::NOT_FOUND, "cron job not found: cron_x");
    let (s, b) = gw.call(Method::GET, "/v1/cron/cron_x/runs", None).await;
    check(s, b, StatusCode::NOT_FOUND, "cron job not found: cron_x");
    let (s, b) = gw.call(Method::GET, &format!("/v1/cron/{id}/runs?limit=many"), None).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{b}");
    let unauthorized =
        Request::builder().method(Method::GET).uri("/v1/cron").body(Body::empty()).unwrap();
    let (s, _, _) = gw.send(unauthorized).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
}

/// `config.toml` in memory, checked with core's loader like a start would.
#[derive(Debug, Default)]
pub(super) struct MemoryConfig {
    text: std::sync::Mutex<Option<String>>,
}

impl super::ConfigEditor for MemoryConfig {
    fn read(&self) -> std::io::Result<super::ConfigFileText> {
        let text = self.text.lock().unwrap().clone();
        Ok(super::ConfigFileText { path: "/home/me/.lemon/config.toml".into(), text })
    }

    fn save(&self, text: &str) -> Result<Vec<String>, super::ConfigSaveError> {
        let path = std::path::Path::new("/home/me/.lemon/config.toml");
        let loaded =
            lemon_core::config::load_str(text, path).map_err(super::ConfigSaveError::Invalid)?;
        *self.text.lock().unwrap() = Some(text.to_owned());
        Ok(loaded.warnings)
    }
}

#[tokio::test]
async fn the_config_file_is_read_and_saved_whole_and_a_bad_one_is_placed() {
    let mut gw = TestGateway::start(Duration::ZERO);
    let (s, b) = gw.call(Method::GET, "/v1/config/file", None).await;
    assert_eq!(s, StatusCode::NOT_FOUND, "no editor: {b}");
    assert_eq!(error_of(&b), "this gateway has no config file to edit");
    let (s, _) = gw.call(Method::PUT, "/v1/config", Some(json!({ "text": "" }))).await;
    assert_eq!(s, StatusCode::NOT_FOUND);

    let editor = Arc::new(MemoryConfig::default());
    gw.state.config_file = Some(editor.clone());
    let (s, b) = gw.call(Method::GET, "/v1/config/file", None).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(b, json!({ "path": "/home/me/.lemon/config.toml", "exists": false, "text": "" }));

    let good = "# my gateway\n[gateway]\n# two at a time\nmax_concurrent_runs = 2\n";
    let (s, b) = gw.call(Method::PUT, "/v1/config", Some(json!({ "text": good }))).await;
    assert_eq!(s, StatusCode::OK, "{b}");
    assert_eq!(b, json!({ "saved": true, "path": "/home/me/.lemon/config.toml", "warnings": [] }));
    let (_, b) = gw.call(Method::GET, "/v1/config/file", None).await;
    assert_eq!(b["text"], good, "saved as sent, comments and all");
    assert_eq!(b["exists"], true);

    let warned = "[gateway]\nmax_concurent_runs = 2\n";
    let (s, b) = gw.call(Method::PUT, "/v1/config", Some(json!({ "text": warned }))).await;
    assert_eq!(s, StatusCode::OK, "{b}");
    let warnings = b["warnings"].as_array().unwrap();
    assert!(warnings[0].as_str().unwrap().contains("max_concurrent_runs"), "{b}");

    let bad = "[gateway]\n# comment\nmax_concurrent_runs = \"many\"\n";
    let (s, b) = gw.call(Method::PUT, "/v1/config", Some(json!({ "text": bad }))).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{b}");
    assert_eq!((b["line"].as_u64(), b["column"].as_u64()), (Some(3), Some(23)), "{b}");
    assert!(error_of(&b).starts_with("/home/me/.lemon/config.toml:3:23: "), "{b}");
    let broken = "[gateway\n";
    let (s, b) = gw.call(Method::PUT, "/v1/config", Some(json!({ "text": broken }))).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{b}");
    assert_eq!(b["line"], 1, "{b}");
    assert!(error_of(&b).contains("invalid TOML"), "{b}");
    let (_, b) = gw.call(Method::GET, "/v1/config/file", None).await;
    assert_eq!(b["text"], warned, "a refused text changes nothing");

    let (s, b) = gw.call(Method::PUT, "/v1/config", Some(json!({}))).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert_eq!(error_of(&b), "text is required: the whole config.toml");
    let unauthorized = Request::builder()
        .method(Method::PUT)
        .uri("/v1/config")
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(json!({ "text": good }).to_string()))
        .unwrap();
    let (s, _, _) = gw.send(unauthorized).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    assert_eq!(super::ConfigEditor::read(&*editor).unwrap().text.as_deref(), Some(warned));
}

#[tokio::test]
async fn the_dashboard_is_public_and_the_api_beside_it_is_not() {
    let gw = TestGateway::start(Duration::ZERO);
    let raw = |uri: &'static str| {
        let req = Request::builder().uri(uri).body(Body::empty()).unwrap();
        within(uri, gw.router().oneshot(req))
    };
    for uri in ["/", "/ui/app.js", "/ui/app.css"] {
        let response = raw(uri).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK, "{uri}");
        let policy = response.headers()[header::CONTENT_SECURITY_POLICY].to_str().unwrap();
        assert!(policy.starts_with("default-src 'self'"), "{policy}");
    }
    for uri in ["/v1/status", "/v1/config/file", "/nope", "/ui"] {
        let response = raw(uri).await.unwrap();
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED, "{uri}");
    }
}

/// A gateway whose API takes files by `files`, and a project directory runs
/// work in.
fn with_files(files: FilesConfig) -> (TestGateway, tempfile::TempDir) {
    let gw = TestGateway::with_files(
        Duration::ZERO,
        RuntimeConfig::default(),
        EventBus::default(),
        files,
    );
    (gw, tempfile::tempdir().unwrap())
}

fn base64_of(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// How many files wait in the stage.
fn staged_files(gw: &TestGateway) -> usize {
    std::fs::read_dir(gw.media.path().join("stage")).map_or(0, Iterator::count)
}

const PDF: &[u8] = b"%PDF-1.7\n1 0 obj <<>> endobj\n%%EOF\n";

#[tokio::test]
async fn attachments_are_saved_in_the_runs_directory_and_named_in_its_prompt() {
    let (gw, project) = with_files(FilesConfig::default());
    let body = json!({
        "prompt": "summarise the report",
        "cwd": project.path(),
        "attachments": [
            { "name": "report.pdf", "mime": "application/pdf", "data": base64_of(PDF) },
        ],
        // Only the gateway lists files: a caller's own entry is dropped.
        "meta": { "attachments": [{ "kind": "file", "path": "/etc/passwd", "name": "passwd",
                                    "mime": "text/plain", "bytes": 1 }] },
    });
    let (status, run) = gw.call(Method::POST, "/v1/runs?wait=true", Some(body)).await;
    assert_eq!(status, StatusCode::OK, "{run}");
    let saved = project.path().join(".lemon/uploads/report.pdf");
    assert_eq!(std::fs::read(&saved).unwrap(), PDF);
    let answer = run["answer"].as_str().unwrap();
    assert!(
        answer.starts_with("summarise the report\n\n[Files sent with this message"),
        "{answer}"
    );
    assert!(answer.contains(".lemon/uploads/report.pdf (file, application/pdf,"), "{answer}");
    assert!(!answer.contains("passwd"), "{answer}");
    let listed = run["meta"]["attachments"].as_array().unwrap();
    assert_eq!(listed.len(), 1, "{run}");
    assert_eq!(listed[0]["name"], "report.pdf");
    assert_eq!(staged_files(&gw), 0, "the stage is empty once the run has its file");
}

#[tokio::test]
async fn refused_attachments_are_4xx_naming_the_file_and_nothing_runs() {
    let files = FilesConfig { max_download_bytes: 16, ..FilesConfig::default() };
    let (gw, project) = with_files(files);
    let good = json!({ "name": "ok.txt", "data": base64_of(b"fine") });
    let cases = [
        (
            json!({ "name": "../../.bashrc", "data": base64_of(b"echo pwned") }),
            StatusCode::BAD_REQUEST,
            "attachments[1] (../../.bashrc): the file name \"../../.bashrc\" is refused: it holds a directory",
        ),
        (
            json!({ "name": "big.txt", "data": base64_of(&[b'x'; 17]) }),
            StatusCode::PAYLOAD_TOO_LARGE,
            "attachments[1] (big.txt): big.txt is 17 bytes — the limit is 16 bytes",
        ),
        (
            json!({ "name": "x.txt", "data": "%%%not base64%%%" }),
            StatusCode::BAD_REQUEST,
            "attachments[1] (x.txt): it is not base64",
        ),
        (
            json!({ "data": base64_of(b"x") }),
            StatusCode::BAD_REQUEST,
            "attachments[1]: name is required with data",
        ),
        (
            json!({ "name": "x.txt", "data": "QQ==", "url": "https://example.com/x" }),
            StatusCode::BAD_REQUEST,
            "attachments[1]: give either data or url, not both",
        ),
        (
            json!({ "url": "http://127.0.0.1:9/secret" }),
            StatusCode::UNPROCESSABLE_ENTITY,
            "attachments[1]: the file could not be fetched: 127.0.0.1 is a private or loopback address",
        ),
    ];
    for (attachment, want_status, want_error) in cases {
        let body = json!({
            "prompt": "look", "cwd": project.path(), "attachments": [good, attachment],
        });
        let (status, error) = gw.call(Method::POST, "/v1/runs", Some(body)).await;
        assert_eq!(status, want_status, "{error}");
        assert!(error_of(&error).starts_with(want_error), "{error}");
    }
    let (_, runs) = gw.call(Method::GET, "/v1/runs", None).await;
    assert_eq!(runs["runs"], json!([]), "nothing was accepted");
    assert_eq!(staged_files(&gw), 0, "the good file of each refused request is gone");
    assert!(!project.path().join(".lemon").exists());

    let off = FilesConfig { enabled: false, ..FilesConfig::default() };
    let (gw, project) = with_files(off);
    let body = json!({ "prompt": "look", "cwd": project.path(), "attachments": [good] });
    let (status, error) = gw.call(Method::POST, "/v1/runs", Some(body)).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{error}");
    assert_eq!(error_of(&error), "attachments[0] (ok.txt): files are not accepted here");
}

#[tokio::test]
async fn only_the_submit_route_takes_a_body_as_large_as_a_file() {
    let files = FilesConfig { max_download_bytes: 2 * 1024 * 1024, ..FilesConfig::default() };
    let (gw, project) = with_files(files);
    let limit = gw.state.files.body_limit();
    let encoded = (2usize * 1024 * 1024).div_ceil(3) * 4;
    assert_eq!(limit, encoded + crate::files::ATTACHMENT_BODY_SLACK);
    let big = vec![7u8; 1536 * 1024];
    let body = json!({
        "prompt": "take it", "cwd": project.path(),
        "attachments": [{ "name": "blob.bin", "data": base64_of(&big) }],
    });
    let (status, run) = gw.call(Method::POST, "/v1/runs?wait=true", Some(body)).await;
    assert_eq!(status, StatusCode::OK, "{run}");
    assert_eq!(std::fs::read(project.path().join(".lemon/uploads/blob.bin")).unwrap(), big);

    // Every other route keeps its 1 MiB.
    let budget = json!({ "run_usd": 1.0, "padding": "x".repeat(crate::error::MAX_BODY_BYTES) });
    let (status, error) = gw.call(Method::PUT, "/v1/sessions/s/budget", Some(budget)).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{error}");
    assert_eq!(
        error_of(&error),
        format!("request body is larger than {} bytes", crate::error::MAX_BODY_BYTES)
    );
    // And the submit route its own limit.
    let huge = json!({ "prompt": "x".repeat(limit) });
    let (status, error) = gw.call(Method::POST, "/v1/runs", Some(huge)).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{error}");
    assert_eq!(error_of(&error), format!("request body is larger than {limit} bytes"));
}

#[tokio::test]
async fn the_cluster_config_is_not_found_off_a_cluster_and_needs_the_token() {
    let gw = TestGateway::start(Duration::ZERO);
    let (status, body) = gw.call(Method::GET, "/v1/cluster/config", None).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert_eq!(error_of(&body), "not a cluster node");
    let put = json!({ "expected_version": 0, "body": "[gateway]\nmax_concurrent_runs = 2\n" });
    let (status, body) = gw.call(Method::PUT, "/v1/cluster/config", Some(put.clone())).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    let request = Request::builder()
        .method(Method::PUT)
        .uri("/v1/cluster/config")
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(put.to_string()))
        .unwrap();
    let (status, _, _) = gw.send(request).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let status = gw.call(Method::GET, "/v1/status", None).await.1;
    assert_eq!(status["cluster"], Value::Null, "{status}");
}
