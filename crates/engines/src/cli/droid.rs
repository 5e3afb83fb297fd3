//! Droid (Factory): `droid exec -o stream-json`, the prompt as the last argument.
//!
//! Command line: `droid exec -o stream-json [--skip-permissions-unsafe] [-s <id>]
//! [-m model] [--reasoning-effort e] [--settings <file>] [extra_args…] --cwd <cwd>
//! <prompt>`; stdin is `/dev/null`. `--settings` names a runtime settings file
//! (this process only) holding the gateway's endpoint ([`super::link`]).
//!
//! Schema (`type`): `system`, `message`, `reasoning`, `tool_call`, `tool_result`,
//! `completion`; any other type is a decode error.
//!
//! Mapping: `system` init → `Started` (`droid:<session_id>`); a `session_id` on any
//! line names the session if none is known; assistant messages are streamed (the
//! last is the answer) and close the reasoning before them; reasoning → a reasoning
//! action, updated while its id repeats; tool calls and results → actions (path
//! keys `path`, `file_path`, `filePath`); `completion` → `Completed` (answer
//! `finalText`).

use lemon_core::engine::ActionKind;
use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::tools::{classify, result_preview};
use super::translate::{head_chars, DecodeError, Emitter, ParseContext, StreamParser};
use super::{prompt_arg, CommandInput, Invocation};

const PATH_KEYS: &[&str] = &["path", "file_path", "filePath"];

pub(super) fn command(input: &CommandInput<'_>) -> Invocation {
    let settings = input.settings;
    let mut args: Vec<String> = ["exec", "-o", "stream-json"].map(str::to_owned).to_vec();
    if settings.skip_permissions {
        args.push("--skip-permissions-unsafe".to_owned());
    }
    if let Some(session) = input.resume {
        args.extend(["-s".to_owned(), session.to_owned()]);
    }
    let model = input.model(&[
        "factory-droid:",
        "factory-droid/",
        "factory:",
        "factory/",
        "droid:",
        "droid/",
    ]);
    if let Some(model) = &model {
        args.extend(["-m".to_owned(), model.clone()]);
    }
    if let Some(effort) = &settings.reasoning_effort {
        args.extend(["--reasoning-effort".to_owned(), effort.clone()]);
    }
    if let Some(settings_file) = input.gateway_mcp.and_then(|access| access.file()) {
        // Runtime settings of this process only: the gateway's endpoint as server `lemon`.
        args.extend(["--settings".to_owned(), path_arg(settings_file)]);
    }
    args.extend(settings.extra_args.iter().cloned());
    args.extend(["--cwd".to_owned(), path_arg(input.cwd)]);
    args.push(prompt_arg(input.prompt));
    Invocation::prompt_last(args, model)
}

/// A path argument that cannot read as an option: a relative path starting with
/// `-` is written `./-…`.
pub(super) fn path_arg(path: &std::path::Path) -> String {
    let text = path.to_string_lossy();
    if text.starts_with('-') {
        format!("./{text}")
    } else {
        text.into_owned()
    }
}

#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Line {
    System {
        subtype: Option<String>,
        cwd: Option<String>,
        session_id: Option<String>,
        tools: Option<Value>,
        model: Option<String>,
    },
    Message {
        role: Option<String>,
        #[serde(default)]
        text: String,
        session_id: Option<String>,
    },
    Reasoning {
        id: Option<String>,
        #[serde(default)]
        text: String,
        session_id: Option<String>,
    },
    ToolCall {
        id: String,
        #[serde(rename = "toolName")]
        tool_name: Option<String>,
        #[serde(rename = "toolId")]
        tool_id: Option<String>,
        #[serde(default)]
        parameters: Value,
        session_id: Option<String>,
    },
    ToolResult {
        id: String,
        #[serde(rename = "isError")]
        is_error: Option<bool>,
        #[serde(default)]
        value: Value,
        session_id: Option<String>,
    },
    Completion {
        #[serde(rename = "finalText")]
        final_text: Option<String>,
        #[serde(rename = "numTurns")]
        num_turns: Option<u64>,
        #[serde(rename = "durationMs")]
        duration_ms: Option<u64>,
        session_id: Option<String>,
    },
}

impl Line {
    fn session_id(&self) -> Option<&str> {
        match self {
            Line::System { session_id, .. }
            | Line::Message { session_id, .. }
            | Line::Reasoning { session_id, .. }
            | Line::ToolCall { session_id, .. }
            | Line::ToolResult { session_id, .. }
            | Line::Completion { session_id, .. } => {
                session_id.as_deref().filter(|s| !s.is_empty())
            }
        }
    }
}

/// Droid's `exec -o stream-json` parser.
#[derive(Debug)]
pub(super) struct Parser {
    ctx: ParseContext,
    /// The last assistant message: the answer when `completion` has no text.
    last_message: String,
    /// Reasoning actions not yet completed, in the order they started.
    reasoning: Vec<String>,
    n_generated_ids: usize,
}

impl Parser {
    pub(super) fn new(ctx: ParseContext) -> Self {
        Parser { ctx, last_message: String::new(), reasoning: Vec::new(), n_generated_ids: 0 }
    }

    fn flush_reasoning(&mut self, out: &mut Emitter) {
        for id in std::mem::take(&mut self.reasoning) {
            out.complete_action(
                &id,
                true,
                Value::Null,
                (ActionKind::Reasoning, "Reasoning".to_owned()),
            );
        }
    }
}

impl StreamParser for Parser {
    fn line(&mut self, line: &str, out: &mut Emitter) -> Result<(), DecodeError> {
        let line: Line = serde_json::from_str(line)?;
        if out.found().is_none() {
            if let Some(session) = line.session_id() {
                out.set_session(session);
            }
        }
        match line {
            Line::System { subtype, cwd, session_id, tools, model } => {
                let session = session_id.as_deref().filter(|s| !s.is_empty());
                if let (Some(session), "init") = (session, subtype.as_deref().unwrap_or("init")) {
                    let mut meta = Map::new();
                    meta.insert("cwd".to_owned(), json!(cwd));
                    meta.insert("tools".to_owned(), tools.unwrap_or(Value::Null));
                    meta.insert("model".to_owned(), json!(model));
                    out.started(Some(session), "Droid", Value::Object(meta));
                }
            }
            Line::Message { role, text, .. } => {
                if role.as_deref() == Some("assistant") {
                    out.paragraph(text.trim());
                    self.last_message = text;
                    self.flush_reasoning(out);
                }
            }
            Line::Reasoning { id, text, .. } => {
                let id = id.filter(|id| !id.is_empty()).unwrap_or_else(|| {
                    let id = format!("droid.reasoning.{}", self.n_generated_ids);
                    self.n_generated_ids += 1;
                    id
                });
                let trimmed = text.trim();
                let title = if trimmed.is_empty() {
                    "Reasoning".to_owned()
                } else {
                    head_chars(trimmed, 100).to_owned()
                };
                let detail = json!({ "text": text, "reasoning": { "text": text, "source": "droid_reasoning" } });
                if self.reasoning.contains(&id) {
                    out.update_action(&id, ActionKind::Reasoning, title, detail);
                } else {
                    self.reasoning.push(id.clone());
                    out.start_action(&id, ActionKind::Reasoning, title, detail);
                }
            }
            Line::ToolCall { id, tool_name, tool_id, parameters, .. } => {
                let name = tool_name.or(tool_id).unwrap_or_else(|| "tool".to_owned());
                let (kind, title) =
                    classify(&name, &parameters, PATH_KEYS, self.ctx.cwd.as_deref());
                out.start_action(
                    &id,
                    kind,
                    title,
                    json!({ "tool_name": name, "input": parameters }),
                );
            }
            Line::ToolResult { id, is_error, value, .. } => {
                let is_error = is_error == Some(true);
                let preview = result_preview(&value);
                let detail = json!({ "result": value, "result_preview": preview, "result_summary": preview, "is_error": is_error });
                out.complete_action(
                    &id,
                    !is_error,
                    detail,
                    (ActionKind::Tool, "tool result".to_owned()),
                );
            }
            Line::Completion { final_text, num_turns, duration_ms, .. } => {
                self.flush_reasoning(out);
                let answer = final_text
                    .filter(|text| !text.trim().is_empty())
                    .unwrap_or_else(|| self.last_message.clone());
                let usage = if num_turns.is_none() && duration_ms.is_none() {
                    Value::Null
                } else {
                    json!({ "num_turns": num_turns, "duration_ms": duration_ms })
                };
                out.complete_ok(answer.trim().to_owned(), usage);
            }
        }
        Ok(())
    }

    fn partial_answer(&self) -> String {
        self.last_message.trim().to_owned()
    }

    fn clean_end(&self, out: &Emitter) -> Result<String, String> {
        if out.found().is_none() {
            Err("droid exec finished but no session_id was captured".to_owned())
        } else {
            Err("droid exec ended without a completion event".to_owned())
        }
    }
}
