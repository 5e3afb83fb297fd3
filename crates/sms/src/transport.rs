//! [`SmsTransport`]: the webhook as a transport. It binds its listener when
//! started, so a port in use is a failing transport (retried), and shows its
//! address in `/v1/status` and `/healthz`.

use std::io;
use std::sync::Arc;

use async_trait::async_trait;
use lemon_core::transport::{Transport, TransportContext, TransportError};
use lemon_transports::access::Access;
use tokio_util::task::TaskTracker;

use crate::config::SmsConfig;
use crate::inbox::StoreInbox;
use crate::media::MmsMedia;
use crate::reply::{Replies, SMS_TRANSPORT_ID};
use crate::send::SmsSender;
use crate::webhook::{router, HookState};

/// The SMS webhook (`POST /webhooks/twilio/sms`).
pub struct SmsTransport {
    pub(crate) config: Arc<SmsConfig>,
    pub(crate) auth_token: Option<Arc<str>>,
    pub(crate) account_sid: Option<Arc<str>>,
    pub(crate) inbox: Arc<StoreInbox>,
    pub(crate) sender: Option<SmsSender>,
}

impl std::fmt::Debug for SmsTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SmsTransport")
            .field("addr", &self.config.addr())
            .field("auth_token", &self.auth_token.as_ref().map(|_| "<redacted>"))
            .finish_non_exhaustive()
    }
}

fn bind_error(addr: &str, err: &io::Error) -> TransportError {
    let message = format!("could not listen on {addr}: {err}");
    match err.kind() {
        io::ErrorKind::PermissionDenied | io::ErrorKind::InvalidInput => {
            TransportError::fatal(message)
        }
        _ => TransportError::retryable(message),
    }
}

#[async_trait]
impl Transport for SmsTransport {
    fn id(&self) -> &str {
        SMS_TRANSPORT_ID
    }

    async fn run(&self, ctx: TransportContext) -> Result<(), TransportError> {
        if let Some(problem) = self.config.files.check().into_iter().next() {
            return Err(TransportError::fatal(format!("invalid [gateway.sms]: files.{problem}")));
        }
        let addr = self.config.addr();
        let listener = lemon_api::http::bind(&addr).await.map_err(|err| bind_error(&addr, &err))?;
        let local = listener.local_addr().map_err(|err| bind_error(&addr, &err))?;
        // Answers under way stop with this run of the transport; the next
        // start picks up what they left on record.
        let stop = ctx.shutdown.child_token();
        let deliveries = TaskTracker::new();
        let replies = match (&self.sender, self.config.reply_to_allowed) {
            (Some(sender), true) => {
                let replies = Replies::new(
                    ctx.router.clone(),
                    sender.clone(),
                    ctx.store.clone(),
                    stop.clone(),
                    ctx.approvals.clone(),
                );
                // MMS media are fetched with the account's credentials.
                let media = match (&self.account_sid, &self.auth_token) {
                    (Some(sid), Some(token)) => Some(MmsMedia::new(
                        ctx.media.clone(),
                        self.config.files.clone(),
                        &self.config.api_base_url,
                        sid,
                        token,
                    )),
                    _ => None,
                };
                let replies = replies.with_media(media);
                let recovered = replies.recover(&deliveries).await;
                if recovered > 0 {
                    tracing::info!(recovered, "SMS answers owed from before the restart");
                }
                Some(replies)
            }
            _ => None,
        };
        // Only conversations can be open to everyone: without them a text
        // starts nothing.
        let access = Access::new(SMS_TRANSPORT_ID, self.config.allow_everyone && replies.is_some());
        access.warn_at_start();
        let detail = match self.config.webhook_url() {
            Some(url) => format!("{local} {url}"),
            None => local.to_string(),
        };
        let detail = access.detail(detail);
        let state = HookState {
            config: self.config.clone(),
            auth_token: self.auth_token.clone(),
            inbox: self.inbox.clone(),
            replies,
            access: Arc::new(access),
            tracker: deliveries.clone(),
        };
        if let Some(sender) = &self.sender {
            ctx.status.track_backlog(sender.backlog());
        }
        ctx.status.running(Some(detail));
        tracing::info!(sms_addr = %local, "SMS webhook listening");
        let served =
            lemon_api::serve_with(listener, router(state), ctx.shutdown.clone(), ctx.http.clone())
                .await;
        stop.cancel();
        deliveries.close();
        deliveries.wait().await;
        served.map_err(|err| {
            TransportError::retryable(format!("SMS webhook on {local} stopped: {err}"))
        })
    }
}
