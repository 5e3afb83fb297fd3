//! The environment variables the reference gateway reads, applied over a
//! loaded `config.toml`: the one place the gateway reads them. The
//! environment is passed in (a map), so `config check`, a start and a reload
//! read the same values and tests never touch the process's environment.
//!
//! | variable | setting | over the file? |
//! |---|---|---|
//! | `LEMON_GATEWAY_MAX_CONCURRENT_RUNS` | `[gateway] max_concurrent_runs` | yes |
//! | `LEMON_GATEWAY_DEFAULT_CWD` | `[gateway] default_cwd` | yes |
//! | `LEMON_GATEWAY_AUTO_RESUME` | `[gateway] auto_resume` | yes |
//! | `LEMON_GATEWAY_ENABLE_WEBHOOK` | `[gateway] enable_webhook` | yes |
//! | `LEMON_GATEWAY_REQUIRE_ENGINE_LOCK` | `[gateway] require_engine_lock` | yes |
//! | `LEMON_GATEWAY_ENGINE_LOCK_TIMEOUT_MS` | `[gateway] engine_lock_timeout_ms` | yes |
//! | `LEMON_GATEWAY_HEALTH_PORT` | `[gateway.health] port` | yes |
//! | `LEMON_SMS_WEBHOOK_ENABLED` | `[gateway.sms] enabled` (`webhook_enabled`) | yes |
//! | `LEMON_SMS_WEBHOOK_PORT` | `[gateway.sms] port` (`webhook_port`) | yes |
//! | `LEMON_SMS_WEBHOOK_BIND` | `[gateway.sms] bind` (`webhook_bind`) | yes |
//! | `LEMON_SMS_INBOX_TTL_MS` | `[gateway.sms] inbox_ttl_ms` | yes |
//! | `TWILIO_INBOX_NUMBER` | `[gateway.sms] inbox_number` | yes |
//! | `TWILIO_VALIDATE_WEBHOOK` | `[gateway.sms] validate_webhook` | yes |
//! | `TWILIO_WEBHOOK_URL` | `[gateway.sms] webhook_url` (over `public_url`) | yes |
//! | `VOICE_PUBLIC_URL` | `[gateway.voice] public_url` | no: a fallback |
//! | `TWILIO_PHONE_NUMBER` | `[gateway.voice] twilio_phone_number` | no: a fallback |
//! | `VOICE_RECORDINGS_DIR` | `[gateway.voice] recordings_dir` | no: a fallback |
//! | `${VAR}` values in `[gateway.xmtp]` | the variable's value | — |
//!
//! The voice variables are fallbacks, as in the reference (its `Voice.Config`
//! reads the section first), and only fill a `[gateway.voice]` section that
//! exists: a variable never switches a channel on by itself, except
//! `LEMON_SMS_WEBHOOK_ENABLED`, which is that switch. Secrets the reference
//! reads from the environment (`TWILIO_AUTH_TOKEN`, `TWILIO_ACCOUNT_SID`,
//! `DEEPGRAM_API_KEY`, `ELEVENLABS_API_KEY`, `OPENAI_API_KEY`,
//! `ANTHROPIC_API_KEY`) are read by the secret store under the default
//! secret names, never here. A blank variable counts as unset; a bad value is
//! an error naming the variable.

use std::collections::BTreeMap;
use std::path::PathBuf;

use super::loader::{MAX_CONCURRENT_RUNS, MAX_DURATION_MS};
use super::reference::{reference_bind, KeyNote};
use super::Config;

/// An environment variable with a value the gateway cannot use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("environment variable {var}: {message}")]
pub struct EnvError {
    pub var: String,
    pub message: String,
}

/// The `[gateway.xmtp]` keys whose `${VAR}` values the reference replaces
/// with the variable's value.
const XMTP_SUBSTITUTED: [&str; 8] = [
    "api_url",
    "wallet_address",
    "wallet_key",
    "private_key",
    "inbox_id",
    "db_path",
    "bridge_script",
    "sdk_module",
];

/// Applies the variables of `env` over `config`, which was read from a file
/// whose raw tables are `file`. Returns a note for every value of the file
/// a variable replaced or could not fill (paths from the file's root, e.g.
/// `["gateway", "sms", "webhook_port"]`).
///
/// # Errors
/// The first variable with a value that is not of its setting's kind (a
/// port, a whole number, a boolean, an E.164 number, an http(s) URL) or out
/// of its setting's bounds.
pub fn apply_env(
    config: &mut Config,
    file: &toml::Table,
    env: &BTreeMap<String, String>,
) -> Result<Vec<KeyNote>, EnvError> {
    let vars = Vars { env };
    let in_file = |path: &[&str]| {
        let mut node = file.get("gateway");
        for part in path {
            node = node.and_then(|v| v.as_table()).and_then(|t| t.get(*part));
        }
        node.is_some()
    };
    let mut notes = Vec::new();
    let mut overrides = |var: &str, keys: &[&[&str]]| {
        for key in keys.iter().filter(|key| in_file(key)) {
            let mut path = vec!["gateway"];
            path.extend_from_slice(key);
            notes.push(KeyNote::new(
                &path,
                format!("the environment variable {var} overrides this value"),
            ));
        }
    };

    let gateway = &mut config.gateway;
    if let Some(n) = vars.number("LEMON_GATEWAY_MAX_CONCURRENT_RUNS", 0, MAX_CONCURRENT_RUNS)? {
        gateway.max_concurrent_runs = usize::try_from(n).unwrap_or(usize::MAX);
        overrides("LEMON_GATEWAY_MAX_CONCURRENT_RUNS", &[&["max_concurrent_runs"]]);
    }
    if let Some(dir) = vars.text("LEMON_GATEWAY_DEFAULT_CWD") {
        gateway.default_cwd = Some(PathBuf::from(dir));
        overrides("LEMON_GATEWAY_DEFAULT_CWD", &[&["default_cwd"]]);
    }
    if let Some(on) = vars.flag("LEMON_GATEWAY_AUTO_RESUME")? {
        gateway.auto_resume = Some(on);
        overrides("LEMON_GATEWAY_AUTO_RESUME", &[&["auto_resume"]]);
    }
    if let Some(on) = vars.flag("LEMON_GATEWAY_ENABLE_WEBHOOK")? {
        gateway.enable_webhook = Some(on);
        overrides("LEMON_GATEWAY_ENABLE_WEBHOOK", &[&["enable_webhook"]]);
    }
    if let Some(on) = vars.flag("LEMON_GATEWAY_REQUIRE_ENGINE_LOCK")? {
        gateway.require_engine_lock = on;
        overrides("LEMON_GATEWAY_REQUIRE_ENGINE_LOCK", &[&["require_engine_lock"]]);
    }
    if let Some(ms) = vars.number("LEMON_GATEWAY_ENGINE_LOCK_TIMEOUT_MS", 0, MAX_DURATION_MS)? {
        gateway.engine_lock_timeout_ms = ms;
        overrides("LEMON_GATEWAY_ENGINE_LOCK_TIMEOUT_MS", &[&["engine_lock_timeout_ms"]]);
    }
    if let Some(port) = vars.port("LEMON_GATEWAY_HEALTH_PORT")? {
        gateway.health.port = Some(port);
        overrides("LEMON_GATEWAY_HEALTH_PORT", &[&["health", "port"]]);
    }

    // `[gateway.sms]`: each variable sets our key and replaces both names the
    // file may use for it.
    let mut sms: Vec<(&str, &[&str], toml::Value)> = Vec::new();
    if let Some(on) = vars.flag("LEMON_SMS_WEBHOOK_ENABLED")? {
        sms.push(("LEMON_SMS_WEBHOOK_ENABLED", &["enabled", "webhook_enabled"], on.into()));
    }
    if let Some(port) = vars.port("LEMON_SMS_WEBHOOK_PORT")? {
        sms.push(("LEMON_SMS_WEBHOOK_PORT", &["port", "webhook_port"], i64::from(port).into()));
    }
    if let Some(raw) = vars.text("LEMON_SMS_WEBHOOK_BIND") {
        let bind = reference_bind(raw).ok_or_else(|| {
            vars.error(
                "LEMON_SMS_WEBHOOK_BIND",
                "must be 127.0.0.1, localhost, 0.0.0.0, any or an IPv4 address",
            )
        })?;
        sms.push(("LEMON_SMS_WEBHOOK_BIND", &["bind", "webhook_bind"], bind.into()));
    }
    if let Some(ms) = vars.number("LEMON_SMS_INBOX_TTL_MS", 1, MAX_DURATION_MS)? {
        let ms = i64::try_from(ms).unwrap_or(i64::MAX);
        sms.push(("LEMON_SMS_INBOX_TTL_MS", &["inbox_ttl_ms"], ms.into()));
    }
    if let Some(number) = vars.text("TWILIO_INBOX_NUMBER") {
        if !crate::sms::is_e164(number) {
            return Err(vars.error(
                "TWILIO_INBOX_NUMBER",
                "is not an E.164 number (`+` and the country code, like +15551234567)",
            ));
        }
        sms.push(("TWILIO_INBOX_NUMBER", &["inbox_number"], number.into()));
    }
    if let Some(on) = vars.flag("TWILIO_VALIDATE_WEBHOOK")? {
        sms.push(("TWILIO_VALIDATE_WEBHOOK", &["validate_webhook"], on.into()));
    }
    if let Some(url) = vars.url("TWILIO_WEBHOOK_URL")? {
        sms.push(("TWILIO_WEBHOOK_URL", &["webhook_url", "public_url"], url.into()));
    }
    if !sms.is_empty() {
        let table = gateway.sms.get_or_insert_with(toml::Table::new);
        for (var, keys, value) in sms {
            for key in keys {
                table.remove(*key);
            }
            table.insert(keys[0].to_owned(), value);
            let in_section: Vec<Vec<&str>> = keys.iter().map(|key| vec!["sms", *key]).collect();
            let paths: Vec<&[&str]> = in_section.iter().map(Vec::as_slice).collect();
            overrides(var, &paths);
        }
    }

    // `[gateway.voice]`: fallbacks for what the section leaves unset.
    if let Some(table) = gateway.voice.as_mut() {
        let mut fill = |key: &str, value: toml::Value| {
            table.entry(key.to_owned()).or_insert(value);
        };
        if let Some(url) = vars.url("VOICE_PUBLIC_URL")? {
            fill("public_url", url.into());
        }
        if let Some(number) = vars.text("TWILIO_PHONE_NUMBER") {
            fill("twilio_phone_number", number.into());
        }
        if let Some(dir) = vars.text("VOICE_RECORDINGS_DIR") {
            fill("recordings_dir", dir.into());
        }
    }

    // `[gateway.xmtp]`: `"${VAR}"` is the variable's value.
    if let Some(table) = gateway.xmtp.as_mut() {
        for key in XMTP_SUBSTITUTED {
            let Some(name) = table.get(key).and_then(|v| v.as_str()).and_then(variable_name) else {
                continue;
            };
            let name = name.to_owned();
            match vars.text(&name) {
                Some(value) => {
                    table.insert(key.to_owned(), value.into());
                }
                None => {
                    table.remove(key);
                    notes.push(KeyNote::new(
                        &["gateway", "xmtp", key],
                        format!(
                            "the environment variable {name} is not set; the key is left unset"
                        ),
                    ));
                }
            }
        }
    }
    Ok(notes)
}

/// `NAME` of a value written `${NAME}` (spaces around it allowed).
fn variable_name(value: &str) -> Option<&str> {
    let name = value.trim().strip_prefix("${")?.strip_suffix('}')?;
    let valid = !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    valid.then_some(name)
}

/// The environment, read by kind; a blank value counts as unset.
struct Vars<'a> {
    env: &'a BTreeMap<String, String>,
}

impl Vars<'_> {
    fn text(&self, var: &str) -> Option<&str> {
        self.env.get(var).map(|v| v.trim()).filter(|v| !v.is_empty())
    }

    fn error(&self, var: &str, why: &str) -> EnvError {
        // Values here are settings, not secrets; a long one is cut.
        let value = self.text(var).unwrap_or_default();
        let shown: String = value.chars().take(80).collect();
        EnvError { var: var.to_owned(), message: format!("{shown:?} {why}") }
    }

    /// `1, true, yes, on` or `0, false, no, off`, in any case.
    fn flag(&self, var: &str) -> Result<Option<bool>, EnvError> {
        let Some(raw) = self.text(var) else { return Ok(None) };
        match raw.to_ascii_lowercase().as_str() {
            "1" | "true" | "yes" | "on" => Ok(Some(true)),
            "0" | "false" | "no" | "off" => Ok(Some(false)),
            _ => {
                Err(self.error(var, "is not a boolean (use 1, true, yes, on or 0, false, no, off)"))
            }
        }
    }

    fn number(&self, var: &str, min: u64, max: u64) -> Result<Option<u64>, EnvError> {
        let Some(raw) = self.text(var) else { return Ok(None) };
        match raw.parse::<u64>() {
            Ok(n) if (min..=max).contains(&n) => Ok(Some(n)),
            _ => Err(self.error(var, &format!("is not a whole number from {min} to {max}"))),
        }
    }

    fn port(&self, var: &str) -> Result<Option<u16>, EnvError> {
        let Some(raw) = self.text(var) else { return Ok(None) };
        raw.parse::<u16>()
            .map(Some)
            .map_err(|_| self.error(var, "is not a port (a whole number from 0 to 65535)"))
    }

    /// An `http://` or `https://` URL with a host, without spaces.
    fn url(&self, var: &str) -> Result<Option<&str>, EnvError> {
        let Some(raw) = self.text(var) else { return Ok(None) };
        let rest = raw.strip_prefix("https://").or_else(|| raw.strip_prefix("http://"));
        let host = rest.map(|rest| rest.split(['/', '?', '#']).next().unwrap_or_default());
        let valid = host.is_some_and(|host| !host.is_empty())
            && !raw.contains(char::is_whitespace)
            && !raw.contains('#');
        if valid {
            Ok(Some(raw))
        } else {
            Err(self.error(var, "is not an http(s) URL with a host"))
        }
    }
}

#[cfg(test)]
mod tests;
