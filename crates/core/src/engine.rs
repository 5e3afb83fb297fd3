//! The engine contract: what every engine (echo, vendor CLIs, the native agent)
//! implements, the events it streams, resume tokens and the registry.
//!
//! An engine's [`Engine::start`] gets a [`StartRequest`] and an [`EventSink`]. It sends
//! `Started`, then any number of `Action` and `Delta` events, then exactly one
//! `Completed`, and returns a [`RunControl`] that can cancel (always) and steer (when
//! [`Capabilities::steer`] is set). The gateway run treats a sink that closes without
//! `Completed` as a crash, so an engine cannot lose a run by dying.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use tokio::sync::mpsc;

use crate::ids::{EngineId, RunId, SessionKey};

pub mod validate;

pub use validate::{Field, InvalidValue};

/// A session handle an engine can continue: `<engine> resume <value>`.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct ResumeToken {
    pub engine: String,
    pub value: String,
}

impl ResumeToken {
    pub fn new(engine: impl Into<String>, value: impl Into<String>) -> Self {
        ResumeToken { engine: engine.into(), value: value.into() }
    }
}

impl fmt::Debug for ResumeToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ResumeToken({}:{})", self.engine, self.value)
    }
}

/// What kind of step an action is; the shared tool classification.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ActionKind {
    Tool,
    Command,
    FileChange,
    WebSearch,
    Subagent,
    Reasoning,
    Note,
    Warning,
    /// A tool call waiting for the owner's answer (`detail.approval`);
    /// completed with the answer. While one is open the run's inactivity
    /// timeout is paused.
    Approval,
}

impl ActionKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ActionKind::Tool => "tool",
            ActionKind::Command => "command",
            ActionKind::FileChange => "file_change",
            ActionKind::WebSearch => "web_search",
            ActionKind::Subagent => "subagent",
            ActionKind::Reasoning => "reasoning",
            ActionKind::Note => "note",
            ActionKind::Approval => "approval",
            ActionKind::Warning => "warning",
        }
    }
}

/// Where an action is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ActionPhase {
    Started,
    Updated,
    Completed,
}

impl ActionPhase {
    pub fn as_str(self) -> &'static str {
        match self {
            ActionPhase::Started => "started",
            ActionPhase::Updated => "updated",
            ActionPhase::Completed => "completed",
        }
    }
}

/// One step an engine took (a tool call, a command, a file edit…), in one phase.
#[derive(Debug, Clone, PartialEq)]
pub struct Action {
    pub id: String,
    pub kind: ActionKind,
    pub title: String,
    /// Engine-specific detail (tool input, exit code…); `Null` when there is none.
    pub detail: serde_json::Value,
    pub phase: ActionPhase,
    pub ok: Option<bool>,
    pub message: Option<String>,
    pub level: Option<String>,
    /// Safe failure fields of a completed step (`error_type`, `timeout_ms`,
    /// `exit_code`); `Null` when there is none.
    pub result_meta: serde_json::Value,
}

/// Why a run did not succeed. The code is stable and shown to users and APIs;
/// `Engine` carries the engine's own error text verbatim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunError {
    /// Cancelled by a user or an API caller.
    UserRequested,
    /// Cancelled because a newer message interrupted it.
    Interrupted,
    /// The engine lock could not be taken within `engine_lock_timeout_ms`.
    LockTimeout,
    /// No event from the engine for the inactivity timeout.
    Timeout,
    /// The engine stopped streaming without a completion, or its task panicked.
    EngineCrashed { detail: String },
    /// The engine could not start the run.
    StartFailed { detail: String },
    /// The engine is registered but cannot run (its CLI is missing, say).
    EngineUnavailable { engine: String, reason: String },
    /// No engine with that id.
    UnknownEngine { engine: String },
    /// The gateway stopped before the run could finish.
    ShuttingDown,
    /// The request was dropped because its conversation's queue was full.
    QueueOverflow,
    /// Cancelled by the router's idle watchdog.
    IdleWatchdog,
    /// A request left queued by a shutdown or a crash that waited longer than
    /// `recovered_max_age_ms` for the next start.
    Expired,
    /// Any other cancellation reason a caller named.
    Cancelled { reason: String },
    /// The queued request was merged into a later one, which answers both.
    Merged { into: RunId },
    /// The session no longer fits the model's context, as the engine that saw the
    /// vendor's error classified it; the next message starts a fresh session. The
    /// text is the engine's.
    ContextOverflow { message: String },
    /// A spending limit of `[gateway.budgets]` was reached; the text says which
    /// limit and what was spent.
    BudgetExceeded { detail: String },
    /// The engine reported a failure; the text is the engine's.
    Engine { message: String },
}

impl RunError {
    /// A stable, machine-readable code.
    pub fn code(&self) -> &str {
        match self {
            RunError::UserRequested => "user_requested",
            RunError::Interrupted => "interrupted",
            RunError::LockTimeout => "lock_timeout",
            RunError::Timeout => "timeout",
            RunError::EngineCrashed { .. } => "engine_crashed",
            RunError::StartFailed { .. } => "start_failed",
            RunError::EngineUnavailable { .. } => "engine_unavailable",
            RunError::UnknownEngine { .. } => "unknown_engine",
            RunError::ShuttingDown => "shutting_down",
            RunError::QueueOverflow => "queue_overflow",
            RunError::IdleWatchdog => "run_idle_watchdog_timeout",
            RunError::Expired => "expired",
            RunError::Cancelled { .. } => "cancelled",
            RunError::Merged { .. } => "merged",
            RunError::ContextOverflow { .. } => "context_overflow",
            RunError::BudgetExceeded { .. } => "budget_exceeded",
            RunError::Engine { .. } => "engine_error",
        }
    }

    /// The error back from its stored form: the [`code`](Self::code) and the
    /// [`Display`](fmt::Display) text a run record keeps. A code this version does
    /// not know (or none) reads as the engine's own message.
    pub fn from_stored(code: Option<&str>, text: String) -> Self {
        let detail = |prefix: &str| text.strip_prefix(prefix).unwrap_or(&text).to_owned();
        match code {
            Some("user_requested") => RunError::UserRequested,
            Some("interrupted") => RunError::Interrupted,
            Some("lock_timeout") => RunError::LockTimeout,
            Some("timeout") => RunError::Timeout,
            Some("engine_crashed") => {
                RunError::EngineCrashed { detail: detail("engine_crashed: ") }
            }
            Some("start_failed") => RunError::StartFailed { detail: detail("start_failed: ") },
            Some("engine_unavailable") => {
                let rest = detail("engine_unavailable: ");
                match rest.strip_suffix(')').and_then(|rest| rest.split_once(" (")) {
                    Some((engine, reason)) => RunError::EngineUnavailable {
                        engine: engine.to_owned(),
                        reason: reason.to_owned(),
                    },
                    None => RunError::EngineUnavailable { engine: rest, reason: String::new() },
                }
            }
            Some("unknown_engine") => {
                RunError::UnknownEngine { engine: detail("unknown_engine: ") }
            }
            Some("shutting_down") => RunError::ShuttingDown,
            Some("queue_overflow") => RunError::QueueOverflow,
            Some("run_idle_watchdog_timeout") => RunError::IdleWatchdog,
            Some("expired") => RunError::Expired,
            Some("cancelled") => RunError::Cancelled { reason: detail("cancelled: ") },
            Some("merged") => match RunId::parse(&detail("merged into ")) {
                Some(into) => RunError::Merged { into },
                None => RunError::Cancelled { reason: text },
            },
            Some("context_overflow") => RunError::ContextOverflow { message: text },
            Some("budget_exceeded") => {
                RunError::BudgetExceeded { detail: detail("budget_exceeded: ") }
            }
            _ => RunError::Engine { message: text },
        }
    }

    /// Whether the session no longer fits the model's context.
    pub fn is_context_overflow(&self) -> bool {
        matches!(self, RunError::ContextOverflow { .. })
    }

    /// Whether this ends the run as aborted (by someone's choice) rather than failed.
    pub fn is_abort(&self) -> bool {
        matches!(
            self,
            RunError::UserRequested
                | RunError::Interrupted
                | RunError::ShuttingDown
                | RunError::Cancelled { .. }
                | RunError::Merged { .. }
                | RunError::IdleWatchdog
                | RunError::QueueOverflow
                | RunError::Expired
        )
    }
}

impl fmt::Display for RunError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RunError::EngineCrashed { detail } => write!(f, "engine_crashed: {detail}"),
            RunError::StartFailed { detail } => write!(f, "start_failed: {detail}"),
            RunError::EngineUnavailable { engine, reason } => {
                write!(f, "engine_unavailable: {engine} ({reason})")
            }
            RunError::UnknownEngine { engine } => write!(f, "unknown_engine: {engine}"),
            RunError::BudgetExceeded { detail } => write!(f, "budget_exceeded: {detail}"),
            RunError::Cancelled { reason } => write!(f, "cancelled: {reason}"),
            RunError::Merged { into } => write!(f, "merged into {into}"),
            RunError::ContextOverflow { message } | RunError::Engine { message } => {
                f.write_str(message)
            }
            other => f.write_str(other.code()),
        }
    }
}

/// The end of a run as an engine (or the gateway) reports it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Completion {
    pub ok: bool,
    /// The final answer; empty means "use the streamed text".
    pub answer: String,
    pub error: Option<RunError>,
    pub resume: Option<ResumeToken>,
    /// Token counts and cost as the engine reports them; `Null` when unknown.
    pub usage: serde_json::Value,
    /// Files delivered with the answer, collected and checked when the run ends
    /// ([`crate::artifacts`]); engines leave it empty.
    pub artifacts: Vec<crate::artifacts::Artifact>,
    /// Set on a run that failed with no answer and was resubmitted once: the
    /// run that answers instead ([`crate::gateway::retry`]); engines leave it unset.
    pub retried_by: Option<RunId>,
}

impl Completion {
    pub fn success(answer: impl Into<String>, resume: Option<ResumeToken>) -> Self {
        Completion {
            ok: true,
            answer: answer.into(),
            error: None,
            resume,
            usage: serde_json::Value::Null,
            artifacts: Vec::new(),
            retried_by: None,
        }
    }

    pub fn failure(error: RunError, resume: Option<ResumeToken>) -> Self {
        Completion {
            ok: false,
            answer: String::new(),
            error: Some(error),
            resume,
            usage: serde_json::Value::Null,
            artifacts: Vec::new(),
            retried_by: None,
        }
    }
}

/// What an engine streams while it runs.
#[derive(Debug, Clone, PartialEq)]
pub enum EngineEvent {
    Started { resume: Option<ResumeToken>, title: Option<String>, meta: serde_json::Value },
    Action(Action),
    Delta(String),
    Completed(Completion),
}

/// The sending half an engine writes its events to. Bounded: an engine that
/// outpaces the gateway waits. A send fails only when the run is gone.
#[derive(Debug, Clone)]
pub struct EventSink {
    tx: mpsc::Sender<EngineEvent>,
}

/// The run that owned a sink is gone; the engine should stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the run is no longer listening")]
pub struct SinkClosed;

impl EventSink {
    /// A sink and the receiving end a run reads from.
    pub fn channel(capacity: usize) -> (EventSink, mpsc::Receiver<EngineEvent>) {
        let (tx, rx) = mpsc::channel(capacity.max(1));
        (EventSink { tx }, rx)
    }

    /// # Errors
    /// [`SinkClosed`] when the run stopped listening.
    ///
    /// # Cancel safety
    /// Cancel safe: a cancelled send delivers nothing.
    pub async fn send(&self, event: EngineEvent) -> Result<(), SinkClosed> {
        self.tx.send(event).await.map_err(|_| SinkClosed)
    }

    /// Sends without waiting; gives the event back when the channel is full.
    ///
    /// # Errors
    /// [`TrySendError::Full`] with the event, or [`TrySendError::Closed`] when the run is gone.
    pub fn try_send(&self, event: EngineEvent) -> Result<(), TrySendError> {
        self.tx.try_send(event).map_err(|err| match err {
            mpsc::error::TrySendError::Full(event) => TrySendError::Full(Box::new(event)),
            mpsc::error::TrySendError::Closed(_) => TrySendError::Closed,
        })
    }

    pub fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }
}

/// Why [`EventSink::try_send`] did not send.
#[derive(Debug, Clone, PartialEq)]
pub enum TrySendError {
    /// The channel is full; here is the event back.
    Full(Box<EngineEvent>),
    /// The run is gone.
    Closed,
}

/// What an engine needs to start one run.
#[derive(Debug, Clone)]
pub struct StartRequest {
    pub run_id: RunId,
    pub session_key: SessionKey,
    pub prompt: String,
    /// A token of this engine to continue; tokens of other engines never reach here.
    pub resume: Option<ResumeToken>,
    /// The resolved working directory.
    pub cwd: PathBuf,
    /// The model suffix of a composite id (`claude:opus` → `opus`), or the request's model.
    pub model: Option<String>,
    pub meta: BTreeMap<String, serde_json::Value>,
    /// The gateway's workspace (`[gateway] workspace_dir`, expanded): file
    /// tools may reach it as well as `cwd`.
    pub workspace: Option<PathBuf>,
    /// The gateway's own state, which nothing the run does may touch.
    pub off_limits: crate::contain::OffLimits,
    /// Files sent with the message, already in the run's uploads directory;
    /// the prompt names them too. An engine that can see images may show
    /// the images to its model.
    pub attachments: Vec<crate::media::Attachment>,
}

/// Why a steer or redirect was not taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SteerError {
    #[error("the engine does not support this")]
    Unsupported,
    #[error("the run has finished")]
    Finished,
    #[error("the engine refused: {0}")]
    Failed(String),
}

/// Control over a started run. `cancel` is total and idempotent: calling it on a
/// finished run, twice, or concurrently does nothing harmful.
#[async_trait]
pub trait RunControl: Send + Sync + fmt::Debug + 'static {
    fn cancel(&self);

    /// Resolves once the run holds nothing any more: for a CLI, once its process
    /// group is reaped. A cancelled run completes (and frees its slot, its engine
    /// lock and its conversation) only after this. Engines that hold no processes
    /// resolve at once, the default.
    ///
    /// # Cancel safety
    /// Cancel safe: waiting again starts over, nothing is lost.
    async fn stopped(&self) {}

    /// Sends more input into the live run.
    ///
    /// # Errors
    /// [`SteerError::Unsupported`] by default.
    async fn steer(&self, _text: &str) -> Result<(), SteerError> {
        Err(SteerError::Unsupported)
    }

    /// Replaces the live run's direction.
    ///
    /// # Errors
    /// [`SteerError::Unsupported`] by default.
    async fn redirect(&self, _text: &str) -> Result<(), SteerError> {
        Err(SteerError::Unsupported)
    }
}

/// What an engine can do beyond running a prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Capabilities {
    pub steer: bool,
    pub redirect: bool,
}

/// Whether an engine can run now; an unavailable engine says why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Availability {
    Available,
    Unavailable { reason: UnavailableReason },
}

/// Why an engine cannot run; its `Display` is one line for a person, naming
/// what was looked at and the setting that fixes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UnavailableReason {
    /// The executable `program` is on none of the directories of `search_path`.
    NotFound { program: String, search_path: String },
    /// The configured `cli_path` does not exist.
    MissingPath { path: std::path::PathBuf },
    /// The configured `cli_path` exists but is not an executable file.
    NotExecutable { path: std::path::PathBuf },
    /// Anything else, said in words.
    Other(String),
}

impl UnavailableReason {
    /// The reason without the places that were searched: what a summary of
    /// several engines shows (`not found on PATH; set cli_path`).
    pub fn short(&self) -> String {
        match self {
            UnavailableReason::NotFound { .. } => "not found on PATH; set cli_path".to_owned(),
            UnavailableReason::MissingPath { path } => {
                format!("cli_path {} does not exist", path.display())
            }
            UnavailableReason::NotExecutable { path } => {
                format!("cli_path {} is not an executable file", path.display())
            }
            UnavailableReason::Other(text) => text.clone(),
        }
    }
}

impl fmt::Display for UnavailableReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UnavailableReason::NotFound { program, search_path } => {
                let searched = if search_path.is_empty() { "an empty PATH" } else { search_path };
                write!(f, "{program} not found on PATH (looked in {searched}); set cli_path")
            }
            UnavailableReason::MissingPath { path } => {
                write!(f, "not found at {} (cli_path)", path.display())
            }
            UnavailableReason::NotExecutable { path } => {
                write!(f, "{} is not an executable file (cli_path)", path.display())
            }
            UnavailableReason::Other(text) => f.write_str(text),
        }
    }
}

impl From<String> for UnavailableReason {
    fn from(text: String) -> Self {
        UnavailableReason::Other(text)
    }
}

impl From<&str> for UnavailableReason {
    fn from(text: &str) -> Self {
        UnavailableReason::Other(text.to_owned())
    }
}

/// Why an engine could not start a run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EngineError {
    #[error("engine_unavailable: {engine} ({reason})")]
    Unavailable { engine: String, reason: String },
    #[error("could not start: {0}")]
    Start(String),
}

/// An engine: something that turns a prompt into a stream of events.
#[async_trait]
pub trait Engine: Send + Sync + fmt::Debug + 'static {
    fn id(&self) -> &EngineId;

    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
    }

    fn availability(&self) -> Availability {
        Availability::Available
    }

    /// The program the engine runs, where it was found; `None` for an engine
    /// that runs none or whose program is missing.
    fn program(&self) -> Option<PathBuf> {
        None
    }

    /// The engine's version as its program reports it (read once, then
    /// cached); `None` when it has none or did not say in time.
    async fn version(&self) -> Option<String> {
        None
    }

    /// Starts a run. Events go to `sink`; the returned control cancels or steers it.
    /// After `Ok`, the engine must eventually send `Completed` or drop the sink.
    ///
    /// # Errors
    /// [`EngineError`] when the run could not start at all; no event was sent.
    async fn start(
        &self,
        req: StartRequest,
        sink: EventSink,
    ) -> Result<Arc<dyn RunControl>, EngineError>;

    /// The line a user pastes to continue a session: `` `<engine> resume <token>` ``.
    fn format_resume(&self, token: &ResumeToken) -> String {
        format!("`{} resume {}`", token.engine, token.value)
    }

    /// Finds this engine's resume line anywhere in `text`.
    fn extract_resume(&self, text: &str) -> Option<ResumeToken> {
        extract_plain_resume(self.id().as_str(), text)
    }

    /// Checks the value of a resume token of this engine before anything is queued:
    /// a value without the shape of this engine's session ids is refused, so none
    /// can reach a command line as an option. The default is
    /// [`validate::check_token`].
    ///
    /// # Errors
    /// [`InvalidValue`] saying what is wrong with the value.
    fn check_resume(&self, value: &str) -> Result<(), InvalidValue> {
        validate::check_token(value)
    }

    /// Whether the whole (trimmed) line is a resume command of this engine.
    fn is_resume_line(&self, line: &str) -> bool {
        let line = line.trim().trim_matches('`').trim();
        extract_plain_resume(self.id().as_str(), line).is_some_and(|token| {
            let rebuilt = format!("{} resume {}", self.id(), token.value);
            normalise_space(line).eq_ignore_ascii_case(&rebuilt)
        })
    }
}

fn normalise_space(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Finds `<engine> resume <token>` (case-insensitive, optional backticks) in `text`;
/// the token is `[A-Za-z0-9_-]+`. The default resume format of engines.
pub fn extract_plain_resume(engine: &str, text: &str) -> Option<ResumeToken> {
    let words: Vec<&str> = text.split_whitespace().collect();
    for window in words.windows(3) {
        let first = window[0].trim_start_matches('`');
        if !first.eq_ignore_ascii_case(engine) || !window[1].eq_ignore_ascii_case("resume") {
            continue;
        }
        let token: String = window[2]
            .trim_end_matches(['`', '.', ',', ';', ')'])
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '-')
            .collect();
        if !token.is_empty() {
            return Some(ResumeToken::new(engine, token));
        }
    }
    None
}

/// The engines a gateway can run, by id. Lookups of composite ids
/// (`claude:opus`) fall back to the part before the first `:`.
///
/// Clones share one table: [`EngineRegistry::replace`] swaps it for every
/// holder at once (a config reload), while a run keeps the `Arc` of the engine
/// it resolved, so running runs finish on the engine they started with.
#[derive(Debug, Clone, Default)]
pub struct EngineRegistry {
    engines: Arc<std::sync::RwLock<Arc<EngineTable>>>,
}

type EngineTable = BTreeMap<EngineId, Arc<dyn Engine>>;

/// Why an engine could not be registered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegistryError {
    #[error("engine {0} is already registered")]
    Duplicate(String),
}

impl EngineRegistry {
    pub fn new() -> Self {
        EngineRegistry::default()
    }

    fn table(&self) -> Arc<EngineTable> {
        self.engines.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// # Errors
    /// [`RegistryError::Duplicate`] when the id is taken.
    pub fn register(&mut self, engine: Arc<dyn Engine>) -> Result<(), RegistryError> {
        let id = engine.id().clone();
        let mut guard = self.engines.write().unwrap_or_else(|e| e.into_inner());
        if guard.contains_key(&id) {
            return Err(RegistryError::Duplicate(id.to_string()));
        }
        Arc::make_mut(&mut guard).insert(id, engine);
        Ok(())
    }

    /// Puts the engines of `next` in place of this registry's, for every clone.
    /// Runs that already resolved an engine keep it.
    pub fn replace(&self, next: &EngineRegistry) {
        let table = next.table();
        *self.engines.write().unwrap_or_else(|e| e.into_inner()) = table;
    }

    /// The engine registered as `id`.
    pub fn engine(&self, id: &EngineId) -> Option<Arc<dyn Engine>> {
        self.table().get(id).cloned()
    }

    /// The engine for `id`, trying the prefix of a composite id; with the model part.
    pub fn resolve(&self, id: &str) -> Option<(Arc<dyn Engine>, Option<String>)> {
        let table = self.table();
        if let Some(engine) = table.get(id) {
            return Some((engine.clone(), None));
        }
        let (prefix, model) = id.split_once(':')?;
        let engine = table.get(prefix)?;
        let model = (!model.is_empty()).then(|| model.to_owned());
        Some((engine.clone(), model))
    }

    pub fn get(&self, id: &str) -> Option<Arc<dyn Engine>> {
        self.resolve(id).map(|(engine, _)| engine)
    }

    /// The engines registered now, in id order.
    pub fn iter(&self) -> impl Iterator<Item = Arc<dyn Engine>> {
        self.table().values().cloned().collect::<Vec<_>>().into_iter()
    }

    /// The ids registered now, in order.
    pub fn ids(&self) -> impl Iterator<Item = EngineId> {
        self.table().keys().cloned().collect::<Vec<_>>().into_iter()
    }

    /// The resume line of `token` as its engine writes it (with backticks), or
    /// the plain `` `<engine> resume <token>` `` when no such engine is registered.
    pub fn format_resume(&self, token: &ResumeToken) -> String {
        match self.get(&token.engine) {
            Some(engine) => engine.format_resume(token),
            None => format!("`{} resume {}`", token.engine, token.value),
        }
    }

    /// Checks `token` against its engine's shape ([`Engine::check_resume`]); a
    /// token of no registered engine is left to the caller's unknown-engine check.
    ///
    /// # Errors
    /// [`InvalidValue`] when the engine refuses the value.
    pub fn check_resume(&self, token: &ResumeToken) -> Result<(), InvalidValue> {
        match self.get(&token.engine) {
            Some(engine) => engine.check_resume(&token.value),
            None => Ok(()),
        }
    }

    /// Asks every engine, in id order, for a resume line in `text`.
    pub fn extract_resume(&self, text: &str) -> Option<ResumeToken> {
        self.table().values().find_map(|engine| engine.extract_resume(text))
    }
}

#[cfg(test)]
pub(crate) mod tests;
