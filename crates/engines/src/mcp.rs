//! The native engine's MCP client: the servers of `[[gateway.mcp_servers]]`
//! (stdio or Streamable HTTP, through the official SDK `rmcp`), whose tools
//! runs are offered as `<server>__<tool>`.
//!
//! Interface only so far; the client itself lands with its tests.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use lemon_core::mcp::{McpServerConfig, McpServerStatus, McpStatusSource};
use lemon_core::secrets::SecretValue;
use lemon_core::tool::ToolSpec;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

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

/// The configured servers, shared by clones.
#[derive(Debug, Clone)]
pub struct McpClients {
    servers: Arc<std::sync::Mutex<Vec<McpServerConfig>>>,
    #[allow(dead_code)]
    options: McpOptions,
}

impl McpClients {
    pub fn new(servers: Vec<McpServerConfig>, options: McpOptions) -> McpClients {
        McpClients { servers: Arc::new(std::sync::Mutex::new(servers)), options }
    }

    /// Puts the servers in step with an edited config.
    pub fn reload(&self, servers: Vec<McpServerConfig>) {
        *self.servers.lock().unwrap_or_else(|e| e.into_inner()) = servers;
    }
}

impl McpStatusSource for McpClients {
    fn servers(&self) -> Vec<McpServerStatus> {
        Vec::new()
    }
}

/// Starts `server`, lists its tools and stops it (`doctor`).
///
/// # Errors
/// Why the server could not be started or listed, with the fix.
pub async fn probe(
    server: &McpServerConfig,
    _options: &McpOptions,
) -> Result<Vec<ToolSpec>, String> {
    Err(format!("{}: the MCP client is not built yet", server.name))
}
