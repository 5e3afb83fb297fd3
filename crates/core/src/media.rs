//! Files people send with a message: a photo, a PDF, a log file.
//!
//! A channel that receives a file checks it against its `files` section
//! ([`FilesConfig`]: who may send files, how large, which names are refused)
//! and hands it to the [`MediaStage`], which keeps it in the gateway's own
//! directory until the run starts. The staged files travel with the request
//! as [`Attachment`]s under the `attachments` key of its metadata, so they are
//! journaled with it and survive a restart. When the run starts, [`place`]
//! moves each file into the uploads directory of the run's working directory
//! (`.lemon/uploads/` unless the channel names another), under a name no
//! other file has, and the prompt gets a note with the paths. An engine that
//! can see images gets the image files too ([`crate::engine::StartRequest`]'s
//! `attachments`).
//!
//! Containment: a name with a path in it (`../../.bashrc`), a control
//! character or nothing left is refused where the file enters; the uploads
//! directory must be inside the run's directory (or the absolute directory
//! the owner configured) and outside the gateway's state; the file is created
//! by [`Reach::open`] with `O_EXCL` and without following links, so a link
//! planted under the chosen name or on the way is never written through.
//! Only files inside the stage directory are ever moved: an `attachments`
//! entry a caller wrote into a request's metadata by hand names nothing the
//! gateway will touch.

use std::collections::BTreeMap;
use std::fmt;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use globset::{Glob, GlobSet, GlobSetBuilder};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::contain::{Access, ContainError, OffLimits, Reach};

/// The request metadata key the attachments travel under.
pub const META_KEY: &str = "attachments";

/// The uploads directory, relative to the run's directory, unless the
/// channel's `files.uploads_dir` names another.
pub const DEFAULT_UPLOADS_DIR: &str = ".lemon/uploads";

/// What kind of file was sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttachmentKind {
    /// A picture (PNG, JPEG, GIF, WebP): shown to a model that can see.
    Image,
    /// Anything else: saved, and its path given to the run.
    File,
}

impl AttachmentKind {
    pub fn as_str(self) -> &'static str {
        match self {
            AttachmentKind::Image => "image",
            AttachmentKind::File => "file",
        }
    }
}

/// A file that came with a message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attachment {
    pub kind: AttachmentKind,
    /// Where the file is: in the stage until the run starts, then in the
    /// uploads directory.
    pub path: PathBuf,
    /// The file's name (checked, without any directory).
    pub name: String,
    /// The media type, e.g. `image/png`, `application/pdf`.
    pub mime: String,
    /// Its size.
    pub bytes: u64,
    /// The channel's `files.uploads_dir`: relative to the run's directory,
    /// or absolute; `None` for [`DEFAULT_UPLOADS_DIR`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uploads_dir: Option<String>,
}

/// The attachments listed in a request's metadata; entries that do not
/// parse are skipped.
pub fn attachments_of(meta: &BTreeMap<String, Value>) -> Vec<Attachment> {
    match meta.get(META_KEY) {
        Some(Value::Array(items)) => {
            items.iter().filter_map(|item| serde_json::from_value(item.clone()).ok()).collect()
        }
        _ => Vec::new(),
    }
}

/// Records `attachments` in `meta`, after any already there.
pub fn add_attachments(meta: &mut BTreeMap<String, Value>, attachments: &[Attachment]) {
    if attachments.is_empty() {
        return;
    }
    let mut all = match meta.remove(META_KEY) {
        Some(Value::Array(items)) => items,
        _ => Vec::new(),
    };
    all.extend(attachments.iter().filter_map(|a| serde_json::to_value(a).ok()));
    meta.insert(META_KEY.to_owned(), Value::Array(all));
}

/// Whether a request's metadata carries attachments.
pub fn has_attachments(meta: &BTreeMap<String, Value>) -> bool {
    matches!(meta.get(META_KEY), Some(Value::Array(items)) if !items.is_empty())
}

/// A user id in `allowed_user_ids`: Telegram's are numbers, Discord's are
/// snowflakes often written as strings, email's are addresses.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(untagged)]
pub enum UserId {
    Number(i64),
    Text(String),
}

impl fmt::Display for UserId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UserId::Number(n) => write!(f, "{n}"),
            UserId::Text(s) => f.write_str(s),
        }
    }
}

/// What a channel does with `auto_put`: a file sent without `/file put`.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum AutoPutMode {
    /// The file is saved and a run is started with its path (and the caption
    /// as the prompt).
    #[default]
    Prompt,
    /// The file is saved and its path replied; no run starts.
    Upload,
}

/// The `files` section of a channel (`[gateway.telegram.files]`,
/// `[gateway.discord.files]`, `[gateway.email.files]`, …): who may send files,
/// how large, which names are refused and where they are saved.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default)]
pub struct FilesConfig {
    /// Files and photos are accepted at all; when off, a message with a file
    /// is answered with a short refusal and its text alone is not run.
    pub enabled: bool,
    /// A file sent without `/file put` is saved and handed to a run (see
    /// `auto_put_mode`); when off, only `/file put` saves files.
    pub auto_put: bool,
    /// What a file sent without `/file put` does.
    pub auto_put_mode: AutoPutMode,
    /// Where files are saved: relative to the run's directory, or absolute;
    /// no `..`. Unset: `.lemon/uploads`.
    #[schemars(length(min = 1))]
    pub uploads_dir: Option<String>,
    /// Only these users may send files (empty: everyone the channel lets in).
    pub allowed_user_ids: Vec<UserId>,
    /// File names and `/file` paths matching one of these globs are refused.
    pub deny_globs: Vec<String>,
    /// The largest file accepted, in bytes (20 MiB by default, Telegram's
    /// download limit); larger ones are refused before they are fetched.
    #[schemars(range(min = 1))]
    pub max_download_bytes: u64,
    /// The largest file `/file get` sends, in bytes.
    pub max_upload_bytes: u64,
    /// Photos sent together (an album) become one message once none has
    /// arrived for this long, in milliseconds.
    pub media_group_debounce_ms: u64,
    /// Files a run writes are sent with its answer (as `[gateway]
    /// auto_send_generated_images` does for images, for this channel).
    pub auto_send_generated_files: bool,
    /// Images a run writes are sent with its answer, for this channel.
    pub auto_send_generated_images: bool,
    /// At most this many generated files are sent with one answer.
    pub auto_send_generated_max_files: usize,
    /// The pause between two files sent with one answer, in milliseconds.
    pub outbound_send_delay_ms: u64,
    /// A file given by URL (the control API, webhooks) may be fetched from a
    /// loopback, private or link-local address; off, such a URL is refused.
    pub allow_private_hosts: bool,
}

/// 20 MiB.
pub const DEFAULT_MAX_DOWNLOAD_BYTES: u64 = 20 * 1024 * 1024;
/// 50 MiB.
pub const DEFAULT_MAX_UPLOAD_BYTES: u64 = 50 * 1024 * 1024;

impl Default for FilesConfig {
    fn default() -> Self {
        FilesConfig {
            enabled: true,
            auto_put: true,
            auto_put_mode: AutoPutMode::Prompt,
            uploads_dir: None,
            allowed_user_ids: Vec::new(),
            deny_globs: vec![
                ".git/**".to_owned(),
                "**/.git/**".to_owned(),
                ".env".to_owned(),
                "**/.env".to_owned(),
                "**/*.pem".to_owned(),
                "**/id_rsa*".to_owned(),
                "**/id_ed25519*".to_owned(),
            ],
            max_download_bytes: DEFAULT_MAX_DOWNLOAD_BYTES,
            max_upload_bytes: DEFAULT_MAX_UPLOAD_BYTES,
            media_group_debounce_ms: 1000,
            auto_send_generated_files: false,
            auto_send_generated_images: false,
            auto_send_generated_max_files: 4,
            outbound_send_delay_ms: 800,
            allow_private_hosts: false,
        }
    }
}

impl FilesConfig {
    /// Whether `user` may send files.
    pub fn user_allowed(&self, user: &str) -> bool {
        self.allowed_user_ids.is_empty()
            || self.allowed_user_ids.iter().any(|id| id.to_string() == user)
    }

    /// The deny globs, compiled; a glob that does not compile is reported
    /// by [`FilesConfig::check`] and skipped here.
    pub fn deny_set(&self) -> GlobSet {
        let mut builder = GlobSetBuilder::new();
        for glob in &self.deny_globs {
            if let Ok(glob) = Glob::new(glob) {
                builder.add(glob);
            }
        }
        builder.build().unwrap_or_else(|_| GlobSet::empty())
    }

    /// The settings' problems, as `key: why` lines (for the config loader).
    pub fn check(&self) -> Vec<String> {
        let mut problems = Vec::new();
        for glob in &self.deny_globs {
            if let Err(err) = Glob::new(glob) {
                problems.push(format!("deny_globs: {glob:?} is not a glob: {err}"));
            }
        }
        if let Some(dir) = &self.uploads_dir {
            if dir.trim().is_empty() {
                problems.push("uploads_dir: must not be blank".to_owned());
            } else if Path::new(dir).components().any(|c| c == std::path::Component::ParentDir) {
                problems.push(format!("uploads_dir: {dir:?} must not contain `..`"));
            }
        }
        if self.max_download_bytes == 0 {
            problems.push("max_download_bytes: must be more than 0".to_owned());
        }
        problems
    }

    /// Whether `path` (a file name, or a path relative to the project) is
    /// refused by `deny_globs`; the glob that matched.
    pub fn denied_by(&self, path: &str) -> Option<String> {
        let set = self.deny_set();
        let matches = set.matches(path);
        let first = matches.first()?;
        // `deny_set` skips globs that do not compile: find the n-th that does.
        self.deny_globs.iter().filter(|g| Glob::new(g).is_ok()).nth(*first).cloned()
    }
}

/// Why a file was not taken. The text is the reply the sender sees.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MediaRefusal {
    #[error("files are not accepted here")]
    Disabled,
    #[error("you may not send files here")]
    UserNotAllowed,
    #[error("{name} is {} — the limit is {}", size_text(*bytes), size_text(*max))]
    TooLarge { name: String, bytes: u64, max: u64 },
    #[error("the file name {name:?} is refused: {why}")]
    BadName { name: String, why: &'static str },
    #[error("{name} is refused (it matches {glob:?} in deny_globs)")]
    Denied { name: String, glob: String },
    #[error("the file could not be fetched: {0}")]
    Fetch(String),
    #[error("the file could not be saved: {0}")]
    Save(String),
    /// A `/file` path outside the project or in the gateway's state.
    #[error("{path} is outside the project")]
    Outside { path: String },
    #[error("{path} does not exist in the project")]
    NotFound { path: String },
    #[error("{path} is not a file")]
    NotAFile { path: String },
    #[error("{path} exists; send it with `/file put --force {path}` to replace it")]
    Exists { path: String },
}

/// `1.2 MB`, `350 KB`, `12 bytes`.
pub fn size_text(bytes: u64) -> String {
    const KB: f64 = 1024.0;
    let b = bytes as f64;
    if b >= KB * KB {
        format!("{:.1} MB", b / (KB * KB))
    } else if b >= KB {
        format!("{:.0} KB", b / KB)
    } else {
        format!("{bytes} bytes")
    }
}

/// `name` as a file name: no directory part, no control character, not `.`
/// or `..`, at most 255 bytes. Leading and trailing blanks are trimmed.
///
/// # Errors
/// [`MediaRefusal::BadName`] saying why.
pub fn check_file_name(name: &str) -> Result<String, MediaRefusal> {
    let refuse = |why| Err(MediaRefusal::BadName { name: name.to_owned(), why });
    let trimmed = name.trim();
    if trimmed.is_empty() {
        return refuse("it is empty");
    }
    if trimmed.contains(['/', '\\']) {
        return refuse("it holds a directory");
    }
    if trimmed == "." || trimmed == ".." {
        return refuse("it names a directory");
    }
    if trimmed.chars().any(char::is_control) {
        return refuse("it holds a control character");
    }
    if trimmed.len() > 255 {
        return refuse("it is longer than 255 bytes");
    }
    Ok(trimmed.to_owned())
}

/// The media type of well-known image bytes, by their first bytes.
pub fn sniff_image(bytes: &[u8]) -> Option<&'static str> {
    if bytes.starts_with(b"\x89PNG\r\n\x1a\n") {
        Some("image/png")
    } else if bytes.starts_with(&[0xff, 0xd8, 0xff]) {
        Some("image/jpeg")
    } else if bytes.starts_with(b"GIF87a") || bytes.starts_with(b"GIF89a") {
        Some("image/gif")
    } else if bytes.len() >= 12 && &bytes[..4] == b"RIFF" && &bytes[8..12] == b"WEBP" {
        Some("image/webp")
    } else {
        None
    }
}

/// The media type of a file name's extension, for the common kinds.
pub fn mime_of_name(name: &str) -> &'static str {
    let ext = name.rsplit_once('.').map(|(_, e)| e.to_ascii_lowercase()).unwrap_or_default();
    match ext.as_str() {
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "gif" => "image/gif",
        "webp" => "image/webp",
        "pdf" => "application/pdf",
        "txt" | "log" | "md" => "text/plain",
        "json" => "application/json",
        "csv" => "text/csv",
        "zip" => "application/zip",
        "ogg" | "oga" | "opus" => "audio/ogg",
        "mp3" => "audio/mpeg",
        "wav" => "audio/wav",
        _ => "application/octet-stream",
    }
}

/// Where channels keep received files until their run starts: a directory
/// of the gateway's own (under its home), so no run reaches it.
#[derive(Debug, Clone)]
pub struct MediaStage {
    dir: PathBuf,
}

impl MediaStage {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        MediaStage { dir: dir.into() }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Checks a file against `files` and keeps it: `name` as sent (`None`:
    /// `fallback` is used, e.g. `photo-<id>.jpg` for a photo without one).
    /// The kind is an image when the bytes are one, whatever was claimed.
    ///
    /// # Errors
    /// A [`MediaRefusal`] the sender is told.
    pub fn keep(
        &self,
        files: &FilesConfig,
        name: Option<&str>,
        fallback: &str,
        mime: Option<&str>,
        bytes: &[u8],
    ) -> Result<Attachment, MediaRefusal> {
        let name = match name.filter(|n| !n.trim().is_empty()) {
            Some(name) => check_file_name(name)?,
            None => check_file_name(fallback)?,
        };
        let size = bytes.len() as u64;
        if size > files.max_download_bytes {
            return Err(MediaRefusal::TooLarge {
                name,
                bytes: size,
                max: files.max_download_bytes,
            });
        }
        if let Some(glob) = files.denied_by(&name) {
            return Err(MediaRefusal::Denied { name, glob });
        }
        let (kind, mime) = match sniff_image(bytes) {
            Some(image) => (AttachmentKind::Image, image.to_owned()),
            None => {
                let claimed = mime.map(str::trim).filter(|m| valid_mime(m));
                let mime = claimed.map(str::to_owned).unwrap_or_else(|| mime_of_name(&name).into());
                // Claimed image bytes that are not a known image format are a file.
                (AttachmentKind::File, mime)
            }
        };
        let dir = self.dir.join(uuid::Uuid::new_v4().simple().to_string());
        let save = || -> io::Result<PathBuf> {
            std::fs::create_dir_all(&dir)?;
            set_private(&self.dir);
            set_private(&dir);
            let path = dir.join(&name);
            let mut file = std::fs::OpenOptions::new().write(true).create_new(true).open(&path)?;
            file.write_all(bytes)?;
            file.sync_all()?;
            Ok(path)
        };
        let path = save().map_err(|err| MediaRefusal::Save(err.to_string()))?;
        Ok(Attachment {
            kind,
            path,
            name,
            mime,
            bytes: size,
            uploads_dir: files.uploads_dir.clone(),
        })
    }

    /// Removes what `attachments` still hold in the stage (a request that
    /// was refused, or a run that ended before it started).
    pub fn discard(&self, attachments: &[Attachment]) {
        for attachment in attachments {
            if let Some(dir) = self.staged_dir(&attachment.path) {
                let _ = std::fs::remove_dir_all(dir);
            }
        }
    }

    /// Removes staged files older than `age`: left by requests that were
    /// refused or ended before they ran, or by a crash mid-way. Returns how
    /// many went.
    pub fn sweep(&self, age: std::time::Duration) -> usize {
        let Ok(entries) = std::fs::read_dir(&self.dir) else { return 0 };
        let now = std::time::SystemTime::now();
        let mut removed = 0;
        for entry in entries.flatten() {
            let Ok(meta) = entry.metadata() else { continue };
            let old = meta
                .modified()
                .ok()
                .and_then(|at| now.duration_since(at).ok())
                .is_some_and(|elapsed| elapsed > age);
            if old && meta.is_dir() && std::fs::remove_dir_all(entry.path()).is_ok() {
                removed += 1;
            }
        }
        removed
    }

    /// The per-file directory holding `path`, when `path` is a file of this
    /// stage (`<stage>/<id>/<name>`, no link, no `..`).
    fn staged_dir(&self, path: &Path) -> Option<PathBuf> {
        let rel = path.strip_prefix(&self.dir).ok()?;
        let parts: Vec<_> = rel.components().collect();
        let [std::path::Component::Normal(id), std::path::Component::Normal(_)] = parts[..] else {
            return None;
        };
        let id = id.to_str()?;
        if id.len() != 32 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        let meta = std::fs::symlink_metadata(path).ok()?;
        meta.file_type().is_file().then(|| self.dir.join(id))
    }
}

fn valid_mime(mime: &str) -> bool {
    let Some((top, sub)) = mime.split_once('/') else { return false };
    let ok = |s: &str| {
        !s.is_empty()
            && s.len() <= 64
            && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"+-.".contains(&b))
    };
    ok(top) && ok(sub)
}

#[cfg(unix)]
fn set_private(dir: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700));
}

#[cfg(not(unix))]
fn set_private(_dir: &Path) {}

/// `/file put [--force] [path]` (with a file) or `/file get <path>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileCommand {
    /// Save the file sent with the command at `path` in the project (a
    /// path ending in `/` is a directory the file keeps its name in; `None`:
    /// the uploads directory). An existing file is replaced only with `force`.
    Put { path: Option<String>, force: bool },
    /// Send the project's file at `path` back.
    Get { path: String },
}

/// How `/file` is used, the reply to a malformed one.
pub const FILE_USAGE: &str =
    "Usage: /file put [--force] [path] (sent as the caption of a file), or /file get <path>";

/// Parses a message that starts with `/file` (also `/file@bot`): `None` when
/// it does not, `Some(Err(usage))` when it is malformed.
pub fn parse_file_command(text: &str) -> Option<Result<FileCommand, &'static str>> {
    let mut words = text.split_whitespace();
    let first = words.next()?;
    let command = first.split_once('@').map_or(first, |(c, _)| c);
    if !command.eq_ignore_ascii_case("/file") {
        return None;
    }
    let rest: Vec<&str> = words.collect();
    Some(match rest.as_slice() {
        ["put"] => Ok(FileCommand::Put { path: None, force: false }),
        ["put", "--force"] => Ok(FileCommand::Put { path: None, force: true }),
        ["put", "--force", path] => {
            Ok(FileCommand::Put { path: Some((*path).into()), force: true })
        }
        ["put", path] => Ok(FileCommand::Put { path: Some((*path).into()), force: false }),
        ["get", path] => Ok(FileCommand::Get { path: (*path).into() }),
        _ => Err(FILE_USAGE),
    })
}

/// The project path `raw` names, resolved inside `dir` (no `..` out, no link
/// out, not the gateway's state) and checked against `deny_globs`.
fn project_path(
    reach: &Reach,
    dir: &Path,
    files: &FilesConfig,
    raw: &str,
) -> Result<PathBuf, MediaRefusal> {
    let raw = raw.trim();
    if raw.is_empty() || raw.chars().any(char::is_control) {
        return Err(MediaRefusal::BadName { name: raw.to_owned(), why: "it is not a path" });
    }
    let outside = || MediaRefusal::Outside { path: raw.to_owned() };
    let resolved = reach.resolve(Path::new(raw)).map_err(|_| outside())?;
    let root = dir.canonicalize().map_err(|_| outside())?;
    let rel = resolved.strip_prefix(&root).map_err(|_| outside())?;
    let rel_text = rel.to_string_lossy();
    if let Some(glob) = files.denied_by(&rel_text) {
        return Err(MediaRefusal::Denied { name: rel_text.into_owned(), glob });
    }
    Ok(resolved)
}

/// `/file put`: saves `bytes` (a file sent as `name`) in the project `dir`
/// at `target` (see [`FileCommand::Put`]); returns where it went, relative to `dir`.
///
/// # Errors
/// A [`MediaRefusal`] the sender is told: a name or path refused, a path
/// outside the project, an existing file without `force`, too large.
pub fn put_file(
    dir: &Path,
    off_limits: &OffLimits,
    files: &FilesConfig,
    target: Option<&str>,
    name: &str,
    force: bool,
    bytes: &[u8],
) -> Result<PathBuf, MediaRefusal> {
    let name = check_file_name(name)?;
    let size = bytes.len() as u64;
    if size > files.max_download_bytes {
        return Err(MediaRefusal::TooLarge { name, bytes: size, max: files.max_download_bytes });
    }
    let raw = match target {
        Some(path) if path.ends_with('/') => format!("{path}{name}"),
        Some(path) => path.to_owned(),
        None => {
            let uploads = files.uploads_dir.as_deref().unwrap_or(DEFAULT_UPLOADS_DIR);
            format!("{}/{name}", uploads.trim_end_matches('/'))
        }
    };
    let reach = Reach::new([dir.to_path_buf()], off_limits.clone());
    let resolved = project_path(&reach, dir, files, &raw)?;
    let access = if force { Access::Create } else { Access::CreateNew };
    let mut file = reach.open(&resolved, access).map_err(|err| match err {
        ContainError::Io { source, .. } if source.kind() == io::ErrorKind::AlreadyExists => {
            MediaRefusal::Exists { path: raw.clone() }
        }
        ContainError::Io { source, .. } => MediaRefusal::Save(source.to_string()),
        _ => MediaRefusal::Outside { path: raw.clone() },
    })?;
    file.write_all(bytes)
        .and_then(|()| file.sync_all())
        .map_err(|e| MediaRefusal::Save(e.to_string()))?;
    let root = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
    Ok(resolved.strip_prefix(&root).map(Path::to_path_buf).unwrap_or(resolved))
}

/// `/file get`: the project file at `path` in `dir`, as its name and bytes.
///
/// # Errors
/// A [`MediaRefusal`] the sender is told: outside the project, denied, not
/// found, not a regular file, larger than `max_upload_bytes`.
pub fn get_file(
    dir: &Path,
    off_limits: &OffLimits,
    files: &FilesConfig,
    path: &str,
) -> Result<(String, Vec<u8>), MediaRefusal> {
    let reach = Reach::new([dir.to_path_buf()], off_limits.clone());
    let resolved = project_path(&reach, dir, files, path)?;
    let shown = path.trim().to_owned();
    let mut file = reach.open(&resolved, Access::Read).map_err(|err| match err {
        ContainError::Io { source, .. } if source.kind() == io::ErrorKind::NotFound => {
            MediaRefusal::NotFound { path: shown.clone() }
        }
        ContainError::Io { source, .. } => MediaRefusal::Fetch(source.to_string()),
        _ => MediaRefusal::Outside { path: shown.clone() },
    })?;
    let meta = file.metadata().map_err(|e| MediaRefusal::Fetch(e.to_string()))?;
    if !meta.is_file() {
        return Err(MediaRefusal::NotAFile { path: shown });
    }
    let name = resolved.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or(shown);
    if meta.len() > files.max_upload_bytes {
        return Err(MediaRefusal::TooLarge {
            name,
            bytes: meta.len(),
            max: files.max_upload_bytes,
        });
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    Read::by_ref(&mut file)
        .take(files.max_upload_bytes + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| MediaRefusal::Fetch(e.to_string()))?;
    Ok((name, bytes))
}

/// What [`place`] did with a run's attachments.
#[derive(Debug, Default)]
pub struct Placed {
    /// The files now in the uploads directory.
    pub attachments: Vec<Attachment>,
    /// Files that could not be placed, with why (logged; the note says so).
    pub failed: Vec<(String, String)>,
}

impl Placed {
    /// The lines added to the prompt: each file's path (relative to `cwd`
    /// when inside it), kind, type and size.
    pub fn note(&self, cwd: &Path) -> Option<String> {
        if self.attachments.is_empty() && self.failed.is_empty() {
            return None;
        }
        let mut note =
            String::from("[Files sent with this message, saved in the working directory:");
        for a in &self.attachments {
            let shown = a.path.strip_prefix(cwd).unwrap_or(&a.path);
            note.push_str(&format!(
                "\n- {} ({}, {}, {})",
                shown.display(),
                a.kind.as_str(),
                a.mime,
                size_text(a.bytes)
            ));
        }
        for (name, why) in &self.failed {
            note.push_str(&format!("\n- {name}: not available ({why})"));
        }
        note.push(']');
        Some(note)
    }
}

/// Copies `attachments` from `stage` into their uploads directory under the
/// run's directory `cwd`, each under a name no file there has (`report.pdf`,
/// then `report-1.pdf`, …). An entry whose path is not a file of the stage
/// is dropped (logged): it was not received by a channel. The staged files
/// stay until the run has ended without a retry ([`MediaStage::discard`]):
/// a retried run gets them again.
pub fn place(
    attachments: &[Attachment],
    stage: &MediaStage,
    cwd: &Path,
    off_limits: &OffLimits,
) -> Placed {
    let mut placed = Placed::default();
    for attachment in attachments {
        if stage.staged_dir(&attachment.path).is_none() {
            tracing::warn!(
                name = %crate::log_text::escape(&attachment.name),
                "an attachment that is not a received file is dropped"
            );
            continue;
        }
        match place_one(attachment, cwd, off_limits) {
            Ok(path) => placed.attachments.push(Attachment { path, ..attachment.clone() }),
            Err(why) => {
                tracing::warn!(
                    name = %crate::log_text::escape(&attachment.name),
                    %why,
                    "a received file could not be saved for its run"
                );
                placed.failed.push((attachment.name.clone(), why));
            }
        }
    }
    placed
}

fn place_one(
    attachment: &Attachment,
    cwd: &Path,
    off_limits: &OffLimits,
) -> Result<PathBuf, String> {
    let name = check_file_name(&attachment.name).map_err(|e| e.to_string())?;
    let configured = attachment.uploads_dir.as_deref().unwrap_or(DEFAULT_UPLOADS_DIR);
    let configured = Path::new(configured);
    let (root, dir) = if configured.is_absolute() {
        if off_limits.overlaps(configured) {
            return Err(format!("{} is the gateway's own state", configured.display()));
        }
        std::fs::create_dir_all(configured)
            .map_err(|err| format!("cannot create {}: {err}", configured.display()))?;
        (configured.to_path_buf(), configured.to_path_buf())
    } else {
        (cwd.to_path_buf(), cwd.join(configured))
    };
    let reach = Reach::new([root], off_limits.clone());
    let (stem, ext) = match name.rsplit_once('.') {
        Some((stem, ext)) if !stem.is_empty() => (stem.to_owned(), format!(".{ext}")),
        _ => (name.clone(), String::new()),
    };
    // The directory is resolved once; each name is then created in it with
    // `O_EXCL`, which a link planted under that name fails too.
    let dir = reach.resolve(&dir).map_err(|err| err.to_string())?;
    let mut source = open_staged(&attachment.path).map_err(|err| err.to_string())?;
    for n in 0..1000 {
        let candidate = if n == 0 { name.clone() } else { format!("{stem}-{n}{ext}") };
        let resolved = dir.join(&candidate);
        match reach.open(&resolved, Access::CreateNew) {
            Ok(mut file) => {
                io::copy(&mut source, &mut file).map_err(|err| err.to_string())?;
                file.sync_all().map_err(|err| err.to_string())?;
                return Ok(resolved);
            }
            Err(ContainError::Io { source, .. })
                if source.kind() == io::ErrorKind::AlreadyExists => {}
            Err(err) => return Err(err.to_string()),
        }
    }
    Err(format!("no free name for {name} in {}", dir.display()))
}

fn open_staged(path: &Path) -> io::Result<impl Read> {
    let anywhere = Reach::new([PathBuf::from("/")], OffLimits::none());
    anywhere.open(path, Access::Read).map_err(|err| match err {
        ContainError::Io { source, .. } => source,
        other => io::Error::other(other.to_string()),
    })
}

#[cfg(test)]
mod tests;
