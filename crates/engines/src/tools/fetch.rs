//! `fetch`: HTTP GET of a URL, text only, bounded in size and time.
//!
//! The rule of webhook callbacks applies ([`lemon_core::net`]): unless
//! `fetch_allow_private` is set, a host named `localhost` (and the like) is
//! refused, the host is resolved first and refused if any of its addresses is
//! loopback, private or link-local, and the connection goes to the address
//! that was checked (no second lookup). Redirects are followed by hand, at
//! most [`MAX_REDIRECTS`], each hop checked the same way.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use async_trait::async_trait;
use lemon_core::net::is_localhost_name;
use lemon_core::tool::{Tool, ToolContext, ToolOutput, ToolSpec};
use reqwest::header::{CONTENT_TYPE, LOCATION};
use reqwest::Url;
use serde_json::{json, Value};

use super::args::Args;
use super::{looks_like_text, BuiltinOptions};

/// Redirects followed before giving up.
const MAX_REDIRECTS: usize = 5;

/// `fetch`.
#[derive(Debug)]
pub(super) struct Fetch {
    options: Arc<BuiltinOptions>,
    /// Which addresses count as private.
    is_private: fn(IpAddr) -> bool,
}

impl Fetch {
    pub(super) fn new(options: Arc<BuiltinOptions>) -> Self {
        Fetch { options, is_private: lemon_core::net::is_private }
    }

    #[cfg(test)]
    pub(super) fn with_rule(options: Arc<BuiltinOptions>, is_private: fn(IpAddr) -> bool) -> Self {
        Fetch { options, is_private }
    }
}

/// Why a fetch failed, as the model reads it.
#[derive(Debug)]
enum FetchError {
    Refused(String),
    Failed(String),
}

#[async_trait]
impl Tool for Fetch {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "fetch".to_owned(),
            description: format!(
                "HTTP GET a URL (http or https) and return the response body as text (HTML, \
                 JSON, plain text…; binary content is refused). The body is cut at {} bytes and \
                 the whole request must finish within {} ms.{}",
                self.options.fetch_max_bytes,
                self.options.fetch_timeout.as_millis(),
                if self.options.fetch_allow_private {
                    ""
                } else {
                    " Local and private network addresses are refused."
                }
            ),
            parameters: json!({
                "type": "object",
                "properties": {
                    "url": {"type": "string", "description": "The http:// or https:// URL to get"}
                },
                "required": ["url"],
                "additionalProperties": false
            }),
        }
    }

    async fn execute(&self, args: Value, ctx: ToolContext) -> ToolOutput {
        let raw = match Args::new(&args).and_then(|args| args.required_str("url")) {
            Ok(raw) => raw,
            Err(message) => return ToolOutput::error(message),
        };
        let timeout = self.options.fetch_timeout;
        let timeout_ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
        tokio::select! {
            () = ctx.cancel.cancelled() => ToolOutput::error("The run was cancelled; the fetch was stopped."),
            done = tokio::time::timeout(timeout, self.fetch(&raw)) => match done {
                Ok(Ok(output)) => output,
                Ok(Err(FetchError::Refused(message))) => {
                    let mut output = ToolOutput::error(message);
                    output.result_meta = json!({ "error_type": "refused" });
                    output
                }
                Ok(Err(FetchError::Failed(message))) => ToolOutput::error(message),
                Err(_) => {
                    let mut output = ToolOutput::error(format!("The fetch timed out after {timeout_ms} ms."));
                    output.result_meta = json!({ "error_type": "timeout", "timeout_ms": timeout_ms });
                    output
                }
            }
        }
    }
}

impl Fetch {
    async fn fetch(&self, raw: &str) -> Result<ToolOutput, FetchError> {
        let mut url =
            Url::parse(raw).map_err(|err| FetchError::Failed(format!("invalid URL: {err}")))?;
        let mut hops = 0;
        let response = loop {
            let client = self.client_for(&url).await?;
            let response = client
                .get(url.clone())
                .header("accept", "text/*, application/json, application/xml;q=0.9, */*;q=0.1")
                .send()
                .await
                .map_err(|err| {
                    FetchError::Failed(format!("the request failed: {}", without_url(&err)))
                })?;
            if !response.status().is_redirection() {
                break response;
            }
            let Some(location) = response.headers().get(LOCATION).and_then(|v| v.to_str().ok())
            else {
                break response;
            };
            hops += 1;
            if hops > MAX_REDIRECTS {
                return Err(FetchError::Failed(format!("more than {MAX_REDIRECTS} redirects")));
            }
            url = url
                .join(location)
                .map_err(|err| FetchError::Failed(format!("invalid redirect location: {err}")))?;
        };
        self.read(response).await
    }

    /// A client that connects to `url`'s host at an address checked by the
    /// private-address rule.
    async fn client_for(&self, url: &Url) -> Result<reqwest::Client, FetchError> {
        if !matches!(url.scheme(), "http" | "https") {
            return Err(FetchError::Refused(format!(
                "only http and https URLs can be fetched, not {}:",
                url.scheme()
            )));
        }
        let port = url.port_or_known_default().unwrap_or(80);
        let host =
            url.host_str().ok_or_else(|| FetchError::Failed("the URL has no host".into()))?;
        let literal = host.trim_start_matches('[').trim_end_matches(']').parse::<IpAddr>().ok();
        let allow = self.options.fetch_allow_private;
        let builder = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .user_agent(concat!("lemon-gateway/", env!("CARGO_PKG_VERSION")));
        let builder = match literal {
            Some(ip) => {
                if !allow && (self.is_private)(ip) {
                    return Err(private(host, ip));
                }
                builder
            }
            None => {
                let name = host.trim_end_matches('.').to_ascii_lowercase();
                if !allow && is_localhost_name(&name) {
                    return Err(FetchError::Refused(format!(
                        "{name} is a local address; fetching local and private addresses is not allowed"
                    )));
                }
                let addrs: Vec<SocketAddr> = tokio::net::lookup_host((name.as_str(), port))
                    .await
                    .map_err(|err| FetchError::Failed(format!("could not resolve {name}: {err}")))?
                    .collect();
                let Some(first) = addrs.first().copied() else {
                    return Err(FetchError::Failed(format!("{name} has no addresses")));
                };
                if !allow {
                    if let Some(addr) = addrs.iter().find(|addr| (self.is_private)(addr.ip())) {
                        return Err(private(&name, addr.ip()));
                    }
                }
                builder.resolve(&name, first)
            }
        };
        builder.build().map_err(|err| FetchError::Failed(format!("no HTTP client: {err}")))
    }

    async fn read(&self, mut response: reqwest::Response) -> Result<ToolOutput, FetchError> {
        let status = response.status();
        let final_url = response.url().clone();
        let content_type =
            response.headers().get(CONTENT_TYPE).and_then(|v| v.to_str().ok()).map(str::to_owned);
        if let Some(kind) = content_type.as_deref().filter(|kind| !is_text(kind)) {
            return Err(FetchError::Failed(format!(
                "{final_url} is not text (content-type {kind}); only text can be fetched"
            )));
        }
        let max = self.options.fetch_max_bytes;
        let mut body = Vec::new();
        let mut truncated = false;
        while let Some(chunk) = response.chunk().await.map_err(|err| {
            FetchError::Failed(format!("reading the body failed: {}", without_url(&err)))
        })? {
            let room = max - body.len();
            if chunk.len() > room {
                body.extend_from_slice(&chunk[..room]);
                truncated = true;
                break;
            }
            body.extend_from_slice(&chunk);
        }
        if content_type.is_none() && !looks_like_text(&body[..body.len().min(8 * 1024)]) {
            return Err(FetchError::Failed(format!(
                "{final_url} is not text; only text can be fetched"
            )));
        }
        let text = String::from_utf8_lossy(&body);
        let text = if truncated { text.trim_end_matches('\u{FFFD}') } else { &text };
        let kind = content_type.as_deref().unwrap_or("unknown type");
        let mut out = format!("HTTP {status} ({kind}, {} bytes)\n\n{text}", body.len());
        if truncated {
            out.push_str(&format!("\n[the body was cut at {max} bytes]"));
        }
        let details = json!({
            "url": final_url.as_str(),
            "status": status.as_u16(),
            "content_type": content_type,
            "bytes": body.len(),
            "truncated": truncated,
        });
        if status.is_success() {
            Ok(ToolOutput::ok(out, details))
        } else {
            let mut output = ToolOutput::error(out);
            output.details = details;
            output.details["error"] = json!(true);
            output.result_meta = json!({ "error_type": "http_status", "status": status.as_u16() });
            Ok(output)
        }
    }
}

fn private(host: &str, ip: IpAddr) -> FetchError {
    FetchError::Refused(format!(
        "{host} resolves to {ip}, a loopback, private or link-local address; fetching those is not allowed"
    ))
}

/// A request error without the URL it carries (a URL may hold a token).
fn without_url(err: &reqwest::Error) -> String {
    let mut text = err.to_string();
    if let Some(url) = err.url() {
        text = text.replace(url.as_str(), "the URL");
    }
    let mut source = std::error::Error::source(err);
    while let Some(inner) = source {
        text.push_str(&format!(": {inner}"));
        source = inner.source();
    }
    text
}

/// Content types read as text.
fn is_text(content_type: &str) -> bool {
    let essence = content_type.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
    essence.starts_with("text/")
        || essence.ends_with("+json")
        || essence.ends_with("+xml")
        || matches!(
            essence.as_str(),
            "application/json"
                | "application/xml"
                | "application/javascript"
                | "application/x-javascript"
                | "application/ecmascript"
                | "application/x-www-form-urlencoded"
                | "application/yaml"
                | "application/x-yaml"
                | "application/toml"
        )
}

#[cfg(test)]
mod tests;
