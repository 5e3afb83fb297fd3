//! `[gateway.engines.lemon]`: the native engine's provider, model, limits and
//! tools, checked when the config is read.

use std::fmt;

use lemon_core::config::invalid_model_message;
use lemon_core::engine::validate::check_model;

use crate::config::{EngineSection, SectionError};

/// The keys of `[gateway.engines.lemon]` [`NativeSettings::from_section`]
/// reads, for the schema of `config.toml`.
#[derive(schemars::JsonSchema)]
#[allow(dead_code)] // Only the schema is used; `from_section` reads the keys.
pub(crate) struct NativeKeys {
    /// `false` leaves the engine out of the table.
    #[schemars(extend("default" = true))]
    enabled: Option<bool>,
    /// The wire protocol: `openai` (Chat Completions, and every compatible
    /// server: Ollama, vLLM, llama.cpp, OpenRouter…), `openai-responses` or
    /// `anthropic`.
    #[schemars(schema_with = "provider_schema")]
    provider: Option<String>,
    /// The server's base URL (`http://127.0.0.1:11434/v1` for Ollama).
    /// Unset: the provider's public endpoint.
    #[schemars(pattern(r"^https?://"))]
    base_url: Option<String>,
    /// The model of runs that name none. Unset: `gpt-4o-mini` (openai),
    /// `claude-sonnet-4-5` (anthropic).
    model: Option<String>,
    /// The name of the secret holding the provider's key; `""` for a server
    /// that takes none. A server on this machine (`localhost`, `127.0.0.1`)
    /// gets a key only when one is set. Unset: `openai_api_key` (openai),
    /// `anthropic_api_key` (anthropic).
    api_key_secret: Option<String>,
    /// The most tokens one model turn may answer with. Unset: the
    /// provider's default.
    #[schemars(range(min = 1, max = u32::MAX))]
    max_tokens: Option<u32>,
    /// Sampling temperature. Unset: the provider's default.
    #[schemars(range(min = 0, max = 2))]
    temperature: Option<f64>,
    /// Instructions put before every conversation.
    system_prompt: Option<String>,
    /// Model turns of one run; then it stops and says the limit was hit.
    #[schemars(range(min = 1, max = 1000), extend("default" = DEFAULT_MAX_TURNS))]
    max_turns: Option<u32>,
    /// The built-in tools offered. Unset: all of them.
    #[schemars(schema_with = "tools_schema")]
    tools: Option<Vec<String>>,
    /// Tokens of context; a conversation estimated over 90% of it is
    /// compacted. Unset: 128000 (openai), 200000 (anthropic).
    #[schemars(range(min = 1000, max = 100_000_000))]
    context_window: Option<u64>,
    /// Images sent with a message (PNG, JPEG, GIF, WebP) are shown to the
    /// model; off, the model has the path the prompt names. A server that
    /// refuses a request with images gets the turn again without them.
    #[schemars(extend("default" = true))]
    vision: Option<bool>,
}

/// Every provider, as `provider` names it.
pub(crate) const PROVIDERS: [ProviderKind; 3] =
    [ProviderKind::OpenAi, ProviderKind::OpenAiResponses, ProviderKind::Anthropic];

fn provider_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let names: Vec<&str> = PROVIDERS.iter().map(|kind| kind.as_str()).collect();
    schemars::json_schema!({ "type": "string", "enum": names, "default": ProviderKind::OpenAi.as_str() })
}

fn tools_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({ "type": "array", "items": { "type": "string", "enum": BUILTIN_TOOLS } })
}

/// The engine's id.
pub const ENGINE_ID: &str = "lemon";

/// The built-in tools a `tools` allow list may name.
pub const BUILTIN_TOOLS: &[&str] =
    &["bash", "read", "write", "edit", "list", "grep", "glob", "fetch"];

/// Model turns of one run unless `max_turns` says otherwise.
pub const DEFAULT_MAX_TURNS: u32 = 25;

/// The wire protocol the engine speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProviderKind {
    /// OpenAI Chat Completions (and every compatible server).
    OpenAi,
    /// OpenAI Responses.
    OpenAiResponses,
    /// Anthropic Messages.
    Anthropic,
}

impl ProviderKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ProviderKind::OpenAi => "openai",
            ProviderKind::OpenAiResponses => "openai-responses",
            ProviderKind::Anthropic => "anthropic",
        }
    }

    fn parse(value: &str) -> Option<Self> {
        PROVIDERS.into_iter().find(|kind| kind.as_str() == value)
    }

    /// The secret holding the key unless `api_key_secret` names another.
    pub fn default_secret(self) -> &'static str {
        match self {
            ProviderKind::OpenAi | ProviderKind::OpenAiResponses => "openai_api_key",
            ProviderKind::Anthropic => "anthropic_api_key",
        }
    }

    /// The model unless `model` names another.
    pub fn default_model(self) -> &'static str {
        match self {
            ProviderKind::OpenAi | ProviderKind::OpenAiResponses => "gpt-4o-mini",
            ProviderKind::Anthropic => "claude-sonnet-4-5",
        }
    }

    /// Whether images sent with a message are shown to the model unless
    /// `vision` says otherwise: yes for every provider. OpenAI's and
    /// Anthropic's current models see; so do the vision models of
    /// compatible servers, and a server or model that refuses a request with
    /// images gets the turn again without them (the prompt names the files).
    pub fn default_vision(self) -> bool {
        match self {
            ProviderKind::OpenAi | ProviderKind::OpenAiResponses | ProviderKind::Anthropic => true,
        }
    }

    /// Tokens of context unless `context_window` says otherwise.
    pub fn default_context_window(self) -> u64 {
        match self {
            ProviderKind::OpenAi | ProviderKind::OpenAiResponses => 128_000,
            ProviderKind::Anthropic => 200_000,
        }
    }
}

impl fmt::Display for ProviderKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The settings of `[gateway.engines.lemon]`, defaults filled in.
#[derive(Debug, Clone, PartialEq)]
pub struct NativeSettings {
    pub enabled: bool,
    pub provider: ProviderKind,
    /// `None`: the provider's public endpoint.
    pub base_url: Option<String>,
    pub model: String,
    pub api_key_secret: String,
    pub max_tokens: Option<u32>,
    pub temperature: Option<f32>,
    pub system_prompt: Option<String>,
    pub max_turns: u32,
    /// Built-in tools offered; `None`: all of them.
    pub tools: Option<Vec<String>>,
    pub context_window: u64,
    /// Images sent with a message (PNG, JPEG, GIF, WebP within
    /// [`super::images`]' bounds) are shown to the model; when off, or for
    /// any other file, the model has the path the prompt names.
    pub vision: bool,
}

impl NativeSettings {
    /// Whether the engine runs without a key: `api_key_secret = ""`, or a
    /// `base_url` on this machine (`localhost`, `127.0.0.1`, `[::1]`: a local
    /// server such as Ollama), where a key is sent only when one is set.
    pub fn key_optional(&self) -> bool {
        self.api_key_secret.is_empty() || self.base_url.as_deref().is_some_and(is_local_url)
    }
}

/// `http(s)://localhost…`, `127.x.x.x` or `[::1]`.
fn is_local_url(url: &str) -> bool {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let host = match authority.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or_default(),
        None => authority.rsplit_once(':').map_or(authority, |(host, _)| host),
    };
    host.eq_ignore_ascii_case("localhost")
        || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

impl Default for NativeSettings {
    fn default() -> Self {
        let provider = ProviderKind::OpenAi;
        NativeSettings {
            enabled: true,
            provider,
            base_url: None,
            model: provider.default_model().to_owned(),
            api_key_secret: provider.default_secret().to_owned(),
            max_tokens: None,
            temperature: None,
            system_prompt: None,
            max_turns: DEFAULT_MAX_TURNS,
            tools: None,
            context_window: provider.default_context_window(),
            vision: provider.default_vision(),
        }
    }
}

fn str_key(section: &EngineSection, key: &str) -> Result<Option<String>, SectionError> {
    match section.other.get(key) {
        None => Ok(None),
        Some(value) => match value.as_str() {
            Some(text) => Ok(Some(text.trim().to_owned()).filter(|t| !t.is_empty())),
            None => Err(SectionError::at(
                key,
                format!("invalid type: {}, expected a string", value.type_str()),
            )),
        },
    }
}

fn int_key(
    section: &EngineSection,
    key: &str,
    min: i64,
    max: i64,
) -> Result<Option<i64>, SectionError> {
    match section.other.get(key) {
        None => Ok(None),
        Some(value) => match value.as_integer() {
            Some(n) if (min..=max).contains(&n) => Ok(Some(n)),
            Some(n) => Err(SectionError::at(key, format!("{n}: must be between {min} and {max}"))),
            None => Err(SectionError::at(
                key,
                format!("invalid type: {}, expected an integer", value.type_str()),
            )),
        },
    }
}

fn bool_key(section: &EngineSection, key: &str) -> Result<Option<bool>, SectionError> {
    match section.other.get(key) {
        None => Ok(None),
        Some(value) => match value.as_bool() {
            Some(flag) => Ok(Some(flag)),
            None => Err(SectionError::at(
                key,
                format!("invalid type: {}, expected true or false", value.type_str()),
            )),
        },
    }
}

impl NativeSettings {
    /// The settings `section` (the engine's `[gateway.engines.lemon]`, if the
    /// file has one) asks for.
    ///
    /// # Errors
    /// The first key with a wrong type or value, naming the key.
    pub fn from_section(section: Option<&EngineSection>) -> Result<Self, SectionError> {
        let Some(section) = section else { return Ok(NativeSettings::default()) };
        let provider = match str_key(section, "provider")? {
            None => ProviderKind::OpenAi,
            Some(name) => ProviderKind::parse(&name).ok_or_else(|| {
                SectionError::at(
                    "provider",
                    format!(
                        "unknown provider {name:?}: expected \"openai\", \"openai-responses\" or \"anthropic\""
                    ),
                )
            })?,
        };
        let model = section
            .model
            .as_deref()
            .map(str::trim)
            .filter(|m| !m.is_empty())
            .unwrap_or(provider.default_model())
            .to_owned();
        check_model(&model).map_err(|why| SectionError::at("model", invalid_model_message(why)))?;
        let base_url = str_key(section, "base_url")?;
        if let Some(url) = &base_url {
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                return Err(SectionError::at(
                    "base_url",
                    format!("{url:?} is not an http:// or https:// URL"),
                ));
            }
        }
        // `api_key_secret = ""`: a server that takes no key (Ollama, llama.cpp).
        let api_key_secret = match section.api_key_secret.as_deref().map(str::trim) {
            Some("") => String::new(),
            Some(name) => name.to_owned(),
            None => provider.default_secret().to_owned(),
        };
        let temperature = match section.other.get("temperature") {
            None => None,
            Some(value) => {
                let t = value.as_float().or_else(|| value.as_integer().map(|n| n as f64));
                match t {
                    Some(t) if (0.0..=2.0).contains(&t) => Some(t as f32),
                    Some(t) => {
                        return Err(SectionError::at(
                            "temperature",
                            format!("{t}: must be between 0 and 2"),
                        ))
                    }
                    None => {
                        return Err(SectionError::at(
                            "temperature",
                            format!("invalid type: {}, expected a number", value.type_str()),
                        ))
                    }
                }
            }
        };
        let tools = match section.other.get("tools") {
            None => None,
            Some(value) => {
                let names: Vec<String> = value.clone().try_into().map_err(|_| {
                    SectionError::at(
                        "tools",
                        format!(
                            "invalid type: {}, expected a list of tool names",
                            value.type_str()
                        ),
                    )
                })?;
                if let Some(unknown) = names.iter().find(|n| !BUILTIN_TOOLS.contains(&n.as_str())) {
                    return Err(SectionError::at(
                        "tools",
                        format!(
                            "unknown tool {unknown:?}: the tools are {}",
                            BUILTIN_TOOLS.join(", ")
                        ),
                    ));
                }
                Some(names)
            }
        };
        Ok(NativeSettings {
            enabled: section.enabled != Some(false),
            provider,
            base_url,
            model,
            api_key_secret,
            max_tokens: int_key(section, "max_tokens", 1, i64::from(u32::MAX))?.map(|n| n as u32),
            temperature,
            system_prompt: str_key(section, "system_prompt")?,
            max_turns: int_key(section, "max_turns", 1, 1000)?
                .map_or(DEFAULT_MAX_TURNS, |n| n as u32),
            tools,
            context_window: int_key(section, "context_window", 1000, 100_000_000)?
                .map_or(provider.default_context_window(), |n| n as u64),
            vision: bool_key(section, "vision")?.unwrap_or(provider.default_vision()),
        })
    }

    /// Whether the allow list lets built-in tool `name` through.
    pub fn allows(&self, name: &str) -> bool {
        self.tools.as_ref().is_none_or(|tools| tools.iter().any(|t| t == name))
    }
}
