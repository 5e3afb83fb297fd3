//! Serving a router over HTTP/1 so that connections cannot exhaust the gateway.
//!
//! Every listener (control API, health, webhooks) goes through [`serve_with`]:
//! - a request head must arrive within [`ServeConfig::header_read_timeout`],
//!   counted from when the server starts waiting for it (the connection opening,
//!   or the previous response ending), so half-sent requests are closed;
//! - a connection with no request in flight that receives nothing for
//!   [`ServeConfig::idle_timeout`] is closed; a request in flight (an open event
//!   stream, however quiet) is never cut by it;
//! - at most [`ServeConfig::max_connections`] connections are open at once; one
//!   more is answered `503 {"error": ...}` and closed, and a rate-limited warning
//!   says the limit was reached;
//! - one client (an IPv4 address, an IPv6 /64) holds at most
//!   [`ClientLimits::max_connections`] of them and sends at most
//!   [`ClientLimits::requests_per_second`] requests a second after a burst of
//!   [`ClientLimits::burst`]; beyond either it is answered `429` with
//!   `Retry-After` (the connection over its share is closed, the request over
//!   its rate is answered and the connection kept), unless its address is in
//!   [`ClientLimits::exempt`];
//! - the responses hyper writes by itself for requests it cannot parse (`400`,
//!   `414`, `431`, with an empty body) are rewritten into the JSON error shape
//!   (the connection's I/O recognises them: nothing else writes an error
//!   status with an empty body).
//!
//! [`ConnectionLimits`] derives the caps of each listener from the process's
//! descriptor limit, so a saturated API cannot take the descriptors the health
//! listener and the gateway's own files need.
//!
//! On shutdown the listener is closed, idle connections are closed at once, and
//! requests in flight finish (event streams end on the same token).

mod clients;
mod conn_io;

use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes, HttpBody};
use axum::extract::ConnectInfo;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt as _;

pub use lemon_core::transport::listener::{
    ClientLimits, ConnectionLimits, ServeConfig, DEFAULT_HEADER_READ_TIMEOUT, DEFAULT_IDLE_TIMEOUT,
};

use clients::{ClientConnection, Clients, Refusal};
use conn_io::ConnIo;

/// How often the connection-limit and accept-error warnings may repeat.
const WARN_EVERY: Duration = Duration::from_secs(10);

/// The pause after an accept error caused by missing resources (descriptors,
/// memory), so a full descriptor table does not spin the accept loop.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// What a connection over the cap is told before it is closed.
static REFUSED_RESPONSE: LazyLock<Vec<u8>> = LazyLock::new(|| {
    conn_io::json_error_response(
        503,
        "Service Unavailable",
        "too many open connections; retry in a moment",
        "retry-after: 1\r\n",
    )
});

/// Connections the kernel completes and queues for a listener before it
/// accepts them (capped by `net.core.somaxconn`). The usual default of 128
/// overflows under a burst of clients, and the kernel then drops their
/// handshakes without a word, so they stall for seconds of retransmits.
pub const LISTEN_BACKLOG: u32 = 4096;

/// Listens on `addr` (`host:port`, the first of its addresses that binds),
/// with address reuse and a backlog of [`LISTEN_BACKLOG`]. Every listener of
/// the gateway is bound so.
///
/// # Errors
/// The address does not resolve, or no address of it can be bound.
pub async fn bind(addr: &str) -> io::Result<TcpListener> {
    let mut last = None;
    for resolved in tokio::net::lookup_host(addr).await? {
        match bind_one(resolved) {
            Ok(listener) => return Ok(listener),
            Err(error) => last = Some(error),
        }
    }
    Err(last.unwrap_or_else(|| {
        io::Error::new(io::ErrorKind::InvalidInput, format!("{addr} resolves to no address"))
    }))
}

fn bind_one(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

/// Serves `router` on `listener` with [`ServeConfig::default`]; see [`serve_with`].
///
/// # Errors
/// As [`serve_with`].
///
/// # Cancel safety
/// As [`serve_with`].
pub async fn serve(
    listener: TcpListener,
    router: Router,
    shutdown: CancellationToken,
) -> io::Result<()> {
    serve_with(listener, router, shutdown, ServeConfig::default()).await
}

/// Serves `router` on `listener` until `shutdown` is cancelled, then stops
/// accepting and waits for in-flight requests. Handlers can read the peer's
/// address (`ConnectInfo<SocketAddr>`). Event streams watch the same token
/// (through their router's state), so an open stream does not hold shutdown up.
///
/// Accept errors caused by missing resources (no free descriptor, no memory) are
/// logged, at most every 10 s, and retried after a short pause; a connection
/// reset before it was accepted is skipped.
///
/// # Errors
/// Any other I/O error from the listener.
///
/// # Cancel safety
/// Dropping the future stops accepting at once; connections already open are
/// served to their end on their own tasks only until the runtime stops.
pub async fn serve_with(
    listener: TcpListener,
    router: Router,
    shutdown: CancellationToken,
    config: ServeConfig,
) -> io::Result<()> {
    let local = listener.local_addr()?;
    let permits = Arc::new(Semaphore::new(config.max_connections.max(1)));
    let clients = Clients::new(config.clients.clone());
    let connections = TaskTracker::new();
    let mut refusals = RateLimitedWarning::default();
    let mut client_refusals = RateLimitedWarning::default();
    let mut accept_errors = RateLimitedWarning::default();
    let result = loop {
        let accepted = tokio::select! {
            () = shutdown.cancelled() => break Ok(()),
            accepted = listener.accept() => accepted,
        };
        let (stream, peer) = match accepted {
            Ok(pair) => pair,
            Err(error) if is_connection_error(&error) => continue,
            Err(error) if is_resource_error(&error) => {
                if let Some(suppressed) = accept_errors.note() {
                    tracing::warn!(addr = %local, %error, suppressed, "cannot accept connections; retrying");
                }
                tokio::select! {
                    () = shutdown.cancelled() => break Ok(()),
                    () = tokio::time::sleep(ACCEPT_BACKOFF) => continue,
                }
            }
            Err(error) => break Err(error),
        };
        let client = match clients.as_ref().map(|clients| clients.connect(peer.ip())) {
            None => None,
            Some(Ok(client)) => Some(client),
            Some(Err(refusal)) => {
                refuse_client(&stream, refusal);
                if let Some(suppressed) = client_refusals.note() {
                    tracing::warn!(
                        addr = %local,
                        client = %peer.ip(),
                        max_connections_per_client = config.clients.max_connections,
                        suppressed,
                        "a client holds its share of connections; refusing its new ones"
                    );
                }
                continue;
            }
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            refuse(&stream);
            if let Some(suppressed) = refusals.note() {
                tracing::warn!(
                    addr = %local,
                    max_connections = config.max_connections,
                    suppressed,
                    "connection limit reached; refusing new connections"
                );
            }
            continue;
        };
        connections.spawn(serve_connection(
            stream,
            peer,
            router.clone(),
            config.clone(),
            shutdown.clone(),
            permit,
            client,
        ));
    };
    drop(listener);
    connections.close();
    connections.wait().await;
    result
}

/// A connection beyond the cap: a best-effort `503` (the socket is fresh, so the
/// short answer fits its buffer), then closed by the drop.
fn refuse(stream: &TcpStream) {
    let _ = stream.set_nodelay(true);
    let _ = stream.try_write(&REFUSED_RESPONSE);
}

/// A connection over its client's share: a best-effort `429`, then closed.
fn refuse_client(stream: &TcpStream, refusal: Refusal) {
    let retry = format!("retry-after: {}\r\n", refusal.retry_after_secs());
    let response =
        conn_io::json_error_response(429, "Too Many Requests", &refusal.message(), &retry);
    let _ = stream.set_nodelay(true);
    let _ = stream.try_write(&response);
}

/// A request over its client's rate: `429` with `Retry-After`, in the error
/// shape of the route it was for (the OpenAI-compatible routes have their own).
fn rate_limited(refusal: Refusal, path: &str) -> axum::response::Response {
    use axum::http::{header, HeaderValue, StatusCode};
    use axum::response::IntoResponse as _;
    let message = refusal.message();
    let openai = ["/v1/chat/", "/v1/responses", "/v1/models"];
    let body = if openai.iter().any(|prefix| path.starts_with(prefix)) {
        let error = crate::api::openai::error::OpenAiErrorDetail {
            code: Some("rate_limit_exceeded".to_owned()),
            message,
            param: None,
            kind: "rate_limit_error".to_owned(),
        };
        axum::Json(crate::api::openai::error::OpenAiErrorBody { error }).into_response()
    } else {
        axum::Json(crate::error::ErrorBody::new(message)).into_response()
    };
    let mut response = (StatusCode::TOO_MANY_REQUESTS, body).into_response();
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(refusal.retry_after_secs()));
    response
}

/// The peer went away between the handshake and `accept`.
fn is_connection_error(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::Interrupted
            | io::ErrorKind::WouldBlock
    )
}

/// No descriptor or memory for the new socket: it passes when connections close.
fn is_resource_error(error: &io::Error) -> bool {
    const EMFILE: i32 = 24;
    const ENFILE: i32 = 23;
    const ENOMEM: i32 = 12;
    const ENOBUFS: i32 = 105;
    matches!(error.raw_os_error(), Some(EMFILE | ENFILE | ENOMEM | ENOBUFS))
        || error.kind() == io::ErrorKind::OutOfMemory
}

/// A warning that is logged at most every [`WARN_EVERY`], with the number of
/// occurrences since the last one it logged.
#[derive(Debug, Default)]
struct RateLimitedWarning {
    last_logged: Option<Instant>,
    suppressed: u64,
}

impl RateLimitedWarning {
    /// Counts one occurrence; `Some(occurrences left unlogged before it)` when
    /// this one is to be logged.
    fn note(&mut self) -> Option<u64> {
        let now = Instant::now();
        match self.last_logged {
            Some(last) if now.duration_since(last) < WARN_EVERY => {
                self.suppressed += 1;
                None
            }
            _ => {
                self.last_logged = Some(now);
                Some(std::mem::take(&mut self.suppressed))
            }
        }
    }
}

/// Serves one connection until it ends, is idle too long, or shutdown.
async fn serve_connection(
    stream: TcpStream,
    peer: SocketAddr,
    router: Router,
    config: ServeConfig,
    shutdown: CancellationToken,
    _permit: OwnedSemaphorePermit,
    client: Option<ClientConnection>,
) {
    // Answers and streamed events go out as they are written, not held for
    // Nagle's algorithm (a voice call's audio frames, an SSE delta).
    let _ = stream.set_nodelay(true);
    let activity = Arc::new(Activity::new());
    let io = TokioIo::new(ConnIo::new(stream, activity.clone()));
    let service_activity = activity.clone();
    let client = client.map(Arc::new);
    let service = hyper::service::service_fn(move |request| {
        handle(router.clone(), peer, service_activity.clone(), client.clone(), request)
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder.timer(TokioTimer::new()).header_read_timeout(config.header_read_timeout);
    // Upgrades (the voice channel's media-stream WebSocket) take the socket
    // over; until then the request head and idle limits apply as to any.
    let connection = builder.serve_connection(io, service).with_upgrades();
    tokio::pin!(connection);
    let idle = activity.idle_for(config.idle_timeout);
    tokio::select! {
        result = connection.as_mut() => {
            if let Err(error) = result {
                tracing::debug!(%peer, %error, "connection ended with an error");
            }
            return;
        }
        () = shutdown.cancelled() => {}
        () = idle => tracing::debug!(%peer, "idle connection closed"),
    }
    connection.as_mut().graceful_shutdown();
    if let Err(error) = connection.await {
        tracing::debug!(%peer, %error, "connection ended with an error");
    }
}

/// One request through the router, counted as in flight until its response
/// body is done.
async fn handle(
    router: Router,
    peer: SocketAddr,
    activity: Arc<Activity>,
    client: Option<Arc<ClientConnection>>,
    mut request: hyper::Request<Incoming>,
) -> Result<axum::response::Response, Infallible> {
    if let Some(Err(refusal)) = client.as_deref().map(ClientConnection::request) {
        tracing::debug!(%peer, path = request.uri().path(), "request over its client's rate refused");
        return Ok(rate_limited(refusal, request.uri().path()));
    }
    let in_flight = activity.begin();
    request.extensions_mut().insert(ConnectInfo(peer));
    let response = router.oneshot(request).await?;
    Ok(response.map(|body| Body::new(TrackedBody { body, _in_flight: in_flight })))
}

/// What a connection is doing, shared by its I/O (reads), its requests (in
/// flight) and its idle watch.
#[derive(Debug)]
struct Activity {
    /// Requests whose response body is not finished yet.
    in_flight: AtomicUsize,
    /// The last byte received or response finished.
    last: Mutex<Instant>,
    /// Woken when a request begins or ends.
    changed: Notify,
}

impl Activity {
    fn new() -> Self {
        Activity {
            in_flight: AtomicUsize::new(0),
            last: Mutex::new(Instant::now()),
            changed: Notify::new(),
        }
    }

    fn touch(&self) {
        *self.last.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Instant::now();
    }

    fn last(&self) -> Instant {
        *self.last.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn is_busy(&self) -> bool {
        self.in_flight.load(Ordering::Acquire) > 0
    }

    fn begin(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        self.changed.notify_waiters();
        InFlight(self.clone())
    }

    /// Resolves once no request has been in flight and nothing has been
    /// received for `idle`.
    async fn idle_for(&self, idle: Duration) {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if self.is_busy() {
                changed.await;
                continue;
            }
            let deadline = self.last() + idle;
            if deadline <= Instant::now() {
                return;
            }
            tokio::select! {
                () = tokio::time::sleep_until(deadline) => {}
                () = changed => {}
            }
        }
    }
}

/// A request in flight; dropped with its response body.
#[derive(Debug)]
struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.touch();
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
        self.0.changed.notify_waiters();
    }
}

/// A response body that keeps its request counted as in flight.
struct TrackedBody {
    body: Body,
    _in_flight: InFlight,
}

impl HttpBody for TrackedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests;
