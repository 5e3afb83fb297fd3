//! Lemon Gateway's headless server binary and command-line client, on top of
//! [`lemon_server`].
//!
//! # Layout
//! - [`cli`]: the command line, logging and signals.
//! - [`client`]: talking to a running gateway; errors a person can act on.
//! - [`run`]: `run`, `attach`, `cancel`: following a run, Ctrl-C.
//! - [`ask`]: a run's approval requests asked on the terminal `run` runs on.
//! - [`approvals_cmd`]: `approvals`, `approvals test`, `approve`, `deny`.
//! - [`show`]: `status`, `engines`, `runs`, `logs` as text or JSON.
//! - [`progress`]: the spinner and action lines on stderr.
//! - [`last_session`]: the last session of each directory, for `run --continue`.
//! - [`secrets_cmd`]: `secrets set|list|delete|migrate`.
//! - [`mcp_cmd`]: `mcp`, a stdio MCP server bridged to the running gateway's `/mcp`.
//! - [`doctor`]: `doctor`, the checks before a start.
//! - [`config_cmd`]: `config schema`, `config reference`, `config init`: the
//!   schema, reference page and starter file of `config.toml`.
//! - [`cli_reference`]: the command-line reference page (`docs cli`).
//! - [`failure`]: exit codes.
//! - [`style`]: `--color` and `NO_COLOR`.
//! - [`out`]: stdout for the commands' output, quiet on a closed pipe.
//! - [`sse`]: a small Server-Sent Events reader for the client.

pub mod approvals_cmd;
pub mod ask;
pub mod cli;
pub mod cli_reference;
pub mod client;
pub mod config_cmd;
pub mod doctor;
pub mod failure;
pub mod last_session;
pub mod mcp_cmd;
pub mod out;
pub mod progress;
pub mod run;
pub mod secrets_cmd;
pub mod show;
pub mod sse;
pub mod style;
