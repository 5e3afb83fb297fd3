//! The cluster-wide part of the config: the keys of `[gateway]` every node of
//! a cluster takes from one versioned row of the database (the cluster
//! config) instead of its own `config.toml`.
//!
//! The row's body is TOML holding only [`SHARED_KEYS`]; anything else (ports,
//! paths, engines, the store, the cluster section, channels, secrets) stays
//! in each node's file and is refused here, naming the key. A key the body
//! sets replaces that key of the file whole (a `[gateway.queue]` in the body
//! is the whole queue section, unset fields at their defaults), and the
//! environment's override of it too; a key the body leaves out is the
//! file's. An empty body (the row before anyone wrote it) changes nothing.

use std::path::Path;

use super::{ConfigError, GatewayConfig};

/// The keys of `[gateway]` the cluster config may set: the cap on
/// concurrent runs, the queue, bindings and the projects they name, budgets
/// and the approvals policy.
pub const SHARED_KEYS: [&str; 6] =
    ["max_concurrent_runs", "queue", "bindings", "projects", "budgets", "approvals"];

/// What errors about the cluster config's body name as their file.
pub const SHARED_SOURCE: &str = "cluster config";

/// A cluster config body, checked: the keys it sets and their values.
#[derive(Debug, Clone, Default)]
pub struct SharedSettings {
    version: i64,
    body: String,
    /// The keys of [`SHARED_KEYS`] the body sets, in that order.
    keys: Vec<&'static str>,
    /// `[gateway]` as the body alone gives it.
    gateway: GatewayConfig,
}

/// Why a key of `[gateway]` is refused in the cluster config.
fn refused(key: &str) -> String {
    format!(
        "`{key}` is not a cluster-wide setting; it stays in each node's config.toml (the \
         cluster config holds only {})",
        SHARED_KEYS.join(", ")
    )
}

impl SharedSettings {
    /// Checks `body`, version `version` of the cluster config, as the loader
    /// checks a file: TOML, types and values, with line and column; a key
    /// that is not one of [`SHARED_KEYS`], or that no section knows, is an
    /// error at the key.
    ///
    /// # Errors
    /// [`ConfigError::Syntax`] or [`ConfigError::Invalid`], whose file is
    /// [`SHARED_SOURCE`].
    pub fn parse(version: i64, body: &str) -> Result<Self, ConfigError> {
        let path = Path::new(SHARED_SOURCE);
        let config = super::loader::load_restricted(body, path, &SHARED_KEYS, refused)?;
        let raw: toml::Table = toml::from_str(body).unwrap_or_default();
        let set = raw.get("gateway").and_then(toml::Value::as_table);
        let keys = SHARED_KEYS.into_iter().filter(|key| set.is_some_and(|t| t.contains_key(*key)));
        Ok(SharedSettings {
            version,
            body: body.to_owned(),
            keys: keys.collect(),
            gateway: config.gateway,
        })
    }

    /// The row's version this body is (0: nobody wrote one).
    pub fn version(&self) -> i64 {
        self.version
    }

    /// The body as written.
    pub fn body(&self) -> &str {
        &self.body
    }

    /// The keys of `[gateway]` it sets.
    pub fn keys(&self) -> &[&'static str] {
        &self.keys
    }

    /// Whether it sets `key` of `[gateway]`.
    pub fn sets(&self, key: &str) -> bool {
        self.keys.contains(&key)
    }

    /// Puts the keys it sets over `config` (a node's file, its environment
    /// applied).
    pub fn apply(&self, config: &mut GatewayConfig) {
        for key in &self.keys {
            copy(key, &self.gateway, config);
        }
    }

    /// `config` with the keys it sets back at their defaults: what a merged
    /// config holds from the node's file.
    pub fn without(&self, config: &GatewayConfig) -> GatewayConfig {
        let mut out = config.clone();
        let defaults = GatewayConfig::default();
        for key in &self.keys {
            copy(key, &defaults, &mut out);
        }
        out
    }

    /// The defaults with the keys it sets taken from `config`: what a merged
    /// config holds from the cluster config.
    pub fn only(&self, config: &GatewayConfig) -> GatewayConfig {
        let mut out = GatewayConfig::default();
        for key in &self.keys {
            copy(key, config, &mut out);
        }
        out
    }
}

/// Copies `key` (one of [`SHARED_KEYS`]) of `from` into `to`.
fn copy(key: &str, from: &GatewayConfig, to: &mut GatewayConfig) {
    match key {
        "max_concurrent_runs" => to.max_concurrent_runs = from.max_concurrent_runs,
        "queue" => to.queue = from.queue.clone(),
        "bindings" => to.bindings = from.bindings.clone(),
        "projects" => to.projects = from.projects.clone(),
        "budgets" => to.budgets = from.budgets.clone(),
        "approvals" => to.approvals = from.approvals.clone(),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(text: &str) -> GatewayConfig {
        super::super::load_str(text, Path::new("config.toml")).unwrap().config.gateway
    }

    fn refusal(body: &str) -> ConfigError {
        SharedSettings::parse(1, body).expect_err("refused")
    }

    #[test]
    fn the_body_overrides_the_keys_it_sets_and_leaves_the_rest_to_the_file() {
        let mut config = file(
            "[gateway]\nmax_concurrent_runs = 2\ndefault_engine = \"echo\"\n\
             [gateway.queue]\ncap = 5\nmode = \"followup\"\n\
             [gateway.budgets]\ndaily_usd = 3.0\n\
             [gateway.api]\nport = 4141\n",
        );
        let shared = SharedSettings::parse(
            7,
            "[gateway]\nmax_concurrent_runs = 9\n[gateway.queue]\ncap = 40\n\
             [[gateway.bindings]]\ntransport = \"telegram\"\nchat_id = 42\nproject = \"site\"\n\
             [gateway.projects.site]\nroot = \"/srv/site\"\n",
        )
        .unwrap();
        assert_eq!(shared.version(), 7);
        assert_eq!(shared.keys(), ["max_concurrent_runs", "queue", "bindings", "projects"]);
        shared.apply(&mut config);
        assert_eq!(config.max_concurrent_runs, 9);
        // The queue section is the body's whole: its unset mode is the default.
        assert_eq!(config.queue.cap, Some(40));
        assert_eq!(config.queue.mode, None);
        assert_eq!(config.bindings.len(), 1);
        assert_eq!(config.bindings[0].chat_id_text().as_deref(), Some("42"));
        assert_eq!(config.projects["site"].root, Path::new("/srv/site"));
        // What the body does not set stays the file's.
        assert_eq!(config.budgets.daily_usd, Some(3.0));
        assert_eq!(config.api.port, Some(4141));
        assert_eq!(
            config.default_engine.as_ref().map(ToString::to_string).as_deref(),
            Some("echo")
        );

        // Split again: the file's part and the row's part.
        let local = shared.without(&config);
        assert_eq!(local.max_concurrent_runs, GatewayConfig::default().max_concurrent_runs);
        assert!(local.bindings.is_empty());
        assert_eq!(local.budgets.daily_usd, Some(3.0));
        let only = shared.only(&config);
        assert_eq!(only.max_concurrent_runs, 9);
        assert_eq!(only.budgets.daily_usd, None);
        assert!(only.default_engine.is_none());
    }

    #[test]
    fn an_empty_body_changes_nothing() {
        let before = file("[gateway]\nmax_concurrent_runs = 3\n[gateway.queue]\ncap = 7\n");
        for body in ["", "# nothing shared yet\n", "[gateway]\n"] {
            let shared = SharedSettings::parse(0, body).unwrap();
            assert!(shared.keys().is_empty(), "{body:?}");
            let mut config = before.clone();
            shared.apply(&mut config);
            assert_eq!(config.max_concurrent_runs, 3);
            assert_eq!(config.queue.cap, Some(7));
        }
    }

    #[test]
    fn node_local_keys_are_refused_naming_the_key_and_where_it_is() {
        let cases = [
            ("[gateway]\nmax_concurrent_runs = 4\n\n[gateway.api]\nport = 1\n", "gateway.api", 4),
            ("[gateway]\nworkspace_dir = \"/tmp/w\"\n", "gateway.workspace_dir", 2),
            ("[gateway.engines.claude]\ncli_path = \"/usr/bin/claude\"\n", "gateway.engines", 1),
            ("[gateway.store]\nbackend = \"postgres\"\n", "gateway.store", 1),
            ("[gateway.cluster]\nenabled = true\n", "gateway.cluster", 1),
            ("[gateway.telegram]\nbot_token = \"123:abc\"\n", "gateway.telegram", 1),
            ("[gateway]\ncron = []\n", "gateway.cron", 2),
        ];
        for (body, key, line) in cases {
            let error = refusal(body);
            let ConfigError::Invalid { key: found, at, message, path } = &error else {
                panic!("{error}")
            };
            assert_eq!(found, key, "{error}");
            assert_eq!(at.map(|at| at.line), Some(line), "{error}");
            assert!(message.contains("stays in each node's config.toml"), "{error}");
            assert_eq!(path, Path::new(SHARED_SOURCE));
        }
        // Outside [gateway].
        let error = refusal("[other]\nx = 1\n");
        assert!(error.to_string().contains("other: only keys of [gateway]"), "{error}");
    }

    #[test]
    fn unknown_and_secret_looking_keys_in_shared_sections_are_refused() {
        let error = refusal("[gateway.queue]\ncap = 3\ncapp = 4\n");
        assert_eq!(error.position().map(|at| (at.line, at.column)), Some((3, 1)), "{error}");
        assert!(error.to_string().contains("gateway.queue.capp: unknown key"), "{error}");
        assert!(error.to_string().contains("did you mean `cap`?"), "{error}");
        // A secret value has no key to go in.
        let error =
            refusal("[[gateway.bindings]]\ntransport = \"telegram\"\nbot_token = \"1:x\"\n");
        assert!(
            error.to_string().contains("gateway.bindings[0].bot_token: unknown key"),
            "{error}"
        );
    }

    #[test]
    fn bad_toml_and_bad_values_are_placed_in_the_body() {
        let error = refusal("[gateway]\nmax_concurrent_runs = \n");
        let ConfigError::Syntax { at, path, .. } = &error else { panic!("{error}") };
        assert_eq!((at.line, path.as_path()), (2, Path::new(SHARED_SOURCE)), "{error}");
        assert!(error.to_string().starts_with("cluster config:2:"), "{error}");

        let error = refusal("[gateway]\nmax_concurrent_runs = \"many\"\n");
        assert_eq!(error.position().map(|at| (at.line, at.column)), Some((2, 23)), "{error}");
        assert!(error.to_string().contains("gateway.max_concurrent_runs"), "{error}");

        let error = refusal("[gateway.queue]\ncap = 0\n");
        assert!(error.to_string().contains("gateway.queue.cap: must be at least 1"), "{error}");
        let error = refusal("[gateway.budgets]\ndaily_usd = -1.0\n");
        assert!(error.to_string().contains("gateway.budgets.daily_usd"), "{error}");
        let error = refusal("[[gateway.approvals.rules]]\ntool = \"[\"\naction = \"deny\"\n");
        assert!(error.to_string().contains("gateway.approvals.rules[0].tool"), "{error}");
    }
}
