//! Lemon Gateway assembled from its library crates: config, environment and
//! secrets in; a running gateway (store, engines, runtime, router, control API,
//! health and every enabled channel) out, with its config reloaded on edits and
//! drained on shutdown. Both front ends embed it: the `lemon-gateway` binary
//! adds a command line, logging and signals; a desktop app adds its window.
//!
//! # Layout
//! - [`start`] builds and starts everything from [`ServeOptions`] and returns
//!   the [`Running`] gateway; [`Running::shutdown`] drains it.
//! - [`paths`]: where state lives (`$LEMON_HOME`, `config.toml`, the database,
//!   secrets), decided by the caller and passed in.

pub mod paths;
mod reload;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use lemon_api::http::{ConnectionLimits, ServeConfig};
use lemon_core::budget::store_guard::StoreBudgetGuard;
use lemon_core::bus::EventBus;
use lemon_core::config::{
    self, ConfigStatus, GatewayConfig, DEFAULT_API_PORT, DEFAULT_HEALTH_PORT,
};
use lemon_core::engine::EngineRegistry;
use lemon_core::gateway::{GatewayDeps, GatewayHandle, RuntimeConfig};
use lemon_core::router::{RouterConfig, RouterHandle};
use lemon_core::secrets::{
    check_bearer_token, env_var_name, SecretStore, SecretValue, SecretsFile,
};
use lemon_core::store::{ProcessGroupRecord, StoreHandle};
use lemon_core::tool::ToolRegistry;
use lemon_core::transport::{TransportDeps, TransportRegistry, TransportState};
use lemon_engines::cli::{kill_leftover_group, ApiKey, CliContext, Leftover, ProcessRecorder};
use lemon_engines::config::EngineSections;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::paths::{secure_home, HomeAccess, Paths};

/// The secret holding the control API's bearer token.
pub const API_TOKEN_SECRET: &str = "lemon_api_token";

/// How long start-up waits for transports to bind or fail before the gateway
/// reports ready; a slower one goes on starting in the background.
const TRANSPORT_START_WAIT: Duration = Duration::from_secs(5);

/// What the binary hands the server.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    pub paths: Paths,
    /// The process environment, for secrets and child processes.
    pub env: BTreeMap<String, String>,
    /// The user's home directory (fallback working directory).
    pub user_home: Option<PathBuf>,
}

/// A started server.
#[derive(Debug)]
pub struct Running {
    pub api_addr: SocketAddr,
    pub health_addr: SocketAddr,
    /// Set when the API token was generated on this start; shown to the user once.
    pub generated_token: Option<SecretValue>,
    pub gateway: GatewayHandle,
    /// Every message goes through the router.
    pub router: RouterHandle,
    /// `shutdown_grace_ms` in force (it follows edits of the config).
    shutdown_grace_ms: Arc<AtomicU64>,
    /// The config in force, as `GET /v1/config` reports it.
    pub config: ConfigStatus,
    store: StoreHandle,
    token: CancellationToken,
    tracker: TaskTracker,
}

/// How much longer than the longest `cancel_grace_ms` a cancelled run waits for
/// its engine to stop before it completes anyway.
const ENGINE_STOP_MARGIN: Duration = Duration::from_secs(30);

/// Maps `[gateway]` to the runtime's settings.
pub fn runtime_config(
    gateway: &GatewayConfig,
    engines: &EngineSections,
    user_home: Option<PathBuf>,
) -> RuntimeConfig {
    // A CLI is SIGKILLed after its grace, so the wait is over soon after that;
    // the margin only matters for an engine that is broken.
    let longest_grace = engines.longest_cancel_grace().unwrap_or(Duration::from_secs(2));
    RuntimeConfig {
        engine_stop_timeout: longest_grace + ENGINE_STOP_MARGIN,
        max_concurrent_runs: gateway.max_concurrent_runs,
        require_engine_lock: gateway.require_engine_lock,
        engine_lock_timeout: Duration::from_millis(gateway.engine_lock_timeout_ms),
        run_inactivity_timeout: Duration::from_millis(gateway.run_inactivity_timeout_ms),
        max_pending_runs: gateway.max_pending_runs,
        default_cwd: gateway.default_cwd.clone(),
        home_dir: user_home,
        allowed_cwd_roots: gateway.allowed_cwd_roots.clone(),
        ..RuntimeConfig::default()
    }
}

/// The control API's bearer token, trimmed: from `LEMON_API_TOKEN` when it is
/// set at all (blank too), else from the secrets file (a blank entry too), else
/// generated and saved (the flag). A blank or short token stops the start with
/// an error naming where it came from, never the value.
fn api_token(
    env: &BTreeMap<String, String>,
    secrets: &SecretStore,
) -> anyhow::Result<(SecretValue, bool)> {
    let var = env_var_name(API_TOKEN_SECRET);
    let configured = match env.get(&var) {
        Some(value) => {
            Some((SecretValue::new(value.as_str()), format!("the environment variable {var}")))
        }
        None => {
            let file = SecretsFile::new(secrets.file_path().to_owned());
            file.get_as_written(API_TOKEN_SECRET)?.map(|value| {
                (value, format!("{} (`{API_TOKEN_SECRET}`)", secrets.file_path().display()))
            })
        }
    };
    match configured {
        Some((value, origin)) => Ok((check_bearer_token(&value, &origin)?, false)),
        None => Ok(secrets.get_or_generate(API_TOKEN_SECRET)?),
    }
}

/// Raises the soft limit on open descriptors to the hard one, so connections get
/// every descriptor the system allows; the limit in force.
fn raise_descriptor_limit() -> u64 {
    use nix::sys::resource::{getrlimit, setrlimit, Resource, RLIM_INFINITY};
    // Linux refuses an infinite descriptor limit; this is its usual ceiling.
    const CEILING: u64 = 1 << 20;
    let (soft, hard) = match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok(limits) => limits,
        Err(error) => {
            tracing::warn!(%error, "cannot read the descriptor limit; assuming 1024");
            return 1024;
        }
    };
    let target = if hard == RLIM_INFINITY { CEILING.max(soft) } else { hard };
    if soft >= target {
        tracing::debug!(limit = soft, "descriptor limit");
        return soft;
    }
    match setrlimit(Resource::RLIMIT_NOFILE, target, hard) {
        Ok(()) => {
            tracing::debug!(limit = target, was = soft, "descriptor limit raised");
            target
        }
        Err(error) => {
            tracing::warn!(%error, limit = soft, "cannot raise the descriptor limit");
            soft
        }
    }
}

/// How the control API and the transports' listeners (`listener`) and the
/// health listener (`health`) serve connections, from `[gateway]` and the
/// descriptor limit.
fn serve_configs(gateway: &GatewayConfig, descriptor_limit: u64) -> (ServeConfig, ServeConfig) {
    let limits = ConnectionLimits::from_descriptor_limit(descriptor_limit);
    let base = ServeConfig {
        header_read_timeout: Duration::from_millis(gateway.http_header_read_timeout_ms),
        idle_timeout: Duration::from_millis(gateway.http_idle_timeout_ms),
        max_connections: limits.listener,
    };
    let listener =
        base.clone().with_max_connections(gateway.http_max_connections.unwrap_or(limits.listener));
    let health = base.with_max_connections(limits.health);
    tracing::debug!(
        descriptor_limit,
        max_connections = listener.max_connections,
        health_max_connections = health.max_connections,
        "connection caps"
    );
    (listener, health)
}

/// What every engine table of one gateway shares: its task tracker, its
/// shutdown token and its tools.
#[derive(Debug, Clone, Copy)]
struct Shared<'a> {
    tracker: &'a TaskTracker,
    token: &'a CancellationToken,
    tools: &'a ToolRegistry,
    budget: &'a Arc<StoreBudgetGuard>,
}

/// Builds every engine the sections enable ([`lemon_engines::build_registry`])
/// with the API keys their `api_key_secret`s name.
fn engines(
    sections: &EngineSections,
    opts: &ServeOptions,
    secrets: &SecretStore,
    store: &StoreHandle,
    shared: Shared<'_>,
) -> anyhow::Result<EngineRegistry> {
    let mut api_keys = BTreeMap::new();
    for (id, section) in sections.iter() {
        let Some(name) = &section.api_key_secret else { continue };
        match secrets.get(name)? {
            Some(value) => {
                api_keys.insert(id.to_owned(), ApiKey::new(value.expose()));
            }
            None => {
                tracing::warn!(engine = %id, secret = %name, "api_key_secret names a secret that is not set")
            }
        }
    }
    let ctx = CliContext {
        base_env: opts.env.clone(),
        search_path: None,
        tracker: shared.tracker.clone(),
        shutdown: shared.token.clone(),
        api_keys,
        recorder: Some(Arc::new(StoreRecorder { store: store.clone() })),
        tools: shared.tools.clone(),
        budget: Some(shared.budget.clone()),
    };
    Ok(lemon_engines::build_registry(sections, &ctx)?)
}

/// Records the process groups of CLI runs in the store while they run.
#[derive(Debug)]
struct StoreRecorder {
    store: StoreHandle,
}

#[async_trait::async_trait]
impl ProcessRecorder for StoreRecorder {
    async fn started(&self, group: ProcessGroupRecord) {
        if let Err(error) = self.store.record_process_group(group).await {
            tracing::warn!(pgid = group.pgid, %error, "process group not recorded");
        }
    }

    async fn reaped(&self, pgid: i32) {
        self.store.forget_process_group(pgid).await;
    }
}

/// Kills every process group an earlier gateway recorded and did not reap (it
/// was killed), unless its pid now belongs to another process; then forgets them.
async fn kill_leftover_processes(store: &StoreHandle) {
    let groups = match store.process_groups().await {
        Ok(groups) => groups,
        Err(error) => {
            tracing::error!(%error, "recorded process groups unreadable; none killed");
            return;
        }
    };
    for group in groups {
        match kill_leftover_group(&group) {
            Leftover::Killed { processes } => {
                tracing::warn!(
                    pgid = group.pgid,
                    processes,
                    "killed processes a previous gateway left running"
                );
            }
            Leftover::Reused => {
                tracing::info!(
                    pgid = group.pgid,
                    "leftover process group is gone; its pid is used by another process"
                );
            }
            Leftover::Gone => {}
        }
        store.forget_process_group(group.pgid).await;
    }
    if let Err(error) = store.flush().await {
        tracing::warn!(%error, "leftover process group records not removed");
    }
}

/// The config file's text (`None`: there is none) and its `[gateway]`.
fn load_config(paths: &Paths) -> anyhow::Result<(Option<String>, GatewayConfig)> {
    let text = match std::fs::read_to_string(&paths.config) {
        Ok(text) => Some(text),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => None,
        Err(_) => {
            // The loader names the path and the reason.
            config::load_file(&paths.config)?;
            None
        }
    };
    let loaded = match &text {
        Some(text) => config::load_str(text, &paths.config)?,
        None => config::LoadedConfig { config: config::Config::default(), warnings: Vec::new() },
    };
    for warning in &loaded.warnings {
        tracing::warn!("{warning}");
    }
    Ok((text, loaded.config.gateway))
}

async fn bind(addr: &str, what: &str) -> anyhow::Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .with_context(|| format!("could not listen on {addr} for the {what}"))
}

/// Starts everything and returns once the listeners are bound.
///
/// # Errors
/// Config errors (with file, line and column), an unopenable store, a port in use.
pub async fn start(opts: ServeOptions) -> anyhow::Result<Running> {
    let started = tokio::time::Instant::now();
    let descriptor_limit = raise_descriptor_limit();
    // The text read here is compared with the file once it is watched, so an
    // edit made while starting is still picked up.
    let (config_text, gateway_config) = load_config(&opts.paths)?;
    let engine_sections = EngineSections::parse(
        &gateway_config.engines,
        &opts.paths.config,
        config_text.as_deref().unwrap_or(""),
    )?;
    let config_status = ConfigStatus::new(reload::initial_report(
        &gateway_config,
        &engine_sections,
        config_text.is_none(),
    ));
    // Private to the user: the database holds every prompt and answer.
    let home = &opts.paths.home;
    match secure_home(home).with_context(|| format!("could not secure {}", home.display()))? {
        HomeAccess::Private => {}
        HomeAccess::Tightened(mode) => tracing::warn!(
            home = %home.display(),
            "the state directory was readable by other users (mode {mode:o}); it is now 0700"
        ),
        HomeAccess::SharedNotOurs(mode) => tracing::warn!(
            home = %home.display(),
            "the state directory is readable by other users (mode {mode:o}) and belongs to another user; run `chmod 700` on it"
        ),
    }
    let store = StoreHandle::open_sqlite(&opts.paths.database())?;
    // Before anything runs (and before the router resumes a single session): a
    // gateway that was killed may have left CLIs' grandchildren behind.
    kill_leftover_processes(&store).await;
    let secrets = Arc::new(SecretStore::new(opts.env.clone(), opts.paths.secrets()));
    let (api_token, generated) = api_token(&opts.env, &secrets)?;
    // Transports are checked before anything starts: a config mistake stops the
    // start before the router recovers a single request, while a port in use
    // only makes that transport fail (and retry).
    let registry = transports(
        &gateway_config,
        &secrets,
        &opts.paths.config,
        config_text.as_deref().unwrap_or(""),
    )?;
    let (listener_serve, health_serve) = serve_configs(&gateway_config, descriptor_limit);

    let token = CancellationToken::new();
    let tracker = TaskTracker::new();
    // The gateway's tools, offered to native runs; registered below once what
    // they use exists, and kept across reloads.
    let tools = ToolRegistry::new();
    // One guard for the gateway's life: every run is checked against it before
    // it starts, native runs between turns; a reload reconfigures it.
    let budget = Arc::new(StoreBudgetGuard::new(store.clone(), gateway_config.budgets.clone()));
    let build_engines: reload::BuildEngines = {
        let (opts, secrets, store) = (opts.clone(), secrets.clone(), store.clone());
        let (tracker, token, tools) = (tracker.clone(), token.clone(), tools.clone());
        let budget = budget.clone();
        Arc::new(move |sections: &EngineSections| {
            let shared =
                Shared { tracker: &tracker, token: &token, tools: &tools, budget: &budget };
            engines(sections, &opts, &secrets, &store, shared)
        })
    };
    let bus = EventBus::default();
    // Clones share one table: a reload swaps the engines for every holder.
    let engine_table = build_engines(&engine_sections)?;
    let deps = GatewayDeps {
        config: RuntimeConfig {
            budget: Some(budget.clone()),
            ..runtime_config(&gateway_config, &engine_sections, opts.user_home.clone())
        },
        engines: engine_table.clone(),
        store: store.clone(),
        bus: bus.clone(),
    };
    let gateway = GatewayHandle::start(deps, token.clone(), &tracker);
    // The router recovers its journal (requests a crash left behind) before it
    // takes the first new request, so recovered ones keep their place.
    let router_config = RouterConfig::from_gateway(&gateway_config);
    let router = RouterHandle::start(router_config, gateway.clone(), token.clone(), &tracker);
    let statuses = registry.statuses().clone();

    let api_listener = bind(&gateway_config.api.addr(DEFAULT_API_PORT), "control API").await?;
    let health_listener =
        bind(&gateway_config.health.addr(DEFAULT_HEALTH_PORT), "health endpoint").await?;
    let api_addr = api_listener.local_addr()?;
    let health_addr = health_listener.local_addr()?;
    let version: Arc<str> = env!("CARGO_PKG_VERSION").into();
    let api = lemon_api::api::router(lemon_api::api::ApiState {
        router: router.clone(),
        runs: router.query(),
        token: api_token.expose().into(),
        default_engine: gateway_config.default_engine.to_string().into(),
        version: version.clone(),
        started_at: started,
        shutdown: token.clone(),
        transports: statuses.clone(),
        config: config_status.clone(),
        budget: budget.clone(),
    });
    let health = lemon_api::health::health_router(
        lemon_api::health::HealthState::new(router.query(), version, started)
            .with_transports(statuses.clone())
            .with_detail_token(api_token.expose())
            .with_config(config_status.clone()),
    );
    tracker.spawn(serve_logged(
        api_listener,
        api,
        token.clone(),
        listener_serve.clone(),
        "control API",
    ));
    tracker.spawn(serve_logged(
        health_listener,
        health,
        token.clone(),
        health_serve,
        "health endpoint",
    ));
    let running_transports = registry.start_supervised(&TransportDeps {
        router: router.clone(),
        store: store.clone(),
        shutdown: token.clone(),
        tracker: tracker.clone(),
        http: listener_serve,
    });
    let settled = statuses.wait_for(|map| !map.values().any(|s| *s == TransportState::Starting));
    if tokio::time::timeout(TRANSPORT_START_WAIT, settled).await.is_err() {
        tracing::warn!("transports still starting; reporting ready anyway");
    }
    let shutdown_grace_ms = Arc::new(AtomicU64::new(gateway_config.shutdown_grace_ms));
    let reloader = reload::Reloader {
        path: opts.paths.config.clone(),
        started: gateway_config.clone(),
        current: gateway_config.clone(),
        last_text: config_text,
        empty_since: None,
        status: config_status.clone(),
        bus,
        gateway: gateway.clone(),
        engines: engine_table,
        router: router.clone(),
        transports: running_transports,
        secrets: secrets.clone(),
        build_engines,
        user_home: opts.user_home.clone(),
        shutdown_grace_ms: shutdown_grace_ms.clone(),
        budget,
    };
    tracker.spawn(reload::watch(reloader, token.clone()));
    tracing::info!(%api_addr, %health_addr, elapsed_ms = started.elapsed().as_millis() as u64, "gateway ready");
    Ok(Running {
        api_addr,
        health_addr,
        generated_token: generated.then_some(api_token),
        gateway,
        router,
        shutdown_grace_ms,
        config: config_status,
        store,
        token,
        tracker,
    })
}

/// Checks the config file at `file` as a start would: core's keys, the
/// engines' sections, every transport's section and the secrets they name (from `env`, then the
/// secrets file of `paths`). The warnings (unknown keys) when it would load.
///
/// # Errors
/// The first problem, with file, line and column where it has them.
pub fn check_config(
    file: &std::path::Path,
    paths: &Paths,
    env: &BTreeMap<String, String>,
) -> Result<Vec<String>, config::ConfigError> {
    let text = std::fs::read_to_string(file).map_err(|e| config::ConfigError::Read {
        path: file.to_owned(),
        message: format!("cannot read config file: {e}"),
    })?;
    let loaded = config::load_str(&text, file)?;
    let gateway = &loaded.config.gateway;
    EngineSections::parse(&gateway.engines, file, &text)?;
    let secrets = Arc::new(SecretStore::new(env.clone(), paths.secrets()));
    webhook_transport(gateway, &secrets, file, &text)?;
    telegram_transport(gateway, &secrets, file, &text)?;
    Ok(loaded.warnings)
}

/// Every transport the gateway knows, enabled or not; the one place a new
/// transport is added. Each decides whether it is on with
/// [`lemon_core::transport::enabled`] (through its config parser).
///
/// # Errors
/// A transport's section is invalid or names a secret that is not set.
fn transports(
    config: &GatewayConfig,
    secrets: &Arc<SecretStore>,
    config_path: &std::path::Path,
    text: &str,
) -> anyhow::Result<TransportRegistry> {
    use lemon_transports::{telegram, webhook};
    let mut registry = TransportRegistry::default();
    match webhook_transport(config, secrets, config_path, text)? {
        Some(transport) => registry.add(transport)?,
        None => registry.add_disabled(webhook::WEBHOOK_TRANSPORT_ID)?,
    }
    match telegram_transport(config, secrets, config_path, text)? {
        Some(transport) => registry.add(transport)?,
        None => registry.add_disabled(telegram::inbound::TRANSPORT_ID)?,
    }
    Ok(registry)
}

/// The webhook transport `config` asks for (`None`: switched off). `text` is
/// the file's text, to place a section's error in it.
///
/// # Errors
/// `[gateway.webhook]` is invalid or names a secret that is not set.
fn webhook_transport(
    config: &GatewayConfig,
    secrets: &Arc<SecretStore>,
    config_path: &std::path::Path,
    text: &str,
) -> Result<Option<Arc<dyn lemon_core::transport::Transport>>, config::ConfigError> {
    use lemon_transports::webhook;
    let located =
        |message: &str| config::section_error(config_path, text, &["gateway", "webhook"], message);
    let webhook_config =
        webhook::WebhookConfig::from_gateway(config.enable_webhook, config.webhook.as_ref())
            .map_err(|e| located(&e.0))?;
    let Some(webhook_config) = webhook_config else { return Ok(None) };
    let tokens = webhook_config.resolve_tokens(secrets).map_err(|e| located(&e.0))?;
    let resolver = Arc::new(webhook::SystemResolver);
    Ok(Some(Arc::new(webhook::WebhookTransport::new(webhook_config, tokens, resolver))))
}

/// The Telegram transport `config` asks for (`None`: switched off).
///
/// # Errors
/// `[gateway.telegram]` is invalid.
fn telegram_transport(
    config: &GatewayConfig,
    secrets: &Arc<SecretStore>,
    config_path: &std::path::Path,
    text: &str,
) -> Result<Option<Arc<dyn lemon_core::transport::Transport>>, config::ConfigError> {
    use lemon_transports::telegram;
    let telegram_section = config.telegram.as_ref();
    if !lemon_core::transport::enabled(config.enable_telegram, telegram_section) {
        return Ok(None);
    }
    let section = telegram_section.cloned().unwrap_or_default();
    let telegram_config = telegram::config::TelegramConfig::parse(&section)
        .map_err(|e| config::section_error(config_path, text, &["gateway", "telegram"], &e.0))?;
    let bound_chats = config
        .bindings
        .iter()
        .filter(|binding| binding.transport == telegram::inbound::TRANSPORT_ID)
        .filter_map(lemon_core::config::BindingConfig::chat_id_text)
        .collect();
    Ok(Some(Arc::new(telegram::bot::TelegramTransport::new(
        telegram_config,
        secrets.clone(),
        bound_chats,
    ))))
}

async fn serve_logged(
    listener: TcpListener,
    router: axum::Router,
    token: CancellationToken,
    config: ServeConfig,
    what: &'static str,
) {
    if let Err(error) = lemon_api::serve_with(listener, router, token, config).await {
        tracing::error!(%error, "{what} stopped");
    }
}

impl Running {
    /// How long running runs may finish at shutdown (`shutdown_grace_ms` in force).
    pub fn shutdown_grace(&self) -> Duration {
        Duration::from_millis(self.shutdown_grace_ms.load(Ordering::Relaxed))
    }

    /// The token that stops everything.
    pub fn token(&self) -> CancellationToken {
        self.token.clone()
    }

    /// Stops accepting runs, lets running ones finish within the grace period,
    /// cancels the rest, stops the listeners and flushes the store.
    ///
    /// # Errors
    /// When the store could not be flushed.
    pub async fn shutdown(self) -> anyhow::Result<()> {
        let grace = self.shutdown_grace();
        tracing::info!(grace_ms = grace.as_millis() as u64, "shutting down");
        let _ = self.gateway.drain(grace).await;
        self.token.cancel();
        self.tracker.close();
        if tokio::time::timeout(Duration::from_secs(10), self.tracker.wait()).await.is_err() {
            tracing::warn!("some tasks did not stop within 10 s");
        }
        self.store.close().await.context("could not flush the store")?;
        tracing::info!("stopped");
        Ok(())
    }
}
