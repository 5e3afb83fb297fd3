//! Claude Code: `claude -p --output-format stream-json --verbose`, the prompt on stdin.
//!
//! Command line: `claude -p --output-format stream-json --input-format text|stream-json
//! --verbose [--dangerously-skip-permissions] [--mcp-config <file>
//! [--permission-prompt-tool mcp__lemon__approve]] [--allowedTools t…] [--model=m]
//! [--max-budget-usd=<usd>] [extra_args…] [--resume=<session_id>]`, with
//! `--max-budget-usd` where a dollar limit of `[gateway.budgets]` applies;
//! `--mcp-config` names the gateway's endpoint (server `lemon`, [`super::link`])
//! for its tools and, without `--dangerously-skip-permissions`, its
//! permission tool. Without steering the prompt goes on stdin
//! as text and stdin is closed; with steering stdin carries stream-json user messages
//! and stays open until the run's `result`.
//!
//! Schema (`type`): `system` (init: `session_id`, `cwd`, `tools`, `model`,
//! `permissionMode`), `assistant` and `user` (`message.content[]` blocks `text`,
//! `thinking`, `tool_use`, `tool_result`), `result` (`is_error`, `result`,
//! `session_id`, usage and cost). Other types are ignored; a line without `type`
//! is a decode error.
//!
//! Mapping: init → `Started` (`claude:<session_id>`); text → streamed deltas (and
//! the fallback answer); thinking → a completed reasoning action; tool_use →
//! started action (shared classification, path key `file_path`); tool_result →
//! completed action, plus a "Permission denied" warning for a denied call;
//! result → `Completed` (answer `result`, usage and cost on success and failure).

use lemon_core::engine::ActionKind;
use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::process::StdinMode;
use super::tools::{classify, result_preview};
use super::translate::{head_chars, DecodeError, Emitter, ParseContext, StreamParser};
use super::{CommandInput, Invocation};

const PATH_KEYS: &[&str] = &["file_path", "notebook_path"];

/// The gateway's permission tool as Claude names it: `mcp__<server>__<tool>`.
pub(crate) const PERMISSION_TOOL: &str = "mcp__lemon__approve";

pub(super) fn command(input: &CommandInput<'_>) -> Invocation {
    let settings = input.settings;
    let mut args: Vec<String> =
        ["-p", "--output-format", "stream-json", "--input-format"].map(str::to_owned).to_vec();
    args.push(if settings.steering { "stream-json" } else { "text" }.to_owned());
    args.push("--verbose".to_owned());
    if settings.skip_permissions {
        args.push("--dangerously-skip-permissions".to_owned());
    }
    if let Some(access) = input.gateway_mcp {
        // The gateway's endpoint as server `lemon`: its tools, and its permission tool.
        if let Some(config) = access.file() {
            args.push("--mcp-config".to_owned());
            args.push(config.display().to_string());
        }
        if access.prompts() && !settings.skip_permissions {
            // Calls Claude would ask a person about are asked through the gateway.
            args.push("--permission-prompt-tool".to_owned());
            args.push(PERMISSION_TOOL.to_owned());
        }
    }
    if !settings.allowed_tools.is_empty() {
        args.push("--allowedTools".to_owned());
        args.extend(settings.allowed_tools.iter().cloned());
    }
    let model = input.model(&["claude:", "claude/", "anthropic:", "anthropic/"]);
    if let Some(model) = &model {
        args.push(format!("--model={model}"));
    }
    if let Some(usd) = input.max_budget_usd {
        // Claude stops the run itself once it has spent this much.
        args.push(format!("--max-budget-usd={}", usd_arg(usd)));
    }
    args.extend(settings.extra_args.iter().cloned());
    if let Some(session) = input.resume {
        // `--resume` takes an optional value: in the `=` form the value is never
        // mistaken for an option, nor an option for a missing value.
        args.push(format!("--resume={session}"));
    }
    let stdin = if settings.steering {
        StdinMode::KeepOpen(user_message(input.prompt))
    } else {
        StdinMode::Write(format!("{}\n", input.prompt.trim_end()).into_bytes())
    };
    Invocation { args, stdin, env: Vec::new(), prompt_is_last_arg: false, model, new_session: None }
}

/// Dollars for `--max-budget-usd`: at most four decimals, rounded down so the
/// CLI never gets more than what is left.
fn usd_arg(usd: f64) -> String {
    let cents = (usd.max(0.0) * 10_000.0).floor() / 10_000.0;
    format!("{cents:.4}")
}

/// One stream-json user message line, as `--input-format stream-json` reads it.
pub(super) fn user_message(text: &str) -> Vec<u8> {
    let message = json!({
        "type": "user",
        "message": { "role": "user", "content": [{ "type": "text", "text": text }] },
    });
    let mut line = message.to_string().into_bytes();
    line.push(b'\n');
    line
}

#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Line {
    System(SystemLine),
    Assistant(MessageLine),
    User(MessageLine),
    Result(ResultLine),
    #[serde(other)]
    Other,
}

#[derive(Debug, Deserialize)]
struct SystemLine {
    subtype: Option<String>,
    session_id: Option<String>,
    cwd: Option<String>,
    tools: Option<Value>,
    model: Option<String>,
    #[serde(rename = "permissionMode")]
    permission_mode: Option<String>,
}

#[derive(Debug, Deserialize)]
struct MessageLine {
    message: Option<Message>,
    parent_tool_use_id: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Message {
    content: Option<Content>,
    error: Option<Value>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Content {
    Blocks(Vec<Block>),
    // A plain-text user message: nothing in it becomes an event.
    #[allow(dead_code)]
    Text(String),
}

#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Block {
    Text {
        text: String,
    },
    Thinking {
        thinking: String,
        signature: Option<String>,
    },
    ToolUse {
        id: String,
        name: String,
        #[serde(default)]
        input: Value,
    },
    ToolResult {
        tool_use_id: String,
        #[serde(default)]
        content: Value,
        is_error: Option<bool>,
    },
    #[serde(other)]
    Other,
}

#[derive(Debug, Deserialize)]
struct ResultLine {
    subtype: Option<String>,
    is_error: Option<bool>,
    result: Option<String>,
    session_id: Option<String>,
    duration_ms: Option<u64>,
    duration_api_ms: Option<u64>,
    num_turns: Option<u64>,
    total_cost_usd: Option<f64>,
    usage: Option<Usage>,
}

#[derive(Debug, Deserialize)]
struct Usage {
    input_tokens: Option<u64>,
    output_tokens: Option<u64>,
    cache_creation_input_tokens: Option<u64>,
    cache_read_input_tokens: Option<u64>,
}

/// Claude's stream-json parser.
#[derive(Debug)]
pub(super) struct Parser {
    ctx: ParseContext,
    /// The text of the latest assistant message that had any: the fallback answer.
    last_text: String,
    n_thinking: usize,
    /// `result` lines still to come: one per user message written.
    results_due: usize,
}

impl Parser {
    pub(super) fn new(ctx: ParseContext) -> Self {
        Parser { ctx, last_text: String::new(), n_thinking: 0, results_due: 1 }
    }

    /// The blocks of an assistant message, or (`assistant` false) of a user message,
    /// whose only blocks of interest are tool results.
    fn blocks(&mut self, line: &MessageLine, assistant: bool, out: &mut Emitter) {
        let Some(message) = &line.message else { return };
        let parent = line.parent_tool_use_id.as_deref();
        let mut text_seen = false;
        if let Some(Content::Blocks(blocks)) = &message.content {
            for block in blocks {
                match block {
                    Block::Text { text } if assistant => {
                        if !text_seen {
                            self.last_text.clear();
                            text_seen = true;
                        }
                        self.last_text.push_str(text);
                        out.paragraph(text);
                    }
                    Block::Thinking { thinking, signature } if assistant => {
                        let id = format!("claude.thinking.{}", self.n_thinking);
                        self.n_thinking += 1;
                        let mut detail = json!({ "reasoning": { "text": thinking, "source": "claude_thinking" } });
                        if let Some(signature) = signature {
                            detail["signature"] = json!(signature);
                        }
                        out.completed_action(
                            &id,
                            ActionKind::Reasoning,
                            head_chars(thinking, 100).to_owned(),
                            detail,
                            true,
                        );
                    }
                    Block::ToolUse { id, name, input } if assistant => {
                        let (kind, title) =
                            classify(name, input, PATH_KEYS, self.ctx.cwd.as_deref());
                        let detail =
                            json!({ "name": name, "input": input, "parent_tool_use_id": parent });
                        out.start_action(id, kind, title, detail);
                    }
                    Block::ToolResult { tool_use_id, content, is_error } => {
                        let is_error = is_error.unwrap_or(false);
                        let preview = result_preview(content);
                        let detail = json!({
                            "tool_use_id": tool_use_id,
                            "result_preview": preview,
                            "is_error": is_error,
                            "parent_tool_use_id": parent,
                        });
                        out.complete_action(
                            tool_use_id,
                            !is_error,
                            detail,
                            (ActionKind::Tool, "tool result".to_owned()),
                        );
                        if is_error {
                            permission_warning(&preview, out);
                        }
                    }
                    Block::Text { .. }
                    | Block::Thinking { .. }
                    | Block::ToolUse { .. }
                    | Block::Other => {}
                }
            }
        }
        if let Some(error) = &message.error {
            let text = match error {
                Value::String(text) => text.clone(),
                other => other.to_string(),
            };
            permission_warning(&text, out);
        }
    }

    fn result(&mut self, result: ResultLine, out: &mut Emitter) {
        if let Some(session) = result.session_id.as_deref() {
            out.set_session(session);
        }
        self.results_due = self.results_due.saturating_sub(1);
        if self.results_due > 0 {
            // A steered message is still to be answered: this turn's text was streamed.
            return;
        }
        let usage = usage(&result);
        let text = result.result.filter(|text| !text.is_empty());
        if result.is_error.unwrap_or(false) {
            let message = text.unwrap_or_else(|| match result.subtype.as_deref() {
                Some(subtype) if subtype != "success" => {
                    format!("Claude session failed ({subtype})")
                }
                _ => "Claude session failed".to_owned(),
            });
            out.complete_error(message.clone(), message, usage);
        } else {
            let answer = text.unwrap_or_else(|| self.last_text.clone());
            out.complete_ok(answer, usage);
        }
    }
}

/// A failed tool call or message that reads like a refused permission gets its
/// own warning.
fn permission_warning(text: &str, out: &mut Emitter) {
    let lower = text.to_lowercase();
    if ["permission", "not authorized", "denied"].iter().any(|word| lower.contains(word)) {
        out.note(format!("Permission denied: {}", head_chars(text, 200)), false);
    }
}

fn usage(result: &ResultLine) -> Value {
    let mut usage = Map::new();
    if let Some(cost) = result.total_cost_usd {
        usage.insert("total_cost_usd".to_owned(), json!(cost));
    }
    for (key, value) in [
        ("duration_ms", result.duration_ms),
        ("duration_api_ms", result.duration_api_ms),
        ("num_turns", result.num_turns),
    ] {
        if let Some(value) = value {
            usage.insert(key.to_owned(), json!(value));
        }
    }
    if let Some(counts) = &result.usage {
        usage.insert(
            "usage".to_owned(),
            json!({
                "input_tokens": counts.input_tokens.unwrap_or(0),
                "output_tokens": counts.output_tokens.unwrap_or(0),
                "cache_creation_input_tokens": counts.cache_creation_input_tokens.unwrap_or(0),
                "cache_read_input_tokens": counts.cache_read_input_tokens.unwrap_or(0),
            }),
        );
    }
    if usage.is_empty() {
        Value::Null
    } else {
        Value::Object(usage)
    }
}

impl StreamParser for Parser {
    fn line(&mut self, line: &str, out: &mut Emitter) -> Result<(), DecodeError> {
        match serde_json::from_str::<Line>(line)? {
            Line::System(system) => {
                let session = system.session_id.as_deref().filter(|s| !s.is_empty());
                if let (Some(session), "init") =
                    (session, system.subtype.as_deref().unwrap_or("init"))
                {
                    let mut meta = Map::new();
                    if let Some(cwd) = system.cwd {
                        meta.insert("cwd".to_owned(), json!(cwd));
                    }
                    if let Some(tools) = system.tools {
                        meta.insert("tools".to_owned(), tools);
                    }
                    if let Some(model) = system.model {
                        meta.insert("model".to_owned(), json!(model));
                    }
                    if let Some(mode) = system.permission_mode {
                        meta.insert("permission_mode".to_owned(), json!(mode));
                    }
                    out.started(Some(session), "Claude", Value::Object(meta));
                }
            }
            Line::Assistant(message) => self.blocks(&message, true, out),
            Line::User(message) => self.blocks(&message, false, out),
            Line::Result(result) => self.result(result, out),
            Line::Other => {}
        }
        Ok(())
    }

    fn steered(&mut self) {
        self.results_due += 1;
    }

    fn partial_answer(&self) -> String {
        self.last_text.clone()
    }

    fn clean_end(&self, out: &Emitter) -> Result<String, String> {
        if out.found().is_none() {
            Err("claude finished but no session_id was captured".to_owned())
        } else {
            Err("claude finished without a result event".to_owned())
        }
    }
}
