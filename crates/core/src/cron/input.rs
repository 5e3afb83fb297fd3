//! New jobs and edits from JSON objects, as the control API and the `cron`
//! tool receive them: camelCase keys (`sessionKey`, `jitterSec`…) with their
//! snake_case spellings, and `message` for `prompt`.

use serde_json::{Map, Value};

use super::{JobPatch, JobSpec};
use crate::ids::SessionKey;

/// Why an object is not a job or an edit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InputError {
    /// A required field is absent (its camelCase name).
    #[error("{0} is required")]
    Missing(&'static str),
    /// A field has the wrong type or shape.
    #[error("{field} {why}")]
    Invalid { field: &'static str, why: &'static str },
    #[error("sessionKey must be a valid Lemon session key")]
    SessionKey,
}

/// The first of `names` that `obj` has with a non-null value.
fn field<'a>(obj: &'a Map<String, Value>, names: &[&str]) -> Option<&'a Value> {
    names.iter().find_map(|name| obj.get(*name).filter(|v| !v.is_null()))
}

fn text(
    obj: &Map<String, Value>,
    names: &[&str],
    field_name: &'static str,
) -> Result<Option<String>, InputError> {
    match field(obj, names) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(InputError::Invalid { field: field_name, why: "must be a string" }),
    }
}

fn boolean(
    obj: &Map<String, Value>,
    names: &[&str],
    field_name: &'static str,
) -> Result<Option<bool>, InputError> {
    match field(obj, names) {
        None => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(InputError::Invalid { field: field_name, why: "must be true or false" }),
    }
}

fn count(
    obj: &Map<String, Value>,
    names: &[&str],
    field_name: &'static str,
) -> Result<Option<u64>, InputError> {
    match field(obj, names) {
        None => Ok(None),
        Some(value) => value.as_u64().map(Some).ok_or(InputError::Invalid {
            field: field_name,
            why: "must be a non-negative integer",
        }),
    }
}

fn object(
    obj: &Map<String, Value>,
    names: &[&str],
    field_name: &'static str,
) -> Result<Option<Value>, InputError> {
    match field(obj, names) {
        None => Ok(None),
        Some(value @ Value::Object(_)) => Ok(Some(value.clone())),
        Some(_) => Err(InputError::Invalid { field: field_name, why: "must be an object" }),
    }
}

fn session_key(obj: &Map<String, Value>) -> Result<Option<SessionKey>, InputError> {
    match text(obj, &["sessionKey", "session_key"], "sessionKey")? {
        None => Ok(None),
        Some(raw) if raw.trim().is_empty() => Err(InputError::SessionKey),
        Some(raw) => SessionKey::parse(raw.trim()).map(Some).map_err(|_| InputError::SessionKey),
    }
}

fn retries(obj: &Map<String, Value>) -> Result<Option<u32>, InputError> {
    count(obj, &["maxRetries", "max_retries"], "maxRetries")?
        .map(|n| {
            u32::try_from(n)
                .map_err(|_| InputError::Invalid { field: "maxRetries", why: "is too large" })
        })
        .transpose()
}

/// The session of a job that names none: `agent:<agent>:main`.
pub fn default_session(agent_id: Option<&str>) -> SessionKey {
    SessionKey::from(format!("agent:{}:main", agent_id.unwrap_or(super::DEFAULT_AGENT)))
}

/// A new job from `obj`; `schedule` and `prompt` (or `message`) are required.
///
/// # Errors
/// [`InputError`] naming the missing or malformed field.
pub fn spec_from_json(obj: &Map<String, Value>) -> Result<JobSpec, InputError> {
    let schedule = text(obj, &["schedule"], "schedule")?.filter(|s| !s.trim().is_empty());
    let schedule = schedule.ok_or(InputError::Missing("schedule"))?;
    let prompt = text(obj, &["prompt", "message"], "prompt")?.filter(|s| !s.trim().is_empty());
    let prompt = prompt.ok_or(InputError::Missing("prompt"))?;
    let agent_id = text(obj, &["agentId", "agent_id"], "agentId")?;
    let session_key = match session_key(obj)? {
        Some(key) => key,
        None => default_session(agent_id.as_deref()),
    };
    Ok(JobSpec {
        name: text(obj, &["name"], "name")?,
        schedule,
        prompt,
        session_key,
        agent_id,
        memory_file: text(obj, &["memoryFile", "memory_file"], "memoryFile")?,
        timezone: text(obj, &["timezone", "tz"], "timezone")?,
        enabled: boolean(obj, &["enabled"], "enabled")?,
        jitter_sec: count(obj, &["jitterSec", "jitter_sec"], "jitterSec")?,
        timeout_ms: count(obj, &["timeoutMs", "timeout_ms"], "timeoutMs")?,
        max_retries: retries(obj)?,
        retry_backoff_ms: count(obj, &["retryBackoffMs", "retry_backoff_ms"], "retryBackoffMs")?,
        meta: object(obj, &["meta"], "meta")?,
    })
}

/// An edit from `obj`: every field it has.
///
/// # Errors
/// [`InputError`] naming the malformed field.
pub fn patch_from_json(obj: &Map<String, Value>) -> Result<JobPatch, InputError> {
    Ok(JobPatch {
        name: text(obj, &["name"], "name")?,
        schedule: text(obj, &["schedule"], "schedule")?,
        prompt: text(obj, &["prompt", "message"], "prompt")?,
        session_key: session_key(obj)?,
        agent_id: text(obj, &["agentId", "agent_id"], "agentId")?,
        memory_file: text(obj, &["memoryFile", "memory_file"], "memoryFile")?,
        timezone: text(obj, &["timezone", "tz"], "timezone")?,
        enabled: boolean(obj, &["enabled"], "enabled")?,
        jitter_sec: count(obj, &["jitterSec", "jitter_sec"], "jitterSec")?,
        timeout_ms: count(obj, &["timeoutMs", "timeout_ms"], "timeoutMs")?,
        max_retries: retries(obj)?,
        retry_backoff_ms: count(obj, &["retryBackoffMs", "retry_backoff_ms"], "retryBackoffMs")?,
        meta: object(obj, &["meta"], "meta")?,
    })
}
