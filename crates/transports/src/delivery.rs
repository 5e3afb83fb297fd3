//! The way answers go back out, shared by every channel: what a channel needs
//! to get a run's answer to its user without losing it, so that a new channel
//! only renders and sends.
//!
//! - [`Backoff`]: how long to wait before the next attempt after a failure.
//! - [`DeliveryRecords`]: durable records of what is still owed, so a restart
//!   delivers it, and a count of what was given up on.
//! - [`Outbox`]: every write call of a channel, paced within the channel's
//!   limits, in order per destination, with edits coalesced and failures
//!   retried as the channel's [`Sink`] classifies them.

mod answer;
mod backoff;
pub mod outbox;
mod records;

pub use answer::plain_answer;
pub use backoff::Backoff;
pub use outbox::{DeliveryError, Failure, Outbox, OutboxSettings, OutboxStats, Sink, Window};
pub use records::{DeliveryRecord, DeliveryRecords, Recovered};
