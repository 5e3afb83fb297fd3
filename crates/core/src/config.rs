//! `config.toml`: plain data types and the loader.
//!
//! The file has one `[gateway]` table (the reference's layout). Every section a
//! later feature owns (telegram, sms, voice, webhook…) is accepted and kept as raw
//! TOML until that feature reads it. Wrong types or values fail with file, line and
//! column (`<file>:<line>:<column>: <key path>: <message>`); unknown keys are
//! reported as warnings. After parsing, the loader checks engine ids (section names
//! and every `default_engine`, where `claude:opus` names a model of `claude`),
//! non-empty binding transports and project roots, and `queue.cap >= 1`.
//! A missing file is not an error of [`load_file_or_default`]: it gives the
//! defaults.
//!
//! A config written for the reference gateway loads as it is: its keys that
//! name one of ours are read as ours, those without a use here are accepted
//! with a note ([`ReferenceKey`], [`Translation`]), and its environment variables apply over the
//! file ([`env`](mod@env), through [`load_str_with_env`]).
//!
//! In a cluster, a few keys of `[gateway]` come from one versioned row of the
//! database over every node's file ([`SharedSettings`], [`SHARED_KEYS`]).

pub mod env;
mod keys;
mod loader;
mod reference;
pub mod schema;
mod shared;
mod status;

pub use keys::{did_you_mean, field_names, parse_section, parse_table, TableError, UnknownKey};
pub use loader::{
    invalid_model_message, key_note_warning, load_file, load_file_or_default, load_file_with_env,
    load_str, load_str_with_env, section_error, unknown_key_warning, ConfigError, LoadedConfig,
    Position, MAX_CLIENT_RATE, MAX_CONCURRENT_RUNS, MAX_CONNECTIONS, MAX_DURATION_MS,
    MAX_PENDING_RUNS, MAX_QUEUE_CAP, MAX_WORKER_THREADS,
};
pub use reference::{reference_bind, KeyNote, ReferenceKey, Translation};
pub use shared::{SharedSettings, SHARED_KEYS, SHARED_SOURCE};
pub use status::{ConfigReport, ConfigStatus, PendingRestart, Rejection};

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::ids::EngineRef;

/// Lemon Gateway's `config.toml`: every setting lives in the `[gateway]`
/// table and the tables under it. A key the gateway does not know is reported
/// with its file, line and column and otherwise ignored; a whole table it
/// does not know is an error.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[schemars(title = "Lemon Gateway config.toml")]
pub struct Config {
    #[serde(default)]
    pub gateway: GatewayConfig,
}

/// `[gateway]`: the runtime's limits and timeouts, the default engine and
/// working directory, and which channels are switched on. The tables below
/// it configure the control API, the queue, the engines, the channels and
/// the store.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
pub struct GatewayConfig {
    /// Runs that may execute at once across all conversations. 0 queues
    /// everything: nothing runs until it is raised.
    #[serde(default = "defaults::max_concurrent_runs")]
    #[schemars(range(max = MAX_CONCURRENT_RUNS))]
    pub max_concurrent_runs: usize,
    /// The engine a run uses when nothing else picks one (the request, a
    /// directive, the session, a binding or a project): an engine id,
    /// optionally with a model (`claude:opus`). Unset: `lemon` when its
    /// provider's API key is set, else `echo`.
    #[serde(default)]
    #[schemars(example = &"claude")]
    pub default_engine: Option<EngineRef>,
    /// The working directory of runs that have no project and name no
    /// directory; `~` is your home directory. Unset: your home directory.
    #[serde(default)]
    #[schemars(example = &"~/code")]
    pub default_cwd: Option<PathBuf>,
    /// Read from the reference layout. A conversation always continues its
    /// last engine session (send `/new` to start fresh); `false` is
    /// accepted with a note saying so.
    #[serde(default)]
    pub auto_resume: Option<bool>,
    /// One run at a time per engine session, even across conversations: a
    /// run waits for its session's lock for up to `engine_lock_timeout_ms`.
    #[serde(default = "defaults::yes")]
    pub require_engine_lock: bool,
    /// How long a run waits for its engine session's lock, in milliseconds;
    /// one that cannot get it completes with `lock_timeout`.
    #[serde(default = "defaults::engine_lock_timeout_ms")]
    #[schemars(range(max = MAX_DURATION_MS))]
    pub engine_lock_timeout_ms: u64,
    /// A run with no engine event for this long, in milliseconds, is
    /// cancelled and completes with `timeout`.
    #[serde(default = "defaults::run_inactivity_timeout_ms")]
    #[schemars(range(max = MAX_DURATION_MS))]
    pub run_inactivity_timeout_ms: u64,
    /// The router cancels a run with no event for this long, in
    /// milliseconds (`run_idle_watchdog_timeout`); 0 turns the watchdog off.
    /// Unset: two hours.
    #[serde(default)]
    #[schemars(example = 7_200_000)]
    #[schemars(range(max = MAX_DURATION_MS))]
    pub run_idle_watchdog_ms: Option<u64>,
    /// On SIGINT or SIGTERM, how long running runs may go on before they
    /// are cancelled, in milliseconds.
    #[serde(default = "defaults::shutdown_grace_ms")]
    #[schemars(range(max = MAX_DURATION_MS))]
    pub shutdown_grace_ms: u64,
    /// A request left queued by a shutdown or a crash runs at the next start
    /// unless it was accepted longer ago than this, in milliseconds; then it
    /// completes `expired`.
    #[serde(default = "defaults::recovered_max_age_ms")]
    #[schemars(range(max = MAX_DURATION_MS))]
    pub recovered_max_age_ms: u64,
    /// When set, every run's working directory must be inside one of these
    /// absolute directories, whoever chose it (links are resolved first).
    /// Empty: any directory.
    #[serde(default)]
    pub allowed_cwd_roots: Vec<PathBuf>,
    /// Requests waiting in all queues together (accepted and not yet
    /// finished) before new ones are refused with 429 and `Retry-After`: a
    /// few tens of MB of queued prompts at most.
    #[serde(default = "defaults::max_pending_runs")]
    #[schemars(range(max = MAX_PENDING_RUNS))]
    pub max_pending_runs: usize,
    /// The gateway's workspace: files a run sends back may be here as well
    /// as in its working directory. `~` is your home directory and a
    /// relative path is under `$LEMON_HOME`. Unset: `$LEMON_HOME/workspace`.
    #[serde(default)]
    #[schemars(example = &"workspace")]
    pub workspace_dir: Option<PathBuf>,
    /// Images a run creates through its file changes are sent with its
    /// answer.
    #[serde(default)]
    pub auto_send_generated_images: bool,
    /// Every HTTP listener: how long a client has to send a request's head,
    /// in milliseconds, from the connection opening or the previous response
    /// ending.
    #[serde(default = "defaults::http_header_read_timeout_ms")]
    #[schemars(range(min = 1, max = MAX_DURATION_MS))]
    pub http_header_read_timeout_ms: u64,
    /// Every HTTP listener: a connection with no request in flight that
    /// sends nothing for this long, in milliseconds, is closed (an open
    /// event stream is never cut).
    #[serde(default = "defaults::http_idle_timeout_ms")]
    #[schemars(range(min = 1, max = MAX_DURATION_MS))]
    pub http_idle_timeout_ms: u64,
    /// Connections the control API (and each channel's listener) keeps open
    /// at once. Unset: derived from the process's file descriptor limit.
    #[serde(default)]
    #[schemars(range(min = 1, max = MAX_CONNECTIONS))]
    pub http_max_connections: Option<usize>,
    #[serde(default)]
    pub http_client_limits: HttpClientLimitsConfig,
    /// Threads of the async runtime that serves the API and the channels and
    /// drives runs, in the `lemon-gateway` binary; a change takes a restart.
    /// Unset: one less than the CPUs, at least 1.
    #[serde(default)]
    #[schemars(range(min = 1, max = MAX_WORKER_THREADS))]
    pub worker_threads: Option<usize>,
    /// Switches the Telegram channel on or off; `[gateway.telegram] enabled`
    /// wins when both are set. Unset (and no `enabled`): off.
    #[serde(default)]
    pub enable_telegram: Option<bool>,
    /// Switches the Discord channel on or off; `[gateway.discord] enabled`
    /// wins when both are set. Unset (and no `enabled`): off.
    #[serde(default)]
    pub enable_discord: Option<bool>,
    /// Switches the XMTP channel on or off; `[gateway.xmtp] enabled` wins
    /// when both are set. Unset (and no `enabled`): off.
    #[serde(default)]
    pub enable_xmtp: Option<bool>,
    /// Switches the webhook channel on or off; `[gateway.webhook] enabled`
    /// wins when both are set. Unset (and no `enabled`): off.
    #[serde(default)]
    pub enable_webhook: Option<bool>,
    /// Only the native `lemon` engine runs: `/<engine>` directives are
    /// ignored, explicit vendor resume lines are refused, and stored vendor
    /// sessions are kept but not continued.
    #[serde(default)]
    pub native_only: Option<bool>,
    // `[gateway.engines.<id>]` is kept raw: each engine parses its own section
    // (`lemon_engines::config`); core checks only the ids.
    #[serde(default)]
    #[schemars(schema_with = "schema::slot::engines")]
    pub engines: BTreeMap<String, toml::Table>,
    /// `[gateway.projects.<name>]`: a project is a directory runs work in,
    /// with its own default engine, approval rules and tools; a binding
    /// names it.
    #[serde(default)]
    pub projects: BTreeMap<String, ProjectConfig>,
    /// `[[gateway.bindings]]`: a chat (or a forum topic) of a channel tied to
    /// a project, an agent, an engine, a queue mode, budgets, approval rules
    /// and tools.
    #[serde(default)]
    pub bindings: Vec<BindingConfig>,
    #[serde(default)]
    pub queue: QueueConfig,
    #[serde(default)]
    pub sandbox: SandboxConfig,
    #[serde(default)]
    pub approvals: ApprovalsConfig,
    #[serde(default)]
    pub budgets: BudgetsConfig,
    /// `[gateway.files]`: files sent with runs over the control API and its
    /// OpenAI-compatible routes: how large, which names are refused, where
    /// they are saved, whether a URL may point at a private address.
    #[serde(default)]
    pub files: crate::media::FilesConfig,
    /// `[gateway.api]`: where the control API (and the dashboard) listens.
    /// Default `127.0.0.1:4040`.
    #[serde(default)]
    pub api: ListenConfig,
    /// `[gateway.health]`: where the health endpoint (`/healthz`,
    /// `/metrics`) listens. Default `127.0.0.1:4042`.
    #[serde(default)]
    pub health: ListenConfig,
    // The sections of the channels: each parses its own.
    #[serde(default)]
    #[schemars(schema_with = "schema::slot::telegram")]
    pub telegram: Option<toml::Table>,
    #[serde(default)]
    #[schemars(schema_with = "schema::slot::discord")]
    pub discord: Option<toml::Table>,
    #[serde(default)]
    #[schemars(schema_with = "schema::slot::xmtp")]
    pub xmtp: Option<toml::Table>,
    #[serde(default)]
    #[schemars(schema_with = "schema::slot::email")]
    pub email: Option<toml::Table>,
    #[serde(default)]
    #[schemars(schema_with = "schema::slot::webhook")]
    pub webhook: Option<toml::Table>,
    #[serde(default)]
    #[schemars(schema_with = "schema::slot::sms")]
    pub sms: Option<toml::Table>,
    #[serde(default)]
    #[schemars(schema_with = "schema::slot::voice")]
    pub voice: Option<toml::Table>,
    /// `[[gateway.cron]]`: scheduled prompts. The jobs written here are
    /// kept in step with the stored jobs by name: one removed here is
    /// removed there.
    #[serde(default)]
    pub cron: Vec<CronJobConfig>,
    /// `[[gateway.mcp_servers]]`: MCP servers whose tools the native engine
    /// offers as `<name>__<tool>`.
    #[serde(default)]
    pub mcp_servers: Vec<crate::mcp::McpServerConfig>,
    /// `[gateway.dashboard]`: accepted with any keys, for configs that carry
    /// one; the dashboard has no settings.
    #[serde(default)]
    #[schemars(schema_with = "schema::any_table")]
    pub dashboard: Option<toml::Table>,
    /// `[gateway.backup]`: copies of the store on a schedule. Unset: none.
    #[serde(default)]
    pub backup: Option<BackupConfig>,
    #[serde(default)]
    pub retention: RetentionConfig,
    #[serde(default)]
    pub store: StoreConfig,
    #[serde(default)]
    pub cluster: ClusterConfig,
}

/// `[gateway.cluster]`: cluster mode, where several gateways (nodes) share one
/// PostgreSQL store and act as one gateway. Read once at start; a change takes
/// a restart.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
pub struct ClusterConfig {
    /// Join the cluster of the store's database; needs `[gateway.store]
    /// backend = "postgres"`.
    #[serde(default)]
    pub enabled: bool,
    /// This node's id (1 to 64 of letters, digits, `.`, `_`, `-`), unique among
    /// the running nodes. Unset: a new one (`node-` and 12 hex digits) at every
    /// start.
    #[serde(default)]
    #[schemars(length(min = 1, max = 64), pattern(r"^[A-Za-z0-9._-]+$"))]
    pub node_id: Option<String>,
    /// The term of every lease a node holds, in milliseconds: a dead node's
    /// sessions and channels move to the others after at most about this long.
    #[serde(default = "defaults::lease_term_ms")]
    #[schemars(range(min = ClusterConfig::MIN_LEASE_TERM_MS, max = ClusterConfig::MAX_LEASE_TERM_MS))]
    pub lease_term_ms: u64,
    /// Where this node's control API is reached (`http://` or `https://`),
    /// shown to the other nodes' status pages.
    #[serde(default)]
    pub api_base_url: Option<String>,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            enabled: false,
            node_id: None,
            lease_term_ms: defaults::lease_term_ms(),
            api_base_url: None,
        }
    }
}

impl ClusterConfig {
    /// The shortest `lease_term_ms`.
    pub const MIN_LEASE_TERM_MS: u64 = 1_000;
    /// The longest `lease_term_ms`.
    pub const MAX_LEASE_TERM_MS: u64 = 600_000;

    /// The node id `node_id` names, or a new one when it names none.
    ///
    /// # Errors
    /// Why `node_id` is not an id (the loader has refused such a file already).
    pub fn node(&self) -> Result<crate::cluster::NodeId, crate::cluster::NodeIdError> {
        match self.node_id.as_deref() {
            Some(raw) => crate::cluster::NodeId::parse(raw),
            None => Ok(crate::cluster::NodeId::generate()),
        }
    }

    /// `lease_term_ms` as a duration.
    pub fn lease_term(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.lease_term_ms)
    }
}

/// `[gateway.store]`: which backend holds runs, events, the journal and
/// channel records. Read once at start; a change takes a restart.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
pub struct StoreConfig {
    /// Where the store lives.
    #[serde(default)]
    pub backend: StoreBackendKind,
    /// The name of the secret that holds the PostgreSQL connection string
    /// (`postgresql://user:password@host:5432/db`); required with `postgres`.
    #[serde(default)]
    #[schemars(length(min = 1, max = 128), pattern(r"^[A-Za-z0-9_.-]+$"))]
    pub url_secret: Option<String>,
    /// At most this many PostgreSQL connections.
    #[serde(default = "defaults::store_pool_size")]
    #[schemars(range(min = 1, max = 1000))]
    pub pool_size: u32,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            backend: StoreBackendKind::default(),
            url_secret: None,
            pool_size: defaults::store_pool_size(),
        }
    }
}

/// `[gateway.store] backend`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum StoreBackendKind {
    /// One SQLite file under the gateway's home.
    #[default]
    Sqlite,
    /// A PostgreSQL database, which one node or several share.
    Postgres,
}

impl StoreBackendKind {
    pub fn as_str(self) -> &'static str {
        match self {
            StoreBackendKind::Sqlite => "sqlite",
            StoreBackendKind::Postgres => "postgres",
        }
    }
}

/// `[gateway.retention]`: what the store forgets, and when. A count of days of
/// 0 keeps that kind of record forever. Applied live by a background task in
/// small batches; never touched: runs not finished or owed a delivery, the
/// journal, chat state, secrets.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
pub struct RetentionConfig {
    /// Finished runs older than this many days go, with their events; what
    /// they spent stays.
    #[serde(default = "defaults::runs_days")]
    pub runs_days: u32,
    /// Events of finished runs older than this many days are compacted into
    /// the run's record (answer, actions, error).
    #[serde(default = "defaults::events_days")]
    pub events_days: u32,
    /// What deleted runs spent is kept this many days (usage totals, budgets).
    #[serde(default = "defaults::usage_days")]
    pub usage_days: u32,
    /// Native sessions' histories unused for this many days go.
    #[serde(default = "defaults::sessions_days")]
    pub sessions_days: u32,
    /// Past this many megabytes (10⁶ bytes) of database file the oldest
    /// finished runs go first, until it is under 90 % of it. Unset: no bound.
    #[serde(default)]
    #[schemars(range(min = 1))]
    pub max_db_mb: Option<u64>,
    /// The runs kept per cron job, newest first.
    #[serde(default = "defaults::cron_runs_kept")]
    pub cron_runs_kept: u32,
}

impl Default for RetentionConfig {
    fn default() -> Self {
        RetentionConfig {
            runs_days: defaults::runs_days(),
            events_days: defaults::events_days(),
            usage_days: defaults::usage_days(),
            sessions_days: defaults::sessions_days(),
            max_db_mb: None,
            cron_runs_kept: defaults::cron_runs_kept(),
        }
    }
}

/// `[gateway.backup]`: when to copy the store and how many copies to keep.
/// The copy is due at the schedule's first slot after the newest one.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
pub struct BackupConfig {
    /// A schedule as cron jobs take it (`daily at 3am`, `0 3 * * *`).
    #[schemars(example = &"daily at 3am")]
    pub every: String,
    /// Where the copies go (`lemon-<UTC time>.db`). Unset: `backups` in the
    /// gateway's home.
    #[serde(default)]
    pub dir: Option<PathBuf>,
    /// Copies kept, newest first; older ones are removed.
    #[serde(default = "defaults::backup_keep")]
    #[schemars(range(min = 1))]
    pub keep: u32,
    /// The time zone of `every` (an IANA name, `Europe/Berlin`). Unset: UTC.
    #[serde(default)]
    pub timezone: Option<String>,
}

impl Default for GatewayConfig {
    fn default() -> Self {
        toml::from_str("").expect("the empty gateway table is valid")
    }
}

impl GatewayConfig {
    /// The raw `[gateway.engines.<id>]` section of an engine, if the file has one.
    pub fn engine(&self, id: &str) -> Option<&toml::Table> {
        self.engines.get(id)
    }

    /// The `[gateway.projects.<id>]` section of a project, if the file has one.
    pub fn project(&self, id: &str) -> Option<&ProjectConfig> {
        self.projects.get(id)
    }

    /// `workspace_dir` expanded: `~` to `user_home`, a relative path (and the
    /// default `workspace`) under `lemon_home`.
    pub fn workspace(&self, lemon_home: &Path, user_home: Option<&Path>) -> PathBuf {
        let configured = self.workspace_dir.as_deref().filter(|p| !p.as_os_str().is_empty());
        let path = configured.unwrap_or(Path::new("workspace"));
        match (path.strip_prefix("~"), user_home) {
            (Ok(rest), Some(home)) => home.join(rest),
            _ if path.is_absolute() => path.to_path_buf(),
            _ => lemon_home.join(path),
        }
    }

    /// How many async runtime threads to start on a machine with `cpus` CPUs:
    /// `worker_threads` when set, else one less than the CPUs, and at least
    /// one. The store's writer thread has the CPU left over. At the loads an
    /// agent gateway sees, a runtime thread more than the work needs costs more
    /// than it brings: each wake-up of an idle runtime wakes a second thread to
    /// look for work, which finds none (a native turn took 18 thread sleeps
    /// with two runtime threads and 8 with one, on two CPUs).
    pub fn worker_threads_for(&self, cpus: usize) -> usize {
        self.worker_threads.unwrap_or(cpus.saturating_sub(1)).max(1)
    }

    /// The control API's listen address (`[gateway.api]`, default `127.0.0.1:4040`).
    pub fn api_addr(&self) -> String {
        self.api.addr(DEFAULT_API_PORT)
    }

    /// The health endpoint's listen address (`[gateway.health]`, default `127.0.0.1:4042`).
    pub fn health_addr(&self) -> String {
        self.health.addr(DEFAULT_HEALTH_PORT)
    }
}

/// `[gateway.projects.<name>]`: a directory runs work in, and what its runs
/// may do.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
pub struct ProjectConfig {
    /// The project's directory: the working directory of its runs. `~` is
    /// your home directory.
    #[schemars(length(min = 1))]
    pub root: PathBuf,
    /// The engine of the project's runs when the request, the session and
    /// the binding pick none (`codex`, `claude:opus`).
    #[serde(default)]
    pub default_engine: Option<EngineRef>,
    /// Approval rules of the project's runs (`[{ tool, match, action }]`),
    /// judged before the owner's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub approvals: Vec<ApprovalRuleConfig>,
    /// The tools the project's runs may use (`["bash", "github__*"]`);
    /// unset, all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<String>>,
}

/// One `[[gateway.cron]]` job: a prompt run on a schedule. `name`,
/// `schedule` and `prompt` are required; the rest default as for a job made
/// over the API.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
pub struct CronJobConfig {
    /// The job's name, unique among the jobs; the stored job of that name
    /// follows this entry.
    #[schemars(length(min = 1))]
    pub name: String,
    /// When it runs: five cron fields (`30 9 * * 1-5`), a shorthand
    /// (`@daily`) or words (`weekdays at 09:30`, `every 15 minutes`).
    pub schedule: String,
    /// What the run is asked.
    #[schemars(length(min = 1))]
    pub prompt: String,
    /// The conversation its runs go to. Unset: `agent:<agent_id>:main`.
    #[serde(default)]
    pub session_key: Option<String>,
    /// The agent of the default session key. Unset: `default`.
    #[serde(default)]
    pub agent_id: Option<String>,
    /// The time zone of `schedule` (an IANA name, `Europe/Berlin`). Unset: UTC.
    #[serde(default)]
    pub timezone: Option<String>,
    /// `false` keeps the job without running it. Unset: on.
    #[serde(default)]
    pub enabled: Option<bool>,
    /// Each firing waits a random time up to this many seconds, so jobs on
    /// the same minute do not start together.
    #[serde(default)]
    #[schemars(range(max = crate::cron::MAX_JITTER_SEC))]
    pub jitter_sec: Option<u64>,
    /// A run still going after this many milliseconds is cancelled.
    #[serde(default)]
    #[schemars(range(min = 1, max = crate::cron::MAX_DURATION_MS))]
    pub timeout_ms: Option<u64>,
    /// How many times a failed run is tried again.
    #[serde(default)]
    #[schemars(range(max = crate::cron::MAX_RETRIES))]
    pub max_retries: Option<u32>,
    /// The wait before the first retry, in milliseconds; doubled after each.
    #[serde(default)]
    #[schemars(range(max = crate::cron::MAX_DURATION_MS))]
    pub retry_backoff_ms: Option<u64>,
}

impl CronJobConfig {
    /// The job it defines. The loader has checked every field.
    pub fn to_spec(&self) -> crate::cron::JobSpec {
        let session_key = match &self.session_key {
            Some(key) => crate::ids::SessionKey::from(key.trim()),
            None => crate::cron::input::default_session(self.agent_id.as_deref()),
        };
        crate::cron::JobSpec {
            name: Some(self.name.trim().to_owned()),
            agent_id: self.agent_id.clone(),
            timezone: self.timezone.clone(),
            enabled: self.enabled,
            jitter_sec: self.jitter_sec,
            timeout_ms: self.timeout_ms,
            max_retries: self.max_retries,
            retry_backoff_ms: self.retry_backoff_ms,
            ..crate::cron::JobSpec::new(self.schedule.clone(), self.prompt.clone(), session_key)
        }
    }
}

/// One `[[gateway.bindings]]` entry: what the runs of one chat (or one
/// forum topic) of a channel get.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
pub struct BindingConfig {
    /// The channel: `telegram`, `discord`, `xmtp`, `email`, `sms`, `voice`
    /// or `webhook`.
    #[schemars(length(min = 1))]
    pub transport: String,
    /// The chat, as the channel names it: a Telegram chat id, a Discord
    /// channel id, an XMTP conversation id. A number or a string.
    #[serde(default)]
    #[schemars(schema_with = "schema::integer_or_string")]
    pub chat_id: Option<toml::Value>,
    /// A forum topic (Telegram) within the chat; a topic's binding wins over
    /// its chat's. A number or a string.
    #[serde(default)]
    #[schemars(schema_with = "schema::integer_or_string")]
    pub topic_id: Option<toml::Value>,
    /// The `[gateway.projects.<name>]` the chat's runs work in.
    #[serde(default)]
    pub project: Option<String>,
    /// The agent part of the chat's session keys.
    #[serde(default)]
    pub agent_id: Option<String>,
    /// The engine of the chat's runs when the request and the session pick
    /// none.
    #[serde(default)]
    pub default_engine: Option<EngineRef>,
    /// The chat's queue mode, over `[gateway.queue] mode`.
    #[serde(default)]
    pub queue_mode: Option<QueueMode>,
    /// `[gateway.bindings.budget]`: limits for the sessions of this binding,
    /// over `[gateway.budgets]`.
    #[serde(default)]
    pub budget: Option<SessionLimits>,
    /// Approval rules of the binding's runs (`[{ tool, match, action }]`),
    /// judged before its project's and the owner's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub approvals: Vec<ApprovalRuleConfig>,
    /// The tools the binding's runs may use (`["bash", "github__*"]`),
    /// within its project's; unset, all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<String>>,
}

impl BindingConfig {
    /// `chat_id` as text, whether the file wrote it as a number or a string.
    pub fn chat_id_text(&self) -> Option<String> {
        self.chat_id.as_ref().and_then(id_text)
    }

    /// `topic_id` as text, whether the file wrote it as a number or a string.
    pub fn topic_id_text(&self) -> Option<String> {
        self.topic_id.as_ref().and_then(id_text)
    }
}

fn id_text(value: &toml::Value) -> Option<String> {
    match value {
        toml::Value::String(s) => Some(s.trim().to_owned()),
        toml::Value::Integer(i) => Some(i.to_string()),
        _ => None,
    }
}

/// What happens to a message sent while its conversation is busy (with
/// nothing active, every mode just runs it). A steer the run took completes
/// with that run; one still unanswered when the run ends is queued in its
/// fallback mode, so it is never lost and never runs twice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum QueueMode {
    /// Queue it after the others (a user message goes ahead of queued goal
    /// continuations).
    Collect,
    /// Queue it; followups sent within 500 ms of each other merge into one
    /// turn.
    Followup,
    /// Send it into the live run; if the engine refuses (or cannot steer),
    /// queue it as a `followup`.
    Steer,
    /// As `steer`, falling back to `collect`.
    SteerBacklog,
    /// Redirect the live run, falling back to `followup`.
    Redirect,
    /// Cancel the live run (it completes `interrupted`) and run this next;
    /// the queue stays.
    Interrupt,
}

impl QueueMode {
    /// Every mode, in the order the docs list them.
    pub const ALL: [QueueMode; 6] = [
        QueueMode::Collect,
        QueueMode::Followup,
        QueueMode::Steer,
        QueueMode::SteerBacklog,
        QueueMode::Redirect,
        QueueMode::Interrupt,
    ];

    /// The spelling used in `config.toml`.
    pub fn as_str(self) -> &'static str {
        match self {
            QueueMode::Collect => "collect",
            QueueMode::Followup => "followup",
            QueueMode::Steer => "steer",
            QueueMode::SteerBacklog => "steer_backlog",
            QueueMode::Redirect => "redirect",
            QueueMode::Interrupt => "interrupt",
        }
    }
}

/// A name that is not a queue mode; its message lists the valid ones.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid queue_mode {given:?}: expected one of collect, followup, steer, steer_backlog, redirect, interrupt")]
pub struct UnknownQueueMode {
    pub given: String,
}

impl std::str::FromStr for QueueMode {
    type Err = UnknownQueueMode;

    fn from_str(raw: &str) -> Result<Self, Self::Err> {
        QueueMode::ALL
            .into_iter()
            .find(|mode| mode.as_str() == raw)
            .ok_or_else(|| UnknownQueueMode { given: raw.to_owned() })
    }
}

/// Which request a full conversation queue drops.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum DropPolicy {
    /// The request waiting longest completes `queue_overflow`.
    Oldest,
    /// The request that came last before this one completes `queue_overflow`.
    Newest,
}

impl DropPolicy {
    /// Every policy.
    pub const ALL: [DropPolicy; 2] = [DropPolicy::Oldest, DropPolicy::Newest];

    /// The spelling used in `config.toml`.
    pub fn as_str(self) -> &'static str {
        match self {
            DropPolicy::Oldest => "oldest",
            DropPolicy::Newest => "newest",
        }
    }
}

/// `[gateway.http_client_limits]`: per client address (an IPv4 address or an
/// IPv6 /64), on the control API and every channel's listener (not health).
/// Zero turns a limit off.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
pub struct HttpClientLimitsConfig {
    /// Connections one client may hold open at once; one more is answered
    /// 429 and closed.
    #[serde(default = "defaults::client_max_connections")]
    #[schemars(range(max = MAX_CONNECTIONS))]
    pub max_connections: usize,
    /// Requests a second one client may send, sustained; a request over it
    /// is answered 429 with `Retry-After`.
    #[serde(default = "defaults::client_requests_per_second")]
    #[schemars(range(max = MAX_CLIENT_RATE))]
    pub requests_per_second: u32,
    /// Requests a client may send at once after a quiet spell (at least 1
    /// while `requests_per_second` is set). Unset: four times the rate.
    #[serde(default)]
    #[schemars(range(max = MAX_CLIENT_RATE))]
    pub burst: Option<u32>,
    /// Networks (CIDR blocks or addresses) no limit applies to. Loopback by
    /// default: behind a reverse proxy on the same machine every client
    /// has the proxy's address.
    #[serde(default = "defaults::client_exempt")]
    pub exempt: Vec<String>,
}

impl Default for HttpClientLimitsConfig {
    fn default() -> Self {
        HttpClientLimitsConfig {
            max_connections: defaults::client_max_connections(),
            requests_per_second: defaults::client_requests_per_second(),
            burst: None,
            exempt: defaults::client_exempt(),
        }
    }
}

impl HttpClientLimitsConfig {
    /// The burst in force: the one set, else four times the rate.
    pub fn burst(&self) -> u32 {
        self.burst.unwrap_or_else(|| self.requests_per_second.saturating_mul(4))
    }
}

/// `[gateway.queue]`: what happens to a message sent while its conversation
/// is busy, and how many may wait.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
pub struct QueueConfig {
    /// The queue mode of requests that name none and whose binding sets
    /// none. Unset: `collect`.
    #[serde(default)]
    #[schemars(example = &"collect")]
    pub mode: Option<QueueMode>,
    /// Requests a conversation may have waiting behind its active run
    /// (queued, or sent into it and not yet answered).
    #[serde(default = "defaults::queue_cap")]
    #[schemars(range(min = 1, max = MAX_QUEUE_CAP))]
    pub cap: Option<usize>,
    /// What a request to a full conversation gets. Unset: it is refused (429
    /// with `Retry-After` on the API and webhooks), so nothing accepted is
    /// lost. `oldest` or `newest`: it is accepted, and the oldest or newest
    /// waiting request completes `queue_overflow`.
    #[serde(default)]
    pub drop: Option<DropPolicy>,
}

impl Default for QueueConfig {
    fn default() -> Self {
        QueueConfig { mode: None, cap: defaults::queue_cap(), drop: None }
    }
}

/// `[gateway.sandbox]`: the kernel's containment of the native engine's
/// `bash` commands (Landlock on Linux).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
pub struct SandboxConfig {
    /// How commands are contained.
    #[serde(default)]
    pub mode: SandboxMode,
    /// Directories a command may read and execute beneath, besides the run's
    /// directory, the workspace and its temporary directory; `~` is the
    /// user's home. A root holding the gateway's state or `~/.ssh` is left out.
    #[serde(default = "defaults::sandbox_read_roots")]
    pub read_roots: Vec<PathBuf>,
    /// TCP ports a command may connect to (any host); none by default.
    #[serde(default)]
    pub allow_connect_ports: Vec<u16>,
    /// Behave as on a kernel without Landlock (to try `required` and the
    /// warnings).
    #[serde(default)]
    pub simulate_no_landlock: bool,
}

impl Default for SandboxConfig {
    fn default() -> Self {
        SandboxConfig {
            mode: SandboxMode::default(),
            read_roots: defaults::sandbox_read_roots(),
            allow_connect_ports: Vec::new(),
            simulate_no_landlock: false,
        }
    }
}

/// `[gateway.approvals]`: ordered rules over the tool calls of native and
/// Claude Code runs; the first that matches decides, and a call none matches
/// is allowed.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
pub struct ApprovalsConfig {
    /// How long an asked call waits for an answer before it is denied, in
    /// milliseconds.
    #[serde(default = "defaults::approval_timeout_ms")]
    #[schemars(range(min = 1))]
    pub timeout_ms: u64,
    /// `[[gateway.approvals.rules]]`: the owner's rules, for runs of trusted
    /// text. Unset: reading tools (`read`, `list`, `ls`, `grep`, `glob` and
    /// the SMS inbox's) are allowed and every other call is asked about;
    /// `rules = []` allows every call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rules: Option<Vec<ApprovalRuleConfig>>,
    /// `[[gateway.approvals.untrusted]]`: the rules of untrusted runs (a
    /// webhook's payload, an email, a run that fetched a page). Unset: the
    /// reading file tools are allowed, `fetch` is denied and every other
    /// call is asked about.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub untrusted: Option<Vec<ApprovalRuleConfig>>,
    /// `[gateway.approvals.engines]`: the rules of one engine's runs
    /// (`codex = [{ tool = "bash", match = "cargo *", action = "allow" }]`),
    /// judged before the owner's.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("x-key" = "engine"))]
    pub engines: BTreeMap<String, Vec<ApprovalRuleConfig>>,
}

impl Default for ApprovalsConfig {
    fn default() -> Self {
        ApprovalsConfig {
            timeout_ms: defaults::approval_timeout_ms(),
            rules: None,
            untrusted: None,
            engines: BTreeMap::new(),
        }
    }
}

impl ApprovalsConfig {
    /// The owner's rules when none are configured: the tools that only read
    /// (files, where the sandbox lets a run read; the SMS inbox) are allowed,
    /// and every call with a side effect (a command, a write, a fetch, a
    /// message, an MCP tool, a vendor CLI's edit) is asked about.
    pub fn default_rules() -> Vec<ApprovalRuleConfig> {
        let rule = ApprovalRuleConfig::any_subject;
        vec![
            rule("{read,list,ls,grep,glob}", ApprovalAction::Allow),
            rule("sms_{get_inbox_number,list_messages,wait_for_code}", ApprovalAction::Allow),
            rule("*", ApprovalAction::Ask),
        ]
    }

    /// The owner's rules: the configured ones, or the defaults.
    pub fn owner_rules(&self) -> Cow<'_, [ApprovalRuleConfig]> {
        match &self.rules {
            Some(rules) => Cow::Borrowed(rules),
            None => Cow::Owned(Self::default_rules()),
        }
    }

    /// The rules of untrusted runs when none are configured: the file tools
    /// that only read are allowed (the sandbox keeps them in the run's
    /// directories), `fetch` is denied, and every other call is asked about.
    pub fn default_untrusted() -> Vec<ApprovalRuleConfig> {
        let rule = ApprovalRuleConfig::any_subject;
        vec![
            rule("{read,list,grep,glob}", ApprovalAction::Allow),
            rule("fetch", ApprovalAction::Deny),
            rule("*", ApprovalAction::Ask),
        ]
    }

    /// The rules of untrusted runs: the configured ones, or the defaults.
    pub fn untrusted_rules(&self) -> Cow<'_, [ApprovalRuleConfig]> {
        match &self.untrusted {
            Some(rules) => Cow::Borrowed(rules),
            None => Cow::Owned(Self::default_untrusted()),
        }
    }
}

/// One approval rule: which calls it matches and what it does with them.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
pub struct ApprovalRuleConfig {
    /// A glob over tool names (`bash`, `write`, `{read,list}`, `*`).
    pub tool: String,
    /// A glob over the call's subject: `bash`'s command line, a file tool's
    /// resolved path, `fetch`'s host. Unset: any.
    #[serde(default, rename = "match")]
    pub pattern: Option<String>,
    /// What happens to a call the rule matches.
    pub action: ApprovalAction,
}

impl ApprovalRuleConfig {
    /// A rule over every call of the tools `tool` names.
    fn any_subject(tool: &str, action: ApprovalAction) -> ApprovalRuleConfig {
        ApprovalRuleConfig { tool: tool.to_owned(), pattern: None, action }
    }
}

/// What a rule does with a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ApprovalAction {
    /// The call runs unasked.
    Allow,
    /// The call waits for the owner's answer (up to `timeout_ms`).
    Ask,
    /// The call is not run; the model is told so.
    Deny,
}

impl ApprovalAction {
    pub fn as_str(self) -> &'static str {
        match self {
            ApprovalAction::Allow => "allow",
            ApprovalAction::Ask => "ask",
            ApprovalAction::Deny => "deny",
        }
    }
}

/// `[gateway.sandbox] mode`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum SandboxMode {
    /// Contain commands where the kernel can, and say so where it cannot.
    #[default]
    Auto,
    /// Refuse to run commands uncontained.
    Required,
    /// No containment.
    Off,
}

impl SandboxMode {
    pub fn as_str(self) -> &'static str {
        match self {
            SandboxMode::Auto => "auto",
            SandboxMode::Required => "required",
            SandboxMode::Off => "off",
        }
    }
}

/// `[gateway.budgets]`: spending limits (none by default) and the prices that
/// turn tokens into US dollars for engines that report no cost. Days are UTC.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize, JsonSchema)]
pub struct BudgetsConfig {
    /// Tokens (input + output) one run may use.
    #[serde(default)]
    pub run_tokens: Option<u64>,
    /// US dollars one run may spend.
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub run_usd: Option<f64>,
    /// Tokens one session may use per UTC day.
    #[serde(default)]
    pub session_daily_tokens: Option<u64>,
    /// US dollars one session may spend per UTC day.
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub session_daily_usd: Option<f64>,
    /// Tokens all sessions together may use per UTC day.
    #[serde(default)]
    pub daily_tokens: Option<u64>,
    /// US dollars all sessions together may spend per UTC day.
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub daily_usd: Option<f64>,
    /// `[gateway.budgets.prices."<model>"]`: prices by model name (or engine
    /// id, for runs that name no model).
    #[serde(default)]
    #[schemars(extend("x-key" = "model"))]
    pub prices: BTreeMap<String, ModelPrice>,
}

impl BudgetsConfig {
    /// The limits of a session: `overrides` (the session's own, then its
    /// binding's) key by key over these.
    pub fn limits(&self, overrides: &[Option<&SessionLimits>]) -> BudgetLimits {
        let mut session = SessionLimits {
            run_tokens: self.run_tokens,
            run_usd: self.run_usd,
            session_daily_tokens: self.session_daily_tokens,
            session_daily_usd: self.session_daily_usd,
        };
        for over in overrides.iter().rev().flatten() {
            session = over.over(&session);
        }
        BudgetLimits { session, daily_tokens: self.daily_tokens, daily_usd: self.daily_usd }
    }

    /// The price of `model`, else of `engine` (for runs that name no model).
    pub fn price(&self, engine: &str, model: Option<&str>) -> Option<&ModelPrice> {
        model.and_then(|m| self.prices.get(m)).or_else(|| self.prices.get(engine))
    }
}

/// The limits a binding or a session may set for itself (`[gateway.bindings.budget]`,
/// `PUT /v1/sessions/{key}/budget`); an unset key keeps the one below it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Deserialize, Serialize, JsonSchema)]
pub struct SessionLimits {
    /// Tokens (input + output) one run may use.
    #[serde(default)]
    pub run_tokens: Option<u64>,
    /// US dollars one run may spend.
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub run_usd: Option<f64>,
    /// Tokens one session may use per UTC day.
    #[serde(default)]
    pub session_daily_tokens: Option<u64>,
    /// US dollars one session may spend per UTC day.
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub session_daily_usd: Option<f64>,
}

impl SessionLimits {
    /// These limits, with `below`'s where these have none.
    pub fn over(&self, below: &SessionLimits) -> SessionLimits {
        SessionLimits {
            run_tokens: self.run_tokens.or(below.run_tokens),
            run_usd: self.run_usd.or(below.run_usd),
            session_daily_tokens: self.session_daily_tokens.or(below.session_daily_tokens),
            session_daily_usd: self.session_daily_usd.or(below.session_daily_usd),
        }
    }

    /// The first amount that is negative or not a number, by key.
    pub fn invalid_key(&self) -> Option<&'static str> {
        [("run_usd", self.run_usd), ("session_daily_usd", self.session_daily_usd)]
            .into_iter()
            .find(|(_, usd)| usd.is_some_and(|usd| !usd.is_finite() || usd < 0.0))
            .map(|(key, _)| key)
    }
}

/// The limits in force for one session.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct BudgetLimits {
    pub session: SessionLimits,
    pub daily_tokens: Option<u64>,
    pub daily_usd: Option<f64>,
}

impl BudgetLimits {
    /// Whether any limit is set.
    pub fn any(&self) -> bool {
        *self != BudgetLimits::default()
    }
}

/// `[gateway.budgets.prices."<model>"]`: US dollars per million tokens. Cache
/// reads and writes cost the input price unless priced themselves.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize, Serialize, JsonSchema)]
pub struct ModelPrice {
    /// US dollars per million input tokens.
    #[schemars(range(min = 0))]
    pub input_per_mtok: f64,
    /// US dollars per million output tokens.
    #[schemars(range(min = 0))]
    pub output_per_mtok: f64,
    /// US dollars per million tokens read from the cache. Unset: the input
    /// price.
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub cache_read_per_mtok: Option<f64>,
    /// US dollars per million tokens written to the cache. Unset: the input
    /// price.
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub cache_write_per_mtok: Option<f64>,
}

impl ModelPrice {
    /// The first price that is negative or not a number, by key.
    pub fn invalid_key(&self) -> Option<&'static str> {
        [
            ("input_per_mtok", Some(self.input_per_mtok)),
            ("output_per_mtok", Some(self.output_per_mtok)),
            ("cache_read_per_mtok", self.cache_read_per_mtok),
            ("cache_write_per_mtok", self.cache_write_per_mtok),
        ]
        .into_iter()
        .find(|(_, price)| price.is_some_and(|p| !p.is_finite() || p < 0.0))
        .map(|(key, _)| key)
    }
}

/// A listener: `bind` address and `port`; unset keys take the section's defaults.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
pub struct ListenConfig {
    /// The address to listen on (`127.0.0.1`, `0.0.0.0` for every
    /// interface, `::1`). Unset: `127.0.0.1`.
    #[serde(default)]
    #[schemars(example = &"127.0.0.1")]
    pub bind: Option<String>,
    /// The port (0 picks a free one). Unset: the section's default port.
    #[serde(default)]
    pub port: Option<u16>,
}

impl ListenConfig {
    /// `bind:port`, defaulting to loopback and `default_port`.
    pub fn addr(&self, default_port: u16) -> String {
        format!(
            "{}:{}",
            self.bind.as_deref().unwrap_or("127.0.0.1"),
            self.port.unwrap_or(default_port)
        )
    }
}

/// Whether `dir` lies inside one of `roots` (`[gateway] allowed_cwd_roots`) once
/// the symlinks of both are resolved, so a link inside a root cannot lead out of
/// it. With no roots every directory is allowed; a directory that cannot be
/// resolved (it does not exist) is inside none.
pub fn cwd_allowed(roots: &[PathBuf], dir: &Path) -> bool {
    if roots.is_empty() {
        return true;
    }
    let Ok(dir) = dir.canonicalize() else { return false };
    roots.iter().filter_map(|root| root.canonicalize().ok()).any(|root| dir.starts_with(root))
}

/// The control API's default port.
pub const DEFAULT_API_PORT: u16 = 4040;
/// The health endpoint's default port.
pub const DEFAULT_HEALTH_PORT: u16 = 4042;

/// The engine of a gateway whose `default_engine` is unset and that has not
/// chosen one itself: `echo`, which needs nothing.
pub fn fallback_engine() -> EngineRef {
    EngineRef::new(crate::ids::EngineId::builtin(FALLBACK_ENGINE))
}

/// The id of [`fallback_engine`].
pub const FALLBACK_ENGINE: &str = "echo";

/// Default values, as functions serde can call.
mod defaults {
    pub(super) fn store_pool_size() -> u32 {
        16
    }
    pub(super) fn lease_term_ms() -> u64 {
        10_000
    }
    pub(super) fn backup_keep() -> u32 {
        7
    }
    pub(super) fn runs_days() -> u32 {
        30
    }
    pub(super) fn events_days() -> u32 {
        7
    }
    pub(super) fn usage_days() -> u32 {
        400
    }
    pub(super) fn sessions_days() -> u32 {
        90
    }
    pub(super) fn cron_runs_kept() -> u32 {
        u32::try_from(crate::cron::RUNS_KEPT).unwrap_or(u32::MAX)
    }
    pub(super) fn approval_timeout_ms() -> u64 {
        600_000
    }
    pub(super) fn sandbox_read_roots() -> Vec<std::path::PathBuf> {
        ["/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/etc", "/opt", "/proc", "/sys"]
            .into_iter()
            .map(std::path::PathBuf::from)
            .collect()
    }
    pub(super) fn max_concurrent_runs() -> usize {
        2
    }
    pub(super) fn yes() -> bool {
        true
    }
    pub(super) fn engine_lock_timeout_ms() -> u64 {
        60_000
    }
    pub(super) fn run_inactivity_timeout_ms() -> u64 {
        300_000
    }
    pub(super) fn shutdown_grace_ms() -> u64 {
        10_000
    }
    pub(super) fn recovered_max_age_ms() -> u64 {
        60 * 60 * 1000
    }
    pub(super) fn max_pending_runs() -> usize {
        10_000
    }
    pub(super) fn queue_cap() -> Option<usize> {
        Some(100)
    }
    pub(super) fn http_header_read_timeout_ms() -> u64 {
        10_000
    }
    pub(super) fn http_idle_timeout_ms() -> u64 {
        5_000
    }
    pub(super) fn client_max_connections() -> usize {
        256
    }
    pub(super) fn client_requests_per_second() -> u32 {
        50
    }
    pub(super) fn client_exempt() -> Vec<String> {
        vec!["127.0.0.0/8".to_owned(), "::1".to_owned()]
    }
}

#[cfg(test)]
mod tests;
