//! The one JSON form of an event, used by the bus's subscribers (SSE, webhook
//! callbacks) and the store alike.
//!
//! [`EventJson`] serialises an event straight to its text: the store writes it into
//! its buffer without building a `serde_json::Value` (a map with an allocated key
//! per field, once a quarter of the writer thread's time per run), and
//! [`BusEvent::to_json`](super::BusEvent::to_json) makes the `Value` from the same
//! code. Stored events of every earlier version have this form; the tests hold it to
//! the field list written out by hand.

use serde::ser::{Serialize, SerializeMap, SerializeSeq, Serializer};

use crate::artifacts::Artifact;

use crate::bus::{BusEvent, EventKind, RunStatus};
use crate::engine::{Action, Completion, ResumeToken, RunError};

/// An event in its JSON form (`{type, run_id, session_key, index, ts_ms, …}`).
#[derive(Debug, Clone, Copy)]
pub struct EventJson<'a>(pub &'a BusEvent);

impl Serialize for EventJson<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let event = self.0;
        let mut map = serializer.serialize_map(None)?;
        event_entries(&mut map, event)?;
        map.end()
    }
}

/// A completion in its JSON form (`{ok, answer, error, error_code, resume, usage,
/// artifacts}`).
#[derive(Debug, Clone, Copy)]
pub struct CompletionJson<'a>(pub &'a Completion);

impl Serialize for CompletionJson<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(7))?;
        completion_entries(&mut map, self.0)?;
        map.end()
    }
}

fn event_entries<M: SerializeMap>(map: &mut M, event: &BusEvent) -> Result<(), M::Error> {
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
        EventKind::EngineAction(action) => map.serialize_entry("action", &ActionJson(action))?,
        EventKind::Delta { seq, text } => {
            map.serialize_entry("seq", seq)?;
            map.serialize_entry("text", text)?;
        }
        EventKind::EngineCompleted(completion) => completion_entries(map, completion)?,
        EventKind::RunCompleted { completion, engine, duration_ms } => {
            completion_entries(map, completion)?;
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
    map.serialize_entry("ts_ms", &event.ts_ms)
}

/// The fields of a completion.
fn completion_entries<M: SerializeMap>(
    map: &mut M,
    completion: &Completion,
) -> Result<(), M::Error> {
    map.serialize_entry("ok", &completion.ok)?;
    map.serialize_entry("answer", &completion.answer)?;
    map.serialize_entry("error", &ErrorText(completion.error.as_ref()))?;
    map.serialize_entry("error_code", &completion.error.as_ref().map(RunError::code))?;
    map.serialize_entry("resume", &Resume(completion.resume.as_ref()))?;
    map.serialize_entry("usage", &completion.usage)?;
    map.serialize_entry("artifacts", &Artifacts(&completion.artifacts))?;
    match &completion.retried_by {
        Some(retry) => map.serialize_entry("retried_by", retry.as_str()),
        None => Ok(()),
    }
}

/// The files of an answer: `[{path, filename, caption, size, mime}]`.
struct Artifacts<'a>(&'a [Artifact]);

impl Serialize for Artifacts<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut seq = serializer.serialize_seq(Some(self.0.len()))?;
        for artifact in self.0 {
            seq.serialize_element(&ArtifactJson(artifact))?;
        }
        seq.end()
    }
}

/// One file of an answer in its JSON form (`{path, filename, caption, size, mime}`).
#[derive(Debug, Clone, Copy)]
pub struct ArtifactJson<'a>(pub &'a Artifact);

impl Serialize for ArtifactJson<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let artifact = self.0;
        let mut map = serializer.serialize_map(Some(5))?;
        map.serialize_entry("path", &artifact.path.to_string_lossy())?;
        map.serialize_entry("filename", &artifact.filename)?;
        map.serialize_entry("caption", &artifact.caption)?;
        map.serialize_entry("size", &artifact.size)?;
        map.serialize_entry("mime", artifact.mime())?;
        map.end()
    }
}

/// An artifact back from its JSON form; `None` for an entry without a path or name.
pub fn artifact_from_json(value: &serde_json::Value) -> Option<Artifact> {
    let text = |key: &str| value.get(key).and_then(serde_json::Value::as_str);
    Some(Artifact {
        path: text("path")?.into(),
        filename: text("filename")?.to_owned(),
        caption: text("caption").map(str::to_owned),
        size: value.get("size").and_then(serde_json::Value::as_u64).unwrap_or(0),
    })
}

/// A resume token: `{engine, value}` or `null`.
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

/// An action in its JSON form (`{id, kind, title, detail, phase, ok, message, level,
/// result_meta}`).
#[derive(Debug, Clone, Copy)]
pub struct ActionJson<'a>(pub &'a Action);

impl Serialize for ActionJson<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let action = self.0;
        let mut map = serializer.serialize_map(Some(9))?;
        map.serialize_entry("id", &action.id)?;
        map.serialize_entry("kind", action.kind.as_str())?;
        map.serialize_entry("title", &action.title)?;
        map.serialize_entry("detail", &action.detail)?;
        map.serialize_entry("phase", action.phase.as_str())?;
        map.serialize_entry("ok", &action.ok)?;
        map.serialize_entry("message", &action.message)?;
        map.serialize_entry("level", &action.level)?;
        map.serialize_entry("result_meta", &action.result_meta)?;
        map.end()
    }
}

#[cfg(test)]
mod tests;
