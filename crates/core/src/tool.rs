//! The tool contract: what the native engine's built-in tools (`bash`, `read`,
//! `edit`…) and the gateway's tools (`cron`, `sms_*`, `telegram_send_image`…)
//! implement, and the [`ToolRegistry`] the gateway tools are registered in.
//!
//! A tool never fails by panicking or by returning `Err`: a refusal, a bad
//! argument or a failed command is a [`ToolOutput`] with `is_error` set, which
//! the model reads and can act on.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};

use async_trait::async_trait;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::contain::{OffLimits, Reach};
use crate::ids::{RunId, SessionKey};

/// What the model is told about a tool.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSpec {
    /// Unique among the tools of a run: `[a-z0-9_]+` for the built-in and
    /// gateway tools; an MCP server's tools are `<server>__<tool>`, with
    /// `A-Z` and `-` as the server gives them ([`crate::mcp::check_tool`]).
    pub name: String,
    pub description: String,
    /// A JSON schema of the arguments object.
    pub parameters: serde_json::Value,
}

/// Where and for whom a tool call runs.
#[derive(Debug, Clone)]
pub struct ToolContext {
    pub run_id: RunId,
    pub session_key: SessionKey,
    /// The model's id for this call.
    pub call_id: String,
    /// The run's working directory; file tools stay inside it or `workspace`.
    pub cwd: PathBuf,
    /// The gateway's workspace directory, when one is configured.
    pub workspace: Option<PathBuf>,
    /// The gateway's own state, out of every tool's reach whatever `cwd` is.
    pub off_limits: OffLimits,
    /// Cancelled when the run is cancelled: a tool stops at once (a command's
    /// process group is killed) and returns.
    pub cancel: CancellationToken,
}

impl ToolContext {
    /// Where this call's file work may go: `cwd`, then the workspace, less
    /// the gateway's state.
    pub fn reach(&self) -> Reach {
        let roots = std::iter::once(self.cwd.clone()).chain(self.workspace.clone());
        Reach::new(roots, self.off_limits.clone())
    }
}

/// The result of one tool call.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ToolOutput {
    /// What the model reads.
    pub text: String,
    /// Structured result for events and channels (`auto_send_files` here asks
    /// the channel to deliver files); `Null` when there is none.
    pub details: serde_json::Value,
    pub is_error: bool,
    /// Safe failure fields for users and APIs (`error_type`, `timeout_ms`,
    /// `exit_code`); `Null` when there is none. Becomes the action's `result_meta`.
    pub result_meta: serde_json::Value,
}

impl ToolOutput {
    pub fn ok(text: impl Into<String>, details: serde_json::Value) -> Self {
        ToolOutput { text: text.into(), details, ..ToolOutput::default() }
    }

    /// Fills `done`, the completed action of a call of tool `name` that
    /// gave this output, as every surface shows a call: ok, a preview of
    /// the text, the tool's details at the top of `detail`
    /// (`auto_send_files` among them, which the run's channel sends), and
    /// `result_meta`.
    pub fn complete(&self, done: &mut crate::engine::Action, name: &str) {
        done.ok = Some(!self.is_error);
        done.message = Some(preview(&self.text));
        let mut detail = serde_json::Map::new();
        detail.insert("name".to_owned(), serde_json::Value::String(name.to_owned()));
        match &self.details {
            serde_json::Value::Object(fields) => {
                for (key, value) in fields {
                    detail.entry(key.clone()).or_insert_with(|| value.clone());
                }
            }
            serde_json::Value::Null => {}
            other => {
                detail.insert("details".to_owned(), other.clone());
            }
        }
        done.detail = serde_json::Value::Object(detail);
        done.result_meta = self.result_meta.clone();
    }

    pub fn error(text: impl Into<String>) -> Self {
        ToolOutput {
            text: text.into(),
            details: serde_json::json!({ "error": true }),
            is_error: true,
            result_meta: serde_json::Value::Null,
        }
    }
}

/// The most characters of a result an action's message shows.
pub const PREVIEW_CHARS: usize = 500;

/// At most [`PREVIEW_CHARS`] characters of `text`, with `…` when cut.
pub fn preview(text: &str) -> String {
    match text.char_indices().nth(PREVIEW_CHARS) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_owned(),
    }
}

/// A tool the model can call.
#[async_trait]
pub trait Tool: Send + Sync + fmt::Debug + 'static {
    fn spec(&self) -> ToolSpec;

    /// Whether runs of `session` are offered this tool (`telegram_send_image`
    /// only in Telegram sessions, say). All sessions by default.
    fn offered(&self, _session: &SessionKey) -> bool {
        true
    }

    /// Runs one call with the model's `args` (already parsed JSON, not checked
    /// against the schema: the tool checks what it reads).
    async fn execute(&self, args: serde_json::Value, ctx: ToolContext) -> ToolOutput;
}

/// The gateway's tools, by name, shared by clones: the server registers them
/// after it has built what they use (the cron scheduler, the SMS inbox), and the
/// native engine reads the table at every run's start.
#[derive(Debug, Clone)]
pub struct ToolRegistry {
    tools: Arc<RwLock<BTreeMap<String, Arc<dyn Tool>>>>,
    /// The table's version, bumped by every [`ToolRegistry::register`]: what
    /// shows the table to someone (the MCP endpoint's sessions) follows it
    /// with [`ToolRegistry::changes`].
    version: Arc<watch::Sender<u64>>,
}

impl Default for ToolRegistry {
    fn default() -> Self {
        ToolRegistry { tools: Arc::default(), version: Arc::new(watch::Sender::new(0)) }
    }
}

impl ToolRegistry {
    pub fn new() -> Self {
        ToolRegistry::default()
    }

    /// Adds `tool`, replacing one of the same name.
    pub fn register(&self, tool: Arc<dyn Tool>) {
        let name = tool.spec().name;
        self.tools.write().unwrap_or_else(|e| e.into_inner()).insert(name, tool);
        self.version.send_modify(|version| *version += 1);
    }

    /// The table's version, changed whenever a tool is registered; a receiver
    /// sees the version current when it was made as already seen.
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.version.subscribe()
    }

    pub fn get(&self, name: &str) -> Option<Arc<dyn Tool>> {
        self.tools.read().unwrap_or_else(|e| e.into_inner()).get(name).cloned()
    }

    /// Every registered tool, in name order.
    pub fn list(&self) -> Vec<Arc<dyn Tool>> {
        self.tools.read().unwrap_or_else(|e| e.into_inner()).values().cloned().collect()
    }
}
