//! Identifier newtypes: runs, conversations and engines.

use std::borrow::Borrow;
use std::fmt;
use std::sync::Arc;

/// A run's id, `run_<uuid>` when the gateway makes it, or whatever non-empty id a
/// caller supplied. Cheap to clone.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RunId(Arc<str>);

impl RunId {
    /// A fresh id. Time-ordered (UUIDv7), so ids created one after another sort
    /// together, which keeps the store's run index append-mostly.
    pub fn generate() -> Self {
        RunId(format!("run_{}", uuid::Uuid::now_v7()).into())
    }

    /// A caller-supplied id; blank ids are refused.
    pub fn parse(raw: &str) -> Option<Self> {
        let trimmed = raw.trim();
        let valid = !trimmed.is_empty()
            && trimmed.len() <= 128
            && trimmed
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | ':' | '.'));
        valid.then(|| RunId(trimmed.into()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

// Hash, Eq and Ord of the derived impls are those of the `str`, so maps keyed by
// ids can be searched with a plain `&str`.
impl Borrow<str> for RunId {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for RunId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for RunId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RunId({})", self.0)
    }
}

/// A session's key as the caller named it (a chat, an API caller's `session_key`):
/// the session's chat state, `/engine` choice and default conversation hang off it.
/// Cheap to clone; reads as the `str` it holds.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SessionKey(Arc<str>);

impl SessionKey {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::ops::Deref for SessionKey {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

impl Borrow<str> for SessionKey {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl From<&str> for SessionKey {
    fn from(raw: &str) -> Self {
        SessionKey(raw.into())
    }
}

impl From<String> for SessionKey {
    fn from(raw: String) -> Self {
        SessionKey(raw.into())
    }
}

impl PartialEq<str> for SessionKey {
    fn eq(&self, other: &str) -> bool {
        &*self.0 == other
    }
}

impl PartialEq<&str> for SessionKey {
    fn eq(&self, other: &&str) -> bool {
        &*self.0 == *other
    }
}

impl fmt::Display for SessionKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for SessionKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SessionKey({})", self.0)
    }
}

/// The key that orders work: requests with the same key run one at a time, in
/// submission order. `session:<session_key>` or `resume:<engine>:<token>`.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConversationKey(Arc<str>);

impl ConversationKey {
    /// The conversation of a session; a blank session key is the `default` session.
    pub fn session(session_key: &str) -> Self {
        let key = if session_key.trim().is_empty() { "default" } else { session_key };
        ConversationKey(format!("session:{key}").into())
    }

    /// The conversation that continues an explicit resume token.
    pub fn resume(engine: &str, token: &str) -> Self {
        ConversationKey(format!("resume:{engine}:{token}").into())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ConversationKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for ConversationKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ConversationKey({})", self.0)
    }
}

/// Why an engine id was refused by [`EngineId::parse`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EngineIdError {
    #[error("invalid engine id {0:?}: must match ^[a-z][a-z0-9_-]*$")]
    Invalid(String),
    #[error("engine id {0:?} is reserved")]
    Reserved(String),
}

/// A validated engine id: `^[a-z][a-z0-9_-]*$`, not `default` or `help`.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EngineId(Arc<str>);

impl EngineId {
    /// # Errors
    /// [`EngineIdError`] when the id has the wrong shape or is reserved.
    pub fn parse(raw: &str) -> Result<Self, EngineIdError> {
        let mut chars = raw.chars();
        let first_ok = chars.next().is_some_and(|c| c.is_ascii_lowercase());
        let rest_ok =
            chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-');
        if !first_ok || !rest_ok {
            return Err(EngineIdError::Invalid(raw.to_owned()));
        }
        if matches!(raw, "default" | "help") {
            return Err(EngineIdError::Reserved(raw.to_owned()));
        }
        Ok(EngineId(raw.into()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Borrow<str> for EngineId {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for EngineId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for EngineId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "EngineId({})", self.0)
    }
}

#[cfg(test)]
mod tests;
