//! Telegram's flood limits as the fake enforces them: one message a second per
//! chat, twenty a minute per group, thirty a second overall (per bot).

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use tokio::time::Instant;

/// The window of the per-group limit.
const GROUP_WINDOW: Duration = Duration::from_secs(60);
/// The window of the overall limit.
const OVERALL_WINDOW: Duration = Duration::from_secs(1);

/// What the fake does with a call over a limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Enforcement {
    /// Answer 429 with `retry_after`, as Telegram does, and record a violation.
    Reject,
    /// Record a violation but answer the call normally, so a test can assert the
    /// limits were kept without changing what the client sees.
    RecordOnly,
    /// No limits at all.
    Off,
}

/// The limits on `sendMessage` and `editMessageText`, per bot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateLimits {
    /// Shortest gap after the previous accepted call for the same chat, measured
    /// when the calls arrive: one second, as Telegram asks.
    pub chat_interval: Duration,
    /// Most calls accepted for one group chat (negative id) in any 60 s.
    pub group_per_minute: usize,
    /// Most calls accepted across all chats in any 1 s.
    pub overall_per_second: usize,
    pub enforcement: Enforcement,
}

impl RateLimits {
    /// Telegram's published limits, enforced with 429 answers.
    pub fn telegram() -> Self {
        RateLimits {
            chat_interval: Duration::from_secs(1),
            group_per_minute: 20,
            overall_per_second: 30,
            enforcement: Enforcement::Reject,
        }
    }

    /// No limits: every call is accepted and nothing is recorded.
    pub fn off() -> Self {
        RateLimits { enforcement: Enforcement::Off, ..RateLimits::telegram() }
    }
}

/// Which limit a call broke.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitKind {
    /// Too soon after the previous call for the same chat.
    ChatInterval,
    /// Over the per-group budget for the last 60 s.
    GroupPerMinute,
    /// Over the overall budget for the last second.
    OverallPerSecond,
}

/// The accepted calls of one bot, as far back as the limits look.
#[derive(Debug, Default)]
pub(super) struct Limiter {
    last_by_chat: HashMap<i64, Instant>,
    by_group: HashMap<i64, VecDeque<Instant>>,
    overall: VecDeque<Instant>,
}

impl Limiter {
    /// The limit a call for `chat_id` at `now` would break, and how long until it
    /// would not.
    pub(super) fn check(
        &mut self,
        limits: &RateLimits,
        chat_id: i64,
        now: Instant,
    ) -> Option<(LimitKind, Duration)> {
        forget_before(&mut self.overall, now, OVERALL_WINDOW);
        if let Some(last) = self.last_by_chat.get(&chat_id) {
            let since = now.saturating_duration_since(*last);
            if since < limits.chat_interval {
                return Some((LimitKind::ChatInterval, limits.chat_interval - since));
            }
        }
        if let Some(window) = self.by_group.get_mut(&chat_id) {
            forget_before(window, now, GROUP_WINDOW);
            if window.len() >= limits.group_per_minute {
                let wait = window.front().map_or(GROUP_WINDOW, |oldest| {
                    (*oldest + GROUP_WINDOW).saturating_duration_since(now)
                });
                return Some((LimitKind::GroupPerMinute, wait));
            }
        }
        if self.overall.len() >= limits.overall_per_second {
            let wait = self.overall.front().map_or(OVERALL_WINDOW, |oldest| {
                (*oldest + OVERALL_WINDOW).saturating_duration_since(now)
            });
            return Some((LimitKind::OverallPerSecond, wait));
        }
        None
    }

    /// Counts an accepted call for `chat_id` at `now`.
    pub(super) fn record(&mut self, chat_id: i64, now: Instant) {
        self.last_by_chat.insert(chat_id, now);
        if chat_id < 0 {
            self.by_group.entry(chat_id).or_default().push_back(now);
        }
        self.overall.push_back(now);
    }
}

/// Drops the instants that are `window` or more before `now`.
fn forget_before(times: &mut VecDeque<Instant>, now: Instant, window: Duration) {
    while times.front().is_some_and(|t| now.saturating_duration_since(*t) >= window) {
        times.pop_front();
    }
}

/// `retry_after` for a wait: whole seconds, rounded up, at least one.
pub(super) fn retry_after_secs(wait: Duration) -> u64 {
    let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    secs.max(1)
}
