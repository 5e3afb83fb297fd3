//! The XMTP transport: a Node.js bridge (`bridges/xmtp/bridge.mjs`, on the
//! XMTP Agent SDK) holds the wallet and the network connection; the gateway
//! starts it, speaks newline-delimited JSON with it over stdio, restarts it
//! with backoff, and keeps one conversation per XMTP conversation.
//!
//! - [`config`] — `[gateway.xmtp]`.
//! - [`attachment`] — remote attachments: fetched, checked and decrypted here.
//! - [`protocol`] — the lines the gateway and the bridge exchange.
//! - [`bridge`] — starting the bridge ([`bridge::Launcher`], given by the
//!   server, which owns process spawning) and one bridge's life: ready, lines,
//!   pings, its end.
//! - `sink` — the outbox's sink: a `send` answered by `sent` or `error`.
//! - [`service`] — [`XmtpTransport`](service::XmtpTransport): messages through
//!   the router, answers in delivery records sent through the outbox.

pub mod attachment;
pub mod bridge;
pub mod config;
pub mod protocol;
pub mod service;
mod sink;

/// The transport's id, in status, bindings and session keys.
pub const TRANSPORT_ID: &str = "xmtp";
