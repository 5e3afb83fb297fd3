//! The JSON body extractor's content-type rule.

use axum::body::Body;
use axum::extract::FromRequest;
use axum::http::{header, Request, StatusCode};
use axum::response::IntoResponse;
use serde_json::Value;

use super::{is_json_content_type, JsonBody};

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
