//! What every vendor parser speaks: an [`Emitter`] that turns "a tool started", "a
//! note", "the run completed" into [`EngineEvent`]s, and the per-run [`Translator`]
//! that feeds lines to a vendor's [`StreamParser`] and guarantees the event order.
//!
//! Invariants held here rather than in each parser:
//! - `Started` is the first event and there is exactly one: an event before the
//!   vendor's own start is preceded by a `Started` carrying the requested resume
//!   token (or none); a later vendor start only updates the resume token.
//! - `Completed` is the last event and there is exactly one: after it, lines, exits
//!   and timeouts produce nothing.
//! - At most three undecodable lines (and three oversized lines) become warnings.

use std::collections::HashMap;
use std::fmt;
use std::path::PathBuf;

use lemon_core::engine::{
    Action, ActionKind, ActionPhase, Completion, EngineEvent, ResumeToken, RunError,
};
use serde_json::{json, Value};

use super::process::Exit;
use super::Vendor;

/// Undecodable (or oversized) lines that are reported; more are only logged.
const MAX_LINE_WARNINGS: usize = 3;
/// How much of a bad line a warning carries.
const BAD_LINE_PREVIEW_CHARS: usize = 200;
/// How much of stderr a failed completion's message carries.
const STDERR_IN_ERROR_CHARS: usize = 2000;

/// Lower-case fragments of a vendor's error text that mean the model's context
/// overflowed: OpenAI's codes and messages (through codex, opencode, pi), HTTP 413
/// from any provider, and the messages of Chinese providers (through opencode and
/// pi). Every vendor's failures are checked against all of them, because each CLI
/// can sit in front of any provider.
const OVERFLOW_MARKERS: [&str; 15] = [
    "context_length_exceeded",
    "context length exceeded",
    "context window",
    "http 413",
    "payload too large",
    "request entity too large",
    "string too long",
    "maximum length",
    "invalid 'input[",
    "input[",
    "上下文长度超过限制",
    "令牌数量超出",
    "输入过长",
    "超出最大长度",
    "上下文窗口已满",
];

/// A CLI's failure as the run's error: [`RunError::ContextOverflow`] when the
/// vendor's text says the session no longer fits the model, so the router starts
/// the next message fresh; otherwise the engine's message as it is.
pub(crate) fn classify_failure(message: String) -> RunError {
    let lower = message.to_lowercase();
    if OVERFLOW_MARKERS.iter().any(|marker| lower.contains(marker)) {
        RunError::ContextOverflow { message }
    } else {
        RunError::Engine { message }
    }
}

/// Lower-case fragments of a vendor's error text that mean the CLI has no
/// credentials: Claude Code's `Not logged in · Please run /login` and
/// `Invalid API key`, and the missing or refused keys of the others (a 401
/// from the provider, OpenCode's `ProviderAuthError`, Pi's `No API key`).
const LOGIN_MARKERS: [&str; 10] = [
    "not logged in",
    "please run /login",
    "invalid api key",
    "invalid x-api-key",
    "authentication_error",
    "401 unauthorized",
    "providerautherror",
    "no api key",
    "api key is missing",
    "missing api key",
];

/// What to do when `vendor`'s CLI has no credentials: the secret to set (and
/// where it goes) or the variables to pass through.
pub(crate) fn login_fix(vendor: Vendor) -> String {
    let section = format!("[gateway.engines.{vendor}]");
    match vendor.default_api_key_env() {
        Some(var) => {
            let secret = var.to_ascii_lowercase();
            let prefix = var.split('_').next().unwrap_or(var);
            format!(
                "the {vendor} CLI has no credentials: log it in as the user the gateway runs as, \
                 or set api_key_secret = \"{secret}\" in {section} and put the key in \
                 $LEMON_HOME/secrets.toml (default ~/.lemon/secrets.toml) as {secret} = \"…\" \
                 or in the gateway's environment as {var}, \
                 or pass your environment through with env_passthrough = [\"{prefix}_*\"]"
            )
        }
        None => format!(
            "the {vendor} CLI has no credentials: log it in as the user the gateway runs as, \
             or pass its provider's key variables through with env_passthrough = [\"PROVIDER_*\"] \
             in {section} (the gateway does not pass its environment to CLIs by default)"
        ),
    }
}

/// As [`classify_failure`], and a failure that says the CLI has no
/// credentials gets the fix after the vendor's own words.
pub(crate) fn classify_failure_for(vendor: Vendor, message: String) -> RunError {
    let lower = message.to_lowercase();
    if LOGIN_MARKERS.iter().any(|marker| lower.contains(marker)) {
        return RunError::Engine { message: format!("{message} — {}", login_fix(vendor)) };
    }
    classify_failure(message)
}

/// A line that is not an event of the vendor's schema.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub(crate) struct DecodeError(pub(crate) String);

impl From<serde_json::Error> for DecodeError {
    fn from(err: serde_json::Error) -> Self {
        DecodeError(err.to_string())
    }
}

/// What a parser knows about the run besides its output.
#[derive(Debug, Clone, Default)]
pub(crate) struct ParseContext {
    /// The run's working directory; tool paths are shown relative to it.
    pub(crate) cwd: Option<PathBuf>,
    /// The child's `HOME`, shown as `~` in command titles.
    pub(crate) home: Option<String>,
    /// The model the CLI was asked to use.
    pub(crate) model: Option<String>,
    /// Pi's `--provider`.
    pub(crate) provider: Option<String>,
}

/// One vendor's JSONL schema: each line in, events out through the [`Emitter`].
pub(crate) trait StreamParser: Send + Sync + fmt::Debug {
    /// Handles one non-empty line.
    ///
    /// # Errors
    /// [`DecodeError`] when the line is not part of the schema.
    fn line(&mut self, line: &str, out: &mut Emitter) -> Result<(), DecodeError>;

    /// Another user message was written into the live session.
    fn steered(&mut self) {}

    /// The answer so far, for a completion the stream itself did not bring.
    fn partial_answer(&self) -> String;

    /// How a clean exit (status 0) without a terminal event ends the run: the answer,
    /// or the error message.
    ///
    /// # Errors
    /// The error message when such an end is a failure.
    fn clean_end(&self, out: &Emitter) -> Result<String, String>;
}

/// An action that started and has not completed.
#[derive(Debug, Clone)]
struct Pending {
    kind: ActionKind,
    title: String,
    detail: Value,
}

/// Collects the events of one run in order, keeping the started/pending/completed
/// bookkeeping the parsers share.
#[derive(Debug)]
pub(crate) struct Emitter {
    vendor: Vendor,
    /// The token the run was asked to continue.
    requested: Option<ResumeToken>,
    /// The session the stream reported, once known.
    found: Option<ResumeToken>,
    started: bool,
    done: bool,
    pending: HashMap<String, Pending>,
    n_notes: usize,
    /// Whether any text was streamed, so later paragraphs get a separator.
    streamed: bool,
    events: Vec<EngineEvent>,
}

impl Emitter {
    pub(crate) fn new(vendor: Vendor, requested: Option<ResumeToken>) -> Self {
        Emitter {
            vendor,
            requested,
            found: None,
            started: false,
            done: false,
            pending: HashMap::new(),
            n_notes: 0,
            streamed: false,
            events: Vec::new(),
        }
    }

    /// The session the stream reported.
    pub(crate) fn found(&self) -> Option<&ResumeToken> {
        self.found.as_ref()
    }

    /// The token a completion carries: the reported session, else the requested one.
    pub(crate) fn resume(&self) -> Option<&ResumeToken> {
        self.found.as_ref().or(self.requested.as_ref())
    }

    pub(crate) fn has_started(&self) -> bool {
        self.started
    }

    pub(crate) fn is_done(&self) -> bool {
        self.done
    }

    /// Records the session the stream reported without emitting anything.
    pub(crate) fn set_session(&mut self, value: &str) {
        if !value.is_empty() {
            self.found = Some(ResumeToken::new(self.vendor.id(), value));
        }
    }

    /// The run's `Started`; a second one only updates the session.
    pub(crate) fn started(&mut self, session: Option<&str>, title: impl Into<String>, meta: Value) {
        if let Some(value) = session {
            self.set_session(value);
        }
        if self.started || self.done {
            return;
        }
        self.started = true;
        self.events.push(EngineEvent::Started {
            resume: self.resume().cloned(),
            title: Some(title.into()),
            meta,
        });
    }

    fn ensure_started(&mut self) {
        if !self.started {
            self.started(None, self.vendor.title(), Value::Null);
        }
    }

    fn push(&mut self, event: EngineEvent) {
        if self.done {
            return;
        }
        self.ensure_started();
        self.events.push(event);
    }

    fn push_action(&mut self, mut action: Action) {
        if action.result_meta.is_null() {
            action.result_meta = result_meta(&action);
        }
        self.push(EngineEvent::Action(action));
    }

    pub(crate) fn is_pending(&self, id: &str) -> bool {
        self.pending.contains_key(id)
    }

    /// An action in phase `started`, remembered until it completes.
    pub(crate) fn start_action(
        &mut self,
        id: &str,
        kind: ActionKind,
        title: String,
        detail: Value,
    ) {
        self.open_action(id, kind, title, detail, ActionPhase::Started);
    }

    /// An action in phase `updated`; it stays pending with the new title and detail.
    pub(crate) fn update_action(
        &mut self,
        id: &str,
        kind: ActionKind,
        title: String,
        detail: Value,
    ) {
        self.open_action(id, kind, title, detail, ActionPhase::Updated);
    }

    /// Records `id` as pending with this title and detail, and emits it in `phase`.
    fn open_action(
        &mut self,
        id: &str,
        kind: ActionKind,
        title: String,
        detail: Value,
        phase: ActionPhase,
    ) {
        self.pending
            .insert(id.to_owned(), Pending { kind, title: title.clone(), detail: detail.clone() });
        self.push_action(action(id, kind, title, detail, phase, None));
    }

    /// Completes a pending action, keeping its kind and title and merging `detail`
    /// into its detail; an unknown id uses `fallback`.
    pub(crate) fn complete_action(
        &mut self,
        id: &str,
        ok: bool,
        detail: Value,
        fallback: (ActionKind, String),
    ) -> (ActionKind, String) {
        let (kind, title, detail) = match self.pending.remove(id) {
            Some(pending) => (pending.kind, pending.title, merge(pending.detail, detail)),
            None => (fallback.0, fallback.1, detail),
        };
        self.push_action(action(id, kind, title.clone(), detail, ActionPhase::Completed, Some(ok)));
        (kind, title)
    }

    /// An action that starts and completes at once.
    pub(crate) fn completed_action(
        &mut self,
        id: &str,
        kind: ActionKind,
        title: String,
        detail: Value,
        ok: bool,
    ) {
        self.pending.remove(id);
        self.push_action(action(id, kind, title, detail, ActionPhase::Completed, Some(ok)));
    }

    /// Any action, as built by the caller.
    pub(crate) fn raw_action(&mut self, action: Action) {
        if action.phase == ActionPhase::Completed {
            self.pending.remove(&action.id);
        } else {
            let pending = Pending {
                kind: action.kind,
                title: action.title.clone(),
                detail: action.detail.clone(),
            };
            self.pending.insert(action.id.clone(), pending);
        }
        self.push_action(action);
    }

    /// A warning (or, with `ok`, an informational note) shown as its own completed action.
    pub(crate) fn note(&mut self, message: impl Into<String>, ok: bool) {
        let message = message.into();
        let id = format!("note_{}", self.n_notes);
        self.n_notes += 1;
        self.push_action(Action {
            id,
            kind: ActionKind::Warning,
            title: message.clone(),
            detail: Value::Null,
            phase: ActionPhase::Completed,
            ok: Some(ok),
            message: Some(message),
            level: Some(if ok { "info" } else { "warning" }.to_owned()),
            result_meta: serde_json::Value::Null,
        });
    }

    /// A completed warning action with its own id.
    pub(crate) fn warning(&mut self, id: &str, title: &str, detail: Value) {
        self.push_action(Action {
            id: id.to_owned(),
            kind: ActionKind::Warning,
            title: title.to_owned(),
            detail,
            phase: ActionPhase::Completed,
            ok: Some(false),
            message: Some(title.to_owned()),
            level: Some("warning".to_owned()),
            result_meta: serde_json::Value::Null,
        });
    }

    /// Streams text as it is.
    pub(crate) fn delta(&mut self, text: &str) {
        if text.is_empty() {
            return;
        }
        self.streamed = true;
        self.push(EngineEvent::Delta(text.to_owned()));
    }

    /// Streams a whole message, separated from earlier text by a blank line.
    pub(crate) fn paragraph(&mut self, text: &str) {
        if text.trim().is_empty() {
            return;
        }
        if self.streamed {
            self.delta(&format!("\n\n{text}"));
        } else {
            self.delta(text);
        }
    }

    pub(crate) fn complete_ok(&mut self, answer: String, usage: Value) {
        let completion =
            Completion { usage, ..Completion::success(answer, self.resume().cloned()) };
        self.finish(completion);
    }

    /// A failed completion with the engine's own message, classified by
    /// [`classify_failure_for`].
    pub(crate) fn complete_error(&mut self, message: String, answer: String, usage: Value) {
        self.complete_failure(classify_failure_for(self.vendor, message), answer, usage);
    }

    pub(crate) fn complete_failure(&mut self, error: RunError, answer: String, usage: Value) {
        let completion =
            Completion { answer, usage, ..Completion::failure(error, self.resume().cloned()) };
        self.finish(completion);
    }

    fn finish(&mut self, completion: Completion) {
        self.push(EngineEvent::Completed(completion));
        self.done = true;
    }

    /// The events collected since the last call.
    pub(crate) fn take(&mut self) -> Vec<EngineEvent> {
        std::mem::take(&mut self.events)
    }
}

fn action(
    id: &str,
    kind: ActionKind,
    title: String,
    detail: Value,
    phase: ActionPhase,
    ok: Option<bool>,
) -> Action {
    Action {
        id: id.to_owned(),
        kind,
        title,
        detail,
        phase,
        ok,
        message: None,
        level: None,
        result_meta: serde_json::Value::Null,
    }
}

/// The safe failure fields of a failed step, from what the vendor's JSONL says of
/// it: `exit_code` (a command's status), `timeout_ms` (a tool's own timeout) and
/// `error_type` (`nonzero_exit`, `declined`, `tool_error`). Never output text or
/// paths. `Null` for a step that did not fail, a warning or a note.
pub(crate) fn result_meta(action: &Action) -> Value {
    if action.phase != ActionPhase::Completed
        || action.ok != Some(false)
        || matches!(action.kind, ActionKind::Warning | ActionKind::Note)
    {
        return Value::Null;
    }
    let detail = &action.detail;
    let exit_code = detail.get("exit_code").and_then(Value::as_i64);
    let timeout_ms = ["timeout_ms", "timeout"]
        .iter()
        .find_map(|key| {
            detail.get(*key).or_else(|| detail.get("input").and_then(|input| input.get(*key)))
        })
        .and_then(Value::as_u64);
    let error_type = match detail.get("status").and_then(Value::as_str) {
        Some("declined") => "declined",
        _ if exit_code.is_some_and(|code| code != 0) => "nonzero_exit",
        _ => "tool_error",
    };
    let mut meta = serde_json::Map::new();
    meta.insert("error_type".to_owned(), json!(error_type));
    if let Some(code) = exit_code {
        meta.insert("exit_code".to_owned(), json!(code));
    }
    if let Some(ms) = timeout_ms {
        meta.insert("timeout_ms".to_owned(), json!(ms));
    }
    Value::Object(meta)
}

/// `extra`'s keys over `base`'s when both are objects; otherwise whichever is set.
fn merge(base: Value, extra: Value) -> Value {
    match (base, extra) {
        (Value::Object(mut base), Value::Object(extra)) => {
            base.extend(extra);
            Value::Object(base)
        }
        (base, Value::Null) => base,
        (_, extra) => extra,
    }
}

/// One run's line loop: lines, oversized lines, steering, the exit and the timeout
/// in; events out, in the order the contract wants.
#[derive(Debug)]
pub(crate) struct Translator {
    vendor: Vendor,
    parser: Box<dyn StreamParser>,
    out: Emitter,
    n_decode_errors: usize,
    n_oversized: usize,
}

impl Translator {
    pub(crate) fn new(
        vendor: Vendor,
        parser: Box<dyn StreamParser>,
        requested: Option<ResumeToken>,
    ) -> Self {
        Translator {
            vendor,
            parser,
            out: Emitter::new(vendor, requested),
            n_decode_errors: 0,
            n_oversized: 0,
        }
    }

    /// Whether the run's `Completed` has been produced.
    pub(crate) fn is_done(&self) -> bool {
        self.out.is_done()
    }

    /// One line of stdout.
    pub(crate) fn line(&mut self, line: &str) -> Vec<EngineEvent> {
        let line = line.strip_suffix('\r').unwrap_or(line);
        if self.is_done() || line.trim().is_empty() {
            return Vec::new();
        }
        if let Err(err) = self.parser.line(line, &mut self.out) {
            let n = self.n_decode_errors;
            self.n_decode_errors += 1;
            if n < MAX_LINE_WARNINGS {
                let preview: String = line.chars().take(BAD_LINE_PREVIEW_CHARS).collect();
                self.out.warning(
                    &format!("decode_error_{n}"),
                    "Invalid JSONL line",
                    json!({ "decode_error": err.0, "line": preview }),
                );
            } else {
                tracing::debug!(engine = self.vendor.id(), error = %err, "invalid JSONL line");
            }
        }
        self.out.take()
    }

    /// A stdout line longer than `limit` bytes was skipped.
    pub(crate) fn oversized(&mut self, bytes: usize, limit: usize) -> Vec<EngineEvent> {
        if self.is_done() {
            return Vec::new();
        }
        let n = self.n_oversized;
        self.n_oversized += 1;
        if n < MAX_LINE_WARNINGS {
            self.out.warning(
                &format!("oversized_line_{n}"),
                "Oversized JSONL line skipped",
                json!({ "bytes": bytes, "limit": limit }),
            );
        } else {
            tracing::debug!(
                engine = self.vendor.id(),
                bytes,
                limit,
                "oversized JSONL line skipped"
            );
        }
        self.out.take()
    }

    /// Another user message went into the live session.
    pub(crate) fn steered(&mut self) {
        self.parser.steered();
    }

    /// The process exited and its output has been read: the completion, unless the
    /// stream already brought one.
    pub(crate) fn exited(
        &mut self,
        exit: Exit,
        stderr: &str,
        stderr_truncated: bool,
    ) -> Vec<EngineEvent> {
        if self.is_done() {
            return Vec::new();
        }
        let stderr = stderr.trim();
        if exit.success() {
            if !stderr.is_empty() {
                self.out.warning(
                    "cli.stderr",
                    "CLI stderr output",
                    json!({ "stderr": tail_chars(stderr, STDERR_IN_ERROR_CHARS), "exit_code": 0, "truncated": stderr_truncated }),
                );
            }
            match self.parser.clean_end(&self.out) {
                Ok(answer) => self.out.complete_ok(answer, Value::Null),
                Err(message) => {
                    self.out.complete_error(message, self.parser.partial_answer(), Value::Null)
                }
            }
        } else {
            let message = exit_message(self.vendor.id(), exit, stderr);
            self.out.complete_error(message, self.parser.partial_answer(), Value::Null);
        }
        self.out.take()
    }

    /// No output for the inactivity timeout: the run fails with `timeout`.
    pub(crate) fn timed_out(&mut self) -> Vec<EngineEvent> {
        if self.is_done() {
            return Vec::new();
        }
        self.out.complete_failure(RunError::Timeout, self.parser.partial_answer(), Value::Null);
        self.out.take()
    }
}

/// `claude exited with status 2: <stderr tail>`.
fn exit_message(engine: &str, exit: Exit, stderr: &str) -> String {
    let status = match (exit.code, exit.signal) {
        (Some(code), _) => format!("{engine} exited with status {code}"),
        (None, Some(signal)) => format!("{engine} was killed by signal {signal}"),
        (None, None) => format!("{engine} exited abnormally"),
    };
    if stderr.is_empty() {
        status
    } else {
        format!("{status}: {}", tail_chars(stderr, STDERR_IN_ERROR_CHARS))
    }
}

/// The last `n` characters of `text`.
fn tail_chars(text: &str, n: usize) -> &str {
    match text.char_indices().rev().nth(n.saturating_sub(1)) {
        Some((start, _)) if n > 0 => &text[start..],
        _ => text,
    }
}

/// The first `n` characters of `text`.
pub(crate) fn head_chars(text: &str, n: usize) -> &str {
    match text.char_indices().nth(n) {
        Some((end, _)) => &text[..end],
        None => text,
    }
}

/// A compact rendering of an event, in the notation of the fixtures' README:
/// `S(claude:abc)`, `A(started id kind "title" -)`, `D("text")`,
/// `C(ok=true, answer "…", resume claude:abc)`. Used by tests and debugging output.
pub fn describe(event: &EngineEvent) -> String {
    fn token(token: Option<&ResumeToken>) -> String {
        token.map_or_else(|| "-".to_owned(), |t| format!("{}:{}", t.engine, t.value))
    }
    match event {
        EngineEvent::Started { resume, .. } => format!("S({})", token(resume.as_ref())),
        EngineEvent::Action(a) => {
            let ok = a.ok.map_or_else(|| "-".to_owned(), |ok| ok.to_string());
            let level = a.level.as_ref().map(|l| format!(" level={l}")).unwrap_or_default();
            format!(
                "A({} {} {} {:?} {ok}{level})",
                a.phase.as_str(),
                a.id,
                a.kind.as_str(),
                a.title
            )
        }
        EngineEvent::Delta(text) => format!("D({text:?})"),
        EngineEvent::Completed(c) => {
            let error = c
                .error
                .as_ref()
                .map(|e| format!(", error {:?}", e.to_string()))
                .unwrap_or_default();
            format!(
                "C(ok={}, answer {:?}{error}, resume {})",
                c.ok,
                c.answer,
                token(c.resume.as_ref())
            )
        }
    }
}

#[cfg(test)]
mod tests;
