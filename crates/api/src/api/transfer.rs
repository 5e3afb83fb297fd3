//! Transfer types of the control API's runs: request bodies in, runs out.

use std::collections::BTreeMap;
use std::path::PathBuf;

use lemon_core::budget::usage::RunSpend;
use lemon_core::bus::RunStatus;
use lemon_core::config::QueueMode;
use lemon_core::engine::{Completion, Field, ResumeToken};
use lemon_core::ids::{RunId, SessionKey};
use lemon_core::router::resolve::parse_engine_ref;
use lemon_core::router::{model_from_meta, Origin, RequestFlags, RouteError, RunRequest, Runs};
use lemon_core::store::{RunFilter, RunRecord};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::ApiError;
use crate::files::{FileSource, IncomingFile};

/// Runs listed when the caller gives no limit.
pub(crate) const DEFAULT_LIST_LIMIT: usize = 50;
/// The most runs one list returns.
pub(crate) const MAX_LIST_LIMIT: usize = 1000;

/// `POST /v1/runs` body.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
pub(crate) struct SubmitBody {
    /// What to ask; required, not blank.
    prompt: Option<String>,
    /// Unset: `default`.
    session_key: Option<String>,
    /// The engine, with a model if it takes one (`claude:opus`); unset: the router chooses.
    engine: Option<String>,
    /// An absolute path to an existing directory the engine runs in.
    #[schema(value_type = Option<String>)]
    cwd: Option<PathBuf>,
    /// Kept with the run; `disable_auto_resume`, `model` and the router's switches are read from it.
    meta: Option<BTreeMap<String, Value>>,
    /// 1 to 128 letters, digits, `_`, `-`, `:` or `.`; unset: generated. The same id again is the same run.
    run_id: Option<String>,
    /// `collect`, `followup`, `steer`, `steer-backlog`, `interrupt`.
    queue_mode: Option<String>,
    /// The engine session to continue.
    resume: Option<ResumeBody>,
    /// Files for the run: saved in its working directory (`.lemon/uploads/`
    /// unless `[gateway.files] uploads_dir` names another) before it starts,
    /// their paths added to the prompt. At most 16; each at most `[gateway.files]
    /// max_download_bytes`. One refused refuses the request.
    #[schema(max_items = 16)]
    attachments: Option<Vec<AttachmentBody>>,
    /// The tools the run may use: tool names or patterns where `*` matches
    /// any run of characters (`["bash", "github__*"]`), within the tools its
    /// project and binding allow; `[]`: none. Unset: all of those.
    #[schema(example = json!(["bash", "github__*"]))]
    tools: Option<Vec<String>>,
}

/// A file sent with a run: its content in base64 (`data`), or a URL the
/// gateway downloads (`url`, `http`, `https` or a base64 `data:` URL).
#[derive(Debug, Deserialize, utoipa::ToSchema)]
pub(super) struct AttachmentBody {
    /// The file's name, without a directory (`report.pdf`); required with
    /// `data`. With `url`, unset: the name the server gives, else the URL's.
    name: Option<String>,
    /// The media type (`application/pdf`); unset: from the name. Image bytes
    /// are recognised whatever is claimed.
    mime: Option<String>,
    /// The content, base64 (standard or URL-safe, padding optional).
    data: Option<String>,
    /// Where to download it from. A private or loopback address is refused
    /// unless `[gateway.files] allow_private_hosts` is on.
    url: Option<String>,
}

/// A resume token: the engine and its session id (`resume` of a submit
/// body, `resume` and `resumed_from` of a run).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub(crate) struct ResumeBody {
    /// The engine that holds the session (`claude`, `codex`).
    pub(crate) engine: String,
    /// The engine's session id.
    pub(crate) value: String,
}

impl From<&ResumeToken> for ResumeBody {
    fn from(token: &ResumeToken) -> Self {
        ResumeBody { engine: token.engine.clone(), value: token.value.clone() }
    }
}

impl SubmitBody {
    /// The files the body carries, checked for shape: each has either `data`
    /// (with a `name`) or `url`.
    pub(super) fn take_attachments(&mut self) -> Result<Vec<IncomingFile>, ApiError> {
        let items = self.attachments.take().unwrap_or_default();
        let mut files = Vec::with_capacity(items.len());
        for (index, item) in items.into_iter().enumerate() {
            let label = format!("attachments[{index}]");
            let source = match (item.data, item.url) {
                (Some(data), None) => {
                    if item.name.as_deref().is_none_or(|name| name.trim().is_empty()) {
                        return Err(ApiError::BadRequest(format!(
                            "{label}: name is required with data"
                        )));
                    }
                    FileSource::Base64(data)
                }
                (None, Some(url)) => FileSource::Url(url),
                (Some(_), Some(_)) => {
                    return Err(ApiError::BadRequest(format!(
                        "{label}: give either data or url, not both"
                    )))
                }
                (None, None) => {
                    return Err(ApiError::BadRequest(format!(
                        "{label}: give the file as data (base64) or url"
                    )))
                }
            };
            let mime = item.mime.filter(|mime| !mime.trim().is_empty());
            files.push(IncomingFile { label, name: item.name, mime, source });
        }
        Ok(files)
    }

    /// The request to submit; blank optional fields count as absent. The run id is
    /// always set (generated when the caller gave none) so the caller can subscribe
    /// to the run before submitting it. Without an engine the router chooses one.
    pub(crate) fn into_request(self) -> Result<RunRequest, ApiError> {
        let prompt = self.prompt.unwrap_or_default();
        if prompt.trim().is_empty() {
            return Err(ApiError::BadRequest(
                "prompt is required and must not be empty".to_owned(),
            ));
        }
        let run_id = match self.run_id.as_deref() {
            None => RunId::generate(),
            Some(raw) => RunId::parse(raw).ok_or_else(|| {
                ApiError::BadRequest(format!(
                    "invalid run_id {raw:?}: use 1 to 128 characters of letters, digits, '_', '-', ':' or '.'"
                ))
            })?,
        };
        let session_key = match non_blank(self.session_key) {
            None => SessionKey::from("default"),
            Some(raw) => {
                SessionKey::parse(&raw).map_err(|err| ApiError::BadRequest(err.to_string()))?
            }
        };
        let queue_mode = non_blank(self.queue_mode)
            .map(|raw| raw.parse::<QueueMode>())
            .transpose()
            .map_err(|err| ApiError::BadRequest(err.to_string()))?;
        let cwd = self.cwd.filter(|cwd| !cwd.as_os_str().is_empty());
        if let Some(cwd) = &cwd {
            check_cwd(cwd)?;
        }
        let resume = match self.resume {
            None => None,
            Some(ResumeBody { engine, value }) => {
                let (engine, value) = (engine.trim().to_owned(), value.trim().to_owned());
                if engine.is_empty() || value.is_empty() {
                    return Err(ApiError::BadRequest(
                        "resume needs a non-empty engine and value".to_owned(),
                    ));
                }
                Some(ResumeToken::new(engine, value))
            }
        };
        // `engine: invalid model for claude (it starts with '-')`
        let engine = non_blank(self.engine)
            .map(|raw| parse_engine_ref(raw.trim(), Field::Engine))
            .transpose()
            .map_err(|refusal| ApiError::BadRequest(RouteError::from(refusal).to_string()))?;
        let mut meta = self.meta.unwrap_or_default();
        // Set by the gateway alone, from `attachments`.
        meta.remove(lemon_core::media::META_KEY);
        // A filter the caller put in `meta` itself stays: every list narrows.
        if let Some(tools) = &self.tools {
            lemon_core::mcp::check_patterns(tools)
                .map_err(|why| ApiError::BadRequest(format!("tools: {why}")))?;
            lemon_core::mcp::ToolFilter::narrow_meta(&mut meta, tools);
        }
        Ok(RunRequest {
            origin: Origin::ControlPlane,
            session_key,
            agent_id: None,
            prompt,
            queue_mode,
            engine,
            resume,
            cwd,
            // The API takes the router's switches as `meta` keys; they stay in `meta`
            // too, so the run's record shows what the caller sent.
            model: model_from_meta(&meta),
            flags: RequestFlags::from_meta(&meta),
            meta,
            run_id: Some(run_id),
            channel: None,
        })
    }
}

impl From<RouteError> for ApiError {
    fn from(err: RouteError) -> Self {
        match err {
            RouteError::ShuttingDown => ApiError::ShuttingDown,
            unknown @ RouteError::UnknownEngine { .. } => ApiError::BadRequest(unknown.to_string()),
            RouteError::UnsupportedResumeEngine { message, .. } => ApiError::BadRequest(message),
            // `resume.value: invalid resume token for claude (it starts with '-')`
            invalid @ RouteError::Invalid { .. } => ApiError::BadRequest(invalid.to_string()),
            RouteError::Refused(err) => err.into(),
            RouteError::Journal(err) => ApiError::StoreUnavailable(err.to_string()),
            RouteError::RunIdConflict { .. } => ApiError::Conflict(err.to_string()),
            RouteError::CwdNotAllowed { .. } => ApiError::BadRequest(err.to_string()),
            RouteError::QueueFull { cap } => ApiError::QueueFull { cap },
        }
    }
}

/// A caller's working directory must be an absolute path to an existing
/// directory: a relative one would resolve against wherever the gateway was
/// started.
fn check_cwd(cwd: &std::path::Path) -> Result<(), ApiError> {
    if !cwd.is_absolute() {
        return Err(ApiError::BadRequest(format!(
            "invalid cwd {:?}: use an absolute path",
            cwd.display().to_string()
        )));
    }
    if !cwd.is_dir() {
        return Err(ApiError::BadRequest(format!(
            "invalid cwd {:?}: not an existing directory",
            cwd.display().to_string()
        )));
    }
    Ok(())
}

fn non_blank(value: Option<String>) -> Option<String> {
    value.map(|v| v.trim().to_owned()).filter(|v| !v.is_empty())
}

/// `POST /v1/runs` query.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(super) struct SubmitQuery {
    /// Answer with the finished run instead of `202`.
    #[param(value_type = Option<bool>)]
    wait: Option<String>,
}

impl SubmitQuery {
    /// Whether the caller wants the finished run instead of an acknowledgement.
    pub(super) fn wait(&self) -> Result<bool, ApiError> {
        match self.wait.as_deref() {
            None | Some("false" | "0") => Ok(false),
            Some("" | "true" | "1") => Ok(true),
            Some(other) => {
                Err(ApiError::BadRequest(format!("invalid wait {other:?}: expected true or false")))
            }
        }
    }
}

/// `GET /v1/runs` query.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(super) struct ListQuery {
    /// Only runs in this status.
    #[param(value_type = Option<RunStatusName>)]
    status: Option<String>,
    /// The most runs to list (50 unless given, at most 1000).
    #[param(value_type = Option<u64>)]
    limit: Option<String>,
}

impl ListQuery {
    pub(super) fn filter(&self) -> Result<RunFilter, ApiError> {
        let status = match self.status.as_deref().map(str::trim) {
            None | Some("") => None,
            Some(raw) => Some(RunStatus::parse(raw).ok_or_else(|| {
                ApiError::BadRequest(format!(
                    "invalid status {raw:?}: expected queued, running, completed, failed or cancelled"
                ))
            })?),
        };
        let limit = match self.limit.as_deref().map(str::trim) {
            None | Some("") => DEFAULT_LIST_LIMIT,
            Some(raw) => raw.parse::<usize>().map_err(|_| {
                ApiError::BadRequest(format!(
                    "invalid limit {raw:?}: expected a non-negative integer"
                ))
            })?,
        };
        Ok(RunFilter { status, limit: limit.min(MAX_LIST_LIMIT) })
    }
}

/// `POST /v1/runs/{id}/steer` body.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
pub(super) struct SteerBody {
    /// What to tell the running engine; required, not blank.
    text: Option<String>,
}

impl SteerBody {
    pub(super) fn text(self) -> Result<String, ApiError> {
        self.text.filter(|text| !text.trim().is_empty()).ok_or_else(|| {
            ApiError::BadRequest("text is required and must not be empty".to_owned())
        })
    }
}

/// A run id from the path; a malformed id names no run.
pub(crate) fn parse_run_id(raw: &str) -> Result<RunId, ApiError> {
    RunId::parse(raw).ok_or_else(|| run_not_found(raw))
}

pub(crate) fn run_not_found(run_id: &str) -> ApiError {
    ApiError::NotFound(format!("run {run_id} not found"))
}

/// Writes a completion seen on the bus into a stored run whose final write may
/// not have reached the store yet.
pub(super) fn apply_completion(
    record: &mut RunRecord,
    completion: &Completion,
    engine: &str,
    duration_ms: u64,
    completed_at_ms: i64,
) {
    record.status = RunStatus::of(completion);
    record.engine = engine.to_owned();
    record.answer = Some(completion.answer.clone());
    record.error = completion.error.as_ref().map(ToString::to_string);
    record.error_code = completion.error.as_ref().map(|e| e.code().to_owned());
    record.resume = completion.resume.clone();
    record.usage = completion.usage.clone();
    record.completed_at_ms = Some(completed_at_ms);
    record.duration_ms = Some(duration_ms);
}

// The fields of this and every response type of the API are in the order of
// their names: the bodies were JSON objects, whose keys serde_json writes
// sorted, so a client sees the same bytes as before they had types.
/// A run, as `GET /v1/runs/{id}` answers it.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub(crate) struct Run {
    /// The engine's answer, once it gave one.
    #[schema(required = true)]
    pub(crate) answer: Option<String>,
    /// The files sent with a finished run's answer (`GET /v1/runs/{id}` and
    /// `?wait=true` only; `[]` while it runs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) artifacts: Option<Vec<Artifact>>,
    /// Set once retention compacted the run's events (`[gateway.retention]
    /// events_days`): only its `run_completed` is left to replay.
    #[schema(required = true)]
    pub(crate) compacted: Option<Compacted>,
    /// When it finished (ms since the epoch).
    #[schema(required = true)]
    pub(crate) completed_at_ms: Option<i64>,
    /// When it was accepted (ms since the epoch).
    pub(crate) created_at_ms: i64,
    /// How long it ran.
    #[schema(required = true)]
    pub(crate) duration_ms: Option<u64>,
    /// The engine it runs on (`claude`, `claude:opus`).
    pub(crate) engine: String,
    /// Why it failed, for a person.
    #[schema(required = true)]
    pub(crate) error: Option<String>,
    /// Why it failed, for a program: `timeout`, `engine_exited`, `cancelled`…
    #[schema(required = true)]
    pub(crate) error_code: Option<String>,
    /// What the caller sent as `meta`.
    pub(crate) meta: Value,
    /// What was asked.
    pub(crate) prompt: String,
    /// The session to continue after it: the token its engine reported.
    #[schema(required = true)]
    pub(crate) resume: Option<ResumeBody>,
    /// The line a user pastes to continue the session.
    #[schema(required = true)]
    pub(crate) resume_line: Option<String>,
    /// The session the run continued (the token it started with).
    #[schema(required = true)]
    pub(crate) resumed_from: Option<ResumeBody>,
    pub(crate) run_id: String,
    pub(crate) session_key: String,
    /// What the run spent, normalised.
    pub(crate) spend: Spend,
    /// When its engine started (ms since the epoch).
    #[schema(required = true)]
    pub(crate) started_at_ms: Option<i64>,
    pub(crate) status: RunStatusName,
    /// Where the run's outside text came from (`webhook ci`, `email from
    /// ann@example.com`); `null` for the owner's own words.
    #[schema(required = true)]
    pub(crate) untrusted: Option<String>,
    /// The engine's own usage report, as it gave it.
    pub(crate) usage: Value,
}

impl Run {
    /// `record` as the API shows it, without its artifacts (the routes that
    /// show them add them).
    pub(crate) fn of(record: &RunRecord, runs: &Runs) -> Run {
        Run {
            answer: record.answer.clone(),
            artifacts: None,
            compacted: record.compacted.as_ref().map(Compacted::from),
            completed_at_ms: record.completed_at_ms,
            created_at_ms: record.created_at_ms,
            duration_ms: record.duration_ms,
            engine: record.engine.clone(),
            error: record.error.clone(),
            error_code: record.error_code.clone(),
            meta: record.meta.clone(),
            prompt: record.prompt.clone(),
            resume: record.resume.as_ref().map(ResumeBody::from),
            resume_line: record.resume.as_ref().map(|token| resume_line(token, runs)),
            resumed_from: record.resumed_from.as_ref().map(ResumeBody::from),
            run_id: record.run_id.clone(),
            session_key: record.session_key.as_str().to_owned(),
            spend: Spend::from(&record.spend),
            started_at_ms: record.started_at_ms,
            status: record.status.into(),
            untrusted: lemon_core::untrusted::source_in(&record.meta),
            usage: record.usage.clone(),
        }
    }
}

/// A run's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
#[schema(as = RunStatus)]
pub(crate) enum RunStatusName {
    Queued,
    Running,
    /// Cancelled while running, and waiting for its engine to let go.
    Cancelling,
    Completed,
    Failed,
    Cancelled,
}

impl From<RunStatus> for RunStatusName {
    fn from(status: RunStatus) -> Self {
        match status {
            RunStatus::Queued => RunStatusName::Queued,
            RunStatus::Running => RunStatusName::Running,
            RunStatus::Cancelling => RunStatusName::Cancelling,
            RunStatus::Completed => RunStatusName::Completed,
            RunStatus::Failed => RunStatusName::Failed,
            RunStatus::Cancelled => RunStatusName::Cancelled,
        }
    }
}

/// What a run spent, normalised: tokens and US dollars.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, utoipa::ToSchema)]
pub(crate) struct Spend {
    /// Prompt tokens read from the engine's cache.
    pub(crate) cache_read_tokens: u64,
    /// Prompt tokens written to the engine's cache.
    pub(crate) cache_write_tokens: u64,
    /// Prompt tokens, cache traffic left out.
    pub(crate) input_tokens: u64,
    /// Tokens of the answer.
    pub(crate) output_tokens: u64,
    /// US dollars: the engine's own figure when it reports one, else priced
    /// from `[gateway.budgets.prices]`, else 0.
    pub(crate) usd: f64,
}

impl From<&RunSpend> for Spend {
    fn from(spend: &RunSpend) -> Self {
        Spend {
            cache_read_tokens: spend.cache_read_tokens,
            cache_write_tokens: spend.cache_write_tokens,
            input_tokens: spend.input_tokens,
            output_tokens: spend.output_tokens,
            usd: spend.usd,
        }
    }
}

/// What compaction kept of a run's events.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub(crate) struct Compacted {
    /// Its completed actions, each `{kind, title, ok, message}`.
    #[schema(value_type = Vec<Object>)]
    pub(crate) actions: Vec<Value>,
    /// When (ms since the epoch).
    pub(crate) at_ms: i64,
    /// How many events the run had.
    pub(crate) events: u64,
}

impl From<&lemon_core::store::Compacted> for Compacted {
    fn from(compacted: &lemon_core::store::Compacted) -> Self {
        Compacted {
            actions: compacted.actions.clone(),
            at_ms: compacted.at_ms,
            events: compacted.events,
        }
    }
}

/// A file sent with a run's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub(crate) struct Artifact {
    /// What the run said about it.
    #[schema(required = true)]
    pub(crate) caption: Option<String>,
    /// The name the recipient sees.
    pub(crate) filename: String,
    /// The media type its extension suggests (`application/octet-stream` otherwise).
    pub(crate) mime: String,
    /// The file, absolute, inside the run's directory or the workspace.
    pub(crate) path: String,
    /// Bytes.
    pub(crate) size: u64,
}

impl From<&lemon_core::artifacts::Artifact> for Artifact {
    fn from(artifact: &lemon_core::artifacts::Artifact) -> Self {
        Artifact {
            caption: artifact.caption.clone(),
            filename: artifact.filename.clone(),
            mime: artifact.mime().to_owned(),
            path: artifact.path.to_string_lossy().into_owned(),
            size: artifact.size,
        }
    }
}

/// The line a user pastes to continue the session, in the engine's own format
/// without the surrounding backticks.
fn resume_line(token: &ResumeToken, runs: &Runs) -> String {
    runs.format_resume(token).trim_matches('`').to_owned()
}

#[cfg(test)]
mod tests;
