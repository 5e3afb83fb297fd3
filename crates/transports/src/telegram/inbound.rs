//! What an incoming Telegram message means: which conversation it belongs to,
//! whether it is a command, a prompt, or something the bot cannot take yet.

use std::fmt::Display;

use lemon_core::config::QueueMode;
use lemon_core::ids::{RunId, SessionKey};
use lemon_core::router::ChannelRef;

use lemon_core::media::MediaRefusal;

use super::types::{Message, TelegramFile};

/// The transport's id, in session keys, bindings and status.
pub const TRANSPORT_ID: &str = "telegram";

/// The commands registered with `setMyCommands`; the router answers them.
pub const COMMANDS: [(&str, &str); 4] = [
    ("cancel", "Stop the running job (or reply to its progress message)"),
    ("new", "Start a fresh session for the next message"),
    ("status", "Show the running job, the queue and the engine"),
    ("engine", "Show or pick the engine: /engine <id>"),
];

/// The commands registered besides [`COMMANDS`] when `allow_queue_override`
/// lets a message pick its queue mode (see [`queue_override`]).
pub const QUEUE_COMMANDS: [(&str, &str); 4] = [
    ("steer", "Add to the running job: /steer <message>"),
    ("followup", "Run after the running job: /followup <message>"),
    ("interrupt", "Stop the running job and run this: /interrupt <message>"),
    ("redirect", "Correct the running job: /redirect <message>"),
];

/// The commands the bot registers and `/help` lists.
pub fn commands(allow_queue_override: bool) -> Vec<(&'static str, &'static str)> {
    let queue = if allow_queue_override { &QUEUE_COMMANDS[..] } else { &[] };
    COMMANDS.iter().chain(queue).copied().collect()
}

/// A message that picks its own queue mode: `/steer`, `/followup`,
/// `/interrupt` or `/redirect` (also `!redirect`), case-insensitive, then the
/// text (empty when the message is the word alone).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueOverride {
    pub mode: QueueMode,
    /// The command's word as written, for a usage hint.
    pub command: &'static str,
    pub prompt: String,
}

/// Reads a leading queue-mode command off `text` (see [`QueueOverride`]).
pub fn queue_override(text: &str) -> Option<QueueOverride> {
    let text = text.trim_start();
    let (first, rest) = match text.find(char::is_whitespace) {
        Some(at) => text.split_at(at),
        None => (text, ""),
    };
    let (mode, command) = match first.to_ascii_lowercase().as_str() {
        "/steer" => (QueueMode::Steer, "/steer"),
        "/followup" => (QueueMode::Followup, "/followup"),
        "/interrupt" => (QueueMode::Interrupt, "/interrupt"),
        "/redirect" | "!redirect" => (QueueMode::Redirect, "/redirect"),
        _ => return None,
    };
    Some(QueueOverride { mode, command, prompt: rest.trim().to_owned() })
}

/// The conversation a message belongs to, for `debounce_ms`: its chat and topic.
pub fn scope_of(message: &Message) -> (i64, Option<i64>) {
    (message.chat.id, topic_of(message))
}

/// What to do with one message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Inbound {
    /// Text for the conversation (a prompt, or a `/command` the router knows).
    Text(String),
    /// A message with a photo, a file or a voice note: its caption without
    /// a mention of the bot (empty when it has none). See [`files_of`].
    Media(String),
    /// A command addressed to another bot in a group: not ours.
    OtherBot,
    /// A sticker, a location, an empty message…: answered with a short notice.
    Unsupported,
}

/// Whether the message carries a file the bot takes.
pub fn has_media(message: &Message) -> bool {
    !message.photo.is_empty()
        || message.document.is_some()
        || message.voice.is_some()
        || message.audio.is_some()
        || message.video.is_some()
        || message.animation.is_some()
        || message.video_note.is_some()
}

/// Reads a message. `bot_username` is the bot's own `@name` (without `@`).
pub fn classify(message: &Message, bot_username: &str) -> Inbound {
    if has_media(message) {
        let caption = message.caption.as_deref().unwrap_or_default().trim();
        if caption.is_empty() {
            return Inbound::Media(String::new());
        }
        return match strip_mention(caption, bot_username) {
            Some(caption) => Inbound::Media(caption),
            None => Inbound::OtherBot,
        };
    }
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

/// A file of a message, as far as it is known before it is fetched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IncomingFile {
    /// What `getFile` takes.
    pub file_id: String,
    /// The name the sender gave it (documents, audio, video), if any.
    pub name: Option<String>,
    /// The name used when it has none (`photo-<id>.jpg`).
    pub fallback: String,
    /// The media type Telegram gives.
    pub mime: Option<String>,
    /// The size Telegram announces.
    pub size: Option<u64>,
}

/// The files of `message`, each as it will be fetched, or refused already:
/// a photo is taken in its largest size within `max_bytes` (refused when
/// even the smallest is larger). The voice note is left out when
/// `voice_apart` (it is transcribed instead).
pub fn files_of(
    message: &Message,
    max_bytes: u64,
    voice_apart: bool,
) -> Vec<Result<IncomingFile, MediaRefusal>> {
    let id_of = |file: &TelegramFile| {
        let id = if file.file_unique_id.is_empty() { &file.file_id } else { &file.file_unique_id };
        // Only what is safe in a file name: Telegram's ids are base64url.
        let id: String = id
            .chars()
            .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_'))
            .take(64)
            .collect();
        if id.is_empty() {
            message.message_id.to_string()
        } else {
            id
        }
    };
    let incoming = |file: &TelegramFile, prefix: &str, ext: &str| IncomingFile {
        file_id: file.file_id.clone(),
        name: file.file_name.clone().filter(|name| !name.trim().is_empty()),
        fallback: format!("{prefix}-{}.{}", id_of(file), ext_of(file.mime_type.as_deref(), ext)),
        mime: file.mime_type.clone(),
        size: file.file_size,
    };
    let mut files = Vec::new();
    if let Some(smallest) = message.photo.first() {
        let fits =
            message.photo.iter().filter(|size| size.file_size.is_none_or(|b| b <= max_bytes));
        let largest = fits.max_by_key(|size| {
            (
                size.file_size.unwrap_or(0),
                u64::from(size.width.unwrap_or(0)) * u64::from(size.height.unwrap_or(0)),
            )
        });
        files.push(match largest {
            Some(photo) => Ok(IncomingFile {
                mime: Some("image/jpeg".to_owned()),
                ..incoming(photo, "photo", "jpg")
            }),
            None => Err(MediaRefusal::TooLarge {
                name: incoming(smallest, "photo", "jpg").fallback,
                bytes: message.photo.iter().filter_map(|p| p.file_size).min().unwrap_or(0),
                max: max_bytes,
            }),
        });
    }
    let others = [
        (&message.document, "document", "bin"),
        (&message.audio, "audio", "mp3"),
        (&message.video, "video", "mp4"),
        (&message.animation, "animation", "mp4"),
        (&message.video_note, "video-note", "mp4"),
    ];
    for (file, prefix, ext) in others {
        if let Some(file) = file {
            files.push(Ok(incoming(file, prefix, ext)));
        }
    }
    if let Some(voice) = message.voice.as_ref().filter(|_| !voice_apart) {
        files.push(Ok(incoming(voice, "voice", "ogg")));
    }
    files
}

/// The extension for a file of media type `mime`, else `fallback`.
fn ext_of<'a>(mime: Option<&str>, fallback: &'a str) -> &'a str {
    match mime.map(str::to_ascii_lowercase).as_deref() {
        Some("image/jpeg") => "jpg",
        Some("image/png") => "png",
        Some("image/gif") => "gif",
        Some("image/webp") => "webp",
        Some("application/pdf") => "pdf",
        Some("audio/ogg" | "audio/opus") => "ogg",
        Some("audio/mpeg") => "mp3",
        Some("audio/mp4" | "audio/x-m4a") => "m4a",
        Some("video/mp4") => "mp4",
        Some("video/webm") => "webm",
        Some("text/plain") => "txt",
        _ => fallback,
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

/// `agent:<agent_id>:telegram:<account>:<dm|group|channel>:<chat_id>[:thread:<topic_id>]`;
/// the account is `account_id`, or the bot's id.
pub fn session_key(agent_id: &str, bot_id: impl Display, message: &Message) -> SessionKey {
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

/// The chat and topic a session key of account `bot_id` names ([`session_key`]'s inverse).
pub fn chat_of(session_key: &str, bot_id: impl Display) -> Option<(i64, Option<i64>)> {
    let parts: Vec<&str> = session_key.split(':').collect();
    let ["agent", _, TRANSPORT_ID, bot, kind, chat, rest @ ..] = parts.as_slice() else {
        return None;
    };
    if *bot != bot_id.to_string() || !matches!(*kind, "dm" | "group" | "channel") {
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
            photo: Vec::new(),
            document: None,
            voice: None,
            audio: None,
            video: None,
            animation: None,
            video_note: None,
            sticker: None,
            media_group_id: None,
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

    fn file(id: &str, size: Option<u64>) -> TelegramFile {
        TelegramFile {
            file_id: format!("f-{id}"),
            file_unique_id: id.to_owned(),
            file_size: size,
            ..TelegramFile::default()
        }
    }

    #[test]
    fn stickers_and_empty_messages_are_unsupported_and_files_are_media() {
        let mut sticker = message("private", 1, None);
        sticker.sticker = Some(serde_json::json!({ "file_id": "s" }));
        assert_eq!(classify(&sticker, "b"), Inbound::Unsupported);
        assert_eq!(classify(&message("private", 1, Some("  ")), "b"), Inbound::Unsupported);
        let mut photo = message("private", 1, None);
        photo.photo = vec![file("a", Some(10))];
        assert_eq!(classify(&photo, "b"), Inbound::Media(String::new()));
        photo.caption = Some("@b what is this?".into());
        assert_eq!(classify(&photo, "b"), Inbound::Media("what is this?".into()));
        photo.caption = Some("/file@other put".into());
        assert_eq!(classify(&photo, "b"), Inbound::OtherBot);
    }

    #[test]
    fn a_photo_is_taken_in_its_largest_size_within_the_limit() {
        let mut photo = message("private", 1, None);
        photo.photo = vec![file("s", Some(100)), file("m", Some(1_000)), file("l", Some(10_000))];
        let pick = |max| files_of(&photo, max, true);
        let found = pick(5_000);
        let chosen = found[0].as_ref().unwrap();
        assert_eq!(chosen.file_id, "f-m");
        assert_eq!(chosen.fallback, "photo-m.jpg");
        assert_eq!(chosen.mime.as_deref(), Some("image/jpeg"));
        assert_eq!(pick(50_000)[0].as_ref().unwrap().file_id, "f-l");
        assert_eq!(
            pick(50)[0],
            Err(MediaRefusal::TooLarge { name: "photo-s.jpg".into(), bytes: 100, max: 50 })
        );
    }

    #[test]
    fn documents_keep_their_name_and_others_get_one() {
        let mut doc = message("private", 1, None);
        doc.document = Some(TelegramFile {
            file_name: Some("report.pdf".into()),
            mime_type: Some("application/pdf".into()),
            ..file("d", Some(5))
        });
        doc.voice =
            Some(TelegramFile { mime_type: Some("audio/ogg".into()), ..file("v/../x", None) });
        let found = files_of(&doc, 100, false);
        assert_eq!(found.len(), 2);
        let document = found[0].as_ref().unwrap();
        assert_eq!(document.name.as_deref(), Some("report.pdf"));
        assert_eq!(document.size, Some(5));
        let voice = found[1].as_ref().unwrap();
        assert_eq!((voice.name.as_deref(), voice.fallback.as_str()), (None, "voice-vx.ogg"));
        assert_eq!(files_of(&doc, 100, true).len(), 1, "a transcribed voice note is no file");
    }

    #[test]
    fn an_account_id_names_the_chats_sessions_instead_of_the_bot() {
        let dm = message("private", 42, Some("hi"));
        let key = session_key("main", "work", &dm);
        assert_eq!(key, "agent:main:telegram:work:dm:42");
        assert_eq!(chat_of(&key, "work"), Some((42, None)));
        assert_eq!(chat_of(&key, 9), None, "not the bot's own account");
    }

    #[test]
    fn queue_mode_commands_pick_the_mode_and_keep_the_text() {
        let check = |text: &str, expected: Option<(QueueMode, &str)>| {
            let found = queue_override(text).map(|o| (o.mode, o.prompt));
            assert_eq!(found, expected.map(|(mode, prompt)| (mode, prompt.to_owned())), "{text}");
        };
        check("/steer also check the tests", Some((QueueMode::Steer, "also check the tests")));
        check("  /FOLLOWUP then deploy", Some((QueueMode::Followup, "then deploy")));
        check("/interrupt stop\nand do this", Some((QueueMode::Interrupt, "stop\nand do this")));
        check("/redirect use main", Some((QueueMode::Redirect, "use main")));
        check("!redirect use main", Some((QueueMode::Redirect, "use main")));
        check("/steer", Some((QueueMode::Steer, "")));
        check("/steering wheel", None);
        check("steer the car", None);
        check("/status", None);
        assert_eq!(commands(false).len(), COMMANDS.len());
        let all: Vec<&str> = commands(true).into_iter().map(|(c, _)| c).collect();
        assert_eq!(
            all,
            ["cancel", "new", "status", "engine", "steer", "followup", "interrupt", "redirect"]
        );
    }

    #[test]
    fn the_same_message_always_gets_the_same_run_id() {
        let m = message("supergroup", -1005, Some("hi"));
        assert_eq!(run_id(9, &m), run_id(9, &m));
        assert_eq!(run_id(9, &m).as_str(), "tg_9_-1005_7");
        assert_ne!(run_id(8, &m), run_id(9, &m));
    }
}
