//! `lemon-gateway secrets set|list|delete|migrate`: the secret store of this
//! `$LEMON_HOME` (keychain, environment, `secrets.toml`), without a running
//! gateway. A running gateway sees a change within a few seconds (it reads
//! the secrets it uses again) and restarts what uses it.
//!
//! A value is read from a prompt with echo off on a terminal, else from
//! stdin (up to the first newline); never from the command line, and never
//! printed.

use std::collections::BTreeMap;
use std::io::{BufRead, IsTerminal, Write};

use lemon_core::config;
use lemon_core::secrets::{check_settable_name, SecretStore, SourceKind};
use lemon_server::paths::Paths;

use crate::failure::{self, Failure};

/// Where a kind of source is, for people.
fn place(store: &SecretStore, kind: Option<SourceKind>) -> String {
    match kind {
        Some(SourceKind::Keychain) => "keychain".to_owned(),
        Some(SourceKind::Env) => "environment".to_owned(),
        Some(SourceKind::File) => format!("file ({})", store.file_path().display()),
        Some(SourceKind::Inline) => "inline in config.toml (move it to the keychain)".to_owned(),
        None => "not set".to_owned(),
    }
}

fn keychain_line(store: &SecretStore) -> String {
    let keychain = store.keychain();
    if keychain.available {
        format!("keychain: {}", keychain.detail)
    } else {
        format!(
            "keychain: not available ({}); secrets are saved to {}",
            keychain.detail,
            store.file_path().display()
        )
    }
}

fn name_ok(name: &str) -> Result<(), Failure> {
    check_settable_name(name).map_err(|_| {
        Failure::usage(format!(
            "invalid secret name {name:?}: use 1 to 64 lowercase letters, digits and `_`"
        ))
    })
}

/// Reads one line from the terminal with echo off.
#[allow(clippy::print_stderr)] // The prompt goes to the terminal.
fn prompt_hidden(name: &str) -> std::io::Result<String> {
    use nix::sys::termios::{self, LocalFlags, SetArg};
    let stdin = std::io::stdin();
    let saved = termios::tcgetattr(&stdin).ok();
    if let Some(saved) = &saved {
        let mut quiet = saved.clone();
        quiet.local_flags.remove(LocalFlags::ECHO);
        quiet.local_flags.insert(LocalFlags::ECHONL);
        let _ = termios::tcsetattr(&stdin, SetArg::TCSANOW, &quiet);
    }
    eprint!("value for {name} (not shown): ");
    std::io::stderr().flush()?;
    let mut line = String::new();
    let read = stdin.lock().read_line(&mut line);
    if let Some(saved) = &saved {
        let _ = termios::tcsetattr(&stdin, SetArg::TCSANOW, saved);
    }
    read?;
    Ok(line)
}

fn read_value(name: &str) -> anyhow::Result<String> {
    let line = if std::io::stdin().is_terminal() {
        prompt_hidden(name)?
    } else {
        let mut line = String::new();
        std::io::stdin().lock().read_line(&mut line)?;
        line
    };
    let value = line.trim_end_matches(['\n', '\r']).to_owned();
    if value.trim().is_empty() {
        return Err(Failure::usage(format!("no value given for {name}")).into());
    }
    Ok(value)
}

/// The names the config file uses, with what uses each; empty when the file
/// cannot be read (`doctor` and `config check` report that).
fn config_uses(paths: &Paths) -> Vec<lemon_api::secrets::SecretUse> {
    let Ok(loaded) = config::load_file_or_default(&paths.config) else { return Vec::new() };
    lemon_server::secret_uses_of(&loaded.config.gateway)
}

#[allow(clippy::print_stdout, clippy::print_stderr)]
pub(crate) fn set(paths: &Paths, env: &BTreeMap<String, String>, name: &str) -> anyhow::Result<u8> {
    name_ok(name)?;
    let store = lemon_server::open_secrets(paths, env);
    let value = read_value(name)?;
    let kind = store.store(name, &value)?;
    crate::say!("{name}: saved to the {}", place(&store, Some(kind)));
    if let Some(SourceKind::Env) = store.kind_of(name)?.filter(|k| *k != kind) {
        eprintln!(
            "warning: {} is set in the environment and is used over it",
            lemon_core::secrets::env_var_name(name)
        );
    }
    Ok(failure::OK)
}

#[allow(clippy::print_stdout)]
pub(crate) fn list(
    paths: &Paths,
    env: &BTreeMap<String, String>,
    json: bool,
) -> anyhow::Result<u8> {
    let store = lemon_server::open_secrets(paths, env);
    let rows = lemon_api::secrets::listing(&store, &config_uses(paths))?;
    if json {
        let secrets: Vec<_> = rows
            .iter()
            .map(|(name, source, used_by)| {
                serde_json::json!({
                    "name": name, "source": source.map(SourceKind::as_str), "used_by": used_by,
                })
            })
            .collect();
        let keychain = store.keychain();
        let out = serde_json::json!({
            "secrets": secrets,
            "keychain": { "available": keychain.available, "detail": keychain.detail },
        });
        crate::say!("{out}");
        return Ok(failure::OK);
    }
    crate::say!("{}", keychain_line(&store));
    if rows.is_empty() {
        crate::say!("no secrets");
    }
    let width = rows.iter().map(|(name, _, _)| name.len()).max().unwrap_or(0);
    for (name, source, used_by) in &rows {
        let used = if used_by.is_empty() {
            String::new()
        } else {
            format!("  (used by {})", used_by.join(", "))
        };
        crate::say!("{name:<width$}  {}{used}", place(&store, *source));
    }
    Ok(failure::OK)
}

#[allow(clippy::print_stdout)]
pub(crate) fn delete(
    paths: &Paths,
    env: &BTreeMap<String, String>,
    name: &str,
) -> anyhow::Result<u8> {
    name_ok(name)?;
    let store = lemon_server::open_secrets(paths, env);
    if store.delete(name)? {
        crate::say!("{name}: deleted");
        return Ok(failure::OK);
    }
    match store.kind_of(name)? {
        Some(SourceKind::Env) => Err(Failure::run(format!(
            "{name} is set in the environment ({}); remove it there",
            lemon_core::secrets::env_var_name(name)
        ))
        .into()),
        _ => Err(Failure::run(format!("{name} is not stored in the keychain or the secrets file"))
            .into()),
    }
}

#[allow(clippy::print_stdout)]
pub(crate) fn migrate(paths: &Paths, env: &BTreeMap<String, String>) -> anyhow::Result<u8> {
    let store = lemon_server::open_secrets(paths, env);
    if !store.keychain().available {
        return Err(Failure::run(format!(
            "no keychain to move secrets to: {}",
            store.keychain().detail
        ))
        .into());
    }
    let moved = store.migrate_file()?;
    if moved.is_empty() {
        crate::say!("nothing to move: {} holds no secrets", store.file_path().display());
    }
    for name in &moved {
        crate::say!("{name}: moved to the keychain");
    }
    Ok(failure::OK)
}
