//! Parsing entry points for the fuzz targets in `fuzz/`: the webhook's body
//! normalisation and query decoding, and the Discord gateway's reading of a
//! frame, each the code a request or a session uses, reachable without a
//! server or a socket.
//!
//! Not a stable interface: nothing but the fuzz targets calls it.

use serde_json::Value;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::Message as WsMessage;

use crate::discord::gateway::{self, GatewayEvent};
use crate::webhook::payload::{Payload, PayloadError, MAX_ATTACHMENTS};

/// Most attachments one webhook request may carry.
pub const WEBHOOK_MAX_ATTACHMENTS: usize = MAX_ATTACHMENTS;

/// A webhook body as the webhook normalises it.
#[derive(Debug, Clone, PartialEq)]
pub struct WebhookBody {
    /// The text followed by the `Attachments:` section.
    pub prompt: String,
    /// The attachments as `meta.webhook` and callbacks carry them.
    pub attachments: Value,
    /// A JSON object.
    pub metadata: Value,
}

/// Why a webhook body is refused, as the webhook answers it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WebhookRefusal {
    /// `400`: not JSON, or not a JSON object.
    NotAnObject,
    /// `422 invalid request payload`.
    MissingPrompt,
    /// `400` with the message.
    Invalid(String),
}

/// Reads a webhook request's raw body: JSON, an object, then normalised.
///
/// # Errors
/// The refusal the webhook answers with.
pub fn webhook_body(bytes: &[u8]) -> Result<WebhookBody, WebhookRefusal> {
    let Ok(body @ Value::Object(_)) = serde_json::from_slice::<Value>(bytes) else {
        return Err(WebhookRefusal::NotAnObject);
    };
    match Payload::from_body(&body) {
        Ok(payload) => Ok(WebhookBody {
            attachments: payload.attachments_json(),
            prompt: payload.prompt,
            metadata: payload.metadata,
        }),
        Err(PayloadError::MissingPrompt) => Err(WebhookRefusal::MissingPrompt),
        Err(PayloadError::Invalid(message)) => Err(WebhookRefusal::Invalid(message)),
    }
}

/// One name or value of a webhook request's query, decoded (`+` and `%XX`).
pub fn webhook_query_part(raw: &str) -> Option<String> {
    crate::webhook::percent_decode(raw)
}

/// A gateway frame as the session reads it.
#[derive(Debug, Clone, PartialEq)]
pub enum DiscordFrame {
    /// A payload: its opcode, sequence number, dispatch name and data; `ready`
    /// is what a `READY` dispatch becomes (`None` when it names no session).
    Payload {
        op: u8,
        seq: Option<u64>,
        name: Option<String>,
        data: Value,
        ready: Option<GatewayEvent>,
    },
    /// The gateway closed the socket with this code; `fatal` when only the
    /// config can fix it.
    Closed { code: u16, fatal: bool },
    /// Not a payload: skipped, and the session reads on.
    Skipped,
}

/// Reads one text frame (`text`) or, with `close`, a close frame with that code.
pub fn discord_frame(text: &str, close: Option<u16>) -> DiscordFrame {
    let message = match close {
        Some(code) => {
            WsMessage::Close(Some(CloseFrame { code: CloseCode::from(code), reason: text.into() }))
        }
        None => WsMessage::text(text),
    };
    let mut socket = futures::stream::iter([Ok(message)]);
    match futures::executor::block_on(gateway::next_payload(&mut socket)) {
        Some(Ok(payload)) => {
            let ready = (payload.op == 0 && payload.t.as_deref() == Some("READY"))
                .then(|| gateway::ready(&payload.d))
                .flatten();
            DiscordFrame::Payload {
                op: payload.op,
                seq: payload.s,
                name: payload.t,
                data: payload.d,
                ready,
            }
        }
        Some(Err(gateway::Closed(code))) => {
            DiscordFrame::Closed { code, fatal: gateway::fatal_close(code).is_some() }
        }
        None => DiscordFrame::Skipped,
    }
}
