//! A run's progress message and final messages, built from its bus events.
//!
//! The progress message is edited while the run goes on; it shows the run's state,
//! one line per action and, once known, the command that resumes the conversation.
//! Answer deltas do not change it: progress changes only when an action starts or
//! ends, so streaming an answer costs no edits. When the run completes, the final
//! messages carry the answer, split to Telegram's limit.
//!
//! Every text produced fits one message ([`MAX_TEXT_UTF16`] UTF-16 units) and its
//! entities are sorted, disjoint, non-empty and inside the text.
//!
//! A [`RenderStyle`] can leave the resume line out (`show_resume_line = false`)
//! and send everything plain, without entities (`use_markdown = false`).

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use lemon_core::bus::{BusEvent, EventKind, RunStatus};
use lemon_core::engine::{Action, ActionPhase, Completion, ResumeToken, RunError};

use super::format::{markdown_to_telegram, utf16_len};
use super::split::split_markdown;
use super::types::{FormattedText, MessageEntity, MAX_TEXT_UTF16};

/// Formats a resume token as its engine shows it, e.g. `` `claude --resume abc` ``
/// (see `Engine::format_resume`). Surrounding backticks are optional.
pub type ResumeFormat = Arc<dyn Fn(&ResumeToken) -> String + Send + Sync>;

/// At most this many action lines are shown; older ones are counted as hidden.
const MAX_ACTION_LINES: usize = 20;
/// The shown action lines take at most this many UTF-16 units, which keeps the
/// progress message well under the limit whatever the titles.
const MAX_ACTIONS_UTF16: usize = 2500;
/// An action title is cut to this many characters.
const MAX_TITLE_CHARS: usize = 80;
/// A resume line longer than this is not a resume command anyone can type; it is
/// left out rather than cut.
const MAX_RESUME_UTF16: usize = 512;

/// How the messages look: `[gateway.telegram] show_resume_line` and `use_markdown`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RenderStyle {
    /// The resume line ends the progress message and the answer.
    pub resume_line: bool,
    /// Code is formatted as Telegram code; otherwise the engine's Markdown is
    /// sent as it is, without entities.
    pub markdown: bool,
}

impl Default for RenderStyle {
    fn default() -> Self {
        RenderStyle { resume_line: true, markdown: true }
    }
}

/// How far an action got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    Running,
    Done,
    Failed,
}

impl Step {
    fn of(action: &Action) -> Self {
        match action.phase {
            ActionPhase::Started | ActionPhase::Updated => Step::Running,
            ActionPhase::Completed if action.ok == Some(false) => Step::Failed,
            ActionPhase::Completed => Step::Done,
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Step::Running => "running",
            Step::Done => "done",
            Step::Failed => "failed",
        }
    }
}

/// One line of the action list.
#[derive(Debug, Clone)]
struct ActionLine {
    title: String,
    step: Step,
}

/// Builds the progress message of one run from its bus events.
///
/// Feed every event of the run to [`apply`](Self::apply); when it returns true,
/// edit the progress message to [`progress`](Self::progress). When the run
/// completes, send [`final_messages`](Self::final_messages).
pub struct ProgressRenderer {
    resume_format: ResumeFormat,
    style: RenderStyle,
    /// The engine's id, from `run_started`.
    engine: Option<String>,
    /// Where the run is, as the first line of the progress message says.
    status: RunStatus,
    /// Actions in the order they were first seen.
    actions: Vec<ActionLine>,
    /// Action id → index in `actions`.
    action_index: HashMap<String, usize>,
    /// The latest resume token reported by the engine or the completion.
    resume: Option<ResumeToken>,
    /// The progress text as of the last event, to tell when it changed.
    rendered: FormattedText,
}

impl fmt::Debug for ProgressRenderer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProgressRenderer")
            .field("engine", &self.engine)
            .field("status", &self.status)
            .field("actions", &self.actions.len())
            .field("resume", &self.resume)
            .field("style", &self.style)
            .finish_non_exhaustive()
    }
}

impl ProgressRenderer {
    /// A renderer for a run that has not started yet, in the default style.
    pub fn new(resume_format: ResumeFormat) -> Self {
        ProgressRenderer::with_style(resume_format, RenderStyle::default())
    }

    /// A renderer for a run that has not started yet, in `style`.
    pub fn with_style(resume_format: ResumeFormat, style: RenderStyle) -> Self {
        let mut renderer = ProgressRenderer {
            resume_format,
            style,
            engine: None,
            status: RunStatus::Running,
            actions: Vec::new(),
            action_index: HashMap::new(),
            resume: None,
            rendered: FormattedText::default(),
        };
        renderer.rendered = renderer.render();
        renderer
    }

    /// Takes one event of the run into account. Returns true when the progress
    /// text changed, i.e. when the progress message needs an edit.
    pub fn apply(&mut self, event: &BusEvent) -> bool {
        match &event.kind {
            EventKind::RunStarted { engine, .. } => self.engine = Some(engine.clone()),
            EventKind::EngineStarted { resume, .. } => self.note_resume(resume.as_ref()),
            EventKind::EngineAction(action) => self.upsert_action(action),
            EventKind::EngineCompleted(completion) => self.note_resume(completion.resume.as_ref()),
            EventKind::RunCompleted { completion, engine, .. } => {
                self.engine = Some(engine.clone());
                return self.complete(completion);
            }
            EventKind::Delta { .. } | EventKind::Phase(_) | EventKind::Status(_) => return false,
        }
        self.rerender()
    }

    /// Takes the run's ending into account, whether it came as an event or was
    /// read back from the store (a restart, a follower that fell behind).
    /// Returns true when the progress text changed.
    pub fn complete(&mut self, completion: &Completion) -> bool {
        self.note_resume(completion.resume.as_ref());
        self.status = RunStatus::of(completion);
        self.rerender()
    }

    fn note_resume(&mut self, resume: Option<&ResumeToken>) {
        if let Some(resume) = resume {
            self.resume = Some(resume.clone());
        }
    }

    fn rerender(&mut self) -> bool {
        let rendered = self.render();
        if rendered == self.rendered {
            return false;
        }
        self.rendered = rendered;
        true
    }

    /// The progress message as of the last event.
    pub fn progress(&self) -> FormattedText {
        self.rendered.clone()
    }

    /// The session the run continues or started, as known so far (or as its
    /// completion says).
    pub fn resume_token<'a>(&'a self, completion: &'a Completion) -> Option<&'a ResumeToken> {
        completion.resume.as_ref().or(self.resume.as_ref())
    }

    /// The messages that end the run: the answer split to Telegram's limit with
    /// the resume command after it; `Error: <message>` for a failed run,
    /// `Cancelled.` (or why it was stopped: interrupted, dropped from a full
    /// queue, the gateway shutting down) for a cancelled one and `Done.` for an
    /// empty answer.
    pub fn final_messages(&self, completion: &Completion) -> Vec<FormattedText> {
        let body = match RunStatus::of(completion) {
            RunStatus::Cancelled => cancelled_text(completion.error.as_ref()),
            RunStatus::Failed => match &completion.error {
                Some(error) => format!("Error: {error}"),
                None => "Error: the run failed".to_owned(),
            },
            _ => completion.answer.clone(),
        };
        let markdown = self.style.markdown;
        let mut messages: Vec<FormattedText> = split_markdown(&body, MAX_TEXT_UTF16)
            .iter()
            .map(|chunk| match markdown {
                true => trim_outside_entities(markdown_to_telegram(chunk)),
                false => FormattedText::plain(chunk.trim()),
            })
            .filter(|message| !message.text.is_empty())
            .collect();
        if messages.is_empty() {
            messages.push(FormattedText::plain("Done."));
        }
        let resume = self.resume_token(completion);
        if let Some(line) = resume.and_then(|token| self.resume_line(token)) {
            let last = messages
                .last_mut()
                .filter(|last| utf16_len(&last.text) + 2 + utf16_len(&line) <= MAX_TEXT_UTF16);
            match last {
                Some(last) => self.push_resume_paragraph(last, &line),
                None => {
                    let mut own = FormattedText::default();
                    self.push_resume_paragraph(&mut own, &line);
                    messages.push(own);
                }
            }
        }
        messages
    }

    fn upsert_action(&mut self, action: &Action) {
        let line = ActionLine { title: action_title(action), step: Step::of(action) };
        match self.action_index.get(&action.id) {
            Some(&i) => self.actions[i] = line,
            None => {
                self.action_index.insert(action.id.clone(), self.actions.len());
                self.actions.push(line);
            }
        }
    }

    /// The resume command without backticks, if there is a usable one and
    /// the style shows it.
    fn resume_line(&self, token: &ResumeToken) -> Option<String> {
        if !self.style.resume_line {
            return None;
        }
        let formatted = (self.resume_format)(token);
        let line = formatted.trim().trim_matches('`').trim();
        let usable = !line.is_empty() && utf16_len(line) <= MAX_RESUME_UTF16;
        usable.then(|| line.to_owned())
    }

    fn render(&self) -> FormattedText {
        let header = match (self.status, &self.engine) {
            (RunStatus::Queued | RunStatus::Running | RunStatus::Cancelling, Some(engine)) => {
                format!("Running… ({})", one_line(engine))
            }
            (RunStatus::Queued | RunStatus::Running | RunStatus::Cancelling, None) => {
                "Running…".to_owned()
            }
            (RunStatus::Completed, _) => "Done.".to_owned(),
            (RunStatus::Cancelled, _) => "Cancelled.".to_owned(),
            (RunStatus::Failed, _) => "Error.".to_owned(),
        };
        let mut out = FormattedText::plain(header);
        // The newest lines that fit both limits; the older ones are only counted.
        let mut shown = Vec::new();
        let mut units = 0;
        for action in self.actions.iter().rev().take(MAX_ACTION_LINES) {
            let line = format!("- {}: {}", action.title, action.step.as_str());
            units += utf16_len(&line) + 1;
            if units > MAX_ACTIONS_UTF16 {
                break;
            }
            shown.push(line);
        }
        if !shown.is_empty() {
            out.text.push_str("\n\n");
            let hidden = self.actions.len() - shown.len();
            if hidden > 0 {
                let steps = if hidden == 1 { "step" } else { "steps" };
                out.text.push_str(&format!("({hidden} earlier {steps} not shown)\n"));
            }
            shown.reverse();
            out.text.push_str(&shown.join("\n"));
        }
        if let Some(line) = self.resume.as_ref().and_then(|token| self.resume_line(token)) {
            self.push_resume_paragraph(&mut out, &line);
        }
        out
    }

    /// Appends the resume line as its own paragraph: as code, or plain.
    fn push_resume_paragraph(&self, out: &mut FormattedText, line: &str) {
        if self.style.markdown {
            push_code_paragraph(out, line);
        } else {
            if !out.text.is_empty() {
                out.text.push_str("\n\n");
            }
            out.text.push_str(line);
        }
    }
}

/// The action's title on one line, its kind when it has none.
fn action_title(action: &Action) -> String {
    let title = one_line(&action.title);
    if title.is_empty() {
        action.kind.as_str().to_owned()
    } else {
        title
    }
}

/// `text` with whitespace runs collapsed to one space and cut to
/// [`MAX_TITLE_CHARS`] characters.
fn one_line(text: &str) -> String {
    let line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    match line.char_indices().nth(MAX_TITLE_CHARS) {
        Some((cut, _)) => format!("{}…", &line[..cut]),
        None => line,
    }
}

/// Appends `code` as its own paragraph, formatted as a `code` entity.
fn push_code_paragraph(out: &mut FormattedText, code: &str) {
    if !out.text.is_empty() {
        out.text.push_str("\n\n");
    }
    let offset = utf16_len(&out.text);
    out.text.push_str(code);
    out.entities.push(MessageEntity {
        kind: "code".to_owned(),
        offset,
        length: utf16_len(code),
        language: None,
    });
}

/// Drops whitespace at both ends of the text, unless it belongs to an entity
/// (the indentation of a code block's first line, say).
fn trim_outside_entities(mut formatted: FormattedText) -> FormattedText {
    // Whitespace characters are all in the Basic Multilingual Plane: one UTF-16
    // unit and at most three bytes each, so units and characters count alike.
    let first_entity = formatted.entities.first().map_or(usize::MAX, |e| e.offset);
    let leading: Vec<char> =
        formatted.text.chars().take_while(|c| c.is_whitespace()).take(first_entity).collect();
    let leading_bytes: usize = leading.iter().map(|c| c.len_utf8()).sum();
    formatted.text.drain(..leading_bytes);
    for entity in &mut formatted.entities {
        entity.offset -= leading.len();
    }

    let keep_units = formatted.entities.iter().map(|e| e.offset + e.length).max().unwrap_or(0);
    let mut units = utf16_len(&formatted.text);
    while units > keep_units && formatted.text.ends_with(char::is_whitespace) {
        formatted.text.pop();
        units -= 1;
    }
    formatted
}

#[cfg(test)]
mod tests;

/// What a user reads when their run was stopped rather than failed.
fn cancelled_text(error: Option<&RunError>) -> String {
    match error {
        Some(RunError::Interrupted) => "Interrupted.".to_owned(),
        Some(RunError::ShuttingDown) => "Stopped: the gateway shut down.".to_owned(),
        Some(RunError::QueueOverflow) => {
            "Dropped: too many messages are waiting in this chat.".to_owned()
        }
        Some(RunError::IdleWatchdog) => "Cancelled: the run went quiet for too long.".to_owned(),
        Some(RunError::Merged { .. }) => "Added to the next job.".to_owned(),
        Some(RunError::Cancelled { reason }) if !reason.trim().is_empty() => {
            format!("Cancelled: {}.", reason.trim().trim_end_matches('.'))
        }
        _ => "Cancelled.".to_owned(),
    }
}
