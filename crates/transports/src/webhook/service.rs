//! [`WebhookTransport`]: the webhook router as a transport. It binds its
//! listener when started, so a port in use is a failing transport (retried)
//! rather than a gateway that does not start.

use std::collections::BTreeMap;
use std::fmt;
use std::io;
use std::sync::Arc;

use async_trait::async_trait;

use super::{router, Resolve, WebhookConfig, WebhookDeps, WebhookState, WEBHOOK_TRANSPORT_ID};
use lemon_core::transport::{Transport, TransportContext, TransportError};

/// The generic webhook transport (`POST /webhooks/{integration}`).
pub struct WebhookTransport {
    config: WebhookConfig,
    /// Integration id → token. Never logged.
    tokens: BTreeMap<String, String>,
    resolver: Arc<dyn Resolve>,
}

impl fmt::Debug for WebhookTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WebhookTransport")
            .field("addr", &self.config.addr())
            .field("tokens", &"<redacted>")
            .finish_non_exhaustive()
    }
}

impl WebhookTransport {
    /// A webhook transport serving `config` with the integrations' `tokens`
    /// (see [`WebhookConfig::resolve_tokens`]), resolving callback hosts with
    /// `resolver`.
    pub fn new(
        config: WebhookConfig,
        tokens: BTreeMap<String, String>,
        resolver: Arc<dyn Resolve>,
    ) -> Self {
        WebhookTransport { config, tokens, resolver }
    }
}

/// Whether a failed bind can succeed later without a config change.
fn bind_error(addr: &str, err: &io::Error) -> TransportError {
    let message = format!("could not listen on {addr}: {err}");
    match err.kind() {
        // Only a config change (another port or address) or privileges help.
        io::ErrorKind::PermissionDenied | io::ErrorKind::InvalidInput => {
            TransportError::fatal(message)
        }
        // A port in use is freed, an address appears when its interface comes up.
        _ => TransportError::retryable(message),
    }
}

#[async_trait]
impl Transport for WebhookTransport {
    fn id(&self) -> &str {
        WEBHOOK_TRANSPORT_ID
    }

    async fn run(&self, ctx: TransportContext) -> Result<(), TransportError> {
        let addr = self.config.addr();
        let listener = lemon_api::http::bind(&addr).await.map_err(|err| bind_error(&addr, &err))?;
        let local = listener.local_addr().map_err(|err| bind_error(&addr, &err))?;
        // Callback deliveries stop with this run of the transport; the next
        // start picks up what they left on record.
        let stop = ctx.shutdown.child_token();
        let state = WebhookState::new(WebhookDeps {
            config: self.config.clone(),
            tokens: self.tokens.clone(),
            router: ctx.router.clone(),
            store: ctx.store.clone(),
            resolver: self.resolver.clone(),
            tracker: ctx.tracker.clone(),
            shutdown: stop.clone(),
            status: Some((ctx.status.clone(), local.to_string())),
            media: ctx.media.clone(),
        });
        // Subscribed before serving, so no run of an integration's session is missed.
        let others = ctx.router.subscribe_starts();
        state.recover_callbacks().await;
        let watcher = state.clone();
        ctx.tracker.spawn(async move { watcher.deliver_others(others).await });
        let deliveries = state.clone();
        tracing::info!(webhook_addr = %local, "webhooks listening");
        let served =
            lemon_api::serve_with(listener, router(state), ctx.shutdown.clone(), ctx.http.clone())
                .await;
        stop.cancel();
        // A restart's recovery must not find a record whose attempt is still
        // under way here.
        deliveries.finish_deliveries().await;
        served
            .map_err(|err| TransportError::retryable(format!("webhooks on {local} stopped: {err}")))
    }
}
