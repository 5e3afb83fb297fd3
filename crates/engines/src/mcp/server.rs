//! One configured MCP server: starting it (a process in its own group, or a
//! Streamable HTTP session), the connection a supervisor task watches, its
//! tool list, its calls and its status.
//!
//! A call is sent as a cancellable request. Its outcome:
//! - the server's result: text to the model, images to files sent with the
//!   answer (`content`), `isError` as a tool error;
//! - `timeout_ms` elapsed: `notifications/cancelled` to the server, a tool
//!   error with `{"error_type": "timeout", "timeout_ms": N}`;
//! - the run cancelled: `notifications/cancelled` to the server, a tool error
//!   at once;
//! - the connection ended (the process exited, it wrote something that is not
//!   JSON-RPC on stdout, the HTTP session broke): a tool error saying why;
//!   the server is started again on its next use.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lemon_core::mcp::{
    check_tool, clean_description, qualified_name, McpServerConfig, McpServerState, McpServerStatus,
};
use lemon_core::tool::{ToolContext, ToolOutput, ToolSpec};
use rmcp::model::{
    CallToolRequest, CallToolRequestParams, ClientRequest, ListToolsRequest,
    PaginatedRequestParams, RequestOptionalParam, ServerResult,
};
use rmcp::service::{NotificationContext, Peer, PeerRequestOptions, RoleClient, RunningService};
use rmcp::{ClientHandler, ServiceError, ServiceExt};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{ChildStderr, ChildStdout};
use tokio_util::sync::CancellationToken;

use super::{McpTool, Shared};
use crate::cli::HelperChild;

/// How long a stopped server has to exit before its group is SIGKILLed.
const STOP_GRACE: Duration = Duration::from_secs(2);
/// How long a failed call waits for the supervisor to say why the
/// connection ended.
const REASON_WAIT: Duration = Duration::from_secs(3);
/// The longest line a stdio server may write (one JSON-RPC message).
const MAX_LINE_BYTES: usize = 16 * 1024 * 1024;
/// The stderr a failed stdio server's error shows, at most.
const STDERR_TAIL_BYTES: usize = 2048;
/// Pages of `tools/list` followed at most.
const MAX_LIST_PAGES: usize = 100;
/// Tools kept of one server at most.
const MAX_TOOLS: usize = 1000;
/// The longest wait before a failed server is started again.
const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// How long a server that failed `failures` times in a row waits before it
/// is started again: nothing after the first failure (a crash costs only the
/// call it broke), then 1 s, doubling up to [`MAX_BACKOFF`].
pub(crate) fn backoff(failures: u32) -> Duration {
    match failures {
        0 | 1 => Duration::ZERO,
        n => Duration::from_secs(1u64 << (n - 2).min(6)).min(MAX_BACKOFF),
    }
}

/// One server of the config.
#[derive(Debug)]
pub(crate) struct Server {
    config: McpServerConfig,
    shared: Arc<Shared>,
    /// Held while the server is started or its tools listed, so concurrent
    /// runs share one start.
    starting: tokio::sync::Mutex<()>,
    state: Mutex<State>,
    /// Cancelled when the server left the config (or changed): it is stopped
    /// and never started again.
    retired: CancellationToken,
}

#[derive(Debug, Default)]
struct State {
    conn: Option<Arc<Connection>>,
    status: Option<McpServerState>,
    error: Option<String>,
    calls: BTreeMap<String, u64>,
    starts: u64,
    /// Failed starts and deaths since the last successful call or listing.
    failures: u32,
    retry_at: Option<tokio::time::Instant>,
    /// The offered tools of the last listing.
    tools: Vec<Arc<McpTool>>,
}

/// One live connection to the server.
#[derive(Debug)]
struct Connection {
    peer: Peer<RoleClient>,
    /// Set by `notifications/tools/list_changed`.
    list_changed: Arc<AtomicBool>,
    /// Asks the supervisor to stop the server.
    stop: CancellationToken,
    /// Cancelled by the supervisor once the connection ended.
    closed: CancellationToken,
    /// Cancelled by the supervisor once the process is gone and the state
    /// says why.
    done: CancellationToken,
    /// Why the stdout reader ended the connection (garbage on stdout).
    broken: Arc<Mutex<Option<String>>>,
}

impl Connection {
    fn is_live(&self) -> bool {
        !self.closed.is_cancelled() && !self.stop.is_cancelled()
    }
}

/// What the client tells the server about itself and hears from it.
#[derive(Debug, Clone)]
struct Handler {
    list_changed: Arc<AtomicBool>,
}

impl ClientHandler for Handler {
    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.list_changed.store(true, Ordering::Release);
    }
}

/// What a started server hands its supervisor.
struct Started {
    service: RunningService<RoleClient, Handler>,
    process: Option<Process>,
}

/// A stdio server's process and what its pipes left behind.
struct Process {
    child: HelperChild,
    stderr: Arc<Mutex<Vec<u8>>>,
    /// The secret values the server was given, cut out of its stderr.
    secrets: Vec<String>,
    recorded: bool,
}

impl Server {
    pub(crate) fn new(config: McpServerConfig, shared: Arc<Shared>) -> Arc<Server> {
        Arc::new(Server {
            config,
            shared,
            starting: tokio::sync::Mutex::new(()),
            state: Mutex::new(State::default()),
            retired: CancellationToken::new(),
        })
    }

    pub(crate) fn config(&self) -> &McpServerConfig {
        &self.config
    }

    fn name(&self) -> &str {
        &self.config.name
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn status(&self) -> McpServerStatus {
        let state = self.state();
        let status = if !self.config.enabled {
            McpServerState::Disabled
        } else {
            state.status.unwrap_or(McpServerState::Idle)
        };
        let mut tools: Vec<String> =
            state.tools.iter().map(|tool| tool.spec.name.clone()).collect();
        tools.sort();
        McpServerStatus {
            name: self.config.name.clone(),
            transport: self.config.transport(),
            state: status,
            tools,
            error: state.error.clone(),
            calls: state.calls.clone(),
            starts: state.starts,
        }
    }

    fn count(&self, outcome: &str) {
        *self.state().calls.entry(outcome.to_owned()).or_default() += 1;
    }

    fn live(&self) -> Option<Arc<Connection>> {
        self.state().conn.clone().filter(|conn| conn.is_live())
    }

    /// The offered tools, starting the server or listing them again when
    /// needed.
    pub(crate) async fn tools(self: &Arc<Self>) -> Result<Vec<Arc<McpTool>>, String> {
        let _starting = self.starting.lock().await;
        let conn = match self.live() {
            Some(conn) => conn,
            None => self.start().await?,
        };
        if conn.list_changed.swap(false, Ordering::AcqRel) {
            let timeout = Duration::from_millis(self.config.startup_timeout_ms);
            match tokio::time::timeout(timeout, self.list(&conn.peer)).await {
                Ok(Ok(tools)) => self.state().tools = tools,
                Ok(Err(error)) => {
                    tracing::warn!(server = %self.name(), %error, "MCP tools not listed again; keeping the earlier list");
                }
                Err(_) => {
                    tracing::warn!(server = %self.name(), "MCP tools not listed again within startup_timeout_ms; keeping the earlier list");
                }
            }
        }
        Ok(self.state().tools.clone())
    }

    /// The live connection for a call, starting the server when it is not
    /// running (and its backoff is over).
    async fn connection(self: &Arc<Self>) -> Result<Arc<Connection>, String> {
        if let Some(conn) = self.live() {
            return Ok(conn);
        }
        let _starting = self.starting.lock().await;
        match self.live() {
            Some(conn) => Ok(conn),
            None => self.start().await,
        }
    }

    /// Starts the server, lists its tools and hands the connection to a
    /// supervisor. Called with `starting` held.
    async fn start(self: &Arc<Self>) -> Result<Arc<Connection>, String> {
        let name = self.name().to_owned();
        if self.retired.is_cancelled() {
            return Err(format!("MCP server {name} was changed or removed from the config"));
        }
        if self.shared.options.shutdown.is_cancelled() {
            return Err("the gateway is shutting down".to_owned());
        }
        let (retry_at, last) = {
            let state = self.state();
            (state.retry_at, state.error.clone().unwrap_or_default())
        };
        let now = tokio::time::Instant::now();
        if let Some(wait) = retry_at.filter(|at| *at > now).map(|at| at - now) {
            let wait = wait.as_secs_f64().ceil() as u64;
            return Err(format!("{last}; it is started again in {wait} s"));
        }
        self.state().status = Some(McpServerState::Starting);
        let list_changed = Arc::new(AtomicBool::new(false));
        let broken = Arc::new(Mutex::new(None));
        let handler = Handler { list_changed: list_changed.clone() };
        let startup = Duration::from_millis(self.config.startup_timeout_ms);
        let mut pending: Option<Process> = None;
        let attempt = async {
            let service = match (&self.config.command, &self.config.url) {
                (Some(command), _) => {
                    let (process, transport) = self.spawn(command, broken.clone()).await?;
                    pending = Some(process);
                    handler.serve(transport).await.map_err(|error| {
                        format!("the MCP handshake failed: {}", init_error_text(&error))
                    })?
                }
                (None, Some(url)) => self.connect_http(url, handler.clone()).await?,
                (None, None) => return Err("the entry has neither command nor url".to_owned()),
            };
            let tools = self.list(service.peer()).await?;
            Ok::<_, String>((service, tools))
        };
        let outcome = match tokio::time::timeout(startup, attempt).await {
            Ok(outcome) => outcome,
            Err(_) => Err(format!(
                "no answer within startup_timeout_ms = {}: raise startup_timeout_ms, or run the \
                 server by hand to see whether it starts",
                self.config.startup_timeout_ms
            )),
        };
        let (service, tools) = match outcome {
            Ok(started) => started,
            Err(error) => {
                let mut error = error;
                if let Some(mut process) = pending.take() {
                    let exit = process.child.terminate(STOP_GRACE).await;
                    self.forget(&mut process).await;
                    if let Some(tail) = process.stderr_tail() {
                        error = format!("{error} ({exit}; its stderr ends: {tail})");
                    }
                }
                let error = format!("MCP server {name} could not be started: {error}");
                self.failed(None, error.clone());
                return Err(error);
            }
        };
        let conn = Arc::new(Connection {
            peer: service.peer().clone(),
            list_changed,
            stop: CancellationToken::new(),
            closed: CancellationToken::new(),
            done: CancellationToken::new(),
            broken,
        });
        {
            let mut state = self.state();
            state.conn = Some(conn.clone());
            state.status = Some(McpServerState::Running);
            state.error = None;
            state.starts += 1;
            state.retry_at = None;
            state.tools = tools;
            tracing::info!(server = %name, tools = state.tools.len(), "MCP server started");
        }
        let started = Started { service, process: pending.take() };
        let supervisor = self.clone().supervise(conn.clone(), started);
        self.shared.options.tracker.spawn(supervisor);
        Ok(conn)
    }

    /// Starts a stdio server's process: its own group, the safe environment
    /// and the secrets its `env` names, stdout through a reader that ends the
    /// connection at the first line that is not JSON-RPC.
    async fn spawn(
        &self,
        command: &str,
        broken: Arc<Mutex<Option<String>>>,
    ) -> Result<(Process, (tokio::io::DuplexStream, tokio::process::ChildStdin)), String> {
        let options = &self.shared.options;
        let mut env = crate::cli::allowlisted_env(&options.base_env);
        let mut secrets = Vec::new();
        for (var, secret) in &self.config.env {
            let value = self.secret(secret, &format!("env {var}")).await?;
            secrets.push(value.expose().to_owned());
            env.insert(var.clone(), value.expose().to_owned());
        }
        let program = if command.contains('/') {
            let path = PathBuf::from(command);
            if !path.is_file() {
                return Err(format!("{command} does not exist: check command"));
            }
            path
        } else {
            let search = options.base_env.get("PATH").cloned().unwrap_or_default();
            crate::cli::which(Path::new(command), &search).ok_or_else(|| {
                format!(
                    "{command} is not on the PATH: install it, or give its full path in command"
                )
            })?
        };
        let cwd = match &self.config.cwd {
            Some(dir) if dir.is_absolute() => dir.clone(),
            Some(dir) => options.home.join(dir),
            None => options.home.clone(),
        };
        let spec = crate::cli::HelperSpec { program, args: self.config.args.clone(), cwd, env };
        let helper = crate::cli::spawn_helper(spec, &options.tracker).await?;
        let mut recorded = false;
        if let (Some(group), Some(recorder)) = (helper.group, self.shared.recorder.get()) {
            recorder.started(group).await;
            recorded = true;
        }
        let stderr = Arc::new(Mutex::new(Vec::new()));
        options.tracker.spawn(keep_stderr(helper.stderr, stderr.clone()));
        let (rmcp_side, our_side) = tokio::io::duplex(64 * 1024);
        options.tracker.spawn(pump_stdout(helper.stdout, our_side, broken));
        let process = Process { child: helper.child, stderr, secrets, recorded };
        Ok((process, (rmcp_side, helper.stdin)))
    }

    /// Opens a Streamable HTTP session, with the secrets its `headers` name.
    async fn connect_http(
        &self,
        url: &str,
        handler: Handler,
    ) -> Result<RunningService<RoleClient, Handler>, String> {
        use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
        // reqwest 0.13 is built without a crypto provider: rustls uses ring.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut headers = std::collections::HashMap::new();
        for (header, secret) in &self.config.headers {
            let value = self.secret(secret, &format!("header {header}")).await?;
            let name = reqwest::header::HeaderName::from_bytes(header.as_bytes())
                .map_err(|_| format!("{header:?} is not a header name"))?;
            let mut value =
                reqwest::header::HeaderValue::from_str(value.expose()).map_err(|_| {
                    format!("the secret {secret} (header {header}) is not a valid header value")
                })?;
            value.set_sensitive(true);
            headers.insert(name, value);
        }
        let config = StreamableHttpClientTransportConfig::with_uri(url).custom_headers(headers);
        let transport = rmcp::transport::StreamableHttpClientTransport::from_config(config);
        handler.serve(transport).await.map_err(|error| http_error(&self.config, &error))
    }

    /// The value of the secret `name` a server's `what` names (read off the
    /// runtime: a keychain or a file may be slow).
    async fn secret(
        &self,
        name: &str,
        what: &str,
    ) -> Result<lemon_core::secrets::SecretValue, String> {
        let lookup = self.shared.options.secrets.clone();
        let owned = name.to_owned();
        let found = tokio::task::spawn_blocking(move || lookup(&owned))
            .await
            .unwrap_or_else(|_| Err("the secret lookup failed".to_owned()));
        match found {
            Ok(Some(value)) => Ok(value),
            Ok(None) => Err(format!(
                "the secret {name} ({what}) is not set: add it to secrets.toml or set {} in the \
                 gateway's environment",
                lemon_core::secrets::env_var_name(name)
            )),
            Err(error) => Err(format!("the secret {name} ({what}) cannot be read: {error}")),
        }
    }

    /// Every page of `tools/list`, checked: the tools runs are offered. A
    /// tool that was offered before with the same spec keeps its `Arc`.
    async fn list(self: &Arc<Self>, peer: &Peer<RoleClient>) -> Result<Vec<Arc<McpTool>>, String> {
        let name = self.name();
        let mut listed: Vec<Value> = Vec::new();
        let mut cursor: Option<String> = None;
        for _ in 0..MAX_LIST_PAGES {
            let params =
                cursor.take().map(|c| PaginatedRequestParams::default().with_cursor(Some(c)));
            let request = ClientRequest::ListToolsRequest(ListToolsRequest {
                params,
                ..RequestOptionalParam::default()
            });
            let result = peer
                .send_request(request)
                .await
                .map_err(|error| format!("tools/list failed: {}", service_error_text(&error)))?;
            let page = result_value(result);
            let Some(tools) = page.get("tools").and_then(Value::as_array) else {
                return Err("its tools/list answer holds no list of tools".to_owned());
            };
            listed.extend(tools.iter().cloned());
            if listed.len() > MAX_TOOLS {
                tracing::warn!(server = %name, "MCP server lists more than {MAX_TOOLS} tools; the rest are left out");
                listed.truncate(MAX_TOOLS);
                break;
            }
            match page.get("nextCursor").and_then(Value::as_str) {
                Some(next) if !next.is_empty() => cursor = Some(next.to_owned()),
                _ => break,
            }
        }
        let known = self.state().tools.clone();
        let mut tools: Vec<Arc<McpTool>> = Vec::new();
        for entry in listed {
            let tool_name = entry.get("name").and_then(Value::as_str).unwrap_or_default();
            let schema = entry.get("inputSchema").cloned().unwrap_or(Value::Null);
            if let Err(why) = check_tool(name, tool_name, &schema) {
                tracing::warn!(server = %name, reason = %lemon_core::log_text::escape(&why), "MCP tool refused");
                continue;
            }
            if !self.config.offers(tool_name) {
                continue;
            }
            let qualified = qualified_name(name, tool_name);
            if tools.iter().any(|tool| tool.spec.name == qualified) {
                tracing::warn!(server = %name, tool = %tool_name, "MCP tool listed twice; the first is kept");
                continue;
            }
            let description = entry
                .get("description")
                .and_then(Value::as_str)
                .or_else(|| entry.get("title").and_then(Value::as_str))
                .map(clean_description)
                .unwrap_or_default();
            let spec = ToolSpec { name: qualified, description, parameters: schema };
            let same = known.iter().find(|tool| tool.spec == spec);
            tools.push(match same {
                Some(tool) => tool.clone(),
                None => {
                    Arc::new(McpTool { server: self.clone(), tool: tool_name.to_owned(), spec })
                }
            });
        }
        tools.sort_by(|a, b| a.spec.name.cmp(&b.spec.name));
        Ok(tools)
    }

    /// Watches one connection until it ends or is stopped; then kills the
    /// process group and says in the state why it ended.
    async fn supervise(self: Arc<Self>, conn: Arc<Connection>, started: Started) {
        let Started { service, mut process } = started;
        let cancel_service = service.cancellation_token();
        let waiting = service.waiting();
        tokio::pin!(waiting);
        let shutdown = self.shared.options.shutdown.clone();
        // The leader's exit, even while something it started keeps its pipes open.
        let leader_exit = async {
            match process.as_mut() {
                Some(process) => Some(process.child.wait().await),
                None => std::future::pending().await,
            }
        };
        // (stopped on purpose, the service ended, the leader's exit)
        let (on_purpose, ended, exited) = tokio::select! {
            _ = &mut waiting => (false, true, None),
            exit = leader_exit => (false, false, exit),
            () = conn.stop.cancelled() => (true, false, None),
            () = shutdown.cancelled() => (true, false, None),
            () = self.retired.cancelled() => (true, false, None),
        };
        conn.closed.cancel();
        cancel_service.cancel();
        if !ended {
            let _ = tokio::time::timeout(STOP_GRACE, &mut waiting).await;
        }
        let mut reason = conn.broken.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if let Some(mut process) = process {
            let exit = process.child.terminate(STOP_GRACE).await;
            let exit = exited.unwrap_or(exit);
            self.forget(&mut process).await;
            if reason.is_none() && !on_purpose {
                let mut text = format!("the server exited ({exit})");
                if let Some(tail) = process.stderr_tail() {
                    text.push_str(&format!("; its stderr ends: {tail}"));
                }
                reason = Some(text);
            }
        }
        if on_purpose {
            let mut state = self.state();
            if state.conn.as_ref().is_some_and(|c| Arc::ptr_eq(c, &conn)) {
                state.conn = None;
                state.status = Some(McpServerState::Idle);
            }
            tracing::info!(server = %self.name(), "MCP server stopped");
        } else {
            let reason = reason.unwrap_or_else(|| "the connection ended".to_owned());
            let error = format!("MCP server {} stopped: {reason}", self.name());
            tracing::warn!(server = %self.name(), error = %lemon_core::log_text::escape(&error), "MCP server died; it is started again on its next use");
            self.failed(Some(&conn), error);
        }
        conn.done.cancel();
    }

    async fn forget(&self, process: &mut Process) {
        if std::mem::take(&mut process.recorded) {
            if let Some(recorder) = self.shared.recorder.get() {
                recorder.reaped(process.child.pgid()).await;
            }
        }
    }

    /// Marks a failed start (`conn` none) or the death of `conn`.
    fn failed(&self, conn: Option<&Arc<Connection>>, error: String) {
        let mut state = self.state();
        if let Some(conn) = conn {
            if !state.conn.as_ref().is_some_and(|c| Arc::ptr_eq(c, conn)) {
                return;
            }
        }
        state.conn = None;
        state.status = Some(McpServerState::Failed);
        state.error = Some(error);
        state.failures = state.failures.saturating_add(1);
        state.retry_at = Some(tokio::time::Instant::now() + backoff(state.failures));
    }

    /// Stops the server (if it runs) and waits until its process is gone.
    pub(crate) async fn stop(&self) {
        let conn = self.state().conn.clone();
        if let Some(conn) = conn {
            conn.stop.cancel();
            conn.done.cancelled().await;
        }
    }

    /// Takes the server out of service for good: stopped, never started again.
    pub(crate) fn retire(&self) {
        self.retired.cancel();
    }

    /// One `tools/call` of the server's tool `tool`.
    pub(crate) async fn call(
        self: &Arc<Self>,
        tool: &str,
        args: Value,
        ctx: ToolContext,
    ) -> ToolOutput {
        let name = self.name().to_owned();
        let conn = tokio::select! {
            biased;
            () = ctx.cancel.cancelled() => {
                self.count("cancelled");
                return ToolOutput::error("cancelled");
            }
            conn = self.connection() => conn,
        };
        let conn = match conn {
            Ok(conn) => conn,
            Err(error) => {
                self.count("error");
                return ToolOutput::error(error);
            }
        };
        let arguments = match args {
            Value::Object(map) => map,
            Value::Null => serde_json::Map::new(),
            _ => {
                self.count("error");
                return ToolOutput::error("the arguments are not a JSON object");
            }
        };
        let params = CallToolRequestParams::new(tool.to_owned()).with_arguments(arguments);
        let request = ClientRequest::CallToolRequest(CallToolRequest::new(params));
        let handle =
            conn.peer.send_cancellable_request(request, PeerRequestOptions::no_options()).await;
        let mut handle = match handle {
            Ok(handle) => handle,
            Err(error) => return self.connection_lost(&conn, &error).await,
        };
        let timeout_ms = self.config.timeout_ms;
        let answer = tokio::select! {
            biased;
            answer = &mut handle.rx => answer,
            () = conn.done.cancelled() => Ok(Err(ServiceError::TransportClosed)),
            () = ctx.cancel.cancelled() => {
                self.count("cancelled");
                self.send_cancel(handle, "the run was cancelled");
                return ToolOutput::error("cancelled");
            }
            () = tokio::time::sleep(Duration::from_millis(timeout_ms)) => {
                self.count("timeout");
                self.send_cancel(handle, "timeout");
                let mut output = ToolOutput::error(format!(
                    "{} did not answer within {timeout_ms} ms (timeout_ms of MCP server {name}); the call was cancelled",
                    qualified_name(&name, tool)
                ));
                output.result_meta = json!({ "error_type": "timeout", "timeout_ms": timeout_ms });
                return output;
            }
        };
        match answer {
            Ok(Ok(result)) => {
                let output = super::content::output(&name, tool, result_value(result), &ctx);
                let mut state = self.state();
                state.failures = 0;
                *state
                    .calls
                    .entry(if output.is_error { "error" } else { "ok" }.to_owned())
                    .or_default() += 1;
                output
            }
            Ok(Err(ServiceError::McpError(error))) => {
                self.count("error");
                ToolOutput::error(format!(
                    "MCP server {name} refused the call: {} (code {})",
                    lemon_core::log_text::escape(&error.message),
                    error.code.0
                ))
            }
            Ok(Err(error)) => self.connection_lost(&conn, &error).await,
            Err(_closed) => self.connection_lost(&conn, &ServiceError::TransportClosed).await,
        }
    }

    fn send_cancel(&self, handle: rmcp::service::RequestHandle<RoleClient>, reason: &str) {
        let reason = reason.to_owned();
        self.shared.options.tracker.spawn(async move {
            let _ = tokio::time::timeout(STOP_GRACE, handle.cancel(Some(reason))).await;
        });
    }

    /// A call that lost its connection: the server is stopped (a process
    /// that is still there is killed) and started again on its next use.
    async fn connection_lost(&self, conn: &Arc<Connection>, error: &ServiceError) -> ToolOutput {
        self.count("error");
        if conn.is_live() {
            // An HTTP session that broke, or a transport that failed to send.
            let text = format!("MCP server {} stopped: {}", self.name(), service_error_text(error));
            self.failed(Some(conn), text);
            conn.stop.cancel();
        }
        let _ = tokio::time::timeout(REASON_WAIT, conn.done.cancelled()).await;
        let why = self.state().error.clone().unwrap_or_else(|| {
            format!("MCP server {}: {}", self.name(), service_error_text(error))
        });
        ToolOutput::error(format!(
            "{why}. The call did not complete; the server is started again on its next use."
        ))
    }
}

impl Process {
    /// The end of the server's stderr, escaped, without the secrets it was given.
    fn stderr_tail(&self) -> Option<String> {
        let bytes = self.stderr.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let mut text = String::from_utf8_lossy(&bytes).into_owned();
        for secret in self.secrets.iter().filter(|s| !s.is_empty()) {
            text = text.replace(secret.as_str(), "<redacted>");
        }
        let text = text.trim();
        (!text.is_empty()).then(|| lemon_core::log_text::escape_within(text, 600))
    }
}

/// Keeps the last [`STDERR_TAIL_BYTES`] of a server's stderr.
async fn keep_stderr(mut stderr: ChildStderr, tail: Arc<Mutex<Vec<u8>>>) {
    let mut chunk = [0u8; 4096];
    loop {
        match stderr.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                let mut tail = tail.lock().unwrap_or_else(|e| e.into_inner());
                tail.extend_from_slice(&chunk[..n]);
                if tail.len() > STDERR_TAIL_BYTES {
                    let excess = tail.len() - STDERR_TAIL_BYTES;
                    tail.drain(..excess);
                }
            }
        }
    }
}

/// Copies a stdio server's stdout to rmcp line by line. Lines before its
/// first JSON message (a banner) are skipped; after it, a line that is not
/// JSON, or one longer than [`MAX_LINE_BYTES`], ends the connection (the
/// stdio transport allows nothing but JSON-RPC messages there), and `broken`
/// says why.
async fn pump_stdout(
    stdout: ChildStdout,
    mut to_rmcp: tokio::io::DuplexStream,
    broken: Arc<Mutex<Option<String>>>,
) {
    let mut reader = BufReader::new(stdout);
    let mut line = Vec::new();
    let mut seen_json = false;
    let limit = MAX_LINE_BYTES as u64 + 1;
    loop {
        line.clear();
        match (&mut reader).take(limit).read_until(b'\n', &mut line).await {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        if line.len() > MAX_LINE_BYTES {
            *broken.lock().unwrap_or_else(|e| e.into_inner()) =
                Some(format!("it wrote a line over {MAX_LINE_BYTES} bytes on stdout"));
            break;
        }
        let message = line.trim_ascii();
        if message.is_empty() {
            continue;
        }
        let is_json = matches!(message.first(), Some(b'{' | b'['))
            && serde_json::from_slice::<serde::de::IgnoredAny>(message).is_ok();
        if !is_json {
            if seen_json {
                *broken.lock().unwrap_or_else(|e| e.into_inner()) = Some(
                    "it wrote a line that is not a JSON-RPC message on stdout (an MCP stdio \
                     server may write nothing else there)"
                        .to_owned(),
                );
                break;
            }
            continue;
        }
        seen_json = true;
        if to_rmcp.write_all(message).await.is_err() || to_rmcp.write_all(b"\n").await.is_err() {
            break;
        }
    }
    let _ = to_rmcp.shutdown().await;
}

/// A result as JSON, whichever of rmcp's types it was read as.
fn result_value(result: ServerResult) -> Value {
    serde_json::to_value(result).unwrap_or(Value::Null)
}

fn service_error_text(error: &ServiceError) -> String {
    match error {
        ServiceError::TransportClosed => "the connection ended".to_owned(),
        ServiceError::McpError(data) => {
            format!("{} (code {})", lemon_core::log_text::escape(&data.message), data.code.0)
        }
        other => lemon_core::log_text::escape(&other.to_string()),
    }
}

fn init_error_text(error: &rmcp::service::ClientInitializeError) -> String {
    use rmcp::service::ClientInitializeError as E;
    match error {
        E::ConnectionClosed(_) => "the server closed the connection before answering".to_owned(),
        E::JsonRpcError(data) => format!(
            "the server refused it: {} (code {})",
            lemon_core::log_text::escape(&data.message),
            data.code.0
        ),
        other => lemon_core::log_text::escape_within(&other.to_string(), 600),
    }
}

/// Why an HTTP server's handshake failed, with the fix.
fn http_error(config: &McpServerConfig, error: &rmcp::service::ClientInitializeError) -> String {
    let text = error.to_string();
    let auth = error.is_authorization_required()
        || error.auth_challenge().is_some()
        || text.contains("401")
        || text.contains("403");
    if auth {
        let named: Vec<String> = config
            .headers
            .iter()
            .map(|(header, secret)| format!("{header} = {secret:?}"))
            .collect();
        let named = if named.is_empty() { "none is set".to_owned() } else { named.join(", ") };
        return format!(
            "the server refused the credentials (HTTP 401/403): check the secrets named in headers ({named})"
        );
    }
    let url = config.url.as_deref().unwrap_or_default();
    let shown = url.split(['?', '#']).next().unwrap_or_default();
    format!("cannot use {shown}: {}", init_error_text(error))
}
