//! The slice of the Telegram Bot API the transport uses: updates coming in,
//! requests going out, and the error envelope.
//!
//! Field names follow the Bot API exactly, so these types serialise to and from
//! its JSON. Everything the transport does not read is ignored on input.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// One incoming update from `getUpdates`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
pub struct Update {
    pub update_id: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<Message>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub edited_message: Option<Message>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channel_post: Option<Message>,
    /// A button of an inline keyboard pressed (an approval's answer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub callback_query: Option<CallbackQuery>,
}

/// A pressed inline button: who pressed it, on which message, with what data.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
pub struct CallbackQuery {
    pub id: String,
    pub from: User,
    /// The bot's message the button is on (absent when it is too old).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<Message>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<String>,
}

/// A message, incoming or sent by the bot.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
pub struct Message {
    pub message_id: i64,
    pub chat: Chat,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<User>,
    #[serde(default)]
    pub date: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub caption: Option<String>,
    /// The forum topic, or (in non-forum groups) the thread of a reply.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message_thread_id: Option<i64>,
    /// True only when the message was sent to a forum topic.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub is_topic_message: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply_to_message: Option<Box<Message>>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub entities: Vec<MessageEntity>,
    /// A photo, in the sizes Telegram made of it, smallest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub photo: Vec<TelegramFile>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub document: Option<TelegramFile>,
    /// A voice message (OGG/Opus), with its `duration` in seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub voice: Option<TelegramFile>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audio: Option<TelegramFile>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub video: Option<TelegramFile>,
    /// A GIF or a silent video.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub animation: Option<TelegramFile>,
    /// A round video message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub video_note: Option<TelegramFile>,
    /// Present on media messages; only its presence matters here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sticker: Option<serde_json::Value>,
    /// Photos and files sent together (an album) share it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media_group_id: Option<String>,
}

/// A file a message carries (`PhotoSize`, `Document`, `Voice`, `Audio`,
/// `Video`, `Animation`, `VideoNote`): the fields of those the transport reads.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
pub struct TelegramFile {
    /// What `getFile` takes.
    #[serde(default)]
    pub file_id: String,
    /// The same for every bot and over time; names files without a name.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub file_unique_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mime_type: Option<String>,
    /// The size Telegram announces, in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file_size: Option<u64>,
    /// Seconds (voice, audio, video).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub width: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub height: Option<u32>,
}

/// `getFile`'s answer: where the file can be downloaded from
/// (`{base}/file/bot<token>/<file_path>`, for an hour).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct FileInfo {
    pub file_id: String,
    #[serde(default)]
    pub file_size: Option<u64>,
    #[serde(default)]
    pub file_path: Option<String>,
}

/// A chat: `private`, `group`, `supergroup` or `channel`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
pub struct Chat {
    pub id: i64,
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub is_forum: bool,
}

/// A user or bot.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
pub struct User {
    pub id: i64,
    #[serde(default)]
    pub is_bot: bool,
    #[serde(default)]
    pub first_name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
}

/// Formatting of a span of text. `offset` and `length` count UTF-16 code units.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
pub struct MessageEntity {
    /// `code`, `pre`, `bot_command`, `bold`, …
    #[serde(rename = "type")]
    pub kind: String,
    pub offset: usize,
    pub length: usize,
    /// For `pre`: the code block's language.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub language: Option<String>,
}

/// The most text one message holds, in UTF-16 units (after entity parsing).
pub const MAX_TEXT_UTF16: usize = 4096;

/// Text with its formatting, ready for `sendMessage` or `editMessageText`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FormattedText {
    pub text: String,
    pub entities: Vec<MessageEntity>,
}

impl FormattedText {
    pub fn plain(text: impl Into<String>) -> Self {
        FormattedText { text: text.into(), entities: Vec::new() }
    }
}

/// `sendMessage` parameters.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SendMessage {
    pub chat_id: i64,
    pub text: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub entities: Vec<MessageEntity>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message_thread_id: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reply_parameters: Option<ReplyParameters>,
    pub link_preview_options: LinkPreviewOptions,
    /// An inline keyboard (`{"inline_keyboard": [[{"text", "callback_data"}]]}`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reply_markup: Option<serde_json::Value>,
}

impl SendMessage {
    pub fn new(chat_id: i64, text: FormattedText) -> Self {
        SendMessage {
            chat_id,
            text: text.text,
            entities: text.entities,
            message_thread_id: None,
            reply_parameters: None,
            link_preview_options: LinkPreviewOptions { is_disabled: true },
            reply_markup: None,
        }
    }
}

/// How a file goes to a chat: `sendPhoto` (shown inline) or `sendDocument`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    Photo,
    Document,
}

impl FileKind {
    /// The Bot API method.
    pub fn method(self) -> &'static str {
        match self {
            FileKind::Photo => "sendPhoto",
            FileKind::Document => "sendDocument",
        }
    }

    /// The multipart field that carries the file.
    pub fn field(self) -> &'static str {
        match self {
            FileKind::Photo => "photo",
            FileKind::Document => "document",
        }
    }
}

/// `sendPhoto` / `sendDocument`: a file of a run's answer, uploaded as
/// `multipart/form-data` and read from disk when the call is made.
#[derive(Debug, Clone, PartialEq)]
pub struct SendFile {
    pub chat_id: i64,
    pub kind: FileKind,
    pub path: std::path::PathBuf,
    pub filename: String,
    pub mime: String,
    pub caption: Option<String>,
    pub message_thread_id: Option<i64>,
}

/// What the outbox sends: a text message or a file.
#[derive(Debug, Clone, PartialEq)]
pub enum Outgoing {
    Text(SendMessage),
    File(SendFile),
}

impl Outgoing {
    pub fn chat_id(&self) -> i64 {
        match self {
            Outgoing::Text(message) => message.chat_id,
            Outgoing::File(file) => file.chat_id,
        }
    }

    pub fn set_chat_id(&mut self, chat_id: i64) {
        match self {
            Outgoing::Text(message) => message.chat_id = chat_id,
            Outgoing::File(file) => file.chat_id = chat_id,
        }
    }
}

/// What a sent message answers.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReplyParameters {
    pub message_id: i64,
    /// Send even when the message replied to is gone.
    pub allow_sending_without_reply: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LinkPreviewOptions {
    pub is_disabled: bool,
}

/// `editMessageText` parameters.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EditMessageText {
    pub chat_id: i64,
    pub message_id: i64,
    pub text: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub entities: Vec<MessageEntity>,
    pub link_preview_options: LinkPreviewOptions,
}

impl EditMessageText {
    pub fn new(chat_id: i64, message_id: i64, text: FormattedText) -> Self {
        EditMessageText {
            chat_id,
            message_id,
            text: text.text,
            entities: text.entities,
            link_preview_options: LinkPreviewOptions { is_disabled: true },
        }
    }
}

/// One entry of `setMyCommands`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BotCommand {
    pub command: String,
    pub description: String,
}

/// Why a Bot API call failed. Never carries the bot token.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TelegramError {
    /// A file to upload could not be read; sending it again will not help.
    #[error("file {filename} could not be read: {reason}")]
    File { filename: String, reason: String },
    /// 429: wait this long before the next call to that chat.
    #[error("rate limited by Telegram: retry after {}s", .0.as_secs())]
    RetryAfter(Duration),
    /// 400 "message is not modified": the edit asked for what is already shown.
    #[error("message is not modified")]
    NotModified,
    /// 401/404 on the bot itself: the token is wrong or revoked.
    #[error("Telegram rejected the bot token ({description})")]
    Unauthorized { description: String },
    /// 409: another poller or a webhook holds the updates of this bot.
    #[error("conflict: {description}")]
    Conflict { description: String },
    /// 400 "group chat was upgraded to a supergroup chat": use the new id.
    #[error("chat migrated to {0}")]
    MigratedTo(i64),
    /// Any other 4xx: retrying the same call will not help.
    #[error("Telegram refused the request: {code} {description}")]
    Rejected { code: u16, description: String },
    /// 5xx: Telegram's side; retry with backoff.
    #[error("Telegram server error: {code} {description}")]
    Server { code: u16, description: String },
    /// The request did not get an answer (connect, timeout, bad body).
    #[error("could not reach Telegram: {0}")]
    Network(String),
    /// The configured Bot API address is not an http(s) URL; fix the configuration.
    #[error("invalid Telegram API base URL: {0}")]
    InvalidBaseUrl(String),
}

impl TelegramError {
    /// Whether sending the same request again later can succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            TelegramError::RetryAfter(_) | TelegramError::Server { .. } | TelegramError::Network(_)
        )
    }
}
