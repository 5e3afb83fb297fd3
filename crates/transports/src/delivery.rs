//! The way answers go back out, shared by every channel: what a channel needs
//! to get a run's answer to its user without losing it, so that a new channel
//! only renders and sends.
//!
//! - [`Backoff`]: how long to wait before the next attempt after a failure.

mod backoff;

pub use backoff::Backoff;
