//! The one place in the workspace that spawns a process.
//!
//! A child gets an explicit working directory, exactly the environment it is given
//! (`env_clear` first), its own process group (so one signal reaches everything it
//! started), piped stdout and stderr, and stdin that is either `/dev/null`, a payload
//! written then closed, or kept open for more writes. `kill_on_drop` is set and
//! dropping a [`CliChild`] that was never reaped SIGKILLs its whole group, so a
//! dropped run (gateway shutdown) leaves no process behind.
//!
//! No CLI outlives the gateway. On Linux every child is started with a
//! parent-death signal (SIGKILL): the kernel sends it when the *thread* that
//! forked the child exits, so children are forked by one spawner thread that
//! lives as long as the process (it runs its own small runtime, which drives the
//! children's pipes and exits). Grandchildren get no such signal; for them every
//! group is recorded (pgid, the leader's start time and session, through a
//! [`ProcessRecorder`]) while it runs, and the next start kills what a killed
//! gateway left ([`kill_leftover_group`]).
//!
//! A descendant can leave the group (`setsid`, `setpgid`: a daemon, a dev
//! server), so a signal to the group misses it. Every child carries a scope of
//! its own in its environment ([`SCOPE_ENV`]), which its descendants inherit
//! wherever they go; whenever a group is killed, so is every process started
//! since its leader whose environment holds that scope (read from
//! `/proc/<pid>/environ`). A descendant can replace its whole environment
//! too, so where a cgroup v2 hierarchy is writable every child is also put in a
//! cgroup of its own before it execs ([`cgroup`]), which nothing it starts can
//! leave, and the cgroup is killed with the group ([`tracking`] says which
//! holds); the scope stays as the fallback.
//!
//! Children cannot read the gateway's secrets: the apps blank them in the
//! gateway's environment block first thing ([`seal_environment`]), and the
//! gateway is not dumpable ([`hide_from_children`], before the first child),
//! so `/proc/<gateway>/mem` (and, on most kernels, `environ`) need
//! `CAP_SYS_PTRACE`, and every child loses that capability (bounding, ambient,
//! inheritable, permitted and effective sets) before it execs, so a gateway
//! running as root does not hand it down either.
//!
//! Output is read through bounded buffers: [`LineReader`] yields stdout lines up to a
//! limit and skips (without storing) the rest of a longer line; [`StderrTail`] keeps
//! the last few KiB of stderr.

use std::collections::BTreeMap;
use std::fmt;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use async_trait::async_trait;
use lemon_core::store::ProcessGroupRecord;
use nix::errno::Errno;
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStderr, ChildStdin, ChildStdout, Command};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::{CancellationToken, DropGuard};
use tokio_util::task::TaskTracker;

mod cgroup;
mod environ;

pub use environ::{environment, is_secret_name, seal_environment, SealedEnvironment};

/// How much of stderr is kept (its last bytes).
pub(crate) const STDERR_TAIL_BYTES: usize = 8 * 1024;

/// The environment variable that carries a child's scope to all its descendants.
pub const SCOPE_ENV: &str = "LEMON_PROCESS_SCOPE";

/// A scope no other child of this or another gateway has: the time and pid of
/// this gateway's first spawn, then a counter.
fn new_scope() -> u64 {
    static BASE: OnceLock<u64> = OnceLock::new();
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let base = *BASE.get_or_init(|| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| since.as_nanos());
        // Truncation is fine: the value only has to differ from other gateways'.
        #[allow(clippy::cast_possible_truncation)]
        let nanos = nanos as u64;
        nanos ^ (u64::from(std::process::id()) << 40)
    });
    // Never 0, which stands for "no scope" in older records.
    base.wrapping_add(NEXT.fetch_add(1, Ordering::Relaxed)).max(1)
}

/// How the processes a child starts are found when its run ends, wherever
/// they went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tracking {
    /// Each child in a cgroup v2 of its own under this folder: nothing it starts
    /// can leave it.
    Cgroup { base: PathBuf },
    /// By process group, and by the scope in the environment; a descendant
    /// that leaves its group and replaces its environment escapes. `reason`
    /// says why there is no cgroup.
    Scope { reason: String },
}

impl fmt::Display for Tracking {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Tracking::Cgroup { base } => write!(f, "cgroup v2 ({})", base.display()),
            Tracking::Scope { reason } => {
                write!(f, "process group and environment scope only ({reason})")
            }
        }
    }
}

/// How this process tracks its children's processes; decided once, at the
/// first call (the first spawn at the latest).
pub fn tracking() -> &'static Tracking {
    static TRACKING: OnceLock<Tracking> = OnceLock::new();
    TRACKING.get_or_init(|| match cgroup::detect() {
        Ok(base) => Tracking::Cgroup { base },
        Err(reason) => Tracking::Scope { reason },
    })
}

fn cgroup_base() -> Option<&'static std::path::Path> {
    match tracking() {
        Tracking::Cgroup { base } => Some(base),
        Tracking::Scope { .. } => None,
    }
}

/// Makes this process's memory and environment unreadable to other processes
/// of its user, its children first (`PR_SET_DUMPABLE` 0): `/proc/<pid>/environ`,
/// `mem` and ptrace then need `CAP_SYS_PTRACE`, which no child keeps. Called
/// at start, and before the first child is forked in any case.
///
/// # Errors
/// The `prctl` error, as a phrase.
pub fn hide_from_children() -> Result<(), String> {
    #[cfg(target_os = "linux")]
    nix::sys::prctl::set_dumpable(false).map_err(|err| format!("PR_SET_DUMPABLE failed: {err}"))?;
    Ok(())
}

/// What the child reads on stdin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum StdinMode {
    /// `/dev/null`.
    Null,
    /// This payload, then end of file.
    Write(Vec<u8>),
    /// This payload, then whatever [`StdinHandle::write`] sends, until the handle drops.
    KeepOpen(Vec<u8>),
    /// The pipe itself, handed to the caller ([`Spawned::stdin_pipe`]).
    Pipe,
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
    /// A Landlock ruleset the child enforces on itself before it execs
    /// ([`crate::tools::Sandbox`]); held until the spawn returns.
    pub(crate) landlock: Option<std::sync::Arc<std::os::fd::OwnedFd>>,
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
    #[error("the process spawner is not running: {0}")]
    Spawner(String),
}

/// A started process and its pipes.
#[derive(Debug)]
pub(crate) struct Spawned {
    pub(crate) child: CliChild,
    pub(crate) stdout: LineReader<ChildStdout>,
    pub(crate) stderr: StderrTail<ChildStderr>,
    /// Present in [`StdinMode::KeepOpen`]; dropping it closes the child's stdin.
    pub(crate) stdin: Option<StdinHandle>,
    /// Present in [`StdinMode::Pipe`]: the child's stdin, to write as the caller likes.
    pub(crate) stdin_pipe: Option<ChildStdin>,
    /// The group as it is recorded; `None` where `/proc` cannot tell the leader's
    /// start time (then nothing is recorded).
    pub(crate) group: Option<ProcessGroupRecord>,
}

/// Starts `spec` in its own process group, from the spawner thread. Stdin is
/// written by a task on `tracker` that ends when the payload is written (or the
/// handle drops, or the child dies).
///
/// # Errors
/// [`SpawnError`] when the working directory is missing or the exec fails.
///
/// # Cancel safety
/// Not cancel safe: a child started for a cancelled call is killed when dropped.
pub(crate) async fn spawn(
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
    let scope = new_scope();
    let cgroup = cgroup_base().and_then(|base| match cgroup::create(base, scope) {
        Ok(cgroup) => Some(cgroup),
        Err(err) => {
            tracing::warn!(error = %err, "no cgroup for a child; it is tracked by its scope only");
            None
        }
    });
    command
        .args(&spec.args)
        .current_dir(&spec.cwd)
        .env_clear()
        .envs(&spec.env)
        .env(SCOPE_ENV, scope.to_string())
        .stdin(if spec.stdin == StdinMode::Null { Stdio::null() } else { Stdio::piped() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    #[cfg(target_os = "linux")]
    prepare_child(
        &mut command,
        cgroup.as_ref().map(|cgroup| cgroup.procs.as_raw_fd()),
        spec.landlock.as_ref().map(|ruleset| ruleset.as_raw_fd()),
    );
    let spawned = spawn_on_spawner(command).await?;
    // The child has joined its cgroup (or failed to start): the parent's
    // descriptor is not needed any more.
    let cgroup_dir = cgroup.map(|cgroup| cgroup.dir);
    let mut child = match spawned {
        Ok(child) => child,
        Err(source) => {
            if let Some(dir) = cgroup_dir {
                let _ = std::fs::remove_dir(dir);
            }
            return Err(SpawnError::Spawn { program: spec.program.clone(), source });
        }
    };
    let pid = child.id().ok_or_else(|| SpawnError::Vanished(spec.program.clone()))?;
    // A pid always fits an i32 on the platforms we run on; the leader's pid is the group id.
    let pgid =
        Pid::from_raw(i32::try_from(pid).map_err(|_| SpawnError::Vanished(spec.program.clone()))?);
    // The leader is not reaped yet, so its /proc entry is there (a zombie at worst).
    let leader = proc_stat(pgid.as_raw());
    let group = leader.map(|stat| ProcessGroupRecord {
        pgid: pgid.as_raw(),
        start_time: stat.start_time,
        session: stat.session,
        scope,
    });
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
    let mut stdin_pipe = None;
    let stdin = match (spec.stdin, child.stdin.take()) {
        (StdinMode::Pipe, pipe) => {
            stdin_pipe = pipe;
            None
        }
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
        child: CliChild {
            child,
            pgid,
            strays: leader.map(|stat| Strays { scope, since: stat.start_time }),
            cgroup: cgroup_dir,
            exit: None,
            _stop_stdin: stop.drop_guard(),
        },
        stdout: LineReader::new(stdout, max_line_bytes),
        stderr: StderrTail::new(stderr, STDERR_TAIL_BYTES),
        stdin,
        stdin_pipe,
        group,
    })
}

/// A long-lived helper process a channel runs beside the gateway (the XMTP
/// bridge): it speaks over its pipes for as long as it lives. `Debug` shows
/// the environment's names only (values may be secrets).
#[derive(Clone)]
pub struct HelperSpec {
    /// The program (a path; looked up by the caller).
    pub program: PathBuf,
    /// Its arguments, logged as they are: never a secret here.
    pub args: Vec<String>,
    /// Its working directory.
    pub cwd: PathBuf,
    /// Its complete environment (secrets go here, never in `args`).
    pub env: BTreeMap<String, String>,
}

impl fmt::Debug for HelperSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HelperSpec")
            .field("program", &self.program)
            .field("args", &self.args)
            .field("cwd", &self.cwd)
            .field("env_keys", &self.env.keys().collect::<Vec<_>>())
            .finish()
    }
}

/// A started helper: its pipes, and the child (in its own process group,
/// killed with its group when dropped before it is reaped).
#[derive(Debug)]
pub struct Helper {
    pub child: HelperChild,
    pub stdin: ChildStdin,
    pub stdout: ChildStdout,
    pub stderr: ChildStderr,
    /// The group as it is recorded for a later start to find, when `/proc` tells.
    pub group: Option<ProcessGroupRecord>,
}

/// A running helper.
#[derive(Debug)]
pub struct HelperChild {
    inner: CliChild,
}

impl HelperChild {
    /// The process group id (the leader's pid).
    pub fn pgid(&self) -> i32 {
        self.inner.pgid()
    }

    /// Waits for the helper to exit and reaps it: how it ended, as a phrase
    /// (`exit code 1`, `signal 9`).
    ///
    /// # Cancel safety
    /// Cancel safe: a cancelled wait can be repeated.
    pub async fn wait(&mut self) -> String {
        let exit = self.inner.wait().await;
        self.inner.signal_group(Signal::SIGKILL);
        describe_exit(exit)
    }

    /// SIGTERM to its group, up to `grace` to exit, then SIGKILL; reaped.
    pub async fn terminate(&mut self, grace: Duration) -> String {
        describe_exit(self.inner.terminate(grace).await)
    }
}

fn describe_exit(exit: Exit) -> String {
    match (exit.code, exit.signal) {
        (Some(code), _) => format!("exit code {code}"),
        (None, Some(signal)) => format!("signal {signal}"),
        (None, None) => "an unknown exit".to_owned(),
    }
}

/// Starts a helper in its own process group with its death tied to the
/// gateway's, like every child this module starts.
///
/// # Errors
/// Why it could not be started, naming the program.
///
/// # Cancel safety
/// Not cancel safe: a helper started for a cancelled call is killed when dropped.
pub async fn spawn_helper(spec: HelperSpec, tracker: &TaskTracker) -> Result<Helper, String> {
    let spec = ProcessSpec {
        program: spec.program,
        args: spec.args,
        cwd: spec.cwd,
        env: spec.env,
        stdin: StdinMode::Pipe,
        prompt_is_last_arg: false,
        landlock: None,
    };
    let program = spec.program.clone();
    let spawned = spawn(spec, 1, tracker).await.map_err(|error| error.to_string())?;
    let stdin = spawned
        .stdin_pipe
        .ok_or_else(|| format!("{} started without its stdin", program.display()))?;
    Ok(Helper {
        child: HelperChild { inner: spawned.child },
        stdin,
        stdout: spawned.stdout.into_inner().into_inner(),
        stderr: spawned.stderr.into_inner(),
        group: spawned.group,
    })
}

/// Between fork and exec, in the child: its parent-death signal is SIGKILL (it
/// dies with the gateway even when the gateway is killed with SIGKILL), it
/// joins its cgroup when it has one (`cgroup_procs`, the cgroup's open
/// `cgroup.procs`), it loses `CAP_SYS_PTRACE` for good, so that it cannot
/// read the non-dumpable gateway's memory or environment even as root, and
/// it enforces its Landlock ruleset when it has one (`landlock`, open in the
/// parent until the spawn returns), after `no_new_privs`.
// The workspace's only unsafe code: `pre_exec` is unsafe because the closure runs
// in the forked child, where only async-signal-safe calls are allowed.
#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
fn prepare_child(
    command: &mut Command,
    cgroup_procs: Option<std::os::fd::RawFd>,
    landlock: Option<std::os::fd::RawFd>,
) {
    let gateway = nix::unistd::getpid();
    // SAFETY: the closure runs in the child between fork and exec. It only makes the
    // system calls prctl(2), getppid(2), getpid(2), kill(2), write(2), capget(2),
    // capset(2) and landlock_restrict_self(2), through nix's thin wrappers or libc, all async-signal-safe;
    // it allocates nothing (an errno converts to an `io::Error` without
    // allocating), takes no lock and shares no state with the parent's threads.
    // The descriptors it uses are open in the parent until the spawn returns,
    // so they are open in the child; the buffers it hands the kernel are its own
    // stack values.
    unsafe {
        command.pre_exec(move || {
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
            // The gateway died between fork and prctl: no signal will come, so go now.
            if nix::unistd::getppid() != gateway {
                let _ = nix::sys::signal::kill(nix::unistd::getpid(), Signal::SIGKILL);
            }
            if let Some(fd) = cgroup_procs {
                // "0" moves the writer: this child, before anything of it runs.
                if libc::write(fd, b"0".as_ptr().cast(), 1) != 1 {
                    return Err(io::Error::last_os_error());
                }
            }
            drop_ptrace_capability()?;
            if let Some(ruleset) = landlock {
                if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
                    || libc::syscall(libc::SYS_landlock_restrict_self, ruleset, 0) != 0
                {
                    return Err(io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
}

/// `CAP_SYS_PTRACE` (linux/capability.h).
#[cfg(target_os = "linux")]
const CAP_SYS_PTRACE: u32 = 19;

/// `struct __user_cap_header_struct`.
#[cfg(target_os = "linux")]
#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

/// `struct __user_cap_data_struct`.
#[cfg(target_os = "linux")]
#[repr(C)]
#[derive(Clone, Copy)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// Takes `CAP_SYS_PTRACE` out of the bounding set (so no exec gives it back,
/// not even of a root or set-uid program), the ambient set, and the
/// inheritable, permitted and effective sets. Without `CAP_SETPCAP` (a
/// process not run as root) the bounding set stays, but such a process holds
/// no capability to begin with. Async-signal-safe: system calls on stack
/// values only (it runs in [`prepare_child`]'s `pre_exec`).
#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
fn drop_ptrace_capability() -> io::Result<()> {
    const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;
    // SAFETY: prctl, capget and capset with integer arguments and pointers to
    // this frame's own, correctly laid out structs (two data words for version 3).
    unsafe {
        // EPERM without CAP_SETPCAP, EINVAL on a kernel without the capability:
        // either way there is nothing to hand down.
        libc::prctl(libc::PR_CAPBSET_DROP, libc::c_ulong::from(CAP_SYS_PTRACE), 0, 0, 0);
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_LOWER as libc::c_ulong,
            libc::c_ulong::from(CAP_SYS_PTRACE),
            0,
            0,
        );
        let mut header = CapHeader { version: LINUX_CAPABILITY_VERSION_3, pid: 0 };
        let mut data = [CapData { effective: 0, permitted: 0, inheritable: 0 }; 2];
        if libc::syscall(libc::SYS_capget, &mut header as *mut CapHeader, data.as_mut_ptr()) != 0 {
            return Err(io::Error::last_os_error());
        }
        let bit = 1u32 << CAP_SYS_PTRACE;
        let held = data[0].effective | data[0].permitted | data[0].inheritable;
        if held & bit != 0 {
            data[0].effective &= !bit;
            data[0].permitted &= !bit;
            data[0].inheritable &= !bit;
            if libc::syscall(libc::SYS_capset, &mut header as *mut CapHeader, data.as_ptr()) != 0 {
                return Err(io::Error::last_os_error());
            }
        }
    }
    Ok(())
}

/// A command for the spawner thread, and where its child goes.
struct SpawnJob {
    command: Command,
    reply: oneshot::Sender<io::Result<Child>>,
}

/// What the spawner thread does.
enum SpawnerMsg {
    Spawn(SpawnJob),
    /// Remove a child's cgroup once its processes have exited.
    RemoveCgroup(PathBuf),
}

fn spawner() -> Result<&'static mpsc::Sender<SpawnerMsg>, SpawnError> {
    static SPAWNER: OnceLock<Result<mpsc::Sender<SpawnerMsg>, String>> = OnceLock::new();
    SPAWNER.get_or_init(start_spawner).as_ref().map_err(|err| SpawnError::Spawner(err.clone()))
}

/// Hands a dropped child's cgroup to the spawner thread, which removes it
/// once it is empty (from a `Drop`, so without waiting).
fn remove_cgroup_later(dir: PathBuf) {
    let sent = spawner()
        .is_ok_and(|spawner| spawner.try_send(SpawnerMsg::RemoveCgroup(dir.clone())).is_ok());
    if !sent {
        // Busy or gone: try once now; an empty cgroup left behind costs nothing.
        let _ = std::fs::remove_dir(&dir);
    }
}

/// Hands `command` to the spawner thread and waits for its child.
async fn spawn_on_spawner(command: Command) -> Result<io::Result<Child>, SpawnError> {
    let spawner = spawner()?;
    let (reply, rx) = oneshot::channel();
    spawner
        .send(SpawnerMsg::Spawn(SpawnJob { command, reply }))
        .await
        .map_err(|_| SpawnError::Spawner("it stopped".to_owned()))?;
    rx.await.map_err(|_| SpawnError::Spawner("it dropped the request".to_owned()))
}

/// Starts the thread that forks every child. It never ends: a child's death signal
/// fires when the thread that forked it exits, so this thread lives as long as the
/// process. Its own runtime (not the caller's, which may be shorter-lived) owns the
/// children's pipes and exit notifications.
fn start_spawner() -> Result<mpsc::Sender<SpawnerMsg>, String> {
    // No child may ever read this process's environment.
    hide_from_children()?;
    match tracking() {
        Tracking::Cgroup { .. } => {
            tracing::debug!(tracking = %tracking(), "child processes tracked")
        }
        Tracking::Scope { .. } => tracing::info!(tracking = %tracking(), "child processes tracked"),
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|err| format!("no runtime: {err}"))?;
    let (tx, mut rx) = mpsc::channel::<SpawnerMsg>(256);
    std::thread::Builder::new()
        .name("lemon-spawner".to_owned())
        .spawn(move || {
            runtime.block_on(async move {
                while let Some(msg) = rx.recv().await {
                    match msg {
                        SpawnerMsg::Spawn(mut job) => {
                            // A caller that went away drops the child, which kills it.
                            let _ = job.reply.send(job.command.spawn());
                        }
                        SpawnerMsg::RemoveCgroup(dir) => {
                            tokio::spawn(cgroup::remove_when_empty(dir));
                        }
                    }
                }
                // Every sender is gone only at process exit; keep the children's
                // parent thread (and the runtime driving their pipes) alive until then.
                std::future::pending::<()>().await;
            });
        })
        .map_err(|err| format!("no thread: {err}"))?;
    Ok(tx)
}

impl fmt::Debug for SpawnerMsg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SpawnerMsg::Spawn(job) => job.fmt(f),
            SpawnerMsg::RemoveCgroup(dir) => f.debug_tuple("RemoveCgroup").field(dir).finish(),
        }
    }
}

impl fmt::Debug for SpawnJob {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SpawnJob").finish_non_exhaustive()
    }
}

/// What `/proc/<pid>/stat` says about a process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ProcStat {
    pid: i32,
    /// Running or sleeping, not a zombie waiting to be reaped.
    alive: bool,
    pgrp: i32,
    session: i32,
    /// Clock ticks after boot (field 22).
    start_time: u64,
}

fn proc_stat(pid: i32) -> Option<ProcStat> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(pid, &text)
}

/// Parses `pid (comm) state ppid pgrp session … starttime …`; `comm` may hold
/// spaces and parentheses, so fields are counted after its last `)`.
fn parse_stat(pid: i32, text: &str) -> Option<ProcStat> {
    let (_, rest) = text.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // `fields[0]` is field 3 (state), so field n is `fields[n - 3]`.
    let state = *fields.first()?;
    Some(ProcStat {
        pid,
        alive: state != "Z" && state != "X",
        pgrp: fields.get(2)?.parse().ok()?,
        session: fields.get(3)?.parse().ok()?,
        start_time: fields.get(19)?.parse().ok()?,
    })
}

/// A child's scope and its leader's start time: whose descendants count as its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Strays {
    scope: u64,
    since: u64,
}

/// Whether the environment (`/proc/<pid>/environ`: `NAME=value` entries, each
/// ended by a NUL) holds `SCOPE_ENV=scope`.
fn environ_has_scope(environ: &[u8], scope: u64) -> bool {
    let wanted = format!("{SCOPE_ENV}={scope}");
    environ.split(|byte| *byte == 0).any(|entry| entry == wanted.as_bytes())
}

/// SIGKILLs every live process started no earlier than `strays.since` whose
/// environment holds the scope, wherever it is (another group, another session);
/// how many. Processes of other users, whose environment cannot be read, are
/// never ours.
fn kill_strays(strays: Strays) -> usize {
    let Ok(entries) = std::fs::read_dir("/proc") else { return 0 };
    let own = std::process::id();
    let mut killed = 0;
    for pid in entries.filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<i32>().ok()) {
        if u32::try_from(pid).is_ok_and(|pid| pid == own) {
            continue;
        }
        let Some(stat) = proc_stat(pid) else { continue };
        if !stat.alive || stat.start_time < strays.since {
            continue;
        }
        let Ok(environ) = std::fs::read(format!("/proc/{pid}/environ")) else { continue };
        if environ_has_scope(&environ, strays.scope) {
            match nix::sys::signal::kill(Pid::from_raw(pid), Signal::SIGKILL) {
                Ok(()) => killed += 1,
                Err(Errno::ESRCH) => {}
                Err(err) => {
                    tracing::warn!(pid, error = %err, "could not kill a process that left its cli's group")
                }
            }
        }
    }
    killed
}

/// How long a killed group may take to die before its run completes anyway.
const GONE_PATIENCE: Duration = Duration::from_secs(2);

/// How many processes of group `pgid` are alive (not zombies).
fn live_in_group(pgid: i32) -> usize {
    let Ok(entries) = std::fs::read_dir("/proc") else { return 0 };
    entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(proc_stat)
        .filter(|stat| stat.alive && stat.pgrp == pgid)
        .count()
}

/// Live processes that can belong to the recorded group: in it, in its session,
/// and started no earlier than its leader.
fn leftover_members(group: &ProcessGroupRecord) -> Vec<ProcStat> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(proc_stat)
        .filter(|stat| {
            stat.alive
                && stat.pgrp == group.pgid
                && stat.session == group.session
                && stat.start_time >= group.start_time
        })
        .collect()
}

/// What became of a process group a previous gateway recorded and never reaped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Leftover {
    /// It was still running and was killed (SIGKILL to the group).
    Killed {
        /// Live processes it had.
        processes: usize,
    },
    /// Nothing of it runs any more.
    Gone,
    /// Its leader's pid belongs to a process started later: left alone.
    Reused,
}

/// Kills what is left of a recorded process group, and only that. The group is
/// taken to be the recorded one if its leader still has the recorded start time;
/// if the leader is gone, if live processes are still in the group (a group id
/// cannot be handed out again while any member lives), in the recorded session
/// and started no earlier than the leader. A leader pid now held by a process
/// with another start time means the group is gone and the id reused: nothing is
/// signalled.
pub fn kill_leftover_group(group: &ProcessGroupRecord) -> Leftover {
    // The child's cgroup is named by its scope, no other process's: whatever
    // is in it was started by that child, even if its pid is used again.
    let in_cgroup = match cgroup_base().filter(|_| group.scope != 0) {
        Some(base) => {
            let dir = cgroup::dir_of(base, group.scope);
            let killed = cgroup::kill(&dir);
            remove_cgroup_later(dir);
            killed
        }
        None => 0,
    };
    let leftover = kill_leftover_group_by_pid(group);
    match leftover {
        _ if in_cgroup == 0 => leftover,
        Leftover::Killed { processes } => Leftover::Killed { processes: processes.max(in_cgroup) },
        Leftover::Gone | Leftover::Reused => Leftover::Killed { processes: in_cgroup },
    }
}

/// [`kill_leftover_group`] by the recorded pids and the scope.
fn kill_leftover_group_by_pid(group: &ProcessGroupRecord) -> Leftover {
    let leader = proc_stat(group.pgid);
    if leader.is_some_and(|stat| stat.start_time != group.start_time) {
        return Leftover::Reused;
    }
    let members = leftover_members(group);
    let leader_alive = leader.is_some_and(|stat| stat.alive);
    // Descendants that left the group, found by the scope in their environment.
    let strays = if group.scope == 0 {
        0
    } else {
        kill_strays(Strays { scope: group.scope, since: group.start_time })
    };
    if members.is_empty() && !leader_alive {
        return if strays == 0 { Leftover::Gone } else { Leftover::Killed { processes: strays } };
    }
    let pgid = Pid::from_raw(group.pgid);
    match killpg(pgid, Signal::SIGKILL) {
        Ok(()) | Err(Errno::ESRCH) => {}
        Err(err) => {
            tracing::warn!(pgid = group.pgid, error = %err, "could not kill a leftover process group");
        }
    }
    // A leader that moved to another group is still the recorded process.
    if let Some(stat) = leader.filter(|stat| stat.alive && stat.pgrp != group.pgid) {
        let _ = nix::sys::signal::kill(Pid::from_raw(stat.pid), Signal::SIGKILL);
    }
    // The members and leader also hold the scope: the scan killed them before
    // the group signal if it saw them first.
    let processes = (members.len()
        + usize::from(leader.is_some_and(|s| s.alive && s.pgrp != group.pgid)))
    .max(strays);
    Leftover::Killed { processes }
}

/// Told when a process group starts and when it has been reaped, so that a
/// record of the groups in flight survives a gateway that is killed.
#[async_trait]
pub trait ProcessRecorder: Send + Sync + fmt::Debug + 'static {
    /// A group started; return once it is recorded durably.
    async fn started(&self, group: ProcessGroupRecord);
    /// The group's leader was reaped and the group killed.
    async fn reaped(&self, pgid: i32);
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
    /// Whose descendants outside the group are killed with it; `None` when
    /// `/proc` could not tell the leader's start time.
    strays: Option<Strays>,
    /// The child's own cgroup, when it has one: everything it started, even
    /// what left the group and replaced its environment. Killed with the group;
    /// removed when the child is dropped.
    cgroup: Option<PathBuf>,
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

    /// SIGKILLs the group and every descendant that left it.
    pub(crate) fn kill_all(&self) {
        self.signal_group(Signal::SIGKILL);
        if let Some(dir) = &self.cgroup {
            let killed = cgroup::kill(dir);
            if killed > 0 {
                tracing::debug!(pgid = self.pgid.as_raw(), killed, "killed the cli's cgroup");
            }
        }
        if let Some(strays) = self.strays {
            let killed = kill_strays(strays);
            if killed > 0 {
                tracing::debug!(
                    pgid = self.pgid.as_raw(),
                    killed,
                    "killed processes that left the cli's group"
                );
            }
        }
    }

    /// SIGKILLs the group and reaps the leader.
    pub(crate) async fn kill(&mut self) -> Exit {
        self.signal_group(Signal::SIGKILL);
        let exit = self.wait().await;
        // Members that outlived the leader (it may have exited just before the
        // signal), and descendants that left the group.
        self.kill_all();
        self.until_gone().await;
        exit
    }

    /// Waits until no process of the group or the cgroup is alive: a killed
    /// member whose parent is not the gateway dies a moment after the signal,
    /// and its run must not complete before. Gives up after
    /// [`GONE_PATIENCE`] (a process stuck in the kernel), saying so.
    pub(crate) async fn until_gone(&self) {
        let pgid = self.pgid.as_raw();
        let left = || {
            let in_group = live_in_group(pgid);
            let in_cgroup = self.cgroup.as_deref().map_or(0, cgroup::live_members);
            in_group + in_cgroup
        };
        let deadline = tokio::time::Instant::now() + GONE_PATIENCE;
        loop {
            let count = left();
            if count == 0 {
                return;
            }
            if tokio::time::Instant::now() >= deadline {
                tracing::warn!(
                    pgid,
                    processes = count,
                    "killed processes of a cli are still alive"
                );
                return;
            }
            // No notification exists for another parent's child dying.
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// SIGTERM to the group, up to `grace` for the leader to exit, then SIGKILL;
    /// the leader is reaped and any member left is killed.
    pub(crate) async fn terminate(&mut self, grace: Duration) -> Exit {
        if let Some(exit) = self.exit {
            self.kill_all();
            self.until_gone().await;
            return exit;
        }
        self.signal_group(Signal::SIGTERM);
        match tokio::time::timeout(grace, self.wait()).await {
            Ok(exit) => {
                // Members that ignored SIGTERM must not outlive the run.
                self.kill_all();
                self.until_gone().await;
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
            self.kill_all();
        }
        // The cgroup is this child's alone whatever became of its pid: nothing
        // in it outlives the child's handle.
        if let Some(dir) = self.cgroup.take() {
            cgroup::kill(&dir);
            remove_cgroup_later(dir);
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

    /// The stream itself, for a caller that reads bytes rather than lines;
    /// nothing read so far is lost (it is in the returned buffer).
    pub(crate) fn into_inner(self) -> BufReader<R> {
        self.inner
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

    /// The stream itself, for a caller that keeps its own bytes.
    pub(crate) fn into_inner(self) -> R {
        self.inner
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
