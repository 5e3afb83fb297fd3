//! `read`, `write`, `edit` and `list`: files in the run's cwd or workspace.

use std::io::{BufRead, Read as _, Seek as _, Write as _};
use std::sync::Arc;

use async_trait::async_trait;
use lemon_core::contain::{Access, EntryKind, Reach};
use lemon_core::tool::{Tool, ToolContext, ToolOutput, ToolSpec};
use serde_json::{json, Value};

use super::args::Args;
use super::{contained, cut, looks_like_text, refusal, shown, BuiltinOptions};

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

/// The file at `raw` opened for reading and writing in place, and its text;
/// refused when it is missing, not a regular file, larger than `max` or binary.
fn read_text(
    reach: &Reach,
    raw: &str,
    max: u64,
) -> Result<(std::path::PathBuf, std::fs::File, String), String> {
    let path = contained(reach, raw)?;
    let mut file = reach.open(&path, Access::ReadWrite).map_err(|err| refusal(raw, &err))?;
    let meta = file.metadata().map_err(|err| format!("{raw}: {err}"))?;
    if !meta.is_file() {
        return Err(format!("{raw} is not a regular file"));
    }
    if meta.len() > max {
        return Err(format!("{raw} is {} bytes, over the {max}-byte limit", meta.len()));
    }
    let mut bytes = Vec::new();
    (&mut file).take(max).read_to_end(&mut bytes).map_err(|err| format!("{raw}: {err}"))?;
    if bytes.contains(&0) {
        return Err(format!("{raw} is a binary file"));
    }
    let text = String::from_utf8(bytes).map_err(|_| format!("{raw} is not UTF-8 text"))?;
    Ok((path, file, text))
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
                 they are; by default the first {} lines, and at most {} bytes: `offset` \
                 (1-based line number) and `limit` page through longer files, and a longer \
                 line is cut. Binary files are refused.",
                self.options.read_default_lines, self.options.output_limit
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
    let reach = ctx.reach();
    let path = contained(&reach, &raw)?;
    let mut file = reach.open(&path, Access::Read).map_err(|err| refusal(&raw, &err))?;
    let meta = file.metadata().map_err(|err| format!("{raw}: {err}"))?;
    if meta.is_dir() {
        return Err(format!("{raw} is a directory; use list"));
    }
    if !meta.is_file() {
        return Err(format!("{raw} is not a regular file"));
    }
    let mut head = vec![0; SNIFF_BYTES];
    let n = read_up_to(&mut file, &mut head).map_err(|err| format!("{raw}: {err}"))?;
    head.truncate(n);
    if !looks_like_text(&head) {
        return Err(format!("{raw} is a binary file"));
    }
    let budget = options.output_limit;
    let mut lines = BoundedLines::new(std::io::BufReader::new(head.as_slice().chain(file)));
    let mut out = String::new();
    let mut returned = 0usize;
    let mut next_line = None;
    // The line cut at the byte limit, and its full length.
    let mut cut_line = None;
    let mut number = 0u64;
    loop {
        number += 1;
        let keep = if number < offset { 0 } else { budget - out.len() };
        let Some((line, length)) = lines.next_line(keep).map_err(|err| format!("{raw}: {err}"))?
        else {
            break;
        };
        if number < offset {
            continue;
        }
        if returned == limit {
            next_line = Some(number);
            break;
        }
        if length + 1 > keep {
            if returned == 0 {
                out.push_str(&utf8_prefix(&line));
                out.push('\n');
                returned = 1;
                cut_line = Some(length);
                if lines.has_more().map_err(|err| format!("{raw}: {err}"))? {
                    next_line = Some(number + 1);
                }
            } else {
                next_line = Some(number);
            }
            break;
        }
        out.push_str(&String::from_utf8_lossy(&line));
        out.push('\n');
        returned += 1;
    }
    if returned == 0 && offset > 1 {
        return Err(format!("{raw} has fewer than {offset} lines"));
    }
    let mut text = cut(&out, budget + 1).to_owned();
    if let Some(length) = cut_line {
        text.push_str(&format!(
            "[line {offset} is {length} bytes; only its first {budget} bytes are shown, the most read returns]\n"
        ));
    }
    if let Some(next) = next_line {
        text.push_str(&format!("[more lines follow; continue with offset={next}]\n"));
    }
    let details = json!({
        "path": shown(ctx, &path),
        "offset": offset,
        "lines": returned,
        "truncated": next_line.is_some() || cut_line.is_some(),
    });
    Ok(ToolOutput::ok(text, details))
}

/// Lines of a reader, each kept only up to a number of bytes: the rest of a
/// longer line is read past, never held, so a file of one huge line costs
/// no more memory than the part returned.
struct BoundedLines<R> {
    reader: R,
}

impl<R: BufRead> BoundedLines<R> {
    fn new(reader: R) -> Self {
        BoundedLines { reader }
    }

    /// The next line without its newline, cut to `keep` bytes, and its full
    /// length; `None` at the end.
    fn next_line(&mut self, keep: usize) -> std::io::Result<Option<(Vec<u8>, usize)>> {
        let mut line = Vec::new();
        let mut length = 0usize;
        let mut any = false;
        loop {
            let buf = self.reader.fill_buf()?;
            if buf.is_empty() {
                return Ok(any.then_some((line, length)));
            }
            any = true;
            let (chunk, ends) = match buf.iter().position(|&b| b == b'\n') {
                Some(at) => (&buf[..at], true),
                None => (buf, false),
            };
            let room = keep.saturating_sub(line.len());
            line.extend_from_slice(&chunk[..chunk.len().min(room)]);
            length += chunk.len();
            let used = chunk.len() + usize::from(ends);
            self.reader.consume(used);
            if ends {
                return Ok(Some((line, length)));
            }
        }
    }

    fn has_more(&mut self) -> std::io::Result<bool> {
        Ok(!self.reader.fill_buf()?.is_empty())
    }
}

/// `bytes` as text, a character cut at the end dropped.
fn utf8_prefix(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(text) => text.to_owned(),
        Err(err) if err.error_len().is_none() => {
            String::from_utf8_lossy(&bytes[..err.valid_up_to()]).into_owned()
        }
        Err(_) => String::from_utf8_lossy(bytes).into_owned(),
    }
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
    let reach = ctx.reach();
    let path = contained(&reach, &raw)?;
    if path.is_dir() {
        return Err(format!("{raw} is a directory"));
    }
    let mut file = reach.open(&path, Access::Create).map_err(|err| refusal(&raw, &err))?;
    file.write_all(content.as_bytes()).map_err(|err| format!("{raw}: {err}"))?;
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
    let (path, mut file, text) = read_text(&ctx.reach(), &raw, max)?;
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
    // Through the descriptor that was read: the file edited is the file checked.
    file.set_len(0)
        .and_then(|()| file.seek(std::io::SeekFrom::Start(0)))
        .and_then(|_| file.write_all(edited.as_bytes()))
        .map_err(|err| format!("{raw}: {err}"))?;
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
    let reach = ctx.reach();
    let path = contained(&reach, &raw)?;
    if !path.is_dir() {
        return Err(format!("{raw} is not a directory"));
    }
    let mut names = Vec::new();
    for (name, kind) in reach.read_dir(&path).map_err(|err| refusal(&raw, &err))? {
        let mut name = name.to_string_lossy().into_owned();
        match kind {
            EntryKind::Dir => name.push('/'),
            EntryKind::Symlink => name.push('@'),
            EntryKind::File | EntryKind::Other => {}
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
