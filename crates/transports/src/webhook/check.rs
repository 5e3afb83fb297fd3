//! The callback URLs a config names, checked once at start: a malformed or
//! private one is a config error, one whose host does not resolve a warning
//! (DNS may come back), instead of a `400` on every call.

use super::callback::{self, CallbackError, Resolve};
use super::WebhookConfig;

/// What is wrong with a configured `callback_url`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallbackUrlProblem {
    /// Malformed, not http(s), or a private address where none is allowed:
    /// the webhook cannot use it. `key` is the path in `[gateway.webhook]`.
    Invalid { key: Vec<String>, message: String },
    /// The host did not resolve now; calls would fail until it does.
    Unresolved { key: Vec<String>, message: String },
}

/// Checks the section's `callback_url` and each integration's, each with its
/// own `allow_private_callback_hosts`.
pub async fn check_callback_urls(
    config: &WebhookConfig,
    resolver: &dyn Resolve,
) -> Vec<CallbackUrlProblem> {
    let mut urls: Vec<(Vec<String>, &str, bool)> = Vec::new();
    if let Some(url) = config.callback_url.as_deref().filter(|u| !u.trim().is_empty()) {
        urls.push((vec!["callback_url".to_owned()], url, config.allow_private_callback_hosts));
    }
    for (id, integration) in &config.integrations {
        if let Some(url) = integration.callback_url.as_deref().filter(|u| !u.trim().is_empty()) {
            let key = vec!["integrations".to_owned(), id.clone(), "callback_url".to_owned()];
            let allow = integration
                .allow_private_callback_hosts
                .unwrap_or(config.allow_private_callback_hosts);
            urls.push((key, url, allow));
        }
    }
    let mut problems = Vec::new();
    for (key, url, allow_private) in urls {
        match callback::check(url, resolver, allow_private).await {
            Ok(_) => {}
            Err(CallbackError::Resolve { .. }) => {
                // The host is said, never the URL: it may carry a token.
                let host = reqwest::Url::parse(url.trim())
                    .ok()
                    .and_then(|u| u.host_str().map(str::to_owned))
                    .unwrap_or_default();
                let message =
                    format!("the host {host:?} does not resolve now; callbacks fail until it does");
                problems.push(CallbackUrlProblem::Unresolved { key, message });
            }
            Err(CallbackError::PrivateHost(host)) => {
                let message = format!(
                    "{host} is a private or loopback address; set allow_private_callback_hosts = true to allow it"
                );
                problems.push(CallbackUrlProblem::Invalid { key, message });
            }
            Err(err) => {
                let message = format!("invalid callback url: {err}");
                problems.push(CallbackUrlProblem::Invalid { key, message });
            }
        }
    }
    problems
}
