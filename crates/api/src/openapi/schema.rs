//! The shapes of the OpenAPI document that have no Rust type of their own in
//! this crate. Every other body is the type its handler reads or writes.
//!
//! - [`SseEvent`]: a stream is a sequence of Server-Sent Event frames, which
//!   axum writes from text; the frame's `data` is the event's JSON as text.
//! - [`NewCronJob`] and [`CronJobPatch`]: the cron routes hand the body, a
//!   JSON object, to the cron module's own reader, which the `cron` tool
//!   shares (camelCase keys and their snake_case spellings, its own words
//!   for what is refused).
//! - [`SandboxStatus`]: the server hands the API the sandbox's report as
//!   JSON; the sandbox lives in the engines crate, which this crate does not
//!   depend on.
//!
//! [`Error`] is not a shape of its own: it names [`crate::error::ErrorBody`]
//! for the components that merge routes in and describe their refusals.

use std::collections::BTreeMap;

use serde_json::Value;
use utoipa::ToSchema;

/// `{"error": "..."}`, the body of every refusal of the control API.
pub use crate::error::ErrorBody as Error;

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

/// `[gateway.sandbox]` as it holds on this kernel.
#[derive(Debug, ToSchema)]
pub struct SandboxStatus {
    /// `auto`, `required` or `off`.
    pub mode: String,
    /// The kernel's Landlock ABI; `null` without Landlock.
    #[schema(required = true)]
    pub landlock_abi: Option<u8>,
    /// Whether commands run contained.
    pub enforced: bool,
    /// One line saying what holds.
    pub detail: String,
}

/// The body of `POST /v1/cron` (the snake_case spellings are taken too).
#[derive(Debug, ToSchema)]
#[schema(rename_all = "camelCase")]
pub struct NewCronJob {
    /// A cron expression (`0 9 * * 1-5`) or `@every 10m`.
    pub schedule: String,
    /// What each run is asked (`message` is taken too).
    pub prompt: String,
    /// Unset: `Cron <the prompt's first 32 characters>`.
    pub name: Option<String>,
    /// Unset: the agent of the session key (`agent:<id>:…`), else `default`.
    pub agent_id: Option<String>,
    /// The session its runs go to.
    pub session_key: Option<String>,
    /// A file whose contents are added to each prompt.
    pub memory_file: Option<String>,
    /// An IANA time zone (`Europe/Paris`); unset: UTC.
    pub timezone: Option<String>,
    /// Unset: `true`.
    pub enabled: Option<bool>,
    /// Seconds of random delay added to each firing (at most 86400).
    pub jitter_sec: Option<u64>,
    /// A run still going after this long is cancelled (unset: 300000).
    pub timeout_ms: Option<u64>,
    /// Retries of a failed run (at most 100).
    pub max_retries: Option<u32>,
    /// The first retry waits this long, each next one twice as long (unset: 30000).
    pub retry_backoff_ms: Option<u64>,
    /// Kept with each run.
    pub meta: Option<BTreeMap<String, Value>>,
}

/// The body of `PATCH /v1/cron/{id}`: the fields to change, at least one.
#[derive(Debug, ToSchema)]
#[schema(rename_all = "camelCase")]
pub struct CronJobPatch {
    /// A cron expression (`0 9 * * 1-5`) or `@every 10m`.
    pub schedule: Option<String>,
    /// What each run is asked (`message` is taken too).
    pub prompt: Option<String>,
    pub name: Option<String>,
    /// The agent its runs belong to.
    pub agent_id: Option<String>,
    /// The session its runs go to.
    pub session_key: Option<String>,
    /// A file whose contents are added to each prompt.
    pub memory_file: Option<String>,
    /// An IANA time zone (`Europe/Paris`).
    pub timezone: Option<String>,
    /// `false` pauses the job.
    pub enabled: Option<bool>,
    /// Seconds of random delay added to each firing (at most 86400).
    pub jitter_sec: Option<u64>,
    /// A run still going after this long is cancelled.
    pub timeout_ms: Option<u64>,
    /// Retries of a failed run (at most 100).
    pub max_retries: Option<u32>,
    /// The first retry waits this long, each next one twice as long.
    pub retry_backoff_ms: Option<u64>,
    /// Kept with each run.
    pub meta: Option<BTreeMap<String, Value>>,
}
