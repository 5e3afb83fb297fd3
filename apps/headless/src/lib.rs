//! Lemon Gateway's headless server binary and command-line client, on top of
//! [`lemon_server`].
//!
//! # Layout
//! - [`cli`]: the command line (`serve`, `run`, `status`), logging and signals.
//! - [`client`]: the `run` and `status` commands, talking to a running gateway.
//! - [`sse`]: a small Server-Sent Events reader for the client.

pub mod cli;
pub mod client;
pub mod sse;
