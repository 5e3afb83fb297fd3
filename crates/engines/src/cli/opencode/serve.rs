//! OpenCode through `opencode serve`: the run whose calls the owner judges.
//!
//! `opencode run` answers every permission request itself (it rejects them,
//! or approves them all with `--auto`); the server sends them to whoever
//! listens to its events. A run whose policy may ask or deny is started as
//! `opencode serve --hostname 127.0.0.1 --port 0`, with a password of the run
//! alone in `OPENCODE_SERVER_PASSWORD` (HTTP basic auth, user `opencode`),
//! and [`drive`] is its client:
//!
//! 1. it waits for `opencode server listening on http://…` on stdout;
//! 2. subscribes to `GET /event` (Server-Sent Events);
//! 3. creates a session whose rules ask about every call (`POST /session`
//!    with `permission = [{permission: "*", action: "ask", pattern: "*"}]`),
//!    or continues the resumed one;
//! 4. sends the prompt (`POST /session/{id}/prompt_async`).
//!
//! The session's events become the lines `opencode run --format json` prints
//! (`step_start`, `step_finish`, `tool_use` once a tool has finished, `text`
//! once a text part is complete, `error`), so the one OpenCode parser reads
//! both; the session going idle ends the stream, and the server is stopped.
//! Each `permission.asked` of the session (or of a session it started) goes
//! to the gate in a task of its own (`bash` with the command, `read`,
//! `edit`, `list`, `glob`, `grep` with the path, `webfetch` as `fetch` with
//! the URL) and is answered `POST /permission/{id}/reply` with `once`, or
//! `reject` and the reason, which the model reads.

use std::collections::HashSet;
use std::time::Duration;

use futures::StreamExt;
use lemon_core::approvals::Decision;
use serde_json::{json, Value};
use tokio::process::ChildStdout;
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use super::super::process::{LineReader, StdinMode, StdoutLine};
use super::super::runner::Asker;
use super::super::{CommandInput, Invocation};
use crate::llm::sse::SseParser;

/// The variable the server reads its password from.
pub(crate) const PASSWORD_ENV: &str = "OPENCODE_SERVER_PASSWORD";
/// The user of the server's basic auth.
const USER: &str = "opencode";
/// How long one request to the server (not the event stream) may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

pub(in crate::cli) fn command(input: &CommandInput<'_>) -> Invocation {
    let args = ["serve", "--hostname", "127.0.0.1", "--port", "0"].map(str::to_owned).to_vec();
    Invocation {
        args,
        stdin: StdinMode::Null,
        env: Vec::new(),
        prompt_is_last_arg: false,
        model: input.model(&[]),
        new_session: None,
    }
}

/// A fresh password for one run's server.
pub(crate) fn password() -> String {
    format!("{}", uuid::Uuid::new_v4().simple())
}

/// What the client asks the server for.
#[derive(Debug, Clone)]
pub(crate) struct Session {
    pub(crate) prompt: String,
    /// `provider/model`.
    pub(crate) model: Option<String>,
    /// The session to continue.
    pub(crate) resume: Option<String>,
    pub(crate) password: String,
}

/// Runs the session on the server whose stdout is `stdout`, sending `run
/// --format json` lines to `lines` until the session is idle.
pub(crate) async fn drive(
    mut stdout: LineReader<ChildStdout>,
    lines: mpsc::Sender<StdoutLine>,
    asker: Asker,
    session: Session,
) {
    let Some(base) = listening(&mut stdout).await else {
        let _ = lines.send(error_line(None, "opencode serve stopped before it listened")).await;
        return;
    };
    // The rest of stdout is the server's log: read, so it never blocks.
    tokio::spawn(async move { while let Ok(Some(_)) = stdout.next_line().await {} });
    if let Err(message) = converse(&base, &lines, &asker, &session).await {
        let _ = lines.send(error_line(session.resume.as_deref(), &message)).await;
    }
}

/// The server's URL, from its `listening on` line.
async fn listening(stdout: &mut LineReader<ChildStdout>) -> Option<String> {
    while let Ok(Some(line)) = stdout.next_line().await {
        let StdoutLine::Line(line) = line else { continue };
        if let Some(at) = line.find("listening on http://") {
            let url = line[at + "listening on ".len()..].trim();
            return Some(url.trim_end_matches('/').to_owned());
        }
    }
    None
}

fn error_line(session: Option<&str>, message: &str) -> StdoutLine {
    let line = json!({
        "type": "error",
        "sessionID": session,
        "error": { "name": "GatewayError", "data": { "message": message } },
    });
    StdoutLine::Line(line.to_string())
}

/// The session from its first event to its idle one.
async fn converse(
    base: &str,
    lines: &mpsc::Sender<StdoutLine>,
    asker: &Asker,
    session: &Session,
) -> Result<(), String> {
    let http = reqwest::Client::builder()
        .no_proxy()
        .build()
        .map_err(|err| format!("no HTTP client for opencode serve: {err}"))?;
    let server = Server { http, base: base.to_owned(), password: session.password.clone() };
    let events = server
        .http
        .get(format!("{base}/event"))
        .basic_auth(USER, Some(&server.password))
        .send()
        .await
        .and_then(reqwest::Response::error_for_status)
        .map_err(|err| format!("opencode serve's events: {err}"))?;
    let id = match &session.resume {
        Some(id) => id.clone(),
        None => {
            let created = server
                .post(
                    "/session",
                    json!({ "permission": [
                    { "permission": "*", "action": "ask", "pattern": "*" },
                    // No one is there to answer OpenCode's own questions.
                    { "permission": "question", "action": "deny", "pattern": "*" },
                    { "permission": "plan_enter", "action": "deny", "pattern": "*" },
                    { "permission": "plan_exit", "action": "deny", "pattern": "*" },
                ] }),
                )
                .await?;
            created
                .get("id")
                .and_then(Value::as_str)
                .map(str::to_owned)
                .ok_or("opencode serve made no session")?
        }
    };
    let mut prompt = json!({ "parts": [{ "type": "text", "text": session.prompt }] });
    if let Some((provider, model)) = session.model.as_deref().and_then(|m| m.split_once('/')) {
        prompt["model"] = json!({ "providerID": provider, "modelID": model });
    }
    server.post(&format!("/session/{id}/prompt_async"), prompt).await?;

    let mut stream = Stream { id, family: HashSet::new(), parser: SseParser::default() };
    stream.family.insert(stream.id.clone());
    let mut body = events.bytes_stream();
    let mut replies: JoinSet<()> = JoinSet::new();
    let mut batch = Vec::new();
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|err| format!("opencode serve's events ended: {err}"))?;
        batch.clear();
        stream.parser.feed(&chunk, &mut batch).map_err(|err| err.to_string())?;
        for event in &batch {
            let Ok(event) = serde_json::from_str::<Value>(&event.data) else { continue };
            match stream.event(&event) {
                Step::Line(line) => {
                    if lines.send(StdoutLine::Line(line.to_string())).await.is_err() {
                        return Ok(());
                    }
                }
                Step::Ask(asked) => {
                    let (server, asker) = (server.clone(), asker.clone());
                    replies.spawn(async move { answer(&server, &asker, &asked).await });
                }
                Step::Idle => return Ok(()),
                Step::Nothing => {}
            }
        }
        while replies.try_join_next().is_some() {}
    }
    Err("opencode serve's events ended before the session was idle".to_owned())
}

/// What one event of the server means for the run.
#[derive(Debug)]
enum Step {
    Line(Value),
    Ask(Value),
    Idle,
    Nothing,
}

/// The session being followed.
struct Stream {
    id: String,
    /// The session and the sessions it started (subagents).
    family: HashSet<String>,
    parser: SseParser,
}

impl Stream {
    fn event(&mut self, event: &Value) -> Step {
        let kind = event.get("type").and_then(Value::as_str).unwrap_or_default();
        let props = event.get("properties").unwrap_or(&Value::Null);
        let text = |pointer: &str| props.pointer(pointer).and_then(Value::as_str);
        match kind {
            "session.created" => {
                if let (Some(child), Some(parent)) = (text("/info/id"), text("/info/parentID")) {
                    if self.family.contains(parent) {
                        self.family.insert(child.to_owned());
                    }
                }
                Step::Nothing
            }
            "message.part.updated" => {
                let part = props.get("part").unwrap_or(&Value::Null);
                if part.get("sessionID").and_then(Value::as_str) != Some(self.id.as_str()) {
                    return Step::Nothing;
                }
                let status = part.pointer("/state/status").and_then(Value::as_str);
                let ended = part.pointer("/time/end").is_some_and(|end| !end.is_null());
                let line_type = match part.get("type").and_then(Value::as_str) {
                    Some("tool") if matches!(status, Some("completed" | "error")) => "tool_use",
                    Some("step-start") => "step_start",
                    Some("step-finish") => "step_finish",
                    Some("text") if ended => "text",
                    _ => return Step::Nothing,
                };
                Step::Line(json!({ "type": line_type, "sessionID": self.id, "part": part }))
            }
            "session.error" if text("/sessionID") == Some(self.id.as_str()) => {
                match props.get("error").filter(|error| !error.is_null()) {
                    Some(error) => {
                        Step::Line(json!({ "type": "error", "sessionID": self.id, "error": error }))
                    }
                    None => Step::Nothing,
                }
            }
            "session.status"
                if text("/sessionID") == Some(self.id.as_str())
                    && text("/status/type") == Some("idle") =>
            {
                Step::Idle
            }
            "session.idle" if text("/sessionID") == Some(self.id.as_str()) => Step::Idle,
            "permission.asked" => match text("/sessionID") {
                Some(session) if self.family.contains(session) => Step::Ask(props.clone()),
                _ => Step::Nothing,
            },
            _ => Step::Nothing,
        }
    }
}

/// A connection to one run's server.
#[derive(Debug, Clone)]
struct Server {
    http: reqwest::Client,
    base: String,
    password: String,
}

impl Server {
    async fn post(&self, path: &str, body: Value) -> Result<Value, String> {
        let response = self
            .http
            .post(format!("{}{path}", self.base))
            .basic_auth(USER, Some(&self.password))
            .timeout(REQUEST_TIMEOUT)
            .json(&body)
            .send()
            .await
            .map_err(|err| format!("opencode serve did not answer {path}: {err}"))?;
        let status = response.status();
        let text = response.text().await.unwrap_or_default();
        if !status.is_success() {
            let text = lemon_core::log_text::escape(crate::cli::translate::head_chars(&text, 300));
            return Err(format!("opencode serve refused {path} ({status}): {text}"));
        }
        Ok(serde_json::from_str(&text).unwrap_or(Value::Null))
    }
}

/// Judges one `permission.asked` and replies to it.
async fn answer(server: &Server, asker: &Asker, asked: &Value) {
    let Some(id) = asked.get("id").and_then(Value::as_str) else { return };
    let call = asked.pointer("/tool/callID").and_then(Value::as_str);
    let (tool, input) = call_of(asked);
    let reply = match asker.decide(tool, &input, call).await {
        Decision::Allow => json!({ "reply": "once" }),
        Decision::Deny(message) => json!({ "reply": "reject", "message": message }),
    };
    if let Err(error) = server.post(&format!("/permission/{id}/reply"), reply).await {
        tracing::warn!(%error, "an approval did not reach opencode serve");
    }
}

/// The gate's tool and input for an OpenCode permission request.
fn call_of(asked: &Value) -> (&str, Value) {
    let permission = asked.get("permission").and_then(Value::as_str).unwrap_or("*");
    let patterns: Vec<&str> = asked
        .get("patterns")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    let meta = |key: &str| asked.pointer(&format!("/metadata/{key}")).and_then(Value::as_str);
    let first = patterns.first().copied().unwrap_or(".");
    match permission {
        "bash" => {
            let command = meta("command").map_or_else(|| patterns.join(" && "), str::to_owned);
            ("bash", json!({ "command": command }))
        }
        "read" | "edit" | "list" | "glob" | "grep" => {
            let path = meta("filepath").or_else(|| meta("filePath")).unwrap_or(first);
            (permission, json!({ "path": path }))
        }
        "webfetch" => ("fetch", json!({ "url": meta("url").unwrap_or(first) })),
        other => (other, json!({ "patterns": patterns })),
    }
}

#[cfg(test)]
mod tests;
