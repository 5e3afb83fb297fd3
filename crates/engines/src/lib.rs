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

use lemon_core::engine::{Availability, Engine, EngineRegistry, RegistryError, UnavailableReason};

pub mod cli;
pub mod config;
pub mod echo;
#[doc(hidden)]
pub mod fuzzing;
pub mod llm;
pub mod mcp;
pub mod native;
pub mod tools;

/// The engine table `sections` ask for: echo (always, paced by its
/// `delay_ms`), every vendor CLI not disabled and the native `lemon` engine
/// (unavailable without its provider key) unless disabled. A CLI that is not
/// installed is still registered, as unavailable; the unavailable ones are
/// logged in one line ([`unavailable_summary`]), where each looked at debug level.
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
    let mut unavailable = Vec::new();
    for engine in cli::build_cli_engines(sections, ctx).into_iter().chain(native) {
        if let Availability::Unavailable { reason } = engine.availability() {
            tracing::debug!(engine = %engine.id(), %reason, "engine unavailable");
            unavailable.push((engine.id().to_string(), reason));
        }
        registry.register(engine)?;
    }
    if let Some(summary) = unavailable_summary(&unavailable) {
        tracing::info!("engines unavailable: {summary}");
    }
    Ok(registry)
}

/// Unavailable engines in one line, those with the same short reason together:
/// `claude, codex: not found on PATH; set cli_path`, groups joined by ` | `.
/// `None` when every engine is available.
pub fn unavailable_summary(engines: &[(String, UnavailableReason)]) -> Option<String> {
    let mut groups: Vec<(String, Vec<&str>)> = Vec::new();
    for (id, reason) in engines {
        let short = reason.short();
        match groups.iter_mut().find(|(reason, _)| *reason == short) {
            Some((_, ids)) => ids.push(id),
            None => groups.push((short, vec![id])),
        }
    }
    let parts: Vec<String> =
        groups.iter().map(|(reason, ids)| format!("{}: {reason}", ids.join(", "))).collect();
    (!parts.is_empty()).then(|| parts.join(" | "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    #[test]
    fn unavailable_engines_are_summarised_by_reason() {
        let not_found = |program: &str| UnavailableReason::NotFound {
            program: program.to_owned(),
            search_path: "/usr/bin:/bin".to_owned(),
        };
        let engines = vec![
            ("claude".to_owned(), not_found("claude")),
            ("codex".to_owned(), not_found("codex")),
            ("pi".to_owned(), UnavailableReason::MissingPath { path: PathBuf::from("/opt/pi") }),
        ];
        assert_eq!(
            unavailable_summary(&engines).as_deref(),
            Some("claude, codex: not found on PATH; set cli_path | pi: cli_path /opt/pi does not exist")
        );
        assert_eq!(unavailable_summary(&[]), None);
    }
}
