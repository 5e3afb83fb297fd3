//! The HTTP edge under attack, on the real binary: idle sockets beyond the
//! descriptor limit, requests hyper cannot parse, bodies that are not JSON,
//! weak API tokens, and what the health port tells a caller without a token.

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::Path;

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::{command, command_with_descriptor_limit, home_with, Gateway, PATIENCE, TOKEN};

async fn within<F: std::future::Future>(what: &str, fut: F) -> F::Output {
    tokio::time::timeout(PATIENCE, fut).await.unwrap_or_else(|_| panic!("timed out: {what}"))
}

fn addr_of(url: &str) -> SocketAddr {
    url.trim_start_matches("http://").parse().unwrap()
}

/// Reads until the peer closes the connection (a reset counts as closed).
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

/// Writes `request` on a new connection; everything the server sends until it
/// closes the connection.
pub(crate) async fn exchange(addr: SocketAddr, request: &[u8]) -> Vec<u8> {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(request).await.unwrap();
    within("the answer and the close", read_to_close(&mut stream)).await
}

/// Status, header lines (names lower-cased) and body of a raw response.
fn parse_response(bytes: &[u8]) -> (u16, Vec<(String, String)>, Vec<u8>) {
    let text = String::from_utf8_lossy(bytes);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or_else(|| panic!("no head: {text:?}"));
    let mut lines = head.split("\r\n");
    let status = lines.next().unwrap().split(' ').nth(1).unwrap().parse().unwrap();
    let headers = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(name, value)| (name.trim().to_ascii_lowercase(), value.trim().to_owned()))
        .collect();
    (status, headers, body.as_bytes().to_vec())
}

/// The raw response is `status` with a JSON `{"error"}` body of the announced
/// length and type; the body.
pub(crate) fn json_error(bytes: &[u8], status: u16, what: &str) -> Value {
    let (got, headers, body) = parse_response(bytes);
    assert_eq!(got, status, "{what}: {}", String::from_utf8_lossy(bytes));
    let header = |name: &str| {
        headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.clone()).unwrap_or_default()
    };
    assert_eq!(header("content-type"), "application/json", "{what}");
    assert_eq!(header("content-length"), body.len().to_string(), "{what}");
    let json: Value = serde_json::from_slice(&body).unwrap();
    assert!(json["error"].as_str().is_some_and(|e| !e.is_empty()), "{what}: {json}");
    json
}

/// Open descriptors of process `pid`.
fn open_descriptors(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).unwrap().count()
}

/// The soft and hard `Max open files` of process `pid`.
fn descriptor_limits(pid: i32) -> (u64, u64) {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = limits.lines().find(|l| l.starts_with("Max open files")).unwrap();
    let mut numbers = line.split_whitespace().filter_map(|w| w.parse().ok());
    (numbers.next().unwrap(), numbers.next().unwrap())
}

#[tokio::test]
async fn idle_sockets_beyond_the_descriptor_limit_starve_neither_health_nor_the_api() {
    const HARD: u64 = 256;
    let dir =
        home_with("[gateway]\nhttp_header_read_timeout_ms = 5000\nhttp_idle_timeout_ms = 60000\n");
    let gateway =
        Gateway::spawn(command_with_descriptor_limit(dir.path(), 128, HARD), dir.path()).await;
    let pid = gateway.pid();
    // The soft limit was raised to the hard one at start.
    assert_eq!(descriptor_limits(pid), (HARD, HARD));
    let api = addr_of(&gateway.api);

    // More silent, unauthenticated sockets than the gateway may have descriptors.
    let mut idle = Vec::new();
    for _ in 0..300 {
        idle.push(TcpStream::connect(api).await.unwrap());
    }
    // Accepted after all of them: the API is full and says so, in JSON.
    let status_request =
        format!("GET /v1/status HTTP/1.1\r\nhost: a\r\nauthorization: Bearer {TOKEN}\r\n\r\n");
    let refused = exchange(api, status_request.as_bytes()).await;
    let body = json_error(&refused, 503, "a full API");
    assert!(body["error"].as_str().unwrap().contains("too many open connections"), "{body}");

    // The gateway holds a bounded number of descriptors, leaving room for health…
    let held = open_descriptors(pid);
    assert!(held >= 100, "the API's connections are held: {held}");
    assert!(held + 16 <= HARD as usize, "{held} descriptors leave no room for health");
    // …which answers while the API is full.
    let health = gateway.http.get(format!("{}/healthz", gateway.health)).send().await.unwrap();
    assert_eq!(health.status(), 200);
    assert_eq!(health.json::<Value>().await.unwrap()["status"], "healthy");

    // The header timeout closes every silent socket; then the API answers again.
    within(
        "the silent sockets to be closed",
        futures::future::join_all(idle.iter_mut().map(read_to_close)),
    )
    .await;
    let status = gateway.get("/v1/status").send().await.unwrap();
    assert_eq!(status.status(), 200);
    let after = open_descriptors(pid);
    assert!(after < 64, "descriptors after the sockets closed: {after}");
    gateway.terminate().await;
}

/// Requests hyper answers by itself, with the status each gets.
pub(crate) fn malformed_requests() -> Vec<(&'static str, Vec<u8>, u16)> {
    let mut many_headers = b"GET /healthz HTTP/1.1\r\nhost: a\r\n".to_vec();
    for i in 0..200 {
        write!(many_headers, "x-header-{i}: value\r\n").unwrap();
    }
    many_headers.extend_from_slice(b"\r\n");
    vec![
        ("headers too large", many_headers, 431),
        ("garbage request line", b"\x16\x03\x01 hello \x00\r\n\r\n".to_vec(), 400),
        (
            "invalid UTF-8 in the path",
            b"GET /v1/\xc3\x28\xfe HTTP/1.1\r\nhost: a\r\n\r\n".to_vec(),
            400,
        ),
        (
            "negative content-length",
            b"POST /v1/runs HTTP/1.1\r\nhost: a\r\ncontent-length: -1\r\n\r\n{}".to_vec(),
            400,
        ),
    ]
}

#[tokio::test]
async fn requests_that_cannot_be_parsed_get_json_errors_on_every_listener() {
    let gateway = Gateway::start(
        "[gateway]\nenable_webhook = true\n[gateway.webhook]\nport = 0\n\
         [gateway.webhook.integrations.ci]\ntoken = \"hook-token-0123456789\"\n",
    )
    .await;
    // Ready means every transport has bound its listener (or failed).
    let webhook: SocketAddr = gateway.webhook.as_deref().unwrap().parse().unwrap();
    assert_eq!(gateway.status().await["transports"]["webhook"]["state"], "running");
    let listeners = [
        ("control API", addr_of(&gateway.api)),
        ("health", addr_of(&gateway.health)),
        ("webhook", webhook),
    ];
    for (listener, addr) in listeners {
        for (what, request, status) in malformed_requests() {
            let answer = exchange(addr, &request).await;
            json_error(&answer, status, &format!("{listener}: {what}"));
        }
    }
    gateway.terminate().await;
}

#[tokio::test]
async fn json_routes_refuse_bodies_that_are_not_json() {
    let gateway = Gateway::start("").await;
    let prompt = json!({ "prompt": "hi", "session_key": "ct" }).to_string();
    let send = |content_type: Option<&'static str>, path: &str, body: String| {
        let mut request = gateway.post(path).body(body);
        if let Some(value) = content_type {
            request = request.header("content-type", value);
        }
        request.send()
    };
    for content_type in [Some("application/x-www-form-urlencoded"), Some("text/plain"), None] {
        let response = send(content_type, "/v1/runs", prompt.clone()).await.unwrap();
        assert_eq!(response.status(), 415, "{content_type:?}");
        let body: Value = response.json().await.unwrap();
        assert!(body["error"].as_str().unwrap().contains("application/json"), "{body}");
    }
    for content_type in ["application/json; charset=utf-8", "application/merge-patch+json"] {
        let response = send(Some(content_type), "/v1/runs", prompt.clone()).await.unwrap();
        assert_eq!(response.status(), 202, "{content_type}");
    }
    let run_id = gateway.submit(json!({ "prompt": "steer me" })).await;
    let steer = send(Some("text/plain"), &format!("/v1/runs/{run_id}/steer"), "{}".to_owned())
        .await
        .unwrap();
    assert_eq!(steer.status(), 415);
    // Routes without a body need no content type.
    let cancel = gateway.post(&format!("/v1/runs/{run_id}/cancel")).send().await.unwrap();
    assert_eq!(cancel.status(), 202);
    gateway.terminate().await;
}

/// Starts the binary on `home` with `LEMON_API_TOKEN` set to `token` (or
/// unset) and expects it to refuse; its stderr.
async fn refused_start(home: &Path, token: Option<&str>) -> String {
    let mut command = command(home);
    match token {
        Some(value) => command.env("LEMON_API_TOKEN", value),
        None => command.env_remove("LEMON_API_TOKEN"),
    };
    let output = within("the gateway to exit", command.output()).await.unwrap();
    assert!(!output.status.success(), "started with {token:?}");
    assert!(
        !String::from_utf8_lossy(&output.stdout).contains("lemon-gateway ready"),
        "reported ready with {token:?}"
    );
    String::from_utf8(output.stderr).unwrap()
}

#[tokio::test]
async fn blank_or_short_api_tokens_stop_the_start() {
    let dir = home_with("");
    let stderr = refused_start(dir.path(), Some("  \t ")).await;
    assert!(stderr.contains("environment variable LEMON_API_TOKEN"), "{stderr}");
    assert!(stderr.contains("blank"), "{stderr}");
    let stderr = refused_start(dir.path(), Some("")).await;
    assert!(stderr.contains("LEMON_API_TOKEN") && stderr.contains("blank"), "{stderr}");
    let stderr = refused_start(dir.path(), Some("tiny-secret-15c")).await;
    assert!(stderr.contains("LEMON_API_TOKEN"), "{stderr}");
    assert!(stderr.contains("shorter than 16 characters"), "{stderr}");
    assert!(!stderr.contains("tiny-secret-15c"), "the token is in {stderr}");

    let secrets = dir.path().join("secrets.toml");
    std::fs::write(&secrets, "lemon_api_token = \"   \"\n").unwrap();
    let stderr = refused_start(dir.path(), None).await;
    assert!(stderr.contains(&secrets.display().to_string()), "{stderr}");
    assert!(stderr.contains("blank"), "{stderr}");
    // The blank entry is refused, not replaced behind the user's back.
    assert_eq!(std::fs::read_to_string(&secrets).unwrap(), "lemon_api_token = \"   \"\n");
}

#[tokio::test]
async fn a_token_with_surrounding_whitespace_is_compared_trimmed() {
    let dir = home_with("");
    let mut padded = command(dir.path());
    padded.env("LEMON_API_TOKEN", format!("  {TOKEN}\n"));
    let gateway = Gateway::spawn(padded, dir.path()).await;
    let status = gateway.get("/v1/status").send().await.unwrap();
    assert_eq!(status.status(), 200);
    let padded_header = gateway
        .http
        .get(format!("{}/v1/status", gateway.api))
        .header("authorization", format!("Bearer   {TOKEN} "))
        .send()
        .await
        .unwrap();
    assert_eq!(padded_header.status(), 200);
    let wrong = gateway
        .http
        .get(format!("{}/v1/status", gateway.api))
        .bearer_auth(format!("{TOKEN}x"))
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status(), 401);
    gateway.terminate().await;
}

#[tokio::test]
async fn health_detail_needs_the_api_token() {
    let gateway = Gateway::start("").await;
    let url = format!("{}/healthz", gateway.health);
    let anonymous: Value = gateway.http.get(&url).send().await.unwrap().json().await.unwrap();
    assert_eq!(
        anonymous,
        json!({
            "ok": true,
            "status": "healthy",
            "checks": [
                { "name": "scheduler", "ok": true },
                { "name": "store", "ok": true },
                { "name": "runs", "ok": true },
            ],
            "transports": {
                "sms": { "state": "disabled" },
                "discord": { "state": "disabled" },
                "email": { "state": "disabled" },
                "telegram": { "state": "disabled" },
                "voice": { "state": "disabled" },
                "webhook": { "state": "disabled" },
                "xmtp": { "state": "disabled" },
            },
        })
    );
    let detailed: Value =
        gateway.http.get(&url).bearer_auth(TOKEN).send().await.unwrap().json().await.unwrap();
    assert!(detailed["version"].is_string(), "{detailed}");
    assert!(detailed["checks"][0]["detail"]["max"].is_u64(), "{detailed}");
    assert!(detailed["checks"][0]["duration_ms"].is_u64(), "{detailed}");
    gateway.terminate().await;
}
