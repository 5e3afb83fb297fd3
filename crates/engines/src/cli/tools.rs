//! The shared tool classification: which [`ActionKind`] a vendor's tool call is and
//! how its title reads (`ls -la`, ``read: `src/main.rs` ``, `Survey repo`), plus the
//! short preview of a tool's result.

use std::path::Path;

use lemon_core::engine::ActionKind;
use serde_json::Value;

use super::translate::head_chars;

/// Command titles are cut to this many characters.
const COMMAND_TITLE_CHARS: usize = 80;
/// Result previews are cut to this many characters.
pub(crate) const RESULT_PREVIEW_CHARS: usize = 200;

/// The kind and title of a call to tool `name` with `input`. File paths are read
/// from the first of `path_keys` that is set and shown relative to `cwd` when they
/// are inside it.
pub(crate) fn classify(
    name: &str,
    input: &Value,
    path_keys: &[&str],
    cwd: Option<&Path>,
) -> (ActionKind, String) {
    let lower = name.to_lowercase();
    let text = |key: &str| input.get(key).and_then(Value::as_str).filter(|s| !s.is_empty());
    let path = || path_keys.iter().find_map(|key| text(key)).map(|path| relativize(path, cwd));
    match lower.as_str() {
        "bash" | "shell" | "killshell" => {
            let command = text("command").or_else(|| text("cmd")).unwrap_or(name);
            (ActionKind::Command, head_chars(command, COMMAND_TITLE_CHARS).to_owned())
        }
        "edit" | "write" | "multiedit" | "notebookedit" => {
            (ActionKind::FileChange, path().unwrap_or_else(|| name.to_owned()))
        }
        "read" | "read_file" => {
            (ActionKind::Tool, path().map_or_else(|| "read".to_owned(), |p| format!("read: `{p}`")))
        }
        "glob" => (
            ActionKind::Tool,
            text("pattern").map_or_else(|| "glob".to_owned(), |p| format!("glob: `{p}`")),
        ),
        "grep" => (
            ActionKind::Tool,
            text("pattern").map_or_else(|| "grep".to_owned(), |p| format!("grep: {p}")),
        ),
        "find" => (
            ActionKind::Tool,
            text("pattern").map_or_else(|| "find".to_owned(), |p| format!("find: {p}")),
        ),
        "ls" | "list" => {
            let path = path().or_else(|| text("path").map(|p| relativize(p, cwd)));
            (ActionKind::Tool, path.map_or_else(|| "ls".to_owned(), |p| format!("ls: `{p}`")))
        }
        "websearch" | "web_search" => {
            (ActionKind::WebSearch, text("query").unwrap_or(name).to_owned())
        }
        "webfetch" | "web_fetch" | "fetch" => {
            (ActionKind::WebSearch, text("url").unwrap_or(name).to_owned())
        }
        "task" | "agent" => {
            let what = text("description").or_else(|| text("prompt")).unwrap_or(name);
            let title = match text("model") {
                Some(model) => format!("{what} ({model})"),
                None => what.to_owned(),
            };
            (ActionKind::Subagent, title)
        }
        _ => (ActionKind::Tool, name.to_owned()),
    }
}

/// The file path of a tool input, as given (not relativized).
pub(crate) fn input_path<'a>(input: &'a Value, path_keys: &[&str]) -> Option<&'a str> {
    path_keys
        .iter()
        .find_map(|key| input.get(*key).and_then(Value::as_str).filter(|s| !s.is_empty()))
}

/// `path` relative to `cwd` when it lies inside it; otherwise unchanged.
pub(crate) fn relativize(path: &str, cwd: Option<&Path>) -> String {
    let Some(cwd) = cwd else { return path.to_owned() };
    match Path::new(path).strip_prefix(cwd) {
        Ok(rel) if !rel.as_os_str().is_empty() => rel.to_string_lossy().into_owned(),
        _ => path.to_owned(),
    }
}

/// A tool result as short text: strings as they are, the text items of a list
/// joined by newlines, the `text` or `content` of an object; anything else as JSON.
/// Cut to [`RESULT_PREVIEW_CHARS`].
pub(crate) fn result_preview(result: &Value) -> String {
    head_chars(&result_text(result), RESULT_PREVIEW_CHARS).to_owned()
}

fn result_text(result: &Value) -> String {
    match result {
        Value::Null => String::new(),
        Value::String(text) => text.clone(),
        Value::Array(items) => items
            .iter()
            .filter_map(|item| match item {
                Value::String(text) => Some(text.clone()),
                Value::Object(map) => map.get("text").and_then(Value::as_str).map(str::to_owned),
                _ => None,
            })
            .collect::<Vec<_>>()
            .join("\n"),
        Value::Object(map) => match map.get("text").or_else(|| map.get("content")) {
            Some(inner) => result_text(inner),
            None => result.to_string(),
        },
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests;
