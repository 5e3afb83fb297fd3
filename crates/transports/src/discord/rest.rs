//! Discord's REST API: the calls the bot makes, each inside the rate-limit
//! bucket Discord announces for it.
//!
//! Every answer carries `X-RateLimit-Bucket`, `-Limit`, `-Remaining` and
//! `-Reset-After`; a route (method, path and its major id: the channel, the
//! application, the interaction) is mapped to its bucket, and a call whose
//! bucket is used up waits for the reset before it goes out. A 429 says how
//! long to wait (`retry_after` in the JSON body, or the `Retry-After` header)
//! and whether the limit is the global one (`"global": true` or
//! `X-RateLimit-Global`), which then holds back every call. The 429 itself is
//! returned as [`DiscordError::RateLimited`]: the outbox makes the same call
//! again after the wait; the calls outside the outbox (command registration,
//! interaction answers, channel lookups) use [`Rest::with_retries`].

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use reqwest::header::HeaderMap;
use reqwest::{Method, StatusCode};
use serde::de::DeserializeOwned;
use serde_json::{json, Value};
use tokio::time::Instant;

use super::types::{
    ApplicationCommand, Channel, CreateFile, CreateMessage, DiscordError, Message, Snowflake,
};

/// The longest wait a 429 is taken at its word for; longer ones are capped.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(600);

/// One bucket's state, as its last answer told it.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    limit: u32,
    remaining: u32,
    reset_at: Instant,
}

#[derive(Debug, Default)]
struct Limits {
    /// Route → the bucket Discord named for it (`<hash>:<major id>`).
    bucket_of: HashMap<String, String>,
    buckets: HashMap<String, Bucket>,
    /// Every call waits until then (a global 429).
    global_until: Option<Instant>,
}

/// A route: what the buckets are keyed by.
#[derive(Debug, Clone)]
struct Route {
    method: Method,
    /// The path as called.
    path: String,
    /// The path with minor ids left out, and the major id kept.
    key: String,
    major: String,
}

impl Route {
    fn new(method: Method, path: String, key: &str, major: impl fmt::Display) -> Self {
        let major = major.to_string();
        let key = format!("{method} {key}:{major}");
        Route { method, path, key, major }
    }
}

/// The REST client. Cheap to clone; clones share the buckets.
#[derive(Clone)]
pub struct Rest {
    http: reqwest::Client,
    base: String,
    /// `Bot <token>`; never shown.
    authorization: Arc<str>,
    limits: Arc<Mutex<Limits>>,
}

impl fmt::Debug for Rest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Rest").field("base", &self.base).finish_non_exhaustive()
    }
}

impl Rest {
    /// A client of the API at `base` (e.g. `https://discord.com/api/v10`)
    /// whose calls may take `timeout` each (`api_timeout_ms`); a call that
    /// takes longer fails as a network error, and the outbox makes it again.
    ///
    /// # Errors
    /// [`DiscordError::Invalid`] when the HTTP client cannot be built.
    pub fn new(base: &str, token: &str, timeout: Duration) -> Result<Self, DiscordError> {
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .user_agent(concat!(
                "DiscordBot (https://github.com/lemon-gateway, ",
                env!("CARGO_PKG_VERSION"),
                ")"
            ))
            .build()
            .map_err(|e| DiscordError::Invalid(format!("HTTP client: {e}")))?;
        Ok(Rest {
            http,
            base: base.trim().trim_end_matches('/').to_owned(),
            authorization: format!("Bot {token}").into(),
            limits: Arc::default(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Limits> {
        self.limits.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Waits until the route's bucket (and the global limit) lets a call go,
    /// and takes one call from the bucket.
    async fn acquire(&self, route: &Route) {
        loop {
            let wait = {
                let mut limits = self.lock();
                let now = Instant::now();
                match limits.global_until {
                    Some(until) if until > now => Some(until - now),
                    _ => {
                        let id = limits.bucket_of.get(&route.key).cloned();
                        match id.and_then(|id| limits.buckets.get_mut(&id)) {
                            None => None,
                            Some(bucket) => {
                                if bucket.reset_at <= now {
                                    bucket.remaining = bucket.limit;
                                    bucket.reset_at = now + Duration::from_secs(1);
                                }
                                if bucket.remaining == 0 {
                                    Some(bucket.reset_at - now)
                                } else {
                                    bucket.remaining -= 1;
                                    None
                                }
                            }
                        }
                    }
                }
            };
            match wait {
                None => return,
                Some(wait) => tokio::time::sleep(wait).await,
            }
        }
    }

    /// Takes in the rate-limit headers of an answer.
    fn observe(&self, route: &Route, headers: &HeaderMap) {
        let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
        let Some(hash) = text("x-ratelimit-bucket") else { return };
        let limit = text("x-ratelimit-limit").and_then(|v| v.parse::<u32>().ok());
        let remaining = text("x-ratelimit-remaining").and_then(|v| v.parse::<u32>().ok());
        let reset_after = text("x-ratelimit-reset-after").and_then(seconds);
        let (Some(limit), Some(remaining), Some(reset_after)) = (limit, remaining, reset_after)
        else {
            return;
        };
        let id = format!("{hash}:{}", route.major);
        let mut limits = self.lock();
        limits.bucket_of.insert(route.key.clone(), id.clone());
        let reset_at = Instant::now() + reset_after;
        let bucket = limits.buckets.entry(id).or_insert(Bucket { limit, remaining, reset_at });
        // The smaller count wins: calls already taken from it are still on their way.
        bucket.limit = limit.max(1);
        bucket.remaining =
            if bucket.reset_at >= reset_at { bucket.remaining.min(remaining) } else { remaining };
        bucket.reset_at = reset_at;
    }

    /// A 429: how long to wait, applied to the route's bucket or to every call.
    fn rate_limited(&self, route: &Route, headers: &HeaderMap, body: &Value) -> Duration {
        let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
        let wait = body
            .get("retry_after")
            .and_then(Value::as_f64)
            .and_then(|s| Duration::try_from_secs_f64(s).ok())
            .or_else(|| header("retry-after").and_then(seconds))
            .unwrap_or(Duration::from_secs(1))
            .min(MAX_RETRY_AFTER);
        let global = body.get("global").and_then(Value::as_bool).unwrap_or(false)
            || header("x-ratelimit-global").is_some_and(|v| v.eq_ignore_ascii_case("true"))
            || header("x-ratelimit-scope") == Some("global");
        let until = Instant::now() + wait;
        let mut limits = self.lock();
        if global {
            limits.global_until = Some(limits.global_until.map_or(until, |at| at.max(until)));
        } else {
            let id = limits.bucket_of.get(&route.key).cloned().unwrap_or_else(|| {
                let id = route.key.clone();
                limits.bucket_of.insert(route.key.clone(), id.clone());
                id
            });
            let bucket = limits.buckets.entry(id).or_insert(Bucket {
                limit: 1,
                remaining: 0,
                reset_at: until,
            });
            bucket.remaining = 0;
            bucket.reset_at = bucket.reset_at.max(until);
        }
        wait
    }

    async fn call(&self, route: Route, body: Body) -> Result<Value, DiscordError> {
        self.acquire(&route).await;
        let url = format!("{}{}", self.base, route.path);
        let mut request = self
            .http
            .request(route.method.clone(), url)
            .header("authorization", &*self.authorization);
        request = match body {
            Body::None => request,
            Body::Json(value) => request.json(&value),
            Body::Multipart { boundary, bytes } => request
                .header("content-type", format!("multipart/form-data; boundary={boundary}"))
                .body(bytes),
        };
        let response = request.send().await.map_err(|e| DiscordError::Network(without_url(&e)))?;
        let status = response.status();
        let headers = response.headers().clone();
        self.observe(&route, &headers);
        let bytes = response.bytes().await.map_err(|e| DiscordError::Network(without_url(&e)))?;
        let value: Value = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).unwrap_or(Value::Null)
        };
        if status.is_success() {
            return Ok(value);
        }
        if status == StatusCode::TOO_MANY_REQUESTS {
            return Err(DiscordError::RateLimited(self.rate_limited(&route, &headers, &value)));
        }
        if status == StatusCode::UNAUTHORIZED {
            return Err(DiscordError::Unauthorized);
        }
        Err(DiscordError::Status {
            status: status.as_u16(),
            code: value.get("code").and_then(Value::as_i64),
            message: value
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or_else(|| status.canonical_reason().unwrap_or("error"))
                .to_owned(),
        })
    }

    async fn call_as<T: DeserializeOwned>(
        &self,
        route: Route,
        body: Body,
    ) -> Result<T, DiscordError> {
        let value = self.call(route, body).await?;
        serde_json::from_value(value)
            .map_err(|e| DiscordError::Invalid(format!("unexpected answer from Discord: {e}")))
    }

    /// Makes `call` again while Discord answers 429 (waiting as it says) or
    /// fails in a way worth retrying, at most `attempts` times in all.
    ///
    /// # Errors
    /// The last error.
    pub async fn with_retries<T, F, Fut>(
        &self,
        attempts: u32,
        mut call: F,
    ) -> Result<T, DiscordError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, DiscordError>>,
    {
        let mut failures = 0u32;
        loop {
            match call().await {
                Ok(value) => return Ok(value),
                Err(DiscordError::RateLimited(wait)) if failures + 1 < attempts => {
                    failures += 1;
                    tokio::time::sleep(wait).await;
                }
                Err(error) if error.is_retryable() && failures + 1 < attempts => {
                    failures += 1;
                    tokio::time::sleep(Duration::from_millis(500) * failures).await;
                }
                Err(error) => return Err(error),
            }
        }
    }

    /// `GET /users/@me`: the bot itself.
    ///
    /// # Errors
    /// [`DiscordError::Unauthorized`] for a wrong token, or as Discord answers.
    pub async fn current_user(&self) -> Result<super::types::User, DiscordError> {
        let route = Route::new(Method::GET, "/users/@me".to_owned(), "/users/@me", "");
        self.call_as(route, Body::None).await
    }

    /// `GET /channels/{id}`.
    ///
    /// # Errors
    /// As Discord answers.
    pub async fn get_channel(&self, channel_id: Snowflake) -> Result<Channel, DiscordError> {
        let route =
            Route::new(Method::GET, format!("/channels/{channel_id}"), "/channels", channel_id);
        self.call_as(route, Body::None).await
    }

    /// `POST /channels/{id}/messages`: text, as a reply when `reply_to` is set,
    /// with its nonce enforced (see [`nonce`](super::types::nonce)). Mentions
    /// in it never ping anyone.
    ///
    /// # Errors
    /// As Discord answers.
    pub async fn create_message(&self, message: &CreateMessage) -> Result<Message, DiscordError> {
        let channel = message.channel_id;
        let route = Route::new(
            Method::POST,
            format!("/channels/{channel}/messages"),
            "/channels/messages",
            channel,
        );
        let mut body = json!({
            "content": message.content,
            "allowed_mentions": { "parse": [], "replied_user": false },
            "nonce": message.nonce,
            "enforce_nonce": true,
        });
        if let Some(reply_to) = message.reply_to {
            body["message_reference"] =
                json!({ "message_id": reply_to, "fail_if_not_exists": false });
        }
        if !message.buttons.is_empty() {
            let buttons: Vec<Value> = message
                .buttons
                .iter()
                .map(|b| json!({ "type": 2, "style": b.style, "label": b.label, "custom_id": b.custom_id }))
                .collect();
            body["components"] = json!([{ "type": 1, "components": buttons }]);
        }
        self.call_as(route, Body::Json(body)).await
    }

    /// `PATCH /channels/{id}/messages/{message}` with new content and no
    /// buttons any more.
    ///
    /// # Errors
    /// As Discord answers.
    pub async fn edit_message_without_buttons(
        &self,
        channel_id: Snowflake,
        message_id: Snowflake,
        content: &str,
    ) -> Result<(), DiscordError> {
        let route = Route::new(
            Method::PATCH,
            format!("/channels/{channel_id}/messages/{message_id}"),
            "/channels/messages/:id",
            channel_id,
        );
        let body =
            json!({ "content": content, "components": [], "allowed_mentions": { "parse": [] } });
        self.call(route, Body::Json(body)).await.map(drop)
    }

    /// `PATCH /channels/{id}/messages/{message}` with new content.
    ///
    /// # Errors
    /// As Discord answers.
    pub async fn edit_message(
        &self,
        channel_id: Snowflake,
        message_id: Snowflake,
        content: &str,
    ) -> Result<(), DiscordError> {
        let route = Route::new(
            Method::PATCH,
            format!("/channels/{channel_id}/messages/{message_id}"),
            "/channels/messages/:id",
            channel_id,
        );
        let body = json!({ "content": content, "allowed_mentions": { "parse": [] } });
        self.call(route, Body::Json(body)).await.map(drop)
    }

    /// `POST /channels/{id}/messages` with one attachment (`multipart/form-data`:
    /// `payload_json` and `files[0]`), with its nonce enforced.
    ///
    /// # Errors
    /// The file cannot be read, or as Discord answers.
    pub async fn create_file(&self, file: &CreateFile) -> Result<Message, DiscordError> {
        // A run's checked file, read without following a link swapped in since.
        let content = lemon_core::contain::read_checked(&file.path).await.map_err(|e| {
            DiscordError::Invalid(format!("cannot read {}: {e}", file.path.display()))
        })?;
        let payload = json!({
            "content": file.caption.clone().unwrap_or_default(),
            "attachments": [{ "id": 0, "filename": file.filename }],
            "allowed_mentions": { "parse": [] },
            "nonce": file.nonce,
            "enforce_nonce": true,
        });
        let boundary = boundary_for(&content);
        let bytes = multipart(&boundary, &payload, file, &content);
        let channel = file.channel_id;
        let route = Route::new(
            Method::POST,
            format!("/channels/{channel}/messages"),
            "/channels/messages",
            channel,
        );
        self.call_as(route, Body::Multipart { boundary, bytes }).await
    }

    /// `PUT /applications/{id}/commands`: the bot's global commands, replacing
    /// whatever was registered.
    ///
    /// # Errors
    /// As Discord answers.
    pub async fn bulk_overwrite_commands(
        &self,
        application_id: Snowflake,
        commands: &[ApplicationCommand],
    ) -> Result<(), DiscordError> {
        let route = Route::new(
            Method::PUT,
            format!("/applications/{application_id}/commands"),
            "/applications/commands",
            application_id,
        );
        let body = serde_json::to_value(commands)
            .map_err(|e| DiscordError::Invalid(format!("commands: {e}")))?;
        self.call(route, Body::Json(body)).await.map(drop)
    }

    /// `POST /interactions/{id}/{token}/callback`: answers a slash command with
    /// a message (`CHANNEL_MESSAGE_WITH_SOURCE`).
    ///
    /// # Errors
    /// As Discord answers.
    pub async fn interaction_reply(
        &self,
        interaction_id: Snowflake,
        token: &str,
        content: &str,
    ) -> Result<(), DiscordError> {
        let route = Route::new(
            Method::POST,
            format!("/interactions/{interaction_id}/{token}/callback"),
            "/interactions/callback",
            interaction_id,
        );
        let body = json!({
            "type": 4,
            "data": { "content": content, "allowed_mentions": { "parse": [] } },
        });
        self.call(route, Body::Json(body)).await.map(drop)
    }

    /// Answers an interaction with a message only its user sees (flag 64,
    /// ephemeral): what became of a button press.
    ///
    /// # Errors
    /// As Discord answers.
    pub async fn interaction_notice(
        &self,
        interaction_id: Snowflake,
        token: &str,
        content: &str,
    ) -> Result<(), DiscordError> {
        let route = Route::new(
            Method::POST,
            format!("/interactions/{interaction_id}/{token}/callback"),
            "/interactions/callback",
            interaction_id,
        );
        let body = json!({
            "type": 4,
            "data": { "content": content, "flags": 64, "allowed_mentions": { "parse": [] } },
        });
        self.call(route, Body::Json(body)).await.map(drop)
    }
}

enum Body {
    None,
    Json(Value),
    Multipart { boundary: String, bytes: Vec<u8> },
}

/// Seconds as Discord writes them (`"1.5"`, `"2"`).
fn seconds(text: &str) -> Option<Duration> {
    text.trim().parse::<f64>().ok().and_then(|s| Duration::try_from_secs_f64(s).ok())
}

/// A network error's text without its URL (which holds interaction tokens).
fn without_url(error: &reqwest::Error) -> String {
    let kind = if error.is_timeout() {
        "timed out"
    } else if error.is_connect() {
        "connection failed"
    } else if error.is_body() || error.is_decode() {
        "the answer broke off"
    } else {
        "request failed"
    };
    kind.to_owned()
}

/// A boundary that does not occur in the content.
fn boundary_for(content: &[u8]) -> String {
    let mut seed = content.len() as u64 ^ 0x9e37_79b9_7f4a_7c15;
    loop {
        let boundary = format!("lemon-discord-{seed:016x}");
        if !content.windows(boundary.len()).any(|w| w == boundary.as_bytes()) {
            return boundary;
        }
        seed = seed.rotate_left(7).wrapping_mul(31).wrapping_add(1);
    }
}

fn multipart(boundary: &str, payload: &Value, file: &CreateFile, content: &[u8]) -> Vec<u8> {
    let filename: String =
        file.filename.chars().map(|c| if c == '"' || c.is_control() { '_' } else { c }).collect();
    let mut out = Vec::with_capacity(content.len() + 512);
    out.extend_from_slice(
        format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"payload_json\"\r\n\
             Content-Type: application/json\r\n\r\n{payload}\r\n"
        )
        .as_bytes(),
    );
    out.extend_from_slice(
        format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"files[0]\"; filename=\"{filename}\"\r\n\
             Content-Type: {}\r\n\r\n",
            file.mime
        )
        .as_bytes(),
    );
    out.extend_from_slice(content);
    out.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route() -> Route {
        Route::new(Method::POST, "/channels/1/messages".into(), "/channels/messages", 1)
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, value.parse().unwrap());
        }
        map
    }

    #[tokio::test(start_paused = true)]
    async fn a_used_up_bucket_waits_for_its_reset() {
        let rest = Rest::new("http://127.0.0.1:1", "t", Duration::from_secs(30)).unwrap();
        let route = route();
        rest.acquire(&route).await;
        rest.observe(
            &route,
            &headers(&[
                ("x-ratelimit-bucket", "abc"),
                ("x-ratelimit-limit", "5"),
                ("x-ratelimit-remaining", "0"),
                ("x-ratelimit-reset-after", "2.5"),
            ]),
        );
        let started = Instant::now();
        rest.acquire(&route).await;
        assert_eq!(started.elapsed(), Duration::from_millis(2500));
        // After the reset the bucket's limit is there again.
        for _ in 0..4 {
            rest.acquire(&route).await;
        }
        assert_eq!(started.elapsed(), Duration::from_millis(2500));
    }

    #[tokio::test(start_paused = true)]
    async fn a_global_429_holds_back_every_route() {
        let rest = Rest::new("http://127.0.0.1:1", "t", Duration::from_secs(30)).unwrap();
        let wait = rest.rate_limited(
            &route(),
            &headers(&[("x-ratelimit-global", "true")]),
            &json!({ "message": "You are being rate limited.", "retry_after": 0.75, "global": true }),
        );
        assert_eq!(wait, Duration::from_millis(750));
        let other = Route::new(Method::GET, "/channels/2".into(), "/channels", 2);
        let started = Instant::now();
        rest.acquire(&other).await;
        assert_eq!(started.elapsed(), Duration::from_millis(750));
    }

    #[tokio::test(start_paused = true)]
    async fn a_route_429_takes_retry_after_from_the_body_or_the_header() {
        let rest = Rest::new("http://127.0.0.1:1", "t", Duration::from_secs(30)).unwrap();
        let from_header =
            rest.rate_limited(&route(), &headers(&[("retry-after", "3")]), &Value::Null);
        assert_eq!(from_header, Duration::from_secs(3));
        let started = Instant::now();
        rest.acquire(&route()).await;
        assert_eq!(started.elapsed(), Duration::from_secs(3));
        // Another channel is another bucket: it does not wait.
        let other =
            Route::new(Method::POST, "/channels/9/messages".into(), "/channels/messages", 9);
        let started = Instant::now();
        rest.acquire(&other).await;
        assert_eq!(started.elapsed(), Duration::ZERO);
    }

    /// A stand-in for Discord's message create that keeps every body it got and
    /// leaves the first call unanswered for `hold`.
    async fn stand_in(hold: Duration) -> (String, Arc<Mutex<Vec<Value>>>) {
        let seen: Arc<Mutex<Vec<Value>>> = Arc::default();
        let record = seen.clone();
        let app = axum::Router::new().route(
            "/channels/{channel}/messages",
            axum::routing::post(move |axum::Json(body): axum::Json<Value>| {
                let record = record.clone();
                async move {
                    let first = {
                        let mut seen = record.lock().unwrap();
                        seen.push(body);
                        seen.len() == 1
                    };
                    if first {
                        tokio::time::sleep(hold).await;
                    }
                    axum::Json(json!({
                        "id": "11", "channel_id": "1", "content": "hi",
                        "author": { "id": "2", "username": "bot", "bot": true },
                    }))
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        (url, seen)
    }

    #[tokio::test]
    async fn a_create_that_outlasts_the_timeout_fails_and_its_retry_carries_the_same_nonce() {
        let (url, seen) = stand_in(Duration::from_secs(30)).await;
        let rest = Rest::new(&url, "t", Duration::from_millis(300)).unwrap();
        let message = CreateMessage {
            channel_id: Snowflake(1),
            content: "hi".into(),
            reply_to: None,
            nonce: super::super::types::nonce("dc_5:part:0"),
            buttons: Vec::new(),
        };
        let error = rest.create_message(&message).await.unwrap_err();
        assert_eq!(error, DiscordError::Network("timed out".into()));
        assert!(error.is_retryable(), "the outbox makes it again");
        let made = rest.create_message(&message).await.unwrap();
        assert_eq!(made.id, Snowflake(11));
        let seen = seen.lock().unwrap().clone();
        assert_eq!(seen.len(), 2);
        for body in &seen {
            assert_eq!(body["nonce"], json!(message.nonce), "{body}");
            assert_eq!(body["enforce_nonce"], json!(true), "{body}");
        }
    }

    #[test]
    fn a_multipart_body_has_the_payload_and_the_file() {
        let file = CreateFile {
            channel_id: Snowflake(1),
            path: "/x/report.txt".into(),
            filename: "re\"port.txt".into(),
            mime: "text/plain".into(),
            caption: None,
            nonce: "n".into(),
        };
        let boundary = boundary_for(b"hello");
        let body = multipart(&boundary, &json!({"content": ""}), &file, b"hello");
        let text = String::from_utf8(body).unwrap();
        assert!(text.contains("name=\"payload_json\""));
        assert!(text.contains("name=\"files[0]\"; filename=\"re_port.txt\""));
        assert!(text.contains("\r\n\r\nhello\r\n"));
        assert!(text.ends_with(&format!("--{boundary}--\r\n")));
    }
}
