//! What a router serves, found by asking it, for the tests that hold a
//! router to its OpenAPI document: a route added without a description
//! fails them, and so does a description of a route that is gone.

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use axum::Router;
use tower::ServiceExt;

/// The methods a route may have in the document.
const METHODS: [Method; 5] =
    [Method::GET, Method::POST, Method::PUT, Method::PATCH, Method::DELETE];

/// Every `/v1` path `router` has (from its `Debug` form, which lists them)
/// with each method it answers (a method it does not is a `405`), sorted,
/// as `"GET /v1/runs/{id}"`. Every request carries `token` as its bearer
/// token, has no body, and fills a path's parameters with `probe`.
///
/// # Panics
/// When the `Debug` form lists no `/v1` path: axum changed it, and the walk
/// must change with it.
pub async fn served(router: &Router, token: Option<&str>) -> Vec<String> {
    let listing = format!("{router:?}");
    let mut paths: Vec<String> = listing
        .split('"')
        .filter(|piece| piece.starts_with("/v1/") && !piece.contains("__private__"))
        .map(str::to_owned)
        .collect();
    paths.sort();
    paths.dedup();
    assert!(!paths.is_empty(), "no /v1 path in the router's Debug form: {listing}");
    let mut served = Vec::new();
    for path in paths {
        let uri = fill(&path);
        for method in METHODS {
            let mut request = Request::builder().method(method.clone()).uri(&uri);
            if let Some(token) = token {
                request = request.header("authorization", format!("Bearer {token}"));
            }
            let response =
                router.clone().oneshot(request.body(Body::empty()).unwrap()).await.unwrap();
            if response.status() != StatusCode::METHOD_NOT_ALLOWED {
                served.push(format!("{method} {path}"));
            }
        }
    }
    served.sort();
    served
}

/// Every operation of `document`, sorted, as `"GET /v1/runs/{id}"`.
pub fn documented(document: &utoipa::openapi::OpenApi) -> Vec<String> {
    let mut operations = Vec::new();
    for (path, item) in &document.paths.paths {
        let methods = [
            (Method::GET, item.get.is_some()),
            (Method::POST, item.post.is_some()),
            (Method::PUT, item.put.is_some()),
            (Method::PATCH, item.patch.is_some()),
            (Method::DELETE, item.delete.is_some()),
        ];
        for (method, present) in methods {
            if present {
                operations.push(format!("{method} {path}"));
            }
        }
    }
    operations.sort();
    operations
}

/// `path` with each `{param}` as `probe`.
fn fill(path: &str) -> String {
    path.split('/')
        .map(|segment| if segment.starts_with('{') { "probe" } else { segment })
        .collect::<Vec<_>>()
        .join("/")
}
