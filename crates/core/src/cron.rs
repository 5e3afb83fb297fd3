//! Scheduled prompts: jobs that submit a prompt through the router on a
//! schedule, in the job's session, so the answer goes wherever that session
//! lives (a Telegram chat, a webhook callback).
//!
//! # Layout
//! - [`schedule`]: cron expressions and shorthands, next firing in a time zone.
//! - this file: the job and run records ([`CronJob`], [`CronRun`]) and their one
//!   JSON form ([`CronJob::to_json`], [`CronRun::to_json`]), what a new job or an
//!   edit carries ([`JobSpec`], [`JobPatch`]).
//! - [`input`]: jobs and edits from the JSON of the API and the tool.
//! - [`jobs`]: the records in the store (`kv` namespaces `cron_jobs` and
//!   `cron_runs:<job id>`).
//! - [`scheduler`]: the actor that fires due jobs, with timeout, retries and
//!   jitter, and the [`CronHandle`] the API, the config sync and the tool use.
//! - [`tool`]: the `cron` tool a native run calls to manage its own jobs.

pub mod input;
pub mod jobs;
pub mod schedule;
pub mod scheduler;
pub mod tool;

use serde::{Deserialize, Serialize};

use crate::ids::SessionKey;
pub use schedule::{parse_timezone, Schedule, ScheduleError};
pub use scheduler::{CronDeps, CronError, CronHandle, CronStatus, SystemClock, WallClock};

/// A run is cancelled after this long unless the job says otherwise (5 minutes).
pub const DEFAULT_TIMEOUT_MS: u64 = 300_000;
/// The first retry waits this long, each next one twice as long (30 seconds).
pub const DEFAULT_RETRY_BACKOFF_MS: u64 = 30_000;
/// The zone of jobs that name none.
pub const DEFAULT_TIMEZONE: &str = "UTC";
/// The agent of jobs that name none and whose session names none.
pub const DEFAULT_AGENT: &str = "default";
/// A run's outcome is kept up to this many characters.
pub const OUTPUT_LIMIT: usize = 500;
/// The runs kept per job unless `[gateway.retention] cron_runs_kept` says
/// otherwise; older ones are dropped.
pub const RUNS_KEPT: usize = 100;
/// Largest jitter, retry count and durations a job may ask for.
pub const MAX_JITTER_SEC: u64 = 86_400;
/// See [`MAX_JITTER_SEC`].
pub const MAX_RETRIES: u32 = 100;
/// See [`MAX_JITTER_SEC`]: 30 days.
pub const MAX_DURATION_MS: u64 = 30 * 24 * 60 * 60 * 1000;

/// Where a job was defined: a config job is kept in step with `config.toml`
/// (by its name) and removed when the file no longer has it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum JobSource {
    #[default]
    Api,
    Config,
}

impl JobSource {
    pub fn as_str(self) -> &'static str {
        match self {
            JobSource::Api => "api",
            JobSource::Config => "config",
        }
    }
}

/// A scheduled job, as stored (`kv` namespace `cron_jobs`, key = id).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CronJob {
    pub id: String,
    pub name: String,
    /// The normalised cron expression ([`Schedule::expr`]).
    pub schedule: String,
    pub prompt: String,
    pub session_key: String,
    pub agent_id: String,
    #[serde(default)]
    pub memory_file: Option<String>,
    pub timezone: String,
    pub enabled: bool,
    pub jitter_sec: u64,
    pub timeout_ms: u64,
    pub max_retries: u32,
    pub retry_backoff_ms: u64,
    #[serde(default)]
    pub meta: serde_json::Value,
    #[serde(default)]
    pub source: JobSource,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
    #[serde(default)]
    pub last_run_at_ms: Option<i64>,
    /// When it fires next (jitter included); `None` when disabled.
    #[serde(default)]
    pub next_run_at_ms: Option<i64>,
}

impl CronJob {
    /// The job's one JSON form, for the API and the tool (camelCase keys).
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "id": self.id,
            "name": self.name,
            "schedule": self.schedule,
            "enabled": self.enabled,
            "agentId": self.agent_id,
            "sessionKey": self.session_key,
            "prompt": self.prompt,
            "memoryFile": self.memory_file,
            "timezone": self.timezone,
            "jitterSec": self.jitter_sec,
            "timeoutMs": self.timeout_ms,
            "maxRetries": self.max_retries,
            "retryBackoffMs": self.retry_backoff_ms,
            "meta": self.meta,
            "source": self.source.as_str(),
            "createdAtMs": self.created_at_ms,
            "updatedAtMs": self.updated_at_ms,
            "lastRunAtMs": self.last_run_at_ms,
            "nextRunAtMs": self.next_run_at_ms,
        })
    }
}

/// How a run of a job went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CronRunStatus {
    /// Submitted to the router, not finished.
    Running,
    /// Failed, waiting for its next attempt.
    Retrying,
    Succeeded,
    Failed,
    /// Cancelled after the job's `timeout_ms`.
    TimedOut,
    /// Stopped with the tool's `abort`.
    Aborted,
}

impl CronRunStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            CronRunStatus::Running => "running",
            CronRunStatus::Retrying => "retrying",
            CronRunStatus::Succeeded => "succeeded",
            CronRunStatus::Failed => "failed",
            CronRunStatus::TimedOut => "timed_out",
            CronRunStatus::Aborted => "aborted",
        }
    }

    /// Still going (running or waiting for a retry).
    pub fn is_active(self) -> bool {
        matches!(self, CronRunStatus::Running | CronRunStatus::Retrying)
    }
}

/// What started a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Trigger {
    Schedule,
    /// `POST /v1/cron/{id}/run` or the tool's `run`.
    Manual,
}

/// One firing of a job, as stored (`kv` namespace `cron_runs:<job id>`, key = id).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CronRun {
    /// Time-ordered, so the store lists a job's runs oldest first.
    pub id: String,
    pub job_id: String,
    /// The router's run of the latest attempt.
    pub router_run_id: Option<String>,
    pub status: CronRunStatus,
    pub trigger: Trigger,
    /// 1 for the first attempt.
    pub attempt: u32,
    pub started_at_ms: i64,
    pub ended_at_ms: Option<i64>,
    /// The answer or the error, cut to [`OUTPUT_LIMIT`] characters.
    pub output: Option<String>,
}

impl CronRun {
    /// The run's one JSON form, for the API and the tool.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "id": self.id,
            "jobId": self.job_id,
            "routerRunId": self.router_run_id,
            "status": self.status.as_str(),
            "trigger": self.trigger,
            "attempt": self.attempt,
            "startedAtMs": self.started_at_ms,
            "endedAtMs": self.ended_at_ms,
            "output": self.output,
        })
    }
}

/// A new job: what the API, the tool and `[[gateway.cron]]` give. Unset fields
/// take the defaults ([`DEFAULT_TIMEOUT_MS`], [`DEFAULT_TIMEZONE`]…).
#[derive(Debug, Clone, PartialEq)]
pub struct JobSpec {
    /// Unset: `Cron <first 32 characters of the prompt>`.
    pub name: Option<String>,
    pub schedule: String,
    pub prompt: String,
    pub session_key: SessionKey,
    /// Unset: the agent of the session key (`agent:<id>:…`), else `default`.
    pub agent_id: Option<String>,
    pub memory_file: Option<String>,
    pub timezone: Option<String>,
    pub enabled: Option<bool>,
    pub jitter_sec: Option<u64>,
    pub timeout_ms: Option<u64>,
    pub max_retries: Option<u32>,
    pub retry_backoff_ms: Option<u64>,
    pub meta: Option<serde_json::Value>,
}

/// An edit of a job: each set field replaces the job's.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct JobPatch {
    pub name: Option<String>,
    pub schedule: Option<String>,
    pub prompt: Option<String>,
    pub session_key: Option<SessionKey>,
    pub agent_id: Option<String>,
    pub memory_file: Option<String>,
    pub timezone: Option<String>,
    pub enabled: Option<bool>,
    pub jitter_sec: Option<u64>,
    pub timeout_ms: Option<u64>,
    pub max_retries: Option<u32>,
    pub retry_backoff_ms: Option<u64>,
    pub meta: Option<serde_json::Value>,
}

impl JobSpec {
    /// A job with its defaults: `prompt` in `session_key` on `schedule`.
    pub fn new(
        schedule: impl Into<String>,
        prompt: impl Into<String>,
        session_key: SessionKey,
    ) -> Self {
        JobSpec {
            name: None,
            schedule: schedule.into(),
            prompt: prompt.into(),
            session_key,
            agent_id: None,
            memory_file: None,
            timezone: None,
            enabled: None,
            jitter_sec: None,
            timeout_ms: None,
            max_retries: None,
            retry_backoff_ms: None,
            meta: None,
        }
    }
}

impl JobPatch {
    /// Whether it changes nothing.
    pub fn is_empty(&self) -> bool {
        *self == JobPatch::default()
    }
}

/// The agent named by a session key `agent:<id>:…`.
pub fn agent_of(session_key: &str) -> Option<&str> {
    let rest = session_key.strip_prefix("agent:")?;
    rest.split(':').next().filter(|agent| !agent.is_empty())
}

/// `text` cut to `limit` characters, with `…` when cut.
pub fn truncate(text: &str, limit: usize) -> String {
    match text.char_indices().nth(limit) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_owned(),
    }
}

#[cfg(test)]
mod tests;
