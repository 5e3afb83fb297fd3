//! `[gateway.engines.<id>]` resolved into the settings a CLI engine runs with, the
//! child's environment, and the executable lookup on `PATH`.

use std::collections::BTreeMap;
use std::fmt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::config::EngineSection;
use lemon_core::engine::UnavailableReason;

use super::Vendor;

/// The inactivity timeout when the section sets none.
pub(crate) const DEFAULT_TIMEOUT: Duration = Duration::from_millis(300_000);
/// The SIGTERM → SIGKILL grace when the section sets none.
pub(crate) const DEFAULT_CANCEL_GRACE: Duration = Duration::from_millis(2_000);
/// The longest stdout line read whole; longer lines are skipped with a warning.
pub(crate) const DEFAULT_MAX_LINE_BYTES: usize = 8 * 1024 * 1024;

/// Variables of the app's environment a child may see.
pub(crate) const ENV_ALLOWLIST: &[&str] = &[
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "SHELL",
    "TMPDIR",
    "TMP",
    "TEMP",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "TERM",
    "XDG_CONFIG_HOME",
    "XDG_CACHE_HOME",
];

/// One engine's settings, resolved from its config section.
#[derive(Clone)]
pub(crate) struct CliSettings {
    pub(crate) cli_path: Option<PathBuf>,
    pub(crate) extra_args: Vec<String>,
    pub(crate) model: Option<String>,
    /// Added to the child's environment; values may be secrets, so `Debug` shows keys only.
    pub(crate) env: BTreeMap<String, String>,
    /// Variables of the gateway's environment passed through (names or `PREFIX_*`).
    pub(crate) env_passthrough: Vec<String>,
    /// `None` disables the inactivity timeout.
    pub(crate) timeout: Option<Duration>,
    pub(crate) cancel_grace: Duration,
    pub(crate) skip_permissions: bool,
    pub(crate) allowed_tools: Vec<String>,
    pub(crate) steering: bool,
    pub(crate) max_line_bytes: usize,
    pub(crate) api_key_env: Option<String>,
    pub(crate) provider: Option<String>,
    pub(crate) reasoning_effort: Option<String>,
    /// The CLI is pointed at the gateway's MCP endpoint for the gateway's
    /// own tools (`cron`, `sms_*`…) where it can be.
    pub(crate) gateway_tools: bool,
}

impl fmt::Debug for CliSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CliSettings")
            .field("cli_path", &self.cli_path)
            .field("extra_args", &self.extra_args)
            .field("model", &self.model)
            .field("env_keys", &self.env.keys().collect::<Vec<_>>())
            .field("env_passthrough", &self.env_passthrough)
            .field("timeout", &self.timeout)
            .field("cancel_grace", &self.cancel_grace)
            .field("skip_permissions", &self.skip_permissions)
            .field("allowed_tools", &self.allowed_tools)
            .field("steering", &self.steering)
            .field("max_line_bytes", &self.max_line_bytes)
            .field("api_key_env", &self.api_key_env)
            .field("provider", &self.provider)
            .field("reasoning_effort", &self.reasoning_effort)
            .field("gateway_tools", &self.gateway_tools)
            .finish()
    }
}

impl CliSettings {
    pub(crate) fn from_section(vendor: Vendor, section: &EngineSection) -> Self {
        let timeout_ms = section.timeout_ms.unwrap_or(DEFAULT_TIMEOUT.as_millis() as u64);
        let max_line_bytes = section
            .other
            .get("max_line_bytes")
            .and_then(|value| value.as_integer())
            .and_then(|n| usize::try_from(n).ok())
            .filter(|n| *n > 0)
            .unwrap_or(DEFAULT_MAX_LINE_BYTES);
        CliSettings {
            cli_path: section.cli_path.clone().filter(|path| !path.as_os_str().is_empty()),
            extra_args: section.extra_args.clone(),
            model: section.model.clone().map(|m| m.trim().to_owned()).filter(|m| !m.is_empty()),
            env: section.env.clone(),
            env_passthrough: section.env_passthrough.clone(),
            timeout: (timeout_ms > 0).then(|| Duration::from_millis(timeout_ms)),
            cancel_grace: section
                .cancel_grace_ms
                .map_or(DEFAULT_CANCEL_GRACE, Duration::from_millis),
            skip_permissions: section.dangerously_skip_permissions.unwrap_or(false),
            allowed_tools: section.allowed_tools.clone(),
            steering: section.steering.unwrap_or(false),
            max_line_bytes,
            api_key_env: section
                .other_str("api_key_env")
                .or_else(|| vendor.default_api_key_env().map(str::to_owned)),
            provider: section.other_str("provider"),
            reasoning_effort: section.other_str("reasoning_effort"),
            gateway_tools: section
                .other
                .get("gateway_tools")
                .and_then(toml::Value::as_bool)
                .unwrap_or(true),
        }
    }
}

/// The child's environment: the allowlisted part of `base` and the variables
/// `env_passthrough` names, then the vendor's variables (only where unset), then
/// the section's `env`, then the API key.
pub(crate) fn child_env(
    base: &BTreeMap<String, String>,
    vendor_defaults: &[(&str, &str)],
    settings: &CliSettings,
    api_key: Option<&str>,
) -> BTreeMap<String, String> {
    let mut env: BTreeMap<String, String> = base
        .iter()
        .filter(|(key, _)| {
            ENV_ALLOWLIST.contains(&key.as_str())
                || crate::config::passes_through(&settings.env_passthrough, key)
        })
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    for (key, value) in vendor_defaults {
        env.entry((*key).to_owned()).or_insert_with(|| (*value).to_owned());
    }
    env.extend(settings.env.iter().map(|(k, v)| (k.clone(), v.clone())));
    if let (Some(key), Some(var)) = (api_key, settings.api_key_env.as_deref()) {
        env.insert(var.to_owned(), key.to_owned());
    }
    env
}

/// The executable to run: `cli_path` when it names a path, else the name (default
/// the vendor id) looked up on `search_path`. The error says what was looked at.
pub(crate) fn resolve_program(
    vendor: Vendor,
    cli_path: Option<&Path>,
    search_path: Option<&str>,
) -> Result<PathBuf, UnavailableReason> {
    let name = cli_path.unwrap_or_else(|| Path::new(vendor.id()));
    if name.components().count() > 1 || name.is_absolute() {
        return if is_executable(name) {
            Ok(name.to_path_buf())
        } else if name.exists() {
            Err(UnavailableReason::NotExecutable { path: name.to_path_buf() })
        } else {
            Err(UnavailableReason::MissingPath { path: name.to_path_buf() })
        };
    }
    let search = search_path.unwrap_or("");
    which(name, search).ok_or_else(|| UnavailableReason::NotFound {
        program: name.display().to_string(),
        search_path: search.to_owned(),
    })
}

/// The first executable file called `name` in the `:`-separated `search_path`.
pub fn which(name: &Path, search_path: &str) -> Option<PathBuf> {
    search_path
        .split(':')
        .filter(|dir| !dir.is_empty())
        .map(|dir| Path::new(dir).join(name))
        .find(|candidate| is_executable(candidate))
}

fn is_executable(path: &Path) -> bool {
    std::fs::metadata(path)
        .is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
}

#[cfg(test)]
mod tests;
