//! `sms_send`: a run texts one of the numbers `[gateway.sms]` allows
//! (`allowed_senders` and `allowed_recipients`), from the inbox number.

use std::sync::Arc;

use async_trait::async_trait;
use lemon_core::tool::{Tool, ToolContext, ToolOutput, ToolSpec};
use serde_json::{json, Value};

use crate::config::SmsConfig;
use crate::send::{SmsSendError, SmsSender, MAX_BODY_CHARS};

/// The `sms_send` tool.
#[derive(Debug)]
pub struct SendTool {
    config: Arc<SmsConfig>,
    /// `None`: the gateway has no Twilio credentials.
    sender: Option<SmsSender>,
}

impl SendTool {
    pub(crate) fn new(config: Arc<SmsConfig>, sender: Option<SmsSender>) -> Self {
        SendTool { config, sender }
    }
}

fn text_arg<'a>(args: &'a Value, key: &str) -> Result<&'a str, String> {
    match args.get(key) {
        Some(Value::String(s)) if !s.trim().is_empty() => Ok(s.as_str()),
        Some(Value::String(_)) | None | Some(Value::Null) => {
            Err(format!("Missing required parameter: {key}"))
        }
        Some(_) => Err(format!("{key} must be a string")),
    }
}

#[async_trait]
impl Tool for SendTool {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "sms_send".to_owned(),
            description: format!(
                "Send an SMS (at most {MAX_BODY_CHARS} characters) from the gateway's number \
                 to one of the numbers the gateway's configuration allows (E.164, like \
                 +15551234567)."
            ),
            parameters: json!({
                "type": "object",
                "properties": {
                    "to": {"type": "string", "description": "The recipient, E.164"},
                    "body": {"type": "string", "description": "The text"}
                },
                "required": ["to", "body"],
                "additionalProperties": false
            }),
        }
    }

    async fn execute(&self, args: Value, ctx: ToolContext) -> ToolOutput {
        let Some(sender) = &self.sender else {
            return ToolOutput::error(
                "SMS sending is not configured on this gateway (no Twilio credentials or inbox number).",
            );
        };
        let (to, body) = match (text_arg(&args, "to"), text_arg(&args, "body")) {
            (Ok(to), Ok(body)) => (to.trim(), body),
            (Err(message), _) | (_, Err(message)) => return ToolOutput::error(message),
        };
        if !self.config.may_send_to(to) {
            return ToolOutput::error(format!(
                "{to} is not a number this gateway may text; allowed: {}",
                allowed_list(&self.config)
            ));
        }
        match sender.send(to, body, Some(ctx.session_key.as_str())).await {
            Ok(sent) => ToolOutput::ok(
                format!("SMS sent to {to} (MessageSid: {})", sent.sid),
                json!({ "ok": true, "message_sid": sent.sid, "status": sent.status, "to": to }),
            ),
            Err(
                error @ (SmsSendError::Invalid(_)
                | SmsSendError::Failed(_)
                | SmsSendError::ShuttingDown),
            ) => ToolOutput::error(error.to_string()),
        }
    }
}

fn allowed_list(config: &SmsConfig) -> String {
    let all: Vec<&str> = config
        .allowed_senders
        .iter()
        .chain(&config.allowed_recipients)
        .map(String::as_str)
        .collect();
    if all.is_empty() {
        "none (set allowed_senders or allowed_recipients in [gateway.sms])".to_owned()
    } else {
        all.join(", ")
    }
}

#[cfg(test)]
mod tests;
