//! The `sms_*` tools over the gateway's [`SmsInbox`]: the inbox number,
//! waiting for a verification code, listing and claiming messages. Without an
//! inbox they answer that SMS is not configured.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lemon_core::sms::{ListFilter, SmsError, SmsInbox, SmsMessage, WaitForCode as Wait};
use lemon_core::tool::{Tool, ToolContext, ToolOutput, ToolSpec};
use serde_json::{json, Value};

use super::args::Args;

/// The text when there is no inbox number.
const NO_NUMBER: &str =
    "SMS inbox number is not configured. Set TWILIO_INBOX_NUMBER (E.164, e.g. +15551234567).";
/// The text when the gateway has no SMS inbox at all.
const NOT_CONFIGURED: &str = "SMS is not configured on this gateway: no inbox receives messages.";
/// How long past its own timeout a wait is given before the tool stops it.
const WAIT_GRACE: Duration = Duration::from_millis(1_500);
/// How much of a body a listed message shows.
const BODY_PREVIEW_CHARS: usize = 200;

fn message_json(message: &SmsMessage) -> Value {
    json!({
        "message_sid": message.message_sid,
        "account_sid": message.account_sid,
        "to": message.to,
        "from": message.from,
        "body": message.body,
        "codes": message.codes,
        "received_at_ms": message.received_at_ms,
        "claimed_by": message.claimed_by,
        "claimed_at_ms": message.claimed_at_ms,
    })
}

fn object_schema(properties: Value, required: &[&str]) -> Value {
    json!({
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": false
    })
}

/// `sms_get_inbox_number`.
#[derive(Debug)]
pub(super) struct GetInboxNumber {
    inbox: Option<Arc<dyn SmsInbox>>,
}

impl GetInboxNumber {
    pub(super) fn new(inbox: Option<Arc<dyn SmsInbox>>) -> Self {
        GetInboxNumber { inbox }
    }
}

#[async_trait]
impl Tool for GetInboxNumber {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "sms_get_inbox_number".to_owned(),
            description: "Get the phone number (E.164) the gateway receives SMS on, to enter \
                          where a service asks for a number to send a verification code to."
                .to_owned(),
            parameters: object_schema(json!({}), &[]),
        }
    }

    async fn execute(&self, _args: Value, _ctx: ToolContext) -> ToolOutput {
        match self.inbox.as_ref().and_then(|inbox| inbox.inbox_number()) {
            Some(number) => ToolOutput::ok(number.clone(), json!({ "inbox_number": number })),
            None => ToolOutput::error(NO_NUMBER),
        }
    }
}

/// `sms_wait_for_code`.
#[derive(Debug)]
pub(super) struct WaitForCode {
    inbox: Option<Arc<dyn SmsInbox>>,
}

impl WaitForCode {
    pub(super) fn new(inbox: Option<Arc<dyn SmsInbox>>) -> Self {
        WaitForCode { inbox }
    }
}

fn wait_args(args: &Value) -> Result<Wait, String> {
    let args = Args::new(args)?;
    let defaults = Wait::default();
    Ok(Wait {
        timeout: args.uint("timeout_ms")?.map_or(defaults.timeout, Duration::from_millis),
        since_ms: args.uint("since_ms")?,
        to: args.str("to")?,
        from_contains: args.str("from_contains")?,
        body_contains: args.str("body_contains")?,
        regex: args.str("regex")?,
        claim: args.bool("claim")?.unwrap_or(defaults.claim),
    })
}

#[async_trait]
impl Tool for WaitForCode {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "sms_wait_for_code".to_owned(),
            description: "Wait for an SMS verification code on the gateway's inbox number and \
                          return it. Looks at messages already received first (use since_ms to \
                          skip old ones), then waits up to timeout_ms. The message is claimed \
                          for this session unless claim is false, so no other session gets the \
                          same code. The code is the first 4-8 digit number, or the first match \
                          of regex."
                .to_owned(),
            parameters: object_schema(
                json!({
                    "timeout_ms": {"type": "integer", "description": "How long to wait (default 60000)"},
                    "since_ms": {"type": "integer", "description": "Only messages received at or after this Unix time in ms"},
                    "to": {"type": "string", "description": "Only messages sent to this number (default: the inbox number)"},
                    "from_contains": {"type": "string", "description": "Only messages whose sender contains this"},
                    "body_contains": {"type": "string", "description": "Only messages whose text contains this"},
                    "regex": {"type": "string", "description": "The code is the first match of this regular expression"},
                    "claim": {"type": "boolean", "description": "Claim the message for this session (default true)"}
                }),
                &[],
            ),
        }
    }

    async fn execute(&self, args: Value, ctx: ToolContext) -> ToolOutput {
        let Some(inbox) = &self.inbox else { return ToolOutput::error(NOT_CONFIGURED) };
        let wait = match wait_args(&args) {
            Ok(wait) => wait,
            Err(message) => return ToolOutput::error(message),
        };
        let bound = wait.timeout + WAIT_GRACE;
        let waited = tokio::select! {
            () = ctx.cancel.cancelled() => {
                return ToolOutput::error("The run was cancelled while waiting for an SMS code.");
            }
            waited = tokio::time::timeout(bound, inbox.wait_for_code(&ctx.session_key, wait)) => {
                waited.unwrap_or(Err(SmsError::Timeout))
            }
        };
        match waited {
            Ok(found) => {
                let m = &found.message;
                let text = format!(
                    "Code: {}\nFrom: {}\nTo: {}\nMessageSid: {}\nReceivedAtMs: {}",
                    found.code, m.from, m.to, m.message_sid, m.received_at_ms
                );
                ToolOutput::ok(text, json!({ "code": found.code, "message": message_json(m) }))
            }
            Err(SmsError::Timeout) => {
                let mut output = ToolOutput::error("Timed out waiting for an SMS code.");
                output.details = json!({ "timeout": true, "error": true });
                output
            }
            Err(err) => ToolOutput::error(format!("Failed waiting for an SMS code: {err}")),
        }
    }
}

/// `sms_list_messages`.
#[derive(Debug)]
pub(super) struct ListMessages {
    inbox: Option<Arc<dyn SmsInbox>>,
}

impl ListMessages {
    pub(super) fn new(inbox: Option<Arc<dyn SmsInbox>>) -> Self {
        ListMessages { inbox }
    }
}

fn list_args(args: &Value, ctx: &ToolContext) -> Result<ListFilter, String> {
    let args = Args::new(args)?;
    let only_mine = args.bool("only_mine")?.unwrap_or(false);
    Ok(ListFilter {
        limit: args.uint("limit")?.map_or(ListFilter::default().limit, |n| n as usize),
        since_ms: args.uint("since_ms")?,
        to: args.str("to")?,
        from_contains: args.str("from_contains")?,
        body_contains: args.str("body_contains")?,
        include_claimed: args.bool("include_claimed")?.unwrap_or(false),
        claimed_by: only_mine.then(|| ctx.session_key.to_string()),
    })
}

fn list_line(index: usize, m: &SmsMessage) -> String {
    let preview: String = m.body.chars().take(BODY_PREVIEW_CHARS).collect();
    let ellipsis = if m.body.chars().count() > BODY_PREVIEW_CHARS { "..." } else { "" };
    format!(
        "{index}. MessageSid={} From={} To={} ReceivedAtMs={} Codes=[{}] ClaimedBy={} Body=\"{preview}{ellipsis}\"",
        m.message_sid,
        m.from,
        m.to,
        m.received_at_ms,
        m.codes.join(", "),
        m.claimed_by.as_deref().unwrap_or("nil"),
    )
}

#[async_trait]
impl Tool for ListMessages {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "sms_list_messages".to_owned(),
            description: "List SMS messages received on the gateway's inbox, newest first. \
                          Claimed messages are left out unless include_claimed; only_mine keeps \
                          the messages this session claimed (combine with include_claimed)."
                .to_owned(),
            parameters: object_schema(
                json!({
                    "limit": {"type": "integer", "description": "At most this many (default 20)"},
                    "since_ms": {"type": "integer", "description": "Only messages received at or after this Unix time in ms"},
                    "to": {"type": "string", "description": "Only messages sent to this number"},
                    "from_contains": {"type": "string", "description": "Only messages whose sender contains this"},
                    "body_contains": {"type": "string", "description": "Only messages whose text contains this"},
                    "include_claimed": {"type": "boolean", "description": "Include claimed messages (default false)"},
                    "only_mine": {"type": "boolean", "description": "Only messages claimed by this session (default false)"}
                }),
                &[],
            ),
        }
    }

    async fn execute(&self, args: Value, ctx: ToolContext) -> ToolOutput {
        let Some(inbox) = &self.inbox else { return ToolOutput::error(NOT_CONFIGURED) };
        let filter = match list_args(&args, &ctx) {
            Ok(filter) => filter,
            Err(message) => return ToolOutput::error(message),
        };
        let messages = match inbox.list_messages(filter).await {
            Ok(messages) => messages,
            Err(err) => return ToolOutput::error(format!("Failed to list messages: {err}")),
        };
        let text = if messages.is_empty() {
            "No messages.".to_owned()
        } else {
            let lines = messages.iter().enumerate().map(|(i, m)| list_line(i + 1, m));
            std::iter::once(format!("Messages: {}", messages.len()))
                .chain(lines)
                .collect::<Vec<_>>()
                .join("\n")
        };
        let details = json!({
            "count": messages.len(),
            "messages": messages.iter().map(message_json).collect::<Vec<_>>(),
        });
        ToolOutput::ok(text, details)
    }
}

/// `sms_claim_message`.
#[derive(Debug)]
pub(super) struct ClaimMessage {
    inbox: Option<Arc<dyn SmsInbox>>,
}

impl ClaimMessage {
    pub(super) fn new(inbox: Option<Arc<dyn SmsInbox>>) -> Self {
        ClaimMessage { inbox }
    }
}

#[async_trait]
impl Tool for ClaimMessage {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "sms_claim_message".to_owned(),
            description: "Claim an SMS message for this session (by its MessageSid from \
                          sms_list_messages), so no other session uses it."
                .to_owned(),
            parameters: object_schema(
                json!({
                    "message_sid": {"type": "string", "description": "The MessageSid to claim"}
                }),
                &["message_sid"],
            ),
        }
    }

    async fn execute(&self, args: Value, ctx: ToolContext) -> ToolOutput {
        let Some(inbox) = &self.inbox else { return ToolOutput::error(NOT_CONFIGURED) };
        let sid = match Args::new(&args).and_then(|args| args.str("message_sid")) {
            Ok(Some(sid)) => sid,
            Ok(None) => return ToolOutput::error("Missing required parameter: message_sid"),
            Err(message) => return ToolOutput::error(message),
        };
        if ctx.session_key.trim().is_empty() {
            return ToolOutput::error("sms_claim_message requires a session key (internal).");
        }
        match inbox.claim_message(&ctx.session_key, &sid).await {
            Ok(()) => ToolOutput::ok(
                format!("Claimed message: {sid}"),
                json!({ "ok": true, "message_sid": sid }),
            ),
            Err(SmsError::NotFound { .. }) => {
                ToolOutput::error(format!("Message not found: {sid}"))
            }
            Err(SmsError::AlreadyClaimed { .. }) => {
                ToolOutput::error(format!("Message is already claimed: {sid}"))
            }
            Err(err) => ToolOutput::error(format!("Failed to claim message: {err}")),
        }
    }
}

#[cfg(test)]
mod tests;
