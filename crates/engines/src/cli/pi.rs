//! Pi: `pi --print --mode json --session <token> <prompt>`.
//!
//! Command line: `pi [extra_args…] --print --mode json [--provider p] [--model m]
//! --session <token> <prompt>`; stdin is `/dev/null`; `NO_COLOR=1` and `CI=1` are set
//! unless configured otherwise. Pi always needs `--session`: a new run gets a fresh
//! session file under `$PI_CODING_AGENT_DIR` (default `~/.pi/agent`)
//! `/sessions/--<cwd>--/<timestamp>_<hex>.jsonl`, and once the stream's `session`
//! header names the session's id, the token becomes that id (whole: its first
//! segment is a timestamp that the sessions of a minute share).
//!
//! Schema (`type`): `session`, `agent_start`, `agent_end{messages}`,
//! `message_end{message}`, `tool_execution_start`, `tool_execution_end`; other
//! types (and lines without a type) are ignored.
//!
//! Mapping: the first line → `Started` (`pi:<token>`); tool executions → actions
//! (path key `path`); an assistant `message_end` is streamed and remembered with its
//! usage and any error (`stopReason` `error` / `aborted`); `agent_end` → `Completed`.

use std::time::{SystemTime, UNIX_EPOCH};

use lemon_core::engine::ActionKind;
use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::tools::{classify, input_path};
use super::translate::{DecodeError, Emitter, ParseContext, StreamParser};
use super::{prompt_arg, CommandInput, Invocation};

const PATH_KEYS: &[&str] = &["path"];

pub(super) fn command(input: &CommandInput<'_>) -> Invocation {
    let settings = input.settings;
    let mut args: Vec<String> = settings.extra_args.clone();
    args.extend(["--print", "--mode", "json"].map(str::to_owned));
    if let Some(provider) = &settings.provider {
        args.extend(["--provider".to_owned(), provider.clone()]);
    }
    let model = input.model(&[]);
    if let Some(model) = &model {
        args.extend(["--model".to_owned(), model.clone()]);
    }
    let (token, new_session) = match input.resume {
        Some(token) => (token.to_owned(), None),
        None => {
            let token = new_session_token(input);
            (token.clone(), Some(token))
        }
    };
    args.extend(["--session".to_owned(), token]);
    // Pi reads an argument starting with `@` as a file to include: a prompt that
    // starts so gets the same leading space as one starting with `-`.
    let prompt = if input.prompt.starts_with('@') {
        format!(" {}", input.prompt)
    } else {
        prompt_arg(input.prompt)
    };
    args.push(prompt);
    Invocation {
        env: vec![("NO_COLOR", "1"), ("CI", "1")],
        new_session,
        ..Invocation::prompt_last(args, model)
    }
}

/// A new session file path; a plain token when its directory cannot be made.
fn new_session_token(input: &CommandInput<'_>) -> String {
    let hex = uuid::Uuid::new_v4().simple().to_string();
    // The child's own variables: the section's `env` over the gateway's, so
    // the file is where the CLI looks for its sessions when it resumes.
    let var = |name: &str| {
        input
            .settings
            .env
            .get(name)
            .or_else(|| input.base_env.get(name))
            .filter(|value| !value.is_empty())
            .cloned()
    };
    let agent_dir =
        var("PI_CODING_AGENT_DIR").or_else(|| var("HOME").map(|home| format!("{home}/.pi/agent")));
    let Some(agent_dir) = agent_dir else { return format!("pi_session_{hex}") };
    let cwd = input.cwd.to_string_lossy();
    let cwd_slug: String = cwd
        .trim_start_matches('/')
        .chars()
        .map(|c| if matches!(c, '/' | '\\' | ':') { '-' } else { c })
        .collect();
    let dir = format!("{agent_dir}/sessions/--{cwd_slug}--");
    if let Err(err) = std::fs::create_dir_all(&dir) {
        tracing::warn!(dir, error = %err, "could not create the pi session directory");
        return format!("pi_session_{hex}");
    }
    format!("{dir}/{}_{hex}.jsonl", file_timestamp(SystemTime::now()))
}

/// `2026-08-01T12-00-00-000Z`: UTC ISO 8601 with `:` and `.` as `-`.
fn file_timestamp(now: SystemTime) -> String {
    let since = now.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (year, month, day) = civil_from_days(days as i64);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}-{:02}-{:02}-{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        since.subsec_millis()
    )
}

/// The proleptic Gregorian date of a day count since 1970-01-01 (Howard Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Line {
    Session {
        id: Option<String>,
    },
    AgentEnd {
        #[serde(default)]
        messages: Vec<Value>,
    },
    MessageEnd {
        #[serde(default)]
        message: Value,
    },
    ToolExecutionStart {
        #[serde(rename = "toolCallId")]
        tool_call_id: Option<String>,
        #[serde(rename = "toolName")]
        tool_name: Option<String>,
        #[serde(default)]
        args: Value,
    },
    ToolExecutionEnd {
        #[serde(rename = "toolCallId")]
        tool_call_id: Option<String>,
        #[serde(rename = "toolName")]
        tool_name: Option<String>,
        #[serde(default)]
        result: Value,
        #[serde(rename = "isError")]
        is_error: Option<bool>,
    },
    #[serde(other)]
    Other,
}

/// What the last assistant message said.
#[derive(Debug, Default)]
struct LastMessage {
    text: String,
    usage: Value,
    error: Option<String>,
}

impl LastMessage {
    /// The message's text, usage and error, when it is the assistant's.
    fn of(message: &Value) -> Option<LastMessage> {
        if message.get("role").and_then(Value::as_str) != Some("assistant") {
            return None;
        }
        let text = match message.get("content") {
            Some(Value::String(text)) => text.clone(),
            Some(Value::Array(blocks)) => blocks
                .iter()
                .filter(|block| block.get("type").and_then(Value::as_str) == Some("text"))
                .filter_map(|block| block.get("text").and_then(Value::as_str))
                .collect::<Vec<_>>()
                .join("\n"),
            _ => String::new(),
        };
        let error = match message.get("stopReason").and_then(Value::as_str) {
            Some(reason @ ("error" | "aborted")) => Some(
                message
                    .get("errorMessage")
                    .and_then(Value::as_str)
                    .filter(|s| !s.is_empty())
                    .map_or_else(|| format!("pi run {reason}"), str::to_owned),
            ),
            _ => None,
        };
        Some(LastMessage {
            text: text.trim().to_owned(),
            usage: message.get("usage").cloned().unwrap_or(Value::Null),
            error,
        })
    }
}

/// Pi's `--mode json` parser.
#[derive(Debug)]
pub(super) struct Parser {
    ctx: ParseContext,
    /// The session token: the new session's file path until the header names its id.
    token: Option<String>,
    resumed: bool,
    last: LastMessage,
    n_generated_ids: usize,
}

impl Parser {
    pub(super) fn new(ctx: ParseContext, new_session: Option<String>, resumed: bool) -> Self {
        Parser {
            ctx,
            token: new_session,
            resumed,
            last: LastMessage::default(),
            n_generated_ids: 0,
        }
    }

    fn title(&self) -> String {
        match (&self.ctx.provider, &self.ctx.model) {
            (Some(provider), Some(model)) => format!("{provider}:{model}"),
            (None, Some(model)) => model.clone(),
            _ => "Pi".to_owned(),
        }
    }

    fn start(&mut self, out: &mut Emitter) {
        if let Some(token) = &self.token {
            out.set_session(token);
        }
        if out.has_started() {
            return;
        }
        let mut meta = Map::new();
        if let Some(cwd) = &self.ctx.cwd {
            meta.insert("cwd".to_owned(), json!(cwd.to_string_lossy()));
        }
        if let Some(model) = &self.ctx.model {
            meta.insert("model".to_owned(), json!(model));
        }
        if let Some(provider) = &self.ctx.provider {
            meta.insert("provider".to_owned(), json!(provider));
        }
        let session = out.resume().map(|token| token.value.clone());
        out.started(session.as_deref(), self.title(), Value::Object(meta));
    }

    fn tool_id(&mut self, id: Option<String>) -> String {
        id.filter(|id| !id.is_empty()).unwrap_or_else(|| {
            let id = format!("pi.tool.{}", self.n_generated_ids);
            self.n_generated_ids += 1;
            id
        })
    }
}

/// Whether a token is a session file path rather than a session id.
fn is_path_token(token: &str) -> bool {
    token.ends_with(".jsonl")
        || token.contains('/')
        || token.contains('\\')
        || token.starts_with('~')
}

impl StreamParser for Parser {
    fn line(&mut self, line: &str, out: &mut Emitter) -> Result<(), DecodeError> {
        let value: Value = serde_json::from_str(line)?;
        if !value.is_object() {
            return Err(DecodeError("expected a JSON object".to_owned()));
        }
        if value.get("type").and_then(Value::as_str).is_none() {
            return Ok(());
        }
        let line: Line = serde_json::from_value(value)?;
        if let Line::Session { id: Some(id) } = &line {
            if !self.resumed && !id.is_empty() && self.token.as_deref().is_none_or(is_path_token) {
                // The whole id: Pi opens the first session whose id starts
                // with `--session`'s value, and its ids are UUIDv7s whose first
                // segment is a timestamp shared by the sessions of a minute.
                self.token = Some(id.clone());
            }
        }
        self.start(out);
        match line {
            Line::ToolExecutionStart { tool_call_id, tool_name, args } => {
                let id = self.tool_id(tool_call_id);
                let name = tool_name.unwrap_or_else(|| "tool".to_owned());
                let (kind, title) = classify(&name, &args, PATH_KEYS, self.ctx.cwd.as_deref());
                let mut detail = json!({ "tool_name": name, "args": args });
                if let (ActionKind::FileChange, Some(path)) = (kind, input_path(&args, PATH_KEYS)) {
                    detail["changes"] = json!([{ "path": path, "kind": "update" }]);
                }
                out.start_action(&id, kind, title, detail);
            }
            Line::ToolExecutionEnd { tool_call_id, tool_name, result, is_error } => {
                let id = self.tool_id(tool_call_id);
                let name = tool_name.unwrap_or_else(|| "tool".to_owned());
                let is_error = is_error.unwrap_or(false);
                let fallback = classify(&name, &Value::Null, PATH_KEYS, self.ctx.cwd.as_deref());
                let detail = json!({ "tool_name": name, "result": result, "is_error": is_error });
                out.complete_action(&id, !is_error, detail, fallback);
            }
            Line::MessageEnd { message } => {
                if let Some(last) = LastMessage::of(&message) {
                    out.paragraph(&last.text);
                    self.last = last;
                }
            }
            Line::AgentEnd { messages } => {
                if let Some(last) = messages.iter().rev().find_map(LastMessage::of) {
                    self.last = last;
                }
                let LastMessage { text, usage, error } = std::mem::take(&mut self.last);
                match error {
                    Some(error) => out.complete_error(error, text, usage),
                    None => out.complete_ok(text, usage),
                }
            }
            Line::Session { .. } | Line::Other => {}
        }
        Ok(())
    }

    fn partial_answer(&self) -> String {
        self.last.text.clone()
    }

    fn clean_end(&self, _out: &Emitter) -> Result<String, String> {
        Err("pi finished without an agent_end event".to_owned())
    }
}

#[cfg(test)]
mod tests;
