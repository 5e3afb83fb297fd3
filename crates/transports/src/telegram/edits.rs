//! `edit_throttle_ms`: how often a run's progress message is edited.
//!
//! After the progress message is shown (sent or edited), it is not edited
//! again before the interval has passed; changes in between wait, and the
//! newest of them is shown once the interval is over. The run's last edit is
//! not paced here: it is made when the run ends. The outbox's own pace (one
//! call a second per chat) comes on top.
//!
//! Plain state: the run's follower asks [`EditPacer::changed`] on each change,
//! sleeps until [`EditPacer::due`] and then calls [`EditPacer::fire`].

use std::time::Duration;

use tokio::time::Instant;

/// When a progress message may be edited next.
#[derive(Debug, Clone)]
pub struct EditPacer {
    interval: Duration,
    /// When the message last changed in the chat.
    last_shown: Option<Instant>,
    /// A change is waiting for the interval to pass.
    waiting: bool,
}

impl EditPacer {
    pub fn new(interval: Duration) -> Self {
        EditPacer { interval, last_shown: None, waiting: false }
    }

    /// The message now shows the newest text (it was just sent or edited).
    pub fn shown(&mut self, now: Instant) {
        self.last_shown = Some(now);
        self.waiting = false;
    }

    /// The text changed at `now`: true when the edit is to be made now (and
    /// it counts as shown); false when it waits for [`EditPacer::due`].
    pub fn changed(&mut self, now: Instant) -> bool {
        match self.last_shown {
            Some(last) if now < last + self.interval => {
                self.waiting = true;
                false
            }
            _ => {
                self.shown(now);
                true
            }
        }
    }

    /// When a waiting change is to be shown.
    pub fn due(&self) -> Option<Instant> {
        match (self.waiting, self.last_shown) {
            (true, Some(last)) => Some(last + self.interval),
            (true, None) => Some(Instant::now()),
            (false, _) => None,
        }
    }

    /// True when a waiting change is due at `now`: the caller edits the
    /// message to the newest text, and it counts as shown.
    pub fn fire(&mut self, now: Instant) -> bool {
        if self.due().is_some_and(|due| due <= now) {
            self.shown(now);
            return true;
        }
        false
    }
}

#[cfg(test)]
mod tests;
