//! Twilio voice calls for Lemon Gateway: a caller talks to the agent.
//!
//! - `POST /webhooks/twilio/voice` (signed by Twilio, checked against
//!   `public_url`) answers `<Connect><Stream>` with a one-time token for the
//!   call, and opens the call's Deepgram stream while Twilio connects.
//! - The media stream (`/webhooks/twilio/voice/stream`) checks the token on
//!   `start`; the caller's μ-law audio goes to Deepgram as it arrives; each
//!   turn is a run in session `voice:<from>`; the answer is spoken sentence
//!   by sentence by ElevenLabs and sent back as `media` frames and `mark`s
//!   ([`call`] has the turn-taking and barge-in rules).
//! - Status and recording callbacks; recordings are saved as WAV under
//!   `$LEMON_HOME/recordings/<date>/`.
//! - Calls are recorded in the kv store ([`calls`]) and listed by
//!   `GET /v1/calls`; each turn's timings go on the bus as `voice_turn`.

pub mod call;
pub mod calls;
pub mod config;
mod deepgram;
pub mod g711;
pub mod recording;
mod service;
mod tts;
pub mod twilio;

pub use calls::{api_doc, api_routes, CallRecords, CALLS_NAMESPACE};
pub use config::{VoiceConfig, VoiceConfigError, VoiceSecrets, DEFAULT_VOICE_PORT};
pub use service::{VoiceDeps, VoiceTransport};

/// The transport's id, in status, logs and bindings (`transport = "voice"`).
pub const TRANSPORT_ID: &str = "voice";
