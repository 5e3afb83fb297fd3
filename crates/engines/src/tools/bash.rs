//! `bash`: a shell command in the run's working directory.
//!
//! The command runs as `/bin/sh -c <command>` through the process module: in
//! its own process group, with exactly the configured environment, stdin from
//! `/dev/null`. stdout and stderr are captured together, in arrival order, up
//! to the output limit (the head and the tail are kept and the text says how
//! much was cut between them). The call ends when the shell has exited and
//! its output is read; what the shell left running in its group is killed
//! then. A timeout or a cancelled run kills the whole group at once.
//!
//! Each command gets a temporary directory of its own (`TMPDIR`, `TMP`,
//! `TEMP`), removed when it ends, and is contained by the kernel as
//! `[gateway.sandbox]` says ([`super::Sandbox`]).

use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lemon_core::tool::{Tool, ToolContext, ToolOutput, ToolSpec};
use serde_json::{json, Value};
use tokio::io::AsyncReadExt;
use tokio::time::Sleep;
use tokio_util::task::TaskTracker;

use super::args::Args;
use super::BuiltinOptions;
use crate::cli::process::{self, Exit, ProcessSpec, StdinMode};

/// After the shell exits (or is killed), how long the output of processes
/// that left its group is still read before the call returns.
const DRAIN: Duration = Duration::from_secs(1);

/// `bash`.
#[derive(Debug)]
pub(super) struct Bash {
    options: Arc<BuiltinOptions>,
}

impl Bash {
    pub(super) fn new(options: Arc<BuiltinOptions>) -> Self {
        Bash { options }
    }
}

#[async_trait]
impl Tool for Bash {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "bash".to_owned(),
            description: format!(
                "Run a shell command (`sh -c`) in the working directory and return its combined \
                 stdout and stderr and its exit code. No input is given on stdin. The command is \
                 killed after `timeout_ms` (default {}, at most {}); processes it leaves behind \
                 are killed when it exits. Long output keeps its beginning and end.",
                self.options.bash_timeout.as_millis(),
                self.options.bash_max_timeout.as_millis()
            ),
            parameters: json!({
                "type": "object",
                "properties": {
                    "command": {"type": "string", "description": "The shell command to run"},
                    "timeout_ms": {"type": "integer", "minimum": 1, "description": "Kill the command after this many milliseconds"}
                },
                "required": ["command"],
                "additionalProperties": false
            }),
        }
    }

    async fn execute(&self, args: Value, ctx: ToolContext) -> ToolOutput {
        let (command, timeout) = match self.parse(&args) {
            Ok(parsed) => parsed,
            Err(message) => return ToolOutput::error(message),
        };
        run(&self.options, command, timeout, &ctx).await
    }
}

impl Bash {
    fn parse(&self, args: &Value) -> Result<(String, Duration), String> {
        let args = Args::new(args)?;
        let command = args.required_str("command")?;
        let timeout = match args.uint("timeout_ms")? {
            None => self.options.bash_timeout,
            Some(0) => return Err("timeout_ms must be at least 1".to_owned()),
            Some(ms) => Duration::from_millis(ms).min(self.options.bash_max_timeout),
        };
        Ok((command, timeout))
    }
}

/// The call's own temporary directory (`TMPDIR`, writable under the
/// sandbox), removed with what is in it when the call ends.
struct CallTemp {
    path: PathBuf,
}

impl CallTemp {
    fn create() -> std::io::Result<CallTemp> {
        use std::os::unix::fs::DirBuilderExt;
        let path = std::env::temp_dir().join(format!("lemon-bash-{}", uuid::Uuid::new_v4()));
        std::fs::DirBuilder::new().mode(0o700).create(&path)?;
        Ok(CallTemp { path })
    }
}

impl Drop for CallTemp {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// How a command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ending {
    Exited(Exit),
    TimedOut,
    Cancelled,
}

async fn run(
    options: &BuiltinOptions,
    command: String,
    timeout: Duration,
    ctx: &ToolContext,
) -> ToolOutput {
    if ctx.cancel.is_cancelled() {
        return ToolOutput::error("The run was cancelled; the command was not started.");
    }
    let temp = match CallTemp::create() {
        Ok(temp) => temp,
        Err(err) => return ToolOutput::error(format!("Could not run the command: {err}")),
    };
    let writable: Vec<PathBuf> =
        ctx.workspace.iter().cloned().chain(std::iter::once(temp.path.clone())).collect();
    let confinement = match options.sandbox.confine(&ctx.cwd, &writable, &ctx.off_limits) {
        Ok(confinement) => confinement,
        Err(message) => return ToolOutput::error(message),
    };
    let mut env = options.bash_env.clone();
    for name in ["TMPDIR", "TMP", "TEMP"] {
        env.insert(name.to_owned(), temp.path.display().to_string());
    }
    let spec = ProcessSpec {
        program: PathBuf::from("/bin/sh"),
        args: vec!["-c".to_owned(), command],
        cwd: ctx.cwd.clone(),
        env,
        stdin: StdinMode::Null,
        // The command may hold anything: logs show a placeholder.
        prompt_is_last_arg: true,
        landlock: confinement.map(|confinement| confinement.ruleset),
    };
    let tracker = TaskTracker::new();
    let spawned = match process::spawn(spec, 1024, &tracker).await {
        Ok(spawned) => spawned,
        Err(err) => return ToolOutput::error(format!("Could not run the command: {err}")),
    };
    let pgid = spawned.child.pgid();
    if let (Some(recorder), Some(group)) = (&options.recorder, spawned.group) {
        recorder.started(group).await;
    }
    let mut child = spawned.child;
    let mut stdout = spawned.stdout.into_inner();
    let mut stderr = spawned.stderr.into_inner();
    let mut captured = Captured::new(options.output_limit);
    let (mut out_buf, mut err_buf) = ([0u8; 8192], [0u8; 8192]);
    let (mut out_open, mut err_open) = (true, true);
    let mut exit: Option<Exit> = None;
    let deadline = tokio::time::sleep(timeout);
    tokio::pin!(deadline);
    let mut drain: Option<Pin<Box<Sleep>>> = None;

    let ending = loop {
        if let Some(exit) = exit.filter(|_| !out_open && !err_open) {
            break Ending::Exited(exit);
        }
        tokio::select! {
            () = ctx.cancel.cancelled() => {
                child.kill().await;
                break Ending::Cancelled;
            }
            () = &mut deadline, if exit.is_none() => {
                child.kill().await;
                break Ending::TimedOut;
            }
            () = async { drain.as_mut().expect("guarded").await }, if drain.is_some() => {
                // Something that left the group still holds the pipes.
                break Ending::Exited(exit.expect("the drain starts at the exit"));
            }
            read = stdout.read(&mut out_buf), if out_open => match read {
                Ok(n) if n > 0 => captured.push(&out_buf[..n]),
                _ => out_open = false,
            },
            read = stderr.read(&mut err_buf), if err_open => match read {
                Ok(n) if n > 0 => captured.push(&err_buf[..n]),
                _ => err_open = false,
            },
            exited = child.wait(), if exit.is_none() => {
                exit = Some(exited);
                // What the shell left running goes with it: its group, and what
                // left the group (its cgroup, its scope).
                child.kill_all();
                drain = Some(Box::pin(tokio::time::sleep(DRAIN)));
            }
        }
    };
    if !matches!(ending, Ending::Exited(_)) {
        // The group is killed: read what it wrote up to its end (its pipes
        // close as its processes die), so nothing of it runs once this returns.
        let rest = async {
            while out_open || err_open {
                tokio::select! {
                    read = stdout.read(&mut out_buf), if out_open => match read {
                        Ok(n) if n > 0 => captured.push(&out_buf[..n]),
                        _ => out_open = false,
                    },
                    read = stderr.read(&mut err_buf), if err_open => match read {
                        Ok(n) if n > 0 => captured.push(&err_buf[..n]),
                        _ => err_open = false,
                    },
                }
            }
        };
        let _ = tokio::time::timeout(DRAIN, rest).await;
    }
    if let Some(recorder) = &options.recorder {
        recorder.reaped(pgid).await;
    }
    finish(ending, timeout, &captured)
}

fn finish(ending: Ending, timeout: Duration, captured: &Captured) -> ToolOutput {
    let mut text = captured.text();
    if text.is_empty() {
        text.push_str("(no output)");
    }
    if !text.ends_with('\n') {
        text.push('\n');
    }
    let timeout_ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
    let mut details = json!({
        "output_bytes": captured.total,
        "truncated": captured.cut() > 0,
    });
    let (is_error, result_meta) = match ending {
        Ending::Exited(exit) => {
            match (exit.code, exit.signal) {
                (Some(code), _) => text.push_str(&format!("[exit code {code}]")),
                (None, Some(signal)) => text.push_str(&format!("[killed by signal {signal}]")),
                (None, None) => text.push_str("[exit status unknown]"),
            }
            details["exit_code"] = json!(exit.code);
            details["signal"] = json!(exit.signal);
            let meta = match exit.signal {
                Some(signal) => json!({ "exit_code": exit.code, "signal": signal }),
                None => json!({ "exit_code": exit.code }),
            };
            (!exit.success(), meta)
        }
        Ending::TimedOut => {
            text.push_str(&format!("[timed out after {timeout_ms} ms; the command was killed]"));
            details["timed_out"] = json!(true);
            (true, json!({ "error_type": "timeout", "timeout_ms": timeout_ms }))
        }
        Ending::Cancelled => {
            text.push_str("[the run was cancelled; the command was killed]");
            (true, json!({ "error_type": "cancelled" }))
        }
    };
    if is_error {
        details["error"] = json!(true);
    }
    ToolOutput { text, details, is_error, result_meta }
}

/// A command's output: the first and the last bytes up to a limit, and how
/// many there were in all.
#[derive(Debug)]
struct Captured {
    head: Vec<u8>,
    tail: Vec<u8>,
    head_cap: usize,
    tail_cap: usize,
    total: usize,
}

impl Captured {
    fn new(limit: usize) -> Self {
        let head_cap = limit / 2;
        Captured {
            head: Vec::new(),
            tail: Vec::new(),
            head_cap,
            tail_cap: limit - head_cap,
            total: 0,
        }
    }

    fn push(&mut self, mut bytes: &[u8]) {
        self.total += bytes.len();
        let room = self.head_cap - self.head.len();
        if room > 0 {
            let take = room.min(bytes.len());
            self.head.extend_from_slice(&bytes[..take]);
            bytes = &bytes[take..];
        }
        self.tail.extend_from_slice(bytes);
        if self.tail.len() > self.tail_cap * 2 {
            self.tail.drain(..self.tail.len() - self.tail_cap);
        }
    }

    /// Bytes dropped between the head and the tail.
    fn cut(&self) -> usize {
        self.total - self.head.len() - self.tail.len().min(self.tail_cap)
    }

    fn text(&self) -> String {
        let tail = &self.tail[self.tail.len().saturating_sub(self.tail_cap)..];
        let cut = self.cut();
        if cut == 0 {
            let mut all = self.head.clone();
            all.extend_from_slice(tail);
            return String::from_utf8_lossy(&all).into_owned();
        }
        let head = String::from_utf8_lossy(&self.head);
        let tail = String::from_utf8_lossy(tail);
        // A cut through a multi-byte character leaves a replacement character.
        let head = head.trim_end_matches('\u{FFFD}');
        let tail = tail.trim_start_matches('\u{FFFD}');
        format!("{head}\n[... {cut} bytes of output cut ...]\n{tail}")
    }
}

#[cfg(test)]
mod tests;
