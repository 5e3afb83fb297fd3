//! The Model Context Protocol, both ways: what the gateway's MCP client (the
//! native engine's `[[gateway.mcp_servers]]`) and its MCP server (`/mcp`,
//! `lemon-gateway mcp`) share.
//!
//! - [`McpServerConfig`]: one `[[gateway.mcp_servers]]` entry, checked where
//!   the config is read ([`McpServerConfig::check`]).
//! - Tool names: a server's tool `search` of server `github` is offered to
//!   the model as `github__search` ([`qualified_name`]); a name or schema a
//!   server gives that a model provider would refuse, or that could pass for
//!   another tool, is refused when the server's tools are loaded
//!   ([`check_tool`]).
//! - [`ToolFilter`]: the tools a conversation may use (`tools = ["bash",
//!   "github__*"]` on a binding, a project or a run request).
//! - [`McpServerStatus`] and [`McpStatusSource`]: what the dashboard, the
//!   health report and `/metrics` show of the servers.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Between a server's name and its tool's: `github__search`.
pub const SEPARATOR: &str = "__";
/// The longest tool name a model is offered (OpenAI's and Anthropic's limit).
pub const MAX_TOOL_NAME: usize = 64;
/// The longest server name.
pub const MAX_SERVER_NAME: usize = 32;
/// The largest input schema accepted from a server, serialized.
pub const MAX_SCHEMA_BYTES: usize = 64 * 1024;
/// The deepest input schema accepted from a server.
pub const MAX_SCHEMA_DEPTH: usize = 32;
/// The longest tool description kept; a longer one is cut here.
pub const MAX_DESCRIPTION_CHARS: usize = 4096;

/// One `[[gateway.mcp_servers]]` entry: a stdio server (`command`) or a
/// Streamable HTTP server (`url`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema)]
pub struct McpServerConfig {
    /// The server's name, the prefix of its tools (`<name>__<tool>`): 1 to
    /// 32 of `a-z`, `0-9`, `_` and `-`, without `__` and not starting or
    /// ending with `_`; unique among the servers.
    #[schemars(length(min = 1, max = MAX_SERVER_NAME), pattern(r"^[a-z0-9-]([a-z0-9_-]*[a-z0-9-])?$"))]
    pub name: String,
    /// The program of a stdio server, found on `PATH` when it has no `/`.
    /// A server has `command` or `url`, not both.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    /// The arguments of a stdio server's program.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// Environment variables of a stdio server, each set to the value of
    /// the secret named (`GITHUB_TOKEN = "github_token"`). The server gets
    /// these and the gateway's safe variables (`PATH`, `HOME`, `LANG`…), no
    /// other.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// The working directory of a stdio server; default the gateway's home.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<PathBuf>,
    /// The endpoint of a Streamable HTTP server (`http://` or `https://`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(r"^https?://"))]
    pub url: Option<String>,
    /// Headers of every request to an HTTP server, each set to the value of
    /// the secret named (`Authorization = "linear_auth"`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    /// `false` keeps the entry without starting the server.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// The server's tools offered (their own names, `*` matches any run of
    /// characters); unset, all of them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<String>>,
    /// How long one tool call may take, in milliseconds.
    #[serde(default = "default_timeout_ms")]
    #[schemars(range(min = 1, max = MAX_TIMEOUT_MS))]
    pub timeout_ms: u64,
    /// How long the server may take to start and list its tools, in
    /// milliseconds.
    #[serde(default = "default_startup_timeout_ms")]
    #[schemars(range(min = 1, max = MAX_TIMEOUT_MS))]
    pub startup_timeout_ms: u64,
}

fn yes() -> bool {
    true
}

fn default_timeout_ms() -> u64 {
    60_000
}

fn default_startup_timeout_ms() -> u64 {
    30_000
}

/// The longest `timeout_ms` or `startup_timeout_ms`: one hour.
pub const MAX_TIMEOUT_MS: u64 = 3_600_000;

/// How a server is reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum McpTransportKind {
    Stdio,
    Http,
}

impl fmt::Display for McpTransportKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            McpTransportKind::Stdio => "stdio",
            McpTransportKind::Http => "http",
        })
    }
}

impl McpServerConfig {
    /// A stdio server `name` started as `command args…`, with the defaults.
    pub fn stdio(name: &str, command: &str, args: &[&str]) -> McpServerConfig {
        McpServerConfig {
            name: name.to_owned(),
            command: Some(command.to_owned()),
            args: args.iter().map(|arg| (*arg).to_owned()).collect(),
            env: BTreeMap::new(),
            cwd: None,
            url: None,
            headers: BTreeMap::new(),
            enabled: true,
            tools: None,
            timeout_ms: default_timeout_ms(),
            startup_timeout_ms: default_startup_timeout_ms(),
        }
    }

    /// An HTTP server `name` at `url`, with the defaults.
    pub fn http(name: &str, url: &str) -> McpServerConfig {
        McpServerConfig {
            command: None,
            args: Vec::new(),
            url: Some(url.to_owned()),
            ..McpServerConfig::stdio(name, "", &[])
        }
    }

    /// How the server is reached (checked configs have exactly one way).
    pub fn transport(&self) -> McpTransportKind {
        if self.url.is_some() {
            McpTransportKind::Http
        } else {
            McpTransportKind::Stdio
        }
    }

    /// Whether the server's own tool `tool` is offered.
    pub fn offers(&self, tool: &str) -> bool {
        self.tools.as_ref().is_none_or(|patterns| patterns.iter().any(|p| glob_match(p, tool)))
    }

    /// The first bad value, as `(key, message)`.
    ///
    /// # Errors
    /// The key of the entry that is wrong and why.
    pub fn check(&self) -> Result<(), (&'static str, String)> {
        check_server_name(&self.name).map_err(|why| ("name", why))?;
        match (&self.command, &self.url) {
            (Some(_), Some(_)) => {
                return Err(("url", "a server has a command or a url, not both".to_owned()))
            }
            (None, None) => {
                return Err((
                    "command",
                    "set command (a stdio server) or url (a Streamable HTTP server)".to_owned(),
                ))
            }
            (Some(command), None) => {
                if command.trim().is_empty() || command.contains('\0') {
                    return Err(("command", "must be a program name or path".to_owned()));
                }
                if self.args.iter().any(|arg| arg.contains('\0')) {
                    return Err(("args", "an argument holds a NUL character".to_owned()));
                }
                if !self.headers.is_empty() {
                    return Err(("headers", "headers are for url servers".to_owned()));
                }
            }
            (None, Some(url)) => {
                let scheme_ok = url.starts_with("http://") || url.starts_with("https://");
                if !scheme_ok || url.chars().any(|c| c.is_whitespace() || c.is_control()) {
                    return Err(("url", format!("{url:?} is not an http:// or https:// URL")));
                }
                if !self.args.is_empty() || !self.env.is_empty() || self.cwd.is_some() {
                    return Err(("url", "args, env and cwd are for command servers".to_owned()));
                }
            }
        }
        for (var, secret) in &self.env {
            if !is_env_name(var) {
                return Err(("env", format!("{var:?} is not an environment variable name")));
            }
            crate::secrets::check_name(secret).map_err(|why| ("env", format!("{var}: {why}")))?;
        }
        for (header, secret) in &self.headers {
            let token = !header.is_empty()
                && header.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_".contains(&b));
            if !token {
                return Err(("headers", format!("{header:?} is not a header name")));
            }
            crate::secrets::check_name(secret)
                .map_err(|why| ("headers", format!("{header}: {why}")))?;
        }
        if let Some(patterns) = &self.tools {
            for pattern in patterns {
                if pattern.is_empty() || pattern.chars().any(|c| c.is_control()) {
                    return Err(("tools", format!("{pattern:?} is not a tool name or pattern")));
                }
            }
        }
        for (key, value) in
            [("timeout_ms", self.timeout_ms), ("startup_timeout_ms", self.startup_timeout_ms)]
        {
            if value == 0 || value > MAX_TIMEOUT_MS {
                return Err((key, format!("must be 1 to {MAX_TIMEOUT_MS}")));
            }
        }
        Ok(())
    }
}

fn is_env_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Checks a server's name: `[a-z0-9_-]+`, at most [`MAX_SERVER_NAME`]
/// characters, no `__` (the separator).
///
/// # Errors
/// Why the name is refused.
pub fn check_server_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= MAX_SERVER_NAME
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"_-".contains(&b))
        && !name.contains(SEPARATOR)
        && !name.starts_with('_')
        && !name.ends_with('_');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{name:?}: a server name is 1 to {MAX_SERVER_NAME} of a-z, 0-9, _ and -, without \
             \"__\" and not starting or ending with _"
        ))
    }
}

/// The name a model is offered for tool `tool` of server `server`.
pub fn qualified_name(server: &str, tool: &str) -> String {
    format!("{server}{SEPARATOR}{tool}")
}

/// `(server, tool)` of a qualified name.
pub fn split_name(name: &str) -> Option<(&str, &str)> {
    name.split_once(SEPARATOR)
}

/// Checks a tool a server lists: its name (`[A-Za-z0-9_-]+`, and the
/// qualified name at most [`MAX_TOOL_NAME`] characters) and its input schema
/// (a JSON object schema of `"type": "object"`, at most [`MAX_SCHEMA_BYTES`]
/// and [`MAX_SCHEMA_DEPTH`] deep).
///
/// # Errors
/// Why the tool is refused, for the log and `doctor`.
pub fn check_tool(server: &str, tool: &str, schema: &serde_json::Value) -> Result<(), String> {
    let name_ok = !tool.is_empty()
        && tool.bytes().all(|b| b.is_ascii_alphanumeric() || b"_-".contains(&b))
        && qualified_name(server, tool).len() <= MAX_TOOL_NAME;
    if !name_ok {
        let shown: String = tool.chars().take(80).collect();
        return Err(format!(
            "tool name {shown:?} refused: a tool name is A-Z, a-z, 0-9, _ and -, and \
             `{server}__<tool>` at most {MAX_TOOL_NAME} characters"
        ));
    }
    let serde_json::Value::Object(object) = schema else {
        return Err(format!("tool {tool:?}: its input schema is not a JSON object"));
    };
    if object.get("type").and_then(serde_json::Value::as_str) != Some("object") {
        return Err(format!("tool {tool:?}: its input schema is not of \"type\": \"object\""));
    }
    let size = serde_json::to_vec(schema).map_or(usize::MAX, |bytes| bytes.len());
    if size > MAX_SCHEMA_BYTES {
        return Err(format!(
            "tool {tool:?}: its input schema is larger than {MAX_SCHEMA_BYTES} bytes"
        ));
    }
    if depth(schema) > MAX_SCHEMA_DEPTH {
        return Err(format!(
            "tool {tool:?}: its input schema is nested deeper than {MAX_SCHEMA_DEPTH}"
        ));
    }
    Ok(())
}

/// A tool's description cut to [`MAX_DESCRIPTION_CHARS`], without control
/// characters but newlines and tabs.
pub fn clean_description(text: &str) -> String {
    text.chars()
        .filter(|c| !c.is_control() || matches!(c, '\n' | '\t'))
        .take(MAX_DESCRIPTION_CHARS)
        .collect()
}

fn depth(value: &serde_json::Value) -> usize {
    // Iterative, so a hostile schema cannot overflow the stack here.
    let mut deepest = 0;
    let mut stack = vec![(value, 1usize)];
    while let Some((value, level)) = stack.pop() {
        deepest = deepest.max(level);
        if level > MAX_SCHEMA_DEPTH {
            return level;
        }
        match value {
            serde_json::Value::Object(map) => stack.extend(map.values().map(|v| (v, level + 1))),
            serde_json::Value::Array(items) => stack.extend(items.iter().map(|v| (v, level + 1))),
            _ => {}
        }
    }
    deepest
}

/// Whether `name` matches `pattern`, where `*` matches any run of characters
/// (`github__*`, `*_send_*`, `bash`).
pub fn glob_match(pattern: &str, name: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    if parts.len() == 1 {
        return pattern == name;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !name.starts_with(first) || name.len() < first.len() + last.len() {
        return false;
    }
    let mut rest = &name[first.len()..];
    for middle in &parts[1..parts.len() - 1] {
        match rest.find(middle) {
            Some(at) => rest = &rest[at + middle.len()..],
            None => return false,
        }
    }
    rest.ends_with(last)
}

/// Which tools a conversation may use: every list given (a binding's, a
/// project's, a request's) narrows it further; a tool is offered when each
/// list has a pattern that matches its name. No list: every tool.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolFilter {
    lists: Vec<Vec<String>>,
}

impl ToolFilter {
    /// Every tool.
    pub fn all() -> ToolFilter {
        ToolFilter::default()
    }

    /// Narrows the filter to the tools `patterns` match.
    pub fn narrow(&mut self, patterns: &[String]) {
        self.lists.push(patterns.to_vec());
    }

    /// Whether the filter lets every tool through.
    pub fn is_all(&self) -> bool {
        self.lists.is_empty()
    }

    /// Whether tool `name` is offered.
    pub fn allows(&self, name: &str) -> bool {
        self.lists.iter().all(|list| list.iter().any(|pattern| glob_match(pattern, name)))
    }

    /// Whether some tool of MCP server `server` (`<server>__…`) may pass:
    /// `false` when every pattern of some list names other tools, so the
    /// server need not be started for the run.
    pub fn may_allow_server(&self, server: &str) -> bool {
        let prefix = qualified_name(server, "");
        self.lists.iter().all(|list| {
            list.iter().any(|pattern| match pattern.split_once('*') {
                // A literal name: one of the server's tools, or not.
                None => pattern.starts_with(&prefix) && pattern.len() > prefix.len(),
                Some((head, _)) => head.starts_with(&prefix) || prefix.starts_with(head),
            })
        })
    }

    /// The lists, narrowest last.
    pub fn lists(&self) -> &[Vec<String>] {
        &self.lists
    }
}

/// The request metadata key the filter of a run travels under (journaled
/// with the message): a list of lists of patterns. A request's own
/// metadata can only narrow it further.
pub const META_KEY: &str = "tool_filter";

impl ToolFilter {
    /// The filter a run's metadata carries; anything unreadable there
    /// narrows to no tool at all rather than to every tool.
    pub fn from_meta(meta: &BTreeMap<String, serde_json::Value>) -> ToolFilter {
        match meta.get(META_KEY) {
            None => ToolFilter::all(),
            Some(value) => serde_json::from_value::<Vec<Vec<String>>>(value.clone())
                .map(|lists| ToolFilter { lists })
                .unwrap_or_else(|_| ToolFilter { lists: vec![Vec::new()] }),
        }
    }

    /// Narrows the filter in `meta` by `patterns`.
    pub fn narrow_meta(meta: &mut BTreeMap<String, serde_json::Value>, patterns: &[String]) {
        let mut filter = ToolFilter::from_meta(meta);
        filter.narrow(patterns);
        meta.insert(META_KEY.to_owned(), serde_json::json!(filter.lists));
    }
}

/// Checks a `tools` list of a binding, a project or a request.
///
/// # Errors
/// The first pattern that is not a tool name or pattern.
pub fn check_patterns(patterns: &[String]) -> Result<(), String> {
    for pattern in patterns {
        let ok = !pattern.is_empty()
            && pattern.len() <= 128
            && pattern.bytes().all(|b| b.is_ascii_alphanumeric() || b"_-*".contains(&b));
        if !ok {
            let shown: String = pattern.chars().take(80).collect();
            return Err(format!(
                "{shown:?} is not a tool name or pattern (A-Z, a-z, 0-9, _, - and *)"
            ));
        }
    }
    Ok(())
}

/// What a configured server is doing now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum McpServerState {
    /// `enabled = false`.
    Disabled,
    /// Not started yet: servers start with the first run that offers them.
    Idle,
    Starting,
    Running,
    /// Its last start or its process failed; it is started again (with
    /// backoff) when a run offers it.
    Failed,
}

impl fmt::Display for McpServerState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            McpServerState::Disabled => "disabled",
            McpServerState::Idle => "idle",
            McpServerState::Starting => "starting",
            McpServerState::Running => "running",
            McpServerState::Failed => "failed",
        })
    }
}

/// One configured server as the dashboard and `/metrics` show it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct McpServerStatus {
    pub name: String,
    pub transport: McpTransportKind,
    pub state: McpServerState,
    /// The offered tools, qualified (`github__search`), in name order.
    pub tools: Vec<String>,
    /// Why the last start or call failed, without secrets.
    pub error: Option<String>,
    /// Tool calls finished, by outcome (`ok`, `error`, `timeout`,
    /// `cancelled`).
    pub calls: BTreeMap<String, u64>,
    /// Times the server was (re)started.
    pub starts: u64,
}

/// Where the API reads the servers' status from (the native engine's MCP
/// client).
pub trait McpStatusSource: Send + Sync + fmt::Debug + 'static {
    fn servers(&self) -> Vec<McpServerStatus>;
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn globs_match_prefixes_suffixes_and_middles() {
        assert!(glob_match("bash", "bash"));
        assert!(!glob_match("bash", "bashx"));
        assert!(glob_match("github__*", "github__search"));
        assert!(!glob_match("github__*", "gitlab__search"));
        assert!(glob_match("*_send_*", "telegram_send_image"));
        assert!(glob_match("*", ""));
        assert!(!glob_match("a*a", "a"));
        assert!(glob_match("a*b*c", "axxbyyc"));
    }

    #[test]
    fn every_list_narrows_the_filter() {
        let mut filter = ToolFilter::all();
        assert!(filter.allows("anything"));
        filter.narrow(&["bash".to_owned(), "github__*".to_owned()]);
        filter.narrow(&["github__*".to_owned()]);
        assert!(filter.allows("github__search"));
        assert!(!filter.allows("bash"), "the second list leaves bash out");

        let mut meta = BTreeMap::new();
        assert!(ToolFilter::from_meta(&meta).is_all());
        ToolFilter::narrow_meta(&mut meta, &["github__*".to_owned()]);
        ToolFilter::narrow_meta(&mut meta, &["github__search".to_owned()]);
        let filter = ToolFilter::from_meta(&meta);
        assert!(filter.allows("github__search") && !filter.allows("github__push"));
        assert!(filter.may_allow_server("github") && !filter.may_allow_server("git"));
        let mut narrowed = ToolFilter::all();
        narrowed.narrow(&["bash".to_owned(), "*_send_*".to_owned()]);
        assert!(narrowed.may_allow_server("fs"), "a leading * may match any server's tool");
        narrowed.narrow(&["bash".to_owned()]);
        assert!(!narrowed.may_allow_server("fs"));
        meta.insert(META_KEY.to_owned(), json!("everything"));
        assert!(!ToolFilter::from_meta(&meta).allows("bash"), "garbage narrows to nothing");
    }

    #[test]
    fn hostile_tool_names_and_schemas_are_refused() {
        let schema = json!({"type": "object", "properties": {}});
        assert!(check_tool("fs", "read_file", &schema).is_ok());
        for name in ["", "bash\nrm", "a b", "x.y", "../x", "é", &"a".repeat(61)] {
            assert!(check_tool("fs", name, &schema).is_err(), "{name:?}");
        }
        assert!(check_tool("fs", "t", &json!({"type": "string"})).is_err());
        assert!(check_tool("fs", "t", &json!([1])).is_err());
        let mut deep = json!({"type": "object"});
        for _ in 0..40 {
            deep = json!({"type": "object", "properties": {"x": deep}});
        }
        assert!(check_tool("fs", "t", &deep).unwrap_err().contains("deeper"));
        let big = json!({"type": "object", "description": "x".repeat(MAX_SCHEMA_BYTES)});
        assert!(check_tool("fs", "t", &big).unwrap_err().contains("larger"));
    }

    #[test]
    fn server_entries_are_checked() {
        assert!(McpServerConfig::stdio("fs", "npx", &["x"]).check().is_ok());
        assert!(McpServerConfig::http("remote", "https://mcp.example.com/mcp").check().is_ok());
        for bad in ["", "Fs", "a__b", "a b", "_a", &"a".repeat(33)] {
            let (key, _) = McpServerConfig::stdio(bad, "npx", &[]).check().unwrap_err();
            assert_eq!(key, "name", "{bad:?}");
        }
        let (key, _) = McpServerConfig::http("x", "ftp://x").check().unwrap_err();
        assert_eq!(key, "url");
        let mut both = McpServerConfig::stdio("x", "npx", &[]);
        both.url = Some("http://127.0.0.1/mcp".to_owned());
        assert_eq!(both.check().unwrap_err().0, "url");
        let mut env = McpServerConfig::stdio("x", "npx", &[]);
        env.env.insert("BAD NAME".to_owned(), "token".to_owned());
        assert_eq!(env.check().unwrap_err().0, "env");
        let mut zero = McpServerConfig::stdio("x", "npx", &[]);
        zero.timeout_ms = 0;
        assert_eq!(zero.check().unwrap_err().0, "timeout_ms");
    }

    #[test]
    fn descriptions_lose_control_characters_and_length() {
        let text = format!("line\u{1b}[31m\nnext{}", "y".repeat(5000));
        let clean = clean_description(&text);
        assert!(!clean.contains('\u{1b}'));
        assert!(clean.contains('\n'));
        assert_eq!(clean.chars().count(), MAX_DESCRIPTION_CHARS);
    }
}
