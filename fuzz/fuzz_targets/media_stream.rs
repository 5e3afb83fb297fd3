//! Twilio Media Streams: each text message of a call's stream read as the
//! stream reads it, the caller's audio decoded from μ-law.
//!
//! Input: messages, one a line.
//! Properties: a `start` carries the frame's sids and token; audio is the
//! base64 of the frame's payload (it encodes back to it) from the inbound
//! track; a mark carries its name; decoded μ-law samples quantise back to
//! themselves.
#![no_main]

use base64::Engine as _;
use lemon_voice::g711;
use lemon_voice::twilio::{read_frame, Frame};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    for line in text.lines().take(64) {
        let frame = read_frame(line);
        let raw = serde_json::from_str::<Value>(line).ok();
        let field = |path: &[&str]| {
            let mut at = raw.as_ref()?;
            for key in path {
                at = at.get(key)?;
            }
            at.as_str().map(str::to_owned)
        };
        match frame {
            Frame::Start { stream_sid, call_sid, token } => {
                assert_eq!(field(&["event"]).as_deref(), Some("start"));
                assert_eq!(Some(stream_sid), field(&["start", "streamSid"]));
                assert_eq!(call_sid, field(&["start", "callSid"]).unwrap_or_default());
                assert_eq!(token, field(&["start", "customParameters", "token"]));
            }
            Frame::Audio(audio) => {
                assert_eq!(field(&["event"]).as_deref(), Some("media"));
                let track = field(&["media", "track"]);
                assert!(track.is_none() || track.as_deref() == Some("inbound"), "{track:?}");
                let payload = field(&["media", "payload"]).expect("a media payload");
                assert_eq!(base64::engine::general_purpose::STANDARD.encode(&audio), payload);
                let samples = g711::decode_all(&audio);
                assert_eq!(samples.len(), audio.len());
                for (byte, sample) in audio.iter().zip(samples) {
                    assert_eq!(g711::decode(g711::encode(sample)), sample, "byte {byte:#04x}");
                }
            }
            Frame::Mark(name) => {
                assert_eq!(field(&["event"]).as_deref(), Some("mark"));
                assert_eq!(Some(name), field(&["mark", "name"]));
            }
            Frame::Stop => assert_eq!(field(&["event"]).as_deref(), Some("stop")),
            Frame::DroppedMedia => assert_eq!(field(&["event"]).as_deref(), Some("media")),
            Frame::Other | Frame::Undecodable => {}
        }
    }
});
