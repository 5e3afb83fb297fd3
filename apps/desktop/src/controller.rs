//! The app's logic without a window system: the gateway connection, the
//! [`TrayView`] kept up to date from the gateway's events and health, and what
//! each [`MenuId`] does. Everything the desktop itself does (clipboard,
//! window, notifications, start at login, quitting) goes through [`Shell`], so
//! the same handler runs under Tauri and in tests.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use lemon_core::secrets::SecretValue;
use serde_json::Value;

use crate::gateway::{self, Api, Connection, Mode, Settings};
use crate::menu::MenuId;
use crate::state::{Health, TrayView, WaitingApproval};

/// How often health and the runs are checked besides the events.
pub const POLL_EVERY: Duration = Duration::from_secs(2);

/// The longest wait before the event stream is opened again.
const MAX_RECONNECT_DELAY: Duration = Duration::from_secs(10);

/// What the desktop does for the app: the Tauri glue implements it, tests
/// record it.
pub trait Shell: Send + Sync {
    /// Puts `text` on the clipboard.
    ///
    /// # Errors
    /// No clipboard.
    fn copy_text(&self, text: &str) -> anyhow::Result<()>;
    /// Shows the window on `url` and focuses it.
    fn show_window(&self, url: &str);
    /// Loads `url` in the window if it is open, without showing it.
    fn reload_window(&self, url: &str);
    /// Whether the window is shown.
    fn window_visible(&self) -> bool;
    /// Opens the file manager on `path`'s folder with it selected.
    ///
    /// # Errors
    /// No file manager.
    fn reveal(&self, path: &Path) -> anyhow::Result<()>;
    /// Opens `path` with the desktop's default program.
    ///
    /// # Errors
    /// No program for it.
    fn open_file(&self, path: &Path) -> anyhow::Result<()>;
    fn autostart_enabled(&self) -> bool;
    /// Turns start at login on or off.
    ///
    /// # Errors
    /// The login item could not be written or removed.
    fn set_autostart(&self, enabled: bool) -> anyhow::Result<()>;
    /// A desktop notification.
    fn notify(&self, title: &str, body: &str);
    /// Puts a call waiting for an answer before the user: a notification
    /// with Approve / Deny / Always for this session, whose choice comes back
    /// as [`Controller::answer`].
    fn ask(&self, approval: &WaitingApproval);
    /// The request `id` was settled (here or elsewhere): its notification goes.
    fn withdraw(&self, id: &str);
    /// Draws the tray (menu, icon, tooltip) for `view`.
    fn redraw(&self, view: &TrayView);
    /// Ends the app with `code`.
    fn exit(&self, code: i32);
}

/// The app's state, shared by the tray, the window's commands and the
/// background tasks. Cheap to clone.
#[derive(Clone)]
pub struct Controller {
    inner: Arc<Inner>,
}

struct Inner {
    settings: Settings,
    http: reqwest::Client,
    launch: SecretValue,
    connection: tokio::sync::Mutex<Option<Connection>>,
    api: Mutex<Option<Api>>,
    view: Mutex<TrayView>,
    /// Why the gateway is not running, when it failed to start.
    start_error: Mutex<Option<String>>,
    /// What the window warns about (no tray host, no keychain).
    warnings: Mutex<Vec<String>>,
}

impl std::fmt::Debug for Controller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Controller")
            .field("home", &self.inner.settings.paths.home)
            .field("view", &self.view())
            .finish_non_exhaustive()
    }
}

/// What `desktop_status` answers the window.
#[derive(Debug, Clone, serde::Serialize)]
pub struct DesktopStatus {
    /// `embedded`, `attached` or `stopped`.
    pub mode: &'static str,
    pub dashboard: Option<String>,
    pub start_error: Option<String>,
    pub warnings: Vec<String>,
    pub keychain: Option<String>,
    pub view: TrayView,
}

impl Controller {
    /// Attaches to the gateway running on this home or starts one inside the
    /// app. A failed start is kept and shown (see [`Controller::start_error`]).
    pub async fn connect(settings: Settings) -> Controller {
        let http = reqwest::Client::builder().no_proxy().build().unwrap_or_default();
        let (launch, error) = match gateway::launch_token() {
            Ok(token) => (token, None),
            Err(error) => (SecretValue::new(String::new()), Some(format!("{error:#}"))),
        };
        let controller = Controller {
            inner: Arc::new(Inner {
                settings,
                http,
                launch,
                connection: tokio::sync::Mutex::new(None),
                api: Mutex::new(None),
                view: Mutex::new(TrayView::default()),
                start_error: Mutex::new(error.clone()),
                warnings: Mutex::new(Vec::new()),
            }),
        };
        if error.is_none() {
            let inner = &controller.inner;
            match gateway::connect(&inner.settings, &inner.http, &inner.launch).await {
                Ok(connection) => controller.install(connection).await,
                Err(error) => controller.failed(&error),
            }
        }
        controller
    }

    async fn install(&self, connection: Connection) {
        if !connection.keychain.available {
            self.add_warning(format!(
                "No keychain: secrets are kept in {} ({}).",
                self.inner.settings.paths.secrets().display(),
                connection.keychain.detail
            ));
        }
        *lock(&self.inner.api) = Some(Api::new(self.inner.http.clone(), &connection));
        *lock(&self.inner.start_error) = None;
        *self.inner.connection.lock().await = Some(connection);
    }

    fn failed(&self, error: &anyhow::Error) {
        tracing::error!("the gateway did not start: {error:#}");
        *lock(&self.inner.start_error) = Some(format!("{error:#}"));
        lock(&self.inner.view).health = Health::Failing("not started".to_owned());
    }

    pub fn settings(&self) -> &Settings {
        &self.inner.settings
    }

    /// The control API, while a gateway is connected.
    pub fn api(&self) -> Option<Api> {
        lock(&self.inner.api).clone()
    }

    /// Why the gateway is not running, after a failed start.
    pub fn start_error(&self) -> Option<String> {
        lock(&self.inner.start_error).clone()
    }

    pub fn add_warning(&self, warning: String) {
        tracing::warn!("{warning}");
        let mut warnings = lock(&self.inner.warnings);
        if !warnings.contains(&warning) {
            warnings.push(warning);
        }
    }

    pub fn warnings(&self) -> Vec<String> {
        lock(&self.inner.warnings).clone()
    }

    pub fn view(&self) -> TrayView {
        lock(&self.inner.view).clone()
    }

    /// Changes the view and redraws the tray.
    fn update(&self, shell: &dyn Shell, change: impl FnOnce(&mut TrayView)) {
        let view = {
            let mut view = lock(&self.inner.view);
            change(&mut view);
            view.clone()
        };
        shell.redraw(&view);
    }

    /// The dashboard's address, with a page (`#/live`).
    pub fn dashboard_url(&self, page: &str) -> Option<String> {
        self.api().map(|api| format!("{}/{page}", api.api_url))
    }

    /// Whether the gateway runs inside the app.
    pub async fn mode(&self) -> &'static str {
        match self.inner.connection.lock().await.as_ref().map(|c| &c.mode) {
            Some(Mode::Embedded(_)) => "embedded",
            Some(Mode::Attached) => "attached",
            None => "stopped",
        }
    }

    /// The window's status, for its `desktop_status` command.
    pub async fn status(&self) -> DesktopStatus {
        let keychain = self.inner.connection.lock().await.as_ref().map(|c| {
            if c.keychain.available {
                format!("keychain: {}", c.keychain.detail)
            } else {
                format!("no keychain: {}", c.keychain.detail)
            }
        });
        DesktopStatus {
            mode: self.mode().await,
            dashboard: self.dashboard_url(""),
            start_error: self.start_error(),
            warnings: self.warnings(),
            keychain,
            view: self.view(),
        }
    }

    /// The script the window runs before each page: on the dashboard's origin
    /// it puts the window's token where the dashboard's login keeps it
    /// (session storage, `lemon.token`) and shows the app's warnings in a
    /// banner. The token is in this script only: never in a URL, a file or argv.
    pub async fn init_script(&self) -> String {
        let connection = self.inner.connection.lock().await;
        let (origin, token) = match connection.as_ref() {
            Some(c) => (c.api_url.clone(), c.window_token.expose().to_owned()),
            None => (String::new(), String::new()),
        };
        drop(connection);
        format!(
            r#"(function () {{
  var origin = {origin};
  if (!origin || window.location.origin !== origin) return;
  try {{ window.sessionStorage.setItem('lemon.token', {token}); }} catch (e) {{}}
  var warnings = {warnings};
  if (!warnings.length) return;
  function banner() {{
    if (document.getElementById('desktop-warning')) return;
    var box = document.createElement('div');
    box.id = 'desktop-warning';
    box.setAttribute('role', 'alert');
    box.style.cssText = 'background:#fff4ce;color:#4a3c00;border-bottom:1px solid #d9b300;padding:8px 14px;font:14px system-ui,sans-serif';
    box.textContent = warnings.join(' ');
    document.body.insertBefore(box, document.body.firstChild);
  }}
  if (document.body) banner(); else document.addEventListener('DOMContentLoaded', banner);
}})();"#,
            origin = js(&origin),
            token = js(&token),
            warnings = js(&self.warnings()),
        )
    }

    /// Reads the runs, intake and health once and redraws the tray.
    pub async fn refresh(&self, shell: &dyn Shell) {
        let autostart = shell.autostart_enabled();
        let Some(api) = self.api() else {
            self.update(shell, |view| {
                view.runs.clear();
                view.autostart = autostart;
                if view.health == Health::Starting {
                    view.health = Health::Failing("not started".to_owned());
                }
            });
            return;
        };
        let (health, status, runs, approvals) =
            tokio::join!(api.health(), api.status(), api.active_runs(), api.approvals());
        let mut settled = Vec::new();
        self.update(shell, |view| {
            view.autostart = autostart;
            view.health = health;
            if let Ok(status) = status {
                view.paused = status["paused"].as_bool().unwrap_or(false);
            }
            if let Ok(runs) = runs {
                view.runs = runs;
            }
            if let Ok(approvals) = approvals {
                settled = view
                    .approvals
                    .iter()
                    .filter(|old| !approvals.iter().any(|new| new.id == old.id))
                    .map(|old| old.id.clone())
                    .collect();
                view.approvals = approvals;
            }
        });
        // Answered while no event reached the app: the notification goes.
        for id in settled {
            shell.withdraw(&id);
        }
    }

    /// Answers the waiting call `id` with `decision` (`approve`, `deny` or
    /// `always`), from the tray or a notification's button.
    ///
    /// # Errors
    /// The gateway did not answer, or refused (another surface settled it).
    pub async fn answer(&self, id: &str, decision: &str, shell: &dyn Shell) -> anyhow::Result<()> {
        let api = self.api().ok_or_else(not_running)?;
        let answered = api.answer(id, decision).await;
        tracing::info!(
            approval = id,
            decision,
            ok = answered.is_ok(),
            "approval answered from the desktop"
        );
        self.update(shell, |view| view.approvals.retain(|approval| approval.id != id));
        shell.withdraw(id);
        answered
    }

    /// Keeps the tray up to date until the app ends: follows `/v1/events` (a
    /// run that starts or ends redraws at once, and one that ends while the
    /// window is hidden is announced), and checks health every [`POLL_EVERY`].
    pub async fn follow(&self, shell: Arc<dyn Shell>) {
        let events = self.follow_events(shell.clone());
        let poll = async {
            loop {
                self.refresh(&*shell).await;
                tokio::time::sleep(POLL_EVERY).await;
            }
        };
        tokio::join!(events, poll);
    }

    async fn follow_events(&self, shell: Arc<dyn Shell>) {
        let mut delay = Duration::from_millis(200);
        loop {
            if let Some(api) = self.api() {
                match api.request(reqwest::Method::GET, "/v1/events").send().await {
                    Ok(response) if response.status().is_success() => {
                        delay = Duration::from_millis(200);
                        let mut body = response.bytes_stream();
                        let mut buffer = Vec::new();
                        while let Some(Ok(chunk)) = body.next().await {
                            buffer.extend_from_slice(&chunk);
                            while let Some(end) = buffer.iter().position(|b| *b == b'\n') {
                                let line: Vec<u8> = buffer.drain(..=end).collect();
                                if let Some(event) = sse_data(&line) {
                                    self.on_event(&*shell, &event).await;
                                }
                            }
                        }
                    }
                    Ok(response) => {
                        tracing::warn!(status = %response.status(), "the event stream was refused");
                    }
                    Err(error) => tracing::debug!(%error, "no event stream"),
                }
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(MAX_RECONNECT_DELAY);
        }
    }

    async fn on_event(&self, shell: &dyn Shell, event: &Value) {
        match event["type"].as_str() {
            Some("run_started") => self.refresh(shell).await,
            Some("run_completed") => {
                self.refresh(shell).await;
                let hidden = !shell.window_visible();
                if hidden {
                    let (title, body) = finished_notice(event);
                    shell.notify(&title, &body);
                }
                let run_id = event["run_id"].as_str().unwrap_or_default();
                tracing::debug!(run_id, notified = hidden, "run finished");
            }
            Some("engine_action") if event["action"]["kind"] == "approval" => {
                let action = &event["action"];
                let Some(approval) = WaitingApproval::from_json(&action["detail"]["approval"])
                else {
                    return;
                };
                if action["phase"] == "started" {
                    tracing::debug!(approval = %approval.id, "approval asked");
                    shell.ask(&approval);
                    self.update(shell, |view| {
                        if !view.approvals.iter().any(|a| a.id == approval.id) {
                            view.approvals.push(approval);
                        }
                    });
                } else if action["phase"] == "completed" {
                    shell.withdraw(&approval.id);
                    self.update(shell, |view| view.approvals.retain(|a| a.id != approval.id));
                }
            }
            _ => {}
        }
    }

    /// Does what the menu item `id` says.
    ///
    /// # Errors
    /// What failed, to be shown to the user.
    pub async fn handle(&self, id: &MenuId, shell: &dyn Shell) -> anyhow::Result<()> {
        tracing::info!(item = %id, "menu");
        match id {
            MenuId::Status => {}
            MenuId::Approve(id) => self.answer(id, "approve", shell).await?,
            MenuId::Deny(id) => self.answer(id, "deny", shell).await?,
            MenuId::Run(run_id) => {
                let page = format!("#/history/{run_id}");
                let url = self.dashboard_url(&page).ok_or_else(not_running)?;
                shell.show_window(&url);
            }
            MenuId::OpenDashboard => {
                let url = self.dashboard_url("#/live").ok_or_else(not_running)?;
                shell.show_window(&url);
            }
            MenuId::ToggleIntake => {
                let api = self.api().ok_or_else(not_running)?;
                let paused = api.set_paused(!self.view().paused).await?;
                self.update(shell, |view| view.paused = paused);
            }
            MenuId::CopyToken => {
                let connection = self.inner.connection.lock().await;
                let token = connection.as_ref().ok_or_else(not_running)?.token.clone();
                drop(connection);
                shell.copy_text(token.expose())?;
            }
            MenuId::RevealConfig => {
                let config = &self.inner.settings.paths.config;
                if config.exists() {
                    shell.reveal(config)?;
                } else {
                    shell.open_file(
                        config.parent().unwrap_or(self.inner.settings.paths.home.as_path()),
                    )?;
                }
            }
            MenuId::ShowLogs => shell.open_file(&self.inner.settings.log_file())?,
            MenuId::RestartGateway => self.restart(shell).await?,
            MenuId::StartAtLogin => {
                let enabled = !shell.autostart_enabled();
                shell.set_autostart(enabled)?;
                let now = shell.autostart_enabled();
                self.update(shell, |view| view.autostart = now);
            }
            MenuId::Quit => self.quit(shell).await,
        }
        Ok(())
    }

    /// Stops the gateway inside the app (running runs finish within its
    /// shutdown grace, as the server's drain does) and starts it again. A
    /// gateway the app attached to is not the app's to restart.
    ///
    /// # Errors
    /// Attached to another gateway, or the new start failed.
    pub async fn restart(&self, shell: &dyn Shell) -> anyhow::Result<()> {
        let mut connection = self.inner.connection.lock().await;
        if matches!(connection.as_ref().map(|c| &c.mode), Some(Mode::Attached)) {
            anyhow::bail!(
                "this gateway was started outside the app; restart it where it runs (`lemon-gateway serve`)"
            );
        }
        let previous = connection.take();
        *lock(&self.inner.api) = None;
        self.update(shell, |view| view.health = Health::Starting);
        if let Some(Connection { mode: Mode::Embedded(running), .. }) = previous {
            running.shutdown().await?;
        }
        drop(connection);
        match gateway::start_embedded(&self.inner.settings, &self.inner.launch).await {
            Ok(connection) => {
                self.install(connection).await;
                if let Some(url) = self.dashboard_url("") {
                    shell.reload_window(&url);
                }
                self.refresh(shell).await;
                Ok(())
            }
            Err(error) => {
                self.failed(&error);
                self.refresh(shell).await;
                Err(error)
            }
        }
    }

    /// Drains the gateway inside the app (runs finish within its shutdown
    /// grace; queued ones wait for the next start) and ends the app. A gateway
    /// the app attached to goes on running.
    pub async fn quit(&self, shell: &dyn Shell) {
        self.update(shell, |view| view.quitting = true);
        let connection = self.inner.connection.lock().await.take();
        *lock(&self.inner.api) = None;
        if let Some(Connection { mode: Mode::Embedded(running), .. }) = connection {
            if let Err(error) = running.shutdown().await {
                tracing::error!("shutdown: {error:#}");
            }
        }
        shell.exit(0);
    }

    /// Where the app keeps its own log.
    pub fn log_file(&self) -> PathBuf {
        self.inner.settings.log_file()
    }
}

fn not_running() -> anyhow::Error {
    anyhow::anyhow!("the gateway is not running")
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The JSON of an SSE `data:` line.
fn sse_data(line: &[u8]) -> Option<Value> {
    let line = std::str::from_utf8(line).ok()?.trim_end();
    let data = line.strip_prefix("data:")?;
    serde_json::from_str(data.trim_start()).ok()
}

/// The notification for a finished run: a title and the start of its answer
/// (or its error).
pub fn finished_notice(event: &Value) -> (String, String) {
    let session = event["session_key"].as_str().unwrap_or("a session");
    let status = event["status"].as_str().unwrap_or("finished");
    let title = format!("Run {status} in {session}");
    let text = if event["ok"] == Value::Bool(true) {
        event["answer"].as_str().unwrap_or_default()
    } else {
        event["error"].as_str().unwrap_or_default()
    };
    let mut body: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if body.chars().count() > 140 {
        body = format!("{}…", body.chars().take(139).collect::<String>());
    }
    (title, body)
}

/// JSON text of a value, for the init script.
fn js<T: serde::Serialize + ?Sized>(value: &T) -> String {
    serde_json::to_string(value).unwrap_or_else(|_| "null".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn sse_lines_give_their_json() {
        assert_eq!(
            sse_data(b"data: {\"type\":\"run_started\"}\n"),
            Some(json!({"type": "run_started"}))
        );
        assert_eq!(sse_data(b"id: 3\n"), None);
        assert_eq!(sse_data(b": keep-alive\n"), None);
    }

    #[test]
    fn a_finished_run_is_announced_with_its_answer_or_error() {
        let ok = json!({"session_key": "chat", "status": "completed", "ok": true, "answer": "all\n tests pass"});
        assert_eq!(
            finished_notice(&ok),
            ("Run completed in chat".to_owned(), "all tests pass".to_owned())
        );
        let failed = json!({"session_key": "chat", "status": "failed", "ok": false, "answer": "", "error": "engine crashed"});
        assert_eq!(finished_notice(&failed).1, "engine crashed");
        let long = json!({"session_key": "s", "status": "completed", "ok": true, "answer": "x".repeat(500)});
        assert_eq!(finished_notice(&long).1.chars().count(), 140);
    }
}
