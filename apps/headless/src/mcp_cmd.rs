//! `lemon-gateway mcp`: a stdio MCP server for the MCP clients that start a
//! command (Claude Desktop, Cursor), bridged to the running gateway's `/mcp`
//! with the API token. The gateway is found, and the token read, as every
//! client command does ([`ClientConfig::resolve`]); the token never appears
//! in argv or in a log line.
//!
//! The bridge is two rmcp peers: a server on stdin/stdout, and a client of
//! `<gateway>/mcp` over Streamable HTTP. `tools/list` (cursors passed
//! through) and `tools/call` go to the gateway as they come, and its
//! answers and errors come back as they are; the gateway's
//! `notifications/tools/list_changed` are passed on. With no gateway
//! running, or one that refuses the token, it exits before reading stdin
//! with the error saying what to do.

use std::sync::{Arc, OnceLock};

use anyhow::Context as _;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, ClientCapabilities, ClientConfig as McpClientInfo,
    Implementation, ListToolsResult, PaginatedRequestParams, ResultType, ServerConfig,
    SubscriptionFilter,
};
use rmcp::service::{NotificationContext, Peer, RequestContext, ServiceError, SubscriptionContext};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::{
    ClientHandler, ErrorData as McpError, RoleClient, RoleServer, ServerHandler, ServiceExt,
};
use tokio::sync::watch;

use crate::client::{Client, ClientConfig};
use crate::failure;

/// Serves MCP on stdin/stdout until the client closes stdin.
///
/// # Errors
/// The gateway cannot be reached or refuses the token ([`crate::client::ClientError`]),
/// or the MCP session with it cannot start.
pub async fn serve(config: ClientConfig) -> anyhow::Result<u8> {
    // The control API answers first: an absent gateway or a refused token
    // is said in the words every client command uses.
    Client::new(config.clone()).get("/v1/status").await?;
    // reqwest 0.13 (rmcp's) is built without a crypto provider.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let url = format!("{}/mcp", config.base_url);
    let transport = StreamableHttpClientTransport::from_config(
        StreamableHttpClientTransportConfig::with_uri(url.as_str())
            .auth_header(config.token.expose()),
    );
    let relay = ListChanged::default();
    let gateway = relay
        .clone()
        .serve(transport)
        .await
        .with_context(|| format!("cannot start an MCP session with the gateway at {url}"))?;
    let bridge = Bridge { gateway: gateway.peer().clone(), relay };
    let served = bridge
        .serve(rmcp::transport::stdio())
        .await
        .context("the MCP client on stdin did not start a session")?;
    let ended = served.waiting().await;
    let _ = gateway.cancel().await;
    ended.context("the stdio MCP session failed")?;
    Ok(failure::OK)
}

/// The gateway's side: passes `tools/list_changed` on to the stdio client,
/// to its session once it has one (the `initialize` era) and to its
/// `subscriptions/listen` streams (later ones).
#[derive(Debug, Clone)]
struct ListChanged {
    client: Arc<OnceLock<Peer<RoleServer>>>,
    /// Bumped at every change the gateway announces; the streams follow it.
    version: Arc<watch::Sender<u64>>,
}

impl Default for ListChanged {
    fn default() -> Self {
        ListChanged { client: Arc::default(), version: Arc::new(watch::Sender::new(0)) }
    }
}

impl ClientHandler for ListChanged {
    fn get_info(&self) -> McpClientInfo {
        McpClientInfo::new(
            ClientCapabilities::default(),
            Implementation::new("lemon-gateway-mcp", env!("CARGO_PKG_VERSION")),
        )
    }

    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.version.send_modify(|version| *version += 1);
        if let Some(client) = self.client.get() {
            if let Err(error) = client.notify_tool_list_changed().await {
                tracing::debug!(%error, "could not pass tools/list_changed on");
            }
        }
    }
}

/// The stdio side: every request goes to the gateway.
#[derive(Debug, Clone)]
struct Bridge {
    gateway: Peer<RoleClient>,
    relay: ListChanged,
}

// The gateway's session with this bridge is of the `initialize` era, whose
// results carry no `resultType`; the stdio client's may be of a later one,
// which needs it (rmcp takes it off again for an older client).

/// A failure to reach the gateway as the stdio client reads it: the
/// gateway's own JSON-RPC error as it is, anything else an internal error.
fn relayed(error: ServiceError) -> McpError {
    match error {
        ServiceError::McpError(error) => error,
        other => McpError::internal_error(format!("the gateway did not answer: {other}"), None),
    }
}

impl ServerHandler for Bridge {
    fn get_info(&self) -> ServerConfig {
        lemon_api::mcp::server_config()
    }

    async fn list_tools(
        &self,
        request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let mut tools = self.gateway.list_tools(request).await.map_err(relayed)?;
        tools.result_type.get_or_insert(ResultType::COMPLETE);
        Ok(tools)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let mut response = self.gateway.call_tool_once(request).await.map_err(relayed)?;
        if let CallToolResponse::Complete(result) = &mut response {
            result.result_type.get_or_insert(ResultType::COMPLETE);
        }
        Ok(response)
    }

    async fn on_initialized(&self, context: NotificationContext<RoleServer>) {
        let _ = self.relay.client.set(context.peer);
    }

    fn accepted_subscription_filter(
        &self,
        requested: &SubscriptionFilter,
    ) -> Option<SubscriptionFilter> {
        lemon_api::mcp::tools_subscription(requested)
    }

    async fn listen(&self, context: SubscriptionContext) -> Result<(), McpError> {
        let mut changes = self.relay.version.subscribe();
        loop {
            tokio::select! {
                () = context.cancelled() => return Ok(()),
                changed = changes.changed() => {
                    if changed.is_err() || context.sink().notify_tool_list_changed().await.is_err() {
                        return Ok(());
                    }
                }
            }
        }
    }
}
