//! `config schema`, `config reference` and `config init`: the JSON Schema of
//! `config.toml`, its reference page and a starter file, all printed from the
//! config types. Core marks the sections other crates parse; this is the one
//! place that knows every crate, so it hands each section its type.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;
use lemon_core::config::schema::{self, SectionSchema};
use serde_json::Value;

/// The file name of the schema `config init` writes beside the config, and
/// that the starter's `#:schema` line names.
pub const SCHEMA_FILE: &str = "config.schema.json";

/// The sections of `[gateway]` each crate parses, with the type it parses
/// them into.
pub fn sections() -> Vec<SectionSchema> {
    use lemon_transports::{discord, email, telegram, webhook, xmtp};
    vec![
        SectionSchema { key: "engines", schema: lemon_engines::config::engines_schema },
        SectionSchema::of::<telegram::config::TelegramConfig>("telegram"),
        SectionSchema::of::<discord::config::DiscordConfig>("discord"),
        SectionSchema::of::<xmtp::config::XmtpConfig>("xmtp"),
        SectionSchema::of::<email::config::EmailConfig>("email"),
        SectionSchema::of::<webhook::WebhookConfig>("webhook"),
        SectionSchema::of::<lemon_sms::config::SmsConfig>("sms"),
        SectionSchema::of::<lemon_voice::config::VoiceConfig>("voice"),
    ]
}

/// The JSON Schema of `config.toml`.
///
/// # Errors
/// A section core leaves to another crate has no schema here.
pub fn schema() -> anyhow::Result<Value> {
    schema::document(&sections()).context("the config schema is incomplete")
}

/// `config schema`'s output, as checked in at `docs/reference/config.schema.json`.
///
/// # Errors
/// As [`schema()`].
pub fn schema_json() -> anyhow::Result<String> {
    Ok(schema::to_json(&schema()?))
}

/// `config reference`'s output, as checked in at `docs/reference/config.md`.
///
/// # Errors
/// As [`schema()`].
pub fn reference() -> anyhow::Result<String> {
    Ok(schema::markdown::render(&schema()?))
}

/// The starter file `config init` writes, pointing at [`SCHEMA_FILE`] beside it.
///
/// # Errors
/// As [`schema()`].
pub fn starter() -> anyhow::Result<String> {
    Ok(schema::starter::render(&schema()?, &format!("./{SCHEMA_FILE}")))
}

/// What `config init` wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Initialized {
    pub config: PathBuf,
    pub schema: PathBuf,
}

/// Why `config init` wrote nothing.
#[derive(Debug, thiserror::Error)]
pub enum InitError {
    #[error(
        "{} already exists; it was left as it is (pass --force to replace it with the starter file)",
        .0.display()
    )]
    Exists(PathBuf),
    #[error("{} is a directory, not a config file", .0.display())]
    Directory(PathBuf),
}

/// Writes the starter file at `config` (refused when a file is there,
/// unless `force`) and the schema beside it as [`SCHEMA_FILE`] (always: it
/// is printed from this build). Missing directories are made private
/// (0700), and the file is private (0600) since it may come to hold tokens.
///
/// # Errors
/// [`InitError`] when nothing was written; a directory or file that cannot
/// be made or written.
pub fn init(config: &Path, force: bool) -> anyhow::Result<Initialized> {
    if config.is_dir() {
        return Err(InitError::Directory(config.to_owned()).into());
    }
    if config.exists() && !force {
        return Err(InitError::Exists(config.to_owned()).into());
    }
    let dir = match config.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_owned(),
        _ => PathBuf::from("."),
    };
    {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let schema_path = dir.join(SCHEMA_FILE);
    write_atomically(&schema_path, schema_json()?.as_bytes(), 0o644)?;
    write_atomically(config, starter()?.as_bytes(), 0o600)?;
    Ok(Initialized { config: config.to_owned(), schema: schema_path })
}

/// Writes `bytes` to a sibling of `path` and renames it over `path`, so a
/// reader sees the old file or the new one, never half of it.
fn write_atomically(path: &Path, bytes: &[u8], mode: u32) -> anyhow::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let temp = path.with_file_name(format!(".{name}.{}.tmp", std::process::id()));
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&temp)
        .and_then(|mut file| {
            file.write_all(bytes)?;
            file.sync_all()
        })
        .and_then(|()| std::fs::rename(&temp, path));
    if written.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
    written.with_context(|| format!("cannot write {}", path.display()))
}

#[cfg(test)]
mod tests;
