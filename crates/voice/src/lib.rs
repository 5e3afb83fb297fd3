//! Twilio voice calls for Lemon Gateway: media streams, speech-to-text, text-to-speech and G.711.
//!
//! The crate is a placeholder in the workspace layout; the voice channel fills it.
