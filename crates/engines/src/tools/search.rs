//! `grep` and `glob`: searching under a directory of the run.
//!
//! Both walk the directory themselves, bounded by `max_walk_entries`, reading
//! each directory through [`Reach::read_dir`] (no link followed): symlinked
//! directories are not entered (they may lead out), `.git` and the gateway's
//! own state are skipped, and a symlinked file is searched only when it
//! resolves inside the run's roots and outside the state.

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use lemon_core::contain::{Access, EntryKind, Reach};
use lemon_core::tool::{Tool, ToolContext, ToolOutput, ToolSpec};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use super::args::Args;
use super::{contained, cut, looks_like_text, shown, BuiltinOptions};

/// A matching line longer than this is cut in the result.
const MAX_LINE_CHARS: usize = 300;

/// What a walk found, and whether it stopped early.
#[derive(Debug, Default)]
struct Walked {
    /// Paths relative to the walk's root, and whether each is a symlink.
    files: Vec<(PathBuf, bool)>,
    /// The entry limit was reached.
    stopped: bool,
}

/// Every file under `root` (depth first, in name order), up to `max` entries,
/// leaving out the gateway's state.
fn walk(reach: &Reach, root: &Path, max: usize, cancel: &CancellationToken) -> Walked {
    let mut walked = Walked::default();
    let mut seen = 0usize;
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        if cancel.is_cancelled() {
            walked.stopped = true;
            break;
        }
        let Ok(mut entries) = reach.read_dir(&root.join(&rel)) else { continue };
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        let mut dirs = Vec::new();
        for (name, kind) in entries {
            seen += 1;
            if seen > max {
                walked.stopped = true;
                walked.files.sort();
                return walked;
            }
            let path = rel.join(&name);
            if reach.denies(&root.join(&path)) {
                continue;
            }
            match kind {
                EntryKind::Dir if name != ".git" => dirs.push(path),
                EntryKind::File => walked.files.push((path, false)),
                EntryKind::Symlink => walked.files.push((path, true)),
                EntryKind::Dir | EntryKind::Other => {}
            }
        }
        // Popped in name order.
        stack.extend(dirs.into_iter().rev());
    }
    walked.files.sort();
    walked
}

/// `grep`.
#[derive(Debug)]
pub(super) struct Grep {
    options: Arc<BuiltinOptions>,
}

impl Grep {
    pub(super) fn new(options: Arc<BuiltinOptions>) -> Self {
        Grep { options }
    }
}

#[async_trait]
impl Tool for Grep {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "grep".to_owned(),
            description: format!(
                "Search files under a directory (default: the working directory) for lines \
                 matching a regular expression (Rust regex syntax). Returns `path:line: text` \
                 for at most {} matching lines. Binary files, `.git` and symlinked directories \
                 are skipped; `glob` limits the files searched (e.g. `*.rs`, `src/**/*.ts`).",
                self.options.max_results
            ),
            parameters: json!({
                "type": "object",
                "properties": {
                    "pattern": {"type": "string", "description": "Regular expression to search for"},
                    "path": {"type": "string", "description": "Directory (or file) to search, relative to the working directory"},
                    "glob": {"type": "string", "description": "Only files whose path below `path` matches this glob"},
                    "case_insensitive": {"type": "boolean", "description": "Ignore case (default false)"}
                },
                "required": ["pattern"],
                "additionalProperties": false
            }),
        }
    }

    async fn execute(&self, args: Value, ctx: ToolContext) -> ToolOutput {
        let options = self.options.clone();
        super::files::blocking(move || grep(&options, &args, &ctx)).await
    }
}

fn glob_matcher(pattern: &str) -> Result<globset::GlobMatcher, String> {
    globset::GlobBuilder::new(pattern)
        .literal_separator(true)
        .build()
        .map(|glob| glob.compile_matcher())
        .map_err(|err| format!("invalid glob {pattern:?}: {err}"))
}

fn grep(options: &BuiltinOptions, args: &Value, ctx: &ToolContext) -> Result<ToolOutput, String> {
    let args = Args::new(args)?;
    let pattern = args.text("pattern")?.filter(|p| !p.is_empty());
    let pattern = pattern.ok_or("Missing required parameter: pattern")?;
    let raw = args.str("path")?.unwrap_or_else(|| ".".to_owned());
    let filter = args.str("glob")?.map(|glob| glob_matcher(&glob)).transpose()?;
    let insensitive = args.bool("case_insensitive")?.unwrap_or(false);
    let regex = regex::RegexBuilder::new(&pattern)
        .case_insensitive(insensitive)
        .size_limit(1 << 20)
        .build()
        .map_err(|err| format!("invalid pattern: {err}"))?;
    let reach = ctx.reach();
    let root = contained(&reach, &raw)?;
    let (base, walked) = if root.is_file() {
        let name = root.file_name().map(PathBuf::from).unwrap_or_default();
        let parent = root.parent().map(Path::to_path_buf).unwrap_or_default();
        (parent, Walked { files: vec![(name, false)], stopped: false })
    } else if root.is_dir() {
        (root.clone(), walk(&reach, &root, options.max_walk_entries, &ctx.cancel))
    } else {
        return Err(format!("{raw} is not a file or directory"));
    };
    let mut lines = Vec::new();
    let mut more = false;
    let mut files_with_matches = 0usize;
    'files: for (rel, is_link) in &walked.files {
        if ctx.cancel.is_cancelled() {
            return Err("the run was cancelled".to_owned());
        }
        if filter.as_ref().is_some_and(|glob| !glob.is_match(rel)) {
            continue;
        }
        let path = base.join(rel);
        let path = if *is_link {
            match reach.resolve(&path) {
                Ok(target) => target,
                Err(_) => continue,
            }
        } else {
            path
        };
        let Some(text) = text_of(&reach, &path, options.max_file_bytes) else { continue };
        let mut matched = false;
        for (index, line) in text.lines().enumerate() {
            if !regex.is_match(line) {
                continue;
            }
            if lines.len() == options.max_results {
                more = true;
                break 'files;
            }
            matched = true;
            let line = cut(line, MAX_LINE_CHARS);
            lines.push(format!("{}:{}: {line}", shown(ctx, &base.join(rel)), index + 1));
        }
        files_with_matches += usize::from(matched);
    }
    let count = lines.len();
    let mut text = if lines.is_empty() { "No matches.".to_owned() } else { lines.join("\n") };
    if more {
        text.push_str(&format!("\n[stopped at {count} matches; narrow the pattern or the path]"));
    }
    if walked.stopped {
        text.push_str(&format!(
            "\n[the search stopped after {} entries; search a smaller directory]",
            options.max_walk_entries
        ));
    }
    Ok(ToolOutput::ok(
        text,
        json!({ "matches": count, "files": files_with_matches, "truncated": more || walked.stopped }),
    ))
}

/// The file's text, or `None` when it is too large, unreadable, binary or
/// the gateway's state.
fn text_of(reach: &Reach, path: &Path, max: u64) -> Option<String> {
    let file = reach.open(path, Access::Read).ok()?;
    let meta = file.metadata().ok()?;
    if !meta.is_file() || meta.len() > max {
        return None;
    }
    let mut bytes = Vec::new();
    file.take(max).read_to_end(&mut bytes).ok()?;
    let head = &bytes[..bytes.len().min(8 * 1024)];
    if !looks_like_text(head) {
        return None;
    }
    Some(String::from_utf8_lossy(&bytes).into_owned())
}

/// `glob`.
#[derive(Debug)]
pub(super) struct Glob {
    options: Arc<BuiltinOptions>,
}

impl Glob {
    pub(super) fn new(options: Arc<BuiltinOptions>) -> Self {
        Glob { options }
    }
}

#[async_trait]
impl Tool for Glob {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "glob".to_owned(),
            description: format!(
                "Find files by name pattern under a directory (default: the working directory), \
                 e.g. `**/*.rs` or `src/*.toml` (`*` stays within one directory, `**` crosses \
                 them). Returns at most {} paths in name order.",
                self.options.max_results
            ),
            parameters: json!({
                "type": "object",
                "properties": {
                    "pattern": {"type": "string", "description": "Glob pattern, relative to `path`"},
                    "path": {"type": "string", "description": "Directory to search, relative to the working directory"}
                },
                "required": ["pattern"],
                "additionalProperties": false
            }),
        }
    }

    async fn execute(&self, args: Value, ctx: ToolContext) -> ToolOutput {
        let options = self.options.clone();
        super::files::blocking(move || glob(&options, &args, &ctx)).await
    }
}

fn glob(options: &BuiltinOptions, args: &Value, ctx: &ToolContext) -> Result<ToolOutput, String> {
    let args = Args::new(args)?;
    let pattern = args.required_str("pattern")?;
    let matcher = glob_matcher(pattern.trim_start_matches("./"))?;
    let raw = args.str("path")?.unwrap_or_else(|| ".".to_owned());
    let reach = ctx.reach();
    let root = contained(&reach, &raw)?;
    if !root.is_dir() {
        return Err(format!("{raw} is not a directory"));
    }
    let walked = walk(&reach, &root, options.max_walk_entries, &ctx.cancel);
    if ctx.cancel.is_cancelled() {
        return Err("the run was cancelled".to_owned());
    }
    let mut paths = Vec::new();
    let mut more = false;
    for (rel, _) in &walked.files {
        if matcher.is_match(rel) {
            if paths.len() == options.max_results {
                more = true;
                break;
            }
            paths.push(shown(ctx, &root.join(rel)));
        }
    }
    let count = paths.len();
    let mut text = if paths.is_empty() { "No files matched.".to_owned() } else { paths.join("\n") };
    if more {
        text.push_str(&format!("\n[stopped at {count} paths; narrow the pattern]"));
    }
    if walked.stopped {
        text.push_str(&format!(
            "\n[the search stopped after {} entries; search a smaller directory]",
            options.max_walk_entries
        ));
    }
    Ok(ToolOutput::ok(text, json!({ "count": count, "truncated": more || walked.stopped })))
}

#[cfg(test)]
mod tests;
