//! The Telegram Bot API client: the handful of calls the transport makes, as JSON
//! POSTs to `{base}/bot{token}/{method}`, with Telegram's error envelope mapped to
//! [`TelegramError`].
//!
//! The bot token is part of every request URL, so it is kept out of everything
//! that can be printed: `Debug` shows `<redacted>`, transport errors are stripped
//! of their URL (and scrubbed of the token as a second line of defence), and no
//! log line mentions a URL.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use reqwest::{StatusCode, Url};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tracing::{debug, warn};

use super::types::{
    BotCommand, CallbackQuery, EditMessageText, FileInfo, Message, SendFile, SendMessage,
    TelegramError, Update, User,
};

#[cfg(test)]
mod tests;

/// Where the real Bot API lives.
pub const DEFAULT_BASE_URL: &str = "https://api.telegram.org";

/// Bound on every call except long polls and uploads.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Bound on a file upload (up to 50 MB).
const UPLOAD_TIMEOUT: Duration = Duration::from_secs(300);
/// Bound on establishing a connection, for every call.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How much longer than its long-poll timeout a `getUpdates` call may take
/// before the client gives up: Telegram answers at the end of the poll, so the
/// HTTP timeout must leave room for the answer to travel.
const POLL_GRACE: Duration = Duration::from_secs(15);
/// The update kinds the transport reads; Telegram keeps this list between calls.
const ALLOWED_UPDATES: [&str; 4] = ["message", "edited_message", "channel_post", "callback_query"];
/// What stands in for the token wherever it would otherwise appear.
const REDACTED: &str = "<redacted>";
/// Longest slice of a non-JSON error body kept in an error description.
const MAX_BODY_IN_ERROR: usize = 200;

/// A client for one bot. Cheap to clone: clones share the connection pool.
#[derive(Clone)]
pub struct BotApi {
    inner: Arc<Inner>,
}

struct Inner {
    http: reqwest::Client,
    /// The base URL as given (without a trailing slash), for `Debug`.
    base_url: String,
    /// `{base}/bot{token}/`: secret, never formatted anywhere but into a request.
    method_prefix: String,
    /// Kept only to scrub it out of error text.
    token: String,
}

impl fmt::Debug for BotApi {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BotApi")
            .field("base_url", &self.inner.base_url)
            .field("token", &REDACTED)
            .finish()
    }
}

/// The Bot API's answer to every call.
#[derive(Debug, Deserialize)]
struct Envelope {
    ok: bool,
    #[serde(default)]
    result: Option<Value>,
    #[serde(default)]
    error_code: Option<u16>,
    #[serde(default)]
    description: Option<String>,
    #[serde(default)]
    parameters: Option<ResponseParameters>,
}

/// `parameters` of an error answer.
#[derive(Debug, Default, Deserialize)]
struct ResponseParameters {
    #[serde(default)]
    retry_after: Option<u64>,
    #[serde(default)]
    migrate_to_chat_id: Option<i64>,
}

#[derive(Debug, Serialize)]
struct GetUpdatesParams<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    offset: Option<i64>,
    limit: u8,
    timeout: u64,
    allowed_updates: &'a [&'a str],
}

#[derive(Debug, Serialize)]
struct DeleteWebhookParams {
    drop_pending_updates: bool,
}

#[derive(Debug, Serialize)]
struct SetMyCommandsParams<'a> {
    commands: &'a [BotCommand],
}

#[derive(Debug, Serialize)]
struct NoParams {}

impl BotApi {
    /// A client for the bot with `token`, calling `{base_url}/bot{token}/{method}`.
    /// `base_url` is [`DEFAULT_BASE_URL`] in production, or a local server in tests;
    /// it may carry a path prefix but no query or fragment.
    ///
    /// # Errors
    /// [`TelegramError::Unauthorized`] when the token is empty or has characters a
    /// Bot API token never has (they would change the URL);
    /// [`TelegramError::InvalidBaseUrl`] when `base_url` is not an http(s) URL;
    /// [`TelegramError::Network`] when the HTTP client cannot be built.
    pub fn new(base_url: &str, token: &str) -> Result<Self, TelegramError> {
        if token.is_empty()
            || !token.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, ':' | '_' | '-'))
        {
            return Err(TelegramError::Unauthorized {
                description: "the bot token is empty or has characters a token cannot have"
                    .to_owned(),
            });
        }
        let base_url = base_url.trim().trim_end_matches('/');
        let parsed =
            Url::parse(base_url).map_err(|e| TelegramError::InvalidBaseUrl(e.to_string()))?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(TelegramError::InvalidBaseUrl("the scheme must be http or https".into()));
        }
        if parsed.query().is_some() || parsed.fragment().is_some() {
            return Err(TelegramError::InvalidBaseUrl(
                "the URL must not have a query or a fragment".into(),
            ));
        }
        let http = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .build()
            .map_err(|e| TelegramError::Network(describe(e)))?;
        Ok(BotApi {
            inner: Arc::new(Inner {
                http,
                base_url: base_url.to_owned(),
                method_prefix: format!("{base_url}/bot{token}/"),
                token: token.to_owned(),
            }),
        })
    }

    /// `getMe`: the bot's own user, which also proves the token works.
    ///
    /// # Errors
    /// See [`TelegramError`]; a wrong token gives [`TelegramError::Unauthorized`].
    ///
    /// # Cancel safety
    /// Cancel safe: the call has no effect on Telegram's side.
    pub async fn get_me(&self) -> Result<User, TelegramError> {
        self.call_typed("getMe", &NoParams {}, REQUEST_TIMEOUT).await
    }

    /// `deleteWebhook`, keeping pending updates, so that `getUpdates` may be used.
    ///
    /// # Errors
    /// See [`TelegramError`].
    ///
    /// # Cancel safety
    /// Cancel safe: deleting the webhook twice is harmless.
    pub async fn delete_webhook(&self) -> Result<(), TelegramError> {
        self.delete_webhook_with(false).await
    }

    /// `deleteWebhook` with `drop_pending_updates`: also drops, for good, the
    /// updates waiting to be fetched (what came while the bot was offline).
    ///
    /// # Errors
    /// See [`TelegramError`].
    ///
    /// # Cancel safety
    /// Cancel safe: deleting the webhook twice is harmless.
    pub async fn delete_webhook_dropping_pending(&self) -> Result<(), TelegramError> {
        self.delete_webhook_with(true).await
    }

    async fn delete_webhook_with(&self, drop_pending_updates: bool) -> Result<(), TelegramError> {
        let params = DeleteWebhookParams { drop_pending_updates };
        self.call("deleteWebhook", &params, REQUEST_TIMEOUT).await.map(drop)
    }

    /// `getUpdates`: long-polls for up to `timeout` (whole seconds; zero polls
    /// briefly) for updates from `offset` on, at most `limit` (clamped to 1–100).
    /// Passing an `offset` confirms, for good, every update below it.
    ///
    /// An update whose message does not parse is still returned, with its
    /// `update_id` and without that message, so the caller's offset moves past it;
    /// a warning is logged. An entry without an `update_id` is skipped.
    ///
    /// # Errors
    /// See [`TelegramError`]; [`TelegramError::Conflict`] when another poller or a
    /// webhook holds this bot's updates.
    ///
    /// # Cancel safety
    /// Cancel safe: updates are confirmed only by a later call's `offset`, so
    /// updates an abandoned call would have returned are delivered again.
    pub async fn get_updates(
        &self,
        offset: Option<i64>,
        timeout: Duration,
        limit: u8,
    ) -> Result<Vec<Update>, TelegramError> {
        let params = GetUpdatesParams {
            offset,
            limit: limit.clamp(1, 100),
            timeout: timeout.as_secs(),
            allowed_updates: &ALLOWED_UPDATES,
        };
        let http_timeout = Duration::from_secs(params.timeout) + POLL_GRACE;
        let result = self.call("getUpdates", &params, http_timeout).await?;
        let Value::Array(entries) = result else {
            return Err(TelegramError::Network(
                "getUpdates answered something else than a list".into(),
            ));
        };
        Ok(entries.into_iter().filter_map(decode_update).collect())
    }

    /// `sendMessage`: sends `req` and returns the message as Telegram stored it.
    ///
    /// # Errors
    /// See [`TelegramError`]; [`TelegramError::RetryAfter`] when over a flood limit,
    /// [`TelegramError::MigratedTo`] when the group became a supergroup.
    ///
    /// # Cancel safety
    /// Not cancel safe: a cancelled call may still have delivered the message.
    pub async fn send_message(&self, req: &SendMessage) -> Result<Message, TelegramError> {
        self.call_typed("sendMessage", req, REQUEST_TIMEOUT).await
    }

    /// `getFile`: where a file a message carries can be downloaded from.
    ///
    /// # Errors
    /// See [`TelegramError`]; a file Telegram no longer has (or one over its
    /// 20 MB download limit) is [`TelegramError::Rejected`].
    pub async fn get_file(&self, file_id: &str) -> Result<FileInfo, TelegramError> {
        self.call_typed("getFile", &json!({ "file_id": file_id }), REQUEST_TIMEOUT).await
    }

    /// The download URL of a file `getFile` described:
    /// `{base}/file/bot<token>/<file_path>`. It holds the token: it goes to
    /// the fetcher and nowhere else ([`FileUrl`] prints as redacted).
    ///
    /// # Errors
    /// [`TelegramError::Rejected`] when `file_path` is missing or is not a
    /// relative path of plain segments (no `..`, query or fragment).
    pub fn file_url(&self, info: &FileInfo) -> Result<FileUrl, TelegramError> {
        let path = info.file_path.as_deref().unwrap_or_default();
        let plain = !path.is_empty()
            && !path.starts_with('/')
            && path.split('/').all(|seg| !seg.is_empty() && seg != "." && seg != "..")
            && path.chars().all(|c| !c.is_control() && !matches!(c, '?' | '#' | '\\' | '%'));
        if !plain {
            return Err(TelegramError::Rejected {
                code: 400,
                description: "getFile gave no usable file_path".to_owned(),
            });
        }
        let prefix = self.inner.method_prefix.trim_end_matches('/');
        let Some((base, bot)) = prefix.rsplit_once('/') else {
            return Err(TelegramError::InvalidBaseUrl("no base".to_owned()));
        };
        Ok(FileUrl(format!("{base}/file/{bot}/{path}")))
    }

    /// `answerCallbackQuery`: the short notice the user who pressed a button
    /// sees, which also stops the button's spinner.
    ///
    /// # Errors
    /// See [`TelegramError`].
    pub async fn answer_callback_query(&self, id: &str, text: &str) -> Result<(), TelegramError> {
        let params = json!({ "callback_query_id": id, "text": text });
        self.call("answerCallbackQuery", &params, REQUEST_TIMEOUT).await.map(drop)
    }

    /// `editMessageText`: replaces the text of a message the bot sent.
    ///
    /// # Errors
    /// See [`TelegramError`]; [`TelegramError::NotModified`] when the message
    /// already shows exactly this text and formatting.
    ///
    /// # Cancel safety
    /// Cancel safe in effect: a cancelled edit may or may not have been applied,
    /// and repeating it is harmless.
    pub async fn edit_message_text(&self, req: &EditMessageText) -> Result<(), TelegramError> {
        // Telegram answers the edited message, or `true` for inline messages;
        // neither is needed.
        self.call("editMessageText", req, REQUEST_TIMEOUT).await.map(drop)
    }

    /// `sendPhoto` or `sendDocument`: uploads the file (read now) as
    /// `multipart/form-data` with its caption, and returns the message.
    ///
    /// # Errors
    /// See [`TelegramError`]; [`TelegramError::File`] when the file cannot be read.
    ///
    /// # Cancel safety
    /// Not cancel safe: a cancelled call may still have delivered the file.
    pub async fn send_file(&self, req: &SendFile) -> Result<Message, TelegramError> {
        // A run's checked file, read without following a link swapped in since.
        let content = lemon_core::contain::read_checked(&req.path).await.map_err(|e| {
            TelegramError::File { filename: req.filename.clone(), reason: e.kind().to_string() }
        })?;
        let method = req.kind.method();
        let boundary = format!("lemon-{}", boundary_for(&content));
        let body = multipart_body(req, &content, &boundary);
        debug!(method, bytes = content.len(), "telegram upload");
        let url = format!("{}{method}", self.inner.method_prefix);
        let response = self
            .inner
            .http
            .post(url)
            .header("content-type", format!("multipart/form-data; boundary={boundary}"))
            .body(body)
            .timeout(UPLOAD_TIMEOUT)
            .send()
            .await
            .map_err(|e| self.network_error(method, e))?;
        let status = response.status();
        let answer = response.bytes().await.map_err(|e| self.network_error(method, e))?;
        let result = interpret(status, &answer).map_err(|e| self.scrub_error(e))?;
        serde_json::from_value(result).map_err(|e| {
            TelegramError::Network(format!(
                "unexpected {method} result: {}",
                self.scrub(e.to_string())
            ))
        })
    }

    /// `setMyCommands`: the command list clients show for this bot.
    ///
    /// # Errors
    /// See [`TelegramError`].
    ///
    /// # Cancel safety
    /// Cancel safe: setting the same list twice is harmless.
    pub async fn set_my_commands(&self, commands: &[BotCommand]) -> Result<(), TelegramError> {
        let params = SetMyCommandsParams { commands };
        self.call("setMyCommands", &params, REQUEST_TIMEOUT).await.map(drop)
    }

    async fn call_typed<P, R>(
        &self,
        method: &'static str,
        params: &P,
        timeout: Duration,
    ) -> Result<R, TelegramError>
    where
        P: Serialize + ?Sized,
        R: DeserializeOwned,
    {
        let result = self.call(method, params, timeout).await?;
        serde_json::from_value(result).map_err(|e| {
            TelegramError::Network(format!(
                "unexpected {method} result: {}",
                self.scrub(e.to_string())
            ))
        })
    }

    /// One call: POST the JSON parameters, read the whole answer, unwrap the envelope.
    async fn call<P>(
        &self,
        method: &'static str,
        params: &P,
        timeout: Duration,
    ) -> Result<Value, TelegramError>
    where
        P: Serialize + ?Sized,
    {
        debug!(method, "telegram call");
        let url = format!("{}{method}", self.inner.method_prefix);
        let response = self
            .inner
            .http
            .post(url)
            .json(params)
            .timeout(timeout)
            .send()
            .await
            .map_err(|e| self.network_error(method, e))?;
        let status = response.status();
        let body = response.bytes().await.map_err(|e| self.network_error(method, e))?;
        interpret(status, &body).map_err(|e| self.scrub_error(e))
    }

    fn network_error(&self, method: &str, error: reqwest::Error) -> TelegramError {
        TelegramError::Network(format!("{method}: {}", self.scrub(describe(error))))
    }

    /// Replaces the token wherever it appears in `text`.
    fn scrub(&self, text: String) -> String {
        if text.contains(self.inner.token.as_str()) {
            text.replace(self.inner.token.as_str(), REDACTED)
        } else {
            text
        }
    }

    fn scrub_error(&self, error: TelegramError) -> TelegramError {
        match error {
            TelegramError::Unauthorized { description } => {
                TelegramError::Unauthorized { description: self.scrub(description) }
            }
            TelegramError::Conflict { description } => {
                TelegramError::Conflict { description: self.scrub(description) }
            }
            TelegramError::Rejected { code, description } => {
                TelegramError::Rejected { code, description: self.scrub(description) }
            }
            TelegramError::Server { code, description } => {
                TelegramError::Server { code, description: self.scrub(description) }
            }
            TelegramError::Network(text) => TelegramError::Network(self.scrub(text)),
            TelegramError::InvalidBaseUrl(text) => TelegramError::InvalidBaseUrl(self.scrub(text)),
            other @ (TelegramError::RetryAfter(_)
            | TelegramError::NotModified
            | TelegramError::MigratedTo(_)
            | TelegramError::File { .. }) => other,
        }
    }
}

/// A file's download URL. It holds the bot token: `Debug` shows
/// `<redacted>`, and [`FileUrl::expose`] is for the request alone.
#[derive(Clone)]
pub struct FileUrl(String);

impl FileUrl {
    /// The URL, to fetch the file with; never to be logged or shown.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for FileUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("FileUrl(<redacted>)")
    }
}

/// A boundary that does not occur in the content: a hex digest of its length and
/// a few of its bytes, lengthened until it is absent.
fn boundary_for(content: &[u8]) -> String {
    let mut seed = content.len() as u64 ^ 0x9e37_79b9_7f4a_7c15;
    for byte in content.iter().step_by((content.len() / 64).max(1)) {
        seed = seed.rotate_left(5) ^ u64::from(*byte);
    }
    let mut boundary = format!("{seed:016x}");
    while content.windows(boundary.len()).any(|w| w == boundary.as_bytes()) {
        boundary.push_str(&format!("{:x}", seed.rotate_left(boundary.len() as u32)));
    }
    boundary
}

/// The `multipart/form-data` body of a file upload: `chat_id`, the optional
/// `message_thread_id` and `caption`, and the file under the method's field.
fn multipart_body(req: &SendFile, content: &[u8], boundary: &str) -> Vec<u8> {
    let mut body = Vec::with_capacity(content.len() + 512);
    let mut field = |name: &str, value: &str| {
        body.extend_from_slice(
            format!(
                "--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"\r\n\r\n{value}\r\n"
            )
            .as_bytes(),
        );
    };
    field("chat_id", &req.chat_id.to_string());
    if let Some(thread) = req.message_thread_id {
        field("message_thread_id", &thread.to_string());
    }
    if let Some(caption) = &req.caption {
        field("caption", caption);
    }
    // Quotes, backslashes and line breaks cannot appear in the quoted name.
    let filename: String = req
        .filename
        .chars()
        .map(|c| if matches!(c, '"' | '\\' | '\r' | '\n') || c.is_control() { '_' } else { c })
        .collect();
    body.extend_from_slice(
        format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"{}\"; filename=\"{filename}\"\r\nContent-Type: {}\r\n\r\n",
            req.kind.field(),
            req.mime
        )
        .as_bytes(),
    );
    body.extend_from_slice(content);
    body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    body
}

/// A reqwest error as text: its message and every cause, without the URL.
fn describe(error: reqwest::Error) -> String {
    let error = error.without_url();
    let mut text = error.to_string();
    let mut source = std::error::Error::source(&error);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// Maps one HTTP answer to the call's `result`, or to the error it stands for.
fn interpret(status: StatusCode, body: &[u8]) -> Result<Value, TelegramError> {
    let envelope = match serde_json::from_slice::<Envelope>(body) {
        Ok(envelope) => envelope,
        Err(parse_error) => return Err(non_json_error(status, body, &parse_error)),
    };
    if envelope.ok {
        return match envelope.result {
            Some(result) if status.is_success() => Ok(result),
            Some(_) => Err(TelegramError::Network(format!(
                "an ok answer came with HTTP status {}",
                status.as_u16()
            ))),
            None => Err(TelegramError::Network("an ok answer without a result".into())),
        };
    }
    let code = envelope.error_code.unwrap_or(status.as_u16());
    let description = envelope.description.unwrap_or_default();
    let parameters = envelope.parameters.unwrap_or_default();
    Err(classify(code, description, &parameters))
}

/// The error for an `ok: false` answer with `error_code` `code`.
fn classify(code: u16, description: String, parameters: &ResponseParameters) -> TelegramError {
    match (code, parameters.migrate_to_chat_id) {
        (429, _) => {
            TelegramError::RetryAfter(Duration::from_secs(parameters.retry_after.unwrap_or(1)))
        }
        (400, _) if description.contains("message is not modified") => TelegramError::NotModified,
        (400, Some(chat_id)) => TelegramError::MigratedTo(chat_id),
        // Telegram answers 404 to a malformed or unknown token.
        (401 | 404, _) => TelegramError::Unauthorized { description },
        (409, _) => TelegramError::Conflict { description },
        (400..=499, _) => TelegramError::Rejected { code, description },
        (500..=599, _) => TelegramError::Server { code, description },
        _ => TelegramError::Network(format!("unexpected error code {code}: {description}")),
    }
}

/// The error for an answer that is not the Bot API's JSON, such as a proxy's
/// HTML error page.
fn non_json_error(
    status: StatusCode,
    body: &[u8],
    parse_error: &serde_json::Error,
) -> TelegramError {
    let code = status.as_u16();
    let text = String::from_utf8_lossy(body);
    let mut excerpt: String = text.chars().take(MAX_BODY_IN_ERROR).collect();
    excerpt = excerpt.split_whitespace().collect::<Vec<_>>().join(" ");
    let description = if excerpt.is_empty() {
        status.canonical_reason().unwrap_or("no description").to_owned()
    } else {
        excerpt
    };
    match code {
        500..=599 => TelegramError::Server { code, description },
        401 | 404 => TelegramError::Unauthorized { description },
        429 => TelegramError::RetryAfter(Duration::from_secs(1)),
        400..=499 => TelegramError::Rejected { code, description },
        _ => TelegramError::Network(format!("unreadable answer (HTTP {code}): {parse_error}")),
    }
}

/// One `getUpdates` entry as an [`Update`], keeping its `update_id` even when a
/// message in it does not parse.
fn decode_update(mut raw: Value) -> Option<Update> {
    let Some(update_id) = raw.get("update_id").and_then(Value::as_i64) else {
        warn!("skipping an update without an update_id");
        return None;
    };
    let callback_query = raw.get_mut("callback_query").map(Value::take).and_then(|value| {
        serde_json::from_value::<CallbackQuery>(value)
            .map_err(
                |error| warn!(update_id, %error, "ignoring a button press that does not parse"),
            )
            .ok()
    });
    let mut message = |field: &'static str| -> Option<Message> {
        let value = raw.get_mut(field)?.take();
        match serde_json::from_value::<Option<Message>>(value) {
            Ok(message) => message,
            Err(error) => {
                warn!(update_id, field, %error, "ignoring a message that does not parse");
                None
            }
        }
    };
    Some(Update {
        update_id,
        message: message("message"),
        edited_message: message("edited_message"),
        channel_post: message("channel_post"),
        callback_query,
    })
}

#[async_trait::async_trait]
impl super::outbox::BotSender for BotApi {
    async fn send_message(&self, req: &SendMessage) -> Result<Message, TelegramError> {
        BotApi::send_message(self, req).await
    }

    async fn edit_message_text(&self, req: &EditMessageText) -> Result<(), TelegramError> {
        BotApi::edit_message_text(self, req).await
    }

    async fn send_file(&self, req: &SendFile) -> Result<Message, TelegramError> {
        BotApi::send_file(self, req).await
    }
}
