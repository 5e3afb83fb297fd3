//! Tests of the serve loop over real sockets on 127.0.0.1.

use std::convert::Infallible;
use std::io::Write as _;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::response::sse::{Event, Sse};
use axum::routing::get;
use axum::Router;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::conn_io::json_replacement;
use super::{serve_with, ClientLimits, ConnectionLimits, ServeConfig};
use lemon_core::net::Network;
use lemon_core::testing::within;

const LONG: Duration = Duration::from_secs(600);
const SHORT: Duration = Duration::from_millis(200);

fn config(header_read_timeout: Duration, idle_timeout: Duration, max: usize) -> ServeConfig {
    ServeConfig {
        header_read_timeout,
        idle_timeout,
        max_connections: max,
        clients: ClientLimits::default(),
    }
}

/// A connection to `addr` from the loopback address `source`.
async fn connect_from(source: [u8; 4], addr: SocketAddr) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::from((source, 0))).unwrap();
    socket.connect(addr).await.unwrap()
}

/// Sends `GET path` on `stream` (kept alive) and reads one response.
async fn get_on(stream: &mut TcpStream, path: &str) -> (u16, Vec<(String, String)>, Vec<u8>) {
    let request = format!("GET {path} HTTP/1.1\r\nhost: a\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut bytes = Vec::new();
    let mut buf = [0u8; 4096];
    within("a response", async {
        loop {
            let n = stream.read(&mut buf).await.unwrap();
            assert!(n > 0, "closed: {}", String::from_utf8_lossy(&bytes));
            bytes.extend_from_slice(&buf[..n]);
            let text = String::from_utf8_lossy(&bytes);
            if let Some((head, body)) = text.split_once("\r\n\r\n") {
                let length = head
                    .lines()
                    .find_map(|l| {
                        l.to_ascii_lowercase()
                            .strip_prefix("content-length:")
                            .map(|v| v.trim().to_owned())
                    })
                    .and_then(|v| v.parse::<usize>().ok())
                    .unwrap_or(0);
                if body.len() >= length {
                    return;
                }
            }
        }
    })
    .await;
    parse_response(&bytes)
}

fn hello_router() -> Router {
    Router::new().route("/hello", get(|| async { "hello" }))
}

/// A server on an ephemeral port, stopped when dropped.
struct TestServer {
    addr: SocketAddr,
    shutdown: CancellationToken,
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

async fn start(router: Router, config: ServeConfig) -> TestServer {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let shutdown = CancellationToken::new();
    tokio::spawn(serve_with(listener, router, shutdown.clone(), config));
    TestServer { addr, shutdown }
}

/// Reads until the server closes the connection (a reset counts as closed).
async fn read_to_close(stream: &mut TcpStream) -> Vec<u8> {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return out,
            Ok(n) => out.extend_from_slice(&buf[..n]),
        }
    }
}

/// Writes `request` on a new connection and returns everything the server sends
/// until it closes the connection.
async fn exchange(addr: SocketAddr, request: &[u8]) -> Vec<u8> {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(request).await.unwrap();
    within("the server to answer and close", read_to_close(&mut stream)).await
}

/// A parsed response: status, lower-cased header lines, body.
fn parse_response(bytes: &[u8]) -> (u16, Vec<(String, String)>, Vec<u8>) {
    let text = String::from_utf8_lossy(bytes);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or_else(|| panic!("no head in {text:?}"));
    let mut lines = head.split("\r\n");
    let status = lines.next().unwrap().split(' ').nth(1).unwrap().parse().unwrap();
    let headers = lines
        .map(|line| {
            let (name, value) = line.split_once(':').unwrap();
            (name.trim().to_ascii_lowercase(), value.trim().to_owned())
        })
        .collect();
    (status, headers, body.as_bytes().to_vec())
}

/// The response is `status` with a JSON `{"error": "..."}` body of the announced
/// length; the error text.
fn assert_json_error(bytes: &[u8], status: u16) -> String {
    let (got, headers, body) = parse_response(bytes);
    assert_eq!(got, status, "{}", String::from_utf8_lossy(bytes));
    let header = |name: &str| {
        headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.clone()).unwrap_or_default()
    };
    assert_eq!(header("content-type"), "application/json");
    assert_eq!(header("content-length"), body.len().to_string());
    let json: Value = serde_json::from_slice(&body).unwrap();
    let error = json["error"].as_str().unwrap_or_else(|| panic!("no error in {json}"));
    assert!(!error.is_empty());
    error.to_owned()
}

/// Log lines written while the guard lives, on this thread.
#[derive(Clone, Default)]
struct CapturedLogs(Arc<Mutex<Vec<u8>>>);

impl CapturedLogs {
    fn install(&self) -> tracing::subscriber::DefaultGuard {
        let logs = self.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || logs.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::WARN)
            .finish();
        tracing::subscriber::set_default(subscriber)
    }

    fn lines_containing(&self, needle: &str) -> Vec<String> {
        let bytes = self.0.lock().unwrap().clone();
        String::from_utf8_lossy(&bytes)
            .lines()
            .filter(|line| line.contains(needle))
            .map(str::to_owned)
            .collect()
    }
}

impl std::io::Write for CapturedLogs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn a_half_sent_request_is_closed_after_the_header_timeout() {
    let server = start(hello_router(), config(SHORT, LONG, 8)).await;
    let mut stream = TcpStream::connect(server.addr).await.unwrap();
    stream.write_all(b"GET /hello HTTP/1.1\r\nhost: a\r\nx-slow: ").await.unwrap();
    let answer = within("the half-sent request to be closed", read_to_close(&mut stream)).await;
    assert!(answer.is_empty(), "{}", String::from_utf8_lossy(&answer));
}

#[tokio::test]
async fn a_silent_connection_is_closed_after_the_idle_timeout() {
    let server = start(hello_router(), config(LONG, SHORT, 8)).await;
    let mut stream = TcpStream::connect(server.addr).await.unwrap();
    stream.write_all(b"GET /hello HTTP/1.1\r\nhost: a\r\n\r\n").await.unwrap();
    let mut buf = [0u8; 1024];
    let n = within("the answer", stream.read(&mut buf)).await.unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).ends_with("hello"));
    // Kept alive after the answer, then closed for being silent.
    let rest = within("the idle connection to be closed", read_to_close(&mut stream)).await;
    assert!(rest.is_empty(), "{}", String::from_utf8_lossy(&rest));
}

#[tokio::test]
async fn a_connection_beyond_the_cap_gets_a_json_503_and_one_log_line() {
    let logs = CapturedLogs::default();
    let _guard = logs.install();
    let server = start(hello_router(), config(LONG, LONG, 1)).await;
    // The first connection holds the only place: it has been answered.
    let mut first = TcpStream::connect(server.addr).await.unwrap();
    first.write_all(b"GET /hello HTTP/1.1\r\nhost: a\r\n\r\n").await.unwrap();
    let mut buf = [0u8; 1024];
    within("the first answer", first.read(&mut buf)).await.unwrap();

    for _ in 0..3 {
        let mut extra = TcpStream::connect(server.addr).await.unwrap();
        let answer = within("the refusal", read_to_close(&mut extra)).await;
        let error = assert_json_error(&answer, 503);
        assert!(error.contains("too many open connections"), "{error}");
    }
    let warnings = logs.lines_containing("connection limit reached");
    assert_eq!(warnings.len(), 1, "one line for three refusals: {warnings:?}");
    assert!(warnings[0].contains("max_connections=1"), "{}", warnings[0]);

    // Once the first connection is gone its place is free again.
    drop(first);
    within("a new connection to be served", async {
        loop {
            let answer = exchange(
                server.addr,
                b"GET /hello HTTP/1.1\r\nhost: a\r\nconnection: close\r\n\r\n",
            )
            .await;
            if parse_response(&answer).0 == 200 {
                return;
            }
        }
    })
    .await;
}

#[tokio::test]
async fn a_quiet_event_stream_stays_open_past_the_idle_timeout() {
    let (events_tx, events_rx) = mpsc::channel::<&'static str>(4);
    let events_rx = Arc::new(tokio::sync::Mutex::new(Some(events_rx)));
    let router = Router::new().route("/hello", get(|| async { "hello" })).route(
        "/events",
        get(move || {
            let events_rx = events_rx.clone();
            async move {
                let rx = events_rx.lock().await.take().unwrap();
                let stream = futures::stream::unfold(rx, |mut rx| async move {
                    let data = rx.recv().await?;
                    Some((Ok::<_, Infallible>(Event::default().data(data)), rx))
                });
                Sse::new(stream)
            }
        }),
    );
    let server = start(router, config(SHORT, SHORT, 8)).await;
    let mut stream = TcpStream::connect(server.addr).await.unwrap();
    stream.write_all(b"GET /events HTTP/1.1\r\nhost: a\r\n\r\n").await.unwrap();
    events_tx.send("one").await.unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 1024];
    while !String::from_utf8_lossy(&seen).contains("data: one") {
        let n = within("the first event", stream.read(&mut buf)).await.unwrap();
        assert!(n > 0, "stream closed early");
        seen.extend_from_slice(&buf[..n]);
    }
    // A connection opened now is closed by the idle timeout; once it is, the
    // stream has been quiet for longer than that timeout.
    let mut idle = TcpStream::connect(server.addr).await.unwrap();
    within("the idle connection to be closed", read_to_close(&mut idle)).await;

    events_tx.send("two").await.unwrap();
    while !String::from_utf8_lossy(&seen).contains("data: two") {
        let n = within("the second event", stream.read(&mut buf)).await.unwrap();
        assert!(n > 0, "the quiet stream was closed: {}", String::from_utf8_lossy(&seen));
        seen.extend_from_slice(&buf[..n]);
    }
}

#[tokio::test]
async fn requests_in_flight_finish_on_shutdown_and_the_listener_closes() {
    let (started_tx, mut started_rx) = mpsc::channel::<()>(1);
    let (release_tx, release_rx) = tokio::sync::oneshot::channel::<()>();
    let release_rx = Arc::new(tokio::sync::Mutex::new(Some(release_rx)));
    let router = Router::new().route(
        "/slow",
        get(move || {
            let release_rx = release_rx.clone();
            let started_tx = started_tx.clone();
            async move {
                let rx = release_rx.lock().await.take().unwrap();
                started_tx.send(()).await.unwrap();
                let _ = rx.await;
                "done"
            }
        }),
    );
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let shutdown = CancellationToken::new();
    let server =
        tokio::spawn(serve_with(listener, router, shutdown.clone(), config(LONG, LONG, 8)));
    let mut slow = TcpStream::connect(addr).await.unwrap();
    slow.write_all(b"GET /slow HTTP/1.1\r\nhost: a\r\n\r\n").await.unwrap();
    within("the slow request to start", started_rx.recv()).await.unwrap();
    let mut idle = TcpStream::connect(addr).await.unwrap();
    idle.write_all(b"GET /missing HTTP/1.1\r\nhost: a\r\n\r\n").await.unwrap();
    let mut buf = [0u8; 1024];
    within("the idle connection's answer", idle.read(&mut buf)).await.unwrap();
    shutdown.cancel();
    // The idle connection is closed at once, the slow request is answered.
    within("the idle connection to close", read_to_close(&mut idle)).await;
    release_tx.send(()).unwrap();
    let answer = within("the slow answer", read_to_close(&mut slow)).await;
    assert!(String::from_utf8_lossy(&answer).ends_with("done"), "{answer:?}");
    within("the server to stop", server).await.unwrap().unwrap();
    assert!(TcpStream::connect(addr).await.is_err(), "the listener is closed");
}

/// Malformed requests hyper answers by itself, each with the status it gets.
pub(crate) fn malformed_requests() -> Vec<(&'static str, Vec<u8>, u16)> {
    let mut many_headers = b"GET /hello HTTP/1.1\r\nhost: a\r\n".to_vec();
    for i in 0..200 {
        write!(many_headers, "x-header-{i}: value\r\n").unwrap();
    }
    many_headers.extend_from_slice(b"\r\n");
    vec![
        ("headers too large", many_headers, 431),
        ("garbage request line", b"\x01\x02 nonsense \x7f\r\n\r\n".to_vec(), 400),
        (
            "invalid UTF-8 in the path",
            b"GET /caf\xc3\x28\xff HTTP/1.1\r\nhost: a\r\n\r\n".to_vec(),
            400,
        ),
        (
            "negative content-length",
            b"POST /hello HTTP/1.1\r\nhost: a\r\ncontent-length: -5\r\n\r\nhello".to_vec(),
            400,
        ),
    ]
}

#[tokio::test]
async fn requests_hyper_rejects_by_itself_get_json_errors() {
    let server = start(hello_router(), config(LONG, LONG, 8)).await;
    for (what, request, status) in malformed_requests() {
        let answer = exchange(server.addr, &request).await;
        let error = assert_json_error(&answer, status);
        assert!(!error.contains('\n'), "{what}: {error}");
    }
    // A good request on the same server is untouched.
    let answer =
        exchange(server.addr, b"GET /hello HTTP/1.1\r\nhost: a\r\nconnection: close\r\n\r\n").await;
    let (status, _, body) = parse_response(&answer);
    assert_eq!((status, body.as_slice()), (200, &b"hello"[..]));
}

#[test]
fn only_bare_error_heads_are_replaced() {
    let bare =
        b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\ndate: x\r\n\r\n";
    let replaced = String::from_utf8(json_replacement(bare).unwrap()).unwrap();
    assert!(replaced.starts_with("HTTP/1.1 431 Request Header Fields Too Large\r\n"), "{replaced}");
    assert!(replaced.ends_with("{\"error\":\"request header fields too large\"}"), "{replaced}");

    let check_kept = |bytes: &[u8]| assert!(json_replacement(bytes).is_none(), "{bytes:?}");
    // A success, an error with a body, a head followed by body bytes, a partial head.
    check_kept(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n");
    check_kept(b"HTTP/1.1 404 Not Found\r\ncontent-length: 23\r\n\r\n");
    check_kept(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\nmore");
    check_kept(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n");
    check_kept(b"data: HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n");
}

#[test]
fn caps_leave_room_for_health_and_the_gateway_itself() {
    let check = |limit: u64, listener: usize, health: usize| {
        let limits = ConnectionLimits::from_descriptor_limit(limit);
        assert_eq!((limits.listener, limits.health), (listener, health), "limit {limit}");
        // Both connection listeners full still leave health and the reserve.
        assert!(2 * limits.listener + limits.health + limits.reserved <= limit as usize);
        assert!(limits.reserved >= 32);
    };
    check(256, 104, 16);
    check(1024, 416, 64);
    check(65_536, 10_000, 64);
    let tiny = ConnectionLimits::from_descriptor_limit(16);
    assert_eq!((tiny.listener, tiny.health), (1, 4));
}

fn limited(max_connections: usize, rate: u32, burst: u32) -> ServeConfig {
    config(LONG, LONG, 64).with_client_limits(ClientLimits {
        max_connections,
        requests_per_second: rate,
        burst,
        exempt: vec![Network::parse("127.0.0.1").unwrap()],
    })
}

#[tokio::test]
async fn a_client_over_its_rate_gets_429_with_retry_after_and_keeps_its_connection() {
    let router = hello_router().route("/v1/models", get(|| async { "models" }));
    // One request a minute, in effect: nothing refills while the test runs.
    let server = start(router, limited(0, 1, 3)).await;
    let mut client = connect_from([127, 0, 0, 2], server.addr).await;
    for _ in 0..3 {
        assert_eq!(get_on(&mut client, "/hello").await.0, 200);
    }
    let (status, headers, body) = get_on(&mut client, "/hello").await;
    assert_eq!(status, 429);
    assert!(headers.contains(&("retry-after".to_owned(), "1".to_owned())), "{headers:?}");
    let json: Value = serde_json::from_slice(&body).unwrap();
    let error = json["error"].as_str().unwrap();
    assert!(error.contains("too many requests from this address; retry in 1 s"), "{error}");
    // The OpenAI-compatible routes get their own error shape.
    let (status, _, body) = get_on(&mut client, "/v1/models").await;
    assert_eq!(status, 429);
    let json: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(json["error"]["type"], "rate_limit_error", "{json}");
    assert_eq!(json["error"]["code"], "rate_limit_exceeded", "{json}");
    // The same client on a new connection has the same empty bucket.
    let mut again = connect_from([127, 0, 0, 2], server.addr).await;
    assert_eq!(get_on(&mut again, "/hello").await.0, 429);
    // Another address, and an exempt one, are served.
    let mut other = connect_from([127, 0, 0, 3], server.addr).await;
    assert_eq!(get_on(&mut other, "/hello").await.0, 200);
    let mut exempt = connect_from([127, 0, 0, 1], server.addr).await;
    for _ in 0..10 {
        assert_eq!(get_on(&mut exempt, "/hello").await.0, 200);
    }
}

#[tokio::test]
async fn a_client_over_its_connection_share_gets_429_and_one_log_line() {
    let logs = CapturedLogs::default();
    let _guard = logs.install();
    let server = start(hello_router(), limited(2, 0, 0)).await;
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut stream = connect_from([127, 0, 0, 4], server.addr).await;
        assert_eq!(get_on(&mut stream, "/hello").await.0, 200);
        held.push(stream);
    }
    for _ in 0..3 {
        let mut extra = connect_from([127, 0, 0, 4], server.addr).await;
        let answer = within("the refusal", read_to_close(&mut extra)).await;
        let error = assert_json_error(&answer, 429);
        assert!(error.contains("too many open connections from this address"), "{error}");
        assert!(String::from_utf8_lossy(&answer).contains("retry-after: 1\r\n"));
    }
    let warnings = logs.lines_containing("holds its share of connections");
    assert_eq!(warnings.len(), 1, "one line for three refusals: {warnings:?}");
    assert!(warnings[0].contains("client=127.0.0.4"), "{}", warnings[0]);
    // Another client is served while this one is full.
    let mut other = connect_from([127, 0, 0, 5], server.addr).await;
    assert_eq!(get_on(&mut other, "/hello").await.0, 200);
    // A closed connection frees its place.
    drop(held.pop());
    within("a place to free up", async {
        loop {
            let mut stream = connect_from([127, 0, 0, 4], server.addr).await;
            let request = b"GET /hello HTTP/1.1\r\nhost: a\r\nconnection: close\r\n\r\n";
            stream.write_all(request).await.unwrap();
            let answer = read_to_close(&mut stream).await;
            if parse_response(&answer).0 == 200 {
                return;
            }
        }
    })
    .await;
}
