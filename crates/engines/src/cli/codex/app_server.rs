//! Codex through `codex app-server`: the run whose calls the owner judges.
//!
//! `codex exec` has no way for another program to answer Codex's approval
//! requests; the app server (JSON-RPC 2.0, one message per line on stdio)
//! sends them to its client. A run whose policy may ask or deny is started as
//! `codex [extra_args…] app-server -c model_auto_compact_token_limit=170000`
//! (and the gateway's endpoint as `exec` gets it, [`super::command`]),
//! and [`drive`] is its client:
//!
//! 1. `initialize`, then the `initialized` notification;
//! 2. `thread/start` (or `thread/resume` with the session to continue) with
//!    `approvalPolicy = "untrusted"`, so Codex asks about every command it does
//!    not know to be read-only, and the run's cwd and model;
//! 3. `turn/start` with the prompt.
//!
//! The server's notifications are written as the lines `codex exec --json`
//! prints (`thread.started`, `turn.started`, `item.started|completed`,
//! `turn.completed|failed`, `error`), so the one Codex parser reads both.
//! Its approval requests (`item/commandExecution/requestApproval` as the
//! `bash` tool with the command, `item/fileChange/requestApproval` as `edit`
//! with each changed path) go to the gate, each in a task of its own while
//! the stream goes on, and are answered `accept` or `decline`; any other
//! request is refused with JSON-RPC's method-not-found. Once the turn ends,
//! stdin is closed and the server exits.

use std::collections::HashMap;
use std::path::PathBuf;

use lemon_core::approvals::Decision;
use serde_json::{json, Value};
use tokio::process::ChildStdout;
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use super::super::process::{LineReader, StdinHandle, StdoutLine};
use super::super::runner::Asker;
use super::super::{CommandInput, Invocation};
use crate::cli::process::StdinMode;

/// The approval policy the thread is started with: Codex asks about every
/// command outside its read-only list, and the gate decides.
const APPROVAL_POLICY: &str = "untrusted";

/// Request ids of the three calls the client makes.
const INITIALIZE: u64 = 1;
const THREAD: u64 = 2;
const TURN: u64 = 3;

pub(in crate::cli) fn command(input: &CommandInput<'_>) -> Invocation {
    let mut args: Vec<String> = input.settings.extra_args.clone();
    args.push("app-server".to_owned());
    args.extend(["-c", "model_auto_compact_token_limit=170000"].map(str::to_owned));
    if let Some(access) = input.gateway_mcp {
        args.extend(access.codex_args());
    }
    let model = input.model(&["codex:", "openai-codex:", "openai:", "chatgpt:"]);
    Invocation {
        args,
        stdin: StdinMode::KeepOpen(Vec::new()),
        env: Vec::new(),
        prompt_is_last_arg: false,
        model,
        new_session: None,
    }
}

/// What the client asks the server for.
#[derive(Debug, Clone)]
pub(crate) struct Turn {
    pub(crate) prompt: String,
    pub(crate) model: Option<String>,
    pub(crate) cwd: PathBuf,
    /// The thread to continue.
    pub(crate) resume: Option<String>,
}

/// Talks to the server on `stdin`/`stdout` until its stdout ends, sending
/// `exec --json` lines to `lines`.
pub(crate) async fn drive(
    mut stdout: LineReader<ChildStdout>,
    stdin: Option<StdinHandle>,
    lines: mpsc::Sender<StdoutLine>,
    asker: Asker,
    turn: Turn,
) {
    let mut client = Client::new(stdin, turn);
    client.request(
        INITIALIZE,
        "initialize",
        json!({
            "clientInfo": { "name": "lemon", "title": "Lemon Gateway", "version": env!("CARGO_PKG_VERSION") },
            "capabilities": { "experimentalApi": false },
        }),
    );
    let mut answers: JoinSet<(Value, Value)> = JoinSet::new();
    loop {
        tokio::select! {
            line = stdout.next_line() => {
                let line = match line {
                    Ok(Some(StdoutLine::Line(line))) => line,
                    Ok(Some(oversized)) => {
                        if lines.send(oversized).await.is_err() {
                            return;
                        }
                        continue;
                    }
                    Ok(None) | Err(_) => return,
                };
                for out in client.message(&line, &asker, &mut answers) {
                    if lines.send(StdoutLine::Line(out)).await.is_err() {
                        return;
                    }
                }
            }
            Some(Ok((id, result))) = answers.join_next(), if !answers.is_empty() => {
                client.send(json!({ "jsonrpc": "2.0", "id": id, "result": result }));
            }
        }
    }
}

/// The client's state between messages.
struct Client {
    /// `None` once the turn is over: closing stdin lets the server exit.
    stdin: Option<StdinHandle>,
    turn: Turn,
    thread: Option<String>,
    /// Tokens of the turn so far (the sum of each update's `last`).
    usage: Usage,
    /// The changes of each file-change item, by item id: what its approval
    /// request is about.
    changes: HashMap<String, Vec<String>>,
}

#[derive(Debug, Default)]
struct Usage {
    input: u64,
    cached: u64,
    output: u64,
}

impl Client {
    fn new(stdin: Option<StdinHandle>, turn: Turn) -> Self {
        Client { stdin, turn, thread: None, usage: Usage::default(), changes: HashMap::new() }
    }

    fn send(&self, message: Value) {
        if let Some(stdin) = &self.stdin {
            let mut bytes = message.to_string().into_bytes();
            bytes.push(b'\n');
            // A server that stopped reading is gone; its stdout tells the rest.
            let _ = stdin.write(bytes);
        }
    }

    fn request(&self, id: u64, method: &str, params: Value) {
        self.send(json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params }));
    }

    /// One message from the server: the `exec` lines it makes.
    fn message(
        &mut self,
        line: &str,
        asker: &Asker,
        answers: &mut JoinSet<(Value, Value)>,
    ) -> Vec<String> {
        let Ok(message) = serde_json::from_str::<Value>(line) else {
            // Not JSON-RPC: handed on as it is, the parser says what it is.
            return vec![line.to_owned()];
        };
        let method = message.get("method").and_then(Value::as_str);
        let params = message.get("params").cloned().unwrap_or(Value::Null);
        match (message.get("id").cloned(), method) {
            (Some(id), Some(method)) => {
                self.server_request(id, method, &params, asker, answers);
                Vec::new()
            }
            (Some(id), None) => self.response(&id, &message),
            (None, Some(method)) => self.notification(method, &params),
            (None, None) => Vec::new(),
        }
        .into_iter()
        .map(|line| line.to_string())
        .collect()
    }

    fn response(&mut self, id: &Value, message: &Value) -> Vec<Value> {
        if let Some(error) = message.get("error") {
            let text = error.get("message").and_then(Value::as_str).unwrap_or("refused");
            self.stdin = None;
            return vec![json!({
                "type": "turn.failed",
                "error": { "message": format!("codex app-server refused the run: {text}") },
            })];
        }
        let result = message.get("result").unwrap_or(&Value::Null);
        match id.as_u64() {
            Some(INITIALIZE) => {
                self.send(json!({ "jsonrpc": "2.0", "method": "initialized" }));
                let mut params = json!({
                    "approvalPolicy": APPROVAL_POLICY,
                    "cwd": self.turn.cwd.display().to_string(),
                });
                if let Some(model) = &self.turn.model {
                    params["model"] = json!(model);
                }
                match &self.turn.resume {
                    Some(thread) => {
                        params["threadId"] = json!(thread);
                        self.request(THREAD, "thread/resume", params);
                    }
                    None => self.request(THREAD, "thread/start", params),
                }
                Vec::new()
            }
            Some(THREAD) => {
                let Some(thread) = result.pointer("/thread/id").and_then(Value::as_str) else {
                    self.stdin = None;
                    return vec![json!({
                        "type": "turn.failed",
                        "error": { "message": "codex app-server started no thread" },
                    })];
                };
                self.thread = Some(thread.to_owned());
                self.request(
                    TURN,
                    "turn/start",
                    json!({
                        "threadId": thread,
                        "input": [{ "type": "text", "text": self.turn.prompt, "text_elements": [] }],
                    }),
                );
                vec![json!({ "type": "thread.started", "thread_id": thread })]
            }
            _ => Vec::new(),
        }
    }

    fn notification(&mut self, method: &str, params: &Value) -> Vec<Value> {
        match method {
            "turn/started" => {
                self.usage = Usage::default();
                vec![json!({ "type": "turn.started" })]
            }
            "item/started" | "item/completed" => {
                let Some(item) = params.get("item") else { return Vec::new() };
                if let (Some("fileChange"), Some(id)) = (
                    item.get("type").and_then(Value::as_str),
                    item.get("id").and_then(Value::as_str),
                ) {
                    let paths = item
                        .get("changes")
                        .and_then(Value::as_array)
                        .into_iter()
                        .flatten()
                        .filter_map(|change| change.get("path").and_then(Value::as_str))
                        .map(str::to_owned)
                        .collect();
                    self.changes.insert(id.to_owned(), paths);
                }
                let kind = if method == "item/started" { "item.started" } else { "item.completed" };
                exec_item(item)
                    .map(|item| json!({ "type": kind, "item": item }))
                    .into_iter()
                    .collect()
            }
            "thread/tokenUsage/updated" => {
                let last = params.pointer("/tokenUsage/last").unwrap_or(&Value::Null);
                let count = |key: &str| last.get(key).and_then(Value::as_u64).unwrap_or(0);
                self.usage.input += count("inputTokens");
                self.usage.cached += count("cachedInputTokens");
                self.usage.output += count("outputTokens");
                Vec::new()
            }
            "error" => {
                let message = params
                    .pointer("/error/message")
                    .and_then(Value::as_str)
                    .unwrap_or("codex error");
                vec![json!({ "type": "error", "message": message })]
            }
            "turn/completed" => {
                let turn = params.get("turn").unwrap_or(&Value::Null);
                // The turn is over: closing stdin lets the server exit.
                self.stdin = None;
                match turn.get("status").and_then(Value::as_str) {
                    Some("completed") => vec![json!({
                        "type": "turn.completed",
                        "usage": {
                            "input_tokens": self.usage.input,
                            "cached_input_tokens": self.usage.cached,
                            "output_tokens": self.usage.output,
                        },
                    })],
                    status => {
                        let message = turn
                            .pointer("/error/message")
                            .and_then(Value::as_str)
                            .map(str::to_owned)
                            .unwrap_or_else(|| format!("codex turn {}", status.unwrap_or("ended")));
                        vec![json!({ "type": "turn.failed", "error": { "message": message } })]
                    }
                }
            }
            _ => Vec::new(),
        }
    }

    /// A request of the server: an approval goes to the gate in a task of
    /// its own; anything else is refused at once.
    fn server_request(
        &mut self,
        id: Value,
        method: &str,
        params: &Value,
        asker: &Asker,
        answers: &mut JoinSet<(Value, Value)>,
    ) {
        let call = params.get("itemId").and_then(Value::as_str).map(str::to_owned);
        let asks: Vec<(&'static str, Value)> = match method {
            "item/commandExecution/requestApproval" => {
                vec![("bash", json!({ "command": shown_command(params) }))]
            }
            "item/fileChange/requestApproval" => {
                let paths = call.as_ref().and_then(|item| self.changes.get(item)).cloned();
                let paths = paths.unwrap_or_default();
                if paths.is_empty() {
                    // Nothing known about the change: asked as the whole cwd.
                    vec![("edit", json!({ "path": "." }))]
                } else {
                    paths.into_iter().map(|path| ("edit", json!({ "path": path }))).collect()
                }
            }
            _ => {
                self.send(json!({
                    "jsonrpc": "2.0",
                    "id": id,
                    "error": { "code": -32601, "message": format!("{method} is not answered by the gateway") },
                }));
                return;
            }
        };
        let asker = asker.clone();
        answers.spawn(async move {
            // Every path of a change must be allowed; the first refusal declines it.
            for (tool, input) in asks {
                if let Decision::Deny(_) = asker.decide(tool, &input, call.as_deref()).await {
                    return (id, json!({ "decision": "decline" }));
                }
            }
            (id, json!({ "decision": "accept" }))
        });
    }
}

/// The command a person reads: the script of Codex's `bash -lc '…'`
/// wrapper (its parsed actions), else the command line as sent.
fn shown_command(params: &Value) -> String {
    let actions: Vec<&str> = params
        .get("commandActions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|action| action.get("command").and_then(Value::as_str))
        .collect();
    match actions.as_slice() {
        [] => params.get("command").and_then(Value::as_str).unwrap_or_default().to_owned(),
        [one] => (*one).to_owned(),
        many => many.join(" && "),
    }
}

/// An app-server item as `exec --json` prints it; `None` for items `exec`
/// does not print (the user's own message, hooks…).
fn exec_item(item: &Value) -> Option<Value> {
    let text = |key: &str| item.get(key).cloned().unwrap_or(Value::Null);
    // Fields `exec` always prints as strings are never null here.
    let string = |key: &str| json!(item.get(key).and_then(Value::as_str).unwrap_or_default());
    let id = string("id");
    let status = item.get("status").and_then(Value::as_str).map(exec_status);
    Some(match item.get("type")?.as_str()? {
        "agentMessage" => json!({ "type": "agent_message", "id": id, "text": string("text") }),
        "reasoning" => {
            let parts = |key: &str| -> Vec<String> {
                item.get(key)
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_str)
                    .map(str::to_owned)
                    .collect()
            };
            let mut lines = parts("summary");
            if lines.is_empty() {
                lines = parts("content");
            }
            json!({ "type": "reasoning", "id": id, "text": lines.join("\n") })
        }
        "commandExecution" => json!({
            "type": "command_execution",
            "id": id,
            "command": string("command"),
            "aggregated_output": text("aggregatedOutput"),
            "exit_code": text("exitCode"),
            "status": status,
        }),
        "fileChange" => {
            let changes: Vec<Value> = item
                .get("changes")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .map(|change| {
                    let kind = change.get("kind");
                    let kind = kind
                        .and_then(Value::as_str)
                        .or_else(|| kind.and_then(|k| k.get("type")).and_then(Value::as_str))
                        .unwrap_or("update");
                    json!({ "path": change.get("path"), "kind": kind })
                })
                .collect();
            json!({ "type": "file_change", "id": id, "changes": changes, "status": status })
        }
        "mcpToolCall" => json!({
            "type": "mcp_tool_call",
            "id": id,
            "server": string("server"),
            "tool": string("tool"),
            "arguments": text("arguments"),
            "result": text("result"),
            "error": text("error"),
            "status": status,
        }),
        "webSearch" => json!({ "type": "web_search", "id": id, "query": string("query") }),
        _ => return None,
    })
}

/// `inProgress` → `in_progress`; the rest are spelled alike.
fn exec_status(status: &str) -> &str {
    match status {
        "inProgress" => "in_progress",
        other => other,
    }
}

#[cfg(test)]
mod tests;
