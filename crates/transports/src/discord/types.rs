//! Discord's wire types, as far as the bot reads and writes them (API v10).
//!
//! Ids are snowflakes: JSON strings of digits, kept as [`Snowflake`].

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A Discord id (user, guild, channel, message, application, interaction).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Snowflake(pub u64);

impl fmt::Display for Snowflake {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl Serialize for Snowflake {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for Snowflake {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Text(String),
            Number(u64),
        }
        match Raw::deserialize(deserializer)? {
            Raw::Number(n) => Ok(Snowflake(n)),
            Raw::Text(text) => text
                .parse()
                .map(Snowflake)
                .map_err(|_| serde::de::Error::custom(format!("{text:?} is not a snowflake"))),
        }
    }
}

/// A user (or bot).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct User {
    pub id: Snowflake,
    #[serde(default)]
    pub username: String,
    #[serde(default)]
    pub bot: bool,
}

/// A message, from `MESSAGE_CREATE` or a REST answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    pub id: Snowflake,
    pub channel_id: Snowflake,
    #[serde(default)]
    pub guild_id: Option<Snowflake>,
    pub author: User,
    #[serde(default)]
    pub content: String,
    #[serde(default)]
    pub mentions: Vec<User>,
    /// The message this one replies to, when Discord could load it.
    #[serde(default)]
    pub referenced_message: Option<Box<Message>>,
    #[serde(default)]
    pub attachments: Vec<MessageAttachment>,
    /// `IS_VOICE_MESSAGE` ([`IS_VOICE_MESSAGE`]) and others.
    #[serde(default)]
    pub flags: u64,
}

/// The message flag of a voice message (its one attachment is the audio).
pub const IS_VOICE_MESSAGE: u64 = 1 << 13;

impl Message {
    /// Whether Discord marks it as a voice message.
    pub fn is_voice_message(&self) -> bool {
        self.flags & IS_VOICE_MESSAGE != 0
    }
}

/// A file that came with a message. Every field may be missing, so an odd
/// attachment never makes the message unreadable; one without a URL is
/// refused when it is fetched.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MessageAttachment {
    #[serde(default)]
    pub id: Option<Snowflake>,
    #[serde(default)]
    pub filename: String,
    #[serde(default)]
    pub content_type: Option<String>,
    /// Its size in bytes, as Discord announces it.
    #[serde(default)]
    pub size: Option<u64>,
    /// Where Discord's CDN serves it.
    #[serde(default)]
    pub url: String,
    /// A voice message's length, in seconds.
    #[serde(default)]
    pub duration_secs: Option<serde_json::Number>,
}

impl MessageAttachment {
    /// A voice message's length, in seconds.
    pub fn duration(&self) -> Option<f64> {
        self.duration_secs.as_ref().and_then(serde_json::Number::as_f64)
    }
}

/// `GET /channels/{id}`, as far as the bot needs it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Channel {
    pub id: Snowflake,
    #[serde(rename = "type")]
    pub kind: u8,
    #[serde(default)]
    pub guild_id: Option<Snowflake>,
    #[serde(default)]
    pub parent_id: Option<Snowflake>,
}

impl Channel {
    /// `ANNOUNCEMENT_THREAD` (10), `PUBLIC_THREAD` (11), `PRIVATE_THREAD` (12).
    pub fn is_thread(&self) -> bool {
        matches!(self.kind, 10..=12)
    }

    /// `DM` (1), `GROUP_DM` (3).
    pub fn is_dm(&self) -> bool {
        matches!(self.kind, 1 | 3)
    }
}

/// `INTERACTION_CREATE`: only application commands (type 2) are acted on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Interaction {
    pub id: Snowflake,
    pub application_id: Snowflake,
    #[serde(rename = "type")]
    pub kind: u8,
    pub token: String,
    #[serde(default)]
    pub guild_id: Option<Snowflake>,
    #[serde(default)]
    pub channel_id: Option<Snowflake>,
    /// The member who used it, in a guild.
    #[serde(default)]
    pub member: Option<Member>,
    /// The user who used it, in a DM.
    #[serde(default)]
    pub user: Option<User>,
    #[serde(default)]
    pub data: Option<CommandData>,
}

impl Interaction {
    /// Who used the command.
    pub fn invoker(&self) -> Option<&User> {
        self.member.as_ref().map(|m| &m.user).or(self.user.as_ref())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    pub user: User,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommandData {
    /// A slash command's name; empty for a button press.
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub options: Vec<CommandOption>,
    /// A pressed button's `custom_id` (an interaction of type 3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub custom_id: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommandOption {
    pub name: String,
    #[serde(default)]
    pub value: Option<serde_json::Value>,
}

/// An application command as registered (`PUT /applications/{id}/commands`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApplicationCommand {
    pub name: String,
    pub description: String,
    /// `CHAT_INPUT` (1).
    #[serde(rename = "type")]
    pub kind: u8,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<ApplicationCommandOption>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApplicationCommandOption {
    /// `STRING` (3).
    #[serde(rename = "type")]
    pub kind: u8,
    pub name: String,
    pub description: String,
    pub required: bool,
}

/// A message the bot sends: text, or a file with an optional caption.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outgoing {
    Text(CreateMessage),
    File(CreateFile),
}

impl Outgoing {
    pub fn channel_id(&self) -> Snowflake {
        match self {
            Outgoing::Text(message) => message.channel_id,
            Outgoing::File(file) => file.channel_id,
        }
    }
}

/// `POST /channels/{id}/messages` with text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreateMessage {
    pub channel_id: Snowflake,
    pub content: String,
    /// The message it replies to (sent even if that message is gone).
    pub reply_to: Option<Snowflake>,
    /// Sent with `enforce_nonce`, see [`nonce`].
    pub nonce: String,
    /// Buttons under the message, in one row; none for most messages.
    pub buttons: Vec<Button>,
}

/// A button under a message (a component of type 2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Button {
    pub label: &'static str,
    /// 3 green (success), 4 red (danger).
    pub style: u8,
    /// What a press sends back, at most 100 characters.
    pub custom_id: String,
}

/// `POST /channels/{id}/messages` with one attachment (multipart).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreateFile {
    pub channel_id: Snowflake,
    pub path: std::path::PathBuf,
    pub filename: String,
    pub mime: String,
    pub caption: Option<String>,
    /// Sent with `enforce_nonce`, see [`nonce`].
    pub nonce: String,
}

/// The `nonce` of a message create, from what the message is (a run's
/// delivery and the part of its answer): the same `key` always gives the same
/// nonce. Every create is sent with `enforce_nonce: true`, so Discord answers
/// a create whose nonce it saw from the bot in the last few minutes with the
/// message already made instead of making another: a create made again after
/// a timeout (which Discord may have applied) or after a restart shows once.
/// 22 characters; Discord allows 25.
pub fn nonce(key: &str) -> String {
    // FNV-1a, 64 bits: the same on every build and platform, unlike std's hasher.
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in key.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("lemon-{hash:016x}")
}

/// Longest message content Discord takes, in characters.
pub const MAX_CONTENT_CHARS: usize = 2000;

/// What a failed REST call means.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DiscordError {
    /// 401: the token is wrong.
    #[error("Discord rejected the bot token (401)")]
    Unauthorized,
    /// 429: wait this long (a route's bucket, or the global limit).
    #[error("rate limited by Discord for {0:?}")]
    RateLimited(std::time::Duration),
    /// Another refusal, with Discord's own code and message.
    #[error("Discord answered {status}: {message}")]
    Status { status: u16, code: Option<i64>, message: String },
    /// The request did not get an answer.
    #[error("Discord could not be reached: {0}")]
    Network(String),
    /// An answer that does not parse, or a file that cannot be read.
    #[error("{0}")]
    Invalid(String),
}

impl DiscordError {
    /// Whether the same call later may succeed.
    pub fn is_retryable(&self) -> bool {
        match self {
            DiscordError::RateLimited(_) | DiscordError::Network(_) => true,
            DiscordError::Status { status, .. } => *status >= 500,
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_message_create_from_discords_docs_parses() {
        let raw = json!({
            "id": "1100000000000000001", "channel_id": "2200000000000000002",
            "guild_id": "3300000000000000003",
            "author": { "id": "4400000000000000004", "username": "ana", "global_name": "Ana" },
            "content": "<@5500000000000000005> hello", "timestamp": "2026-01-01T00:00:00.000000+00:00",
            "mentions": [{ "id": "5500000000000000005", "username": "lemon", "bot": true }],
            "attachments": [], "type": 0, "tts": false, "mention_everyone": false
        });
        let message: Message = serde_json::from_value(raw).unwrap();
        assert_eq!(message.guild_id, Some(Snowflake(3_300_000_000_000_000_003)));
        assert!(message.mentions[0].bot);
        assert_eq!(serde_json::to_value(message.id).unwrap(), json!("1100000000000000001"));
        assert!(!message.is_voice_message());
    }

    #[test]
    fn attachments_and_voice_messages_parse_and_odd_ones_do_not_break_the_message() {
        let raw = json!({
            "id": "1", "channel_id": "2", "author": { "id": "3", "username": "ana" },
            "content": "", "flags": 8192,
            "attachments": [
                { "id": "10", "filename": "voice-message.ogg", "size": 27_000,
                  "url": "https://cdn.discordapp.com/attachments/2/10/voice-message.ogg",
                  "proxy_url": "https://media.discordapp.net/x", "content_type": "audio/ogg",
                  "duration_secs": 4.5, "waveform": "AAAA" },
                { "unexpected": true }
            ]
        });
        let message: Message = serde_json::from_value(raw).unwrap();
        assert!(message.is_voice_message());
        let voice = &message.attachments[0];
        assert_eq!((voice.filename.as_str(), voice.size), ("voice-message.ogg", Some(27_000)));
        assert_eq!(voice.duration(), Some(4.5));
        assert_eq!(voice.content_type.as_deref(), Some("audio/ogg"));
        assert_eq!(message.attachments[1].url, "");
    }

    #[test]
    fn a_nonce_is_the_same_for_the_same_key_and_fits_discords_limit() {
        let first = nonce("dc_1300000000000000001:part:0");
        assert_eq!(first, nonce("dc_1300000000000000001:part:0"));
        assert_ne!(first, nonce("dc_1300000000000000001:part:1"));
        assert_ne!(first, nonce("dc_1300000000000000002:part:0"));
        assert!(first.len() <= 25, "{first}");
        // Pinned: a nonce must not change between builds, or a create made again
        // by a newer binary after a restart would not be recognised.
        assert_eq!(nonce(""), "lemon-cbf29ce484222325");
        assert_eq!(nonce("a"), "lemon-af63dc4c8601ec8c");
    }
}
