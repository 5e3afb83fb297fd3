//! Which tools a caller sees, in name order, and the pages `tools/list`
//! answers with.
//!
//! A run sees `approve` and the gateway's tools offered to its session and
//! let through by its tool filter; the owner sees the control tools and the
//! gateway's tools offered to the session it acts for. A registered tool
//! named like one of the endpoint's own is never shown nor called.
//!
//! A cursor is opaque to the client: the last name of the page before, in
//! base64. A page starts after that name, so a tool registered between two
//! pages neither shifts nor repeats the rest.

use std::sync::Arc;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use lemon_core::approvals::TokenRun;
use lemon_core::ids::SessionKey;
use lemon_core::mcp::ToolFilter;
use lemon_core::tool::{Tool, ToolRegistry, ToolSpec};
use rmcp::model::{CacheScope, CallToolResult, ContentBlock, ListToolsResult};
use rmcp::ErrorData as McpError;
use serde_json::{json, Map, Value};

use super::{control, APPROVE_TOOL};

/// Tools in one page of `tools/list`.
pub const TOOLS_PER_PAGE: usize = 50;
/// What a cursor's text starts with, so a made-up cursor is refused.
const CURSOR_PREFIX: &str = "after:";

/// Whether `name` is one of the endpoint's own tools (never a registered one).
fn reserved(name: &str) -> bool {
    name == APPROVE_TOOL || control::Tool::named(name).is_some()
}

/// A gateway tool `run` may call: offered to its session, let through by
/// its filter.
pub(super) fn run_tool(
    registry: &ToolRegistry,
    run: &TokenRun,
    name: &str,
) -> Option<Arc<dyn Tool>> {
    let session = SessionKey::from(run.session_key.as_str());
    let filter = ToolFilter::from_meta(&run.meta);
    registry
        .get(name)
        .filter(|tool| !reserved(name) && filter.allows(name) && tool.offered(&session))
}

/// A gateway tool the owner may call for `session`.
pub(super) fn owner_tool(
    registry: &ToolRegistry,
    session: &SessionKey,
    name: &str,
) -> Option<Arc<dyn Tool>> {
    registry.get(name).filter(|tool| !reserved(name) && tool.offered(session))
}

/// What a run sees, in name order.
pub(super) fn for_run(registry: &ToolRegistry, run: &TokenRun) -> Vec<rmcp::model::Tool> {
    let session = SessionKey::from(run.session_key.as_str());
    let filter = ToolFilter::from_meta(&run.meta);
    let mut tools: Vec<_> = registry
        .list()
        .iter()
        .map(|tool| (tool.spec(), tool))
        .filter(|(spec, tool)| {
            !reserved(&spec.name) && filter.allows(&spec.name) && tool.offered(&session)
        })
        .map(|(spec, _)| described(spec))
        .collect();
    if asks_through_approve(run) {
        tools.push(approve());
    }
    tools.sort_by(|a, b| a.name.cmp(&b.name));
    tools
}

/// Whether the run's CLI asks its permission prompts through `approve`:
/// Claude Code's alone (the others relay theirs over their own protocols).
pub(super) fn asks_through_approve(run: &TokenRun) -> bool {
    run.engine == CLAUDE
}

/// The engine whose runs ask through `approve`.
const CLAUDE: &str = "claude";

/// Whether the gateway judges the run's calls of its tools by the owner's
/// rules before running them: for every CLI but Claude Code (which asks
/// through `approve` about `mcp__lemon__<tool>`) and OpenCode (whose relay
/// asks about `lemon_<tool>`). Codex runs them without asking, Droid by its
/// own permission level.
pub(super) fn judged_here(run: &TokenRun) -> bool {
    !matches!(run.engine.as_str(), CLAUDE | "opencode")
}

/// What the owner sees acting for `session`, in name order.
pub(super) fn for_owner(registry: &ToolRegistry, session: &SessionKey) -> Vec<rmcp::model::Tool> {
    let mut tools: Vec<_> = registry
        .list()
        .iter()
        .map(|tool| (tool.spec(), tool))
        .filter(|(spec, tool)| !reserved(&spec.name) && tool.offered(session))
        .map(|(spec, _)| described(spec))
        .collect();
    tools.extend(control::Tool::ALL.iter().map(|tool| tool.describe()));
    tools.sort_by(|a, b| a.name.cmp(&b.name));
    tools
}

/// The page of `tools` after `cursor` (the first without one).
///
/// # Errors
/// An invalid-params error for a cursor this endpoint did not make.
pub(super) fn page(
    tools: Vec<rmcp::model::Tool>,
    cursor: Option<&str>,
) -> Result<ListToolsResult, McpError> {
    let after = cursor.map(decode).transpose()?;
    let rest: Vec<_> = tools
        .into_iter()
        .filter(|tool| after.as_deref().is_none_or(|after| tool.name.as_ref() > after))
        .collect();
    let more = rest.len() > TOOLS_PER_PAGE;
    let page: Vec<_> = rest.into_iter().take(TOOLS_PER_PAGE).collect();
    let next = if more { page.last().map(|tool| encode(&tool.name)) } else { None };
    let mut result = ListToolsResult::with_all_items(page)
        // The list depends on who asks and changes as tools are registered.
        .with_ttl_ms(0)
        .with_cache_scope(CacheScope::Private);
    result.next_cursor = next;
    Ok(result)
}

fn encode(name: &str) -> String {
    URL_SAFE_NO_PAD.encode(format!("{CURSOR_PREFIX}{name}"))
}

fn decode(cursor: &str) -> Result<String, McpError> {
    let invalid = || McpError::invalid_params("invalid cursor: not one this server gave", None);
    let bytes = URL_SAFE_NO_PAD.decode(cursor.trim()).map_err(|_| invalid())?;
    let text = String::from_utf8(bytes).map_err(|_| invalid())?;
    text.strip_prefix(CURSOR_PREFIX).map(str::to_owned).ok_or_else(invalid)
}

/// A gateway tool as MCP describes it.
fn described(spec: ToolSpec) -> rmcp::model::Tool {
    let schema = match spec.parameters {
        Value::Object(schema) => schema,
        _ => object(json!({ "type": "object" })),
    };
    rmcp::model::Tool::new(spec.name, spec.description, schema)
}

/// `value`'s object (an empty one for anything else).
pub(super) fn object(value: Value) -> Map<String, Value> {
    match value {
        Value::Object(map) => map,
        _ => Map::new(),
    }
}

fn approve() -> rmcp::model::Tool {
    let schema = object(json!({
        "type": "object",
        "properties": {
            "tool_name": { "type": "string", "description": "The tool the agent wants to call." },
            "input": { "type": "object", "description": "The call's input." },
            "tool_use_id": { "type": "string", "description": "The call's id." },
        },
        "required": ["tool_name", "input"],
    }));
    rmcp::model::Tool::new(
        APPROVE_TOOL,
        "Asks the gateway's owner whether a tool call may run: the owner's rules decide, or the owner answers from a chat, the dashboard, the API or the command line.",
        schema,
    )
}

/// A bad argument: an `isError` result naming it.
pub(super) fn argument_error(name: &str, problem: &str) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(format!("invalid argument {name}: {problem}"))])
}
