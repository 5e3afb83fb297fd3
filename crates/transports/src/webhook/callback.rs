//! Callback delivery: the run's result POSTed to a URL, with retries, never to a
//! private or loopback address unless allowed.
//!
//! The host is resolved once per attempt, every address is checked, and the
//! connection is pinned to the checked address, so a second DNS answer cannot
//! point it elsewhere. Redirects are not followed and no proxy is used.
//!
//! Every callback is on record (in the store's key-value records, namespace
//! `webhook.callback`) from before its run is submitted until it is delivered,
//! with the attempts made so far, so a restart delivers what a stop left
//! pending and the attempts are counted across restarts. One given up on is
//! kept for a week.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use crate::delivery::{Backoff, DeliveryRecord, DeliveryRecords};
use futures::future::BoxFuture;
use lemon_core::bus::BusEvent;
use lemon_core::ids::SessionKey;
use lemon_core::net::{is_localhost_name, is_private};
use lemon_core::router::RunFollower;
use lemon_core::transport::StatusHandle;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

/// Store namespace of the callbacks not delivered yet, keyed by run id.
pub(super) const CALLBACK_NS: &str = "webhook.callback";

/// How long a callback given up on stays on record.
pub(super) const GIVEN_UP_TTL: Duration = Duration::from_secs(7 * 24 * 60 * 60);

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
    /// How long the run may take before the callback is given up on
    /// (`callback_wait_timeout_ms`); `None`: as long as it takes.
    pub wait: Option<Duration>,
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

/// One run's callback as it is kept on record until delivered. The URL is
/// stored (it may carry a token) but never logged.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(super) struct CallbackRecord {
    pub(super) url: String,
    pub(super) integration_id: String,
    pub(super) run_id: String,
    pub(super) session_key: SessionKey,
    #[serde(default)]
    pub(super) metadata: Value,
    /// The normalised attachments (a JSON list).
    #[serde(default)]
    pub(super) attachments: Value,
    /// Attempts made so far, across restarts.
    #[serde(default)]
    pub(super) attempts: u32,
    /// Set once delivery was given up: the last attempt's error.
    #[serde(default)]
    pub(super) failed: Option<String>,
}

impl DeliveryRecord for CallbackRecord {
    fn given_up(&self) -> bool {
        self.failed.is_some()
    }
}

/// One run's callback, delivered once the run completes.
#[derive(Debug)]
pub(super) struct Delivery {
    pub(super) record: CallbackRecord,
    pub(super) settings: CallbackSettings,
    pub(super) resolver: std::sync::Arc<dyn Resolve>,
    pub(super) records: DeliveryRecords<CallbackRecord>,
    /// Shown again when this callback is given up on.
    pub(super) status: Option<CallbackStatus>,
}

/// The webhook transport's status line: where it listens and, once any
/// callback was given up on, how many.
#[derive(Debug, Clone)]
pub(super) struct CallbackStatus {
    pub(super) handle: StatusHandle,
    pub(super) addr: String,
    pub(super) records: DeliveryRecords<CallbackRecord>,
}

impl CallbackStatus {
    /// Shows the transport as running with its current detail.
    pub(super) fn show(&self) {
        let detail = match self.records.given_up_count() {
            0 => self.addr.clone(),
            1 => format!("{}; 1 callback given up (see the log)", self.addr),
            n => format!("{}; {n} callbacks given up (see the log)", self.addr),
        };
        self.handle.running(Some(detail));
    }
}

impl Delivery {
    /// Waits for the run's completion, then delivers it. A stop before that
    /// leaves the record for the next start.
    pub(super) async fn follow(mut self, mut run: RunFollower, shutdown: CancellationToken) {
        let waited = async {
            match self.settings.wait {
                Some(wait) => tokio::time::timeout(wait, run.completion()).await.ok(),
                None => Some(run.completion().await),
            }
        };
        let completed = tokio::select! {
            () = shutdown.cancelled() => return,
            completed = waited => completed,
        };
        match completed {
            Some(Some(event)) => {
                self.deliver(&event, &shutdown).await;
            }
            Some(None) => {}
            None => self.give_up_waiting().await,
        }
    }

    /// The run outlasted `callback_wait_timeout_ms`: the callback is given
    /// up on, as the reference gateway does, and the run goes on.
    async fn give_up_waiting(&mut self) {
        let wait_ms = self.settings.wait.map_or(0, |wait| wait.as_millis());
        let reason =
            format!("the run did not finish within callback_wait_timeout_ms ({wait_ms} ms)");
        tracing::warn!(run_id = %self.record.run_id, %reason, "webhook callback given up");
        self.record.failed = Some(reason);
        self.records.give_up(&self.record.run_id, &self.record).await;
        if let Some(status) = &self.status {
            status.show();
        }
    }

    /// POSTs the result, retrying with exponential backoff up to the attempts
    /// allowed (counting those made before a restart); `true` on a 2xx, after
    /// which the record goes. A stop between attempts keeps the record; a
    /// callback out of attempts, or refused outright, is given up on. Failures
    /// are logged with the host only: a URL may carry a token.
    pub(super) async fn deliver(&mut self, event: &BusEvent, shutdown: &CancellationToken) -> bool {
        let completed = super::completed_json(event).await;
        let record = &self.record;
        let body = json!({
            "integration_id": record.integration_id,
            "run_id": record.run_id,
            "session_key": record.session_key,
            "completed": completed,
            "duration_ms": completed["duration_ms"],
            "metadata": record.metadata,
            "attachments": record.attachments,
        });
        let host = reqwest::Url::parse(&record.url)
            .ok()
            .and_then(|u| u.host_str().map(str::to_owned))
            .unwrap_or_default();
        let backoff = Backoff::new(self.settings.backoff, self.settings.backoff_max);
        let mut last_error = None;
        while self.record.attempts < self.settings.max_attempts {
            let wait = backoff.delay(self.record.attempts);
            tokio::select! {
                () = shutdown.cancelled() => return false,
                () = tokio::time::sleep(wait) => {}
            }
            // An attempt under way is not cut short by a stop (its timeout
            // bounds it), so a callback the receiver took is not sent again.
            let result = self.attempt(&body).await;
            self.record.attempts += 1;
            let attempt = self.record.attempts;
            let run_id = self.record.run_id.as_str();
            match result {
                Ok(()) => {
                    self.records.finish(run_id).await;
                    return true;
                }
                Err(error) => {
                    tracing::warn!(%run_id, %host, attempt, %error, "webhook callback failed");
                    let refused = matches!(
                        error,
                        CallbackError::InvalidUrl(_) | CallbackError::PrivateHost(_)
                    );
                    last_error = Some(error);
                    if refused {
                        break;
                    }
                    self.records.record(run_id, &self.record).await;
                }
            }
        }
        let reason = last_error.map_or_else(|| "no attempts left".to_owned(), |e| e.to_string());
        tracing::error!(run_id = %self.record.run_id, %host, attempts = self.record.attempts, %reason, "webhook callback given up");
        self.record.failed = Some(reason);
        self.records.give_up(&self.record.run_id, &self.record).await;
        if let Some(status) = &self.status {
            status.show();
        }
        false
    }

    async fn attempt(&self, body: &Value) -> Result<(), CallbackError> {
        let target =
            check(&self.record.url, self.resolver.as_ref(), self.settings.allow_private_hosts)
                .await?;
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
