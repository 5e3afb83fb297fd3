//! A fake ElevenLabs streaming text-to-speech server on loopback:
//! `POST /v1/text-to-speech/{voice_id}/stream?output_format=ulaw_8000` with
//! `xi-api-key` answers a 440 Hz tone as raw μ-law (8 kHz), `TONE_MS` long,
//! streamed in two chunks. It records every text it was asked to speak.

use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use serde::Deserialize;

/// How long each spoken text sounds.
pub const TONE_MS: usize = 200;
/// μ-law bytes per spoken text (8 bytes a millisecond).
pub const TONE_BYTES: usize = TONE_MS * 8;

/// One request the fake received.
#[derive(Debug, Clone)]
pub struct Spoken {
    pub voice_id: String,
    pub text: String,
    pub model_id: Option<String>,
    pub query: String,
}

#[derive(Debug)]
struct Inner {
    key: String,
    spoken: Mutex<Vec<Spoken>>,
}

/// The running fake.
#[derive(Debug, Clone)]
pub struct FakeElevenLabs {
    /// `http://127.0.0.1:<port>`, for `elevenlabs_base_url`.
    pub base_url: String,
    inner: Arc<Inner>,
}

#[derive(Deserialize)]
struct SpeakBody {
    text: String,
    #[serde(default)]
    model_id: Option<String>,
}

impl FakeElevenLabs {
    /// Starts the fake accepting `key`.
    pub async fn start(key: &str) -> FakeElevenLabs {
        let inner = Arc::new(Inner { key: key.to_owned(), spoken: Mutex::new(Vec::new()) });
        let app = Router::new()
            .route("/v1/text-to-speech/{voice_id}/stream", post(speak))
            .with_state(inner.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let listener =
            axum::serve::ListenerExt::tap_io(listener, |tcp: &mut tokio::net::TcpStream| {
                let _ = tcp.set_nodelay(true);
            });
        tokio::spawn(async move { axum::serve(listener, app).await });
        FakeElevenLabs { base_url: format!("http://{addr}"), inner }
    }

    /// Every text it was asked to speak, in order.
    pub fn spoken(&self) -> Vec<Spoken> {
        self.inner.spoken.lock().unwrap().clone()
    }
}

/// The tone every text is spoken as: 440 Hz at half scale, μ-law encoded.
pub fn tone() -> Vec<u8> {
    (0..TONE_BYTES)
        .map(|n| {
            let t = n as f64 / 8000.0;
            let sample = (16000.0 * (2.0 * std::f64::consts::PI * 440.0 * t).sin()) as i16;
            crate::fake_twilio_voice::ulaw_encode(sample)
        })
        .collect()
}

async fn speak(
    State(inner): State<Arc<Inner>>,
    Path(voice_id): Path<String>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    Json(body): Json<SpeakBody>,
) -> Response {
    if headers.get("xi-api-key").and_then(|v| v.to_str().ok()) != Some(inner.key.as_str()) {
        return (StatusCode::UNAUTHORIZED, Json(serde_json::json!({"detail": "invalid_api_key"})))
            .into_response();
    }
    inner.spoken.lock().unwrap().push(Spoken {
        voice_id,
        text: body.text,
        model_id: body.model_id,
        query: query.unwrap_or_default(),
    });
    let audio = tone();
    let (first, second) = audio.split_at(audio.len() / 2);
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
        vec![Ok(first.to_vec()), Ok(second.to_vec())];
    let body = Body::from_stream(futures::stream::iter(chunks));
    ([("content-type", "audio/basic")], body).into_response()
}
