//! Outbound SMS over Twilio's REST API
//! (`POST /2010-04-01/Accounts/{AccountSid}/Messages.json`, HTTP basic auth
//! with the account SID and auth token), through the shared paced
//! [`Outbox`]: one destination is a recipient's number, a `429` waits as long
//! as Twilio asks (or a second), a `5xx` or a network error is retried with
//! backoff. Every message sent or given up on is recorded in the kv namespace
//! `sms.sent` (key: Twilio's SID, or `failed-<uuid>` for one never accepted).
//!
//! A call that takes longer than its timeout (`api_timeout_ms`) is a network
//! error too, and retried. Twilio's message create has no idempotency key, so
//! Twilio may already have taken the text the timed-out call carried: sending
//! errs on the side of a duplicate text rather than a lost one.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lemon_core::store::StoreHandle;
use lemon_transports::delivery::{Backoff, DeliveryError, Failure, Outbox, OutboxSettings, Sink};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Store namespace of the messages sent.
pub const SENT_NS: &str = "sms.sent";
/// The most characters one message may carry (Twilio's limit).
pub const MAX_BODY_CHARS: usize = 1600;
/// The wait after a `429` that names none.
const DEFAULT_RETRY_AFTER: Duration = Duration::from_secs(1);
/// The longest `Retry-After` honoured.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);

/// One text to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboundSms {
    pub to: String,
    pub body: String,
}

/// Twilio's answer to a created message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SentSms {
    pub sid: String,
    pub status: String,
}

/// Why a send failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SendError {
    /// Twilio answered with an error status; `message` is Twilio's own.
    #[error("Twilio answered {status}: {message}")]
    Status { status: u16, message: String, retry_after: Option<Duration> },
    #[error("could not reach Twilio: {0}")]
    Network(String),
    /// The answer was not the JSON Twilio sends.
    #[error("unexpected answer from Twilio: {0}")]
    Protocol(String),
}

/// Twilio's REST API, for one account. The credentials are never logged.
#[derive(Clone)]
pub struct TwilioClient {
    http: reqwest::Client,
    base_url: String,
    account_sid: String,
    auth_token: String,
    from: String,
}

impl fmt::Debug for TwilioClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TwilioClient")
            .field("base_url", &self.base_url)
            .field("from", &self.from)
            .finish_non_exhaustive()
    }
}

#[derive(Deserialize)]
struct CreatedJson {
    sid: String,
    #[serde(default)]
    status: Option<String>,
}

#[derive(Deserialize)]
struct ErrorJson {
    #[serde(default)]
    message: Option<String>,
    #[serde(default)]
    code: Option<u64>,
}

/// The HTTP client of the REST calls: no redirects, `timeout` per call.
fn http_client(timeout: Duration) -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(timeout)
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap_or_default()
}

fn retry_after(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    let raw = headers.get(reqwest::header::RETRY_AFTER)?.to_str().ok()?;
    let seconds: u64 = raw.trim().parse().ok()?;
    Some(Duration::from_secs(seconds).min(MAX_RETRY_AFTER))
}

impl TwilioClient {
    /// A client of `base_url` (Twilio's, or a test's) for `account_sid`,
    /// sending from `from`, whose calls may take
    /// [`DEFAULT_API_TIMEOUT_MS`](crate::config::DEFAULT_API_TIMEOUT_MS) each.
    pub fn new(base_url: &str, account_sid: String, auth_token: String, from: String) -> Self {
        let timeout = Duration::from_millis(crate::config::DEFAULT_API_TIMEOUT_MS);
        TwilioClient {
            http: http_client(timeout),
            base_url: base_url.trim_end_matches('/').to_owned(),
            account_sid,
            auth_token,
            from,
        }
    }

    /// The same client, with calls that may take `timeout` each; a call that
    /// takes longer fails as a network error (and is retried).
    #[must_use]
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.http = http_client(timeout);
        self
    }

    /// The number texts are sent from.
    pub fn from(&self) -> &str {
        &self.from
    }

    /// Creates one message.
    ///
    /// # Errors
    /// Twilio's error status and message, a network error, an answer that is not JSON.
    pub async fn create(&self, sms: &OutboundSms) -> Result<SentSms, SendError> {
        let url =
            format!("{}/2010-04-01/Accounts/{}/Messages.json", self.base_url, self.account_sid);
        let form =
            [("To", sms.to.as_str()), ("From", self.from.as_str()), ("Body", sms.body.as_str())];
        let answer = self
            .http
            .post(url)
            .basic_auth(&self.account_sid, Some(&self.auth_token))
            .form(&form)
            .send()
            .await
            // Without the URL: it carries the account SID.
            .map_err(|err| SendError::Network(err.without_url().to_string()))?;
        let status = answer.status();
        let after = retry_after(answer.headers());
        let body = answer
            .bytes()
            .await
            .map_err(|err| SendError::Network(err.without_url().to_string()))?;
        if !status.is_success() {
            let parsed: Option<ErrorJson> = serde_json::from_slice(&body).ok();
            let message = match parsed {
                Some(ErrorJson { message: Some(message), code }) => match code {
                    Some(code) => format!("{message} (code {code})"),
                    None => message,
                },
                _ => status.canonical_reason().unwrap_or("error").to_owned(),
            };
            return Err(SendError::Status { status: status.as_u16(), message, retry_after: after });
        }
        let created: CreatedJson =
            serde_json::from_slice(&body).map_err(|err| SendError::Protocol(err.to_string()))?;
        Ok(SentSms { sid: created.sid, status: created.status.unwrap_or_else(|| "queued".into()) })
    }
}

/// Twilio as the outbox's sink: no edits, pacing per recipient.
#[derive(Debug)]
struct TwilioSink {
    client: TwilioClient,
}

#[async_trait]
impl Sink for TwilioSink {
    type Dest = String;
    type MessageId = String;
    type Message = OutboundSms;
    type Edit = ();
    type Receipt = SentSms;
    type Error = SendError;

    fn destination(&self, message: &OutboundSms) -> String {
        message.to.clone()
    }

    fn redirect(&self, message: &mut OutboundSms, to: &String) {
        message.to.clone_from(to);
    }

    fn message_id(&self, receipt: &SentSms) -> String {
        receipt.sid.clone()
    }

    fn shown(&self, _message: OutboundSms) -> Option<()> {
        None
    }

    fn classify(&self, error: &SendError) -> Failure<String> {
        match error {
            SendError::Status { status: 429, retry_after, .. } => {
                Failure::RetryAfter(retry_after.unwrap_or(DEFAULT_RETRY_AFTER))
            }
            SendError::Status { status, .. } if *status >= 500 => Failure::Transient,
            SendError::Network(_) => Failure::Transient,
            SendError::Status { .. } | SendError::Protocol(_) => Failure::Fatal,
        }
    }

    async fn send(&self, message: &OutboundSms) -> Result<SentSms, SendError> {
        self.client.create(message).await
    }

    async fn edit(&self, _dest: &String, _id: &String, _edit: &()) -> Result<(), SendError> {
        Err(SendError::Protocol("a sent SMS cannot be edited".into()))
    }
}

/// A sent (or failed) message as recorded.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct SentRecord {
    sid: Option<String>,
    to: String,
    from: String,
    body: String,
    status: String,
    sent_at_ms: i64,
    #[serde(default)]
    session: Option<String>,
    #[serde(default)]
    error: Option<String>,
}

/// Why a text was not sent, as callers show it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SmsSendError {
    #[error("{0}")]
    Invalid(String),
    #[error("the SMS was not sent: {0}")]
    Failed(String),
    #[error("the gateway is shutting down; the SMS was not sent")]
    ShuttingDown,
}

/// Sends texts through the outbox and records them. Cheap to clone.
#[derive(Clone)]
pub struct SmsSender {
    outbox: Outbox<TwilioSink>,
    from: String,
    store: StoreHandle,
    record_ttl_ms: i64,
}

impl fmt::Debug for SmsSender {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SmsSender").field("from", &self.from).finish_non_exhaustive()
    }
}

/// The outbox's pacing for Twilio: one message a second per recipient, four
/// attempts with backoff from half a second.
pub fn outbox_settings() -> OutboxSettings {
    OutboxSettings {
        interval: Duration::from_secs(1),
        overall: None,
        send_attempts: 4,
        edit_attempts: 1,
        backoff: Backoff::new(Duration::from_millis(500), Duration::from_secs(8)),
        shutdown_grace: Duration::from_secs(5),
        queue_capacity: 256,
        quiet_start: Duration::ZERO,
    }
}

/// The parts of `text` that fit in one message each, split at whitespace when
/// possible.
pub fn split_body(text: &str) -> Vec<String> {
    let mut parts = Vec::new();
    let mut rest = text.trim();
    while rest.chars().count() > MAX_BODY_CHARS {
        let limit = rest.char_indices().nth(MAX_BODY_CHARS).map_or(rest.len(), |(i, _)| i);
        let cut = rest[..limit].rfind(char::is_whitespace).filter(|&i| i > 0).unwrap_or(limit);
        parts.push(rest[..cut].trim_end().to_owned());
        rest = rest[cut..].trim_start();
    }
    if !rest.is_empty() {
        parts.push(rest.to_owned());
    }
    parts
}

impl SmsSender {
    /// What the sender's outbox holds, for metrics.
    pub fn backlog(&self) -> lemon_core::transport::Backlog {
        self.outbox.backlog()
    }

    /// A sender over `client`, paced by an outbox that stops with `token`;
    /// records are kept for `record_ttl`.
    pub fn spawn(
        client: TwilioClient,
        store: StoreHandle,
        record_ttl: Duration,
        token: CancellationToken,
        tracker: &TaskTracker,
    ) -> Self {
        let from = client.from().to_owned();
        let outbox = Outbox::spawn(TwilioSink { client }, outbox_settings(), token, tracker);
        SmsSender {
            outbox,
            from,
            store,
            record_ttl_ms: i64::try_from(record_ttl.as_millis()).unwrap_or(i64::MAX),
        }
    }

    /// Sends `body` to `to` (E.164, at most [`MAX_BODY_CHARS`]) for `session`,
    /// waiting for Twilio to accept it, and records it.
    ///
    /// # Errors
    /// A bad number or body; Twilio refusing it after the retries; shutdown.
    pub async fn send(
        &self,
        to: &str,
        body: &str,
        session: Option<&str>,
    ) -> Result<SentSms, SmsSendError> {
        let to = to.trim();
        if !crate::config::is_e164(to) {
            return Err(SmsSendError::Invalid(format!(
                "`to` must be an E.164 number like +15551234567, not {to:?}"
            )));
        }
        if body.trim().is_empty() {
            return Err(SmsSendError::Invalid("`body` is empty".into()));
        }
        if body.chars().count() > MAX_BODY_CHARS {
            return Err(SmsSendError::Invalid(format!(
                "`body` is longer than {MAX_BODY_CHARS} characters"
            )));
        }
        let sms = OutboundSms { to: to.to_owned(), body: body.to_owned() };
        let sent = self.outbox.send(sms).await;
        let now = lemon_core::clock::now_ms();
        let mut record = SentRecord {
            sid: None,
            to: to.to_owned(),
            from: self.from.clone(),
            body: body.to_owned(),
            status: String::new(),
            sent_at_ms: now,
            session: session.map(str::to_owned),
            error: None,
        };
        let key;
        let result = match sent {
            Ok(sent) => {
                record.sid = Some(sent.sid.clone());
                record.status.clone_from(&sent.status);
                key = sent.sid.clone();
                Ok(sent)
            }
            Err(DeliveryError::ShuttingDown) => return Err(SmsSendError::ShuttingDown),
            Err(DeliveryError::Failed { attempts, error }) => {
                tracing::warn!(attempts, %error, "SMS not sent");
                record.status = "failed".into();
                record.error = Some(error.to_string());
                key = format!("failed-{}", uuid::Uuid::new_v4().simple());
                Err(SmsSendError::Failed(format!("{error} (after {attempts} attempt(s))")))
            }
        };
        if let Ok(value) = serde_json::to_value(&record) {
            let expires = now.saturating_add(self.record_ttl_ms);
            self.store.kv_put(SENT_NS, &key, value, Some(expires)).await;
        }
        result
    }

    /// The messages sent, newest first, as the API shows them.
    pub async fn sent(&self, limit: usize) -> Vec<Value> {
        let listed = self.store.kv_list(SENT_NS, lemon_core::clock::now_ms()).await;
        let mut records: Vec<SentRecord> = listed
            .unwrap_or_default()
            .into_iter()
            .filter_map(|(_, value)| serde_json::from_value(value).ok())
            .collect();
        records.sort_by_key(|r| std::cmp::Reverse(r.sent_at_ms));
        records
            .into_iter()
            .take(limit)
            .map(|r| {
                json!({"sid": r.sid, "to": r.to, "from": r.from, "body": r.body, "status": r.status,
                       "sent_at_ms": r.sent_at_ms, "session": r.session, "error": r.error})
            })
            .collect()
    }
}

/// A sender shared by the webhook, the API and the `sms_send` tool.
pub type SharedSender = Arc<SmsSender>;

#[cfg(test)]
mod tests;
