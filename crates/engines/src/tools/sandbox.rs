//! Kernel containment of the `bash` tool with Landlock.
//!
//! Each command gets a ruleset made for it before it starts, enforced in the
//! child between fork and exec (`no_new_privs`, then `landlock_restrict_self`),
//! so the shell and everything it starts:
//! - write, create and delete only in the run's directory, the workspace and a
//!   temporary directory of the call's own (`TMPDIR`, removed afterwards);
//! - read and execute only there and under the read roots (system directories
//!   by default), never in the gateway's state or `~/.ssh`: a root that holds
//!   either is left out;
//! - open TCP connections only to the allowed ports, bind none (ABI 4);
//! - signal nothing and reach no abstract socket outside the command (ABI 6).
//!
//! The file tools are held to the run's directory and the workspace in the
//! gateway itself ([`lemon_core::contain::Reach`]): Landlock restricts a whole
//! thread, and the gateway's threads serve every run.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use lemon_core::config::{SandboxConfig, SandboxMode};
use lemon_core::contain::OffLimits;

/// What the kernel offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Support {
    /// Landlock with this ABI version.
    Landlock(u8),
    /// No Landlock: not built in, not enabled, or `simulate_no_landlock`.
    Missing,
}

impl Support {
    /// The kernel's Landlock ABI, probed once per process.
    pub fn probe() -> Support {
        static PROBED: std::sync::OnceLock<Support> = std::sync::OnceLock::new();
        *PROBED.get_or_init(landlock_rules::probe)
    }
}

/// How `bash` is contained: the config's `[gateway.sandbox]` with the paths
/// resolved, and what the kernel offers.
#[derive(Debug, Clone)]
pub struct Sandbox {
    pub mode: SandboxMode,
    /// Absolute directories a command may read and execute beneath.
    pub read_roots: Vec<PathBuf>,
    /// TCP ports a command may connect to.
    pub connect_ports: Vec<u16>,
    /// `~/.ssh`: never granted, whatever the roots say.
    pub ssh_dir: Option<PathBuf>,
    pub support: Support,
}

impl Default for Sandbox {
    /// No containment: for tests of the tools themselves and embedders that
    /// contain the gateway otherwise.
    fn default() -> Self {
        Sandbox {
            mode: SandboxMode::Off,
            read_roots: Vec::new(),
            connect_ports: Vec::new(),
            ssh_dir: None,
            support: Support::Missing,
        }
    }
}

/// A ruleset ready to be enforced on one command.
#[derive(Debug, Clone)]
pub(crate) struct Confinement {
    pub(crate) ruleset: Arc<OwnedFd>,
}

impl Sandbox {
    /// From `[gateway.sandbox]`; `home` is the user's home (for `~`).
    pub fn from_config(config: &SandboxConfig, home: Option<&Path>) -> Sandbox {
        let expand = |path: &PathBuf| match (path.strip_prefix("~"), home) {
            (Ok(rest), Some(home)) => home.join(rest),
            _ => path.clone(),
        };
        Sandbox {
            mode: config.mode,
            read_roots: config.read_roots.iter().map(expand).collect(),
            connect_ports: config.allow_connect_ports.clone(),
            ssh_dir: home.map(|home| home.join(".ssh")),
            support: if config.simulate_no_landlock { Support::Missing } else { Support::probe() },
        }
    }

    /// Whether commands run contained.
    pub fn enforced(&self) -> bool {
        self.mode != SandboxMode::Off && matches!(self.support, Support::Landlock(_))
    }

    /// `/v1/status`'s `sandbox`: `{"mode", "landlock_abi" (null without
    /// Landlock), "enforced", "detail"}`.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "mode": self.mode.as_str(),
            "landlock_abi": match self.support {
                Support::Landlock(abi) => Some(abi),
                Support::Missing => None,
            },
            "enforced": self.enforced(),
            "detail": self.describe(),
        })
    }

    /// One line for the log, `doctor` and `/v1/status`.
    pub fn describe(&self) -> String {
        match (self.mode, self.support) {
            (SandboxMode::Off, _) => "off: bash runs with the gateway's own access".to_owned(),
            (_, Support::Landlock(abi)) => format!(
                "Landlock ABI {abi}: bash writes only in the run's directory, the workspace and a \
                 temporary directory, reads only there and under {} read roots, and connects to {}",
                self.read_roots.len(),
                match self.connect_ports.as_slice() {
                    [] => "no TCP port".to_owned(),
                    ports => format!(
                        "TCP ports {}",
                        ports.iter().map(u16::to_string).collect::<Vec<_>>().join(", ")
                    ),
                }
            ),
            (SandboxMode::Required, Support::Missing) => {
                "this kernel has no Landlock and mode = \"required\": bash is refused".to_owned()
            }
            (SandboxMode::Auto, Support::Missing) => {
                "this kernel has no Landlock: bash runs with the gateway's own access".to_owned()
            }
        }
    }

    /// The confinement of one command working in `cwd`, writing also in
    /// `writable` (the workspace, the call's temporary directory). `None`:
    /// it runs unconfined (mode `off`, or `auto` without Landlock).
    ///
    /// # Errors
    /// What the model is told: the sandbox is required and missing, a
    /// directory would grant the gateway's state, or the kernel refused the
    /// ruleset.
    pub(crate) fn confine(
        &self,
        cwd: &Path,
        writable: &[PathBuf],
        off_limits: &OffLimits,
    ) -> Result<Option<Confinement>, String> {
        match (self.mode, self.support) {
            (SandboxMode::Off, _) | (SandboxMode::Auto, Support::Missing) => return Ok(None),
            (SandboxMode::Required, Support::Missing) => {
                return Err("The command was not run: [gateway.sandbox] mode = \"required\" and \
                            this kernel has no Landlock."
                    .to_owned())
            }
            (_, Support::Landlock(_)) => {}
        }
        let refused = |path: &Path| {
            off_limits.overlaps(path)
                || self
                    .ssh_dir
                    .as_deref()
                    .is_some_and(|ssh| ssh.starts_with(path) || path.starts_with(ssh))
        };
        if refused(cwd) {
            return Err(format!(
                "The command was not run: its directory {} holds the gateway's state or ~/.ssh, \
                 which the sandbox cannot grant.",
                cwd.display()
            ));
        }
        let write: Vec<&Path> = std::iter::once(cwd)
            .chain(writable.iter().map(PathBuf::as_path))
            .filter(|path| !refused(path))
            .collect();
        let read: Vec<&Path> =
            self.read_roots.iter().map(PathBuf::as_path).filter(|path| !refused(path)).collect();
        self.ruleset(&read, &write)
            .map(|ruleset| Some(Confinement { ruleset: Arc::new(ruleset) }))
            .map_err(|err| format!("The command was not run: the sandbox could not be made: {err}"))
    }

    fn ruleset(&self, read: &[&Path], write: &[&Path]) -> Result<OwnedFd, String> {
        landlock_rules::ruleset(read, write, &self.connect_ports)
    }
}

#[cfg(target_os = "linux")]
mod landlock_rules {
    use std::os::fd::OwnedFd;
    use std::path::Path;

    use landlock::{
        path_beneath_rules, Access, AccessFs, AccessNet, CompatLevel, Compatible, NetPort, Ruleset,
        RulesetAttr, RulesetCreatedAttr, RulesetError, Scope, ABI,
    };

    use super::Support;

    /// The highest Landlock ABI this gateway asks for.
    const ABI_WANTED: ABI = ABI::V6;

    /// The newest ABI the kernel has, up to [`ABI_WANTED`].
    pub(super) fn probe() -> Support {
        let versions =
            [(ABI::V6, 6), (ABI::V5, 5), (ABI::V4, 4), (ABI::V3, 3), (ABI::V2, 2), (ABI::V1, 1)];
        versions
            .into_iter()
            .find(|(abi, _)| {
                Ruleset::default()
                    .set_compatibility(CompatLevel::HardRequirement)
                    .handle_access(AccessFs::from_all(*abi))
                    .and_then(Ruleset::create)
                    .is_ok()
            })
            .map_or(Support::Missing, |(_, version)| Support::Landlock(version))
    }

    /// Read and execute beneath `read`; everything beneath `write`; devices
    /// under `/dev` read and written (`/dev/null`, a terminal), not made;
    /// TCP connections to `ports` only; no signal or abstract socket out.
    /// What an older kernel lacks is left out (best effort).
    pub(super) fn ruleset(
        read: &[&Path],
        write: &[&Path],
        ports: &[u16],
    ) -> Result<OwnedFd, String> {
        let abi = ABI_WANTED;
        let devices = AccessFs::from_read(abi) | AccessFs::WriteFile | AccessFs::IoctlDev;
        let created =
            Ruleset::default()
                .handle_access(AccessFs::from_all(abi))
                .and_then(|r| r.handle_access(AccessNet::BindTcp | AccessNet::ConnectTcp))
                .and_then(|r| r.scope(Scope::AbstractUnixSocket | Scope::Signal))
                .and_then(Ruleset::create)
                .and_then(|r| r.add_rules(path_beneath_rules(read, AccessFs::from_read(abi))))
                .and_then(|r| r.add_rules(path_beneath_rules(["/dev"], devices)))
                .and_then(|r| r.add_rules(path_beneath_rules(write, AccessFs::from_all(abi))))
                .and_then(|r| {
                    r.add_rules(ports.iter().map(|port| {
                        Ok::<_, RulesetError>(NetPort::new(*port, AccessNet::ConnectTcp))
                    }))
                })
                .map_err(|err| err.to_string())?;
        let fd: Option<OwnedFd> = created.into();
        fd.ok_or_else(|| "this kernel made no Landlock ruleset".to_owned())
    }
}

#[cfg(not(target_os = "linux"))]
mod landlock_rules {
    use std::os::fd::OwnedFd;
    use std::path::Path;

    use super::Support;

    pub(super) fn probe() -> Support {
        Support::Missing
    }

    pub(super) fn ruleset(_: &[&Path], _: &[&Path], _: &[u16]) -> Result<OwnedFd, String> {
        Err("Landlock is Linux's".to_owned())
    }
}
