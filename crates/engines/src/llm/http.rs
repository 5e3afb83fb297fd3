//! What the three wire protocols share: the POST of a streaming request, the
//! typed errors read from a refused request or a streamed error, and the
//! driver turning a response body into [`LlmEvent`]s through a protocol's
//! [`Decoder`], with the stall timeout on every read.

use std::collections::VecDeque;
use std::time::{Duration, SystemTime};

use futures::stream::{self, BoxStream, StreamExt};
use lemon_core::secrets::SecretValue;
use reqwest::header::{HeaderMap, HeaderValue};

use super::sse::{SseEvent, SseParser};
use super::{LlmError, LlmEvent, LlmStream};

/// The most of an error body read: provider error bodies are a few hundred bytes.
const MAX_ERROR_BODY: usize = 64 * 1024;

/// The most of a provider's message kept in an error.
const MAX_MESSAGE_CHARS: usize = 1000;

/// The markers (lowercase) that make an error text a context overflow: the
/// router's list, and the phrases Anthropic and OpenAI-compatible servers use.
const OVERFLOW_MARKERS: [&str; 16] = [
    "context_length_exceeded",
    "context length exceeded",
    "context window",
    "http 413",
    "payload too large",
    "request entity too large",
    "string too long",
    "maximum length",
    "invalid 'input[",
    "input[",
    "prompt is too long",
    "exceed context limit",
    "maximum context length",
    "model_context_window_exceeded",
    "request_too_large",
    "too many tokens",
];

/// Whether an error text (a body, a code, a message) says the request does not
/// fit the model's context window.
pub fn is_context_overflow(text: &str) -> bool {
    let lower = text.to_lowercase();
    OVERFLOW_MARKERS.iter().any(|marker| lower.contains(marker))
}

/// How a provider takes the API key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KeyHeader {
    /// `Authorization: Bearer <key>` (OpenAI and compatible servers).
    Bearer,
    /// `x-api-key: <key>` and `anthropic-version` (Anthropic).
    Anthropic,
}

/// The version header Anthropic's Messages API requires.
pub(crate) const ANTHROPIC_VERSION: &str = "2023-06-01";

/// One provider endpoint: the HTTP client, the key and the stall timeout.
/// `Debug` shows no key.
#[derive(Debug, Clone)]
pub(crate) struct Endpoint {
    pub(crate) client: reqwest::Client,
    pub(crate) url: String,
    pub(crate) api_key: SecretValue,
    pub(crate) key_header: KeyHeader,
    pub(crate) stall_timeout: Duration,
}

/// A protocol's reading of SSE events into turn events.
pub(crate) trait Decoder: Send + 'static {
    /// Reads one event, appending what it completes to `out`. `Ok(true)` when
    /// the turn is over (the rest of the body is not read).
    fn event(&mut self, event: SseEvent, out: &mut Vec<LlmEvent>) -> Result<bool, LlmError>;

    /// The body ended before an event said the turn was over.
    fn end(&mut self, out: &mut Vec<LlmEvent>) -> Result<(), LlmError>;
}

impl Endpoint {
    /// POSTs `body` and, once the provider accepted it, streams the turn
    /// through `decoder`.
    pub(crate) async fn stream<D: Decoder, B: serde::Serialize + ?Sized>(
        &self,
        body: &B,
        decoder: D,
    ) -> Result<LlmStream, LlmError> {
        let mut request = self
            .client
            .post(&self.url)
            .header(reqwest::header::ACCEPT, "text/event-stream")
            .json(body);
        let key = self.api_key.expose();
        match self.key_header {
            KeyHeader::Bearer if !key.is_empty() => {
                request = request
                    .header(reqwest::header::AUTHORIZATION, sensitive(&format!("Bearer {key}"))?);
            }
            KeyHeader::Bearer => {}
            KeyHeader::Anthropic => {
                if !key.is_empty() {
                    request = request.header("x-api-key", sensitive(key)?);
                }
                request = request.header("anthropic-version", ANTHROPIC_VERSION);
            }
        }
        let response = match tokio::time::timeout(self.stall_timeout, request.send()).await {
            Err(_) => return Err(LlmError::Stalled),
            Ok(Err(error)) => return Err(self.redact(network_error(&error))),
            Ok(Ok(response)) => response,
        };
        let status = response.status();
        if !status.is_success() {
            let headers = response.headers().clone();
            let body = self.read_error_body(response).await?;
            return Err(self.redact(error_from_response(status.as_u16(), &headers, &body)));
        }
        Ok(drive(
            response.bytes_stream().boxed(),
            decoder,
            self.stall_timeout,
            self.api_key.clone(),
        ))
    }

    async fn read_error_body(&self, mut response: reqwest::Response) -> Result<String, LlmError> {
        let mut body = Vec::new();
        loop {
            match tokio::time::timeout(self.stall_timeout, response.chunk()).await {
                Err(_) => return Err(LlmError::Stalled),
                Ok(Err(error)) => return Err(self.redact(network_error(&error))),
                Ok(Ok(None)) => break,
                Ok(Ok(Some(chunk))) => {
                    let room = MAX_ERROR_BODY - body.len();
                    body.extend_from_slice(&chunk[..chunk.len().min(room)]);
                    if body.len() >= MAX_ERROR_BODY {
                        break;
                    }
                }
            }
        }
        Ok(String::from_utf8_lossy(&body).into_owned())
    }

    fn redact(&self, error: LlmError) -> LlmError {
        redact(error, &self.api_key)
    }
}

fn sensitive(value: &str) -> Result<HeaderValue, LlmError> {
    let mut value = HeaderValue::from_str(value).map_err(|_| LlmError::Invalid {
        message: "the API key holds characters an HTTP header cannot carry".to_owned(),
    })?;
    value.set_sensitive(true);
    Ok(value)
}

/// `error` with every copy of the key in its message replaced by `***`.
pub(crate) fn redact(error: LlmError, key: &SecretValue) -> LlmError {
    let key = key.expose();
    if key.is_empty() {
        return error;
    }
    let clean = |message: String| message.replace(key, "***");
    match error {
        LlmError::Auth { message } => LlmError::Auth { message: clean(message) },
        LlmError::RateLimited { retry_after, message } => {
            LlmError::RateLimited { retry_after, message: clean(message) }
        }
        LlmError::ContextOverflow { message } => {
            LlmError::ContextOverflow { message: clean(message) }
        }
        LlmError::Server { status, message } => {
            LlmError::Server { status, message: clean(message) }
        }
        LlmError::Network { message } => LlmError::Network { message: clean(message) },
        LlmError::Invalid { message } => LlmError::Invalid { message: clean(message) },
        LlmError::Stalled => LlmError::Stalled,
    }
}

/// A connect, reset or body error, with its causes and without the URL.
pub(crate) fn network_error(error: &reqwest::Error) -> LlmError {
    let mut message = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    LlmError::Network { message }
}

fn truncate(message: &str) -> String {
    match message.char_indices().nth(MAX_MESSAGE_CHARS) {
        Some((at, _)) => format!("{}…", &message[..at]),
        None => message.to_owned(),
    }
}

/// The `{"error": {"message", "type", "code"}}` of OpenAI and Anthropic bodies
/// (also `{"error": "text"}` and `{"message": …}` of compatible servers):
/// the message, the type and the code.
pub(crate) fn error_fields(value: &serde_json::Value) -> (String, Option<String>, Option<String>) {
    let text = |v: Option<&serde_json::Value>| v.and_then(|v| v.as_str()).map(str::to_owned);
    let code = |v: Option<&serde_json::Value>| match v {
        Some(serde_json::Value::String(s)) => Some(s.clone()),
        Some(serde_json::Value::Number(n)) => Some(n.to_string()),
        _ => None,
    };
    match value.get("error") {
        Some(serde_json::Value::String(message)) => (message.clone(), None, None),
        Some(error) => (
            text(error.get("message")).unwrap_or_default(),
            text(error.get("type")),
            code(error.get("code")),
        ),
        None => (
            text(value.get("message")).unwrap_or_default(),
            text(value.get("type")),
            code(value.get("code")),
        ),
    }
}

/// The typed error of a refused request.
pub(crate) fn error_from_response(status: u16, headers: &HeaderMap, body: &str) -> LlmError {
    let parsed: Option<serde_json::Value> = serde_json::from_str(body).ok();
    let (message, kind, code) = parsed.as_ref().map(error_fields).unwrap_or_default();
    let message = if message.is_empty() {
        let body = body.trim();
        if body.is_empty() {
            format!("HTTP {status}")
        } else {
            truncate(body)
        }
    } else {
        truncate(&message)
    };
    match status {
        401 | 403 => LlmError::Auth { message },
        429 => LlmError::RateLimited { retry_after: retry_after(headers), message },
        400 | 413 if status == 413 || is_context_overflow(body) => {
            LlmError::ContextOverflow { message }
        }
        500..=599 => LlmError::Server { status, message },
        _ => {
            // An overloaded or rate-limit type under another status (some
            // proxies) keeps its meaning.
            if kind.is_none() && code.is_none() {
                return LlmError::Invalid { message };
            }
            match error_from_kind(kind.as_deref(), code.as_deref(), &message) {
                error @ (LlmError::Server { status: 503 | 529, .. }
                | LlmError::RateLimited { .. }) => error,
                _ => LlmError::Invalid { message },
            }
        }
    }
}

/// The typed error of an error a stream carried: by its type and code, and by
/// the overflow markers in any of its texts.
pub(crate) fn error_from_kind(kind: Option<&str>, code: Option<&str>, message: &str) -> LlmError {
    let message = truncate(message);
    let names = [kind.unwrap_or_default(), code.unwrap_or_default()];
    let named = |wanted: &[&str]| names.iter().any(|name| wanted.contains(name));
    if names.iter().any(|name| is_context_overflow(name)) || is_context_overflow(&message) {
        return LlmError::ContextOverflow { message };
    }
    if named(&["authentication_error", "permission_error", "invalid_api_key"]) {
        LlmError::Auth { message }
    } else if named(&["rate_limit_error", "rate_limit_exceeded", "insufficient_quota"]) {
        LlmError::RateLimited { retry_after: None, message }
    } else if named(&["overloaded_error"]) {
        LlmError::Server { status: 529, message }
    } else if named(&[
        "invalid_request_error",
        "not_found_error",
        "billing_error",
        "invalid_prompt",
    ]) {
        LlmError::Invalid { message }
    } else if named(&["server_is_overloaded", "slow_down"]) {
        LlmError::Server { status: 503, message }
    } else {
        LlmError::Server { status: 500, message }
    }
}

/// How long a 429 asks to wait: `retry-after-ms`, else `Retry-After` in
/// seconds or as an HTTP date.
pub(crate) fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::trim);
    if let Some(ms) = header("retry-after-ms").and_then(|v| v.parse::<f64>().ok()) {
        if ms.is_finite() && ms >= 0.0 {
            return Some(Duration::from_secs_f64(ms / 1000.0));
        }
    }
    let value = header("retry-after")?;
    if let Ok(secs) = value.parse::<f64>() {
        return (secs.is_finite() && secs >= 0.0).then(|| Duration::from_secs_f64(secs));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(SystemTime::now()).unwrap_or(Duration::ZERO))
}

/// What the driver carries between reads.
struct Drive<D> {
    body: BoxStream<'static, reqwest::Result<bytes::Bytes>>,
    parser: SseParser,
    decoder: D,
    stall: Duration,
    key: SecretValue,
    pending: VecDeque<Result<LlmEvent, LlmError>>,
    over: bool,
}

impl<D: Decoder> Drive<D> {
    fn fail(&mut self, error: LlmError) {
        self.pending.push_back(Err(redact(error, &self.key)));
        self.over = true;
    }

    fn decode(&mut self, events: Vec<SseEvent>) {
        let mut out = Vec::new();
        for event in events {
            match self.decoder.event(event, &mut out) {
                Ok(false) => {}
                Ok(true) => {
                    self.over = true;
                    break;
                }
                Err(error) => {
                    self.pending.extend(out.drain(..).map(Ok));
                    self.fail(error);
                    return;
                }
            }
        }
        self.pending.extend(out.into_iter().map(Ok));
    }

    /// Reads until there is an event to give or the turn is over.
    async fn advance(&mut self) {
        while self.pending.is_empty() && !self.over {
            let mut events = Vec::new();
            match tokio::time::timeout(self.stall, self.body.next()).await {
                Err(_) => self.fail(LlmError::Stalled),
                Ok(Some(Err(error))) => self.fail(network_error(&error)),
                Ok(Some(Ok(chunk))) => match self.parser.feed(&chunk, &mut events) {
                    Ok(()) => self.decode(events),
                    Err(error) => {
                        self.decode(events);
                        self.fail(LlmError::Invalid { message: error.to_string() });
                    }
                },
                Ok(None) => {
                    if let Err(error) = self.parser.finish(&mut events) {
                        self.fail(LlmError::Invalid { message: error.to_string() });
                        continue;
                    }
                    self.decode(events);
                    if !self.over {
                        let mut out = Vec::new();
                        let ended = self.decoder.end(&mut out);
                        self.pending.extend(out.into_iter().map(Ok));
                        match ended {
                            Ok(()) => self.over = true,
                            Err(error) => self.fail(error),
                        }
                    }
                }
            }
        }
    }
}

/// The turn `body` streams, read by `decoder`; no byte for `stall` is
/// [`LlmError::Stalled`].
pub(crate) fn drive<D: Decoder>(
    body: BoxStream<'static, reqwest::Result<bytes::Bytes>>,
    decoder: D,
    stall: Duration,
    key: SecretValue,
) -> LlmStream {
    let state = Drive {
        body,
        parser: SseParser::default(),
        decoder,
        stall,
        key,
        pending: VecDeque::new(),
        over: false,
    };
    Box::pin(stream::unfold(state, |mut state| async move {
        state.advance().await;
        let item = state.pending.pop_front()?;
        Some((item, state))
    }))
}

/// A streamed `error` event (Anthropic's and the Responses API's share a shape)
/// as the typed error; the generic type `error` says nothing and is dropped.
pub(crate) fn stream_error(value: &serde_json::Value) -> LlmError {
    let (message, kind, code) = error_fields(value);
    let kind = kind.filter(|k| k != "error");
    error_from_kind(kind.as_deref(), code.as_deref(), &message)
}

/// The decoded events of a stream that must not fail, for the protocols' unit tests.
#[cfg(test)]
pub(crate) fn ok(events: Vec<Result<LlmEvent, LlmError>>) -> Vec<LlmEvent> {
    events.into_iter().map(|e| e.expect("no error")).collect()
}

/// The events `lines` (a literal event stream) decode to, for the protocols'
/// unit tests.
#[cfg(test)]
pub(crate) fn decode_all<D: Decoder>(
    mut decoder: D,
    stream: &str,
) -> Vec<Result<LlmEvent, LlmError>> {
    let mut parser = SseParser::default();
    let mut events = Vec::new();
    parser.feed(stream.as_bytes(), &mut events).expect("a valid event stream");
    parser.finish(&mut events).expect("a valid event stream");
    let mut results = Vec::new();
    for event in events {
        let mut out = Vec::new();
        let step = decoder.event(event, &mut out);
        results.extend(out.into_iter().map(Ok));
        match step {
            Ok(false) => {}
            Ok(true) => return results,
            Err(error) => {
                results.push(Err(error));
                return results;
            }
        }
    }
    let mut out = Vec::new();
    let ended = decoder.end(&mut out);
    results.extend(out.into_iter().map(Ok));
    if let Err(error) = ended {
        results.push(Err(error));
    }
    results
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, HeaderValue::from_str(value).expect("a header value"));
        }
        map
    }

    #[test]
    fn statuses_map_to_typed_errors() {
        let none = HeaderMap::new();
        let openai = r#"{"error":{"message":"Incorrect API key provided","type":"invalid_request_error","param":null,"code":"invalid_api_key"}}"#;
        assert_eq!(
            error_from_response(401, &none, openai),
            LlmError::Auth { message: "Incorrect API key provided".to_owned() }
        );
        assert!(matches!(error_from_response(403, &none, "{}"), LlmError::Auth { .. }));
        let overflow = r#"{"error":{"message":"This model's maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}"#;
        assert!(matches!(
            error_from_response(400, &none, overflow),
            LlmError::ContextOverflow { message } if message.starts_with("This model's maximum")
        ));
        let anthropic = r#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 208656 tokens > 200000 maximum"},"request_id":"req_1"}"#;
        assert!(matches!(
            error_from_response(400, &none, anthropic),
            LlmError::ContextOverflow { .. }
        ));
        assert!(matches!(error_from_response(413, &none, ""), LlmError::ContextOverflow { .. }));
        let bad = r#"{"type":"error","error":{"type":"invalid_request_error","message":"max_tokens: field required"}}"#;
        assert_eq!(
            error_from_response(400, &none, bad),
            LlmError::Invalid { message: "max_tokens: field required".to_owned() }
        );
        let overloaded =
            r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#;
        assert_eq!(
            error_from_response(529, &none, overloaded),
            LlmError::Server { status: 529, message: "Overloaded".to_owned() }
        );
        assert_eq!(
            error_from_response(502, &none, "<html>bad gateway</html>"),
            LlmError::Server { status: 502, message: "<html>bad gateway</html>".to_owned() }
        );
        assert_eq!(
            error_from_response(404, &none, ""),
            LlmError::Invalid { message: "HTTP 404".to_owned() }
        );
    }

    #[test]
    fn retry_after_reads_milliseconds_seconds_and_dates() {
        assert_eq!(
            retry_after(&headers(&[("retry-after-ms", "1500"), ("retry-after", "9")])),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(retry_after(&headers(&[("retry-after", "7")])), Some(Duration::from_secs(7)));
        let later = httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(120));
        let wait = retry_after(&headers(&[("retry-after", &later)])).expect("a date");
        assert!(wait > Duration::from_secs(100) && wait <= Duration::from_secs(120), "{wait:?}");
        assert_eq!(
            retry_after(&headers(&[("retry-after", "Sun, 06 Nov 1994 08:49:37 GMT")])),
            Some(Duration::ZERO)
        );
        assert_eq!(retry_after(&headers(&[("retry-after", "soon")])), None);
        assert_eq!(retry_after(&headers(&[("retry-after", "-3")])), None);
        assert_eq!(retry_after(&HeaderMap::new()), None);
    }

    #[test]
    fn a_429_carries_its_retry_after() {
        let error = error_from_response(
            429,
            &headers(&[("retry-after", "3")]),
            r#"{"error":{"message":"Rate limit reached","type":"requests","code":"rate_limit_exceeded"}}"#,
        );
        assert_eq!(
            error,
            LlmError::RateLimited {
                retry_after: Some(Duration::from_secs(3)),
                message: "Rate limit reached".to_owned()
            }
        );
    }

    #[test]
    fn the_key_is_taken_out_of_messages() {
        let key = SecretValue::new("sk-secret-123");
        let error =
            LlmError::Auth { message: "Incorrect API key provided: sk-secret-123.".to_owned() };
        assert_eq!(
            redact(error, &key),
            LlmError::Auth { message: "Incorrect API key provided: ***.".to_owned() }
        );
    }

    #[test]
    fn streamed_error_kinds_map_to_typed_errors() {
        assert_eq!(
            error_from_kind(Some("overloaded_error"), None, "Overloaded"),
            LlmError::Server { status: 529, message: "Overloaded".to_owned() }
        );
        assert!(matches!(
            error_from_kind(Some("invalid_request_error"), Some("context_length_exceeded"), "x"),
            LlmError::ContextOverflow { .. }
        ));
        assert!(matches!(
            error_from_kind(None, Some("rate_limit_exceeded"), "slow"),
            LlmError::RateLimited { retry_after: None, .. }
        ));
        assert!(matches!(
            error_from_kind(Some("invalid_request_error"), None, "bad"),
            LlmError::Invalid { .. }
        ));
        assert!(matches!(
            error_from_kind(Some("server_error"), None, "oops"),
            LlmError::Server { status: 500, .. }
        ));
    }
}
