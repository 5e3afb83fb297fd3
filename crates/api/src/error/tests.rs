//! The JSON body extractor's content-type rule, and the bounds every
//! listener's bodies are read and parsed within.

use axum::body::Body;
use axum::extract::FromRequest;
use axum::http::{header, Request, StatusCode};
use axum::response::IntoResponse;
use serde_json::Value;

use super::{
    declared_too_large, is_json_content_type, json_depth_exceeds, parse_json, read_body, BodyError,
    JsonBody, JsonBodyError, MAX_JSON_DEPTH,
};

#[test]
fn json_content_types_are_recognised() {
    let check = |value: &str, expected: bool| {
        assert_eq!(is_json_content_type(value), expected, "{value:?}");
    };
    check("application/json", true);
    check("application/json; charset=utf-8", true);
    check("Application/JSON;charset=UTF-8", true);
    check("application/merge-patch+json", true);
    check("application/vnd.api+json ; q=1", true);
    check("application/x-www-form-urlencoded", false);
    check("text/plain", false);
    check("text/json", false);
    check("application/+json", false);
    check("application/jsonx", false);
    check("multipart/form-data; boundary=x", false);
    check("", false);
    check("json", false);
}

/// What the extractor answers for a body with `content_type` (none when `None`).
async fn extract(
    content_type: Option<&str>,
    body: &'static str,
) -> Result<Value, (StatusCode, Value)> {
    let mut request = Request::builder().method("POST").uri("/");
    if let Some(value) = content_type {
        request = request.header(header::CONTENT_TYPE, value);
    }
    let request = request.body(Body::from(body)).unwrap();
    match JsonBody::<Value>::from_request(request, &()).await {
        Ok(JsonBody(value)) => Ok(value),
        Err(error) => {
            let response = error.into_response();
            let status = response.status();
            let bytes = axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap();
            Err((status, serde_json::from_slice(&bytes).unwrap()))
        }
    }
}

#[tokio::test]
async fn bodies_that_are_not_declared_json_get_415() {
    for content_type in [Some("application/x-www-form-urlencoded"), Some("text/plain"), None] {
        let (status, body) = extract(content_type, r#"{"prompt":"hi"}"#).await.unwrap_err();
        assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE, "{content_type:?}");
        assert!(body["error"].as_str().unwrap().contains("application/json"), "{body}");
    }
    for content_type in ["application/json; charset=utf-8", "application/merge-patch+json"] {
        let value = extract(Some(content_type), r#"{"prompt":"hi"}"#).await.unwrap();
        assert_eq!(value["prompt"], "hi", "{content_type}");
    }
    // No body and no type is not a media type problem: the JSON itself is missing.
    let (status, _) = extract(None, "").await.unwrap_err();
    assert_eq!(status, StatusCode::BAD_REQUEST);
}

#[test]
fn nesting_is_counted_outside_strings_only() {
    let check = |text: &str, max: usize, expected: bool| {
        assert_eq!(json_depth_exceeds(text.as_bytes(), max), expected, "{text:?} within {max}");
    };
    check("[[1]]", 2, false);
    check("[[1]]", 1, true);
    check(r#"{"a":{"b":[]}}"#, 3, false);
    check(r#"{"a":{"b":[{}]}}"#, 3, true);
    // Brackets in strings, escaped quotes among them, do not nest.
    check(r#"["[[[[", "\"[[[[", "\\", []]"#, 2, false);
    check(r#"["\\"]"#, 1, false);
    // Unbalanced closers do not go below zero.
    check("]]]][[", 2, false);
}

#[test]
fn a_body_nested_past_the_bound_is_refused_before_serde_reads_it() {
    let at_bound = format!("{}{}", "[".repeat(MAX_JSON_DEPTH), "]".repeat(MAX_JSON_DEPTH));
    assert!(parse_json::<Value>(at_bound.as_bytes()).is_ok());
    let past = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    let error = parse_json::<Value>(past.as_bytes()).unwrap_err();
    assert!(matches!(error, JsonBodyError::TooDeep));
    assert_eq!(error.to_string(), "invalid JSON body: nested deeper than 64 levels");
}

#[test]
fn a_declared_length_over_the_limit_is_seen_in_the_headers() {
    let headers = |length: &str| {
        let mut headers = axum::http::HeaderMap::new();
        headers.insert(header::CONTENT_LENGTH, length.parse().unwrap());
        headers
    };
    assert!(declared_too_large(&headers("1025"), 1024));
    assert!(!declared_too_large(&headers("1024"), 1024));
    assert!(!declared_too_large(&axum::http::HeaderMap::new(), 1024));
}

#[tokio::test]
async fn a_body_is_read_up_to_its_limit_and_no_further() {
    let none = axum::http::HeaderMap::new();
    let read = read_body(&none, Body::from("0123456789"), 10).await.unwrap();
    assert_eq!(&read[..], b"0123456789");
    // Without a declared length, the first chunk past the limit ends the read.
    let chunks = futures::stream::iter((0..).map(|_| Ok::<_, std::io::Error>(vec![b'x'; 600])));
    let error = read_body(&none, Body::from_stream(chunks), 1024).await.unwrap_err();
    assert_eq!(error, BodyError::TooLarge { limit: 1024 });
    let response = error.into_response();
    assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);
    let bytes = axum::body::to_bytes(response.into_body(), 1024).await.unwrap();
    let body: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(body["error"], "request body is larger than 1024 bytes");
    // A declared length over the limit is refused without polling the body,
    // which here never ends.
    let (_tx, never) = futures::channel::mpsc::channel::<Result<Vec<u8>, std::io::Error>>(1);
    let mut declared = axum::http::HeaderMap::new();
    declared.insert(header::CONTENT_LENGTH, "2048".parse().unwrap());
    let error = read_body(&declared, Body::from_stream(never), 1024).await.unwrap_err();
    assert_eq!(error, BodyError::TooLarge { limit: 1024 });
}
