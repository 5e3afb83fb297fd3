//! OpenCode: `opencode run --format json`, the prompt as the last argument;
//! a run whose calls the owner judges runs `opencode serve` instead
//! ([`serve`]), whose client prints the same lines.
//!
//! Command line: `opencode run --format json [--session=ses_…] [--model=m]
//! [extra_args…] -- <prompt>`; stdin is `/dev/null`. The gateway's endpoint
//! comes in `OPENCODE_CONFIG_CONTENT` ([`super::link`]).
//!
//! Schema: every line is `{type, timestamp, sessionID, part}`; types `step_start`,
//! `step_finish`, `tool_use`, `text` and `error` (which carries `error` and
//! `message`). Other types, and lines without a type, are ignored.
//!
//! Mapping: the first `sessionID` (or the resumed session) → `Started`
//! (`opencode:<ses_id>`); `tool_use` → an action started, or completed by
//! `state.status` `completed` / `error`; `text` parts are streamed and concatenated
//! into the answer; `step_finish` with reason `stop` → `Completed`; `error` → a
//! failed `Completed`.

use lemon_core::engine::ActionKind;
use serde::Deserialize;
use serde_json::{json, Value};

use super::tools::{classify, input_path, relativize};
use super::translate::{DecodeError, Emitter, ParseContext, StreamParser};
use super::{CommandInput, Invocation};

const PATH_KEYS: &[&str] = &["file_path", "filePath"];
/// Tool output previews are cut to this many bytes.
const OUTPUT_PREVIEW_BYTES: usize = 500;

pub(super) fn command(input: &CommandInput<'_>) -> Invocation {
    let mut args: Vec<String> = ["run", "--format", "json"].map(str::to_owned).to_vec();
    if let Some(session) = input.resume {
        args.push(format!("--session={session}"));
    }
    let model = input.model(&[]);
    if let Some(model) = &model {
        args.push(format!("--model={model}"));
    }
    args.extend(input.settings.extra_args.iter().cloned());
    // After `--` the prompt cannot be read as an option, whatever it starts with.
    args.push("--".to_owned());
    args.push(input.prompt.to_owned());
    Invocation::prompt_last(args, model)
}

#[derive(Debug, Deserialize)]
struct Envelope {
    #[serde(rename = "type")]
    kind: Option<String>,
    #[serde(rename = "sessionID")]
    session_id: Option<String>,
    #[serde(default)]
    part: Value,
    #[serde(default)]
    error: Value,
    #[serde(default)]
    message: Value,
}

/// OpenCode's `run --format json` parser.
#[derive(Debug)]
pub(super) struct Parser {
    ctx: ParseContext,
    /// The text parts so far: the answer.
    text: String,
    saw_step_finish: bool,
    n_generated_ids: usize,
}

impl Parser {
    pub(super) fn new(ctx: ParseContext) -> Self {
        Parser { ctx, text: String::new(), saw_step_finish: false, n_generated_ids: 0 }
    }

    fn tool_use(&mut self, part: &Value, out: &mut Emitter) {
        let id = match part.get("callID").or_else(|| part.get("id")).and_then(Value::as_str) {
            Some(id) => id.to_owned(),
            None => {
                let id = format!("opencode.tool.{}", self.n_generated_ids);
                self.n_generated_ids += 1;
                id
            }
        };
        let tool = part.get("tool").and_then(Value::as_str).unwrap_or("tool");
        let state = part.get("state").unwrap_or(&Value::Null);
        let input = state.get("input").cloned().unwrap_or_else(|| json!({}));
        let cwd = self.ctx.cwd.as_deref();
        let (kind, mut title) = classify(tool, &input, PATH_KEYS, cwd);
        let path = input_path(&input, PATH_KEYS);
        if let Some(state_title) =
            state.get("title").and_then(Value::as_str).filter(|t| !t.is_empty())
        {
            // OpenCode titles a file tool with its path, which the classification already shows.
            let names_path = path
                .is_some_and(|path| state_title == path || state_title == relativize(path, cwd));
            if !names_path {
                title = state_title.to_owned();
            }
        }
        let mut detail = json!({ "name": tool, "input": input, "callID": id });
        if let (ActionKind::FileChange, Some(path)) = (kind, path) {
            detail["changes"] = json!([{ "path": path, "kind": "update" }]);
        }
        let exit_code = state.pointer("/metadata/exit").and_then(Value::as_i64);
        match state.get("status").and_then(Value::as_str) {
            Some("completed") => {
                let output = state.get("output").and_then(Value::as_str).unwrap_or("");
                detail["output_preview"] = json!(head_bytes(output, OUTPUT_PREVIEW_BYTES));
                detail["exit_code"] = json!(exit_code);
                out.complete_action(
                    &id,
                    exit_code.is_none_or(|code| code == 0),
                    detail,
                    (kind, title),
                );
            }
            Some("error") => {
                detail["error"] = state.get("error").cloned().unwrap_or(Value::Null);
                detail["exit_code"] = json!(exit_code);
                out.complete_action(&id, false, detail, (kind, title));
            }
            _ if out.is_pending(&id) => out.update_action(&id, kind, title, detail),
            _ => out.start_action(&id, kind, title, detail),
        }
    }
}

/// The longest prefix of `text` of at most `n` bytes that ends on a character boundary.
fn head_bytes(text: &str, n: usize) -> &str {
    if text.len() <= n {
        return text;
    }
    let mut end = n;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

fn error_message(envelope: &Envelope) -> String {
    let text = |value: Option<&Value>| {
        value.and_then(Value::as_str).filter(|s| !s.is_empty()).map(str::to_owned)
    };
    text(Some(&envelope.message))
        .or_else(|| text(envelope.error.pointer("/data/message")))
        .or_else(|| text(envelope.error.get("message")))
        .or_else(|| text(envelope.error.get("name")))
        .or_else(|| text(Some(&envelope.error)))
        .unwrap_or_else(|| "opencode error".to_owned())
}

impl StreamParser for Parser {
    fn line(&mut self, line: &str, out: &mut Emitter) -> Result<(), DecodeError> {
        let envelope: Envelope = serde_json::from_str(line)?;
        let session = envelope.session_id.as_deref().filter(|s| !s.is_empty());
        if out.found().is_none() {
            if let Some(session) = session {
                out.set_session(session);
            }
        }
        if !out.has_started() {
            if let Some(session) = out.resume().map(|token| token.value.clone()) {
                let title = self.ctx.model.clone().unwrap_or_else(|| "OpenCode".to_owned());
                out.started(Some(&session), title, Value::Null);
            }
        }
        match envelope.kind.as_deref() {
            Some("tool_use") => self.tool_use(&envelope.part, out),
            Some("text") => {
                if let Some(text) = envelope.part.get("text").and_then(Value::as_str) {
                    self.text.push_str(text);
                    out.delta(text);
                }
            }
            Some("step_finish") => {
                self.saw_step_finish = true;
                if envelope.part.get("reason").and_then(Value::as_str) == Some("stop") {
                    let mut usage = serde_json::Map::new();
                    for key in ["tokens", "cost"] {
                        if let Some(value) = envelope.part.get(key) {
                            usage.insert(key.to_owned(), value.clone());
                        }
                    }
                    let usage = if usage.is_empty() { Value::Null } else { Value::Object(usage) };
                    out.complete_ok(self.text.clone(), usage);
                }
            }
            Some("error") => {
                out.complete_error(error_message(&envelope), self.text.clone(), Value::Null)
            }
            _ => {}
        }
        Ok(())
    }

    fn partial_answer(&self) -> String {
        self.text.clone()
    }

    fn clean_end(&self, out: &Emitter) -> Result<String, String> {
        if out.resume().is_none() {
            Err("opencode finished but no sessionID was captured".to_owned())
        } else if self.saw_step_finish {
            Ok(self.text.clone())
        } else {
            Err("opencode finished without a result event".to_owned())
        }
    }
}

pub(super) mod serve;
