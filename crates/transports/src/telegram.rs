//! The Telegram transport: a bot that long-polls the Bot API, turns messages into
//! runs through the router and streams progress and answers back.

pub mod albums;
pub mod api;
pub mod bot;
pub mod config;
pub mod debounce;
pub mod edits;
pub mod format;
pub mod inbound;
pub mod outbox;
pub mod render;
pub mod split;
pub mod types;
