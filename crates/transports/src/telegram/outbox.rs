//! The Telegram side of the outbox: every Telegram write call of the bot goes
//! through a [`delivery::Outbox`], paced so that
//! Telegram never has a reason to flood-ban the bot.
//!
//! What is Telegram's here:
//! - The limits ([`OutboxConfig`]'s defaults): at most one call a second per
//!   chat, at most 20 calls in any minute per group chat (negative ids) and at
//!   most 30 calls in any second overall.
//! - What Telegram's answers mean: a 429 stops all calls to that chat until its
//!   `retry_after` has passed; server and network errors are retried with
//!   backoff; "message is not modified" counts as success; a group that became
//!   a supergroup (`migrate_to_chat_id`) gets the send at its new id; other
//!   refusals fail at once.
//! - The calls: `sendMessage`, `sendPhoto`, `sendDocument` and `editMessageText`
//!   through a [`BotSender`].
//!
//! Pacing, order, coalescing of edits, retries and shutdown are the generic
//! outbox's (see [`crate::delivery::outbox`]).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::delivery::{self, Backoff, Failure, Outbox, OutboxSettings, Sink, Window};

use super::types::{
    EditMessageText, FormattedText, Message, Outgoing, SendFile, SendMessage, TelegramError,
};

pub use crate::delivery::OutboxStats;

/// Why a message was not delivered to Telegram.
pub type DeliveryError = delivery::DeliveryError<TelegramError>;

/// The Bot API write calls the outbox makes. The HTTP client implements it; tests
/// use a fake.
#[async_trait]
pub trait BotSender: Send + Sync + 'static {
    /// `sendMessage`.
    async fn send_message(&self, req: &SendMessage) -> Result<Message, TelegramError>;
    /// `editMessageText`.
    async fn edit_message_text(&self, req: &EditMessageText) -> Result<(), TelegramError>;
    /// `sendPhoto` or `sendDocument`.
    async fn send_file(&self, req: &SendFile) -> Result<Message, TelegramError>;
}

/// Pacing and retry settings. The defaults are Telegram's published limits.
#[derive(Debug, Clone, PartialEq)]
pub struct OutboxConfig {
    /// Least time between the starts of two calls to one chat.
    pub chat_interval: Duration,
    /// Most calls to one group chat within [`group_window`](Self::group_window).
    pub group_max_calls: usize,
    /// The rolling window of the group limit.
    pub group_window: Duration,
    /// Most calls over all chats within [`global_window`](Self::global_window).
    pub global_max_calls: usize,
    /// The rolling window of the overall limit.
    pub global_window: Duration,
    /// Attempts of a send, or of an edit someone waits for, before its error is
    /// returned. 429 answers do not use attempts up: they say when to retry.
    pub send_attempts: u32,
    /// Attempts of a progress edit before it is dropped.
    pub edit_attempts: u32,
    /// Wait after the first server or network error; it doubles with each attempt.
    pub backoff_initial: Duration,
    /// The longest wait between two attempts.
    pub backoff_max: Duration,
    /// How long shutdown waits for the answers of calls already made.
    pub shutdown_grace: Duration,
    /// Requests the handle channel holds before callers wait.
    pub queue_capacity: usize,
    /// No call in the first moments after the start: a restarted gateway does
    /// not know when the previous process last wrote to a chat.
    pub quiet_start: Duration,
}

impl Default for OutboxConfig {
    fn default() -> Self {
        OutboxConfig {
            chat_interval: Duration::from_secs(1),
            group_max_calls: 20,
            group_window: Duration::from_secs(60),
            global_max_calls: 30,
            // 30 a second is Telegram's figure for calls as they arrive; calls
            // leave here up to network jitter apart from how they arrive, so the
            // window has a margin (about 27 calls a second at most).
            global_window: Duration::from_millis(1100),
            send_attempts: 10,
            edit_attempts: 3,
            backoff_initial: Duration::from_secs(1),
            backoff_max: Duration::from_secs(60),
            shutdown_grace: Duration::from_secs(5),
            queue_capacity: 256,
            quiet_start: Duration::from_secs(1),
        }
    }
}

impl OutboxConfig {
    /// The generic outbox's settings (the group limit is the sink's, per chat).
    fn settings(&self) -> OutboxSettings {
        OutboxSettings {
            interval: self.chat_interval,
            overall: Some(Window::new(self.global_max_calls, self.global_window)),
            send_attempts: self.send_attempts,
            edit_attempts: self.edit_attempts,
            backoff: Backoff::new(self.backoff_initial, self.backoff_max),
            shutdown_grace: self.shutdown_grace,
            queue_capacity: self.queue_capacity,
            quiet_start: self.quiet_start,
        }
    }
}

/// Telegram as a [`Sink`]: chats by id, `sendMessage` (or a file upload) and
/// `editMessageText`.
pub struct TelegramSink {
    sender: Arc<dyn BotSender>,
    /// The cap of a group chat.
    group: Window,
}

impl TelegramSink {
    pub fn new(sender: Arc<dyn BotSender>, config: &OutboxConfig) -> Self {
        TelegramSink { sender, group: Window::new(config.group_max_calls, config.group_window) }
    }
}

impl fmt::Debug for TelegramSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TelegramSink").field("group", &self.group).finish_non_exhaustive()
    }
}

#[async_trait]
impl Sink for TelegramSink {
    type Dest = i64;
    type MessageId = i64;
    type Message = Outgoing;
    type Edit = FormattedText;
    type Receipt = Message;
    type Error = TelegramError;

    fn destination(&self, message: &Outgoing) -> i64 {
        message.chat_id()
    }

    fn redirect(&self, message: &mut Outgoing, to: &i64) {
        message.set_chat_id(*to);
    }

    fn message_id(&self, receipt: &Message) -> i64 {
        receipt.message_id
    }

    fn shown(&self, message: Outgoing) -> Option<FormattedText> {
        match message {
            Outgoing::Text(message) => {
                Some(FormattedText { text: message.text, entities: message.entities })
            }
            Outgoing::File(_) => None,
        }
    }

    /// Group chats (negative ids) have a cap of their own; private chats do not.
    fn window(&self, chat_id: &i64) -> Option<Window> {
        (*chat_id < 0).then_some(self.group)
    }

    fn classify(&self, error: &TelegramError) -> Failure<i64> {
        match error {
            TelegramError::RetryAfter(wait) => Failure::RetryAfter(*wait),
            TelegramError::NotModified => Failure::AlreadyShown,
            TelegramError::MigratedTo(new_id) => Failure::MovedTo(*new_id),
            error if error.is_retryable() => Failure::Transient,
            _ => Failure::Fatal,
        }
    }

    async fn send(&self, message: &Outgoing) -> Result<Message, TelegramError> {
        match message {
            Outgoing::Text(message) => self.sender.send_message(message).await,
            Outgoing::File(file) => self.sender.send_file(file).await,
        }
    }

    async fn edit(
        &self,
        chat_id: &i64,
        message_id: &i64,
        text: &FormattedText,
    ) -> Result<(), TelegramError> {
        let req = EditMessageText::new(*chat_id, *message_id, text.clone());
        self.sender.edit_message_text(&req).await
    }
}

/// The handle to the bot's outbox. Cheap to clone; the outbox stops when the
/// last handle is dropped (after delivering what is queued) or when its token
/// is cancelled.
#[derive(Debug, Clone)]
pub struct OutboxHandle {
    outbox: Outbox<TelegramSink>,
}

impl OutboxHandle {
    /// Starts an outbox that makes its calls through `sender`, on `tracker`.
    pub fn spawn(
        sender: Arc<dyn BotSender>,
        config: OutboxConfig,
        token: CancellationToken,
        tracker: &TaskTracker,
    ) -> Self {
        let sink = TelegramSink::new(sender, &config);
        OutboxHandle { outbox: Outbox::spawn(sink, config.settings(), token, tracker) }
    }

    /// Sends a message and waits until Telegram accepted it.
    ///
    /// # Errors
    /// [`DeliveryError::Failed`] when Telegram refused it or it kept failing,
    /// [`DeliveryError::ShuttingDown`] when the outbox stopped first.
    ///
    /// # Cancel safety
    /// Dropping the future does not withdraw the message: it may still be sent.
    pub async fn send(&self, req: SendMessage) -> Result<Message, DeliveryError> {
        self.outbox.send(Outgoing::Text(req)).await
    }

    /// Uploads a file and waits until Telegram accepted it; paced and retried
    /// like a message.
    ///
    /// # Errors
    /// As [`send`](Self::send).
    ///
    /// # Cancel safety
    /// Dropping the future does not withdraw the upload: it may still be made.
    pub async fn send_file(&self, req: SendFile) -> Result<Message, DeliveryError> {
        self.outbox.send(Outgoing::File(req)).await
    }

    /// Queues an edit of a message and returns without waiting for it. A newer
    /// edit of the same message replaces it if it has not been made yet.
    ///
    /// # Errors
    /// [`DeliveryError::ShuttingDown`] when the outbox has stopped.
    ///
    /// # Cancel safety
    /// Cancel safe: once queued, the edit is made whether or not the future is
    /// polled to the end.
    pub async fn edit(
        &self,
        chat_id: i64,
        message_id: i64,
        text: FormattedText,
    ) -> Result<(), DeliveryError> {
        self.outbox.edit(chat_id, message_id, text).await
    }

    /// Edits a message and waits until it shows `text` (or a newer edit of it).
    /// Meant for the last edit of a progress message. Has the attempts of a send.
    ///
    /// # Errors
    /// [`DeliveryError::Failed`] when Telegram refused the edit or it kept
    /// failing, [`DeliveryError::ShuttingDown`] when the outbox stopped first.
    ///
    /// # Cancel safety
    /// Dropping the future does not withdraw the edit.
    pub async fn edit_and_wait(
        &self,
        chat_id: i64,
        message_id: i64,
        text: FormattedText,
    ) -> Result<(), DeliveryError> {
        self.outbox.edit_and_wait(chat_id, message_id, text).await
    }

    /// The counters so far.
    pub fn stats(&self) -> OutboxStats {
        self.outbox.stats()
    }

    /// What the outbox holds, for metrics (see [`Outbox::backlog`]).
    pub fn backlog(&self) -> lemon_core::transport::Backlog {
        self.outbox.backlog()
    }
}

#[cfg(test)]
mod tests;
