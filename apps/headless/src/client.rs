//! A client of a running gateway's control API: where it is, the token, and
//! errors a person can act on ([`ClientError`]) instead of transport errors.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;

use futures::StreamExt;
use lemon_core::config::{self, DEFAULT_API_PORT};
use lemon_core::secrets::{env_var_name, SecretValue};
use lemon_server::paths::Paths;
use lemon_server::API_TOKEN_SECRET;
use serde_json::Value;

use crate::sse::SseParser;

/// Where the API token was found, for the message when the gateway refuses it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenSource {
    /// The environment variable (`LEMON_API_TOKEN`).
    Env(String),
    /// The OS keychain.
    Keychain,
    /// The secrets file.
    File(PathBuf),
}

impl fmt::Display for TokenSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TokenSource::Env(var) => write!(f, "${var}"),
            TokenSource::File(path) => write!(f, "{}", path.display()),
            TokenSource::Keychain => f.write_str("the keychain (lemon_api_token)"),
        }
    }
}

/// Why a request to the gateway did not get an answer to work with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientError {
    /// Nothing answers at the URL.
    Unreachable { url: String },
    /// The connection broke while following a run.
    Lost { url: String, run_id: String },
    /// No token in the environment or the secrets file.
    NoToken { var: String, file: PathBuf },
    /// The gateway refused the token.
    Unauthorized { url: String, source: TokenSource },
    /// The gateway answered with an error (`{"error": …}`).
    Refused { status: u16, message: String },
    /// The gateway's answer was not what this client understands.
    Protocol(String),
}

impl ClientError {
    /// The process exit code for this error (see [`crate::cli`]).
    pub fn exit_code(&self) -> u8 {
        match self {
            ClientError::Unreachable { .. } | ClientError::Lost { .. } => 3,
            ClientError::NoToken { .. } | ClientError::Unauthorized { .. } => 4,
            ClientError::Refused { .. } | ClientError::Protocol(_) => 1,
        }
    }
}

impl fmt::Display for ClientError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClientError::Unreachable { url } => write!(
                f,
                "cannot reach the gateway at {url}: is it running? start it with `lemon-gateway`"
            ),
            ClientError::Lost { url, run_id } => write!(
                f,
                "lost the connection to the gateway at {url} while following run {run_id}; once it is back, follow the run with `lemon-gateway attach {run_id}`"
            ),
            ClientError::NoToken { var, file } => write!(
                f,
                "no API token: looked in ${var} and {}; set {var}, or start the gateway once so it creates the file",
                file.display()
            ),
            ClientError::Unauthorized { url, source } => write!(
                f,
                "the gateway at {url} refused the API token from {source}; use the token the gateway printed when it created it (in its secrets.toml)"
            ),
            ClientError::Refused { status, message } => {
                write!(f, "the gateway refused the request ({status}): {message}")
            }
            ClientError::Protocol(message) => write!(f, "unexpected answer from the gateway: {message}"),
        }
    }
}

impl std::error::Error for ClientError {}

/// Where the gateway is and how to authenticate.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    pub base_url: String,
    pub token: SecretValue,
    pub token_source: TokenSource,
}

impl ClientConfig {
    /// The URL from `--url`/`LEMON_URL` or the config's `[gateway.api]`; the token
    /// from `LEMON_API_TOKEN` or `$LEMON_HOME/secrets.toml`.
    ///
    /// # Errors
    /// A bad config file ([`config::ConfigError`]), or no token anywhere
    /// ([`ClientError::NoToken`]).
    pub fn resolve(
        paths: &Paths,
        env: BTreeMap<String, String>,
        url: Option<String>,
    ) -> anyhow::Result<Self> {
        let base_url = match url {
            Some(url) => url.trim_end_matches('/').to_owned(),
            None => match config::load_file_or_default(&paths.config) {
                Ok(loaded) => {
                    let api = &loaded.config.gateway.api;
                    let bind = match api.bind.as_deref() {
                        None | Some("0.0.0.0") | Some("any") => "127.0.0.1",
                        Some("::") => "[::1]",
                        Some(other) => other,
                    };
                    format!("http://{bind}:{}", api.port.unwrap_or(DEFAULT_API_PORT))
                }
                // An edit the running gateway refused: it still runs on its
                // last good config, and says where it listens.
                Err(error) => match running_api(paths) {
                    Some(api) => {
                        warn_refused_config(&error, &api);
                        api
                    }
                    None => return Err(error.into()),
                },
            },
        };
        let var = env_var_name(API_TOKEN_SECRET);
        let from_env = env.get(&var).is_some_and(|value| !value.trim().is_empty());
        let secrets = lemon_server::open_secrets(paths, &env);
        let Some(token) = secrets.get(API_TOKEN_SECRET)? else {
            return Err(ClientError::NoToken { var, file: paths.secrets() }.into());
        };
        let in_keychain =
            secrets.kind_of(API_TOKEN_SECRET)? == Some(lemon_core::secrets::SourceKind::Keychain);
        let token_source = if in_keychain {
            TokenSource::Keychain
        } else if from_env {
            TokenSource::Env(var)
        } else {
            TokenSource::File(paths.secrets())
        };
        Ok(ClientConfig { base_url, token, token_source })
    }
}

/// The control API's URL from the running gateway's file
/// ([`Paths::running`]); `None` without one.
fn running_api(paths: &Paths) -> Option<String> {
    let text = std::fs::read_to_string(paths.running()).ok()?;
    let body: serde_json::Value = serde_json::from_str(&text).ok()?;
    let api = body.get("api")?.as_str()?;
    // Only a loopback or plain address: the file is the gateway's own, but
    // what reaches the token must not be steered elsewhere by its text.
    api.strip_prefix("http://")
        .filter(|rest| rest.parse::<std::net::SocketAddr>().is_ok())
        .map(|_| api.to_owned())
}

#[allow(clippy::print_stderr)] // The command's own warning, before any output.
fn warn_refused_config(error: &config::ConfigError, api: &str) {
    eprintln!(
        "lemon-gateway: warning: {error}\n  (the file has an edit the gateway refused; it runs on its last good config at {api})"
    );
}

/// A connection to the gateway's control API.
#[derive(Debug, Clone)]
pub struct Client {
    config: ClientConfig,
    http: reqwest::Client,
}

impl Client {
    pub fn new(config: ClientConfig) -> Self {
        Client { config, http: reqwest::Client::new() }
    }

    /// The gateway's base URL.
    pub fn url(&self) -> &str {
        &self.config.base_url
    }

    async fn send(
        &self,
        request: reqwest::RequestBuilder,
    ) -> Result<reqwest::Response, ClientError> {
        let response = request
            .bearer_auth(self.config.token.expose())
            .send()
            .await
            .map_err(|_| ClientError::Unreachable { url: self.config.base_url.clone() })?;
        let status = response.status();
        if status == reqwest::StatusCode::UNAUTHORIZED {
            return Err(ClientError::Unauthorized {
                url: self.config.base_url.clone(),
                source: self.config.token_source.clone(),
            });
        }
        if !status.is_success() {
            let body: Value = response.json().await.unwrap_or_default();
            let message = body["error"].as_str().unwrap_or("no error message").to_owned();
            return Err(ClientError::Refused { status: status.as_u16(), message });
        }
        Ok(response)
    }

    async fn json(&self, request: reqwest::RequestBuilder) -> Result<Value, ClientError> {
        let response = self.send(request).await?;
        response.json().await.map_err(|e| ClientError::Protocol(format!("not JSON: {e}")))
    }

    /// `GET path` as JSON.
    ///
    /// # Errors
    /// See [`ClientError`].
    pub async fn get(&self, path: &str) -> Result<Value, ClientError> {
        self.json(self.http.get(format!("{}{path}", self.config.base_url))).await
    }

    /// `GET path` as text (an export).
    ///
    /// # Errors
    /// See [`ClientError`].
    pub async fn get_text(&self, path: &str) -> Result<String, ClientError> {
        let response = self.send(self.http.get(format!("{}{path}", self.config.base_url))).await?;
        response.text().await.map_err(|e| ClientError::Protocol(format!("not text: {e}")))
    }

    /// `POST path` with a JSON `body`, as JSON.
    ///
    /// # Errors
    /// See [`ClientError`].
    pub async fn post(&self, path: &str, body: &Value) -> Result<Value, ClientError> {
        self.json(self.http.post(format!("{}{path}", self.config.base_url)).json(body)).await
    }

    /// The run's events (`GET /v1/runs/{id}/events`): stored ones first, then
    /// live ones, ending with `run_completed`.
    ///
    /// # Errors
    /// See [`ClientError`].
    pub async fn events(&self, run_id: &str) -> Result<Events, ClientError> {
        let url = format!("{}/v1/runs/{run_id}/events", self.config.base_url);
        let response = self.send(self.http.get(url)).await?;
        Ok(Events {
            stream: Box::pin(
                response.bytes_stream().map(|chunk| chunk.map(|bytes| bytes.to_vec())),
            ),
            parser: SseParser::default(),
            pending: std::collections::VecDeque::new(),
            url: self.config.base_url.clone(),
            run_id: run_id.to_owned(),
        })
    }
}

type ByteStream = std::pin::Pin<Box<dyn futures::Stream<Item = reqwest::Result<Vec<u8>>> + Send>>;

/// A run's event stream: `(type, data)` pairs.
pub struct Events {
    stream: ByteStream,
    parser: SseParser,
    pending: std::collections::VecDeque<(String, Value)>,
    url: String,
    run_id: String,
}

impl fmt::Debug for Events {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Events").field("run_id", &self.run_id).finish_non_exhaustive()
    }
}

impl Events {
    /// The next event; `None` when the stream ended.
    ///
    /// # Errors
    /// [`ClientError::Lost`] when the connection breaks.
    ///
    /// # Cancel safety
    /// Cancel safe: a chunk read is parsed before the future completes, and
    /// events not yet returned wait in the queue.
    pub async fn next(&mut self) -> Result<Option<(String, Value)>, ClientError> {
        loop {
            if let Some(event) = self.pending.pop_front() {
                return Ok(Some(event));
            }
            match self.stream.next().await {
                None => return Ok(None),
                Some(Err(_)) => {
                    return Err(ClientError::Lost {
                        url: self.url.clone(),
                        run_id: self.run_id.clone(),
                    })
                }
                Some(Ok(chunk)) => {
                    for event in self.parser.push(&chunk) {
                        let data = serde_json::from_str(&event.data).unwrap_or_default();
                        self.pending.push_back((event.event, data));
                    }
                }
            }
        }
    }
}
