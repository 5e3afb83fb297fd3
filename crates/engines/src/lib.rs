//! Lemon Gateway engines: implementations of [`lemon_core::engine::Engine`].
//!
//! # Layout
//! - [`echo`]: streams the prompt back word by word; for tests, benchmarks and smoke checks.
//! - [`cli`]: vendor coding CLIs (Claude Code, Codex, OpenCode, Pi, Droid) run as child processes;
//!   [`cli::build_cli_engines`] turns `[gateway.engines.*]` into engines.

pub mod cli;
pub mod echo;
