//! The gateway's MCP endpoint, `/mcp` (Streamable HTTP, the official SDK
//! `rmcp`): the gateway's own tools for whoever holds one of its tokens.
//!
//! - **A run's token** (`Authorization: Bearer <run token>`, the token a
//!   vendor CLI run got from the [`Gate`] when it started, in its MCP config
//!   file, never on a command line): `approve`, the tool Claude Code asks its
//!   permission prompts through (`--permission-prompt-tool
//!   mcp__lemon__approve`), and the gateway's tools of the [`ToolRegistry`]
//!   offered to the run's session and let through by the run's tool filter.
//!   A call acts for the run: its session, its directory, its events (see
//!   `gateway`). When the run ends its token is withdrawn and every request
//!   with it is a `401`.
//! - **The API token** (the control API's check): the control tools `run`,
//!   `status`, `cancel` and `runs` (see `control`) and the gateway's tools,
//!   acting for the session an optional `Lemon-Session` header names (else
//!   `default`). This is what Claude Desktop, Cursor or any MCP client of the
//!   owner starts runs with, directly or through `lemon-gateway mcp`.
//! - Any other request is a `401` before its body is read; a body longer
//!   than [`MAX_BODY_BYTES`] is a `413`.
//!
//! `tools/list` answers in pages of [`TOOLS_PER_PAGE`] with an opaque
//! cursor (`catalog`); `notifications/tools/list_changed` goes to every
//! session (and every `subscriptions/listen` stream) when a tool is
//! registered. An unknown tool is a JSON-RPC invalid-params error; a tool's
//! own failure and a bad argument are results with `isError`.

mod catalog;
mod control;
mod gateway;

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::Router;
use lemon_core::approvals::{Decision, Gate};
use lemon_core::ids::SessionKey;
use lemon_core::router::RouterHandle;
use lemon_core::tool::ToolRegistry;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig, SubscriptionFilter,
};
use rmcp::service::{NotificationContext, RequestContext, SubscriptionContext};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use serde_json::{json, Value};
use tokio_util::sync::{CancellationToken, DropGuard};
use tokio_util::task::TaskTracker;

use crate::api::ApiToken;
use crate::error::ApiError;

pub use catalog::TOOLS_PER_PAGE;

/// The permission tool's name on this server.
pub const APPROVE_TOOL: &str = "approve";
/// The header an API-token caller names the session its gateway tools act
/// for with.
pub const SESSION_HEADER: &str = "lemon-session";
/// The largest request the endpoint reads (a tool call's input is small).
pub const MAX_BODY_BYTES: usize = 1024 * 1024;

/// What the endpoint serves from: the gate (run tokens), the API token, the
/// router (runs, directories), the gateway's tools.
#[derive(Clone)]
pub struct McpEndpoint {
    /// Knows every live run's token, and relays `approve`.
    pub gate: Gate,
    /// The control API's token (with the desktop's launch token): it opens
    /// the control tools. Never logged.
    pub token: ApiToken,
    /// Runs are submitted, followed and cancelled through it; tools get the
    /// gateway's directories from it.
    pub router: RouterHandle,
    /// The gateway's tools.
    pub tools: ToolRegistry,
    /// The gateway's workspace, where tools may also work.
    pub workspace: Option<PathBuf>,
    /// Per-session watchers (`list_changed`) are spawned here.
    pub tracker: TaskTracker,
}

impl fmt::Debug for McpEndpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("McpEndpoint")
            .field("token", &self.token)
            .field("router", &self.router)
            .field("workspace", &self.workspace)
            .finish_non_exhaustive()
    }
}

/// `/mcp` over `endpoint`; stops with `shutdown`.
pub fn router(endpoint: McpEndpoint, shutdown: &CancellationToken) -> Router {
    let shared = Arc::new(Shared { endpoint: endpoint.clone(), shutdown: shutdown.clone() });
    let mut config = StreamableHttpServerConfig::default();
    config.cancellation_token = shutdown.child_token();
    config.max_request_body_bytes = MAX_BODY_BYTES;
    let service = StreamableHttpService::new(
        move || Ok(McpServer::new(shared.clone())),
        Arc::new(LocalSessionManager::default()),
        config,
    );
    let auth = Auth { gate: endpoint.gate, token: endpoint.token };
    Router::new().nest_service("/mcp", service).layer(middleware::from_fn_with_state(auth, admit))
}

/// Who a request comes from, as [`admit`] found it: put in the request's
/// extensions, where the handler reads it.
#[derive(Clone)]
enum Caller {
    /// A live run's token.
    Run { token: Arc<str> },
    /// The API token, acting for `session`.
    Owner { session: SessionKey },
}

impl fmt::Debug for Caller {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Caller::Run { .. } => f.write_str("Caller::Run(<redacted>)"),
            Caller::Owner { session } => write!(f, "Caller::Owner({session:?})"),
        }
    }
}

/// What [`admit`] checks tokens with.
#[derive(Clone)]
struct Auth {
    gate: Gate,
    token: ApiToken,
}

/// Lets a request through only with a live run's token or the API token, and
/// only when its declared length is within [`MAX_BODY_BYTES`]: nothing of a
/// body is read before both hold.
async fn admit(State(auth): State<Auth>, mut req: Request, next: Next) -> Response {
    let caller = match bearer(req.headers()) {
        Some(token) if auth.gate.knows(token) => Caller::Run { token: token.into() },
        _ if auth.token.matches(req.headers()) => match session_of(req.headers()) {
            Ok(session) => Caller::Owner { session },
            Err(refused) => return refused.into_response(),
        },
        _ => return ApiError::Unauthorized.into_response(),
    };
    if crate::error::declared_too_large(req.headers(), MAX_BODY_BYTES) {
        return ApiError::PayloadTooLarge { limit: MAX_BODY_BYTES }.into_response();
    }
    req.extensions_mut().insert(caller);
    next.run(req).await
}

/// The session a `Lemon-Session` header names; `default` without one.
fn session_of(headers: &HeaderMap) -> Result<SessionKey, ApiError> {
    let Some(value) = headers.get(SESSION_HEADER) else {
        return Ok(SessionKey::from("default"));
    };
    let raw = value.to_str().map_err(|_| {
        ApiError::BadRequest("invalid Lemon-Session header: not visible ASCII".to_owned())
    })?;
    let raw = raw.trim();
    if raw.is_empty() {
        return Ok(SessionKey::from("default"));
    }
    SessionKey::parse(raw)
        .map_err(|err| ApiError::BadRequest(format!("invalid Lemon-Session header: {err}")))
}

/// The bearer token of `headers`.
fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.trim().split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// What every session's server shares.
#[derive(Debug)]
struct Shared {
    endpoint: McpEndpoint,
    shutdown: CancellationToken,
}

/// The MCP server of one session (or, for a stateless request, of one
/// request): made by the transport, dropped when the session ends.
#[derive(Debug, Clone)]
struct McpServer {
    shared: Arc<Shared>,
    /// Cancelled when the last clone of this session's server is dropped:
    /// its `list_changed` watcher stops.
    session: CancellationToken,
    _session_guard: Arc<DropGuard>,
}

impl McpServer {
    fn new(shared: Arc<Shared>) -> Self {
        let session = CancellationToken::new();
        McpServer { shared, _session_guard: Arc::new(session.clone().drop_guard()), session }
    }

    fn endpoint(&self) -> &McpEndpoint {
        &self.shared.endpoint
    }

    /// The caller of the request `context` belongs to.
    fn caller(context: &RequestContext<RoleServer>) -> Result<Caller, McpError> {
        context
            .extensions
            .get::<axum::http::request::Parts>()
            .and_then(|parts| parts.extensions.get::<Caller>().cloned())
            .ok_or_else(|| McpError::invalid_request("no credentials", None))
    }

    /// The run `token` names, or the error of a withdrawn token.
    fn run_of(&self, token: &str) -> Result<lemon_core::approvals::TokenRun, McpError> {
        self.endpoint()
            .gate
            .run_of(token)
            .ok_or_else(|| McpError::invalid_request("unknown or expired run token", None))
    }

    /// The owner's rules on a gateway tool called by a run whose CLI does
    /// not ask about it itself, by the tool's own name (`cron`), as a native
    /// call is judged: `None` to run it, else the refusal the model reads.
    /// An asked call waits for the owner, its expiry, the run's end or the
    /// request's cancellation.
    async fn judge(
        &self,
        token: &str,
        request: &CallToolRequestParams,
        context: &RequestContext<RoleServer>,
    ) -> Result<Option<CallToolResult>, McpError> {
        let input = Value::Object(request.arguments.clone().unwrap_or_default());
        let decided = tokio::select! {
            decided = self.endpoint().gate.decide(token, &request.name, &input, None) => decided,
            () = context.ct.cancelled() => {
                return Err(McpError::invalid_request("the call was cancelled", None))
            }
        };
        match decided {
            Ok(Decision::Allow) => Ok(None),
            Ok(Decision::Deny(message)) => {
                Ok(Some(CallToolResult::error(vec![ContentBlock::text(message)])))
            }
            Err(unknown) => Err(McpError::invalid_request(unknown.to_string(), None)),
        }
    }

    async fn approve(
        &self,
        token: &str,
        request: CallToolRequestParams,
    ) -> Result<CallToolResponse, McpError> {
        let arguments = request.arguments.unwrap_or_default();
        let Some(tool) = arguments.get("tool_name").and_then(Value::as_str) else {
            return Ok(catalog::argument_error("tool_name", "a string is required").into());
        };
        let input = arguments.get("input").cloned().unwrap_or_else(|| json!({}));
        let call_id = arguments.get("tool_use_id").and_then(Value::as_str);
        match self.endpoint().gate.decide(token, tool, &input, call_id).await {
            Ok(decision) => Ok(behavior(decision, &input).into()),
            Err(unknown) => Err(McpError::invalid_request(unknown.to_string(), None)),
        }
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

/// An unknown tool: a JSON-RPC invalid-params error, as the spec says.
fn no_tool(name: &str) -> McpError {
    McpError::invalid_params(format!("unknown tool {name:?}"), None)
}

/// The part of a client's `subscriptions/listen` the gateway serves, over
/// `/mcp` or `lemon-gateway mcp`: changes of the tool list, nothing else.
pub fn tools_subscription(requested: &SubscriptionFilter) -> Option<SubscriptionFilter> {
    (requested.tools_list_changed == Some(true))
        .then(|| SubscriptionFilter::builder().tools_list_changed().build())
}

/// What the gateway says of itself to an MCP client, over `/mcp` or
/// `lemon-gateway mcp`: its name and version, tools that may change.
pub fn server_config() -> ServerConfig {
    let capabilities = ServerCapabilities::builder().enable_tools().enable_tool_list_changed();
    let mut info = ServerConfig::new(capabilities.build());
    info.server_info = Implementation::new("lemon-gateway", env!("CARGO_PKG_VERSION"));
    info
}

impl ServerHandler for McpServer {
    fn get_info(&self) -> ServerConfig {
        server_config()
    }

    async fn list_tools(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let tools = match Self::caller(&context)? {
            Caller::Run { token } => {
                let run = self.run_of(&token)?;
                catalog::for_run(&self.endpoint().tools, &run)
            }
            Caller::Owner { session } => catalog::for_owner(&self.endpoint().tools, &session),
        };
        catalog::page(tools, request.and_then(|request| request.cursor).as_deref())
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let endpoint = self.endpoint();
        match Self::caller(&context)? {
            Caller::Run { token } => {
                let run = self.run_of(&token)?;
                if request.name == APPROVE_TOOL && catalog::asks_through_approve(&run) {
                    return self.approve(&token, request).await;
                }
                let tool = catalog::run_tool(&endpoint.tools, &run, &request.name)
                    .ok_or_else(|| no_tool(&request.name))?;
                if catalog::judged_here(&run) {
                    if let Some(refused) = self.judge(&token, &request, &context).await? {
                        return Ok(refused.into());
                    }
                }
                let call = gateway::Call::for_run(endpoint, &token, run, &context).await?;
                Ok(call.execute(tool, request.arguments, endpoint).await.into())
            }
            Caller::Owner { session } => {
                if let Some(tool) = control::Tool::named(&request.name) {
                    let control = control::Control::new(endpoint, session, &context);
                    return Ok(control.call(tool, request.arguments).await.into());
                }
                let tool = catalog::owner_tool(&endpoint.tools, &session, &request.name)
                    .ok_or_else(|| no_tool(&request.name))?;
                let call = gateway::Call::for_owner(endpoint, session, &context).await?;
                Ok(call.execute(tool, request.arguments, endpoint).await.into())
            }
        }
    }

    async fn on_initialized(&self, context: NotificationContext<RoleServer>) {
        // Until the session ends, a change of the tools is announced to it.
        let peer = context.peer;
        let mut changes = self.endpoint().tools.changes();
        let (session, shutdown) = (self.session.clone(), self.shared.shutdown.clone());
        self.endpoint().tracker.spawn(async move {
            loop {
                tokio::select! {
                    () = session.cancelled() => return,
                    () = shutdown.cancelled() => return,
                    changed = changes.changed() => {
                        if changed.is_err() || peer.notify_tool_list_changed().await.is_err() {
                            return;
                        }
                    }
                }
            }
        });
    }

    fn accepted_subscription_filter(
        &self,
        requested: &SubscriptionFilter,
    ) -> Option<SubscriptionFilter> {
        tools_subscription(requested)
    }

    async fn listen(&self, context: SubscriptionContext) -> Result<(), McpError> {
        let mut changes = self.endpoint().tools.changes();
        loop {
            tokio::select! {
                () = context.cancelled() => return Ok(()),
                () = self.shared.shutdown.cancelled() => return Ok(()),
                changed = changes.changed() => {
                    if changed.is_err() || context.sink().notify_tool_list_changed().await.is_err() {
                        return Ok(());
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
