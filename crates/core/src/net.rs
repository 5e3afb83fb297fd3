//! Classifying network addresses: which ones a request from the gateway to a
//! URL it was given (a webhook callback, the `fetch` tool) must not reach
//! unless its owner allowed private hosts.

use std::net::IpAddr;

/// Loopback, private, link-local, shared, unspecified, broadcast and multicast
/// addresses; an IPv4-mapped IPv6 address is judged as its IPv4 address.
pub fn is_private(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
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
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return is_private(IpAddr::V4(v4));
            }
            let first = v6.segments()[0];
            v6.is_unspecified()
                || v6.is_loopback()
                || (first & 0xfe00) == 0xfc00
                || (first & 0xffc0) == 0xfe80
                || (first & 0xff00) == 0xff00
        }
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

#[cfg(test)]
mod tests {
    use super::*;

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
