//! `lemon-desktop`: the tray app.

use std::collections::BTreeMap;
use std::process::ExitCode;

use lemon_desktop::gateway::Settings;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::EnvFilter;

/// Logs go to stderr and to `$LEMON_HOME/logs/desktop.log` ("Show logs"). A
/// line that cannot be written (a full disk) is lost, never reported with a
/// panic of the task that logged.
fn init_logging(settings: &Settings) {
    let file = settings.log_file();
    let file_layer = file
        .parent()
        .and_then(|dir| std::fs::create_dir_all(dir).ok())
        .and_then(|()| std::fs::OpenOptions::new().create(true).append(true).open(&file).ok())
        .map(|file| {
            tracing_subscriber::fmt::layer()
                .with_ansi(false)
                .with_writer(std::sync::Mutex::new(file))
                .log_internal_errors(false)
        });
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    tracing_subscriber::registry()
        .with(filter)
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .log_internal_errors(false),
        )
        .with(file_layer)
        .init();
}

#[allow(clippy::print_stderr)]
fn main() -> ExitCode {
    // Before any other thread: secrets in the environment are kept in memory and
    // blanked in the block /proc shows (the gateway it runs reads the map).
    let env: BTreeMap<String, String> = match lemon_server::seal_environment() {
        Ok(sealed) => sealed.vars,
        Err((sealed, why)) => {
            eprintln!("lemon-desktop: warning: secrets stay readable in this process's environment block: {why}");
            sealed.vars
        }
    };
    // Without a display GTK cannot start, and tao panics.
    let has_display = ["DISPLAY", "WAYLAND_DISPLAY"]
        .iter()
        .any(|name| env.get(*name).is_some_and(|value| !value.trim().is_empty()));
    if !has_display {
        eprintln!(
            "lemon-desktop: no display (neither DISPLAY nor WAYLAND_DISPLAY is set). The desktop app needs a graphical session; on a server, run `lemon-gateway serve` instead."
        );
        return ExitCode::from(2);
    }
    let settings = Settings::from_env(env);
    init_logging(&settings);
    match lemon_desktop::app::run(settings) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("lemon-desktop: {error:#}");
            ExitCode::FAILURE
        }
    }
}
