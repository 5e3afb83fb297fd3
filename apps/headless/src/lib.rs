//! Lemon Gateway's headless server, assembled from the library crates.
//!
//! # Layout
//! - [`paths`]: where state lives (`$LEMON_HOME`, `config.toml`, the database, secrets).
//! - [`server`]: builds the gateway from config, serves the control API and health,
//!   reloads config edits, and drains on shutdown.
//! - [`cli`]: the command line (`serve`, `run`, `status`).
//! - [`client`]: the `run` and `status` commands, talking to a running gateway.
//! - [`sse`]: a small Server-Sent Events reader for the client.

pub mod cli;
pub mod client;
pub mod paths;
pub mod server;
pub mod sse;
