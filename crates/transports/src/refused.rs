//! What a chat channel answers when the router does not take a message, the
//! one rule every chat (Telegram, Discord, email, XMTP, SMS, voice calls) uses.
//!
//! - A refusal the user can act on (an invalid resume token, a full queue, an
//!   unknown engine) is answered every time, as [`RouteError::chat_reply`]
//!   words it.
//! - A store that cannot save the request ([`RouteError::Journal`]: a full
//!   disk, a read-only file system, an I/O error) is told **once per
//!   conversation** while it lasts, in plain words ([`StoreNotice`]), never as
//!   the store's own error (it names paths and SQLite's messages). Every later
//!   message of that conversation gets no answer until one of its requests is
//!   accepted again ([`Refusals::accepted`]); the next failure is told again.
//!   A protocol that must answer every message answers [`STILL_FAILING`].
//!
//! The memory is per channel and per start, and bounded: past
//! [`REMEMBERED_CONVERSATIONS`] it starts over, so a flood of conversations
//! cannot grow it (a conversation forgotten that way may be told twice).

use std::collections::HashSet;
use std::sync::{Mutex, PoisonError};

use lemon_core::ids::SessionKey;
use lemon_core::router::RouteError;

/// How many conversations told about a failing store are remembered.
pub const REMEMBERED_CONVERSATIONS: usize = 4096;

/// The short answer for a protocol that must answer every message (a Discord
/// slash command, a turn of a phone call) once the notice was given.
pub const STILL_FAILING: &str = "Still not accepted: the gateway's storage is failing.";

/// What happens to a message the store could not save, which decides what the
/// notice promises.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreNotice {
    /// The message is gone (a chat message, an SMS): the sender sends it again.
    SendAgain,
    /// The message waits where it came from and is handed over again (a mail
    /// left unread in the mailbox): nothing to do.
    Kept,
}

impl StoreNotice {
    /// The notice, in words a user can act on.
    pub fn text(self) -> &'static str {
        match self {
            StoreNotice::SendAgain => {
                "The gateway cannot save messages right now (its storage is failing), \
                 so nothing was accepted. Please send it again later."
            }
            StoreNotice::Kept => {
                "The gateway cannot save messages right now (its storage is failing), \
                 so this mail was not taken yet. It waits and is taken once the gateway \
                 can save again; there is no need to send it again."
            }
        }
    }
}

/// One channel's answers to refused messages, and the conversations already
/// told that the store is failing.
#[derive(Debug)]
pub struct Refusals {
    notice: StoreNotice,
    /// Conversations told about the failing store and not accepted since.
    told: Mutex<HashSet<SessionKey>>,
}

impl Refusals {
    pub fn new(notice: StoreNotice) -> Self {
        Refusals { notice, told: Mutex::new(HashSet::new()) }
    }

    /// The answer to a message of `session` that the router refused with
    /// `error`: `None` when the store is failing and the conversation was told
    /// so already.
    pub fn reply(&self, session: &SessionKey, error: &RouteError) -> Option<String> {
        if !matches!(error, RouteError::Journal(_)) {
            return Some(error.chat_reply());
        }
        let mut told = self.told.lock().unwrap_or_else(PoisonError::into_inner);
        if told.contains(session) {
            return None;
        }
        if told.len() >= REMEMBERED_CONVERSATIONS {
            told.clear();
        }
        told.insert(session.clone());
        Some(self.notice.text().to_owned())
    }

    /// A request of `session` was accepted: the store saves again, and a
    /// later failure is told again.
    pub fn accepted(&self, session: &SessionKey) {
        self.told.lock().unwrap_or_else(PoisonError::into_inner).remove(session);
    }
}

#[cfg(test)]
mod tests;
