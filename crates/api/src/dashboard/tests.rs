//! The dashboard's files and headers: every file the page loads is embedded,
//! served with its type under the strict policy, and reaches nothing but this
//! origin.

use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use lemon_core::testing::within;
use tower::ServiceExt;

use super::{router, ASSETS, CONTENT_SECURITY_POLICY, INDEX};

async fn get(method: Method, uri: &str) -> (StatusCode, axum::http::HeaderMap, String) {
    let req = Request::builder().method(method).uri(uri).body(Body::empty()).unwrap();
    let response = within(uri, router().oneshot(req)).await.unwrap();
    let (parts, body) = response.into_parts();
    let bytes = within(uri, axum::body::to_bytes(body, usize::MAX)).await.unwrap();
    (parts.status, parts.headers, String::from_utf8(bytes.to_vec()).unwrap())
}

fn header(headers: &axum::http::HeaderMap, name: header::HeaderName) -> &str {
    headers.get(&name).unwrap_or_else(|| panic!("{name} is set")).to_str().unwrap()
}

#[tokio::test]
async fn the_page_is_served_at_the_root_with_the_strict_policy() {
    let (status, headers, body) = get(Method::GET, "/").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(header(&headers, header::CONTENT_TYPE), "text/html; charset=utf-8");
    assert_eq!(body, INDEX.body);
    let policy = header(&headers, header::CONTENT_SECURITY_POLICY);
    assert_eq!(policy, CONTENT_SECURITY_POLICY);
    for directive in [
        "default-src 'self'",
        "script-src 'self'",
        "connect-src 'self'",
        "object-src 'none'",
        "frame-ancestors 'none'",
    ] {
        assert!(policy.split(';').any(|d| d.trim() == directive), "{directive} in {policy}");
    }
    assert!(!policy.contains("unsafe-inline") && !policy.contains("unsafe-eval"), "{policy}");
    assert_eq!(header(&headers, header::X_CONTENT_TYPE_OPTIONS), "nosniff");
    assert_eq!(header(&headers, header::REFERRER_POLICY), "no-referrer");
    assert_eq!(header(&headers, header::X_FRAME_OPTIONS), "DENY");
}

#[tokio::test]
async fn every_asset_is_served_with_its_type_and_headers() {
    for asset in ASSETS {
        let uri = format!("/ui/{}", asset.name);
        let (status, headers, body) = get(Method::GET, &uri).await;
        assert_eq!(status, StatusCode::OK, "{uri}");
        assert_eq!(header(&headers, header::CONTENT_TYPE), asset.content_type, "{uri}");
        assert_eq!(body, asset.body, "{uri}");
        assert_eq!(header(&headers, header::CONTENT_SECURITY_POLICY), CONTENT_SECURITY_POLICY);
        assert_eq!(header(&headers, header::X_CONTENT_TYPE_OPTIONS), "nosniff");
    }
}

#[tokio::test]
async fn unknown_files_and_other_methods_are_json_errors() {
    let (status, headers, body) = get(Method::GET, "/ui/secret.toml").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(body, r#"{"error":"no dashboard file \"secret.toml\""}"#);
    assert_eq!(header(&headers, header::X_CONTENT_TYPE_OPTIONS), "nosniff");
    let (status, _, _) = get(Method::GET, "/ui/..%2Fapi.rs").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _, body) = get(Method::POST, "/").await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(body, r#"{"error":"method not allowed"}"#);
}

/// Every `/ui/…` path in the page and every module a script imports.
fn references(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    for (marker, prefix) in [("\"/ui/", ""), ("from './", ""), ("import './", "")] {
        let mut rest = text;
        while let Some(at) = rest.find(marker) {
            rest = &rest[at + marker.len()..];
            let end = rest.find(['"', '\'']).unwrap();
            found.push(format!("{prefix}{}", &rest[..end]));
        }
    }
    found
}

#[test]
fn every_file_the_page_loads_is_embedded() {
    let names: Vec<&str> = ASSETS.iter().map(|asset| asset.name).collect();
    let page_refs = references(INDEX.body);
    assert!(page_refs.contains(&"app.js".to_owned()), "{page_refs:?}");
    for asset in std::iter::once(&INDEX).chain(ASSETS) {
        for reference in references(asset.body) {
            assert!(names.contains(&reference.as_str()), "{} loads {reference}", asset.name);
        }
    }
    // And nothing embedded is unused.
    let mut used: Vec<String> = ASSETS.iter().flat_map(|a| references(a.body)).collect();
    used.extend(page_refs);
    for name in names {
        assert!(used.iter().any(|u| u == name), "{name} is embedded but never loaded");
    }
}

#[test]
fn no_file_reaches_another_origin_or_runs_inline_code() {
    for asset in std::iter::once(&INDEX).chain(ASSETS) {
        // The SVG namespace is a name, not a request.
        let text = asset.body.replace("xmlns=\"http://www.w3.org/2000/svg\"", "");
        for scheme in ["http://", "https://", "//cdn", "ws://", "wss://"] {
            assert!(!text.contains(scheme), "{} mentions {scheme}", asset.name);
        }
        assert!(!text.contains("EventSource"), "{}: streams are read with fetch", asset.name);
        assert!(!text.contains("localStorage"), "{}: the token stays in the tab", asset.name);
        assert!(!text.contains("innerHTML"), "{}: text goes in as text", asset.name);
        assert!(!text.contains("eval("), "{}", asset.name);
    }
    let page = INDEX.body;
    assert!(!page.contains(" style="), "no inline style");
    assert!(!page.contains(" onclick=") && !page.contains(" onsubmit="), "no inline handlers");
    let mut rest = page;
    while let Some(at) = rest.find("<script") {
        let tag_end = rest[at..].find('>').unwrap() + at;
        assert!(rest[at..tag_end].contains(" src="), "every script is a file");
        rest = &rest[tag_end..];
    }
}

#[test]
fn the_token_is_sent_in_a_header_never_in_a_url() {
    let api = ASSETS.iter().find(|a| a.name == "api.js").unwrap().body;
    assert!(api.contains("Authorization: `Bearer ${"), "the token goes in the header");
    assert!(api.contains("sessionStorage"), "the token is kept for the tab only");
    for asset in ASSETS {
        for needle in ["?token=", "&token=", "access_token"] {
            assert!(!asset.body.contains(needle), "{} puts the token in a URL", asset.name);
        }
    }
}

#[test]
fn every_page_carries_the_storage_alert_read_from_the_status() {
    // The alert sits outside the page that each route clears, and shows what
    // `/v1/status` says of the store: `store.writable`, `store.error`.
    let page = INDEX.body;
    let alert = page.find("id=\"storage-alert\"").expect("the alert element");
    assert!(alert < page.find("id=\"page\"").unwrap(), "outside the routed page");
    let line = page.lines().find(|line| line.contains("id=\"storage-alert\"")).unwrap();
    assert!(line.contains("role=\"alert\"") && line.contains(" hidden"), "{line}");
    let app = ASSETS.iter().find(|a| a.name == "app.js").unwrap().body;
    for needle in ["store.writable === false", "store.error", "'/v1/status'", "Storage failing"] {
        assert!(app.contains(needle), "app.js reads {needle}");
    }
}
