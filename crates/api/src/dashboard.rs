//! The web dashboard: one page at `/` and its assets under `/ui/`, embedded
//! in the binary (plain HTML, CSS and JavaScript modules; nothing is built).
//!
//! The assets are public; the page asks for the API token, keeps it in the
//! tab's session storage, and sends it on every call to `/v1/…`. Event
//! streams are read with `fetch` so the token travels in the `Authorization`
//! header, never in a URL. Every asset is served under a strict Content
//! Security Policy: only this origin's scripts, styles, images and
//! connections, no inline script or style, no frames, no plugins.

use axum::extract::Path;
use axum::http::{header, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

use crate::error::{method_not_allowed, ApiError};

/// The Content Security Policy of every dashboard response.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'self'; \
     style-src 'self'; img-src 'self' data:; font-src 'self'; connect-src 'self'; \
     object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// One embedded file.
#[derive(Debug, Clone, Copy)]
pub struct Asset {
    /// Its name under `/ui/` (`app.js`), or `index.html` for the page.
    pub name: &'static str,
    pub content_type: &'static str,
    pub body: &'static str,
}

macro_rules! asset {
    ($name:literal, $type:expr) => {
        Asset {
            name: $name,
            content_type: $type,
            body: include_str!(concat!("../dashboard/", $name)),
        }
    };
}

const JS: &str = "text/javascript; charset=utf-8";

/// The page itself, served at `/`.
pub const INDEX: Asset = asset!("index.html", "text/html; charset=utf-8");

/// Everything under `/ui/`.
pub const ASSETS: &[Asset] = &[
    asset!("app.css", "text/css; charset=utf-8"),
    asset!("app.js", JS),
    asset!("api.js", JS),
    asset!("dom.js", JS),
    asset!("runs.js", JS),
    asset!("pages.js", JS),
    asset!("config.js", JS),
    asset!("lemon.svg", "image/svg+xml"),
];

/// The dashboard's routes: `GET /` and `GET /ui/{name}`, no token needed.
pub fn router() -> Router {
    Router::new()
        .route("/", get(index).fallback(method_not_allowed))
        .route("/ui/{name}", get(asset).fallback(method_not_allowed))
}

async fn index() -> Response {
    serve(&INDEX)
}

async fn asset(Path(name): Path<String>) -> Response {
    match ASSETS.iter().find(|asset| asset.name == name) {
        Some(asset) => serve(asset),
        None => with_security_headers(
            ApiError::NotFound(format!("no dashboard file {name:?}")).into_response(),
        ),
    }
}

fn serve(asset: &Asset) -> Response {
    let mut response = (StatusCode::OK, asset.body).into_response();
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(asset.content_type));
    // The files change with the binary: always ask again, never keep a stale page.
    response.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    with_security_headers(response)
}

fn with_security_headers(mut response: Response) -> Response {
    let headers = response.headers_mut();
    headers
        .insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CONTENT_SECURITY_POLICY));
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(
        HeaderName::from_static("cross-origin-opener-policy"),
        HeaderValue::from_static("same-origin"),
    );
    headers.insert(
        HeaderName::from_static("cross-origin-resource-policy"),
        HeaderValue::from_static("same-origin"),
    );
    response
}

#[cfg(test)]
mod tests;
