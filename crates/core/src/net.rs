//! Classifying network addresses: which ones a request from the gateway to a
//! URL it was given (a webhook callback, the `fetch` tool) must not reach
//! unless its owner allowed private hosts; networks written as CIDR blocks
//! (the listeners' exempt clients).

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Loopback, private, link-local, shared, unspecified, broadcast and multicast
/// addresses. An IPv6 address that carries an IPv4 address a router or the
/// kernel may deliver to (IPv4-mapped `::ffff:a.b.c.d`, IPv4-compatible
/// `::a.b.c.d`, IPv4-translated `::ffff:0:a.b.c.d`, NAT64 `64:ff9b::/96`, 6to4
/// `2002::/16`, Teredo `2001::/32`) is judged by the IPv4 address it carries;
/// the local-use NAT64 block `64:ff9b:1::/48` and site-local `fec0::/10` are
/// private whatever they carry.
pub fn is_private(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_private_v4(v4),
        IpAddr::V6(v6) => {
            if embedded_v4(v6).is_some_and(|v4s| v4s.iter().any(|v4| is_private_v4(*v4))) {
                return true;
            }
            let segments = v6.segments();
            let first = segments[0];
            v6.is_unspecified()
                || v6.is_loopback()
                || (first & 0xfe00) == 0xfc00
                || (first & 0xffc0) == 0xfe80
                || (first & 0xffc0) == 0xfec0
                || (first & 0xff00) == 0xff00
                || (segments[..3] == [0x64, 0xff9b, 1])
        }
    }
}

fn is_private_v4(v4: Ipv4Addr) -> bool {
    let [a, b, ..] = v4.octets();
    a == 0
        || a == 10
        || a == 127
        || (a == 169 && b == 254)
        || (a == 172 && (16..32).contains(&b))
        || (a == 192 && b == 168)
        || (a == 100 && (64..128).contains(&b))
        || a >= 224
}

/// The IPv4 addresses an IPv6 address carries by one of the standard
/// embeddings, if it has one (Teredo carries two: its server and, inverted,
/// the client's public address).
fn embedded_v4(v6: Ipv6Addr) -> Option<Vec<Ipv4Addr>> {
    let v4 = |high: u16, low: u16| Ipv4Addr::from((u32::from(high) << 16) | u32::from(low));
    let s = v6.segments();
    // The last 32 bits, for the embeddings that put the address there.
    let low = v4(s[6], s[7]);
    match s {
        // IPv4-compatible (::a.b.c.d, deprecated but still parsed and, with a
        // `sit` tunnel, routed), IPv4-mapped and IPv4-translated.
        [0, 0, 0, 0, 0, 0, _, _]
        | [0, 0, 0, 0, 0, 0xffff, _, _]
        | [0, 0, 0, 0, 0xffff, 0, _, _] => Some(vec![low]),
        // NAT64, the well-known prefix (RFC 6052).
        [0x64, 0xff9b, 0, 0, 0, 0, _, _] => Some(vec![low]),
        // 6to4 (RFC 3056): 2002:AABB:CCDD::/48.
        [0x2002, high, low16, ..] => Some(vec![v4(high, low16)]),
        // Teredo (RFC 4380): 2001:0:SERVER:flags:port:CLIENT with the client inverted.
        [0x2001, 0, server_high, server_low, ..] => {
            Some(vec![v4(server_high, server_low), v4(!s[6], !s[7])])
        }
        _ => None,
    }
}

/// Host names that mean this machine whatever DNS says. `host` is expected
/// canonical: trimmed, lowercase, without a trailing dot.
pub fn is_localhost_name(host: &str) -> bool {
    matches!(
        host,
        "localhost" | "localhost.localdomain" | "localhost6" | "ip6-localhost" | "ip6-loopback"
    ) || host.ends_with(".localhost")
}

/// An address with an IPv4-mapped IPv6 address (`::ffff:a.b.c.d`) taken as
/// the IPv4 address it carries, so one client has one form.
pub fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        IpAddr::V4(_) => ip,
    }
}

/// A block of addresses in CIDR notation: `10.0.0.0/8`, `::1/128`, or a bare
/// address (a block of one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Network {
    /// The first address of the block (host bits cleared).
    base: IpAddr,
    prefix: u8,
}

impl Network {
    /// Parses `address[/prefix]`.
    ///
    /// # Errors
    /// A message saying what is wrong: not an address, or a prefix longer than
    /// the address (32 for IPv4, 128 for IPv6).
    pub fn parse(text: &str) -> Result<Network, String> {
        let text = text.trim();
        let (address, prefix) = match text.split_once('/') {
            Some((address, prefix)) => (address, Some(prefix)),
            None => (text, None),
        };
        let ip: IpAddr = address.parse().map_err(|_| {
            format!("{text:?} is not an IP address or a CIDR block like 10.0.0.0/8")
        })?;
        let ip = canonical(ip);
        let bits = if ip.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => bits,
            Some(digits) => match digits.parse::<u8>() {
                Ok(n) if n <= bits => n,
                _ => return Err(format!("{text:?}: the prefix must be a number from 0 to {bits}")),
            },
        };
        Ok(Network { base: mask(ip, prefix), prefix })
    }

    /// Whether `ip` (an IPv4-mapped address as its IPv4 address) is in the block.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        ip.is_ipv4() == self.base.is_ipv4() && mask(ip, self.prefix) == self.base
    }
}

impl fmt::Display for Network {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.base, self.prefix)
    }
}

/// `ip` with every bit after the first `prefix` cleared.
pub fn mask(ip: IpAddr, prefix: u8) -> IpAddr {
    match ip {
        IpAddr::V4(v4) => {
            let keep = u32::MAX.checked_shl(32 - u32::from(prefix.min(32))).unwrap_or(0);
            IpAddr::V4((u32::from(v4) & keep).into())
        }
        IpAddr::V6(v6) => {
            let keep = u128::MAX.checked_shl(128 - u32::from(prefix.min(128))).unwrap_or(0);
            IpAddr::V6((u128::from(v6) & keep).into())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn networks_parse_and_contain_their_addresses() {
        let loopback = Network::parse("127.0.0.0/8").unwrap();
        assert!(loopback.contains("127.1.2.3".parse().unwrap()));
        assert!(loopback.contains("::ffff:127.0.0.9".parse().unwrap()));
        assert!(!loopback.contains("128.0.0.1".parse().unwrap()));
        assert!(!loopback.contains("::1".parse().unwrap()));
        assert_eq!(Network::parse("10.1.2.3/16").unwrap().to_string(), "10.1.0.0/16");
        let one = Network::parse(" ::1 ").unwrap();
        assert_eq!(one.to_string(), "::1/128");
        assert!(one.contains("::1".parse().unwrap()));
        assert!(!one.contains("::2".parse().unwrap()));
        let all = Network::parse("0.0.0.0/0").unwrap();
        assert!(all.contains("203.0.113.7".parse().unwrap()));
        let v6 = Network::parse("2001:db8::/32").unwrap();
        assert!(v6.contains("2001:db8:ffff::1".parse().unwrap()));
        assert!(!v6.contains("2001:db9::1".parse().unwrap()));
    }

    #[test]
    fn bad_networks_say_what_is_wrong() {
        for (text, message) in [
            ("localhost", "is not an IP address"),
            ("10.0.0.0/33", "from 0 to 32"),
            ("::/129", "from 0 to 128"),
            ("10.0.0.0/x", "from 0 to 32"),
            ("", "is not an IP address"),
        ] {
            let error = Network::parse(text).unwrap_err();
            assert!(error.contains(message), "{text:?}: {error}");
        }
    }

    #[test]
    fn private_addresses_are_recognised() {
        for ip in [
            "10.1.2.3",
            "127.0.0.1",
            "169.254.1.1",
            "172.20.0.1",
            "192.168.1.1",
            "100.64.0.1",
            "0.0.0.0",
            "::1",
            "::",
            "fd00::1",
            "fe80::1",
            "::ffff:127.0.0.1",
        ] {
            assert!(is_private(ip.parse().unwrap()), "{ip}");
        }
        for ip in ["93.184.216.34", "172.32.0.1", "2606:4700::1111"] {
            assert!(!is_private(ip.parse().unwrap()), "{ip}");
        }
    }

    /// Every IPv6 form that carries an IPv4 address is judged by that address.
    #[test]
    fn ipv6_addresses_carrying_ipv4_are_judged_by_the_ipv4_address() {
        for ip in [
            // IPv4-compatible.
            "::127.0.0.1",
            "::10.0.0.1",
            "::192.168.1.1",
            "::169.254.169.254",
            // IPv4-mapped and IPv4-translated.
            "::ffff:10.0.0.1",
            "::ffff:0:127.0.0.1",
            // NAT64, well-known prefix; and the local-use prefix, whatever it carries.
            "64:ff9b::127.0.0.1",
            "64:ff9b::10.1.2.3",
            "64:ff9b:1::5db8:d822",
            // 6to4 of 127.0.0.1, 10.0.0.1 and 192.168.0.1.
            "2002:7f00:1::",
            "2002:a00:1::1",
            "2002:c0a8:1:ffff::1",
            // Teredo with a loopback server, and with client 127.0.0.1 (inverted).
            "2001:0:7f00:1::1",
            "2001:0:5db8:d822:0:0:80ff:fffe",
            // Site-local.
            "fec0::1",
        ] {
            assert!(is_private(ip.parse().unwrap()), "{ip}");
        }
        for ip in [
            "::93.184.216.34",
            "::ffff:93.184.216.34",
            "64:ff9b::93.184.216.34",
            "2002:5db8:d822::1",
            "2001:0:5db8:d822:0:0:a247:27dd",
            "2001:db8::1",
        ] {
            assert!(!is_private(ip.parse().unwrap()), "{ip}");
        }
    }

    #[test]
    fn localhost_names_are_recognised() {
        for name in ["localhost", "ip6-loopback", "api.localhost"] {
            assert!(is_localhost_name(name), "{name}");
        }
        for name in ["example.com", "localhost.example.com", "mylocalhost"] {
            assert!(!is_localhost_name(name), "{name}");
        }
    }
}
