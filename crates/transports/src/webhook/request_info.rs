//! What a run keeps about the HTTP request that started it (`meta.webhook.request`):
//! method, path, query with secret-looking values redacted, remote address, user
//! agent and `X-Request-Id`.

use std::net::{IpAddr, SocketAddr};

use axum::http::{HeaderMap, Method};
use serde_json::{json, Value};

/// What a redacted value is replaced with.
pub(super) const REDACTED: &str = "[REDACTED]";

/// Query keys containing any of these (ignoring case) have their value redacted.
const SECRET_KEY_PARTS: [&str; 8] =
    ["token", "secret", "password", "auth", "api_key", "apikey", "signature", "sig"];

/// Longest header value kept; longer ones are cut (at a character boundary).
const MAX_HEADER_CHARS: usize = 512;

/// `{"method", "path", "query", "remote_ip", "user_agent", "request_id"}`; absent
/// values are `null`.
pub(super) fn request_json(
    method: &Method,
    path: &str,
    raw_query: Option<&str>,
    remote: Option<SocketAddr>,
    headers: &HeaderMap,
) -> Value {
    json!({
        "method": method.as_str(),
        "path": path,
        "query": raw_query.and_then(redact_query),
        "remote_ip": remote.map(|addr| remote_ip(addr.ip())),
        "user_agent": header(headers, "user-agent"),
        "request_id": header(headers, "x-request-id"),
    })
}

/// The query string with the value of every secret-looking key replaced by
/// `[REDACTED]`; other pairs stay exactly as sent. `None` when empty.
pub(super) fn redact_query(raw: &str) -> Option<String> {
    let pairs: Vec<String> = raw
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| match pair.split_once('=') {
            Some((key, _)) if is_secret_key(key) => format!("{key}={REDACTED}"),
            _ => pair.to_owned(),
        })
        .collect();
    (!pairs.is_empty()).then(|| pairs.join("&"))
}

/// Whether a (raw, possibly percent-encoded) query key names a secret. A key
/// that does not decode is treated as secret.
fn is_secret_key(raw: &str) -> bool {
    let Some(key) = super::percent_decode(raw) else { return true };
    let key = key.to_ascii_lowercase();
    SECRET_KEY_PARTS.iter().any(|part| key.contains(part))
}

/// Dotted IPv4 (also for an IPv4-mapped IPv6 peer), else IPv6.
fn remote_ip(ip: IpAddr) -> String {
    ip.to_canonical().to_string()
}

fn header(headers: &HeaderMap, name: &str) -> Option<String> {
    super::header_str(headers, name).map(|value| value.chars().take(MAX_HEADER_CHARS).collect())
}
