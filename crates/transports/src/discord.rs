//! The Discord transport: a bot on the Gateway WebSocket that turns messages
//! and slash commands into runs through the router and streams answers back
//! by editing one message, through the shared delivery layer.
//!
//! - [`config`]: the `[gateway.discord]` section.
//! - [`gateway`]: the Gateway WebSocket session (identify, heartbeats, resume,
//!   reconnect with backoff, invalid sessions).
//! - [`rest`]: the REST calls, inside the rate-limit buckets Discord announces.
//! - [`inbound`]: session keys, run ids, mentions, commands.
//! - [`render`]: the working message and the answer's parts.
//! - [`sink`]: Discord as the outbox's [`Sink`](crate::delivery::Sink).
//! - [`bot`]: [`bot::DiscordTransport`], the transport itself.

pub mod bot;
pub mod config;
pub mod gateway;
pub mod inbound;
pub mod render;
pub mod rest;
pub mod sink;
pub mod types;
