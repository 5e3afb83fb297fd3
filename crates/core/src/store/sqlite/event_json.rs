//! Writes the JSON text of [`BusEvent::to_json`] straight into a buffer.
//!
//! `to_json` builds a `serde_json::Value` (a map with an allocated key per field) only
//! to have it turned into text, which was a quarter of the writer thread's time per
//! run. This writes the same object directly. The tests hold it to `to_json`: for
//! every kind of event, the stored text parses back to exactly `to_json()`, so a
//! change to one without the other fails them.

use serde::ser::{Serialize, SerializeMap, Serializer};

use crate::bus::{BusEvent, EventKind, RunStatus};
use crate::engine::{Action, Completion, ResumeToken, RunError};

/// Appends the JSON of `event` to `buf`; the text equals `event.to_json()` once parsed.
///
/// # Errors
/// Only if a nested `serde_json::Value` cannot be written, which it always can.
pub(super) fn write(buf: &mut Vec<u8>, event: &BusEvent) -> serde_json::Result<()> {
    let mut serializer = serde_json::Serializer::new(buf);
    let mut map = serializer.serialize_map(None)?;
    match &event.kind {
        EventKind::RunStarted { engine, model } => {
            map.serialize_entry("engine", engine)?;
            map.serialize_entry("model", model)?;
        }
        EventKind::EngineStarted { resume, title, meta } => {
            map.serialize_entry("resume", &Resume(resume.as_ref()))?;
            map.serialize_entry("title", title)?;
            map.serialize_entry("meta", meta)?;
        }
        EventKind::EngineAction(action) => map.serialize_entry("action", &ActionBody(action))?,
        EventKind::Delta { seq, text } => {
            map.serialize_entry("seq", seq)?;
            map.serialize_entry("text", text)?;
        }
        EventKind::EngineCompleted(completion) => completion_entries(&mut map, completion)?,
        EventKind::RunCompleted { completion, engine, duration_ms } => {
            completion_entries(&mut map, completion)?;
            map.serialize_entry("engine", engine)?;
            map.serialize_entry("duration_ms", duration_ms)?;
            map.serialize_entry("status", RunStatus::of(completion).as_str())?;
        }
        EventKind::Phase(phase) => map.serialize_entry("phase", phase.as_str())?,
        EventKind::Status(status) => map.serialize_entry("status", status.as_str())?,
    }
    map.serialize_entry("type", event.kind.type_name())?;
    map.serialize_entry("run_id", event.run_id.as_str())?;
    map.serialize_entry("session_key", &*event.session_key)?;
    map.serialize_entry("index", &event.index)?;
    map.serialize_entry("ts_ms", &event.ts_ms)?;
    map.end()
}

/// The fields of `bus::completion_json`.
fn completion_entries<M: SerializeMap>(
    map: &mut M,
    completion: &Completion,
) -> Result<(), M::Error> {
    map.serialize_entry("ok", &completion.ok)?;
    map.serialize_entry("answer", &completion.answer)?;
    map.serialize_entry("error", &ErrorText(completion.error.as_ref()))?;
    map.serialize_entry("error_code", &completion.error.as_ref().map(RunError::code))?;
    map.serialize_entry("resume", &Resume(completion.resume.as_ref()))?;
    map.serialize_entry("usage", &completion.usage)
}

/// `bus::resume_json`: `{engine, value}` or `null`.
struct Resume<'a>(Option<&'a ResumeToken>);

impl Serialize for Resume<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let Some(token) = self.0 else { return serializer.serialize_none() };
        let mut map = serializer.serialize_map(Some(2))?;
        map.serialize_entry("engine", &token.engine)?;
        map.serialize_entry("value", &token.value)?;
        map.end()
    }
}

/// An error's display text, written without building the `String` first.
struct ErrorText<'a>(Option<&'a RunError>);

impl Serialize for ErrorText<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self.0 {
            Some(error) => serializer.collect_str(error),
            None => serializer.serialize_none(),
        }
    }
}

/// `bus::action_json`.
struct ActionBody<'a>(&'a Action);

impl Serialize for ActionBody<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let action = self.0;
        let mut map = serializer.serialize_map(Some(8))?;
        map.serialize_entry("id", &action.id)?;
        map.serialize_entry("kind", action.kind.as_str())?;
        map.serialize_entry("title", &action.title)?;
        map.serialize_entry("detail", &action.detail)?;
        map.serialize_entry("phase", action.phase.as_str())?;
        map.serialize_entry("ok", &action.ok)?;
        map.serialize_entry("message", &action.message)?;
        map.serialize_entry("level", &action.level)?;
        map.end()
    }
}

#[cfg(test)]
mod tests;
