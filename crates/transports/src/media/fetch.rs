//! A capped download of a file a message points to.
//!
//! Each hop (the URL, then every redirect, at most [`MAX_REDIRECTS`]) is
//! resolved once, every address is checked against private and loopback
//! ranges unless the fetcher allows them, and the connection is pinned to the
//! checked address, so a second DNS answer cannot send it elsewhere. No proxy
//! is used. Credentials go only to the first URL's origin: a redirect to a
//! CDN (Twilio's media URLs answer with one) gets none, and a redirect from
//! `https` to `http` is not followed.
//!
//! A `Content-Length` over the limit is refused before the body is read; a
//! body that goes over it is dropped at the chunk that does, so no more than
//! the limit (and that chunk) is ever held.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use lemon_core::media::{size_text, MediaRefusal};
use lemon_core::net::{is_localhost_name, is_private};
use lemon_core::secrets::SecretValue;

use crate::webhook::{Resolve, SystemResolver};

/// How long one download may take, redirects and body included.
pub const DEFAULT_FETCH_TIMEOUT: Duration = Duration::from_secs(120);
/// The most redirects followed.
pub const MAX_REDIRECTS: usize = 5;

/// HTTP Basic credentials (Twilio's media: the account SID and auth token).
#[derive(Clone)]
pub struct BasicAuth {
    pub user: String,
    pub password: SecretValue,
}

impl std::fmt::Debug for BasicAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BasicAuth").field("user", &self.user).finish_non_exhaustive()
    }
}

/// A fetched file.
#[derive(Clone)]
pub struct Downloaded {
    pub bytes: Vec<u8>,
    /// The `Content-Type` it was served with (without parameters).
    pub content_type: Option<String>,
}

impl std::fmt::Debug for Downloaded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Downloaded")
            .field("bytes", &self.bytes.len())
            .field("content_type", &self.content_type)
            .finish()
    }
}

/// Fetches files for a channel. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Fetcher {
    resolver: Arc<dyn Resolve>,
    allow_private: bool,
    timeout: Duration,
}

/// A checked hop: where to connect.
struct Hop {
    url: reqwest::Url,
    /// The host name to pin, when the URL names one rather than an address.
    domain: Option<String>,
    addr: SocketAddr,
}

impl Fetcher {
    /// A fetcher with the system resolver; `allow_private` lets it reach
    /// private and loopback addresses (a channel whose own API is on this
    /// machine).
    pub fn new(allow_private: bool) -> Self {
        Fetcher {
            resolver: Arc::new(SystemResolver),
            allow_private,
            timeout: DEFAULT_FETCH_TIMEOUT,
        }
    }

    /// The same, resolving names with `resolver`.
    pub fn with_resolver(mut self, resolver: Arc<dyn Resolve>) -> Self {
        self.resolver = resolver;
        self
    }

    /// The same, with another limit on one download's time.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Whether private and loopback addresses are reached.
    pub fn allows_private(&self) -> bool {
        self.allow_private
    }

    /// Fetches `url` (`name` is the file's, for the refusal's text), at most
    /// `max_bytes` of it, with `auth` sent to the URL's own origin only.
    ///
    /// # Errors
    /// [`MediaRefusal::TooLarge`] when the file is over `max_bytes` (by its
    /// `Content-Length`, or once that many bytes came), else
    /// [`MediaRefusal::Fetch`] saying why: a URL that is not http(s), a
    /// private address, a host that does not resolve or answer, an error
    /// status, too many redirects, the time limit.
    pub async fn fetch(
        &self,
        url: &str,
        name: &str,
        max_bytes: u64,
        auth: Option<&BasicAuth>,
    ) -> Result<Downloaded, MediaRefusal> {
        let refuse = |why: String| MediaRefusal::Fetch(why);
        let mut current = reqwest::Url::parse(url.trim())
            .map_err(|_| refuse("its address is not a URL".to_owned()))?;
        let origin = current.origin();
        let work = async {
            for _ in 0..=MAX_REDIRECTS {
                let hop = self.check(&current).await?;
                let host = hop.domain.clone().unwrap_or_else(|| hop.addr.ip().to_string());
                let mut builder = reqwest::Client::builder()
                    .redirect(reqwest::redirect::Policy::none())
                    .no_proxy()
                    .connect_timeout(Duration::from_secs(10).min(self.timeout));
                if let Some(domain) = &hop.domain {
                    builder = builder.resolve(domain, hop.addr);
                }
                let client =
                    builder.build().map_err(|err| refuse(format!("no HTTP client: {err}")))?;
                let mut request = client.get(hop.url.clone());
                if let Some(auth) = auth.filter(|_| current.origin() == origin) {
                    request = request.basic_auth(&auth.user, Some(auth.password.expose()));
                }
                let response = request.send().await.map_err(|err| refuse(failure(&host, &err)))?;
                let status = response.status();
                if status.is_redirection() {
                    let location = response
                        .headers()
                        .get(reqwest::header::LOCATION)
                        .and_then(|v| v.to_str().ok())
                        .ok_or_else(|| refuse(format!("{host} redirected nowhere ({status})")))?;
                    let next = current
                        .join(location)
                        .map_err(|_| refuse(format!("{host} redirected to something not a URL")))?;
                    if current.scheme() == "https" && next.scheme() != "https" {
                        return Err(refuse(format!("{host} redirected from https to http")));
                    }
                    current = next;
                    continue;
                }
                if !status.is_success() {
                    return Err(refuse(format!("{host} answered {status}")));
                }
                return read_capped(response, &host, name, max_bytes).await;
            }
            Err(refuse(format!("more than {MAX_REDIRECTS} redirects")))
        };
        match tokio::time::timeout(self.timeout, work).await {
            Ok(result) => result,
            Err(_) => Err(refuse(format!("it took longer than {} s", self.timeout.as_secs()))),
        }
    }

    /// Resolves `url`'s host and refuses private addresses unless allowed.
    async fn check(&self, url: &reqwest::Url) -> Result<Hop, MediaRefusal> {
        let refuse = |why: String| Err(MediaRefusal::Fetch(why));
        if !matches!(url.scheme(), "http" | "https") {
            return refuse("its address is not http or https".to_owned());
        }
        if !url.username().is_empty() || url.password().is_some() {
            return refuse("its address carries credentials".to_owned());
        }
        let Some(port) = url.port_or_known_default() else {
            return refuse("its address has no port".to_owned());
        };
        let host = url.host_str().unwrap_or_default();
        let literal = host.trim_start_matches('[').trim_end_matches(']').parse::<IpAddr>().ok();
        let mut url = url.clone();
        let (domain, addrs) = match literal {
            Some(ip) => (None, vec![SocketAddr::new(ip, port)]),
            None => {
                let name = host.trim().trim_end_matches('.').to_ascii_lowercase();
                if name.is_empty() {
                    return refuse("its address has no host".to_owned());
                }
                if !self.allow_private && is_localhost_name(&name) {
                    return refuse(format!(
                        "{name} is this machine, which files are not fetched from"
                    ));
                }
                let Ok(addrs) = self.resolver.resolve(&name, port).await else {
                    return refuse(format!("{name} could not be resolved"));
                };
                if url.set_host(Some(&name)).is_err() {
                    return refuse(format!("{name} is not a host name"));
                }
                (Some(name), addrs)
            }
        };
        let shown = domain.clone().unwrap_or_else(|| host.to_owned());
        let Some(first) = addrs.first().copied() else {
            return refuse(format!("{shown} has no address"));
        };
        if !self.allow_private && addrs.iter().any(|addr| is_private(addr.ip())) {
            return refuse(format!(
                "{shown} is a private or loopback address, which files are not fetched from"
            ));
        }
        Ok(Hop { url, domain, addr: first })
    }
}

/// Why a request got no answer, naming the host only (never the URL).
fn failure(host: &str, err: &reqwest::Error) -> String {
    if err.is_timeout() {
        format!("{host} did not answer in time")
    } else if err.is_connect() {
        format!("{host} could not be reached")
    } else {
        format!("{host}: {}", err_text(err))
    }
}

/// The error without its URL, and without the chain's URL-bearing parts.
fn err_text(err: &reqwest::Error) -> String {
    let mut text = String::new();
    let mut source: Option<&dyn std::error::Error> = Some(err);
    while let Some(e) = source {
        let part = e.to_string();
        if !part.contains("://") && !text.contains(&part) {
            if !text.is_empty() {
                text.push_str(": ");
            }
            text.push_str(&part);
        }
        source = e.source();
    }
    if text.is_empty() {
        "the request failed".to_owned()
    } else {
        text
    }
}

/// Reads the body, refusing it by its `Content-Length` first and stopping
/// at the chunk that goes past `max_bytes`.
async fn read_capped(
    mut response: reqwest::Response,
    host: &str,
    name: &str,
    max_bytes: u64,
) -> Result<Downloaded, MediaRefusal> {
    let too_large =
        |bytes: u64| MediaRefusal::TooLarge { name: name.to_owned(), bytes, max: max_bytes };
    if let Some(length) = response.content_length().filter(|length| *length > max_bytes) {
        return Err(too_large(length));
    }
    let content_type = response
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .map(|v| v.trim().to_ascii_lowercase())
        .filter(|v| !v.is_empty());
    let mut bytes = Vec::with_capacity(
        usize::try_from(response.content_length().unwrap_or(0).min(max_bytes)).unwrap_or(0),
    );
    loop {
        let chunk = response.chunk().await.map_err(|err| {
            MediaRefusal::Fetch(if err.is_timeout() {
                format!("{host} stopped sending {name} in time")
            } else {
                format!("{host} stopped sending {name} after {}", size_text(bytes.len() as u64))
            })
        })?;
        let Some(chunk) = chunk else { break };
        let total = bytes.len() as u64 + chunk.len() as u64;
        if total > max_bytes {
            return Err(too_large(total));
        }
        bytes.extend_from_slice(&chunk);
    }
    Ok(Downloaded { bytes, content_type })
}
