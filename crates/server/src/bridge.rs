//! Starting a channel's helper process (the XMTP bridge) through the engines'
//! process module, the only place that spawns: the program looked up on the
//! gateway's `PATH`, its own process group recorded in the store while it runs
//! (so a start after a crash kills what is left), killed with the gateway.

use std::path::Path;
use std::time::Duration;

use async_trait::async_trait;
use lemon_engines::cli::{spawn_helper, HelperChild, HelperSpec};
use lemon_transports::xmtp::bridge::{BridgeChild, BridgeCommand, BridgeProcess, Launcher};
use tokio_util::task::TaskTracker;

/// Starts bridges for the transports.
#[derive(Debug)]
pub(crate) struct HelperLauncher {
    pub(crate) groups: crate::ProcessGroups,
    pub(crate) tracker: TaskTracker,
}

#[async_trait]
impl Launcher for HelperLauncher {
    async fn launch(&self, command: BridgeCommand) -> Result<BridgeProcess, String> {
        let search = command.env.get("PATH").cloned().unwrap_or_default();
        let program = if command.program.contains('/') {
            Path::new(&command.program).to_path_buf()
        } else {
            lemon_engines::cli::which(Path::new(&command.program), &search)
                .ok_or_else(|| format!("{} is not on the PATH", command.program))?
        };
        let spec = HelperSpec { program, args: command.args, cwd: command.cwd, env: command.env };
        let helper = spawn_helper(spec, &self.tracker).await?;
        if let Some(group) = helper.group {
            if let Err(error) = self.groups.record(group).await {
                tracing::warn!(pgid = group.pgid, %error, "process group not recorded");
            }
        }
        Ok(BridgeProcess {
            stdin: Box::pin(helper.stdin),
            stdout: Box::pin(helper.stdout),
            stderr: Box::pin(helper.stderr),
            child: Box::new(RecordedChild { child: helper.child, groups: self.groups.clone() }),
        })
    }
}

/// A helper whose group record is forgotten once it is reaped.
#[derive(Debug)]
struct RecordedChild {
    child: HelperChild,
    groups: crate::ProcessGroups,
}

#[async_trait]
impl BridgeChild for RecordedChild {
    async fn wait(&mut self) -> String {
        let exit = self.child.wait().await;
        self.groups.forget(self.child.pgid()).await;
        exit
    }

    async fn stop(&mut self, grace: Duration) -> String {
        let exit = self.child.terminate(grace).await;
        self.groups.forget(self.child.pgid()).await;
        exit
    }
}
