//! Identifier newtypes: runs, conversations and engines.

use std::borrow::Borrow;
use std::fmt;
use std::sync::Arc;

use crate::engine::validate::{check_model, InvalidValue, MAX_MODEL_LEN};

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

/// Why a session key was refused by [`SessionKey::parse`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SessionKeyError {
    /// A newline, tab or other control character, which would let the key forge
    /// log lines and status output. The message does not repeat the key.
    #[error("invalid session_key: control characters are not allowed")]
    ControlCharacter,
}

impl SessionKey {
    /// A key from outside (an API path or body). Keys with control characters are
    /// refused; anything else is the key as given (the router reads a blank key
    /// as the `default` session).
    ///
    /// # Errors
    /// [`SessionKeyError`] saying why the key was refused.
    pub fn parse(raw: &str) -> Result<Self, SessionKeyError> {
        if raw.chars().any(char::is_control) {
            return Err(SessionKeyError::ControlCharacter);
        }
        Ok(SessionKey(raw.into()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for SessionKey {
    fn as_ref(&self) -> &str {
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

// Serialised as the plain string it holds, as stored rows and JSON bodies have
// always carried it.
impl serde::Serialize for SessionKey {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

impl<'de> serde::Deserialize<'de> for SessionKey {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        Ok(SessionKey(raw.as_ref().into()))
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

    /// An id written in the source (`echo`, `lemon`), which has the right shape.
    pub fn builtin(id: &'static str) -> Self {
        debug_assert!(EngineId::parse(id).is_ok(), "{id} is not an engine id");
        EngineId(id.into())
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

/// A model name as an engine's command line takes it, checked by
/// [`check_model`] (`opus`,
/// `anthropic/claude-sonnet-4-5`). Cheap to clone.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Model(Arc<str>);

impl Model {
    /// # Errors
    /// [`InvalidValue`] saying what is wrong with the name.
    pub fn parse(raw: &str) -> Result<Self, InvalidValue> {
        check_model(raw)?;
        Ok(Model(raw.into()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::ops::Deref for Model {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Model {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Model {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Model({})", self.0)
    }
}

/// Why an engine reference was refused by [`EngineRef::parse`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EngineRefError {
    /// The part before `:` is not an engine id.
    #[error(transparent)]
    Id(#[from] EngineIdError),
    /// `claude:` with nothing after the colon.
    #[error("engine {0:?} has an empty model after `:`")]
    EmptyModel(String),
    /// The part after `:` is not a safe model name. The message does not repeat it.
    #[error("invalid model: {0}; use up to {MAX_MODEL_LEN} ASCII letters, digits and `._:/@-`, not starting with `-`")]
    Model(InvalidValue),
}

/// An engine and, optionally, the model it runs with: `claude` or `claude:opus`.
/// Parsed once where a request, a directive or the config names an engine, and
/// carried typed from there to the engine; the composite text is its
/// [`Display`](fmt::Display) and serde form. Cheap to clone.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EngineRef {
    id: EngineId,
    model: Option<Model>,
}

impl EngineRef {
    /// `<id>` or `<id>:<model>`.
    ///
    /// # Errors
    /// [`EngineRefError`] naming the part that was refused.
    pub fn parse(raw: &str) -> Result<Self, EngineRefError> {
        let (id, model) = match raw.split_once(':') {
            Some((id, model)) => (id, Some(model)),
            None => (raw, None),
        };
        let id = EngineId::parse(id)?;
        let model = match model {
            None => None,
            Some(m) if m.trim().is_empty() => {
                return Err(EngineRefError::EmptyModel(raw.to_owned()))
            }
            Some(m) => Some(Model::parse(m).map_err(EngineRefError::Model)?),
        };
        Ok(EngineRef { id, model })
    }

    /// The engine itself, with no model.
    pub fn new(id: EngineId) -> Self {
        EngineRef { id, model: None }
    }

    pub fn with_model(id: EngineId, model: Option<Model>) -> Self {
        EngineRef { id, model }
    }

    pub fn id(&self) -> &EngineId {
        &self.id
    }

    pub fn model(&self) -> Option<&Model> {
        self.model.as_ref()
    }

    /// Whether this names the engine `id`, whatever the model.
    pub fn is(&self, id: &str) -> bool {
        self.id.as_str() == id
    }
}

impl From<EngineId> for EngineRef {
    fn from(id: EngineId) -> Self {
        EngineRef::new(id)
    }
}

impl std::str::FromStr for EngineRef {
    type Err = EngineRefError;

    fn from_str(raw: &str) -> Result<Self, Self::Err> {
        EngineRef::parse(raw)
    }
}

impl fmt::Display for EngineRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.model {
            Some(model) => write!(f, "{}:{model}", self.id),
            None => f.write_str(self.id.as_str()),
        }
    }
}

impl fmt::Debug for EngineRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "EngineRef({self})")
    }
}

impl PartialEq<str> for EngineRef {
    fn eq(&self, other: &str) -> bool {
        match (other.split_once(':'), &self.model) {
            (None, None) => self.id.as_str() == other,
            (Some((id, model)), Some(own)) => self.id.as_str() == id && own.as_str() == model,
            _ => false,
        }
    }
}

impl PartialEq<&str> for EngineRef {
    fn eq(&self, other: &&str) -> bool {
        self == *other
    }
}

impl serde::Serialize for EngineRef {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for EngineRef {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        EngineRef::parse(&raw).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests;
