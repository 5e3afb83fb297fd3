//! A run followed as an OpenAI client reads it: pieces of text (the answer's
//! deltas, and a line per tool call of the engine), then how it ended.
//!
//! The follower gives each event once, stored or live, and always ends with
//! the run's typed completion. A completion that says the request was merged
//! into a later one is not the end: the later run answers both, so it is
//! followed on. Tool calls become text lines because an OpenAI client would
//! otherwise try to run them itself.

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;

use lemon_core::bus::{BusEvent, EventKind};
use lemon_core::engine::{Action, ActionKind, ActionPhase, Completion, RunError};
use lemon_core::router::{Followed, RouterHandle, RunFollower};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

/// What a followed run gives next.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Step {
    /// Text to show, in order.
    Text(String),
    /// The run is over.
    End(Completion),
}

/// Follows one accepted run (and the run it was merged into, if it was).
#[derive(Debug)]
pub(crate) struct AnswerStream {
    router: RouterHandle,
    follower: RunFollower,
    shutdown: CancellationToken,
    text: Rendering,
    /// The end, held back while the unstreamed rest of the answer goes first.
    pending_end: Option<Completion>,
    ended: bool,
}

impl AnswerStream {
    pub(crate) fn new(
        router: RouterHandle,
        follower: RunFollower,
        shutdown: CancellationToken,
    ) -> Self {
        AnswerStream {
            router,
            follower,
            shutdown,
            text: Rendering::default(),
            pending_end: None,
            ended: false,
        }
    }

    /// The next piece; `None` after the end, or when the gateway shuts down
    /// before the run ends (the run still completes and is recorded).
    ///
    /// # Cancel safety
    /// Cancel safe as [`RunFollower::next`] is.
    pub(crate) async fn next(&mut self) -> Option<Step> {
        loop {
            if self.ended {
                return None;
            }
            if let Some(end) = self.pending_end.take() {
                self.ended = true;
                return Some(Step::End(end));
            }
            let event = tokio::select! {
                biased;
                () = self.shutdown.cancelled() => return None,
                event = self.follower.next() => event?,
            };
            if let Some(step) = self.take(&event) {
                return Some(step);
            }
        }
    }

    fn take(&mut self, event: &Followed) -> Option<Step> {
        if let Some(completed) = event.completed() {
            return self.complete(completed);
        }
        let text = match event.event() {
            Some(typed) => match &typed.kind {
                EventKind::Delta { text, .. } => self.text.delta(text),
                EventKind::EngineAction(action) => self.text.action(action),
                _ => None,
            },
            // Read back from the store: the same events in their JSON form.
            None => {
                let data = event.to_json();
                match event.type_name() {
                    "delta" => data["text"].as_str().and_then(|text| self.text.delta(text)),
                    "engine_action" => {
                        action_from_json(&data["action"]).and_then(|a| self.text.action(&a))
                    }
                    _ => None,
                }
            }
        };
        text.map(Step::Text)
    }

    /// The run's end. An answer that was not streamed (or only its start was)
    /// comes as text first, and the end on the next call.
    fn complete(&mut self, event: &Arc<BusEvent>) -> Option<Step> {
        let EventKind::RunCompleted { completion, .. } = &event.kind else { return None };
        if let Some(RunError::Merged { into }) = &completion.error {
            tracing::debug!(run_id = %event.run_id, into = %into, "request merged; following the run that answers it");
            self.follower = self.router.follow(into);
            return None;
        }
        match self.text.rest(completion) {
            Some(rest) => {
                self.pending_end = Some(completion.clone());
                Some(Step::Text(rest))
            }
            None => {
                self.ended = true;
                Some(Step::End(completion.clone()))
            }
        }
    }
}

/// How a stream of one API shape is made of a followed run's steps.
pub(crate) trait Render: Send + 'static {
    type Item: Send + 'static;
    /// The items of a piece of text.
    fn text(&mut self, text: &str) -> Vec<Self::Item>;
    /// The items that end the stream.
    fn end(&mut self, completion: &Completion) -> Vec<Self::Item>;
}

/// `first`, then the items `render` makes of the run's steps, in order.
pub(crate) fn rendered<R: Render>(
    first: Vec<R::Item>,
    render: R,
    answer: AnswerStream,
) -> impl futures::Stream<Item = R::Item> + Send + 'static {
    let queued = VecDeque::from(first);
    futures::stream::unfold(
        (render, Some(answer), queued),
        |(mut render, mut answer, mut queued)| async move {
            loop {
                if let Some(item) = queued.pop_front() {
                    return Some((item, (render, answer, queued)));
                }
                match answer.as_mut()?.next().await? {
                    Step::Text(text) => queued.extend(render.text(&text)),
                    Step::End(completion) => {
                        queued.extend(render.end(&completion));
                        answer = None;
                    }
                }
            }
        },
    )
}

/// The text a client is shown of a run: the answer's deltas as they come, a
/// line for each tool call, kept apart from the answer by line breaks.
#[derive(Debug)]
pub(crate) struct Rendering {
    /// The answer's text streamed so far (the deltas, without tool lines).
    answer: String,
    /// Whatever was shown last ends a line, or nothing was shown yet.
    at_line_start: bool,
    /// A tool line was shown last: the next text starts after a blank line.
    after_tool_line: bool,
    /// Actions already shown, so a start and its completion are one line.
    shown: HashSet<String>,
}

impl Default for Rendering {
    fn default() -> Self {
        Rendering {
            answer: String::new(),
            at_line_start: true,
            after_tool_line: false,
            shown: HashSet::new(),
        }
    }
}

impl Rendering {
    /// A piece of the answer.
    pub(crate) fn delta(&mut self, text: &str) -> Option<String> {
        if text.is_empty() {
            return None;
        }
        self.answer.push_str(text);
        if !self.after_tool_line {
            return Some(self.show(text.to_owned()));
        }
        // One blank line after the tool lines, however the engine separates
        // its blocks of text.
        let text = text.trim_start_matches(['\n', '\r']);
        if text.is_empty() {
            return None;
        }
        self.after_tool_line = false;
        Some(self.show(format!("\n{text}")))
    }

    /// A tool call's line: `▸ <title>` when it starts, `✗ <title>: <message>`
    /// when it fails; nothing for other steps, or a step already shown.
    pub(crate) fn action(&mut self, action: &Action) -> Option<String> {
        if !shows_as_tool_call(action.kind) {
            return None;
        }
        let failed = action.phase == ActionPhase::Completed && action.ok == Some(false);
        let first = self.shown.insert(action.id.clone());
        if !first && !failed {
            return None;
        }
        let title = one_line(&action.title);
        let line = if failed {
            match action.message.as_deref().map(one_line).filter(|m| !m.is_empty()) {
                Some(message) => format!("✗ {title}: {message}\n"),
                None => format!("✗ {title}\n"),
            }
        } else {
            format!("▸ {title}\n")
        };
        let mut out = String::new();
        if !self.at_line_start {
            out.push('\n');
        }
        out.push_str(&line);
        self.after_tool_line = true;
        Some(self.show(out))
    }

    /// The part of a successful run's answer not streamed yet: all of it when
    /// the engine streamed none, the end of it when it streamed its start.
    pub(crate) fn rest(&mut self, completion: &Completion) -> Option<String> {
        if !completion.ok {
            return None;
        }
        let rest = completion.answer.strip_prefix(self.answer.as_str())?.to_owned();
        self.delta(&rest)
    }

    fn show(&mut self, text: String) -> String {
        self.at_line_start = text.ends_with('\n');
        text
    }
}

/// The kinds of action a user sees as a tool call of the engine; reasoning,
/// notes and warnings are not shown.
fn shows_as_tool_call(kind: ActionKind) -> bool {
    match kind {
        ActionKind::Tool
        | ActionKind::Command
        | ActionKind::FileChange
        | ActionKind::WebSearch
        | ActionKind::Subagent => true,
        ActionKind::Reasoning | ActionKind::Note | ActionKind::Warning | ActionKind::Approval => {
            false
        }
    }
}

/// Text on one line: line breaks and tabs become spaces, so a title cannot
/// forge more lines.
fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// An action back from its stored JSON form (`{id, kind, title, phase, ok, message}`).
fn action_from_json(value: &Value) -> Option<Action> {
    let text = |key: &str| value.get(key).and_then(Value::as_str);
    let kind = match text("kind")? {
        "tool" => ActionKind::Tool,
        "command" => ActionKind::Command,
        "file_change" => ActionKind::FileChange,
        "web_search" => ActionKind::WebSearch,
        "subagent" => ActionKind::Subagent,
        "reasoning" => ActionKind::Reasoning,
        "note" => ActionKind::Note,
        "approval" => ActionKind::Approval,
        _ => ActionKind::Warning,
    };
    let phase = match text("phase")? {
        "started" => ActionPhase::Started,
        "updated" => ActionPhase::Updated,
        _ => ActionPhase::Completed,
    };
    Some(Action {
        id: text("id")?.to_owned(),
        kind,
        title: text("title").unwrap_or_default().to_owned(),
        detail: Value::Null,
        phase,
        ok: value.get("ok").and_then(Value::as_bool),
        message: text("message").map(str::to_owned),
        level: None,
        result_meta: Value::Null,
    })
}
