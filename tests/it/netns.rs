//! A network namespace of a process's own, joined to the host by a veth pair,
//! whose link can be set down and up: a network partition of that process
//! from everything else on the machine (the database, the other nodes, the
//! test), made with `ip` as root.

use std::net::Ipv4Addr;
use std::path::PathBuf;

/// A namespace `lemon-p<pid>` and the veth pair `lp<pid>h` (host side) /
/// `lp<pid>n` (inside), with the /30 `10.231.<k>.0`: the host is `.1`, the
/// namespace `.2`. Removed on drop (the pair goes with the namespace).
pub(crate) struct Netns {
    name: String,
    host_link: String,
    ip: PathBuf,
    pub(crate) host_addr: Ipv4Addr,
    pub(crate) inside_addr: Ipv4Addr,
}

/// The `ip` binary; a test that needs one fails loudly without it.
fn ip_binary() -> PathBuf {
    ["/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"]
        .iter()
        .map(PathBuf::from)
        .find(|path| path.exists())
        .expect("a network partition needs `ip` (apt-get install iproute2)")
}

fn run(ip: &PathBuf, args: &[&str]) {
    let output = std::process::Command::new(ip).args(args).output().unwrap();
    assert!(
        output.status.success(),
        "ip {}: {} (a network partition needs root, or CAP_NET_ADMIN and CAP_SYS_ADMIN)",
        args.join(" "),
        String::from_utf8_lossy(&output.stderr).trim()
    );
}

impl Netns {
    /// Makes the namespace and its link, up.
    pub(crate) fn create() -> Netns {
        let ip = ip_binary();
        let pid = std::process::id();
        let k = u8::try_from(pid % 250).unwrap() + 1;
        let netns = Netns {
            name: format!("lemon-p{pid}"),
            host_link: format!("lp{pid}h"),
            ip,
            host_addr: Ipv4Addr::new(10, 231, k, 1),
            inside_addr: Ipv4Addr::new(10, 231, k, 2),
        };
        let inside_link = format!("lp{pid}n");
        // A namespace left by an earlier run of this process id goes first.
        let _ = std::process::Command::new(&netns.ip).args(["netns", "del", &netns.name]).output();
        run(&netns.ip, &["netns", "add", &netns.name]);
        run(
            &netns.ip,
            &["link", "add", &netns.host_link, "type", "veth", "peer", "name", &inside_link],
        );
        run(&netns.ip, &["link", "set", &inside_link, "netns", &netns.name]);
        let host_cidr = format!("{}/30", netns.host_addr);
        run(&netns.ip, &["addr", "add", &host_cidr, "dev", &netns.host_link]);
        run(&netns.ip, &["link", "set", &netns.host_link, "up"]);
        let inside_cidr = format!("{}/30", netns.inside_addr);
        netns.inside(&["addr", "add", &inside_cidr, "dev", &inside_link]);
        netns.inside(&["link", "set", &inside_link, "up"]);
        netns.inside(&["link", "set", "lo", "up"]);
        netns
    }

    fn inside(&self, args: &[&str]) {
        let mut all = vec!["-n", self.name.as_str()];
        all.extend_from_slice(args);
        run(&self.ip, &all);
    }

    /// The namespace's network, for a server's list of allowed clients.
    pub(crate) fn cidr(&self) -> String {
        let [a, b, c, _] = self.host_addr.octets();
        format!("{a}.{b}.{c}.0/30")
    }

    /// The words that run a program inside the namespace: `ip netns exec`
    /// execs it, so the process keeps the pid it was started with.
    pub(crate) fn exec_prefix(&self) -> Vec<std::ffi::OsString> {
        vec![self.ip.clone().into(), "netns".into(), "exec".into(), self.name.clone().into()]
    }

    /// The partition: the link goes down, and with it the carrier inside.
    pub(crate) fn cut(&self) {
        run(&self.ip, &["link", "set", &self.host_link, "down"]);
    }

    /// The partition heals.
    pub(crate) fn heal(&self) {
        run(&self.ip, &["link", "set", &self.host_link, "up"]);
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = std::process::Command::new(&self.ip).args(["netns", "del", &self.name]).output();
    }
}
