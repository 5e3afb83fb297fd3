//! `[gateway.xmtp]`: the raw TOML section parsed into typed settings.

use std::path::PathBuf;
use std::time::Duration;

use lemon_core::config::{
    parse_section, KeyNote, QueueMode, ReferenceKey, Translation, UnknownKey,
};
use lemon_core::ids::EngineRef;
use lemon_core::secrets::{SecretStore, SecretValue};
use serde::{Deserialize, Deserializer};

/// The secret the wallet key is read from unless `wallet_key_secret` names another.
pub const DEFAULT_WALLET_KEY_SECRET: &str = "xmtp_wallet_key";
/// The secret the local database's encryption key is read from, when it is set.
pub const DEFAULT_DB_KEY_SECRET: &str = "xmtp_db_encryption_key";
/// The bridge shipped with the gateway, where the gateway was built from.
pub const SHIPPED_BRIDGE_SCRIPT: &str =
    concat!(env!("CARGO_MANIFEST_DIR"), "/../../bridges/xmtp/bridge.mjs");

/// The XMTP network the bridge joins.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum XmtpEnv {
    /// XMTP's test network.
    #[default]
    Dev,
    /// The production network (where wallets' apps are).
    Production,
    /// A network node on this machine.
    Local,
}

impl XmtpEnv {
    pub fn as_str(self) -> &'static str {
        match self {
            XmtpEnv::Dev => "dev",
            XmtpEnv::Production => "production",
            XmtpEnv::Local => "local",
        }
    }
}

/// `[gateway.xmtp]`: an agent on the XMTP messaging network, through a
/// Node.js bridge the gateway starts and supervises; only the senders listed
/// may start runs.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[schemars(transform = reference_keys_schema)]
pub struct XmtpConfig {
    /// Switches the channel on or off, over `[gateway] enable_xmtp`. Unset:
    /// as `enable_xmtp` says, else off.
    #[serde(default)]
    pub enabled: Option<bool>,
    /// The Node.js program: a name looked up on `PATH`, or a path.
    #[serde(default = "defaults::node")]
    pub node: String,
    /// The bridge script; the shipped one when not set. A relative path is
    /// taken from the config file's folder.
    #[serde(default)]
    pub bridge_script: Option<PathBuf>,
    /// The secret holding the wallet's private key (passed to the bridge in
    /// its environment, never on its command line).
    #[serde(default = "defaults::wallet_key_secret")]
    pub wallet_key_secret: String,
    /// The reference's inline wallet key (also read from its other name,
    /// `private_key`; `"${VAR}"` is the environment variable's value), used
    /// when the secret named by `wallet_key_secret` is not set. Never logged.
    #[serde(default, deserialize_with = "inline_secret")]
    #[schemars(with = "Option<String>")]
    pub wallet_key: Option<SecretValue>,
    /// The secret holding the key of the SDK's local database; optional.
    #[serde(default = "defaults::db_key_secret")]
    pub db_encryption_key_secret: String,
    /// The network (the reference's `environment` is read as this).
    #[serde(default)]
    #[schemars(extend("default" = "dev"))]
    pub env: XmtpEnv,
    /// Inbox ids or Ethereum addresses that may start runs; empty lets
    /// nobody in. A refused sender's inbox id is in the log (INFO), to copy here.
    #[serde(default)]
    pub allowed_senders: Vec<String>,
    /// Every sender may start runs, whatever `allowed_senders` says: a public
    /// agent. Warned about at every start and shown in status.
    #[serde(default)]
    pub allow_everyone: bool,
    /// Conversations without a `[[gateway.bindings]]` entry for `transport =
    /// "xmtp"` (by conversation id) get no run.
    #[serde(default)]
    pub deny_unbound: bool,
    /// The agent part of session keys.
    #[serde(default = "defaults::agent_id")]
    pub agent_id: String,
    /// The conversations' queue mode unless a binding sets one.
    #[serde(default)]
    pub queue_mode: Option<QueueMode>,
    /// The engine unless a binding, a directive or `/engine` picks one.
    #[serde(default)]
    pub engine: Option<EngineRef>,
    /// How long a started bridge has to say `ready` (connected), in
    /// milliseconds; the reference's `connect_timeout_ms` is read as this.
    #[serde(default = "defaults::ready_timeout_ms")]
    pub ready_timeout_ms: u64,
    /// How often a quiet bridge is pinged, in milliseconds.
    #[serde(default = "defaults::ping_interval_ms")]
    pub ping_interval_ms: u64,
    /// How long a ping may go unanswered before the bridge is restarted, in
    /// milliseconds.
    #[serde(default = "defaults::ping_timeout_ms")]
    pub ping_timeout_ms: u64,
    /// The wait before the first restart, in milliseconds (doubling up to a
    /// minute).
    #[serde(default = "defaults::restart_backoff_ms")]
    pub restart_backoff_ms: u64,
    /// How long a send waits for a bridge, and then for its answer, in
    /// milliseconds.
    #[serde(default = "defaults::send_timeout_ms")]
    pub send_timeout_ms: u64,
    /// How many times an answer is sent before it is recorded as undelivered.
    #[serde(default = "defaults::delivery_attempts")]
    #[schemars(range(min = 1))]
    pub delivery_attempts: u32,
    /// `[gateway.xmtp.files]`: remote attachments (who may send them, how
    /// large, which names are refused, where they are saved).
    #[serde(default)]
    pub files: lemon_core::media::FilesConfig,
}

/// An inline secret: kept out of `Debug`; blank is unset.
fn inline_secret<'de, D: Deserializer<'de>>(d: D) -> Result<Option<SecretValue>, D::Error> {
    Ok(Option::<String>::deserialize(d)?
        .filter(|value| !value.trim().is_empty())
        .map(|value| SecretValue::new(value.trim())))
}

/// The reference layout's keys in the section's schema.
fn reference_keys_schema(schema: &mut schemars::Schema) {
    lemon_core::config::schema::add_reference_keys(schema, REFERENCE_KEYS);
}

/// The reference's `[gateway.xmtp]` keys: read as ours, or accepted with
/// what happens instead.
const REFERENCE_KEYS: &[ReferenceKey] = &[
    ReferenceKey::Alias { theirs: "environment", ours: "env" },
    ReferenceKey::Alias { theirs: "connect_timeout_ms", ours: "ready_timeout_ms" },
    ReferenceKey::Alias { theirs: "private_key", ours: "wallet_key" },
    ReferenceKey::Inert {
        key: "api_url",
        what_happens: "the bridge joins the XMTP network `env` names (dev, production or local)",
    },
    ReferenceKey::Inert {
        key: "poll_interval_ms",
        what_happens: "the bridge streams new messages as they come; nothing polls",
    },
    ReferenceKey::Inert {
        key: "require_live",
        what_happens: "the bridge always connects to the network, and status says whether it is",
    },
    ReferenceKey::Inert {
        key: "mock_mode",
        what_happens: "there is no mock mode: with XMTP on, the bridge connects to the network",
    },
    ReferenceKey::Inert {
        key: "wallet_address",
        what_happens: "the address is the wallet key's own",
    },
    ReferenceKey::Inert { key: "inbox_id", what_happens: "the inbox is the wallet key's own" },
    ReferenceKey::Inert {
        key: "db_path",
        what_happens: "the bridge keeps its database under $LEMON_HOME/xmtp",
    },
    ReferenceKey::Inert {
        key: "sdk_module",
        what_happens: "the bridge uses the XMTP agent SDK installed beside it (bridges/xmtp)",
    },
];

mod defaults {
    pub(super) fn node() -> String {
        "node".to_owned()
    }
    pub(super) fn wallet_key_secret() -> String {
        super::DEFAULT_WALLET_KEY_SECRET.to_owned()
    }
    pub(super) fn db_key_secret() -> String {
        super::DEFAULT_DB_KEY_SECRET.to_owned()
    }
    pub(super) fn agent_id() -> String {
        "default".to_owned()
    }
    pub(super) fn ready_timeout_ms() -> u64 {
        60_000
    }
    pub(super) fn ping_interval_ms() -> u64 {
        15_000
    }
    pub(super) fn ping_timeout_ms() -> u64 {
        10_000
    }
    pub(super) fn restart_backoff_ms() -> u64 {
        1_000
    }
    pub(super) fn send_timeout_ms() -> u64 {
        30_000
    }
    pub(super) fn delivery_attempts() -> u32 {
        10
    }
}

/// A `[gateway.xmtp]` that cannot be used; the message names the key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid [gateway.xmtp]: {0}")]
pub struct XmtpConfigError(pub String);

/// The secrets the bridge gets in its environment.
#[derive(Debug, Clone)]
pub struct XmtpSecrets {
    pub wallet_key: SecretValue,
    pub db_encryption_key: Option<SecretValue>,
}

impl XmtpConfig {
    /// Parses the raw section and checks what serde cannot.
    ///
    /// # Errors
    /// A wrong type or value, naming the key.
    pub fn parse(table: &toml::Table) -> Result<Self, XmtpConfigError> {
        XmtpConfig::parse_values(table).map(|(config, _)| config)
    }

    /// Parses the raw section, with the keys it does not know; a section
    /// switched off is checked as well.
    ///
    /// # Errors
    /// A wrong type or value, naming the key.
    pub fn parse_values(table: &toml::Table) -> Result<(Self, Vec<UnknownKey>), XmtpConfigError> {
        let translated = Translation::new(table, REFERENCE_KEYS);
        let (config, unknown) = parse_section::<XmtpConfig>(&translated.table)
            .map_err(|err| XmtpConfigError(translated.in_file(err).to_string()))?;
        if config.node.trim().is_empty() {
            return Err(XmtpConfigError("node: name the Node.js program or its path".into()));
        }
        if config.bridge_script.as_ref().is_some_and(|p| p.as_os_str().is_empty()) {
            return Err(XmtpConfigError("bridge_script: give a path or leave it out".into()));
        }
        for (key, name) in [
            ("wallet_key_secret", &config.wallet_key_secret),
            ("db_encryption_key_secret", &config.db_encryption_key_secret),
        ] {
            if lemon_core::secrets::check_settable_name(name).is_err() {
                return Err(XmtpConfigError(format!(
                    "{key}: {name:?} is not a secret name (lowercase letters, digits and _)"
                )));
            }
        }
        for sender in &config.allowed_senders {
            if !is_identity(sender) {
                return Err(XmtpConfigError(format!(
                    "allowed_senders: {sender:?} is neither an inbox id nor an address"
                )));
            }
        }
        let ranges = [
            ("ready_timeout_ms", config.ready_timeout_ms, 100, 600_000),
            ("ping_interval_ms", config.ping_interval_ms, 100, 600_000),
            ("ping_timeout_ms", config.ping_timeout_ms, 100, 600_000),
            ("restart_backoff_ms", config.restart_backoff_ms, 10, 600_000),
            ("send_timeout_ms", config.send_timeout_ms, 100, 600_000),
        ];
        for (key, value, low, high) in ranges {
            if !(low..=high).contains(&value) {
                return Err(XmtpConfigError(format!(
                    "{key}: between {low} and {high} milliseconds"
                )));
            }
        }
        if config.delivery_attempts == 0 {
            return Err(XmtpConfigError("delivery_attempts must be at least 1".into()));
        }
        if let Some(problem) = config.files.check().into_iter().next() {
            return Err(XmtpConfigError(format!("files.{problem}")));
        }
        Ok((config, unknown))
    }

    /// What the section's reference keys do where that is worth saying: a
    /// key accepted without a use here, an alias beside our own key.
    pub fn reference_notes(table: &toml::Table) -> Vec<KeyNote> {
        let mut notes = Translation::new(table, REFERENCE_KEYS).notes;
        let explicit_secret = table.contains_key("wallet_key_secret");
        if explicit_secret
            && (table.contains_key("wallet_key") || table.contains_key("private_key"))
        {
            let key = if table.contains_key("wallet_key") { "wallet_key" } else { "private_key" };
            notes.push(KeyNote::new(
                &[key],
                format!("both `wallet_key_secret` and `{key}` are set; the secret is used, and `{key}` only while that secret is not set"),
            ));
        }
        notes
    }

    /// The bridge script: the configured one (relative to `config_dir`), else
    /// the shipped one.
    pub fn script(&self, config_dir: &std::path::Path) -> PathBuf {
        match &self.bridge_script {
            Some(path) if path.is_absolute() => path.clone(),
            Some(path) => config_dir.join(path),
            None => lexically_normal(std::path::Path::new(SHIPPED_BRIDGE_SCRIPT)),
        }
    }

    /// Whether `sender` (an inbox id) or its `address` is in
    /// `allowed_senders` (an empty list has nobody; `allow_everyone` is
    /// checked by the caller).
    pub fn sender_listed(&self, sender: &str, address: Option<&str>) -> bool {
        self.allowed_senders.iter().any(|allowed| {
            allowed.eq_ignore_ascii_case(sender)
                || address.is_some_and(|address| allowed.eq_ignore_ascii_case(address))
        })
    }

    /// The wallet key (required) and the database key (if set).
    ///
    /// # Errors
    /// The wallet key's secret is not set, or the store cannot be read.
    pub fn resolve_secrets(&self, secrets: &SecretStore) -> Result<XmtpSecrets, XmtpConfigError> {
        let read = |name: &str| {
            secrets
                .get(name)
                .map_err(|e| XmtpConfigError(format!("the secret {name} cannot be read: {e}")))
        };
        // The secret first, then the reference's inline key.
        let wallet_key = read(&self.wallet_key_secret)?
            .or_else(|| self.wallet_key.clone())
            .ok_or_else(|| {
                XmtpConfigError(format!(
                    "wallet_key_secret: the secret {} is not set (`lemon-gateway secrets set {}`)",
                    self.wallet_key_secret, self.wallet_key_secret
                ))
            })?;
        let db_encryption_key = read(&self.db_encryption_key_secret)?;
        Ok(XmtpSecrets { wallet_key, db_encryption_key })
    }

    /// Whether attachments may come from this machine or a private network
    /// (and over plain http): only when the XMTP network itself is local
    /// (`env = "local"`), as other channels allow it when their own API is.
    pub fn attachments_may_be_local(&self) -> bool {
        self.env == XmtpEnv::Local
    }

    pub(crate) fn duration(ms: u64) -> Duration {
        Duration::from_millis(ms)
    }
}

/// `path` with its `..` parts applied (`a/b/../c` is `a/c`), without
/// touching the file system.
fn lexically_normal(path: &std::path::Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// An inbox id (hex) or an Ethereum address (`0x` + 40 hex digits).
pub fn is_identity(text: &str) -> bool {
    let hex = text.strip_prefix("0x").unwrap_or(text);
    (1..=128).contains(&hex.len()) && hex.chars().all(|c| c.is_ascii_hexdigit())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<XmtpConfig, XmtpConfigError> {
        XmtpConfig::parse(&toml::from_str::<toml::Table>(text).unwrap())
    }

    #[test]
    fn defaults_use_node_on_the_path_the_shipped_bridge_and_the_dev_network() {
        let config = parse("").unwrap();
        assert_eq!(config.node, "node");
        assert_eq!(config.env, XmtpEnv::Dev);
        assert_eq!(config.wallet_key_secret, "xmtp_wallet_key");
        let shipped = config.script(std::path::Path::new("/home"));
        assert!(shipped.ends_with("bridges/xmtp/bridge.mjs"), "{}", shipped.display());
        assert!(!shipped.display().to_string().contains(".."), "{}", shipped.display());
        assert!(shipped.is_file(), "the shipped bridge is where the default points");
        assert!(!config.sender_listed("abc", None), "an empty list has nobody");
        assert!(!config.allow_everyone);
        assert!(parse("allow_everyone = true").unwrap().allow_everyone);
    }

    #[test]
    fn files_take_20_mib_by_default_and_local_addresses_only_on_a_local_network() {
        let config = parse("").unwrap();
        assert!(config.files.enabled);
        assert_eq!(config.files.max_download_bytes, 20 * 1024 * 1024);
        assert!(!config.attachments_may_be_local());
        let local = parse("env = \"local\"\n[files]\nmax_download_bytes = 4096").unwrap();
        assert!(local.attachments_may_be_local());
        assert_eq!(local.files.max_download_bytes, 4096);
    }

    #[test]
    fn a_relative_bridge_script_is_taken_from_the_config_folder() {
        let config = parse("bridge_script = \"b/bridge.mjs\"").unwrap();
        assert_eq!(
            config.script(std::path::Path::new("/etc/lemon")),
            PathBuf::from("/etc/lemon/b/bridge.mjs")
        );
    }

    #[test]
    fn bad_values_name_their_key() {
        let cases = [
            ("env = \"mainnet\"", "env"),
            ("allowed_senders = [\"bob@example.com\"]", "allowed_senders"),
            ("wallet_key_secret = \"Bad Name\"", "wallet_key_secret"),
            ("ping_timeout_ms = 1", "ping_timeout_ms"),
            ("delivery_attempts = 0", "delivery_attempts"),
            ("node = \" \"", "node"),
            ("[files]\nuploads_dir = \"../out\"", "files.uploads_dir"),
            ("[files]\nmax_download_bytes = \"big\"", "max_download_bytes"),
        ];
        for (text, key) in cases {
            let error = parse(text).unwrap_err().0;
            assert!(error.contains(key), "{text}: {error}");
        }
    }

    #[test]
    fn the_reference_keys_are_read_as_ours_or_accepted_with_what_happens() {
        let reference: toml::Table = "environment = \"production\"\nconnect_timeout_ms = 10000\n\
             private_key = \"0xkey\"\napi_url = \"https://x\"\npoll_interval_ms = 1500\n\
             require_live = true\nmock_mode = false\nwallet_address = \"0xabc\"\n\
             inbox_id = \"inbox-1\"\ndb_path = \"/tmp/x.db\"\nsdk_module = \"@xmtp/node-sdk\"\n"
            .parse()
            .unwrap();
        let (config, unknown) = XmtpConfig::parse_values(&reference).unwrap();
        assert!(unknown.is_empty(), "{unknown:?}");
        assert_eq!(config.env, XmtpEnv::Production);
        assert_eq!(config.ready_timeout_ms, 10_000);
        assert_eq!(config.wallet_key.as_ref().map(SecretValue::expose), Some("0xkey"));
        assert!(!format!("{config:?}").contains("0xkey"));
        let notes = XmtpConfig::reference_notes(&reference);
        let keys: Vec<String> = notes.iter().map(|n| n.path.join(".")).collect();
        assert_eq!(
            keys,
            [
                "api_url",
                "poll_interval_ms",
                "require_live",
                "mock_mode",
                "wallet_address",
                "inbox_id",
                "db_path",
                "sdk_module"
            ]
        );
        assert!(notes.iter().all(|n| n.message.starts_with("accepted; ")), "{notes:?}");
        // The inline key is used while no secret is set; the secret wins.
        let dir = std::env::temp_dir().join(format!("lemon-xmtp-{}", std::process::id()));
        let none = SecretStore::new(Default::default(), dir.join("secrets.toml"));
        assert_eq!(config.resolve_secrets(&none).unwrap().wallet_key.expose(), "0xkey");
        let env = [("XMTP_WALLET_KEY".to_owned(), "0xsecret".to_owned())].into();
        let set = SecretStore::new(env, dir.join("secrets.toml"));
        assert_eq!(config.resolve_secrets(&set).unwrap().wallet_key.expose(), "0xsecret");
        // Ours wins over its reference name, with a note naming both.
        let both: toml::Table = "env = \"dev\"\nenvironment = \"production\"".parse().unwrap();
        assert_eq!(XmtpConfig::parse(&both).unwrap().env, XmtpEnv::Dev);
        let notes = XmtpConfig::reference_notes(&both);
        assert!(notes[0].message.contains("`env` is used"), "{notes:?}");
        // An error in an alias names the key the file wrote.
        let bad: toml::Table = "environment = \"mainnet\"".parse().unwrap();
        let error = XmtpConfig::parse(&bad).unwrap_err().0;
        assert!(error.contains("`environment`"), "{error}");
    }

    #[test]
    fn senders_are_matched_by_inbox_id_or_address_ignoring_case() {
        let config = parse(
            "allowed_senders = [\"ABCDEF01\", \"0x00000000000000000000000000000000000000aa\"]",
        )
        .unwrap();
        assert!(config.sender_listed("abcdef01", None));
        assert!(config.sender_listed("ff", Some("0x00000000000000000000000000000000000000AA")));
        assert!(!config.sender_listed("ff", Some("0x00000000000000000000000000000000000000ab")));
        assert!(!config.sender_listed("ff", None));
    }
}
