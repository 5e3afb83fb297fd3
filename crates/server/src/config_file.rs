//! `config.toml` for the dashboard's editor: read as written, and saved only
//! after it is checked whole as a start would check it. A saved text goes
//! in place of the file in one rename, so the watch on the file (see
//! [`crate::reload`]) sees one complete edit and applies it like any other.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use lemon_api::api::{ConfigEditor, ConfigFileText, ConfigSaveError};
use lemon_core::secrets::SecretStore;

/// The running gateway's config file.
pub(crate) struct ConfigFile {
    pub(crate) path: PathBuf,
    /// The gateway's secrets, to check the names a text uses.
    pub(crate) secrets: Arc<SecretStore>,
    /// The process environment the engines would be built with.
    pub(crate) env: BTreeMap<String, String>,
}

impl std::fmt::Debug for ConfigFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConfigFile").field("path", &self.path).finish_non_exhaustive()
    }
}

impl ConfigEditor for ConfigFile {
    fn read(&self) -> std::io::Result<ConfigFileText> {
        let text = match std::fs::read_to_string(&self.path) {
            Ok(text) => Some(text),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => None,
            Err(error) => return Err(error),
        };
        Ok(ConfigFileText { path: self.path.clone(), text })
    }

    fn save(&self, text: &str) -> Result<Vec<String>, ConfigSaveError> {
        let warnings = crate::check_config_text(text, &self.path, &self.secrets, &self.env)
            .map_err(ConfigSaveError::Invalid)?;
        write_atomically(&self.path, text).map_err(ConfigSaveError::Write)?;
        tracing::info!(path = %self.path.display(), "config file saved from the API");
        Ok(warnings)
    }
}

/// Tells apart the siblings of saves that overlap.
static SAVES: AtomicU64 = AtomicU64::new(0);

/// Writes `text` to a sibling of `path`, syncs it and renames it over `path`
/// (the file a symlink points to, when `path` is one), keeping the file's
/// permissions (0600 for a new one). A failure leaves the old file as it was.
pub(crate) fn write_atomically(path: &Path, text: &str) -> std::io::Result<()> {
    let target = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_owned());
    let dir = target.parent().map_or_else(|| PathBuf::from("."), Path::to_path_buf);
    let name = target.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let n = SAVES.fetch_add(1, Ordering::Relaxed);
    let sibling = dir.join(format!(".{name}.{}.{n}.tmp", std::process::id()));
    let written = (|| {
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create(true).truncate(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
            let mode = std::fs::metadata(&target).map_or(0o600, |m| m.permissions().mode());
            options.mode(mode & 0o777);
        }
        let mut file = options.open(&sibling)?;
        file.write_all(text.as_bytes())?;
        file.sync_all()?;
        drop(file);
        std::fs::rename(&sibling, &target)?;
        // The rename itself is made durable by syncing the directory.
        if let Ok(dir) = std::fs::File::open(&dir) {
            let _ = dir.sync_all();
        }
        Ok(())
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&sibling);
    }
    written
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_save_replaces_the_file_whole_and_keeps_its_mode() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.toml");
        std::fs::write(&path, "# old\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        write_atomically(&path, "# new\n[gateway]\n").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "# new\n[gateway]\n");
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o640);
        let left: Vec<_> =
            std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(left, [std::ffi::OsString::from("config.toml")], "no sibling is left behind");

        let fresh = dir.path().join("new.toml");
        write_atomically(&fresh, "[gateway]\n").unwrap();
        assert_eq!(std::fs::metadata(&fresh).unwrap().permissions().mode() & 0o777, 0o600);
    }

    #[test]
    fn a_symlinked_config_is_written_through_the_link() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real.toml");
        std::fs::write(&real, "# old\n").unwrap();
        let link = dir.path().join("config.toml");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        write_atomically(&link, "# new\n").unwrap();
        assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink());
        assert_eq!(std::fs::read_to_string(&real).unwrap(), "# new\n");
    }

    #[test]
    fn a_refused_text_is_not_written() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.toml");
        std::fs::write(&path, "# kept\n").unwrap();
        let editor = ConfigFile {
            path: path.clone(),
            secrets: Arc::new(SecretStore::new(BTreeMap::new(), dir.path().join("secrets.toml"))),
            env: BTreeMap::new(),
        };
        let refused = editor.save("[gateway]\nmax_concurrent_runs = -1\n").unwrap_err();
        let ConfigSaveError::Invalid(error) = refused else { panic!("{refused}") };
        assert_eq!(error.position().map(|at| at.line), Some(2), "{error}");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "# kept\n");
        let unknown_engine = editor.save("[gateway]\ndefault_engine = \"nope\"\n").unwrap_err();
        assert!(unknown_engine.to_string().contains("nope"), "{unknown_engine}");
        assert_eq!(editor.read().unwrap().text.as_deref(), Some("# kept\n"));
        let warnings = editor.save("# mine\n[gateway]\nmax_concurent_runs = 1\n").unwrap();
        assert!(warnings[0].contains("max_concurrent_runs"), "{warnings:?}");
        assert_eq!(
            editor.read().unwrap().text.as_deref(),
            Some("# mine\n[gateway]\nmax_concurent_runs = 1\n")
        );
    }
}
