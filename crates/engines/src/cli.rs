//! Vendor coding CLIs (Claude Code, Codex, OpenCode, Pi, Droid) run as child processes.
//!
//! Each vendor is one [`CliEngine`]: it spawns the vendor's CLI in the run's working
//! directory, feeds it the prompt, reads its JSONL stdout line by line and turns every
//! line into [`EngineEvent`](lemon_core::engine::EngineEvent)s with that vendor's parser. Exactly one `Started` and one
//! `Completed` reach the sink per run, whatever the CLI does (ends early, exits
//! non-zero, prints garbage, hangs); a cancelled run stops without a `Completed`, its
//! process group killed.
//!
//! # Layout
//! - `process`: the only code in the workspace that spawns a process; process groups,
//!   signals, bounded stdout lines and the stderr tail.
//! - `runner`: supervises one run: reads output, enforces the inactivity timeout,
//!   handles cancel and steering, and finishes exactly once.
//! - `translate`: the shared event vocabulary of the parsers (pending actions, notes,
//!   the Started/Completed guarantees) and the per-run line loop.
//! - `tools`: the shared tool classification (kind and title of a tool call).
//! - `resume`: each vendor's resume line (`claude --resume <id>`, …).
//! - `claude`, `codex`, `opencode`, `pi`, `droid`: each vendor's command line and parser.
//! - `settings`: `[gateway.engines.<id>]` resolved into settings, the child
//!   environment and the PATH lookup.
//! - `link`: a run's registration with the approvals gate and its CLI's MCP
//!   configuration pointing at the gateway's endpoint with the run's token.
//!
//! # Configuration
//!
//! Every vendor is registered by [`build_cli_engines`] unless its section says
//! `enabled = false`. Keys of `[gateway.engines.<id>]` (`<id>` is `claude`, `codex`,
//! `opencode`, `pi` or `droid`):
//!
//! | key | default | meaning |
//! |---|---|---|
//! | `enabled` | `true` | `false` leaves the engine out |
//! | `cli_path` | the vendor's name on `PATH` | the executable; a bare name is looked up on `PATH` |
//! | `extra_args` | `[]` | arguments added to the vendor's command line |
//! | `model` | none | model when the run names none (`claude:opus` names `opus`) |
//! | `env` | `{}` | variables added to the child's environment |
//! | `env_passthrough` | `[]` | variables of the gateway's environment passed to the child: names or `PREFIX_*` (never `LEMON_*`); logged by name only |
//! | `timeout_ms` | `300000` | inactivity timeout: no output for this long fails the run with `timeout`; `0` disables it |
//! | `cancel_grace_ms` | `2000` | after SIGTERM on cancel, how long before SIGKILL |
//! | `dangerously_skip_permissions` | `false` | claude `--dangerously-skip-permissions`, codex `--dangerously-bypass-approvals-and-sandbox`, droid `--skip-permissions-unsafe`; claude, codex and opencode calls are then not relayed to the owner |
//! | `allowed_tools` | `[]` | claude `--allowedTools` |
//! | `steering` | `false` | claude only: keep stdin open (`--input-format stream-json`) so a live run can be steered |
//! | `api_key_secret` | none | the secret holding the API key; the app resolves it into [`CliContext::api_keys`] |
//! | `api_key_env` | per vendor | the variable the key is passed in (`ANTHROPIC_API_KEY`, `OPENAI_API_KEY`, `FACTORY_API_KEY`; none for opencode and pi) |
//! | `max_line_bytes` | `8388608` | a longer stdout line is skipped with a warning |
//! | `provider` | none | pi `--provider` |
//! | `reasoning_effort` | none | droid `--reasoning-effort` |
//! | `gateway_tools` | `true` | once the API listens, claude, codex, opencode and droid get the gateway's MCP endpoint (`lemon`) with the gateway's tools (`cron`, `sms_*`…) acting for the run's session; pi has no MCP client |
//!
//! The child's environment is built from nothing: the allowlisted variables of
//! [`CliContext::base_env`] (`PATH`, `HOME`, `USER`, `LOGNAME`, `SHELL`, `TMPDIR`,
//! `TMP`, `TEMP`, `LANG`, `LC_ALL`, `LC_CTYPE`, `TERM`, `XDG_CONFIG_HOME`,
//! `XDG_CACHE_HOME`) and those `env_passthrough` names, then the vendor's own (`NO_COLOR=1` and `CI=1` for pi), then
//! `env`, then the API key. The gateway's own secrets are never inherited, and
//! secrets never appear on the command line or in logs.

mod claude;
mod codex;
mod droid;
mod link;
mod opencode;
mod pi;
pub(crate) mod process;
mod resume;
pub(crate) mod runner;
pub(crate) mod settings;
pub(crate) mod tools;
pub(crate) mod translate;

pub use process::{
    environment, hide_from_children, is_secret_name, kill_leftover_group, seal_environment,
    spawn_helper, tracking as process_tracking, Helper, HelperChild, HelperSpec, Leftover,
    ProcessRecorder, SealedEnvironment, Tracking, SCOPE_ENV,
};
pub use settings::which;
pub use translate::describe;

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use crate::config::{EngineSection, EngineSections};
use async_trait::async_trait;
use lemon_core::engine::validate::check_model;
use lemon_core::engine::{
    Availability, Capabilities, Engine, EngineError, EventSink, InvalidValue, ResumeToken,
    RunControl, StartRequest, UnavailableReason,
};
use lemon_core::ids::EngineId;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use self::settings::CliSettings;

/// The vendor CLIs this module runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Vendor {
    Claude,
    Codex,
    Opencode,
    Pi,
    Droid,
}

impl Vendor {
    /// Every vendor, in registration order.
    pub const ALL: [Vendor; 5] =
        [Vendor::Claude, Vendor::Codex, Vendor::Opencode, Vendor::Pi, Vendor::Droid];

    /// The engine id, which is also the executable's default name.
    pub fn id(self) -> &'static str {
        match self {
            Vendor::Claude => "claude",
            Vendor::Codex => "codex",
            Vendor::Opencode => "opencode",
            Vendor::Pi => "pi",
            Vendor::Droid => "droid",
        }
    }

    /// The vendor whose engine id is `id`.
    pub fn from_id(id: &str) -> Option<Vendor> {
        Vendor::ALL.into_iter().find(|vendor| vendor.id() == id)
    }

    /// The title of the run's `Started` event.
    pub fn title(self) -> &'static str {
        match self {
            Vendor::Claude => "Claude",
            Vendor::Codex => "Codex",
            Vendor::Opencode => "OpenCode",
            Vendor::Pi => "Pi",
            Vendor::Droid => "Droid",
        }
    }

    /// Where the API key goes unless `api_key_env` says otherwise.
    pub(crate) fn default_api_key_env(self) -> Option<&'static str> {
        match self {
            Vendor::Claude => Some("ANTHROPIC_API_KEY"),
            Vendor::Codex => Some("OPENAI_API_KEY"),
            Vendor::Droid => Some("FACTORY_API_KEY"),
            Vendor::Opencode | Vendor::Pi => None,
        }
    }
}

impl fmt::Display for Vendor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.id())
    }
}

/// What a vendor's command line is built from.
#[derive(Debug)]
struct CommandInput<'a> {
    settings: &'a CliSettings,
    prompt: &'a str,
    /// The session to continue (already checked to belong to this vendor).
    resume: Option<&'a str>,
    /// The run's model, before the vendor's prefixes are stripped.
    model: Option<&'a str>,
    cwd: &'a std::path::Path,
    base_env: &'a BTreeMap<String, String>,
    /// The dollars the run may spend under the limits that apply to it
    /// (`[gateway.budgets]`); Claude gets it as `--max-budget-usd`.
    max_budget_usd: Option<f64>,
    /// How the CLI reaches the gateway's MCP endpoint as this run (Claude's
    /// permission prompts, the gateway's tools), when it does.
    gateway_mcp: Option<&'a link::McpAccess>,
}

impl CommandInput<'_> {
    /// The run's model without any of `prefixes`, else the configured model.
    fn model(&self, prefixes: &[&str]) -> Option<String> {
        let from_run = self.model.map(|model| {
            let lower = model.to_ascii_lowercase();
            prefixes
                .iter()
                .find(|prefix| lower.starts_with(*prefix))
                .map_or(model, |prefix| &model[prefix.len()..])
                .trim()
        });
        from_run
            .filter(|m| !m.is_empty())
            .map(str::to_owned)
            .or_else(|| self.settings.model.clone())
    }
}

/// A vendor's command line for one run.
#[derive(Debug)]
struct Invocation {
    args: Vec<String>,
    stdin: process::StdinMode,
    /// Variables the vendor wants, set only when the environment lacks them.
    env: Vec<(&'static str, &'static str)>,
    /// The prompt is the last argument (hidden in logs).
    prompt_is_last_arg: bool,
    /// The model passed on the command line.
    model: Option<String>,
    /// The session token the command line names for a new session (pi).
    new_session: Option<String>,
}

impl Invocation {
    /// A command line whose last argument is the prompt, with no stdin and no
    /// extra environment: how opencode, pi and droid are run.
    fn prompt_last(args: Vec<String>, model: Option<String>) -> Self {
        Invocation {
            args,
            stdin: process::StdinMode::Null,
            env: Vec::new(),
            prompt_is_last_arg: true,
            model,
            new_session: None,
        }
    }
}

/// A prompt passed as an argument must not read as an option.
fn prompt_arg(prompt: &str) -> String {
    if prompt.starts_with('-') {
        format!(" {prompt}")
    } else {
        prompt.to_owned()
    }
}

/// A secret string whose `Debug` never shows the value.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey(String);

impl ApiKey {
    pub fn new(value: impl Into<String>) -> Self {
        ApiKey(value.into())
    }

    pub(crate) fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ApiKey(<redacted>)")
    }
}

/// What the app hands the CLI engines: where to look and what to pass on.
/// The library reads no environment variables itself.
#[derive(Debug, Clone, Default)]
pub struct CliContext {
    /// The gateway's environment (usually `std::env::vars()`); children get only its
    /// allowlisted variables.
    pub base_env: BTreeMap<String, String>,
    /// The `PATH` to look executables up on; `None` uses `base_env["PATH"]`.
    pub search_path: Option<String>,
    /// Run supervisors and stdin writers are spawned here, so a shutdown can wait for them.
    pub tracker: TaskTracker,
    /// Cancelled when the gateway shuts down: every live child is then stopped.
    pub shutdown: CancellationToken,
    /// Resolved API keys by engine id (from each section's `api_key_secret`).
    pub api_keys: BTreeMap<String, ApiKey>,
    /// Keeps a record of every process group while it runs (the app: in the
    /// store), so the next start can kill what a killed gateway left.
    pub recorder: Option<Arc<dyn ProcessRecorder>>,
    /// The gateway's tools (`cron`, `sms_*`…), offered to native runs.
    pub tools: lemon_core::tool::ToolRegistry,
    /// The spending check native runs make between model turns.
    pub budget: Option<Arc<dyn lemon_core::budget::BudgetGuard>>,
    /// The gateway's store: native sessions are kept in it (in memory without one).
    pub store: Option<lemon_core::store::StoreHandle>,
    /// How the native engine's `bash` commands are contained; none by default.
    pub sandbox: crate::tools::Sandbox,
    /// The owner's policy over the native engine's tool calls; `None`
    /// allows every call.
    pub approvals: Option<crate::native::Approvals>,
    /// Where the CLIs ask about their calls (Claude Code's permission prompt
    /// tool on the gateway's MCP endpoint) and find the gateway's tools there;
    /// `None`: no CLI is pointed at the endpoint.
    pub gate: Option<lemon_core::approvals::Gate>,
    /// The MCP servers of `[[gateway.mcp_servers]]`, whose tools native runs
    /// are offered; `None`: no MCP tools.
    pub mcp: Option<crate::mcp::McpClients>,
}

/// The allowlisted part of `base` (the variables every child gets).
pub(crate) fn allowlisted_env(base: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    base.iter()
        .filter(|(key, _)| settings::ENV_ALLOWLIST.contains(&key.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// Builds the five vendor engines from `[gateway.engines.*]`: every vendor not
/// disabled with `enabled = false`, configured by its section (or defaults).
/// An engine whose CLI is missing is still built; it reports itself unavailable.
pub fn build_cli_engines(sections: &EngineSections, ctx: &CliContext) -> Vec<Arc<dyn Engine>> {
    let default_section = EngineSection::default();
    Vendor::ALL
        .into_iter()
        .filter_map(|vendor| {
            let section = sections.get(vendor.id()).unwrap_or(&default_section);
            if section.enabled == Some(false) {
                return None;
            }
            Some(Arc::new(CliEngine::new(vendor, section, ctx)) as Arc<dyn Engine>)
        })
        .collect()
}

/// One vendor CLI as an engine.
pub struct CliEngine {
    id: EngineId,
    vendor: Vendor,
    settings: Arc<CliSettings>,
    /// The app's environment; read for the child's allowlist and HOME.
    base_env: Arc<BTreeMap<String, String>>,
    /// Where executables are looked up.
    search_path: Option<String>,
    api_key: Option<ApiKey>,
    tracker: TaskTracker,
    shutdown: CancellationToken,
    recorder: Option<Arc<dyn ProcessRecorder>>,
    /// The first line of `<program> --version`, once asked.
    version: tokio::sync::OnceCell<Option<String>>,
    /// Asked what a run may still spend before a CLI that can cap it starts.
    budget: Option<Arc<dyn lemon_core::budget::BudgetGuard>>,
    gate: Option<lemon_core::approvals::Gate>,
}

/// How long `<cli> --version` may take before the engine is listed without one.
const VERSION_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3);

impl fmt::Debug for CliEngine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CliEngine")
            .field("id", &self.id)
            .field("settings", &self.settings)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .finish_non_exhaustive()
    }
}

impl CliEngine {
    /// The engine for `vendor`, configured by `section`; the API key comes from
    /// `ctx.api_keys[vendor id]`.
    pub fn new(vendor: Vendor, section: &EngineSection, ctx: &CliContext) -> Self {
        // Vendor ids are fixed, lowercase slugs.
        let id = EngineId::parse(vendor.id()).expect("vendor ids are valid engine ids");
        let settings = CliSettings::from_section(vendor, section);
        let api_key = ctx.api_keys.get(vendor.id()).cloned();
        if api_key.is_some() && settings.api_key_env.is_none() {
            tracing::warn!(
                engine = vendor.id(),
                "an API key is configured but not used: set api_key_env"
            );
        }
        CliEngine {
            id,
            vendor,
            settings: Arc::new(settings),
            base_env: Arc::new(ctx.base_env.clone()),
            search_path: ctx.search_path.clone().or_else(|| ctx.base_env.get("PATH").cloned()),
            api_key,
            tracker: ctx.tracker.clone(),
            shutdown: ctx.shutdown.clone(),
            recorder: ctx.recorder.clone(),
            version: tokio::sync::OnceCell::new(),
            budget: ctx.budget.clone(),
            gate: ctx.gate.clone(),
        }
    }

    /// The first non-empty line `<program> --version` prints, within
    /// [`VERSION_TIMEOUT`]; the child is killed if it takes longer.
    async fn read_version(&self) -> Option<String> {
        let program = self.resolve_program().ok()?;
        let spec = process::ProcessSpec {
            program,
            args: vec!["--version".to_owned()],
            cwd: PathBuf::from("/"),
            env: settings::child_env(&self.base_env, &[], &self.settings, None),
            stdin: process::StdinMode::Null,
            prompt_is_last_arg: false,
            landlock: None,
        };
        let read = async {
            let mut spawned = process::spawn(spec, 64 * 1024, &self.tracker).await.ok()?;
            let mut first = None;
            while let Ok(Some(line)) = spawned.stdout.next_line().await {
                if let (None, process::StdoutLine::Line(text)) = (&first, line) {
                    let text = text.trim();
                    if !text.is_empty() {
                        first =
                            Some(lemon_core::log_text::escape(text).chars().take(200).collect());
                    }
                }
            }
            spawned.child.wait().await;
            first
        };
        tokio::time::timeout(VERSION_TIMEOUT, read).await.ok().flatten()
    }

    pub fn vendor(&self) -> Vendor {
        self.vendor
    }

    /// The values of a run that go on the command line, checked once more here so
    /// that no caller can start a CLI with a token or a model it would read as an
    /// option, whatever path the request took.
    fn check_command_values(&self, req: &StartRequest) -> Result<(), EngineError> {
        let refuse = |what: &str, why: InvalidValue| {
            EngineError::Start(format!("invalid {what} for {}: {why}", self.vendor))
        };
        if let Some(token) = req.resume.as_ref().filter(|t| t.engine == self.vendor.id()) {
            resume::check(self.vendor, &token.value).map_err(|why| refuse("resume token", why))?;
        }
        let models = req.model.iter().chain(self.settings.model.iter());
        for model in models.map(|m| m.trim()).filter(|m| !m.is_empty()) {
            check_model(model).map_err(|why| refuse("model", why))?;
        }
        Ok(())
    }

    fn resolve_program(&self) -> Result<PathBuf, UnavailableReason> {
        settings::resolve_program(
            self.vendor,
            self.settings.cli_path.as_deref(),
            self.search_path.as_deref(),
        )
    }
}

#[async_trait]
impl Engine for CliEngine {
    fn id(&self) -> &EngineId {
        &self.id
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            steer: self.vendor == Vendor::Claude && self.settings.steering,
            redirect: false,
        }
    }

    fn program(&self) -> Option<PathBuf> {
        self.resolve_program().ok()
    }

    async fn version(&self) -> Option<String> {
        // A program still missing is asked again once it is installed.
        self.resolve_program().ok()?;
        self.version.get_or_init(|| self.read_version()).await.clone()
    }

    fn availability(&self) -> Availability {
        match self.resolve_program() {
            Ok(_) => Availability::Available,
            Err(reason) => Availability::Unavailable { reason },
        }
    }

    async fn start(
        &self,
        req: StartRequest,
        sink: EventSink,
    ) -> Result<Arc<dyn RunControl>, EngineError> {
        self.check_command_values(&req)?;
        let program = self.resolve_program().map_err(|reason| EngineError::Unavailable {
            engine: self.id.to_string(),
            reason: reason.to_string(),
        })?;
        // Only Claude can stop itself at a dollar amount.
        let max_budget_usd = match (&self.budget, self.vendor) {
            (Some(budget), Vendor::Claude) => {
                let model = req.model.clone().unwrap_or_default();
                let scope = lemon_core::budget::BudgetScope {
                    run_id: &req.run_id,
                    session_key: &req.session_key,
                    engine: self.id.as_str(),
                    model: &model,
                };
                budget.remaining_usd(scope).await
            }
            _ => None,
        };
        let launch = runner::Launch {
            max_budget_usd,
            vendor: self.vendor,
            program,
            settings: self.settings.clone(),
            base_env: self.base_env.clone(),
            api_key: self.api_key.as_ref().map(|key| key.expose().to_owned()),
            tracker: self.tracker.clone(),
            cancel: self.shutdown.child_token(),
            recorder: self.recorder.clone(),
            gate: self.gate.clone(),
        };
        runner::start(launch, req, sink).await
    }

    fn format_resume(&self, token: &ResumeToken) -> String {
        resume::format(self.vendor, &token.value)
    }

    fn check_resume(&self, value: &str) -> Result<(), InvalidValue> {
        resume::check(self.vendor, value)
    }

    fn extract_resume(&self, text: &str) -> Option<ResumeToken> {
        resume::extract(self.vendor, text)
    }

    fn is_resume_line(&self, line: &str) -> bool {
        resume::is_resume_line(self.vendor, line)
    }
}

#[cfg(test)]
mod tests;
