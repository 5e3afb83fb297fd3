//! Checks of recorded calls that every channel's outbox tests share.

use std::fmt::Debug;
use std::time::Duration;

use tokio::time::Instant;

/// The calls, without the times they started.
pub(crate) fn just_calls<C: Clone>(calls: &[(C, Instant)]) -> Vec<C> {
    calls.iter().map(|(call, _)| call.clone()).collect()
}

/// The most calls that started within any window of `window` (half-open).
pub(crate) fn most_calls_in_any_window(times: &[Instant], window: Duration) -> usize {
    let mut times = times.to_vec();
    times.sort();
    (0..times.len())
        .map(|i| times[i..].iter().take_while(|&&t| t < times[i] + window).count())
        .max()
        .unwrap_or(0)
}

/// Each call started at least `at_least` after the one before it.
pub(crate) fn assert_spaced<C: Debug>(calls: &[(C, Instant)], at_least: Duration) {
    for pair in calls.windows(2) {
        let gap = pair[1].1 - pair[0].1;
        assert!(gap >= at_least, "{:?} then {:?} only {gap:?} apart", pair[0].0, pair[1].0);
    }
}
