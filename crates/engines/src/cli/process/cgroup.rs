//! A cgroup (v2) of its own for every child: what a child and its descendants
//! cannot leave, whatever they do to their process group, session or
//! environment (only a process allowed to write the cgroup files could move
//! itself out, and a run's processes are not, unless they run as root).
//!
//! The cgroups are `<the gateway's own cgroup>/lemon-runs/<scope>`, named by
//! the child's scope, so a later start finds a killed gateway's leftovers from
//! the scope in its process-group record. The child joins its cgroup itself,
//! between fork and exec, by writing `0` to an inherited `cgroup.procs`
//! descriptor; nothing of it runs outside. Killing is `cgroup.kill` (Linux
//! 5.14), else SIGKILL to every pid `cgroup.procs` lists, a few rounds.
//!
//! This module only touches directories under `lemon-runs` that it created or
//! that are named by a recorded scope.

use std::fs;
use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use nix::sys::signal::Signal;
use nix::unistd::Pid;

/// The folder under the gateway's own cgroup that holds the runs' cgroups.
const RUNS_DIR: &str = "lemon-runs";

/// Finds a cgroup v2 hierarchy and the gateway's place in it, makes
/// `lemon-runs` there and checks that a cgroup can be made in it and joined;
/// the folder, or why there is none (a phrase).
pub(super) fn detect() -> Result<PathBuf, String> {
    let mountinfo = fs::read_to_string("/proc/self/mountinfo")
        .map_err(|err| format!("/proc/self/mountinfo unreadable: {err}"))?;
    let mount = cgroup2_mount(&mountinfo).ok_or("no cgroup v2 hierarchy is mounted")?;
    let own = fs::read_to_string("/proc/self/cgroup")
        .map_err(|err| format!("/proc/self/cgroup unreadable: {err}"))?;
    let own = own_cgroup(&own).ok_or("this process is in no cgroup v2 group")?;
    let own = mount.join(own.trim_start_matches('/'));
    // Moving a process needs write access to the `cgroup.procs` of the common
    // ancestor of where it is and where it goes: this process's own cgroup.
    fs::OpenOptions::new()
        .write(true)
        .open(own.join("cgroup.procs"))
        .map_err(|err| format!("cannot move processes out of {}: {err}", own.display()))?;
    let base = own.join(RUNS_DIR);
    match fs::create_dir(&base) {
        Ok(()) => {}
        Err(err) if err.kind() == io::ErrorKind::AlreadyExists => {}
        Err(err) => return Err(format!("cannot create {}: {err}", base.display())),
    }
    // A cgroup of the kind every child gets, which it could join: made, its
    // `cgroup.procs` opened for writing, removed.
    let probe = base.join(format!("probe-{}", std::process::id()));
    let opened = fs::create_dir(&probe)
        .and_then(|()| fs::OpenOptions::new().write(true).open(probe.join("cgroup.procs")));
    let _ = fs::remove_dir(&probe);
    opened.map_err(|err| format!("cannot create a cgroup in {}: {err}", base.display()))?;
    Ok(base)
}

/// Where the cgroup v2 hierarchy is mounted (`/sys/fs/cgroup`, or
/// `/sys/fs/cgroup/unified` beside v1 controllers), from `/proc/self/mountinfo`:
/// `id parent major:minor root mountpoint options… - fstype source options`.
fn cgroup2_mount(mountinfo: &str) -> Option<PathBuf> {
    mountinfo.lines().find_map(|line| {
        let (before, after) = line.split_once(" - ")?;
        if after.split_whitespace().next()? != "cgroup2" {
            return None;
        }
        let mut fields = before.split_whitespace();
        let root = fields.nth(3)?;
        // A bind mount of a sub-tree does not show the whole hierarchy.
        if root != "/" {
            return None;
        }
        Some(PathBuf::from(unescape_octal(fields.next()?)))
    })
}

/// `mountinfo` writes space, tab, newline and backslash as `\ooo`.
fn unescape_octal(text: &str) -> String {
    let mut out = Vec::with_capacity(text.len());
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 4 <= bytes.len() {
            let digits = &bytes[i + 1..i + 4];
            let value = digits
                .iter()
                .all(|b| (b'0'..=b'7').contains(b))
                .then(|| digits.iter().fold(0u32, |acc, b| acc * 8 + u32::from(b - b'0')));
            if let Some(value) = value.and_then(|v| u8::try_from(v).ok()) {
                out.push(value);
                i += 4;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The cgroup v2 path of this process: the `0::<path>` line of `/proc/self/cgroup`.
fn own_cgroup(text: &str) -> Option<&str> {
    text.lines().find_map(|line| line.strip_prefix("0::")).filter(|path| path.starts_with('/'))
}

/// The cgroup of the child with `scope`.
pub(super) fn dir_of(base: &Path, scope: u64) -> PathBuf {
    base.join(scope.to_string())
}

/// A child's cgroup, made before it is forked.
#[derive(Debug)]
pub(super) struct RunCgroup {
    pub(super) dir: PathBuf,
    /// `cgroup.procs`, open for writing: the child writes `0` to it to join.
    pub(super) procs: OwnedFd,
}

/// Makes the cgroup of the child with `scope`.
///
/// # Errors
/// The folder cannot be made or its `cgroup.procs` opened.
pub(super) fn create(base: &Path, scope: u64) -> io::Result<RunCgroup> {
    let dir = dir_of(base, scope);
    fs::create_dir(&dir)?;
    match fs::OpenOptions::new().write(true).open(dir.join("cgroup.procs")) {
        Ok(file) => Ok(RunCgroup { dir, procs: file.into() }),
        Err(err) => {
            let _ = fs::remove_dir(&dir);
            Err(err)
        }
    }
}

/// The pids in a cgroup (none when it is gone).
fn members(dir: &Path) -> Vec<i32> {
    fs::read_to_string(dir.join("cgroup.procs"))
        .map(|text| text.lines().filter_map(|line| line.trim().parse().ok()).collect())
        .unwrap_or_default()
}

/// How many processes of the cgroup `dir` are alive.
pub(super) fn live_members(dir: &Path) -> usize {
    members(dir).into_iter().filter(|pid| alive(*pid)).count()
}

/// SIGKILLs every process in the cgroup `dir`; how many there were. A cgroup
/// that is gone is fine.
pub(super) fn kill(dir: &Path) -> usize {
    let found = members(dir);
    if found.is_empty() {
        return 0;
    }
    // `cgroup.kill` kills atomically, forks in flight included.
    if fs::write(dir.join("cgroup.kill"), "1").is_ok() {
        return found.len();
    }
    // Older kernels: signal what is listed until nothing is; a process forked
    // meanwhile is listed in the next round.
    let mut pids = found.clone();
    for _ in 0..16 {
        if pids.is_empty() {
            break;
        }
        for pid in &pids {
            let _ = nix::sys::signal::kill(Pid::from_raw(*pid), Signal::SIGKILL);
        }
        pids = members(dir).into_iter().filter(|pid| alive(*pid)).collect();
    }
    found.len()
}

/// Not a zombie: a killed process stays listed until it is reaped.
fn alive(pid: i32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X")
    })
}

/// Removes the cgroup `dir` once its processes are gone, trying again for a
/// while: a killed process leaves its cgroup only when it has exited.
pub(super) async fn remove_when_empty(dir: PathBuf) {
    for _ in 0..400 {
        match fs::remove_dir(&dir) {
            Ok(()) => return,
            Err(err) if err.kind() == io::ErrorKind::NotFound => return,
            Err(_) => tokio::time::sleep(std::time::Duration::from_millis(25)).await,
        }
    }
    tracing::debug!(cgroup = %dir.display(), "a run's cgroup is still busy; left in place");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cgroup2_mount_is_found_beside_v1_controllers() {
        let mountinfo = "\
25 30 0:22 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755
26 25 0:23 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec - cgroup2 cgroup2 rw,nsdelegate
27 25 0:24 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
";
        assert_eq!(cgroup2_mount(mountinfo), Some(PathBuf::from("/sys/fs/cgroup/unified")));
        let only_v2 = "30 1 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw\n";
        assert_eq!(cgroup2_mount(only_v2), Some(PathBuf::from("/sys/fs/cgroup")));
        let sub_tree = "30 1 0:26 /user.slice /mnt/cg rw - cgroup2 cgroup2 rw\n";
        assert_eq!(cgroup2_mount(sub_tree), None);
        let spaced = "30 1 0:26 / /mnt/my\\040cgroups rw - cgroup2 cgroup2 rw\n";
        assert_eq!(cgroup2_mount(spaced), Some(PathBuf::from("/mnt/my cgroups")));
        assert_eq!(cgroup2_mount("25 30 0:22 / /sys/fs/cgroup ro - tmpfs tmpfs ro\n"), None);
    }

    #[test]
    fn the_own_cgroup_is_the_v2_line() {
        let text = "9:name=systemd:/\n4:memory:/a/b\n0::/system.slice/lemon.service\n";
        assert_eq!(own_cgroup(text), Some("/system.slice/lemon.service"));
        assert_eq!(own_cgroup("0::/\n"), Some("/"));
        assert_eq!(own_cgroup("4:memory:/a\n"), None);
    }
}
