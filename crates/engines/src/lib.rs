//! Lemon Gateway engines: implementations of [`lemon_core::engine::Engine`].
//!
//! # Layout
//! - [`config`]: `[gateway.engines.*]` parsed from the raw sections core keeps,
//!   with errors placed in the file.
//! - [`echo`]: streams the prompt back word by word; for tests, benchmarks and smoke checks.
//! - [`cli`]: vendor coding CLIs (Claude Code, Codex, OpenCode, Pi, Droid) run as child processes;
//!   [`cli::build_cli_engines`] turns their sections into engines.
//! - [`llm`]: the LLM clients of the native engine, over one request/event model.
//! - [`native`]: the native `lemon` engine: the agent loop over an LLM client and tools.
//! - [`tools`]: the native engine's built-in tools (`bash`, `read`, `edit`, `fetch`…) and
//!   the gateway's tools (`sms_*`, `telegram_send_image`, `discord_send_file`).
//! - [`build_registry`]: the whole engine table, at a start and after every config edit.

use std::sync::Arc;

use lemon_core::engine::{Availability, Engine, EngineRegistry, RegistryError};

pub mod cli;
pub mod config;
pub mod echo;
pub mod llm;
pub mod native;
pub mod tools;

/// The engine table `sections` ask for: echo (always, paced by its
/// `delay_ms`), every vendor CLI not disabled and the native `lemon` engine
/// (unavailable without its provider key) unless disabled. A CLI that is not installed
/// is still registered, as unavailable, and its reason is logged.
///
/// # Errors
/// Two engines with one id.
pub fn build_registry(
    sections: &config::EngineSections,
    ctx: &cli::CliContext,
) -> Result<EngineRegistry, RegistryError> {
    let mut registry = EngineRegistry::new();
    registry
        .register(Arc::new(echo::EchoEngine::new(sections.echo_delay(), ctx.tracker.clone())))?;
    let native = native::build(sections, ctx).map(|engine| Arc::new(engine) as Arc<dyn Engine>);
    for engine in cli::build_cli_engines(sections, ctx).into_iter().chain(native) {
        if let Availability::Unavailable { reason } = engine.availability() {
            tracing::info!(engine = %engine.id(), %reason, "engine unavailable");
        }
        registry.register(engine)?;
    }
    Ok(registry)
}
