//! Keeping file paths inside the directories a run may touch, and out of the
//! gateway's own state.
//!
//! Every path a tool, an artifact line, a channel's file upload or a cron job
//! names goes through a [`Reach`]: the run's roots (its directory and the
//! workspace) and the gateway's [`OffLimits`] (its home, its config file's
//! directory, its secrets file, the keychain's files). [`Reach::resolve`]
//! makes the path absolute, resolves every symlink in it, and accepts the
//! result only when it lies under one of the (also resolved) roots and not in
//! the gateway's state. `../`, absolute paths elsewhere and symlinks pointing
//! out or into the state are refused.
//!
//! A path checked and then opened by name could be swapped in between (a
//! directory replaced by a link to the secrets). So the file itself is opened
//! by [`Reach::open`], which walks down from the root one component at a time
//! with `O_NOFOLLOW`: the checked path holds no link, so any link found on the
//! way was put there after the check and the open fails. A hard link to a
//! state file is caught by comparing the opened file's identity.
//!
//! [`resolve_inside`] is the check without the state: for the gateway's own
//! writes into its own directories (call recordings).

use std::ffi::OsString;
use std::fs::File;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use rustix::fs::{AtFlags, FileType, Mode, OFlags};

/// Why a path was refused.
#[derive(Debug, thiserror::Error)]
pub enum ContainError {
    #[error("{path} is outside the allowed directories")]
    Outside { path: String },
    /// The path is (or leads into) the gateway's home, config, secrets or keychain.
    #[error("{path} is the gateway's own state")]
    OffLimits { path: String },
    /// A link appeared on a checked path before it was opened.
    #[error("{path} changed while it was being opened")]
    Changed { path: String },
    #[error("{path}: {source}")]
    Io { path: String, source: io::Error },
    #[error("no directory is allowed")]
    NoRoots,
}

/// `path` resolved (symlinks included) and checked to be inside one of
/// `roots`. A relative path is taken relative to the first root. The path
/// itself need not exist (a file about to be written): its deepest existing
/// ancestor is resolved and the rest, which may not contain `..`, appended.
///
/// # Errors
/// [`ContainError::Outside`] for a path that leaves every root,
/// [`ContainError::Io`] when a root or an existing ancestor cannot be resolved.
pub fn resolve_inside(roots: &[&Path], path: &Path) -> Result<PathBuf, ContainError> {
    let first = roots.first().ok_or(ContainError::NoRoots)?;
    let shown = || path.display().to_string();
    let absolute = if path.is_absolute() { path.to_path_buf() } else { first.join(path) };
    let resolved = resolve_existing_prefix(&absolute)
        .map_err(|source| ContainError::Io { path: shown(), source })?;
    for root in roots {
        let Ok(root) = root.canonicalize() else { continue };
        if resolved.starts_with(&root) {
            return Ok(resolved);
        }
    }
    Err(ContainError::Outside { path: shown() })
}

/// How many dangling symlinks one path may go through before it counts as a loop.
const MAX_DANGLING_LINKS: usize = 40;

/// Canonicalises the deepest existing ancestor of `path` and appends the
/// components below it; `..` below the existing part is refused as not found.
/// A dangling symlink on the way (a link to a file not created yet) is
/// followed to where it points, so a write through it is judged by its target.
fn resolve_existing_prefix(path: &Path) -> io::Result<PathBuf> {
    let mut existing = path.to_path_buf();
    let mut rest = Vec::new();
    let mut links = 0;
    loop {
        match existing.canonicalize() {
            Ok(base) => {
                let mut out = base;
                for part in rest.iter().rev() {
                    out.push(part);
                }
                return Ok(out);
            }
            Err(err) if err.kind() == io::ErrorKind::NotFound => {
                if existing.symlink_metadata().is_ok_and(|meta| meta.file_type().is_symlink()) {
                    links += 1;
                    if links > MAX_DANGLING_LINKS {
                        return Err(io::Error::other("too many levels of symbolic links"));
                    }
                    let target = std::fs::read_link(&existing)?;
                    let parent = existing.parent().map(Path::to_path_buf).unwrap_or_default();
                    existing = parent.join(target);
                    continue;
                }
                let name = match existing.components().next_back() {
                    Some(Component::Normal(name)) => name.to_owned(),
                    _ => return Err(err),
                };
                rest.push(name);
                if !existing.pop() {
                    return Err(err);
                }
            }
            Err(err) => return Err(err),
        }
    }
}

/// What one entry of [`OffLimits`] says about the paths under it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rule {
    /// The gateway's state: no run reads or writes here.
    Denied,
    /// A directory inside a denied one that runs may use (the workspace, when
    /// it lives in the gateway's home).
    Allowed,
}

/// The gateway's own state, which no run may read or write whatever its
/// directory: its home, its config file's directory, its secrets file, the
/// keychain's files. Built once by the server from where it keeps things and
/// handed to every run; clones share it.
///
/// A path is judged by the deepest entry that holds it: a denied directory
/// with an allowed one inside (the workspace in the home) lets runs use the
/// inner one only, and a denied entry inside that (a config file kept in the
/// workspace) is denied again.
#[derive(Debug, Clone)]
pub struct OffLimits {
    /// Resolved (symlinks followed, as far as they exist), deepest first.
    entries: Arc<[(PathBuf, Rule)]>,
}

impl OffLimits {
    /// Nothing is off limits: for tests and tools that touch no files.
    pub fn none() -> Self {
        OffLimits { entries: Arc::from(Vec::new()) }
    }

    /// `denied` paths (directories or files, which need not exist yet), with
    /// the directories of `carved_out` inside them left usable. Relative
    /// paths are taken against the process's directory.
    pub fn new(
        denied: impl IntoIterator<Item = PathBuf>,
        carved_out: impl IntoIterator<Item = PathBuf>,
    ) -> Self {
        let resolve = |path: PathBuf| {
            let absolute = std::path::absolute(&path).unwrap_or(path);
            resolve_existing_prefix(&absolute).unwrap_or(absolute)
        };
        let mut entries: Vec<(PathBuf, Rule)> = denied
            .into_iter()
            .map(|path| (resolve(path), Rule::Denied))
            .chain(carved_out.into_iter().map(|path| (resolve(path), Rule::Allowed)))
            .collect();
        // Deepest first; at the same depth a denial comes before an allowance,
        // so a path named both ways is denied.
        entries.sort_by(|(a, rule_a), (b, rule_b)| {
            let deeper = b.components().count().cmp(&a.components().count());
            deeper.then_with(|| (*rule_a == Rule::Allowed).cmp(&(*rule_b == Rule::Allowed)))
        });
        entries.dedup();
        OffLimits { entries: Arc::from(entries) }
    }

    /// The denied paths, resolved.
    pub fn denied(&self) -> impl Iterator<Item = &Path> {
        self.entries
            .iter()
            .filter(|(_, rule)| *rule == Rule::Denied)
            .map(|(path, _)| path.as_path())
    }

    /// Whether `resolved` (absolute, symlinks resolved) is the gateway's state.
    pub fn denies(&self, resolved: &Path) -> bool {
        self.entries
            .iter()
            .find(|(entry, _)| resolved.starts_with(entry))
            .is_some_and(|(_, rule)| *rule == Rule::Denied)
    }

    /// Whether a run working in `dir` would have the gateway's state inside
    /// its directory or would itself be in it: such a directory is not used
    /// as a run's directory or workspace.
    pub fn overlaps(&self, dir: &Path) -> bool {
        let absolute = std::path::absolute(dir).unwrap_or_else(|_| dir.to_path_buf());
        let dir = resolve_existing_prefix(&absolute).unwrap_or(absolute);
        self.denies(&dir) || self.denied().any(|denied| denied.starts_with(&dir))
    }

    /// Whether the open file `meta` is one of the denied files under another
    /// name (a hard link). Only files with more than one link are compared.
    fn is_denied_file(&self, meta: &std::fs::Metadata) -> bool {
        meta.nlink() > 1
            && self.denied().any(|path| {
                std::fs::metadata(path)
                    .is_ok_and(|denied| denied.dev() == meta.dev() && denied.ino() == meta.ino())
            })
    }
}

/// How [`Reach::open`] opens a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// An existing file, for reading.
    Read,
    /// An existing file, for reading and writing in place.
    ReadWrite,
    /// A file created or truncated for writing; missing parent directories
    /// are created.
    Create,
    /// A new file created for writing, failing with `AlreadyExists` when the
    /// name is taken (by anything, a link included); missing parent
    /// directories are created.
    CreateNew,
}

/// The kind of a directory entry, as [`Reach::read_dir`] reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    File,
    Dir,
    Symlink,
    Other,
}

/// Where one run may read and write: its roots (the run's directory, then
/// the workspace) less the gateway's [`OffLimits`].
#[derive(Debug, Clone)]
pub struct Reach {
    roots: Vec<PathBuf>,
    /// The roots that exist, resolved once: what opens walk down from.
    canonical: Vec<PathBuf>,
    off_limits: OffLimits,
}

impl Reach {
    /// `roots` in order: a relative path is taken against the first.
    pub fn new(roots: impl IntoIterator<Item = PathBuf>, off_limits: OffLimits) -> Self {
        let roots: Vec<PathBuf> = roots.into_iter().collect();
        let canonical = roots.iter().filter_map(|root| root.canonicalize().ok()).collect();
        Reach { roots, canonical, off_limits }
    }

    pub fn roots(&self) -> &[PathBuf] {
        &self.roots
    }

    /// The same state kept out, with other roots.
    pub fn with_roots(&self, roots: impl IntoIterator<Item = PathBuf>) -> Reach {
        Reach::new(roots, self.off_limits.clone())
    }

    /// `path` resolved (symlinks included), inside a root and outside the
    /// gateway's state. As with [`resolve_inside`], the path need not exist.
    ///
    /// # Errors
    /// [`ContainError::Outside`] for a path that leaves every root,
    /// [`ContainError::OffLimits`] for the gateway's state,
    /// [`ContainError::Io`] when it cannot be resolved.
    pub fn resolve(&self, path: &Path) -> Result<PathBuf, ContainError> {
        let roots: Vec<&Path> = self.roots.iter().map(PathBuf::as_path).collect();
        let resolved = resolve_inside(&roots, path)?;
        if self.off_limits.denies(&resolved) {
            return Err(ContainError::OffLimits { path: path.display().to_string() });
        }
        Ok(resolved)
    }

    /// Whether `resolved` (absolute, symlinks resolved) is inside a root and
    /// outside the gateway's state: what a directory walk keeps.
    pub fn allows(&self, resolved: &Path) -> bool {
        !self.off_limits.denies(resolved)
            && self.canonical.iter().any(|root| resolved.starts_with(root))
    }

    /// Whether `resolved` (absolute, symlinks resolved) is the gateway's
    /// state: what a walk below a root skips, without entering it.
    pub fn denies(&self, resolved: &Path) -> bool {
        self.off_limits.denies(resolved)
    }

    /// Opens `resolved`, a path [`Reach::resolve`] returned, walking down
    /// from its root without following any link: a link that appeared since
    /// the check fails the open instead of leading elsewhere.
    ///
    /// # Errors
    /// [`ContainError::Changed`] when a link or a non-directory is found on
    /// the way, [`ContainError::OffLimits`] for a hard link to a state file,
    /// [`ContainError::Outside`] for a path under no root, [`ContainError::Io`]
    /// for the rest (not found, permission denied).
    pub fn open(&self, resolved: &Path, access: Access) -> Result<File, ContainError> {
        let file = File::from(self.open_fd(resolved, access)?);
        let meta = file.metadata().map_err(|source| io_error(resolved, source))?;
        if self.off_limits.is_denied_file(&meta) {
            return Err(ContainError::OffLimits { path: resolved.display().to_string() });
        }
        Ok(file)
    }

    /// The entries of the directory `resolved` (not `.` and `..`), read
    /// through a descriptor opened as [`Reach::open`] does.
    ///
    /// # Errors
    /// As [`Reach::open`]; reading the entries may fail too.
    pub fn read_dir(&self, resolved: &Path) -> Result<Vec<(OsString, EntryKind)>, ContainError> {
        let fd = self.open_fd(resolved, Access::Read)?;
        let meta = rustix::fs::fstat(&fd).map_err(|e| io_error(resolved, e.into()))?;
        if FileType::from_raw_mode(meta.st_mode) != FileType::Directory {
            return Err(io_error(resolved, io::Error::other("not a directory")));
        }
        let mut dir = rustix::fs::Dir::read_from(&fd).map_err(|e| io_error(resolved, e.into()))?;
        let mut out = Vec::new();
        while let Some(entry) = dir.read() {
            let entry = entry.map_err(|e| io_error(resolved, e.into()))?;
            let name = entry.file_name().to_bytes();
            if name == b"." || name == b".." {
                continue;
            }
            let kind = match entry.file_type() {
                FileType::Unknown => {
                    rustix::fs::statat(&fd, entry.file_name(), AtFlags::SYMLINK_NOFOLLOW)
                        .map(|stat| FileType::from_raw_mode(stat.st_mode))
                        .unwrap_or(FileType::Unknown)
                }
                known => known,
            };
            let kind = match kind {
                FileType::RegularFile => EntryKind::File,
                FileType::Directory => EntryKind::Dir,
                FileType::Symlink => EntryKind::Symlink,
                _ => EntryKind::Other,
            };
            out.push((std::ffi::OsStr::from_bytes(name).to_owned(), kind));
        }
        Ok(out)
    }

    fn open_fd(&self, resolved: &Path, access: Access) -> Result<OwnedFd, ContainError> {
        let shown = || resolved.display().to_string();
        if self.off_limits.denies(resolved) {
            return Err(ContainError::OffLimits { path: shown() });
        }
        // The deepest root holding the path, so the walk below it is short.
        let root = self
            .canonical
            .iter()
            .filter(|root| resolved.starts_with(root))
            .max_by_key(|root| root.components().count())
            .ok_or_else(|| ContainError::Outside { path: shown() })?;
        let rel =
            resolved.strip_prefix(root).map_err(|_| ContainError::Outside { path: shown() })?;
        let mut names = Vec::new();
        for part in rel.components() {
            match part {
                Component::Normal(name) => names.push(name),
                // A resolved path has none of these.
                _ => return Err(ContainError::Outside { path: shown() }),
            }
        }
        let dir_flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let mut dir = rustix::fs::open(root, dir_flags, Mode::empty())
            .map_err(|e| walk_error(resolved, e.into()))?;
        let Some((last, parents)) = names.split_last() else {
            // The root itself (listing the run's directory).
            return Ok(dir);
        };
        for name in parents {
            if matches!(access, Access::Create | Access::CreateNew) {
                match rustix::fs::mkdirat(&dir, *name, Mode::from_raw_mode(0o777)) {
                    Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                    Err(e) => return Err(io_error(resolved, e.into())),
                }
            }
            dir = rustix::fs::openat(&dir, *name, dir_flags, Mode::empty())
                .map_err(|e| walk_error(resolved, e.into()))?;
        }
        // Non-blocking, so a FIFO planted under the checked name cannot hold
        // the open forever; it changes nothing for regular files.
        let flags = OFlags::NOFOLLOW
            | OFlags::CLOEXEC
            | OFlags::NONBLOCK
            | match access {
                Access::Read => OFlags::RDONLY,
                Access::ReadWrite => OFlags::RDWR,
                Access::Create => OFlags::WRONLY | OFlags::CREATE | OFlags::TRUNC,
                Access::CreateNew => OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL,
            };
        rustix::fs::openat(&dir, *last, flags, Mode::from_raw_mode(0o666))
            .map_err(|e| walk_error(resolved, e.into()))
    }
}

/// The bytes of `path`, a file a [`Reach`] resolved earlier (absolute, no
/// link in it), read without following any link: one swapped in since the
/// check fails the read. For channels sending a run's files later.
///
/// # Errors
/// The file cannot be opened or read, or a link appeared on its path.
pub async fn read_checked(path: &Path) -> io::Result<Vec<u8>> {
    let path = path.to_path_buf();
    let read = move || -> io::Result<Vec<u8>> {
        let anywhere = Reach::new([PathBuf::from("/")], OffLimits::none());
        let mut file = anywhere.open(&path, Access::Read).map_err(|err| match err {
            ContainError::Io { source, .. } => source,
            other => io::Error::other(other.to_string()),
        })?;
        let mut bytes = Vec::new();
        io::Read::read_to_end(&mut file, &mut bytes)?;
        Ok(bytes)
    };
    tokio::task::spawn_blocking(read).await.map_err(io::Error::other)?
}

fn io_error(path: &Path, source: io::Error) -> ContainError {
    ContainError::Io { path: path.display().to_string(), source }
}

/// A link met by `O_NOFOLLOW` (`ELOOP`) or a file where a directory was
/// (`ENOTDIR`) means the checked path changed; other errors stay what they are.
fn walk_error(path: &Path, source: io::Error) -> ContainError {
    match source.raw_os_error() {
        Some(code)
            if code == rustix::io::Errno::LOOP.raw_os_error()
                || code == rustix::io::Errno::NOTDIR.raw_os_error() =>
        {
            ContainError::Changed { path: path.display().to_string() }
        }
        _ => io_error(path, source),
    }
}

#[cfg(test)]
mod tests;
