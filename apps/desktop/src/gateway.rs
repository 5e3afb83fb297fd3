//! The gateway the app shows: one started inside the app ([`lemon_server::start`]),
//! or one already running on the same home, found through the health port of
//! its config. Both are reached the same way, over the control API on
//! loopback, so the tray, the window and the dashboard see the same thing.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use lemon_core::config;
use lemon_core::secrets::{KeychainStatus, SecretValue};
use lemon_server::paths::Paths;
use lemon_server::{Running, ServeOptions};
use serde_json::Value;

use crate::state::{Health, RunSummary, WaitingApproval};

/// How long a health probe or an API call may take.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// How long the probe for a gateway already running may take.
const ATTACH_PROBE_TIMEOUT: Duration = Duration::from_millis(800);

/// Where the app's state and settings come from.
#[derive(Debug, Clone)]
pub struct Settings {
    pub paths: Paths,
    pub env: BTreeMap<String, String>,
    pub user_home: Option<PathBuf>,
}

impl Settings {
    /// From the process environment, as the headless binary resolves them.
    pub fn from_env(env: BTreeMap<String, String>) -> Self {
        let user_home = env.get("HOME").filter(|h| !h.is_empty()).map(PathBuf::from);
        let paths = Paths::resolve(None, &env, user_home.clone());
        Settings { paths, env, user_home }
    }

    /// The app's own log file, which "Show logs" opens.
    pub fn log_file(&self) -> PathBuf {
        self.paths.home.join("logs").join("desktop.log")
    }
}

/// A fresh token for this launch's window: 32 random bytes, hex. Kept in
/// memory only.
///
/// # Errors
/// When the system has no randomness to give.
pub fn launch_token() -> anyhow::Result<SecretValue> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| anyhow::anyhow!("no randomness for a token: {e}"))?;
    Ok(SecretValue::new(bytes.iter().map(|b| format!("{b:02x}")).collect::<String>()))
}

/// How the app holds its gateway.
#[derive(Debug)]
pub enum Mode {
    /// Started inside the app; drained when the app quits.
    Embedded(Box<Running>),
    /// Started elsewhere on the same home (`lemon-gateway serve`); left running.
    Attached,
}

/// The gateway the app talks to.
#[derive(Debug)]
pub struct Connection {
    pub mode: Mode,
    /// `http://127.0.0.1:4040`: the control API and the dashboard.
    pub api_url: String,
    /// `http://127.0.0.1:4042`: `/healthz`.
    pub health_url: String,
    /// The configured API token (what "Copy API token" copies).
    pub token: SecretValue,
    /// The token the window logs in with: this launch's own when embedded,
    /// else the configured one.
    pub window_token: SecretValue,
    /// Whether the OS keychain answered, and why not.
    pub keychain: KeychainStatus,
}

fn url_of(addr: SocketAddr) -> String {
    let host = if addr.ip().is_unspecified() {
        "127.0.0.1".to_owned()
    } else if addr.is_ipv6() {
        format!("[{}]", addr.ip())
    } else {
        addr.ip().to_string()
    };
    format!("http://{host}:{}", addr.port())
}

fn loopback_url(addr: &str) -> String {
    match addr.parse::<SocketAddr>() {
        Ok(addr) => url_of(addr),
        Err(_) => format!("http://{addr}"),
    }
}

/// The configured token and the keychain's state, read as a start would
/// (the keychain probe is bounded by its own timeout).
async fn token_and_keychain(settings: &Settings) -> anyhow::Result<(SecretValue, KeychainStatus)> {
    let (paths, env) = (settings.paths.clone(), settings.env.clone());
    tokio::task::spawn_blocking(move || {
        let secrets = lemon_server::open_secrets(&paths, &env);
        let keychain = secrets.keychain().clone();
        let (token, _) = lemon_server::api_token(&env, &secrets)?;
        Ok((token, keychain))
    })
    .await
    .context("the secrets lookup stopped")?
}

/// A gateway already serving this home: its config's health port answers
/// `/healthz` as the gateway does. `None` when nothing answers there.
pub async fn find_running(settings: &Settings, http: &reqwest::Client) -> Option<(String, String)> {
    // As the gateway reads it: `LEMON_GATEWAY_HEALTH_PORT` moves the health port.
    let loaded = config::load_file_with_env(&settings.paths.config, &settings.env).ok()?;
    let gateway = &loaded.config.gateway;
    let health_url = loopback_url(&gateway.health_addr());
    let api_url = loopback_url(&gateway.api_addr());
    let response = http
        .get(format!("{health_url}/healthz"))
        .timeout(ATTACH_PROBE_TIMEOUT)
        .send()
        .await
        .ok()?;
    let body: Value = response.json().await.ok()?;
    // The gateway's answer, healthy or not: `ok` and its `checks`.
    (body.get("ok").is_some_and(Value::is_boolean) && body.get("checks").is_some())
        .then_some((api_url, health_url))
}

/// Attaches to a gateway already running on this home, else starts one inside
/// the app with `launch` accepted as an extra API token.
///
/// # Errors
/// The embedded start failed (a config error, a port in use, …).
pub async fn connect(
    settings: &Settings,
    http: &reqwest::Client,
    launch: &SecretValue,
) -> anyhow::Result<Connection> {
    if let Some((api_url, health_url)) = find_running(settings, http).await {
        tracing::info!(%api_url, "attached to the gateway already running on this home");
        let (token, keychain) = token_and_keychain(settings).await?;
        return Ok(Connection {
            mode: Mode::Attached,
            api_url,
            health_url,
            window_token: token.clone(),
            token,
            keychain,
        });
    }
    start_embedded(settings, launch).await
}

/// Starts the gateway inside the app.
///
/// # Errors
/// As [`lemon_server::start`].
pub async fn start_embedded(
    settings: &Settings,
    launch: &SecretValue,
) -> anyhow::Result<Connection> {
    let running = lemon_server::start(ServeOptions {
        paths: settings.paths.clone(),
        env: settings.env.clone(),
        user_home: settings.user_home.clone(),
        launch_token: Some(launch.clone()),
    })
    .await?;
    let (token, keychain) = token_and_keychain(settings).await?;
    tracing::info!(api = %running.api_addr, "gateway started inside the app");
    Ok(Connection {
        api_url: url_of(running.api_addr),
        health_url: url_of(running.health_addr),
        mode: Mode::Embedded(Box::new(running)),
        token,
        window_token: launch.clone(),
        keychain,
    })
}

/// Calls to the control API with a token.
#[derive(Debug, Clone)]
pub struct Api {
    pub http: reqwest::Client,
    pub api_url: String,
    pub health_url: String,
    token: SecretValue,
    /// The configured API token: `/healthz` gives its details (the store's
    /// error) to it alone.
    health_token: SecretValue,
}

impl Api {
    pub fn new(http: reqwest::Client, connection: &Connection) -> Self {
        Api {
            http,
            api_url: connection.api_url.clone(),
            health_url: connection.health_url.clone(),
            token: connection.window_token.clone(),
            health_token: connection.token.clone(),
        }
    }

    /// A request to `path` under the API, with the bearer token.
    pub fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        self.http
            .request(method, format!("{}{path}", self.api_url))
            .bearer_auth(self.token.expose())
    }

    async fn json(&self, method: reqwest::Method, path: &str) -> anyhow::Result<Value> {
        let response = self
            .request(method, path)
            .timeout(REQUEST_TIMEOUT)
            .send()
            .await
            .with_context(|| format!("the gateway did not answer {path}"))?;
        let status = response.status();
        let body: Value = response.json().await.unwrap_or(Value::Null);
        if !status.is_success() {
            let error = body["error"].as_str().unwrap_or("no reason given");
            anyhow::bail!("{path}: {status}: {error}");
        }
        Ok(body)
    }

    /// `GET /v1/status`.
    ///
    /// # Errors
    /// The gateway did not answer or refused.
    pub async fn status(&self) -> anyhow::Result<Value> {
        self.json(reqwest::Method::GET, "/v1/status").await
    }

    /// Pauses intake (`true`) or resumes it; the state in force after.
    ///
    /// # Errors
    /// The gateway did not answer or refused.
    pub async fn set_paused(&self, paused: bool) -> anyhow::Result<bool> {
        let path = if paused { "/v1/intake/pause" } else { "/v1/intake/resume" };
        let body = self.json(reqwest::Method::POST, path).await?;
        Ok(body["paused"].as_bool().unwrap_or(paused))
    }

    /// The calls waiting for an answer, oldest first.
    ///
    /// # Errors
    /// The gateway did not answer or refused.
    pub async fn approvals(&self) -> anyhow::Result<Vec<WaitingApproval>> {
        let body = self.json(reqwest::Method::GET, "/v1/approvals").await?;
        Ok(body["approvals"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(WaitingApproval::from_json)
            .collect())
    }

    /// Answers request `id` with `decision` (`approve`, `deny` or `always`),
    /// recorded as given from the desktop.
    ///
    /// # Errors
    /// The gateway did not answer, or refused (the request was settled).
    pub async fn answer(&self, id: &str, decision: &str) -> anyhow::Result<()> {
        let path = format!("/v1/approvals/{id}");
        let response = self
            .request(reqwest::Method::POST, &path)
            .timeout(REQUEST_TIMEOUT)
            .json(&serde_json::json!({ "decision": decision, "via": "desktop" }))
            .send()
            .await
            .with_context(|| format!("the gateway did not answer {path}"))?;
        let status = response.status();
        if !status.is_success() {
            let body: Value = response.json().await.unwrap_or(Value::Null);
            anyhow::bail!("{}", body["error"].as_str().unwrap_or("the answer was refused"));
        }
        Ok(())
    }

    /// Running runs, then queued ones, each oldest first.
    ///
    /// # Errors
    /// The gateway did not answer or refused.
    pub async fn active_runs(&self) -> anyhow::Result<Vec<RunSummary>> {
        let mut all = Vec::new();
        for status in ["running", "queued"] {
            let body = self
                .json(reqwest::Method::GET, &format!("/v1/runs?status={status}&limit=50"))
                .await?;
            let mut runs: Vec<RunSummary> = body["runs"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|run| RunSummary {
                    run_id: text(&run["run_id"]),
                    session_key: text(&run["session_key"]),
                    engine: text(&run["engine"]),
                    status: text(&run["status"]),
                    prompt: text(&run["prompt"]),
                })
                .collect();
            // The API lists newest first.
            runs.reverse();
            all.extend(runs);
        }
        Ok(all)
    }

    /// The gateway's health: `/healthz` (with the token, for the store's
    /// error), read by [`health_of`].
    pub async fn health(&self) -> Health {
        let probe = self
            .http
            .get(format!("{}/healthz", self.health_url))
            .bearer_auth(self.health_token.expose())
            .timeout(REQUEST_TIMEOUT);
        let Ok(response) = probe.send().await else {
            return Health::Failing("the gateway does not answer".to_owned());
        };
        health_of(&response.json().await.unwrap_or(Value::Null))
    }
}

/// The longest store error the tray shows, in characters.
const STORE_ERROR_CHARS: usize = 80;

/// The health a `/healthz` body reports: a failing `store` check first (new
/// messages are refused), then any other failing check, then a failing
/// channel.
pub fn health_of(body: &Value) -> Health {
    if body["ok"] != Value::Bool(true) {
        let failed: Vec<&Value> = body["checks"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|check| check["ok"] != Value::Bool(true))
            .collect();
        if let Some(store) = failed.iter().find(|check| check["name"] == "store") {
            let why = store["error"]
                .as_str()
                .filter(|why| !why.trim().is_empty())
                .map(|why| crate::state::one_line_cut(why, STORE_ERROR_CHARS));
            return Health::StoreFailing(why);
        }
        let names: Vec<String> = failed.iter().map(|check| text(&check["name"])).collect();
        return Health::Failing(if names.is_empty() {
            "unhealthy".to_owned()
        } else {
            format!("{} failing", names.join(", "))
        });
    }
    let failing: Vec<String> = body["transports"]
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(_, t)| t["state"] == "failing")
        .map(|(id, _)| id.clone())
        .collect();
    if failing.is_empty() {
        Health::Healthy
    } else {
        Health::Failing(format!("{} failing", failing.join(", ")))
    }
}

fn text(value: &Value) -> String {
    value.as_str().unwrap_or_default().to_owned()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::health_of;
    use crate::state::Health;

    fn check(body: serde_json::Value, expected: Health) {
        assert_eq!(health_of(&body), expected, "{body}");
    }

    fn checks(store: serde_json::Value) -> serde_json::Value {
        json!([{ "name": "scheduler", "ok": true }, store, { "name": "runs", "ok": true }])
    }

    #[test]
    fn a_store_that_cannot_save_is_named_with_its_error_when_given() {
        let error = "store database error: database or disk is full";
        check(
            json!({ "ok": false, "checks": checks(json!({ "name": "store", "ok": false, "error": error })) }),
            Health::StoreFailing(Some(error.to_owned())),
        );
        // Without the token the report has no error.
        check(
            json!({ "ok": false, "checks": checks(json!({ "name": "store", "ok": false })) }),
            Health::StoreFailing(None),
        );
        let long = format!("store database error: {}", "disk I/O error ".repeat(10));
        let Health::StoreFailing(Some(shown)) = health_of(
            &json!({ "ok": false, "checks": checks(json!({ "name": "store", "ok": false, "error": long })) }),
        ) else {
            panic!("a failing store");
        };
        assert_eq!(shown.chars().count(), 81, "{shown}");
        assert!(shown.ends_with('…'), "{shown}");
    }

    #[test]
    fn other_checks_and_channels_fail_by_name() {
        check(
            json!({ "ok": false, "checks": [{ "name": "scheduler", "ok": false }, { "name": "store", "ok": true }] }),
            Health::Failing("scheduler failing".to_owned()),
        );
        check(json!(null), Health::Failing("unhealthy".to_owned()));
        check(
            json!({ "ok": true, "checks": checks(json!({ "name": "store", "ok": true })),
                "transports": { "telegram": { "state": "failing" }, "sms": { "state": "running" } } }),
            Health::Failing("telegram failing".to_owned()),
        );
        check(
            json!({ "ok": true, "checks": checks(json!({ "name": "store", "ok": true })), "transports": {} }),
            Health::Healthy,
        );
    }
}
