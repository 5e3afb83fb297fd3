//! `read`, `write`, `edit` and `list`: files in the run's cwd or workspace.

use std::io::{BufRead, Read as _};
use std::sync::Arc;

use async_trait::async_trait;
use lemon_core::tool::{Tool, ToolContext, ToolOutput, ToolSpec};
use serde_json::{json, Value};

use super::args::Args;
use super::{contained, cut, looks_like_text, shown, BuiltinOptions};

/// How much of a file is looked at to tell text from binary.
const SNIFF_BYTES: usize = 8 * 1024;

/// Runs blocking file work off the async threads; a panic in it is an error
/// result, not a crash.
pub(super) async fn blocking<F>(work: F) -> ToolOutput
where
    F: FnOnce() -> Result<ToolOutput, String> + Send + 'static,
{
    match tokio::task::spawn_blocking(work).await {
        Ok(Ok(output)) => output,
        Ok(Err(message)) => ToolOutput::error(message),
        Err(err) => ToolOutput::error(format!("the tool failed: {err}")),
    }
}

/// The file at `raw` as text, refused when it is missing, not a regular file,
/// larger than `max` or binary.
fn read_text(
    ctx: &ToolContext,
    raw: &str,
    max: u64,
) -> Result<(std::path::PathBuf, String), String> {
    let path = contained(ctx, raw)?;
    let meta = std::fs::metadata(&path).map_err(|err| format!("{raw}: {err}"))?;
    if !meta.is_file() {
        return Err(format!("{raw} is not a regular file"));
    }
    if meta.len() > max {
        return Err(format!("{raw} is {} bytes, over the {max}-byte limit", meta.len()));
    }
    let bytes = std::fs::read(&path).map_err(|err| format!("{raw}: {err}"))?;
    if bytes.contains(&0) {
        return Err(format!("{raw} is a binary file"));
    }
    let text = String::from_utf8(bytes).map_err(|_| format!("{raw} is not UTF-8 text"))?;
    Ok((path, text))
}

/// `read`: lines of a text file.
#[derive(Debug)]
pub(super) struct Read {
    options: Arc<BuiltinOptions>,
}

impl Read {
    pub(super) fn new(options: Arc<BuiltinOptions>) -> Self {
        Read { options }
    }
}

#[async_trait]
impl Tool for Read {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "read".to_owned(),
            description: format!(
                "Read a text file in the working directory or workspace. Returns its lines as \
                 they are; by default the first {} lines, `offset` (1-based line number) and \
                 `limit` page through longer files. Binary files are refused.",
                self.options.read_default_lines
            ),
            parameters: json!({
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "File path, relative to the working directory"},
                    "offset": {"type": "integer", "minimum": 1, "description": "First line to return (1-based)"},
                    "limit": {"type": "integer", "minimum": 1, "description": "Number of lines to return"}
                },
                "required": ["path"],
                "additionalProperties": false
            }),
        }
    }

    async fn execute(&self, args: Value, ctx: ToolContext) -> ToolOutput {
        let options = self.options.clone();
        blocking(move || read(&options, &args, &ctx)).await
    }
}

fn read(options: &BuiltinOptions, args: &Value, ctx: &ToolContext) -> Result<ToolOutput, String> {
    let args = Args::new(args)?;
    let raw = args.required_str("path")?;
    let offset = args.uint("offset")?.unwrap_or(1).max(1);
    let limit = args.uint("limit")?.map_or(options.read_default_lines, |n| n as usize).max(1);
    let path = contained(ctx, &raw)?;
    let meta = std::fs::metadata(&path).map_err(|err| format!("{raw}: {err}"))?;
    if meta.is_dir() {
        return Err(format!("{raw} is a directory; use list"));
    }
    if !meta.is_file() {
        return Err(format!("{raw} is not a regular file"));
    }
    let mut file = std::fs::File::open(&path).map_err(|err| format!("{raw}: {err}"))?;
    let mut head = vec![0; SNIFF_BYTES];
    let n = read_up_to(&mut file, &mut head).map_err(|err| format!("{raw}: {err}"))?;
    head.truncate(n);
    if !looks_like_text(&head) {
        return Err(format!("{raw} is a binary file"));
    }
    let reader = std::io::BufReader::new(head.as_slice().chain(file));
    let mut out = String::new();
    let mut returned = 0usize;
    let mut next_line = None;
    let mut cut_short = false;
    for (index, line) in reader.split(b'\n').enumerate() {
        let number = index as u64 + 1;
        let line = line.map_err(|err| format!("{raw}: {err}"))?;
        if number < offset {
            continue;
        }
        if returned == limit {
            next_line = Some(number);
            break;
        }
        let line = String::from_utf8_lossy(&line);
        if out.len() + line.len() + 1 > options.output_limit {
            if returned == 0 {
                out.push_str(cut(&line, options.output_limit));
                out.push('\n');
                returned = 1;
                cut_short = true;
            }
            next_line = Some(offset + returned as u64);
            break;
        }
        out.push_str(&line);
        out.push('\n');
        returned += 1;
    }
    if returned == 0 && offset > 1 {
        return Err(format!("{raw} has fewer than {offset} lines"));
    }
    let mut text = out;
    if cut_short {
        text.push_str(&format!("[line {offset} was cut at {} bytes]\n", options.output_limit));
    }
    if let Some(next) = next_line {
        text.push_str(&format!("[more lines follow; continue with offset={next}]\n"));
    }
    let details = json!({
        "path": shown(ctx, &path),
        "offset": offset,
        "lines": returned,
        "truncated": next_line.is_some() || cut_short,
    });
    Ok(ToolOutput::ok(text, details))
}

fn read_up_to(file: &mut std::fs::File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match file.read(&mut buf[filled..])? {
            0 => break,
            n => filled += n,
        }
    }
    Ok(filled)
}

/// `write`: a whole file, parent directories created.
#[derive(Debug)]
pub(super) struct Write;

#[async_trait]
impl Tool for Write {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "write".to_owned(),
            description: "Write a file in the working directory or workspace, replacing it if it \
                          exists; missing parent directories are created."
                .to_owned(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "File path, relative to the working directory"},
                    "content": {"type": "string", "description": "The complete new content"}
                },
                "required": ["path", "content"],
                "additionalProperties": false
            }),
        }
    }

    async fn execute(&self, args: Value, ctx: ToolContext) -> ToolOutput {
        blocking(move || write(&args, &ctx)).await
    }
}

fn write(args: &Value, ctx: &ToolContext) -> Result<ToolOutput, String> {
    let args = Args::new(args)?;
    let raw = args.required_str("path")?;
    let content = args.text("content")?.ok_or("Missing required parameter: content")?;
    let path = contained(ctx, &raw)?;
    if path.is_dir() {
        return Err(format!("{raw} is a directory"));
    }
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(|err| format!("{raw}: {err}"))?;
    }
    std::fs::write(&path, content.as_bytes()).map_err(|err| format!("{raw}: {err}"))?;
    let shown = shown(ctx, &path);
    Ok(ToolOutput::ok(
        format!("Wrote {} bytes to {shown}", content.len()),
        json!({ "path": shown, "bytes": content.len() }),
    ))
}

/// `edit`: replaces exact text.
#[derive(Debug)]
pub(super) struct Edit {
    options: Arc<BuiltinOptions>,
}

impl Edit {
    pub(super) fn new(options: Arc<BuiltinOptions>) -> Self {
        Edit { options }
    }
}

#[async_trait]
impl Tool for Edit {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "edit".to_owned(),
            description: "Replace exact text in a file. `old_string` must occur exactly once \
                          (include enough surrounding lines to make it unique) unless \
                          `replace_all` is true, which replaces every occurrence. Whitespace and \
                          indentation must match the file."
                .to_owned(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "File path, relative to the working directory"},
                    "old_string": {"type": "string", "description": "The exact text to replace"},
                    "new_string": {"type": "string", "description": "The text to put instead"},
                    "replace_all": {"type": "boolean", "description": "Replace every occurrence (default false)"}
                },
                "required": ["path", "old_string", "new_string"],
                "additionalProperties": false
            }),
        }
    }

    async fn execute(&self, args: Value, ctx: ToolContext) -> ToolOutput {
        let max = self.options.max_file_bytes;
        blocking(move || edit(max, &args, &ctx)).await
    }
}

fn edit(max: u64, args: &Value, ctx: &ToolContext) -> Result<ToolOutput, String> {
    let args = Args::new(args)?;
    let raw = args.required_str("path")?;
    let old = args.text("old_string")?.ok_or("Missing required parameter: old_string")?;
    let new = args.text("new_string")?.ok_or("Missing required parameter: new_string")?;
    let replace_all = args.bool("replace_all")?.unwrap_or(false);
    if old.is_empty() {
        return Err("old_string must not be empty".to_owned());
    }
    if old == new {
        return Err("old_string and new_string are the same".to_owned());
    }
    let (path, text) = read_text(ctx, &raw, max)?;
    let count = text.matches(old.as_str()).count();
    let shown = shown(ctx, &path);
    match count {
        0 => return Err(format!("old_string was not found in {shown}")),
        1 => {}
        n if !replace_all => {
            return Err(format!(
                "old_string occurs {n} times in {shown}; include more surrounding text to make \
                 it unique, or set replace_all to replace every occurrence"
            ))
        }
        _ => {}
    }
    let edited = text.replace(old.as_str(), &new);
    std::fs::write(&path, edited.as_bytes()).map_err(|err| format!("{raw}: {err}"))?;
    let noun = if count == 1 { "occurrence" } else { "occurrences" };
    Ok(ToolOutput::ok(
        format!("Replaced {count} {noun} in {shown}"),
        json!({ "path": shown, "replacements": count }),
    ))
}

/// `list`: a directory's entries.
#[derive(Debug)]
pub(super) struct List {
    options: Arc<BuiltinOptions>,
}

impl List {
    pub(super) fn new(options: Arc<BuiltinOptions>) -> Self {
        List { options }
    }
}

#[async_trait]
impl Tool for List {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "list".to_owned(),
            description: "List a directory in the working directory or workspace (default: the \
                          working directory). Directories end with `/`, symlinks with `@`."
                .to_owned(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "Directory path, relative to the working directory (default \".\")"}
                },
                "additionalProperties": false
            }),
        }
    }

    async fn execute(&self, args: Value, ctx: ToolContext) -> ToolOutput {
        let max = self.options.max_results;
        blocking(move || list(max, &args, &ctx)).await
    }
}

fn list(max: usize, args: &Value, ctx: &ToolContext) -> Result<ToolOutput, String> {
    let args = Args::new(args)?;
    let raw = args.str("path")?.unwrap_or_else(|| ".".to_owned());
    let path = contained(ctx, &raw)?;
    if !path.is_dir() {
        return Err(format!("{raw} is not a directory"));
    }
    let mut names = Vec::new();
    for entry in std::fs::read_dir(&path).map_err(|err| format!("{raw}: {err}"))? {
        let entry = entry.map_err(|err| format!("{raw}: {err}"))?;
        let mut name = entry.file_name().to_string_lossy().into_owned();
        match entry.file_type() {
            Ok(kind) if kind.is_dir() => name.push('/'),
            Ok(kind) if kind.is_symlink() => name.push('@'),
            _ => {}
        }
        names.push(name);
    }
    names.sort();
    let total = names.len();
    names.truncate(max);
    let mut text = if names.is_empty() { "(empty directory)".to_owned() } else { names.join("\n") };
    if total > names.len() {
        text.push_str(&format!("\n[{} more entries not shown]", total - names.len()));
    }
    Ok(ToolOutput::ok(text, json!({ "path": shown(ctx, &path), "entries": total })))
}

#[cfg(test)]
mod tests;
