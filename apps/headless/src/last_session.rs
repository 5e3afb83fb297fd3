//! The last session used from each directory, for `run --continue`: one JSON
//! file under the state home (mode 0600), keyed by the directory's bytes in hex
//! so no directory name, however odd, can change the file's structure.

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::{Deserialize, Serialize};

/// Directories remembered; the least recently used are forgotten first.
const MAX_ENTRIES: usize = 512;

#[derive(Debug, Default, Serialize, Deserialize)]
struct Record {
    #[serde(default)]
    dirs: BTreeMap<String, Entry>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Entry {
    session: String,
    /// A counter, larger for later writes (the order of use).
    used: u64,
}

/// The record's file under `home`.
pub fn file(home: &Path) -> PathBuf {
    home.join("cli-sessions.json")
}

fn key(dir: &Path) -> String {
    dir.as_os_str().as_bytes().iter().map(|b| format!("{b:02x}")).collect()
}

fn read(file: &Path) -> Record {
    std::fs::read(file)
        .ok()
        .and_then(|bytes| serde_json::from_slice(&bytes).ok())
        .unwrap_or_default()
}

/// The session last used from `dir`, if any.
pub fn get(file: &Path, dir: &Path) -> Option<String> {
    read(file).dirs.get(&key(dir)).map(|entry| entry.session.clone())
}

/// Records `session` as the last one used from `dir`.
///
/// # Errors
/// The file cannot be written.
pub fn set(file: &Path, dir: &Path, session: &str) -> anyhow::Result<()> {
    let mut record = read(file);
    let used = record.dirs.values().map(|entry| entry.used).max().unwrap_or(0) + 1;
    record.dirs.insert(key(dir), Entry { session: session.to_owned(), used });
    while record.dirs.len() > MAX_ENTRIES {
        let oldest = record.dirs.iter().min_by_key(|(_, entry)| entry.used).map(|(k, _)| k.clone());
        match oldest {
            Some(oldest) => record.dirs.remove(&oldest),
            None => break,
        };
    }
    if let Some(parent) = file.parent() {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("cannot create {}", parent.display()))?;
    }
    // Written next to the file and renamed over it: a reader never sees half a file.
    let tmp = file.with_extension(format!("json.{}", std::process::id()));
    let mut out = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .with_context(|| format!("cannot write {}", tmp.display()))?;
    out.write_all(&serde_json::to_vec(&record)?)?;
    std::fs::rename(&tmp, file).with_context(|| format!("cannot write {}", file.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn each_directory_keeps_its_own_last_session() {
        let home = tempfile::tempdir().unwrap();
        let file = file(home.path());
        let odd = Path::new("/tmp/a\"b\n\\c/../\u{1b}[31m");
        assert_eq!(get(&file, odd), None);
        set(&file, odd, "s1").unwrap();
        set(&file, Path::new("/tmp/other"), "s2").unwrap();
        assert_eq!(get(&file, odd).as_deref(), Some("s1"));
        assert_eq!(get(&file, Path::new("/tmp/other")).as_deref(), Some("s2"));
        set(&file, odd, "s3").unwrap();
        assert_eq!(get(&file, odd).as_deref(), Some("s3"));
        let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
    }

    #[test]
    fn a_damaged_file_reads_as_empty_and_is_replaced() {
        let home = tempfile::tempdir().unwrap();
        let file = file(home.path());
        std::fs::write(&file, "not json").unwrap();
        assert_eq!(get(&file, Path::new("/x")), None);
        set(&file, Path::new("/x"), "s").unwrap();
        assert_eq!(get(&file, Path::new("/x")).as_deref(), Some("s"));
    }

    #[test]
    fn the_least_recently_used_directories_are_forgotten() {
        let home = tempfile::tempdir().unwrap();
        let file = file(home.path());
        for i in 0..=MAX_ENTRIES {
            set(&file, Path::new(&format!("/d{i}")), "s").unwrap();
        }
        assert_eq!(get(&file, Path::new("/d0")), None);
        assert_eq!(get(&file, Path::new(&format!("/d{MAX_ENTRIES}"))).as_deref(), Some("s"));
    }
}
