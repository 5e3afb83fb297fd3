//! `secrets.toml`: a flat table of strings, written atomically with mode 0600.

use std::collections::BTreeMap;
use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use toml_edit::{DocumentMut, ImDocument, Item, Value};

use super::{SecretSource, SecretValue, SecretsError, SecretsWarning, SourceKind};
use crate::config::Position;

/// The secrets file at a path. The file is read on every lookup and may not
/// exist (then it has no secrets).
#[derive(Debug, Clone)]
pub struct SecretsFile {
    path: PathBuf,
}

impl SecretsFile {
    pub fn new(path: PathBuf) -> Self {
        SecretsFile { path }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file's text, or `None` when it does not exist.
    fn read_text(&self) -> Result<Option<String>, SecretsError> {
        match fs::read_to_string(&self.path) {
            Ok(text) => Ok(Some(text)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(SecretsError::Read { path: self.path.clone(), message: e.to_string() }),
        }
    }

    /// Parses `text`, checking that every entry is a string. Error messages come
    /// from the TOML parser (static descriptions and key names) or from here, and
    /// never quote the text, so no value leaks into them.
    fn parse<'t>(&self, text: &'t str) -> Result<ImDocument<&'t str>, SecretsError> {
        let doc = ImDocument::parse(text).map_err(|e| SecretsError::Malformed {
            path: self.path.clone(),
            at: e.span().map(|s| Position::of_offset(text, s.start)),
            message: e
                .message()
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .collect::<Vec<_>>()
                .join("; "),
        })?;
        for (name, item) in doc.iter() {
            if !matches!(item, Item::Value(Value::String(_))) {
                return Err(SecretsError::Malformed {
                    path: self.path.clone(),
                    at: item.span().map(|s| Position::of_offset(text, s.start)),
                    message: format!("secret `{name}` must be a string"),
                });
            }
        }
        Ok(doc)
    }

    /// Every secret in the file.
    ///
    /// # Errors
    /// [`SecretsError::Read`], [`SecretsError::Malformed`].
    pub fn read_all(&self) -> Result<BTreeMap<String, SecretValue>, SecretsError> {
        let Some(text) = self.read_text()? else {
            return Ok(BTreeMap::new());
        };
        let doc = self.parse(&text)?;
        Ok(doc
            .iter()
            .filter_map(|(name, item)| Some((name.to_owned(), SecretValue::new(item.as_str()?))))
            .collect())
    }

    /// Sets one secret, keeping the other entries and comments, by writing a new
    /// 0600 file next to the old one and renaming it over.
    pub(super) fn set(&self, name: &str, value: &str) -> Result<(), SecretsError> {
        let text = self.read_text()?.unwrap_or_default();
        let mut doc: DocumentMut = self.parse(&text)?.into_mut();
        doc[name] = toml_edit::value(value);
        self.write_atomically(doc.to_string().as_bytes()).map_err(|e| SecretsError::Write {
            path: self.path.clone(),
            name: name.to_owned(),
            message: e.to_string(),
        })
    }

    fn write_atomically(&self, contents: &[u8]) -> io::Result<()> {
        let dir = match self.path.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir.to_owned(),
            _ => PathBuf::from("."),
        };
        create_private_dir(&dir)?;
        let file_name =
            self.path.file_name().map_or_else(|| "secrets.toml".into(), |n| n.to_string_lossy());
        let tmp = dir.join(format!(".{file_name}.{}.tmp", uuid::Uuid::new_v4().simple()));
        let result = (|| {
            let mut file = create_private_file(&tmp)?;
            file.write_all(contents)?;
            file.sync_all()?;
            fs::rename(&tmp, &self.path)
        })();
        if result.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        result?;
        // Persist the rename itself; failing to is not worth failing the save.
        if let Ok(dir) = fs::File::open(&dir) {
            let _ = dir.sync_all();
        }
        Ok(())
    }

    /// A warning when group or other users can read or write the file.
    pub fn permission_warning(&self) -> Option<SecretsWarning> {
        let mode = file_mode(&self.path)?;
        (mode & 0o077 != 0)
            .then(|| SecretsWarning::FileAccessibleByOthers { path: self.path.clone(), mode })
    }
}

impl SecretsFile {
    /// The value of `name` exactly as the file has it, an empty string too (which
    /// [`SecretSource::get`] counts as unset).
    ///
    /// # Errors
    /// [`SecretsError::Read`], [`SecretsError::Malformed`].
    pub fn get_as_written(&self, name: &str) -> Result<Option<SecretValue>, SecretsError> {
        let Some(text) = self.read_text()? else {
            return Ok(None);
        };
        let doc = self.parse(&text)?;
        Ok(doc.get(name).and_then(Item::as_str).map(SecretValue::new))
    }
}

impl SecretsFile {
    /// Removes `name`, keeping the other entries and comments; whether it was
    /// there. The file is not rewritten when it was not.
    ///
    /// # Errors
    /// [`SecretsError::Read`], [`SecretsError::Malformed`], [`SecretsError::Write`].
    pub fn remove(&self, name: &str) -> Result<bool, SecretsError> {
        let Some(text) = self.read_text()? else {
            return Ok(false);
        };
        let mut doc: DocumentMut = self.parse(&text)?.into_mut();
        if doc.remove(name).is_none() {
            return Ok(false);
        }
        self.write_atomically(doc.to_string().as_bytes()).map_err(|e| SecretsError::Write {
            path: self.path.clone(),
            name: name.to_owned(),
            message: e.to_string(),
        })?;
        Ok(true)
    }
}

impl SecretSource for SecretsFile {
    fn describe(&self) -> String {
        self.path.display().to_string()
    }

    fn get(&self, name: &str) -> Result<Option<SecretValue>, SecretsError> {
        Ok(self.get_as_written(name)?.filter(|v| !v.expose().is_empty()))
    }

    fn kind(&self) -> SourceKind {
        SourceKind::File
    }

    fn writable(&self) -> bool {
        true
    }

    fn store(&self, name: &str, value: &str) -> Result<(), SecretsError> {
        self.set(name, value)
    }

    fn remove(&self, name: &str) -> Result<bool, SecretsError> {
        SecretsFile::remove(self, name)
    }

    fn names(&self) -> Result<Vec<String>, SecretsError> {
        Ok(self.read_all()?.into_keys().collect())
    }
}

#[cfg(unix)]
fn create_private_dir(dir: &Path) -> io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)
}

#[cfg(not(unix))]
fn create_private_dir(dir: &Path) -> io::Result<()> {
    fs::create_dir_all(dir)
}

/// A new file only the owner can read and write (mode 0600 from creation, so the
/// value is never briefly readable by others).
#[cfg(unix)]
fn create_private_file(path: &Path) -> io::Result<fs::File> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let file = fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path)?;
    // The umask can only remove bits; set the mode exactly anyway.
    file.set_permissions(fs::Permissions::from_mode(0o600))?;
    Ok(file)
}

#[cfg(not(unix))]
fn create_private_file(path: &Path) -> io::Result<fs::File> {
    fs::OpenOptions::new().write(true).create_new(true).open(path)
}

#[cfg(unix)]
fn file_mode(path: &Path) -> Option<u32> {
    use std::os::unix::fs::PermissionsExt;
    fs::metadata(path).ok().map(|m| m.permissions().mode() & 0o777)
}

#[cfg(not(unix))]
fn file_mode(_path: &Path) -> Option<u32> {
    None
}
