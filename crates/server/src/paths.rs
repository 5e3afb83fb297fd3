//! Where the gateway keeps its state. The binary decides these from the command
//! line and environment and passes them in; nothing below reads the environment.

use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use lemon_core::contain::{OffLimits, Reach};

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

    /// Where the gateway running on this home says where it listens
    /// (`{"pid", "api", "health"}`, written at start and removed at a clean
    /// stop), so a client finds it when `config.toml` has an edit it refused.
    pub fn running(&self) -> PathBuf {
        self.home.join("gateway.json")
    }

    /// `$LEMON_HOME/media`: received files waiting for their run.
    pub fn media_stage(&self) -> lemon_core::media::MediaStage {
        lemon_core::media::MediaStage::new(self.home.join("media"))
    }

    /// Where a run goes whose directory would hold the gateway's state:
    /// `lemon-workspace` beside the home (`~/lemon-workspace` for the
    /// default `~/.lemon`), never inside it.
    pub fn spare_dir(&self) -> PathBuf {
        let home = self.home.canonicalize().unwrap_or_else(|_| self.home.clone());
        home.parent().unwrap_or(&home).join(SPARE_DIR)
    }

    /// What no run may read or write, wherever it works: the home (but the
    /// `workspace` in it), the config file and its directory, the secrets
    /// file and the keychain's files under `user_home`. The config file's
    /// directory is left out when it is the user's home or above it (a
    /// `--config ~/lemon.toml`): everything would be off limits then, so only
    /// the file itself is.
    pub fn off_limits(&self, user_home: Option<&Path>, workspace: &Path) -> OffLimits {
        let mut denied =
            vec![self.home.clone(), self.secrets(), self.database(), self.config.clone()];
        let config_dir = self.config.parent().filter(|dir| !dir.as_os_str().is_empty());
        if let Some(dir) = config_dir {
            let canonical = |path: &Path| path.canonicalize().unwrap_or_else(|_| path.to_owned());
            let above_user =
                user_home.is_some_and(|user| canonical(user).starts_with(canonical(dir)));
            if !above_user {
                denied.push(dir.to_owned());
            }
        }
        if let Some(user) = user_home {
            denied.extend(KEYCHAIN_FILES.iter().map(|rel| user.join(rel)));
        }
        OffLimits::new(denied, [workspace.to_owned()])
    }

    /// The workspace runs use and what they may not touch, for a configured
    /// `workspace`: one that would hold the state (or be in it) is replaced by
    /// [`Paths::spare_dir`].
    pub fn fence(&self, user_home: Option<&Path>, workspace: PathBuf) -> Fence {
        let spare = self.spare_dir();
        let configured = self.off_limits(user_home, &workspace);
        if !configured.overlaps(&workspace) {
            return Fence {
                off_limits: configured,
                workspace,
                spare,
                moved_from: None,
                media: self.media_stage(),
            };
        }
        Fence {
            off_limits: self.off_limits(user_home, &spare),
            workspace: spare.clone(),
            spare,
            moved_from: Some(workspace),
            media: self.media_stage(),
        }
    }
}

/// The name of [`Paths::spare_dir`].
pub const SPARE_DIR: &str = "lemon-workspace";

/// Where the keychains keep their files, under the user's home: GNOME
/// Keyring, KWallet, macOS Keychain.
const KEYCHAIN_FILES: &[&str] = &[
    ".local/share/keyrings",
    ".local/share/kwalletd",
    ".kde/share/apps/kwallet",
    ".kde4/share/apps/kwallet",
    "Library/Keychains",
];

/// Where runs may work and what they may not touch, decided once from the
/// [`Paths`] and the configured workspace.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Fence {
    /// The gateway's state, handed to every run.
    pub off_limits: OffLimits,
    /// The workspace runs use.
    pub workspace: PathBuf,
    /// Where a run goes whose own directory would hold the state.
    pub spare: PathBuf,
    /// The configured workspace, when it held the state and was replaced.
    pub moved_from: Option<PathBuf>,
    /// Where channels keep received files until their run starts.
    pub media: lemon_core::media::MediaStage,
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

impl Fence {
    /// The workspace alone, less the state: where channels save the files
    /// they receive (email attachments).
    pub fn reach(&self) -> Reach {
        Reach::new([self.workspace.clone()], self.off_limits.clone())
    }
}

#[cfg(test)]
mod tests;
