//! The native `lemon` engine: an LLM agent loop in the gateway itself.
//!
//! A run sends the session's history and the tools to the model, streams the
//! answer's text as deltas, runs every tool call the model makes as an action,
//! appends the results and asks again, until the model answers without calling
//! a tool or `max_turns` model turns were taken.
//!
//! - **Steering**: a steer is a user message injected at the next model-turn
//!   boundary (after the running tools finish); a redirect drops the current
//!   model turn, cancels its running tools and goes on with the new instruction.
//! - **Cancel** stops the stream and every running tool at once (each tool gets
//!   a cancelled token; a command's process group is killed); like the CLI
//!   engines, a cancelled run sends no `Completed` and [`RunControl::stopped`]
//!   resolves once every tool task has ended.
//! - **Sessions**: the conversation is kept in the store under a session id
//!   (`lemon resume <id>`) and written after every model turn.
//! - **Compaction**: a request estimated over 90% of `context_window`, or one
//!   the provider refuses as too long, has the older turns summarised by the
//!   model into one message; the run shows a `compaction` action.
//! - **Budgets**: before every model turn the run's usage is checked against
//!   [`BudgetGuard`]; a reached limit ends the run with `budget_exceeded`.
//! - **Images**: with `vision` on, the images sent with the message
//!   ([`StartRequest::attachments`]) go to the model with the run's first
//!   user message, and again in later turns of the session; a provider that
//!   refuses a request carrying images gets the turn once more without them.
//!
//! # Layout
//! - `settings`: `[gateway.engines.lemon]`.
//! - `session`: the session records and their ids.
//! - `compact`: token estimates, where to cut, the summary request's text.
//! - `images`: which attachments are shown to the model, read within bounds.
//! - `agent`: one run's loop.

mod agent;
pub mod compact;
pub mod images;
pub mod session;
pub mod settings;

pub use settings::{NativeSettings, ProviderKind, BUILTIN_TOOLS, ENGINE_ID};

use std::fmt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use lemon_core::budget::BudgetGuard;
use lemon_core::engine::{
    Availability, Capabilities, Engine, EngineError, EventSink, InvalidValue, RunControl,
    StartRequest, SteerError,
};
use lemon_core::ids::EngineId;
use lemon_core::tool::{Tool, ToolRegistry, ToolSpec};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::cli::ApiKey;
use crate::llm::LlmClient;

use self::agent::ToolSet;
use self::session::Sessions;

/// Everything a native engine is built from.
#[derive(Debug)]
pub struct NativeParts {
    pub settings: NativeSettings,
    /// The client for the provider, or why there is none (no key).
    pub client: Result<Arc<dyn LlmClient>, String>,
    /// The key, only to keep it out of every text a run shows.
    pub api_key: Option<ApiKey>,
    /// The built-in tools before the allow list.
    pub builtins: Vec<Arc<dyn Tool>>,
    /// The gateway's tools.
    pub gateway_tools: ToolRegistry,
    pub budget: Option<Arc<dyn BudgetGuard>>,
    pub store: Option<lemon_core::store::StoreHandle>,
    /// Run tasks are spawned here.
    pub tracker: TaskTracker,
    /// Cancelled when the gateway shuts down: every run stops.
    pub shutdown: CancellationToken,
    pub workspace: Option<PathBuf>,
    /// The owner's policy over tool calls and where asked calls wait; `None`
    /// allows every call.
    pub approvals: Option<Approvals>,
    /// The MCP servers whose tools runs are offered (`<server>__<tool>`).
    pub mcp: Option<crate::mcp::McpClients>,
}

/// `[gateway.approvals]` compiled, and the hub its asked calls wait in.
#[derive(Debug, Clone, Default)]
pub struct Approvals {
    /// The owner's rules and those of untrusted runs
    /// ([`lemon_core::untrusted`]), as a config edit leaves them.
    pub rules: lemon_core::approvals::Rules,
    pub hub: lemon_core::approvals::ApprovalHub,
}

/// The native engine.
pub struct NativeEngine {
    id: EngineId,
    settings: Arc<NativeSettings>,
    client: Result<Arc<dyn LlmClient>, String>,
    api_key: Option<ApiKey>,
    /// The allowed built-in tools with their specs, built once: a spec is a
    /// JSON schema, and every run offers the same ones.
    builtins: Vec<(ToolSpec, Arc<dyn Tool>)>,
    gateway_tools: ToolRegistry,
    mcp: Option<crate::mcp::McpClients>,
    /// The tool sets runs were offered, by the tools in them: a run offered
    /// the same tools as an earlier one shares its set (specs, their token
    /// estimate, the lookup by name). Like the built-ins', a gateway or MCP
    /// tool's spec is read once per set (and its name once per run when the
    /// run's tool filter narrows the tools).
    tool_sets: Mutex<Vec<OfferedSet>>,
    budget: Option<Arc<dyn BudgetGuard>>,
    sessions: Sessions,
    tracker: TaskTracker,
    shutdown: CancellationToken,
    workspace: Option<PathBuf>,
    approvals: Option<Approvals>,
}

impl fmt::Debug for NativeEngine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NativeEngine")
            .field("settings", &self.settings)
            .field("available", &self.client.is_ok())
            .finish_non_exhaustive()
    }
}

impl NativeEngine {
    pub fn new(parts: NativeParts) -> Self {
        let settings = parts.settings;
        let builtins = parts
            .builtins
            .into_iter()
            .map(|tool| (tool.spec(), tool))
            .filter(|(spec, _)| settings.allows(&spec.name))
            .collect();
        NativeEngine {
            id: EngineId::parse(ENGINE_ID).expect("lemon is a valid engine id"),
            settings: Arc::new(settings),
            client: parts.client,
            api_key: parts.api_key,
            builtins,
            gateway_tools: parts.gateway_tools,
            mcp: parts.mcp,
            tool_sets: Mutex::new(Vec::new()),
            budget: parts.budget,
            sessions: Sessions::new(parts.store),
            tracker: parts.tracker,
            shutdown: parts.shutdown,
            workspace: parts.workspace,
            approvals: parts.approvals,
        }
    }

    pub fn settings(&self) -> &NativeSettings {
        &self.settings
    }

    /// The tools a run in `session` is offered: the built-ins, the gateway
    /// tools offered there whose names no built-in has, and the MCP servers'
    /// tools (their servers started when needed), each only when `filter`
    /// (the run's [`ToolFilter`](lemon_core::mcp::ToolFilter)) allows its name.
    async fn tool_set(
        &self,
        session: &lemon_core::ids::SessionKey,
        filter: &lemon_core::mcp::ToolFilter,
    ) -> Arc<ToolSet> {
        let mcp_tools = match &self.mcp {
            Some(mcp) => mcp.tools_within(filter).await,
            None => Vec::new(),
        };
        let allowed = |tool: &Arc<dyn Tool>| filter.is_all() || filter.allows(&tool.spec().name);
        let builtins: Vec<&(ToolSpec, Arc<dyn Tool>)> = self
            .builtins
            .iter()
            .filter(|(spec, _)| filter.is_all() || filter.allows(&spec.name))
            .collect();
        let extras = self
            .gateway_tools
            .list()
            .into_iter()
            .filter(|tool| tool.offered(session))
            .chain(mcp_tools)
            .filter(|tool| allowed(tool));
        let offered: Vec<Arc<dyn Tool>> =
            builtins.iter().map(|(_, tool)| tool.clone()).chain(extras).collect();
        let mut sets = self.tool_sets.lock().unwrap_or_else(|e| e.into_inner());
        let same = |known: &[Arc<dyn Tool>]| {
            known.len() == offered.len()
                && known.iter().zip(&offered).all(|(a, b)| Arc::ptr_eq(a, b))
        };
        if let Some((_, set)) = sets.iter().find(|(known, _)| same(known)) {
            return set.clone();
        }
        let mut tools: Vec<(ToolSpec, Arc<dyn Tool>)> =
            builtins.iter().map(|(spec, tool)| (spec.clone(), tool.clone())).collect();
        for tool in &offered[builtins.len()..] {
            let spec = tool.spec();
            if !tools.iter().any(|(known, _)| known.name == spec.name) {
                tools.push((spec, tool.clone()));
            }
        }
        let set = Arc::new(ToolSet::new(tools));
        // A handful of sets in practice (one per kind of channel and tool
        // filter); tools that keep changing start the list over instead of
        // growing it.
        if sets.len() >= MAX_TOOL_SETS {
            sets.clear();
        }
        sets.push((offered, set.clone()));
        set
    }
}

/// A tool set with the tools it was made for.
type OfferedSet = (Vec<Arc<dyn Tool>>, Arc<ToolSet>);

/// Most tool sets an engine keeps.
const MAX_TOOL_SETS: usize = 16;

/// The native engine `[gateway.engines.lemon]` asks for, with its key from
/// `ctx.api_keys["lemon"]` and the built-in tools; `None` when it is disabled.
pub fn build(
    sections: &crate::config::EngineSections,
    ctx: &crate::cli::CliContext,
) -> Option<NativeEngine> {
    // The sections were checked when the config was read.
    let settings = NativeSettings::from_section(sections.get(ENGINE_ID)).unwrap_or_else(|error| {
        tracing::warn!(%error, "[gateway.engines.lemon] unreadable; using the defaults");
        NativeSettings::default()
    });
    if !settings.enabled {
        return None;
    }
    let api_key = ctx.api_keys.get(ENGINE_ID).cloned();
    let provider = match settings.provider {
        ProviderKind::OpenAi => crate::llm::Provider::OpenAi,
        ProviderKind::OpenAiResponses => crate::llm::Provider::OpenAiResponses,
        ProviderKind::Anthropic => crate::llm::Provider::Anthropic,
    };
    // A keyless server gets no key header (the client sends none for "").
    let key = match &api_key {
        Some(key) => Some(key.expose()),
        None if settings.key_optional() => Some(""),
        None => None,
    };
    let client = match key {
        Some(key) => Ok(crate::llm::build_client(
            provider,
            crate::llm::ClientOptions {
                base_url: settings.base_url.clone(),
                api_key: lemon_core::secrets::SecretValue::new(key),
                ..crate::llm::ClientOptions::default()
            },
        )),
        None => Err(missing_key_reason(&settings)),
    };
    let options = crate::tools::BuiltinOptions {
        bash_env: crate::cli::allowlisted_env(&ctx.base_env),
        recorder: ctx.recorder.clone(),
        sandbox: ctx.sandbox.clone(),
        ..crate::tools::BuiltinOptions::default()
    };
    Some(NativeEngine::new(NativeParts {
        settings,
        client,
        api_key,
        builtins: crate::tools::builtin(&options),
        gateway_tools: ctx.tools.clone(),
        budget: ctx.budget.clone(),
        store: ctx.store.clone(),
        tracker: ctx.tracker.clone(),
        shutdown: ctx.shutdown.clone(),
        workspace: None,
        approvals: ctx.approvals.clone(),
        mcp: ctx.mcp.clone(),
    }))
}

/// Why the engine has no client: the key's secret is not set.
pub fn missing_key_reason(settings: &NativeSettings) -> String {
    let secret = &settings.api_key_secret;
    format!(
        "no {secret} set: store the {} API key as `{secret}` in secrets.toml or the {} environment variable \
         (a server that takes no key: set api_key_secret = \"\" in [gateway.engines.lemon])",
        settings.provider,
        lemon_core::secrets::env_var_name(secret)
    )
}

#[async_trait]
impl Engine for NativeEngine {
    fn id(&self) -> &EngineId {
        &self.id
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities { steer: true, redirect: true }
    }

    fn availability(&self) -> Availability {
        match &self.client {
            Ok(_) => Availability::Available,
            Err(reason) => Availability::Unavailable { reason: reason.clone().into() },
        }
    }

    fn check_resume(&self, value: &str) -> Result<(), InvalidValue> {
        session::check_id(value)
    }

    async fn start(
        &self,
        req: StartRequest,
        sink: EventSink,
    ) -> Result<Arc<dyn RunControl>, EngineError> {
        let client = self
            .client
            .clone()
            .map_err(|reason| EngineError::Unavailable { engine: ENGINE_ID.to_owned(), reason })?;
        let resume = req.resume.as_ref().filter(|token| token.engine == ENGINE_ID);
        let (session_id, history) = match resume {
            Some(token) => {
                session::check_id(&token.value).map_err(|why| {
                    EngineError::Start(format!("invalid resume token for lemon: {why}"))
                })?;
                let auto = req.meta.get("resume_source").and_then(|v| v.as_str()) == Some("auto");
                let read_images = self.settings.vision.then_some(&req.off_limits);
                match self.sessions.load(&token.value, read_images).await {
                    Ok(history) => (token.value.clone(), history),
                    Err(error) if auto => {
                        tracing::warn!(run_id = %req.run_id, %error, "lemon session not continued; starting a new one");
                        (session::new_id(), Vec::new())
                    }
                    Err(error) => return Err(EngineError::Start(error.to_string())),
                }
            }
            None => (session::new_id(), Vec::new()),
        };
        let filter = lemon_core::mcp::ToolFilter::from_meta(&req.meta);
        let tools = self.tool_set(&req.session_key, &filter).await;
        let cancel = self.shutdown.child_token();
        let (controls_tx, controls_rx) = mpsc::channel(16);
        let stopped = CancellationToken::new();
        let workspace = req.workspace.clone().or_else(|| self.workspace.clone());
        let agent = agent::Agent::new(agent::AgentParts {
            req,
            settings: self.settings.clone(),
            client,
            api_key: self.api_key.clone(),
            tools,
            budget: self.budget.clone(),
            sessions: self.sessions.clone(),
            session_id,
            history,
            sink,
            cancel: cancel.clone(),
            controls: controls_rx,
            workspace,
            approvals: self.approvals.clone(),
        });
        let guard = stopped.clone().drop_guard();
        self.tracker.spawn(async move {
            agent.run().await;
            drop(guard);
        });
        Ok(Arc::new(NativeControl { cancel, controls: controls_tx, stopped }))
    }
}

/// A steer or redirect on its way to the run.
#[derive(Debug)]
pub(crate) enum Control {
    Steer(String, oneshot::Sender<Result<(), SteerError>>),
    Redirect(String, oneshot::Sender<Result<(), SteerError>>),
}

/// The handle the gateway holds on a native run.
#[derive(Debug)]
struct NativeControl {
    cancel: CancellationToken,
    controls: mpsc::Sender<Control>,
    /// Cancelled once the run and every tool task it started have ended.
    stopped: CancellationToken,
}

impl NativeControl {
    async fn send(
        &self,
        make: impl FnOnce(oneshot::Sender<Result<(), SteerError>>) -> Control,
    ) -> Result<(), SteerError> {
        if self.cancel.is_cancelled() {
            return Err(SteerError::Finished);
        }
        let (reply, rx) = oneshot::channel();
        self.controls.send(make(reply)).await.map_err(|_| SteerError::Finished)?;
        rx.await.map_err(|_| SteerError::Finished)?
    }
}

#[async_trait]
impl RunControl for NativeControl {
    fn cancel(&self) {
        self.cancel.cancel();
    }

    async fn stopped(&self) {
        self.stopped.cancelled().await;
    }

    async fn steer(&self, text: &str) -> Result<(), SteerError> {
        let text = text.to_owned();
        self.send(|reply| Control::Steer(text, reply)).await
    }

    async fn redirect(&self, text: &str) -> Result<(), SteerError> {
        let text = text.to_owned();
        self.send(|reply| Control::Redirect(text, reply)).await
    }
}

#[cfg(test)]
mod tests;
