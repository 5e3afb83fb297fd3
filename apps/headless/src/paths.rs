//! Where the gateway keeps its state. The binary decides these from the command
//! line and environment and passes them in; nothing below reads the environment.

use std::path::PathBuf;

/// The files of one gateway installation.
#[derive(Debug, Clone)]
pub struct Paths {
    /// `$LEMON_HOME`, default `~/.lemon`.
    pub home: PathBuf,
    /// `--config`, `$LEMON_CONFIG`, or `$LEMON_HOME/config.toml`.
    pub config: PathBuf,
}

impl Paths {
    /// Resolves the paths from the command line and the environment map.
    pub fn resolve(
        config_flag: Option<PathBuf>,
        env: &std::collections::BTreeMap<String, String>,
        user_home: Option<PathBuf>,
    ) -> Paths {
        let home = env
            .get("LEMON_HOME")
            .filter(|v| !v.trim().is_empty())
            .map(PathBuf::from)
            .or_else(|| user_home.map(|h| h.join(".lemon")))
            .unwrap_or_else(|| PathBuf::from(".lemon"));
        let config = config_flag
            .or_else(|| env.get("LEMON_CONFIG").filter(|v| !v.trim().is_empty()).map(PathBuf::from))
            .unwrap_or_else(|| home.join("config.toml"));
        Paths { home, config }
    }

    /// The SQLite database.
    pub fn database(&self) -> PathBuf {
        self.home.join("lemon.db")
    }

    /// Secrets for machines without a keychain (mode 0600).
    pub fn secrets(&self) -> PathBuf {
        self.home.join("secrets.toml")
    }
}
