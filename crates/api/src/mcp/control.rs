//! The control tools the API token opens: `run`, `status`, `cancel` and
//! `runs`. They take the control API's paths (`POST /v1/runs`, `GET
//! /v1/runs/{id}`, `POST /v1/runs/{id}/cancel`, `GET /v1/runs`), with the
//! same checks and the same words for what is refused.
//!
//! Every answer is one text block of JSON. A refused request, an unknown run
//! and a run that failed or was cancelled are results with `isError`.

use std::time::Duration;

use lemon_core::ids::SessionKey;
use lemon_core::router::{RouterHandle, Runs, Submitted};
use lemon_core::store::RunFilter;
use rmcp::model::{CallToolResult, ContentBlock, JsonObject};
use rmcp::service::RequestContext;
use rmcp::RoleServer;
use serde_json::{json, Map, Value};
use tokio_util::sync::CancellationToken;

use super::catalog::{argument_error, object};
use super::McpEndpoint;
use crate::api::runs::{cancel_run, refuse_unavailable, wait_for_run, CommandReply};
use crate::api::transfer::{
    parse_run_id, run_not_found, Run, SubmitBody, DEFAULT_LIST_LIMIT, MAX_LIST_LIMIT,
};
use crate::error::ApiError;

/// How long `run` waits for its run unless `timeout_ms` says otherwise: ten minutes.
pub(super) const DEFAULT_WAIT_MS: u64 = 600_000;
/// The longest `timeout_ms`: one hour.
pub(super) const MAX_WAIT_MS: u64 = 3_600_000;
/// The longest prompt a `runs` entry shows.
const PROMPT_PREVIEW_CHARS: usize = 200;

/// One control tool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Tool {
    Run,
    Status,
    Cancel,
    Runs,
}

impl Tool {
    pub(super) const ALL: [Tool; 4] = [Tool::Run, Tool::Status, Tool::Cancel, Tool::Runs];

    pub(super) fn name(self) -> &'static str {
        match self {
            Tool::Run => "run",
            Tool::Status => "status",
            Tool::Cancel => "cancel",
            Tool::Runs => "runs",
        }
    }

    pub(super) fn named(name: &str) -> Option<Tool> {
        Tool::ALL.into_iter().find(|tool| tool.name() == name)
    }

    pub(super) fn describe(self) -> rmcp::model::Tool {
        let run_id = json!({ "type": "string", "description": "The run's id (run_…)." });
        let (description, schema) = match self {
            Tool::Run => (
                "Starts a run on one of the gateway's engines (an AI agent such as Claude Code, Codex or the gateway's own) with a prompt and, unless wait is false, waits for its answer.",
                json!({
                    "type": "object",
                    "properties": {
                        "prompt": { "type": "string", "description": "What to ask." },
                        "engine": { "type": "string", "description": "The engine, with a model if it takes one (claude, codex, claude:opus); unset: the gateway's choice." },
                        "session_key": { "type": "string", "description": "The conversation to continue or start; unset: the session this client acts for (default)." },
                        "model": { "type": "string", "description": "The model to use, for engines that take one." },
                        "cwd": { "type": "string", "description": "An absolute path to an existing directory the engine works in; unset: the gateway's default." },
                        "wait": { "type": "boolean", "description": "Wait for the answer (default true); false answers with the run's id at once." },
                        "timeout_ms": { "type": "integer", "minimum": 1, "maximum": MAX_WAIT_MS, "description": "How long to wait for the answer (default 600000, ten minutes); then the run's id and state come back and the run goes on." },
                    },
                    "required": ["prompt"],
                }),
            ),
            Tool::Status => (
                "A run's state (queued, running, completed, failed, cancelled), its engine and its answer or error.",
                json!({ "type": "object", "properties": { "run_id": run_id }, "required": ["run_id"] }),
            ),
            Tool::Cancel => (
                "Cancels a queued or running run.",
                json!({ "type": "object", "properties": { "run_id": run_id }, "required": ["run_id"] }),
            ),
            Tool::Runs => (
                "Recent runs, newest first.",
                json!({
                    "type": "object",
                    "properties": {
                        "session_key": { "type": "string", "description": "Only the runs of this conversation." },
                        "limit": { "type": "integer", "minimum": 1, "maximum": MAX_LIST_LIMIT, "description": "At most this many runs (default 50)." },
                    },
                }),
            ),
        };
        rmcp::model::Tool::new(self.name(), description, object(schema))
    }
}

/// A bad argument, named.
struct BadArgument {
    name: &'static str,
    problem: &'static str,
}

/// The arguments of one call, read with the argument named in every refusal.
struct Args(Map<String, Value>);

impl Args {
    /// A string argument; blank counts as absent.
    fn string(&self, name: &'static str) -> Result<Option<String>, BadArgument> {
        match self.0.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(text)) => {
                Ok(Some(text.trim().to_owned()).filter(|text| !text.is_empty()))
            }
            Some(_) => Err(BadArgument { name, problem: "expected a string" }),
        }
    }

    fn required(&self, name: &'static str) -> Result<String, BadArgument> {
        self.string(name)?.ok_or(BadArgument { name, problem: "required, and must not be empty" })
    }

    fn boolean(&self, name: &'static str) -> Result<Option<bool>, BadArgument> {
        match self.0.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Bool(value)) => Ok(Some(*value)),
            Some(_) => Err(BadArgument { name, problem: "expected true or false" }),
        }
    }

    /// A whole number from 1 to `max`.
    fn count(
        &self,
        name: &'static str,
        max: u64,
        problem: &'static str,
    ) -> Result<Option<u64>, BadArgument> {
        match self.0.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(value) => match value.as_u64() {
                Some(n) if (1..=max).contains(&n) => Ok(Some(n)),
                _ => Err(BadArgument { name, problem }),
            },
        }
    }
}

/// The owner's call of a control tool.
pub(super) struct Control {
    router: RouterHandle,
    runs: Runs,
    /// The session the caller acts for: `run`'s default.
    session: SessionKey,
    /// Cancelled when the request is: `run` stops waiting (the run goes on).
    request: CancellationToken,
}

impl Control {
    pub(super) fn new(
        endpoint: &McpEndpoint,
        session: SessionKey,
        context: &RequestContext<RoleServer>,
    ) -> Self {
        Control {
            router: endpoint.router.clone(),
            runs: endpoint.router.query(),
            session,
            request: context.ct.clone(),
        }
    }

    pub(super) async fn call(&self, tool: Tool, arguments: Option<JsonObject>) -> CallToolResult {
        let args = Args(arguments.unwrap_or_default());
        let answer = match tool {
            Tool::Run => self.run(&args).await,
            Tool::Status => self.status(&args).await,
            Tool::Cancel => self.cancel(&args).await,
            Tool::Runs => self.list(&args).await,
        };
        match answer {
            Ok(Answer { body, failed }) => {
                let content = vec![ContentBlock::text(body.to_string())];
                if failed {
                    CallToolResult::error(content)
                } else {
                    CallToolResult::success(content)
                }
            }
            Err(Refusal::Argument(bad)) => argument_error(bad.name, bad.problem),
            Err(Refusal::Api(err)) => {
                if let ApiError::Internal(detail) | ApiError::StoreUnavailable(detail) = &err {
                    tracing::warn!(tool = tool.name(), error = %detail, "mcp control tool failed");
                }
                CallToolResult::error(vec![ContentBlock::text(err.to_string())])
            }
        }
    }

    async fn run(&self, args: &Args) -> Result<Answer, Refusal> {
        let prompt = args.required("prompt")?;
        let engine = args.string("engine")?;
        let session_key = args.string("session_key")?;
        let model = args.string("model")?;
        let cwd = args.string("cwd")?;
        let wait = args.boolean("wait")?.unwrap_or(true);
        let timeout_ms = args
            .count(
                "timeout_ms",
                MAX_WAIT_MS,
                "expected a whole number of milliseconds from 1 to 3600000",
            )?
            .unwrap_or(DEFAULT_WAIT_MS);
        let mut body = json!({
            "prompt": prompt,
            "session_key": session_key.unwrap_or_else(|| self.session.to_string()),
            "engine": engine,
            "cwd": cwd,
        });
        if let Some(model) = model {
            body["meta"] = json!({ "model": model });
        }
        // The same checks as `POST /v1/runs`, in its words.
        let body: SubmitBody = serde_json::from_value(body)
            .map_err(|err| ApiError::Internal(format!("the run tool's body: {err}")))?;
        let req = body.into_request()?;
        if let Some(engine) = &req.engine {
            refuse_unavailable(&self.runs, engine)?;
        }
        let (accepted, follower) = match self.router.submit(req).await.map_err(ApiError::from)? {
            Submitted::Run(accepted, follower) => (accepted, follower),
            Submitted::Command { command, reply } => {
                let body = json!(CommandReply::new(&command, reply));
                return Ok(Answer { body, failed: false });
            }
        };
        if !wait {
            let body = json!({
                "run_id": accepted.run_id.as_str(),
                "session_key": accepted.session_key.as_str(),
                "engine": accepted.engine,
                "status": "accepted",
            });
            return Ok(Answer { body, failed: false });
        }
        let waited = tokio::select! {
            finished = tokio::time::timeout(Duration::from_millis(timeout_ms), wait_for_run(&self.runs, follower)) => finished.ok(),
            () = self.request.cancelled() => None,
        };
        match waited {
            Some(finished) => Ok(Answer::of_run(&finished?)),
            None => {
                let run_id = accepted.run_id;
                let record = self.runs.get(&run_id).await.map_err(ApiError::from)?;
                let status = record.map(|record| record.status.as_str()).unwrap_or("queued");
                let body = json!({
                    "run_id": run_id.as_str(),
                    "session_key": accepted.session_key.as_str(),
                    "engine": accepted.engine,
                    "status": status,
                    "note": format!("still {status} after {timeout_ms} ms; ask status with its run_id for the answer"),
                });
                Ok(Answer { body, failed: false })
            }
        }
    }

    async fn status(&self, args: &Args) -> Result<Answer, Refusal> {
        let raw = args.required("run_id")?;
        let run_id = parse_run_id(&raw)?;
        let record = self
            .runs
            .get(&run_id)
            .await
            .map_err(ApiError::from)?
            .ok_or_else(|| run_not_found(&raw))?;
        Ok(Answer::of_run(&Run::of(&record, &self.runs)))
    }

    async fn cancel(&self, args: &Args) -> Result<Answer, Refusal> {
        let raw = args.required("run_id")?;
        let body = json!(cancel_run(&self.router, &self.runs, &raw).await?);
        Ok(Answer { body, failed: false })
    }

    async fn list(&self, args: &Args) -> Result<Answer, Refusal> {
        let session = match args.string("session_key")? {
            None => None,
            Some(raw) => {
                Some(SessionKey::parse(&raw).map_err(|err| ApiError::BadRequest(err.to_string()))?)
            }
        };
        let limit = args
            .count("limit", MAX_LIST_LIMIT as u64, "expected a whole number from 1 to 1000")?
            .map_or(DEFAULT_LIST_LIMIT, |n| n as usize);
        // A session's recent runs are found among the most recent of all.
        let wanted = if session.is_some() { MAX_LIST_LIMIT } else { limit };
        let filter = RunFilter { status: None, limit: wanted };
        let records = self.runs.list(filter).await.map_err(ApiError::from)?;
        let runs: Vec<Value> = records
            .iter()
            .filter(|record| session.as_ref().is_none_or(|key| record.session_key == key.as_str()))
            .take(limit)
            .map(|record| {
                json!({
                    "run_id": record.run_id,
                    "session_key": record.session_key,
                    "engine": record.engine,
                    "status": record.status.as_str(),
                    "prompt": preview(&record.prompt),
                    "created_at_ms": record.created_at_ms,
                    "completed_at_ms": record.completed_at_ms,
                })
            })
            .collect();
        Ok(Answer { body: json!({ "runs": runs }), failed: false })
    }
}

/// A control tool's answer; `failed` makes it an `isError` result.
struct Answer {
    body: Value,
    failed: bool,
}

impl Answer {
    /// A run's state and outcome, from the run as `GET /v1/runs/{id}` has it.
    fn of_run(run: &Run) -> Answer {
        let run = json!(run);
        let keys = [
            "run_id",
            "session_key",
            "engine",
            "status",
            "answer",
            "error",
            "error_code",
            "resume_line",
            "created_at_ms",
            "completed_at_ms",
            "duration_ms",
        ];
        let mut body = Map::new();
        for key in keys {
            if let Some(value) = run.get(key).filter(|value| !value.is_null()) {
                body.insert(key.to_owned(), value.clone());
            }
        }
        if let Some(files) =
            run.get("artifacts").and_then(Value::as_array).filter(|f| !f.is_empty())
        {
            body.insert("artifacts".to_owned(), Value::Array(files.clone()));
        }
        let failed = matches!(run["status"].as_str(), Some("failed" | "cancelled"));
        Answer { body: Value::Object(body), failed }
    }
}

/// Why a control tool refused a call.
enum Refusal {
    Argument(BadArgument),
    Api(ApiError),
}

impl From<BadArgument> for Refusal {
    fn from(bad: BadArgument) -> Self {
        Refusal::Argument(bad)
    }
}

impl From<ApiError> for Refusal {
    fn from(err: ApiError) -> Self {
        Refusal::Api(err)
    }
}

fn preview(text: &str) -> String {
    match text.char_indices().nth(PROMPT_PREVIEW_CHARS) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_owned(),
    }
}
