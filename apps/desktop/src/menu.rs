//! The tray menu as data: every item's id comes from [`MenuId`], and
//! [`menu_model`] lays out the menu for a [`TrayView`]. The Tauri glue turns
//! the entries into native items and menu events back into [`MenuId`]s.

use std::fmt;
use std::str::FromStr;

use crate::state::{Health, TrayView};

/// At most this many active runs are listed; the rest are counted.
pub const MAX_LISTED_RUNS: usize = 10;

/// At most this many waiting calls are offered; the rest are counted.
pub const MAX_LISTED_APPROVALS: usize = 5;

/// Every item of the tray menu. Its string form ([`fmt::Display`] /
/// [`FromStr`]) is the native menu item's id.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum MenuId {
    /// The line at the top saying what the gateway is doing (not clickable).
    Status,
    /// An active run: opens it in the dashboard. `run:<id>`.
    Run(String),
    /// Approves the waiting call with this request id. `approve:<id>`.
    Approve(String),
    /// Denies the waiting call with this request id. `deny:<id>`.
    Deny(String),
    OpenDashboard,
    /// Pause intake, or resume it when paused.
    ToggleIntake,
    CopyToken,
    RevealConfig,
    ShowLogs,
    RestartGateway,
    /// The start-at-login check item.
    StartAtLogin,
    /// Drains the runs and quits.
    Quit,
}

impl MenuId {
    /// The ids of the fixed items, in menu order.
    pub const FIXED: [MenuId; 9] = [
        MenuId::Status,
        MenuId::OpenDashboard,
        MenuId::ToggleIntake,
        MenuId::CopyToken,
        MenuId::RevealConfig,
        MenuId::ShowLogs,
        MenuId::RestartGateway,
        MenuId::StartAtLogin,
        MenuId::Quit,
    ];

    fn fixed_name(&self) -> Option<&'static str> {
        Some(match self {
            MenuId::Status => "status",
            MenuId::Run(_) | MenuId::Approve(_) | MenuId::Deny(_) => return None,
            MenuId::OpenDashboard => "open-dashboard",
            MenuId::ToggleIntake => "toggle-intake",
            MenuId::CopyToken => "copy-token",
            MenuId::RevealConfig => "reveal-config",
            MenuId::ShowLogs => "show-logs",
            MenuId::RestartGateway => "restart-gateway",
            MenuId::StartAtLogin => "start-at-login",
            MenuId::Quit => "quit",
        })
    }
}

impl fmt::Display for MenuId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MenuId::Run(run_id) => write!(f, "run:{run_id}"),
            MenuId::Approve(id) => write!(f, "approve:{id}"),
            MenuId::Deny(id) => write!(f, "deny:{id}"),
            fixed => f.write_str(fixed.fixed_name().unwrap_or_default()),
        }
    }
}

/// A string that is no menu id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownMenuId(pub String);

impl fmt::Display for UnknownMenuId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "no menu item {:?}", self.0)
    }
}

impl std::error::Error for UnknownMenuId {}

impl FromStr for MenuId {
    type Err = UnknownMenuId;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Some(run_id) = s.strip_prefix("run:") {
            if !run_id.is_empty() {
                return Ok(MenuId::Run(run_id.to_owned()));
            }
        }
        let request = |id: &str| lemon_core::approvals::is_request_id(id).then(|| id.to_owned());
        if let Some(id) = s.strip_prefix("approve:").and_then(request) {
            return Ok(MenuId::Approve(id));
        }
        if let Some(id) = s.strip_prefix("deny:").and_then(request) {
            return Ok(MenuId::Deny(id));
        }
        MenuId::FIXED
            .iter()
            .find(|id| id.fixed_name() == Some(s))
            .cloned()
            .ok_or_else(|| UnknownMenuId(s.to_owned()))
    }
}

/// How an entry shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EntryKind {
    /// A clickable item.
    Action,
    /// A shown but disabled line.
    Info,
    /// A check item and whether it is checked.
    Check(bool),
    Separator,
}

/// One line of the menu.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MenuEntry {
    /// `None` for separators and the "… more" line.
    pub id: Option<MenuId>,
    pub label: String,
    pub kind: EntryKind,
}

impl MenuEntry {
    fn item(id: MenuId, label: impl Into<String>) -> Self {
        MenuEntry { id: Some(id), label: label.into(), kind: EntryKind::Action }
    }

    fn separator() -> Self {
        MenuEntry { id: None, label: String::new(), kind: EntryKind::Separator }
    }
}

/// The status line at the top of the menu and the tray's tooltip.
pub fn status_line(view: &TrayView) -> String {
    let running = view.running_runs();
    let queued = view.runs.len() - running;
    let mut line = match &view.health {
        Health::Starting => "Lemon Gateway: starting".to_owned(),
        Health::Failing(reason) => format!("Lemon Gateway: failing ({reason})"),
        Health::StoreFailing(None) => {
            "Lemon Gateway: storage failing, new messages refused".to_owned()
        }
        Health::StoreFailing(Some(why)) => {
            format!("Lemon Gateway: storage failing, new messages refused ({why})")
        }
        Health::Healthy if running == 0 => "Lemon Gateway: idle".to_owned(),
        Health::Healthy => format!("Lemon Gateway: {running} run{} active", plural(running)),
    };
    if queued > 0 {
        line.push_str(&format!(", {queued} queued"));
    }
    if !view.approvals.is_empty() {
        let n = view.approvals.len();
        line.push_str(&format!(" · {n} call{} waiting for you", plural(n)));
    }
    if view.paused {
        line.push_str(" · intake paused");
    }
    if view.quitting {
        line.push_str(" · quitting after the runs finish");
    }
    line
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

/// The menu for `view`: the status line, the calls waiting for an answer
/// (Approve and Deny for each), the active runs (each opens in the
/// dashboard), then the fixed items.
pub fn menu_model(view: &TrayView) -> Vec<MenuEntry> {
    let mut entries = vec![MenuEntry {
        id: Some(MenuId::Status),
        label: status_line(view),
        kind: EntryKind::Info,
    }];
    if !view.approvals.is_empty() {
        entries.push(MenuEntry::separator());
        for approval in view.approvals.iter().take(MAX_LISTED_APPROVALS) {
            let call = approval.call();
            entries.push(MenuEntry::item(
                MenuId::Approve(approval.id.clone()),
                format!("Approve {call}"),
            ));
            entries
                .push(MenuEntry::item(MenuId::Deny(approval.id.clone()), format!("Deny {call}")));
        }
        if view.approvals.len() > MAX_LISTED_APPROVALS {
            entries.push(MenuEntry {
                id: None,
                label: format!(
                    "… {} more in the dashboard",
                    view.approvals.len() - MAX_LISTED_APPROVALS
                ),
                kind: EntryKind::Info,
            });
        }
    }
    if !view.runs.is_empty() {
        entries.push(MenuEntry::separator());
        for run in view.runs.iter().take(MAX_LISTED_RUNS) {
            entries.push(MenuEntry::item(MenuId::Run(run.run_id.clone()), run.label()));
        }
        if view.runs.len() > MAX_LISTED_RUNS {
            entries.push(MenuEntry {
                id: None,
                label: format!("… {} more", view.runs.len() - MAX_LISTED_RUNS),
                kind: EntryKind::Info,
            });
        }
    }
    entries.push(MenuEntry::separator());
    entries.push(MenuEntry::item(MenuId::OpenDashboard, "Open dashboard"));
    entries.push(MenuEntry::item(
        MenuId::ToggleIntake,
        if view.paused { "Resume intake" } else { "Pause intake" },
    ));
    entries.push(MenuEntry::item(MenuId::CopyToken, "Copy API token"));
    entries.push(MenuEntry::item(MenuId::RevealConfig, "Reveal config folder"));
    entries.push(MenuEntry::item(MenuId::ShowLogs, "Show logs"));
    entries.push(MenuEntry::item(MenuId::RestartGateway, "Restart gateway"));
    entries.push(MenuEntry {
        id: Some(MenuId::StartAtLogin),
        label: "Start at login".to_owned(),
        kind: EntryKind::Check(view.autostart),
    });
    entries.push(MenuEntry::separator());
    entries.push(MenuEntry::item(MenuId::Quit, "Quit"));
    entries
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::RunSummary;

    fn run(id: &str, status: &str) -> RunSummary {
        RunSummary {
            run_id: id.to_owned(),
            session_key: "chat-1".to_owned(),
            engine: "echo".to_owned(),
            status: status.to_owned(),
            prompt: "fix the flaky test in the parser please".to_owned(),
        }
    }

    #[test]
    fn every_id_round_trips_through_its_string_form() {
        let mut all = MenuId::FIXED.to_vec();
        all.push(MenuId::Run("01J9ZK".to_owned()));
        all.push(MenuId::Approve("apr_0123456789ab".to_owned()));
        all.push(MenuId::Deny("apr_0123456789ab".to_owned()));
        for id in all {
            assert_eq!(id.to_string().parse::<MenuId>(), Ok(id.clone()), "{id}");
        }
        assert_eq!("run:".parse::<MenuId>(), Err(UnknownMenuId("run:".to_owned())));
        assert!("pause".parse::<MenuId>().is_err());
        // Only a request id is ever sent on as one.
        assert!("approve:../v1/intake/pause".parse::<MenuId>().is_err());
        assert!("deny:".parse::<MenuId>().is_err());
    }

    #[test]
    fn waiting_calls_come_first_with_approve_and_deny() {
        let approval = |n: usize| crate::state::WaitingApproval {
            id: format!("apr_00000000000{n}"),
            session_key: "chat-1".to_owned(),
            tool: "bash".to_owned(),
            subject: format!("touch file-{n}"),
        };
        let view = TrayView {
            approvals: (0..7).map(approval).collect(),
            health: Health::Healthy,
            ..TrayView::default()
        };
        let entries = menu_model(&view);
        assert_eq!(entries[0].label, "Lemon Gateway: idle · 7 calls waiting for you");
        assert_eq!(entries[2].id, Some(MenuId::Approve("apr_000000000000".to_owned())));
        assert_eq!(entries[2].label, "Approve bash: touch file-0");
        assert_eq!(entries[3].id, Some(MenuId::Deny("apr_000000000000".to_owned())));
        assert_eq!(entries[3].label, "Deny bash: touch file-0");
        let offered = entries.iter().filter(|e| matches!(e.id, Some(MenuId::Approve(_)))).count();
        assert_eq!(offered, MAX_LISTED_APPROVALS);
        assert!(entries.iter().any(|e| e.label == "… 2 more in the dashboard"));
        assert_eq!(entries.last().map(|e| e.label.as_str()), Some("Quit"));
    }

    #[test]
    fn the_menu_lists_active_runs_then_the_fixed_items() {
        let view = TrayView {
            runs: vec![run("r1", "running"), run("r2", "queued")],
            health: Health::Healthy,
            ..TrayView::default()
        };
        let entries = menu_model(&view);
        let labels: Vec<&str> = entries.iter().map(|e| e.label.as_str()).collect();
        assert_eq!(labels[0], "Lemon Gateway: 1 run active, 1 queued");
        assert_eq!(entries[2].id, Some(MenuId::Run("r1".to_owned())));
        assert_eq!(entries[2].label, "chat-1: fix the flaky test in the parser… (echo)");
        assert_eq!(entries[3].label, "chat-1: fix the flaky test in the parser… (echo, queued)");
        let fixed: Vec<&str> = entries[5..].iter().map(|e| e.label.as_str()).collect();
        assert_eq!(
            fixed,
            [
                "Open dashboard",
                "Pause intake",
                "Copy API token",
                "Reveal config folder",
                "Show logs",
                "Restart gateway",
                "Start at login",
                "",
                "Quit"
            ]
        );
    }

    #[test]
    fn paused_intake_offers_resume_and_start_at_login_shows_its_state() {
        let view = TrayView { paused: true, autostart: true, ..TrayView::default() };
        let entries = menu_model(&view);
        assert!(entries
            .iter()
            .any(|e| e.id == Some(MenuId::ToggleIntake) && e.label == "Resume intake"));
        assert!(entries
            .iter()
            .any(|e| e.id == Some(MenuId::StartAtLogin) && e.kind == EntryKind::Check(true)));
        assert!(entries[0].label.ends_with("· intake paused"), "{}", entries[0].label);
    }

    #[test]
    fn many_runs_are_cut_to_the_first_ten_and_counted() {
        let runs = (0..13).map(|i| run(&format!("r{i}"), "running")).collect();
        let entries =
            menu_model(&TrayView { runs, health: Health::Healthy, ..TrayView::default() });
        let listed = entries.iter().filter(|e| matches!(e.id, Some(MenuId::Run(_)))).count();
        assert_eq!(listed, MAX_LISTED_RUNS);
        assert!(entries.iter().any(|e| e.label == "… 3 more"));
        assert_eq!(entries[0].label, "Lemon Gateway: 13 runs active");
    }

    #[test]
    fn a_failing_gateway_says_why() {
        let view = TrayView {
            health: Health::Failing("health check: store".to_owned()),
            ..TrayView::default()
        };
        assert_eq!(status_line(&view), "Lemon Gateway: failing (health check: store)");
    }

    #[test]
    fn a_store_that_cannot_save_says_new_messages_are_refused() {
        let mut view = TrayView {
            health: Health::StoreFailing(Some("database or disk is full".to_owned())),
            runs: vec![run("r1", "queued")],
            ..TrayView::default()
        };
        assert_eq!(
            status_line(&view),
            "Lemon Gateway: storage failing, new messages refused (database or disk is full), 1 queued"
        );
        view.health = Health::StoreFailing(None);
        assert_eq!(
            menu_model(&view)[0].label,
            "Lemon Gateway: storage failing, new messages refused, 1 queued"
        );
    }
}
