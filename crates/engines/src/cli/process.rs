//! The one place in the workspace that spawns a process.
//!
//! A child gets an explicit working directory, exactly the environment it is given
//! (`env_clear` first), its own process group (so one signal reaches everything it
//! started), piped stdout and stderr, and stdin that is either `/dev/null`, a payload
//! written then closed, or kept open for more writes. `kill_on_drop` is set and
//! dropping a [`CliChild`] that was never reaped SIGKILLs its whole group, so a
//! dropped run (gateway shutdown) leaves no process behind.
//!
//! Output is read through bounded buffers: [`LineReader`] yields stdout lines up to a
//! limit and skips (without storing) the rest of a longer line; [`StderrTail`] keeps
//! the last few KiB of stderr.

use std::collections::BTreeMap;
use std::io;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStderr, ChildStdin, ChildStdout, Command};
use tokio::sync::mpsc;
use tokio_util::sync::{CancellationToken, DropGuard};
use tokio_util::task::TaskTracker;

/// How much of stderr is kept (its last bytes).
pub(crate) const STDERR_TAIL_BYTES: usize = 8 * 1024;

/// What the child reads on stdin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum StdinMode {
    /// `/dev/null`.
    Null,
    /// This payload, then end of file.
    Write(Vec<u8>),
    /// This payload, then whatever [`StdinHandle::write`] sends, until the handle drops.
    KeepOpen(Vec<u8>),
}

/// A process to start.
#[derive(Debug, Clone)]
pub(crate) struct ProcessSpec {
    pub(crate) program: PathBuf,
    pub(crate) args: Vec<String>,
    pub(crate) cwd: PathBuf,
    /// The complete environment of the child.
    pub(crate) env: BTreeMap<String, String>,
    pub(crate) stdin: StdinMode,
    /// The last argument is the user's prompt: logs show a placeholder instead.
    pub(crate) prompt_is_last_arg: bool,
}

/// Why a process could not be started.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SpawnError {
    #[error("working directory {} does not exist or is not a directory", .0.display())]
    Cwd(PathBuf),
    #[error("could not start {}: {source}", .program.display())]
    Spawn { program: PathBuf, source: io::Error },
    #[error("{} exited before it could be supervised", .0.display())]
    Vanished(PathBuf),
    #[error("{} started without its output pipes", .0.display())]
    Pipes(PathBuf),
}

/// A started process and its pipes.
#[derive(Debug)]
pub(crate) struct Spawned {
    pub(crate) child: CliChild,
    pub(crate) stdout: LineReader<ChildStdout>,
    pub(crate) stderr: StderrTail<ChildStderr>,
    /// Present in [`StdinMode::KeepOpen`]; dropping it closes the child's stdin.
    pub(crate) stdin: Option<StdinHandle>,
}

/// Starts `spec` in its own process group. Stdin is written by a task on `tracker`
/// that ends when the payload is written (or the handle drops, or the child dies).
///
/// # Errors
/// [`SpawnError`] when the working directory is missing or the exec fails.
pub(crate) fn spawn(
    spec: ProcessSpec,
    max_line_bytes: usize,
    tracker: &TaskTracker,
) -> Result<Spawned, SpawnError> {
    if !spec.cwd.is_dir() {
        return Err(SpawnError::Cwd(spec.cwd));
    }
    // The one sanctioned `Command::new` of the workspace: every child goes through here
    // so that cwd, environment, process group and kill-on-drop are always set.
    #[allow(clippy::disallowed_methods)]
    let mut command = Command::new(&spec.program);
    command
        .args(&spec.args)
        .current_dir(&spec.cwd)
        .env_clear()
        .envs(&spec.env)
        .stdin(if spec.stdin == StdinMode::Null { Stdio::null() } else { Stdio::piped() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let mut child = command
        .spawn()
        .map_err(|source| SpawnError::Spawn { program: spec.program.clone(), source })?;
    let pid = child.id().ok_or_else(|| SpawnError::Vanished(spec.program.clone()))?;
    // A pid always fits an i32 on the platforms we run on; the leader's pid is the group id.
    let pgid =
        Pid::from_raw(i32::try_from(pid).map_err(|_| SpawnError::Vanished(spec.program.clone()))?);
    tracing::debug!(
        pid,
        program = %spec.program.display(),
        args = ?loggable_args(&spec),
        cwd = %spec.cwd.display(),
        env_keys = ?spec.env.keys().collect::<Vec<_>>(),
        "cli process started"
    );

    let (Some(stdout), Some(stderr)) = (child.stdout.take(), child.stderr.take()) else {
        return Err(SpawnError::Pipes(spec.program));
    };
    let stop = CancellationToken::new();
    let stdin = match (spec.stdin, child.stdin.take()) {
        (StdinMode::Write(payload), Some(pipe)) => {
            tracker.spawn(write_stdin(pipe, payload, None, stop.clone()));
            None
        }
        (StdinMode::KeepOpen(payload), Some(pipe)) => {
            let (tx, rx) = mpsc::channel(16);
            tracker.spawn(write_stdin(pipe, payload, Some(rx), stop.clone()));
            Some(StdinHandle { tx })
        }
        _ => None,
    };
    Ok(Spawned {
        child: CliChild { child, pgid, exit: None, _stop_stdin: stop.drop_guard() },
        stdout: LineReader::new(stdout, max_line_bytes),
        stderr: StderrTail::new(stderr, STDERR_TAIL_BYTES),
        stdin,
    })
}

fn loggable_args(spec: &ProcessSpec) -> Vec<&str> {
    let n = spec.args.len();
    spec.args
        .iter()
        .enumerate()
        .map(
            |(i, arg)| {
                if spec.prompt_is_last_arg && i + 1 == n {
                    "[prompt]"
                } else {
                    arg.as_str()
                }
            },
        )
        .collect()
}

/// Sends more input to a child whose stdin is kept open. Dropping it closes stdin.
#[derive(Debug)]
pub(crate) struct StdinHandle {
    tx: mpsc::Sender<Vec<u8>>,
}

impl StdinHandle {
    /// Queues bytes for the child's stdin.
    ///
    /// # Errors
    /// The bytes back when the writer has stopped (the child is gone) or is backed up.
    pub(crate) fn write(&self, bytes: Vec<u8>) -> Result<(), Vec<u8>> {
        self.tx.try_send(bytes).map_err(|err| match err {
            mpsc::error::TrySendError::Full(bytes) | mpsc::error::TrySendError::Closed(bytes) => {
                bytes
            }
        })
    }
}

/// Writes `payload`, then (when kept open) whatever arrives on `more`; stdin closes
/// when this returns. A write blocks at most until the child dies or `stop` fires.
async fn write_stdin(
    mut pipe: ChildStdin,
    payload: Vec<u8>,
    mut more: Option<mpsc::Receiver<Vec<u8>>>,
    stop: CancellationToken,
) {
    let mut next = Some(payload);
    while let Some(bytes) = next.take() {
        let written = tokio::select! {
            () = stop.cancelled() => return,
            written = async {
                pipe.write_all(&bytes).await?;
                pipe.flush().await
            } => written,
        };
        if let Err(err) = written {
            tracing::debug!(error = %err, "cli stdin closed by the child");
            return;
        }
        let Some(rx) = more.as_mut() else { return };
        next = tokio::select! {
            () = stop.cancelled() => return,
            bytes = rx.recv() => bytes,
        };
    }
}

/// How a process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Exit {
    pub(crate) code: Option<i32>,
    pub(crate) signal: Option<i32>,
}

impl Exit {
    pub(crate) fn success(&self) -> bool {
        self.code == Some(0)
    }

    fn from_status(status: ExitStatus) -> Self {
        Exit { code: status.code(), signal: status.signal() }
    }
}

/// A running child and its process group. Reaped by [`CliChild::wait`]; a child
/// dropped before that is SIGKILLed with its whole group.
#[derive(Debug)]
pub(crate) struct CliChild {
    child: Child,
    pgid: Pid,
    /// Set once the leader has been reaped.
    exit: Option<Exit>,
    /// Stops the stdin writer when the child goes away.
    _stop_stdin: DropGuard,
}

impl CliChild {
    /// The process group id (the leader's pid).
    pub(crate) fn pgid(&self) -> i32 {
        self.pgid.as_raw()
    }

    /// Waits for the leader to exit and reaps it.
    ///
    /// # Cancel safety
    /// Cancel safe: a cancelled wait can be repeated.
    pub(crate) async fn wait(&mut self) -> Exit {
        if let Some(exit) = self.exit {
            return exit;
        }
        let exit = match self.child.wait().await {
            Ok(status) => Exit::from_status(status),
            Err(err) => {
                tracing::warn!(pgid = self.pgid.as_raw(), error = %err, "could not wait for cli process");
                Exit { code: None, signal: None }
            }
        };
        self.exit = Some(exit);
        exit
    }

    /// Sends `signal` to every process of the group; a group that is already gone is fine.
    pub(crate) fn signal_group(&self, signal: Signal) {
        match killpg(self.pgid, signal) {
            Ok(()) | Err(Errno::ESRCH) => {}
            Err(err) => {
                tracing::warn!(pgid = self.pgid.as_raw(), %signal, error = %err, "could not signal cli process group")
            }
        }
    }

    /// SIGKILLs the group and reaps the leader.
    pub(crate) async fn kill(&mut self) -> Exit {
        self.signal_group(Signal::SIGKILL);
        let exit = self.wait().await;
        // Members that outlived the leader (it may have exited just before the signal).
        self.signal_group(Signal::SIGKILL);
        exit
    }

    /// SIGTERM to the group, up to `grace` for the leader to exit, then SIGKILL;
    /// the leader is reaped and any member left is killed.
    pub(crate) async fn terminate(&mut self, grace: Duration) -> Exit {
        if let Some(exit) = self.exit {
            self.signal_group(Signal::SIGKILL);
            return exit;
        }
        self.signal_group(Signal::SIGTERM);
        match tokio::time::timeout(grace, self.wait()).await {
            Ok(exit) => {
                // Members that ignored SIGTERM must not outlive the run.
                self.signal_group(Signal::SIGKILL);
                exit
            }
            Err(_elapsed) => {
                tracing::debug!(
                    pgid = self.pgid.as_raw(),
                    "cli process ignored SIGTERM; killing it"
                );
                self.kill().await
            }
        }
    }
}

impl Drop for CliChild {
    fn drop(&mut self) {
        // Only before the leader is reaped: until then its pid (the group id) cannot be reused.
        if self.exit.is_none() {
            self.signal_group(Signal::SIGKILL);
        }
    }
}

/// One item of stdout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum StdoutLine {
    /// A line without its `\n` (a trailing `\r` is kept; invalid UTF-8 is replaced).
    Line(String),
    /// A line longer than the limit, skipped; its length in bytes.
    Oversized { bytes: usize },
}

/// Reads lines of at most `max` bytes; a longer line is skipped while it is read,
/// so its size never matters.
#[derive(Debug)]
pub(crate) struct LineReader<R> {
    inner: BufReader<R>,
    buf: Vec<u8>,
    max: usize,
    /// Bytes of the current line so far, once it is longer than `max`.
    skipping: Option<usize>,
    eof: bool,
}

impl<R: AsyncRead + Unpin> LineReader<R> {
    pub(crate) fn new(inner: R, max: usize) -> Self {
        LineReader {
            inner: BufReader::with_capacity(64 * 1024, inner),
            buf: Vec::new(),
            max,
            skipping: None,
            eof: false,
        }
    }

    /// The next line, or `None` at end of file (an unterminated last line is returned first).
    ///
    /// # Errors
    /// The pipe's read error.
    ///
    /// # Cancel safety
    /// Cancel safe: bytes read so far stay in the reader.
    pub(crate) async fn next_line(&mut self) -> io::Result<Option<StdoutLine>> {
        loop {
            if self.eof {
                return Ok(None);
            }
            let available = self.inner.fill_buf().await?;
            if available.is_empty() {
                self.eof = true;
                if let Some(bytes) = self.skipping.take() {
                    return Ok(Some(StdoutLine::Oversized { bytes }));
                }
                if self.buf.is_empty() {
                    return Ok(None);
                }
                return Ok(Some(self.take_line()));
            }
            let newline = available.iter().position(|b| *b == b'\n');
            let chunk = &available[..newline.unwrap_or(available.len())];
            let chunk_len = chunk.len();
            match self.skipping.as_mut() {
                Some(skipped) => *skipped += chunk_len,
                None if self.buf.len() + chunk_len > self.max => {
                    self.skipping = Some(self.buf.len() + chunk_len);
                    self.buf = Vec::new();
                }
                None => self.buf.extend_from_slice(chunk),
            }
            self.inner.consume(chunk_len + usize::from(newline.is_some()));
            if newline.is_some() {
                if let Some(bytes) = self.skipping.take() {
                    return Ok(Some(StdoutLine::Oversized { bytes }));
                }
                return Ok(Some(self.take_line()));
            }
        }
    }

    fn take_line(&mut self) -> StdoutLine {
        let bytes = std::mem::take(&mut self.buf);
        StdoutLine::Line(match String::from_utf8(bytes) {
            Ok(line) => line,
            Err(err) => String::from_utf8_lossy(err.as_bytes()).into_owned(),
        })
    }
}

/// Keeps the last `cap` bytes of a stream.
#[derive(Debug)]
pub(crate) struct StderrTail<R> {
    inner: R,
    tail: Vec<u8>,
    cap: usize,
    n_bytes: usize,
}

impl<R: AsyncRead + Unpin> StderrTail<R> {
    pub(crate) fn new(inner: R, cap: usize) -> Self {
        StderrTail { inner, tail: Vec::new(), cap, n_bytes: 0 }
    }

    /// Reads what is there; `false` at end of file (or on a read error).
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub(crate) async fn read_more(&mut self) -> bool {
        let mut chunk = [0u8; 4096];
        match self.inner.read(&mut chunk).await {
            Ok(0) | Err(_) => false,
            Ok(n) => {
                self.n_bytes += n;
                self.tail.extend_from_slice(&chunk[..n]);
                if self.tail.len() > self.cap {
                    let excess = self.tail.len() - self.cap;
                    self.tail.drain(..excess);
                }
                true
            }
        }
    }

    /// The kept text, and whether earlier bytes were dropped.
    pub(crate) fn text(&self) -> (String, bool) {
        let text = String::from_utf8_lossy(&self.tail);
        let truncated = self.n_bytes > self.tail.len();
        // A cut through a multi-byte character leaves a replacement character in front.
        let text = if truncated { text.trim_start_matches('\u{FFFD}') } else { &text };
        (text.to_owned(), truncated)
    }
}

#[cfg(test)]
mod tests;
