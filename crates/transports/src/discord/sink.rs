//! Discord as the outbox's [`Sink`]: every message and edit of the bot goes
//! through a [`delivery::Outbox`](crate::delivery::Outbox), which paces them
//! per channel and overall, keeps sends in order ahead of edits, coalesces the
//! edits of a streamed answer, and waits out 429s.
//!
//! What is Discord's here: the calls (`POST` and `PATCH` of channel messages,
//! attachments) and what their errors mean: a 429 is a retry-after, a 5xx or a
//! network error is transient, anything else (a deleted channel, missing
//! permissions) is a refusal.

use std::time::Duration;

use async_trait::async_trait;

use super::rest::Rest;
use super::types::{DiscordError, Message, Outgoing, Snowflake};
use crate::delivery::{Backoff, Failure, OutboxSettings, Sink, Window};

/// The outbox's settings for Discord: `interval` between two calls to one
/// channel, at most 40 calls a second overall (Discord's global limit is 50).
pub fn settings(interval: Duration, send_attempts: u32) -> OutboxSettings {
    OutboxSettings {
        interval,
        overall: Some(Window::new(40, Duration::from_secs(1))),
        send_attempts,
        edit_attempts: 3,
        backoff: Backoff::new(Duration::from_secs(1), Duration::from_secs(60)),
        shutdown_grace: Duration::from_secs(5),
        queue_capacity: 256,
        quiet_start: Duration::from_millis(500),
    }
}

/// The bot's REST client as a sink.
#[derive(Debug)]
pub struct DiscordSink {
    rest: Rest,
}

impl DiscordSink {
    pub fn new(rest: Rest) -> Self {
        DiscordSink { rest }
    }
}

#[async_trait]
impl Sink for DiscordSink {
    type Dest = Snowflake;
    type MessageId = Snowflake;
    type Message = Outgoing;
    type Edit = String;
    type Receipt = Message;
    type Error = DiscordError;

    fn destination(&self, message: &Outgoing) -> Snowflake {
        message.channel_id()
    }

    fn redirect(&self, message: &mut Outgoing, to: &Snowflake) {
        match message {
            Outgoing::Text(text) => text.channel_id = *to,
            Outgoing::File(file) => file.channel_id = *to,
        }
    }

    fn message_id(&self, receipt: &Message) -> Snowflake {
        receipt.id
    }

    fn shown(&self, message: Outgoing) -> Option<String> {
        match message {
            Outgoing::Text(text) => Some(text.content),
            Outgoing::File(_) => None,
        }
    }

    fn classify(&self, error: &DiscordError) -> Failure<Snowflake> {
        match error {
            DiscordError::RateLimited(wait) => Failure::RetryAfter(*wait),
            error if error.is_retryable() => Failure::Transient,
            _ => Failure::Fatal,
        }
    }

    async fn send(&self, message: &Outgoing) -> Result<Message, DiscordError> {
        match message {
            Outgoing::Text(text) => self.rest.create_message(text).await,
            Outgoing::File(file) => self.rest.create_file(file).await,
        }
    }

    async fn edit(
        &self,
        channel: &Snowflake,
        message_id: &Snowflake,
        content: &String,
    ) -> Result<(), DiscordError> {
        self.rest.edit_message(*channel, *message_id, content).await
    }
}
