//! Pure resolution of a request: explicit resume lines, engine directives, slash
//! commands, bindings, the engine and the conversation key. Nothing here touches the store or the bus, so every rule is a unit test.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::config::{BindingConfig, GatewayConfig, ProjectConfig, QueueMode, SessionLimits};
use crate::engine::validate::{check_engine_ref_model, check_model};
use crate::engine::{extract_plain_resume, EngineRegistry, Field, InvalidValue, ResumeToken};
use crate::ids::{ConversationKey, EngineId, EngineRef, EngineRefError, Model, SessionKey};

use super::ChannelRef;

/// The prompt used when a message held nothing but a resume line.
pub const CONTINUE_PROMPT: &str = "Continue.";

/// The engine ids a leading `/<id>` directive may name even before the engine is
/// registered, so `/claude` on a server without Claude fails clearly instead of
/// being sent to the default engine as text.
pub const DIRECTIVE_ENGINES: [&str; 7] =
    ["lemon", "claude", "codex", "opencode", "pi", "droid", "echo"];

/// The message shown when `native_only` refuses a vendor resume token.
pub const NATIVE_ONLY_RESUME_MESSAGE: &str = "Top-level router resumes support only the native \"lemon\" engine. Use `lemon resume <id>` or omit the resume token.";

/// A prompt with its explicit resume line taken out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExtractedResume {
    pub token: ResumeToken,
    /// The prompt without the resume line; [`CONTINUE_PROMPT`] when nothing is left.
    pub prompt: String,
}

/// Finds the first line that is exactly a resume line of a registered engine (or
/// the built-in `lemon resume <id>`), and removes it from the prompt. A resume
/// command mentioned inside a sentence is text, not a resume.
pub fn extract_resume_line(engines: &EngineRegistry, prompt: &str) -> Option<ExtractedResume> {
    let lines: Vec<&str> = prompt.lines().collect();
    for (at, line) in lines.iter().enumerate() {
        let Some(token) = resume_of_line(engines, line) else { continue };
        let rest: Vec<&str> =
            lines.iter().enumerate().filter(|(i, _)| *i != at).map(|(_, l)| *l).collect();
        let rest = rest.join("\n").trim().to_owned();
        let prompt = if rest.is_empty() { CONTINUE_PROMPT.to_owned() } else { rest };
        return Some(ExtractedResume { token, prompt });
    }
    None
}

fn resume_of_line(engines: &EngineRegistry, line: &str) -> Option<ResumeToken> {
    if line.trim().is_empty() {
        return None;
    }
    for engine in engines.iter() {
        if engine.is_resume_line(line) {
            if let Some(token) = engine.extract_resume(line) {
                return Some(token);
            }
        }
    }
    // The native format is known even when no `lemon` engine is registered, so a
    // pasted `lemon resume <id>` is never sent to another engine as text.
    let bare = line.trim().trim_matches('`').trim();
    let token = extract_plain_resume("lemon", bare)?;
    let words: Vec<&str> = bare.split_whitespace().collect();
    (words.len() == 3).then_some(token)
}

/// A leading `/<engine>` directive and the prompt after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Directive {
    /// The engine as written, possibly composite (`claude:opus`).
    pub engine: EngineRef,
    pub prompt: String,
}

/// Parses `/<engine> rest…` where `<engine>` (or its prefix before `:`) is a known
/// directive name or a registered engine. Anything else is not a directive; a
/// directive whose model part is not a safe model name is refused.
pub fn parse_directive(
    engines: &EngineRegistry,
    prompt: &str,
) -> Option<Result<Directive, Refusal>> {
    let trimmed = prompt.trim_start();
    let rest = trimmed.strip_prefix('/')?;
    let end = rest.find(char::is_whitespace).unwrap_or(rest.len());
    let name = &rest[..end];
    let prefix = name.split(':').next().unwrap_or(name);
    let known =
        DIRECTIVE_ENGINES.contains(&prefix) || engines.ids().any(|id| id.as_str() == prefix);
    if name.is_empty() || !known {
        return None;
    }
    let after = rest[end..].trim();
    let prompt = if after.is_empty() { CONTINUE_PROMPT.to_owned() } else { after.to_owned() };
    Some(parse_engine_ref(name, Field::Prompt).map(|engine| Directive { engine, prompt }))
}

/// Strips what the router takes out of a prompt before it runs: an explicit
/// resume line (unless the request carries a structured token) and a leading
/// `/<engine>` directive (unless `native_only`). Gives the prompt as it runs, the
/// resume line found and the directive.
pub fn strip_prompt(
    engines: &EngineRegistry,
    prompt: &str,
    structured_resume: bool,
    native_only: bool,
) -> StrippedPrompt {
    let mut prompt = prompt.to_owned();
    let mut resume = None;
    if !structured_resume {
        if let Some(found) = extract_resume_line(engines, &prompt) {
            prompt = found.prompt;
            resume = Some(found.token);
        }
    }
    let directive = if native_only { None } else { parse_directive(engines, &prompt) };
    if let Some(Ok(directive)) = &directive {
        prompt.clone_from(&directive.prompt);
    }
    StrippedPrompt { prompt, resume, directive }
}

/// A prompt with its resume line and directive taken out, by [`strip_prompt`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StrippedPrompt {
    pub prompt: String,
    /// The resume line found in the prompt (not checked yet).
    pub resume: Option<ResumeToken>,
    /// The leading directive, or why its engine was refused.
    pub directive: Option<Result<Directive, Refusal>>,
}

/// An engine reference a caller or a message wrote (`claude`, `claude:opus`),
/// parsed; a refusal names `field` and does not repeat the caller's text.
///
/// # Errors
/// A [`Refusal`] when the id has the wrong shape or the model is not a safe
/// model name.
pub fn parse_engine_ref(raw: &str, field: Field) -> Result<EngineRef, Refusal> {
    EngineRef::parse(raw).map_err(|err| match err {
        EngineRefError::Id(_) => Refusal {
            field,
            what:
                "invalid engine id, which must match ^[a-z][a-z0-9_-]*$ and not be default or help"
                    .to_owned(),
            why: InvalidValue::Shape,
        },
        EngineRefError::EmptyModel(_) => Refusal {
            field,
            what: format!("invalid model for {}", engine_name(raw)),
            why: InvalidValue::Empty,
        },
        EngineRefError::Model(why) => {
            Refusal { field, what: format!("invalid model for {}", engine_name(raw)), why }
        }
    })
}

/// A command the router answers itself instead of running it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SlashCommand {
    /// Cancel the conversation's active run; its queue stays.
    Cancel,
    /// The next message starts a new session (no auto-resume).
    New,
    /// Report the active run, the queue length and the engine.
    Status,
    /// Make `engine` sticky for the session; `None` shows the current choice.
    Engine(Option<String>),
}

/// Parses `/cancel`, `/new`, `/status` and `/engine [id]` (the whole message).
pub fn parse_slash_command(prompt: &str) -> Option<SlashCommand> {
    let mut words = prompt.split_whitespace();
    let first = words.next()?.to_ascii_lowercase();
    let arg = words.next().map(str::to_owned);
    let extra = words.next().is_some();
    match (first.as_str(), arg, extra) {
        ("/cancel", None, false) => Some(SlashCommand::Cancel),
        ("/new", None, false) => Some(SlashCommand::New),
        ("/status", None, false) => Some(SlashCommand::Status),
        ("/engine", arg, false) => Some(SlashCommand::Engine(arg)),
        _ => None,
    }
}

/// What a channel binding contributes to a request.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BindingDefaults {
    pub cwd: Option<PathBuf>,
    pub agent_id: Option<String>,
    /// The topic binding's engine, then the chat binding's, then the project's.
    pub default_engine: Option<EngineRef>,
    pub queue_mode: Option<QueueMode>,
    /// The topic binding's limits over the chat binding's, key by key.
    pub budget: Option<SessionLimits>,
    /// The project the topic binding names, else the chat binding's.
    pub project: Option<String>,
    /// The topic binding's `tools`, else the chat binding's.
    pub tools: Option<Vec<String>>,
}

/// Resolves the bindings of a channel: a binding for the exact topic wins over the
/// chat's binding, key by key, and the project gives the working directory and a
/// fallback engine.
pub fn resolve_binding(config: &GatewayConfig, channel: &ChannelRef) -> BindingDefaults {
    let (topic, chat) = matching_bindings(&config.bindings, channel);
    fn pick<T>(
        topic: Option<&BindingConfig>,
        chat: Option<&BindingConfig>,
        f: impl Fn(&BindingConfig) -> Option<T>,
    ) -> Option<T> {
        topic.and_then(&f).or_else(|| chat.and_then(&f))
    }
    let project_id = pick(topic, chat, |b| b.project.clone());
    let project = project_id.as_deref().and_then(|id| config.project(id));
    BindingDefaults {
        cwd: project.as_ref().map(|p| p.root.clone()),
        agent_id: pick(topic, chat, |b| b.agent_id.clone()),
        default_engine: pick(topic, chat, |b| b.default_engine.clone())
            .or_else(|| project.as_ref().and_then(|p| p.default_engine.clone())),
        queue_mode: topic.and_then(|b| b.queue_mode).or_else(|| chat.and_then(|b| b.queue_mode)),
        budget: match (topic.and_then(|b| b.budget), chat.and_then(|b| b.budget)) {
            (Some(topic), Some(chat)) => Some(topic.over(&chat)),
            (topic, chat) => topic.or(chat),
        },
        tools: pick(topic, chat, |b| b.tools.clone()),
        project: project_id,
    }
}

/// The project a run belongs to: the one its binding names, else the one
/// whose root is the deepest holding the run's directory (as the approval
/// rules of projects are found).
pub fn project_of<'a>(
    config: &'a GatewayConfig,
    bound: Option<&str>,
    cwd: Option<&Path>,
) -> Option<&'a ProjectConfig> {
    match bound {
        Some(id) => config.project(id),
        None => {
            let cwd = cwd?;
            config
                .projects
                .values()
                .filter(|project| cwd.starts_with(&project.root))
                .max_by_key(|project| project.root.components().count())
        }
    }
}

/// Narrows the tool filter `meta` carries ([`crate::mcp::META_KEY`]) by the
/// project's `tools`, then the binding's: a run is offered a tool only when
/// the request's own filter, the project's and the binding's lists all let
/// it through. Unset lists narrow nothing.
pub fn narrow_tools(
    meta: &mut BTreeMap<String, serde_json::Value>,
    project: Option<&[String]>,
    binding: Option<&[String]>,
) {
    for patterns in [project, binding].into_iter().flatten() {
        crate::mcp::ToolFilter::narrow_meta(meta, patterns);
    }
}

/// The bindings of a channel: the one of its exact topic, and the chat's.
pub fn matching_bindings<'a>(
    bindings: &'a [BindingConfig],
    channel: &ChannelRef,
) -> (Option<&'a BindingConfig>, Option<&'a BindingConfig>) {
    let matches_chat = |binding: &BindingConfig| {
        binding.transport == channel.transport && binding.chat_id_text() == channel.chat_id
    };
    let topic = channel.topic_id.as_ref().and_then(|topic_id| {
        bindings.iter().find(|b| matches_chat(b) && b.topic_id_text().as_ref() == Some(topic_id))
    });
    let chat = bindings.iter().find(|b| matches_chat(b) && b.topic_id.is_none());
    (topic, chat)
}

/// Where the engine and resume token of a request came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResumeSource {
    /// A resume line in the prompt or a structured token from the caller.
    Explicit,
    /// The session's chat state.
    Auto,
}

impl ResumeSource {
    pub fn as_str(self) -> &'static str {
        match self {
            ResumeSource::Explicit => "explicit",
            ResumeSource::Auto => "auto",
        }
    }
}

/// The inputs of engine selection, already extracted from the request.
#[derive(Debug, Clone)]
pub struct EngineInputs<'a> {
    pub explicit_resume: Option<ResumeToken>,
    /// The caller's engine hint, then an inline directive, then the sticky choice.
    pub chosen: Option<&'a EngineRef>,
    /// The session's last engine and token, unless auto-resume is disabled.
    pub chat_state: Option<ResumeToken>,
    pub binding_engine: Option<&'a EngineRef>,
    pub default_engine: &'a EngineRef,
    pub native_only: bool,
}

/// The engine a request runs on and the token it continues.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineChoice {
    pub engine: EngineRef,
    pub resume: Option<ResumeToken>,
    pub source: Option<ResumeSource>,
}

/// Why no engine could be chosen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChoiceError {
    /// `native_only` refuses explicit vendor tokens.
    UnsupportedResumeEngine { engine: String },
    /// A resume token names no engine id (its engine part has the wrong shape).
    UnknownEngine { engine: String },
}

/// The native engine's id, the only one `native_only` runs.
pub const NATIVE_ENGINE: &str = "lemon";

fn same_engine(chosen: &EngineRef, token_engine: &str) -> bool {
    chosen == token_engine || chosen.is(token_engine)
}

/// The engine a resume token names.
fn engine_of(token: &ResumeToken) -> Result<EngineRef, ChoiceError> {
    EngineRef::parse(&token.engine)
        .map_err(|_| ChoiceError::UnknownEngine { engine: token.engine.clone() })
}

fn native() -> EngineRef {
    EngineRef::new(EngineId::builtin(NATIVE_ENGINE))
}

/// Engine selection: explicit resume token's engine → caller hint / directive /
/// sticky engine → the stored session (auto-resume) → binding (topic, then chat,
/// then project) → the global default. An auto-resume applies only when it is
/// compatible with an explicitly chosen engine.
pub fn choose_engine(inputs: EngineInputs<'_>) -> Result<EngineChoice, ChoiceError> {
    if inputs.native_only {
        if let Some(token) = inputs.explicit_resume {
            if token.engine != NATIVE_ENGINE {
                return Err(ChoiceError::UnsupportedResumeEngine { engine: token.engine });
            }
            return Ok(EngineChoice {
                engine: native(),
                resume: Some(token),
                source: Some(ResumeSource::Explicit),
            });
        }
        // Stored vendor tokens stay in the store ("quarantined") but are not used.
        let resume = inputs.chat_state.filter(|t| t.engine == NATIVE_ENGINE);
        let source = resume.as_ref().map(|_| ResumeSource::Auto);
        return Ok(EngineChoice { engine: native(), resume, source });
    }
    if let Some(token) = inputs.explicit_resume {
        return Ok(EngineChoice {
            engine: engine_of(&token)?,
            resume: Some(token),
            source: Some(ResumeSource::Explicit),
        });
    }
    if let Some(chosen) = inputs.chosen {
        let resume = inputs.chat_state.filter(|t| same_engine(chosen, &t.engine));
        let source = resume.as_ref().map(|_| ResumeSource::Auto);
        return Ok(EngineChoice { engine: chosen.clone(), resume, source });
    }
    if let Some(token) = inputs.chat_state {
        return Ok(EngineChoice {
            engine: engine_of(&token)?,
            resume: Some(token),
            source: Some(ResumeSource::Auto),
        });
    }
    let engine = inputs.binding_engine.unwrap_or(inputs.default_engine).clone();
    Ok(EngineChoice { engine, resume: None, source: None })
}

/// A value of a request refused before anything was queued: which field, what
/// it was meant to be (`invalid resume token for claude`) and why it was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub field: Field,
    pub what: String,
    pub why: InvalidValue,
}

impl From<Refusal> for super::RouteError {
    fn from(refusal: Refusal) -> Self {
        super::RouteError::Invalid { field: refusal.field, what: refusal.what, why: refusal.why }
    }
}

/// The engine part of an engine reference, for messages: the id when it is one,
/// else a neutral word (the raw text is the caller's and is not repeated).
fn engine_name(engine_ref: &str) -> &str {
    let prefix = engine_ref.split(':').next().unwrap_or(engine_ref);
    if EngineId::parse(prefix).is_ok() {
        prefix
    } else {
        "the engine"
    }
}

/// The model part of a composite engine reference (`claude:opus`), from `field`.
///
/// # Errors
/// A [`Refusal`] naming `field` when the model is not a safe model name.
pub fn check_engine_model(engine_ref: &str, field: Field) -> Result<(), Refusal> {
    check_engine_ref_model(engine_ref).map_err(|why| Refusal {
        field,
        what: format!("invalid model for {}", engine_name(engine_ref)),
        why,
    })
}

/// The request's model (the control API's `meta.model`).
///
/// # Errors
/// A [`Refusal`] of [`Field::MetaModel`] when it is not a safe model name.
pub fn check_request_model(model: &str, engine_ref: &str) -> Result<(), Refusal> {
    check_model(model).map_err(|why| Refusal {
        field: Field::MetaModel,
        what: format!("invalid model for {}", engine_name(engine_ref)),
        why,
    })
}

/// The request's model, checked as [`check_request_model`] does, for `engine`.
///
/// # Errors
/// A [`Refusal`] of [`Field::MetaModel`] when it is not a safe model name.
pub fn request_model(model: &str, engine: &EngineRef) -> Result<Model, Refusal> {
    Model::parse(model).map_err(|why| Refusal {
        field: Field::MetaModel,
        what: format!("invalid model for {}", engine.id()),
        why,
    })
}

/// A resume token: its engine's model part (from `engine_field`), then its value
/// against the shape its engine accepts (from `value_field`).
///
/// # Errors
/// A [`Refusal`] naming the field whose value was refused.
pub fn check_resume_token(
    engines: &EngineRegistry,
    token: &ResumeToken,
    engine_field: Field,
    value_field: Field,
) -> Result<(), Refusal> {
    check_engine_model(&token.engine, engine_field)?;
    engines.check_resume(token).map_err(|why| Refusal {
        field: value_field,
        what: format!("invalid resume token for {}", engine_name(&token.engine)),
        why,
    })
}

/// The conversation a request belongs to: the explicit token's, else its session's.
pub fn conversation_key(
    session_key: &SessionKey,
    explicit: Option<&ResumeToken>,
) -> ConversationKey {
    match explicit {
        Some(token) => ConversationKey::resume(&token.engine, &token.value),
        None => ConversationKey::session(session_key),
    }
}

/// The queue mode: the request's, then the binding's, then `[gateway.queue] mode`,
/// then `collect`.
pub fn queue_mode(
    requested: Option<QueueMode>,
    binding: Option<QueueMode>,
    configured: Option<QueueMode>,
) -> QueueMode {
    requested.or(binding).or(configured).unwrap_or(QueueMode::Collect)
}

#[cfg(test)]
mod tests;
