//! `lemon-gateway run` and `status`: a client of a running gateway's control API.

use std::io::Write;

use anyhow::{bail, Context};
use futures::StreamExt;
use lemon_core::config::{self, DEFAULT_API_PORT};
use lemon_core::secrets::{SecretStore, SecretValue};

use crate::sse::SseParser;
use lemon_server::paths::Paths;
use lemon_server::API_TOKEN_SECRET;

/// Where the gateway is and how to authenticate.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    pub base_url: String,
    pub token: SecretValue,
}

impl ClientConfig {
    /// The URL from `--url`/`LEMON_URL` or the config's `[gateway.api]`; the token
    /// from `LEMON_API_TOKEN` or `$LEMON_HOME/secrets.toml`.
    ///
    /// # Errors
    /// A bad config file, or no token anywhere.
    pub fn resolve(
        paths: &Paths,
        env: std::collections::BTreeMap<String, String>,
        url: Option<String>,
    ) -> anyhow::Result<Self> {
        let base_url = match url {
            Some(url) => url.trim_end_matches('/').to_owned(),
            None => {
                let loaded = config::load_file_or_default(&paths.config)?;
                let api = &loaded.config.gateway.api;
                let bind = match api.bind.as_deref() {
                    None | Some("0.0.0.0") | Some("any") => "127.0.0.1",
                    Some("::") => "[::1]",
                    Some(other) => other,
                };
                format!("http://{bind}:{}", api.port.unwrap_or(DEFAULT_API_PORT))
            }
        };
        let secrets = SecretStore::new(env, paths.secrets());
        let Some(token) = secrets.get(API_TOKEN_SECRET)? else {
            bail!(
                "no API token: set LEMON_API_TOKEN, or start the gateway once so it creates {}",
                paths.secrets().display()
            );
        };
        Ok(ClientConfig { base_url, token })
    }

    fn http(&self) -> reqwest::Client {
        reqwest::Client::new()
    }

    fn get(&self, path: &str) -> reqwest::RequestBuilder {
        self.http().get(format!("{}{path}", self.base_url)).bearer_auth(self.token.expose())
    }

    fn post(&self, path: &str) -> reqwest::RequestBuilder {
        self.http().post(format!("{}{path}", self.base_url)).bearer_auth(self.token.expose())
    }
}

/// How a run ended, as the client saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunOutcome {
    /// The run's id, or the slash command that was answered instead.
    pub run_id: String,
    pub ok: bool,
    pub error: Option<String>,
}

async fn error_of(response: reqwest::Response) -> anyhow::Error {
    let status = response.status();
    let body: serde_json::Value = response.json().await.unwrap_or_default();
    let message = body.get("error").and_then(|e| e.as_str()).unwrap_or("no error message");
    anyhow::anyhow!("gateway answered {status}: {message}")
}

/// Submits a prompt, streams its answer to `out`, then prints the resume line.
///
/// # Errors
/// The gateway is unreachable or refused the request.
pub async fn run(
    client: &ClientConfig,
    session: Option<&str>,
    engine: Option<&str>,
    prompt: &str,
    out: &mut dyn Write,
) -> anyhow::Result<RunOutcome> {
    let body = serde_json::json!({ "prompt": prompt, "session_key": session, "engine": engine });
    let response = client
        .post("/v1/runs")
        .json(&body)
        .send()
        .await
        .with_context(|| format!("could not reach the gateway at {}", client.base_url))?;
    if !response.status().is_success() {
        return Err(error_of(response).await);
    }
    let accepted: serde_json::Value = response.json().await?;
    // Slash commands (`/status`, `/cancel`, …) are answered at once, without a run.
    if let (Some(command), Some(reply)) = (accepted["command"].as_str(), accepted["reply"].as_str())
    {
        writeln!(out, "{reply}")?;
        return Ok(RunOutcome { run_id: format!("/{command}"), ok: true, error: None });
    }
    let run_id =
        accepted["run_id"].as_str().context("the gateway answered without a run id")?.to_owned();

    let response = client.get(&format!("/v1/runs/{run_id}/events")).send().await?;
    if !response.status().is_success() {
        return Err(error_of(response).await);
    }
    let mut stream = response.bytes_stream();
    let mut parser = SseParser::default();
    let mut streamed = String::new();
    let mut completed: Option<serde_json::Value> = None;
    'stream: while let Some(chunk) = stream.next().await {
        for event in parser.push(&chunk?) {
            let data: serde_json::Value = serde_json::from_str(&event.data).unwrap_or_default();
            match event.event.as_str() {
                "delta" => {
                    let text = data["text"].as_str().unwrap_or_default();
                    streamed.push_str(text);
                    out.write_all(text.as_bytes())?;
                    out.flush()?;
                }
                "run_completed" => {
                    completed = Some(data);
                    break 'stream;
                }
                _ => {}
            }
        }
    }
    let Some(completed) = completed else {
        bail!("the event stream of run {run_id} ended before the run completed")
    };
    let answer = completed["answer"].as_str().unwrap_or_default();
    if streamed.is_empty() && !answer.is_empty() {
        out.write_all(answer.as_bytes())?;
    }
    if !streamed.is_empty() || !answer.is_empty() {
        writeln!(out)?;
    }
    let run: serde_json::Value =
        client.get(&format!("/v1/runs/{run_id}")).send().await?.json().await?;
    if let Some(line) = run["resume_line"].as_str() {
        writeln!(out, "\n`{line}`")?;
    }
    let ok = completed["ok"].as_bool().unwrap_or(false);
    let error = completed["error"].as_str().map(str::to_owned);
    Ok(RunOutcome { run_id, ok, error })
}

/// The gateway's `/v1/status`.
///
/// # Errors
/// The gateway is unreachable or refused the request.
pub async fn status(client: &ClientConfig) -> anyhow::Result<serde_json::Value> {
    let response = client
        .get("/v1/status")
        .send()
        .await
        .with_context(|| format!("could not reach the gateway at {}", client.base_url))?;
    if !response.status().is_success() {
        return Err(error_of(response).await);
    }
    Ok(response.json().await?)
}
