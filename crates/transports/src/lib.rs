//! Lemon Gateway transports: the ways in and out of a gateway over HTTP.
//!
//! # Layout
//! - [`api`]: the control API (`/v1/...`): submit, inspect, cancel and steer runs,
//!   and follow their events over Server-Sent Events. Bearer-token protected.
//! - [`health`]: `/healthz`, `/health` and `/metrics`, meant for a loopback or
//!   internal port; without the API token `/healthz` shows states only.
//! - [`webhook`]: `POST /webhooks/{integration}`, generic inbound webhooks with
//!   per-integration tokens, attachments, sync or async answers, callbacks and
//!   idempotency keys kept in the store; run as a transport by
//!   [`webhook::WebhookTransport`].
//! - [`telegram`]: the Telegram bot: long polling, progress edits through a
//!   rate-limited outbox, answers split to Telegram's limits.
//! - [`transport`]: the contract every channel implements, the states status
//!   reports, the one enable rule, and the [`transport::TransportRegistry`] that
//!   supervises and restarts transports.
//! - [`error`]: [`error::ApiError`], the one JSON error shape of every router, and
//!   extractors whose rejections use it.
//! - [`http`]: runs a router on a listener until a shutdown token fires
//!   ([`serve`], [`serve_with`]), with header and idle timeouts, a connection cap,
//!   and JSON bodies on the errors hyper answers by itself.
//!
//! Handlers parse, call the gateway or the store, and map errors; they hold no
//! business rules and never call engines.

pub mod api;
pub mod error;
pub mod health;
pub mod http;
pub mod telegram;
pub mod transport;
pub mod webhook;

pub use http::{serve, serve_with};

#[cfg(test)]
pub(crate) mod test_util {
    //! What the crate's tests share.

    use std::future::Future;
    use std::time::Duration;

    /// A safety net: every wait in a test ends on an event long before this.
    pub(crate) const PATIENCE: Duration = Duration::from_secs(20);

    /// `fut`, or a panic naming `what` after `patience`.
    pub(crate) async fn within_for<F: Future>(patience: Duration, what: &str, fut: F) -> F::Output {
        match tokio::time::timeout(patience, fut).await {
            Ok(output) => output,
            Err(_) => panic!("timed out waiting for {what}"),
        }
    }

    /// `fut`, or a panic naming `what` after [`PATIENCE`].
    pub(crate) async fn within<F: Future>(what: &str, fut: F) -> F::Output {
        within_for(PATIENCE, what, fut).await
    }
}
