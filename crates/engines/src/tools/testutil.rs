//! What the tools' tests share: a call context in a temp dir.

use std::path::{Path, PathBuf};

use lemon_core::contain::OffLimits;
use lemon_core::ids::RunId;
use lemon_core::tool::ToolContext;
use tokio_util::sync::CancellationToken;

/// What [`Dirs::plant_state`] writes to the gateway's secrets file.
pub(super) const SECRETS: &str = "lemon_api_token = \"tok-state-1234567890\"\n";
/// What [`Dirs::plant_state`] writes to the gateway's config file.
pub(super) const CONFIG: &str = "[gateway]\ndefault_engine = \"echo\"\n";

/// A temp dir with `cwd/` and `workspace/` in it, and `outside/secret` next to
/// them, for containment attacks.
#[derive(Debug)]
pub(super) struct Dirs {
    pub(super) _tmp: tempfile::TempDir,
    pub(super) cwd: PathBuf,
    pub(super) workspace: PathBuf,
    pub(super) outside: PathBuf,
}

impl Dirs {
    pub(super) fn new() -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let cwd = tmp.path().join("cwd");
        let workspace = tmp.path().join("workspace");
        let outside = tmp.path().join("outside");
        for dir in [&cwd, &workspace, &outside] {
            std::fs::create_dir_all(dir).unwrap();
        }
        std::fs::write(outside.join("secret"), "top secret\n").unwrap();
        Dirs { _tmp: tmp, cwd, workspace, outside }
    }

    pub(super) fn ctx(&self) -> ToolContext {
        self.ctx_for("agent:main:main")
    }

    pub(super) fn ctx_for(&self, session: &str) -> ToolContext {
        ToolContext {
            run_id: RunId::parse("run_test").unwrap(),
            session_key: session.into(),
            call_id: "call_1".to_owned(),
            cwd: self.cwd.clone(),
            workspace: Some(self.workspace.clone()),
            off_limits: OffLimits::new([self.state()], []),
            cancel: CancellationToken::new(),
        }
    }

    /// `cwd/.lemon`: the gateway's home inside the run's directory, off limits.
    pub(super) fn state(&self) -> PathBuf {
        self.cwd.join(".lemon")
    }

    /// Fills [`Dirs::state`] with `secrets.toml` and `config.toml`, and plants
    /// `state_link` (a symlink to it) and `secrets_link` (to its secrets) in
    /// the workspace.
    pub(super) fn plant_state(&self) {
        std::fs::create_dir_all(self.state()).unwrap();
        std::fs::write(self.state().join("secrets.toml"), SECRETS).unwrap();
        std::fs::write(self.state().join("config.toml"), CONFIG).unwrap();
        std::os::unix::fs::symlink(self.state(), self.workspace.join("state_link")).unwrap();
        std::os::unix::fs::symlink(
            self.state().join("secrets.toml"),
            self.workspace.join("secrets_link"),
        )
        .unwrap();
    }

    /// Plants the links attacks go through: `link_out` (a symlink to
    /// `outside/`), `secret_link` (to `outside/secret`), `loop_a`/`loop_b` (a
    /// loop) and `dangling` (to a missing file outside).
    pub(super) fn plant_links(&self) {
        let link = |target: &Path, name: &str| {
            std::os::unix::fs::symlink(target, self.cwd.join(name)).unwrap();
        };
        link(&self.outside, "link_out");
        link(&self.outside.join("secret"), "secret_link");
        link(&self.cwd.join("loop_b"), "loop_a");
        link(&self.cwd.join("loop_a"), "loop_b");
        link(&self.outside.join("made_by_tool"), "dangling");
    }

    /// The paths every file tool must refuse, after [`Dirs::plant_links`].
    pub(super) fn attacks(&self) -> Vec<String> {
        vec![
            "../outside/secret".to_owned(),
            self.outside.join("secret").display().to_string(),
            "/etc/passwd".to_owned(),
            "secret_link".to_owned(),
            "loop_a".to_owned(),
            "link_out/secret".to_owned(),
            "dangling".to_owned(),
        ]
    }
}
