//! The voice listener: Twilio's webhooks (signature-checked against
//! `public_url`) and the media-stream WebSocket, and [`VoiceTransport`], which
//! serves them as a transport.
//!
//! What a request may cost before it is trusted:
//! - a webhook without `X-Twilio-Signature` is a `403` with its body unread;
//!   one with a signature is read up to 64 KiB (a longer `Content-Length` is a
//!   `413` before reading), since the signature covers the form;
//! - a media-stream message is at most 64 KiB (Twilio's are under 1 KiB), and
//!   a stream without a valid one-time token is closed at its `start`;
//! - a caller not in `allowed_callers` (unless `allow_everyone`) is answered
//!   with a spoken refusal and `<Hangup/>`: no stream token, no Deepgram;
//! - one call (`CallSid`) gets one stream: a replay of its webhook while the
//!   stream has not connected gets the same answer (same token: Twilio
//!   retrying a lost answer still connects), and any later one an empty
//!   `<Response/>`; neither opens anything.

use std::collections::HashMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{RawQuery, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures::{SinkExt, StreamExt};
use lemon_core::ids::EngineRef;
use lemon_core::router::RouterHandle;
use lemon_core::transport::{Transport, TransportContext, TransportError};
use lemon_transports::refused::{Refusals, StoreNotice};
use serde_json::json;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::call::{Call, FromTwilio, Out};
use crate::calls::CallRecords;
use crate::config::{VoiceConfig, VoiceSecrets};
use crate::deepgram::{self, ListenError, Listener};
use crate::tts::Speaker;
use crate::twilio::{self, read_frame, Frame, TwilioRest};

/// How long a call's stream has to connect after its webhook.
const CONNECT_WITHIN: Duration = Duration::from_secs(30);
/// Messages queued for Twilio per call.
const OUT_BUFFER: usize = 1024;
/// Largest webhook body accepted.
const MAX_WEBHOOK_BYTES: usize = 64 * 1024;
/// Largest media-stream message accepted (Twilio's media frames are a few
/// hundred bytes; the default of the WebSocket library is 64 MiB).
const MAX_STREAM_MESSAGE_BYTES: usize = 64 * 1024;
/// What a caller who is not allowed hears before the gateway hangs up.
const REFUSAL_TWIML: &str = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Response>\n  <Say>Sorry, this number does not take calls from you. Goodbye.</Say>\n  <Hangup/>\n</Response>\n";

/// A call whose webhook was answered and whose stream has not started yet.
struct Pending {
    call_sid: String,
    from: String,
    /// The Deepgram connection, opened while Twilio connects the stream.
    listener: oneshot::Receiver<Result<Listener, ListenError>>,
    /// Ends the call's tasks (its Deepgram stream among them).
    token: CancellationToken,
}

/// What every handler and call shares.
pub(crate) struct Shared {
    pub(crate) config: VoiceConfig,
    pub(crate) router: RouterHandle,
    pub(crate) records: CallRecords,
    pub(crate) speaker: Speaker,
    /// Twilio's REST API, when the account SID and auth token are set.
    pub(crate) rest: Option<TwilioRest>,
    pub(crate) recordings: PathBuf,
    pub(crate) engine: Option<EngineRef>,
    pub(crate) tracker: TaskTracker,
    pub(crate) shutdown: CancellationToken,
    auth_token: Option<String>,
    deepgram_key: String,
    /// Per-call one-time token → the call waiting for its stream, and the
    /// calls answered lately; one lock, so a call is answered once.
    pending: Mutex<Answered>,
    /// Callers told that the store cannot save what they say, told once
    /// each; a later turn hears [`lemon_transports::refused::STILL_FAILING`].
    pub(crate) refusals: Refusals,
}

/// The calls the incoming-call webhook answered, in memory. The call records
/// in the store remember every call for good; this covers the moment between
/// reading them and writing a new call's.
#[derive(Default)]
struct Answered {
    /// One-time token → the call waiting for its stream.
    by_token: HashMap<String, Pending>,
    /// CallSid → when its webhook was first answered; kept [`CONNECT_WITHIN`].
    recent: HashMap<String, tokio::time::Instant>,
}

/// How a call's incoming-call webhook was answered before.
enum Earlier {
    /// Its stream has not connected: the token it was given.
    Pending(String),
    /// Its stream connected, ended or never came.
    Done,
}

impl Answered {
    /// How `call_sid` was answered before, if it was.
    fn earlier(&mut self, call_sid: &str) -> Option<Earlier> {
        let now = tokio::time::Instant::now();
        self.recent.retain(|_, at| now.duration_since(*at) < CONNECT_WITHIN);
        if let Some((token, _)) = self.by_token.iter().find(|(_, p)| p.call_sid == call_sid) {
            return Some(Earlier::Pending(token.clone()));
        }
        self.recent.contains_key(call_sid).then_some(Earlier::Done)
    }

    /// Claims `call_sid` for a new stream: `None` when it is new, else how it
    /// was answered before.
    fn claim(&mut self, call_sid: &str) -> Option<Earlier> {
        let earlier = self.earlier(call_sid);
        if earlier.is_none() {
            self.recent.insert(call_sid.to_owned(), tokio::time::Instant::now());
        }
        earlier
    }
}

/// Everything the voice channel is built from.
#[derive(Clone)]
pub struct VoiceDeps {
    pub config: VoiceConfig,
    pub secrets: VoiceSecrets,
    /// `$LEMON_HOME/recordings`.
    pub recordings: PathBuf,
    /// Set when a `voice` binding chooses the engine: calls then name none.
    pub bound_engine: bool,
}

impl fmt::Debug for VoiceDeps {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VoiceDeps")
            .field("config", &self.config)
            .field("recordings", &self.recordings)
            .finish_non_exhaustive()
    }
}

/// The voice channel as a transport: it binds its listener when started.
#[derive(Debug)]
pub struct VoiceTransport {
    deps: VoiceDeps,
}

impl VoiceTransport {
    pub fn new(deps: VoiceDeps) -> Self {
        VoiceTransport { deps }
    }
}

fn shared(deps: &VoiceDeps, ctx: &TransportContext) -> Shared {
    let http = reqwest::Client::builder()
        .tcp_nodelay(true)
        .connect_timeout(Duration::from_secs(10))
        .build()
        .unwrap_or_default();
    let secrets = &deps.secrets;
    let rest = match (&secrets.twilio_account_sid, &secrets.twilio_auth_token) {
        (Some(sid), Some(token)) => Some(TwilioRest {
            http: http.clone(),
            base_url: deps.config.twilio_api_base_url.trim_end_matches('/').to_owned(),
            account_sid: sid.clone(),
            auth_token: token.clone(),
        }),
        _ => None,
    };
    Shared {
        speaker: Speaker::new(&deps.config, secrets.elevenlabs_api_key.clone(), http),
        config: deps.config.clone(),
        router: ctx.router.clone(),
        records: CallRecords::new(ctx.store.clone()),
        rest,
        recordings: deps.recordings.clone(),
        engine: if deps.bound_engine { None } else { deps.config.engine.clone() },
        tracker: ctx.tracker.clone(),
        shutdown: ctx.shutdown.clone(),
        auth_token: secrets.twilio_auth_token.clone(),
        deepgram_key: secrets.deepgram_api_key.clone(),
        pending: Mutex::new(Answered::default()),
        refusals: Refusals::new(StoreNotice::SendAgain),
    }
}

#[async_trait::async_trait]
impl Transport for VoiceTransport {
    fn id(&self) -> &str {
        crate::TRANSPORT_ID
    }

    async fn run(&self, ctx: TransportContext) -> Result<(), TransportError> {
        let addr = self.deps.config.addr();
        let listener = lemon_api::http::bind(&addr)
            .await
            .map_err(|e| TransportError::retryable(format!("could not listen on {addr}: {e}")))?;
        let local = listener
            .local_addr()
            .map_err(|e| TransportError::retryable(format!("could not listen on {addr}: {e}")))?;
        let shared = Arc::new(shared(&self.deps, &ctx));
        if shared.rest.is_none() {
            tracing::info!("voice: no twilio_account_sid set; calls are hung up by closing the stream and not recorded");
        }
        let callers = self.deps.config.callers_summary();
        ctx.status.running(Some(format!("{local}; {callers}")));
        tracing::info!(voice_addr = %local, public_url = %self.deps.config.public_base(), "voice calls listening");
        if self.deps.config.allow_everyone {
            tracing::warn!(
                "voice: allow_everyone = true: anyone who dials the number talks to the agent; list callers in allowed_callers instead"
            );
        } else if self.deps.config.allowed_callers.is_empty() {
            tracing::warn!(
                "voice: allowed_callers is empty: every call is refused; list the callers' numbers (E.164) in [gateway.voice] allowed_callers"
            );
        }
        let app = router(shared.clone());
        let shutdown = ctx.shutdown.clone();
        // The shared server: request-head and idle timeouts and the
        // connection cap as on every listener; the media stream is an upgrade.
        let served = lemon_api::serve_with(listener, app, shutdown, ctx.http.clone()).await;
        served.map_err(|e| TransportError::retryable(format!("voice on {local} stopped: {e}")))
    }
}

/// The voice routes.
pub(crate) fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/webhooks/twilio/voice", post(incoming_call))
        .route("/webhooks/twilio/voice/status", post(call_status))
        .route("/webhooks/twilio/voice/recording", post(recording_status))
        .route("/webhooks/twilio/voice/stream", get(media_stream))
        .method_not_allowed_fallback(lemon_api::error::method_not_allowed)
        .fallback(lemon_api::error::not_found)
        .with_state(shared)
}

fn error(status: StatusCode, message: &str) -> Response {
    (status, Json(json!({ "error": message }))).into_response()
}

fn twiml(body: String) -> Response {
    ([(header::CONTENT_TYPE, "application/xml")], body).into_response()
}

/// The form parameters of a webhook whose signature holds (or is not
/// required). The signature header is required before the body is read, and
/// the body is read up to [`MAX_WEBHOOK_BYTES`].
async fn verified_form(
    shared: &Shared,
    path: &str,
    query: Option<&str>,
    headers: &HeaderMap,
    body: Body,
) -> Result<Vec<(String, String)>, Response> {
    let signature = headers
        .get(lemon_sms::signature::SIGNATURE_HEADER)
        .and_then(|value| value.to_str().ok())
        .filter(|value| !value.trim().is_empty());
    let token = match (shared.config.validate_webhook, shared.auth_token.as_deref(), signature) {
        (false, _, _) => None,
        (true, None, _) => {
            return Err(error(StatusCode::FORBIDDEN, "webhook signatures cannot be checked"))
        }
        (true, Some(_), None) => {
            tracing::warn!(path, "voice webhook without a Twilio signature refused");
            return Err(error(StatusCode::FORBIDDEN, "invalid Twilio signature"));
        }
        (true, Some(token), Some(signature)) => Some((token, signature)),
    };
    let body = lemon_api::error::read_body(headers, body, MAX_WEBHOOK_BYTES)
        .await
        .map_err(IntoResponse::into_response)?;
    let params: Vec<(String, String)> = serde_urlencoded::from_bytes(&body)
        .map_err(|_| error(StatusCode::BAD_REQUEST, "the body is not a form"))?;
    let Some((token, signature)) = token else {
        return Ok(params);
    };
    // The URL Twilio called, as configured: never the Host header.
    let mut url = format!("{}{path}", shared.config.public_base());
    if let Some(query) = query.filter(|q| !q.is_empty()) {
        url.push('?');
        url.push_str(query);
    }
    if !lemon_sms::signature::validate_form(token, &url, &params, signature) {
        tracing::warn!(path, "voice webhook with a missing or wrong Twilio signature refused");
        return Err(error(StatusCode::FORBIDDEN, "invalid Twilio signature"));
    }
    Ok(params)
}

fn param<'a>(params: &'a [(String, String)], name: &str) -> Option<&'a str> {
    params.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
}

/// `POST /webhooks/twilio/voice`: a call came in. Answers `<Connect><Stream>`
/// with a one-time token and opens the call's Deepgram stream meanwhile.
async fn incoming_call(
    State(shared): State<Arc<Shared>>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let path = "/webhooks/twilio/voice";
    let params = match verified_form(&shared, path, query.as_deref(), &headers, body).await {
        Ok(params) => params,
        Err(refused) => return refused,
    };
    let call_sid = param(&params, "CallSid").unwrap_or("");
    if !twilio::is_sid(call_sid, "CA") {
        return error(StatusCode::BAD_REQUEST, "CallSid is missing or not a call SID");
    }
    let from = param(&params, "From").unwrap_or("");
    if !twilio::is_phone_number(from) {
        return error(StatusCode::BAD_REQUEST, "From is not an E.164 phone number");
    }
    let to = param(&params, "To").unwrap_or("").to_owned();
    if !shared.config.allows_caller(from) {
        tracing::warn!(
            call = %call_sid,
            caller = %lemon_core::log_text::escape(from),
            "call refused: the caller is not in [gateway.voice] allowed_callers"
        );
        return twiml(REFUSAL_TWIML.to_owned());
    }
    // A call answered before opens nothing: its webhook repeated while the
    // stream has not connected gets the same answer, any later one (also
    // after a restart: the call records are in the store) an empty one.
    let earlier =
        shared.pending.lock().unwrap_or_else(std::sync::PoisonError::into_inner).earlier(call_sid);
    if let Some(earlier) = earlier {
        return replayed(&shared, call_sid, earlier);
    }
    if shared.records.get(call_sid).await.is_some() {
        return replayed(&shared, call_sid, Earlier::Done);
    }
    let token = format!("{}{}", uuid::Uuid::new_v4().simple(), uuid::Uuid::new_v4().simple());
    let call_token = shared.shutdown.child_token();
    let (listener_tx, listener_rx) = oneshot::channel();
    {
        let mut answered = shared.pending.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(earlier) = answered.claim(call_sid) {
            drop(answered);
            return replayed(&shared, call_sid, earlier);
        }
        let pending = Pending {
            call_sid: call_sid.to_owned(),
            from: from.to_owned(),
            listener: listener_rx,
            token: call_token.clone(),
        };
        answered.by_token.insert(token.clone(), pending);
    }
    {
        let url = deepgram::listen_url(&shared.config);
        let key = shared.deepgram_key.clone();
        let stop = call_token.clone();
        let tracker = shared.tracker.clone();
        shared.tracker.spawn(async move {
            let connected = deepgram::connect(&url, &key, stop, &tracker).await;
            let _ = listener_tx.send(connected);
        });
    }
    // A stream that never connects gives its place (and its Deepgram stream) up.
    {
        let shared2 = shared.clone();
        let token = token.clone();
        shared.tracker.spawn(async move {
            tokio::select! {
                () = tokio::time::sleep(CONNECT_WITHIN) => {}
                () = shared2.shutdown.cancelled() => {}
            }
            let left = shared2
                .pending
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .by_token
                .remove(&token);
            if let Some(pending) = left {
                tracing::warn!(call = %pending.call_sid, "the call's media stream never started");
                pending.token.cancel();
            }
        });
    }
    let (call_sid, from) = (call_sid.to_owned(), from.to_owned());
    shared
        .records
        .update(&call_sid, |record| {
            record.insert("id".into(), json!(call_sid));
            record.insert("from".into(), json!(from));
            record.insert("to".into(), json!(to));
            record.insert("status".into(), json!("connecting"));
            record.insert("started_at_ms".into(), json!(lemon_core::clock::now_ms()));
            record.insert("turns".into(), json!([]));
            record.insert("recording".into(), json!(null));
        })
        .await;
    tracing::info!(call = %call_sid, "incoming call");
    twiml(twilio::connect_stream(&twilio::stream_url(&shared.config.public_base()), &token))
}

/// The answer to an incoming-call webhook for a call answered before: the
/// same TwiML while its stream has not connected (Twilio retrying an answer
/// it lost still connects), else an empty `<Response/>`. Nothing is opened.
fn replayed(shared: &Shared, call_sid: &str, earlier: Earlier) -> Response {
    match earlier {
        Earlier::Pending(token) => {
            tracing::info!(call = %call_sid, "incoming-call webhook repeated; same answer");
            let url = twilio::stream_url(&shared.config.public_base());
            twiml(twilio::connect_stream(&url, &token))
        }
        Earlier::Done => {
            tracing::warn!(call = %call_sid, "incoming-call webhook replayed for a call already answered; nothing opened");
            twiml(twilio::EMPTY_TWIML.to_owned())
        }
    }
}

/// `POST /webhooks/twilio/voice/status`: the call's progress.
async fn call_status(
    State(shared): State<Arc<Shared>>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let path = "/webhooks/twilio/voice/status";
    let params = match verified_form(&shared, path, query.as_deref(), &headers, body).await {
        Ok(params) => params,
        Err(refused) => return refused,
    };
    let call_sid = param(&params, "CallSid").unwrap_or("");
    if !twilio::is_sid(call_sid, "CA") {
        return error(StatusCode::BAD_REQUEST, "CallSid is missing or not a call SID");
    }
    let status = param(&params, "CallStatus").unwrap_or("").to_owned();
    if !status.bytes().all(|b| b.is_ascii_lowercase() || b == b'-') {
        return error(StatusCode::BAD_REQUEST, "CallStatus is not a call status");
    }
    tracing::info!(call = %call_sid, status = %status, "call status");
    if shared.records.get(call_sid).await.is_some() {
        shared
            .records
            .update(call_sid, |record| {
                record.insert("twilio_status".into(), json!(status));
            })
            .await;
    }
    twiml(twilio::EMPTY_TWIML.to_owned())
}

/// `POST /webhooks/twilio/voice/recording`: a recording is ready; it is
/// downloaded in the background.
async fn recording_status(
    State(shared): State<Arc<Shared>>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let path = "/webhooks/twilio/voice/recording";
    let params = match verified_form(&shared, path, query.as_deref(), &headers, body).await {
        Ok(params) => params,
        Err(refused) => return refused,
    };
    let call_sid = param(&params, "CallSid").unwrap_or("").to_owned();
    let recording_sid = param(&params, "RecordingSid").unwrap_or("").to_owned();
    if !twilio::is_sid(&call_sid, "CA") || !twilio::is_sid(&recording_sid, "RE") {
        return error(StatusCode::BAD_REQUEST, "CallSid or RecordingSid is missing or malformed");
    }
    if param(&params, "RecordingStatus") != Some("completed") {
        return twiml(twilio::EMPTY_TWIML.to_owned());
    }
    let Some(rest) = shared.rest.clone() else {
        tracing::warn!(call = %call_sid, "a recording is ready but twilio_account_sid is not set");
        return twiml(twilio::EMPTY_TWIML.to_owned());
    };
    let date = chrono::Utc::now().format("%Y-%m-%d").to_string();
    let shared2 = shared.clone();
    shared.tracker.spawn(async move {
        let saved = crate::recording::download_and_save(
            &rest,
            &shared2.recordings,
            &call_sid,
            &recording_sid,
            &date,
            &shared2.shutdown,
        )
        .await;
        match saved {
            Ok(path) => {
                tracing::info!(call = %call_sid, path = %path.display(), "recording saved");
                shared2
                    .records
                    .update(&call_sid, |record| {
                        record.insert(
                            "recording".into(),
                            json!({ "sid": recording_sid, "path": path.display().to_string() }),
                        );
                    })
                    .await;
            }
            Err(error) => {
                tracing::warn!(call = %call_sid, %error, "recording not saved");
                shared2
                    .records
                    .update(&call_sid, |record| {
                        record.insert(
                            "recording".into(),
                            json!({ "sid": recording_sid, "path": null, "error": error.to_string() }),
                        );
                    })
                    .await;
            }
        }
    });
    twiml(twilio::EMPTY_TWIML.to_owned())
}

/// `GET /webhooks/twilio/voice/stream`: the media stream.
async fn media_stream(State(shared): State<Arc<Shared>>, ws: WebSocketUpgrade) -> Response {
    ws.max_message_size(MAX_STREAM_MESSAGE_BYTES)
        .max_frame_size(MAX_STREAM_MESSAGE_BYTES)
        .on_upgrade(move |socket| serve_stream(shared, socket))
}

async fn serve_stream(shared: Arc<Shared>, socket: WebSocket) {
    let (mut sink, mut stream) = socket.split();
    let (out_tx, mut out_rx) = mpsc::channel::<Out>(OUT_BUFFER);
    let writer = shared.tracker.spawn(async move {
        while let Some(out) = out_rx.recv().await {
            let sent = match out {
                Out::Text(text) => sink.send(Message::Text(text.into())).await,
                Out::Close => {
                    let _ = sink.close().await;
                    break;
                }
            };
            if sent.is_err() {
                break;
            }
        }
    });
    // `connected`, then `start` with the call's token.
    let start = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(Ok(message)) = stream.next().await {
            let Message::Text(text) = message else { continue };
            match read_frame(&text) {
                start @ Frame::Start { .. } => return Some(start),
                Frame::Undecodable => tracing::debug!("undecodable media-stream message ignored"),
                _ => {}
            }
        }
        None
    })
    .await
    .ok()
    .flatten();
    let Some(Frame::Start { stream_sid, call_sid, token }) = start else {
        let _ = out_tx.send(Out::Close).await;
        return;
    };
    let token = token.unwrap_or_default();
    let pending = shared
        .pending
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .by_token
        .remove(&token);
    let Some(pending) = pending.filter(|p| call_sid.is_empty() || p.call_sid == call_sid) else {
        tracing::warn!("a media stream without a valid call token was refused");
        let _ = out_tx.send(Out::Close).await;
        return;
    };
    let listener = match tokio::time::timeout(Duration::from_secs(10), pending.listener).await {
        Ok(Ok(Ok(listener))) => listener,
        Ok(Ok(Err(error))) => {
            tracing::warn!(call = %pending.call_sid, %error, "no transcription; ending the call");
            pending.token.cancel();
            let _ = out_tx.send(Out::Close).await;
            return;
        }
        _ => {
            tracing::warn!(call = %pending.call_sid, "Deepgram did not connect in time; ending the call");
            pending.token.cancel();
            let _ = out_tx.send(Out::Close).await;
            return;
        }
    };
    let Listener { audio, heard } = listener;
    let (twilio_tx, twilio_rx) = mpsc::channel(64);
    let call = Call {
        shared: shared.clone(),
        call_sid: pending.call_sid.clone(),
        from: pending.from.clone(),
        stream_sid,
        out: out_tx.clone(),
        heard,
        twilio: twilio_rx,
        token: pending.token.clone(),
    };
    shared.tracker.spawn(call.run());
    // The read loop never waits on the call: audio that Deepgram cannot take
    // in time is dropped.
    let mut dropped: u64 = 0;
    loop {
        let message = tokio::select! {
            () = pending.token.cancelled() => break,
            message = stream.next() => message,
        };
        let Some(Ok(message)) = message else {
            let _ = twilio_tx.send(FromTwilio::Stop).await;
            break;
        };
        let text = match message {
            Message::Text(text) => text,
            Message::Close(_) => {
                let _ = twilio_tx.send(FromTwilio::Stop).await;
                break;
            }
            _ => continue,
        };
        match read_frame(&text) {
            Frame::Audio(bytes) => {
                if audio.try_send(bytes.into()).is_err() {
                    dropped += 1;
                }
            }
            Frame::Mark(name) => {
                let _ = twilio_tx.send(FromTwilio::Mark(name)).await;
            }
            Frame::Stop => {
                let _ = twilio_tx.send(FromTwilio::Stop).await;
                break;
            }
            Frame::Undecodable => tracing::debug!("undecodable media-stream message ignored"),
            Frame::Start { .. } | Frame::DroppedMedia | Frame::Other => {}
        }
    }
    if dropped > 0 {
        tracing::warn!(call = %pending.call_sid, dropped, "audio frames dropped: transcription fell behind");
    }
    // Dropping the audio sender ends the Deepgram stream (CloseStream).
    drop(audio);
    drop(twilio_tx);
    pending.token.cancelled().await;
    let _ = writer.await;
}
