//! The bridge protocol: one JSON object per line over the bridge's stdio, each
//! with `"v": 1` and a `"type"`.
//!
//! Bridge → gateway:
//! - `ready` `{inbox_id, address?, env?}` — connected; answers can be sent.
//! - `message` `{id, conversation_id, sender, sender_address?, text, sent_at_ms,
//!   attachment?}` — a message someone else wrote in a conversation: a text,
//!   or a remote attachment (`text` empty) described by `attachment`
//!   `{url, filename?, content_length?, secret, salt, nonce, content_digest,
//!   scheme}` (keys in base64, the digest in hex): the bridge never fetches
//!   it, the gateway does ([`super::attachment`]).
//! - `sent` `{request_id, message_id}` — a `send` went out.
//! - `error` `{request_id?, message, retry?}` — a `send` failed (`retry`: worth
//!   sending again), or, without `request_id`, something the bridge reports.
//! - `pong` `{id}` — the answer to a `ping`.
//!
//! Gateway → bridge:
//! - `ack` `{id}` — the message `id` is taken (the router has it, or it was
//!   refused for good); the bridge may move its cursor past it.
//! - `send` `{request_id, conversation_id, text}` — send a text; `request_id`
//!   is the same for every attempt of one answer, so a bridge that already sent
//!   it answers `sent` again without sending twice.
//! - `ping` `{id}` — answer with `pong`.
//!
//! Lines are at most [`MAX_LINE_BYTES`]; a longer one, one that is not JSON,
//! of another version or of an unknown type is logged and skipped.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::io::{AsyncBufRead, AsyncBufReadExt};

/// The protocol's version, in every line.
pub const PROTOCOL_VERSION: u64 = 1;
/// The longest line either side reads.
pub const MAX_LINE_BYTES: usize = 1024 * 1024;

/// A text message the bridge saw.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct InboundMessage {
    pub id: String,
    pub conversation_id: String,
    /// The sender's inbox id.
    pub sender: String,
    #[serde(default)]
    pub sender_address: Option<String>,
    #[serde(default)]
    pub text: String,
    #[serde(default)]
    pub sent_at_ms: Option<i64>,
    /// A remote attachment the message is (its text is then empty).
    #[serde(default)]
    pub attachment: Option<Box<RemoteAttachment>>,
}

/// A remote attachment as the sender described it: where its encrypted bytes
/// are and how to open them. Its `Debug` shows neither the URL nor the keys.
#[derive(Clone, PartialEq, Eq, Deserialize)]
pub struct RemoteAttachment {
    pub url: String,
    #[serde(default)]
    pub filename: Option<String>,
    /// The encrypted payload's length, as announced.
    #[serde(default)]
    pub content_length: Option<u64>,
    /// Base64, 32 bytes.
    pub secret: String,
    /// Base64, 32 bytes.
    pub salt: String,
    /// Base64, 12 bytes.
    pub nonce: String,
    /// The payload's SHA-256, lowercase hex.
    pub content_digest: String,
    /// `https://`.
    pub scheme: String,
}

impl std::fmt::Debug for RemoteAttachment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteAttachment")
            .field("filename", &self.filename)
            .field("content_length", &self.content_length)
            .finish_non_exhaustive()
    }
}

/// A line from the bridge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FromBridge {
    Ready { inbox_id: String, address: Option<String> },
    Message(InboundMessage),
    Sent { request_id: String, message_id: String },
    Error { request_id: Option<String>, message: String, retry: bool },
    Pong { id: String },
}

/// Why a line from the bridge was skipped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LineError {
    #[error("not a JSON object: {0}")]
    NotJson(String),
    #[error("protocol version {0:?}, not {PROTOCOL_VERSION}")]
    Version(Option<u64>),
    #[error("unknown type {0:?}")]
    UnknownType(String),
    #[error("a {kind} line without its fields: {error}")]
    Fields { kind: String, error: String },
}

#[derive(Deserialize)]
struct ReadyFields {
    inbox_id: String,
    #[serde(default)]
    address: Option<String>,
}

#[derive(Deserialize)]
struct SentFields {
    request_id: String,
    #[serde(default)]
    message_id: String,
}

#[derive(Deserialize)]
struct ErrorFields {
    #[serde(default)]
    request_id: Option<String>,
    #[serde(default)]
    message: String,
    #[serde(default)]
    retry: bool,
}

#[derive(Deserialize)]
struct PongFields {
    id: String,
}

/// Parses one line from the bridge.
///
/// # Errors
/// [`LineError`] saying why the line is skipped.
pub fn parse_line(line: &str) -> Result<FromBridge, LineError> {
    let value: Value =
        serde_json::from_str(line.trim()).map_err(|e| LineError::NotJson(e.to_string()))?;
    let Value::Object(object) = &value else {
        return Err(LineError::NotJson("not an object".into()));
    };
    let version = object.get("v").and_then(Value::as_u64);
    if version != Some(PROTOCOL_VERSION) {
        return Err(LineError::Version(version));
    }
    let kind = object.get("type").and_then(Value::as_str).unwrap_or("").to_owned();
    fn fields<T: serde::de::DeserializeOwned>(kind: &str, value: Value) -> Result<T, LineError> {
        serde_json::from_value(value)
            .map_err(|e| LineError::Fields { kind: kind.to_owned(), error: e.to_string() })
    }
    match kind.as_str() {
        "ready" => {
            let ready: ReadyFields = fields(&kind, value)?;
            Ok(FromBridge::Ready { inbox_id: ready.inbox_id, address: ready.address })
        }
        "message" => Ok(FromBridge::Message(fields(&kind, value)?)),
        "sent" => {
            let sent: SentFields = fields(&kind, value)?;
            Ok(FromBridge::Sent { request_id: sent.request_id, message_id: sent.message_id })
        }
        "error" => {
            let error: ErrorFields = fields(&kind, value)?;
            Ok(FromBridge::Error {
                request_id: error.request_id,
                message: error.message,
                retry: error.retry,
            })
        }
        "pong" => Ok(FromBridge::Pong { id: fields::<PongFields>(&kind, value)?.id }),
        _ => Err(LineError::UnknownType(kind)),
    }
}

/// A line to the bridge.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum ToBridge {
    Ack { id: String },
    Send { request_id: String, conversation_id: String, text: String },
    Ping { id: String },
}

impl ToBridge {
    /// The line, with its version and without the newline.
    pub fn to_line(&self) -> String {
        let mut value = serde_json::to_value(self).unwrap_or_default();
        if let Value::Object(object) = &mut value {
            object.insert("v".into(), PROTOCOL_VERSION.into());
        }
        value.to_string()
    }
}

/// One item read from the bridge's stdout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Line {
    Text(String),
    /// Longer than the limit: skipped while it was read; its length.
    Oversized(usize),
}

/// Reads lines of at most `max` bytes; a longer one is skipped as it is read,
/// so its size never matters.
#[derive(Debug)]
pub struct LineReader<R> {
    reader: R,
    buf: Vec<u8>,
    /// Bytes of the current line so far, once it is over the limit.
    skipped: Option<usize>,
    max: usize,
}

impl<R: AsyncBufRead + Unpin> LineReader<R> {
    pub fn new(reader: R, max: usize) -> Self {
        LineReader { reader, buf: Vec::new(), skipped: None, max }
    }

    /// The next line, `None` at the end (an unterminated last line first).
    ///
    /// # Errors
    /// The pipe's read error.
    ///
    /// # Cancel safety
    /// Cancel safe: what was read so far stays in the reader.
    pub async fn next_line(&mut self) -> std::io::Result<Option<Line>> {
        loop {
            let available = self.reader.fill_buf().await?;
            if available.is_empty() {
                return Ok(match self.skipped.take() {
                    Some(n) => Some(Line::Oversized(n)),
                    None if self.buf.is_empty() => None,
                    None => Some(self.take()),
                });
            }
            let newline = available.iter().position(|b| *b == b'\n');
            let chunk = &available[..newline.unwrap_or(available.len())];
            let len = chunk.len();
            match self.skipped.as_mut() {
                Some(n) => *n += len,
                None if self.buf.len() + len > self.max => {
                    self.skipped = Some(self.buf.len() + len);
                    self.buf = Vec::new();
                }
                None => self.buf.extend_from_slice(chunk),
            }
            self.reader.consume(len + usize::from(newline.is_some()));
            if newline.is_some() {
                return Ok(Some(match self.skipped.take() {
                    Some(n) => Line::Oversized(n),
                    None => self.take(),
                }));
            }
        }
    }

    fn take(&mut self) -> Line {
        let bytes = std::mem::take(&mut self.buf);
        Line::Text(String::from_utf8_lossy(&bytes).into_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_of_line_parses() {
        let ready = parse_line(r#"{"v":1,"type":"ready","inbox_id":"ab12","address":"0xff"}"#);
        assert_eq!(
            ready,
            Ok(FromBridge::Ready { inbox_id: "ab12".into(), address: Some("0xff".into()) })
        );
        let message = parse_line(
            r#"{"v":1,"type":"message","id":"m1","conversation_id":"c1","sender":"ab","text":"hi","sent_at_ms":5}"#,
        )
        .unwrap();
        let FromBridge::Message(message) = message else { panic!("{message:?}") };
        assert_eq!((message.id.as_str(), message.text.as_str()), ("m1", "hi"));
        assert_eq!(
            parse_line(r#"{"v":1,"type":"sent","request_id":"r","message_id":"m"}"#),
            Ok(FromBridge::Sent { request_id: "r".into(), message_id: "m".into() })
        );
        assert_eq!(
            parse_line(r#"{"v":1,"type":"error","request_id":"r","message":"no","retry":true}"#),
            Ok(FromBridge::Error {
                request_id: Some("r".into()),
                message: "no".into(),
                retry: true
            })
        );
        assert_eq!(
            parse_line(r#"{"v":1,"type":"pong","id":"7"}"#),
            Ok(FromBridge::Pong { id: "7".into() })
        );
    }

    #[test]
    fn an_attachment_message_parses_without_text_and_hides_its_keys() {
        let line = r#"{"v":1,"type":"message","id":"m","conversation_id":"c","sender":"ab","text":"","attachment":{"url":"https://files.example/secret-path","filename":"a.txt","content_length":12,"secret":"c2VjcmV0","salt":"c2FsdA==","nonce":"bm9uY2U=","content_digest":"00","scheme":"https://"}}"#;
        let Ok(FromBridge::Message(message)) = parse_line(line) else { panic!("{line}") };
        let attachment = message.attachment.clone().unwrap();
        assert_eq!(attachment.filename.as_deref(), Some("a.txt"));
        assert_eq!(attachment.content_length, Some(12));
        assert_eq!(message.text, "");
        let shown = format!("{message:?}");
        assert!(!shown.contains("c2VjcmV0") && !shown.contains("secret-path"), "{shown}");
        // A text message needs no attachment; an attachment without its keys is skipped.
        let text =
            r#"{"v":1,"type":"message","id":"m","conversation_id":"c","sender":"ab","text":"hi"}"#;
        assert!(matches!(parse_line(text), Ok(FromBridge::Message(m)) if m.attachment.is_none()));
        let keyless = r#"{"v":1,"type":"message","id":"m","conversation_id":"c","sender":"ab","attachment":{"url":"https://x"}}"#;
        assert!(matches!(parse_line(keyless), Err(LineError::Fields { .. })));
    }

    #[test]
    fn bad_lines_say_why() {
        assert!(matches!(parse_line("garbage"), Err(LineError::NotJson(_))));
        assert!(matches!(parse_line("[1]"), Err(LineError::NotJson(_))));
        assert_eq!(parse_line(r#"{"type":"ready"}"#), Err(LineError::Version(None)));
        assert_eq!(parse_line(r#"{"v":2,"type":"ready"}"#), Err(LineError::Version(Some(2))));
        assert_eq!(
            parse_line(r#"{"v":1,"type":"typing"}"#),
            Err(LineError::UnknownType("typing".into()))
        );
        assert!(matches!(
            parse_line(r#"{"v":1,"type":"message","id":"m"}"#),
            Err(LineError::Fields { .. })
        ));
    }

    #[test]
    fn lines_to_the_bridge_carry_the_version() {
        let line = ToBridge::Send {
            request_id: "r".into(),
            conversation_id: "c".into(),
            text: "a\nb".into(),
        }
        .to_line();
        let value: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(value["v"], 1);
        assert_eq!(value["type"], "send");
        assert_eq!(value["text"], "a\nb");
        assert!(!line.contains('\n'));
        assert_eq!(
            serde_json::from_str::<Value>(&ToBridge::Ack { id: "m".into() }.to_line()).unwrap(),
            serde_json::json!({"v": 1, "type": "ack", "id": "m"})
        );
    }

    #[tokio::test]
    async fn a_line_over_the_limit_is_skipped_and_the_next_read() {
        let input = format!("short\n{}\nnext\nlast", "x".repeat(100));
        let reader = tokio::io::BufReader::with_capacity(8, input.as_bytes());
        let mut reader = LineReader::new(reader, 16);
        let mut lines = Vec::new();
        while let Some(line) = reader.next_line().await.unwrap() {
            lines.push(line);
        }
        assert_eq!(
            lines,
            [
                Line::Text("short".into()),
                Line::Oversized(100),
                Line::Text("next".into()),
                Line::Text("last".into())
            ]
        );
    }
}
