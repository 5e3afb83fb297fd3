//! What a run shows in Discord: one working message, edited as the run goes
//! (the answer as it streams in, or the actions while there is no text yet),
//! then the answer split into messages under 2 000 characters, code blocks
//! closed and reopened at a cut, and the resume line in code format.

use std::sync::Arc;

use lemon_core::bus::{BusEvent, EventKind, RunStatus};
use lemon_core::engine::{Action, ActionPhase, Completion, ResumeToken, RunError};

use super::types::MAX_CONTENT_CHARS;
use crate::telegram::render::ResumeFormat;
use crate::telegram::split::split_markdown;

/// The streamed text shown in the working message is cut to this many
/// characters (its newest part), leaving room for the status line.
const MAX_STREAMED_CHARS: usize = MAX_CONTENT_CHARS - 200;
/// Action lines shown while no text has come.
const MAX_ACTION_LINES: usize = 8;
const MAX_TITLE_CHARS: usize = 80;
/// A resume line longer than this is left out rather than cut.
const MAX_RESUME_CHARS: usize = 512;

/// Builds one run's working message and final messages from its events.
pub struct StreamRenderer {
    resume_format: ResumeFormat,
    engine: Option<String>,
    /// The answer so far, from the engine's deltas.
    text: String,
    /// (id, title, step) in the order first seen.
    actions: Vec<(String, String, &'static str)>,
    resume: Option<ResumeToken>,
}

impl std::fmt::Debug for StreamRenderer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamRenderer")
            .field("engine", &self.engine)
            .field("text_len", &self.text.len())
            .field("actions", &self.actions.len())
            .finish_non_exhaustive()
    }
}

impl StreamRenderer {
    pub fn new(resume_format: ResumeFormat) -> Self {
        StreamRenderer {
            resume_format,
            engine: None,
            text: String::new(),
            actions: Vec::new(),
            resume: None,
        }
    }

    /// A renderer whose resume lines are the token's engine and value.
    pub fn plain() -> Self {
        StreamRenderer::new(Arc::new(|t: &ResumeToken| {
            format!("`{} resume {}`", t.engine, t.value)
        }))
    }

    /// Takes one event into account; true when the working message changed.
    pub fn apply(&mut self, event: &BusEvent) -> bool {
        match &event.kind {
            EventKind::RunStarted { engine, .. } => {
                let changed = self.engine.as_deref() != Some(engine.as_str());
                self.engine = Some(engine.clone());
                changed
            }
            EventKind::EngineStarted { resume, .. } => {
                self.note_resume(resume.as_ref());
                false
            }
            EventKind::EngineAction(action) => {
                self.upsert(action);
                self.text.is_empty()
            }
            EventKind::Delta { text, .. } => {
                self.text.push_str(text);
                !text.is_empty()
            }
            EventKind::EngineCompleted(completion) => {
                self.note_resume(completion.resume.as_ref());
                false
            }
            EventKind::RunCompleted { .. } | EventKind::Phase(_) | EventKind::Status(_) => false,
        }
    }

    fn note_resume(&mut self, resume: Option<&ResumeToken>) {
        if let Some(resume) = resume {
            self.resume = Some(resume.clone());
        }
    }

    fn upsert(&mut self, action: &Action) {
        let step = match action.phase {
            ActionPhase::Started | ActionPhase::Updated => "running",
            ActionPhase::Completed if action.ok == Some(false) => "failed",
            ActionPhase::Completed => "done",
        };
        let title = one_line(if action.title.trim().is_empty() {
            action.kind.as_str()
        } else {
            &action.title
        });
        match self.actions.iter_mut().find(|(id, _, _)| *id == action.id) {
            Some(line) => *line = (action.id.clone(), title, step),
            None => self.actions.push((action.id.clone(), title, step)),
        }
    }

    /// The working message as of the last event.
    pub fn working(&self) -> String {
        let status = match &self.engine {
            Some(engine) => format!("*Running… ({})*", one_line(engine)),
            None => "*Running…*".to_owned(),
        };
        if self.text.trim().is_empty() {
            let mut out = status;
            let skip = self.actions.len().saturating_sub(MAX_ACTION_LINES);
            for (_, title, step) in self.actions.iter().skip(skip) {
                out.push_str(&format!("\n- {title}: {step}"));
            }
            return out;
        }
        // The newest part of the text, its code blocks whole.
        let chunks = split_markdown(&self.text, MAX_STREAMED_CHARS);
        let shown = chunks.last().cloned().unwrap_or_default();
        format!("{shown}\n\n{status}")
    }

    /// The messages that end the run. `started` is false for a message that
    /// was taken into another job (steered or merged), which gets a short note.
    pub fn final_parts(&self, completion: &Completion, started: bool) -> Vec<String> {
        if !started {
            if let Some(RunError::Merged { .. }) = &completion.error {
                return vec!["Added to the next job.".to_owned()];
            }
            if completion.ok {
                return vec!["Added to the running job.".to_owned()];
            }
        }
        let body = match RunStatus::of(completion) {
            RunStatus::Cancelled => cancelled_text(completion.error.as_ref()),
            RunStatus::Failed => match &completion.error {
                Some(error) => format!("Error: {error}"),
                None => "Error: the run failed".to_owned(),
            },
            _ => completion.answer.clone(),
        };
        let mut parts: Vec<String> = split_markdown(&body, MAX_CONTENT_CHARS)
            .into_iter()
            .map(|part| part.trim_end().to_owned())
            .filter(|part| !part.trim().is_empty())
            .collect();
        if parts.is_empty() {
            parts.push("Done.".to_owned());
        }
        let resume = completion.resume.as_ref().or(self.resume.as_ref());
        if let Some(line) = resume.and_then(|token| self.resume_line(token)) {
            let code = format!("`{line}`");
            match parts.last_mut() {
                Some(last)
                    if last.chars().count() + 2 + code.chars().count() <= MAX_CONTENT_CHARS =>
                {
                    last.push_str("\n\n");
                    last.push_str(&code);
                }
                _ => parts.push(code),
            }
        }
        parts
    }

    /// The resume command without backticks, if there is a usable one.
    fn resume_line(&self, token: &ResumeToken) -> Option<String> {
        let formatted = (self.resume_format)(token);
        let line = formatted.trim().trim_matches('`').trim();
        let usable =
            !line.is_empty() && !line.contains('`') && line.chars().count() <= MAX_RESUME_CHARS;
        usable.then(|| line.to_owned())
    }
}

fn one_line(text: &str) -> String {
    let line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    let line = line.replace(['*', '_', '`'], "");
    match line.char_indices().nth(MAX_TITLE_CHARS) {
        Some((cut, _)) => format!("{}…", &line[..cut]),
        None => line,
    }
}

/// What a user reads when their run was stopped rather than failed.
fn cancelled_text(error: Option<&RunError>) -> String {
    match error {
        Some(RunError::Interrupted) => "Interrupted.".to_owned(),
        Some(RunError::ShuttingDown) => "Stopped: the gateway shut down.".to_owned(),
        Some(RunError::QueueOverflow) => {
            "Dropped: too many messages are waiting in this channel.".to_owned()
        }
        Some(RunError::IdleWatchdog) => "Cancelled: the run went quiet for too long.".to_owned(),
        Some(RunError::Merged { .. }) => "Added to the next job.".to_owned(),
        Some(RunError::Cancelled { reason }) if !reason.trim().is_empty() => {
            format!("Cancelled: {}.", reason.trim().trim_end_matches('.'))
        }
        _ => "Cancelled.".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lemon_core::engine::ResumeToken;

    fn token() -> ResumeToken {
        ResumeToken { engine: "claude".into(), value: "abc-123".into() }
    }

    #[test]
    fn a_long_answer_is_split_under_the_limit_with_code_blocks_whole() {
        let code: String = (0..150).map(|i| format!("let v{i} = {i};\n")).collect();
        let answer = format!("{}\n\n```rust\n{code}```\n\nThe end.", "word ".repeat(300));
        let mut completion = Completion::success(answer, None);
        completion.resume = Some(token());
        let parts = StreamRenderer::plain().final_parts(&completion, true);
        assert!(parts.len() >= 3, "{}", parts.len());
        for part in &parts {
            assert!(part.chars().count() <= MAX_CONTENT_CHARS, "{}", part.chars().count());
            assert_eq!(part.matches("```").count() % 2, 0, "fences balanced: {part}");
        }
        let last = parts.last().unwrap();
        assert!(last.contains("The end."));
        assert!(last.ends_with("`claude resume abc-123`"), "{last}");
    }

    #[test]
    fn the_working_message_streams_the_newest_text_under_the_limit() {
        let mut renderer = StreamRenderer::plain();
        assert_eq!(renderer.working(), "*Running…*");
        let long = "x".repeat(5000);
        renderer.text = format!("{long} tail");
        let working = renderer.working();
        assert!(working.chars().count() <= MAX_CONTENT_CHARS);
        assert!(working.contains("tail"), "the newest text is shown");
    }

    #[test]
    fn failures_cancellations_and_steered_messages_read_as_such() {
        let renderer = StreamRenderer::plain();
        let failed = Completion::failure(RunError::Engine { message: "no disk".into() }, None);
        assert_eq!(renderer.final_parts(&failed, true), ["Error: no disk"]);
        let cancelled = Completion::failure(RunError::Interrupted, None);
        assert_eq!(renderer.final_parts(&cancelled, true), ["Interrupted."]);
        let steered = Completion::success("the other job's answer", None);
        assert_eq!(renderer.final_parts(&steered, false), ["Added to the running job."]);
        assert_eq!(renderer.final_parts(&Completion::success("", None), true), ["Done."]);
    }
}
