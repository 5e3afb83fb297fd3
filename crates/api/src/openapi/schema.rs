//! The shapes of the control API's JSON responses, for its OpenAPI document.
//!
//! The handlers build these bodies as JSON; each type here names every key
//! such a body has, with its type. A key that may be `null` is an `Option`;
//! a key only some bodies carry says so. The end-to-end schemathesis run
//! checks every response the gateway gives against these shapes.

use std::collections::BTreeMap;

use serde_json::Value;
use utoipa::openapi::schema::{OneOfBuilder, Schema};
use utoipa::openapi::{Ref, RefOr};
use utoipa::{PartialSchema, ToSchema};

/// Every error of the control API: `{"error": "..."}`.
#[derive(Debug, ToSchema)]
pub struct Error {
    /// What went wrong, for a person.
    pub error: String,
}

/// One Server-Sent Event of a stream (`/v1/runs/{id}/events`, `/v1/events`,
/// the OpenAI-compatible routes with `stream`).
#[derive(Debug, ToSchema)]
pub struct SseEvent {
    /// The event's type (`run_started`, `delta`, `run_completed`…); OpenAI's
    /// chat chunks have none.
    pub event: Option<String>,
    /// The event as JSON text (`[DONE]` at the end of a chat stream).
    pub data: String,
    /// The run event's index, for `Last-Event-ID`.
    pub id: Option<String>,
}

/// `422` of `PUT /v1/config`: the config is refused, with where.
#[derive(Debug, ToSchema)]
pub struct ConfigRefused {
    pub error: String,
    /// 1-based line of the error in the text, when it has one.
    pub line: Option<u64>,
    pub column: Option<u64>,
}

/// A run's status.
#[derive(Debug, ToSchema)]
#[schema(rename_all = "snake_case")]
pub enum RunStatus {
    Queued,
    Running,
    Cancelling,
    Completed,
    Failed,
    Cancelled,
}

/// `202` of `POST /v1/runs`: the run is accepted.
#[derive(Debug, ToSchema)]
pub struct Accepted {
    pub run_id: String,
    pub session_key: String,
    /// `accepted`.
    pub status: String,
    pub conversation: String,
    /// The engine it runs on (`claude`, `claude:opus`).
    pub engine: String,
    /// `true` when the run id was submitted before: this is that run.
    pub duplicate: Option<bool>,
}

/// `200` of `POST /v1/runs` for a slash command (`/new`, `/status`…).
#[derive(Debug, ToSchema)]
pub struct CommandReply {
    /// `cancel`, `new`, `status` or `engine`.
    pub command: String,
    pub reply: String,
}

/// `200` of `POST /v1/runs`: a slash command's reply, or with `?wait=true`
/// the finished run.
#[derive(Debug)]
pub enum SubmitReply {
    Run(Box<Run>),
    Command(CommandReply),
}

impl utoipa::PartialSchema for SubmitReply {
    fn schema() -> RefOr<Schema> {
        OneOfBuilder::new()
            .item(Ref::from_schema_name(Run::name()))
            .item(Ref::from_schema_name(CommandReply::name()))
            .into()
    }
}

impl ToSchema for SubmitReply {
    fn schemas(schemas: &mut Vec<(String, RefOr<Schema>)>) {
        for (name, schema) in
            [(Run::name(), Run::schema()), (CommandReply::name(), CommandReply::schema())]
        {
            schemas.push((name.into_owned(), schema));
        }
        Run::schemas(schemas);
    }
}

/// A resume token: the engine and its session id.
#[derive(Debug, ToSchema)]
pub struct ResumeToken {
    pub engine: String,
    pub value: String,
}

/// What a run spent, normalised.
#[derive(Debug, ToSchema)]
pub struct Spend {
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cache_read_tokens: u64,
    pub cache_write_tokens: u64,
    /// US dollars.
    pub usd: f64,
}

/// A file sent with a run's answer.
#[derive(Debug, ToSchema)]
pub struct Artifact {
    pub path: String,
    pub filename: String,
    pub caption: Option<String>,
    pub size: u64,
    pub mime: String,
}

/// What compaction kept of a run's events.
#[derive(Debug, ToSchema)]
pub struct Compacted {
    /// When (ms since the epoch).
    pub at_ms: i64,
    /// How many events the run had.
    pub events: u64,
    /// Its completed actions: `{kind, title, ok, message}`.
    pub actions: Vec<Value>,
}

/// A run, as `GET /v1/runs/{id}` answers it.
#[derive(Debug, ToSchema)]
pub struct Run {
    pub run_id: String,
    pub session_key: String,
    pub engine: String,
    pub prompt: String,
    /// What the caller sent as `meta`.
    pub meta: Value,
    /// Where the run's outside text came from (`webhook ci`, `email from
    /// ann@example.com`); `null` for the owner's own words.
    pub untrusted: Option<String>,
    pub status: RunStatus,
    pub answer: Option<String>,
    pub error: Option<String>,
    /// `timeout`, `engine_exited`, `cancelled`…
    pub error_code: Option<String>,
    pub resumed_from: Option<ResumeToken>,
    pub resume: Option<ResumeToken>,
    /// The line a user pastes to continue the session.
    pub resume_line: Option<String>,
    /// The engine's own usage report, as it gave it.
    pub usage: Value,
    pub spend: Spend,
    pub created_at_ms: i64,
    pub started_at_ms: Option<i64>,
    pub completed_at_ms: Option<i64>,
    pub duration_ms: Option<u64>,
    /// Set once retention compacted the run's events (`[gateway.retention]
    /// events_days`): only its `run_completed` is left to replay.
    pub compacted: Option<Compacted>,
    /// The files of a finished run's answer (`GET /v1/runs/{id}` and
    /// `?wait=true` only; `[]` while it runs).
    pub artifacts: Option<Vec<Artifact>>,
}

/// `GET /v1/runs`.
#[derive(Debug, ToSchema)]
pub struct RunList {
    /// Newest first.
    pub runs: Vec<Run>,
}

/// `POST /v1/runs/{id}/cancel`.
#[derive(Debug, ToSchema)]
pub struct RunCancelled {
    pub run_id: String,
    /// `cancelling`, or the run's status when it is no longer active.
    pub status: String,
}

/// `POST /v1/runs/{id}/steer`.
#[derive(Debug, ToSchema)]
pub struct Steered {
    /// Whether the running engine took the text.
    pub accepted: bool,
    /// Why not, when it did not.
    pub reason: Option<String>,
}

/// A session's chat state: the engine session it continues.
#[derive(Debug, ToSchema)]
pub struct ChatState {
    pub engine: String,
    pub resume_token: String,
    pub updated_at_ms: i64,
    pub expires_at_ms: i64,
}

/// `GET /v1/sessions/{key}`.
#[derive(Debug, ToSchema)]
pub struct Session {
    pub session_key: String,
    pub active_run: Option<String>,
    pub active_runs: Vec<String>,
    /// Queued run ids, in the order they run.
    pub queue: Vec<String>,
    pub queue_length: u64,
    pub pending_steers: u64,
    pub chat_state: Option<ChatState>,
    /// The engine the session sticks to (`/engine`), if any.
    pub engine: Option<String>,
}

/// `POST /v1/sessions/{key}/cancel` and `/abort`.
#[derive(Debug, ToSchema)]
pub struct SessionCancelled {
    pub session_key: String,
    /// Queued runs dropped (`abort` only; `0` for `cancel`).
    pub dropped: u64,
    /// Active runs cancelled.
    pub cancelled: u64,
}

/// Tokens, dollars and runs over a span.
#[derive(Debug, ToSchema)]
pub struct Totals {
    pub runs: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cache_read_tokens: u64,
    pub cache_write_tokens: u64,
    pub tokens: u64,
    pub usd: f64,
}

/// [`Totals`] of one engine.
#[derive(Debug, ToSchema)]
pub struct EngineTotals {
    pub engine: String,
    pub runs: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cache_read_tokens: u64,
    pub cache_write_tokens: u64,
    pub tokens: u64,
    pub usd: f64,
}

/// [`Totals`] of one session.
#[derive(Debug, ToSchema)]
pub struct SessionTotals {
    pub session_key: String,
    pub runs: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cache_read_tokens: u64,
    pub cache_write_tokens: u64,
    pub tokens: u64,
    pub usd: f64,
}

/// `GET /v1/usage`.
#[derive(Debug, ToSchema)]
pub struct Usage {
    pub since_ms: i64,
    pub total: Totals,
    pub engines: Vec<EngineTotals>,
    pub sessions: Vec<SessionTotals>,
}

/// The limits in force for a session (`null`: no limit).
#[derive(Debug, ToSchema)]
pub struct Limits {
    pub run_tokens: Option<u64>,
    pub run_usd: Option<f64>,
    pub session_daily_tokens: Option<u64>,
    pub session_daily_usd: Option<f64>,
    pub daily_tokens: Option<u64>,
    pub daily_usd: Option<f64>,
}

/// A session's own limits, set with `PUT /v1/sessions/{key}/budget`.
#[derive(Debug, ToSchema)]
pub struct SessionLimits {
    pub run_tokens: Option<u64>,
    pub run_usd: Option<f64>,
    pub session_daily_tokens: Option<u64>,
    pub session_daily_usd: Option<f64>,
}

/// `GET` and `PUT /v1/sessions/{key}/budget`.
#[derive(Debug, ToSchema)]
pub struct Budget {
    pub session_key: String,
    pub limits: Limits,
    pub session_override: Option<SessionLimits>,
    /// Start of the current UTC day.
    pub day_start_ms: i64,
    pub today: Totals,
    pub all_sessions_today: Totals,
}

/// The scheduler's counters.
#[derive(Debug, ToSchema)]
pub struct Scheduler {
    pub in_flight: u64,
    pub waitq: u64,
    pub max: u64,
    pub conversations: u64,
    pub queued: u64,
}

/// An engine in `/v1/status`.
#[derive(Debug, ToSchema)]
pub struct EngineStatus {
    pub id: String,
    pub available: bool,
    pub steer: bool,
    pub redirect: bool,
    /// The executable, for a CLI engine found on `PATH`.
    pub path: Option<String>,
    pub version: Option<String>,
    /// Why it is unavailable.
    pub reason: Option<String>,
}

/// A transport's state in `/v1/status`.
#[derive(Debug, ToSchema)]
pub struct TransportStatus {
    /// `disabled`, `starting`, `running`, `failing` or `stopped`.
    pub state: String,
    pub detail: Option<String>,
    pub reason: Option<String>,
    pub attempts: Option<u64>,
    /// `null`: not retried.
    pub retry_in_ms: Option<u64>,
}

/// An MCP server of `[[gateway.mcp_servers]]` in `/v1/status`: the
/// native engine's runs are offered its tools.
#[derive(Debug, ToSchema)]
pub struct McpServerStatus {
    pub name: String,
    /// `stdio` (a command) or `http` (Streamable HTTP).
    pub transport: String,
    /// `disabled`, `idle` (not started yet: it starts with the first run
    /// that offers it), `starting`, `running` or `failed` (started again
    /// when a run offers it).
    pub state: String,
    /// The tools offered, as runs see them (`<server>__<tool>`), in name order.
    pub tools: Vec<String>,
    /// Why the last start or call failed.
    pub error: Option<String>,
    /// Tool calls finished, by outcome (`ok`, `error`, `timeout`, `cancelled`).
    pub calls: BTreeMap<String, u64>,
    /// Times the server was started or restarted.
    pub starts: u64,
}

/// Where a secret the config names was found.
#[derive(Debug, ToSchema)]
pub struct SecretSource {
    pub source: String,
    /// Later sources that have it too and are not used.
    pub overrides: Vec<String>,
}

/// `GET /v1/status`.
#[derive(Debug, ToSchema)]
pub struct Status {
    pub version: String,
    pub uptime_ms: u64,
    /// Whether intake is paused (`/v1/intake/pause`).
    pub paused: bool,
    /// Threads of the async runtime the gateway runs on (`[gateway] worker_threads`).
    pub worker_threads: u64,
    pub scheduler: Scheduler,
    pub engines: Vec<EngineStatus>,
    /// The engine of requests that name none.
    pub default_engine: String,
    pub default_engine_reason: String,
    /// By transport id.
    pub transports: BTreeMap<String, TransportStatus>,
    /// By secret name.
    pub secrets: BTreeMap<String, SecretSource>,
    /// The servers of `[[gateway.mcp_servers]]`, by name.
    pub mcp_servers: Vec<McpServerStatus>,
    /// How the native engine's `bash` commands are contained.
    pub sandbox: SandboxStatus,
    /// The store; `null` for a store in memory.
    pub store: Option<StoreStatus>,
    /// The cluster, when the gateway is one of its nodes; `null` otherwise.
    pub cluster: Option<ClusterStatus>,
}

/// The cluster, in `/v1/status`, as this node sees it.
#[derive(Debug, ToSchema)]
pub struct ClusterStatus {
    /// This node's id.
    pub node: String,
    /// The lease term.
    pub term_ms: u64,
    /// Whether this node is fenced (it writes nothing more and is stopping).
    pub fenced: bool,
    /// Every registered node, oldest first; `null` when the cluster tables
    /// could not be read (see `error`).
    pub nodes: Option<Vec<ClusterNodeStatus>>,
    pub slots: Option<ClusterSlots>,
    /// Who owns each single-consumer channel, by name.
    pub channels: Option<Vec<ClusterChannel>>,
    /// Sessions whose lease this node holds.
    pub sessions_here: u64,
    /// The cluster config: its version and the one this node applied.
    pub config: ClusterConfigVersions,
    /// Why the cluster tables could not be read.
    pub error: Option<String>,
}

/// `cluster.config` in `/v1/status`.
#[derive(Debug, ToSchema)]
pub struct ClusterConfigVersions {
    /// The version in the database; `null` when it could not be read.
    pub version: Option<i64>,
    /// The version in force on this node (0: none, its file alone).
    pub applied_version: Option<i64>,
    /// Why this node refused a later version (it keeps the one it applied).
    pub error: Option<String>,
}

/// `GET` and `PUT /v1/cluster/config`: the cluster config.
#[derive(Debug, ToSchema)]
pub struct ClusterConfig {
    /// 0 before anyone wrote it.
    pub version: i64,
    /// TOML with only the cluster-wide keys of `[gateway]`.
    pub body: String,
    pub updated_at_ms: i64,
    /// The node that wrote it.
    pub updated_by: Option<String>,
    /// The version in force on this node.
    pub applied_version: Option<i64>,
}

/// `400` and `422` of `PUT /v1/cluster/config`: the body is refused, with
/// the key and where in the body (or in the node's file) the problem is.
#[derive(Debug, ToSchema)]
pub struct ClusterConfigRefused {
    pub error: String,
    /// The key path (`gateway.api`), when the problem has one.
    pub key: Option<String>,
    pub line: Option<u64>,
    pub column: Option<u64>,
}

/// `409` of `PUT /v1/cluster/config`: the row moved on.
#[derive(Debug, ToSchema)]
pub struct ClusterConfigConflict {
    pub error: String,
    /// The version the row is at now.
    pub version: i64,
}

/// A node of the cluster.
#[derive(Debug, ToSchema)]
pub struct ClusterNodeStatus {
    pub id: String,
    /// Its last heartbeat is within the lease term.
    pub alive: bool,
    pub started_at_ms: i64,
    pub last_heartbeat_ms: i64,
    pub api_base_url: Option<String>,
    pub version: String,
    /// The single-consumer channels it could own.
    pub channels: Vec<String>,
}

/// The cluster's run slots.
#[derive(Debug, ToSchema)]
pub struct ClusterSlots {
    /// The cap on concurrent runs across the cluster.
    pub total: u64,
    /// Slots runs hold now.
    pub in_use: u64,
}

/// A single-consumer channel's lease.
#[derive(Debug, ToSchema)]
pub struct ClusterChannel {
    /// `<transport>:<account>`.
    pub channel: String,
    /// The node holding it (or that held it last).
    pub node: String,
    pub epoch: i64,
    /// Held now: `node` runs the channel.
    pub live: bool,
}

/// The store, in `/v1/status`.
#[derive(Debug, ToSchema)]
pub struct StoreStatus {
    /// `sqlite` or `postgres`.
    pub backend: String,
    /// The SQLite file, or the database as `postgres://host:port/database`
    /// (never the user or password).
    pub path: String,
    /// Whether it saves right now (a full disk or a read-only file system: no).
    pub writable: bool,
    /// Why it does not save; `null` while it does.
    pub error: Option<String>,
    /// The database file's size, or the PostgreSQL tables' with their
    /// indexes; `null` when it cannot be read.
    pub bytes: Option<u64>,
    /// Its write-ahead log's size; `null` for PostgreSQL.
    pub log_bytes: Option<u64>,
    /// Rows per table (`runs`, `run_events`, `pruned_usage`, `journal`, `kv`,
    /// `chat_state`); `null` when the file cannot be read.
    pub rows: Option<std::collections::BTreeMap<String, u64>>,
    /// The last retention pass, once one ran.
    pub last_prune: Option<PrunePass>,
    /// What retention removed since start, by kind (`runs`, `events`, `usage`,
    /// `expired_records`, `sessions`, `cron_runs`, `pages`).
    pub pruned_total: std::collections::BTreeMap<String, u64>,
    /// The newest scheduled backup known.
    pub last_backup: Option<BackupMade>,
    /// Why the last scheduled backup failed, until one succeeds.
    pub backup_error: Option<String>,
}

/// One retention pass.
#[derive(Debug, ToSchema)]
pub struct PrunePass {
    /// When it ended (ms since the epoch).
    pub at_ms: i64,
    pub took_ms: u64,
    /// What it removed, by kind.
    pub removed: std::collections::BTreeMap<String, u64>,
    /// The step that failed, and why; the pass stopped there.
    pub error: Option<String>,
}

/// A scheduled backup that was made.
#[derive(Debug, ToSchema)]
pub struct BackupMade {
    pub at_ms: i64,
    pub path: String,
}

/// `GET /v1/approvals`.
#[derive(Debug, ToSchema)]
pub struct Approvals {
    /// Oldest first.
    pub approvals: Vec<PendingApproval>,
}

/// A tool call waiting for the owner's answer.
#[derive(Debug, ToSchema)]
pub struct PendingApproval {
    /// `apr_…`.
    pub id: String,
    /// Four digits, unique among the requests waiting: what a reply by text
    /// names (`yes 4821`).
    pub code: String,
    pub run_id: String,
    pub session_key: String,
    pub tool: String,
    /// The command, resolved path or host, cut to 400 characters.
    pub subject: String,
    /// The rule that asked (`untrusted: …` for a rule of untrusted runs).
    pub rule: String,
    /// Where the run's untrusted text came from (`webhook ci`, `email from
    /// ann@example.com`, `a page fetched from example.com`); absent for a
    /// run of the owner's own words.
    pub untrusted: Option<String>,
    pub requested_at_ms: i64,
    /// Unanswered by then, the call is denied.
    pub expires_at_ms: i64,
}

/// `POST /v1/approvals/{id}`.
#[derive(Debug, ToSchema)]
pub struct Approval {
    pub approval: PendingApproval,
    /// `approve` or `deny`.
    pub decision: String,
    pub by: String,
}

/// `[gateway.sandbox]` as it holds on this kernel.
#[derive(Debug, ToSchema)]
pub struct SandboxStatus {
    /// `auto`, `required` or `off`.
    pub mode: String,
    /// The kernel's Landlock ABI; null without Landlock.
    pub landlock_abi: Option<u8>,
    /// Whether commands run contained.
    pub enforced: bool,
    /// One line saying what holds.
    pub detail: String,
}

/// `POST /v1/intake/pause` and `/resume`.
#[derive(Debug, ToSchema)]
pub struct Intake {
    pub paused: bool,
}

/// A setting that changed in the file and takes effect at the next start.
#[derive(Debug, ToSchema)]
pub struct PendingRestart {
    pub key: String,
    pub running: Value,
    pub file: Value,
}

/// The last edit of the file that was refused.
#[derive(Debug, ToSchema)]
pub struct Rejected {
    pub error: String,
    pub at_ms: i64,
}

/// `GET /v1/config`.
#[derive(Debug, ToSchema)]
pub struct Config {
    pub generation: u64,
    /// The config in force, secrets left out.
    pub effective: Value,
    pub pending_restart: Vec<PendingRestart>,
    pub rejected: Option<Rejected>,
    pub file_missing: bool,
}

/// `GET /v1/config/file`.
#[derive(Debug, ToSchema)]
pub struct ConfigFile {
    pub path: String,
    pub exists: bool,
    /// config.toml as written (`""` when it does not exist).
    pub text: String,
}

/// `200` of `PUT /v1/config`.
#[derive(Debug, ToSchema)]
pub struct ConfigSaved {
    pub saved: bool,
    pub path: Option<String>,
    pub warnings: Vec<String>,
}

/// A scheduled job.
#[derive(Debug, ToSchema)]
#[schema(rename_all = "camelCase")]
pub struct CronJob {
    pub id: String,
    pub name: String,
    pub schedule: String,
    pub enabled: bool,
    pub agent_id: String,
    pub session_key: String,
    pub prompt: String,
    pub memory_file: Option<String>,
    pub timezone: String,
    pub jitter_sec: u64,
    pub timeout_ms: u64,
    pub max_retries: u32,
    pub retry_backoff_ms: u64,
    pub meta: Value,
    /// `api` or `config`.
    pub source: String,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
    pub last_run_at_ms: Option<i64>,
    /// `null` when disabled.
    pub next_run_at_ms: Option<i64>,
}

/// `POST /v1/cron`'s body (the snake_case spellings are taken too).
#[derive(Debug, ToSchema)]
#[schema(rename_all = "camelCase")]
pub struct NewCronJob {
    /// A cron expression (`0 9 * * 1-5`) or `@every 10m`.
    pub schedule: String,
    pub prompt: String,
    pub name: Option<String>,
    pub agent_id: Option<String>,
    pub session_key: Option<String>,
    pub memory_file: Option<String>,
    /// An IANA time zone (`Europe/Paris`); unset: UTC.
    pub timezone: Option<String>,
    pub enabled: Option<bool>,
    pub jitter_sec: Option<u64>,
    pub timeout_ms: Option<u64>,
    pub max_retries: Option<u32>,
    pub retry_backoff_ms: Option<u64>,
    pub meta: Option<BTreeMap<String, Value>>,
}

/// `PATCH /v1/cron/{id}`'s body: the fields to change, at least one.
#[derive(Debug, ToSchema)]
#[schema(rename_all = "camelCase")]
pub struct CronJobPatch {
    pub schedule: Option<String>,
    pub prompt: Option<String>,
    pub name: Option<String>,
    pub agent_id: Option<String>,
    pub session_key: Option<String>,
    pub memory_file: Option<String>,
    /// An IANA time zone (`Europe/Paris`); unset: UTC.
    pub timezone: Option<String>,
    pub enabled: Option<bool>,
    pub jitter_sec: Option<u64>,
    pub timeout_ms: Option<u64>,
    pub max_retries: Option<u32>,
    pub retry_backoff_ms: Option<u64>,
    pub meta: Option<BTreeMap<String, Value>>,
}

/// `GET /v1/cron`.
#[derive(Debug, ToSchema)]
pub struct CronJobs {
    pub jobs: Vec<CronJob>,
}

/// One firing of a job.
#[derive(Debug, ToSchema)]
#[schema(rename_all = "camelCase")]
pub struct CronRun {
    pub id: String,
    pub job_id: String,
    pub router_run_id: Option<String>,
    /// `running`, `retrying`, `succeeded`, `failed`, `timed_out` or `aborted`.
    pub status: String,
    /// `schedule` or `manual`.
    pub trigger: String,
    pub attempt: u32,
    pub started_at_ms: i64,
    pub ended_at_ms: Option<i64>,
    pub output: Option<String>,
}

/// `GET /v1/cron/{id}/runs`.
#[derive(Debug, ToSchema)]
#[schema(rename_all = "camelCase")]
pub struct CronRuns {
    pub job_id: String,
    /// Newest first.
    pub runs: Vec<CronRun>,
}

/// `DELETE /v1/cron/{id}`.
#[derive(Debug, ToSchema)]
pub struct CronRemoved {
    pub removed: bool,
    pub id: String,
}

/// A secret in `GET /v1/secrets` (never its value).
#[derive(Debug, ToSchema)]
pub struct SecretEntry {
    pub name: String,
    /// `keychain`, `env`, `file`, `inline`, or `null`: not set anywhere.
    pub source: Option<String>,
    /// What in the config uses it.
    pub used_by: Vec<String>,
}

/// Whether the OS keychain can be used.
#[derive(Debug, ToSchema)]
pub struct Keychain {
    pub available: bool,
    pub detail: Option<String>,
}

/// `GET /v1/secrets`.
#[derive(Debug, ToSchema)]
pub struct Secrets {
    pub secrets: Vec<SecretEntry>,
    pub keychain: Keychain,
}

/// `PUT /v1/secrets/{name}`.
#[derive(Debug, ToSchema)]
pub struct SecretSaved {
    pub name: String,
    /// Where it was saved: `keychain` or `file`.
    pub source: String,
}

/// `DELETE /v1/secrets/{name}`.
#[derive(Debug, ToSchema)]
pub struct SecretDeleted {
    pub name: String,
    pub deleted: bool,
}

/// The OpenAI-compatible routes' error object.
#[derive(Debug, ToSchema)]
pub struct OpenAiError {
    pub message: String,
    /// `invalid_request_error`, `authentication_error`, `rate_limit_error`, `server_error`…
    #[schema(rename = "type")]
    pub kind: String,
    pub param: Option<String>,
    pub code: Option<String>,
}

/// `{"error": {...}}` of the OpenAI-compatible routes.
#[derive(Debug, ToSchema)]
pub struct OpenAiErrorBody {
    pub error: OpenAiError,
}

/// An engine as an OpenAI model.
#[derive(Debug, ToSchema)]
pub struct Model {
    pub id: String,
    /// `model`.
    pub object: String,
    pub created: u64,
    pub owned_by: String,
}

/// `GET /v1/models`.
#[derive(Debug, ToSchema)]
pub struct ModelList {
    /// `list`.
    pub object: String,
    pub data: Vec<Model>,
}

/// The assistant's message in a chat completion.
#[derive(Debug, ToSchema)]
pub struct ChatMessage {
    pub role: String,
    pub content: Option<String>,
    pub refusal: Option<String>,
}

/// The one choice of a chat completion.
#[derive(Debug, ToSchema)]
pub struct ChatChoice {
    pub index: u32,
    pub message: ChatMessage,
    pub logprobs: Option<Value>,
    pub finish_reason: Option<String>,
}

/// Cached prompt tokens.
#[derive(Debug, ToSchema)]
pub struct PromptTokensDetails {
    pub cached_tokens: u64,
}

/// A chat completion's token counts.
#[derive(Debug, ToSchema)]
pub struct ChatUsage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub total_tokens: u64,
    pub prompt_tokens_details: Option<PromptTokensDetails>,
}

/// `POST /v1/chat/completions` without `stream`: a `chat.completion`.
#[derive(Debug, ToSchema)]
pub struct ChatCompletion {
    pub id: String,
    /// `chat.completion`.
    pub object: String,
    pub created: u64,
    pub model: String,
    pub system_fingerprint: Option<String>,
    pub choices: Vec<ChatChoice>,
    /// `null` when the engine reported none.
    pub usage: Option<ChatUsage>,
}

/// `POST /v1/responses` without `stream`: a `response`.
#[derive(Debug, ToSchema)]
pub struct ResponseObject {
    /// `resp_<run id>`.
    pub id: String,
    /// `response`.
    pub object: String,
    pub created_at: u64,
    /// `completed`, `in_progress`, `failed`.
    pub status: String,
    pub error: Option<Value>,
    pub incomplete_details: Option<Value>,
    pub instructions: Option<String>,
    pub model: String,
    /// The assistant's message: `{"id", "type": "message", "status", "role", "content": [...]}`.
    pub output: Vec<Value>,
    pub parallel_tool_calls: bool,
    pub tool_choice: String,
    pub tools: Vec<Value>,
    pub metadata: Value,
    pub usage: Option<Value>,
}
