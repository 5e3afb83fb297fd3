//! The Gateway WebSocket: one session of the bot with Discord, kept alive
//! across drops.
//!
//! - Connect to `<gateway_url>/?v=10&encoding=json`, read HELLO (op 10) with the
//!   heartbeat interval, then IDENTIFY (op 2) with the token and [`INTENTS`], or
//!   RESUME (op 6) with the session id and the last sequence number when there
//!   is a session to continue.
//! - Heartbeats (op 1, with the last sequence number): the first after a random
//!   part of the interval, then one per interval. A heartbeat that was not
//!   acknowledged (op 11) by the time the next is due means the connection is
//!   dead: it is dropped and the session resumed. Discord's own heartbeat
//!   request (op 1) is answered at once.
//! - A drop, RECONNECT (op 7) or a close code that allows it reconnects to the
//!   `resume_gateway_url` from READY and resumes, so Discord replays what was
//!   missed; failed connects back off (1 s doubling to 60 s), and after three
//!   failed connects to the resume URL a new session is started at the
//!   configured URL.
//! - INVALID SESSION (op 9): `d = true` resumes; `d = false` forgets the
//!   session, waits 1–5 s and identifies again.
//! - A close code only a config change can fix (4004 authentication failed,
//!   4010–4014 shard, version and intent refusals) ends the run with a fatal
//!   error that names it.
//! - Dispatches (op 0) go to the bot in order; READY and RESUMED are told apart.
//!   On shutdown the socket is closed with a code that keeps the session, so the
//!   next start resumes it.

use std::fmt;
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio::time::{sleep_until, Instant};
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::Message as WsMessage;
use tokio_util::sync::CancellationToken;

use super::types::{Snowflake, User};
use crate::delivery::Backoff;

/// `GUILD_MESSAGES` (1 << 9), `DIRECT_MESSAGES` (1 << 12) and `MESSAGE_CONTENT`
/// (1 << 15, privileged: switched on in the developer portal).
pub const INTENTS: u64 = (1 << 9) | (1 << 12) | (1 << 15);

/// How long connecting and HELLO may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// Failed connects to a resume URL before a new session is started instead.
const MAX_RESUME_FAILURES: u32 = 3;
/// Close code sent on shutdown: not 1000/1001, so Discord keeps the session.
const CLOSE_KEEP_SESSION: u16 = 4000;
/// Waits between failed connects: 1 s, doubling up to a minute.
const CONNECT_BACKOFF: Backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(60));

/// A session that can be resumed: kept across drops and in the store across
/// restarts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resumable {
    pub session_id: String,
    /// The last sequence number handled.
    pub seq: u64,
    pub resume_url: String,
}

/// What the session tells the bot.
#[derive(Debug, Clone, PartialEq)]
pub enum GatewayEvent {
    /// A new session (after IDENTIFY).
    Ready { user: User, application_id: Option<Snowflake>, session_id: String, resume_url: String },
    /// An earlier session continues; missed dispatches follow.
    Resumed,
    /// Any other dispatch, with its sequence number.
    Dispatch { name: String, seq: u64, data: Value },
    /// The connection is gone; the next attempt is in `retry_in`.
    Disconnected { reason: String, attempts: u32, retry_in: Duration },
}

/// Where and as whom to connect.
#[derive(Clone)]
pub struct GatewaySettings {
    pub url: String,
    /// Never shown.
    pub token: String,
    pub intents: u64,
    /// Waits between failed connects.
    pub backoff: Backoff,
}

impl GatewaySettings {
    /// The bot's session at `url` as `token`: [`INTENTS`], and failed
    /// connects backing off from 1 s to 60 s.
    pub fn new(url: String, token: String) -> Self {
        GatewaySettings { url, token, intents: INTENTS, backoff: CONNECT_BACKOFF }
    }
}

impl fmt::Debug for GatewaySettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GatewaySettings")
            .field("url", &self.url)
            .field("intents", &self.intents)
            .finish_non_exhaustive()
    }
}

/// How one connection ended.
#[derive(Debug)]
enum Ended {
    Shutdown,
    /// Only a config change helps.
    Fatal(String),
    /// Connect again; `healthy` when the connection had served.
    Reconnect {
        reason: String,
        healthy: bool,
    },
    /// Op 9 with `d = false`: identify again after 1–5 s.
    InvalidSession,
}

/// Runs the session until `shutdown` fires (then `Ok`) or Discord refuses the
/// bot in a way only a config change can fix (then the error's text).
///
/// # Errors
/// The refusal, e.g. `authentication failed (close code 4004)`.
pub async fn run(
    settings: GatewaySettings,
    mut resume: Option<Resumable>,
    events: mpsc::Sender<GatewayEvent>,
    shutdown: CancellationToken,
) -> Result<(), String> {
    let mut failures = 0u32;
    loop {
        let url = resume.as_ref().map_or(settings.url.as_str(), |r| r.resume_url.as_str());
        let url = socket_url(url);
        let ended = connect_once(&settings, &url, &mut resume, &events, &shutdown).await;
        let pause = match ended {
            Ended::Shutdown => return Ok(()),
            Ended::Fatal(reason) => return Err(reason),
            Ended::InvalidSession => {
                resume = None;
                failures = 0;
                tracing::info!("discord gateway: session invalid; identifying again");
                Duration::from_millis(1000 + random_below(4000))
            }
            Ended::Reconnect { reason, healthy } => {
                failures = if healthy { 1 } else { failures + 1 };
                // A resume URL that keeps failing (a session saved before a
                // restart, say) is given up for a new session at `url`.
                if !healthy && failures >= MAX_RESUME_FAILURES && resume.take().is_some() {
                    tracing::info!("discord gateway: resume keeps failing; starting a new session");
                }
                // A connection that served reconnects at once; failures back off.
                let pause = if healthy { Duration::ZERO } else { settings.backoff.delay(failures) };
                tracing::info!(%reason, retry_in_ms = pause.as_millis() as u64, "discord gateway: reconnecting");
                let _ = events
                    .send(GatewayEvent::Disconnected {
                        reason,
                        attempts: failures,
                        retry_in: pause,
                    })
                    .await;
                pause
            }
        };
        tokio::select! {
            () = shutdown.cancelled() => return Ok(()),
            () = tokio::time::sleep(pause) => {}
        }
    }
}

/// `<url>/?v=10&encoding=json`, unless the URL names its own query.
fn socket_url(url: &str) -> String {
    let url = url.trim();
    if url.contains('?') {
        url.to_owned()
    } else {
        format!("{}/?v=10&encoding=json", url.trim_end_matches('/'))
    }
}

/// A number in `0..bound` (not for secrets).
fn random_below(bound: u64) -> u64 {
    let mut bytes = [0u8; 8];
    if getrandom::fill(&mut bytes).is_err() {
        return bound / 2;
    }
    u64::from_le_bytes(bytes) % bound.max(1)
}

/// The close codes after which identifying or resuming again cannot help.
pub(crate) fn fatal_close(code: u16) -> Option<&'static str> {
    match code {
        4004 => Some("Discord rejected the bot token (close code 4004): check bot_token_secret"),
        4010 => Some("Discord refused the shard (close code 4010)"),
        4011 => Some("Discord requires sharding for this bot (close code 4011)"),
        4012 => Some("Discord refused the gateway version (close code 4012)"),
        4013 => Some("Discord refused the intents (close code 4013)"),
        4014 => Some(
            "Discord refused the intents (close code 4014): switch on the Message Content \
             intent for the bot in the developer portal",
        ),
        _ => None,
    }
}

async fn connect_once(
    settings: &GatewaySettings,
    url: &str,
    resume: &mut Option<Resumable>,
    events: &mpsc::Sender<GatewayEvent>,
    shutdown: &CancellationToken,
) -> Ended {
    let connect = tokio::time::timeout(CONNECT_TIMEOUT, tokio_tungstenite::connect_async(url));
    let mut socket = tokio::select! {
        () = shutdown.cancelled() => return Ended::Shutdown,
        connected = connect => match connected {
            Ok(Ok((socket, _))) => socket,
            Ok(Err(error)) => {
                return Ended::Reconnect { reason: format!("could not connect: {error}"), healthy: false }
            }
            Err(_) => return Ended::Reconnect { reason: "connect timed out".into(), healthy: false },
        },
    };
    // HELLO first.
    let hello = tokio::time::timeout(CONNECT_TIMEOUT, next_payload(&mut socket)).await;
    let interval = match hello {
        Ok(Some(Ok(payload))) if payload.op == 10 => payload
            .d
            .get("heartbeat_interval")
            .and_then(Value::as_u64)
            .map(Duration::from_millis)
            .filter(|d| !d.is_zero()),
        _ => None,
    };
    let Some(interval) = interval else {
        return Ended::Reconnect { reason: "no HELLO from the gateway".into(), healthy: false };
    };
    let opening = match resume.as_ref() {
        Some(session) => json!({
            "op": 6,
            "d": { "token": settings.token, "session_id": session.session_id, "seq": session.seq },
        }),
        None => json!({
            "op": 2,
            "d": {
                "token": settings.token,
                "intents": settings.intents,
                "properties": { "os": std::env::consts::OS, "browser": "lemon-gateway", "device": "lemon-gateway" },
            },
        }),
    };
    if socket.send(WsMessage::text(opening.to_string())).await.is_err() {
        return Ended::Reconnect {
            reason: "the gateway closed during the handshake".into(),
            healthy: false,
        };
    }
    let jitter = Duration::from_millis(random_below(interval.as_millis() as u64).max(1));
    let mut next_beat = Instant::now() + jitter;
    let mut acked = true;
    let mut healthy = false;
    let mut seq = resume.as_ref().map(|r| r.seq);
    loop {
        let payload = tokio::select! {
            () = shutdown.cancelled() => {
                let frame = CloseFrame { code: CloseCode::from(CLOSE_KEEP_SESSION), reason: "restarting".into() };
                let _ = tokio::time::timeout(Duration::from_secs(2), socket.close(Some(frame))).await;
                return Ended::Shutdown;
            }
            () = sleep_until(next_beat) => {
                if !acked {
                    return Ended::Reconnect { reason: "heartbeat not acknowledged".into(), healthy: true };
                }
                if socket.send(heartbeat(seq)).await.is_err() {
                    return Ended::Reconnect { reason: "the connection broke".into(), healthy };
                }
                acked = false;
                next_beat += interval;
                continue;
            }
            payload = next_payload(&mut socket) => payload,
        };
        let payload = match payload {
            None => {
                return Ended::Reconnect {
                    reason: "the gateway closed the connection".into(),
                    healthy,
                }
            }
            Some(Err(Closed(code))) => {
                if let Some(reason) = fatal_close(code) {
                    return Ended::Fatal(reason.to_owned());
                }
                if matches!(code, 4007 | 4009) {
                    // Invalid sequence, session timed out: a new session.
                    *resume = None;
                }
                return Ended::Reconnect {
                    reason: format!("closed by the gateway (code {code})"),
                    healthy,
                };
            }
            Some(Ok(payload)) => payload,
        };
        match payload.op {
            0 => {
                if let Some(s) = payload.s {
                    seq = Some(s);
                    if let Some(session) = resume.as_mut() {
                        session.seq = s;
                    }
                }
                let name = payload.t.unwrap_or_default();
                let event = match name.as_str() {
                    "READY" => match ready(&payload.d) {
                        Some(ready) => {
                            healthy = true;
                            if let GatewayEvent::Ready { session_id, resume_url, .. } = &ready {
                                *resume = Some(Resumable {
                                    session_id: session_id.clone(),
                                    seq: seq.unwrap_or(0),
                                    resume_url: resume_url.clone(),
                                });
                            }
                            ready
                        }
                        None => {
                            return Ended::Reconnect {
                                reason: "READY without a session".into(),
                                healthy: false,
                            }
                        }
                    },
                    "RESUMED" => {
                        healthy = true;
                        GatewayEvent::Resumed
                    }
                    _ => GatewayEvent::Dispatch {
                        name,
                        seq: payload.s.unwrap_or(0),
                        data: payload.d,
                    },
                };
                if events.send(event).await.is_err() {
                    return Ended::Shutdown;
                }
            }
            1 if socket.send(heartbeat(seq)).await.is_err() => {
                return Ended::Reconnect { reason: "the connection broke".into(), healthy };
            }
            7 => {
                return Ended::Reconnect {
                    reason: "the gateway asked to reconnect".into(),
                    healthy: true,
                }
            }
            9 => {
                if payload.d.as_bool() == Some(true) && resume.is_some() {
                    return Ended::Reconnect {
                        reason: "session invalid, resumable".into(),
                        healthy: true,
                    };
                }
                return Ended::InvalidSession;
            }
            11 => acked = true,
            _ => {}
        }
    }
}

fn heartbeat(seq: Option<u64>) -> WsMessage {
    WsMessage::text(json!({ "op": 1, "d": seq }).to_string())
}

pub(crate) fn ready(d: &Value) -> Option<GatewayEvent> {
    let user: User = serde_json::from_value(d.get("user")?.clone()).ok()?;
    let session_id = d.get("session_id")?.as_str()?.to_owned();
    let resume_url = d.get("resume_gateway_url")?.as_str()?.to_owned();
    let application_id = d
        .get("application")
        .and_then(|a| a.get("id"))
        .and_then(|id| serde_json::from_value(id.clone()).ok());
    Some(GatewayEvent::Ready { user, application_id, session_id, resume_url })
}

/// A gateway payload.
#[derive(Debug, Deserialize)]
pub(crate) struct Payload {
    pub(crate) op: u8,
    #[serde(default)]
    pub(crate) d: Value,
    #[serde(default)]
    pub(crate) s: Option<u64>,
    #[serde(default)]
    pub(crate) t: Option<String>,
}

/// The socket closed with this code.
#[derive(Debug)]
pub(crate) struct Closed(pub(crate) u16);

/// The next payload; `None` when the connection is gone without a close code.
pub(crate) async fn next_payload<S>(socket: &mut S) -> Option<Result<Payload, Closed>>
where
    S: futures::Stream<Item = Result<WsMessage, tokio_tungstenite::tungstenite::Error>> + Unpin,
{
    loop {
        match socket.next().await? {
            Ok(WsMessage::Text(text)) => match serde_json::from_str::<Payload>(&text) {
                Ok(payload) => return Some(Ok(payload)),
                Err(error) => tracing::warn!(%error, "discord gateway: payload skipped"),
            },
            Ok(WsMessage::Close(frame)) => {
                return frame.map(|f| Err(Closed(u16::from(f.code))));
            }
            Ok(_) => {}
            Err(_) => return None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A gateway that says HELLO and reports the first payload it gets.
    async fn one_shot_gateway() -> (String, tokio::sync::oneshot::Receiver<Value>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("ws://{}", listener.local_addr().unwrap());
        let (tx, rx) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            let (stream, _) = listener.accept().await.unwrap();
            let mut ws = tokio_tungstenite::accept_async(stream).await.unwrap();
            let hello = json!({ "op": 10, "d": { "heartbeat_interval": 45_000 } });
            ws.send(WsMessage::text(hello.to_string())).await.unwrap();
            if let Some(Ok(WsMessage::Text(text))) = ws.next().await {
                let _ = tx.send(serde_json::from_str::<Value>(&text).unwrap());
            }
        });
        (url, rx)
    }

    #[tokio::test]
    async fn a_resume_url_that_keeps_failing_gives_way_to_a_new_session() {
        let (url, first) = one_shot_gateway().await;
        // A port nothing listens on.
        let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let dead_url = format!("ws://{}", dead.local_addr().unwrap());
        drop(dead);
        let settings = GatewaySettings {
            url,
            token: "t".into(),
            intents: INTENTS,
            backoff: Backoff::new(Duration::from_millis(1), Duration::from_millis(5)),
        };
        let saved = Resumable { session_id: "old".into(), seq: 9, resume_url: dead_url };
        let (events, _rx) = mpsc::channel(8);
        let stop = CancellationToken::new();
        let session = tokio::spawn(run(settings, Some(saved), events, stop.clone()));
        let payload = tokio::time::timeout(Duration::from_secs(30), first).await.unwrap().unwrap();
        assert_eq!(payload["op"], 2, "identified: {payload}");
        assert_eq!(payload["d"]["intents"], INTENTS);
        stop.cancel();
        assert_eq!(session.await.unwrap(), Ok(()));
    }

    #[tokio::test]
    async fn a_saved_session_is_resumed_with_its_id_and_sequence() {
        let (url, first) = one_shot_gateway().await;
        let settings = GatewaySettings {
            url: "ws://127.0.0.1:1".into(),
            token: "t".into(),
            intents: INTENTS,
            backoff: Backoff::new(Duration::from_millis(1), Duration::from_millis(5)),
        };
        let saved = Resumable { session_id: "s-1".into(), seq: 42, resume_url: url };
        let (events, _rx) = mpsc::channel(8);
        let stop = CancellationToken::new();
        let session = tokio::spawn(run(settings, Some(saved), events, stop.clone()));
        let payload = tokio::time::timeout(Duration::from_secs(30), first).await.unwrap().unwrap();
        assert_eq!(
            payload,
            json!({ "op": 6, "d": { "token": "t", "session_id": "s-1", "seq": 42 } })
        );
        stop.cancel();
        assert_eq!(session.await.unwrap(), Ok(()));
    }

    /// A payload a scripted gateway got, on its `connection` (counted from
    /// 0), with the (paused) time of that connection's HELLO and of the
    /// payload's arrival, once its answers were sent.
    #[derive(Debug)]
    struct Received {
        connection: usize,
        hello_at: Instant,
        at: Instant,
        payload: Value,
    }

    /// A gateway on 127.0.0.1, one connection at a time: HELLO with
    /// `interval_ms`, then `answer(payload)` sent back for each payload, which
    /// is reported.
    ///
    /// Under paused time the clock jumps to the next timer whenever every
    /// task waits for a socket with nothing to read yet, so no byte may be
    /// held back in real time: the gateway writes without delay (no Nagle)
    /// and answers every payload, which acknowledges it at once, so the bot's
    /// next write is not held back waiting for a TCP acknowledgement either.
    async fn scripted_gateway(
        interval_ms: u64,
        answer: fn(&Value) -> Vec<Value>,
    ) -> (String, mpsc::UnboundedReceiver<Received>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("ws://{}", listener.local_addr().unwrap());
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            for connection in 0.. {
                let Ok((stream, _)) = listener.accept().await else { return };
                stream.set_nodelay(true).unwrap();
                let Ok(mut ws) = tokio_tungstenite::accept_async(stream).await else { continue };
                let hello = json!({ "op": 10, "d": { "heartbeat_interval": interval_ms } });
                if ws.send(WsMessage::text(hello.to_string())).await.is_err() {
                    continue;
                }
                let hello_at = Instant::now();
                while let Some(Ok(WsMessage::Text(text))) = ws.next().await {
                    let payload: Value = serde_json::from_str(&text).unwrap();
                    let replies = answer(&payload);
                    assert!(!replies.is_empty(), "every payload is answered: {payload}");
                    for reply in replies {
                        let _ = ws.send(WsMessage::text(reply.to_string())).await;
                    }
                    let received = Received { connection, hello_at, at: Instant::now(), payload };
                    if tx.send(received).is_err() {
                        return;
                    }
                }
            }
        });
        (url, rx)
    }

    /// The next payload with opcode `op`.
    async fn next_op(received: &mut mpsc::UnboundedReceiver<Received>, op: u64) -> Received {
        let patience = Duration::from_secs(3600);
        lemon_core::testing::within_for(patience, "a payload from the session", async {
            loop {
                let got = received.recv().await.expect("the gateway runs");
                if got.payload["op"] == op {
                    return got;
                }
            }
        })
        .await
    }

    /// The documented pacing: the first heartbeat at a random point of the
    /// interval, then one per interval.
    #[tokio::test(start_paused = true)]
    async fn the_first_heartbeat_comes_at_a_random_point_of_the_interval() {
        // Every payload, IDENTIFY too, is answered with a heartbeat ACK.
        let (url, mut received) = scripted_gateway(45_000, |_| vec![json!({ "op": 11 })]).await;
        let mut firsts = Vec::new();
        for _ in 0..5 {
            let (events, _events) = mpsc::channel(8);
            let stop = CancellationToken::new();
            let settings = GatewaySettings::new(url.clone(), "t".into());
            let session = tokio::spawn(run(settings, None, events, stop.clone()));
            let first = next_op(&mut received, 1).await;
            let second = next_op(&mut received, 1).await;
            assert_eq!(first.connection, second.connection, "{first:?} {second:?}");
            let jitter = first.at - first.hello_at;
            assert!(jitter > Duration::ZERO, "{jitter:?}");
            assert!(jitter < Duration::from_secs(45), "{jitter:?}");
            assert_eq!(second.at - first.at, Duration::from_secs(45));
            firsts.push(jitter);
            stop.cancel();
            assert_eq!(session.await.unwrap(), Ok(()));
        }
        assert!(firsts.iter().any(|jitter| *jitter != firsts[0]), "always the same: {firsts:?}");
    }

    /// The documented wait: a session Discord calls invalid (op 9, `d =
    /// false`) is started afresh after 1–5 s.
    #[tokio::test(start_paused = true)]
    async fn an_invalid_session_is_identified_afresh_after_1_to_5_s() {
        let refuse = |payload: &Value| {
            if payload["op"] == 2 {
                vec![json!({ "op": 9, "d": false })]
            } else {
                vec![json!({ "op": 11 })]
            }
        };
        let (url, mut received) = scripted_gateway(3_600_000, refuse).await;
        let (events, _events) = mpsc::channel(8);
        let stop = CancellationToken::new();
        let settings = GatewaySettings::new(url, "t".into());
        let session = tokio::spawn(run(settings, None, events, stop.clone()));
        let mut refused = next_op(&mut received, 2).await;
        let mut waits = Vec::new();
        for _ in 0..5 {
            let again = lemon_core::testing::within_for(
                Duration::from_secs(3600),
                "the next connection's first payload",
                async {
                    loop {
                        let got = received.recv().await.expect("the gateway runs");
                        if got.connection != refused.connection && got.payload["op"] != 1 {
                            return got;
                        }
                    }
                },
            )
            .await;
            assert_eq!(again.payload["op"], 2, "a new session, not a resume: {:?}", again.payload);
            waits.push(again.hello_at - refused.at);
            refused = again;
        }
        for wait in &waits {
            assert!(*wait >= Duration::from_secs(1), "{waits:?}");
            assert!(*wait <= Duration::from_secs(5), "{waits:?}");
        }
        stop.cancel();
        assert_eq!(session.await.unwrap(), Ok(()));
    }

    /// The documented backoff: failed connects wait 1 s, doubling up to 60 s.
    /// The URL's scheme is refused before any connection, so each attempt
    /// fails at once and only the waits take (paused) time.
    #[tokio::test(start_paused = true)]
    async fn failed_connects_back_off_from_1_s_doubling_to_60_s() {
        let settings = GatewaySettings::new("http://127.0.0.1".into(), "t".into());
        let (events, mut rx) = mpsc::channel(16);
        let stop = CancellationToken::new();
        let session = tokio::spawn(run(settings, None, events, stop.clone()));
        let mut promised = Vec::new();
        let mut previous: Option<(Instant, Duration)> = None;
        for attempt in 1..=9 {
            let event = lemon_core::testing::within_for(
                Duration::from_secs(3600),
                "a failed connect",
                rx.recv(),
            )
            .await;
            let Some(GatewayEvent::Disconnected { attempts, retry_in, .. }) = event else {
                panic!("not a failed connect: {event:?}");
            };
            assert_eq!(attempts, attempt);
            let now = Instant::now();
            if let Some((at, wait)) = previous {
                assert_eq!(now - at, wait, "the wait taken is the one announced");
            }
            previous = Some((now, retry_in));
            promised.push(retry_in.as_secs());
        }
        assert_eq!(promised, [1, 2, 4, 8, 16, 32, 60, 60, 60]);
        stop.cancel();
        assert_eq!(session.await.unwrap(), Ok(()));
    }

    #[test]
    fn the_socket_url_names_version_and_encoding() {
        assert_eq!(
            socket_url("wss://gateway.discord.gg"),
            "wss://gateway.discord.gg/?v=10&encoding=json"
        );
        assert_eq!(socket_url("ws://127.0.0.1:9/"), "ws://127.0.0.1:9/?v=10&encoding=json");
        assert_eq!(socket_url("ws://h/?v=10"), "ws://h/?v=10");
    }

    #[test]
    fn the_intents_are_guild_messages_dms_and_message_content() {
        assert_eq!(INTENTS, 37_376);
    }

    #[test]
    fn refusals_only_config_can_fix_are_fatal() {
        assert!(fatal_close(4004).unwrap().contains("token"));
        assert!(fatal_close(4014).unwrap().contains("Message Content"));
        for code in [1000, 1006, 4000, 4007, 4009] {
            assert_eq!(fatal_close(code), None, "{code}");
        }
    }

    #[test]
    fn ready_carries_the_session_and_the_application() {
        let d = json!({
            "v": 10, "user": { "id": "55", "username": "lemon", "bot": true },
            "session_id": "abc", "resume_gateway_url": "wss://resume.example",
            "application": { "id": "77", "flags": 0 }, "guilds": []
        });
        assert_eq!(
            ready(&d),
            Some(GatewayEvent::Ready {
                user: User { id: Snowflake(55), username: "lemon".into(), bot: true },
                application_id: Some(Snowflake(77)),
                session_id: "abc".into(),
                resume_url: "wss://resume.example".into(),
            })
        );
        assert_eq!(ready(&json!({ "user": { "id": "1" } })), None);
    }
}
