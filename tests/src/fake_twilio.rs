//! A fake Twilio on loopback: the REST API's message create
//! (`POST /2010-04-01/Accounts/{AccountSid}/Messages.json`, form fields `To`,
//! `From`, `Body`, HTTP basic auth with the account SID and auth token), and
//! the other half of Twilio's part, signing inbound SMS webhooks the way
//! Twilio does (HMAC-SHA1 over the URL and the sorted form parameters).
//!
//! Requests are read with this module's own parsing and answered with the JSON
//! Twilio's docs show (a `201` message resource; error bodies with `code`,
//! `message`, `more_info`, `status`). A test scripts failures ahead of the
//! next creates ([`FakeTwilio::fail_next`]): error answers, and connection
//! faults (a late answer, a connection closed without one, a call held open
//! and never answered, before or after the message is made); every request is
//! recorded with when it came. Twilio's create has no idempotency key: a
//! create made again makes another message, here as there.
//!
//! It serves MMS media as Twilio does: `GET
//! /2010-04-01/Accounts/{AccountSid}/Messages/{MessageSid}/Media/{MediaSid}`
//! with the account's basic auth (else `401`) answers a `307` to the file on
//! the fake's "CDN" (`/cdn/{MediaSid}`), served without auth
//! ([`FakeTwilio::add_media`], [`FakeTwilio::media_fetches`]).
//!
//! Two creates to one number less than a second apart are recorded as a
//! violation ([`FakeTwilio::violations`]): the pace the gateway promises per
//! recipient (Twilio itself queues what a number cannot send at once).

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use serde_json::json;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// A scripted answer to the next create.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// `429` with `Retry-After: <secs>` and error 20429.
    TooManyRequests { retry_after_secs: u64 },
    /// `500` with error 20500.
    ServerError,
    /// `400` with error 21211 (an invalid `To`).
    InvalidTo,
    /// Network latency: the create reaches the fake this much later (it is
    /// recorded and answered then, as usual).
    Delay(Duration),
    /// The connection is closed without an answer; no message is made.
    Drop,
    /// The create is held open and never answered, until the client gives up
    /// or the fake stops; `applied` says whether the message was made first
    /// (Twilio took it and the answer never came) or not.
    Hang { applied: bool },
}

/// One request the fake received.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub path: String,
    /// Whether its basic auth named the fake's account and token.
    pub authorized: bool,
    /// The form fields, in order.
    pub form: Vec<(String, String)>,
    /// The status it was answered with; for one never answered, 201 when the
    /// message was made, else 0.
    pub status: u16,
    /// Whether the client got an answer.
    pub answered: bool,
    /// When it came (for a delayed create, when the delay was over).
    pub at: Instant,
}

impl Recorded {
    /// The first value of form field `name`.
    pub fn field(&self, name: &str) -> Option<&str> {
        self.form.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }
}

/// One fetch of a media URL or of its file on the CDN.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MediaFetch {
    pub path: String,
    /// Whether it carried the account's basic auth.
    pub authorized: bool,
    pub status: u16,
}

#[derive(Debug, Default)]
struct Inner {
    /// Media SID → (content type, bytes).
    media: std::collections::HashMap<String, (String, Vec<u8>)>,
    media_fetches: Vec<MediaFetch>,
    failures: VecDeque<Failure>,
    recorded: Vec<Recorded>,
    next_sid: u64,
    violations: Vec<String>,
}

#[derive(Clone)]
struct Shared {
    account_sid: String,
    auth_token: String,
    inner: Arc<Mutex<Inner>>,
    changed: watch::Sender<usize>,
    stop: CancellationToken,
}

/// The least time between two creates to one number.
const PER_NUMBER_INTERVAL: Duration = Duration::from_secs(1);

/// The fake, serving until dropped.
#[derive(Debug)]
pub struct FakeTwilio {
    addr: SocketAddr,
    inner: Arc<Mutex<Inner>>,
    changed: watch::Receiver<usize>,
    stop: CancellationToken,
}

impl Drop for FakeTwilio {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

fn twilio_error(status: StatusCode, code: u32, message: &str) -> Response {
    let body = json!({
        "code": code,
        "message": message,
        "more_info": format!("https://www.twilio.com/docs/errors/{code}"),
        "status": status.as_u16(),
    });
    (status, [(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
}

/// `user`, `password` of a `Basic` authorization header.
fn basic_auth(headers: &HeaderMap) -> Option<(String, String)> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let encoded = value.strip_prefix("Basic ")?;
    let decoded = base64::engine::general_purpose::STANDARD.decode(encoded.trim()).ok()?;
    let text = String::from_utf8(decoded).ok()?;
    let (user, password) = text.split_once(':')?;
    Some((user.to_owned(), password.to_owned()))
}

/// `application/x-www-form-urlencoded` into pairs (`+` is a space, `%XX` a byte).
pub fn parse_form(body: &[u8]) -> Vec<(String, String)> {
    fn decode(raw: &str) -> String {
        let bytes = raw.as_bytes();
        let mut out = Vec::with_capacity(bytes.len());
        let mut i = 0;
        while i < bytes.len() {
            match bytes[i] {
                b'+' => out.push(b' '),
                b'%' if i + 2 < bytes.len() => {
                    let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("zz");
                    match u8::from_str_radix(hex, 16) {
                        Ok(byte) => {
                            out.push(byte);
                            i += 2;
                        }
                        Err(_) => out.push(b'%'),
                    }
                }
                byte => out.push(byte),
            }
            i += 1;
        }
        String::from_utf8_lossy(&out).into_owned()
    }
    let text = String::from_utf8_lossy(body);
    text.split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (decode(k), decode(v))
        })
        .collect()
}

/// An answer whose body fails before its first byte: the connection is closed
/// and the client sees it end without a response.
fn dropped_connection() -> Response {
    let failing = futures::stream::once(async {
        Err::<Bytes, std::io::Error>(std::io::Error::other("connection dropped by the fake"))
    });
    Response::new(axum::body::Body::from_stream(failing))
}

/// The message resource Twilio answers a create with (`201`).
fn created(inner: &mut Inner, account: &str, form: &[(String, String)]) -> Response {
    let field = |name: &str| form.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
    inner.next_sid += 1;
    let sid = format!("SM{:032x}", inner.next_sid);
    let body = json!({
        "account_sid": account,
        "api_version": "2010-04-01",
        "body": field("Body"),
        "date_created": "Thu, 24 Aug 2023 05:01:45 +0000",
        "date_sent": null,
        "date_updated": "Thu, 24 Aug 2023 05:01:45 +0000",
        "direction": "outbound-api",
        "error_code": null,
        "error_message": null,
        "from": field("From"),
        "messaging_service_sid": null,
        "num_media": "0",
        "num_segments": "1",
        "price": null,
        "price_unit": "USD",
        "sid": sid,
        "status": "queued",
        "subresource_uris": {
            "media": format!("/2010-04-01/Accounts/{account}/Messages/{sid}/Media.json")
        },
        "to": field("To"),
        "uri": format!("/2010-04-01/Accounts/{account}/Messages/{sid}.json"),
    });
    (StatusCode::CREATED, [(header::CONTENT_TYPE, "application/json")], body.to_string())
        .into_response()
}

/// The answer to a create that reached the fake, `None` when it makes no
/// message and gets no answer.
fn answer(
    inner: &mut Inner,
    account: &str,
    authorized: bool,
    failure: Option<&Failure>,
    form: &[(String, String)],
) -> Option<Response> {
    let has = |name: &str| form.iter().any(|(k, _)| k == name);
    Some(match failure {
        _ if !authorized => twilio_error(StatusCode::UNAUTHORIZED, 20003, "Authenticate"),
        Some(Failure::TooManyRequests { retry_after_secs }) => {
            let mut response =
                twilio_error(StatusCode::TOO_MANY_REQUESTS, 20429, "Too Many Requests");
            response.headers_mut().insert(
                header::RETRY_AFTER,
                retry_after_secs.to_string().parse().expect("a header value"),
            );
            response
        }
        Some(Failure::ServerError) => {
            twilio_error(StatusCode::INTERNAL_SERVER_ERROR, 20500, "Internal Server Error")
        }
        Some(Failure::InvalidTo) => twilio_error(
            StatusCode::BAD_REQUEST,
            21211,
            "The 'To' number is not a valid phone number.",
        ),
        Some(Failure::Drop | Failure::Hang { applied: false }) => return None,
        _ if !(has("To") && has("Body") && has("From")) => {
            twilio_error(StatusCode::BAD_REQUEST, 21604, "A 'To' phone number is required.")
        }
        Some(Failure::Delay(_) | Failure::Hang { applied: true }) | None => {
            created(inner, account, form)
        }
    })
}

async fn create(
    State(shared): State<Shared>,
    Path(account): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let form = parse_form(&body);
    let authorized = basic_auth(&headers).is_some_and(|(user, password)| {
        user == shared.account_sid && password == shared.auth_token
    }) && account == shared.account_sid;
    let path = format!("/2010-04-01/Accounts/{account}/Messages.json");
    let failure = if authorized {
        shared.inner.lock().unwrap_or_else(PoisonError::into_inner).failures.pop_front()
    } else {
        None
    };
    if let Some(Failure::Delay(latency)) = &failure {
        tokio::time::sleep(*latency).await;
    }
    let answered = !matches!(failure, Some(Failure::Drop | Failure::Hang { .. }));
    let (response, count) = {
        let mut inner = shared.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let response = answer(&mut inner, &account, authorized, failure.as_ref(), &form);
        let status = response.as_ref().map_or(0, |r| r.status().as_u16());
        let at = Instant::now();
        if let Some(to) = form.iter().find(|(k, _)| k == "To").map(|(_, v)| v.clone()) {
            let previous = inner.recorded.iter().rev().find(|r| r.field("To") == Some(to.as_str()));
            let gap = previous.map(|p| at - p.at).filter(|gap| *gap < PER_NUMBER_INTERVAL);
            if let Some(gap) = gap {
                inner.violations.push(format!("two creates to {to} {gap:?} apart"));
            }
        }
        inner.recorded.push(Recorded { path, authorized, form, status, answered, at });
        (response, inner.recorded.len())
    };
    shared.changed.send_replace(count);
    match response {
        Some(response) if answered => response,
        _ => {
            if matches!(failure, Some(Failure::Hang { .. })) {
                shared.stop.cancelled().await;
            }
            dropped_connection()
        }
    }
}

/// A media URL: the account's basic auth, then a redirect to the CDN.
async fn media(
    State(shared): State<Shared>,
    Path((account, message, media)): Path<(String, String, String)>,
    headers: HeaderMap,
) -> Response {
    let authorized = basic_auth(&headers).is_some_and(|(user, password)| {
        user == shared.account_sid && password == shared.auth_token
    }) && account == shared.account_sid;
    let mut inner = shared.inner.lock().unwrap_or_else(PoisonError::into_inner);
    let known = inner.media.contains_key(&media);
    let response = match (authorized, known) {
        (false, _) => twilio_error(StatusCode::UNAUTHORIZED, 20003, "Authenticate"),
        (true, false) => twilio_error(StatusCode::NOT_FOUND, 20404, "Not Found"),
        (true, true) => {
            (StatusCode::TEMPORARY_REDIRECT, [(header::LOCATION, format!("/cdn/{media}"))])
                .into_response()
        }
    };
    let path = format!("/2010-04-01/Accounts/{account}/Messages/{message}/Media/{media}");
    inner.media_fetches.push(MediaFetch { path, authorized, status: response.status().as_u16() });
    response
}

/// The file behind a media URL, as Twilio's CDN serves it (no auth).
async fn cdn(
    State(shared): State<Shared>,
    Path(media): Path<String>,
    headers: HeaderMap,
) -> Response {
    let mut inner = shared.inner.lock().unwrap_or_else(PoisonError::into_inner);
    let found = inner.media.get(&media).cloned();
    let authorized = headers.contains_key(header::AUTHORIZATION);
    let response = match found {
        Some((content_type, bytes)) => {
            ([(header::CONTENT_TYPE, content_type)], bytes).into_response()
        }
        None => StatusCode::NOT_FOUND.into_response(),
    };
    let path = format!("/cdn/{media}");
    inner.media_fetches.push(MediaFetch { path, authorized, status: response.status().as_u16() });
    response
}

impl FakeTwilio {
    /// Starts the fake on `127.0.0.1` for the account `account_sid` with `auth_token`.
    pub async fn start(account_sid: &str, auth_token: &str) -> FakeTwilio {
        let inner = Arc::new(Mutex::new(Inner::default()));
        let (changed, receiver) = watch::channel(0);
        let stop = CancellationToken::new();
        let shared = Shared {
            account_sid: account_sid.to_owned(),
            auth_token: auth_token.to_owned(),
            inner: inner.clone(),
            changed,
            stop: stop.clone(),
        };
        let app = Router::new()
            .route("/2010-04-01/Accounts/{account}/Messages.json", post(create))
            .route(
                "/2010-04-01/Accounts/{account}/Messages/{message}/Media/{media}",
                axum::routing::get(media),
            )
            .route("/cdn/{media}", axum::routing::get(cdn))
            .with_state(shared);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("a port");
        let addr = listener.local_addr().expect("an address");
        let serve_stop = stop.clone();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async move { serve_stop.cancelled().await })
                .await;
        });
        FakeTwilio { addr, inner, changed: receiver, stop }
    }

    /// The base URL, for `api_base_url`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Keeps a file sent with the inbound message `message_sid` of
    /// `account_sid`; its `MediaUrl`, as the webhook carries it.
    pub fn add_media(
        &self,
        account_sid: &str,
        message_sid: &str,
        content_type: &str,
        bytes: &[u8],
    ) -> String {
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let media_sid = format!("ME{:032x}", inner.media.len() + 1);
        inner.media.insert(media_sid.clone(), (content_type.to_owned(), bytes.to_vec()));
        format!(
            "{}/2010-04-01/Accounts/{account_sid}/Messages/{message_sid}/Media/{media_sid}",
            self.url()
        )
    }

    /// The media URL and CDN fetches so far.
    pub fn media_fetches(&self) -> Vec<MediaFetch> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner).media_fetches.clone()
    }

    /// The next creates fail like this, in order.
    pub fn fail_next(&self, failures: &[Failure]) {
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        inner.failures.extend(failures.iter().cloned());
    }

    /// Every request so far.
    pub fn requests(&self) -> Vec<Recorded> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner).recorded.clone()
    }

    /// The messages made (answered `201`, or made and then never answered).
    pub fn created(&self) -> Vec<Recorded> {
        self.requests().into_iter().filter(|r| r.status == 201).collect()
    }

    /// Creates to one number that came less than a second apart.
    pub fn violations(&self) -> Vec<String> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner).violations.clone()
    }

    /// The requests, one a line with their time from the first, for a failure message.
    pub fn describe(&self) -> String {
        let requests = self.requests();
        let start = requests.first().map(|r| r.at);
        let mut out = String::from("twilio requests:\n");
        for r in &requests {
            let ms = start.map_or(0, |s| r.at.duration_since(s).as_millis());
            let answer = match (r.answered, r.status) {
                (true, status) => status.to_string(),
                (false, 201) => "no answer (message made)".to_owned(),
                (false, _) => "no answer (no message)".to_owned(),
            };
            let to = r.field("To").unwrap_or("?");
            let body = r.field("Body").unwrap_or("");
            out.push_str(&format!("  +{ms}ms To={to} Body={body:?} -> {answer}\n"));
        }
        out
    }

    /// Waits until at least `count` requests were received, at most `patience`.
    ///
    /// # Panics
    /// When they did not come in time.
    pub async fn wait_for_requests(&self, count: usize, patience: Duration) -> Vec<Recorded> {
        let mut changed = self.changed.clone();
        tokio::time::timeout(patience, changed.wait_for(|n| *n >= count))
            .await
            .expect("the requests came in time")
            .expect("the fake is running");
        self.requests()
    }
}

/// The `X-Twilio-Signature` Twilio sends for a form webhook to `url` with
/// `params`: base64 of HMAC-SHA1 keyed by the auth token over the URL followed
/// by every parameter, sorted by name (then value), as `name` + `value`.
pub fn twilio_signature(auth_token: &str, url: &str, params: &[(&str, &str)]) -> String {
    let mut sorted = params.to_vec();
    sorted.sort();
    let mut data = url.to_owned();
    for (name, value) in sorted {
        data.push_str(name);
        data.push_str(value);
    }
    let mut mac =
        Hmac::<sha1::Sha1>::new_from_slice(auth_token.as_bytes()).expect("any key length");
    mac.update(data.as_bytes());
    base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Twilio's documented example (auth token `12345`).
    #[test]
    fn the_signer_matches_twilios_documented_example() {
        let params = [
            ("CallSid", "CA1234567890ABCDE"),
            ("Caller", "+12349013030"),
            ("Digits", "1234"),
            ("From", "+12349013030"),
            ("To", "+18005551212"),
        ];
        let url = "https://mycompany.com/myapp.php?foo=1&bar=2";
        assert_eq!(twilio_signature("12345", url, &params), "0/KCTR6DLpKmkAf8muzZqo1nDgQ=");
    }

    #[test]
    fn forms_are_decoded() {
        let form = parse_form(b"To=%2B15551234567&Body=Your+code+is+1234%21&Empty=");
        assert_eq!(
            form,
            vec![
                ("To".to_owned(), "+15551234567".to_owned()),
                ("Body".to_owned(), "Your code is 1234!".to_owned()),
                ("Empty".to_owned(), String::new()),
            ]
        );
    }
}
