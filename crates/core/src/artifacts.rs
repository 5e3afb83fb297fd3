//! Files a run hands back to its channel with the answer.
//!
//! At a run's end three sources are collected: `MEDIA: <path>` lines of the
//! answer, the `auto_send_files` a completed action's detail asks for (`[{path,
//! filename, caption}]`, as the file tools write it), and — when `[gateway]
//! auto_send_generated_images` is on — image files the run added through its
//! file-change actions. Each path is checked with a
//! [`Reach`] of the run's working directory and the workspace (symlinks
//! resolved, the gateway's own state refused) and must name an existing
//! regular file; the rest are refused with a reason and never sent. A channel
//! reads a checked file with [`Artifact::read`], which follows no link. Files are
//! deduplicated (the same path under the same name once; a `MEDIA:` line or a
//! generated image adds nothing to an explicit request for the same file) and the
//! `MEDIA:` lines are taken out of the answer text.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::contain::{Access, ContainError, OffLimits, Reach};
use crate::engine::{Action, ActionKind, ActionPhase};

/// Files sent with one answer at most; further ones are refused.
pub const MAX_ARTIFACTS: usize = 10;
/// Generated images sent with one answer at most.
pub const MAX_GENERATED_IMAGES: usize = 4;

/// Extensions sent as images (Telegram photos) and collected as generated images.
pub const IMAGE_EXTENSIONS: &[&str] =
    &["png", "jpg", "jpeg", "gif", "webp", "bmp", "svg", "tif", "tiff", "heic", "heif"];

/// A checked file to deliver with a run's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Artifact {
    /// The file, absolute with symlinks resolved, inside the run's cwd or the workspace.
    pub path: PathBuf,
    /// The name the recipient sees.
    pub filename: String,
    pub caption: Option<String>,
    /// Bytes, when it was checked.
    pub size: u64,
}

impl Artifact {
    /// The MIME type its extension suggests (`application/octet-stream` otherwise).
    pub fn mime(&self) -> &'static str {
        mime_of(&self.filename)
    }

    /// Whether its extension is an image's.
    pub fn is_image(&self) -> bool {
        extension(&self.filename).is_some_and(|ext| IMAGE_EXTENSIONS.contains(&ext.as_str()))
    }

    /// The file's bytes, read without following any link: a directory on its
    /// checked path swapped for a link since the check makes this fail.
    ///
    /// # Errors
    /// The file cannot be opened or read, or a link appeared on its path.
    pub async fn read(&self) -> std::io::Result<Vec<u8>> {
        crate::contain::read_checked(&self.path).await
    }
}

/// The MIME type of a file name's extension.
pub fn mime_of(filename: &str) -> &'static str {
    match extension(filename).as_deref() {
        Some("png") => "image/png",
        Some("jpg" | "jpeg") => "image/jpeg",
        Some("gif") => "image/gif",
        Some("webp") => "image/webp",
        Some("bmp") => "image/bmp",
        Some("svg") => "image/svg+xml",
        Some("tif" | "tiff") => "image/tiff",
        Some("heic") => "image/heic",
        Some("heif") => "image/heif",
        Some("pdf") => "application/pdf",
        Some("txt" | "log") => "text/plain",
        Some("md") => "text/markdown",
        Some("csv") => "text/csv",
        Some("json") => "application/json",
        Some("html" | "htm") => "text/html",
        Some("zip") => "application/zip",
        _ => "application/octet-stream",
    }
}

fn extension(name: &str) -> Option<String> {
    Path::new(name).extension().and_then(|ext| ext.to_str()).map(str::to_ascii_lowercase)
}

/// A file a run asked for, before it is checked.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Request {
    path: String,
    filename: Option<String>,
    caption: Option<String>,
    source: Source,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    Explicit,
    Media,
    Generated,
}

/// A path that was not sent, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    pub path: String,
    pub reason: String,
}

/// The directories a run's files must be in, and whether generated images count.
#[derive(Debug, Clone, Copy)]
pub struct ArtifactRoots<'a> {
    /// The run's working directory; relative paths are taken from here.
    pub cwd: &'a Path,
    pub workspace: Option<&'a Path>,
    /// The gateway's own state: never sent, whatever the roots hold.
    pub off_limits: &'a OffLimits,
    /// `[gateway] auto_send_generated_images`.
    pub generated_images: bool,
}

/// What a run's end hands to its channel.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Collected {
    /// The answer without its `MEDIA:` lines.
    pub answer: String,
    pub artifacts: Vec<Artifact>,
    pub refused: Vec<Refused>,
}

/// Watches a run's actions for files to send; [`finish`](Self::finish) checks them.
#[derive(Debug, Clone, Default)]
pub struct ArtifactCollector {
    explicit: Vec<Request>,
    generated: Vec<Request>,
}

impl ArtifactCollector {
    /// Takes the file requests of a completed action: `auto_send_files` at the top
    /// of its detail, and the images a file change added. A failed action counts
    /// for nothing; keys of the wrong type are skipped.
    pub fn action(&mut self, action: &Action) {
        if action.phase != ActionPhase::Completed || action.ok == Some(false) {
            return;
        }
        let detail = &action.detail;
        for entry in detail.get("auto_send_files").and_then(Value::as_array).into_iter().flatten() {
            let Some(path) = entry.get("path").and_then(Value::as_str).filter(|p| !p.is_empty())
            else {
                continue;
            };
            self.explicit.push(Request {
                path: path.to_owned(),
                filename: text(entry.get("filename")),
                caption: text(entry.get("caption")),
                source: Source::Explicit,
            });
        }
        if action.kind == ActionKind::FileChange {
            for path in added_paths(detail) {
                let is_image =
                    extension(&path).is_some_and(|ext| IMAGE_EXTENSIONS.contains(&ext.as_str()));
                if is_image && !self.generated.iter().any(|r| r.path == path) {
                    self.generated.push(Request {
                        path,
                        filename: None,
                        caption: None,
                        source: Source::Generated,
                    });
                }
            }
        }
    }

    /// Strips the answer's `MEDIA:` lines and checks every request against `roots`.
    pub fn finish(self, answer: &str, roots: ArtifactRoots<'_>) -> Collected {
        let (stripped, media) = strip_media_lines(answer);
        let media = media.into_iter().map(|path| Request {
            path,
            filename: None,
            caption: None,
            source: Source::Media,
        });
        let generated = if roots.generated_images { self.generated } else { Vec::new() };
        let mut out = Collected { answer: stripped, ..Collected::default() };
        let mut n_generated = 0;
        for request in self.explicit.into_iter().chain(media).chain(generated) {
            let resolved = match check(&request.path, roots) {
                Ok(found) => found,
                Err(reason) => {
                    out.refused.push(Refused { path: request.path, reason });
                    continue;
                }
            };
            let (path, size) = resolved;
            let filename = request.filename.clone().unwrap_or_else(|| basename(&path));
            let duplicate = out.artifacts.iter().any(|known| {
                known.path == path
                    && (request.source != Source::Explicit || known.filename == filename)
            });
            if duplicate {
                continue;
            }
            if request.source == Source::Generated {
                if n_generated == MAX_GENERATED_IMAGES {
                    let reason = format!("more than {MAX_GENERATED_IMAGES} generated images");
                    out.refused.push(Refused { path: request.path, reason });
                    continue;
                }
                n_generated += 1;
            }
            if out.artifacts.len() == MAX_ARTIFACTS {
                let reason = format!("more than {MAX_ARTIFACTS} files for one answer");
                out.refused.push(Refused { path: request.path, reason });
                continue;
            }
            out.artifacts.push(Artifact { path, filename, caption: request.caption, size });
        }
        out
    }
}

/// A non-blank string, trimmed.
fn text(value: Option<&Value>) -> Option<String> {
    value.and_then(Value::as_str).map(str::trim).filter(|s| !s.is_empty()).map(str::to_owned)
}

/// The paths a file change added: `changes[]` entries of kind `add` or `create`,
/// and the path of a `write` tool's input.
fn added_paths(detail: &Value) -> Vec<String> {
    let mut paths = Vec::new();
    for change in detail.get("changes").and_then(Value::as_array).into_iter().flatten() {
        let kind = change.get("kind").and_then(Value::as_str);
        if matches!(kind, Some("add" | "create" | "added" | "created")) {
            if let Some(path) = change.get("path").and_then(Value::as_str) {
                paths.push(path.to_owned());
            }
        }
    }
    let name = detail.get("name").and_then(Value::as_str).map(str::to_ascii_lowercase);
    if name.as_deref() == Some("write") {
        let input = detail.get("input").or_else(|| detail.get("args"));
        let path = ["file_path", "path"]
            .iter()
            .find_map(|key| input.and_then(|input| input.get(*key)).and_then(Value::as_str));
        if let Some(path) = path {
            paths.push(path.to_owned());
        }
    }
    paths
}

/// The path resolved inside the roots and its size, or why it cannot be sent.
/// The file is opened as [`Reach::open`] does, so what is measured is what
/// the check passed, not a link swapped in since.
fn check(raw: &str, roots: ArtifactRoots<'_>) -> Result<(PathBuf, u64), String> {
    let dirs =
        std::iter::once(roots.cwd.to_path_buf()).chain(roots.workspace.map(Path::to_path_buf));
    let reach = Reach::new(dirs, roots.off_limits.clone());
    let reason = |err: ContainError| match err {
        ContainError::Outside { .. } => {
            "outside the working directory and the workspace".to_owned()
        }
        ContainError::OffLimits { .. } => "the gateway's own state".to_owned(),
        ContainError::Changed { .. } => "changed while it was checked".to_owned(),
        ContainError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
            "no such file".to_owned()
        }
        ContainError::Io { source, .. } => source.to_string(),
        ContainError::NoRoots => "no directory is allowed".to_owned(),
    };
    let resolved = reach.resolve(Path::new(raw)).map_err(reason)?;
    let file = reach.open(&resolved, Access::Read).map_err(reason)?;
    let meta = file.metadata().map_err(|err| err.to_string())?;
    if !meta.is_file() {
        return Err("not a regular file".to_owned());
    }
    Ok((resolved, meta.len()))
}

fn basename(path: &Path) -> String {
    path.file_name().map_or_else(|| "file".to_owned(), |name| name.to_string_lossy().into_owned())
}

/// The answer without its `MEDIA: <path>` lines, and the paths they name (quotes
/// around a path are taken off; a path may contain spaces). Blank lines left at
/// the end are dropped.
pub fn strip_media_lines(answer: &str) -> (String, Vec<String>) {
    let mut kept = Vec::new();
    let mut paths = Vec::new();
    for line in answer.split('\n') {
        match media_path(line) {
            Some(path) => {
                if !path.is_empty() && !paths.contains(&path) {
                    paths.push(path);
                }
            }
            None => kept.push(line),
        }
    }
    if paths.is_empty() {
        return (answer.to_owned(), paths);
    }
    let text = kept.join("\n");
    (text.trim_end().to_owned(), paths)
}

/// The path of a `MEDIA:` line.
fn media_path(line: &str) -> Option<String> {
    let rest = line.trim().strip_prefix("MEDIA:")?.trim();
    let unquoted = ['"', '\'', '`']
        .iter()
        .find_map(|q| rest.strip_prefix(*q).and_then(|r| r.strip_suffix(*q)))
        .unwrap_or(rest);
    Some(unquoted.trim().to_owned())
}

#[cfg(test)]
mod tests;
