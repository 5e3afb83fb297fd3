//! The gateway's MCP endpoint, `/mcp` (Streamable HTTP, the official SDK
//! `rmcp`): today it serves the one tool Claude Code asks its permission
//! prompts through, `approve` (`--permission-prompt-tool
//! mcp__lemon__approve`).
//!
//! - Every request carries `Authorization: Bearer <run token>`, the token a
//!   Claude run got from the [`Gate`] when it started (in its MCP config file,
//!   never on a command line). Any other request is a `401` before the body
//!   is read; the API token does not open it.
//! - `approve` takes `{tool_name, input, tool_use_id?}` and answers, as
//!   Claude reads it, one text block holding `{"behavior": "allow",
//!   "updatedInput": …}` or `{"behavior": "deny", "message": …}`. An asked
//!   call waits here until it is answered, expires or the run ends.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::Router;
use lemon_core::approvals::{Decision, Gate};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use crate::error::ApiError;

/// The permission tool's name on this server.
pub const APPROVE_TOOL: &str = "approve";
/// The largest request the endpoint reads (a tool call's input is small).
const MAX_BODY_BYTES: usize = 1024 * 1024;

/// `/mcp`, answering runs that hold a token of `gate`; stops with `shutdown`.
pub fn router(gate: Gate, shutdown: &CancellationToken) -> Router {
    let handler = GateServer { gate: gate.clone() };
    let mut config = StreamableHttpServerConfig::default();
    config.cancellation_token = shutdown.child_token();
    config.max_request_body_bytes = MAX_BODY_BYTES;
    let service = StreamableHttpService::new(
        move || Ok(handler.clone()),
        Arc::new(LocalSessionManager::default()),
        config,
    );
    Router::new()
        .nest_service("/mcp", service)
        .layer(middleware::from_fn_with_state(gate, require_run_token))
}

/// Lets a request through only with a token a live run holds.
async fn require_run_token(State(gate): State<Gate>, req: Request, next: Next) -> Response {
    match run_token(req.headers()) {
        Some(token) if gate.knows(token) => next.run(req).await,
        _ => ApiError::Unauthorized.into_response(),
    }
}

/// The bearer token of `headers`.
fn run_token(headers: &axum::http::HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.trim().split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// The MCP server: one tool, answered by the gate.
#[derive(Debug, Clone)]
struct GateServer {
    gate: Gate,
}

impl GateServer {
    fn tool() -> Tool {
        let schema = json!({
            "type": "object",
            "properties": {
                "tool_name": { "type": "string", "description": "The tool the agent wants to call." },
                "input": { "type": "object", "description": "The call's input." },
                "tool_use_id": { "type": "string", "description": "The call's id." },
            },
            "required": ["tool_name", "input"],
        });
        let Value::Object(schema) = schema else { unreachable!("an object literal") };
        Tool::new(
            APPROVE_TOOL,
            "Asks the gateway's owner whether a tool call may run: the owner's rules decide, or the owner answers from a chat, the dashboard, the API or the command line.",
            schema,
        )
    }
}

/// Claude's permission answer as the one text block it reads.
fn behavior(decision: Decision, input: &Value) -> CallToolResult {
    let answer = match decision {
        Decision::Allow => json!({ "behavior": "allow", "updatedInput": input }),
        Decision::Deny(message) => json!({ "behavior": "deny", "message": message }),
    };
    CallToolResult::success(vec![ContentBlock::text(answer.to_string())])
}

impl ServerHandler for GateServer {
    fn get_info(&self) -> ServerConfig {
        let mut info = ServerConfig::new(ServerCapabilities::builder().enable_tools().build());
        info.server_info = Implementation::new("lemon-gateway", env!("CARGO_PKG_VERSION"));
        info
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        Ok(ListToolsResult::with_all_items(vec![Self::tool()]))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        if request.name != APPROVE_TOOL {
            return Err(McpError::invalid_params(format!("no tool {:?}", request.name), None));
        }
        let token = context
            .extensions
            .get::<axum::http::request::Parts>()
            .and_then(|parts| run_token(&parts.headers).map(str::to_owned))
            .ok_or_else(|| McpError::invalid_request("no run token", None))?;
        let arguments = request.arguments.unwrap_or_default();
        let Some(tool) = arguments.get("tool_name").and_then(Value::as_str) else {
            let missing = "tool_name: a string is required";
            return Ok(CallToolResult::error(vec![ContentBlock::text(missing)]).into());
        };
        let input = arguments.get("input").cloned().unwrap_or_else(|| json!({}));
        let call_id = arguments.get("tool_use_id").and_then(Value::as_str);
        match self.gate.decide(&token, tool, &input, call_id).await {
            Ok(decision) => Ok(behavior(decision, &input).into()),
            Err(unknown) => Err(McpError::invalid_request(unknown.to_string(), None)),
        }
    }
}

#[cfg(test)]
mod tests;
