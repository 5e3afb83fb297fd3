//! The bridge as the outbox's [`Sink`]: a send is a `send` line answered by
//! `sent` or `error`. XMTP messages are not edited, so the outbox only sends.

use std::sync::Arc;

use async_trait::async_trait;

use super::bridge::{Link, SendError};
use crate::delivery::{Failure, Sink};

/// An answer for one conversation.
#[derive(Debug, Clone)]
pub(super) struct Outgoing {
    /// The same for every attempt of one answer (the run id).
    pub(super) request_id: String,
    pub(super) conversation_id: String,
    pub(super) text: String,
}

#[derive(Debug)]
pub(super) struct BridgeSink {
    pub(super) link: Arc<Link>,
}

#[async_trait]
impl Sink for BridgeSink {
    type Dest = String;
    type MessageId = String;
    type Message = Outgoing;
    type Edit = String;
    type Receipt = String;
    type Error = SendError;

    fn destination(&self, message: &Outgoing) -> String {
        message.conversation_id.clone()
    }

    fn redirect(&self, message: &mut Outgoing, to: &String) {
        message.conversation_id.clone_from(to);
    }

    fn message_id(&self, receipt: &String) -> String {
        receipt.clone()
    }

    fn shown(&self, _message: Outgoing) -> Option<String> {
        None
    }

    fn classify(&self, error: &SendError) -> Failure<String> {
        match error {
            SendError::BridgeDown(_) | SendError::Timeout => Failure::Transient,
            SendError::Failed { retry: true, .. } => Failure::Transient,
            SendError::Failed { retry: false, .. } => Failure::Fatal,
        }
    }

    async fn send(&self, message: &Outgoing) -> Result<String, SendError> {
        self.link.send(&message.request_id, &message.conversation_id, &message.text).await
    }

    async fn edit(&self, _dest: &String, _id: &String, _edit: &String) -> Result<(), SendError> {
        Ok(())
    }
}
