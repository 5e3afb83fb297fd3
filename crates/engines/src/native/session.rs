//! Native sessions: the conversation of a session id (messages, tool calls and
//! their results), kept in the store's `native.session` records as JSON and
//! written after every model turn.
//!
//! A user message's images are kept by reference (`images: [{path, mime}]`),
//! never their bytes: loading a session reads the files again (within the
//! bounds of [`super::images`]), and those gone since are left out, their
//! paths still in the message's text.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use lemon_core::contain::OffLimits;
use lemon_core::engine::InvalidValue;
use lemon_core::store::StoreHandle;
use serde_json::{json, Value};

use super::images::{self, ImageRef, Room};
use crate::llm::{ChatMessage, ToolCall};

/// The store namespace of native sessions.
pub const NAMESPACE: &str = "native.session";

/// A fresh session id: a UUID v7 in its simple (32 hex digits) form.
pub fn new_id() -> String {
    uuid::Uuid::now_v7().simple().to_string()
}

/// A session id has the shape [`new_id`] gives: 32 lowercase hex digits.
///
/// # Errors
/// [`InvalidValue`] for anything else.
pub fn check_id(value: &str) -> Result<(), InvalidValue> {
    if value.is_empty() {
        return Err(InvalidValue::Empty);
    }
    if value.len() != 32 || !value.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        return Err(InvalidValue::Shape);
    }
    Ok(())
}

/// The JSON form of one message; a user message's images by their paths.
pub fn message_to_json(message: &ChatMessage) -> Value {
    match message {
        ChatMessage::User { text, images } => {
            let refs: Vec<Value> = images
                .iter()
                .filter_map(|image| {
                    let path = image.path.as_ref()?.to_str()?;
                    Some(json!({ "path": path, "mime": image.mime }))
                })
                .collect();
            if refs.is_empty() {
                json!({ "role": "user", "text": text })
            } else {
                json!({ "role": "user", "text": text, "images": refs })
            }
        }
        ChatMessage::Assistant { text, tool_calls } => json!({
            "role": "assistant",
            "text": text,
            "tool_calls": tool_calls
                .iter()
                .map(|c| json!({ "id": c.id, "name": c.name, "arguments": c.arguments }))
                .collect::<Vec<_>>(),
        }),
        ChatMessage::ToolResult { call_id, name, content, is_error } => json!({
            "role": "tool",
            "call_id": call_id,
            "name": name,
            "content": content,
            "is_error": is_error,
        }),
    }
}

fn text(value: &Value, key: &str) -> Option<String> {
    value.get(key)?.as_str().map(str::to_owned)
}

/// The images a message's JSON form names (a user message's; entries that
/// are not `{path, mime}` are skipped).
pub fn image_refs(value: &Value) -> Vec<ImageRef> {
    let refs = value.get("images").and_then(Value::as_array);
    refs.into_iter()
        .flatten()
        .filter_map(|image| {
            Some(ImageRef { path: text(image, "path")?.into(), mime: text(image, "mime")? })
        })
        .collect()
}

/// A message back from its JSON form; `None` when it is not one. A user
/// message comes back without its images: [`image_refs`] names them, and
/// [`Sessions::load`] reads them.
pub fn message_from_json(value: &Value) -> Option<ChatMessage> {
    match value.get("role")?.as_str()? {
        "user" => Some(ChatMessage::user(text(value, "text")?)),
        "assistant" => {
            let calls = value.get("tool_calls").and_then(Value::as_array);
            let tool_calls = calls
                .into_iter()
                .flatten()
                .map(|c| {
                    Some(ToolCall {
                        id: text(c, "id")?,
                        name: text(c, "name")?,
                        arguments: text(c, "arguments")?,
                    })
                })
                .collect::<Option<Vec<_>>>()?;
            Some(ChatMessage::Assistant { text: text(value, "text")?, tool_calls })
        }
        "tool" => Some(ChatMessage::ToolResult {
            call_id: text(value, "call_id")?,
            name: text(value, "name")?,
            content: text(value, "content")?,
            is_error: value.get("is_error")?.as_bool()?,
        }),
        _ => None,
    }
}

/// Why a session could not be loaded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LoadError {
    #[error("no lemon session {0}")]
    Missing(String),
    #[error("lemon session {0} is unreadable")]
    Invalid(String),
}

/// Where sessions live: the gateway's store, or memory when there is none.
#[derive(Debug, Clone)]
pub enum Sessions {
    Store(StoreHandle),
    Memory(Arc<Mutex<BTreeMap<String, Value>>>),
}

impl Sessions {
    pub fn new(store: Option<StoreHandle>) -> Self {
        match store {
            Some(store) => Sessions::Store(store),
            None => Sessions::Memory(Arc::default()),
        }
    }

    /// Writes the conversation of session `id`.
    pub async fn save(&self, id: &str, messages: &[ChatMessage]) {
        let value = json!({
            "version": 1,
            "updated_at_ms": lemon_core::clock::now_ms(),
            "messages": messages.iter().map(message_to_json).collect::<Vec<_>>(),
        });
        match self {
            Sessions::Store(store) => store.kv_put(NAMESPACE, id, value, None).await,
            Sessions::Memory(map) => {
                map.lock().unwrap_or_else(|e| e.into_inner()).insert(id.to_owned(), value);
            }
        }
    }

    /// The conversation of session `id`. With `read_images` (vision is on), the
    /// images its messages name are read again, without any in the gateway's
    /// state, the newest first while a request has room for them (those of
    /// older messages are left out past that, as files gone since are);
    /// without, no image is read.
    ///
    /// # Errors
    /// [`LoadError`] when there is no such session or it cannot be read.
    pub async fn load(
        &self,
        id: &str,
        read_images: Option<&OffLimits>,
    ) -> Result<Vec<ChatMessage>, LoadError> {
        let value = match self {
            Sessions::Store(store) => store
                .kv_get(NAMESPACE, id, lemon_core::clock::now_ms())
                .await
                .map_err(|_| LoadError::Invalid(id.to_owned()))?,
            Sessions::Memory(map) => map.lock().unwrap_or_else(|e| e.into_inner()).get(id).cloned(),
        };
        let value = value.ok_or_else(|| LoadError::Missing(id.to_owned()))?;
        let records = value
            .get("messages")
            .and_then(Value::as_array)
            .ok_or_else(|| LoadError::Invalid(id.to_owned()))?;
        let mut messages: Vec<ChatMessage> = records
            .iter()
            .map(message_from_json)
            .collect::<Option<_>>()
            .ok_or_else(|| LoadError::Invalid(id.to_owned()))?;
        if let Some(off_limits) = read_images {
            let mut room = Room::REQUEST;
            for (message, record) in messages.iter_mut().zip(records).rev() {
                let refs = image_refs(record);
                if refs.is_empty() {
                    continue;
                }
                if let ChatMessage::User { images: shown, .. } = message {
                    *shown = images::read(refs, off_limits, &mut room).await;
                }
            }
        }
        Ok(messages)
    }
}
