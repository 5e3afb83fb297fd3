//! The fake REST API, with its rate limits.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State as AxState;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Router;
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{Bucket, Call, FakeMessage, Fault, Shared, State, BOT_ID, BOT_NAME};

/// How long Discord remembers an enforced nonce ("the past few minutes").
const NONCE_WINDOW: Duration = Duration::from_secs(5 * 60);

pub(super) async fn serve(listener: TcpListener, shared: Arc<Shared>, stop: CancellationToken) {
    let router = Router::new().fallback(handle).with_state(shared);
    let _ = axum::serve(listener, router).with_graceful_shutdown(stop.cancelled_owned()).await;
}

fn error(status: u16, code: u64, message: &str) -> (u16, HeaderMap, Value) {
    (status, HeaderMap::new(), json!({ "message": message, "code": code }))
}

async fn handle(
    AxState(shared): AxState<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if uri.path().starts_with("/attachments/") {
        return cdn(&shared, &method, &uri);
    }
    let path = uri.path().strip_prefix("/api/v10").unwrap_or(uri.path()).to_owned();
    let nonce = create_nonce(&method, &path, &headers, &body);
    let fault = take_connection_fault(&mut shared.lock(), &path);
    if let Some(Fault::Delay(latency)) = fault {
        tokio::time::sleep(latency).await;
    }
    let apply = !matches!(fault, Some(Fault::Drop | Fault::Hang { applied: false }));
    let answered = !matches!(fault, Some(Fault::Drop | Fault::Hang { .. }));
    let (status, out_headers, value) = {
        let mut state = shared.lock();
        let hits = state.nonce_hits;
        let reply = if apply {
            answer(&mut state, &method, &path, &headers, &body)
        } else {
            (0, HeaderMap::new(), Value::Null)
        };
        let applied = apply && reply.0 < 300 && state.nonce_hits == hits;
        state.calls.push(Call {
            method: method.to_string(),
            path: path.clone(),
            status: reply.0,
            at: Instant::now(),
            answered,
            applied,
            nonce,
        });
        reply
    };
    shared.changed();
    if !answered {
        if matches!(fault, Some(Fault::Hang { .. })) {
            shared.stop.cancelled().await;
        }
        return dropped_connection();
    }
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = if status == StatusCode::NO_CONTENT {
        status.into_response()
    } else {
        (status, axum::Json(value)).into_response()
    };
    response.headers_mut().extend(out_headers);
    response
}

/// The CDN: a file a user sent, by its attachment's path (no rate limits,
/// no token, as Discord's CDN serves signed URLs).
fn cdn(shared: &Shared, method: &Method, uri: &Uri) -> Response {
    let found = {
        let mut state = shared.lock();
        state.cdn_fetches.push(uri.path().to_owned());
        state.cdn_files.get(uri.path()).cloned()
    };
    shared.changed();
    match found {
        Some((content_type, bytes)) if method == Method::GET => {
            ([(axum::http::header::CONTENT_TYPE, content_type)], bytes).into_response()
        }
        Some(_) => StatusCode::METHOD_NOT_ALLOWED.into_response(),
        None => (StatusCode::NOT_FOUND, "no such attachment").into_response(),
    }
}

/// Takes the first fault queued for `path` if it acts on the connection
/// (the others are answered by [`answer`]).
fn take_connection_fault(state: &mut State, path: &str) -> Option<Fault> {
    let at = state.faults.iter().position(|(route, _)| path.contains(route.as_str()))?;
    match state.faults[at].1 {
        Fault::Delay(_) | Fault::Drop | Fault::Hang { .. } => {
            state.faults.remove(at).map(|(_, fault)| fault)
        }
        Fault::RateLimited { .. } | Fault::Status(_) => None,
    }
}

/// An answer whose body fails before its first byte: the connection is closed
/// and the client sees it end without a response.
fn dropped_connection() -> Response {
    let failing = futures::stream::once(async {
        Err::<Bytes, std::io::Error>(std::io::Error::other("connection dropped by the fake"))
    });
    Response::new(axum::body::Body::from_stream(failing))
}

/// The payload of a message create (`POST /channels/{id}/messages`), JSON or
/// multipart's `payload_json`, with its files.
fn create_payload(
    headers: &HeaderMap,
    body: &[u8],
) -> Result<(Value, Vec<Upload>), (u64, &'static str)> {
    let content_type = headers.get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("");
    if let Some(boundary) = content_type.strip_prefix("multipart/form-data; boundary=") {
        parse_multipart(boundary, body).ok_or((50035, "Invalid Form Body"))
    } else {
        serde_json::from_slice::<Value>(body)
            .map(|value| (value, Vec::new()))
            .map_err(|_| (50109, "The request body contains invalid JSON."))
    }
}

/// A create's `nonce` (a string or an integer, as Discord takes it) and
/// whether `enforce_nonce` is set.
fn nonce_of(payload: &Value) -> Option<(String, bool)> {
    let nonce = match &payload["nonce"] {
        Value::String(text) => text.clone(),
        Value::Number(n) => n.to_string(),
        _ => return None,
    };
    Some((nonce, payload["enforce_nonce"] == Value::Bool(true)))
}

fn create_nonce(
    method: &Method,
    path: &str,
    headers: &HeaderMap,
    body: &[u8],
) -> Option<(String, bool)> {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    if !(*method == Method::POST && matches!(segments.as_slice(), ["channels", _, "messages"])) {
        return None;
    }
    create_payload(headers, body).ok().and_then(|(payload, _)| nonce_of(&payload))
}

fn answer(
    state: &mut State,
    method: &Method,
    path: &str,
    headers: &HeaderMap,
    body: &[u8],
) -> (u16, HeaderMap, Value) {
    let authorized = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v == format!("Bot {}", state.token));
    if !authorized {
        return error(401, 0, "401: Unauthorized");
    }
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let bucket = match (method.as_str(), segments.as_slice()) {
        ("POST" | "PATCH", ["channels", channel, "messages", ..]) => {
            Some(format!("messages:{channel}"))
        }
        ("GET", ["channels", channel]) => Some(format!("channel:{channel}")),
        ("PUT", ["applications", app, "commands"]) => Some(format!("commands:{app}")),
        _ => None,
    };
    let interaction = segments.first() == Some(&"interactions");
    if let Some(at) = state.faults.iter().position(|(route, _)| path.contains(route.as_str())) {
        let (_, fault) = state.faults.remove(at).unwrap();
        return match fault {
            Fault::RateLimited { retry_after, global: true } => rate_limited(retry_after, true),
            // A route's 429 carries its bucket's headers too, as Discord's example shows.
            Fault::RateLimited { retry_after, global: false } => {
                let mut answer = rate_limited(retry_after, false);
                if let Some(key) = &bucket {
                    let hash = key.split(':').next().unwrap_or("bucket");
                    let put = |h: &mut HeaderMap, name: &'static str, value: String| {
                        h.insert(name, HeaderValue::from_str(&value).unwrap());
                    };
                    put(&mut answer.1, "x-ratelimit-bucket", format!("{hash}-hash"));
                    put(&mut answer.1, "x-ratelimit-limit", state.channel_limit.0.to_string());
                    put(&mut answer.1, "x-ratelimit-remaining", "0".to_owned());
                    put(&mut answer.1, "x-ratelimit-reset-after", format!("{retry_after:.3}"));
                }
                answer
            }
            Fault::Status(status) => error(status, 0, "injected failure"),
            // Taken off the queue before the answer (`take_connection_fault`).
            Fault::Delay(_) | Fault::Drop | Fault::Hang { .. } => {
                error(500, 0, "a connection fault reached the answer")
            }
        };
    }
    if !interaction {
        let now = Instant::now();
        let global = state.global.get_or_insert(Bucket { started: now, count: 0 });
        if now.duration_since(global.started) >= Duration::from_secs(1) {
            *global = Bucket { started: now, count: 0 };
        }
        global.count += 1;
        if global.count > state.global_limit {
            let wait = 1.0 - now.duration_since(global.started).as_secs_f64();
            state.violations.push(format!("global limit: {method} {path}"));
            return rate_limited(wait, true);
        }
    }
    let mut limit_headers = HeaderMap::new();
    if let Some(key) = &bucket {
        let (limit, window) = state.channel_limit;
        let now = Instant::now();
        let b = state.buckets.entry(key.clone()).or_insert(Bucket { started: now, count: 0 });
        if now.duration_since(b.started) >= window {
            *b = Bucket { started: now, count: 0 };
        }
        b.count += 1;
        let reset_after = (window - now.duration_since(b.started)).as_secs_f64();
        if b.count > limit {
            state
                .violations
                .push(format!("bucket {key}: {method} {path} (call {} of {limit})", b.count));
            let mut answer = rate_limited(reset_after, false);
            answer.1.insert("x-ratelimit-bucket", HeaderValue::from_static("fakebucket"));
            return answer;
        }
        let hash = key.split(':').next().unwrap_or("bucket").to_owned();
        let put = |h: &mut HeaderMap, name: &'static str, value: String| {
            h.insert(name, HeaderValue::from_str(&value).unwrap());
        };
        put(&mut limit_headers, "x-ratelimit-bucket", format!("{hash}-hash"));
        put(&mut limit_headers, "x-ratelimit-limit", limit.to_string());
        put(&mut limit_headers, "x-ratelimit-remaining", (limit - b.count).to_string());
        put(&mut limit_headers, "x-ratelimit-reset-after", format!("{reset_after:.3}"));
    }
    let (status, _, value) = perform(state, method, &segments, headers, body);
    (status, limit_headers, value)
}

fn rate_limited(retry_after: f64, global: bool) -> (u16, HeaderMap, Value) {
    let mut headers = HeaderMap::new();
    headers.insert(
        "retry-after",
        HeaderValue::from_str(&format!("{}", retry_after.ceil() as u64)).unwrap(),
    );
    if global {
        headers.insert("x-ratelimit-global", HeaderValue::from_static("true"));
        headers.insert("x-ratelimit-scope", HeaderValue::from_static("global"));
    } else {
        headers.insert("x-ratelimit-scope", HeaderValue::from_static("user"));
    }
    let body = json!({ "message": "You are being rate limited.", "retry_after": retry_after, "global": global });
    (429, headers, body)
}

fn message_json(message: &FakeMessage) -> Value {
    json!({
        "id": message.id.to_string(), "channel_id": message.channel_id.to_string(), "type": 0,
        "author": { "id": BOT_ID.to_string(), "username": BOT_NAME, "bot": true },
        "content": message.content, "mentions": [], "embeds": [],
        "attachments": message.attachments.iter().enumerate().map(|(i, (name, bytes))| json!({
            "id": i.to_string(), "filename": name, "size": bytes.len(),
        })).collect::<Vec<_>>(),
        "timestamp": "2026-12-01T00:00:00.000000+00:00",
    })
}

fn perform(
    state: &mut State,
    method: &Method,
    segments: &[&str],
    headers: &HeaderMap,
    body: &[u8],
) -> (u16, HeaderMap, Value) {
    match (method.as_str(), segments) {
        ("GET", ["users", "@me"]) => (
            200,
            HeaderMap::new(),
            json!({ "id": BOT_ID.to_string(), "username": BOT_NAME, "bot": true }),
        ),
        ("GET", ["channels", id]) => {
            let channel = id.parse::<u64>().ok().and_then(|id| state.channels.get(&id));
            match channel {
                Some(c) => (
                    200,
                    HeaderMap::new(),
                    json!({
                        "id": c.id.to_string(), "type": c.kind,
                        "guild_id": c.guild_id.map(|g| g.to_string()),
                        "parent_id": c.parent_id.map(|p| p.to_string()),
                    }),
                ),
                None => error(404, 10003, "Unknown Channel"),
            }
        }
        ("POST", ["channels", channel, "messages"]) => {
            let Ok(channel_id) = channel.parse::<u64>() else {
                return error(404, 10003, "Unknown Channel");
            };
            let (payload, files) = match create_payload(headers, body) {
                Ok(parsed) => parsed,
                Err((code, message)) => return error(400, code, message),
            };
            let nonce = nonce_of(&payload);
            if nonce.as_ref().is_some_and(|(n, _)| n.chars().count() > 25) {
                return error(
                    400,
                    50035,
                    "Invalid Form Body: nonce must be 25 or fewer in length.",
                );
            }
            // Discord: with `enforce_nonce`, a nonce the same author used in the
            // past few minutes answers with that message and makes none.
            if let Some((nonce, true)) = &nonce {
                let now = Instant::now();
                state.nonces.retain(|_, (_, at)| now.duration_since(*at) < NONCE_WINDOW);
                let made = state.nonces.get(nonce).map(|(id, _)| *id);
                if let Some(message) =
                    made.and_then(|id| state.messages.iter().find(|m| m.id == id))
                {
                    let value = message_json(message);
                    state.nonce_hits += 1;
                    return (200, HeaderMap::new(), value);
                }
            }
            let content = payload["content"].as_str().unwrap_or_default().to_owned();
            if content.chars().count() > 2000 {
                return error(
                    400,
                    50035,
                    "Invalid Form Body: content must be 2000 or fewer in length.",
                );
            }
            if content.is_empty() && files.is_empty() {
                return error(400, 50006, "Cannot send an empty message");
            }
            let components = payload.get("components").cloned().unwrap_or_else(|| json!([]));
            if let Err(why) = check_components(&components) {
                return error(400, 50035, &format!("Invalid Form Body: {why}"));
            }
            let reply_to =
                payload["message_reference"]["message_id"].as_str().and_then(|id| id.parse().ok());
            let id = state.next_id();
            let message = FakeMessage {
                id,
                channel_id,
                author_id: BOT_ID,
                content: content.clone(),
                reply_to,
                versions: vec![content],
                edits: 0,
                attachments: files,
                components,
                sent_at: Instant::now(),
            };
            let value = message_json(&message);
            state.messages.push(message);
            if let Some((nonce, true)) = nonce {
                state.nonces.insert(nonce, (id, Instant::now()));
            }
            (200, HeaderMap::new(), value)
        }
        ("PATCH", ["channels", _, "messages", id]) => {
            let Ok(payload) = serde_json::from_slice::<Value>(body) else {
                return error(400, 50109, "The request body contains invalid JSON.");
            };
            let id = id.parse::<u64>().unwrap_or(0);
            let Some(message) =
                state.messages.iter_mut().find(|m| m.id == id && m.author_id == BOT_ID)
            else {
                return error(404, 10008, "Unknown Message");
            };
            let content = payload["content"].as_str().unwrap_or_default().to_owned();
            if content.chars().count() > 2000 {
                return error(
                    400,
                    50035,
                    "Invalid Form Body: content must be 2000 or fewer in length.",
                );
            }
            if let Some(components) = payload.get("components") {
                if let Err(why) = check_components(components) {
                    return error(400, 50035, &format!("Invalid Form Body: {why}"));
                }
                message.components = components.clone();
            }
            message.content = content.clone();
            message.versions.push(content);
            message.edits += 1;
            let value = message_json(message);
            (200, HeaderMap::new(), value)
        }
        ("PUT", ["applications", _, "commands"]) => match serde_json::from_slice::<Value>(body) {
            Ok(Value::Array(commands)) => {
                state.commands = commands.clone();
                (200, HeaderMap::new(), Value::Array(commands))
            }
            _ => error(400, 50035, "Invalid Form Body"),
        },
        ("POST", ["interactions", id, _token, "callback"]) => {
            let Ok(payload) = serde_json::from_slice::<Value>(body) else {
                return error(400, 50109, "The request body contains invalid JSON.");
            };
            let id = id.parse::<u64>().unwrap_or(0);
            let content = payload["data"]["content"].as_str().unwrap_or_default().to_owned();
            state.interaction_replies.push((id, content));
            (204, HeaderMap::new(), Value::Null)
        }
        _ => error(404, 0, "404: Not Found"),
    }
}

/// Discord's limits on message components: at most 5 action rows (type 1)
/// of at most 5 buttons (type 2) each; a button has a style 1–5, a label of
/// at most 80 characters and, unless it is a link (style 5), a `custom_id`
/// of 1–100 characters.
fn check_components(components: &Value) -> Result<(), String> {
    let rows = components.as_array().ok_or("components must be an array")?;
    if rows.len() > 5 {
        return Err("components must be 5 or fewer in length".to_owned());
    }
    for row in rows {
        if row["type"] != 1 {
            return Err("a top-level component must be an action row (type 1)".to_owned());
        }
        let buttons = row["components"].as_array().ok_or("an action row needs components")?;
        if buttons.is_empty() || buttons.len() > 5 {
            return Err("an action row holds 1 to 5 components".to_owned());
        }
        for button in buttons {
            let style = button["style"].as_u64().unwrap_or(0);
            if button["type"] != 2 || !(1..=5).contains(&style) {
                return Err(format!("not a button: {button}"));
            }
            if button["label"].as_str().is_some_and(|l| l.chars().count() > 80) {
                return Err("a button label must be 80 or fewer in length".to_owned());
            }
            let id = button["custom_id"].as_str().unwrap_or_default();
            if style != 5 && (id.is_empty() || id.chars().count() > 100) {
                return Err("a button's custom_id must be 1 to 100 in length".to_owned());
            }
        }
    }
    Ok(())
}

/// (filename, bytes) of an uploaded file.
type Upload = (String, Vec<u8>);

/// `payload_json` and the files of a `multipart/form-data` body.
fn parse_multipart(boundary: &str, body: &[u8]) -> Option<(Value, Vec<Upload>)> {
    let delimiter = format!("--{}", boundary.trim_matches('"'));
    let mut payload = None;
    let mut files = Vec::new();
    let mut rest = body;
    loop {
        let start = find(rest, delimiter.as_bytes())?;
        rest = &rest[start + delimiter.len()..];
        if rest.starts_with(b"--") {
            break;
        }
        rest = rest.strip_prefix(b"\r\n")?;
        let head_end = find(rest, b"\r\n\r\n")?;
        let head = std::str::from_utf8(&rest[..head_end]).ok()?;
        let content_start = head_end + 4;
        let next = find(&rest[content_start..], format!("\r\n{delimiter}").as_bytes())?;
        let content = &rest[content_start..content_start + next];
        let disposition =
            head.lines().find(|l| l.to_ascii_lowercase().starts_with("content-disposition"))?;
        let field = |key: &str| {
            let at = disposition.find(&format!("{key}=\""))? + key.len() + 2;
            let end = disposition[at..].find('"')?;
            Some(disposition[at..at + end].to_owned())
        };
        match field("name")?.as_str() {
            "payload_json" => payload = serde_json::from_slice(content).ok(),
            name if name.starts_with("files[") => {
                files.push((field("filename")?, content.to_vec()))
            }
            _ => {}
        }
        rest = &rest[content_start + next + 2..];
    }
    Some((payload?, files))
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}
