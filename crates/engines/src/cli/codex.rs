//! Codex: `codex exec --json`, the prompt on stdin; a run whose calls the
//! owner judges runs `codex app-server` instead ([`app_server`]), whose
//! client prints the same lines.
//!
//! Command line: `codex [extra_args…] exec [--model=m] --json --skip-git-repo-check
//! --color=never [--dangerously-bypass-approvals-and-sandbox]
//! -c model_auto_compact_token_limit=170000 [-c mcp_servers.lemon.url="<url>"
//! -c mcp_servers.lemon.bearer_token_env_var="LEMON_MCP_TOKEN"
//! -c mcp_servers.lemon.default_tools_approval_mode="approve"
//! -c mcp_servers.lemon.tool_timeout_sec=3600.0] [resume -- <thread_id>] -`;
//! the prompt and a newline go on stdin, which is then closed. The
//! `mcp_servers.lemon` overrides point Codex at the gateway's endpoint for
//! its tools ([`super::link`]); the run's token is in `LEMON_MCP_TOKEN`.
//!
//! Schema (`type`): `thread.started`, `turn.started`, `turn.completed`,
//! `turn.failed`, `error`, `item.started|updated|completed` with items
//! `agent_message`, `reasoning`, `command_execution`, `file_change`,
//! `mcp_tool_call`, `web_search`, `todo_list`, `error`. Any other type, or item
//! type, is a decode error.
//!
//! Mapping: `thread.started` → `Started` (`codex:<thread_id>`); each turn is a note
//! action completed when the turn ends; items are actions whose phase is the event's;
//! agent messages are streamed and the last one is the answer; `Reconnecting… n/m`
//! errors update one `codex.reconnect` note; other errors are warnings;
//! `turn.completed` / `turn.failed` → `Completed`.

use lemon_core::engine::{Action, ActionKind, ActionPhase};
use serde::Deserialize;
use serde_json::{json, Value};

use super::process::StdinMode;
use super::tools::result_preview;
use super::translate::{head_chars, DecodeError, Emitter, ParseContext, StreamParser};
use super::{CommandInput, Invocation};

const RECONNECT_ID: &str = "codex.reconnect";

pub(super) fn command(input: &CommandInput<'_>) -> Invocation {
    let settings = input.settings;
    let mut args: Vec<String> = settings.extra_args.clone();
    args.push("exec".to_owned());
    let model = input.model(&["codex:", "openai-codex:", "openai:", "chatgpt:"]);
    if let Some(model) = &model {
        args.push(format!("--model={model}"));
    }
    args.extend(["--json", "--skip-git-repo-check", "--color=never"].map(str::to_owned));
    if settings.skip_permissions {
        args.push("--dangerously-bypass-approvals-and-sandbox".to_owned());
    }
    args.extend(["-c", "model_auto_compact_token_limit=170000"].map(str::to_owned));
    if let Some(access) = input.gateway_mcp {
        args.extend(access.codex_args());
    }
    if let Some(thread) = input.resume {
        // After `--` the thread id and `-` are positional, whatever they start with.
        args.extend(["resume".to_owned(), "--".to_owned(), thread.to_owned()]);
    }
    args.push("-".to_owned());
    let stdin = StdinMode::Write(format!("{}\n", input.prompt).into_bytes());
    Invocation { args, stdin, env: Vec::new(), prompt_is_last_arg: false, model, new_session: None }
}

#[derive(Debug, Deserialize)]
#[serde(tag = "type")]
enum Line {
    #[serde(rename = "thread.started")]
    ThreadStarted { thread_id: String },
    #[serde(rename = "turn.started")]
    TurnStarted,
    #[serde(rename = "turn.completed")]
    TurnCompleted { usage: Option<Usage> },
    #[serde(rename = "turn.failed")]
    TurnFailed { error: Option<ErrorInfo> },
    #[serde(rename = "error")]
    Error { message: Option<String> },
    #[serde(rename = "item.started")]
    ItemStarted { item: Item },
    #[serde(rename = "item.updated")]
    ItemUpdated { item: Item },
    #[serde(rename = "item.completed")]
    ItemCompleted { item: Item },
}

#[derive(Debug, Deserialize)]
struct Usage {
    input_tokens: Option<u64>,
    cached_input_tokens: Option<u64>,
    output_tokens: Option<u64>,
}

#[derive(Debug, Deserialize)]
struct ErrorInfo {
    message: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Item {
    AgentMessage {
        #[serde(default)]
        text: String,
    },
    Reasoning {
        id: String,
        #[serde(default)]
        text: String,
    },
    CommandExecution {
        id: String,
        #[serde(default)]
        command: String,
        exit_code: Option<i64>,
        status: Option<String>,
    },
    FileChange {
        id: String,
        #[serde(default)]
        changes: Vec<Change>,
        status: Option<String>,
    },
    McpToolCall {
        id: String,
        #[serde(default)]
        server: String,
        #[serde(default)]
        tool: String,
        #[serde(default)]
        arguments: Value,
        #[serde(default)]
        result: Value,
        error: Option<ErrorInfo>,
        status: Option<String>,
    },
    WebSearch {
        id: String,
        #[serde(default)]
        query: String,
    },
    TodoList {
        id: String,
        #[serde(default)]
        items: Vec<Todo>,
    },
    Error {
        id: String,
        #[serde(default)]
        message: String,
    },
}

#[derive(Debug, Deserialize)]
struct Change {
    path: String,
    kind: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Todo {
    #[serde(default)]
    completed: bool,
}

/// Codex's `exec --json` parser.
#[derive(Debug)]
pub(super) struct Parser {
    ctx: ParseContext,
    /// The last agent message: the answer.
    answer: String,
    n_turns: usize,
    /// The action of the turn in progress.
    turn: Option<String>,
}

impl Parser {
    pub(super) fn new(ctx: ParseContext) -> Self {
        Parser { ctx, answer: String::new(), n_turns: 0, turn: None }
    }

    fn command_title(&self, command: &str) -> String {
        let command = match self.ctx.home.as_deref().filter(|home| home.len() > 1) {
            Some(home) => command.replace(home, "~"),
            None => command.to_owned(),
        };
        head_chars(&command, 80).to_owned()
    }

    fn end_turn(&mut self, ok: bool, out: &mut Emitter) {
        if out.is_pending(RECONNECT_ID) {
            out.complete_action(
                RECONNECT_ID,
                ok,
                Value::Null,
                (ActionKind::Note, "Reconnecting".to_owned()),
            );
        }
        if let Some(turn) = self.turn.take() {
            out.complete_action(
                &turn,
                ok,
                Value::Null,
                (ActionKind::Note, "turn started".to_owned()),
            );
        }
    }

    fn item(&mut self, phase: ActionPhase, item: Item, out: &mut Emitter) {
        match item {
            Item::AgentMessage { text, .. } => {
                if phase == ActionPhase::Completed {
                    out.paragraph(&text);
                    self.answer = text;
                }
            }
            Item::Reasoning { id, text } => {
                let detail = json!({ "reasoning": { "text": text, "source": "codex_reasoning" } });
                phased(
                    out,
                    phase,
                    &id,
                    ActionKind::Reasoning,
                    head_chars(&text, 100).to_owned(),
                    detail,
                    true,
                );
            }
            Item::CommandExecution { id, command, exit_code, status } => {
                let title = self.command_title(&command);
                let completed = status.as_deref() == Some("completed");
                let ok = completed && exit_code.is_none_or(|code| code == 0);
                let detail =
                    json!({ "exit_code": exit_code, "status": status_name(status.as_deref()) });
                phased(out, phase, &id, ActionKind::Command, title, detail, ok);
            }
            Item::McpToolCall { id, server, tool, arguments, result, error, status } => {
                let title =
                    if server.is_empty() { tool.clone() } else { format!("{server}.{tool}") };
                let mut detail = json!({
                    "server": server,
                    "tool": tool,
                    "status": status_name(status.as_deref()),
                    "arguments": arguments,
                });
                let error_message = error.and_then(|error| error.message);
                let ok = status.as_deref() == Some("completed") && error_message.is_none();
                if phase == ActionPhase::Completed {
                    let preview =
                        result_preview(&result.get("content").cloned().unwrap_or(Value::Null));
                    detail["error_message"] = json!(error_message);
                    detail["result_preview"] = json!(preview);
                    detail["result_summary"] = json!(preview);
                }
                phased(out, phase, &id, ActionKind::Tool, title, detail, ok);
            }
            Item::WebSearch { id, query } => {
                phased(
                    out,
                    phase,
                    &id,
                    ActionKind::WebSearch,
                    query.clone(),
                    json!({ "query": query }),
                    true,
                );
            }
            Item::FileChange { id, changes, status } => {
                if phase == ActionPhase::Completed {
                    let title = match changes.len() {
                        0 => "no changes".to_owned(),
                        1 => "1 file changed".to_owned(),
                        n => format!("{n} files changed"),
                    };
                    let changes: Vec<Value> = changes
                        .iter()
                        .map(|c| json!({ "path": c.path, "kind": c.kind.as_deref().unwrap_or("update") }))
                        .collect();
                    let ok = status.as_deref() == Some("completed");
                    let detail = json!({ "changes": changes, "status": status_name(status.as_deref()), "error": null });
                    out.completed_action(&id, ActionKind::FileChange, title, detail, ok);
                }
            }
            Item::TodoList { id, items } => {
                let done = items.iter().filter(|item| item.completed).count();
                let total = items.len();
                let detail = json!({ "done": done, "total": total });
                phased(
                    out,
                    phase,
                    &id,
                    ActionKind::Note,
                    format!("{done}/{total} tasks"),
                    detail,
                    true,
                );
            }
            Item::Error { id, message } => {
                if phase == ActionPhase::Completed {
                    out.warning(&id, &message, Value::Null);
                }
            }
        }
    }

    fn error(&mut self, message: String, out: &mut Emitter) {
        match reconnect_attempt(&message) {
            Some((attempt, max)) => out.raw_action(Action {
                id: RECONNECT_ID.to_owned(),
                kind: ActionKind::Note,
                title: message.clone(),
                detail: json!({ "attempt": attempt, "max": max }),
                phase: if attempt <= 1 { ActionPhase::Started } else { ActionPhase::Updated },
                ok: None,
                message: Some(message),
                level: Some("info".to_owned()),
                result_meta: serde_json::Value::Null,
            }),
            None => out.note(message, false),
        }
    }
}

/// An item event as an action in the event's phase.
fn phased(
    out: &mut Emitter,
    phase: ActionPhase,
    id: &str,
    kind: ActionKind,
    title: String,
    detail: Value,
    ok: bool,
) {
    match phase {
        ActionPhase::Started => out.start_action(id, kind, title, detail),
        ActionPhase::Updated => out.update_action(id, kind, title, detail),
        ActionPhase::Completed => {
            out.complete_action(id, ok, detail, (kind, title));
        }
    }
}

/// Codex statuses; anything unknown counts as in progress.
fn status_name(status: Option<&str>) -> &'static str {
    match status {
        Some("completed") => "completed",
        Some("failed") => "failed",
        Some("declined") => "declined",
        _ => "in_progress",
    }
}

/// `(attempt, max)` of a `Reconnecting… 2/5` message.
fn reconnect_attempt(message: &str) -> Option<(u64, u64)> {
    let start = message.find("Reconnecting")?;
    let rest = &message[start..];
    let bytes = rest.as_bytes();
    (0..bytes.len()).find_map(|i| {
        let attempt_len = bytes[i..].iter().take_while(|b| b.is_ascii_digit()).count();
        if attempt_len == 0 || bytes.get(i + attempt_len) != Some(&b'/') {
            return None;
        }
        let max_start = i + attempt_len + 1;
        let max_len = bytes[max_start..].iter().take_while(|b| b.is_ascii_digit()).count();
        if max_len == 0 {
            return None;
        }
        let attempt = rest[i..i + attempt_len].parse().ok()?;
        let max = rest[max_start..max_start + max_len].parse().ok()?;
        Some((attempt, max))
    })
}

impl StreamParser for Parser {
    fn line(&mut self, line: &str, out: &mut Emitter) -> Result<(), DecodeError> {
        match serde_json::from_str::<Line>(line)? {
            Line::ThreadStarted { thread_id } => {
                out.started(Some(&thread_id), "Codex", Value::Null)
            }
            Line::TurnStarted => {
                let id = format!("turn_{}", self.n_turns);
                self.n_turns += 1;
                out.start_action(&id, ActionKind::Note, "turn started".to_owned(), Value::Null);
                self.turn = Some(id);
            }
            Line::TurnCompleted { usage } => {
                self.end_turn(true, out);
                let usage = usage.unwrap_or(Usage {
                    input_tokens: None,
                    cached_input_tokens: None,
                    output_tokens: None,
                });
                let usage = json!({
                    "input_tokens": usage.input_tokens.unwrap_or(0),
                    "cached_input_tokens": usage.cached_input_tokens.unwrap_or(0),
                    "output_tokens": usage.output_tokens.unwrap_or(0),
                });
                out.complete_ok(self.answer.clone(), usage);
            }
            Line::TurnFailed { error } => {
                self.end_turn(false, out);
                let message = error
                    .and_then(|error| error.message)
                    .unwrap_or_else(|| "codex turn failed".to_owned());
                out.complete_error(message, self.answer.clone(), Value::Null);
            }
            Line::Error { message } => {
                self.error(message.unwrap_or_else(|| "codex error".to_owned()), out)
            }
            Line::ItemStarted { item } => self.item(ActionPhase::Started, item, out),
            Line::ItemUpdated { item } => self.item(ActionPhase::Updated, item, out),
            Line::ItemCompleted { item } => self.item(ActionPhase::Completed, item, out),
        }
        Ok(())
    }

    fn partial_answer(&self) -> String {
        self.answer.clone()
    }

    fn clean_end(&self, out: &Emitter) -> Result<String, String> {
        if out.found().is_none() {
            Err("codex exec finished but no session_id/thread_id was captured".to_owned())
        } else {
            Err("codex exec ended without turn completion".to_owned())
        }
    }
}

pub(super) mod app_server;
#[cfg(test)]
mod tests;
