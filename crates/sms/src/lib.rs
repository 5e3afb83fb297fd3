//! Twilio SMS for Lemon Gateway: the inbound webhook with its signature check,
//! the inbox the `sms_*` tools read codes from, outbound texts over Twilio's
//! REST API, conversations over SMS, and the `/v1/sms` routes.
//!
//! [`signature`] is shared with the voice channel, whose webhooks Twilio signs
//! the same way. [`Sms`] is what the server builds from `[gateway.sms]`: it
//! hands out the transport, the inbox, the API routes and the `sms_send` tool.

pub mod api;
pub mod config;
pub mod inbox;
pub mod media;
pub mod reply;
pub mod send;
pub mod signature;
pub mod tool;
pub mod transport;
pub mod webhook;

use std::sync::Arc;

use lemon_core::store::StoreHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use config::{SmsConfig, SmsConfigError, SmsSecrets};
pub use inbox::StoreInbox;
pub use send::{SmsSender, TwilioClient};
pub use transport::SmsTransport;

/// SMS as configured: one inbox, one sender (when Twilio credentials and an
/// inbox number are set), shared by the webhook, the API and the tools.
#[derive(Debug, Clone)]
pub struct Sms {
    config: Arc<SmsConfig>,
    auth_token: Option<Arc<str>>,
    /// For fetching MMS media (with the auth token).
    account_sid: Option<Arc<str>>,
    inbox: Arc<StoreInbox>,
    sender: Option<SmsSender>,
}

impl Sms {
    /// Builds SMS from a checked `config` and its `secrets`
    /// ([`SmsConfig::resolve`]) on `store`; texts stop with `token`.
    pub fn new(
        config: SmsConfig,
        secrets: SmsSecrets,
        store: StoreHandle,
        token: CancellationToken,
        tracker: &TaskTracker,
    ) -> Self {
        let inbox = Arc::new(StoreInbox::new(
            store.clone(),
            config.inbox_number.clone(),
            config.inbox_ttl_ms,
        ));
        let sender = match (&secrets.account_sid, &secrets.auth_token, &config.inbox_number) {
            (Some(sid), Some(token_value), Some(from)) => {
                let client = TwilioClient::new(
                    &config.api_base_url,
                    sid.clone(),
                    token_value.clone(),
                    from.clone(),
                )
                .with_timeout(config.api_timeout());
                Some(SmsSender::spawn(client, store, config.inbox_ttl(), token, tracker))
            }
            _ => None,
        };
        Sms {
            account_sid: secrets.account_sid.map(Into::into),
            auth_token: secrets.auth_token.map(Into::into),
            config: Arc::new(config),
            inbox,
            sender,
        }
    }

    /// The inbox, for the `sms_*` tools.
    pub fn inbox(&self) -> Arc<StoreInbox> {
        self.inbox.clone()
    }

    /// Whether texts can be sent (credentials and an inbox number are set).
    pub fn can_send(&self) -> bool {
        self.sender.is_some()
    }

    /// The webhook transport.
    pub fn transport(&self) -> Arc<SmsTransport> {
        Arc::new(SmsTransport {
            config: self.config.clone(),
            auth_token: self.auth_token.clone(),
            account_sid: self.account_sid.clone(),
            inbox: self.inbox.clone(),
            sender: self.sender.clone(),
        })
    }

    /// The OpenAPI description of [`Sms::api_routes`].
    pub fn api_doc() -> utoipa::openapi::OpenApi {
        <api::SmsDoc as utoipa::OpenApi>::openapi()
    }

    /// The `/v1/sms` routes, for `lemon_api::api::router_with`.
    pub fn api_routes(&self) -> axum::Router {
        api::routes(self.inbox.clone(), self.sender.clone())
    }

    /// The `sms_send` tool.
    pub fn send_tool(&self) -> Arc<tool::SendTool> {
        Arc::new(tool::SendTool::new(self.config.clone(), self.sender.clone()))
    }
}
