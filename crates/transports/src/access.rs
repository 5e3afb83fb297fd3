//! Who may talk to the gateway through a chat channel, the one rule every
//! channel (Telegram, Discord, email, XMTP, SMS replies) uses.
//!
//! - A chat, user or sender gets a run only when it is on the channel's
//!   allow-list. **An empty list lets nobody in**: a run has the owner's tools,
//!   so a bot nobody restricted must not answer the first stranger who finds it.
//! - A public bot is an explicit opt-in, `allow_everyone = true`, warned about
//!   (WARN) at every start of the channel and shown in its status detail
//!   (`lemon-gateway status`, `/v1/status`) and by `doctor`.
//! - A refusal is logged at INFO, naming the channel, the list's key and the id
//!   refused (escaped for the log), once per id per start, so the owner can
//!   copy the id into the list without a stranger being able to flood the log.
//!
//! What a refused message gets otherwise (no answer at all, or a short "not
//! allowed" where the protocol demands an answer) is the channel's business;
//! it never gets a run, and nothing of it is stored.

use std::collections::HashSet;
use std::sync::Mutex;

use lemon_core::log_text;

/// The key that opens a channel to everyone.
pub const ALLOW_EVERYONE_KEY: &str = "allow_everyone";

/// What status shows, after the channel's own detail, for a channel open to
/// everyone.
pub const OPEN_TO_EVERYONE: &str = "open to everyone (allow_everyone = true)";

/// How many refused ids are remembered so each is logged once; past that the
/// memory starts over (a stranger flood cannot grow it without bound).
const REMEMBERED_REFUSALS: usize = 4096;

/// Longest id written to the log (ids are short; anything longer is not an id).
const MAX_LOGGED_ID: usize = 256;

/// One channel's access rule for one start: `allow_everyone`, and the ids
/// already logged as refused.
#[derive(Debug)]
pub struct Access {
    channel: &'static str,
    allow_everyone: bool,
    refused: Mutex<HashSet<String>>,
}

impl Access {
    /// The rule of `channel` (its transport id, for the log).
    pub fn new(channel: &'static str, allow_everyone: bool) -> Self {
        Access { channel, allow_everyone, refused: Mutex::new(HashSet::new()) }
    }

    /// Whether the channel is open to everyone.
    pub fn allow_everyone(&self) -> bool {
        self.allow_everyone
    }

    /// Whether one that is `listed` (on the channel's allow-lists, as the
    /// channel combines them) gets in: listed, or everyone is allowed.
    pub fn admits(&self, listed: bool) -> bool {
        self.allow_everyone || listed
    }

    /// [`Access::admits`], logging a refusal of `what` (`"chat"`, `"sender"`)
    /// with `id`, which is not in the list `key`.
    pub fn check(&self, listed: bool, what: &str, id: &str, key: &str) -> bool {
        if self.admits(listed) {
            return true;
        }
        self.refused(what, id, key);
        false
    }

    /// Logs (INFO) that `what` `id` got no run because it is not in `key`,
    /// once per id per start.
    pub fn refused(&self, what: &str, id: &str, key: &str) {
        let id = log_text::escape_within(id, MAX_LOGGED_ID);
        {
            let mut refused =
                self.refused.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if refused.len() >= REMEMBERED_REFUSALS {
                refused.clear();
            }
            if !refused.insert(format!("{what}\u{0}{id}")) {
                return;
            }
        }
        tracing::info!(
            channel = self.channel,
            refused = %id,
            "a {what} not in {key} got no run; to let it in, add {id} to {key} in [gateway.{}]",
            self.channel
        );
    }

    /// Warns (WARN) when the channel is open to everyone; called at every start.
    pub fn warn_at_start(&self) {
        if self.allow_everyone {
            tracing::warn!(
                channel = self.channel,
                "[gateway.{}] allow_everyone = true: anyone who finds this channel gets runs with the gateway's tools",
                self.channel
            );
        }
    }

    /// The channel's status `detail`, with [`OPEN_TO_EVERYONE`] after it when
    /// it is open to everyone.
    pub fn detail(&self, detail: String) -> String {
        status_detail(detail, self.allow_everyone)
    }
}

/// A status `detail`, with [`OPEN_TO_EVERYONE`] after it when the channel is
/// open to everyone.
pub fn status_detail(detail: String, allow_everyone: bool) -> String {
    if allow_everyone {
        format!("{detail}; {OPEN_TO_EVERYONE}")
    } else {
        detail
    }
}

/// Who a channel's configuration lets in, as `doctor` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reach {
    /// `allow_everyone = true`.
    Everyone,
    /// This many entries on the allow-lists.
    Listed(usize),
    /// Every list empty: nobody gets a run.
    Nobody,
}

impl Reach {
    /// The reach of a channel with `allow_everyone` and `listed` entries on its lists.
    pub fn of(allow_everyone: bool, listed: usize) -> Self {
        match (allow_everyone, listed) {
            (true, _) => Reach::Everyone,
            (false, 0) => Reach::Nobody,
            (false, n) => Reach::Listed(n),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_listed_get_in_unless_everyone_is_allowed() {
        let closed = Access::new("telegram", false);
        assert!(closed.admits(true));
        assert!(!closed.admits(false));
        assert!(closed.check(true, "chat", "42", "allowed_chat_ids"));
        assert!(!closed.check(false, "chat", "7", "allowed_chat_ids"));
        let open = Access::new("telegram", true);
        assert!(open.admits(false));
        assert!(open.check(false, "chat", "7", "allowed_chat_ids"));
    }

    #[test]
    fn an_empty_list_lets_nobody_in() {
        let list: Vec<i64> = Vec::new();
        let access = Access::new("telegram", false);
        assert!(!access.admits(list.contains(&1)));
        assert_eq!(Reach::of(false, list.len()), Reach::Nobody);
        assert_eq!(Reach::of(false, 2), Reach::Listed(2));
        assert_eq!(Reach::of(true, 0), Reach::Everyone);
    }

    #[test]
    fn status_says_when_a_channel_is_open_to_everyone() {
        assert_eq!(Access::new("discord", false).detail("@bot".into()), "@bot");
        assert_eq!(
            Access::new("discord", true).detail("@bot".into()),
            "@bot; open to everyone (allow_everyone = true)"
        );
    }

    #[test]
    fn each_refused_id_is_remembered_once_and_the_memory_is_bounded() {
        let access = Access::new("xmtp", false);
        access.refused("sender", "abc", "allowed_senders");
        access.refused("sender", "abc", "allowed_senders");
        access.refused("sender", "line\nbreak", "allowed_senders");
        let remembered = access.refused.lock().unwrap().clone();
        assert_eq!(remembered.len(), 2);
        assert!(remembered.contains("sender\u{0}line\\nbreak"), "escaped: {remembered:?}");
        for n in 0..REMEMBERED_REFUSALS + 10 {
            access.refused("sender", &n.to_string(), "allowed_senders");
        }
        assert!(access.refused.lock().unwrap().len() <= REMEMBERED_REFUSALS);
    }
}
