//! Tests of secret lookup, storage and redaction.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use super::*;

fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
}

/// A store over `env` and `<dir>/secrets.toml` holding `file` (when given).
fn store(dir: &Path, pairs: &[(&str, &str)], file: Option<&str>) -> SecretStore {
    let path = dir.join("secrets.toml");
    if let Some(text) = file {
        fs::write(&path, text).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
    }
    SecretStore::new(env(pairs), path)
}

fn check_get(store: &SecretStore, name: &str, expect: Option<&str>) {
    let got = store.get(name).unwrap();
    assert_eq!(got.as_ref().map(SecretValue::expose), expect, "secret {name}");
}

fn mode(path: &Path) -> u32 {
    fs::metadata(path).unwrap().permissions().mode() & 0o777
}

#[test]
fn environment_wins_over_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(
        dir.path(),
        &[("LEMON_API_TOKEN", "from-env")],
        Some("lemon_api_token = \"from-file\"\nother = \"file-only\"\n"),
    );
    check_get(&store, "lemon_api_token", Some("from-env"));
    check_get(&store, "other", Some("file-only"));
}

#[test]
fn env_names_are_upper_cased_with_underscores() {
    assert_eq!(env_var_name("lemon_api_token"), "LEMON_API_TOKEN");
    assert_eq!(env_var_name("twilio-auth.token"), "TWILIO_AUTH_TOKEN");
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path(), &[("TWILIO_AUTH_TOKEN", "tok"), ("EMPTY", "")], None);
    check_get(&store, "twilio-auth-token", Some("tok"));
    check_get(&store, "TWILIO_AUTH_TOKEN", Some("tok"));
    // An empty variable counts as unset.
    check_get(&store, "empty", None);
}

#[test]
fn file_lookup_and_misses() {
    let dir = tempfile::tempdir().unwrap();
    // No file at all.
    let empty = store(dir.path(), &[], None);
    check_get(&empty, "deepgram_api_key", None);
    assert!(empty.warnings().is_empty());

    let store = store(
        dir.path(),
        &[],
        Some("# keys\ndeepgram_api_key = \"dg-123\"\n\"with.dot\" = \"d\"\n"),
    );
    check_get(&store, "deepgram_api_key", Some("dg-123"));
    check_get(&store, "with.dot", Some("d"));
    check_get(&store, "elevenlabs_api_key", None);
    let all = SecretsFile::new(store.file_path().to_owned()).read_all().unwrap();
    assert_eq!(all.keys().collect::<Vec<_>>(), ["deepgram_api_key", "with.dot"]);
}

#[test]
fn invalid_names_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path(), &[], None);
    for name in ["", "has space", "a=b", "é"] {
        assert_eq!(
            store.get(name),
            Err(SecretsError::InvalidName { name: name.to_owned() }),
            "{name:?}"
        );
        assert!(store.set(name, "v").is_err(), "{name:?}");
    }
}

#[test]
fn set_creates_the_file_and_directory_privately() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("home/.lemon/secrets.toml");
    let store = SecretStore::new(BTreeMap::new(), path.clone());
    store.set("lemon_api_token", "abc").unwrap();
    assert_eq!(mode(&path), 0o600);
    assert_eq!(mode(path.parent().unwrap()), 0o700);
    check_get(&store, "lemon_api_token", Some("abc"));

    // Updating keeps other entries; no temporary file is left behind.
    store.set("other", "x\"y").unwrap();
    store.set("lemon_api_token", "def").unwrap();
    check_get(&store, "lemon_api_token", Some("def"));
    check_get(&store, "other", Some("x\"y"));
    let names: Vec<_> =
        fs::read_dir(path.parent().unwrap()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names, ["secrets.toml"]);
}

#[test]
fn set_keeps_comments_and_tightens_an_open_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("secrets.toml");
    fs::write(&path, "# written by hand\nkeep = \"k\"\n").unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
    let store = SecretStore::new(BTreeMap::new(), path.clone());

    // Still readable, with a warning the app can log.
    check_get(&store, "keep", Some("k"));
    let warnings = store.warnings();
    assert_eq!(
        warnings,
        [SecretsWarning::FileAccessibleByOthers { path: path.clone(), mode: 0o644 }]
    );
    assert_eq!(
        warnings[0].to_string(),
        format!(
            "{} is readable or writable by other users (mode 0644); run chmod 600 {}",
            path.display(),
            path.display()
        )
    );

    store.set("new", "n").unwrap();
    assert_eq!(mode(&path), 0o600);
    assert!(store.warnings().is_empty());
    assert_eq!(
        fs::read_to_string(&path).unwrap(),
        "# written by hand\nkeep = \"k\"\nnew = \"n\"\n"
    );
}

#[test]
fn get_or_generate_generates_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("secrets.toml");
    let store = SecretStore::new(BTreeMap::new(), path.clone());

    let (first, generated) = store.get_or_generate("lemon_api_token").unwrap();
    assert!(generated);
    assert_eq!(first.expose().len(), 64);
    assert!(first.expose().chars().all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
    assert_eq!(mode(&path), 0o600);

    let (second, generated) = store.get_or_generate("lemon_api_token").unwrap();
    assert!(!generated);
    assert_eq!(second, first);

    let fresh = SecretStore::new(BTreeMap::new(), path);
    let (third, generated) = fresh.get_or_generate("lemon_api_token").unwrap();
    assert!(!generated);
    assert_eq!(third, first);

    // A different name gets a different token.
    let (other, generated) = fresh.get_or_generate("webhook_token").unwrap();
    assert!(generated);
    assert_ne!(other, first);

    // An environment value is returned as is and nothing is written.
    let env_store = SecretStore::new(env(&[("FROM_ENV", "e")]), dir.path().join("unused.toml"));
    let (value, generated) = env_store.get_or_generate("from_env").unwrap();
    assert_eq!((value.expose(), generated), ("e", false));
    assert!(!dir.path().join("unused.toml").exists());
}

#[test]
fn values_never_show_in_debug_output() {
    let value = SecretValue::new("hunter2-very-secret");
    assert_eq!(format!("{value:?}"), "SecretValue(***)");
    assert_eq!(format!("{value}"), "SecretValue(***)");
    assert_eq!(format!("{:?}", Some(&value)), "Some(SecretValue(***))");

    let dir = tempfile::tempdir().unwrap();
    let store =
        store(dir.path(), &[("API_KEY", "hunter2-env")], Some("file_key = \"hunter2-file\"\n"));
    let debug = format!("{store:?}");
    assert!(!debug.contains("hunter2"), "{debug}");
    assert!(debug.contains("secrets.toml"), "{debug}");
    assert_eq!(
        store.describe_sources(),
        ["environment".to_owned(), store.file_path().display().to_string()]
    );
}

fn check_malformed(text: &str, expect_suffix: &str, values: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path(), &[], Some(text));
    let path = store.file_path().to_owned();
    let err = store.get("anything").unwrap_err();
    assert!(matches!(err, SecretsError::Malformed { .. }), "{err:?}");
    let shown = format!("{err} / {err:?}");
    assert_eq!(err.to_string(), format!("{}{expect_suffix}", path.display()));
    for value in values {
        assert!(!shown.contains(value), "{value:?} leaked into {shown}");
    }
    // A malformed file is not overwritten by `set`.
    assert!(matches!(store.set("x", "y"), Err(SecretsError::Malformed { .. })));
    assert_eq!(fs::read_to_string(&path).unwrap(), text);
}

#[test]
fn malformed_file_errors_name_the_file_and_position_but_no_value() {
    check_malformed(
        "ok = \"s3cr3t-one\"\ntoken = s3cr3t-two\n",
        ":2:9: malformed secrets file: invalid string; expected `\"`, `'`",
        &["s3cr3t"],
    );
    check_malformed(
        "token = \"s3cr3t-unterminated\n",
        ":1:29: malformed secrets file: invalid basic string",
        &["s3cr3t"],
    );
    check_malformed(
        "ok = \"s3cr3t-one\"\nport = 4242\n",
        ":2:8: malformed secrets file: secret `port` must be a string",
        &["s3cr3t", "4242"],
    );
    check_malformed(
        "[nested]\nkey = \"s3cr3t\"\n",
        ":1:1: malformed secrets file: secret `nested` must be a string",
        &["s3cr3t"],
    );
}

#[test]
fn a_source_put_first_wins() {
    #[derive(Debug)]
    struct Keychain;
    impl SecretSource for Keychain {
        fn describe(&self) -> String {
            "keychain".to_owned()
        }
        fn get(&self, name: &str) -> Result<Option<SecretValue>, SecretsError> {
            Ok((name == "lemon_api_token").then(|| SecretValue::new("from-keychain")))
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path(), &[("LEMON_API_TOKEN", "from-env"), ("OTHER", "o")], None)
        .with_source_first(Keychain);
    check_get(&store, "lemon_api_token", Some("from-keychain"));
    check_get(&store, "other", Some("o"));
    assert_eq!(store.describe_sources()[0], "keychain");
}

#[test]
fn read_errors_name_the_file() {
    let dir = tempfile::tempdir().unwrap();
    // A directory where the file should be.
    let path: PathBuf = dir.path().to_owned();
    let store = SecretStore::new(BTreeMap::new(), path.clone());
    let err = store.get("x").unwrap_err();
    assert!(
        err.to_string().starts_with(&format!("{}: cannot read secrets file: ", path.display())),
        "{err}"
    );
}

#[test]
fn bearer_tokens_are_trimmed_and_refused_when_blank_or_short() {
    let origin = "the environment variable LEMON_API_TOKEN";
    let check_refused = |value: &str, expected: TokenError| {
        let err = check_bearer_token(&SecretValue::new(value), origin).unwrap_err();
        assert_eq!(err, expected, "{value:?}");
        let message = err.to_string();
        assert!(message.contains(origin), "{message}");
        if !value.trim().is_empty() {
            assert!(!message.contains(value.trim()), "the value is in {message}");
        }
    };
    check_refused("", TokenError::Blank { origin: origin.to_owned() });
    check_refused(" \t\n ", TokenError::Blank { origin: origin.to_owned() });
    check_refused("short-secret", TokenError::TooShort { origin: origin.to_owned() });
    // Fifteen characters once trimmed, even with padding around them.
    check_refused("   fifteen-chars-x   ", TokenError::TooShort { origin: origin.to_owned() });
    let token = check_bearer_token(&SecretValue::new("  sixteen-chars-xy\n"), origin).unwrap();
    assert_eq!(token.expose(), "sixteen-chars-xy");
}

#[test]
fn a_blank_entry_is_unset_for_lookups_but_visible_as_written() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("secrets.toml");
    fs::write(&path, "lemon_api_token = \"\"\nother = \"  \"\n").unwrap();
    let file = SecretsFile::new(path);
    assert_eq!(file.get("lemon_api_token").unwrap(), None);
    assert_eq!(file.get_as_written("lemon_api_token").unwrap(), Some(SecretValue::new("")));
    assert_eq!(file.get_as_written("other").unwrap(), Some(SecretValue::new("  ")));
    assert_eq!(file.get_as_written("missing").unwrap(), None);
}

#[test]
fn a_missing_secret_says_where_it_was_looked_for_and_how_to_set_it() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("secrets.toml");
    let store = SecretStore::new(BTreeMap::new(), file.clone());
    let message = store.not_set_message("zapier_webhook_token");
    let path = file.display();
    assert_eq!(
        message,
        format!(
            "secret \"zapier_webhook_token\" is not set (looked in the environment variable ZAPIER_WEBHOOK_TOKEN, {path}); add zapier_webhook_token = \"…\" to {path} (mode 0600) or set ZAPIER_WEBHOOK_TOKEN in the gateway's environment"
        )
    );
}

#[test]
fn the_origin_of_a_secret_names_the_source_in_use_and_the_ones_it_overrides() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("secrets.toml");
    let env = BTreeMap::from([("TELEGRAM_BOT_TOKEN".to_owned(), "1:stale".to_owned())]);
    let store = SecretStore::new(env, file.clone());
    assert_eq!(
        store.origin("telegram_bot_token").unwrap().unwrap().overrides,
        Vec::<String>::new()
    );
    store.set("telegram_bot_token", "2:fresh").unwrap();
    let origin = store.origin("telegram_bot_token").unwrap().unwrap();
    assert_eq!(origin.source, "the environment variable TELEGRAM_BOT_TOKEN");
    assert_eq!(origin.overrides, [file.display().to_string()]);
    assert_eq!(store.origin("other").unwrap(), None);
}

/// A writable keychain in memory.
#[derive(Debug, Default, Clone)]
struct MemoryKeychain(std::sync::Arc<std::sync::Mutex<BTreeMap<String, String>>>);

impl SecretSource for MemoryKeychain {
    fn describe(&self) -> String {
        "keychain".to_owned()
    }
    fn get(&self, name: &str) -> Result<Option<SecretValue>, SecretsError> {
        Ok(self.0.lock().unwrap().get(name).map(SecretValue::new))
    }
    fn kind(&self) -> SourceKind {
        SourceKind::Keychain
    }
    fn writable(&self) -> bool {
        true
    }
    fn store(&self, name: &str, value: &str) -> Result<(), SecretsError> {
        self.0.lock().unwrap().insert(name.to_owned(), value.to_owned());
        Ok(())
    }
    fn remove(&self, name: &str) -> Result<bool, SecretsError> {
        Ok(self.0.lock().unwrap().remove(name).is_some())
    }
    fn names(&self) -> Result<Vec<String>, SecretsError> {
        Ok(self.0.lock().unwrap().keys().cloned().collect())
    }
}

fn with_keychain(store: SecretStore, keychain: &MemoryKeychain) -> SecretStore {
    let status = KeychainStatus { available: true, detail: "memory".to_owned() };
    store.with_keychain(Some(Box::new(keychain.clone())), status)
}

#[test]
fn store_saves_to_the_keychain_and_takes_the_file_copy_out() {
    let dir = tempfile::tempdir().unwrap();
    let keychain = MemoryKeychain::default();
    let store = with_keychain(
        store(dir.path(), &[("FROM_ENV", "e")], Some("tg_token = \"old\"\nkeep = \"k\"\n")),
        &keychain,
    );
    assert_eq!(store.kind_of("tg_token").unwrap(), Some(SourceKind::File));
    assert_eq!(store.store("tg_token", "new-value").unwrap(), SourceKind::Keychain);
    check_get(&store, "tg_token", Some("new-value"));
    assert_eq!(store.kind_of("tg_token").unwrap(), Some(SourceKind::Keychain));
    let file = fs::read_to_string(store.file_path()).unwrap();
    assert!(!file.contains("tg_token") && file.contains("keep"), "{file}");
    assert_eq!(store.kind_of("from_env").unwrap(), Some(SourceKind::Env));
    assert_eq!(store.stored_names().unwrap(), ["keep", "tg_token"]);
    assert!(store.delete("tg_token").unwrap());
    assert!(!store.delete("tg_token").unwrap(), "already gone");
    check_get(&store, "tg_token", None);
    assert!(store.keychain().available);
}

#[test]
fn store_without_a_keychain_saves_to_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path(), &[], None);
    assert!(!store.keychain().available);
    assert_eq!(store.store("openai_api_key", "sk-1").unwrap(), SourceKind::File);
    assert_eq!(mode(store.file_path()), 0o600);
    check_get(&store, "openai_api_key", Some("sk-1"));
    assert!(store.delete("openai_api_key").unwrap());
    check_get(&store, "openai_api_key", None);
    assert!(store.migrate_file().unwrap_err().to_string().contains("not available"));
}

#[test]
fn settable_names_are_lowercase_digits_and_underscores() {
    for good in ["a", "telegram_bot_token", "key2", &"x".repeat(64)] {
        check_settable_name(good).unwrap();
    }
    for bad in ["", "A", "with-dash", "dot.ted", "spa ce", "é", &"x".repeat(65), "../x"] {
        assert!(check_settable_name(bad).is_err(), "{bad:?}");
    }
    let dir = tempfile::tempdir().unwrap();
    assert!(store(dir.path(), &[], None).store("Bad-Name", "v").is_err());
}

#[test]
fn migrate_moves_the_file_into_the_keychain() {
    let dir = tempfile::tempdir().unwrap();
    let keychain = MemoryKeychain::default();
    let store = with_keychain(
        store(dir.path(), &[], Some("a = \"1\"\nb = \"2\"\n# kept\nblank = \"\"\n")),
        &keychain,
    );
    assert_eq!(store.migrate_file().unwrap(), ["a", "b"]);
    check_get(&store, "a", Some("1"));
    check_get(&store, "b", Some("2"));
    let file = fs::read_to_string(store.file_path()).unwrap();
    assert!(!file.contains("a = ") && !file.contains("b = "), "{file}");
    assert!(file.contains("# kept\nblank"), "other entries and their comments stay: {file}");
    assert_eq!(keychain.names().unwrap(), ["a", "b"]);
}
