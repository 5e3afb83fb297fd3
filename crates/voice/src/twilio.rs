//! Twilio's side of a call: the `<Connect><Stream>` TwiML, the media-stream
//! messages, and the REST calls (start a recording, hang up, download a
//! recording).

use std::time::Duration;

use base64::Engine as _;
use serde::Deserialize;
use serde_json::json;

/// A Twilio SID (`CA…` for calls, `RE…` for recordings, `MZ…` for streams):
/// two letters and up to 62 letters or digits. Checked where one enters, so it
/// is safe in a URL path, a file name and a store key.
pub fn is_sid(value: &str, prefix: &str) -> bool {
    value.len() >= 4
        && value.len() <= 64
        && value.starts_with(prefix)
        && value.bytes().all(|b| b.is_ascii_alphanumeric())
}

/// An E.164 phone number (`+` and 7 to 15 digits), the only caller id a call's
/// session is keyed by.
pub fn is_phone_number(value: &str) -> bool {
    let Some(digits) = value.strip_prefix('+') else { return false };
    (7..=15).contains(&digits.len())
        && digits.bytes().all(|b| b.is_ascii_digit())
        && !digits.starts_with('0')
}

/// `&`, `<`, `>`, `"` and `'` escaped for an XML attribute.
fn xml_attr(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c => out.push(c),
        }
    }
    out
}

/// The TwiML that connects a call to a bidirectional media stream at
/// `stream_url` (no query string: Twilio refuses one), carrying `token` as a
/// `<Parameter>` that comes back in the stream's `start` message.
pub fn connect_stream(stream_url: &str, token: &str) -> String {
    format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Response>\n  <Connect>\n    <Stream url=\"{}\">\n      <Parameter name=\"token\" value=\"{}\"/>\n    </Stream>\n  </Connect>\n</Response>\n",
        xml_attr(stream_url),
        xml_attr(token)
    )
}

/// An empty TwiML answer (status and recording callbacks).
pub const EMPTY_TWIML: &str = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Response/>\n";

/// The media-stream URL for a public base URL: `https` becomes `wss`.
pub fn stream_url(public_base: &str) -> String {
    let ws = if let Some(rest) = public_base.strip_prefix("https://") {
        format!("wss://{rest}")
    } else if let Some(rest) = public_base.strip_prefix("http://") {
        format!("ws://{rest}")
    } else {
        public_base.to_owned()
    };
    format!("{ws}/webhooks/twilio/voice/stream")
}

/// A message Twilio sends on the media stream.
#[derive(Debug, Deserialize)]
#[serde(tag = "event", rename_all = "lowercase")]
pub(crate) enum Inbound {
    Connected,
    Start {
        start: StartInfo,
    },
    Media {
        media: MediaInfo,
    },
    Mark {
        mark: MarkInfo,
    },
    Stop,
    /// `dtmf` and anything newer.
    #[serde(other)]
    Other,
}

#[derive(Debug, Deserialize)]
pub(crate) struct StartInfo {
    #[serde(rename = "streamSid")]
    pub(crate) stream_sid: String,
    #[serde(rename = "callSid", default)]
    pub(crate) call_sid: String,
    #[serde(rename = "customParameters", default)]
    pub(crate) custom_parameters: serde_json::Map<String, serde_json::Value>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct MediaInfo {
    #[serde(default)]
    pub(crate) track: Option<String>,
    pub(crate) payload: String,
}

#[derive(Debug, Deserialize)]
pub(crate) struct MarkInfo {
    pub(crate) name: String,
}

impl MediaInfo {
    /// The caller's μ-law audio this message carries: `None` for another
    /// track or a payload that is not base64.
    pub(crate) fn inbound_audio(&self) -> Option<Vec<u8>> {
        if self.track.as_deref().is_some_and(|t| t != "inbound") {
            return None;
        }
        base64::engine::general_purpose::STANDARD.decode(&self.payload).ok()
    }
}

/// One media-stream message as the stream reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// The stream started: its sid, the call's sid and the call token it carries.
    Start { stream_sid: String, call_sid: String, token: Option<String> },
    /// The caller's μ-law audio.
    Audio(Vec<u8>),
    /// Audio of another track, or a payload that is not base64: dropped.
    DroppedMedia,
    /// Twilio played the audio before this mark.
    Mark(String),
    /// The call hung up.
    Stop,
    /// `connected`, `dtmf` and anything newer.
    Other,
    /// Not a message of the protocol: ignored.
    Undecodable,
}

/// Reads one text message of the media stream, as the stream does.
pub fn read_frame(text: &str) -> Frame {
    match serde_json::from_str::<Inbound>(text) {
        Ok(Inbound::Start { start }) => Frame::Start {
            token: start.custom_parameters.get("token").and_then(|v| v.as_str()).map(str::to_owned),
            stream_sid: start.stream_sid,
            call_sid: start.call_sid,
        },
        Ok(Inbound::Media { media }) => match media.inbound_audio() {
            Some(audio) => Frame::Audio(audio),
            None => Frame::DroppedMedia,
        },
        Ok(Inbound::Mark { mark }) => Frame::Mark(mark.name),
        Ok(Inbound::Stop) => Frame::Stop,
        Ok(Inbound::Connected | Inbound::Other) => Frame::Other,
        Err(_) => Frame::Undecodable,
    }
}

/// A `media` message carrying μ-law `audio` to the caller.
pub(crate) fn media_message(stream_sid: &str, audio: &[u8]) -> String {
    let payload = base64::engine::general_purpose::STANDARD.encode(audio);
    json!({ "event": "media", "streamSid": stream_sid, "media": { "payload": payload } })
        .to_string()
}

/// A `mark` message: Twilio echoes it once the audio before it has played.
pub(crate) fn mark_message(stream_sid: &str, name: &str) -> String {
    json!({ "event": "mark", "streamSid": stream_sid, "mark": { "name": name } }).to_string()
}

/// A `clear` message: Twilio drops the audio it has not played yet.
pub(crate) fn clear_message(stream_sid: &str) -> String {
    json!({ "event": "clear", "streamSid": stream_sid }).to_string()
}

/// Twilio's REST API for one account.
#[derive(Clone)]
pub(crate) struct TwilioRest {
    pub(crate) http: reqwest::Client,
    pub(crate) base_url: String,
    pub(crate) account_sid: String,
    pub(crate) auth_token: String,
}

impl std::fmt::Debug for TwilioRest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TwilioRest").field("base_url", &self.base_url).finish_non_exhaustive()
    }
}

/// A REST call that did not succeed; never holds a secret.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RestError {
    #[error("Twilio answered {status}")]
    Status { status: u16 },
    #[error("Twilio could not be reached: {0}")]
    Network(String),
    #[error("the download is not a WAV file")]
    NotWav,
}

impl RestError {
    fn of(err: &reqwest::Error) -> Self {
        // Without the URL: it names the account.
        RestError::Network(err.without_url_string())
    }

    /// Whether trying again later can help (a recording not ready yet, a
    /// server error, the network).
    pub(crate) fn retryable(&self) -> bool {
        match self {
            RestError::Status { status } => *status == 404 || *status == 429 || *status >= 500,
            RestError::Network(_) => true,
            RestError::NotWav => false,
        }
    }
}

trait WithoutUrl {
    fn without_url_string(&self) -> String;
}

impl WithoutUrl for reqwest::Error {
    fn without_url_string(&self) -> String {
        let mut error = format!("{self}");
        if let Some(url) = self.url() {
            error = error.replace(url.as_str(), "<twilio>");
        }
        error
    }
}

const REST_TIMEOUT: Duration = Duration::from_secs(10);

impl TwilioRest {
    fn account_url(&self, rest: &str) -> String {
        format!("{}/2010-04-01/Accounts/{}/{rest}", self.base_url, self.account_sid)
    }

    async fn post_form(&self, url: String, form: &[(&str, &str)]) -> Result<(), RestError> {
        let response = self
            .http
            .post(url)
            .basic_auth(&self.account_sid, Some(&self.auth_token))
            .form(form)
            .timeout(REST_TIMEOUT)
            .send()
            .await
            .map_err(|e| RestError::of(&e))?;
        let status = response.status().as_u16();
        if (200..300).contains(&status) {
            Ok(())
        } else {
            Err(RestError::Status { status })
        }
    }

    /// Ends a call (`Status=completed`); a call already over (404) is not an error.
    pub(crate) async fn hang_up(&self, call_sid: &str) -> Result<(), RestError> {
        match self
            .post_form(
                self.account_url(&format!("Calls/{call_sid}.json")),
                &[("Status", "completed")],
            )
            .await
        {
            Err(RestError::Status { status: 404 }) => Ok(()),
            other => other,
        }
    }

    /// Starts a dual-channel recording of a live call; Twilio calls
    /// `callback` when it is ready.
    pub(crate) async fn start_recording(
        &self,
        call_sid: &str,
        callback: &str,
    ) -> Result<(), RestError> {
        let form = [
            ("RecordingChannels", "dual"),
            ("RecordingTrack", "both"),
            ("RecordingStatusCallback", callback),
            ("RecordingStatusCallbackEvent", "completed"),
            ("Trim", "do-not-trim"),
        ];
        self.post_form(self.account_url(&format!("Calls/{call_sid}/Recordings.json")), &form).await
    }

    /// The recording's WAV file (both channels), checked to be one.
    pub(crate) async fn download_recording(
        &self,
        recording_sid: &str,
    ) -> Result<bytes::Bytes, RestError> {
        let url = self.account_url(&format!("Recordings/{recording_sid}.wav?RequestedChannels=2"));
        let response = self
            .http
            .get(url)
            .basic_auth(&self.account_sid, Some(&self.auth_token))
            .timeout(Duration::from_secs(60))
            .send()
            .await
            .map_err(|e| RestError::of(&e))?;
        let status = response.status().as_u16();
        if status != 200 {
            return Err(RestError::Status { status });
        }
        let body = response.bytes().await.map_err(|e| RestError::of(&e))?;
        if !crate::recording::is_wav(&body) {
            return Err(RestError::NotWav);
        }
        Ok(body)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stream_twiml_carries_the_token_as_a_parameter_and_no_query_string() {
        let twiml = connect_stream(&stream_url("https://voice.example.com"), "t&k\"1");
        assert_eq!(
            twiml,
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Response>\n  <Connect>\n    <Stream url=\"wss://voice.example.com/webhooks/twilio/voice/stream\">\n      <Parameter name=\"token\" value=\"t&amp;k&quot;1\"/>\n    </Stream>\n  </Connect>\n</Response>\n"
        );
        assert_eq!(
            stream_url("http://127.0.0.1:9"),
            "ws://127.0.0.1:9/webhooks/twilio/voice/stream"
        );
    }

    #[test]
    fn media_stream_messages_parse_from_the_documented_json() {
        let start: Inbound = serde_json::from_str(
            r#"{"event":"start","sequenceNumber":"1","start":{"accountSid":"AC123","streamSid":"MZ18ad3ab5a668481ce02b83e7395059f0","callSid":"CA123","tracks":["inbound"],"mediaFormat":{"encoding":"audio/x-mulaw","sampleRate":8000,"channels":1},"customParameters":{"token":"abc"}},"streamSid":"MZ18ad3ab5a668481ce02b83e7395059f0"}"#,
        )
        .unwrap();
        let Inbound::Start { start } = start else { panic!("{start:?}") };
        assert_eq!(start.call_sid, "CA123");
        assert_eq!(start.custom_parameters["token"], "abc");
        let media: Inbound = serde_json::from_str(
            r#"{"event":"media","sequenceNumber":"3","media":{"track":"inbound","chunk":"1","timestamp":"5","payload":"no+JhoaJjpzN"},"streamSid":"MZ1"}"#,
        )
        .unwrap();
        assert!(matches!(media, Inbound::Media { media } if media.payload == "no+JhoaJjpzN"));
        let dtmf: Inbound = serde_json::from_str(
            r#"{"event":"dtmf","streamSid":"MZ1","sequenceNumber":"5","dtmf":{"track":"inbound_track","digit":"1"}}"#,
        )
        .unwrap();
        assert!(matches!(dtmf, Inbound::Other));
        let stop: Inbound = serde_json::from_str(
            r#"{"event":"stop","sequenceNumber":"5","streamSid":"MZ1","stop":{"accountSid":"AC1","callSid":"CA1"}}"#,
        )
        .unwrap();
        assert!(matches!(stop, Inbound::Stop));
    }

    #[test]
    fn frames_read_as_the_stream_uses_them() {
        let start = read_frame(
            r#"{"event":"start","start":{"streamSid":"MZ1","callSid":"CA1","customParameters":{"token":"abc"}},"streamSid":"MZ1"}"#,
        );
        assert_eq!(
            start,
            Frame::Start {
                stream_sid: "MZ1".to_owned(),
                call_sid: "CA1".to_owned(),
                token: Some("abc".to_owned())
            }
        );
        let audio = read_frame(r#"{"event":"media","media":{"track":"inbound","payload":"/38="}}"#);
        assert_eq!(audio, Frame::Audio(vec![0xFF, 0x7F]));
        // Another track and a payload that is not base64 are dropped.
        for dropped in [
            r#"{"event":"media","media":{"track":"outbound","payload":"/38="}}"#,
            r#"{"event":"media","media":{"payload":"not base64!"}}"#,
        ] {
            assert_eq!(read_frame(dropped), Frame::DroppedMedia, "{dropped}");
        }
        assert_eq!(
            read_frame(r#"{"event":"mark","mark":{"name":"turn-1"}}"#),
            Frame::Mark("turn-1".to_owned())
        );
        assert_eq!(read_frame(r#"{"event":"stop"}"#), Frame::Stop);
        assert_eq!(read_frame(r#"{"event":"connected","protocol":"Call"}"#), Frame::Other);
        for undecodable in ["", "{", r#"{"event":"start"}"#, r#"{"event":"media"}"#, "[1]"] {
            assert_eq!(read_frame(undecodable), Frame::Undecodable, "{undecodable}");
        }
    }

    #[test]
    fn sids_and_numbers_are_checked_where_they_enter() {
        assert!(is_sid("CA0123456789abcdef0123456789abcdef", "CA"));
        assert!(!is_sid("CA../../etc", "CA"));
        assert!(!is_sid("RE0123", "CA"));
        assert!(is_phone_number("+15551230100"));
        for bad in ["15551230100", "+1555", "+0123456789", "+1555123010a", "anonymous", "+1 555"] {
            assert!(!is_phone_number(bad), "{bad}");
        }
    }
}
