//! The email transport: mail in by IMAP IDLE (or a relay's webhook), one
//! conversation per thread, the answer as a reply in the thread over SMTP.
//!
//! - [`config`] — `[gateway.email]`.
//! - [`check`] — `doctor`'s IMAP login and SMTP connection.
//! - [`message`] — what a mail means: sender checks, thread, prompt, attachments.
//! - `imap` — the mailbox watcher (UID catch-up, IDLE, reconnects).
//! - `smtp` — the reply mail and the outbox's SMTP sink.
//! - `inbound_hook` — `POST /email/inbound` for relay services.
//! - [`service`] — [`EmailTransport`](service::EmailTransport), tying them to the
//!   router and the delivery records.

pub mod check;
pub mod config;
mod imap;
mod inbound_hook;
pub mod message;
pub mod service;
mod smtp;

pub use message::TRANSPORT_ID;
