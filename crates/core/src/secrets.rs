//! Secret values (API tokens, keys), looked up by name.
//!
//! Config names a secret; the value comes from the sources the app gives, in
//! order: the environment map the app passed in, then `$LEMON_HOME/secrets.toml`
//! (mode 0600). The app puts the OS keychain in front of the others with
//! [`SecretStore::with_keychain`] (or any source with
//! [`SecretStore::with_source_first`]); [`SecretStore::store`] saves to the
//! first writable source, the keychain when there is one. Values are never
//! logged: [`SecretValue`]'s `Debug` and `Display` print a placeholder, and errors
//! name the file and the secret, never a value.
//!
//! The library reads no environment variables itself: the app passes the process
//! environment (or any other map) to [`SecretStore::new`].
//!
//! # `secrets.toml`
//! A flat table of strings, `name = "value"`. [`SecretStore::set`] rewrites it
//! atomically (temporary file, then rename) with mode 0600, keeping comments and
//! other entries. A file that other users can read or write is still used, so a
//! server keeps starting, but [`SecretStore::warnings`] reports it for the app to
//! log; it is not tightened behind the user's back on read. The next `set`
//! replaces it with a 0600 file.

mod file;

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

pub use file::SecretsFile;

use crate::config::Position;

/// A secret value. `Debug` and `Display` print `SecretValue(***)`; call
/// [`SecretValue::expose`] where the value is really needed.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretValue(String);

impl SecretValue {
    pub fn new(value: impl Into<String>) -> Self {
        SecretValue(value.into())
    }

    /// The value itself. Do not log it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for SecretValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SecretValue(***)")
    }
}

impl fmt::Display for SecretValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SecretValue(***)")
    }
}

/// Fewest characters a bearer token may have (a generated one has 64).
pub const MIN_TOKEN_CHARS: usize = 16;

/// A configured bearer token that must not be used. Names where the token came
/// from, never its value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    /// Empty or only whitespace.
    #[error("the API token from {origin} is blank; set one of at least {MIN_TOKEN_CHARS} characters, or remove it to have one generated")]
    Blank { origin: String },
    /// Fewer than [`MIN_TOKEN_CHARS`] characters after trimming.
    #[error("the API token from {origin} is shorter than {MIN_TOKEN_CHARS} characters; use a longer one, or remove it to have one generated")]
    TooShort { origin: String },
}

/// `value` as a bearer token: trimmed (tokens are compared trimmed), and refused
/// when blank or shorter than [`MIN_TOKEN_CHARS`]. `origin` says where it came
/// from (`the environment variable LEMON_API_TOKEN`, a file) for the error.
///
/// # Errors
/// [`TokenError`] naming `origin`.
pub fn check_bearer_token(value: &SecretValue, origin: &str) -> Result<SecretValue, TokenError> {
    let trimmed = value.expose().trim();
    if trimmed.is_empty() {
        return Err(TokenError::Blank { origin: origin.to_owned() });
    }
    if trimmed.chars().count() < MIN_TOKEN_CHARS {
        return Err(TokenError::TooShort { origin: origin.to_owned() });
    }
    Ok(SecretValue::new(trimmed))
}

/// A secret that could not be looked up or saved. Messages name the file and the
/// secret, never its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SecretsError {
    /// Secret names are letters, digits, `_`, `-` and `.`.
    InvalidName { name: String },
    /// The secrets file exists but could not be read.
    Read { path: PathBuf, message: String },
    /// The secrets file is not a flat TOML table of strings.
    Malformed { path: PathBuf, at: Option<Position>, message: String },
    /// The secrets file could not be written.
    Write { path: PathBuf, name: String, message: String },
    /// The OS gave no randomness for a generated secret.
    Random { message: String },
    /// Another source (such as a keychain) failed.
    Backend { backend: String, name: String, message: String },
}

impl fmt::Display for SecretsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SecretsError::InvalidName { name } => {
                write!(f, "invalid secret name {name:?}: use letters, digits, `_`, `-` and `.`")
            }
            SecretsError::Read { path, message } => {
                write!(f, "{}: cannot read secrets file: {message}", path.display())
            }
            SecretsError::Malformed { path, at, message } => {
                write!(f, "{}", path.display())?;
                if let Some(at) = at {
                    write!(f, ":{at}")?;
                }
                write!(f, ": malformed secrets file: {message}")
            }
            SecretsError::Write { path, name, message } => {
                write!(f, "{}: cannot save secret `{name}`: {message}", path.display())
            }
            SecretsError::Random { message } => write!(f, "cannot generate a secret: {message}"),
            SecretsError::Backend { backend, name, message } => {
                write!(f, "{backend}: cannot look up secret `{name}`: {message}")
            }
        }
    }
}

impl std::error::Error for SecretsError {}

/// Something to be logged about the secret sources; not an error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SecretsWarning {
    /// The secrets file's mode lets group or other users read or write it.
    FileAccessibleByOthers { path: PathBuf, mode: u32 },
}

impl fmt::Display for SecretsWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SecretsWarning::FileAccessibleByOthers { path, mode } => write!(
                f,
                "{} is readable or writable by other users (mode {mode:04o}); run chmod 600 {}",
                path.display(),
                path.display()
            ),
        }
    }
}

/// One place secrets are looked up, in the chain [`SecretStore`] walks.
///
/// `Debug` implementations must not print values.
pub trait SecretSource: fmt::Debug + Send + Sync {
    /// What the source is, for messages: `environment`, a file path, `keychain`.
    fn describe(&self) -> String;

    /// Where this source looks for secret `name`, for a message saying it is
    /// missing: `the environment variable ZAPIER_WEBHOOK_TOKEN`. By default
    /// [`SecretSource::describe`].
    fn location(&self, _name: &str) -> String {
        self.describe()
    }

    /// The value of secret `name`, or `None` when this source does not have it.
    ///
    /// # Errors
    /// [`SecretsError`] when the source exists but cannot be read.
    fn get(&self, name: &str) -> Result<Option<SecretValue>, SecretsError>;

    /// What kind of place this is, for `GET /v1/secrets` and `secrets list`.
    /// By default [`SourceKind::File`].
    fn kind(&self) -> SourceKind {
        SourceKind::File
    }

    /// Whether [`SecretSource::store`] saves here. By default `false`.
    fn writable(&self) -> bool {
        false
    }

    /// Saves `value` as secret `name`. By default refused: the source is read-only.
    ///
    /// # Errors
    /// [`SecretsError`] when it cannot be saved.
    fn store(&self, name: &str, _value: &str) -> Result<(), SecretsError> {
        Err(SecretsError::Backend {
            backend: self.describe(),
            name: name.to_owned(),
            message: "this source is read-only".to_owned(),
        })
    }

    /// Removes secret `name`; whether it was there. By default nothing is removed.
    ///
    /// # Errors
    /// [`SecretsError`] when it cannot be removed.
    fn remove(&self, _name: &str) -> Result<bool, SecretsError> {
        Ok(false)
    }

    /// The names this source holds, where it can tell (a file can, the
    /// environment cannot: any variable could be one). By default none.
    ///
    /// # Errors
    /// [`SecretsError`] when the source cannot be read.
    fn names(&self) -> Result<Vec<String>, SecretsError> {
        Ok(Vec::new())
    }
}

/// The kind of place a secret is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SourceKind {
    /// The OS keychain (Secret Service, kernel keyutils, macOS Keychain,
    /// Windows Credential Manager).
    Keychain,
    /// The gateway's environment.
    Env,
    /// `$LEMON_HOME/secrets.toml`.
    File,
    /// Written into config.toml itself (works, with a warning).
    Inline,
}

impl SourceKind {
    /// `keychain`, `env`, `file` or `inline`.
    pub fn as_str(self) -> &'static str {
        match self {
            SourceKind::Keychain => "keychain",
            SourceKind::Env => "env",
            SourceKind::File => "file",
            SourceKind::Inline => "inline",
        }
    }
}

impl fmt::Display for SourceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Whether the OS keychain can be used, and why not, for `GET /v1/secrets`,
/// `secrets list` and `doctor`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeychainStatus {
    pub available: bool,
    /// The backend in use (`Secret Service`), or why there is none.
    pub detail: String,
}

impl KeychainStatus {
    /// No keychain, for `detail`'s reason.
    pub fn unavailable(detail: impl Into<String>) -> Self {
        KeychainStatus { available: false, detail: detail.into() }
    }
}

/// The longest name a secret set through the API or the command line may have.
pub const MAX_SETTABLE_NAME: usize = 64;

/// A secret name as the API and the `secrets` command take it:
/// `[a-z0-9_]{1,64}`.
///
/// # Errors
/// [`SecretsError::InvalidName`].
pub fn check_settable_name(name: &str) -> Result<(), SecretsError> {
    let valid = !name.is_empty()
        && name.len() <= MAX_SETTABLE_NAME
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    if valid {
        Ok(())
    } else {
        Err(SecretsError::InvalidName { name: name.to_owned() })
    }
}

/// Secrets from an environment map, under the name upper-cased with `-` and `.`
/// turned into `_` (`lemon_api_token` → `LEMON_API_TOKEN`). Empty values count as
/// unset.
#[derive(Clone)]
pub struct EnvSource {
    vars: BTreeMap<String, String>,
}

impl EnvSource {
    pub fn new(vars: BTreeMap<String, String>) -> Self {
        EnvSource { vars }
    }
}

/// The environment variable a secret is read from: `lemon_api_token` →
/// `LEMON_API_TOKEN`.
pub fn env_var_name(secret: &str) -> String {
    secret
        .chars()
        .map(|c| if c == '-' || c == '.' { '_' } else { c.to_ascii_uppercase() })
        .collect()
}

impl fmt::Debug for EnvSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EnvSource").field("n_vars", &self.vars.len()).finish()
    }
}

impl SecretSource for EnvSource {
    fn describe(&self) -> String {
        "environment".to_owned()
    }

    fn location(&self, name: &str) -> String {
        format!("the environment variable {}", env_var_name(name))
    }

    fn get(&self, name: &str) -> Result<Option<SecretValue>, SecretsError> {
        Ok(self.vars.get(&env_var_name(name)).filter(|v| !v.is_empty()).map(SecretValue::new))
    }

    fn kind(&self) -> SourceKind {
        SourceKind::Env
    }
}

/// Where a secret's value comes from; see [`SecretStore::origin`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretOrigin {
    /// The source in use (`the environment variable TELEGRAM_BOT_TOKEN`).
    pub source: String,
    /// Later sources that have it too and are not used.
    pub overrides: Vec<String>,
}

/// The chain of secret sources, plus the secrets file that new secrets are saved
/// to. Built by the app; cheap to keep for the life of the process. File access
/// is synchronous: the file is tiny and read on every lookup, so edits made by
/// hand or by another process are seen without a restart.
#[derive(Debug)]
pub struct SecretStore {
    /// Looked up in order; the first that has the secret wins.
    sources: Vec<Box<dyn SecretSource>>,
    /// Also the last entry of `sources`; [`SecretStore::set`] writes here.
    file: SecretsFile,
    /// Whether a keychain is in the chain, as the app found it.
    keychain: KeychainStatus,
}

impl SecretStore {
    /// Environment first, then `secrets_file` (normally `$LEMON_HOME/secrets.toml`).
    pub fn new(env: BTreeMap<String, String>, secrets_file: PathBuf) -> Self {
        let file = SecretsFile::new(secrets_file);
        SecretStore {
            sources: vec![Box::new(EnvSource::new(env)), Box::new(file.clone())],
            file,
            keychain: KeychainStatus::unavailable("no keychain was looked for"),
        }
    }

    /// Puts the keychain in front of the chain when `source` is `Some`, and
    /// records what [`SecretStore::keychain`] reports.
    #[must_use]
    pub fn with_keychain(
        mut self,
        source: Option<Box<dyn SecretSource>>,
        status: KeychainStatus,
    ) -> Self {
        if let Some(source) = source {
            self.sources.insert(0, source);
        }
        self.keychain = status;
        self
    }

    /// Whether the keychain is in use, and why not.
    pub fn keychain(&self) -> &KeychainStatus {
        &self.keychain
    }

    /// Puts `source` in front of the chain (the keychain, when there is one).
    #[must_use]
    pub fn with_source_first(mut self, source: impl SecretSource + 'static) -> Self {
        self.sources.insert(0, Box::new(source));
        self
    }

    /// Where [`SecretStore::set`] saves secrets.
    pub fn file_path(&self) -> &Path {
        self.file.path()
    }

    /// What each source is, in lookup order, for `doctor`-style output.
    pub fn describe_sources(&self) -> Vec<String> {
        self.sources.iter().map(|s| s.describe()).collect()
    }

    /// Why secret `name` is missing, for an error: where it was looked for, in
    /// lookup order, and how to set it: `secret "zapier_webhook_token" is not
    /// set (looked in the environment variable ZAPIER_WEBHOOK_TOKEN,
    /// /home/u/.lemon/secrets.toml); add zapier_webhook_token = "…" to
    /// /home/u/.lemon/secrets.toml (mode 0600) or set ZAPIER_WEBHOOK_TOKEN in the
    /// gateway's environment`.
    pub fn not_set_message(&self, name: &str) -> String {
        let looked: Vec<String> = self.sources.iter().map(|s| s.location(name)).collect();
        format!(
            "secret {name:?} is not set (looked in {}); add {name} = \"…\" to {} (mode 0600) or set {} in the gateway's environment",
            looked.join(", "),
            self.file.path().display(),
            env_var_name(name)
        )
    }

    /// Which source secret `name` comes from ([`SecretSource::describe`]) and
    /// the later sources that also have it and are overridden by it (a stale
    /// `TELEGRAM_BOT_TOKEN` in the environment over `secrets.toml`, say).
    /// `None` when no source has it.
    ///
    /// # Errors
    /// As [`SecretStore::get`].
    pub fn origin(&self, name: &str) -> Result<Option<SecretOrigin>, SecretsError> {
        check_name(name)?;
        let mut found: Option<SecretOrigin> = None;
        for source in &self.sources {
            if source.get(name)?.is_none() {
                continue;
            }
            match &mut found {
                None => {
                    found =
                        Some(SecretOrigin { source: source.location(name), overrides: Vec::new() });
                }
                Some(origin) => origin.overrides.push(source.location(name)),
            }
        }
        Ok(found)
    }

    /// The value of secret `name` from the first source that has it.
    ///
    /// # Errors
    /// [`SecretsError::InvalidName`], or the error of a source that cannot be read
    /// (a malformed secrets file is an error, not a miss).
    pub fn get(&self, name: &str) -> Result<Option<SecretValue>, SecretsError> {
        check_name(name)?;
        for source in &self.sources {
            if let Some(value) = source.get(name)? {
                return Ok(Some(value));
            }
        }
        Ok(None)
    }

    /// Saves `value` as secret `name` in the secrets file, creating the file (mode
    /// 0600) and its directory (mode 0700) as needed. A source earlier in the chain
    /// (the environment) still wins on [`SecretStore::get`].
    ///
    /// # Errors
    /// [`SecretsError::InvalidName`], [`SecretsError::Malformed`] when the existing
    /// file cannot be parsed (it is left alone), [`SecretsError::Write`].
    pub fn set(&self, name: &str, value: &str) -> Result<(), SecretsError> {
        check_name(name)?;
        self.file.set(name, value)
    }

    /// The value of secret `name`; when no source has it, a new random token (32
    /// bytes, 64 hex characters) saved to the secrets file. The flag says whether
    /// it was generated now.
    ///
    /// # Errors
    /// As [`SecretStore::get`] and [`SecretStore::set`], and
    /// [`SecretsError::Random`].
    pub fn get_or_generate(&self, name: &str) -> Result<(SecretValue, bool), SecretsError> {
        if let Some(value) = self.get(name)? {
            return Ok((value, false));
        }
        let value = generate_token()?;
        self.set(name, value.expose())?;
        Ok((value, true))
    }

    /// The kind of the first source that has secret `name`.
    ///
    /// # Errors
    /// As [`SecretStore::get`].
    pub fn kind_of(&self, name: &str) -> Result<Option<SourceKind>, SecretsError> {
        check_name(name)?;
        for source in &self.sources {
            if source.get(name)?.is_some() {
                return Ok(Some(source.kind()));
            }
        }
        Ok(None)
    }

    /// Saves `value` as secret `name` in the first writable source (the
    /// keychain when there is one, else the secrets file), and takes it out of
    /// the writable sources after it, so the saved value is the one used over
    /// them. Returns where it went.
    ///
    /// # Errors
    /// [`SecretsError::InvalidName`] (see [`check_settable_name`]), or the
    /// source's error when it cannot be saved.
    pub fn store(&self, name: &str, value: &str) -> Result<SourceKind, SecretsError> {
        check_settable_name(name)?;
        let mut writable = self.sources.iter().filter(|s| s.writable());
        let Some(first) = writable.next() else {
            self.file.set(name, value)?;
            return Ok(SourceKind::File);
        };
        first.store(name, value)?;
        for later in writable {
            later.remove(name)?;
        }
        Ok(first.kind())
    }

    /// Removes secret `name` from every writable source (keychain and file);
    /// whether any had it. The environment is not changed.
    ///
    /// # Errors
    /// [`SecretsError::InvalidName`], or a source's error.
    pub fn delete(&self, name: &str) -> Result<bool, SecretsError> {
        check_name(name)?;
        let mut any = false;
        for source in self.sources.iter().filter(|s| s.writable()) {
            any |= source.remove(name)?;
        }
        Ok(any)
    }

    /// The names the keychain and the secrets file hold (sorted, once each).
    ///
    /// # Errors
    /// A source that cannot be read.
    pub fn stored_names(&self) -> Result<Vec<String>, SecretsError> {
        let mut names = Vec::new();
        for source in &self.sources {
            names.extend(source.names()?);
        }
        names.sort();
        names.dedup();
        Ok(names)
    }

    /// Moves every secret of the secrets file into the first writable source
    /// before it (the keychain), removing each from the file once it is saved
    /// there. Returns the names moved.
    ///
    /// # Errors
    /// [`SecretsError::Backend`] when there is no keychain; the first secret
    /// that could not be moved (those before it stay moved).
    pub fn migrate_file(&self) -> Result<Vec<String>, SecretsError> {
        let Some(target) =
            self.sources.iter().find(|s| s.writable() && s.kind() != SourceKind::File)
        else {
            return Err(SecretsError::Backend {
                backend: "keychain".to_owned(),
                name: "*".to_owned(),
                message: format!("not available: {}", self.keychain.detail),
            });
        };
        let mut moved = Vec::new();
        for (name, value) in self.file.read_all()? {
            if value.expose().is_empty() {
                continue;
            }
            target.store(&name, value.expose())?;
            self.file.remove(&name)?;
            moved.push(name);
        }
        Ok(moved)
    }

    /// Problems worth logging, checked now: a secrets file other users can access.
    pub fn warnings(&self) -> Vec<SecretsWarning> {
        self.file.permission_warning().into_iter().collect()
    }
}

/// A secret name as config files may name one: `[A-Za-z0-9_.-]{1,128}`.
///
/// # Errors
/// [`SecretsError::InvalidName`].
pub fn check_name(name: &str) -> Result<(), SecretsError> {
    let valid = !name.is_empty()
        && name.len() <= 128
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
    if valid {
        Ok(())
    } else {
        Err(SecretsError::InvalidName { name: name.to_owned() })
    }
}

/// 32 random bytes from the OS, as 64 lowercase hex characters.
fn generate_token() -> Result<SecretValue, SecretsError> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| SecretsError::Random { message: e.to_string() })?;
    let hex = bytes.iter().map(|b| format!("{b:02x}")).collect::<String>();
    Ok(SecretValue(hex))
}

#[cfg(test)]
mod tests;
