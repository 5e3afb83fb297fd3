//! The OS keychain as a secret source, through `keyring`: the Secret Service
//! (GNOME Keyring, KWallet) or the kernel's keyutils on Linux, the Keychain on
//! macOS, the Credential Manager on Windows; the mock store in tests.
//!
//! Every secret is an entry of service [`SERVICE`] whose user is the secret's
//! name. The names stored are kept in one more entry, [`INDEX_USER`], since a
//! keychain cannot be listed portably.
//!
//! A keychain can hang: a locked GNOME keyring with a display waits for a
//! person to type the password into a prompt. So every call runs on its own
//! thread and is given up after a timeout ([`PROBE_TIMEOUT`], or
//! `LEMON_KEYCHAIN_TIMEOUT_MS`). [`open`] probes once (save, read, remove a
//! probe entry); a keychain that fails or does not answer is not used, and
//! the secrets file takes its place. After one call timed out, the keychain is
//! taken as stuck and later calls fail at once.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use lemon_core::secrets::{KeychainStatus, SecretSource, SecretValue, SecretsError, SourceKind};

/// The service name every entry is saved under.
pub const SERVICE: &str = "lemon-gateway";

/// The entry holding the names of the secrets saved (one a line). Not a valid
/// secret name, so it cannot collide with one.
pub const INDEX_USER: &str = ".names";

/// The entry the probe saves and removes.
const PROBE_USER: &str = ".probe";

/// How long one keychain call may take by default.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(3);

/// Chooses the backend: `auto` (the default), `off`, `secret-service`,
/// `keyutils` or `mock` (in memory, for tests).
pub const BACKEND_VAR: &str = "LEMON_KEYCHAIN";

/// Overrides [`PROBE_TIMEOUT`], in milliseconds.
pub const TIMEOUT_VAR: &str = "LEMON_KEYCHAIN_TIMEOUT_MS";

/// Which store the entries are in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// The platform's store (macOS Keychain, Windows Credential Manager).
    Platform,
    /// The freedesktop Secret Service over D-Bus.
    SecretService,
    /// The kernel's keyutils (kept in memory; lost on reboot).
    Keyutils,
    /// Values in this process only.
    Mock,
}

impl Backend {
    /// For messages.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Platform => "the system keychain",
            Backend::SecretService => "Secret Service",
            Backend::Keyutils => "kernel keyutils (kept until reboot)",
            Backend::Mock => "in-memory mock keychain",
        }
    }

    fn credential(self, user: &str) -> keyring::Result<keyring::Entry> {
        match self {
            Backend::Platform => keyring::Entry::new(SERVICE, user),
            #[cfg(target_os = "linux")]
            Backend::SecretService => {
                let credential =
                    keyring::secret_service::SsCredential::new_with_target(None, SERVICE, user)?;
                Ok(keyring::Entry::new_with_credential(Box::new(credential)))
            }
            #[cfg(target_os = "linux")]
            Backend::Keyutils => {
                let credential =
                    keyring::keyutils::KeyutilsCredential::new_with_target(None, SERVICE, user)?;
                Ok(keyring::Entry::new_with_credential(Box::new(credential)))
            }
            #[cfg(not(target_os = "linux"))]
            Backend::SecretService | Backend::Keyutils => keyring::Entry::new(SERVICE, user),
            Backend::Mock => {
                let credential =
                    keyring::mock::default_credential_builder().build(None, SERVICE, user)?;
                Ok(keyring::Entry::new_with_credential(credential))
            }
        }
    }
}

/// A keychain error in words, never with a value in it.
fn describe_error(error: &keyring::Error) -> String {
    match error {
        keyring::Error::BadEncoding(_) => "the stored value is not UTF-8 text".to_owned(),
        keyring::Error::Ambiguous(found) => {
            format!("{} entries match; remove the extra ones", found.len())
        }
        other => other.to_string(),
    }
}

/// The OS keychain: one backend, its entries, and the timeout of each call.
pub struct Keychain {
    backend: Backend,
    timeout: Duration,
    entries: Mutex<HashMap<String, Arc<keyring::Entry>>>,
    /// A call timed out: the keychain is not asked again.
    stuck: Arc<AtomicBool>,
}

impl fmt::Debug for Keychain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Keychain")
            .field("backend", &self.backend)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl Keychain {
    fn new(backend: Backend, timeout: Duration) -> Self {
        Keychain {
            backend,
            timeout,
            entries: Mutex::new(HashMap::new()),
            stuck: Arc::new(AtomicBool::new(false)),
        }
    }

    fn entry(&self, user: &str) -> Result<Arc<keyring::Entry>, String> {
        let mut entries = self.entries.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(entry) = entries.get(user) {
            return Ok(entry.clone());
        }
        let entry = Arc::new(self.backend.credential(user).map_err(|e| describe_error(&e))?);
        entries.insert(user.to_owned(), entry.clone());
        Ok(entry)
    }

    /// Runs `op` on `user`'s entry on its own thread, given up after the timeout.
    fn call<T: Send + 'static>(
        &self,
        user: &str,
        op: impl FnOnce(&keyring::Entry) -> keyring::Result<T> + Send + 'static,
    ) -> Result<keyring::Result<T>, String> {
        if self.stuck.load(Ordering::Relaxed) {
            return Err(
                "the keychain stopped answering earlier; restart once it is unlocked".into()
            );
        }
        let entry = self.entry(user)?;
        let (tx, rx) = mpsc::sync_channel(1);
        let spawned = std::thread::Builder::new().name("keychain".into()).spawn(move || {
            let _ = tx.send(op(&entry));
        });
        if let Err(error) = spawned {
            return Err(format!("cannot start a thread for the keychain: {error}"));
        }
        match rx.recv_timeout(self.timeout) {
            Ok(result) => Ok(result),
            Err(mpsc::RecvTimeoutError::Timeout) => {
                self.stuck.store(true, Ordering::Relaxed);
                Err(format!(
                    "no answer within {} ms (a locked keyring waiting for its password?)",
                    self.timeout.as_millis()
                ))
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => Err("the keychain call failed".into()),
        }
    }

    fn backend_error(&self, name: &str, message: String) -> SecretsError {
        SecretsError::Backend { backend: self.describe(), name: name.to_owned(), message }
    }

    fn read(&self, user: &str) -> Result<Option<String>, String> {
        match self.call(user, |entry| entry.get_password())? {
            Ok(value) => Ok(Some(value)),
            Err(keyring::Error::NoEntry) => Ok(None),
            Err(error) => Err(describe_error(&error)),
        }
    }

    fn write(&self, user: &str, value: String) -> Result<(), String> {
        self.call(user, move |entry| entry.set_password(&value))?.map_err(|e| describe_error(&e))
    }

    fn erase(&self, user: &str) -> Result<bool, String> {
        match self.call(user, |entry| entry.delete_credential())? {
            Ok(()) => Ok(true),
            Err(keyring::Error::NoEntry) => Ok(false),
            Err(error) => Err(describe_error(&error)),
        }
    }

    fn index(&self) -> Result<BTreeSet<String>, String> {
        Ok(self
            .read(INDEX_USER)?
            .unwrap_or_default()
            .lines()
            .map(str::trim)
            .filter(|line| !line.is_empty())
            .map(str::to_owned)
            .collect())
    }

    fn update_index(&self, edit: impl FnOnce(&mut BTreeSet<String>)) -> Result<(), String> {
        let mut names = self.index()?;
        let before = names.clone();
        edit(&mut names);
        if names == before {
            return Ok(());
        }
        if names.is_empty() {
            self.erase(INDEX_USER).map(|_| ())
        } else {
            self.write(INDEX_USER, names.into_iter().collect::<Vec<_>>().join("\n"))
        }
    }

    /// Saves, reads back and removes a probe entry: the keychain works.
    fn probe(&self) -> Result<(), String> {
        let value = format!("probe-{}", std::process::id());
        self.write(PROBE_USER, value.clone())?;
        let read = self.read(PROBE_USER)?;
        let _ = self.erase(PROBE_USER);
        if read.as_deref() == Some(value.as_str()) {
            Ok(())
        } else {
            Err("a value saved could not be read back".to_owned())
        }
    }
}

impl SecretSource for Keychain {
    fn describe(&self) -> String {
        format!("keychain ({})", self.backend.name())
    }

    fn location(&self, name: &str) -> String {
        format!("the keychain ({}, service {SERVICE}, entry {name})", self.backend.name())
    }

    fn get(&self, name: &str) -> Result<Option<SecretValue>, SecretsError> {
        let value = self.read(name).map_err(|message| self.backend_error(name, message))?;
        Ok(value.filter(|v| !v.is_empty()).map(SecretValue::new))
    }

    fn kind(&self) -> SourceKind {
        SourceKind::Keychain
    }

    fn writable(&self) -> bool {
        true
    }

    fn store(&self, name: &str, value: &str) -> Result<(), SecretsError> {
        self.write(name, value.to_owned()).map_err(|message| self.backend_error(name, message))?;
        self.update_index(|names| {
            names.insert(name.to_owned());
        })
        .map_err(|message| self.backend_error(name, message))
    }

    fn remove(&self, name: &str) -> Result<bool, SecretsError> {
        let removed = self.erase(name).map_err(|message| self.backend_error(name, message))?;
        self.update_index(|names| {
            names.remove(name);
        })
        .map_err(|message| self.backend_error(name, message))?;
        Ok(removed)
    }

    fn names(&self) -> Result<Vec<String>, SecretsError> {
        let index = self.index().map_err(|message| self.backend_error(INDEX_USER, message))?;
        Ok(index.into_iter().collect())
    }
}

/// The backends `auto` tries, in order.
fn auto_backends() -> Vec<Backend> {
    if cfg!(target_os = "linux") {
        vec![Backend::SecretService, Backend::Keyutils]
    } else {
        vec![Backend::Platform]
    }
}

/// The keychain `env` asks for ([`BACKEND_VAR`], [`TIMEOUT_VAR`]), probed;
/// `None` with the reason when there is none that works. Blocks for at most
/// the timeout per backend tried; call it off the async runtime.
pub fn open(env: &BTreeMap<String, String>) -> (Option<Keychain>, KeychainStatus) {
    let timeout = env
        .get(TIMEOUT_VAR)
        .and_then(|ms| ms.trim().parse::<u64>().ok())
        .filter(|ms| *ms > 0)
        .map_or(PROBE_TIMEOUT, Duration::from_millis);
    let choice = env.get(BACKEND_VAR).map_or("auto", |v| v.trim());
    let backends = match choice {
        "" | "auto" => auto_backends(),
        "off" => {
            return (None, KeychainStatus::unavailable(format!("switched off ({BACKEND_VAR}=off)")))
        }
        "secret-service" => vec![Backend::SecretService],
        "keyutils" => vec![Backend::Keyutils],
        "mock" => vec![Backend::Mock],
        other => {
            return (
                None,
                KeychainStatus::unavailable(format!(
                "{BACKEND_VAR}={other:?} is not one of auto, off, secret-service, keyutils, mock"
            )),
            )
        }
    };
    let mut failures = Vec::new();
    for backend in backends {
        let keychain = Keychain::new(backend, timeout);
        match keychain.probe() {
            Ok(()) => {
                let status = KeychainStatus { available: true, detail: backend.name().to_owned() };
                return (Some(keychain), status);
            }
            Err(error) => failures.push(format!("{}: {error}", backend.name())),
        }
    }
    (None, KeychainStatus::unavailable(failures.join("; ")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mock_keychain_saves_lists_and_removes() {
        let keychain = Keychain::new(Backend::Mock, PROBE_TIMEOUT);
        keychain.probe().unwrap();
        assert_eq!(keychain.get("telegram_bot_token").unwrap(), None);
        keychain.store("telegram_bot_token", "123:abc").unwrap();
        keychain.store("openai_api_key", "sk-x").unwrap();
        let value = keychain.get("telegram_bot_token").unwrap().unwrap();
        assert_eq!(value.expose(), "123:abc");
        assert_eq!(keychain.names().unwrap(), ["openai_api_key", "telegram_bot_token"]);
        assert!(keychain.remove("telegram_bot_token").unwrap());
        assert!(!keychain.remove("telegram_bot_token").unwrap());
        assert_eq!(keychain.get("telegram_bot_token").unwrap(), None);
        assert_eq!(keychain.names().unwrap(), ["openai_api_key"]);
        assert_eq!(keychain.kind(), SourceKind::Keychain);
    }

    #[test]
    fn errors_name_the_entry_and_never_the_value() {
        let keychain = Keychain::new(Backend::Mock, PROBE_TIMEOUT);
        keychain.store("tg", "the-value").unwrap();
        let entry = keychain.entry("tg").unwrap();
        let mock: &keyring::mock::MockCredential =
            entry.get_credential().downcast_ref().expect("a mock credential");
        mock.set_error(keyring::Error::BadEncoding(b"the-value".to_vec()));
        let error = keychain.get("tg").unwrap_err().to_string();
        assert!(error.contains("`tg`") && error.contains("not UTF-8"), "{error}");
        assert!(!error.contains("the-value"), "{error}");
    }

    #[test]
    fn a_keychain_that_does_not_answer_is_given_up_after_the_timeout() {
        let keychain = Keychain::new(Backend::Mock, Duration::from_millis(50));
        let (release, wait) = mpsc::channel::<()>();
        let wait = Mutex::new(wait);
        let result = keychain.call("x", move |_| {
            let _ = wait.lock().unwrap().recv();
            Ok(())
        });
        assert!(result.unwrap_err().contains("no answer within 50 ms"));
        let again = keychain.get("x").unwrap_err().to_string();
        assert!(again.contains("stopped answering"), "{again}");
        drop(release);
    }

    #[test]
    fn open_follows_the_environment() {
        let env = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
        };
        let (none, status) = open(&env(&[(BACKEND_VAR, "off")]));
        assert!(none.is_none() && !status.available && status.detail.contains("off"));
        let (none, status) = open(&env(&[(BACKEND_VAR, "vault")]));
        assert!(none.is_none() && status.detail.contains("\"vault\""), "{}", status.detail);
        let (some, status) = open(&env(&[(BACKEND_VAR, "mock")]));
        assert!(some.is_some() && status.available, "{}", status.detail);
    }
}
