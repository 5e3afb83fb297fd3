//! What an incoming Telegram message means: which conversation it belongs to,
//! whether it is a command, a prompt, or something the bot cannot take yet.

use lemon_core::ids::{RunId, SessionKey};
use lemon_core::router::ChannelRef;

use super::types::Message;

/// The transport's id, in session keys, bindings and status.
pub const TRANSPORT_ID: &str = "telegram";

/// The commands registered with `setMyCommands`; the router answers them.
pub const COMMANDS: [(&str, &str); 4] = [
    ("cancel", "Stop the running job (or reply to its progress message)"),
    ("new", "Start a fresh session for the next message"),
    ("status", "Show the running job, the queue and the engine"),
    ("engine", "Show or pick the engine: /engine <id>"),
];

/// What to do with one message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Inbound {
    /// Text for the conversation (a prompt, or a `/command` the router knows).
    Text(String),
    /// A command addressed to another bot in a group: not ours.
    OtherBot,
    /// A photo, a voice note, a sticker…: answered with a short notice.
    Unsupported,
}

/// Reads a message. `bot_username` is the bot's own `@name` (without `@`).
pub fn classify(message: &Message, bot_username: &str) -> Inbound {
    let Some(text) = message.text.as_deref() else { return Inbound::Unsupported };
    let text = text.trim();
    if text.is_empty() {
        return Inbound::Unsupported;
    }
    match strip_mention(text, bot_username) {
        Some(text) => Inbound::Text(text),
        None => Inbound::OtherBot,
    }
}

/// `/cancel@MyBot args` → `/cancel args` and `@MyBot fix it` → `fix it`; `None`
/// when the command names another bot.
fn strip_mention(text: &str, bot_username: &str) -> Option<String> {
    if let Some(rest) = text.strip_prefix('@') {
        let name_len =
            rest.find(|c: char| !(c.is_alphanumeric() || c == '_')).unwrap_or(rest.len());
        let (name, after) = rest.split_at(name_len);
        let after = after.trim_start_matches([',', ':']).trim();
        if name.eq_ignore_ascii_case(bot_username) && !after.is_empty() {
            return strip_mention(after, bot_username);
        }
        return Some(text.to_owned());
    }
    if !text.starts_with('/') {
        return Some(text.to_owned());
    }
    let (first, rest) = match text.find(char::is_whitespace) {
        Some(at) => text.split_at(at),
        None => (text, ""),
    };
    match first.split_once('@') {
        Some((command, bot)) if bot.eq_ignore_ascii_case(bot_username) => {
            Some(format!("{command}{rest}"))
        }
        Some(_) => None,
        None => Some(text.to_owned()),
    }
}

/// `dm`, `group` or `channel`.
fn chat_kind(kind: &str) -> &'static str {
    match kind {
        "private" => "dm",
        "channel" => "channel",
        _ => "group",
    }
}

/// The forum topic a message belongs to. Replies in ordinary groups carry a
/// `message_thread_id` too; only forum topics are separate conversations.
pub fn topic_of(message: &Message) -> Option<i64> {
    message.message_thread_id.filter(|_| message.is_topic_message)
}

/// `agent:<agent_id>:telegram:<bot_id>:<dm|group|channel>:<chat_id>[:thread:<topic_id>]`.
pub fn session_key(agent_id: &str, bot_id: i64, message: &Message) -> SessionKey {
    let kind = chat_kind(&message.chat.kind);
    let chat_id = message.chat.id;
    match topic_of(message) {
        Some(topic) => {
            format!("agent:{agent_id}:{TRANSPORT_ID}:{bot_id}:{kind}:{chat_id}:thread:{topic}")
                .into()
        }
        None => format!("agent:{agent_id}:{TRANSPORT_ID}:{bot_id}:{kind}:{chat_id}").into(),
    }
}

/// The chat and topic a session key of `bot_id` names ([`session_key`]'s inverse).
pub fn chat_of(session_key: &str, bot_id: i64) -> Option<(i64, Option<i64>)> {
    let parts: Vec<&str> = session_key.split(':').collect();
    let ["agent", _, TRANSPORT_ID, bot, kind, chat, rest @ ..] = parts.as_slice() else {
        return None;
    };
    if bot.parse::<i64>().ok()? != bot_id || !matches!(*kind, "dm" | "group" | "channel") {
        return None;
    }
    let chat_id = chat.parse::<i64>().ok()?;
    match rest {
        [] => Some((chat_id, None)),
        ["thread", topic] => Some((chat_id, Some(topic.parse().ok()?))),
        _ => None,
    }
}

/// The chat and topic, for `[[gateway.bindings]]`.
pub fn channel_ref(message: &Message) -> ChannelRef {
    ChannelRef {
        transport: TRANSPORT_ID.to_owned(),
        chat_id: Some(message.chat.id.to_string()),
        topic_id: topic_of(message).map(|topic| topic.to_string()),
    }
}

/// The run id of a message: the same message always gets the same id, so a
/// message seen twice (a restart before its offset was saved) is one run. Only
/// letters, digits, `_` and `-`, so engines that use the run id as their resume
/// token (echo) give a resume line that can be pasted back.
pub fn run_id(bot_id: i64, message: &Message) -> RunId {
    let raw = format!("tg_{bot_id}_{}_{}", message.chat.id, message.message_id);
    RunId::parse(&raw).unwrap_or_else(RunId::generate)
}

#[cfg(test)]
mod tests {
    use super::super::types::Chat;
    use super::*;

    fn message(kind: &str, chat_id: i64, text: Option<&str>) -> Message {
        Message {
            message_id: 7,
            chat: Chat {
                id: chat_id,
                kind: kind.to_owned(),
                title: None,
                username: None,
                is_forum: false,
            },
            from: None,
            date: 0,
            text: text.map(str::to_owned),
            caption: None,
            message_thread_id: None,
            is_topic_message: false,
            reply_to_message: None,
            entities: Vec::new(),
            photo: None,
            document: None,
            voice: None,
            audio: None,
            video: None,
            sticker: None,
        }
    }

    #[test]
    fn a_session_key_names_its_chat_back() {
        assert_eq!(chat_of("agent:a:telegram:7:dm:42", 7), Some((42, None)));
        assert_eq!(chat_of("agent:a:telegram:7:group:-100:thread:3", 7), Some((-100, Some(3))));
        assert_eq!(chat_of("agent:a:telegram:8:dm:42", 7), None);
        assert_eq!(chat_of("agent:a:telegram:7:room:42", 7), None);
        assert_eq!(chat_of("agent:a:telegram:7:dm:x", 7), None);
        assert_eq!(chat_of("agent:a:telegram:7:dm:42:extra", 7), None);
        assert_eq!(chat_of("agent:a:main", 7), None);
        let mut message = message("supergroup", -100, None);
        message.message_thread_id = Some(9);
        message.is_topic_message = true;
        let key = session_key("a", 7, &message);
        assert_eq!(chat_of(&key, 7), Some((-100, Some(9))));
    }

    #[test]
    fn session_keys_name_the_chat_kind_and_topic() {
        let dm = message("private", 42, Some("hi"));
        assert_eq!(session_key("main", 9, &dm), "agent:main:telegram:9:dm:42");
        let group = message("supergroup", -1005, Some("hi"));
        assert_eq!(session_key("main", 9, &group), "agent:main:telegram:9:group:-1005");
        let channel = message("channel", -1006, Some("hi"));
        assert_eq!(session_key("main", 9, &channel), "agent:main:telegram:9:channel:-1006");
        let mut topic = message("supergroup", -1005, Some("hi"));
        topic.message_thread_id = Some(77);
        topic.is_topic_message = true;
        assert_eq!(session_key("main", 9, &topic), "agent:main:telegram:9:group:-1005:thread:77");
        assert_eq!(channel_ref(&topic).topic_id.as_deref(), Some("77"));
    }

    #[test]
    fn a_reply_thread_outside_forums_is_not_a_topic() {
        let mut reply = message("supergroup", -1, Some("hi"));
        reply.message_thread_id = Some(5);
        assert_eq!(topic_of(&reply), None);
        assert_eq!(session_key("a", 1, &reply), "agent:a:telegram:1:group:-1");
    }

    #[test]
    fn commands_lose_their_bot_mention_and_other_bots_are_skipped() {
        let mine = message("group", -1, Some("/cancel@LemonBot"));
        assert_eq!(classify(&mine, "lemonbot"), Inbound::Text("/cancel".into()));
        let with_arg = message("group", -1, Some("/engine@LemonBot claude"));
        assert_eq!(classify(&with_arg, "LemonBot"), Inbound::Text("/engine claude".into()));
        let other = message("group", -1, Some("/cancel@OtherBot"));
        assert_eq!(classify(&other, "LemonBot"), Inbound::OtherBot);
        let addressed = message("group", -1, Some("@LemonBot, fix the bug"));
        assert_eq!(classify(&addressed, "lemonbot"), Inbound::Text("fix the bug".into()));
        let someone_else = message("group", -1, Some("@alice fix the bug"));
        assert_eq!(classify(&someone_else, "lemonbot"), Inbound::Text("@alice fix the bug".into()));
        let plain = message("private", 1, Some("  fix the bug @someone  "));
        assert_eq!(classify(&plain, "LemonBot"), Inbound::Text("fix the bug @someone".into()));
    }

    #[test]
    fn media_and_empty_messages_are_unsupported() {
        let mut photo = message("private", 1, None);
        photo.photo = Some(serde_json::json!([]));
        assert_eq!(classify(&photo, "b"), Inbound::Unsupported);
        assert_eq!(classify(&message("private", 1, Some("  ")), "b"), Inbound::Unsupported);
    }

    #[test]
    fn the_same_message_always_gets_the_same_run_id() {
        let m = message("supergroup", -1005, Some("hi"));
        assert_eq!(run_id(9, &m), run_id(9, &m));
        assert_eq!(run_id(9, &m).as_str(), "tg_9_-1005_7");
        assert_ne!(run_id(8, &m), run_id(9, &m));
    }
}
