//! Twilio SMS for Lemon Gateway: webhook signature check, inbound inbox and the SMS tools.
//!
//! The crate is a placeholder in the workspace layout; the SMS channel fills it.
