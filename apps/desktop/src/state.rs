//! What the tray shows, as plain data: the active runs, whether intake is
//! paused, the gateway's health and the start-at-login flag. The controller
//! keeps one [`TrayView`] up to date from the gateway's events and health; the
//! menu and the icon are drawn from it.

use serde::Serialize;

use crate::icon::IconState;

/// The longest prompt shown in a run's menu line, in characters.
const PROMPT_CHARS: usize = 32;

/// The gateway's health as the tray shows it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(tag = "state", content = "reason", rename_all = "snake_case")]
pub enum Health {
    /// Not known yet (the gateway is starting, or the first check is out).
    #[default]
    Starting,
    Healthy,
    /// The gateway does not answer, reports itself unhealthy, or a channel is
    /// failing; why, in a few words.
    Failing(String),
    /// The store cannot save (a full disk, a read-only file system): every
    /// new message is refused until it can. The store's error, cut short,
    /// when the gateway gave it.
    StoreFailing(Option<String>),
}

/// A queued or running run, as the menu lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RunSummary {
    pub run_id: String,
    pub session_key: String,
    pub engine: String,
    /// `running`, `queued` or `cancelling`.
    pub status: String,
    pub prompt: String,
}

impl RunSummary {
    /// `session: prompt… (engine)`, with `, queued` for a run that waits.
    pub fn label(&self) -> String {
        let short = one_line_cut(&self.prompt, PROMPT_CHARS);
        let status =
            if self.status == "running" { String::new() } else { format!(", {}", self.status) };
        format!("{}: {short} ({}{status})", self.session_key, self.engine)
    }
}

/// A tool call waiting for the owner's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WaitingApproval {
    /// `apr_…`.
    pub id: String,
    pub session_key: String,
    pub tool: String,
    /// The command, path or host.
    pub subject: String,
}

impl WaitingApproval {
    /// The request from an approval's JSON (`/v1/approvals`, or the
    /// `approval` of an approval action); `None` without an id.
    pub fn from_json(value: &serde_json::Value) -> Option<WaitingApproval> {
        let text = |key: &str| value[key].as_str().unwrap_or_default().to_owned();
        let id = value["id"].as_str().filter(|id| lemon_core::approvals::is_request_id(id))?;
        Some(WaitingApproval {
            id: id.to_owned(),
            session_key: text("session_key"),
            tool: text("tool"),
            subject: text("subject"),
        })
    }

    /// `tool: subject` on one line, the subject cut to 40 characters.
    pub fn call(&self) -> String {
        format!("{}: {}", self.tool, one_line_cut(&self.subject, SUBJECT_CHARS))
    }
}

/// `text` on one line (whitespace folded), cut to `chars` characters with
/// `…` when it was longer.
pub(crate) fn one_line_cut(text: &str, chars: usize) -> String {
    let line: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
    let mut short: String = line.chars().take(chars).collect();
    if line.chars().count() > chars {
        short = format!("{}…", short.trim_end());
    }
    short
}

/// The longest subject shown in an approval's menu line, in characters.
const SUBJECT_CHARS: usize = 40;

/// Everything the tray draws.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct TrayView {
    /// Active runs, oldest first: running ones, then queued ones.
    pub runs: Vec<RunSummary>,
    /// Intake paused: messages queue, no run starts.
    pub paused: bool,
    pub health: Health,
    /// Start at login is on.
    pub autostart: bool,
    /// Quit was chosen; the runs are finishing.
    pub quitting: bool,
    /// Calls waiting for the owner's answer, oldest first.
    pub approvals: Vec<WaitingApproval>,
}

impl TrayView {
    /// Runs holding a slot (running or being cancelled).
    pub fn running_runs(&self) -> usize {
        self.runs.iter().filter(|run| run.status != "queued").count()
    }

    /// Which icon the tray shows.
    pub fn icon_state(&self) -> IconState {
        match &self.health {
            Health::Failing(_) | Health::StoreFailing(_) => IconState::Failing,
            _ if self.running_runs() > 0 => IconState::Busy(self.running_runs()),
            _ => IconState::Idle,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(status: &str) -> RunSummary {
        RunSummary {
            run_id: "r".to_owned(),
            session_key: "s".to_owned(),
            engine: "echo".to_owned(),
            status: status.to_owned(),
            prompt: "  hello\n  world ".to_owned(),
        }
    }

    #[test]
    fn the_icon_is_busy_with_the_running_count_and_failing_wins() {
        let mut view = TrayView::default();
        assert_eq!(view.icon_state(), IconState::Idle);
        view.runs = vec![run("running"), run("queued"), run("cancelling")];
        assert_eq!(view.icon_state(), IconState::Busy(2));
        view.health = Health::Failing("no answer".to_owned());
        assert_eq!(view.icon_state(), IconState::Failing);
        view.health = Health::StoreFailing(None);
        assert_eq!(view.icon_state(), IconState::Failing);
    }

    #[test]
    fn an_approval_reads_as_its_call_cut_short_and_needs_a_request_id() {
        let json = serde_json::json!({ "id": "apr_0123456789ab", "session_key": "s", "tool": "bash",
            "subject": "touch  a\nb" });
        let approval = WaitingApproval::from_json(&json).unwrap();
        assert_eq!(approval.call(), "bash: touch a b");
        let long = WaitingApproval { subject: "x".repeat(60), ..approval };
        assert_eq!(long.call(), format!("bash: {}…", "x".repeat(40)));
        let forged = serde_json::json!({ "id": "../v1/intake/pause", "tool": "bash" });
        assert_eq!(WaitingApproval::from_json(&forged), None);
    }

    #[test]
    fn a_run_label_folds_whitespace_and_names_a_waiting_status() {
        assert_eq!(run("running").label(), "s: hello world (echo)");
        assert_eq!(run("queued").label(), "s: hello world (echo, queued)");
    }
}
