//! Approval requests in a chat, the one way every chat (Telegram and
//! Discord with buttons, SMS by reply) offers them and takes the answer.
//!
//! - When a run of the chat asks, the chat gets "Allow this?" with the tool
//!   and its command, path or host, and Approve, Deny and "Always for this
//!   session" buttons whose data is `apr:a:<id>` / `apr:d:<id>` /
//!   `apr:s:<id>` ([`button_data`]).
//! - A press is read on only when its data has a request id's shape
//!   ([`parse_press`]); it counts only from the place the request was offered
//!   in ([`Offered`]), and only if that place may talk to the bot.
//! - Once the request is settled, the message says how and loses its buttons
//!   ([`settled_text`]).
//! - Where there are no buttons (SMS), the question names the request's four
//!   digit code and a reply `yes 4821` / `no 4821` / `always 4821` answers
//!   it ([`ask_text_by_reply`], [`parse_text_reply`]).

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use lemon_core::approvals::{AnswerError, PendingApproval, Reply};
use lemon_core::engine::Action;

const APPROVE: &str = "apr:a:";
const DENY: &str = "apr:d:";
const ALWAYS: &str = "apr:s:";

/// The label of the button that approves for the rest of the session.
pub const ALWAYS_LABEL: &str = "Always for this session";

/// The data of request `id`'s buttons: Approve, Deny, Always for this session.
pub fn button_data(id: &str) -> [String; 3] {
    [format!("{APPROVE}{id}"), format!("{DENY}{id}"), format!("{ALWAYS}{id}")]
}

/// A press's data: the answer and the request id. `None` for data that is
/// not a button of ours or carries no request id's shape (the data comes
/// from the chat, so nothing else of it is read or logged).
pub fn parse_press(data: &str) -> Option<(Reply, &str)> {
    let (reply, id) = [(APPROVE, Reply::Approve), (DENY, Reply::Deny), (ALWAYS, Reply::Always)]
        .into_iter()
        .find_map(|(prefix, reply)| data.strip_prefix(prefix).map(|id| (reply, id)))?;
    lemon_core::approvals::is_request_id(id).then_some((reply, id))
}

/// The request of an approval action, as its `detail.approval` carries it.
pub fn request_of(action: &Action) -> Option<PendingApproval> {
    serde_json::from_value(action.detail["approval"].clone()).ok()
}

/// `tool: subject`, the line that says what is asked.
fn what(request: &PendingApproval) -> String {
    format!("{}: {}", request.tool, request.subject)
}

/// The question a chat is asked.
pub fn ask_text(request: &PendingApproval) -> String {
    let outside = request
        .untrusted
        .as_deref()
        .map(|source| format!("\n(asked by a run of outside text: {source})"))
        .unwrap_or_default();
    format!("Allow this?\n{}{outside}", what(request))
}

/// The question by text, where there are no buttons (SMS, email): the reply
/// names the request's code.
pub fn ask_text_by_reply(request: &PendingApproval) -> String {
    format!(
        "{}\nReply yes {code} or no {code} (always {code}: yes for the rest of this conversation).",
        ask_text(request),
        code = request.code
    )
}

/// A reply by text to a request: `yes 4821`, `no 4821` or `always 4821`
/// (also `y`, `n`, `approve`, `deny`; any case, surrounding space ignored).
/// `None` for anything else, which is an ordinary message.
pub fn parse_text_reply(text: &str) -> Option<(Reply, &str)> {
    let mut words = text.split_whitespace();
    let (verb, code) = (words.next()?, words.next()?);
    if words.next().is_some() || code.len() != 4 || !code.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    match verb.to_ascii_lowercase().as_str() {
        "yes" | "y" | "approve" => Some((Reply::Approve, code)),
        "no" | "n" | "deny" => Some((Reply::Deny, code)),
        "always" => Some((Reply::Always, code)),
        _ => None,
    }
}

/// What the question becomes once `action` (the approval's completion)
/// settled it.
pub fn settled_text(request: &PendingApproval, action: &Action) -> String {
    let settled = action.message.as_deref().unwrap_or("settled");
    let mark = if action.ok == Some(true) { "Approved" } else { "Not run" };
    format!("{mark} ({settled})\n{}", what(request))
}

/// What the presser is told.
pub fn notice(answered: &Result<PendingApproval, AnswerError>, reply: Reply) -> String {
    match (answered, reply) {
        (Ok(_), Reply::Approve) => "Approved.".to_owned(),
        (Ok(_), Reply::Always) => "Approved for the rest of this conversation.".to_owned(),
        (Ok(_), Reply::Deny) => "Denied.".to_owned(),
        (Err(error), _) => format!("Not taken: {error}."),
    }
}

/// The requests offered in a chat: the place each was asked in and the
/// message that carries its buttons.
#[derive(Debug)]
pub struct Offered<P, M> {
    requests: Mutex<HashMap<String, (P, M)>>,
}

impl<P, M> Default for Offered<P, M> {
    fn default() -> Self {
        Offered { requests: Mutex::new(HashMap::new()) }
    }
}

impl<P: PartialEq, M> Offered<P, M> {
    pub fn insert(&self, id: &str, place: P, message_id: M) {
        self.lock().insert(id.to_owned(), (place, message_id));
    }

    /// The place and message of request `id`, forgotten now that it is settled.
    pub fn take(&self, id: &str) -> Option<(P, M)> {
        self.lock().remove(id)
    }

    /// Whether a press in `place` may answer request `id`: it was offered
    /// there, or not in this chat at all (asked before a restart, or of a run
    /// started elsewhere; the hub still knows it).
    pub fn pressed_in_place(&self, id: &str, place: &P) -> bool {
        self.lock().get(id).is_none_or(|(offered, _)| offered == place)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (P, M)>> {
        self.requests.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_our_buttons_with_a_request_id_are_read() {
        let [approve, deny, always] = button_data("apr_0123456789ab");
        assert_eq!(parse_press(&approve), Some((Reply::Approve, "apr_0123456789ab")));
        assert_eq!(parse_press(&deny), Some((Reply::Deny, "apr_0123456789ab")));
        assert_eq!(parse_press(&always), Some((Reply::Always, "apr_0123456789ab")));
        assert_eq!(parse_press("apr:a:apr_../../etc"), None);
        assert_eq!(parse_press("apr:a:APR_0123456789AB"), None);
        assert_eq!(parse_press("engine:claude"), None);
    }

    #[test]
    fn a_reply_by_text_names_a_code_and_nothing_else() {
        assert_eq!(parse_text_reply("yes 4821"), Some((Reply::Approve, "4821")));
        assert_eq!(parse_text_reply("  No 4821\n"), Some((Reply::Deny, "4821")));
        assert_eq!(parse_text_reply("APPROVE 1000"), Some((Reply::Approve, "1000")));
        assert_eq!(parse_text_reply("Always 1000"), Some((Reply::Always, "1000")));
        assert_eq!(parse_text_reply("yes"), None);
        assert_eq!(parse_text_reply("yes 48211"), None);
        assert_eq!(parse_text_reply("yes 4821 please"), None);
        assert_eq!(parse_text_reply("yes abcd"), None);
        assert_eq!(parse_text_reply("maybe 4821"), None);
    }

    #[test]
    fn a_press_counts_only_where_the_request_was_offered() {
        let offered = Offered::<u64, i64>::default();
        offered.insert("apr_0123456789ab", 7, 100);
        assert!(offered.pressed_in_place("apr_0123456789ab", &7));
        assert!(!offered.pressed_in_place("apr_0123456789ab", &8));
        assert!(
            offered.pressed_in_place("apr_ffffffffffff", &8),
            "not offered here: the hub decides"
        );
        assert_eq!(offered.take("apr_0123456789ab"), Some((7, 100)));
        assert_eq!(offered.take("apr_0123456789ab"), None);
    }
}
