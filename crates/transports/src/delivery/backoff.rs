//! Exponential backoff between attempts.

use std::time::Duration;

/// Waits that double from `initial` after each failure, up to `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// The wait after the first failure.
    pub initial: Duration,
    /// The longest wait.
    pub max: Duration,
}

impl Backoff {
    pub const fn new(initial: Duration, max: Duration) -> Self {
        Backoff { initial, max }
    }

    /// The wait after `failures` failed attempts (1 for the first failure):
    /// `initial`, twice that, four times… never more than `max`. No wait
    /// before any attempt failed.
    pub fn delay(&self, failures: u32) -> Duration {
        if failures == 0 {
            return Duration::ZERO;
        }
        let doublings = (failures - 1).min(20);
        self.initial.saturating_mul(1 << doublings).min(self.max.max(self.initial))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_double_up_to_the_longest() {
        let backoff = Backoff::new(Duration::from_millis(250), Duration::from_secs(2));
        let waits: Vec<u64> = (0..7).map(|n| backoff.delay(n).as_millis() as u64).collect();
        assert_eq!(waits, [0, 250, 500, 1000, 2000, 2000, 2000]);
        // Far past the cap: no overflow.
        assert_eq!(backoff.delay(u32::MAX), Duration::from_secs(2));
    }

    #[test]
    fn a_longest_wait_below_the_first_is_the_first() {
        let backoff = Backoff::new(Duration::from_secs(3), Duration::from_secs(1));
        assert_eq!(backoff.delay(1), Duration::from_secs(3));
        assert_eq!(backoff.delay(5), Duration::from_secs(3));
    }
}
