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
//! - [`retention`]: `[gateway.retention]`, the task that keeps the store small.
//! - [`cluster`]: `[gateway.cluster]`, this gateway as one node of several.

mod backups;
mod bridge;
pub mod cluster;
mod config_file;
pub mod keychain;
pub mod paths;
mod reload;
pub mod retention;

/// For an app's `main`, before any thread: the environment, with its secrets
/// blanked in the block `/proc` shows.
pub use lemon_engines::cli::{seal_environment, SealedEnvironment};

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use lemon_api::http::{ClientLimits, ConnectionLimits, ServeConfig};
use lemon_core::budget::store_guard::StoreBudgetGuard;
use lemon_core::bus::EventBus;
use lemon_core::config::{
    self, ConfigStatus, GatewayConfig, DEFAULT_API_PORT, DEFAULT_HEALTH_PORT,
};
use lemon_core::cron::tool::CronTool;
use lemon_core::cron::{CronDeps, CronHandle, SystemClock};
use lemon_core::engine::EngineRegistry;
use lemon_core::gateway::{GatewayDeps, GatewayHandle, RuntimeConfig};
use lemon_core::ids::{EngineId, EngineRef};
use lemon_core::net::Network;
use lemon_core::router::{RouterConfig, RouterHandle};
use lemon_core::secrets::{
    check_bearer_token, env_var_name, SecretStore, SecretValue, SecretsFile,
};
use lemon_core::store::{ProcessGroupRecord, StoreHandle, StoreLocation};
use lemon_core::tool::ToolRegistry;
use lemon_core::transport::{TransportDeps, TransportRegistry, TransportState};
use lemon_engines::cli::{kill_leftover_group, ApiKey, CliContext, Leftover, ProcessRecorder};
use lemon_engines::config::EngineSections;
use lemon_engines::native::{self, NativeSettings};
use lemon_engines::tools::GatewayToolOptions;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::paths::{secure_home, Fence, HomeAccess, Paths};

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
    /// A second API token accepted beside the configured one for this start
    /// only (the desktop app's window logs in with it). Kept in memory, never
    /// written anywhere.
    pub launch_token: Option<SecretValue>,
}

/// A started server.
#[derive(Debug)]
pub struct Running {
    pub api_addr: SocketAddr,
    pub health_addr: SocketAddr,
    /// [`paths::Paths::running`], removed by a clean stop.
    running_file: PathBuf,
    /// Set when the API token was generated on this start; shown to the user once.
    pub generated_token: Option<SecretValue>,
    /// Every enabled channel and where it is reached once started, as
    /// `(id, where)` with no whitespace in `where`: the webhook's URL
    /// (`http://127.0.0.1:4046/webhooks/`), Telegram's mode (`polling:@bot`), or
    /// the state of one that is not running (`failing`).
    pub channels: Vec<(String, String)>,
    pub gateway: GatewayHandle,
    /// Every message goes through the router.
    pub router: RouterHandle,
    /// `shutdown_grace_ms` in force (it follows edits of the config).
    shutdown_grace_ms: Arc<AtomicU64>,
    /// The config in force, as `GET /v1/config` reports it.
    pub config: ConfigStatus,
    /// The gateway's tools, as native runs are offered them.
    pub tools: ToolRegistry,
    /// The native engine's MCP servers (their status for the dashboard and
    /// `/metrics`).
    pub mcp: lemon_engines::mcp::McpClients,
    store: StoreHandle,
    token: CancellationToken,
    tracker: TaskTracker,
    /// This node, in cluster mode.
    cluster: Option<Arc<lemon_core::cluster::ClusterNode>>,
    /// Cancelled when the gateway must stop on its own (its cluster node was
    /// fenced) or has stopped.
    stop_requested: CancellationToken,
}

/// How much longer than the longest `cancel_grace_ms` a cancelled run waits for
/// its engine to stop before it completes anyway.
const ENGINE_STOP_MARGIN: Duration = Duration::from_secs(30);

/// Maps `[gateway]` to the runtime's settings; `fence` says which workspace
/// runs use and what they may not touch.
pub fn runtime_config(
    gateway: &GatewayConfig,
    engines: &EngineSections,
    user_home: Option<PathBuf>,
    fence: &Fence,
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
        allowed_cwd_roots: gateway.allowed_cwd_roots.clone(),
        workspace_dir: Some(fence.workspace.clone()),
        off_limits: fence.off_limits.clone(),
        spare_cwd: Some(fence.spare.clone()),
        home_dir: user_home,
        auto_send_generated_images: gateway.auto_send_generated_images,
        media_stage: Some(fence.media.clone()),
        ..RuntimeConfig::default()
    }
}

/// The workspace and the state runs keep out of, for `gateway`'s
/// `workspace_dir`; a workspace that would hold the gateway's state is
/// replaced, and the replacement logged naming both.
pub(crate) fn fence(gateway: &GatewayConfig, paths: &Paths, user_home: Option<&Path>) -> Fence {
    let fence = paths.fence(user_home, gateway.workspace(&paths.home, user_home));
    if let Some(configured) = &fence.moved_from {
        tracing::info!(
            configured = %configured.display(),
            workspace = %fence.workspace.display(),
            "workspace_dir holds the gateway's own state; runs use the spare workspace instead"
        );
    }
    fence
}

/// The control API's bearer token, trimmed: from the keychain when it has it,
/// else from `LEMON_API_TOKEN` when it is
/// set at all (blank too), else from the secrets file (a blank entry too), else
/// generated and saved (the flag). A blank or short token stops the start with
/// an error naming where it came from, never the value.
pub fn api_token(
    env: &BTreeMap<String, String>,
    secrets: &SecretStore,
) -> anyhow::Result<(SecretValue, bool)> {
    match configured_api_token(env, secrets)? {
        Some(value) => Ok((value, false)),
        None => Ok(secrets.get_or_generate(API_TOKEN_SECRET)?),
    }
}

/// The API token where one is set (keychain, environment, secrets file, in
/// that order, as [`api_token`] reads them), checked; `None` when none is.
/// Also read again on every secrets check while the gateway runs, so a
/// changed token reaches the API without a restart.
pub(crate) fn configured_api_token(
    env: &BTreeMap<String, String>,
    secrets: &SecretStore,
) -> anyhow::Result<Option<SecretValue>> {
    let var = env_var_name(API_TOKEN_SECRET);
    if secrets.kind_of(API_TOKEN_SECRET)? == Some(lemon_core::secrets::SourceKind::Keychain) {
        if let Some(value) = secrets.get(API_TOKEN_SECRET)? {
            return Ok(Some(check_bearer_token(&value, "the keychain (`lemon_api_token`)")?));
        }
    }
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
        Some((value, origin)) => Ok(Some(check_bearer_token(&value, &origin)?)),
        None => Ok(None),
    }
}

/// The secret store of `paths` and `env` in lookup order: the OS keychain (when
/// one answers the probe, see [`keychain::open`]), the environment, then
/// `secrets.toml`. Blocks for at most the keychain's timeout; in async code
/// call it through `spawn_blocking`.
pub fn open_secrets(paths: &Paths, env: &BTreeMap<String, String>) -> SecretStore {
    let (keychain, status) = keychain::open(env);
    let keychain = keychain.map(|k| Box::new(k) as Box<dyn lemon_core::secrets::SecretSource>);
    SecretStore::new(env.clone(), paths.secrets()).with_keychain(keychain, status)
}

/// Opens the store `[gateway.store]` names: the SQLite file under the home, or
/// the PostgreSQL database whose connection string is the `url_secret` secret.
/// A gateway that `serves` holds a PostgreSQL database alone; a check
/// (`doctor`) opens it beside the gateway that does, and so does a cluster
/// node ([`start`] opens its store itself).
///
/// # Errors
/// The file or database cannot be opened or migrated, or the secret is unset.
pub async fn open_store(
    config: &lemon_core::config::StoreConfig,
    paths: &Paths,
    secrets: &SecretStore,
    serves: bool,
) -> anyhow::Result<(StoreHandle, StoreLocation)> {
    use lemon_core::config::StoreBackendKind;
    match config.backend {
        StoreBackendKind::Sqlite => {
            let path = paths.database();
            let store = StoreHandle::open_sqlite(&path)?;
            Ok((store, StoreLocation::File(path.into())))
        }
        StoreBackendKind::Postgres => {
            let (store, location) = open_postgres(config, secrets, serves).await?;
            Ok((StoreHandle::new(store), location))
        }
    }
}

/// The PostgreSQL store of `config`; `exclusive`: it holds the database alone
/// (one gateway, not a cluster node and not a check).
///
/// # Errors
/// The secret is unset, or the database cannot be reached or migrated.
pub(crate) async fn open_postgres(
    config: &lemon_core::config::StoreConfig,
    secrets: &SecretStore,
    exclusive: bool,
) -> anyhow::Result<(Arc<lemon_core::store::postgres::PostgresStore>, StoreLocation)> {
    let name = config.url_secret.as_deref().unwrap_or_default();
    let url = secrets
        .get(name)
        .with_context(|| format!("could not read the secret {name}"))?
        .ok_or_else(|| {
            anyhow::anyhow!(
                "[gateway.store] backend = \"postgres\": {}",
                secrets.not_set_message(name)
            )
        })?;
    let store = lemon_core::store::postgres::PostgresStore::connect(
        lemon_core::store::postgres::PostgresConfig {
            url: url.expose().to_owned(),
            pool_size: config.pool_size as usize,
            chat_state_ttl_ms: lemon_core::store::DEFAULT_CHAT_STATE_TTL_MS,
            exclusive,
        },
    )
    .await?;
    let target: Arc<str> = store.target().into();
    Ok((Arc::new(store), StoreLocation::Postgres(target)))
}

/// [`open_secrets`] off the async runtime's threads.
async fn open_secrets_blocking(paths: &Paths, env: &BTreeMap<String, String>) -> SecretStore {
    let (owned_paths, owned_env) = (paths.clone(), env.clone());
    match tokio::task::spawn_blocking(move || open_secrets(&owned_paths, &owned_env)).await {
        Ok(store) => store,
        Err(error) => {
            tracing::warn!(%error, "keychain probe failed; using the environment and the secrets file");
            SecretStore::new(env.clone(), paths.secrets())
        }
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
        clients: ClientLimits::default(),
    };
    let clients = &gateway.http_client_limits;
    let client_limits = ClientLimits {
        max_connections: clients.max_connections,
        requests_per_second: clients.requests_per_second,
        burst: clients.burst(),
        // The loader has checked every entry.
        exempt: clients.exempt.iter().filter_map(|text| Network::parse(text).ok()).collect(),
    };
    let listener = base
        .clone()
        .with_max_connections(gateway.http_max_connections.unwrap_or(limits.listener))
        .with_client_limits(client_limits);
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
    sandbox: &'a lemon_engines::tools::Sandbox,
    approvals: &'a lemon_engines::native::Approvals,
    gate: &'a lemon_core::approvals::Gate,
    mcp: &'a lemon_engines::mcp::McpClients,
    groups: &'a ProcessGroups,
}

/// The address a local client reaches a listener bound to `addr` at: the
/// loopback address of its family for an unspecified one (`0.0.0.0`, `::`).
fn loopback_of(addr: SocketAddr) -> SocketAddr {
    match addr.ip() {
        std::net::IpAddr::V4(ip) if ip.is_unspecified() => {
            SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, addr.port()))
        }
        std::net::IpAddr::V6(ip) if ip.is_unspecified() => {
            SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, addr.port()))
        }
        _ => addr,
    }
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
        if id == native::ENGINE_ID {
            continue;
        }
        let Some(name) = section.api_key_secret.as_ref().filter(|name| !name.trim().is_empty())
        else {
            continue;
        };
        match secrets.get(name)? {
            Some(value) => {
                api_keys.insert(id.to_owned(), ApiKey::new(value.expose()));
            }
            None => {
                tracing::warn!(engine = %id, "api_key_secret: {}", secrets.not_set_message(name))
            }
        }
    }
    // The native engine's key has a default secret per provider.
    let native = NativeSettings::from_section(sections.get(native::ENGINE_ID))?;
    if native.enabled && !native.api_key_secret.is_empty() {
        if let Some(value) = secrets.get(&native.api_key_secret)? {
            api_keys.insert(native::ENGINE_ID.to_owned(), ApiKey::new(value.expose()));
        }
    }
    let ctx = CliContext {
        base_env: opts.env.clone(),
        search_path: None,
        tracker: shared.tracker.clone(),
        shutdown: shared.token.clone(),
        api_keys,
        recorder: Some(Arc::new(StoreRecorder { groups: shared.groups.clone() })),
        tools: shared.tools.clone(),
        budget: Some(shared.budget.clone()),
        store: Some(store.clone()),
        sandbox: shared.sandbox.clone(),
        approvals: Some(shared.approvals.clone()),
        gate: Some(shared.gate.clone()),
        mcp: Some(shared.mcp.clone()),
    };
    Ok(lemon_engines::build_registry(sections, &ctx)?)
}

/// The engine of requests nothing else routes, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DefaultEngine {
    pub engine: EngineRef,
    pub reason: String,
}

/// `default_engine` as configured; unset, `lemon` when its provider key is
/// set or it needs none (`api_key_secret = ""`, a `base_url` on this
/// machine), else `echo`.
///
/// # Errors
/// A secrets file that cannot be read.
pub fn default_engine(
    gateway: &GatewayConfig,
    sections: &EngineSections,
    secrets: &SecretStore,
) -> anyhow::Result<DefaultEngine> {
    if let Some(engine) = &gateway.default_engine {
        let reason = "set by default_engine in config.toml".to_owned();
        return Ok(DefaultEngine { engine: engine.clone(), reason });
    }
    let native = NativeSettings::from_section(sections.get(native::ENGINE_ID))?;
    let secret = &native.api_key_secret;
    let (engine, reason) = if !native.enabled {
        (config::FALLBACK_ENGINE, "the lemon engine is disabled".to_owned())
    } else if !secret.is_empty() && secrets.get(secret)?.is_some() {
        (native::ENGINE_ID, format!("{secret} is set"))
    } else if native.key_optional() {
        let reason = match native.base_url.as_deref() {
            Some(url) if !secret.is_empty() => format!("{url} is on this machine and needs no key"),
            _ => "api_key_secret = \"\": its server needs no key".to_owned(),
        };
        (native::ENGINE_ID, reason)
    } else {
        (config::FALLBACK_ENGINE, format!("no {secret} set"))
    };
    let engine = EngineRef::new(EngineId::parse(engine).expect("built-in engine ids are valid"));
    Ok(DefaultEngine { engine, reason })
}

/// The router's settings, with the default engine the gateway chose when
/// `default_engine` is unset.
pub(crate) fn router_config(gateway: &GatewayConfig, chosen: &DefaultEngine) -> RouterConfig {
    let mut router = RouterConfig::from_gateway(gateway);
    if gateway.default_engine.is_none() {
        router.default_engine = chosen.engine.clone();
    }
    router
}

/// The `[[gateway.cron]]` jobs of a config.
pub(crate) fn cron_jobs(
    config: &lemon_core::config::GatewayConfig,
) -> Vec<lemon_core::cron::JobSpec> {
    config.cron.iter().map(lemon_core::config::CronJobConfig::to_spec).collect()
}

/// The process groups this gateway's CLIs and helpers run in, recorded in the
/// store while they run so that a start after a crash kills what is left. In
/// cluster mode each machine and home has its own records
/// ([`cluster::process_namespace`]): the store is shared, the processes are not.
#[derive(Debug, Clone)]
pub(crate) struct ProcessGroups {
    store: StoreHandle,
    namespace: Arc<str>,
}

impl ProcessGroups {
    /// Records `group` and waits until the record is durable.
    pub(crate) async fn record(
        &self,
        group: ProcessGroupRecord,
    ) -> Result<(), lemon_core::store::StoreError> {
        if &*self.namespace == lemon_core::store::PROCESS_GROUPS_NAMESPACE {
            return self.store.record_process_group(group).await;
        }
        let value = serde_json::to_value(group).map_err(|e| {
            lemon_core::store::StoreError::Corrupt(format!("process group {}: {e}", group.pgid))
        })?;
        self.store.kv_put(&self.namespace, &group.pgid.to_string(), value, None).await;
        self.store.flush().await
    }

    /// Forgets a reaped group.
    pub(crate) async fn forget(&self, pgid: i32) {
        self.store.kv_delete(&self.namespace, &pgid.to_string()).await;
    }

    /// Every recorded group; an unreadable record is dropped.
    async fn list(&self) -> Result<Vec<ProcessGroupRecord>, lemon_core::store::StoreError> {
        if &*self.namespace == lemon_core::store::PROCESS_GROUPS_NAMESPACE {
            return self.store.process_groups().await;
        }
        let records = self.store.kv_list(&self.namespace, lemon_core::clock::now_ms()).await?;
        let mut groups = Vec::with_capacity(records.len());
        for (key, value) in records {
            match serde_json::from_value::<ProcessGroupRecord>(value) {
                Ok(group) => groups.push(group),
                Err(error) => {
                    tracing::warn!(key, %error, "unreadable process group record dropped");
                    self.store.kv_delete(&self.namespace, &key).await;
                }
            }
        }
        Ok(groups)
    }
}

/// Records the process groups of CLI runs in the store while they run.
#[derive(Debug)]
struct StoreRecorder {
    groups: ProcessGroups,
}

#[async_trait::async_trait]
impl ProcessRecorder for StoreRecorder {
    async fn started(&self, group: ProcessGroupRecord) {
        if let Err(error) = self.groups.record(group).await {
            tracing::warn!(pgid = group.pgid, %error, "process group not recorded");
        }
    }

    async fn reaped(&self, pgid: i32) {
        self.groups.forget(pgid).await;
    }
}

/// Kills every process group an earlier gateway recorded and did not reap (it
/// was killed), unless its pid now belongs to another process; then forgets them.
async fn kill_leftover_processes(groups: &ProcessGroups) {
    let recorded = match groups.list().await {
        Ok(recorded) => recorded,
        Err(error) => {
            tracing::error!(%error, "recorded process groups unreadable; none killed");
            return;
        }
    };
    for group in recorded {
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
        groups.forget(group.pgid).await;
    }
    if let Err(error) = groups.store.flush().await {
        tracing::warn!(%error, "leftover process group records not removed");
    }
}

/// The config file's text (`None`: there is none) and its `[gateway]`, with
/// the environment's overrides (`LEMON_GATEWAY_*`, `LEMON_SMS_*`,
/// `TWILIO_*`…, see [`config::env`]) applied over it.
fn load_config(
    paths: &Paths,
    env: &BTreeMap<String, String>,
) -> anyhow::Result<(Option<String>, GatewayConfig)> {
    let text = match std::fs::read_to_string(&paths.config) {
        Ok(text) => Some(text),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => None,
        Err(_) => {
            // The loader names the path and the reason.
            config::load_file(&paths.config)?;
            None
        }
    };
    let loaded = config::load_str_with_env(text.as_deref().unwrap_or(""), &paths.config, env)?;
    match &text {
        Some(_) => tracing::info!(config = %paths.config.display(), "config read"),
        None => tracing::info!(
            config = %paths.config.display(),
            "no config file; defaults apply"
        ),
    }
    for warning in &loaded.warnings {
        tracing::warn!("{warning}");
    }
    Ok((text, loaded.config.gateway))
}

/// The enabled webhook's configured callback URLs, checked once: a malformed
/// or private one stops the start, one whose host does not resolve is a
/// warning.
///
/// # Errors
/// The first URL the webhook cannot use, placed in the file.
async fn check_webhook_callbacks(
    config: &GatewayConfig,
    path: &std::path::Path,
    text: &str,
) -> Result<(), config::ConfigError> {
    use lemon_transports::webhook;
    let Ok(Some(hook)) =
        webhook::WebhookConfig::from_gateway(config.enable_webhook, config.webhook.as_ref())
    else {
        return Ok(());
    };
    for problem in webhook::check_callback_urls(&hook, &webhook::SystemResolver).await {
        let (key, message, fatal) = match problem {
            webhook::CallbackUrlProblem::Invalid { key, message } => (key, message, true),
            webhook::CallbackUrlProblem::Unresolved { key, message } => (key, message, false),
        };
        let mut at = vec!["gateway", "webhook"];
        at.extend(key[..key.len() - 1].iter().map(String::as_str));
        let error = config::section_error(path, text, &at, &format!("`callback_url`: {message}"));
        if fatal {
            return Err(error);
        }
        tracing::warn!("{error}");
    }
    Ok(())
}

/// Where each secret the config names (and the API token) comes from; a
/// source that overrides another (a stale variable in the environment over
/// `secrets.toml`) is logged, naming both and never the value.
fn secret_sources(
    config: &GatewayConfig,
    engines: &EngineSections,
    secrets: &SecretStore,
) -> Vec<(String, lemon_core::secrets::SecretOrigin)> {
    let mut names = vec![API_TOKEN_SECRET.to_owned()];
    names.extend(
        engines
            .iter()
            .filter_map(|(_, section)| section.api_key_secret.clone())
            .filter(|name| !name.trim().is_empty()),
    );
    let named = |section: Option<&toml::Table>, key: &str| -> Option<String> {
        section?.get(key)?.as_str().map(str::to_owned)
    };
    names.extend(named(config.telegram.as_ref(), "bot_token_secret"));
    names.extend(named(config.discord.as_ref(), "bot_token_secret"));
    // The voice transcription key of a chat channel that transcribes.
    for section in [config.telegram.as_ref(), config.discord.as_ref()].into_iter().flatten() {
        if let Ok((voice, _)) = lemon_transports::media::VoiceConfig::split(section) {
            names.extend(voice.secret_names());
        }
    }
    if lemon_core::transport::enabled(config.enable_xmtp, config.xmtp.as_ref()) {
        let xmtp = config.xmtp.as_ref();
        for (key, default) in [
            ("wallet_key_secret", lemon_transports::xmtp::config::DEFAULT_WALLET_KEY_SECRET),
            ("db_encryption_key_secret", lemon_transports::xmtp::config::DEFAULT_DB_KEY_SECRET),
        ] {
            names.push(named(xmtp, key).unwrap_or_else(|| default.to_owned()));
        }
    }
    let email = config.email.as_ref();
    for part in ["imap", "smtp", "inbound_webhook"] {
        let table = email.and_then(|section| section.get(part)).and_then(|v| v.as_table());
        names.extend(named(table, "password_secret"));
        names.extend(named(table, "token_secret"));
    }
    if let Ok(Some(voice)) = lemon_voice::VoiceConfig::from_gateway(config.voice.as_ref()) {
        names.extend([
            voice.twilio_auth_token_secret,
            voice.twilio_account_sid_secret,
            voice.deepgram_api_key_secret,
            voice.elevenlabs_api_key_secret,
        ]);
    }
    if let Some(integrations) = config
        .webhook
        .as_ref()
        .and_then(|section| section.get("integrations"))
        .and_then(|value| value.as_table())
    {
        for integration in integrations.values() {
            names.extend(named(integration.as_table(), "token_secret"));
        }
    }
    names.sort();
    names.dedup();
    let mut out = Vec::new();
    for name in names {
        let Ok(Some(origin)) = secrets.origin(&name) else { continue };
        if !origin.overrides.is_empty() {
            tracing::warn!(
                secret = %name,
                source = %origin.source,
                overrides = %origin.overrides.join(", "),
                "secret set in more than one place; the first is used"
            );
        }
        out.push((name, origin));
    }
    out
}

/// Every secret `config` uses and what uses it, inline values (named by their
/// key in config.toml) included, for `GET /v1/secrets`. Inline values are
/// logged as a warning when the config is read.
pub(crate) fn secret_uses(
    config: &GatewayConfig,
    engines: &EngineSections,
) -> Vec<lemon_api::secrets::SecretUse> {
    use lemon_api::secrets::SecretUse;
    let mut uses = vec![SecretUse {
        name: API_TOKEN_SECRET.to_owned(),
        used_by: vec!["api".to_owned()],
        inline: false,
    }];
    let mut named = |used_by: String, section: Option<&toml::Table>, key: &str, at: String| {
        let Some(section) = section else { return };
        if let Some(name) = section.get(&format!("{key}_secret")).and_then(|v| v.as_str()) {
            uses.push(SecretUse {
                name: name.to_owned(),
                used_by: vec![used_by.clone()],
                inline: false,
            });
        }
        if section.get(key).and_then(|v| v.as_str()).is_some_and(|v| !v.trim().is_empty()) {
            uses.push(SecretUse {
                name: format!("{at}.{key}"),
                used_by: vec![used_by],
                inline: true,
            });
        }
    };
    named(
        "telegram".to_owned(),
        config.telegram.as_ref(),
        "bot_token",
        "gateway.telegram".to_owned(),
    );
    // The reference's inline Twilio auth token.
    named("sms".to_owned(), config.sms.as_ref(), "auth_token", "gateway.sms".to_owned());
    if let Some(webhook) = config.webhook.as_ref() {
        named("webhook".to_owned(), Some(webhook), "token", "gateway.webhook".to_owned());
        if let Some(integrations) = webhook.get("integrations").and_then(|v| v.as_table()) {
            for (id, integration) in integrations {
                named(
                    format!("webhook.{id}"),
                    integration.as_table(),
                    "token",
                    format!("gateway.webhook.integrations.{id}"),
                );
            }
        }
    }
    for (id, section) in engines.iter() {
        if let Some(name) = &section.api_key_secret {
            uses.push(SecretUse {
                name: name.clone(),
                used_by: vec![format!("engines.{id}")],
                inline: false,
            });
        }
    }
    if let Ok(native) = NativeSettings::from_section(engines.get(native::ENGINE_ID)) {
        if native.enabled && !native.api_key_secret.is_empty() {
            uses.push(SecretUse {
                name: native.api_key_secret.clone(),
                used_by: vec![format!("engines.{}", native::ENGINE_ID)],
                inline: false,
            });
        }
    }
    uses
}

/// Every secret a config read from a file uses, as `GET /v1/secrets` lists them (its engine sections parsed
/// here; sections that do not parse name no secrets).
pub fn secret_uses_of(config: &GatewayConfig) -> Vec<lemon_api::secrets::SecretUse> {
    let sections =
        EngineSections::parse(&config.engines, Path::new("config.toml"), "").unwrap_or_default();
    secret_uses(config, &sections)
}

/// Where each enabled channel is reached, for the ready line (see
/// [`Running::channels`]).
fn channel_lines(states: &BTreeMap<String, TransportState>) -> Vec<(String, String)> {
    use lemon_transports::{telegram, webhook};
    states
        .iter()
        .filter(|(_, state)| **state != TransportState::Disabled)
        .map(|(id, state)| {
            // A detail may go on after its address (`; 1 callback given up`).
            let detail = match state {
                TransportState::Running { detail } => detail
                    .as_deref()
                    .and_then(|d| d.split([';', ' ']).next())
                    .filter(|d| !d.is_empty()),
                _ => None,
            };
            let at = match (id.as_str(), detail) {
                // A cluster node's single-consumer channel another node runs.
                (_, Some("standby")) => "standby".to_owned(),
                (webhook::WEBHOOK_TRANSPORT_ID, Some(addr)) => format!("http://{addr}/webhooks/"),
                (telegram::inbound::TRANSPORT_ID, Some(bot)) => format!("polling:{bot}"),
                (lemon_sms::reply::SMS_TRANSPORT_ID, Some(addr)) => {
                    format!("http://{addr}{}", lemon_sms::config::WEBHOOK_PATH)
                }
                (lemon_voice::TRANSPORT_ID, Some(addr)) => {
                    format!("http://{addr}/webhooks/twilio/voice")
                }
                (_, Some(detail)) => detail.to_owned(),
                (_, None) => state.as_str().to_owned(),
            };
            (id.clone(), at)
        })
        .collect()
}

/// Every engine a config names, with the key that names it: `default_engine`,
/// each project's and binding's, Telegram's and Discord's `engine`, each
/// webhook integration's.
pub fn engine_refs(config: &GatewayConfig) -> Vec<(Vec<String>, lemon_core::ids::EngineRef)> {
    let mut refs: Vec<(Vec<String>, lemon_core::ids::EngineRef)> = Vec::new();
    if let Some(engine) = &config.default_engine {
        refs.push((vec!["default_engine".to_owned()], engine.clone()));
    }
    for (id, project) in &config.projects {
        if let Some(engine) = &project.default_engine {
            let key = vec!["projects".into(), id.clone(), "default_engine".into()];
            refs.push((key, engine.clone()));
        }
    }
    for (i, binding) in config.bindings.iter().enumerate() {
        if let Some(engine) = &binding.default_engine {
            let key = vec!["bindings".into(), i.to_string(), "default_engine".into()];
            refs.push((key, engine.clone()));
        }
    }
    let parsed = |value: Option<&toml::Value>| {
        value
            .and_then(toml::Value::as_str)
            .and_then(|raw| lemon_core::ids::EngineRef::parse(raw).ok())
    };
    for (channel, section) in [("telegram", &config.telegram), ("discord", &config.discord)] {
        if let Some(engine) = parsed(section.as_ref().and_then(|section| section.get("engine"))) {
            refs.push((vec![channel.into(), "engine".into()], engine));
        }
    }
    let integrations = config
        .webhook
        .as_ref()
        .and_then(|section| section.get("integrations"))
        .and_then(|value| value.as_table());
    for (id, integration) in integrations.into_iter().flatten() {
        if let Some(engine) = parsed(integration.get("engine")) {
            let key = vec!["webhook".into(), "integrations".into(), id.clone(), "engine".into()];
            refs.push((key, engine));
        }
    }
    refs
}

/// Every engine a config names ([`engine_refs`]) is one of `registry`, checked
/// at start and for every edit.
///
/// # Errors
/// The first engine that is not, naming the key, its place in the file and the
/// engines there are.
fn check_engine_refs(
    config: &GatewayConfig,
    registry: &EngineRegistry,
    path: &std::path::Path,
    text: &str,
) -> Result<(), config::ConfigError> {
    for (key, engine) in engine_refs(config) {
        if registry.engine(engine.id()).is_some() {
            continue;
        }
        let mut known: Vec<String> = registry.ids().map(|id| id.to_string()).collect();
        known.sort();
        let suggestion =
            config::did_you_mean(engine.id().as_str(), known.iter().map(String::as_str))
                .map(|s| format!("did you mean {s:?}? "))
                .unwrap_or_default();
        let message = format!(
            "unknown engine {:?}: {suggestion}the engines are {}",
            engine.id().as_str(),
            known.join(", ")
        );
        let mut at = vec!["gateway".to_owned()];
        let last = key.last().cloned().unwrap_or_default();
        at.extend(key[..key.len() - 1].iter().cloned());
        let at: Vec<&str> = at.iter().map(String::as_str).collect();
        let error = config::section_error(path, text, &at, &format!("`{last}`: {message}"));
        return Err(error);
    }
    Ok(())
}

/// Warnings about keys the channels' and engines' sections do not know, placed
/// in the file with the closest known key, whether the section is enabled or
/// not. A section that does not parse gives none here: its error is reported
/// where it is built.
fn section_warnings(
    config: &GatewayConfig,
    engines: &EngineSections,
    registry: &EngineRegistry,
    path: &std::path::Path,
    text: &str,
) -> Vec<String> {
    use lemon_transports::{telegram, webhook};
    let mut out = Vec::new();
    let mut place = |section: &str, unknown: Vec<config::UnknownKey>| {
        for key in unknown {
            out.push(config::unknown_key_warning(path, text, &["gateway", section], &key));
        }
    };
    // What the reference gateway's keys do where that is worth saying.
    let mut notes: Vec<String> = Vec::new();
    let mut note = |section: &str, found: Vec<config::KeyNote>| {
        for found in found {
            notes.push(config::key_note_warning(path, text, &["gateway", section], &found));
        }
    };
    if let Some(table) = &config.sms {
        note("sms", lemon_sms::SmsConfig::reference_notes(table));
    }
    if let Some(table) = &config.discord {
        note("discord", lemon_transports::discord::config::DiscordConfig::reference_notes(table));
    }
    if let Some(table) = &config.email {
        note("email", lemon_transports::email::config::EmailConfig::reference_notes(table));
    }
    if let Some(table) = &config.xmtp {
        note("xmtp", lemon_transports::xmtp::config::XmtpConfig::reference_notes(table));
    }
    if let Some(table) = &config.voice {
        note("voice", lemon_voice::VoiceConfig::reference_notes(table));
    }
    if let Some(table) = &config.telegram {
        note("telegram", telegram::config::TelegramConfig::reference_notes(table));
    }
    if let Some(table) = &config.webhook {
        if let Ok((_, unknown)) = webhook::WebhookConfig::parse_with_unknown_keys(table) {
            place("webhook", unknown);
        }
    }
    if let Some(table) = &config.telegram {
        if let Ok((_, unknown)) = telegram::config::TelegramConfig::parse_values(table) {
            place("telegram", unknown);
        }
    }
    if let Some(table) = &config.sms {
        if let Ok((_, unknown)) = lemon_sms::SmsConfig::parse_with_unknown_keys(table) {
            place("sms", unknown);
        }
    }
    if let Some(table) = &config.discord {
        if let Ok((_, unknown)) =
            lemon_transports::discord::config::DiscordConfig::parse_values(table)
        {
            place("discord", unknown);
        }
    }
    if let Some(table) = &config.email {
        use lemon_transports::email::config::EmailConfig;
        if let Ok((_, unknown)) = EmailConfig::parse_values(table) {
            place("email", unknown);
        }
    }
    if let Some(table) = &config.voice {
        if let Ok((_, unknown)) = lemon_voice::VoiceConfig::parse_with_unknown_keys(table) {
            place("voice", unknown);
        }
    }
    if let Some(table) = &config.xmtp {
        use lemon_transports::xmtp::config::XmtpConfig;
        if let Ok((_, unknown)) = XmtpConfig::parse_values(table) {
            place("xmtp", unknown);
        }
    }
    let ids: Vec<String> = registry.ids().map(|id| id.to_string()).collect();
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    out.extend(engines.warnings(path, text, &ids));
    out.extend(notes);
    out
}

async fn bind(addr: &str, what: &str) -> anyhow::Result<TcpListener> {
    lemon_api::http::bind(addr)
        .await
        .with_context(|| format!("could not listen on {addr} for the {what}"))
}

/// Starts everything and returns once the listeners are bound.
///
/// # Errors
/// Config errors (with file, line and column), an unopenable store, a port in use.
pub async fn start(opts: ServeOptions) -> anyhow::Result<Running> {
    let started = tokio::time::Instant::now();
    // Before any secret is read: no child may read this process's memory or
    // environment (an embedding app's too).
    lemon_engines::cli::hide_from_children().map_err(anyhow::Error::msg)?;
    tracing::info!(tracking = %lemon_engines::cli::process_tracking(), "child processes tracked");
    let descriptor_limit = raise_descriptor_limit();
    // The text read here is compared with the file once it is watched, so an
    // edit made while starting is still picked up.
    let (config_text, mut gateway_config) = load_config(&opts.paths, &opts.env)?;
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
    // Secrets first: a PostgreSQL store's connection string is one.
    let secrets = Arc::new(open_secrets_blocking(&opts.paths, &opts.env).await);
    // A cluster node shares its database with the other nodes: it does not
    // take the one-gateway lock, and it joins the cluster below.
    let clustered = gateway_config.cluster.enabled;
    let (store, location, postgres) = if clustered {
        let (postgres, location) = open_postgres(&gateway_config.store, &secrets, false).await?;
        (StoreHandle::new(postgres.clone()), location, Some(postgres))
    } else {
        let (store, location) =
            open_store(&gateway_config.store, &opts.paths, &secrets, true).await?;
        (store, location, None)
    };
    let groups = ProcessGroups {
        store: store.clone(),
        namespace: cluster::process_namespace(clustered, home),
    };
    tracing::info!(
        home = %home.display(),
        store = location.backend(),
        database = %location.describe(),
        secrets = %opts.paths.secrets().display(),
        "state"
    );
    // Before anything runs (and before the router resumes a single session): a
    // gateway that was killed may have left CLIs' grandchildren behind.
    kill_leftover_processes(&groups).await;
    let keychain = secrets.keychain();
    if keychain.available {
        tracing::info!(keychain = %keychain.detail, "secrets: keychain, environment, secrets file");
    } else {
        // Why each backend failed is long; `doctor` says it, and `-v` logs it.
        tracing::info!(
            "no keychain; secrets come from the environment and the secrets file (`lemon-gateway doctor` says why)"
        );
        tracing::debug!(reason = %keychain.detail, "no keychain");
    }
    for warning in secrets.warnings() {
        tracing::warn!("{warning}");
    }
    let (api_token, generated) = api_token(&opts.env, &secrets)?;
    let token = CancellationToken::new();
    let tracker = TaskTracker::new();
    // A cluster node puts the cluster config over its file before anything
    // is built from it, and follows it from then on.
    let joined = match &postgres {
        Some(postgres) => {
            Some(cluster::join(&mut gateway_config, postgres, &tracker, token.clone()).await?)
        }
        None => None,
    };
    let cluster_node = joined.as_ref().map(|joined| joined.node.clone());
    let shared_config = joined.as_ref().and_then(|joined| joined.shared.clone().ok());
    let applied_config = lemon_api::cluster::AppliedConfig::default();
    // A version refused at start is tried again after a good edit of the file.
    let mut refused_row = None;
    let (shared_rows, shared_checks) = match joined {
        Some(joined) => {
            config_status.update(|report| {
                report.effective = reload::effective_json(&gateway_config, &engine_sections);
            });
            match &joined.shared {
                Ok(shared) => applied_config.applied(shared.version()),
                Err(error) => {
                    applied_config.refused(joined.row.version, error.clone());
                    refused_row = Some(joined.row.clone());
                }
            }
            let (rows_tx, rows) = tokio::sync::watch::channel(Some(joined.row));
            cluster::follow_config(joined.node.clone(), rows_tx, &tracker, token.clone());
            let (checks_tx, checks) = tokio::sync::mpsc::channel(8);
            (Some(rows), Some((checks_tx, checks)))
        }
        None => (None, None),
    };
    // Transports are checked before anything starts: a config mistake stops the
    // start before the router recovers a single request, while a port in use
    // only makes that transport fail (and retry).
    let sms = sms_section(
        &gateway_config,
        &secrets,
        &opts.paths.config,
        config_text.as_deref().unwrap_or(""),
    )?
    .map(|(config, sms_secrets)| {
        lemon_sms::Sms::new(config, sms_secrets, store.clone(), token.clone(), &tracker)
    });
    // Decided once: the workspace runs use, and the gateway's own state that
    // nothing a run does (tools, artifacts, uploads, cron paths) may reach.
    let fence = fence(&gateway_config, &opts.paths, opts.user_home.as_deref());
    let registry = transports(
        &gateway_config,
        &secrets,
        &opts.paths.config,
        config_text.as_deref().unwrap_or(""),
        sms.as_ref(),
        &HelperDeps {
            lemon_home: &opts.paths.home,
            user_home: opts.user_home.as_deref(),
            groups: &groups,
            tracker: &tracker,
            env: &opts.env,
            cluster: cluster_node.as_ref(),
        },
    )?;
    check_webhook_callbacks(
        &gateway_config,
        &opts.paths.config,
        config_text.as_deref().unwrap_or(""),
    )
    .await?;
    let (listener_serve, health_serve) = serve_configs(&gateway_config, descriptor_limit);

    // The gateway's tools, offered to native runs; registered below once what
    // they use exists, and kept across reloads.
    let tools = ToolRegistry::new();
    // Without SMS the sms_* tools answer that SMS is not configured.
    let mut gateway_tools = GatewayToolOptions {
        home: opts.user_home.clone(),
        sms: sms.as_ref().map(|sms| sms.inbox() as Arc<dyn lemon_core::sms::SmsInbox>),
        ..Default::default()
    };
    // `discord_send_file` queues no file the transport would refuse to upload.
    if let Some(Ok((discord, _))) = gateway_config
        .discord
        .as_ref()
        .map(lemon_transports::discord::config::DiscordConfig::parse_values)
    {
        gateway_tools.discord_max_bytes = discord.max_upload_bytes;
    }
    lemon_engines::tools::register_gateway_tools(&tools, &gateway_tools);
    if let Some(sms) = &sms {
        tools.register(sms.send_tool());
    }
    // One guard for the gateway's life: every run is checked against it before
    // it starts, native runs between turns; a reload reconfigures it.
    let budget = Arc::new(StoreBudgetGuard::new(store.clone(), gateway_config.budgets.clone()));
    // How `bash` is contained, said once at start.
    let sandbox = lemon_engines::tools::Sandbox::from_config(
        &gateway_config.sandbox,
        opts.user_home.as_deref(),
    );
    if sandbox.enforced() {
        tracing::info!(mode = sandbox.mode.as_str(), "sandbox: {}", sandbox.describe());
    } else {
        tracing::warn!(mode = sandbox.mode.as_str(), "sandbox: {}", sandbox.describe());
    }
    // The owner's policy over tool calls (checked when the config was read),
    // and where asked calls wait for an answer.
    let approval_hub = lemon_core::approvals::ApprovalHub::default();
    // A config edit replaces the rules in force (`reload`).
    let approval_rules =
        lemon_core::approvals::Rules::from_gateway(&gateway_config).unwrap_or_default();
    let approvals = lemon_engines::native::Approvals {
        rules: approval_rules.clone(),
        hub: approval_hub.clone(),
    };
    // Where Claude Code asks about its calls, on the API's `/mcp` once it listens.
    let gate = lemon_core::approvals::Gate::new(approval_rules.clone(), approval_hub.clone());
    // The native engine's MCP servers, started by the first run that offers them.
    let mcp = mcp_clients(&gateway_config, &opts, &secrets, &tracker, &token);
    mcp.record_processes(Arc::new(StoreRecorder { groups: groups.clone() }));
    let build_engines: reload::BuildEngines = {
        let (opts, secrets, store) = (opts.clone(), secrets.clone(), store.clone());
        let (tracker, token, tools) = (tracker.clone(), token.clone(), tools.clone());
        let (budget, sandbox, approvals) = (budget.clone(), sandbox.clone(), approvals.clone());
        let (gate, mcp, groups) = (gate.clone(), mcp.clone(), groups.clone());
        Arc::new(move |sections: &EngineSections| {
            let shared = Shared {
                tracker: &tracker,
                token: &token,
                tools: &tools,
                budget: &budget,
                sandbox: &sandbox,
                approvals: &approvals,
                gate: &gate,
                mcp: &mcp,
                groups: &groups,
            };
            engines(sections, &opts, &secrets, &store, shared)
        })
    };
    let bus = EventBus::default();
    // Subscribed before the first run starts, so every run is counted.
    let run_metrics = lemon_api::metrics::RunMetrics::spawn(
        bus.subscribe_all(),
        Some(budget.clone() as Arc<dyn lemon_core::budget::BudgetGuard>),
        token.clone(),
        &tracker,
    );
    // Clones share one table: a reload swaps the engines for every holder.
    let engine_table = build_engines(&engine_sections)?;
    let text = config_text.as_deref().unwrap_or("");
    reload::check_engine_refs_merged(
        &gateway_config,
        &engine_table,
        &opts.paths.config,
        text,
        shared_config.as_ref(),
    )?;
    for warning in
        section_warnings(&gateway_config, &engine_sections, &engine_table, &opts.paths.config, text)
    {
        tracing::warn!("{warning}");
    }
    let deps = GatewayDeps {
        config: RuntimeConfig {
            budget: Some(budget.clone()),
            ..runtime_config(&gateway_config, &engine_sections, opts.user_home.clone(), &fence)
        },
        engines: engine_table.clone(),
        store: store.clone(),
        bus: bus.clone(),
    };
    let gateway =
        GatewayHandle::start_clustered(deps, cluster_node.clone(), token.clone(), &tracker);
    // The router recovers its journal (requests a crash left behind) before it
    // takes the first new request, so recovered ones keep their place.
    let chosen_default = default_engine(&gateway_config, &engine_sections, &secrets)?;
    tracing::info!("default engine: {} ({})", chosen_default.engine, chosen_default.reason);
    let router_config = router_config(&gateway_config, &chosen_default);
    let router = RouterHandle::start(router_config, gateway.clone(), token.clone(), &tracker);
    if let Some(node) = &cluster_node {
        // Followers here of runs on other nodes get their events; cancels and
        // steers from other nodes reach this node's runs.
        lemon_core::cluster::node::relay::spawn_relay(
            node.clone(),
            bus.clone(),
            &tracker,
            token.clone(),
        );
        let handler: Arc<dyn lemon_core::cluster::node::remote::ControlHandler> =
            Arc::new(router.clone());
        node.serve_controls(handler, &tracker, token.clone());
    }
    // Scheduled prompts fire through the router; a native run manages them
    // with the `cron` tool. In a cluster one node at a time fires them: the
    // one holding the `cron` lease.
    let cron_leader = cluster_node.as_ref().map(|node| {
        let (lead, leader) = tokio::sync::watch::channel(false);
        let lead = Arc::new(lead);
        node.own_channel(cluster::CRON_LEASE, &tracker, token.clone(), move |held| {
            let lead = lead.clone();
            Box::pin(async move {
                lead.send_replace(true);
                held.cancelled().await;
                lead.send_replace(false);
            })
        });
        leader
    });
    let cron = CronHandle::start_led(
        CronDeps { router: router.clone(), store: store.clone(), clock: Arc::new(SystemClock) },
        cron_jobs(&gateway_config),
        cron_leader,
        token.clone(),
        &tracker,
    );
    tools.register(Arc::new(CronTool::new(cron.clone())));
    let upkeep = lemon_core::store::upkeep::Upkeep::default();
    let database_file = match &location {
        StoreLocation::File(path) => Some(path.to_path_buf()),
        StoreLocation::Postgres(_) => None,
    };
    if let Some(plan) =
        gateway_config.backup.as_ref().and_then(|b| backups::Plan::from_config(b, &opts.paths.home))
    {
        match &database_file {
            Some(file) => {
                tracker.spawn(backups::run(file.clone(), plan, upkeep.clone(), token.clone()));
            }
            None => tracing::warn!(
                "[gateway.backup] copies the SQLite file; a PostgreSQL store is backed up with the database's own tools (pg_dump, base backups)"
            ),
        }
    }
    let (retention_config, retention_watch) =
        tokio::sync::watch::channel(gateway_config.retention.clone());
    tracker.spawn(retention::run(
        retention::Retention {
            store: store.clone(),
            database: database_file.clone(),
            upkeep: upkeep.clone(),
            media: Some(fence.media.clone()),
        },
        retention_watch,
        token.clone(),
    ));
    let statuses = registry.statuses().clone();

    let api_listener = bind(&gateway_config.api.addr(DEFAULT_API_PORT), "control API").await?;
    let health_listener =
        bind(&gateway_config.health.addr(DEFAULT_HEALTH_PORT), "health endpoint").await?;
    let api_addr = api_listener.local_addr()?;
    let health_addr = health_listener.local_addr()?;
    let version: Arc<str> = env!("CARGO_PKG_VERSION").into();
    // The components' own routes, behind the API's token, and their
    // descriptions in the API's OpenAPI document.
    let extra_routes = sms.as_ref().map_or_else(axum::Router::new, lemon_sms::Sms::api_routes);
    let mut document = lemon_api::openapi::document();
    if sms.is_some() {
        document = lemon_api::openapi::merge(document, lemon_sms::Sms::api_doc());
    }
    // What the transports and engines start with: a change from here on
    // (through the API, which serves from below) reloads what uses it.
    let secret_values = {
        let (config, path) = (gateway_config.clone(), opts.paths.config.clone());
        let (text, secrets) = (config_text.clone().unwrap_or_default(), secrets.clone());
        tokio::task::spawn_blocking(move || reload::secret_values(&config, &path, &text, &secrets))
            .await
            .unwrap_or_default()
    };
    let secret_uses =
        lemon_api::secrets::SecretUses::new(secret_uses(&gateway_config, &engine_sections));
    for secret in secret_uses.get().iter().filter(|s| s.inline) {
        tracing::warn!(
            key = %secret.name,
            "a secret is written into config.toml; save it with `lemon-gateway secrets set NAME` and name it with the `_secret` key instead"
        );
    }
    let secrets_changed = Arc::new(tokio::sync::Notify::new());
    let secrets_routes = lemon_api::secrets::routes(lemon_api::secrets::SecretsApi {
        store: secrets.clone(),
        uses: secret_uses.clone(),
        changed: secrets_changed.clone(),
    });
    // The routes of the components that have their own: merged behind the
    // API's token.
    let mut extra = axum::Router::new();
    if lemon_voice::VoiceConfig::from_gateway(gateway_config.voice.as_ref())
        .ok()
        .flatten()
        .is_some()
    {
        extra = extra.merge(lemon_voice::api_routes(lemon_voice::CallRecords::new(store.clone())));
        document = lemon_api::openapi::merge(document, lemon_voice::api_doc());
    }
    // One token for the API, its OpenAI routes and the detailed health
    // report; the reload path replaces it when the secret changes.
    let shared_token = lemon_api::api::ApiToken::new(api_token.expose());
    let default_choice = lemon_api::api::DefaultChoice::new(
        &chosen_default.engine.to_string(),
        &chosen_default.reason,
    );
    let api = lemon_api::api::router_documented(
        lemon_api::api::ApiState {
            router: router.clone(),
            runs: router.query(),
            token: shared_token.clone(),
            launch_token: opts.launch_token.as_ref().map(|token| token.expose().into()),
            default_engine: default_choice.clone(),
            version: version.clone(),
            started_at: started,
            shutdown: token.clone(),
            transports: statuses.clone(),
            config: config_status.clone(),
            secret_sources: secret_sources(&gateway_config, &engine_sections, &secrets).into(),
            cron: cron.clone(),
            budget: budget.clone(),
            config_file: Some(Arc::new(config_file::ConfigFile {
                path: opts.paths.config.clone(),
                secrets: secrets.clone(),
                env: opts.env.clone(),
            })),
            sandbox: sandbox.to_json(),
            approvals: approval_hub.clone(),
            database: Some(location.clone()),
            upkeep: upkeep.clone(),
            files: lemon_api::files::FileIntake::new(
                fence.media.clone(),
                gateway_config.files.clone(),
            ),
            mcp: Some(Arc::new(mcp.clone())),
            cluster: cluster_node.clone(),
            cluster_config: shared_checks.as_ref().map(|(requests, _)| {
                lemon_api::cluster::ClusterConfig {
                    applied: applied_config.clone(),
                    check: Some(Arc::new(cluster::SharedChecker { requests: requests.clone() })),
                }
            }),
        },
        extra_routes.merge(secrets_routes).merge(extra),
        document,
    )
    // The MCP endpoint: the gateway's tools for run tokens and the API token,
    // the control tools for the API token.
    .merge(lemon_api::mcp::router(
        lemon_api::mcp::McpEndpoint {
            gate: gate.clone(),
            token: shared_token
                .with_launch(opts.launch_token.as_ref().map(|token| token.expose().into())),
            router: router.clone(),
            tools: tools.clone(),
            workspace: Some(fence.workspace.clone()),
            tracker: tracker.clone(),
        },
        &token,
    ));
    gate.set_url(format!("http://{}/mcp", loopback_of(api_addr)));
    let mut health_state = lemon_api::health::HealthState::new(router.query(), version, started)
        .with_transports(statuses.clone())
        .with_detail_token(shared_token.clone())
        .with_config(config_status.clone())
        .with_database(location.clone(), upkeep.clone())
        .with_run_metrics(run_metrics)
        .with_mcp(Arc::new(mcp.clone()));
    if let Some(node) = &cluster_node {
        health_state = health_state.with_cluster(node.clone());
    }
    let health = lemon_api::health::health_router(health_state);
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
        approvals: approval_hub.clone(),
        media: fence.media.clone(),
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
        last_text: config_text.clone(),
        empty_since: None,
        status: config_status.clone(),
        bus,
        gateway: gateway.clone(),
        engines: engine_table,
        router: router.clone(),
        cron,
        transports: running_transports,
        secrets: secrets.clone(),
        build_engines,
        user_home: opts.user_home.clone(),
        lemon_home: opts.paths.home.clone(),
        shutdown_grace_ms: shutdown_grace_ms.clone(),
        default_engine: chosen_default,
        default_choice,
        budget,
        approval_rules,
        secret_uses,
        secrets_changed,
        secret_values,
        api_token: shared_token,
        env: opts.env.clone(),
        retention: retention_config,
        mcp: mcp.clone(),
        cluster: cluster_node.clone(),
        applied_text: config_text,
        shared: shared_config,
        refused_row,
        applied: applied_config,
    };
    let feed = shared_rows
        .zip(shared_checks)
        .map(|(rows, (_, checks))| reload::SharedFeed { rows, checks });
    tracker.spawn(reload::watch(reloader, feed, token.clone()));
    let stop_requested = token.child_token();
    if let Some(node) = &cluster_node {
        // Fail-stop: a fenced node writes nothing more and its engines are
        // stopped; the process goes, for its supervisor to start a new member.
        let (fenced, stop, id) = (node.fenced(), stop_requested.clone(), node.id().clone());
        tracker.spawn(async move {
            tokio::select! {
                () = fenced.cancelled() => {
                    tracing::error!(
                        node = %id,
                        exit_code = cluster::FENCED_EXIT_CODE,
                        "this cluster node is fenced: it could not renew its leases in time, so other nodes take its sessions and channels over; the gateway stops and exits for its supervisor to start it again"
                    );
                    stop.cancel();
                }
                () = stop.cancelled() => {}
            }
        });
    }
    // The front end says it is ready (the headless binary's ready line); this is the time it took.
    tracing::debug!(%api_addr, %health_addr, elapsed_ms = started.elapsed().as_millis() as u64, "gateway ready");
    let running_file = opts.paths.running();
    write_running_file(&running_file, api_addr, health_addr);
    Ok(Running {
        api_addr,
        health_addr,
        running_file,
        generated_token: generated.then_some(api_token),
        channels: channel_lines(&statuses.snapshot()),
        gateway,
        router,
        shutdown_grace_ms,
        config: config_status,
        tools,
        mcp,
        store,
        token,
        tracker,
        cluster: cluster_node,
        stop_requested,
    })
}

/// The MCP client of `[[gateway.mcp_servers]]`: secrets from the gateway's
/// store, stdio servers started in `$LEMON_HOME` with the safe environment.
fn mcp_clients(
    gateway: &GatewayConfig,
    opts: &ServeOptions,
    secrets: &Arc<SecretStore>,
    tracker: &TaskTracker,
    token: &CancellationToken,
) -> lemon_engines::mcp::McpClients {
    let store = secrets.clone();
    let lookup: lemon_engines::mcp::SecretLookup =
        Arc::new(move |name: &str| store.get(name).map_err(|error| error.to_string()));
    lemon_engines::mcp::McpClients::new(
        gateway.mcp_servers.clone(),
        lemon_engines::mcp::McpOptions {
            base_env: opts.env.clone(),
            home: opts.paths.home.clone(),
            secrets: lookup,
            tracker: tracker.clone(),
            shutdown: token.clone(),
        },
    )
}

/// Checks the config file at `file` as a start would: core's keys with the
/// environment's overrides of `env` applied over them, the engines'
/// sections, every transport's section and the secrets they name (from
/// `env`, then the secrets file of `paths`). The warnings (unknown keys,
/// notes on the reference gateway's keys, variables that replace a value of
/// the file) when it would load.
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
    let secrets = Arc::new(open_secrets(paths, env));
    check_config_text(&text, file, &secrets, env)
}

/// [`check_config`] on a text that would be the file at `file`, with the
/// gateway's `secrets`.
fn check_config_text(
    text: &str,
    file: &std::path::Path,
    secrets: &Arc<SecretStore>,
    env: &BTreeMap<String, String>,
) -> Result<Vec<String>, config::ConfigError> {
    let loaded = config::load_str_with_env(text, file, env)?;
    let gateway = &loaded.config.gateway;
    let sections = EngineSections::parse(&gateway.engines, file, text)?;
    webhook_transport(gateway, secrets, file, text)?;
    telegram_transport(gateway, secrets, file, text)?;
    sms_section(gateway, secrets, file, text)?;
    discord_transport(gateway, secrets, file, text)?;
    let home = file.parent().unwrap_or_else(|| std::path::Path::new("."));
    email_transport(gateway, secrets, file, text)?;
    xmtp_section(gateway, secrets, file, text)?;
    voice_transport(gateway, secrets, file, text, home, None)?;
    // The engine table as a start would build it, to check the names against.
    let ctx = CliContext { base_env: env.clone(), ..CliContext::default() };
    let registry = lemon_engines::build_registry(&sections, &ctx).map_err(|e| {
        config::ConfigError::Invalid {
            path: file.to_owned(),
            at: None,
            key: "gateway.engines".to_owned(),
            message: e.to_string(),
        }
    })?;
    check_engine_refs(gateway, &registry, file, text)?;
    let mut warnings = loaded.warnings;
    warnings.extend(section_warnings(gateway, &sections, &registry, file, text));
    Ok(warnings)
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
    sms: Option<&lemon_sms::Sms>,
    helpers: &HelperDeps<'_>,
) -> anyhow::Result<TransportRegistry> {
    let lemon_home = helpers.lemon_home;
    use lemon_transports::{telegram, webhook};
    let mut registry = TransportRegistry::default();
    // In cluster mode a single-consumer channel runs under its channel lease.
    let leased = |transport| cluster::leased(config, transport, helpers.cluster);
    match webhook_transport(config, secrets, config_path, text)? {
        Some(transport) => registry.add(leased(transport))?,
        None => registry.add_disabled(webhook::WEBHOOK_TRANSPORT_ID)?,
    }
    match telegram_transport(config, secrets, config_path, text)? {
        Some(transport) => registry.add(leased(transport))?,
        None => registry.add_disabled(telegram::inbound::TRANSPORT_ID)?,
    }
    match discord_transport(config, secrets, config_path, text)? {
        Some(transport) => registry.add(leased(transport))?,
        None => registry.add_disabled(lemon_transports::discord::inbound::TRANSPORT_ID)?,
    }
    match sms {
        Some(sms) => registry.add(sms.transport())?,
        None => registry.add_disabled(lemon_sms::reply::SMS_TRANSPORT_ID)?,
    }
    match email_transport(config, secrets, config_path, text)? {
        Some(transport) => registry.add(leased(transport))?,
        None => registry.add_disabled(lemon_transports::email::TRANSPORT_ID)?,
    }
    match voice_transport(config, secrets, config_path, text, lemon_home, helpers.user_home)? {
        Some(transport) => registry.add(leased(transport))?,
        None => registry.add_disabled(lemon_voice::TRANSPORT_ID)?,
    }
    match xmtp_section(config, secrets, config_path, text)? {
        Some(xmtp_config) => {
            let config_dir = config_path.parent().unwrap_or_else(|| Path::new("."));
            let script = xmtp_config.script(config_dir);
            let bound_conversations = config
                .bindings
                .iter()
                .filter(|binding| binding.transport == lemon_transports::xmtp::TRANSPORT_ID)
                .filter_map(lemon_core::config::BindingConfig::chat_id_text)
                .collect();
            let launcher = Arc::new(bridge::HelperLauncher {
                groups: helpers.groups.clone(),
                tracker: helpers.tracker.clone(),
            });
            registry.add(leased(Arc::new(lemon_transports::xmtp::service::XmtpTransport::new(
                lemon_transports::xmtp::service::XmtpDeps {
                    config: xmtp_config,
                    secrets: secrets.clone(),
                    launcher,
                    script,
                    state_dir: lemon_home.join("xmtp"),
                    base_env: helpers.env.clone(),
                    bound_conversations,
                },
            ))))?;
        }
        None => registry.add_disabled(lemon_transports::xmtp::TRANSPORT_ID)?,
    }
    Ok(registry)
}

/// What transports need from the start beyond their config: where state
/// goes, and for one that runs a helper process, the store, tracker and
/// environment.
struct HelperDeps<'a> {
    /// `$LEMON_HOME`: voice recordings and the bridge's state go under it.
    lemon_home: &'a Path,
    /// The user's home, for a `~` in `recordings_dir`.
    user_home: Option<&'a Path>,
    groups: &'a ProcessGroups,
    tracker: &'a TaskTracker,
    env: &'a BTreeMap<String, String>,
    /// This node, in cluster mode: single-consumer channels run under their
    /// channel lease.
    cluster: Option<&'a Arc<lemon_core::cluster::ClusterNode>>,
}

/// `[gateway.xmtp]` when XMTP is on (`None`: switched off; the section is
/// checked either way), with its wallet key present.
///
/// # Errors
/// `[gateway.xmtp]` is invalid or its wallet key's secret is not set.
fn xmtp_section(
    config: &GatewayConfig,
    secrets: &SecretStore,
    config_path: &std::path::Path,
    text: &str,
) -> Result<Option<lemon_transports::xmtp::config::XmtpConfig>, config::ConfigError> {
    use lemon_transports::xmtp::config::XmtpConfig;
    let section = config.xmtp.as_ref();
    let located =
        |message: &str| config::section_error(config_path, text, &["gateway", "xmtp"], message);
    if !lemon_core::transport::enabled(config.enable_xmtp, section) {
        if let Some(section) = section {
            XmtpConfig::parse_values(section).map_err(|e| located(&e.0))?;
        }
        return Ok(None);
    }
    let section = section.cloned().unwrap_or_default();
    let xmtp = XmtpConfig::parse(&section).map_err(|e| located(&e.0))?;
    xmtp.resolve_secrets(secrets).map_err(|e| located(&e.0))?;
    Ok(Some(xmtp))
}

/// `[gateway.sms]` and the Twilio secrets it names when SMS is enabled
/// (`None`: switched off; the section is checked either way).
///
/// # Errors
/// `[gateway.sms]` is invalid, or would leave the webhook unchecked
/// (`validate_webhook` without an auth token or `public_url`).
fn sms_section(
    config: &GatewayConfig,
    secrets: &SecretStore,
    config_path: &std::path::Path,
    text: &str,
) -> Result<Option<(lemon_sms::SmsConfig, lemon_sms::SmsSecrets)>, config::ConfigError> {
    let located =
        |message: &str| config::section_error(config_path, text, &["gateway", "sms"], message);
    let Some(sms) =
        lemon_sms::SmsConfig::from_gateway(config.sms.as_ref()).map_err(|e| located(&e.0))?
    else {
        return Ok(None);
    };
    let sms_secrets = sms.resolve(secrets).map_err(|e| located(&e.0))?;
    Ok(Some((sms, sms_secrets)))
}

/// The voice transport `config` asks for (`None`: switched off); recordings
/// go where `recordings_dir` (or `VOICE_RECORDINGS_DIR`) says, else under
/// `<lemon_home>/recordings`.
///
/// # Errors
/// `[gateway.voice]` is invalid or names a secret that is not set.
fn voice_transport(
    config: &GatewayConfig,
    secrets: &Arc<SecretStore>,
    config_path: &std::path::Path,
    text: &str,
    lemon_home: &std::path::Path,
    user_home: Option<&std::path::Path>,
) -> Result<Option<Arc<dyn lemon_core::transport::Transport>>, config::ConfigError> {
    let located =
        |message: &str| config::section_error(config_path, text, &["gateway", "voice"], message);
    let Some(voice) =
        lemon_voice::VoiceConfig::from_gateway(config.voice.as_ref()).map_err(|e| located(&e.0))?
    else {
        return Ok(None);
    };
    let voice_secrets = voice.resolve_secrets(secrets).map_err(|e| located(&e.0))?;
    let recordings = voice.recordings(lemon_home, user_home);
    let bound_engine = config.bindings.iter().any(|binding| {
        binding.transport == lemon_voice::TRANSPORT_ID && binding.default_engine.is_some()
    });
    Ok(Some(Arc::new(lemon_voice::VoiceTransport::new(lemon_voice::VoiceDeps {
        config: voice,
        secrets: voice_secrets,
        recordings,
        bound_engine,
    }))))
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
    let located =
        |message: &str| config::section_error(config_path, text, &["gateway", "telegram"], message);
    if !lemon_core::transport::enabled(config.enable_telegram, telegram_section) {
        // Switched off, its types and values are still checked.
        if let Some(section) = telegram_section {
            telegram::config::TelegramConfig::parse_values(section).map_err(|e| located(&e.0))?;
        }
        return Ok(None);
    }
    let section = telegram_section.cloned().unwrap_or_default();
    let telegram_config =
        telegram::config::TelegramConfig::parse(&section).map_err(|e| located(&e.0))?;
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

/// The Discord transport `config` asks for (`None`: switched off).
///
/// # Errors
/// `[gateway.discord]` is invalid.
fn discord_transport(
    config: &GatewayConfig,
    secrets: &Arc<SecretStore>,
    config_path: &std::path::Path,
    text: &str,
) -> Result<Option<Arc<dyn lemon_core::transport::Transport>>, config::ConfigError> {
    use lemon_transports::discord;
    let section = config.discord.as_ref();
    let located =
        |message: &str| config::section_error(config_path, text, &["gateway", "discord"], message);
    if !lemon_core::transport::enabled(config.enable_discord, section) {
        // Switched off, its types and values are still checked.
        if let Some(section) = section {
            discord::config::DiscordConfig::parse_values(section).map_err(|e| located(&e.0))?;
        }
        return Ok(None);
    }
    let section = section.cloned().unwrap_or_default();
    let discord_config =
        discord::config::DiscordConfig::parse(&section).map_err(|e| located(&e.0))?;
    let bound_channels = config
        .bindings
        .iter()
        .filter(|binding| binding.transport == discord::inbound::TRANSPORT_ID)
        .filter_map(lemon_core::config::BindingConfig::chat_id_text)
        .collect();
    Ok(Some(Arc::new(discord::bot::DiscordTransport::new(
        discord_config,
        secrets.clone(),
        bound_channels,
    ))))
}

/// The email transport `config` asks for (`None`: switched off); its
/// attachments are staged like every channel's files and placed in the run's
/// uploads directory when it starts.
///
/// # Errors
/// `[gateway.email]` is invalid or names a secret that is not set.
fn email_transport(
    config: &GatewayConfig,
    secrets: &Arc<SecretStore>,
    config_path: &std::path::Path,
    text: &str,
) -> Result<Option<Arc<dyn lemon_core::transport::Transport>>, config::ConfigError> {
    use lemon_transports::email;
    let section = config.email.as_ref();
    let located =
        |message: &str| config::section_error(config_path, text, &["gateway", "email"], message);
    if !lemon_core::transport::enabled(None, section) {
        // Switched off, its types and values are still checked.
        if let Some(section) = section {
            email::config::EmailConfig::parse_values(section).map_err(|e| located(&e.0))?;
        }
        return Ok(None);
    }
    let section = section.cloned().unwrap_or_default();
    let email_config = email::config::EmailConfig::parse(&section).map_err(|e| located(&e.0))?;
    email_config.resolve_secrets(secrets).map_err(|e| located(&e.0))?;
    Ok(Some(Arc::new(email::service::EmailTransport::new(email_config, secrets.clone()))))
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

    /// Cancelled when the gateway must stop without being asked: its cluster
    /// node was fenced ([`Running::fenced`]). A front end shuts it down then
    /// as it does on a signal.
    pub fn stop_requested(&self) -> CancellationToken {
        self.stop_requested.clone()
    }

    /// Whether this gateway is a cluster node that was fenced: after
    /// [`Running::shutdown`] the process should exit with
    /// [`cluster::FENCED_EXIT_CODE`].
    pub fn fenced(&self) -> bool {
        self.cluster.as_ref().is_some_and(|node| node.is_fenced())
    }

    /// This node, in cluster mode.
    pub fn cluster(&self) -> Option<&Arc<lemon_core::cluster::ClusterNode>> {
        self.cluster.as_ref()
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
        if let Some(node) = self.cluster() {
            // The runs have ended; once what they wrote is durable, their
            // sessions may move on now rather than a lease term later.
            match self.store.flush().await {
                Ok(()) => {
                    let released = node.release_all_sessions().await;
                    tracing::info!(released, "sessions given up to the other nodes");
                }
                Err(error) => {
                    tracing::warn!(%error, "sessions kept until their leases lapse: the store is not writable");
                }
            }
        }
        self.token.cancel();
        // Every MCP server's process group is killed before the wait below.
        self.mcp.shutdown().await;
        self.tracker.close();
        if tokio::time::timeout(Duration::from_secs(10), self.tracker.wait()).await.is_err() {
            tracing::warn!("some tasks did not stop within 10 s");
        }
        self.store.close().await.context("could not flush the store")?;
        if let Err(error) = std::fs::remove_file(&self.running_file) {
            tracing::debug!(%error, "the running gateway's file was already gone");
        }
        tracing::info!("stopped");
        Ok(())
    }
}

/// Writes where this gateway listens to `path` (0600, replaced whole), for
/// clients that cannot read it from a config file the gateway refused.
fn write_running_file(path: &Path, api: SocketAddr, health: SocketAddr) {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let body = serde_json::json!({
        "pid": std::process::id(),
        "api": format!("http://{api}"),
        "health": format!("http://{health}"),
    });
    let partial = path.with_extension("json.partial");
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&partial)
        .and_then(|mut file| file.write_all(body.to_string().as_bytes()))
        .and_then(|()| std::fs::rename(&partial, path));
    if let Err(error) = written {
        tracing::warn!(path = %path.display(), %error, "could not write where the gateway listens; clients read config.toml");
    }
}
