//! Voice calls end to end: the real binary with `[gateway.voice]`, Twilio's
//! signed webhooks and media stream played by the test (real speech from
//! espeak-ng), and fake Deepgram, ElevenLabs and Twilio REST servers. The echo
//! engine answers, so each answer is the caller's words, except where the
//! native engine answers from the fake LLM.

use std::time::Duration;

use futures::StreamExt;
use lemon_tests::fake_deepgram::{results, speech_started, FakeDeepgram};
use lemon_tests::fake_elevenlabs::{FakeElevenLabs, TONE_BYTES};
use lemon_tests::fake_twilio_voice::{
    sign, speech_ulaw, ulaw_decode, wav_file, FakeTwilioRest, MediaClient, Sent,
};
use serde_json::Value;

use crate::support::{home_with, Gateway, PATIENCE};
use crate::webhook_e2e::free_port;

const AUTH_TOKEN: &str = "twilio-auth-token-e2e-5c1d";
const ACCOUNT_SID: &str = "AC0123456789abcdef0123456789abcdef";
const DEEPGRAM_KEY: &str = "deepgram-key-e2e-77aa";
const ELEVENLABS_KEY: &str = "elevenlabs-key-e2e-91bb";
const CALLER: &str = "+15551230100";
const OPENAI_KEY: &str = "sk-voice-e2e-3f9d";

struct Voice {
    gateway: Gateway,
    deepgram: FakeDeepgram,
    elevenlabs: FakeElevenLabs,
    rest: FakeTwilioRest,
    public_url: String,
    http: reqwest::Client,
    _home: tempfile::TempDir,
}

/// A gateway with voice on (echo engine, no greeting unless `extra` sets one,
/// [`CALLER`] the one caller allowed unless `extra` says who is) and its
/// fakes; recordings are served after one 404.
async fn start(extra: &str) -> Voice {
    start_logging(extra, None).await
}

/// [`start`], with the gateway's log written to `log` when given.
async fn start_logging(extra: &str, log: Option<&std::path::Path>) -> Voice {
    let deepgram = FakeDeepgram::start(DEEPGRAM_KEY).await;
    let elevenlabs = FakeElevenLabs::start(ELEVENLABS_KEY).await;
    let rest = FakeTwilioRest::start(ACCOUNT_SID, AUTH_TOKEN, wav_file(800), 1).await;
    let greeting = if extra.contains("greeting") { "" } else { "greeting = \"\"\n" };
    // A `[gateway.engines.lemon]` table in `extra` leaves the engine unset:
    // calls then run on the gateway's default, the native engine.
    let native = extra.contains("[gateway.engines.lemon]");
    let engine = if native { "" } else { "engine = \"echo\"\n" };
    // The test's caller is the one allowed, unless `extra` says who is.
    let callers = if extra.contains("allowed_callers") || extra.contains("allow_everyone") {
        String::new()
    } else {
        format!("allowed_callers = [\"{CALLER}\"]\n")
    };
    // The public URL names the port, so it is picked before the gateway
    // binds it; another process taking it in between fails that start, which
    // status shows, and the next attempt picks another port.
    let mut attempts = 0;
    let (gateway, home, public_url) = loop {
        attempts += 1;
        let port = free_port().await;
        let public_url = format!("http://127.0.0.1:{port}");
        let config = format!(
            "[gateway.voice]\nenabled = true\nport = {port}\npublic_url = \"{public_url}\"\n\
             deepgram_base_url = \"{}\"\nelevenlabs_base_url = \"{}\"\ntwilio_api_base_url = \"{}\"\n\
             {engine}{greeting}{callers}{extra}",
            deepgram.base_url, elevenlabs.base_url, rest.base_url
        );
        let home = home_with(&config);
        write_secrets(home.path(), native);
        let gateway = match log {
            None => Gateway::start_in(home.path()).await,
            Some(log) => {
                let file = std::fs::File::create(log).unwrap();
                let command = crate::support::command(home.path());
                Gateway::spawn_with_stderr(command, home.path(), file.into()).await
            }
        };
        let voice = gateway.status().await["transports"]["voice"].clone();
        if voice["state"] == "running" {
            break (gateway, home, public_url);
        }
        assert!(attempts < 5, "voice never listened: {voice}");
        assert!(gateway.terminate().await.success());
    };
    Voice {
        gateway,
        deepgram,
        elevenlabs,
        rest,
        public_url,
        http: reqwest::Client::new(),
        _home: home,
    }
}

fn write_secrets(home: &std::path::Path, with_openai_key: bool) {
    use std::os::unix::fs::PermissionsExt;
    let path = home.join("secrets.toml");
    let mut text = format!(
        "twilio_auth_token = \"{AUTH_TOKEN}\"\ntwilio_account_sid = \"{ACCOUNT_SID}\"\n\
         deepgram_api_key = \"{DEEPGRAM_KEY}\"\nelevenlabs_api_key = \"{ELEVENLABS_KEY}\"\n"
    );
    if with_openai_key {
        text.push_str(&format!("openai_api_key = \"{OPENAI_KEY}\"\n"));
    }
    std::fs::write(&path, text).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

fn call_sid(n: u8) -> String {
    format!("CA{n:02x}23456789abcdef0123456789abcdef")
}

impl Voice {
    /// Posts a form webhook to `path` signed as Twilio would (or with `signature`).
    async fn post_signed(
        &self,
        path: &str,
        params: &[(&str, &str)],
        signature: Option<&str>,
    ) -> reqwest::Response {
        let url = format!("{}{path}", self.public_url);
        let signed = sign(AUTH_TOKEN, &url, params);
        let mut request = self.http.post(&url).form(params).timeout(PATIENCE);
        match signature {
            Some("") => {}
            Some(other) => request = request.header("X-Twilio-Signature", other),
            None => request = request.header("X-Twilio-Signature", signed),
        }
        request.send().await.unwrap()
    }

    /// Twilio's incoming-call webhook: the stream URL and token of the TwiML answer.
    async fn incoming(&self, sid: &str) -> (String, String) {
        let params = [
            ("AccountSid", ACCOUNT_SID),
            ("CallSid", sid),
            ("From", CALLER),
            ("To", "+15551239999"),
            ("CallStatus", "ringing"),
            ("Direction", "inbound"),
        ];
        let response = self.post_signed("/webhooks/twilio/voice", &params, None).await;
        assert_eq!(response.status(), 200);
        assert_eq!(response.headers()["content-type"], "application/xml");
        let twiml = response.text().await.unwrap();
        let attr = |name: &str| -> String {
            let start = twiml.find(&format!("{name}=\"")).unwrap() + name.len() + 2;
            twiml[start..start + twiml[start..].find('"').unwrap()].to_owned()
        };
        assert!(
            twiml.contains("<Connect>") && twiml.contains("<Parameter name=\"token\""),
            "{twiml}"
        );
        (attr("url"), attr("value"))
    }

    async fn call(&self, sid: &str) -> Value {
        let response = self.gateway.get(&format!("/v1/calls/{sid}")).send().await.unwrap();
        assert_eq!(response.status(), 200);
        response.json().await.unwrap()
    }

    /// Waits (bounded) until the call's record satisfies `done`.
    async fn call_until(&self, sid: &str, what: &str, done: impl Fn(&Value) -> bool) -> Value {
        let waited = tokio::time::timeout(PATIENCE, async {
            loop {
                let call = self.call(sid).await;
                if done(&call) {
                    return call;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
        match waited {
            Ok(call) => call,
            Err(_) => panic!("call {sid}: {what} did not happen: {}", self.call(sid).await),
        }
    }
}

/// Root-mean-square amplitude of μ-law audio.
fn rms(audio: &[u8]) -> f64 {
    let sum: f64 = audio.iter().map(|&b| f64::from(ulaw_decode(b)).powi(2)).sum();
    (sum / audio.len().max(1) as f64).sqrt()
}

#[tokio::test]
async fn a_call_gets_a_spoken_answer_with_its_turn_timings_on_the_bus_and_on_record() {
    let voice = start("").await;
    let sid = call_sid(1);
    let (stream_url, token) = voice.incoming(&sid).await;
    let host = voice.public_url.trim_start_matches("http://");
    assert_eq!(stream_url, format!("ws://{host}/webhooks/twilio/voice/stream"));
    // Deepgram is connected before Twilio opens the stream.
    let seen = voice.deepgram.wait_for("a stream opened", |s| s.streams == 1).await;
    assert!(seen.query.contains("encoding=mulaw&sample_rate=8000&channels=1"), "{}", seen.query);
    let events = voice.gateway.get("/v1/events").send().await.unwrap();
    assert_eq!(events.status(), 200);

    let client = MediaClient::connect(&stream_url, &sid, &token).await;
    let speech = speech_ulaw("What time is it");
    assert!(speech.len() > 4000, "speech is {} bytes", speech.len());
    client.play(&speech).await;
    voice.deepgram.wait_for("all the speech arrived", |s| s.audio_bytes >= speech.len()).await;
    voice.deepgram.say(results("What time", false, false));
    voice.deepgram.say(results("What time is it? Tell me now.", true, true));

    let log = client.wait_for("two spoken sentences", |l| l.marks() >= 2).await;
    let audio = log.audio();
    assert_eq!(audio.len(), 2 * TONE_BYTES);
    assert!(rms(&audio) > 5000.0, "the answer is audible: rms {}", rms(&audio));
    assert!(log.invalid.is_empty(), "{:?}", log.invalid);
    assert!(matches!(log.sent.last(), Some(Sent::Mark(_))));
    let spoken: Vec<String> = voice.elevenlabs.spoken().into_iter().map(|s| s.text).collect();
    assert_eq!(spoken, ["What time is it?", "Tell me now."]);
    assert!(voice.elevenlabs.spoken()[0].query.contains("output_format=ulaw_8000"));

    // The turn's timings on the bus.
    let mut parser = lemon_tests::event_stream::EventStream::default();
    let mut stream = events.bytes_stream();
    let turn = tokio::time::timeout(PATIENCE, async {
        while let Some(chunk) = stream.next().await {
            for event in parser.push(&chunk.unwrap()) {
                if event.event == "voice_turn" {
                    return serde_json::from_str::<Value>(&event.data).unwrap();
                }
            }
        }
        panic!("the event stream ended");
    })
    .await
    .expect("voice_turn in time");
    assert_eq!(turn["call_sid"], sid.as_str());
    assert_eq!(turn["turn"], 1);
    assert!(turn["timings"]["transcript_final_to_first_audio_ms"].is_number(), "{turn}");
    assert!(turn["timings"]["gateway_ms"].is_number(), "{turn}");

    // And on record, with the run in session voice:<from>.
    let call = voice
        .call_until(&sid, "the answer on record", |c| c["turns"][0]["answer"].is_string())
        .await;
    assert_eq!(call["from"], CALLER);
    assert_eq!(call["status"], "in_progress");
    assert_eq!(call["turns"][0]["user"], "What time is it? Tell me now.");
    assert_eq!(call["turns"][0]["answer"], "What time is it? Tell me now.");
    assert!(call["turns"][0]["timings"]["tts_first_byte_ms"].is_number(), "{call}");
    let run_id = call["turns"][0]["run_id"].as_str().unwrap().to_owned();
    let run = voice.gateway.run(&run_id).await;
    assert_eq!(run["session_key"], format!("voice:{CALLER}"));
    let list: Value = voice.gateway.get("/v1/calls").send().await.unwrap().json().await.unwrap();
    assert_eq!(list["calls"][0]["id"], sid.as_str());
    assert_eq!(list["calls"][0]["turn_count"], 1);
    let anonymous = voice.http.get(format!("{}/v1/calls", voice.gateway.api)).send().await.unwrap();
    assert_eq!(anonymous.status(), 401);
    let status = voice.gateway.status().await;
    assert_eq!(status["transports"]["voice"]["state"], "running", "{status}");

    // The caller hangs up: Deepgram's stream is closed, the call ends.
    client.stop(&sid);
    voice.deepgram.wait_for("CloseStream", |s| s.controls.iter().any(|c| c == "CloseStream")).await;
    let call = voice.call_until(&sid, "the end", |c| c["status"] == "ended").await;
    assert_eq!(call["end_reason"], "caller_hung_up");
    assert!(voice.rest.requests().is_empty(), "no hang-up needed: {:?}", voice.rest.requests());
}

/// One call from `CALLER`: `words` spoken and transcribed, the answer's
/// `sentences` spoken back, then the caller hangs up.
async fn one_turn_call(voice: &Voice, n: u8, words: &str, sentences: usize) -> Vec<String> {
    let sid = call_sid(n);
    let spoken_before = voice.elevenlabs.spoken().len();
    let (stream_url, token) = voice.incoming(&sid).await;
    voice.deepgram.wait_for("the call's stream opened", |s| s.streams == usize::from(n)).await;
    let client = MediaClient::connect(&stream_url, &sid, &token).await;
    let speech = speech_ulaw(words);
    client.play(&speech).await;
    voice.deepgram.wait_for("the speech arrived", |s| s.audio_bytes >= speech.len()).await;
    voice.deepgram.say(results(words, true, true));
    let log = client.wait_for("the spoken answer", |l| l.marks() >= sentences).await;
    assert!(rms(&log.audio()) > 5000.0, "the answer is audible");
    client.stop(&sid);
    voice.call_until(&sid, "the end of the call", |c| c["status"] == "ended").await;
    voice.elevenlabs.spoken().into_iter().skip(spoken_before).map(|s| s.text).collect()
}

#[tokio::test]
async fn calls_run_on_the_native_engine_and_a_second_call_continues_the_first() {
    let llm = lemon_tests::fake_llm::FakeLlm::start().await;
    llm.push(lemon_tests::fake_llm::Turn::text(&["It is ", "noon. ", "Anything else?"]));
    llm.push(lemon_tests::fake_llm::Turn::text(&["You asked ", "the time."]));
    let lemon = format!(
        "[gateway.engines.lemon]\nbase_url = \"{}\"\nmodel = \"voice-model\"\n",
        llm.base_url()
    );
    let voice = start(&lemon).await;

    let spoken = one_turn_call(&voice, 1, "What time is it", 2).await;
    assert_eq!(spoken, ["It is noon.", "Anything else?"]);
    let spoken = one_turn_call(&voice, 2, "What did I ask", 1).await;
    assert_eq!(spoken, ["You asked the time."]);

    // Both calls ran on the native engine in session voice:<from>, and the
    // second call's request carried the first call's conversation.
    let requests = llm.requests();
    let paths: Vec<&str> = requests.iter().map(|r| r.path.as_str()).collect();
    assert_eq!(requests.len(), 2, "{paths:?}");
    let second = requests[1].body["messages"].to_string();
    assert!(second.contains("What time is it") && second.contains("It is noon."), "{second}");
    assert!(second.contains("What did I ask"), "{second}");
    let call = voice.call(&call_sid(2)).await;
    let run = voice.gateway.run(call["turns"][0]["run_id"].as_str().unwrap()).await;
    assert_eq!(run["session_key"], format!("voice:{CALLER}"), "{run}");
    assert_eq!(run["resume"]["engine"], "lemon", "{run}");
}

/// The voice port is served like every other listener (request-head and idle
/// timeouts, the connection cap, JSON for what hyper refuses by itself).
#[tokio::test]
async fn the_voice_listener_answers_unparsable_requests_with_json_errors() {
    let voice = start("").await;
    let addr: std::net::SocketAddr =
        voice.public_url.trim_start_matches("http://").parse().unwrap();
    for (what, request, status) in crate::http_hardening::malformed_requests() {
        let answer = crate::http_hardening::exchange(addr, &request).await;
        crate::http_hardening::json_error(&answer, status, &format!("voice: {what}"));
    }
}

#[tokio::test]
async fn forged_or_unsigned_voice_webhooks_are_refused_and_a_stream_needs_its_token() {
    let voice = start("").await;
    let sid = call_sid(2);
    let params = [("CallSid", sid.as_str()), ("From", CALLER), ("To", "+15551239999")];
    for signature in [Some(""), Some("bm90IGEgc2lnbmF0dXJl")] {
        let response = voice.post_signed("/webhooks/twilio/voice", &params, signature).await;
        assert_eq!(response.status(), 403);
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["error"], "invalid Twilio signature");
    }
    // Signed for other parameters than the ones sent.
    let url = format!("{}/webhooks/twilio/voice", voice.public_url);
    let other = sign(AUTH_TOKEN, &url, &[("CallSid", sid.as_str()), ("From", "+15550000000")]);
    let response = voice.post_signed("/webhooks/twilio/voice", &params, Some(&other)).await;
    assert_eq!(response.status(), 403);
    for path in ["/webhooks/twilio/voice/status", "/webhooks/twilio/voice/recording"] {
        let response = voice.post_signed(path, &params, Some("")).await;
        assert_eq!(response.status(), 403, "{path}");
    }
    // Signed, but not a phone number.
    let bad_from = [("CallSid", sid.as_str()), ("From", "client:alice")];
    let response = voice.post_signed("/webhooks/twilio/voice", &bad_from, None).await;
    assert_eq!(response.status(), 400);
    let body: Value = response.json().await.unwrap();
    assert!(body["error"].as_str().unwrap().contains("From"), "{body}");
    assert_eq!(voice.deepgram.seen().streams, 0, "nothing opened for a refused call");

    // A stream that starts with a token it was not given is closed.
    let (stream_url, _token) = voice.incoming(&sid).await;
    let intruder = MediaClient::connect(&stream_url, &sid, "not-the-token").await;
    let log = intruder.wait_for("the stream closed", |l| l.closed).await;
    assert!(log.sent.is_empty());
    let call = voice.call(&sid).await;
    assert_eq!(call["status"], "connecting");
}

#[tokio::test]
async fn barge_in_clears_playback_and_noise_without_words_does_not() {
    let voice = start("barge_in_min_words = 2\n").await;
    let sid = call_sid(3);
    let (stream_url, token) = voice.incoming(&sid).await;
    voice.deepgram.wait_for("a stream opened", |s| s.streams == 1).await;
    let client = MediaClient::connect(&stream_url, &sid, &token).await;
    // The answer has not played yet: its marks stay with the client.
    client.hold_marks(true);
    client.play(&speech_ulaw("Tell me a story")).await;
    voice.deepgram.say(results("Tell me a story. Make it long. Very long indeed.", true, true));
    client.wait_for("the answer being spoken", |l| l.marks() >= 1).await;

    // Noise and a single word while speaking: no interruption.
    voice.deepgram.say(speech_started());
    voice.deepgram.say(results("", true, false));
    voice.deepgram.say(results("uh", true, false));
    // Words: an interruption.
    voice.deepgram.say(results("what about tomorrow", true, true));
    let log = client.wait_for("clear", |l| l.clears() >= 1).await;
    assert_eq!(log.clears(), 1);
    let call =
        voice.call_until(&sid, "the second turn", |c| c["turns"][1]["user"].is_string()).await;
    assert_eq!(call["turns"][0]["interrupted"], true, "{call}");
    // Nothing of the noise made it into the caller's next turn.
    assert_eq!(call["turns"][1]["user"], "what about tomorrow");
    client.hold_marks(false);
    let call =
        voice.call_until(&sid, "the second answer", |c| c["turns"][1]["answer"].is_string()).await;
    assert_eq!(call["turns"][1]["answer"], "what about tomorrow");
    assert_eq!(client.log().clears(), 1);
}

#[tokio::test]
async fn silence_ends_the_call_with_a_goodbye_and_a_hang_up() {
    let voice = start("silence_timeout_ms = 600\ngoodbye = \"Goodbye for now.\"\n").await;
    let sid = call_sid(4);
    let (stream_url, token) = voice.incoming(&sid).await;
    let client = MediaClient::connect(&stream_url, &sid, &token).await;
    let hang_up = voice.rest.wait_for("POST", &format!("/Calls/{sid}.json")).await;
    assert!(hang_up.authorized);
    assert_eq!(hang_up.form, [("Status".to_owned(), "completed".to_owned())]);
    let log = client.wait_for("the stream closed", |l| l.closed).await;
    assert_eq!(log.audio().len(), TONE_BYTES, "the goodbye was spoken");
    let spoken: Vec<String> = voice.elevenlabs.spoken().into_iter().map(|s| s.text).collect();
    assert_eq!(spoken, ["Goodbye for now."]);
    let call = voice.call_until(&sid, "the end", |c| c["status"] == "ended").await;
    assert_eq!(call["end_reason"], "silence");
    voice.deepgram.wait_for("CloseStream", |s| s.controls.iter().any(|c| c == "CloseStream")).await;
}

#[tokio::test]
async fn the_duration_cap_ends_a_call_that_goes_on() {
    let voice = start(
        "max_call_duration_seconds = 1\nsilence_timeout_ms = 60000\ngreeting = \"Hi there.\"\n",
    )
    .await;
    let sid = call_sid(5);
    let (stream_url, token) = voice.incoming(&sid).await;
    let connected = tokio::time::Instant::now();
    let client = MediaClient::connect(&stream_url, &sid, &token).await;
    client.wait_for("the greeting", |l| l.marks() >= 1).await;
    // The caller keeps talking; the cap ends the call anyway.
    voice.deepgram.say(speech_started());
    voice.rest.wait_for("POST", &format!("/Calls/{sid}.json")).await;
    assert!(connected.elapsed() >= Duration::from_millis(900), "{:?}", connected.elapsed());
    client.wait_for("the stream closed", |l| l.closed).await;
    let call = voice.call_until(&sid, "the end", |c| c["status"] == "ended").await;
    assert_eq!(call["end_reason"], "max_duration");
    let spoken: Vec<String> = voice.elevenlabs.spoken().into_iter().map(|s| s.text).collect();
    assert_eq!(spoken, ["Hi there.", "Thanks for calling. Goodbye."]);
}

#[tokio::test]
async fn a_completed_recording_is_downloaded_with_retry_and_saved_as_wav() {
    let voice = start("record_calls = true\n").await;
    let sid = call_sid(6);
    let (stream_url, token) = voice.incoming(&sid).await;
    let client = MediaClient::connect(&stream_url, &sid, &token).await;
    let started = voice.rest.wait_for("POST", &format!("/Calls/{sid}/Recordings.json")).await;
    assert!(started.authorized);
    let form = |name: &str| started.form.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
    assert_eq!(form("RecordingChannels").as_deref(), Some("dual"));
    let callback = format!("{}/webhooks/twilio/voice/recording", voice.public_url);
    assert_eq!(form("RecordingStatusCallback"), Some(callback));
    client.stop(&sid);
    voice.call_until(&sid, "the end", |c| c["status"] == "ended").await;

    let recording_sid = "RE0123456789abcdef0123456789abcdef";
    let recording_url = format!(
        "{}/2010-04-01/Accounts/{ACCOUNT_SID}/Recordings/{recording_sid}",
        voice.rest.base_url
    );
    let params = [
        ("AccountSid", ACCOUNT_SID),
        ("CallSid", sid.as_str()),
        ("RecordingSid", recording_sid),
        ("RecordingUrl", recording_url.as_str()),
        ("RecordingStatus", "completed"),
        ("RecordingDuration", "3"),
        ("RecordingChannels", "2"),
        ("RecordingSource", "StartCallRecordingAPI"),
    ];
    let response = voice.post_signed("/webhooks/twilio/voice/recording", &params, None).await;
    assert_eq!(response.status(), 200);
    let call =
        voice.call_until(&sid, "the recording saved", |c| c["recording"]["path"].is_string()).await;
    let path = std::path::PathBuf::from(call["recording"]["path"].as_str().unwrap());
    let date = chrono_free_today();
    let dir = voice.gateway.home.canonicalize().unwrap().join("recordings");
    assert!(path.starts_with(&dir), "{}", path.display());
    assert_eq!(path.file_name().unwrap().to_str().unwrap(), format!("{sid}_{recording_sid}.wav"));
    assert!(
        date.contains(&path.parent().unwrap().file_name().unwrap().to_str().unwrap().to_owned())
    );
    assert_eq!(std::fs::read(&path).unwrap(), wav_file(800));
    let downloads: Vec<_> =
        voice.rest.requests().into_iter().filter(|r| r.method == "GET").collect();
    assert_eq!(downloads.len(), 2, "one 404, then the file: {downloads:?}");
    assert!(downloads
        .iter()
        .all(|r| r.authorized && r.path.ends_with(&format!("{recording_sid}.wav"))));
}

/// Today's UTC date as `YYYY-MM-DD`, and yesterday's (a test running over
/// midnight), from the system clock.
fn chrono_free_today() -> Vec<String> {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs()
        as i64;
    [secs, secs - 86_400].iter().map(|s| civil_date(s.div_euclid(86_400))).collect()
}

/// Days since 1970-01-01 as a civil date (Howard Hinnant's algorithm).
fn civil_date(days: i64) -> String {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}")
}

#[tokio::test]
async fn a_bad_voice_section_or_a_missing_key_stops_the_start_at_its_place() {
    let cases = [
        (
            "[gateway.voice]\nenabled = true\npublic_url = \"https://voice.example.com\"\nbarge_in_min_words = 0\n",
            ":4:22: gateway.voice.barge_in_min_words: `barge_in_min_words`: must be at least 1",
        ),
        (
            // Off, and its wrong type is still an error.
            "[gateway.voice]\nenabled = false\nbarge_in = \"yes\"\n",
            ":3:12: gateway.voice.barge_in:",
        ),
        ("[gateway.voice]\nenabled = true\n", ":1:1: gateway.voice: `public_url`: set the https URL"),
        (
            "[gateway.voice]\nenabled = true\npublic_url = \"https://voice.example.com\"\n",
            "`twilio_auth_token_secret`: secret \"twilio_auth_token\" is not set",
        ),
    ];
    for (text, expected) in cases {
        let home = home_with(text);
        let (code, stderr) = crate::support::failed_start(home.path()).await;
        assert_eq!(code, Some(5), "a config error: {text}\n{stderr}");
        assert!(stderr.contains(expected), "{text}\nexpected {expected}\n--- stderr ---\n{stderr}");
    }
}

/// The incoming-call webhook for `sid` from `from`, signed: its status and TwiML.
async fn incoming_from(voice: &Voice, sid: &str, from: &str) -> (u16, String) {
    let params =
        [("AccountSid", ACCOUNT_SID), ("CallSid", sid), ("From", from), ("To", "+15551239999")];
    let response = voice.post_signed("/webhooks/twilio/voice", &params, None).await;
    let status = response.status().as_u16();
    (status, response.text().await.unwrap())
}

/// Waits (bounded) until the file at `path` holds a line with every one of `words`.
async fn log_line(path: &std::path::Path, words: &[&str]) -> String {
    let found = tokio::time::timeout(PATIENCE, async {
        loop {
            let text = std::fs::read_to_string(path).unwrap_or_default();
            if let Some(line) = text.lines().find(|l| words.iter().all(|w| l.contains(w))) {
                return line.to_owned();
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    found.unwrap_or_else(|_| panic!("no log line with {words:?}"))
}

#[tokio::test]
async fn a_caller_not_allowed_hears_a_refusal_and_opens_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("gateway.log");
    let voice = start_logging("", Some(&log)).await;
    let status = voice.gateway.status().await;
    let detail = status["transports"]["voice"]["detail"].as_str().unwrap().to_owned();
    assert!(detail.ends_with("1 allowed caller"), "{detail}");

    let stranger = "+15559870000";
    let sid = call_sid(7);
    let (status, twiml) = incoming_from(&voice, &sid, stranger).await;
    assert_eq!(status, 200);
    assert!(twiml.contains("<Say>") && twiml.contains("<Hangup/>"), "{twiml}");
    assert!(!twiml.contains("<Connect>") && !twiml.contains("token"), "{twiml}");
    let line = log_line(&log, &["call refused", stranger]).await;
    assert!(line.contains("allowed_callers"), "{line}");
    // No call on record; the listed caller's call is the first stream Deepgram sees.
    let response = voice.gateway.get(&format!("/v1/calls/{sid}")).send().await.unwrap();
    assert_eq!(response.status(), 404);
    voice.incoming(&call_sid(8)).await;
    voice.deepgram.wait_for("the listed caller's stream", |s| s.streams >= 1).await;
    assert_eq!(voice.deepgram.seen().streams, 1);

    // Everyone, by opt-in: said at the start, in the log and in status.
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("gateway.log");
    let open = start_logging("allow_everyone = true\n", Some(&log)).await;
    log_line(&log, &["WARN", "allow_everyone = true"]).await;
    let status = open.gateway.status().await;
    let detail = status["transports"]["voice"]["detail"].as_str().unwrap().to_owned();
    assert!(detail.contains("every caller is answered (allow_everyone = true)"), "{detail}");
    let (status, twiml) = incoming_from(&open, &call_sid(9), stranger).await;
    assert_eq!(status, 200);
    assert!(twiml.contains("<Connect>"), "{twiml}");
}

#[tokio::test]
async fn a_replayed_call_webhook_gets_one_stream_token_and_one_deepgram_stream() {
    let voice = start("").await;
    let sid = call_sid(10);
    // Three times the same signed webhook: one token, one Deepgram stream.
    let mut answers = Vec::new();
    for _ in 0..3 {
        answers.push(voice.incoming(&sid).await);
    }
    assert!(answers.iter().all(|answer| answer == &answers[0]), "{answers:?}");
    let (stream_url, token) = answers.remove(0);
    voice.deepgram.wait_for("the call's stream", |s| s.streams >= 1).await;
    let client = MediaClient::connect(&stream_url, &sid, &token).await;
    voice.call_until(&sid, "the stream connected", |c| c["status"] == "in_progress").await;
    // Once the stream is connected, a replay is answered with nothing to do.
    let (status, twiml) = incoming_from(&voice, &sid, CALLER).await;
    assert_eq!(status, 200);
    assert!(twiml.contains("<Response/>") && !twiml.contains("token"), "{twiml}");
    // The next call's stream is the second Deepgram ever sees.
    voice.incoming(&call_sid(11)).await;
    voice.deepgram.wait_for("the next call's stream", |s| s.streams >= 2).await;
    assert_eq!(voice.deepgram.seen().streams, 2);
    drop(client);
}
