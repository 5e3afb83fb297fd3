//! Callback delivery: the run's result POSTed to a URL, with retries, never to a
//! private or loopback address unless allowed.
//!
//! The host is resolved once per attempt, every address is checked, and the
//! connection is pinned to the checked address, so a second DNS answer cannot
//! point it elsewhere. Redirects are not followed and no proxy is used.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use crate::delivery::Backoff;
use futures::future::BoxFuture;
use lemon_core::bus::BusEvent;
use lemon_core::ids::RunId;
use serde_json::{json, Value};

/// Resolves a host name to addresses; injectable so tests need no DNS.
pub trait Resolve: Send + Sync + fmt::Debug {
    fn resolve<'a>(
        &'a self,
        host: &'a str,
        port: u16,
    ) -> BoxFuture<'a, std::io::Result<Vec<SocketAddr>>>;
}

/// The system resolver.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemResolver;

impl Resolve for SystemResolver {
    fn resolve<'a>(
        &'a self,
        host: &'a str,
        port: u16,
    ) -> BoxFuture<'a, std::io::Result<Vec<SocketAddr>>> {
        Box::pin(async move { Ok(tokio::net::lookup_host((host, port)).await?.collect()) })
    }
}

/// Retry and safety settings of one integration's callbacks.
#[derive(Debug, Clone)]
pub struct CallbackSettings {
    pub max_attempts: u32,
    /// The wait after the first failure; doubled after each next one.
    pub backoff: Duration,
    pub backoff_max: Duration,
    /// Per attempt.
    pub timeout: Duration,
    pub allow_private_hosts: bool,
}

/// Why a callback URL was refused or an attempt failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallbackError {
    #[error("{0}")]
    InvalidUrl(String),
    #[error("{0} is a private or loopback address")]
    PrivateHost(String),
    #[error("could not resolve {host}: {reason}")]
    Resolve { host: String, reason: String },
    #[error("request failed: {0}")]
    Http(String),
    #[error("unexpected status {0}")]
    Status(u16),
}

/// Loopback, private, link-local, shared, unspecified, broadcast and multicast.
pub(super) fn is_private(ip: IpAddr) -> bool {
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

fn is_localhost_name(host: &str) -> bool {
    matches!(
        host,
        "localhost" | "localhost.localdomain" | "localhost6" | "ip6-localhost" | "ip6-loopback"
    ) || host.ends_with(".localhost")
}

/// A checked callback: where to connect.
#[derive(Debug)]
pub(super) struct Target {
    /// With the host canonicalised: trimmed, lowercase, no trailing dot.
    url: reqwest::Url,
    /// The host name to pin, when the URL has a name rather than an address.
    domain: Option<String>,
    addr: SocketAddr,
}

impl Target {
    /// The URL to POST to, host canonicalised.
    pub(super) fn url(&self) -> &reqwest::Url {
        &self.url
    }
}

/// Whether a callback answer counts as delivered: any 2xx, and nothing else
/// (redirects are not followed).
pub(super) fn delivered(status: u16) -> bool {
    (200..300).contains(&status)
}

/// Parses `raw`, resolves its host and refuses private addresses unless allowed.
///
/// # Errors
/// A URL that is not http(s) with a host, a host that does not resolve, or one
/// with a private address.
pub(super) async fn check(
    raw: &str,
    resolver: &dyn Resolve,
    allow_private: bool,
) -> Result<Target, CallbackError> {
    let mut url = reqwest::Url::parse(raw.trim())
        .map_err(|err| CallbackError::InvalidUrl(err.to_string()))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(CallbackError::InvalidUrl("the scheme must be http or https".into()));
    }
    let port =
        url.port_or_known_default().ok_or_else(|| CallbackError::InvalidUrl("no port".into()))?;
    let host = url.host_str().unwrap_or_default();
    let literal = host.trim_start_matches('[').trim_end_matches(']').parse::<IpAddr>().ok();
    let (domain, addrs) = match literal {
        Some(ip) => (None, vec![SocketAddr::new(ip, port)]),
        None => {
            let name = host.trim().trim_end_matches('.').to_ascii_lowercase();
            if name.is_empty() {
                return Err(CallbackError::InvalidUrl("no host".into()));
            }
            if !allow_private && is_localhost_name(&name) {
                return Err(CallbackError::PrivateHost(name));
            }
            let addrs = resolver.resolve(&name, port).await.map_err(|err| {
                CallbackError::Resolve { host: name.clone(), reason: err.to_string() }
            })?;
            (Some(name), addrs)
        }
    };
    if let Some(name) = &domain {
        url.set_host(Some(name)).map_err(|err| CallbackError::InvalidUrl(err.to_string()))?;
    }
    let Some(first) = addrs.first().copied() else {
        let host = domain.unwrap_or_default();
        return Err(CallbackError::Resolve { host, reason: "no addresses".into() });
    };
    if !allow_private {
        if let Some(private) = addrs.iter().find(|addr| is_private(addr.ip())) {
            return Err(CallbackError::PrivateHost(private.ip().to_string()));
        }
    }
    Ok(Target { url, domain, addr: first })
}

/// One run's callback, delivered once the run completes.
#[derive(Debug)]
pub(super) struct Delivery {
    pub(super) url: String,
    pub(super) integration_id: String,
    pub(super) run_id: RunId,
    pub(super) session_key: String,
    pub(super) metadata: Value,
    /// The normalised attachments (a JSON list).
    pub(super) attachments: Value,
    pub(super) settings: CallbackSettings,
    pub(super) resolver: std::sync::Arc<dyn Resolve>,
}

impl Delivery {
    /// POSTs the result, retrying with exponential backoff; `true` on a 2xx.
    /// Failures are logged (with the host only: a URL may carry a token).
    pub(super) async fn deliver(&self, event: &BusEvent) -> bool {
        let completed = super::completed_json(event);
        let body = json!({
            "integration_id": self.integration_id,
            "run_id": self.run_id.as_str(),
            "session_key": self.session_key,
            "completed": completed,
            "duration_ms": completed["duration_ms"],
            "metadata": self.metadata,
            "attachments": self.attachments,
        });
        let host = reqwest::Url::parse(&self.url)
            .ok()
            .and_then(|u| u.host_str().map(str::to_owned))
            .unwrap_or_default();
        let backoff = Backoff::new(self.settings.backoff, self.settings.backoff_max);
        for attempt in 1..=self.settings.max_attempts {
            match self.attempt(&body).await {
                Ok(()) => return true,
                Err(error) => {
                    tracing::warn!(run_id = %self.run_id.as_str(), %host, attempt, %error, "webhook callback failed");
                    if matches!(error, CallbackError::InvalidUrl(_) | CallbackError::PrivateHost(_))
                    {
                        return false;
                    }
                }
            }
            if attempt < self.settings.max_attempts {
                tokio::time::sleep(backoff.delay(attempt)).await;
            }
        }
        false
    }

    async fn attempt(&self, body: &Value) -> Result<(), CallbackError> {
        let target =
            check(&self.url, self.resolver.as_ref(), self.settings.allow_private_hosts).await?;
        let timeout = self.settings.timeout;
        let mut builder = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .timeout(timeout)
            .connect_timeout(timeout.min(Duration::from_secs(5)));
        if let Some(domain) = &target.domain {
            builder = builder.resolve(domain, target.addr);
        }
        let client = builder.build().map_err(|err| CallbackError::Http(err.to_string()))?;
        let response = client
            .post(target.url)
            .json(body)
            .send()
            .await
            .map_err(|err| CallbackError::Http(err.without_url().to_string()))?;
        if delivered(response.status().as_u16()) {
            Ok(())
        } else {
            Err(CallbackError::Status(response.status().as_u16()))
        }
    }
}
