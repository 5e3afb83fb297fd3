//! `run` and `attach` answer the run's approval requests where they run: on
//! a terminal, a request is asked inline on stderr ("Allow this? bash: …
//! \[y\]es / \[n\]o / \[a\]lways for this session") and the typed answer
//! goes to `/v1/approvals/{id}`; off a terminal, the request is named with the command that answers it, and the
//! run waits for another surface. A request settled elsewhere (a chat, the
//! API) closes the question.

use std::io::BufRead;

use serde_json::Value;
use tokio::sync::mpsc;

use crate::style::Style;

/// The run's open question and where its answer is typed.
#[derive(Debug)]
pub struct Asker {
    /// Whether answers are typed here (stdin is a terminal).
    interactive: bool,
    style: Style,
    /// Lines typed on stdin, read by a thread of their own once the first
    /// question is asked.
    lines: Option<mpsc::UnboundedReceiver<String>>,
    /// The requests asked and not settled yet, oldest first.
    open: Vec<Value>,
}

/// What a typed line means.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Typed {
    /// Answer request `id` with `decision` (`approve`, `deny`, `always`).
    Answer { id: String, decision: &'static str },
    /// Not an answer: asked again.
    Again,
}

impl Asker {
    pub fn new(interactive: bool, style: Style) -> Self {
        Asker { interactive, style, lines: None, open: Vec::new() }
    }

    /// Whether a question waits for a typed answer (the spinner stays off
    /// meanwhile, so it does not draw over the question).
    pub fn asking(&self) -> bool {
        self.interactive && !self.open.is_empty()
    }

    /// Takes a run event: an approval request opens a question, its
    /// settling closes it. Returns the text to print on stderr, if any.
    pub fn event(&mut self, kind: &str, data: &Value) -> Option<String> {
        let action = &data["action"];
        if kind != "engine_action" || action["kind"] != "approval" {
            return None;
        }
        let request = &action["detail"]["approval"];
        let id = request["id"].as_str()?;
        if action["phase"] == "completed" {
            let position = self.open.iter().position(|open| open["id"] == id)?;
            self.open.remove(position);
            let how = action["message"].as_str().unwrap_or("settled");
            return Some(format!("{id}: {how}"));
        }
        self.open.push(request.clone());
        if !self.interactive {
            return Some(format!(
                "waiting for approval {id}: {}\n  answer it with `lemon-gateway approve {id}` or `lemon-gateway deny {id}`",
                what(request)
            ));
        }
        (self.open.len() == 1).then(|| self.question())
    }

    /// The question about the oldest open request.
    pub fn question(&self) -> String {
        let Some(request) = self.open.first() else { return String::new() };
        let outside = request["untrusted"]
            .as_str()
            .map(|source| format!(" (asked by a run of outside text: {source})"))
            .unwrap_or_default();
        format!(
            "{} {}{outside}\n  {} ",
            self.style.yellow("Allow this?"),
            what(request),
            self.style.bold("[y]es / [n]o / [a]lways for this session:")
        )
    }

    /// The next line typed; pending while no question is open.
    pub async fn line(&mut self) -> Option<String> {
        if !self.asking() {
            return std::future::pending().await;
        }
        self.lines.get_or_insert_with(read_lines).recv().await
    }

    /// Stdin ended: requests wait for another surface from now on.
    pub fn stdin_closed(&mut self) {
        self.interactive = false;
    }

    /// What `line` answers: the oldest open request.
    pub fn read(&self, line: &str) -> Typed {
        let Some(id) = self.open.first().and_then(|request| request["id"].as_str()) else {
            return Typed::Again;
        };
        let decision = match line.trim().to_ascii_lowercase().as_str() {
            "y" | "yes" => "approve",
            "n" | "no" => "deny",
            "a" | "always" => "always",
            _ => return Typed::Again,
        };
        Typed::Answer { id: id.to_owned(), decision }
    }
}

/// `tool: subject`.
fn what(request: &Value) -> String {
    format!(
        "{}: {}",
        request["tool"].as_str().unwrap_or_default(),
        request["subject"].as_str().unwrap_or_default()
    )
}

/// Lines of stdin from a thread of its own (a blocking read there never
/// keeps the command from ending).
fn read_lines() -> mpsc::UnboundedReceiver<String> {
    let (tx, rx) = mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { return };
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    rx
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn approval(phase: &str, id: &str, message: Option<&str>) -> Value {
        json!({ "action": { "kind": "approval", "phase": phase, "message": message,
            "detail": { "approval": { "id": id, "tool": "bash", "subject": "rm -rf build" } } } })
    }

    #[test]
    fn a_request_is_asked_answered_by_y_or_n_and_closed_when_settled() {
        let mut asker = Asker::new(true, Style { color: false });
        let shown = asker.event("engine_action", &approval("started", "apr_1", None));
        assert_eq!(
            shown.as_deref(),
            Some("Allow this? bash: rm -rf build\n  [y]es / [n]o / [a]lways for this session: ")
        );
        assert!(asker.asking());
        assert_eq!(asker.read("maybe"), Typed::Again);
        assert_eq!(asker.read(" Y \n"), Typed::Answer { id: "apr_1".into(), decision: "approve" });
        assert_eq!(asker.read("no"), Typed::Answer { id: "apr_1".into(), decision: "deny" });
        assert_eq!(asker.read("a"), Typed::Answer { id: "apr_1".into(), decision: "always" });
        let settled = approval("completed", "apr_1", Some("approved by @ann via telegram"));
        let shown = asker.event("engine_action", &settled);
        assert_eq!(shown.as_deref(), Some("apr_1: approved by @ann via telegram"));
        assert!(!asker.asking());
    }

    #[test]
    fn off_a_terminal_a_request_names_the_command_that_answers_it() {
        let mut asker = Asker::new(false, Style { color: false });
        let shown = asker.event("engine_action", &approval("started", "apr_2", None)).unwrap();
        assert!(shown.starts_with("waiting for approval apr_2: bash: rm -rf build"), "{shown}");
        assert!(shown.contains("`lemon-gateway approve apr_2`"), "{shown}");
        assert!(!asker.asking(), "nothing is read from stdin");
    }
}
