//! One call of a gateway tool over MCP: the [`ToolContext`] it runs with,
//! and its output as an MCP result.
//!
//! - For a run: the run's id, session and directory, so `cron` schedules in
//!   the run's chat, `telegram_send_image` sends to it and
//!   `sms_wait_for_code` waits for the run. The call shows in the run's
//!   events as a tool action, and the files its result queues
//!   (`auto_send_files`) go with the run's answer. It is cancelled when the
//!   request is, or when the run ends.
//! - For the owner (the API token): the session the request names, the
//!   directory a run of the gateway would work in, a call id of its own. No
//!   run delivers files for it, so a result that queues files says so as an
//!   error.
//!
//! Every call works in the gateway's workspace too and never reaches the
//! gateway's own state.

use std::sync::Arc;

use lemon_core::approvals::TokenRun;
use lemon_core::engine::{Action, ActionKind, ActionPhase, EngineEvent};
use lemon_core::ids::{RunId, SessionKey};
use lemon_core::tool::{Tool, ToolContext, ToolOutput};
use rmcp::model::{CallToolResult, ContentBlock, JsonObject};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::McpEndpoint;

/// The files a tool's result asks its run's channel to send (see
/// [`lemon_core::artifacts`]).
const SEND_FILES_KEY: &str = "auto_send_files";

/// A call about to run: its context, and where it reports.
pub(super) struct Call {
    ctx: ToolContext,
    /// The run's token, for its events; `None` for the owner.
    run_token: Option<Arc<str>>,
    /// Cancelled when the request is cancelled.
    request: CancellationToken,
    /// Cancelled when the run ends; never for the owner.
    ended: CancellationToken,
}

impl Call {
    /// A call of the run holding `token`.
    ///
    /// # Errors
    /// An invalid-request error once the token is withdrawn, an internal
    /// error when the gateway shuts down.
    pub(super) async fn for_run(
        endpoint: &McpEndpoint,
        token: &Arc<str>,
        run: TokenRun,
        context: &RequestContext<RoleServer>,
    ) -> Result<Call, McpError> {
        let ended = endpoint
            .gate
            .ended(token)
            .ok_or_else(|| McpError::invalid_request("unknown or expired run token", None))?;
        let off_limits = off_limits(endpoint).await?;
        let run_id = RunId::parse(&run.run_id).unwrap_or_else(RunId::generate);
        let ctx = ToolContext {
            run_id,
            session_key: SessionKey::from(run.session_key),
            call_id: call_id(),
            cwd: run.cwd,
            workspace: endpoint.workspace.clone(),
            off_limits,
            cancel: CancellationToken::new(),
        };
        Ok(Call { ctx, run_token: Some(token.clone()), request: context.ct.clone(), ended })
    }

    /// A call of the owner, acting for `session`.
    ///
    /// # Errors
    /// An internal error when the gateway shuts down.
    pub(super) async fn for_owner(
        endpoint: &McpEndpoint,
        session: SessionKey,
        context: &RequestContext<RoleServer>,
    ) -> Result<Call, McpError> {
        let off_limits = off_limits(endpoint).await?;
        let id = call_id();
        // Where a run of the gateway would work now; the workspace when no
        // directory is allowed (the call's file work is refused there too
        // unless the workspace holds it).
        let cwd = match endpoint.router.run_dir(None).await {
            Ok(dir) => Some(dir),
            Err(_) => endpoint.workspace.clone(),
        };
        let ctx = ToolContext {
            run_id: RunId::parse(&id).unwrap_or_else(RunId::generate),
            session_key: session,
            call_id: id,
            cwd: cwd.unwrap_or_default(),
            workspace: endpoint.workspace.clone(),
            off_limits,
            cancel: CancellationToken::new(),
        };
        let ended = CancellationToken::new();
        Ok(Call { ctx, run_token: None, request: context.ct.clone(), ended })
    }

    /// Runs `tool` with `arguments`; its output as an MCP result.
    pub(super) async fn execute(
        self,
        tool: Arc<dyn Tool>,
        arguments: Option<JsonObject>,
        endpoint: &McpEndpoint,
    ) -> CallToolResult {
        let name = tool.spec().name;
        let action_id = format!("tool_{}", self.ctx.call_id);
        let args = Value::Object(arguments.unwrap_or_default());
        if let Some(token) = &self.run_token {
            let mut started = action(&action_id, &name, ActionPhase::Started);
            started.detail = serde_json::json!({ "name": name, "input": args, "via": "mcp" });
            let _ = endpoint.gate.report(token, EngineEvent::Action(started)).await;
        }
        let cancel = self.ctx.cancel.clone();
        let execution = tool.execute(args, self.ctx.clone());
        tokio::pin!(execution);
        let output = tokio::select! {
            output = &mut execution => output,
            () = async {
                tokio::select! {
                    () = self.request.cancelled() => {}
                    () = self.ended.cancelled() => {}
                }
            } => {
                // The tool stops at once and returns what it has.
                cancel.cancel();
                execution.await
            }
        };
        match &self.run_token {
            Some(token) => {
                let done = completed_action(&action_id, &name, &output);
                let _ = endpoint.gate.report(token, EngineEvent::Action(done)).await;
                result(output)
            }
            None if queues_files(&output) => error_result(&format!(
                "{name} queues files to send with a run's answer, and this call belongs to no run: ask a run to do it (the run tool)"
            )),
            None => result(output),
        }
    }
}

/// The gateway's own state, which no call reaches.
async fn off_limits(endpoint: &McpEndpoint) -> Result<lemon_core::contain::OffLimits, McpError> {
    endpoint
        .router
        .off_limits()
        .await
        .map_err(|_| McpError::internal_error("the gateway is shutting down", None))
}

/// An id for one call over MCP.
fn call_id() -> String {
    format!("mcp_{}", uuid::Uuid::new_v4().simple())
}

fn queues_files(output: &ToolOutput) -> bool {
    output.details.get(SEND_FILES_KEY).and_then(Value::as_array).is_some_and(|f| !f.is_empty())
}

/// The tool's output as MCP reads it: its text, `isError` when it failed.
fn result(output: ToolOutput) -> CallToolResult {
    let content = vec![ContentBlock::text(output.text)];
    if output.is_error {
        CallToolResult::error(content)
    } else {
        CallToolResult::success(content)
    }
}

fn error_result(text: &str) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(text)])
}

fn action(id: &str, name: &str, phase: ActionPhase) -> Action {
    Action {
        id: id.to_owned(),
        kind: ActionKind::Tool,
        title: name.to_owned(),
        detail: Value::Null,
        phase,
        ok: None,
        message: None,
        level: None,
        result_meta: Value::Null,
    }
}

/// The completed action of a call, as a native call's
/// ([`ToolOutput::complete`]).
fn completed_action(id: &str, name: &str, output: &ToolOutput) -> Action {
    let mut done = action(id, name, ActionPhase::Completed);
    output.complete(&mut done, name);
    done
}
