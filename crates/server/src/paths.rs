//! Where the gateway keeps its state. The binary decides these from the command
//! line and environment and passes them in; nothing below reads the environment.

use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

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

/// How the state directory was made private.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HomeAccess {
    /// Created now, or already readable by its owner alone.
    Private,
    /// Other users could read it; its mode was set to 0700. Holds the old mode.
    Tightened(u32),
    /// Other users can read it and it belongs to someone else, so it was left
    /// alone. Holds its mode.
    SharedNotOurs(u32),
}

/// Creates `home` with mode 0700 when missing. An existing home that others can
/// read, list or write is tightened to 0700 when this process's user owns it; one
/// owned by another user is left as it is (the caller warns). The database holds
/// every prompt and answer, so nothing the gateway keeps is meant for other users.
///
/// # Errors
/// The directory cannot be created, read, or (when it is ours) changed.
pub fn secure_home(home: &Path) -> io::Result<HomeAccess> {
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(home)?;
    let meta = std::fs::metadata(home)?;
    let mode = meta.permissions().mode() & 0o7777;
    if mode & 0o077 == 0 {
        return Ok(HomeAccess::Private);
    }
    if meta.uid() != nix::unistd::geteuid().as_raw() {
        return Ok(HomeAccess::SharedNotOurs(mode));
    }
    std::fs::set_permissions(home, std::fs::Permissions::from_mode(0o700))?;
    Ok(HomeAccess::Tightened(mode))
}
