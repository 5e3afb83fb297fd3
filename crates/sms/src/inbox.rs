//! The SMS inbox over the store: every received message is a record in the
//! kv namespace `sms.inbox` (key: its `MessageSid`) that expires after
//! `inbox_ttl_ms`, so old messages read as absent and the store purges them.
//!
//! One lock orders everything that reads and then writes: ingesting, claiming
//! and registering a waiter. So a message that arrives while a wait scans the
//! stored ones is either found by the scan or handed to the waiter, never
//! missed, and two sessions never claim one message. Waiters are served in the
//! order they started waiting.

use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use lemon_core::ids::SessionKey;
use lemon_core::sms::{CodeMatch, ListFilter, SmsError, SmsInbox, SmsMessage, WaitForCode};
use lemon_core::store::StoreHandle;
use regex::Regex;
use serde::{Deserialize, Serialize};
use tokio::sync::{oneshot, Mutex};

/// Store namespace of the received messages.
pub const INBOX_NS: &str = "sms.inbox";

/// Longest `MessageSid` accepted (Twilio's are 34 characters).
const MAX_SID_CHARS: usize = 64;
/// Longest `From` / `To` accepted (numbers, short codes, sender names).
const MAX_ADDRESS_CHARS: usize = 64;

/// Milliseconds since the epoch; injectable so tests can move time.
pub type Clock = Arc<dyn Fn() -> i64 + Send + Sync>;

/// A message as stored.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Record {
    message_sid: String,
    #[serde(default)]
    account_sid: Option<String>,
    to: String,
    from: String,
    body: String,
    codes: Vec<String>,
    received_at_ms: u64,
    #[serde(default)]
    claimed_by: Option<String>,
    #[serde(default)]
    claimed_at_ms: Option<u64>,
    /// Every parameter Twilio sent, as received.
    #[serde(default)]
    params: Vec<(String, String)>,
}

impl Record {
    fn message(&self) -> SmsMessage {
        SmsMessage {
            message_sid: self.message_sid.clone(),
            account_sid: self.account_sid.clone(),
            to: self.to.clone(),
            from: self.from.clone(),
            body: self.body.clone(),
            codes: self.codes.clone(),
            received_at_ms: self.received_at_ms,
            claimed_by: self.claimed_by.clone(),
            claimed_at_ms: self.claimed_at_ms,
        }
    }
}

/// Why an inbound message was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IngestError {
    #[error("missing MessageSid")]
    MissingSid,
    #[error("MessageSid is not a Twilio SID")]
    BadSid,
    #[error("{0} is missing, too long or has control characters")]
    BadAddress(&'static str),
    #[error("{0}")]
    Unavailable(String),
}

/// What ingesting a message did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ingested {
    /// New: stored (and handed to a waiter if one matched).
    Stored(SmsMessage),
    /// Its `MessageSid` was stored already; nothing changed.
    Duplicate,
}

/// The candidate codes of `body`: every run of 4 to 8 digits standing alone,
/// in order, without repeats.
pub fn extract_codes(body: &str) -> Vec<String> {
    static CODE: std::sync::OnceLock<Regex> = std::sync::OnceLock::new();
    #[allow(clippy::expect_used)]
    let code = CODE.get_or_init(|| Regex::new(r"\b\d{4,8}\b").expect("a valid expression"));
    let mut out: Vec<String> = Vec::new();
    for found in code.find_iter(body) {
        if !out.iter().any(|c| c == found.as_str()) {
            out.push(found.as_str().to_owned());
        }
    }
    out
}

/// The code `wait` reads out of `record`: with a valid `regex`, its first
/// capture group when it has one, else its whole first match (no match: none);
/// otherwise (or with an invalid one) the first 4–8 digit run.
fn code_of(record: &Record, regex: Option<&Regex>) -> Option<String> {
    match regex {
        Some(regex) => {
            let captures = regex.captures(&record.body)?;
            let found = captures.get(1).or_else(|| captures.get(0))?;
            Some(found.as_str().to_owned())
        }
        None => record.codes.first().cloned(),
    }
}

/// What one wait looks for, with its regular expression compiled.
#[derive(Debug)]
struct Wanted {
    since_ms: Option<u64>,
    to: Option<String>,
    from_contains: Option<String>,
    body_contains: Option<String>,
    regex: Option<Regex>,
    claim: bool,
}

impl Wanted {
    fn new(wait: WaitForCode, inbox_number: Option<&str>) -> Self {
        let regex = wait.regex.as_deref().and_then(|raw| match Regex::new(raw) {
            Ok(regex) => Some(regex),
            Err(error) => {
                tracing::debug!(%error, "sms_wait_for_code regex invalid; the default code applies");
                None
            }
        });
        Wanted {
            since_ms: wait.since_ms,
            to: wait.to.or_else(|| inbox_number.map(str::to_owned)),
            from_contains: wait.from_contains.map(|f| f.to_lowercase()),
            body_contains: wait.body_contains,
            regex,
            claim: wait.claim,
        }
    }

    /// The code of `record` when it is one this wait takes.
    fn code(&self, record: &Record) -> Option<String> {
        if record.claimed_by.is_some()
            || self.since_ms.is_some_and(|since| record.received_at_ms < since)
            || self.to.as_ref().is_some_and(|to| *to != record.to)
            || self.from_contains.as_ref().is_some_and(|f| !record.from.to_lowercase().contains(f))
            || self.body_contains.as_ref().is_some_and(|b| !record.body.contains(b.as_str()))
        {
            return None;
        }
        code_of(record, self.regex.as_ref())
    }
}

struct Waiter {
    id: u64,
    session: String,
    wanted: Wanted,
    reply: oneshot::Sender<CodeMatch>,
}

#[derive(Default)]
struct State {
    waiters: VecDeque<Waiter>,
    next_id: u64,
}

/// The gateway's SMS inbox on the store. Cheap to share behind an `Arc`.
pub struct StoreInbox {
    store: StoreHandle,
    inbox_number: Option<String>,
    ttl_ms: u64,
    clock: Clock,
    state: Mutex<State>,
}

impl fmt::Debug for StoreInbox {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoreInbox")
            .field("inbox_number", &self.inbox_number)
            .field("ttl_ms", &self.ttl_ms)
            .finish_non_exhaustive()
    }
}

fn session_name(session: &SessionKey) -> String {
    match session.as_str().trim() {
        "" => "unknown".to_owned(),
        name => name.to_owned(),
    }
}

fn clean_address(raw: Option<&str>, what: &'static str) -> Result<String, IngestError> {
    let value = raw.map(str::trim).unwrap_or_default();
    if value.is_empty()
        || value.chars().count() > MAX_ADDRESS_CHARS
        || value.chars().any(char::is_control)
    {
        return Err(IngestError::BadAddress(what));
    }
    Ok(value.to_owned())
}

impl StoreInbox {
    /// The inbox on `store`, receiving on `inbox_number`, keeping messages
    /// for `ttl_ms`, with the wall clock.
    pub fn new(store: StoreHandle, inbox_number: Option<String>, ttl_ms: u64) -> Self {
        StoreInbox::with_clock(store, inbox_number, ttl_ms, Arc::new(lemon_core::clock::now_ms))
    }

    /// As [`StoreInbox::new`], timed by `clock`.
    pub fn with_clock(
        store: StoreHandle,
        inbox_number: Option<String>,
        ttl_ms: u64,
        clock: Clock,
    ) -> Self {
        StoreInbox { store, inbox_number, ttl_ms, clock, state: Mutex::new(State::default()) }
    }

    fn now(&self) -> i64 {
        (self.clock)()
    }

    async fn records(&self) -> Result<Vec<Record>, SmsError> {
        let listed =
            self.store.kv_list(INBOX_NS, self.now()).await.map_err(|err| {
                SmsError::Unavailable(format!("the SMS inbox cannot be read: {err}"))
            })?;
        let mut records: Vec<Record> = listed
            .into_iter()
            .filter_map(|(key, value)| match serde_json::from_value::<Record>(value) {
                Ok(record) => Some(record),
                Err(error) => {
                    tracing::warn!(%key, %error, "unreadable SMS record skipped");
                    None
                }
            })
            .collect();
        // Newest first; the sid breaks ties so the order is stable.
        records.sort_by(|a, b| {
            b.received_at_ms.cmp(&a.received_at_ms).then_with(|| b.message_sid.cmp(&a.message_sid))
        });
        Ok(records)
    }

    async fn record(&self, sid: &str) -> Result<Option<Record>, SmsError> {
        let found =
            self.store.kv_get(INBOX_NS, sid, self.now()).await.map_err(|err| {
                SmsError::Unavailable(format!("the SMS inbox cannot be read: {err}"))
            })?;
        Ok(found.and_then(|value| serde_json::from_value(value).ok()))
    }

    async fn put(&self, record: &Record) {
        let ttl = i64::try_from(self.ttl_ms).unwrap_or(i64::MAX);
        let received = i64::try_from(record.received_at_ms).unwrap_or(i64::MAX);
        let expires = received.saturating_add(ttl);
        match serde_json::to_value(record) {
            Ok(value) => {
                self.store.kv_put(INBOX_NS, &record.message_sid, value, Some(expires)).await
            }
            Err(error) => tracing::warn!(%error, "SMS record not stored"),
        }
    }

    /// Stores a message Twilio posted (its form `params`), once per
    /// `MessageSid`, and hands it to the first waiter it matches.
    ///
    /// # Errors
    /// A missing or malformed `MessageSid`, `From` or `To`; the store failing.
    pub async fn ingest(&self, params: &[(String, String)]) -> Result<Ingested, IngestError> {
        let param = |name: &str| params.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str());
        let sid = param("MessageSid")
            .or_else(|| param("SmsMessageSid"))
            .map(str::trim)
            .filter(|sid| !sid.is_empty())
            .ok_or(IngestError::MissingSid)?;
        if sid.len() > MAX_SID_CHARS || !sid.bytes().all(|b| b.is_ascii_alphanumeric()) {
            return Err(IngestError::BadSid);
        }
        let from = clean_address(param("From"), "From")?;
        let to = clean_address(param("To"), "To")?;
        let body = param("Body").unwrap_or_default().trim().to_owned();
        let mut state = self.state.lock().await;
        match self.record(sid).await {
            Ok(Some(_)) => return Ok(Ingested::Duplicate),
            Ok(None) => {}
            Err(err) => return Err(IngestError::Unavailable(err.to_string())),
        }
        let now = u64::try_from(self.now()).unwrap_or(0);
        let mut record = Record {
            message_sid: sid.to_owned(),
            account_sid: param("AccountSid").map(|s| s.trim().to_owned()).filter(|s| !s.is_empty()),
            to,
            from,
            codes: extract_codes(&body),
            body,
            received_at_ms: now,
            claimed_by: None,
            claimed_at_ms: None,
            params: params.to_vec(),
        };
        // The first waiter (in the order they came) that takes it and is still there.
        let mut handed = None;
        let mut index = 0;
        while index < state.waiters.len() {
            let waiter = &state.waiters[index];
            if waiter.reply.is_closed() {
                state.waiters.remove(index);
                continue;
            }
            if let Some(code) = waiter.wanted.code(&record) {
                handed = state.waiters.remove(index).map(|waiter| (waiter, code));
                break;
            }
            index += 1;
        }
        if let Some((waiter, _)) = &handed {
            if waiter.wanted.claim {
                record.claimed_by = Some(waiter.session.clone());
                record.claimed_at_ms = Some(now);
            }
        }
        self.put(&record).await;
        if let Some((waiter, code)) = handed {
            let found = CodeMatch { code, message: record.message() };
            if waiter.reply.send(found).is_err() && waiter.wanted.claim {
                // The waiter went away in between: the message stays unclaimed.
                record.claimed_by = None;
                record.claimed_at_ms = None;
                self.put(&record).await;
            }
        }
        drop(state);
        Ok(Ingested::Stored(record.message()))
    }
}

#[async_trait]
impl SmsInbox for StoreInbox {
    fn inbox_number(&self) -> Option<String> {
        self.inbox_number.clone()
    }

    async fn wait_for_code(
        &self,
        session: &SessionKey,
        wait: WaitForCode,
    ) -> Result<CodeMatch, SmsError> {
        let timeout = wait.timeout;
        let wanted = Wanted::new(wait, self.inbox_number.as_deref());
        let session = session_name(session);
        let (id, mut rx) = {
            let mut state = self.state.lock().await;
            for mut record in self.records().await? {
                let Some(code) = wanted.code(&record) else { continue };
                if wanted.claim {
                    record.claimed_by = Some(session.clone());
                    record.claimed_at_ms = Some(u64::try_from(self.now()).unwrap_or(0));
                    self.put(&record).await;
                }
                return Ok(CodeMatch { code, message: record.message() });
            }
            let id = state.next_id;
            state.next_id += 1;
            let (reply, rx) = oneshot::channel();
            state.waiters.push_back(Waiter { id, session, wanted, reply });
            (id, rx)
        };
        match tokio::time::timeout(timeout, &mut rx).await {
            Ok(Ok(found)) => Ok(found),
            Ok(Err(_)) => Err(SmsError::Unavailable("the SMS inbox stopped".into())),
            Err(_) => {
                let mut state = self.state.lock().await;
                let before = state.waiters.len();
                state.waiters.retain(|waiter| waiter.id != id);
                if state.waiters.len() < before {
                    return Err(SmsError::Timeout);
                }
                // Handed a message just as the time ran out: it is ours.
                rx.try_recv().map_err(|_| SmsError::Timeout)
            }
        }
    }

    async fn list_messages(&self, filter: ListFilter) -> Result<Vec<SmsMessage>, SmsError> {
        let from_contains = filter.from_contains.as_ref().map(|f| f.to_lowercase());
        Ok(self
            .records()
            .await?
            .into_iter()
            .filter(|r| filter.include_claimed || r.claimed_by.is_none())
            .filter(|r| filter.since_ms.is_none_or(|since| r.received_at_ms >= since))
            .filter(|r| filter.to.as_ref().is_none_or(|to| *to == r.to))
            .filter(|r| from_contains.as_ref().is_none_or(|f| r.from.to_lowercase().contains(f)))
            .filter(|r| filter.body_contains.as_ref().is_none_or(|b| r.body.contains(b.as_str())))
            .filter(|r| filter.claimed_by.as_ref().is_none_or(|s| r.claimed_by.as_ref() == Some(s)))
            .take(filter.limit)
            .map(|r| r.message())
            .collect())
    }

    async fn claim_message(&self, session: &SessionKey, message_sid: &str) -> Result<(), SmsError> {
        let session = session_name(session);
        let _state = self.state.lock().await;
        let Some(mut record) = self.record(message_sid.trim()).await? else {
            return Err(SmsError::NotFound { message_sid: message_sid.to_owned() });
        };
        match &record.claimed_by {
            Some(owner) if !owner.is_empty() && *owner != session => {
                Err(SmsError::AlreadyClaimed { message_sid: message_sid.to_owned() })
            }
            _ => {
                record.claimed_by = Some(session);
                record.claimed_at_ms = Some(u64::try_from(self.now()).unwrap_or(0));
                self.put(&record).await;
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests;
