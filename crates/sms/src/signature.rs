//! Twilio request signatures (`X-Twilio-Signature`).
//!
//! Twilio signs every webhook it sends with HMAC-SHA1, keyed by the account's
//! auth token, over the URL it called followed by every form parameter sorted
//! by name (`name` then `value`, no separators; the values of a repeated name
//! sorted too). A JSON webhook instead carries `bodySHA256=<hex>` in the URL's
//! query: the signature then covers the URL alone and the hash must match the
//! raw body.
//!
//! The URL must be the one Twilio called, so callers build it from the
//! configured public URL plus the request's path and raw query, never from the
//! `Host` header. Twilio's own helpers accept a signature computed with or
//! without the default port (`:443` / `:80`); so does [`validate_form`].

use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha1::Sha1;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

type HmacSha1 = Hmac<Sha1>;

/// The header Twilio puts the signature in.
pub const SIGNATURE_HEADER: &str = "X-Twilio-Signature";

/// The base64 signature Twilio would send for `url` and form `params`.
pub fn sign_form(auth_token: &str, url: &str, params: &[(String, String)]) -> String {
    let mut sorted: Vec<(&str, &str)> =
        params.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    sorted.sort_unstable();
    let mut mac = new_mac(auth_token);
    mac.update(url.as_bytes());
    for (name, value) in sorted {
        mac.update(name.as_bytes());
        mac.update(value.as_bytes());
    }
    base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes())
}

/// Whether `signature` is Twilio's for `url` and form `params`, with the URL
/// taken as given and with its default port added or removed.
pub fn validate_form(
    auth_token: &str,
    url: &str,
    params: &[(String, String)],
    signature: &str,
) -> bool {
    if auth_token.is_empty() || signature.is_empty() {
        return false;
    }
    url_variants(url)
        .iter()
        .any(|candidate| same(&sign_form(auth_token, candidate, params), signature))
}

/// Whether `signature` is Twilio's for a JSON webhook: `url` must carry
/// `bodySHA256` in its query, the signature covers the URL alone (with or
/// without its default port) and the hash matches the raw `body`.
pub fn validate_body(auth_token: &str, url: &str, body: &[u8], signature: &str) -> bool {
    let Some(expected_hash) = query_param(url, "bodySHA256") else {
        return false;
    };
    if !same(&body_sha256(body), &expected_hash.to_ascii_lowercase()) {
        return false;
    }
    validate_form(auth_token, url, &[], signature)
}

/// The lowercase hex SHA-256 of a raw body, as Twilio puts it in `bodySHA256`.
pub fn body_sha256(body: &[u8]) -> String {
    let digest = Sha256::digest(body);
    let mut hex = String::with_capacity(64);
    for byte in digest {
        hex.push(char::from(HEX[usize::from(byte >> 4)]));
        hex.push(char::from(HEX[usize::from(byte & 0x0f)]));
    }
    hex
}

const HEX: &[u8; 16] = b"0123456789abcdef";

fn new_mac(auth_token: &str) -> HmacSha1 {
    #[allow(clippy::expect_used)]
    HmacSha1::new_from_slice(auth_token.as_bytes()).expect("HMAC takes keys of every length")
}

fn same(a: &str, b: &str) -> bool {
    a.len() == b.len() && bool::from(a.as_bytes().ct_eq(b.as_bytes()))
}

/// `url` as given, and with its scheme's default port added or removed.
fn url_variants(url: &str) -> Vec<String> {
    let mut variants = vec![url.to_owned()];
    let Some((scheme, rest)) = url.split_once("://") else {
        return variants;
    };
    let default_port = match scheme.to_ascii_lowercase().as_str() {
        "https" => "443",
        "http" => "80",
        _ => return variants,
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    // Userinfo is kept as Twilio received it; the port follows the host.
    let (userinfo, hostport) = match authority.rsplit_once('@') {
        Some((user, host)) => (format!("{user}@"), host),
        None => (String::new(), authority),
    };
    let host_end = if hostport.starts_with('[') {
        hostport.find(']').map_or(hostport.len(), |i| i + 1)
    } else {
        hostport.find(':').unwrap_or(hostport.len())
    };
    let (host, port) = hostport.split_at(host_end);
    match port.strip_prefix(':') {
        Some(p) if p == default_port => variants.push(format!("{scheme}://{userinfo}{host}{tail}")),
        Some(_) => {}
        None => variants.push(format!("{scheme}://{userinfo}{host}:{default_port}{tail}")),
    }
    variants
}

fn query_param(url: &str, name: &str) -> Option<String> {
    let query = url.split_once('?')?.1;
    let query = query.split('#').next().unwrap_or(query);
    query.split('&').find_map(|pair| {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        (key == name).then(|| value.to_owned())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: &str = "12345";
    const URL: &str = "https://mycompany.com/myapp.php?foo=1&bar=2";

    fn params(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    fn call_params() -> Vec<(String, String)> {
        params(&[
            ("CallSid", "CA1234567890ABCDE"),
            ("Digits", "1234"),
            ("From", "+14158675309"),
            ("To", "+18005551212"),
            ("Caller", "+14158675309"),
        ])
    }

    #[test]
    fn the_security_docs_vector() {
        let p = params(&[
            ("CallSid", "CA1234567890ABCDE"),
            ("Caller", "+12349013030"),
            ("Digits", "1234"),
            ("From", "+12349013030"),
            ("To", "+18005551212"),
        ]);
        assert_eq!(sign_form(TOKEN, URL, &p), "0/KCTR6DLpKmkAf8muzZqo1nDgQ=");
        assert!(validate_form(TOKEN, URL, &p, "0/KCTR6DLpKmkAf8muzZqo1nDgQ="));
    }

    #[test]
    fn the_request_validator_vectors() {
        let p = call_params();
        assert_eq!(sign_form(TOKEN, URL, &p), "RSOYDt4T1cUTdK1PDd93/VVr8B8=");
        assert_eq!(
            sign_form(TOKEN, "https://mycompany.com:443/myapp.php?foo=1&bar=2", &p),
            "kvajT1Ptam85bY51eRf/AJRuM3w="
        );
        assert_eq!(
            sign_form(TOKEN, "http://mycompany.com:80/myapp.php?foo=1&bar=2", &p),
            "0ZXoZLH/DfblKGATFgpif+LLRf4="
        );
    }

    #[test]
    fn a_signature_over_the_url_with_or_without_its_default_port_is_accepted() {
        let p = call_params();
        // Signed without the port, configured with it, and the other way round.
        assert!(validate_form(
            TOKEN,
            "https://mycompany.com:443/myapp.php?foo=1&bar=2",
            &p,
            "RSOYDt4T1cUTdK1PDd93/VVr8B8="
        ));
        assert!(validate_form(TOKEN, URL, &p, "kvajT1Ptam85bY51eRf/AJRuM3w="));
        assert!(validate_form(
            TOKEN,
            "http://mycompany.com/myapp.php?foo=1&bar=2",
            &p,
            "0ZXoZLH/DfblKGATFgpif+LLRf4="
        ));
        // Another port is another URL.
        assert!(!validate_form(
            TOKEN,
            "https://mycompany.com:8443/myapp.php?foo=1&bar=2",
            &p,
            "RSOYDt4T1cUTdK1PDd93/VVr8B8="
        ));
    }

    #[test]
    fn repeated_names_are_sorted_by_value() {
        let p = params(&[
            ("Sid", "CA123"),
            ("SidAccount", "AC123"),
            ("Digits", "5678"),
            ("Digits", "1234"),
        ]);
        assert_eq!(sign_form(TOKEN, URL, &p), "IK+Dwps556ElfBT0I3Rgjkr1wJU=");
        let reordered = params(&[
            ("Digits", "1234"),
            ("SidAccount", "AC123"),
            ("Sid", "CA123"),
            ("Digits", "5678"),
        ]);
        assert!(validate_form(TOKEN, URL, &reordered, "IK+Dwps556ElfBT0I3Rgjkr1wJU="));
    }

    #[test]
    fn a_changed_param_a_changed_url_a_wrong_token_or_no_signature_is_refused() {
        let p = call_params();
        let good = "RSOYDt4T1cUTdK1PDd93/VVr8B8=";
        let mut changed = p.clone();
        changed[1].1 = "9999".to_owned();
        assert!(!validate_form(TOKEN, URL, &changed, good));
        let mut added = p.clone();
        added.push(("Extra".to_owned(), String::new()));
        assert!(!validate_form(TOKEN, URL, &added, good));
        assert!(!validate_form(TOKEN, "https://mycompany.com/myapp.php?foo=1&bar=3", &p, good));
        assert!(!validate_form("54321", URL, &p, good));
        assert!(!validate_form(TOKEN, URL, &p, ""));
        assert!(!validate_form("", URL, &p, good));
        assert!(!validate_form(TOKEN, URL, &p, "RSOYDt4T1cUTdK1PDd93/VVr8B8"));
    }

    #[test]
    fn the_json_body_variant() {
        let body = br#"{"property": "value", "boolean": true}"#;
        let hash = "0a1ff7634d9ab3b95db5c9a2dfe9416e41502b283a80c7cf19632632f96e6620";
        assert_eq!(body_sha256(body), hash);
        let url = format!("{URL}&bodySHA256={hash}");
        assert!(validate_body(TOKEN, &url, body, "a9nBmqA0ju/hNViExpshrM61xv4="));
        // The same signature with another body, or without the hash in the URL.
        assert!(!validate_body(
            TOKEN,
            &url,
            br#"{"property": "value", "boolean": false}"#,
            "a9nBmqA0ju/hNViExpshrM61xv4="
        ));
        assert!(!validate_body(TOKEN, URL, body, "a9nBmqA0ju/hNViExpshrM61xv4="));
    }

    #[test]
    fn url_variants_keep_the_path_query_and_ipv6_hosts() {
        assert_eq!(
            url_variants("https://[::1]/x?y=1"),
            vec!["https://[::1]/x?y=1".to_owned(), "https://[::1]:443/x?y=1".to_owned()]
        );
        assert_eq!(
            url_variants("http://h:80?q"),
            vec!["http://h:80?q".to_owned(), "http://h?q".to_owned()]
        );
        assert_eq!(url_variants("https://h:8443/"), vec!["https://h:8443/".to_owned()]);
        assert_eq!(url_variants("not a url"), vec!["not a url".to_owned()]);
    }
}
