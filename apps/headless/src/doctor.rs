//! `lemon-gateway doctor`: checks what a start needs, one line per check,
//! `ok`, `warn` or `fail`, each warning and failure with its fix. Exits
//! non-zero when anything failed.
//!
//! Checked: the config file (with file:line:col on an error), the keychain,
//! the secrets file's mode, the listening ports, a bind beyond loopback, the
//! engines (found, with their versions), the provider key of the native
//! engine, and each configured channel (Telegram's token through `getMe`
//! against its `api_base_url`).

use std::collections::BTreeMap;
use std::time::Duration;

use lemon_core::config::{self, GatewayConfig, DEFAULT_API_PORT, DEFAULT_HEALTH_PORT};
use lemon_core::engine::Availability;
use lemon_core::secrets::SecretStore;
use lemon_server::paths::Paths;

use crate::failure;
use crate::style::Style;

/// How long Telegram's `getMe` may take.
const GET_ME_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Level {
    Ok,
    Warn,
    Fail,
}

/// One line of the report.
#[derive(Debug)]
struct Check {
    level: Level,
    what: String,
    detail: String,
    fix: Option<String>,
}

#[derive(Debug, Default)]
struct Report {
    checks: Vec<Check>,
}

impl Report {
    fn ok(&mut self, what: &str, detail: impl Into<String>) {
        self.push(Level::Ok, what, detail.into(), None);
    }
    fn warn(&mut self, what: &str, detail: impl Into<String>, fix: impl Into<String>) {
        self.push(Level::Warn, what, detail.into(), Some(fix.into()));
    }
    fn fail(&mut self, what: &str, detail: impl Into<String>, fix: impl Into<String>) {
        self.push(Level::Fail, what, detail.into(), Some(fix.into()));
    }
    fn push(&mut self, level: Level, what: &str, detail: String, fix: Option<String>) {
        self.checks.push(Check { level, what: what.to_owned(), detail, fix });
    }

    fn render(&self, style: Style) -> String {
        let width = self.checks.iter().map(|c| c.what.len()).max().unwrap_or(0);
        let mut out = String::new();
        for check in &self.checks {
            let level = match check.level {
                Level::Ok => style.green("ok  "),
                Level::Warn => style.yellow("warn"),
                Level::Fail => style.red("fail"),
            };
            out.push_str(&format!("{level}  {:<width$}  {}\n", check.what, check.detail));
            if let Some(fix) = &check.fix {
                out.push_str(&format!("      {:<width$}  fix: {fix}\n", ""));
            }
        }
        let fails = self.checks.iter().filter(|c| c.level == Level::Fail).count();
        let warns = self.checks.iter().filter(|c| c.level == Level::Warn).count();
        out.push_str(&format!(
            "\n{fails} failed, {warns} warnings, {} checks\n",
            self.checks.len()
        ));
        out
    }
}

/// Runs every check and prints the report; the exit code.
#[allow(clippy::print_stdout)]
pub(crate) async fn doctor(
    paths: &Paths,
    env: &BTreeMap<String, String>,
    style: Style,
) -> anyhow::Result<u8> {
    let mut report = Report::default();
    let (paths_owned, env_owned) = (paths.clone(), env.clone());
    let store =
        tokio::task::spawn_blocking(move || lemon_server::open_secrets(&paths_owned, &env_owned))
            .await?;
    let gateway = check_config(&mut report, paths, env);
    check_keychain(&mut report, &store);
    if let Some(gateway) = &gateway {
        check_ports(&mut report, gateway).await;
        check_engines(&mut report, gateway, paths, env, &store).await;
        check_channels(&mut report, gateway, &store).await;
    }
    print!("{}", report.render(style));
    let failed = report.checks.iter().any(|c| c.level == Level::Fail);
    Ok(if failed { failure::RUN_FAILED } else { failure::OK })
}

/// The config file as a start would check it; its `[gateway]` when it loads.
fn check_config(
    report: &mut Report,
    paths: &Paths,
    env: &BTreeMap<String, String>,
) -> Option<GatewayConfig> {
    if !paths.config.exists() {
        report
            .ok("config", format!("{} does not exist; the defaults apply", paths.config.display()));
        return Some(GatewayConfig::default());
    }
    match lemon_server::check_config(&paths.config, paths, env) {
        Ok(warnings) => {
            report.ok("config", format!("{} is valid", paths.config.display()));
            for warning in warnings {
                report.warn("config", warning, "remove or correct the key");
            }
        }
        Err(error) => {
            report.fail("config", error.to_string(), "correct the file at the place named");
            // The rest needs the core keys; they may still load.
            return config::load_file(&paths.config).ok().map(|loaded| loaded.config.gateway);
        }
    }
    config::load_file(&paths.config).ok().map(|loaded| loaded.config.gateway)
}

fn check_keychain(report: &mut Report, store: &SecretStore) {
    let keychain = store.keychain();
    if keychain.available {
        report.ok("keychain", keychain.detail.clone());
    } else {
        report.warn(
            "keychain",
            format!(
                "not available ({}); secrets are kept in {}",
                keychain.detail,
                store.file_path().display()
            ),
            "on a desktop, unlock the login keyring; on a server the file (mode 0600) is fine",
        );
    }
    for warning in store.warnings() {
        report.warn(
            "secrets file",
            warning.to_string(),
            format!("chmod 600 {}", store.file_path().display()),
        );
    }
}

fn is_loopback(bind: &str) -> bool {
    let host = bind.trim_start_matches('[').trim_end_matches(']');
    host == "localhost" || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

async fn check_ports(report: &mut Report, gateway: &GatewayConfig) {
    let listeners = [
        ("control API", gateway.api.addr(DEFAULT_API_PORT), gateway.api.bind.clone()),
        ("health", gateway.health.addr(DEFAULT_HEALTH_PORT), gateway.health.bind.clone()),
    ];
    for (what, addr, bind) in listeners {
        match tokio::net::TcpListener::bind(&addr).await {
            Ok(listener) => {
                drop(listener);
                report.ok(what, format!("{addr} is free"));
            }
            Err(error) => report.fail(
                what,
                format!("cannot listen on {addr}: {error}"),
                "stop what listens there (another gateway? `lemon-gateway status`) or set another port in config.toml",
            ),
        }
        let bind = bind.unwrap_or_else(|| "127.0.0.1".to_owned());
        if !is_loopback(&bind) {
            report.warn(
                what,
                format!("listens on {addr}, beyond this machine, over plain HTTP"),
                "put a TLS proxy (Caddy, nginx) in front, or bind 127.0.0.1",
            );
        }
    }
}

async fn check_engines(
    report: &mut Report,
    gateway: &GatewayConfig,
    paths: &Paths,
    env: &BTreeMap<String, String>,
    store: &SecretStore,
) {
    let text = std::fs::read_to_string(&paths.config).unwrap_or_default();
    let Ok(sections) =
        lemon_engines::config::EngineSections::parse(&gateway.engines, &paths.config, &text)
    else {
        return;
    };
    let ctx = lemon_engines::cli::CliContext { base_env: env.clone(), ..Default::default() };
    let Ok(registry) = lemon_engines::build_registry(&sections, &ctx) else { return };
    let mut ids: Vec<_> = registry.ids().collect();
    ids.sort();
    for id in ids {
        let Some(engine) = registry.engine(&id) else { continue };
        let what = format!("engine {id}");
        match engine.availability() {
            Availability::Available => {
                let version = tokio::time::timeout(Duration::from_secs(10), engine.version())
                    .await
                    .ok()
                    .flatten();
                let mut detail = match engine.program() {
                    Some(program) => format!("found at {}", program.display()),
                    None => "built in".to_owned(),
                };
                if let Some(version) = version {
                    detail.push_str(&format!(" ({version})"));
                }
                report.ok(&what, detail);
            }
            Availability::Unavailable { reason } => report.warn(
                &what,
                reason.to_string(),
                format!("only needed to run {id}: do what the message says"),
            ),
        }
    }
    if let Ok(native) = lemon_engines::native::NativeSettings::from_section(
        sections.get(lemon_engines::native::ENGINE_ID),
    ) {
        if native.enabled {
            let name = &native.api_key_secret;
            match store.get(name) {
                Ok(Some(_)) => report.ok("provider key", format!("{name} is set")),
                Ok(None) => report.warn(
                    "provider key",
                    format!("{name} is not set; runs use the echo engine"),
                    format!("lemon-gateway secrets set {name}"),
                ),
                Err(error) => {
                    report.fail("provider key", error.to_string(), "repair the secret store named")
                }
            }
        }
    }
}

async fn check_channels(report: &mut Report, gateway: &GatewayConfig, store: &SecretStore) {
    use lemon_transports::{telegram, webhook};
    match webhook::WebhookConfig::from_gateway(gateway.enable_webhook, gateway.webhook.as_ref()) {
        Ok(Some(_)) => report.ok("channel webhook", "configured"),
        Ok(None) => {}
        Err(error) => report.fail("channel webhook", error.0, "correct [gateway.webhook]"),
    }
    if lemon_core::transport::enabled(gateway.enable_telegram, gateway.telegram.as_ref()) {
        let section = gateway.telegram.clone().unwrap_or_default();
        match telegram::config::TelegramConfig::parse(&section) {
            Ok(config) => check_telegram(report, &config, store).await,
            Err(error) => report.fail("channel telegram", error.0, "correct [gateway.telegram]"),
        }
    }
}

/// Asks Telegram's `getMe` whether it takes the bot token.
async fn check_telegram(
    report: &mut Report,
    config: &lemon_transports::telegram::config::TelegramConfig,
    store: &SecretStore,
) {
    let what = "channel telegram";
    let secret = config.bot_token_secret.clone().unwrap_or_else(|| "telegram_bot_token".to_owned());
    let token = match config.resolve_token(store) {
        Ok(token) => token,
        Err(error) => {
            report.fail(what, error.0, format!("lemon-gateway secrets set {secret}"));
            return;
        }
    };
    let base = config.api_base_url.trim_end_matches('/');
    let url = format!("{base}/bot{token}/getMe");
    drop(token);
    let http = reqwest::Client::builder().timeout(GET_ME_TIMEOUT).build();
    let Ok(http) = http else {
        report.warn(what, "cannot make an HTTP client", "try again");
        return;
    };
    match http.get(&url).send().await {
        Ok(response) if response.status().is_success() => {
            let body: serde_json::Value = response.json().await.unwrap_or_default();
            let name = body["result"]["username"].as_str().unwrap_or("?");
            report.ok(what, format!("the bot token is accepted (@{name})"));
        }
        Ok(response) if matches!(response.status().as_u16(), 401 | 404) => report.fail(
            what,
            format!("Telegram refused the bot token ({})", response.status()),
            format!("get a new token from @BotFather and run `lemon-gateway secrets set {secret}`"),
        ),
        Ok(response) => report.warn(
            what,
            format!("getMe answered {}", response.status()),
            "check api_base_url and try again later",
        ),
        // The error names the URL, which holds the token: say only what failed.
        Err(error) => report.warn(
            what,
            format!(
                "cannot reach {base}: {}",
                if error.is_timeout() {
                    "timed out"
                } else if error.is_connect() {
                    "connection failed"
                } else {
                    "request failed"
                }
            ),
            "check the network and api_base_url",
        ),
    }
}
