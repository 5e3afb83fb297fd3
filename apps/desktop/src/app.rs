//! The Tauri glue: the tray built from [`menu_model`], the window on the
//! dashboard, the plugins, and [`TauriShell`], through which the
//! [`Controller`] reaches the desktop. The logic lives in the controller.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tauri::image::Image;
use tauri::menu::{CheckMenuItem, Menu, MenuItem, PredefinedMenuItem};
use tauri::tray::TrayIconBuilder;
use tauri::{AppHandle, Manager, RunEvent, Runtime, WebviewUrl, WebviewWindowBuilder, WindowEvent};
use tauri_plugin_autostart::ManagerExt as _;
use tauri_plugin_clipboard_manager::ClipboardExt as _;
use tauri_plugin_notification::NotificationExt as _;
use tauri_plugin_opener::OpenerExt as _;

use crate::controller::{Controller, Shell};
use crate::gateway::Settings;
use crate::icon::{self, Theme};
use crate::menu::{menu_model, status_line, EntryKind, MenuEntry, MenuId};
use crate::notifications::Notifier;
use crate::state::{TrayView, WaitingApproval};
use crate::tray_host::{self, TrayHost};

/// The window's label.
pub const WINDOW: &str = "main";
/// The tray icon's id (its X window class ends with it).
pub const TRAY: &str = "lemon";

/// The [`Shell`] the commands use, as managed state.
#[derive(Clone)]
pub struct SharedShell(pub Arc<dyn Shell>);

impl std::fmt::Debug for SharedShell {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SharedShell")
    }
}

/// The commands the app's own page (`dist/index.html`, shown when the
/// gateway did not start) calls.
pub mod commands {
    use tauri::State;

    use super::SharedShell;
    use crate::controller::{Controller, DesktopStatus};
    use crate::menu::MenuId;
    use crate::state::TrayView;

    /// What the app runs and why it warns.
    #[tauri::command]
    pub async fn desktop_status(
        controller: State<'_, Controller>,
    ) -> Result<DesktopStatus, String> {
        Ok(controller.status().await)
    }

    /// Does what the menu item `id` (its string form) does; the view after.
    #[tauri::command]
    pub async fn menu_action(
        id: String,
        controller: State<'_, Controller>,
        shell: State<'_, SharedShell>,
    ) -> Result<TrayView, String> {
        let id: MenuId = id.parse().map_err(|e| format!("{e}"))?;
        controller.handle(&id, &*shell.0).await.map_err(|e| format!("{e:#}"))?;
        Ok(controller.view())
    }
}

/// The app's commands on `builder`; shared by the app and its tests.
pub fn with_commands<R: Runtime>(builder: tauri::Builder<R>) -> tauri::Builder<R> {
    builder
        .invoke_handler(tauri::generate_handler![commands::desktop_status, commands::menu_action])
}

/// The desktop as Tauri reaches it.
pub struct TauriShell<R: Runtime> {
    app: AppHandle<R>,
    theme: Theme,
    tray: AtomicBool,
    /// What the tray shows now, so an unchanged view redraws nothing (a
    /// rebuilt menu would close one the user has open).
    drawn: Mutex<Option<(Vec<MenuEntry>, icon::IconState, String)>>,
    /// Waiting calls as notifications with buttons.
    notifier: Arc<Notifier>,
}

impl<R: Runtime> std::fmt::Debug for TauriShell<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TauriShell").field("theme", &self.theme).finish_non_exhaustive()
    }
}

impl<R: Runtime> TauriShell<R> {
    pub fn new(app: AppHandle<R>, theme: Theme) -> Self {
        TauriShell {
            app,
            theme,
            tray: AtomicBool::new(false),
            drawn: Mutex::new(None),
            notifier: Arc::new(Notifier::default()),
        }
    }

    /// Whether the tray icon is up (else closing the window quits).
    pub fn has_tray(&self) -> bool {
        self.tray.load(Ordering::Relaxed)
    }

    fn window(&self) -> Option<tauri::WebviewWindow<R>> {
        self.app.get_webview_window(WINDOW)
    }
}

impl<R: Runtime> Shell for TauriShell<R> {
    fn copy_text(&self, text: &str) -> anyhow::Result<()> {
        self.app.clipboard().write_text(text.to_owned())?;
        Ok(())
    }

    fn show_window(&self, url: &str) {
        let Some(window) = self.window() else { return };
        if let Ok(url) = url.parse() {
            let _ = window.navigate(url);
        }
        let _ = window.show();
        let _ = window.unminimize();
        let _ = window.set_focus();
    }

    fn reload_window(&self, url: &str) {
        if let (Some(window), Ok(url)) = (self.window(), url.parse()) {
            let _ = window.navigate(url);
        }
    }

    fn window_visible(&self) -> bool {
        self.window().and_then(|w| w.is_visible().ok()).unwrap_or(false)
    }

    fn reveal(&self, path: &std::path::Path) -> anyhow::Result<()> {
        self.app.opener().reveal_item_in_dir(path)?;
        Ok(())
    }

    fn open_file(&self, path: &std::path::Path) -> anyhow::Result<()> {
        self.app.opener().open_path(path.display().to_string(), None::<&str>)?;
        Ok(())
    }

    fn autostart_enabled(&self) -> bool {
        self.app.autolaunch().is_enabled().unwrap_or(false)
    }

    fn set_autostart(&self, enabled: bool) -> anyhow::Result<()> {
        let manager = self.app.autolaunch();
        if enabled {
            manager.enable()?;
        } else {
            manager.disable()?;
        }
        Ok(())
    }

    fn notify(&self, title: &str, body: &str) {
        if let Err(error) = self.app.notification().builder().title(title).body(body).show() {
            tracing::info!(%error, "no notification shown");
        }
    }

    fn ask(&self, approval: &WaitingApproval) {
        let (notifier, approval) = (self.notifier.clone(), approval.clone());
        tauri::async_runtime::spawn(async move {
            if let Err(error) = notifier.ask(&approval).await {
                tracing::info!(%error, approval = %approval.id, "no notification for the approval");
            }
        });
    }

    fn withdraw(&self, id: &str) {
        let (notifier, id) = (self.notifier.clone(), id.to_owned());
        tauri::async_runtime::spawn(async move { notifier.withdraw(&id).await });
    }

    fn redraw(&self, view: &TrayView) {
        if !self.has_tray() {
            return;
        }
        let Some(tray) = self.app.tray_by_id(TRAY) else { return };
        let entries = menu_model(view);
        let state = view.icon_state();
        let tooltip = status_line(view);
        let mut drawn = self.drawn.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let (menu_changed, icon_changed, tooltip_changed) = match drawn.as_ref() {
            Some((e, s, t)) => (*e != entries, *s != state, *t != tooltip),
            None => (true, true, true),
        };
        if menu_changed {
            match build_menu(&self.app, &entries) {
                Ok(menu) => {
                    let _ = tray.set_menu(Some(menu));
                }
                Err(error) => tracing::warn!(%error, "the tray menu could not be built"),
            }
        }
        if icon_changed {
            let _ = tray.set_icon(Some(tray_image(state, self.theme)));
        }
        if tooltip_changed {
            let _ = tray.set_tooltip(Some(&tooltip));
        }
        if menu_changed || icon_changed || tooltip_changed {
            // What the tray shows now: the end-to-end test waits for this
            // line before it opens the menu, since a rebuilt menu closes an
            // open one.
            tracing::debug!(status = %tooltip, icon = ?state, autostart = view.autostart, "tray drawn");
        }
        *drawn = Some((entries, state, tooltip));
    }

    fn exit(&self, code: i32) {
        self.app.exit(code);
    }
}

fn tray_image(state: icon::IconState, theme: Theme) -> Image<'static> {
    Image::new_owned(icon::render(state, theme), icon::SIZE, icon::SIZE)
}

/// Native menu items for `entries`.
fn build_menu<R: Runtime>(app: &AppHandle<R>, entries: &[MenuEntry]) -> tauri::Result<Menu<R>> {
    let menu = Menu::new(app)?;
    for (i, entry) in entries.iter().enumerate() {
        let id = entry.id.as_ref().map_or_else(|| format!("line-{i}"), MenuId::to_string);
        match entry.kind {
            EntryKind::Separator => menu.append(&PredefinedMenuItem::separator(app)?)?,
            EntryKind::Check(checked) => {
                menu.append(&CheckMenuItem::with_id(
                    app,
                    id,
                    &entry.label,
                    true,
                    checked,
                    None::<&str>,
                )?)?;
            }
            EntryKind::Action => {
                menu.append(&MenuItem::with_id(app, id, &entry.label, true, None::<&str>)?)?
            }
            EntryKind::Info => {
                menu.append(&MenuItem::with_id(app, id, &entry.label, false, None::<&str>)?)?
            }
        }
    }
    Ok(menu)
}

fn build_tray<R: Runtime>(
    app: &AppHandle<R>,
    controller: &Controller,
    shell: &Arc<TauriShell<R>>,
) -> tauri::Result<()> {
    let view = controller.view();
    let menu = build_menu(app, &menu_model(&view))?;
    let (controller, handler_shell) = (controller.clone(), shell.clone());
    TrayIconBuilder::with_id(TRAY)
        .icon(tray_image(view.icon_state(), shell.theme))
        .tooltip(status_line(&view))
        .menu(&menu)
        .show_menu_on_left_click(true)
        .on_menu_event(move |_app, event| {
            let Ok(id) = event.id().as_ref().parse::<MenuId>() else { return };
            let (controller, shell) = (controller.clone(), handler_shell.clone());
            tauri::async_runtime::spawn(async move {
                if let Err(error) = controller.handle(&id, &*shell).await {
                    tracing::warn!(item = %id, "{error:#}");
                    shell.notify("Lemon Gateway", &format!("{error:#}"));
                }
            });
        })
        .build(app)?;
    Ok(())
}

/// Whether the window opens at start even with a tray (`LEMON_DESKTOP_WINDOW=1`).
fn window_at_start(env: &BTreeMap<String, String>) -> bool {
    env.get("LEMON_DESKTOP_WINDOW").is_some_and(|v| v == "1")
}

/// Runs the app until it quits.
///
/// # Errors
/// Tauri could not start.
pub fn run(settings: Settings) -> anyhow::Result<()> {
    let theme = Theme::from_env(&settings.env);
    let open_window = window_at_start(&settings.env);
    let skip_tray = settings.env.get("LEMON_DESKTOP_NO_TRAY").is_some_and(|v| v == "1");
    let app = with_commands(tauri::Builder::default())
        // First: a second launch hands over to the first and ends here.
        .plugin(tauri_plugin_single_instance::init(|app, _argv, _cwd| {
            tracing::info!("a second launch: showing the window");
            if let Some(window) = app.get_webview_window(WINDOW) {
                let _ = window.show();
                let _ = window.unminimize();
                let _ = window.set_focus();
            }
        }))
        .plugin(tauri_plugin_autostart::init(tauri_plugin_autostart::MacosLauncher::LaunchAgent, None))
        .plugin(tauri_plugin_notification::init())
        .plugin(tauri_plugin_clipboard_manager::init())
        .plugin(tauri_plugin_opener::init())
        .setup(move |app| {
            let controller = tauri::async_runtime::block_on(Controller::connect(settings));
            app.manage(controller.clone());
            let shell = Arc::new(TauriShell::new(app.handle().clone(), theme));
            app.manage(SharedShell(shell.clone()));
            app.manage(shell.clone());
            let host = if skip_tray {
                TrayHost::Missing("The tray is switched off (LEMON_DESKTOP_NO_TRAY=1).".to_owned())
            } else {
                tray_host::detect()
            };
            tracing::info!(?host, "tray host");
            let tray = match host {
                TrayHost::Missing(reason) => {
                    controller.add_warning(reason);
                    false
                }
                _ => {
                    // libayatana is loaded at run time and panics when missing.
                    let built = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        build_tray(app.handle(), &controller, &shell)
                    }));
                    match built {
                        Ok(Ok(())) => true,
                        Ok(Err(error)) => {
                            controller.add_warning(format!("The tray icon could not be created ({error}), so Lemon Gateway runs in this window: closing it quits."));
                            false
                        }
                        Err(_) => {
                            controller.add_warning("The tray icon could not be created (libayatana-appindicator3 is missing), so Lemon Gateway runs in this window: closing it quits.".to_owned());
                            false
                        }
                    }
                }
            };
            shell.tray.store(tray, Ordering::Relaxed);
            let script = tauri::async_runtime::block_on(controller.init_script());
            let url = match controller.dashboard_url("") {
                Some(url) => WebviewUrl::External(url.parse()?),
                None => WebviewUrl::App("index.html".into()),
            };
            let visible = !tray || open_window || controller.start_error().is_some();
            WebviewWindowBuilder::new(app.handle(), WINDOW, url)
                .title("Lemon Gateway")
                .inner_size(1180.0, 800.0)
                .visible(visible)
                .initialization_script(&script)
                .build()?;
            tracing::info!(
                tray,
                window = visible,
                dashboard = controller.dashboard_url("").unwrap_or_default(),
                "desktop ready"
            );
            let notifier = shell.notifier.clone();
            let follow_shell: Arc<dyn Shell> = shell;
            let (listener, listener_shell) = (controller.clone(), follow_shell.clone());
            tauri::async_runtime::spawn(notifier.listen(listener, listener_shell));
            tauri::async_runtime::spawn(async move { controller.follow(follow_shell).await });
            Ok(())
        })
        .on_window_event(|window, event| {
            if let WindowEvent::CloseRequested { api, .. } = event {
                let app = window.app_handle();
                let shell = app.state::<SharedShell>().0.clone();
                api.prevent_close();
                let has_tray = app.state::<Arc<TauriShell<tauri::Wry>>>().has_tray();
                if has_tray {
                    // The tray stays; the window comes back from it.
                    let _ = window.hide();
                } else {
                    let controller = app.state::<Controller>().inner().clone();
                    tauri::async_runtime::spawn(async move { controller.quit(&*shell).await });
                }
            }
        })
        .build(tauri::generate_context!())?;
    app.run(|_app, event| {
        // The last window closing is no reason to end: the tray stays.
        if let RunEvent::ExitRequested { code: None, api, .. } = event {
            api.prevent_exit();
        }
    });
    Ok(())
}
