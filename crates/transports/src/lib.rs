//! Lemon Gateway transports: the ways in and out of a gateway over HTTP.
//!
//! # Layout
//! - [`api`]: the control API (`/v1/...`): submit, inspect, cancel and steer runs,
//!   and follow their events over Server-Sent Events. Bearer-token protected.
//! - [`health`]: `/healthz`, `/health` and `/metrics`, unauthenticated, meant for a
//!   loopback or internal port.
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
//! - [`serve`]: runs a router on a listener until a shutdown token fires.
//!
//! Handlers parse, call the gateway or the store, and map errors; they hold no
//! business rules and never call engines.

pub mod api;
pub mod error;
pub mod health;
pub mod telegram;
pub mod transport;
pub mod webhook;

use axum::Router;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// Serves `router` on `listener` until `shutdown` is cancelled, then stops
/// accepting and waits for in-flight requests. Handlers can read the peer's
/// address (`ConnectInfo<SocketAddr>`). Event streams watch the same token
/// (through their router's state), so an open stream does not hold shutdown up.
///
/// # Errors
/// An I/O error from the listener.
///
/// # Cancel safety
/// Dropping the future stops the server at once, without a graceful shutdown.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let app = router.into_make_service_with_connect_info::<std::net::SocketAddr>();
    axum::serve(listener, app).with_graceful_shutdown(shutdown.cancelled_owned()).await
}
