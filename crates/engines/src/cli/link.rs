//! A run's line to the gateway's MCP endpoint (`/mcp`): its registration with
//! the approvals [`Gate`] (the run's token) and what its CLI is given to reach
//! the endpoint with that token.
//!
//! A run registers when its CLI talks to the gateway: to ask about its calls
//! (Claude's `--permission-prompt-tool`; Codex's and OpenCode's servers when a
//! rule may refuse, relayed in-process) or to call the gateway's own tools
//! (`gateway_tools`, on by default, once the endpoint listens). The token
//! names the run, so a gateway tool called with it acts for the run's
//! session. It reaches the CLI only in a 0600 file removed with the link or
//! in the CLI's environment, never on its command line or in a log, and it
//! is withdrawn when the link is dropped (the run's process is gone):
//!
//! | CLI | pointed at `/mcp` by | the token in |
//! |---|---|---|
//! | Claude Code | `--mcp-config <file>`: `mcpServers.lemon`, `type = "http"` | the file's `Authorization` header |
//! | Codex | `-c mcp_servers.lemon.url="…"` `-c mcp_servers.lemon.bearer_token_env_var="LEMON_MCP_TOKEN"` `-c mcp_servers.lemon.default_tools_approval_mode="approve"` `-c mcp_servers.lemon.tool_timeout_sec=3600.0` | `LEMON_MCP_TOKEN` |
//! | OpenCode | `OPENCODE_CONFIG_CONTENT`: `mcp.lemon`, `type = "remote"`, merged into the section's own | that variable's `headers` |
//! | Droid | `--settings <file>` (runtime settings for the one process): `mcp.mcpServers.lemon`, `type = "http"` | the file's `Authorization` header |
//! | Pi | nothing: Pi has no MCP client | — |
//!
//! A link without the gateway's tools (`gateway_tools = false`) narrows the
//! run's tool filter to `approve`, so its token opens nothing but the relay.

use std::collections::BTreeMap;
use std::fmt;
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use lemon_core::approvals::{Gate, Registration, RunScope, RunTicket};
use lemon_core::engine::{EventSink, StartRequest};
use serde_json::{json, Value};

use super::runner::Asker;
use super::settings::CliSettings;
use super::Vendor;

/// The gateway's server name in every CLI's MCP configuration: Claude shows
/// its tools as `mcp__lemon__<tool>`, Codex as `<tool>` in the namespace
/// `mcp__lemon`.
pub(crate) const SERVER: &str = "lemon";
/// The endpoint's permission tool (Claude's `mcp__lemon__approve`).
pub(crate) const APPROVE_TOOL: &str = "approve";
/// The variable Codex reads the run's bearer token from (named like a
/// secret, so the gateway's and Codex's secret-name filters treat it as one).
pub(crate) const TOKEN_ENV: &str = "LEMON_MCP_TOKEN";
/// How long Codex waits for one call of the gateway's tools, in seconds.
const CODEX_TOOL_TIMEOUT_SEC: f64 = 3600.0;
/// The variable OpenCode reads a configuration from, over its files.
pub(crate) const OPENCODE_CONFIG_ENV: &str = "OPENCODE_CONFIG_CONTENT";

/// Whether `vendor`'s CLI has an MCP client the gateway can configure for
/// one run without writing into the user's home.
pub(crate) fn takes_gateway_tools(vendor: Vendor) -> bool {
    !matches!(vendor, Vendor::Pi)
}

/// A run's registration with the gate, and its CLI's way to the endpoint.
pub(crate) struct GateLink {
    gate: Gate,
    registration: Registration,
    /// How the CLI reaches `/mcp`; `None` when it does not (a relayed run
    /// without the gateway's tools, or an endpoint not listening).
    access: Option<McpAccess>,
    /// Codex's or OpenCode's calls are relayed by the gateway's client of
    /// their server.
    relayed: bool,
}

impl fmt::Debug for GateLink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GateLink")
            .field("access", &self.access)
            .field("relayed", &self.relayed)
            .finish_non_exhaustive()
    }
}

impl GateLink {
    /// The link of a run of `vendor` about to start, or `None` when its CLI
    /// has no reason to talk to the gateway.
    ///
    /// # Errors
    /// The file the CLI reads its MCP configuration from could not be
    /// written; nothing is left registered or on disk.
    pub(crate) fn open(
        gate: &Gate,
        vendor: Vendor,
        settings: &CliSettings,
        scope: &RunScope<'_>,
        req: &StartRequest,
        sink: &EventSink,
    ) -> io::Result<Option<GateLink>> {
        let url = gate.url();
        let asks = !settings.skip_permissions;
        let prompts = vendor == Vendor::Claude && asks && url.is_some();
        // Codex and OpenCode ask through their own servers, when a rule may say no.
        let relayed =
            matches!(vendor, Vendor::Codex | Vendor::Opencode) && asks && gate.may_refuse(scope);
        let tools = settings.gateway_tools && url.is_some() && takes_gateway_tools(vendor);
        if !(prompts || relayed || tools) {
            return Ok(None);
        }
        let mut meta = req.meta.clone();
        if !tools {
            lemon_core::mcp::ToolFilter::narrow_meta(&mut meta, &[APPROVE_TOOL.to_owned()]);
        }
        let registration = gate.register(RunTicket {
            run_id: req.run_id.to_string(),
            session_key: req.session_key.to_string(),
            engine: vendor.id().to_owned(),
            cwd: req.cwd.clone(),
            meta,
            sink: sink.clone(),
        });
        let access = match url.filter(|_| prompts || tools) {
            Some(url) => {
                Some(McpAccess::new(vendor, url, &registration.token, prompts, &settings.env)?)
            }
            None => None,
        };
        Ok(Some(GateLink { gate: gate.clone(), registration, access, relayed }))
    }

    /// How the CLI reaches the endpoint, when it does.
    pub(crate) fn access(&self) -> Option<&McpAccess> {
        self.access.as_ref()
    }

    /// Whether the run's calls are relayed by the gateway's client of the
    /// CLI's server (Codex's app server, OpenCode's server).
    pub(crate) fn relayed(&self) -> bool {
        self.relayed
    }

    /// Whether a call of the run waits for the owner's answer now.
    pub(crate) fn asking(&self) -> bool {
        self.registration.asking.load(std::sync::atomic::Ordering::SeqCst) > 0
    }

    /// How a relayed CLI's client asks about the run's calls.
    pub(crate) fn asker(&self) -> Asker {
        Asker::new(self.gate.clone(), self.registration.token.clone())
    }
}

/// What a CLI is given to reach `/mcp` as one run.
pub(crate) struct McpAccess {
    vendor: Vendor,
    url: String,
    token: String,
    /// Claude's `--mcp-config`, Droid's `--settings`; removed on drop.
    file: Option<SecretFile>,
    /// Claude asks about its calls through `approve`.
    prompts: bool,
    /// The section's own `OPENCODE_CONFIG_CONTENT`, which the gateway's
    /// server is merged into.
    opencode_config: Option<String>,
}

impl fmt::Debug for McpAccess {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("McpAccess")
            .field("vendor", &self.vendor)
            .field("url", &self.url)
            .field("file", &self.file.as_ref().map(|file| &file.path))
            .field("prompts", &self.prompts)
            .finish_non_exhaustive()
    }
}

impl McpAccess {
    /// The access of a run of `vendor` holding `token`; writes the file the
    /// CLI reads it from, for the CLIs that read one. `env` is the section's
    /// `env`.
    pub(crate) fn new(
        vendor: Vendor,
        url: &str,
        token: &str,
        prompts: bool,
        env: &BTreeMap<String, String>,
    ) -> io::Result<McpAccess> {
        let server = json!({
            "type": "http",
            "url": url,
            "headers": { "Authorization": format!("Bearer {token}") },
        });
        let file = match vendor {
            Vendor::Claude => {
                Some(SecretFile::write(&json!({ "mcpServers": { SERVER: server } }))?)
            }
            Vendor::Droid => {
                Some(SecretFile::write(&json!({ "mcp": { "mcpServers": { SERVER: server } } }))?)
            }
            Vendor::Codex | Vendor::Opencode | Vendor::Pi => None,
        };
        Ok(McpAccess {
            vendor,
            url: url.to_owned(),
            token: token.to_owned(),
            file,
            prompts,
            opencode_config: env.get(OPENCODE_CONFIG_ENV).cloned(),
        })
    }

    /// The file holding the configuration (Claude's `--mcp-config`, Droid's
    /// `--settings`).
    pub(crate) fn file(&self) -> Option<&Path> {
        self.file.as_ref().map(|file| file.path.as_path())
    }

    /// Whether Claude asks about its calls through `approve`.
    pub(crate) fn prompts(&self) -> bool {
        self.prompts
    }

    /// Codex's `-c` overrides naming the server, the variable its token is
    /// in, and that Codex runs its tools unasked: it would otherwise refuse
    /// them under `codex exec` (its approval policy is `never`) and ask its
    /// app-server client, which relays only commands and file changes. The
    /// gateway judges them itself by the owner's rules, and a call may wait
    /// for the owner's answer (or `sms_wait_for_code` for a text) far longer
    /// than Codex's default 60 s per call: an hour.
    pub(crate) fn codex_args(&self) -> Vec<String> {
        let string = |text: &str| toml::Value::String(text.to_owned()).to_string();
        [
            format!("mcp_servers.{SERVER}.url={}", string(&self.url)),
            format!("mcp_servers.{SERVER}.bearer_token_env_var={}", string(TOKEN_ENV)),
            format!("mcp_servers.{SERVER}.default_tools_approval_mode={}", string("approve")),
            format!("mcp_servers.{SERVER}.tool_timeout_sec={CODEX_TOOL_TIMEOUT_SEC:.1}"),
        ]
        .into_iter()
        .flat_map(|value| ["-c".to_owned(), value])
        .collect()
    }

    /// Puts the token where the CLI reads it from its environment: Codex's
    /// bearer variable, OpenCode's configuration (merged into the section's
    /// own `OPENCODE_CONFIG_CONTENT`; one that is not a JSON object is left
    /// alone and the run goes without the gateway's tools).
    pub(crate) fn add_env(&self, env: &mut BTreeMap<String, String>) {
        match self.vendor {
            Vendor::Codex => {
                env.insert(TOKEN_ENV.to_owned(), self.token.clone());
            }
            Vendor::Opencode => {
                let mut config = match self.opencode_config.as_deref() {
                    None => json!({}),
                    Some(text) => match serde_json::from_str::<Value>(text) {
                        Ok(config @ Value::Object(_)) => config,
                        _ => {
                            tracing::warn!(
                                engine = self.vendor.id(),
                                "OPENCODE_CONFIG_CONTENT in the engine's env is not a JSON object; \
                                 the run goes without the gateway's tools"
                            );
                            return;
                        }
                    },
                };
                if !config["mcp"].is_object() {
                    config["mcp"] = json!({});
                }
                config["mcp"][SERVER] = json!({
                    "type": "remote",
                    "url": self.url,
                    "headers": { "Authorization": format!("Bearer {}", self.token) },
                    "oauth": false,
                });
                env.insert(OPENCODE_CONFIG_ENV.to_owned(), config.to_string());
            }
            Vendor::Claude | Vendor::Droid | Vendor::Pi => {}
        }
    }
}

/// A file only the gateway's user can read, removed when dropped.
struct SecretFile {
    path: PathBuf,
}

impl SecretFile {
    /// Writes `content` to a new file of its own in the temporary directory.
    fn write(content: &Value) -> io::Result<SecretFile> {
        let name = format!("lemon-mcp-{}.json", uuid::Uuid::new_v4().simple());
        let path = std::env::temp_dir().join(name);
        let mut file =
            std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&path)?;
        // From here on the file is removed whatever happens.
        let secret = SecretFile { path };
        file.write_all(content.to_string().as_bytes())?;
        Ok(secret)
    }
}

impl Drop for SecretFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

#[cfg(test)]
mod tests;
