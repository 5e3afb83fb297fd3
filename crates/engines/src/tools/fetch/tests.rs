//! `fetch` against local axum servers: the private-address rule, redirects,
//! and the size and time limits.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::Path;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Redirect};
use axum::routing::get;
use axum::Router;
use lemon_core::testing::within;
use lemon_core::tool::{Tool, ToolOutput};
use serde_json::json;

use super::super::testutil::Dirs;
use super::super::BuiltinOptions;
use super::{is_text, Fetch};

/// Serves the test routes on `ip`; `other` is where `/away` redirects to.
async fn serve(ip: &str, other: Option<SocketAddr>) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind((ip, 0)).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let away = other.map(|other| format!("http://{other}/text")).unwrap_or_default();
    let app = Router::new()
        .route("/text", get(|| async { "hello from the server" }))
        .route(
            "/json",
            get(|| async { ([(header::CONTENT_TYPE, "application/json")], "{\"a\":1}") }),
        )
        .route("/big", get(|| async { "x".repeat(10_000) }))
        .route("/bytes/{n}", get(|Path(n): Path<usize>| async move { "x".repeat(n) }))
        .route(
            "/png",
            get(|| async {
                ([(header::CONTENT_TYPE, "image/png")], vec![0x89u8, b'P', b'N', b'G'])
            }),
        )
        .route(
            "/missing",
            get(|| async { (StatusCode::NOT_FOUND, "no such page").into_response() }),
        )
        .route("/slow", get(std::future::pending::<String>))
        .route("/here", get(|| async { Redirect::to("/text") }))
        .route("/away", get(move || async move { Redirect::to(&away) }))
        .route("/loop", get(|| async { Redirect::to("/loop") }));
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

fn allowing() -> BuiltinOptions {
    BuiltinOptions { fetch_allow_private: true, ..BuiltinOptions::default() }
}

async fn fetch(tool: &Fetch, url: String) -> ToolOutput {
    within("the fetch", tool.execute(json!({ "url": url }), Dirs::new().ctx())).await
}

#[tokio::test]
async fn a_local_server_is_fetched_only_when_private_addresses_are_allowed() {
    let addr = serve("127.0.0.1", None).await;
    let allowed = Fetch::new(Arc::new(allowing()));
    let out = fetch(&allowed, format!("http://{addr}/text")).await;
    assert!(!out.is_error, "{out:?}");
    assert!(
        out.text.starts_with("HTTP 200 OK (text/plain; charset=utf-8, 21 bytes)\n\n"),
        "{}",
        out.text
    );
    assert!(out.text.ends_with("hello from the server"), "{}", out.text);
    assert_eq!(out.details["status"], 200);
    let json_out = fetch(&allowed, format!("http://{addr}/json")).await;
    assert!(json_out.text.ends_with("{\"a\":1}"), "{}", json_out.text);

    let refusing = Fetch::new(Arc::new(BuiltinOptions::default()));
    for url in [
        format!("http://{addr}/text"),
        format!("http://localhost:{}/text", addr.port()),
        format!("http://[::1]:{}/text", addr.port()),
        "http://169.254.169.254/latest/meta-data".to_owned(),
        "http://10.0.0.1/".to_owned(),
    ] {
        let out = fetch(&refusing, url.clone()).await;
        assert!(out.is_error, "{url}: {out:?}");
        assert!(out.text.contains("not allowed"), "{url}: {}", out.text);
        assert_eq!(out.result_meta, json!({"error_type": "refused"}));
    }
    let out = fetch(&refusing, "file:///etc/passwd".to_owned()).await;
    assert!(out.is_error && out.text.contains("only http and https"), "{}", out.text);
    let out = fetch(&refusing, "not a url".to_owned()).await;
    assert!(out.is_error && out.text.starts_with("invalid URL"), "{}", out.text);
}

/// IPv6 addresses that carry a loopback IPv4 address (IPv4-compatible,
/// IPv4-mapped, NAT64, 6to4) are refused before any connection, like the
/// IPv4 address itself: a kernel with a `sit` tunnel routes `::127.0.0.1` to
/// this machine.
#[tokio::test]
async fn ipv6_forms_of_a_loopback_address_are_refused() {
    let addr = serve("127.0.0.1", None).await;
    let port = addr.port();
    let refusing = Fetch::new(Arc::new(BuiltinOptions::default()));
    for host in ["[::127.0.0.1]", "[::ffff:127.0.0.1]", "[64:ff9b::127.0.0.1]", "[2002:7f00:1::]"] {
        let url = format!("http://{host}:{port}/text");
        let out = fetch(&refusing, url.clone()).await;
        assert!(out.is_error, "{url}: {out:?}");
        assert!(out.text.contains("not allowed"), "{url}: {}", out.text);
        assert_eq!(out.result_meta, json!({"error_type": "refused"}), "{url}");
    }
}

/// Private, except the one address the "public" server listens on.
fn all_private_but_127_0_0_2(ip: IpAddr) -> bool {
    lemon_core::net::is_private(ip) && ip != IpAddr::from([127, 0, 0, 2])
}

#[tokio::test]
async fn a_redirect_to_a_private_address_is_refused() {
    let loopback = serve("127.0.0.1", None).await;
    let public = serve("127.0.0.2", Some(loopback)).await;
    let tool = Fetch::with_rule(Arc::new(BuiltinOptions::default()), all_private_but_127_0_0_2);

    let direct = fetch(&tool, format!("http://{public}/text")).await;
    assert!(!direct.is_error, "{direct:?}");
    let same_host = fetch(&tool, format!("http://{public}/here")).await;
    assert!(same_host.text.ends_with("hello from the server"), "{}", same_host.text);
    assert_eq!(same_host.details["url"], format!("http://{public}/text"));

    let out = fetch(&tool, format!("http://{public}/away")).await;
    assert!(out.is_error, "{out:?}");
    assert!(out.text.contains("127.0.0.1") && out.text.contains("not allowed"), "{}", out.text);
    let looping = fetch(&tool, format!("http://{public}/loop")).await;
    assert_eq!(looping.text, "more than 5 redirects");
}

#[tokio::test]
async fn the_body_is_cut_at_the_size_limit_and_binary_is_refused() {
    let addr = serve("127.0.0.1", None).await;
    let small = Fetch::new(Arc::new(BuiltinOptions { fetch_max_bytes: 100, ..allowing() }));
    let out = fetch(&small, format!("http://{addr}/big")).await;
    assert!(!out.is_error);
    assert!(
        out.text.ends_with(&format!("{}\n[the body was cut at 100 bytes]", "x".repeat(100))),
        "{}",
        out.text
    );
    assert_eq!(
        (out.details["bytes"].clone(), out.details["truncated"].clone()),
        (json!(100), json!(true))
    );

    let png = fetch(&small, format!("http://{addr}/png")).await;
    assert!(png.is_error && png.text.contains("not text (content-type image/png)"), "{}", png.text);
    let missing = fetch(&small, format!("http://{addr}/missing")).await;
    assert!(missing.is_error && missing.text.starts_with("HTTP 404 Not Found"), "{}", missing.text);
    assert_eq!(missing.result_meta, json!({"error_type": "http_status", "status": 404}));
}

#[tokio::test]
async fn a_slow_server_hits_the_time_limit_and_cancel_stops_the_fetch() {
    let addr = serve("127.0.0.1", None).await;
    let quick = Fetch::new(Arc::new(BuiltinOptions {
        fetch_timeout: Duration::from_millis(200),
        ..allowing()
    }));
    let out = fetch(&quick, format!("http://{addr}/slow")).await;
    assert_eq!(out.text, "The fetch timed out after 200 ms.");
    assert_eq!(out.result_meta, json!({"error_type": "timeout", "timeout_ms": 200}));

    let patient = Fetch::new(Arc::new(allowing()));
    let dirs = Dirs::new();
    let ctx = dirs.ctx();
    ctx.cancel.cancel();
    let out = within(
        "the cancelled fetch",
        patient.execute(json!({"url": format!("http://{addr}/slow")}), ctx),
    )
    .await;
    assert!(out.is_error && out.text.contains("cancelled"), "{}", out.text);
}

/// The documented default: `fetch` reads at most 1 MiB of a body.
#[tokio::test]
async fn by_default_a_body_is_cut_at_1_mib() {
    let addr = serve("127.0.0.1", None).await;
    let tool = Fetch::new(Arc::new(allowing()));
    let whole = fetch(&tool, format!("http://{addr}/bytes/1048576")).await;
    assert!(!whole.is_error, "{}", &whole.text[..80]);
    assert_eq!(whole.details["bytes"], 1_048_576);
    assert_eq!(whole.details["truncated"], false);
    assert!(whole.text.ends_with('x'), "nothing follows the body");

    let longer = fetch(&tool, format!("http://{addr}/bytes/1048577")).await;
    assert_eq!(longer.details["bytes"], 1_048_576);
    assert_eq!(longer.details["truncated"], true);
    assert!(longer.text.ends_with("x\n[the body was cut at 1048576 bytes]"));
}

/// The documented default: a whole `fetch` may take 30 s.
#[tokio::test(start_paused = true)]
async fn by_default_a_fetch_gives_up_after_30_s() {
    let addr = serve("127.0.0.1", None).await;
    let tool = Fetch::new(Arc::new(allowing()));
    let started = tokio::time::Instant::now();
    let out =
        tool.execute(json!({ "url": format!("http://{addr}/slow") }), Dirs::new().ctx()).await;
    let waited = started.elapsed();
    assert_eq!(out.text, "The fetch timed out after 30000 ms.");
    assert_eq!(out.result_meta, json!({"error_type": "timeout", "timeout_ms": 30_000}));
    assert!(waited >= Duration::from_secs(30), "gave up after {waited:?}");
    assert!(waited < Duration::from_secs(31), "gave up after {waited:?}");
}

#[test]
fn text_content_types() {
    for kind in
        ["text/html; charset=utf-8", "application/json", "application/ld+json", "image/svg+xml"]
    {
        assert!(is_text(kind), "{kind}");
    }
    for kind in ["image/png", "application/octet-stream", "application/pdf"] {
        assert!(!is_text(kind), "{kind}");
    }
}
