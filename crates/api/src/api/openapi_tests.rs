//! The OpenAPI document against the router: every route it serves is
//! described, nothing it does not serve is, and the document is valid
//! OpenAPI 3.1 as far as its structure goes (schemathesis, in the end-to-end
//! test, loads it and checks every response against it).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use serde_json::Value;
use tower::ServiceExt;

use super::router_with;
use super::tests::TestGateway;
use crate::openapi::{document, routes};
use crate::secrets::{SecretUses, SecretsApi};

const TOKEN: &str = "test-token-6f1c";

pub(super) fn secrets_routes(dir: &std::path::Path) -> axum::Router {
    crate::secrets::routes(SecretsApi {
        store: Arc::new(lemon_core::secrets::SecretStore::new(
            Default::default(),
            dir.join("secrets.toml"),
        )),
        uses: SecretUses::new(Vec::new()),
        changed: Arc::new(tokio::sync::Notify::new()),
    })
}

#[tokio::test]
async fn every_route_the_api_serves_is_in_its_document_and_nothing_else() {
    let gw = TestGateway::start(Duration::ZERO);
    let dir = tempfile::tempdir().unwrap();
    // The API's routes with the secrets routes merged in, as the server serves them.
    let app = router_with(gw.state.clone(), secrets_routes(dir.path()));
    let served = routes::served(&app, Some(TOKEN)).await;
    let documented = routes::documented(&document());
    assert!(served.len() > 30, "{served:#?}");
    assert_eq!(served, documented, "served (left) and documented (right) differ");
}

#[tokio::test]
async fn a_route_without_a_description_fails_the_walk() {
    let gw = TestGateway::start(Duration::ZERO);
    let extra =
        axum::Router::new().route("/v1/undocumented", axum::routing::post(|| async { "ok" }));
    let app = router_with(gw.state.clone(), extra);
    let served = routes::served(&app, Some(TOKEN)).await;
    assert!(served.contains(&"POST /v1/undocumented".to_owned()), "{served:#?}");
    assert!(!routes::documented(&document()).contains(&"POST /v1/undocumented".to_owned()));
}

#[tokio::test]
async fn the_document_is_served_behind_the_token() {
    let gw = TestGateway::start(Duration::ZERO);
    let request = |auth: bool| {
        let mut request = Request::builder().uri("/v1/openapi.json");
        if auth {
            request = request.header(header::AUTHORIZATION, format!("Bearer {TOKEN}"));
        }
        request.body(Body::empty()).unwrap()
    };
    let refused = gw.router().oneshot(request(false)).await.unwrap();
    assert_eq!(refused.status(), StatusCode::UNAUTHORIZED);
    let response = gw.router().oneshot(request(true)).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()[header::CONTENT_TYPE], "application/json");
    let bytes = axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap();
    let served: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(served, serde_json::to_value(document()).unwrap());
}

#[test]
fn the_document_is_valid_openapi_3_1() {
    let doc = serde_json::to_value(document()).unwrap();
    let found = problems(&doc);
    assert!(found.is_empty(), "{found:#?}");
    // The checker finds what it is there to find.
    let mut broken = doc.clone();
    broken["paths"]["/v1/runs/{id}"]["get"]["parameters"] = Value::Array(Vec::new());
    broken["paths"]["/v1/runs"]["get"]["responses"]["200"]["content"]["application/json"]
        ["schema"] = serde_json::json!({ "$ref": "#/components/schemas/Nowhere" });
    assert_eq!(problems(&broken).len(), 2, "{:#?}", problems(&broken));
}

/// What is wrong with `doc` as an OpenAPI 3.1 document: the version and
/// info, every operation with responses and a unique id, every path
/// parameter declared, every `$ref` resolving.
fn problems(doc: &Value) -> Vec<String> {
    let mut problems = Vec::new();
    if !doc["openapi"].as_str().is_some_and(|v| v.starts_with("3.1.")) {
        problems.push(format!("openapi is {}", doc["openapi"]));
    }
    for key in ["title", "version"] {
        if !doc["info"][key].is_string() {
            problems.push(format!("info.{key} is missing"));
        }
    }
    if !doc["components"]["securitySchemes"]["bearer"].is_object() {
        problems.push("no bearer security scheme".to_owned());
    }
    let mut ids = BTreeSet::new();
    let Some(paths) = doc["paths"].as_object() else {
        return vec!["no paths".to_owned()];
    };
    for (path, item) in paths {
        if !path.starts_with("/v1/") {
            problems.push(format!("path {path} is outside /v1"));
        }
        let params: Vec<&str> = path
            .split('/')
            .filter_map(|s| s.strip_prefix('{').and_then(|s| s.strip_suffix('}')))
            .collect();
        for (method, operation) in item.as_object().into_iter().flatten() {
            let at = format!("{method} {path}");
            if operation["responses"].as_object().is_none_or(|r| r.is_empty()) {
                problems.push(format!("{at}: no responses"));
            }
            match operation["operationId"].as_str() {
                Some(id) if ids.insert(id.to_owned()) => {}
                other => problems.push(format!("{at}: operationId {other:?} missing or repeated")),
            }
            for param in &params {
                let declared = operation["parameters"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|p| p["in"] == "path" && p["name"] == *param && p["required"] == true);
                if !declared {
                    problems.push(format!("{at}: path parameter {param} not declared"));
                }
            }
        }
    }
    refs(doc, doc, &mut problems);
    problems
}

fn refs(doc: &Value, value: &Value, problems: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            if let Some(Value::String(target)) = map.get("$ref") {
                let resolves =
                    target.strip_prefix("#").and_then(|pointer| doc.pointer(pointer)).is_some();
                if !resolves {
                    problems.push(format!("$ref {target} does not resolve"));
                }
            }
            map.values().for_each(|v| refs(doc, v, problems));
        }
        Value::Array(items) => items.iter().for_each(|v| refs(doc, v, problems)),
        _ => {}
    }
}

/// Schemathesis checks each Server-Sent Event against the stream's schema:
/// an event (`event`, `data`, `id`), not the stream as one string.
#[test]
fn streams_are_described_event_by_event() {
    let doc = serde_json::to_value(document()).unwrap();
    for (path, method) in [
        ("/v1/runs/{id}/events", "get"),
        ("/v1/events", "get"),
        ("/v1/chat/completions", "post"),
        ("/v1/responses", "post"),
    ] {
        let schema = &doc["paths"][path][method]["responses"]["200"]["content"]
            ["text/event-stream"]["schema"];
        assert_eq!(schema["$ref"], "#/components/schemas/SseEvent", "{method} {path}: {schema}");
    }
    let event = &doc["components"]["schemas"]["SseEvent"];
    assert_eq!(event["required"], serde_json::json!(["data"]), "{event}");
}

#[test]
fn the_routes_that_take_files_document_them_and_their_refusals() {
    let doc = serde_json::to_value(document()).unwrap();
    for (path, schema) in [
        ("/v1/runs", "SubmitBody"),
        ("/v1/chat/completions", "ChatRequest"),
        ("/v1/responses", "ResponsesRequest"),
    ] {
        let responses = &doc["paths"][path]["post"]["responses"];
        for status in ["400", "403", "413", "422"] {
            assert!(responses[status].is_object(), "{path} {status}: {responses}");
        }
        let too_large = responses["413"]["description"].as_str().unwrap();
        assert!(too_large.contains("max_download_bytes"), "{path}: {too_large}");
        assert!(doc["components"]["schemas"][schema].is_object(), "{schema}");
    }
    let attachment = &doc["components"]["schemas"]["AttachmentBody"]["properties"];
    for field in ["name", "mime", "data", "url"] {
        assert!(attachment[field].is_object(), "{field}: {attachment}");
    }
    let submit = &doc["components"]["schemas"]["SubmitBody"]["properties"]["attachments"];
    assert!(submit.to_string().contains("AttachmentBody"), "{submit}");
}
