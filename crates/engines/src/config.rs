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
use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};
use serde::de::DeserializeOwned;
use serde::Serialize;

/// The longest `max_line_bytes` a section may set (1 GiB).
pub const MAX_LINE_BYTES_LIMIT: i64 = 1 << 30;

/// One `[gateway.engines.<id>]`: the keys every engine shares plus the ones a
/// single engine reads itself (`other`). Its schema documents the keys; the
/// defaults are the vendor CLIs' (`cli::settings`).
#[derive(Clone, Default, PartialEq, Serialize, JsonSchema)]
pub struct EngineSection {
    /// `false` leaves the engine out of the table.
    #[schemars(extend("default" = true))]
    pub enabled: Option<bool>,
    /// Milliseconds between the words the echo engine streams.
    #[schemars(range(max = MAX_DURATION_MS), extend("default" = 0))]
    pub delay_ms: Option<u64>,
    /// The executable: a path, or a name looked up on `PATH`. Unset: the
    /// engine's id (`claude`, `codex`…) on `PATH`.
    pub cli_path: Option<PathBuf>,
    /// Arguments added to the vendor's command line.
    #[schemars(extend("default" = []))]
    pub extra_args: Vec<String>,
    /// The model of runs that name none (`claude:opus` names `opus`).
    pub model: Option<String>,
    /// Variables added to the CLI's environment (`CLAUDE_CONFIG_DIR =
    /// "/srv/claude"`); values may be secrets, so they are never logged.
    #[schemars(extend("default" = {}))]
    pub env: BTreeMap<String, String>,
    /// Variables of the gateway's own environment passed to the CLI: names
    /// (`ANTHROPIC_API_KEY`) or prefixes (`ANTHROPIC_*`); never `*` alone
    /// or the gateway's own `LEMON_*`. Logged by name only.
    #[schemars(extend("default" = []), inner(pattern(r"^[A-Za-z_][A-Za-z0-9_]*\*?$")))]
    pub env_passthrough: Vec<String>,
    /// Inactivity timeout, in milliseconds: a run whose CLI prints nothing
    /// for this long fails with `timeout`; 0 turns it off.
    #[schemars(
        range(max = MAX_DURATION_MS),
        extend("default" = crate::cli::settings::DEFAULT_TIMEOUT.as_millis() as u64)
    )]
    pub timeout_ms: Option<u64>,
    /// After SIGTERM on cancel, how long before SIGKILL, in milliseconds.
    #[schemars(
        range(max = MAX_DURATION_MS),
        extend("default" = crate::cli::settings::DEFAULT_CANCEL_GRACE.as_millis() as u64)
    )]
    pub cancel_grace_ms: Option<u64>,
    /// Runs without the CLI's own permission checks (claude
    /// `--dangerously-skip-permissions`, codex
    /// `--dangerously-bypass-approvals-and-sandbox`, droid
    /// `--skip-permissions-unsafe`); claude, codex and opencode calls are
    /// then not relayed to the owner.
    #[schemars(extend("default" = false))]
    pub dangerously_skip_permissions: Option<bool>,
    /// Claude only: its `--allowedTools`.
    #[schemars(extend("default" = []))]
    pub allowed_tools: Vec<String>,
    /// Claude only: stdin stays open (`--input-format stream-json`) so a
    /// live run can be steered.
    #[schemars(extend("default" = false))]
    pub steering: Option<bool>,
    /// The name of the secret holding the engine's API key, passed to the
    /// CLI in `api_key_env`.
    pub api_key_secret: Option<String>,
    /// Engine-specific keys (`max_line_bytes`, `api_key_env`, `provider`,
    /// `reasoning_effort`, `gateway_tools`, and whatever a vendor's engine reads).
    #[serde(flatten)]
    #[schemars(skip)]
    pub other: toml::Table,
}

/// The keys only the vendor CLIs read, kept in [`EngineSection::other`]
/// and checked by `check_cli_keys`: their schema ([`CLI_KEYS`]).
#[derive(JsonSchema)]
#[allow(dead_code)] // Only the schema is used; the keys are read from `other`.
struct CliKeys {
    /// A stdout line longer than this many bytes is skipped with a warning.
    #[schemars(
        range(min = 1, max = MAX_LINE_BYTES_LIMIT),
        extend("default" = crate::cli::settings::DEFAULT_MAX_LINE_BYTES)
    )]
    max_line_bytes: Option<i64>,
    /// The variable the API key is passed in. Unset: `ANTHROPIC_API_KEY`
    /// (claude), `OPENAI_API_KEY` (codex), `FACTORY_API_KEY` (droid); opencode
    /// and pi need it set to get a key.
    api_key_env: Option<String>,
    /// Pi only: its `--provider`.
    provider: Option<String>,
    /// Droid only: its `--reasoning-effort`.
    reasoning_effort: Option<String>,
    /// Once the API listens, claude, codex, opencode and droid get the
    /// gateway's MCP endpoint with the gateway's tools (`cron`, `sms_*`…)
    /// acting for the run's session; pi has no MCP client.
    #[schemars(extend("default" = true))]
    gateway_tools: Option<bool>,
}

/// `[gateway.engines]` in the schema of `config.toml`: a table for the echo
/// engine, the native `lemon` engine and each vendor CLI, with the keys each
/// reads. A key an engine does not read is kept for it (and named by
/// `config check` for echo and the vendor CLIs).
pub fn engines_schema(generator: &mut SchemaGenerator) -> Schema {
    let shared = EngineSection::json_schema(generator);
    let cli = CliKeys::json_schema(generator);
    let native = crate::native::settings::NativeKeys::json_schema(generator);
    let properties = |schema: &Schema| {
        schema.get("properties").and_then(|p| p.as_object()).cloned().unwrap_or_default()
    };
    let section = |description: String, properties: serde_json::Map<String, serde_json::Value>| {
        json_schema!({
            "type": "object",
            "description": description,
            "properties": properties,
            "additionalProperties": true,
        })
    };
    let mut engines = serde_json::Map::new();
    let echo = properties(&shared).into_iter().filter(|(key, _)| key == "delay_ms").collect();
    engines.insert(
        "echo".to_owned(),
        section(
            "The echo engine, always there: it streams the prompt back word by word.".to_owned(),
            echo,
        )
        .to_value(),
    );
    engines.insert(
        crate::native::ENGINE_ID.to_owned(),
        section(
            "The native `lemon` engine: an LLM agent loop in the gateway, with the built-in \
             tools and the MCP servers' tools."
                .to_owned(),
            properties(&native),
        )
        .to_value(),
    );
    let mut vendor_keys = properties(&shared);
    vendor_keys.remove("delay_ms");
    vendor_keys.extend(properties(&cli));
    // The vendors share one table's schema; each adds its own description.
    let shared_name = "CliEngineSection";
    let vendor = section("A vendor CLI as an engine.".to_owned(), vendor_keys);
    generator.definitions_mut().insert(shared_name.to_owned(), vendor.to_value());
    let path = generator.settings().definitions_path.trim_end_matches('/').to_owned();
    let reference = format!("#{path}/{shared_name}");
    for vendor in crate::cli::Vendor::ALL {
        let description = format!(
            "{}'s CLI as an engine, run as `{}` (found on `PATH` unless `cli_path` says otherwise).",
            vendor.title(),
            vendor.id()
        );
        let schema = json_schema!({ "allOf": [{ "$ref": reference }], "description": description });
        engines.insert(vendor.id().to_owned(), schema.to_value());
    }
    json_schema!({
        "type": "object",
        "description": "`[gateway.engines.<id>]`: the engines' settings, one table per engine id. \
            A table named after no engine is reported by `config check`.",
        "properties": engines,
        "additionalProperties": false,
    })
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
