//! The `cron` tool: a native run schedules, inspects and stops its own
//! recurring work. A new job targets the session the run belongs to (so the
//! answers come back to the same chat, thread included), whatever session key
//! the model wrote.
//!
//! Every answer is a title line and the pretty JSON payload; the payload is
//! also the output's `details`. Refusals are error outputs with the message.

use async_trait::async_trait;
use serde_json::{json, Map, Value};

use super::input::{self, default_session, InputError};
use super::scheduler::{CronError, CronHandle};
use super::{agent_of, CronJob, DEFAULT_AGENT};
use crate::contain::ContainError;
use crate::tool::{Tool, ToolContext, ToolOutput, ToolSpec};

/// Every action, in the order the messages list them.
pub const ACTIONS: [&str; 10] =
    ["status", "list", "add", "update", "pause", "resume", "abort", "remove", "run", "runs"];

/// The runs `runs` answers with unless `limit` says otherwise.
const DEFAULT_RUNS_LIMIT: usize = 100;

/// The `cron` tool over the gateway's scheduler.
#[derive(Debug, Clone)]
pub struct CronTool {
    cron: CronHandle,
}

impl CronTool {
    pub fn new(cron: CronHandle) -> Self {
        CronTool { cron }
    }
}

#[async_trait]
impl Tool for CronTool {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "cron".to_owned(),
            description: "Schedule prompts that run later or repeatedly in this conversation, \
                          and list, change, pause, resume, run, abort or remove them. Schedules \
                          are 5-field cron expressions or shorthands such as `every 30m`, \
                          `daily at 9am`, `weekdays at 09:30`."
                .to_owned(),
            parameters: parameters(),
        }
    }

    async fn execute(&self, args: Value, ctx: ToolContext) -> ToolOutput {
        let empty = Map::new();
        let args = args.as_object().unwrap_or(&empty);
        match self.dispatch(args, &ctx).await {
            Ok((title, payload)) => ToolOutput::ok(
                format!("{title}\n{}", serde_json::to_string_pretty(&payload).unwrap_or_default()),
                payload,
            ),
            Err(message) => ToolOutput::error(message),
        }
    }
}

type Answer = Result<(&'static str, Value), String>;

fn string<'a>(args: &'a Map<String, Value>, names: &[&str]) -> Option<&'a str> {
    names
        .iter()
        .find_map(|name| args.get(*name).and_then(Value::as_str))
        .map(str::trim)
        .filter(|s| !s.is_empty())
}

/// The manager's errors in the tool's words.
fn say(error: CronError, action: &str) -> String {
    match error {
        CronError::NotFound { id } => format!("Cron job not found: {id}"),
        CronError::RunNotFound { .. } => "Cron run not found".to_owned(),
        CronError::RunNotActive { .. } => "Cron run is not active".to_owned(),
        CronError::Schedule { error, .. } => format!("Invalid schedule: {error}"),
        CronError::ShuttingDown => {
            "Cron scheduler is unavailable: the gateway is shutting down".to_owned()
        }
        other => format!("Failed to {action} cron job: {other}"),
    }
}

impl CronTool {
    async fn dispatch(&self, args: &Map<String, Value>, ctx: &ToolContext) -> Answer {
        let Some(action) =
            args.get("action").and_then(Value::as_str).map(str::trim).filter(|a| !a.is_empty())
        else {
            return Err("action is required".to_owned());
        };
        match action {
            "status" => self.status().await,
            "list" => self.list(args).await,
            "add" => self.add(args, ctx).await,
            "update" => self.update(args, ctx).await,
            "pause" => self.set_enabled(args, false).await,
            "resume" => self.set_enabled(args, true).await,
            "abort" => self.abort(args).await,
            "remove" => self.remove(args).await,
            "run" => self.run(args).await,
            "runs" => self.runs(args).await,
            other => Err(format!("Unknown action '{other}'. Supported: {}", ACTIONS.join(", "))),
        }
    }

    async fn status(&self) -> Answer {
        let status = self.cron.status().await.map_err(|e| say(e, "read"))?;
        Ok((
            "Cron status",
            json!({
                "enabled": true,
                "jobCount": status.job_count,
                "activeJobs": status.active_jobs,
                "nextRunAtMs": status.next_run_at_ms,
            }),
        ))
    }

    async fn list(&self, args: &Map<String, Value>) -> Answer {
        let include_disabled = ["includeDisabled", "include_disabled"]
            .iter()
            .find_map(|name| args.get(*name).and_then(Value::as_bool))
            .unwrap_or(false);
        let agent = string(args, &["agentId", "agent_id"]);
        let jobs: Vec<Value> = self
            .cron
            .list()
            .await
            .map_err(|e| say(e, "list"))?
            .iter()
            .filter(|job| include_disabled || job.enabled)
            .filter(|job| agent.is_none_or(|agent| job.agent_id == agent))
            .map(CronJob::to_json)
            .collect();
        Ok(("Cron jobs", json!({ "jobs": jobs })))
    }

    async fn add(&self, args: &Map<String, Value>, ctx: &ToolContext) -> Answer {
        let fields = args.get("job").and_then(Value::as_object).unwrap_or(args);
        let mut spec = input::spec_from_json(fields).map_err(|e| match e {
            InputError::Missing(field) => format!("{field} is required for action=add"),
            other => other.to_string(),
        })?;
        check_memory_file(spec.memory_file.as_deref(), ctx)?;
        let model_session = string(fields, &["sessionKey", "session_key"]).is_some();
        // The running session is preferred: the model's key may lack the thread.
        if !ctx.session_key.trim().is_empty() {
            spec.session_key = ctx.session_key.clone();
        } else if !model_session {
            spec.session_key = default_session(spec.agent_id.as_deref());
        }
        if spec.agent_id.is_none() {
            spec.agent_id = Some(agent_of(&spec.session_key).unwrap_or(DEFAULT_AGENT).to_owned());
        }
        let job = self.cron.add(spec).await.map_err(|e| say(e, "add"))?;
        Ok(("Cron job added", job.to_json()))
    }

    fn job_id<'a>(args: &'a Map<String, Value>, action: &str) -> Result<&'a str, String> {
        string(args, &["id", "jobId", "job_id"])
            .ok_or_else(|| format!("id (or jobId) is required for action={action}"))
    }

    async fn update(&self, args: &Map<String, Value>, ctx: &ToolContext) -> Answer {
        let id = Self::job_id(args, "update")?;
        let fields = args.get("patch").and_then(Value::as_object).unwrap_or(args);
        let patch = input::patch_from_json(fields).map_err(|e| e.to_string())?;
        check_memory_file(patch.memory_file.as_deref(), ctx)?;
        if patch.is_empty() {
            return Err("No update fields were provided".to_owned());
        }
        let job = self.cron.update(id, patch).await.map_err(|e| say(e, "update"))?;
        Ok((
            "Cron job updated",
            json!({ "id": job.id, "updated": true, "nextRunAtMs": job.next_run_at_ms }),
        ))
    }

    async fn set_enabled(&self, args: &Map<String, Value>, enabled: bool) -> Answer {
        let (action, title, flag) = if enabled {
            ("resume", "Cron job resumed", "resumed")
        } else {
            ("pause", "Cron job paused", "paused")
        };
        let id = Self::job_id(args, action)?;
        let patch = super::JobPatch { enabled: Some(enabled), ..super::JobPatch::default() };
        let job = self.cron.update(id, patch).await.map_err(|e| say(e, action))?;
        Ok((
            title,
            json!({ "id": job.id, flag: true, "enabled": job.enabled, "nextRunAtMs": job.next_run_at_ms }),
        ))
    }

    async fn abort(&self, args: &Map<String, Value>) -> Answer {
        let run_id = string(args, &["runId", "cronRunId", "run_id", "cron_run_id"])
            .ok_or_else(|| "runId (or cronRunId) is required".to_owned())?;
        let run = self.cron.abort(run_id).await.map_err(|e| say(e, "abort"))?;
        Ok((
            "Cron run aborted",
            json!({
                "aborted": true,
                "runId": run.id,
                "jobId": run.job_id,
                "status": run.status.as_str(),
                "routerRunId": run.router_run_id,
            }),
        ))
    }

    async fn remove(&self, args: &Map<String, Value>) -> Answer {
        let id = Self::job_id(args, "remove")?;
        let job = self.cron.remove(id).await.map_err(|e| say(e, "remove"))?;
        Ok(("Cron job removed", json!({ "removed": true, "id": job.id })))
    }

    async fn run(&self, args: &Map<String, Value>) -> Answer {
        let id = Self::job_id(args, "run")?;
        let run = self.cron.trigger(id).await.map_err(|e| say(e, "run"))?;
        Ok((
            "Cron job triggered",
            json!({ "triggered": true, "jobId": run.job_id, "runId": run.id }),
        ))
    }

    async fn runs(&self, args: &Map<String, Value>) -> Answer {
        let id = Self::job_id(args, "runs")?;
        let limit = args
            .get("limit")
            .and_then(Value::as_u64)
            .and_then(|n| usize::try_from(n).ok())
            .unwrap_or(DEFAULT_RUNS_LIMIT);
        let runs = self.cron.runs(id).await.map_err(|e| say(e, "read"))?;
        let runs: Vec<Value> = runs.iter().take(limit).map(super::CronRun::to_json).collect();
        Ok(("Cron runs", json!({ "jobId": id, "runs": runs })))
    }
}

/// The JSON schema of the arguments.
/// A job's `memoryFile` is a file its runs keep notes in: one in the
/// gateway's own state (its home, config, secrets) is refused, directly or
/// through a link, as the file tools would refuse it.
fn check_memory_file(path: Option<&str>, ctx: &ToolContext) -> Result<(), String> {
    let Some(path) = path.map(str::trim).filter(|p| !p.is_empty()) else { return Ok(()) };
    match ctx.reach().resolve(std::path::Path::new(path)) {
        Err(ContainError::OffLimits { .. }) => Err(format!(
            "memoryFile {path} is the gateway's own state (its home, config or secrets); choose a file in the working directory or the workspace"
        )),
        // A path elsewhere is for the job's own runs to judge, in their directory.
        _ => Ok(()),
    }
}

fn parameters() -> Value {
    let text = |description: &str| json!({ "type": "string", "description": description });
    let integer =
        |description: &str| json!({ "type": "integer", "minimum": 0, "description": description });
    json!({
        "type": "object",
        "properties": {
            "action": { "type": "string", "enum": ACTIONS, "description": "What to do." },
            "includeDisabled": { "type": "boolean", "description": "list: include paused jobs." },
            "id": text("The job (update, pause, resume, remove, run, runs)."),
            "jobId": text("Same as id."),
            "runId": text("The cron run to abort."),
            "cronRunId": text("Same as runId."),
            "name": text("add: the job's name (default: Cron <start of the prompt>)."),
            "schedule": text("5-field cron expression, or `every 30m`, `every 2h`, `daily at 9am`, `weekdays at 09:30`."),
            "prompt": text("The prompt each firing sends."),
            "memoryFile": text("A file the job keeps notes in."),
            "enabled": { "type": "boolean" },
            "timezone": text("IANA time zone of the schedule (default UTC)."),
            "jitterSec": integer("Fire up to this many seconds late, at random."),
            "timeoutMs": integer("Cancel a firing after this long (default 300000)."),
            "maxRetries": integer("Retries of a failed firing (default 0)."),
            "retryBackoffMs": integer("Wait before the first retry, doubled each time (default 30000)."),
            "agentId": text("The agent the job belongs to."),
            "sessionKey": text("Ignored when the conversation is known: jobs answer here."),
            "limit": integer("runs: how many (default 100)."),
            "meta": { "type": "object" },
            "job": { "type": "object", "description": "add: the fields as one object." },
            "patch": { "type": "object", "description": "update: the fields to change as one object." },
        },
        "required": ["action"],
    })
}

#[cfg(test)]
mod tests;
