//! `[gateway.engines.<id>]`: the raw sections core keeps, parsed into the
//! settings the engines read, with errors placed in the file.
//!
//! Core checks only each section's id; every key inside belongs to the engine.
//! [`EngineSections::parse`] reads them all at once, for a start and for every
//! config edit alike, and [`build_registry`](crate::build_registry) turns them
//! into the engine table.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use lemon_core::config::{
    invalid_model_message, section_error, unknown_key_warning, ConfigError, UnknownKey,
    MAX_DURATION_MS,
};
use lemon_core::engine::validate::check_model;
use serde::de::DeserializeOwned;
use serde::Serialize;

/// The longest `max_line_bytes` a section may set (1 GiB).
pub const MAX_LINE_BYTES_LIMIT: i64 = 1 << 30;

/// One `[gateway.engines.<id>]`: the keys every engine shares plus the ones a
/// single engine reads itself (`other`).
#[derive(Clone, Default, PartialEq, Serialize)]
pub struct EngineSection {
    /// `false` leaves a CLI engine out of the table.
    pub enabled: Option<bool>,
    /// Echo: milliseconds between streamed words.
    pub delay_ms: Option<u64>,
    pub cli_path: Option<PathBuf>,
    pub extra_args: Vec<String>,
    pub model: Option<String>,
    /// Added to a CLI's environment; values may be secrets, so `Debug` shows keys only.
    pub env: BTreeMap<String, String>,
    /// Variables of the gateway's own environment passed to the CLI: names
    /// (`ANTHROPIC_API_KEY`) or prefixes (`ANTHROPIC_*`), checked by
    /// [`check_passthrough`].
    pub env_passthrough: Vec<String>,
    pub timeout_ms: Option<u64>,
    pub cancel_grace_ms: Option<u64>,
    pub dangerously_skip_permissions: Option<bool>,
    pub allowed_tools: Vec<String>,
    pub steering: Option<bool>,
    /// Name of the secret holding the engine's API key.
    pub api_key_secret: Option<String>,
    /// Engine-specific keys (`max_line_bytes`, `api_key_env`, `provider`,
    /// `reasoning_effort`, `gateway_tools`, and whatever a vendor's engine reads).
    #[serde(flatten)]
    pub other: toml::Table,
}

impl fmt::Debug for EngineSection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EngineSection")
            .field("enabled", &self.enabled)
            .field("delay_ms", &self.delay_ms)
            .field("cli_path", &self.cli_path)
            .field("extra_args", &self.extra_args)
            .field("model", &self.model)
            .field("env_keys", &self.env.keys().collect::<Vec<_>>())
            .field("env_passthrough", &self.env_passthrough)
            .field("timeout_ms", &self.timeout_ms)
            .field("cancel_grace_ms", &self.cancel_grace_ms)
            .field("dangerously_skip_permissions", &self.dangerously_skip_permissions)
            .field("allowed_tools", &self.allowed_tools)
            .field("steering", &self.steering)
            .field("api_key_secret", &self.api_key_secret)
            .field("other_keys", &self.other.keys().collect::<Vec<_>>())
            .finish()
    }
}

/// Why a section cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct SectionError {
    /// The key whose value is wrong; `None` when `message` quotes the key
    /// (`like_this`) itself.
    pub key: Option<String>,
    pub message: String,
}

impl SectionError {
    pub(crate) fn at(key: &str, message: impl Into<String>) -> Self {
        SectionError { key: Some(key.to_owned()), message: message.into() }
    }
}

/// One key's value as `T`, or an error naming the key.
fn value<T: DeserializeOwned>(key: &str, value: &toml::Value) -> Result<T, SectionError> {
    value
        .clone()
        .try_into()
        .map_err(|e: toml::de::Error| SectionError::at(key, e.message().trim().replace('\n', " ")))
}

/// A duration in milliseconds, at most [`MAX_DURATION_MS`].
fn millis(key: &str, raw: &toml::Value) -> Result<u64, SectionError> {
    let ms: u64 = value(key, raw)?;
    if ms > MAX_DURATION_MS {
        return Err(SectionError::at(
            key,
            format!("{ms} is too large: must be at most {MAX_DURATION_MS}"),
        ));
    }
    Ok(ms)
}

impl EngineSection {
    /// Parses one raw section: the shared keys by type and range (durations at
    /// most [`MAX_DURATION_MS`], a `model` that
    /// [`check_model`] accepts), the CLI engines' own keys by
    /// type and range; other keys are kept for the engine in `other`.
    ///
    /// # Errors
    /// The first key with a wrong type or value.
    pub fn parse(table: &toml::Table) -> Result<Self, SectionError> {
        let mut section = EngineSection::default();
        for (key, raw) in table {
            match key.as_str() {
                "enabled" => section.enabled = Some(value(key, raw)?),
                "delay_ms" => section.delay_ms = Some(millis(key, raw)?),
                "cli_path" => section.cli_path = Some(value(key, raw)?),
                "extra_args" => section.extra_args = value(key, raw)?,
                "model" => section.model = Some(value(key, raw)?),
                "env" => section.env = value(key, raw)?,
                "env_passthrough" => {
                    section.env_passthrough = value(key, raw)?;
                    for (i, pattern) in section.env_passthrough.iter().enumerate() {
                        check_passthrough(pattern).map_err(|why| {
                            SectionError::at(key, format!("entry {i} {pattern:?}: {why}"))
                        })?;
                    }
                }
                "timeout_ms" => section.timeout_ms = Some(millis(key, raw)?),
                "cancel_grace_ms" => section.cancel_grace_ms = Some(millis(key, raw)?),
                "dangerously_skip_permissions" => {
                    section.dangerously_skip_permissions = Some(value(key, raw)?);
                }
                "allowed_tools" => section.allowed_tools = value(key, raw)?,
                "steering" => section.steering = Some(value(key, raw)?),
                "api_key_secret" => section.api_key_secret = Some(value(key, raw)?),
                _ => {
                    section.other.insert(key.clone(), raw.clone());
                }
            }
        }
        if let Some(model) = section.model.as_deref().map(str::trim).filter(|m| !m.is_empty()) {
            check_model(model)
                .map_err(|why| SectionError::at("model", invalid_model_message(why)))?;
        }
        check_cli_keys(&section.other).map_err(|message| SectionError { key: None, message })?;
        Ok(section)
    }

    /// An engine-specific key as trimmed, non-empty text.
    pub(crate) fn other_str(&self, key: &str) -> Option<String> {
        self.other
            .get(key)
            .and_then(|value| value.as_str())
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
    }
}

/// Checks one `env_passthrough` entry: a variable name of ASCII letters,
/// digits and `_` not starting with a digit, optionally ending in `*` to
/// match every variable with that prefix (`ANTHROPIC_*`). A bare `*` and the
/// gateway's own `LEMON_*` variables are refused: they would hand the CLI the
/// gateway's secrets.
///
/// # Errors
/// Why the entry is refused.
pub fn check_passthrough(pattern: &str) -> Result<(), &'static str> {
    let name = pattern.strip_suffix('*').unwrap_or(pattern);
    if name.is_empty() {
        return Err("must name a variable or a prefix (`*` alone would pass everything)");
    }
    let valid = name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !name.starts_with(|c: char| c.is_ascii_digit());
    if !valid {
        return Err("use ASCII letters, digits and `_`, optionally ending in `*`");
    }
    if name.to_ascii_uppercase().starts_with("LEMON_") || "LEMON_".starts_with(name) {
        return Err("the gateway's own LEMON_* variables are never passed through");
    }
    Ok(())
}

/// Whether variable `name` matches one of `patterns` (see [`check_passthrough`]).
pub fn passes_through(patterns: &[String], name: &str) -> bool {
    patterns.iter().any(|pattern| match pattern.strip_suffix('*') {
        Some(prefix) => name.starts_with(prefix),
        None => name == pattern,
    })
}

/// Checks the keys only the CLI engines read (`max_line_bytes`, `api_key_env`,
/// `provider`, `reasoning_effort`, `gateway_tools`): their types and ranges.
/// The message quotes the key (`like_this`), which places it in the file.
fn check_cli_keys(other: &toml::Table) -> Result<(), String> {
    if let Some(value) = other.get("max_line_bytes") {
        match value.as_integer() {
            Some(n) if (1..=MAX_LINE_BYTES_LIMIT).contains(&n) => {}
            Some(n) => {
                return Err(format!(
                    "`max_line_bytes` = {n}: must be between 1 and {MAX_LINE_BYTES_LIMIT}"
                ))
            }
            None => {
                return Err(format!(
                    "`max_line_bytes`: invalid type: {}, expected an integer",
                    value.type_str()
                ))
            }
        }
    }
    for key in ["api_key_env", "provider", "reasoning_effort"] {
        if let Some(value) = other.get(key).filter(|value| !value.is_str()) {
            return Err(format!("`{key}`: invalid type: {}, expected a string", value.type_str()));
        }
    }
    if let Some(value) = other.get("gateway_tools").filter(|value| !value.is_bool()) {
        return Err(format!(
            "`gateway_tools`: invalid type: {}, expected a boolean",
            value.type_str()
        ));
    }
    Ok(())
}

/// The keys every engine section shares, as [`EngineSection::parse`] reads them.
pub const SHARED_KEYS: [&str; 13] = [
    "enabled",
    "delay_ms",
    "cli_path",
    "extra_args",
    "model",
    "env",
    "env_passthrough",
    "timeout_ms",
    "cancel_grace_ms",
    "dangerously_skip_permissions",
    "allowed_tools",
    "steering",
    "api_key_secret",
];

/// The keys only the CLI engines read (kept in [`EngineSection::other`]).
pub const CLI_KEYS: [&str; 5] =
    ["max_line_bytes", "api_key_env", "provider", "reasoning_effort", "gateway_tools"];

/// Every `[gateway.engines.<id>]` of a config, parsed, by engine id.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(transparent)]
pub struct EngineSections {
    sections: BTreeMap<String, EngineSection>,
}

impl EngineSections {
    /// Parses every raw section (`GatewayConfig::engines`); `path` and `text`
    /// are the file's, to place an error in it.
    ///
    /// # Errors
    /// The first section with a wrong key, as
    /// `<file>:<line>:<column>: gateway.engines.<id>.<key>: <message>`.
    pub fn parse(
        raw: &BTreeMap<String, toml::Table>,
        path: &Path,
        text: &str,
    ) -> Result<Self, ConfigError> {
        let mut sections = BTreeMap::new();
        for (id, table) in raw {
            let section = EngineSection::parse(table)
                .and_then(|section| {
                    if id == crate::native::ENGINE_ID {
                        crate::native::NativeSettings::from_section(Some(&section))?;
                    }
                    Ok(section)
                })
                .map_err(|e| {
                    // With the key in the section path the error points at its value.
                    let mut at = vec!["gateway", "engines", id.as_str()];
                    at.extend(e.key.as_deref());
                    section_error(path, text, &at, &e.message)
                })?;
            sections.insert(id.clone(), section);
        }
        Ok(EngineSections { sections })
    }

    /// Warnings about the sections, placed in the file like core's: a section
    /// named after no engine (`[gateway.engines.cluade]`, with the closest of
    /// `engines` and the vendor CLIs, enabled or not), and in the sections of
    /// echo and the vendor CLIs a key none of them reads (`cli_pth`). Another
    /// engine's section keeps its own keys.
    pub fn warnings(&self, path: &Path, text: &str, engines: &[&str]) -> Vec<String> {
        let vendors = crate::cli::Vendor::ALL.map(crate::cli::Vendor::id);
        let known_ids: Vec<&str> = engines.iter().copied().chain(vendors).chain(["echo"]).collect();
        let mut out = Vec::new();
        for (id, section) in &self.sections {
            if !known_ids.contains(&id.as_str()) {
                let unknown = UnknownKey::new(vec![id.clone()], known_ids.iter().copied());
                let warning = unknown_key_warning(path, text, &["gateway", "engines"], &unknown)
                    .replace(": unknown key ", ": unknown engine section ");
                out.push(warning);
                continue;
            }
            if id != "echo" && !vendors.contains(&id.as_str()) {
                continue;
            }
            for key in section.other.keys().filter(|key| !CLI_KEYS.contains(&key.as_str())) {
                let known = SHARED_KEYS.iter().chain(CLI_KEYS.iter()).copied();
                let unknown = UnknownKey::new(vec![key.clone()], known);
                out.push(unknown_key_warning(path, text, &["gateway", "engines", id], &unknown));
            }
        }
        out
    }

    /// The section of engine `id`, if the file has one.
    pub fn get(&self, id: &str) -> Option<&EngineSection> {
        self.sections.get(id)
    }

    /// Every section, by engine id.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &EngineSection)> {
        self.sections.iter().map(|(id, section)| (id.as_str(), section))
    }

    /// The echo engine's pause between words (`[gateway.engines.echo] delay_ms`).
    pub fn echo_delay(&self) -> Duration {
        Duration::from_millis(self.get("echo").and_then(|s| s.delay_ms).unwrap_or(0))
    }

    /// The longest `cancel_grace_ms` any section sets.
    pub fn longest_cancel_grace(&self) -> Option<Duration> {
        self.sections
            .values()
            .filter_map(|section| section.cancel_grace_ms)
            .max()
            .map(Duration::from_millis)
    }
}

impl FromIterator<(String, EngineSection)> for EngineSections {
    fn from_iter<I: IntoIterator<Item = (String, EngineSection)>>(iter: I) -> Self {
        EngineSections { sections: iter.into_iter().collect() }
    }
}

#[cfg(test)]
mod tests;
