//! The Telegram transport: a bot that long-polls the Bot API, turns messages into
//! runs through the router and streams progress and answers back.
//!
//! - [`types`]: the Bot API types the transport sends and receives.
//! - [`format`](mod@format): Markdown answers to text with `pre`/`code` entities.
//! - [`split`]: long Markdown cut into message-sized chunks, code fences repaired.
//! - [`render`]: a run's bus events to a progress message and final messages.
//! - [`outbox`]: every write call goes through here, within Telegram's rate limits.

pub mod format;
pub mod outbox;
pub mod render;
pub mod split;
pub mod types;
