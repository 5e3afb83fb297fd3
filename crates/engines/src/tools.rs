//! The tools a native run can call.
//!
//! [`builtin`] gives the engine's own tools, which work on the run's working
//! directory: `bash`, `read`, `write`, `edit`, `list`, `grep`, `glob` and
//! `fetch`. [`gateway_tools`] gives the tools of the gateway, registered once
//! in the server's [`ToolRegistry`]: the `sms_*` tools over the SMS inbox and
//! the `telegram_send_image` / `discord_send_file` tools that hand a file to
//! the chat.
//!
//! Every path a tool is given goes through the call's [`Reach`]: the run's
//! cwd and the workspace as roots, less the gateway's own state (its home,
//! config, secrets and keychain files), so `../`, absolute paths elsewhere and
//! symlinks out or into the state are refused, and walks skip the state. Files
//! and directories are then opened with [`Reach::open`] and
//! [`Reach::read_dir`], which follow no link, so a path swapped after the
//! check cannot lead out. A tool never panics: bad arguments, refusals and
//! failures are error results the model reads.
//!
//! # Layout
//! - `args`: reading the model's arguments (strings trimmed, numbers and
//!   booleans also from strings).
//! - `bash`: `sh -c` in the run's cwd through the process module.
//! - `files`: `read`, `write`, `edit`, `list`.
//! - `search`: `grep` and `glob`, over a bounded directory walk.
//! - `fetch`: HTTP GET with the private-address rule of webhook callbacks.
//! - `sms`: the four `sms_*` tools.
//! - `send`: `telegram_send_image` and `discord_send_file`.

mod args;
mod bash;
mod fetch;
mod files;
mod sandbox;
mod search;
mod send;
mod sms;

pub use sandbox::{Sandbox, Support as SandboxSupport};

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use lemon_core::contain::{ContainError, Reach};
use lemon_core::sms::SmsInbox;
use lemon_core::tool::{Tool, ToolContext, ToolRegistry};

use crate::cli::ProcessRecorder;

/// Limits and settings of the built-in tools.
#[derive(Debug, Clone)]
pub struct BuiltinOptions {
    /// `bash` when the call gives no `timeout_ms`.
    pub bash_timeout: Duration,
    /// The longest `timeout_ms` a call may ask for.
    pub bash_max_timeout: Duration,
    /// The environment of `bash` commands, complete (nothing else is inherited).
    pub bash_env: BTreeMap<String, String>,
    /// Told about every command's process group, so a killed gateway's
    /// leftovers are killed at the next start.
    pub recorder: Option<Arc<dyn ProcessRecorder>>,
    /// The most text a tool returns (a command's output keeps its head and
    /// tail; `read` returns at most this many bytes of a file, and holds no
    /// more than that of a longer line in memory).
    pub output_limit: usize,
    /// Files larger than this are not read, edited or searched.
    pub max_file_bytes: u64,
    /// Lines `read` returns when the call gives no `limit`.
    pub read_default_lines: usize,
    /// Entries `list` and `glob` return, and matching lines `grep` returns, at most.
    pub max_results: usize,
    /// Directory entries a `grep` or `glob` walk looks at, at most.
    pub max_walk_entries: usize,
    /// The largest body `fetch` reads; the rest is cut.
    pub fetch_max_bytes: usize,
    /// How long a whole `fetch` (every redirect and the body) may take.
    pub fetch_timeout: Duration,
    /// Lets `fetch` reach loopback, private and link-local addresses.
    pub fetch_allow_private: bool,
    /// How `bash` commands are contained (`[gateway.sandbox]`).
    pub sandbox: Sandbox,
}

impl Default for BuiltinOptions {
    fn default() -> Self {
        BuiltinOptions {
            bash_timeout: Duration::from_secs(120),
            bash_max_timeout: Duration::from_secs(600),
            bash_env: default_bash_env(),
            recorder: None,
            output_limit: 30_000,
            max_file_bytes: 10 * 1024 * 1024,
            read_default_lines: 2_000,
            max_results: 200,
            max_walk_entries: 100_000,
            fetch_max_bytes: 1024 * 1024,
            fetch_timeout: Duration::from_secs(30),
            fetch_allow_private: false,
            sandbox: Sandbox::default(),
        }
    }
}

/// A minimal environment for commands: `PATH` and `HOME` of a plain system,
/// and a UTF-8 locale. The native engine passes the gateway's allowlisted
/// environment instead (the one CLIs get).
fn default_bash_env() -> BTreeMap<String, String> {
    [("PATH", "/usr/local/bin:/usr/bin:/bin"), ("LANG", "C.UTF-8")]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// The native engine's own tools, configured by `options`.
pub fn builtin(options: &BuiltinOptions) -> Vec<Arc<dyn Tool>> {
    let options = Arc::new(options.clone());
    vec![
        Arc::new(bash::Bash::new(options.clone())),
        Arc::new(files::Read::new(options.clone())),
        Arc::new(files::Write),
        Arc::new(files::Edit::new(options.clone())),
        Arc::new(files::List::new(options.clone())),
        Arc::new(search::Grep::new(options.clone())),
        Arc::new(search::Glob::new(options.clone())),
        Arc::new(fetch::Fetch::new(options)),
    ]
}

/// What the gateway's tools use.
#[derive(Debug, Clone)]
pub struct GatewayToolOptions {
    /// The SMS inbox; without one the `sms_*` tools answer that SMS is not configured.
    pub sms: Option<Arc<dyn SmsInbox>>,
    /// The user's home, for `~/…` paths of the send tools.
    pub home: Option<PathBuf>,
    /// The largest image `telegram_send_image` queues.
    pub telegram_max_bytes: u64,
    /// The largest file `discord_send_file` queues (the server sets the
    /// Discord transport's `max_upload_bytes`; 10 MiB, Discord's limit for bots).
    pub discord_max_bytes: u64,
}

impl Default for GatewayToolOptions {
    fn default() -> Self {
        GatewayToolOptions {
            sms: None,
            home: None,
            telegram_max_bytes: 50 * 1024 * 1024,
            discord_max_bytes: 10 * 1024 * 1024,
        }
    }
}

/// The gateway's tools other than `cron`: the four `sms_*` tools,
/// `telegram_send_image` and `discord_send_file`.
pub fn gateway_tools(options: &GatewayToolOptions) -> Vec<Arc<dyn Tool>> {
    let sms = options.sms.clone();
    vec![
        Arc::new(sms::GetInboxNumber::new(sms.clone())),
        Arc::new(sms::WaitForCode::new(sms.clone())),
        Arc::new(sms::ListMessages::new(sms.clone())),
        Arc::new(sms::ClaimMessage::new(sms)),
        Arc::new(send::SendFile::telegram(options.home.clone(), options.telegram_max_bytes)),
        Arc::new(send::SendFile::discord(options.home.clone(), options.discord_max_bytes)),
    ]
}

/// Registers [`gateway_tools`] in `registry`.
pub fn register_gateway_tools(registry: &ToolRegistry, options: &GatewayToolOptions) {
    for tool in gateway_tools(options) {
        registry.register(tool);
    }
}

/// `raw` resolved inside the run's cwd or workspace and outside the
/// gateway's state, or the refusal as the model reads it.
fn contained(reach: &Reach, raw: &str) -> Result<PathBuf, String> {
    reach.resolve(Path::new(raw)).map_err(|err| refusal(raw, &err))
}

fn refusal(raw: &str, err: &ContainError) -> String {
    match err {
        ContainError::Outside { .. } => {
            format!("{raw} is outside the working directory and the workspace")
        }
        ContainError::OffLimits { .. } => format!(
            "{raw} is the gateway's own state (its home, config or secrets); no tool may read or write it"
        ),
        ContainError::Changed { .. } => {
            format!("{raw} changed while it was being opened (a link appeared on its path)")
        }
        ContainError::Io { source, .. } => format!("{raw}: {source}"),
        ContainError::NoRoots => "no directory is allowed for this run".to_owned(),
    }
}

/// `path` as the model should see it: relative to the cwd when it is inside it.
fn shown(ctx: &ToolContext, path: &Path) -> String {
    let cwd = ctx.cwd.canonicalize().unwrap_or_else(|_| ctx.cwd.clone());
    match path.strip_prefix(&cwd) {
        Ok(rel) if rel.as_os_str().is_empty() => ".".to_owned(),
        Ok(rel) => rel.display().to_string(),
        Err(_) => path.display().to_string(),
    }
}

/// Whether these first bytes of a file look like text: no NUL byte, and
/// valid UTF-8 except perhaps for a character cut at the end.
fn looks_like_text(head: &[u8]) -> bool {
    if head.contains(&0) {
        return false;
    }
    match std::str::from_utf8(head) {
        Ok(_) => true,
        Err(err) => err.error_len().is_none(),
    }
}

/// `text` cut to at most `max` bytes on a character boundary.
fn cut(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

#[cfg(test)]
mod testutil;
