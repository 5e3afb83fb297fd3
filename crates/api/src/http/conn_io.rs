//! A connection's socket as hyper sees it: reads count as activity, and the
//! empty error responses hyper writes by itself get the JSON error shape.
//!
//! hyper answers a request it cannot parse (a garbage request line, a bad
//! header, a head too large, a malformed URI) without calling the service: it
//! writes a bare status line with `content-length: 0` and closes. Every other
//! response comes from a router, whose errors are JSON with a body. So a write
//! that is a whole response head, with an error status and `content-length: 0`,
//! written while no request is in flight, is hyper's own; it is replaced by the
//! same status with `{"error": "..."}`. The replacement is reported to hyper as
//! written at once and is sent on the following writes, flushes and the
//! shutdown, which hyper always makes before it closes.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use super::Activity;

/// The socket of one connection, as given to hyper.
#[derive(Debug)]
pub(super) struct ConnIo {
    stream: TcpStream,
    activity: Arc<Activity>,
    /// A replacement response still to be written, and how much of it is.
    replacement: Option<(Vec<u8>, usize)>,
}

impl ConnIo {
    pub(super) fn new(stream: TcpStream, activity: Arc<Activity>) -> Self {
        ConnIo { stream, activity, replacement: None }
    }

    /// Writes what is left of the replacement.
    fn poll_replacement(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while let Some((bytes, written)) = &mut self.replacement {
            if *written == bytes.len() {
                self.replacement = None;
                break;
            }
            let n = ready!(Pin::new(&mut self.stream).poll_write(cx, &bytes[*written..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            *written += n;
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncRead for ConnIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        ready!(Pin::new(&mut this.stream).poll_read(cx, buf))?;
        if buf.filled().len() > before {
            this.activity.touch();
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for ConnIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        ready!(this.poll_replacement(cx))?;
        if !this.activity.is_busy() {
            if let Some(replacement) = json_replacement(buf) {
                this.replacement = Some((replacement, 0));
                if let Poll::Ready(Err(error)) = this.poll_replacement(cx) {
                    return Poll::Ready(Err(error));
                }
                return Poll::Ready(Ok(buf.len()));
            }
        }
        Pin::new(&mut this.stream).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_replacement(cx))?;
        Pin::new(&mut this.stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_replacement(cx))?;
        Pin::new(&mut this.stream).poll_shutdown(cx)
    }

    /// Not vectored, so hyper writes each response head in one buffer, where it
    /// can be recognised.
    fn is_write_vectored(&self) -> bool {
        false
    }
}

/// The JSON response replacing `buf`, when `buf` is exactly one response head
/// with a 4xx or 5xx status and `content-length: 0`.
pub(super) fn json_replacement(buf: &[u8]) -> Option<Vec<u8>> {
    let head = std::str::from_utf8(buf).ok()?;
    let head = head.strip_suffix("\r\n\r\n")?;
    if head.contains("\r\n\r\n") {
        return None;
    }
    let mut lines = head.split("\r\n");
    let status_line = lines.next()?;
    let rest =
        status_line.strip_prefix("HTTP/1.1 ").or_else(|| status_line.strip_prefix("HTTP/1.0 "))?;
    let code: u16 = rest.get(..3)?.parse().ok()?;
    if !(400..=599).contains(&code) {
        return None;
    }
    let empty = lines.any(|line| {
        line.split_once(':').is_some_and(|(name, value)| {
            name.trim().eq_ignore_ascii_case("content-length") && value.trim() == "0"
        })
    });
    if !empty {
        return None;
    }
    let status = axum::http::StatusCode::from_u16(code).ok()?;
    let reason = status.canonical_reason().unwrap_or("Error");
    Some(json_error_response(code, reason, &message_for(code, reason), ""))
}

/// What the error body says for a status hyper answers by itself.
fn message_for(code: u16, reason: &str) -> String {
    match code {
        400 => "malformed request: the request line or a header could not be parsed".to_owned(),
        414 => "request target too long".to_owned(),
        431 => "request header fields too large".to_owned(),
        _ => reason.to_ascii_lowercase(),
    }
}

/// A complete `connection: close` response with `{"error": message}`;
/// `extra_headers` are whole header lines, each ending in `\r\n`.
pub(super) fn json_error_response(
    code: u16,
    reason: &str,
    message: &str,
    extra_headers: &str,
) -> Vec<u8> {
    // One string field: it always serialises.
    let body = serde_json::to_string(&crate::error::ErrorBody::new(message)).unwrap_or_default();
    format!(
        "HTTP/1.1 {code} {reason}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n{extra_headers}connection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}
