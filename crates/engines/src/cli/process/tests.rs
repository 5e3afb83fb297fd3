//! Tests of the bounded readers and of spawning and terminating real processes.

use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::ReadBuf;

use super::*;

/// Hands out its bytes a few at a time, as a pipe under load does.
struct Chunked {
    data: Vec<u8>,
    pos: usize,
    step: usize,
}

impl AsyncRead for Chunked {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let end = (self.pos + self.step).min(self.data.len()).min(self.pos + buf.remaining());
        buf.put_slice(&self.data[self.pos..end]);
        self.pos = end;
        Poll::Ready(Ok(()))
    }
}

async fn lines(data: &[u8], max: usize, step: usize) -> Vec<StdoutLine> {
    let mut reader = LineReader::new(Chunked { data: data.to_vec(), pos: 0, step }, max);
    let mut out = Vec::new();
    while let Some(line) = reader.next_line().await.unwrap() {
        out.push(line);
    }
    out
}

fn line(text: &str) -> StdoutLine {
    StdoutLine::Line(text.to_owned())
}

#[tokio::test]
async fn lines_are_split_whatever_the_chunking() {
    for step in [1, 3, 7, 1024] {
        assert_eq!(
            lines(b"{\"a\":1}\n\n{\"b\":2}\r\nlast", 64, step).await,
            [line("{\"a\":1}"), line(""), line("{\"b\":2}\r"), line("last")],
            "step {step}"
        );
    }
}

#[tokio::test]
async fn a_line_over_the_limit_is_skipped_and_reading_goes_on() {
    let mut data = b"short\n".to_vec();
    data.extend(std::iter::repeat_n(b'x', 100));
    data.extend(b"\nafter\n");
    data.extend(std::iter::repeat_n(b'y', 11));
    for step in [1, 5, 4096] {
        assert_eq!(
            lines(&data, 10, step).await,
            [
                line("short"),
                StdoutLine::Oversized { bytes: 100 },
                line("after"),
                StdoutLine::Oversized { bytes: 11 }
            ],
            "step {step}"
        );
    }
    // Exactly the limit is fine.
    assert_eq!(lines(b"0123456789\n", 10, 3).await, [line("0123456789")]);
}

#[tokio::test]
async fn invalid_utf8_is_replaced_not_fatal() {
    assert_eq!(lines(b"ok \xff\xfe\n", 64, 2).await, [line("ok \u{FFFD}\u{FFFD}")]);
}

#[tokio::test]
async fn the_stderr_tail_keeps_the_last_bytes() {
    let mut data = "é".repeat(10).into_bytes();
    data.extend(b"the end");
    let mut tail = StderrTail::new(Chunked { data, pos: 0, step: 4 }, 10);
    while tail.read_more().await {}
    let (text, truncated) = tail.text();
    assert!(truncated);
    assert!(text.ends_with("the end") && text.len() <= 10, "{text:?}");
    assert!(!text.contains('\u{FFFD}'), "a cut character is dropped: {text:?}");

    let mut short = StderrTail::new(Chunked { data: b"oops".to_vec(), pos: 0, step: 4 }, 10);
    while short.read_more().await {}
    assert_eq!(short.text(), ("oops".to_owned(), false));
}

fn spec(script: &str, cwd: PathBuf, env: &[(&str, &str)]) -> ProcessSpec {
    ProcessSpec {
        program: PathBuf::from("/bin/sh"),
        args: vec!["-c".to_owned(), script.to_owned()],
        cwd,
        env: env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect(),
        stdin: StdinMode::Write(b"from stdin\n".to_vec()),
        prompt_is_last_arg: false,
        landlock: None,
    }
}

#[tokio::test]
async fn a_child_gets_exactly_its_environment_its_cwd_and_its_stdin() {
    let dir = tempfile::tempdir().unwrap();
    let tracker = TaskTracker::new();
    let script = "read line; echo \"$line\"; pwd; env | sort";
    let mut spawned = spawn(
        spec(script, dir.path().to_path_buf(), &[("ONLY_THIS", "yes"), ("PATH", "/usr/bin:/bin")]),
        1024,
        &tracker,
    )
    .await
    .unwrap();
    let mut out = Vec::new();
    while let Some(StdoutLine::Line(line)) = spawned.stdout.next_line().await.unwrap() {
        out.push(line);
    }
    assert_eq!(spawned.child.wait().await, Exit { code: Some(0), signal: None });
    let cwd = dir.path().canonicalize().unwrap();
    assert_eq!(out[..2], ["from stdin".to_owned(), cwd.to_string_lossy().into_owned()]);
    let env: Vec<&str> = out[2..]
        .iter()
        .map(String::as_str)
        .filter(|l| !["PWD=", "OLDPWD=", "SHLVL=", "_="].iter().any(|p| l.starts_with(p)))
        .collect();
    // Its environment, and the scope its descendants carry wherever they go.
    let scope = format!("{SCOPE_ENV}={}", spawned.group.unwrap().scope);
    assert_eq!(env, [scope.as_str(), "ONLY_THIS=yes", "PATH=/usr/bin:/bin"]);
}

#[tokio::test]
async fn a_missing_cwd_or_program_is_a_spawn_error() {
    let tracker = TaskTracker::new();
    let missing = std::env::temp_dir().join("lemon-no-such-dir-for-spawn");
    assert!(matches!(
        spawn(spec("true", missing, &[]), 64, &tracker).await,
        Err(SpawnError::Cwd(_))
    ));
    let mut bad = spec("true", std::env::temp_dir(), &[]);
    bad.program = PathBuf::from("/nonexistent/lemon-cli");
    assert!(matches!(spawn(bad, 64, &tracker).await, Err(SpawnError::Spawn { .. })));
}

#[tokio::test]
async fn terminate_stops_the_whole_group() {
    let tracker = TaskTracker::new();
    // The shell starts a background sleeper in its group, then waits.
    let mut spawned = spawn(
        spec("sleep 1000 & echo started; wait", std::env::temp_dir(), &[("PATH", "/usr/bin:/bin")]),
        64,
        &tracker,
    )
    .await
    .unwrap();
    assert_eq!(spawned.stdout.next_line().await.unwrap(), Some(line("started")));
    let exit = spawned.child.terminate(Duration::from_secs(5)).await;
    assert_eq!(exit.signal, Some(15));
    // Every member got the signal: the pipe the sleeper held is closed, so it has exited.
    // (An orphaned member may linger as a zombie until init reaps it, so the group id
    // itself can still answer for a moment.)
    assert_eq!(spawned.stdout.next_line().await.unwrap(), None);
}

#[test]
fn stat_fields_are_counted_after_the_command_name() {
    // A command name may hold spaces and parentheses.
    let text =
        "4242 (evil) (name) S 1 4242 4100 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10";
    let stat = parse_stat(4242, text).unwrap();
    assert_eq!(
        stat,
        ProcStat { pid: 4242, alive: true, pgrp: 4242, session: 4100, start_time: 987_654 }
    );
    let zombie = text.replace(") S ", ") Z ");
    assert!(!parse_stat(4242, &zombie).unwrap().alive);
    assert_eq!(parse_stat(1, "1 (short) S 0"), None);
}

async fn sleeper(tracker: &TaskTracker) -> Spawned {
    let spec = ProcessSpec {
        program: PathBuf::from("/bin/sleep"),
        args: vec!["1000".to_owned()],
        cwd: std::env::temp_dir(),
        env: BTreeMap::new(),
        stdin: StdinMode::Null,
        prompt_is_last_arg: false,
        landlock: None,
    };
    spawn(spec, 64, tracker).await.unwrap()
}

#[tokio::test]
async fn a_spawned_group_is_described_by_its_leaders_start_time_and_session() {
    let tracker = TaskTracker::new();
    let mut spawned = sleeper(&tracker).await;
    let group = spawned.group.expect("the leader's /proc entry is readable");
    let pgid = spawned.child.pgid();
    assert_eq!(group.pgid, pgid);
    let stat = proc_stat(pgid).unwrap();
    assert_eq!((stat.pgrp, stat.start_time, stat.session), (pgid, group.start_time, group.session));
    assert_eq!(spawned.child.kill().await.signal, Some(9));
}

#[tokio::test]
async fn a_leftover_group_is_killed_only_while_its_leader_is_the_recorded_process() {
    let tracker = TaskTracker::new();
    let mut ours = sleeper(&tracker).await;
    let mut reused = sleeper(&tracker).await;
    let ours_group = ours.group.unwrap();
    // A record of an earlier process that had the pid the second sleeper has now.
    let mut stale = reused.group.unwrap();
    stale.start_time -= 1;
    // That process had a scope (and a cgroup) of its own, long gone.
    stale.scope = u64::MAX;

    assert_eq!(kill_leftover_group(&stale), Leftover::Reused);
    assert!(
        proc_stat(stale.pgid).is_some_and(|stat| stat.alive),
        "a reused pid is never signalled"
    );
    assert_eq!(kill_leftover_group(&ours_group), Leftover::Killed { processes: 1 });
    assert_eq!(ours.child.wait().await.signal, Some(9));
    // Reaped: nothing of it is left to kill, and a later record of it finds nothing.
    assert_eq!(kill_leftover_group(&ours_group), Leftover::Gone);
    assert_eq!(reused.child.kill().await.signal, Some(9));
}

#[tokio::test]
async fn a_helper_speaks_over_its_pipes_in_its_own_group_and_is_terminated() {
    let tracker = TaskTracker::new();
    let spec = HelperSpec {
        program: PathBuf::from("/bin/sh"),
        args: vec![
            "-c".into(),
            "echo \"$HELPER_SECRET\" >&2; while read line; do echo \"got $line\"; done".into(),
        ],
        cwd: std::env::temp_dir(),
        env: BTreeMap::from([
            ("PATH".to_owned(), "/usr/bin:/bin".to_owned()),
            ("HELPER_SECRET".to_owned(), "s3cret-value".to_owned()),
        ]),
    };
    let shown = format!("{spec:?}");
    assert!(shown.contains("HELPER_SECRET") && !shown.contains("s3cret-value"), "{shown}");
    let mut helper = spawn_helper(spec, &tracker).await.unwrap();
    assert_eq!(proc_stat(helper.child.pgid()).map(|s| s.pgrp), Some(helper.child.pgid()));
    helper.stdin.write_all(b"ping\n").await.unwrap();
    let mut stdout = BufReader::new(&mut helper.stdout);
    let mut line = String::new();
    tokio::time::timeout(Duration::from_secs(10), stdout.read_line(&mut line))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(line, "got ping\n");
    let mut err = String::new();
    tokio::time::timeout(
        Duration::from_secs(10),
        BufReader::new(&mut helper.stderr).read_line(&mut err),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(err, "s3cret-value\n", "the environment reached it");
    let exit = helper.child.terminate(Duration::from_secs(5)).await;
    assert_eq!(exit, "signal 15");
}

#[test]
fn the_scope_is_found_only_as_a_whole_entry_of_the_environment() {
    let environ = format!("PATH=/bin\0{SCOPE_ENV}=42\0HOME=/h\0").into_bytes();
    assert!(environ_has_scope(&environ, 42));
    assert!(!environ_has_scope(&environ, 4));
    assert!(!environ_has_scope(&format!("{SCOPE_ENV}=420\0").into_bytes(), 42));
    assert!(!environ_has_scope(&format!("X{SCOPE_ENV}=42\0").into_bytes(), 42));
    assert!(!environ_has_scope(b"", 42));
}

/// A shell that starts a `setsid` sleeper (out of the group and session), prints
/// its pid and exits; the sleeper's stdout is not the pipe.
async fn leaves_a_setsid_sleeper(tracker: &TaskTracker) -> (Spawned, i32) {
    leaves_a_sleeper(tracker, "setsid sleep 1000").await
}

/// A shell that runs `sleeper &` with its output away from the pipe, prints
/// its pid and exits.
async fn leaves_a_sleeper(tracker: &TaskTracker, sleeper: &str) -> (Spawned, i32) {
    let spec = ProcessSpec {
        program: PathBuf::from("/bin/sh"),
        args: vec!["-c".to_owned(), format!("{sleeper} </dev/null >/dev/null 2>&1 & echo $!")],
        cwd: std::env::temp_dir(),
        env: BTreeMap::from([("PATH".to_owned(), "/usr/bin:/bin".to_owned())]),
        stdin: StdinMode::Null,
        prompt_is_last_arg: false,
        landlock: None,
    };
    let mut spawned = spawn(spec, 64, tracker).await.unwrap();
    let Some(StdoutLine::Line(pid)) = spawned.stdout.next_line().await.unwrap() else {
        panic!("the shell prints the sleeper's pid")
    };
    (spawned, pid.trim().parse().unwrap())
}

/// `setsid` leaves the group, so a group signal misses it; it may not have
/// called it yet when the shell's `echo` runs.
async fn until_out_of_group(pid: i32, pgid: i32) -> ProcStat {
    eventually("the sleeper leaves the group", || {
        proc_stat(pid).filter(|stat| stat.alive && stat.pgrp != pgid)
    })
    .await
}

/// Polls `probe` until it gives a value, bounded: the kernel acts on `setsid`
/// and on signals in its own time.
async fn eventually<T>(what: &str, mut probe: impl FnMut() -> Option<T>) -> T {
    lemon_core::testing::within(what, async {
        loop {
            if let Some(value) = probe() {
                return value;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
}

fn gone(pid: i32) -> Option<()> {
    proc_stat(pid).is_none_or(|stat| !stat.alive).then_some(())
}

#[tokio::test]
async fn a_descendant_that_left_the_group_is_killed_with_it() {
    let tracker = TaskTracker::new();
    let (mut spawned, sleeper) = leaves_a_setsid_sleeper(&tracker).await;
    let pgid = spawned.child.pgid();
    let stat = until_out_of_group(sleeper, pgid).await;
    assert_ne!(stat.session, spawned.group.unwrap().session, "setsid made a session of its own");
    spawned.child.wait().await;
    spawned.child.kill_all();
    eventually("the sleeper is killed", || gone(sleeper)).await;
}

#[tokio::test]
async fn a_leftover_group_takes_its_descendants_outside_the_group_along() {
    let tracker = TaskTracker::new();
    let (mut spawned, sleeper) = leaves_a_setsid_sleeper(&tracker).await;
    let group = spawned.group.unwrap();
    until_out_of_group(sleeper, group.pgid).await;
    // The leader is gone and reaped, as after a gateway killed with SIGKILL.
    spawned.child.wait().await;
    assert_eq!(kill_leftover_group(&group), Leftover::Killed { processes: 1 });
    eventually("the sleeper is killed", || gone(sleeper)).await;
    // A record without a scope (written by an older gateway) finds nothing.
    assert_eq!(kill_leftover_group(&ProcessGroupRecord { scope: 0, ..group }), Leftover::Gone);
}

/// A shell that starts a sleeper in a session of its own with an empty
/// environment (no scope either), prints its pid and exits.
async fn leaves_an_env_less_sleeper(tracker: &TaskTracker) -> (Spawned, i32) {
    let (spawned, pid) = leaves_a_sleeper(tracker, "setsid env -i sleep 1000").await;
    until_out_of_group(pid, spawned.child.pgid()).await;
    eventually("the sleeper's environment is empty", || {
        std::fs::read(format!("/proc/{pid}/environ")).ok().filter(Vec::is_empty)
    })
    .await;
    (spawned, pid)
}

/// What a cgroup can do here: this host (root, with cgroup2 mounted) must offer it.
fn assert_cgroup_tracking() {
    assert!(
        matches!(tracking(), Tracking::Cgroup { .. }),
        "children are not tracked by cgroup here: {}",
        tracking()
    );
}

#[tokio::test]
async fn a_descendant_that_left_its_session_and_environment_is_killed_with_its_cgroup() {
    assert_cgroup_tracking();
    let tracker = TaskTracker::new();
    let (mut spawned, sleeper) = leaves_an_env_less_sleeper(&tracker).await;
    spawned.child.wait().await;
    spawned.child.kill_all();
    eventually("the sleeper is killed", || gone(sleeper)).await;
}

#[tokio::test]
async fn a_leftover_group_takes_its_cgroup_along() {
    assert_cgroup_tracking();
    let tracker = TaskTracker::new();
    let (mut spawned, sleeper) = leaves_an_env_less_sleeper(&tracker).await;
    let group = spawned.group.unwrap();
    // The leader is gone and reaped, as after a gateway killed with SIGKILL;
    // the sleeper's pid and environment lead nowhere, its cgroup does.
    spawned.child.wait().await;
    assert_eq!(kill_leftover_group(&group), Leftover::Killed { processes: 1 });
    eventually("the sleeper is killed", || gone(sleeper)).await;
}

/// `CapInh`, `CapPrm`, `CapEff`, `CapBnd` and `CapAmb` of a child, as the
/// child sees them in `/proc/self/status`.
async fn child_capabilities(tracker: &TaskTracker) -> Vec<(String, u64)> {
    let spec = ProcessSpec {
        program: PathBuf::from("/bin/sh"),
        args: vec!["-c".to_owned(), "grep ^Cap /proc/self/status".to_owned()],
        cwd: std::env::temp_dir(),
        env: BTreeMap::from([("PATH".to_owned(), "/usr/bin:/bin".to_owned())]),
        stdin: StdinMode::Null,
        prompt_is_last_arg: false,
        landlock: None,
    };
    let mut spawned = spawn(spec, 1024, tracker).await.unwrap();
    let mut sets = Vec::new();
    while let Some(StdoutLine::Line(line)) = spawned.stdout.next_line().await.unwrap() {
        let (name, hex) = line.split_once(':').unwrap();
        sets.push((name.to_owned(), u64::from_str_radix(hex.trim(), 16).unwrap()));
    }
    spawned.child.wait().await;
    sets
}

/// Whether this process runs as root (its effective uid, from `/proc/self/status`).
fn running_as_root() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let uids = status.lines().find_map(|line| line.strip_prefix("Uid:")).unwrap();
    uids.split_whitespace().nth(1) == Some("0")
}

#[tokio::test]
async fn no_child_holds_cap_sys_ptrace_and_the_gateway_is_not_dumpable() {
    let tracker = TaskTracker::new();
    let sets = child_capabilities(&tracker).await;
    assert_eq!(sets.len(), 5, "{sets:?}");
    let ptrace = 1u64 << 19;
    for (name, set) in &sets {
        // Without root the bounding set cannot be lowered, and holds nothing that counts.
        if name == "CapBnd" && !running_as_root() {
            continue;
        }
        assert_eq!(set & ptrace, 0, "{name} of a child holds CAP_SYS_PTRACE: {set:x}");
    }
    if running_as_root() {
        // Root keeps its other capabilities.
        let effective = sets.iter().find(|(name, _)| name == "CapEff").unwrap().1;
        assert_ne!(effective, 0, "{sets:?}");
    }
    assert!(!nix::sys::prctl::get_dumpable().unwrap(), "the spawning process is not dumpable");
}
