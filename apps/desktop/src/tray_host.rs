//! Whether the desktop can show a tray icon at all: a StatusNotifierWatcher
//! on the session bus (KDE, GNOME with the AppIndicator extension, most
//! panels), or an X11 system tray (the `_NET_SYSTEM_TRAY_S<screen>` selection
//! has an owner). Without either the icon would be created and never shown,
//! so the app opens its window instead and says why.

use std::time::Duration;

/// The bus name of the StatusNotifierItem host registry.
const WATCHER: &str = "org.kde.StatusNotifierWatcher";

/// What shows tray icons here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TrayHost {
    StatusNotifier,
    /// An XEmbed system tray (trayer, older panels).
    XEmbed,
    /// Nothing: why, for the window's warning.
    Missing(String),
}

/// Looks for a tray host on the session bus, then on the X display.
pub fn detect() -> TrayHost {
    if status_notifier_watcher().unwrap_or(false) {
        return TrayHost::StatusNotifier;
    }
    if x11_system_tray().unwrap_or(false) {
        return TrayHost::XEmbed;
    }
    TrayHost::Missing(
        "No tray is available on this desktop (no StatusNotifierWatcher on the session bus and no system tray on the display; on GNOME, install the AppIndicator extension), so Lemon Gateway runs in this window: closing it quits."
            .to_owned(),
    )
}

fn status_notifier_watcher() -> anyhow::Result<bool> {
    let connection = zbus::blocking::connection::Builder::session()?
        .method_timeout(Duration::from_secs(2))
        .build()?;
    let proxy = zbus::blocking::fdo::DBusProxy::new(&connection)?;
    Ok(proxy.name_has_owner(WATCHER.try_into()?)?)
}

fn x11_system_tray() -> anyhow::Result<bool> {
    use x11rb::connection::Connection as _;
    use x11rb::protocol::xproto::ConnectionExt as _;
    let (connection, screen) = x11rb::connect(None)?;
    let name = format!("_NET_SYSTEM_TRAY_S{screen}");
    let atom = connection.intern_atom(true, name.as_bytes())?.reply()?.atom;
    if atom == x11rb::NONE {
        return Ok(false);
    }
    let owner = connection.get_selection_owner(atom)?.reply()?.owner;
    connection.flush()?;
    Ok(owner != x11rb::NONE)
}
