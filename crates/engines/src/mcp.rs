//! The native engine's MCP client: the servers of `[[gateway.mcp_servers]]`
//! (stdio or Streamable HTTP, through the official SDK `rmcp`), whose tools
//! runs are offered as `<server>__<tool>`.
//!
//! It owns the servers' connections and processes and nothing else: it reads
//! no config file and no environment (the server passes the entries, the
//! gateway's environment and a secret lookup in), and it decides nothing
//! about which run sees which tool beyond each entry's own `tools` list (the
//! native engine applies the run's [`lemon_core::mcp::ToolFilter`]).
//!
//! - **Lifecycle**: a server starts with the first run that offers its tools
//!   ([`McpClients::tools`]) and stays up while the gateway runs. One that
//!   dies, or fails to start, is marked failed and started again on its next
//!   use after a backoff that grows with consecutive failures (none after the
//!   first, so one crash costs nothing but the call it broke); while it
//!   waits, runs are offered the other servers' tools. A stdio server runs in
//!   its own process group, which is killed when it is stopped: by
//!   [`McpClients::reload`] (its entry changed or went away), by
//!   [`McpClients::shutdown`] or by the gateway's shutdown token.
//! - **Tools**: listed with `tools/list` (every page), each checked with
//!   [`lemon_core::mcp::check_tool`] and the entry's allow list; a refused
//!   one is left out with a warning. `notifications/tools/list_changed`
//!   makes the next run list them again.
//! - **Calls**: a call is a [`Tool`]; see `server` for how results,
//!   timeouts, crashes and cancellation become tool outputs.
//!
//! # Layout
//! - `server`: one server: starting it, its connection, its supervisor and
//!   its calls.
//! - `content`: a `tools/call` result as the model and the channel get it.

mod content;
mod server;

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use async_trait::async_trait;
use lemon_core::mcp::{McpServerConfig, McpServerStatus, McpStatusSource};
use lemon_core::secrets::SecretValue;
use lemon_core::tool::{Tool, ToolContext, ToolOutput, ToolSpec};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::cli::ProcessRecorder;

use self::server::Server;

/// Looks a secret up by name (a server's `env` and `headers` values).
pub type SecretLookup = Arc<dyn Fn(&str) -> Result<Option<SecretValue>, String> + Send + Sync>;

/// What the client starts servers with.
#[derive(Clone)]
pub struct McpOptions {
    /// The gateway's environment; a stdio server gets only its allowlisted
    /// variables and its own `env`.
    pub base_env: BTreeMap<String, String>,
    /// A stdio server's working directory when its entry names none.
    pub home: PathBuf,
    pub secrets: SecretLookup,
    pub tracker: TaskTracker,
    /// Cancelled when the gateway shuts down: every server is stopped.
    pub shutdown: CancellationToken,
}

impl fmt::Debug for McpOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("McpOptions").field("home", &self.home).finish_non_exhaustive()
    }
}

/// What every server of one client shares.
#[derive(Debug)]
struct Shared {
    options: McpOptions,
    /// Keeps a record of every stdio server's process group while it runs.
    recorder: OnceLock<Arc<dyn ProcessRecorder>>,
}

/// The configured servers, shared by clones.
#[derive(Debug, Clone)]
pub struct McpClients {
    shared: Arc<Shared>,
    /// In config order; a reload replaces the entries that changed.
    servers: Arc<std::sync::Mutex<Vec<Arc<Server>>>>,
}

impl McpClients {
    pub fn new(servers: Vec<McpServerConfig>, options: McpOptions) -> McpClients {
        let shared = Arc::new(Shared { options, recorder: OnceLock::new() });
        let servers =
            servers.into_iter().map(|config| Server::new(config, shared.clone())).collect();
        McpClients { shared, servers: Arc::new(std::sync::Mutex::new(servers)) }
    }

    /// Records the process group of every stdio server started from now on
    /// (the store, so that a start after a crash kills what is left). Set
    /// once; later calls are ignored.
    pub fn record_processes(&self, recorder: Arc<dyn ProcessRecorder>) {
        let _ = self.shared.recorder.set(recorder);
    }

    fn list(&self) -> Vec<Arc<Server>> {
        self.servers.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Puts the servers in step with an edited config: a server whose entry
    /// changed or went away is stopped (its process group killed), a new or
    /// changed one waits idle for the next run that offers it, the others
    /// keep running.
    pub fn reload(&self, servers: Vec<McpServerConfig>) {
        let mut current = self.servers.lock().unwrap_or_else(|e| e.into_inner());
        let mut next = Vec::with_capacity(servers.len());
        for config in servers {
            match current.iter().position(|server| *server.config() == config) {
                Some(at) => next.push(current.remove(at)),
                None => {
                    tracing::info!(server = %config.name, "MCP server added or changed; it starts with the next run that offers it");
                    next.push(Server::new(config, self.shared.clone()));
                }
            }
        }
        for gone in current.drain(..) {
            tracing::info!(server = %gone.config().name, "MCP server changed or removed; stopping it");
            gone.retire();
        }
        *current = next;
    }

    /// The tools of every enabled server, starting the ones not running
    /// (concurrently, each within its `startup_timeout_ms`). A server that
    /// cannot be started, or waits out its backoff, is left out with a
    /// warning. The same tool is the same `Arc` from one call to the next
    /// while its server lists it unchanged.
    pub async fn tools(&self) -> Vec<Arc<dyn Tool>> {
        self.tools_within(&lemon_core::mcp::ToolFilter::all()).await
    }

    /// [`McpClients::tools`] of the servers `filter` may let a tool of
    /// through: a run narrowed to other tools starts no server.
    pub async fn tools_within(&self, filter: &lemon_core::mcp::ToolFilter) -> Vec<Arc<dyn Tool>> {
        let servers: Vec<Arc<Server>> = self
            .list()
            .into_iter()
            .filter(|server| server.config().enabled)
            .filter(|server| filter.may_allow_server(&server.config().name))
            .collect();
        if servers.is_empty() {
            return Vec::new();
        }
        let listed = futures::future::join_all(servers.iter().map(|server| server.tools())).await;
        let mut tools: Vec<Arc<dyn Tool>> = Vec::new();
        for (server, listed) in servers.iter().zip(listed) {
            match listed {
                Ok(list) => tools.extend(list.into_iter().map(|tool| tool as Arc<dyn Tool>)),
                Err(error) => tracing::warn!(
                    server = %server.config().name,
                    %error,
                    "MCP server skipped for this run"
                ),
            }
        }
        tools
    }

    /// Stops every server (their process groups killed) and waits until
    /// they are gone. Later runs start them again unless the gateway's
    /// shutdown token is cancelled.
    pub async fn shutdown(&self) {
        let servers = self.list();
        futures::future::join_all(servers.iter().map(|server| server.stop())).await;
    }
}

impl McpStatusSource for McpClients {
    fn servers(&self) -> Vec<McpServerStatus> {
        self.list().iter().map(|server| server.status()).collect()
    }
}

/// Starts `server`, lists its tools and stops it (`doctor`). The tools are
/// the ones a run would be offered (allow list and checks applied).
///
/// # Errors
/// Why the server could not be started or listed, with the fix.
pub async fn probe(
    server: &McpServerConfig,
    options: &McpOptions,
) -> Result<Vec<ToolSpec>, String> {
    let shared = Arc::new(Shared { options: options.clone(), recorder: OnceLock::new() });
    let mut config = server.clone();
    config.enabled = true;
    let server = Server::new(config, shared);
    let listed = server.tools().await;
    server.stop().await;
    listed.map(|tools| tools.iter().map(|tool| tool.spec()).collect())
}

/// One tool of one server, as runs are offered it.
#[derive(Debug)]
pub struct McpTool {
    server: Arc<Server>,
    /// The server's own name of the tool.
    tool: String,
    spec: ToolSpec,
}

impl McpTool {
    /// The server's name.
    pub fn server(&self) -> &str {
        &self.server.config().name
    }

    /// The server's own name of the tool (`search` of `github__search`).
    pub fn tool(&self) -> &str {
        &self.tool
    }
}

#[async_trait]
impl Tool for McpTool {
    fn spec(&self) -> ToolSpec {
        self.spec.clone()
    }

    async fn execute(&self, args: serde_json::Value, ctx: ToolContext) -> ToolOutput {
        self.server.call(&self.tool, args, ctx).await
    }
}

#[cfg(test)]
mod tests;
