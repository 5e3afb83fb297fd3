//! Deepgram live transcription over a WebSocket: the caller's μ-law audio goes
//! out as binary frames, transcripts come back as JSON. A `KeepAlive` goes out
//! while no audio flows; `CloseStream` ends the stream.

use std::time::Duration;

use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use serde::Deserialize;
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::Message;
use tokio_util::sync::CancellationToken;

use crate::config::VoiceConfig;

/// A quiet socket gets a `KeepAlive` this often (Deepgram closes after 10 s).
const KEEP_ALIVE_EVERY: Duration = Duration::from_secs(3);
/// How long the end of a stream waits for Deepgram's last results.
const CLOSE_WAIT: Duration = Duration::from_secs(2);
/// Frames of audio held for Deepgram; when full, audio is dropped (the read
/// loop of the media stream never waits).
pub(crate) const AUDIO_BUFFER: usize = 256;

/// What Deepgram tells a call.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Heard {
    /// A transcript of the audio so far; `is_final` ones are not revised.
    Transcript { text: String, is_final: bool, speech_final: bool },
    /// The caller stopped speaking (a gap in words).
    UtteranceEnd,
    /// Voice activity began (possibly noise).
    SpeechStarted,
}

#[derive(Debug, Deserialize)]
#[serde(tag = "type")]
enum ServerMessage {
    Results {
        #[serde(default)]
        is_final: bool,
        #[serde(default)]
        speech_final: bool,
        channel: Channel,
    },
    UtteranceEnd {},
    SpeechStarted {},
    #[serde(other)]
    Other,
}

#[derive(Debug, Deserialize)]
struct Channel {
    #[serde(default)]
    alternatives: Vec<Alternative>,
}

#[derive(Debug, Deserialize)]
struct Alternative {
    #[serde(default)]
    transcript: String,
}

/// Parses one server message; `None` for ones a call does not act on.
pub(crate) fn parse(text: &str) -> Option<Heard> {
    match serde_json::from_str::<ServerMessage>(text).ok()? {
        ServerMessage::Results { is_final, speech_final, channel } => {
            let text = channel.alternatives.into_iter().next().map(|a| a.transcript)?;
            Some(Heard::Transcript { text: text.trim().to_owned(), is_final, speech_final })
        }
        ServerMessage::UtteranceEnd {} => Some(Heard::UtteranceEnd),
        ServerMessage::SpeechStarted {} => Some(Heard::SpeechStarted),
        ServerMessage::Other => None,
    }
}

/// The `/v1/listen` URL for Twilio's audio.
pub(crate) fn listen_url(config: &VoiceConfig) -> String {
    format!(
        "{}/v1/listen?encoding=mulaw&sample_rate=8000&channels=1&model={}&interim_results=true&endpointing={}&utterance_end_ms={}&vad_events=true&smart_format=true&punctuate=true",
        config.deepgram_base_url.trim_end_matches('/'),
        config.deepgram_model,
        config.deepgram_endpointing_ms,
        config.deepgram_utterance_end_ms,
    )
}

/// An open Deepgram stream: audio in, transcripts out. Dropping `audio` (or
/// cancelling `stop`) sends `CloseStream`, waits briefly for the last results
/// and closes the socket.
#[derive(Debug)]
pub(crate) struct Listener {
    pub(crate) audio: mpsc::Sender<Bytes>,
    pub(crate) heard: mpsc::Receiver<Heard>,
}

/// Why Deepgram could not be reached; never holds the key.
#[derive(Debug, thiserror::Error)]
#[error("Deepgram: {0}")]
pub(crate) struct ListenError(String);

/// Connects to Deepgram; the stream's task runs until the audio sender is
/// dropped, `stop` is cancelled or Deepgram closes.
pub(crate) async fn connect(
    url: &str,
    api_key: &str,
    stop: CancellationToken,
    tracker: &tokio_util::task::TaskTracker,
) -> Result<Listener, ListenError> {
    connect_with(url, api_key, stop, tracker, KEEP_ALIVE_EVERY).await
}

/// [`connect`] with `keep_alive` as the quiet time before a `KeepAlive`.
async fn connect_with(
    url: &str,
    api_key: &str,
    stop: CancellationToken,
    tracker: &tokio_util::task::TaskTracker,
    keep_alive: Duration,
) -> Result<Listener, ListenError> {
    let mut request =
        url.into_client_request().map_err(|e| ListenError(format!("bad URL: {e}")))?;
    let auth = HeaderValue::from_str(&format!("Token {api_key}"))
        .map_err(|_| ListenError("the API key is not a valid header value".into()))?;
    request.headers_mut().insert("authorization", auth);
    // Transcripts and audio are small frames that must not wait for Nagle.
    let connect = tokio_tungstenite::connect_async_with_config(request, None, true);
    let (socket, _) = tokio::time::timeout(Duration::from_secs(10), connect)
        .await
        .map_err(|_| ListenError("connecting timed out".into()))?
        .map_err(|e| ListenError(connect_error(&e)))?;
    let (audio_tx, audio_rx) = mpsc::channel(AUDIO_BUFFER);
    let (heard_tx, heard_rx) = mpsc::channel(64);
    tracker.spawn(pump(socket, audio_rx, heard_tx, stop, keep_alive));
    Ok(Listener { audio: audio_tx, heard: heard_rx })
}

fn connect_error(err: &tokio_tungstenite::tungstenite::Error) -> String {
    use tokio_tungstenite::tungstenite::Error;
    match err {
        Error::Http(response) => format!("refused with {}", response.status()),
        other => other.to_string(),
    }
}

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

async fn pump(
    socket: Socket,
    mut audio: mpsc::Receiver<Bytes>,
    heard: mpsc::Sender<Heard>,
    stop: CancellationToken,
    every: Duration,
) {
    let (mut sink, mut stream) = socket.split();
    let keep_alive = Message::text(r#"{"type":"KeepAlive"}"#);
    let mut quiet = Box::pin(tokio::time::sleep(every));
    loop {
        tokio::select! {
            () = stop.cancelled() => break,
            frame = audio.recv() => match frame {
                Some(frame) => {
                    if sink.send(Message::Binary(frame)).await.is_err() {
                        return;
                    }
                    quiet.as_mut().reset(tokio::time::Instant::now() + every);
                }
                None => break,
            },
            () = &mut quiet => {
                if sink.send(keep_alive.clone()).await.is_err() {
                    return;
                }
                quiet.as_mut().reset(tokio::time::Instant::now() + every);
            }
            message = stream.next() => match message {
                Some(Ok(Message::Text(text))) => {
                    if let Some(event) = parse(&text) {
                        if heard.send(event).await.is_err() {
                            break;
                        }
                    }
                }
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => return,
                Some(Ok(_)) => {}
            },
        }
    }
    // The end of the call: flush, then close.
    let _ = sink.send(Message::text(r#"{"type":"CloseStream"}"#)).await;
    let _ = tokio::time::timeout(CLOSE_WAIT, async {
        while let Some(Ok(message)) = stream.next().await {
            if matches!(message, Message::Close(_)) {
                break;
            }
        }
    })
    .await;
    let _ = sink.close().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_utterance_end_and_speech_started_parse_from_deepgram_json() {
        let results = r#"{"type":"Results","channel_index":[0,1],"duration":1.98,"start":5.99,"is_final":true,"speech_final":true,"from_finalize":false,"channel":{"alternatives":[{"transcript":" What time is it? ","confidence":0.99,"words":[]}]},"metadata":{"request_id":"x","model_info":{"name":"2-general-nova","version":"2024","arch":"nova-3"},"model_uuid":"y"}}"#;
        assert_eq!(
            parse(results),
            Some(Heard::Transcript {
                text: "What time is it?".into(),
                is_final: true,
                speech_final: true
            })
        );
        assert_eq!(
            parse(r#"{"type":"UtteranceEnd","channel":[0,1],"last_word_end":2.5}"#),
            Some(Heard::UtteranceEnd)
        );
        assert_eq!(
            parse(r#"{"type":"SpeechStarted","channel":[0,1],"timestamp":9.54}"#),
            Some(Heard::SpeechStarted)
        );
        assert_eq!(parse(r#"{"type":"Metadata","request_id":"x","duration":1.0}"#), None);
        assert_eq!(parse("not json"), None);
    }

    /// A socket the test serves: sends `said`, then passes on the
    /// `authorization` header it was opened with, every text frame it
    /// receives and the size of every audio frame.
    #[allow(clippy::result_large_err)] // tungstenite's handshake callback returns its own error type.
    async fn serve_one(
        listener: tokio::net::TcpListener,
        said: Vec<String>,
        got: mpsc::UnboundedSender<String>,
    ) {
        use tokio_tungstenite::tungstenite::handshake::server::{Request, Response};
        let (tcp, _) = listener.accept().await.unwrap();
        let auth = got.clone();
        let capture = move |request: &Request, response: Response| {
            let header = request.headers()["authorization"].to_str().unwrap().to_owned();
            auth.send(header).unwrap();
            Ok(response)
        };
        let mut socket = tokio_tungstenite::accept_hdr_async(tcp, capture).await.unwrap();
        for text in said {
            socket.send(Message::text(text)).await.unwrap();
        }
        while let Some(Ok(message)) = socket.next().await {
            match message {
                Message::Text(text) => got.send(text.to_string()).unwrap(),
                Message::Binary(bytes) => got.send(format!("{} audio bytes", bytes.len())).unwrap(),
                _ => {}
            }
        }
    }

    async fn next(got: &mut mpsc::UnboundedReceiver<String>) -> Option<String> {
        tokio::time::timeout(Duration::from_secs(10), got.recv()).await.unwrap()
    }

    #[tokio::test]
    async fn audio_goes_out_keep_alives_fill_the_quiet_and_the_end_closes_the_stream() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("ws://{}/v1/listen", listener.local_addr().unwrap());
        let said = vec![r#"{"type":"SpeechStarted","channel":[0,1],"timestamp":0.1}"#.to_owned()];
        let (got_tx, mut got) = mpsc::unbounded_channel();
        tokio::spawn(serve_one(listener, said, got_tx));
        let tracker = tokio_util::task::TaskTracker::new();
        let quiet = Duration::from_millis(30);
        let mut listener =
            connect_with(&url, "dg-key", CancellationToken::new(), &tracker, quiet).await.unwrap();
        assert_eq!(next(&mut got).await.as_deref(), Some("Token dg-key"));
        listener.audio.send(Bytes::from_static(&[0xFF; 160])).await.unwrap();
        assert_eq!(next(&mut got).await.as_deref(), Some("160 audio bytes"));
        let heard = tokio::time::timeout(Duration::from_secs(10), listener.heard.recv()).await;
        assert_eq!(heard.unwrap(), Some(Heard::SpeechStarted));
        // No audio for a while: a KeepAlive.
        assert_eq!(next(&mut got).await.as_deref(), Some(r#"{"type":"KeepAlive"}"#));
        // The call is over: CloseStream, however many KeepAlives came first.
        drop(listener);
        loop {
            match next(&mut got).await.as_deref() {
                Some(r#"{"type":"KeepAlive"}"#) => {}
                other => {
                    assert_eq!(other, Some(r#"{"type":"CloseStream"}"#));
                    break;
                }
            }
        }
    }

    #[test]
    fn the_listen_url_asks_for_mulaw_at_8khz_with_turn_events() {
        let url = listen_url(&VoiceConfig::default());
        assert!(
            url.starts_with(
                "wss://api.deepgram.com/v1/listen?encoding=mulaw&sample_rate=8000&channels=1"
            ),
            "{url}"
        );
        for part in
            ["interim_results=true", "utterance_end_ms=1000", "vad_events=true", "endpointing=300"]
        {
            assert!(url.contains(part), "{url}");
        }
    }
}
