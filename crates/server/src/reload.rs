//! Live edits of `config.toml`.
//!
//! The file's directory is watched (editors save by writing a new file and
//! renaming it over the old one), events are debounced, and the file is read
//! again. Its text is compared with the last text seen, so an edit that keeps
//! the size and the modification time is still seen and a touch that changes
//! nothing applies nothing. A new text is parsed and validated whole (core's
//! keys, every transport's section, the engines) before anything is applied:
//! a refused edit changes nothing, is logged and published (`config_rejected`)
//! with its file, line and column, and the gateway reports `degraded` until the
//! file is good again. An accepted one is a new generation: each component
//! takes its part ([`plan`] says which), runs already started keep the
//! generation they started with, and `config_reloaded` lists what was applied
//! and what waits for a restart (listen addresses, ports, HTTP limits).
//! A deleted file keeps the running config, with a warning. A file that
//! turns empty is taken only once it has stayed empty for [`EMPTY_SETTLE`]:
//! an editor saving in place truncates the file before it writes the new
//! text, and a reader in between must not apply the defaults for a moment.
//!
//! On a cluster node the cluster config (one versioned row of the database,
//! [`SharedSettings`]) is put over the file: a new version of the row and an
//! edit of the file both give a merged config that is checked and applied
//! the same way. A version this node refuses (it names an engine this node
//! lacks, say) is logged and published (`config_rejected`), the node keeps
//! the config in force, and it tries that version again after its next good
//! file edit. A changed `max_concurrent_runs` also sets the cluster's slot
//! count. Bodies sent to `PUT /v1/cluster/config` are checked here too
//! ([`CheckRequest`]), over the config in force, without applying them.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use lemon_core::budget::store_guard::StoreBudgetGuard;
use lemon_core::bus::{EventBus, Notice};
use lemon_core::cluster::SharedConfig;
use lemon_core::config::{
    self, ConfigError, ConfigReport, ConfigStatus, GatewayConfig, PendingRestart, Rejection,
    SharedSettings, SHARED_SOURCE,
};
use lemon_core::gateway::GatewayHandle;
use lemon_core::router::RouterHandle;
use lemon_core::transport::RunningTransports;
use lemon_engines::config::EngineSections;
use lemon_transports::{discord, telegram, webhook};
use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot, watch as watch_channel};
use tokio_util::sync::CancellationToken;

use self::dir_watch::DirWatch;

mod dir_watch;

/// How long the watcher waits for a burst of file events to end.
const DEBOUNCE: Duration = Duration::from_millis(150);

/// How often the file is read when its directory cannot be watched.
const FALLBACK_POLL: Duration = Duration::from_secs(1);

/// How long a file that turned empty must stay empty to count as an edit.
pub(crate) const EMPTY_SETTLE: Duration = Duration::from_secs(1);

/// What to do with a text just read.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Settle {
    /// Check and apply it.
    Take,
    /// The file just turned empty: read it again after this long.
    Wait(Duration),
}

/// Whether `text` is taken now. `empty_since` is when the file was first seen
/// empty after having content; it is set and cleared here.
pub(crate) fn settle(
    text: &str,
    last_text: Option<&str>,
    empty_since: &mut Option<Instant>,
    now: Instant,
) -> Settle {
    let had_content = last_text.is_some_and(|last| !last.trim().is_empty());
    if !text.trim().is_empty() || !had_content {
        *empty_since = None;
        return Settle::Take;
    }
    let since = *empty_since.get_or_insert(now);
    let waited = now.saturating_duration_since(since);
    if waited >= EMPTY_SETTLE {
        *empty_since = None;
        Settle::Take
    } else {
        Settle::Wait(EMPTY_SETTLE - waited)
    }
}

/// Keys of `[gateway]` that the running gateway takes live.
const LIVE_KEYS: &[&str] = &[
    "max_concurrent_runs",
    "default_engine",
    "default_cwd",
    "auto_resume",
    "require_engine_lock",
    "engine_lock_timeout_ms",
    "run_inactivity_timeout_ms",
    "run_idle_watchdog_ms",
    "shutdown_grace_ms",
    "recovered_max_age_ms",
    "allowed_cwd_roots",
    "max_pending_runs",
    "workspace_dir",
    "auto_send_generated_images",
    "native_only",
    "engines",
    "projects",
    "bindings",
    "budgets",
    "approvals",
    "queue",
    "cron",
    "enable_webhook",
    "webhook",
    "enable_telegram",
    "telegram",
    "enable_discord",
    "discord",
    "email",
    "retention",
    "mcp_servers",
];

/// Keys of `[gateway]` whose edits wait for a restart.
const RESTART_KEYS: &[&str] = &[
    "api",
    "backup",
    "sms",
    "health",
    "http_header_read_timeout_ms",
    "http_idle_timeout_ms",
    "http_max_connections",
    "http_client_limits",
    "worker_threads",
    "voice",
    "enable_xmtp",
    "xmtp",
    "sandbox",
    "dashboard",
    "files",
    "store",
    "cluster",
];

/// What an accepted edit changes, component by component.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Plan {
    /// `[gateway]` keys applied live, in file order of [`LIVE_KEYS`].
    pub(crate) applied: Vec<String>,
    /// The scheduler's settings (slots, timeouts, lock, working directories).
    pub(crate) runtime: bool,
    /// The router's settings (default engine, bindings, projects, queue, watchdog).
    pub(crate) router: bool,
    /// The engine table is rebuilt.
    pub(crate) engines: bool,
    pub(crate) webhook: bool,
    pub(crate) telegram: bool,
    pub(crate) discord: bool,
    pub(crate) email: bool,
    pub(crate) shutdown_grace: bool,
    /// `[[gateway.cron]]` is put in step with the stored jobs.
    pub(crate) cron: bool,
    /// The budget guard gets the new limits and prices.
    pub(crate) budgets: bool,
    /// The approval rules in force are replaced.
    pub(crate) approvals: bool,
    /// The retention task gets the new `[gateway.retention]` and runs a pass.
    pub(crate) retention: bool,
    /// `[[gateway.mcp_servers]]`: changed and removed servers are stopped,
    /// new ones start with the next native run.
    pub(crate) mcp: bool,
}

impl Plan {
    pub(crate) fn is_empty(&self) -> bool {
        self.applied.is_empty()
    }
}

/// The JSON form of `[gateway]` with every default filled in, secrets left in.
fn raw_json(config: &GatewayConfig) -> serde_json::Map<String, Value> {
    match serde_json::to_value(config) {
        Ok(Value::Object(map)) => map,
        _ => serde_json::Map::new(),
    }
}

/// What changes from `current` to `next`, by the key paths of `[gateway]`.
pub(crate) fn plan(current: &GatewayConfig, next: &GatewayConfig) -> Plan {
    let (before, after) = (raw_json(current), raw_json(next));
    let changed = |key: &str| before.get(key) != after.get(key);
    let mut plan = Plan::default();
    for key in LIVE_KEYS.iter().copied().filter(|key| changed(key)) {
        plan.applied.push(key.to_owned());
        match key {
            "shutdown_grace_ms" => plan.shutdown_grace = true,
            "engines" => {
                plan.engines = true;
                // The stop bound follows the engines' cancel grace.
                plan.runtime = true;
            }
            "enable_webhook" | "webhook" => plan.webhook = true,
            "cron" => plan.cron = true,
            "enable_telegram" | "telegram" => plan.telegram = true,
            "enable_discord" | "discord" => plan.discord = true,
            "email" => plan.email = true,
            "default_engine"
            | "native_only"
            | "queue"
            | "run_idle_watchdog_ms"
            | "recovered_max_age_ms" => plan.router = true,
            "projects" => {
                plan.router = true;
                // Projects have approval rules of their own.
                plan.approvals = true;
            }
            "bindings" => {
                plan.router = true;
                plan.approvals = true;
                // Bound chats are let through Telegram's allow list.
                plan.telegram = true;
                // And Discord's `deny_unbound`.
                plan.discord = true;
            }
            "approvals" => plan.approvals = true,
            "retention" => plan.retention = true,
            "mcp_servers" => plan.mcp = true,
            "budgets" => {
                plan.budgets = true;
                // `/status` shows the limits the router reads.
                plan.router = true;
            }
            "allowed_cwd_roots" => {
                plan.router = true;
                plan.runtime = true;
            }
            _ => plan.runtime = true,
        }
    }
    plan
}

/// Settings edited in `file` that differ from the ones the gateway `started`
/// with and wait for a restart.
pub(crate) fn pending_restarts(
    started: &GatewayConfig,
    file: &GatewayConfig,
) -> Vec<PendingRestart> {
    let (before, after) = (raw_json(started), raw_json(file));
    let mut pending = Vec::new();
    for key in RESTART_KEYS {
        let running = before.get(*key).cloned().unwrap_or(Value::Null);
        let in_file = after.get(*key).cloned().unwrap_or(Value::Null);
        match (&running, &in_file) {
            (Value::Object(a), Value::Object(b)) => {
                let mut fields: Vec<&String> = a.keys().chain(b.keys()).collect();
                fields.sort();
                fields.dedup();
                for field in fields {
                    let (was, now) = (a.get(field), b.get(field));
                    if was != now {
                        pending.push(PendingRestart {
                            key: format!("gateway.{key}.{field}"),
                            running: was.cloned().unwrap_or(Value::Null),
                            file: now.cloned().unwrap_or(Value::Null),
                        });
                    }
                }
            }
            _ if running != in_file => pending.push(PendingRestart {
                key: format!("gateway.{key}"),
                running,
                file: in_file,
            }),
            _ => {}
        }
    }
    pending
}

/// `[gateway]` as `GET /v1/config` shows it: defaults filled in (the engine
/// sections as the engines parsed them), every value that may be a secret
/// replaced by `"[REDACTED]"` (inline tokens, passwords, engines'
/// environments). Names of secrets (`*_secret`) stay.
pub(crate) fn effective_json(config: &GatewayConfig, engines: &EngineSections) -> Value {
    let mut map = raw_json(config);
    if let Ok(engines) = serde_json::to_value(engines) {
        map.insert("engines".to_owned(), engines);
    }
    let mut value = Value::Object(map);
    redact(&mut value, false);
    value
}

fn is_secret_key(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    if key.ends_with("_secret") || key.starts_with("allow_") {
        return false;
    }
    // `wallet_key` and `private_key`: the reference's inline XMTP key.
    ["token", "password", "secret", "api_key", "apikey", "credential", "private_key", "wallet_key"]
        .iter()
        .any(|word| key.contains(word))
}

fn redact(value: &mut Value, secret: bool) {
    match value {
        Value::Object(map) => {
            for (key, child) in map.iter_mut() {
                redact(child, secret || key == "env" || is_secret_key(key));
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|item| redact(item, secret)),
        Value::Null | Value::Bool(_) => {}
        _ if secret => *value = json!("[REDACTED]"),
        _ => {}
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// Builds an engine table from the parsed engine sections (the server's `engines`).
pub(crate) type BuildEngines = Arc<
    dyn Fn(&EngineSections) -> anyhow::Result<lemon_core::engine::EngineRegistry> + Send + Sync,
>;

/// Everything a reload reaches.
pub(crate) struct Reloader {
    pub(crate) path: PathBuf,
    /// The config the gateway started with (listeners, HTTP limits).
    pub(crate) started: GatewayConfig,
    /// The config in force.
    pub(crate) current: GatewayConfig,
    /// The text last read, good or not; `None` when there was no file.
    pub(crate) last_text: Option<String>,
    /// When the file was first seen empty after having content.
    pub(crate) empty_since: Option<Instant>,
    pub(crate) status: ConfigStatus,
    pub(crate) bus: EventBus,
    pub(crate) gateway: GatewayHandle,
    /// The engine table the gateway and the router share.
    pub(crate) engines: lemon_core::engine::EngineRegistry,
    pub(crate) router: RouterHandle,
    pub(crate) cron: lemon_core::cron::CronHandle,
    pub(crate) transports: RunningTransports,
    pub(crate) secrets: Arc<lemon_core::secrets::SecretStore>,
    pub(crate) build_engines: BuildEngines,
    pub(crate) user_home: Option<PathBuf>,
    /// `$LEMON_HOME`, which a relative `workspace_dir` is under.
    pub(crate) lemon_home: PathBuf,
    pub(crate) shutdown_grace_ms: Arc<AtomicU64>,
    /// The engine chosen for an unset `default_engine`: at start, and again
    /// when the engines are rebuilt (a key set, the `lemon` section edited).
    pub(crate) default_engine: crate::DefaultEngine,
    /// The same choice as `/v1/status` reports it.
    pub(crate) default_choice: lemon_api::api::DefaultChoice,
    /// Lives as long as the gateway; an edit of `[gateway.budgets]` reconfigures it.
    pub(crate) budget: Arc<StoreBudgetGuard>,
    /// The approval rules the native engine and the vendor relay judge by;
    /// an edit of `[gateway.approvals]`, a project or a binding replaces them.
    pub(crate) approval_rules: lemon_core::approvals::Rules,
    /// The secrets the config in force uses, as `GET /v1/secrets` shows them.
    pub(crate) secret_uses: lemon_api::secrets::SecretUses,
    /// Notified when `PUT` or `DELETE /v1/secrets` changed one.
    pub(crate) secrets_changed: Arc<tokio::sync::Notify>,
    /// The values last seen of the secrets the transports and engines use.
    pub(crate) secret_values:
        std::collections::BTreeMap<String, Option<lemon_core::secrets::SecretValue>>,
    /// The API's token in force, replaced when `lemon_api_token` changes.
    pub(crate) api_token: lemon_api::api::ApiToken,
    /// The environment the gateway started with (`LEMON_API_TOKEN`).
    pub(crate) env: std::collections::BTreeMap<String, String>,
    /// `[gateway.retention]` for the retention task, which runs a pass on a change.
    pub(crate) retention: tokio::sync::watch::Sender<lemon_core::config::RetentionConfig>,
    /// The native engine's MCP servers, put in step with `[[gateway.mcp_servers]]`.
    pub(crate) mcp: lemon_engines::mcp::McpClients,
    /// This node, in cluster mode: a rebuilt single-consumer channel runs
    /// under its channel lease as at start.
    pub(crate) cluster: Option<Arc<lemon_core::cluster::ClusterNode>>,
    /// The file's text of the config in force (`last_text` may be a
    /// refused one): a new cluster config is put over this.
    pub(crate) applied_text: Option<String>,
    /// The cluster config in force over the file; `None` off a cluster.
    pub(crate) shared: Option<SharedSettings>,
    /// The last version of the cluster config this node refused, tried
    /// again after the next good edit of the file.
    pub(crate) refused_row: Option<SharedConfig>,
    /// What this node did with the cluster config, for the API.
    pub(crate) applied: lemon_api::cluster::AppliedConfig,
}

/// A cluster config body to check as this node would apply it, and where
/// the answer goes.
#[derive(Debug)]
pub(crate) struct CheckRequest {
    pub(crate) body: String,
    pub(crate) reply: oneshot::Sender<Result<(), ConfigError>>,
}

/// What reaches the reload path from the cluster: the cluster config's row
/// as last read, and bodies to check.
#[derive(Debug)]
pub(crate) struct SharedFeed {
    pub(crate) rows: watch_channel::Receiver<Option<SharedConfig>>,
    pub(crate) checks: mpsc::Receiver<CheckRequest>,
}

/// Why a text (or a merged config) was refused: a config error with its
/// place, or what a component said.
#[derive(Debug)]
enum Refusal {
    Config(ConfigError),
    Other(String),
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Config(error) => error.fmt(f),
            Refusal::Other(message) => f.write_str(message),
        }
    }
}

impl Refusal {
    fn other(error: impl std::fmt::Display) -> Self {
        Refusal::Other(error.to_string())
    }

    /// As `PUT /v1/cluster/config` answers it.
    fn into_config_error(self) -> ConfigError {
        match self {
            Refusal::Config(error) => error,
            Refusal::Other(message) => ConfigError::Invalid {
                path: SHARED_SOURCE.into(),
                at: None,
                key: String::new(),
                message,
            },
        }
    }
}

/// [`crate::check_engine_refs`] of a config merged from a file (`text` at
/// `path`) and `shared`: each engine a key names is placed in the text that
/// set the key.
///
/// # Errors
/// The first engine that is not in `table`.
pub(crate) fn check_engine_refs_merged(
    config: &GatewayConfig,
    table: &lemon_core::engine::EngineRegistry,
    path: &Path,
    text: &str,
    shared: Option<&SharedSettings>,
) -> Result<(), ConfigError> {
    match shared.filter(|shared| !shared.keys().is_empty()) {
        None => crate::check_engine_refs(config, table, path, text),
        Some(shared) => {
            crate::check_engine_refs(&shared.without(config), table, path, text)?;
            let source = Path::new(SHARED_SOURCE);
            crate::check_engine_refs(&shared.only(config), table, source, shared.body())
        }
    }
}

impl std::fmt::Debug for Reloader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reloader").field("path", &self.path).finish_non_exhaustive()
    }
}

/// A new text, checked whole, ready to apply.
struct Checked {
    config: GatewayConfig,
    sections: EngineSections,
    engines: Option<lemon_core::engine::EngineRegistry>,
    webhook: Option<Option<Arc<dyn lemon_core::transport::Transport>>>,
    telegram: Option<Option<Arc<dyn lemon_core::transport::Transport>>>,
    discord: Option<Option<Arc<dyn lemon_core::transport::Transport>>>,
    email: Option<Option<Arc<dyn lemon_core::transport::Transport>>>,
    /// The workspace and the gateway's state for the edited `workspace_dir`.
    fence: crate::paths::Fence,
    plan: Plan,
}

impl Reloader {
    /// Reads the file and applies it if its text changed. Returns when to
    /// read it again if it just turned empty.
    pub(crate) async fn check_file(&mut self) -> Option<Duration> {
        let text = match std::fs::read_to_string(&self.path) {
            Ok(text) => text,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                if !self.status.get().missing {
                    tracing::warn!(
                        path = %self.path.display(),
                        "config file deleted; keeping the running config"
                    );
                    self.status.update(|report| report.missing = true);
                }
                return None;
            }
            Err(error) => {
                let message = format!("{}: cannot read config file: {error}", self.path.display());
                self.reject(message);
                return None;
            }
        };
        if self.status.get().missing {
            self.status.update(|report| report.missing = false);
        }
        if self.last_text.as_deref() == Some(text.as_str()) {
            self.empty_since = None;
            return None;
        }
        if let Settle::Wait(delay) =
            settle(&text, self.last_text.as_deref(), &mut self.empty_since, Instant::now())
        {
            tracing::debug!(path = %self.path.display(), "config file is empty; waiting for it to settle");
            return Some(delay);
        }
        self.last_text = Some(text.clone());
        match self.checked(&text) {
            Ok(checked) => {
                self.applied_text = Some(text);
                self.apply(checked).await;
                // A version refused with the old file may fit the new one.
                if let Some(row) = self.refused_row.take() {
                    self.check_shared(row).await;
                }
            }
            Err(message) => self.reject(message),
        }
        None
    }

    /// Applies version `row` of the cluster config over the file in force,
    /// unless it is the one in force or was refused already.
    pub(crate) async fn check_shared(&mut self, row: SharedConfig) {
        let in_force = self.shared.as_ref().map_or(0, SharedSettings::version);
        let refused = self.refused_row.as_ref().is_some_and(|r| r.version == row.version);
        if row.version == in_force || refused {
            return;
        }
        let version = row.version;
        let shared = match SharedSettings::parse(version, &row.body) {
            Ok(shared) => shared,
            Err(error) => return self.refuse_shared(row, error.to_string()),
        };
        let text = self.applied_text.clone().unwrap_or_default();
        match self.checked_with(&text, Some(&shared), None) {
            Ok(checked) => {
                let keys = shared.keys().join(", ");
                self.shared = Some(shared);
                self.refused_row = None;
                self.apply(checked).await;
                self.applied.applied(version);
                tracing::info!(version, keys = %keys, "cluster config applied");
            }
            Err(refusal) => self.refuse_shared(row, refusal.to_string()),
        }
    }

    /// A version of the cluster config this node cannot apply: said, and
    /// the config in force kept.
    fn refuse_shared(&mut self, row: SharedConfig, error: String) {
        tracing::error!(
            version = row.version,
            %error,
            "cluster config refused on this node; keeping the config in force"
        );
        self.applied.refused(row.version, error.clone());
        let mut body = serde_json::Map::new();
        body.insert("error".to_owned(), json!(error));
        body.insert("path".to_owned(), json!(SHARED_SOURCE));
        body.insert("version".to_owned(), json!(row.version));
        self.bus.publish_notice(Notice { type_name: "config_rejected", ts_ms: now_ms(), body });
        self.refused_row = Some(row);
    }

    /// Checks `body` as this node would apply it as the cluster config, over
    /// the file in force; applies nothing.
    fn check_candidate(&self, body: &str) -> Result<(), ConfigError> {
        let shared = SharedSettings::parse(0, body)?;
        let text = self.applied_text.clone().unwrap_or_default();
        self.checked_with(&text, Some(&shared), None)
            .map(|_| ())
            .map_err(Refusal::into_config_error)
    }

    /// Reads again the secrets the transports and engines use; a component
    /// whose secret changed (set, replaced or deleted in the keychain, the
    /// environment of a restart aside, or the secrets file) is rebuilt with it
    /// as if its section had been edited.
    pub(crate) async fn check_secrets(&mut self) {
        self.check_api_token().await;
        // Without a config file the defaults are in force: their secrets count too.
        let text = self.last_text.clone().unwrap_or_default();
        if self.status.get().rejected.is_some() {
            return;
        }
        let users = secret_users(&self.current, &self.path, &text);
        let (config, path, secrets) =
            (self.current.clone(), self.path.clone(), self.secrets.clone());
        let read =
            tokio::task::spawn_blocking(move || secret_values(&config, &path, &text, &secrets))
                .await;
        let Ok(values) = read else { return };
        let mut forced = Plan::default();
        for (name, value) in &values {
            // A name first seen (a config edit named it) is only recorded:
            // the edit itself rebuilt what uses it.
            if self.secret_values.get(name).is_none_or(|old| old == value) {
                continue;
            }
            for user in users.get(name).into_iter().flatten() {
                match *user {
                    "telegram" => forced.telegram = true,
                    "webhook" => forced.webhook = true,
                    _ => forced.engines = true,
                }
                if !forced.applied.iter().any(|a| a == user) {
                    forced.applied.push((*user).to_owned());
                }
            }
            tracing::info!(secret = %name, "secret changed; reloading what uses it");
        }
        self.secret_values = values;
        if forced.is_empty() {
            return;
        }
        let text = self.last_text.clone().unwrap_or_default();
        match self.checked_with(&text, self.shared.as_ref(), Some(forced)) {
            Ok(checked) => self.apply(checked).await,
            Err(refusal) => self.reject(refusal.to_string()),
        }
    }

    /// Reads the API token again and puts a changed one in force: requests
    /// from now on need it, streams opened with the old one go on. A token
    /// that is refused (blank, too short) or unset leaves the running one.
    async fn check_api_token(&mut self) {
        let (env, secrets) = (self.env.clone(), self.secrets.clone());
        let read =
            tokio::task::spawn_blocking(move || crate::configured_api_token(&env, &secrets)).await;
        match read {
            Ok(Ok(Some(token))) => {
                if self.api_token.replace(token.expose()) {
                    tracing::info!("API token changed; requests need the new one from now on");
                }
            }
            Ok(Ok(None)) | Err(_) => {}
            Ok(Err(error)) => {
                tracing::warn!(%error, "the API token was not changed");
            }
        }
    }

    /// Chooses the default engine again by the documented rule (a key set
    /// while running makes `lemon` the default at once); whether it changed.
    async fn choose_default(&mut self, config: &GatewayConfig, sections: &EngineSections) -> bool {
        let (config, sections, secrets) = (config.clone(), sections.clone(), self.secrets.clone());
        let chosen = tokio::task::spawn_blocking(move || {
            crate::default_engine(&config, &sections, &secrets)
        })
        .await;
        let chosen = match chosen {
            Ok(Ok(chosen)) => chosen,
            Ok(Err(error)) => {
                tracing::warn!(%error, "the default engine was not chosen again");
                return false;
            }
            Err(_) => return false,
        };
        self.default_choice.replace(&chosen.engine.to_string(), &chosen.reason);
        if chosen.engine == self.default_engine.engine {
            self.default_engine = chosen;
            return false;
        }
        tracing::info!(engine = %chosen.engine, reason = %chosen.reason, "default engine changed");
        self.default_engine = chosen;
        true
    }

    fn checked(&self, text: &str) -> Result<Checked, String> {
        self.checked_with(text, self.shared.as_ref(), None).map_err(|refusal| refusal.to_string())
    }

    /// The file's `text` with `shared` put over it, checked whole; `forced`
    /// rebuilds what it names whether it changed or not.
    fn checked_with(
        &self,
        text: &str,
        shared: Option<&SharedSettings>,
        forced: Option<Plan>,
    ) -> Result<Checked, Refusal> {
        // The environment's overrides apply over every edit, as at start;
        // the cluster config over both.
        let loaded =
            config::load_str_with_env(text, &self.path, &self.env).map_err(Refusal::Config)?;
        for warning in &loaded.warnings {
            tracing::warn!("{warning}");
        }
        let mut config = loaded.config.gateway;
        if let Some(shared) = shared {
            shared.apply(&mut config);
        }
        let sections =
            EngineSections::parse(&config.engines, &self.path, text).map_err(Refusal::other)?;
        let plan = forced.unwrap_or_else(|| plan(&self.current, &config));
        // Only the parts the edit changes are built again.
        let webhook = plan
            .webhook
            .then(|| crate::webhook_transport(&config, &self.secrets, &self.path, text))
            .transpose()
            .map_err(Refusal::other)?;
        let telegram = plan
            .telegram
            .then(|| crate::telegram_transport(&config, &self.secrets, &self.path, text))
            .transpose()
            .map_err(Refusal::other)?;
        let discord = plan
            .discord
            .then(|| crate::discord_transport(&config, &self.secrets, &self.path, text))
            .transpose()
            .map_err(Refusal::other)?;
        let paths =
            crate::paths::Paths { home: self.lemon_home.clone(), config: self.path.clone() };
        let fence = crate::fence(&config, &paths, self.user_home.as_deref());
        let email = plan
            .email
            .then(|| crate::email_transport(&config, &self.secrets, &self.path, text))
            .transpose()
            .map_err(Refusal::other)?;
        let engines = plan
            .engines
            .then(|| (self.build_engines)(&sections))
            .transpose()
            .map_err(|e| Refusal::Other(format!("{}: {e}", self.path.display())))?;
        // Engine names are checked against the table the edit leaves in force.
        let table = engines.as_ref().unwrap_or(&self.engines);
        check_engine_refs_merged(&config, table, &self.path, text, shared)
            .map_err(Refusal::Config)?;
        for warning in crate::section_warnings(&config, &sections, table, &self.path, text) {
            tracing::warn!("{warning}");
        }
        let leased = |built: Option<Option<Arc<dyn lemon_core::transport::Transport>>>| {
            built.map(|t| t.map(|t| crate::cluster::leased(&config, t, self.cluster.as_ref())))
        };
        let (webhook, telegram, discord, email) =
            (leased(webhook), leased(telegram), leased(discord), leased(email));
        Ok(Checked { config, sections, engines, webhook, telegram, discord, email, fence, plan })
    }

    fn reject(&mut self, error: String) {
        tracing::error!(%error, "config edit rejected; keeping the running config");
        let at_ms = now_ms();
        self.status.update(|report| {
            report.rejected = Some(Rejection { error: error.clone(), at_ms });
            report.n_rejected += 1;
        });
        let mut body = serde_json::Map::new();
        body.insert("error".to_owned(), json!(error));
        body.insert("path".to_owned(), json!(self.path.display().to_string()));
        self.bus.publish_notice(Notice { type_name: "config_rejected", ts_ms: at_ms, body });
    }

    async fn apply(&mut self, checked: Checked) {
        let Checked { config, sections, engines, webhook, telegram, discord, email, fence, plan } =
            checked;
        let pending = pending_restarts(&self.started, &config);
        if plan.is_empty() {
            self.status.update(|report| {
                report.rejected = None;
                report.pending_restart = pending.clone();
            });
            if pending.is_empty() {
                tracing::info!(path = %self.path.display(), "config file edited; no setting changed");
            }
            for p in &pending {
                tracing::warn!(key = %p.key, "config edit waits for a restart to take effect");
            }
            self.publish_pending_only(&pending);
            return;
        }
        if plan.budgets {
            self.budget.reconfigure(config.budgets.clone());
        }
        if plan.approvals {
            self.approval_rules.replace(&config);
        }
        if plan.retention {
            self.retention.send_replace(config.retention.clone());
        }
        if plan.mcp {
            self.mcp.reload(config.mcp_servers.clone());
        }
        if let Some(engines) = engines {
            self.engines.replace(&engines);
        }
        if plan.runtime {
            let runtime = lemon_core::gateway::RuntimeConfig {
                budget: Some(self.budget.clone()),
                ..crate::runtime_config(&config, &sections, self.user_home.clone(), &fence)
            };
            if self.gateway.reload(runtime).await.is_err() {
                return;
            }
        }
        if config.max_concurrent_runs != self.current.max_concurrent_runs {
            self.set_cluster_slots(config.max_concurrent_runs).await;
        }
        let chose_again =
            (plan.engines || plan.router) && self.choose_default(&config, &sections).await;
        if (plan.router || chose_again)
            && self
                .router
                .reload(crate::router_config(&config, &self.default_engine))
                .await
                .is_err()
        {
            return;
        }
        if plan.cron && self.cron.sync_config(crate::cron_jobs(&config)).await.is_err() {
            return;
        }
        if plan.shutdown_grace {
            self.shutdown_grace_ms.store(config.shutdown_grace_ms, Ordering::Relaxed);
        }
        for (id, transport) in [
            (webhook::WEBHOOK_TRANSPORT_ID, webhook),
            (telegram::inbound::TRANSPORT_ID, telegram),
            (discord::inbound::TRANSPORT_ID, discord),
            (lemon_transports::email::TRANSPORT_ID, email),
        ] {
            match transport {
                None => {}
                Some(None) => self.transports.stop(id).await,
                Some(Some(transport)) => {
                    if let Err(error) = self.transports.restart(transport).await {
                        tracing::error!(transport = id, %error, "transport not restarted");
                    }
                }
            }
        }
        let effective = effective_json(&config, &sections);
        self.secret_uses.replace(crate::secret_uses(&config, &sections));
        self.current = config;
        let mut generation = 0;
        self.status.update(|report| {
            report.generation += 1;
            report.n_applied += 1;
            generation = report.generation;
            report.effective = effective;
            report.pending_restart = pending.clone();
            report.rejected = None;
        });
        let pending_keys: Vec<&str> = pending.iter().map(|p| p.key.as_str()).collect();
        tracing::info!(
            path = %self.path.display(),
            generation,
            applied = %plan.applied.join(", "),
            pending_restart = %pending_keys.join(", "),
            "config reloaded"
        );
        let mut body = serde_json::Map::new();
        body.insert("generation".to_owned(), json!(generation));
        body.insert("applied".to_owned(), json!(plan.applied));
        body.insert("pending_restart".to_owned(), json!(pending_keys));
        self.bus.publish_notice(Notice { type_name: "config_reloaded", ts_ms: now_ms(), body });
    }

    /// Makes the cluster's slot count `max`, on a cluster node. When the
    /// cluster config sets the cap, only while its version is still the
    /// latest: a node slow to apply an older version must not undo a newer
    /// one that another node applied already (every node sets the same
    /// count for the same version, so repeating it changes nothing).
    async fn set_cluster_slots(&self, max: usize) {
        let Some(node) = &self.cluster else { return };
        if let Some(shared) = self.shared.as_ref().filter(|s| s.sets("max_concurrent_runs")) {
            match node.cluster().config().await {
                Ok(row) if row.version != shared.version() => return,
                Ok(_) => {}
                Err(error) => {
                    tracing::warn!(%error, "cluster slot count not changed: the cluster config could not be read");
                    return;
                }
            }
        }
        let slots = u32::try_from(max).unwrap_or(u32::MAX);
        match node.cluster().set_slot_count(slots).await {
            Ok(_) => tracing::info!(slots, "the cluster runs at most {slots} runs at once"),
            Err(error) => {
                tracing::error!(%error, slots, "the cluster's slot count was not changed")
            }
        }
    }

    /// An edit that changes only settings needing a restart: nothing is
    /// applied, which is said as such.
    fn publish_pending_only(&self, pending: &[PendingRestart]) {
        if pending.is_empty() {
            return;
        }
        let keys: Vec<&str> = pending.iter().map(|p| p.key.as_str()).collect();
        let mut body = serde_json::Map::new();
        body.insert("generation".to_owned(), json!(self.status.get().generation));
        body.insert("applied".to_owned(), json!(Vec::<String>::new()));
        body.insert("pending_restart".to_owned(), json!(keys));
        self.bus.publish_notice(Notice {
            type_name: "config_pending_restart",
            ts_ms: now_ms(),
            body,
        });
    }
}

/// The secrets the transports and engines of `config` read by name, each with
/// what uses it: `telegram`, `webhook` or `engines`.
fn secret_users(
    config: &GatewayConfig,
    path: &Path,
    text: &str,
) -> std::collections::BTreeMap<String, Vec<&'static str>> {
    let mut users: std::collections::BTreeMap<String, Vec<&'static str>> = Default::default();
    let sections = EngineSections::parse(&config.engines, path, text).unwrap_or_default();
    for secret in crate::secret_uses(config, &sections) {
        if secret.inline {
            continue;
        }
        for used_by in &secret.used_by {
            let user = match used_by.split('.').next() {
                Some("telegram") => "telegram",
                Some("webhook") => "webhook",
                Some("engines") => "engines",
                _ => continue,
            };
            let entry = users.entry(secret.name.clone()).or_default();
            if !entry.contains(&user) {
                entry.push(user);
            }
        }
    }
    users
}

/// The values now of the secrets the transports and engines of `config` read
/// by name (a secret that cannot be read is left out). Blocks on the keychain.
pub(crate) fn secret_values(
    config: &GatewayConfig,
    path: &Path,
    text: &str,
    secrets: &lemon_core::secrets::SecretStore,
) -> std::collections::BTreeMap<String, Option<lemon_core::secrets::SecretValue>> {
    secret_users(config, path, text)
        .into_keys()
        .filter_map(|name| secrets.get(&name).ok().map(|value| (name, value)))
        .collect()
}

/// How often the secrets in use are read again, for changes made outside the
/// API (`lemon-gateway secrets set`, an edit of `secrets.toml`).
const SECRETS_POLL: Duration = Duration::from_secs(2);

/// The report of the config read at start.
pub(crate) fn initial_report(
    config: &GatewayConfig,
    engines: &EngineSections,
    missing: bool,
) -> ConfigReport {
    ConfigReport {
        generation: 1,
        effective: effective_json(config, engines),
        pending_restart: Vec::new(),
        rejected: None,
        missing,
        n_applied: 0,
        n_rejected: 0,
    }
}

/// Watches the config file's directory and hands every change of the file to
/// `reloader` once its events have been quiet for [`DEBOUNCE`], until `token`
/// is cancelled. Without a watch (the directory cannot be watched) it reads
/// the file every second instead.
pub(crate) async fn watch(
    mut reloader: Reloader,
    feed: Option<SharedFeed>,
    token: CancellationToken,
) {
    let (mut rows, mut checks) = match feed {
        Some(SharedFeed { rows, checks }) => (Some(rows), Some(checks)),
        None => (None, None),
    };
    let name = reloader.path.file_name().map(ToOwned::to_owned).unwrap_or_default();
    let dir = reloader.path.parent().map_or_else(|| PathBuf::from("."), Path::to_path_buf);
    let mut watcher = match DirWatch::new(&dir, name) {
        Ok(watcher) => Some(watcher),
        Err(error) => {
            tracing::warn!(dir = %dir.display(), %error, "cannot watch the config directory; reading the file every second");
            None
        }
    };
    let mut tick = tokio::time::interval(FALLBACK_POLL);
    let mut secrets_tick = tokio::time::interval(SECRETS_POLL);
    secrets_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let secrets_changed = reloader.secrets_changed.clone();
    // The end of the current burst of events, once one named the file.
    let mut settled: Option<Instant> = None;
    // An edit made while the gateway started is picked up here.
    let mut recheck = reloader.check_file().await;
    loop {
        let polling = watcher.is_none();
        let again = tokio::time::sleep(recheck.unwrap_or_default());
        let quiet = tokio::time::sleep_until(settled.unwrap_or_else(Instant::now));
        tokio::select! {
            () = token.cancelled() => return,
            changed = changed(watcher.as_mut()), if !polling => {
                if let Err(error) = changed {
                    tracing::warn!(dir = %dir.display(), %error, "the config directory's watch failed; reading the file every second");
                    watcher = None;
                } else {
                    settled = Some(Instant::now() + DEBOUNCE);
                }
                continue;
            }
            () = quiet, if settled.is_some() => settled = None,
            _ = tick.tick(), if polling => {}
            () = again, if recheck.is_some() => {}
            () = secrets_changed.notified() => {
                reloader.check_secrets().await;
                continue;
            }
            changed = row_changed(rows.as_mut()) => {
                match changed {
                    Some(row) => reloader.check_shared(row).await,
                    None => rows = None,
                }
                continue;
            }
            request = next_check(checks.as_mut()) => {
                match request {
                    Some(request) => {
                        let _ = request.reply.send(reloader.check_candidate(&request.body));
                    }
                    None => checks = None,
                }
                continue;
            }
            _ = secrets_tick.tick() => {
                reloader.check_secrets().await;
                continue;
            }
        }
        recheck = reloader.check_file().await;
    }
}

/// The next row of the cluster config; `None` once nothing sends any more.
async fn row_changed(
    rows: Option<&mut watch_channel::Receiver<Option<SharedConfig>>>,
) -> Option<SharedConfig> {
    let Some(rows) = rows else { return std::future::pending().await };
    loop {
        rows.changed().await.ok()?;
        if let Some(row) = rows.borrow_and_update().clone() {
            return Some(row);
        }
    }
}

/// The next body to check; `None` once nothing sends any more.
async fn next_check(checks: Option<&mut mpsc::Receiver<CheckRequest>>) -> Option<CheckRequest> {
    match checks {
        Some(checks) => checks.recv().await,
        None => std::future::pending().await,
    }
}

/// The watcher's next event for the config file.
async fn changed(watcher: Option<&mut DirWatch>) -> std::io::Result<()> {
    match watcher {
        Some(watcher) => watcher.changed().await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests;
