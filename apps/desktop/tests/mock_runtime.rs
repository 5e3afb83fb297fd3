//! The app's commands and tray actions on Tauri's MockRuntime (no display, no
//! D-Bus): a real gateway starts inside the app on a private home, and every
//! menu item is driven through the `menu_action` command as the tray does.
//! The desktop's side (clipboard, window, start at login, exit) is recorded.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lemon_desktop::app::{with_commands, SharedShell};
use lemon_desktop::controller::{Controller, Shell};
use lemon_desktop::gateway::Settings;
use lemon_desktop::icon::IconState;
use lemon_desktop::menu::status_line;
use lemon_desktop::state::{Health, TrayView};
use serde_json::{json, Value};
use tauri::test::{
    get_ipc_response, mock_builder, mock_context, noop_assets, MockRuntime, INVOKE_KEY,
};

const TOKEN: &str = "desktop-test-token-0123456789";
const PATIENCE: Duration = Duration::from_secs(60);

#[derive(Default)]
struct Recorded {
    copied: Vec<String>,
    shown: Vec<String>,
    reloaded: Vec<String>,
    revealed: Vec<PathBuf>,
    opened: Vec<PathBuf>,
    autostart: bool,
    notified: Vec<(String, String)>,
    asked: Vec<String>,
    withdrawn: Vec<String>,
    exited: Vec<i32>,
    drawn: Vec<TrayView>,
}

#[derive(Default)]
struct Recorder(Mutex<Recorded>);

impl Recorder {
    fn get(&self) -> std::sync::MutexGuard<'_, Recorded> {
        self.0.lock().unwrap()
    }
}

impl Shell for Recorder {
    fn copy_text(&self, text: &str) -> anyhow::Result<()> {
        self.get().copied.push(text.to_owned());
        Ok(())
    }
    fn show_window(&self, url: &str) {
        self.get().shown.push(url.to_owned());
    }
    fn reload_window(&self, url: &str) {
        self.get().reloaded.push(url.to_owned());
    }
    fn window_visible(&self) -> bool {
        false
    }
    fn reveal(&self, path: &Path) -> anyhow::Result<()> {
        self.get().revealed.push(path.to_owned());
        Ok(())
    }
    fn open_file(&self, path: &Path) -> anyhow::Result<()> {
        self.get().opened.push(path.to_owned());
        Ok(())
    }
    fn autostart_enabled(&self) -> bool {
        self.get().autostart
    }
    fn set_autostart(&self, enabled: bool) -> anyhow::Result<()> {
        self.get().autostart = enabled;
        Ok(())
    }
    fn notify(&self, title: &str, body: &str) {
        self.get().notified.push((title.to_owned(), body.to_owned()));
    }
    fn ask(&self, approval: &lemon_desktop::state::WaitingApproval) {
        self.get().asked.push(approval.id.clone());
    }
    fn withdraw(&self, id: &str) {
        self.get().withdrawn.push(id.to_owned());
    }
    fn redraw(&self, view: &TrayView) {
        self.get().drawn.push(view.clone());
    }
    fn exit(&self, code: i32) {
        self.get().exited.push(code);
    }
}

struct App {
    _home: tempfile::TempDir,
    home: PathBuf,
    controller: Controller,
    shell: Arc<Recorder>,
    app: tauri::App<MockRuntime>,
    window: tauri::WebviewWindow<MockRuntime>,
}

async fn app(config: &str) -> App {
    let home = tempfile::tempdir().unwrap();
    let text = format!("{config}\n[gateway.api]\nport = 0\n\n[gateway.health]\nport = 0\n");
    std::fs::write(home.path().join("config.toml"), text).unwrap();
    let env: BTreeMap<String, String> = [
        ("LEMON_HOME", home.path().display().to_string()),
        ("HOME", home.path().display().to_string()),
        ("LEMON_API_TOKEN", TOKEN.to_owned()),
        ("LEMON_KEYCHAIN", "off".to_owned()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    let controller = tokio::time::timeout(PATIENCE, Controller::connect(Settings::from_env(env)))
        .await
        .expect("the gateway starts");
    assert_eq!(controller.start_error(), None);
    let shell = Arc::new(Recorder::default());
    let app = with_commands(mock_builder())
        .manage(controller.clone())
        .manage(SharedShell(shell.clone()))
        .build(mock_context(noop_assets()))
        .unwrap();
    let window =
        tauri::WebviewWindowBuilder::new(&app, "main", Default::default()).build().unwrap();
    App { home: home.path().to_owned(), _home: home, controller, shell, app, window }
}

impl App {
    /// A menu item, as the tray's menu event runs it; the view after.
    async fn menu(&self, id: &str) -> Result<Value, Value> {
        // The command is async: its answer comes from the app's runtime, so the
        // blocking IPC helper runs off this test's thread.
        let (window, id) = (IpcWindow(self.window.clone()), id.to_owned());
        tokio::task::spawn_blocking(move || window.invoke("menu_action", json!({ "id": id })))
            .await
            .unwrap()
    }

    async fn status(&self) -> Value {
        self.controller.api().unwrap().status().await.unwrap()
    }

    async fn shut(self) {
        if let Some(api) = self.controller.api() {
            let _ = api.set_paused(false).await;
        }
        self.controller.quit(&*self.shell).await;
        drop(self.app);
    }
}

struct IpcWindow(tauri::WebviewWindow<MockRuntime>);

impl IpcWindow {
    fn invoke(&self, cmd: &str, body: Value) -> Result<Value, Value> {
        let url = if cfg!(windows) { "http://tauri.localhost" } else { "tauri://localhost" };
        get_ipc_response(
            &self.0,
            tauri::webview::InvokeRequest {
                cmd: cmd.into(),
                callback: tauri::ipc::CallbackFn(0),
                error: tauri::ipc::CallbackFn(1),
                url: url.parse().unwrap(),
                body: tauri::ipc::InvokeBody::Json(body),
                headers: Default::default(),
                invoke_key: INVOKE_KEY.to_owned(),
            },
        )
        .map(|body| body.deserialize::<Value>().unwrap())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn desktop_status_reports_the_embedded_gateway_and_the_missing_keychain() {
    let app = app("").await;
    let window = IpcWindow(app.window.clone());
    let status = tokio::task::spawn_blocking(move || window.invoke("desktop_status", json!({})))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status["mode"], json!("embedded"));
    let dashboard = status["dashboard"].as_str().unwrap();
    assert!(dashboard.starts_with("http://127.0.0.1:"), "{dashboard}");
    assert_eq!(status["start_error"], Value::Null);
    let warnings = status["warnings"].to_string();
    assert!(warnings.contains("No keychain"), "{warnings}");
    assert!(!status.to_string().contains(TOKEN), "the status never carries the token");
    app.shut().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_and_resume_from_the_menu_change_the_gateways_intake() {
    let app = app("").await;
    let view = app.menu("toggle-intake").await.unwrap();
    assert_eq!(view["paused"], json!(true));
    assert_eq!(app.status().await["paused"], json!(true));
    // A message sent now is accepted and waits.
    let api = app.controller.api().unwrap();
    let response = api
        .request(reqwest::Method::POST, "/v1/runs")
        .json(&json!({ "prompt": "held back", "run_id": "held-1" }))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 202);
    app.controller.refresh(&*app.shell).await;
    let view = app.controller.view();
    assert_eq!(view.runs.len(), 1, "{view:?}");
    assert_eq!((view.runs[0].run_id.as_str(), view.runs[0].status.as_str()), ("held-1", "queued"));
    let view = app.menu("toggle-intake").await.unwrap();
    assert_eq!(view["paused"], json!(false));
    let run = tokio::time::timeout(PATIENCE, async {
        loop {
            let run: Value = api
                .request(reqwest::Method::GET, "/v1/runs/held-1")
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            if run["status"] == json!("completed") {
                break run;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the held run completes once resumed");
    assert_eq!(run["answer"], json!("held back"));
    assert!(app.shell.get().drawn.iter().any(|v| v.paused), "the tray was redrawn paused");
    app.shut().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copy_token_copies_the_configured_token_and_start_at_login_toggles() {
    let app = app("").await;
    app.menu("copy-token").await.unwrap();
    assert_eq!(app.shell.get().copied, [TOKEN]);
    let view = app.menu("start-at-login").await.unwrap();
    assert_eq!(view["autostart"], json!(true));
    assert!(app.shell.get().autostart);
    let view = app.menu("start-at-login").await.unwrap();
    assert_eq!(view["autostart"], json!(false));
    app.menu("reveal-config").await.unwrap();
    assert_eq!(app.shell.get().revealed, [app.home.join("config.toml")]);
    app.menu("show-logs").await.unwrap();
    assert_eq!(app.shell.get().opened, [app.home.join("logs").join("desktop.log")]);
    app.menu("open-dashboard").await.unwrap();
    let shown = app.shell.get().shown.clone();
    assert!(
        shown[0].starts_with("http://127.0.0.1:") && shown[0].ends_with("/#/live"),
        "{shown:?}"
    );
    app.menu("run:some-run").await.unwrap();
    assert!(app.shell.get().shown[1].ends_with("/#/history/some-run"));
    let error = app.menu("no-such-item").await.unwrap_err();
    assert_eq!(error, json!("no menu item \"no-such-item\""));
    app.shut().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_brings_the_gateway_back_on_a_fresh_start() {
    let app = app("").await;
    app.menu("toggle-intake").await.unwrap();
    let before = app.status().await["uptime_ms"].as_u64().unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    app.menu("restart-gateway").await.unwrap();
    let status = app.status().await;
    // A new gateway: its uptime started again, and intake is open.
    assert!(status["uptime_ms"].as_u64().unwrap() < before + 50, "{status}");
    assert_eq!(status["paused"], json!(false));
    assert_eq!(app.shell.get().reloaded.len(), 1);
    app.shut().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quit_lets_a_running_run_finish_before_the_app_exits() {
    // Ten words at 150 ms each: the run is still going when Quit is chosen.
    let app = app("[gateway.engines.echo]\ndelay_ms = 150\n").await;
    let api = app.controller.api().unwrap();
    let response = api
        .request(reqwest::Method::POST, "/v1/runs")
        .json(&json!({ "prompt": "one two three four five six seven eight nine ten", "run_id": "slow-1" }))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 202);
    // Wait for the first delta: the run is running.
    let mut stream =
        api.request(reqwest::Method::GET, "/v1/runs/slow-1/events").send().await.unwrap();
    tokio::time::timeout(PATIENCE, async {
        while let Some(chunk) = stream.chunk().await.unwrap() {
            if String::from_utf8_lossy(&chunk).contains("\"delta\"") {
                return;
            }
        }
        panic!("the run's events ended before a delta");
    })
    .await
    .expect("the run streams");
    let home = app.home.clone();
    let quit = tokio::time::timeout(PATIENCE, app.menu("quit"));
    quit.await.expect("quit drains in time").unwrap();
    assert_eq!(app.shell.get().exited, [0]);
    assert!(app.controller.api().is_none());
    // The run finished whole before the gateway stopped.
    let run = run_after_restart(&home).await;
    assert_eq!(run["status"], json!("completed"), "{run}");
    assert_eq!(run["answer"], json!("one two three four five six seven eight nine ten"));
    drop(app);
}

/// `slow-1` as a new start of the gateway on the same home reads it back.
async fn run_after_restart(home: &Path) -> Value {
    let env: BTreeMap<String, String> = [
        ("LEMON_HOME", home.display().to_string()),
        ("HOME", home.display().to_string()),
        ("LEMON_API_TOKEN", TOKEN.to_owned()),
        ("LEMON_KEYCHAIN", "off".to_owned()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    let controller = Controller::connect(Settings::from_env(env)).await;
    let api = controller.api().unwrap();
    let run: Value = api
        .request(reqwest::Method::GET, "/v1/runs/slow-1")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    controller.quit(&Recorder::default()).await;
    run
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tray_shows_storage_failing_while_the_store_cannot_save() {
    let app = app("").await;
    app.controller.refresh(&*app.shell).await;
    assert_eq!(app.controller.view().health, Health::Healthy);
    // Another connection to the store's file makes its writes fail, as a
    // full disk does, until the trigger goes.
    let db = rusqlite::Connection::open(app.home.join("lemon.db")).unwrap();
    db.busy_timeout(Duration::from_secs(5)).unwrap();
    db.execute_batch(
        "CREATE TRIGGER no_health BEFORE INSERT ON health \
         BEGIN SELECT RAISE(ABORT, 'database or disk is full'); END;",
    )
    .unwrap();
    app.controller.refresh(&*app.shell).await;
    let view = app.controller.view();
    let Health::StoreFailing(Some(why)) = &view.health else {
        panic!("storage failing with the store's error: {view:?}");
    };
    assert!(why.contains("database or disk is full"), "{why}");
    assert_eq!(view.icon_state(), IconState::Failing);
    assert!(
        status_line(&view).starts_with("Lemon Gateway: storage failing, new messages refused"),
        "{}",
        status_line(&view)
    );
    assert!(app.shell.get().drawn.iter().any(|v| v.health == view.health), "the tray was redrawn");

    db.execute_batch("DROP TRIGGER no_health;").unwrap();
    app.controller.refresh(&*app.shell).await;
    assert_eq!(app.controller.view().health, Health::Healthy);
    app.shut().await;
}
