//! Wall-clock time for timestamps that leave the process (stored rows, API bodies).
//!
//! Durations and deadlines use `tokio::time::Instant` so tests can pause time; this
//! module is only for "when did it happen" in milliseconds since the Unix epoch.

use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch, saturating at zero for clocks set before 1970.
pub fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}
