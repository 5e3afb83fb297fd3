//! Twilio voice calls for Lemon Gateway: media streams, speech-to-text, text-to-speech and G.711.

pub mod g711;
