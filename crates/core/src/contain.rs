//! Keeping file paths inside the directories a run may touch.
//!
//! Every path a tool, an artifact line or a channel's file upload names goes
//! through [`resolve_inside`]: the path is made absolute, every symlink in it
//! is resolved, and the result must lie under one of the (also resolved)
//! roots. `../`, absolute paths elsewhere and symlinks pointing out are refused.

use std::io;
use std::path::{Component, Path, PathBuf};

/// Why a path was refused.
#[derive(Debug, thiserror::Error)]
pub enum ContainError {
    #[error("{path} is outside the allowed directories")]
    Outside { path: String },
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_inside_are_resolved_and_paths_outside_refused() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        std::fs::create_dir_all(root.join("sub")).unwrap();
        std::fs::write(root.join("sub/a.txt"), "a").unwrap();
        let canonical = root.canonicalize().unwrap();

        let inside = resolve_inside(&[&root], Path::new("sub/a.txt")).unwrap();
        assert_eq!(inside, canonical.join("sub/a.txt"));
        let new_file = resolve_inside(&[&root], Path::new("sub/new/b.txt")).unwrap();
        assert_eq!(new_file, canonical.join("sub/new/b.txt"));

        for bad in ["../x", "/etc/passwd", "sub/../../x", "sub/missing/../../../x"] {
            let err = resolve_inside(&[&root], Path::new(bad)).unwrap_err();
            assert!(
                matches!(err, ContainError::Outside { .. } | ContainError::Io { .. }),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn a_symlink_out_of_the_root_is_refused_and_a_second_root_is_allowed() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        let other = dir.path().join("other");
        std::fs::create_dir_all(&root).unwrap();
        std::fs::create_dir_all(&other).unwrap();
        std::fs::write(other.join("secret"), "s").unwrap();
        std::os::unix::fs::symlink(&other, root.join("link")).unwrap();

        let err = resolve_inside(&[&root], Path::new("link/secret")).unwrap_err();
        assert!(matches!(err, ContainError::Outside { .. }), "{err}");
        let ok = resolve_inside(&[&root, &other], Path::new("link/secret")).unwrap();
        assert_eq!(ok, other.canonicalize().unwrap().join("secret"));
    }
    #[test]
    fn a_dangling_symlink_is_judged_by_its_target() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        std::fs::create_dir_all(&root).unwrap();
        std::os::unix::fs::symlink(dir.path().join("elsewhere/new"), root.join("out")).unwrap();
        std::os::unix::fs::symlink(root.join("later"), root.join("in")).unwrap();

        let err = resolve_inside(&[&root], Path::new("out")).unwrap_err();
        assert!(matches!(err, ContainError::Outside { .. }), "{err}");
        let inside = resolve_inside(&[&root], Path::new("in")).unwrap();
        assert_eq!(inside, root.canonicalize().unwrap().join("later"));
    }
}
