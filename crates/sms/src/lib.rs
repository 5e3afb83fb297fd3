//! Twilio SMS for Lemon Gateway: webhook signature check, inbound inbox and the SMS tools.
//!
//! [`signature`] is shared with the voice channel, whose webhooks Twilio signs
//! the same way.

pub mod signature;
