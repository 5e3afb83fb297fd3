//! The Telegram transport: a bot that long-polls the Bot API, turns messages into
//! runs through the router and streams progress and answers back.

pub mod api;
pub mod config;
pub mod inbound;
pub mod types;
