//! Lemon Gateway channels: the ways messages come in and answers go out, each a
//! [`Transport`](lemon_core::transport::Transport) run by the registry in core.
//!
//! # Layout
//! - [`access`]: who may talk to the gateway through a chat channel, one rule
//!   for all: listed, or nobody, unless `allow_everyone` opens it (warned about
//!   at every start, shown in status).
//! - [`refused`]: what a chat answers when the router does not take a
//!   message; a failing store is told once per conversation, in plain words.
//! - [`delivery`]: what every channel shares on the way out (backoff between
//!   attempts).
//! - [`webhook`]: `POST /webhooks/{integration}`, generic inbound webhooks with
//!   per-integration tokens, attachments, sync or async answers, callbacks and
//!   idempotency keys kept in the store; run as a transport by
//!   [`webhook::WebhookTransport`].
//! - [`telegram`]: the Telegram bot: long polling, progress edits through a
//!   rate-limited outbox, answers split to Telegram's limits.
//! - [`discord`]: the Discord bot: the Gateway WebSocket (resumed after drops
//!   and restarts), answers streamed by editing one message through the same
//!   outbox, REST calls inside Discord's rate-limit buckets.
//! - [`email`]: mail in by IMAP IDLE or a relay's webhook, one conversation per
//!   thread, answers as replies in the thread over SMTP.
//!
//! - [`media`]: files and voice messages people send: a capped download
//!   that keeps to public addresses, staging, and voice transcription
//!   (OpenAI-compatible or Deepgram), shared by the chat channels.
//! - [`xmtp`]: XMTP through a Node.js bridge speaking JSON lines over stdio,
//!   restarted with backoff; answers sent when the run completes.
//!
//! Listening channels serve with `lemon_api::serve_with` and answer errors with
//! `lemon_api::error::ApiError`, like the control API.

pub mod access;
pub mod ask;
pub mod delivery;
pub mod discord;
pub mod email;
#[doc(hidden)]
pub mod fuzzing;
pub mod media;
pub mod refused;
pub mod telegram;
pub mod webhook;
pub mod xmtp;
