//! The shared media pieces against small servers on loopback: capped
//! downloads (refused by length, stopped mid-body, private addresses,
//! redirects and credentials), staging, and both transcription APIs.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{RawQuery, State};
use axum::http::{header, HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use lemon_core::media::{AttachmentKind, FilesConfig, MediaRefusal, MediaStage};
use lemon_core::secrets::{SecretStore, SecretValue};
use serde_json::json;

use super::*;

/// What a test server saw: each request's path and `Authorization`.
type Seen = Arc<Mutex<Vec<(String, Option<String>)>>>;

const PNG: &[u8] = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR fake image bytes";

async fn serve(app: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}")
}

fn record(seen: &Seen, uri: &Uri, headers: &HeaderMap) {
    let auth = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).map(str::to_owned);
    seen.lock().unwrap().push((uri.path().to_owned(), auth));
}

/// A file server: `/image.png`, `/report.pdf`, `/declared-huge` (a
/// `Content-Length` of 1 GB and a body that never comes), `/endless` (64 KiB
/// chunks forever, no length), `/missing` (404), `/to/<url>` (a redirect).
async fn file_server(seen: Seen) -> String {
    async fn image(State(seen): State<Seen>, uri: Uri, headers: HeaderMap) -> Response {
        record(&seen, &uri, &headers);
        ([(header::CONTENT_TYPE, "image/png")], PNG).into_response()
    }
    async fn report(State(seen): State<Seen>, uri: Uri, headers: HeaderMap) -> Response {
        record(&seen, &uri, &headers);
        ([(header::CONTENT_TYPE, "application/pdf; x=1")], b"%PDF-1.4 report".as_slice())
            .into_response()
    }
    async fn declared_huge() -> Response {
        let body = Body::from_stream(futures::stream::pending::<Result<Bytes, std::io::Error>>());
        Response::builder().header(header::CONTENT_LENGTH, "1000000000").body(body).unwrap()
    }
    async fn endless() -> Response {
        let chunk = Bytes::from(vec![7u8; 64 * 1024]);
        let stream = futures::stream::repeat_with(move || Ok::<_, std::io::Error>(chunk.clone()));
        Response::new(Body::from_stream(stream))
    }
    async fn redirect(State(seen): State<Seen>, uri: Uri, headers: HeaderMap) -> Response {
        record(&seen, &uri, &headers);
        let target = uri.query().unwrap_or_default().trim_start_matches("to=").to_owned();
        (StatusCode::FOUND, [(header::LOCATION, target)]).into_response()
    }
    let app = Router::new()
        .route("/image.png", get(image))
        .route("/report.pdf", get(report))
        .route("/declared-huge", get(declared_huge))
        .route("/endless", get(endless))
        .route("/redirect", get(redirect))
        .with_state(seen);
    serve(app).await
}

fn files(max: u64) -> FilesConfig {
    FilesConfig { max_download_bytes: max, ..FilesConfig::default() }
}

#[tokio::test]
async fn a_file_is_fetched_and_staged_with_its_served_type() {
    let seen = Seen::default();
    let base = file_server(seen.clone()).await;
    let dir = tempfile::tempdir().unwrap();
    let stage = MediaStage::new(dir.path().join("stage"));
    let fetcher = Fetcher::new(true);
    let url = format!("{base}/report.pdf");
    let file = RemoteFile {
        url: &url,
        name: Some("q3 report.pdf"),
        fallback: "file",
        mime: None,
        size: Some(15),
    };
    let kept = fetch_and_keep(&fetcher, &stage, &files(1024), file, None).await.unwrap();
    assert_eq!(kept.name, "q3 report.pdf");
    assert_eq!(kept.mime, "application/pdf");
    assert_eq!(kept.kind, AttachmentKind::File);
    assert_eq!(std::fs::read(&kept.path).unwrap(), b"%PDF-1.4 report");
    assert!(kept.path.starts_with(dir.path().join("stage")));

    let url = format!("{base}/image.png");
    let image = RemoteFile {
        url: &url,
        name: None,
        fallback: "photo-1.png",
        mime: Some("image/png"),
        size: None,
    };
    let kept = fetch_and_keep(&fetcher, &stage, &files(1024), image, None).await.unwrap();
    assert_eq!((kept.kind, kept.name.as_str()), (AttachmentKind::Image, "photo-1.png"));
}

#[tokio::test]
async fn hostile_names_denied_names_and_announced_sizes_are_refused_before_fetching() {
    let seen = Seen::default();
    let base = file_server(seen.clone()).await;
    let dir = tempfile::tempdir().unwrap();
    let stage = MediaStage::new(dir.path().join("stage"));
    let fetcher = Fetcher::new(true);
    let url = format!("{base}/report.pdf");
    let remote =
        |name, size| RemoteFile { url: &url, name: Some(name), fallback: "f", mime: None, size };
    let err = fetch_and_keep(&fetcher, &stage, &files(1024), remote("../../.bashrc", None), None)
        .await
        .unwrap_err();
    assert!(matches!(err, MediaRefusal::BadName { .. }), "{err}");
    assert!(err.to_string().contains("../../.bashrc"), "{err}");
    let err = fetch_and_keep(&fetcher, &stage, &files(1024), remote("server.pem", None), None)
        .await
        .unwrap_err();
    assert!(matches!(err, MediaRefusal::Denied { .. }), "{err}");
    let err = fetch_and_keep(&fetcher, &stage, &files(1024), remote("big.pdf", Some(4096)), None)
        .await
        .unwrap_err();
    assert_eq!(err.to_string(), "big.pdf is 4 KB — the limit is 1 KB");
    assert!(seen.lock().unwrap().is_empty(), "nothing was fetched");
    assert!(!dir.path().join("stage").exists(), "nothing was staged");
}

#[tokio::test]
async fn a_length_over_the_limit_is_refused_without_reading_and_an_endless_body_stops() {
    let base = file_server(Seen::default()).await;
    let fetcher = Fetcher::new(true).with_timeout(Duration::from_secs(30));
    // The body never comes: only its Content-Length can have refused it.
    let err =
        fetcher.fetch(&format!("{base}/declared-huge"), "huge.bin", 1024, None).await.unwrap_err();
    assert_eq!(
        err,
        MediaRefusal::TooLarge { name: "huge.bin".into(), bytes: 1_000_000_000, max: 1024 }
    );
    let max = 200 * 1024;
    let err =
        fetcher.fetch(&format!("{base}/endless"), "endless.bin", max, None).await.unwrap_err();
    let MediaRefusal::TooLarge { bytes, max: limit, .. } = err else { panic!("{err:?}") };
    assert_eq!(limit, max);
    assert!(
        bytes > max && bytes <= max + 64 * 1024 * 2,
        "stopped at the chunk past the limit: {bytes}"
    );
}

#[tokio::test]
async fn private_addresses_are_refused_unless_allowed() {
    let base = file_server(Seen::default()).await;
    let url = format!("{base}/image.png");
    let err = Fetcher::new(false).fetch(&url, "image.png", 1024, None).await.unwrap_err();
    assert!(err.to_string().contains("127.0.0.1 is a private or loopback address"), "{err}");
    let err = Fetcher::new(false)
        .fetch("http://localhost:9/x.png", "x.png", 1024, None)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("localhost is this machine"), "{err}");
    for bad in ["ftp://example.com/x", "not a url", "http://user:pw@example.com/x"] {
        let err = Fetcher::new(true).fetch(bad, "x", 1024, None).await.unwrap_err();
        assert!(matches!(err, MediaRefusal::Fetch(_)), "{bad}: {err}");
        assert!(!err.to_string().contains("pw"), "{err}");
    }
    assert!(Fetcher::new(true).fetch(&url, "image.png", 1024, None).await.is_ok());
}

#[tokio::test]
async fn credentials_go_to_the_urls_own_origin_and_not_through_a_redirect_elsewhere() {
    let (first_seen, cdn_seen) = (Seen::default(), Seen::default());
    let first = file_server(first_seen.clone()).await;
    let cdn = file_server(cdn_seen.clone()).await;
    let auth = BasicAuth { user: "AC123".into(), password: SecretValue::new("tw-secret") };
    let fetcher = Fetcher::new(true);
    // A redirect to another origin (another port is another origin).
    let url = format!("{first}/redirect?to={cdn}/image.png");
    let got = fetcher.fetch(&url, "media", 1024, Some(&auth)).await.unwrap();
    assert_eq!(got.bytes, PNG);
    assert_eq!(got.content_type.as_deref(), Some("image/png"));
    let expected = format!("Basic {}", base64_encode("AC123:tw-secret"));
    assert_eq!(first_seen.lock().unwrap()[0].1.as_deref(), Some(expected.as_str()));
    assert_eq!(cdn_seen.lock().unwrap()[0], ("/image.png".to_owned(), None));
    // A redirect within the origin keeps them.
    let url = format!("{first}/redirect?to=/report.pdf");
    fetcher.fetch(&url, "media", 1024, Some(&auth)).await.unwrap();
    assert_eq!(first_seen.lock().unwrap()[2].1.as_deref(), Some(expected.as_str()));
    assert!(format!("{auth:?}").find("tw-secret").is_none());
}

#[tokio::test]
async fn an_error_status_and_a_dead_host_say_what_happened_without_the_url() {
    let base = file_server(Seen::default()).await;
    let fetcher = Fetcher::new(true);
    let err =
        fetcher.fetch(&format!("{base}/missing?token=abc"), "x", 1024, None).await.unwrap_err();
    assert_eq!(err.to_string(), "the file could not be fetched: 127.0.0.1 answered 404 Not Found");
    let err = fetcher.fetch("http://127.0.0.1:9/x?token=abc", "x", 1024, None).await.unwrap_err();
    assert!(err.to_string().contains("127.0.0.1 could not be reached"), "{err}");
    assert!(!err.to_string().contains("token"), "{err}");
}

fn base64_encode(text: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(text)
}

#[test]
fn refusals_read_as_one_reply() {
    assert_eq!(refusals_text(&[]), None);
    let one = MediaRefusal::Disabled;
    assert_eq!(
        refusals_text(std::slice::from_ref(&one)).as_deref(),
        Some("files are not accepted here")
    );
    let two = refusals_text(&[one, MediaRefusal::UserNotAllowed]).unwrap();
    assert_eq!(two, "- files are not accepted here\n- you may not send files here");
    assert_eq!(heard("fix the build"), "heard: fix the build");
}

#[test]
fn local_urls_are_told_from_public_ones() {
    for local in
        ["http://127.0.0.1:9/api", "http://[::1]:80/", "http://localhost/x", "http://10.1.2.3"]
    {
        assert!(is_local_url(local), "{local}");
    }
    for public in [
        "https://discord.com/api/v10",
        "https://api.twilio.com",
        "http://93.184.216.34/",
        "not a url",
    ] {
        assert!(!is_local_url(public), "{public}");
    }
}

/// A transcription service: what it received, and what it answers.
#[derive(Debug, Default)]
struct Heard {
    path: String,
    query: String,
    auth: String,
    content_type: String,
    body: Vec<u8>,
}

#[derive(Clone)]
struct Service {
    heard: Arc<Mutex<Vec<Heard>>>,
    answer: Arc<Mutex<(StatusCode, serde_json::Value)>>,
}

async fn transcription_service(answer: (StatusCode, serde_json::Value)) -> (String, Service) {
    async fn take(
        State(service): State<Service>,
        uri: Uri,
        RawQuery(query): RawQuery,
        headers: HeaderMap,
        body: Bytes,
    ) -> Response {
        let text = |name| headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
        service.heard.lock().unwrap().push(Heard {
            path: uri.path().to_owned(),
            query: query.unwrap_or_default(),
            auth: text(header::AUTHORIZATION),
            content_type: text(header::CONTENT_TYPE),
            body: body.to_vec(),
        });
        let (status, value) = service.answer.lock().unwrap().clone();
        (status, axum::Json(value)).into_response()
    }
    let service = Service { heard: Arc::default(), answer: Arc::new(Mutex::new(answer)) };
    let app = Router::new()
        .route("/v1/audio/transcriptions", post(take))
        .route("/v1/listen", post(take))
        .with_state(service.clone());
    (serve(app).await, service)
}

fn settings(provider: TranscriptionProvider, base_url: String) -> TranscriberSettings {
    TranscriberSettings {
        provider,
        base_url,
        model: "test-model".into(),
        api_key: SecretValue::new("sk-test-key-123"),
        max_bytes: 1024,
        max_seconds: 60,
        timeout: Duration::from_secs(30),
    }
}

const OGG: &[u8] = b"OggS\0\x02fake opus voice";

fn note(audio: &[u8]) -> transcribe::VoiceNote<'_> {
    transcribe::VoiceNote {
        audio,
        file_name: "voice-message.ogg",
        mime: "audio/ogg",
        seconds: Some(3.2),
    }
}

#[tokio::test]
async fn openai_gets_a_multipart_upload_and_its_text_is_the_transcript() {
    let (base, service) =
        transcription_service((StatusCode::OK, json!({ "text": " deploy the site " }))).await;
    let transcriber =
        Transcriber::new(settings(TranscriptionProvider::OpenAi, format!("{base}/v1/"))).unwrap();
    assert_eq!(transcriber.transcribe(note(OGG)).await.unwrap(), "deploy the site");
    let heard = service.heard.lock().unwrap();
    let heard = &heard[0];
    assert_eq!(heard.path, "/v1/audio/transcriptions");
    assert_eq!(heard.auth, "Bearer sk-test-key-123");
    let boundary = heard.content_type.strip_prefix("multipart/form-data; boundary=").unwrap();
    let body = String::from_utf8_lossy(&heard.body);
    assert!(body.contains("name=\"model\"\r\n\r\ntest-model\r\n"), "{body}");
    assert!(body.contains("name=\"response_format\"\r\n\r\njson\r\n"), "{body}");
    assert!(
        body.contains(
            "name=\"file\"; filename=\"voice-message.ogg\"\r\nContent-Type: audio/ogg\r\n\r\nOggS"
        ),
        "{body}"
    );
    assert!(heard.body.windows(OGG.len()).any(|w| w == OGG));
    assert!(body.ends_with(&format!("--{boundary}--\r\n")), "{body}");
}

#[tokio::test]
async fn deepgram_gets_the_raw_audio_and_its_first_alternative_is_the_transcript() {
    let answer = json!({
        "metadata": { "duration": 3.2, "channels": 1 },
        "results": { "channels": [ { "alternatives": [ { "transcript": "Run the tests.", "confidence": 0.99 } ] } ] }
    });
    let (base, service) = transcription_service((StatusCode::OK, answer)).await;
    // A trailing /v1 is Deepgram's version, not part of the base.
    for base_url in [base.clone(), format!("{base}/v1")] {
        let transcriber =
            Transcriber::new(settings(TranscriptionProvider::Deepgram, base_url)).unwrap();
        assert_eq!(transcriber.transcribe(note(OGG)).await.unwrap(), "Run the tests.");
    }
    let heard = service.heard.lock().unwrap();
    assert_eq!(heard.len(), 2);
    for heard in heard.iter() {
        assert_eq!(heard.path, "/v1/listen");
        assert_eq!(heard.query, "model=test-model&smart_format=true");
        assert_eq!(heard.auth, "Token sk-test-key-123");
        assert_eq!(heard.content_type, "audio/ogg");
        assert_eq!(heard.body, OGG);
    }
}

#[tokio::test]
async fn a_note_over_the_limits_is_refused_before_any_upload() {
    let (base, service) = transcription_service((StatusCode::OK, json!({ "text": "x" }))).await;
    let transcriber =
        Transcriber::new(settings(TranscriptionProvider::OpenAi, format!("{base}/v1"))).unwrap();
    let err = transcriber.admit(Some(4096), None).unwrap_err();
    assert_eq!(err.to_string(), "the voice message is 4 KB — the limit for transcription is 1 KB");
    let err = transcriber.admit(None, Some(61.5)).unwrap_err();
    assert_eq!(
        err.to_string(),
        "the voice message is 1 min 2 s long — the limit for transcription is 1 min"
    );
    assert!(transcriber.admit(Some(1024), Some(60.0)).is_ok());
    let long = transcribe::VoiceNote { seconds: Some(600.0), ..note(OGG) };
    assert!(matches!(transcriber.transcribe(long).await, Err(TranscribeError::TooLong { .. })));
    let big = vec![0u8; 2048];
    assert!(matches!(
        transcriber.transcribe(note(&big)).await,
        Err(TranscribeError::TooLarge { .. })
    ));
    // Fetched from a URL: refused by the announced size before the download.
    let fetcher = Fetcher::new(true);
    let remote = transcribe::RemoteVoice {
        file_name: "v.ogg",
        mime: None,
        bytes: Some(5000),
        seconds: None,
    };
    let err = transcriber
        .fetch_and_transcribe(&fetcher, "http://127.0.0.1:9/v.ogg", remote, None)
        .await
        .unwrap_err();
    assert!(matches!(err, TranscribeError::TooLarge { bytes: 5000, max: 1024 }), "{err}");
    assert!(service.heard.lock().unwrap().is_empty(), "nothing was uploaded");
}

#[tokio::test]
async fn service_errors_are_clear_and_never_show_the_key() {
    let (base, service) = transcription_service((
        StatusCode::UNAUTHORIZED,
        json!({ "error": { "message": "Incorrect API key provided: sk-test-key-123" } }),
    ))
    .await;
    let transcriber =
        Transcriber::new(settings(TranscriptionProvider::OpenAi, format!("{base}/v1"))).unwrap();
    let err = transcriber.transcribe(note(OGG)).await.unwrap_err().to_string();
    assert_eq!(
        err,
        "the transcription service refused the API key (401): check voice_transcription_api_key_secret"
    );
    *service.answer.lock().unwrap() = (
        StatusCode::BAD_REQUEST,
        json!({ "err_code": "Bad Request", "err_msg": "corrupt audio (key sk-test-key-123)" }),
    );
    let err = transcriber.transcribe(note(OGG)).await.unwrap_err().to_string();
    assert_eq!(err, "the transcription service answered 400: corrupt audio (key ***)");
    *service.answer.lock().unwrap() = (StatusCode::OK, json!({ "text": "   " }));
    let err = transcriber.transcribe(note(OGG)).await.unwrap_err();
    assert_eq!(err, TranscribeError::NoSpeech);
    *service.answer.lock().unwrap() = (StatusCode::OK, json!({ "words": [] }));
    let err = transcriber.transcribe(note(OGG)).await.unwrap_err().to_string();
    assert!(err.contains("no `text`"), "{err}");
    let dead =
        Transcriber::new(settings(TranscriptionProvider::Deepgram, "http://127.0.0.1:9".into()))
            .unwrap();
    let err = dead.transcribe(note(OGG)).await.unwrap_err().to_string();
    assert_eq!(err, "the transcription service could not be reached: 127.0.0.1: no connection");
    assert!(!format!("{transcriber:?}").contains("sk-test-key-123"));
}

#[tokio::test]
async fn a_voice_message_is_fetched_then_transcribed() {
    let (base, service) = transcription_service((StatusCode::OK, json!({ "text": "hello" }))).await;
    let voice_server = {
        async fn voice() -> Response {
            ([(header::CONTENT_TYPE, "audio/ogg")], OGG).into_response()
        }
        serve(Router::new().route("/voice.ogg", get(voice))).await
    };
    let transcriber =
        Transcriber::new(settings(TranscriptionProvider::OpenAi, format!("{base}/v1"))).unwrap();
    let remote = transcribe::RemoteVoice {
        file_name: "voice.ogg",
        mime: None,
        bytes: None,
        seconds: Some(2.0),
    };
    let text = transcriber
        .fetch_and_transcribe(
            &Fetcher::new(true),
            &format!("{voice_server}/voice.ogg"),
            remote,
            None,
        )
        .await
        .unwrap();
    assert_eq!(text, "hello");
    let body = String::from_utf8_lossy(&service.heard.lock().unwrap()[0].body).into_owned();
    assert!(body.contains("Content-Type: audio/ogg\r\n\r\nOggS"), "{body}");
}

fn voice_section(text: &str) -> Result<(VoiceConfig, toml::Table), String> {
    VoiceConfig::split(&text.parse::<toml::Table>().unwrap())
}

#[test]
fn the_voice_keys_come_out_of_a_section_with_their_defaults() {
    let (voice, rest) = voice_section(
        "voice_transcription = true\nvoice_max_bytes = 2048\nshow_transcript = true\nbot_token = \"x\"",
    )
    .unwrap();
    assert!(voice.voice_transcription && voice.show_transcript);
    assert_eq!(voice.voice_max_bytes, 2048);
    assert_eq!(voice.voice_max_seconds, voice::DEFAULT_VOICE_MAX_SECONDS);
    assert_eq!(rest.keys().collect::<Vec<_>>(), ["bot_token"]);
    assert_eq!(voice.model(), "gpt-4o-mini-transcribe");
    assert_eq!(voice.base_url(), "https://api.openai.com/v1");
    assert_eq!(voice.api_key_secret(), "openai_api_key");
    let (deepgram, _) = voice_section("voice_transcription_provider = \"deepgram\"").unwrap();
    assert_eq!(
        (deepgram.model(), deepgram.base_url(), deepgram.api_key_secret()),
        ("nova-3".to_owned(), "https://api.deepgram.com".to_owned(), "deepgram_api_key".to_owned())
    );
    let (off, _) = voice_section("").unwrap();
    assert_eq!(off, VoiceConfig::default());
    assert!(!off.voice_transcription && !off.show_transcript);
}

#[test]
fn bad_voice_values_name_their_key() {
    for (text, key) in [
        ("voice_transcription_provider = \"whisper\"", "voice_transcription_provider"),
        ("voice_max_bytes = 0", "voice_max_bytes"),
        ("voice_max_seconds = 0", "voice_max_seconds"),
        ("voice_transcription_base_url = \"ftp://x\"", "voice_transcription_base_url"),
        ("voice_transcription_model = \" \"", "voice_transcription_model"),
        ("voice_transcription = \"yes\"", "voice_transcription"),
    ] {
        let err = voice_section(text).unwrap_err();
        assert!(err.contains(key), "{text}: {err}");
    }
    let mut unknown =
        vec![lemon_core::config::UnknownKey::new(vec!["voice_transcripton".into()], ["bot_token"])];
    VoiceConfig::suggest(&mut unknown);
    assert_eq!(unknown[0].suggestion.as_deref(), Some("voice_transcription"));
}

#[test]
fn the_key_comes_from_the_providers_secret_or_inline_and_is_never_shown() {
    let dir = tempfile::tempdir().unwrap();
    let env = [
        ("OPENAI_API_KEY".to_owned(), "sk-from-env".to_owned()),
        ("DEEPGRAM_API_KEY".to_owned(), "dg-from-env".to_owned()),
    ]
    .into();
    let secrets = SecretStore::new(env, dir.path().join("secrets.toml"));
    let (off, _) = voice_section("").unwrap();
    assert!(off.transcriber(&secrets).unwrap().is_none());
    let (openai, _) = voice_section("voice_transcription = true").unwrap();
    let transcriber = openai.transcriber(&secrets).unwrap().unwrap();
    assert_eq!(transcriber.provider(), TranscriptionProvider::OpenAi);
    assert_eq!(openai.secret_names(), ["openai_api_key"]);
    let (deepgram, _) =
        voice_section("voice_transcription = true\nvoice_transcription_provider = \"deepgram\"")
            .unwrap();
    assert_eq!(deepgram.transcriber(&secrets).unwrap().unwrap().model(), "nova-3");
    let (missing, _) = voice_section(
        "voice_transcription = true\nvoice_transcription_api_key_secret = \"other_key\"",
    )
    .unwrap();
    let err = missing.transcriber(&secrets).unwrap_err();
    assert!(
        err.contains("voice_transcription_api_key_secret") && err.contains("other_key"),
        "{err}"
    );
    let (inline, _) = voice_section(
        "voice_transcription = true\nvoice_transcription_api_key = \"sk-inline-secret\"",
    )
    .unwrap();
    assert!(inline.transcriber(&secrets).unwrap().is_some());
    assert!(inline.secret_names().is_empty());
    assert!(!format!("{inline:?}").contains("sk-inline-secret"));
}
