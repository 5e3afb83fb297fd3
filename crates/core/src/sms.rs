//! The SMS inbox: text messages received on the gateway's number, from which
//! runs read verification codes (`sms_wait_for_code`) and which they claim so
//! that two sessions never use one code.
//!
//! The SMS channel implements [`SmsInbox`]; the `sms_*` tools only call it.
//! Semantics every implementation keeps:
//! - a message is stored once per `message_sid` (a duplicate is ignored);
//! - its `codes` are every run of 4 to 8 digits standing alone in the body, in
//!   order, without repeats; the default code is the first;
//! - listing is newest first, claimed messages left out unless asked for;
//! - a claim by one session refuses a claim by another, and the same session
//!   may claim again;
//! - `wait_for_code` first looks at the stored unclaimed messages (newest
//!   first), then waits; waiters are served in the order they started waiting,
//!   a new message going to the first whose filters match.

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;

use crate::ids::SessionKey;

/// One received message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SmsMessage {
    pub message_sid: String,
    pub account_sid: Option<String>,
    pub to: String,
    pub from: String,
    pub body: String,
    /// The candidate codes of `body`, in order, without repeats.
    pub codes: Vec<String>,
    /// Wall-clock milliseconds.
    pub received_at_ms: u64,
    /// The session that claimed it.
    pub claimed_by: Option<String>,
    pub claimed_at_ms: Option<u64>,
}

/// Which messages [`SmsInbox::list_messages`] returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListFilter {
    /// At most this many, newest first.
    pub limit: usize,
    /// Received at or after (wall-clock ms).
    pub since_ms: Option<u64>,
    /// Sent to exactly this number.
    pub to: Option<String>,
    /// The sender contains this, ignoring case.
    pub from_contains: Option<String>,
    /// The body contains this, case sensitive.
    pub body_contains: Option<String>,
    /// Claimed messages too (by default only unclaimed ones).
    pub include_claimed: bool,
    /// Only messages claimed by this session.
    pub claimed_by: Option<String>,
}

impl Default for ListFilter {
    fn default() -> Self {
        ListFilter {
            limit: 20,
            since_ms: None,
            to: None,
            from_contains: None,
            body_contains: None,
            include_claimed: false,
            claimed_by: None,
        }
    }
}

/// What [`SmsInbox::wait_for_code`] waits for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WaitForCode {
    /// How long to wait for a matching message.
    pub timeout: Duration,
    pub since_ms: Option<u64>,
    /// Sent to this number; `None` means the inbox's own number (when it has one).
    pub to: Option<String>,
    pub from_contains: Option<String>,
    pub body_contains: Option<String>,
    /// The code is the first match of this regular expression (its first
    /// capture group when it has one) instead of the first 4–8 digit run; an
    /// invalid expression falls back to the default.
    pub regex: Option<String>,
    /// Claim the message for the waiting session.
    pub claim: bool,
}

impl Default for WaitForCode {
    fn default() -> Self {
        WaitForCode {
            timeout: Duration::from_secs(60),
            since_ms: None,
            to: None,
            from_contains: None,
            body_contains: None,
            regex: None,
            claim: true,
        }
    }
}

/// A code found by [`SmsInbox::wait_for_code`], and the message it is in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CodeMatch {
    pub code: String,
    pub message: SmsMessage,
}

/// Why an inbox operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SmsError {
    #[error("timed out waiting for an SMS code")]
    Timeout,
    #[error("message not found: {message_sid}")]
    NotFound { message_sid: String },
    #[error("message is already claimed: {message_sid}")]
    AlreadyClaimed { message_sid: String },
    /// The inbox cannot answer (its store failed, it is shutting down).
    #[error("{0}")]
    Unavailable(String),
}

/// The gateway's SMS inbox.
#[async_trait]
pub trait SmsInbox: Send + Sync + fmt::Debug + 'static {
    /// The number messages are received on, E.164, when one is configured.
    fn inbox_number(&self) -> Option<String>;

    /// The first code matching `wait`, from a stored message or from one that
    /// arrives within `wait.timeout`; claimed for `session` when `wait.claim`.
    ///
    /// # Errors
    /// [`SmsError::Timeout`] when none came in time, [`SmsError::Unavailable`].
    async fn wait_for_code(
        &self,
        session: &SessionKey,
        wait: WaitForCode,
    ) -> Result<CodeMatch, SmsError>;

    /// The stored messages `filter` selects, newest first.
    ///
    /// # Errors
    /// [`SmsError::Unavailable`].
    async fn list_messages(&self, filter: ListFilter) -> Result<Vec<SmsMessage>, SmsError>;

    /// Marks the message claimed by `session`.
    ///
    /// # Errors
    /// [`SmsError::NotFound`], [`SmsError::AlreadyClaimed`] (by another
    /// session), [`SmsError::Unavailable`].
    async fn claim_message(&self, session: &SessionKey, message_sid: &str) -> Result<(), SmsError>;
}

/// Whether `raw` is an E.164 phone number: `+`, then 2 to 15 digits, the first not 0.
pub fn is_e164(raw: &str) -> bool {
    let Some(digits) = raw.strip_prefix('+') else { return false };
    (2..=15).contains(&digits.len())
        && digits.bytes().all(|b| b.is_ascii_digit())
        && !digits.starts_with('0')
}
