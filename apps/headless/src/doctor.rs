//! `lemon-gateway doctor`: checks what a start needs, one line per check,
//! `ok`, `warn` or `fail`, each warning and failure with its fix. Exits
//! non-zero when anything failed.
//!
//! Checked: the config file (with file:line:col on an error), the keychain,
//! the secrets file's mode, how a run's processes are tracked (a cgroup, or
//! only their group and scope), the listening ports, a bind beyond loopback, the
//! engines (found, with their versions), the provider key of the native
//! engine, and each configured channel: Telegram's token through `getMe`
//! and Discord's through `GET /users/@me` against their `api_base_url`; SMS
//! and voice (their secrets, an https `public_url`, a free port); email (an
//! IMAP login and an SMTP connection with its login); XMTP (Node.js and its
//! version, the bridge script and its installed SDK, the wallet key). For
//! each chat channel, who it lets in: its allow-lists, nobody (a warning),
//! or everyone (`allow_everyone`, a warning). Each `[[gateway.mcp_servers]]`
//! entry: disabled, or started with its tools listed (how many, their
//! names), or why it cannot start and the fix. Every call to a server has a
//! timeout.

use std::collections::BTreeMap;
use std::time::Duration;

use lemon_core::config::{self, GatewayConfig, DEFAULT_API_PORT, DEFAULT_HEALTH_PORT};
use lemon_core::engine::Availability;
use lemon_core::secrets::SecretStore;
use lemon_engines::cli::Tracking;
use lemon_server::paths::Paths;
use lemon_transports::access::Reach;

use crate::failure;
use crate::style::Style;

/// How long Telegram's `getMe` (and Discord's `/users/@me`) may take.
const GET_ME_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a mail server may take to log in.
const MAIL_TIMEOUT: Duration = Duration::from_secs(15);
/// The oldest Node.js the XMTP SDK runs on.
const XMTP_NODE_MAJOR: u32 = 22;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Level {
    /// Something to know that needs nothing done (optional CLIs not installed).
    Info,
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
    fn info(&mut self, what: &str, detail: impl Into<String>) {
        self.push(Level::Info, what, detail.into(), None);
    }
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
                Level::Info => style.dim("info"),
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
        let checks = self.checks.iter().filter(|c| c.level != Level::Info).count();
        out.push_str(&format!("\n{fails} failed, {warns} warnings, {checks} checks\n"));
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
    match gateway.as_ref().map(|g| &g.store) {
        Some(wanted) if wanted.backend == config::StoreBackendKind::Postgres => {
            check_postgres(&mut report, wanted, paths, &store).await;
        }
        _ => check_storage(&mut report, paths),
    }
    if let Some(gateway) = gateway.as_ref().filter(|g| g.cluster.enabled) {
        check_cluster(&mut report, gateway, paths, &store).await;
    }
    check_process_tracking(&mut report);
    if let Some(gateway) = &gateway {
        check_sandbox(&mut report, gateway, env);
        check_ports(&mut report, gateway, &store).await;
        check_engines(&mut report, gateway, paths, env, &store).await;
        check_channels(&mut report, gateway, &store).await;
        check_sms_and_voice(&mut report, gateway, &store).await;
        check_discord(&mut report, gateway, &store).await;
        check_email(&mut report, gateway, &store).await;
        check_xmtp(&mut report, gateway, paths, env, &store).await;
    }
    if let Some(gateway) = &gateway {
        check_mcp_servers(&mut report, &gateway.mcp_servers, paths, env, store).await;
    }
    crate::say_raw!("{}", report.render(style));
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
    // As a start reads it: the environment's overrides (ports…) apply.
    config::load_file_with_env(&paths.config, env).ok().map(|loaded| loaded.config.gateway)
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

/// How a run's processes are found at its end: a cgroup holds every one of
/// them; the process group and the environment scope miss one that leaves its
/// group and replaces its environment.
/// Below either, the disk that holds the home is too full for comfort.
const LOW_DISK_BYTES: u64 = 1_000_000_000;
const LOW_DISK_PERCENT: u64 = 5;

/// The database's size and the room left on the disk that holds the home:
/// `warn` under 1 GB or 5 % free (a full disk pauses intake).
fn check_storage(report: &mut Report, paths: &Paths) {
    let database = paths.database();
    let sizes = lemon_core::store::sqlite::file_sizes(&database);
    let stored = sizes.database + sizes.log;
    // The home may not exist yet: the nearest folder above it that does.
    let Some(existing) = paths.home.ancestors().find(|dir| dir.is_dir()) else { return };
    let stat = match rustix::fs::statvfs(existing) {
        Ok(stat) => stat,
        Err(err) => {
            report.warn(
                "storage",
                format!("cannot read the free space of {}: {err}", existing.display()),
                "check the disk that holds the home",
            );
            return;
        }
    };
    let (free, total) = (stat.f_bavail * stat.f_frsize, stat.f_blocks * stat.f_frsize);
    let detail = format!(
        "{} {}; {} free of {} on the disk of {}",
        database.display(),
        crate::show::size(stored),
        crate::show::size(free),
        crate::show::size(total),
        existing.display()
    );
    match storage_verdict(free, total) {
        None => report.ok("storage", detail),
        Some(why) => report.warn(
            "storage",
            format!("{detail}: {why}"),
            "free space on that disk, or move the home (LEMON_HOME) to a larger one: a full disk refuses new messages until there is room",
        ),
    }
}

/// A PostgreSQL store: it can be reached with the `url_secret` connection
/// string, its schema is one this build reads, and it takes writes.
async fn check_postgres(
    report: &mut Report,
    config: &config::StoreConfig,
    paths: &Paths,
    secrets: &SecretStore,
) {
    const WAIT: Duration = Duration::from_secs(20);
    let opened =
        tokio::time::timeout(WAIT, lemon_server::open_store(config, paths, secrets, false)).await;
    let (store, location) = match opened {
        Ok(Ok(opened)) => opened,
        Ok(Err(error)) => {
            report.fail(
                "store",
                format!("{error:#}"),
                "check the connection string in the url_secret secret and that the server takes connections from here",
            );
            return;
        }
        Err(_) => {
            report.fail(
                "store",
                format!("the PostgreSQL server gave no answer within {} s", WAIT.as_secs()),
                "check the host and port of the connection string and the network to it",
            );
            return;
        }
    };
    let checked = store.lifecycle().check_writable().await;
    let bytes = store.retention().used_bytes().await.unwrap_or(0);
    let _ = store.lifecycle().close().await;
    match checked {
        Ok(()) => report.ok(
            "store",
            format!("postgres {} takes writes; {}", location.describe(), crate::show::size(bytes)),
        ),
        Err(error) => report.fail(
            "store",
            format!("postgres {}: {error}", location.describe()),
            "check the database user's rights and the server's free space",
        ),
    }
}

/// Cluster mode: the cluster's nodes, read without joining it (no lease is
/// taken), and whether another live node is registered with this node's id.
async fn check_cluster(
    report: &mut Report,
    gateway: &GatewayConfig,
    paths: &Paths,
    secrets: &SecretStore,
) {
    const WAIT: Duration = Duration::from_secs(20);
    let inspected = tokio::time::timeout(WAIT, lemon_server::cluster::inspect(gateway, secrets));
    let inspection = match inspected.await {
        Ok(Ok(inspection)) => inspection,
        Ok(Err(error)) => {
            report.fail(
                "cluster",
                format!("{error:#}"),
                "the cluster needs the PostgreSQL store: check it as the store check says",
            );
            return;
        }
        Err(_) => {
            report.fail(
                "cluster",
                format!("the PostgreSQL server gave no answer within {} s", WAIT.as_secs()),
                "check the host and port of the connection string and the network to it",
            );
            return;
        }
    };
    let alive: Vec<&str> =
        inspection.nodes.iter().filter(|n| n.alive).map(|n| n.id.as_str()).collect();
    let summary = format!(
        "{} of {} registered nodes alive{}{}",
        alive.len(),
        inspection.nodes.len(),
        if alive.is_empty() { "" } else { ": " },
        alive.join(", ")
    );
    let Some(id) = gateway.cluster.node_id.as_deref() else {
        report.ok("cluster", format!("{summary}; this node takes a new id at each start"));
        return;
    };
    let clash = inspection.nodes.iter().find(|n| n.alive && n.id.as_str() == id);
    match clash {
        Some(_) if local_gateway_runs(paths) => report
            .ok("cluster", format!("{summary}; {id} is this home's gateway, which is running")),
        Some(node) => report.fail(
            "cluster",
            format!(
                "{summary}; another live node is registered as {id} (version {}, at {})",
                node.info.version,
                node.info.api_base_url.as_deref().unwrap_or("no api_base_url")
            ),
            "give each node its own [gateway.cluster] node_id (or none: a new one at each start)",
        ),
        None => report.ok("cluster", format!("{summary}; none is registered as {id}")),
    }
}

/// Whether this home's gateway runs: its running file names a live process.
fn local_gateway_runs(paths: &Paths) -> bool {
    let Ok(text) = std::fs::read_to_string(paths.running()) else { return false };
    let pid = serde_json::from_str::<serde_json::Value>(&text)
        .ok()
        .and_then(|v| v.get("pid").and_then(serde_json::Value::as_u64));
    pid.is_some_and(|pid| std::path::Path::new(&format!("/proc/{pid}")).exists())
}

/// Why `free` of `total` bytes is too little, if it is.
fn storage_verdict(free: u64, total: u64) -> Option<String> {
    if free < LOW_DISK_BYTES {
        return Some("less than 1 GB left".to_owned());
    }
    if total > 0 && free.saturating_mul(100) < total.saturating_mul(LOW_DISK_PERCENT) {
        return Some(format!("less than {LOW_DISK_PERCENT} % left"));
    }
    None
}

fn check_process_tracking(report: &mut Report) {
    match lemon_engines::cli::process_tracking() {
        tracking @ Tracking::Cgroup { .. } => report.ok("process tracking", tracking.to_string()),
        tracking @ Tracking::Scope { .. } => report.warn(
            "process tracking",
            tracking.to_string(),
            "run the gateway where a cgroup v2 hierarchy is writable (as root, or in a systemd \
             unit with Delegate=yes), so that no process a run starts outlives it",
        ),
    }
}

/// `[gateway.sandbox]` on this kernel: `ok` when commands are contained,
/// `warn` when they run with the gateway's access, `fail` when `required`
/// cannot be met (every command would be refused).
fn check_sandbox(report: &mut Report, gateway: &GatewayConfig, env: &BTreeMap<String, String>) {
    use lemon_core::config::SandboxMode;
    let home = env.get("HOME").filter(|home| !home.is_empty()).map(std::path::Path::new);
    let sandbox = lemon_engines::tools::Sandbox::from_config(&gateway.sandbox, home);
    let detail = sandbox.describe();
    match sandbox.mode {
        _ if sandbox.enforced() => report.ok("sandbox", detail),
        SandboxMode::Required => report.fail(
            "sandbox",
            detail,
            "run on a kernel with Landlock (Linux 5.13 or later, `lsm=` including landlock), or set \
             [gateway.sandbox] mode = \"auto\"",
        ),
        _ => report.warn(
            "sandbox",
            detail,
            "run on a kernel with Landlock (Linux 5.13 or later) and leave [gateway.sandbox] mode \
             at \"auto\", so that a run's commands cannot change anything outside its directory",
        ),
    }
}

fn is_loopback(bind: &str) -> bool {
    let host = bind.trim_start_matches('[').trim_end_matches(']');
    host == "localhost" || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// How long doctor waits for a gateway already listening to answer.
const RUNNING_GATEWAY_TIMEOUT: Duration = Duration::from_secs(3);

/// What a gateway listening at `addr` says of itself: on the control API its
/// status (with the API token), on the health port its `/healthz`. `None`
/// when nothing there answers as this home's gateway.
async fn running_gateway(addr: &str, health: bool, store: &SecretStore) -> Option<String> {
    let http = reqwest::Client::builder().timeout(RUNNING_GATEWAY_TIMEOUT).build().ok()?;
    // A wildcard bind is reached on loopback.
    let (host, port) = addr.rsplit_once(':')?;
    let host = match host {
        "0.0.0.0" => "127.0.0.1",
        "[::]" => "[::1]",
        other => other,
    };
    if health {
        let body: serde_json::Value = http
            .get(format!("http://{host}:{port}/healthz"))
            .send()
            .await
            .ok()?
            .json()
            .await
            .ok()?;
        let status = body.get("checks").and(body.get("status"))?.as_str()?;
        return Some(format!("the gateway answers there: {status}"));
    }
    let token = store.get(lemon_server::API_TOKEN_SECRET).ok()??;
    let response = http
        .get(format!("http://{host}:{port}/v1/status"))
        .bearer_auth(token.expose())
        .send()
        .await
        .ok()?;
    let body: serde_json::Value = response.json().await.ok()?;
    let version = body.get("version")?.as_str()?;
    let up = body.get("uptime_ms").and_then(serde_json::Value::as_u64).unwrap_or(0);
    Some(format!(
        "this home's gateway runs there (version {version}, up {})",
        crate::show::duration(up)
    ))
}

async fn check_ports(report: &mut Report, gateway: &GatewayConfig, store: &SecretStore) {
    let listeners = [
        ("control API", gateway.api.addr(DEFAULT_API_PORT), gateway.api.bind.clone(), false),
        ("health", gateway.health.addr(DEFAULT_HEALTH_PORT), gateway.health.bind.clone(), true),
    ];
    for (what, addr, bind, health) in listeners {
        match tokio::net::TcpListener::bind(&addr).await {
            Ok(listener) => {
                drop(listener);
                report.ok(what, format!("{addr} is free"));
            }
            Err(error) => match running_gateway(&addr, health, store).await {
                // The user's own gateway: checked through its API, not its port.
                Some(running) if running.ends_with(": unhealthy") => report.warn(
                    what,
                    format!("{addr}: {running}"),
                    "see which check fails: curl -H \"Authorization: Bearer $(lemon-gateway token)\" on /healthz",
                ),
                Some(running) => report.ok(what, format!("{addr}: {running}")),
                None => report.fail(
                    what,
                    format!("cannot listen on {addr}: {error}"),
                    "stop what listens there or set another port in config.toml",
                ),
            },
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
    // A CLI the config does not name is optional: its absence is one note.
    let mut not_installed = Vec::new();
    // Named: its section, or any key that routes to it.
    let refs = lemon_server::engine_refs(gateway);
    let named_by =
        |id: &str| gateway.engines.contains_key(id) || refs.iter().any(|(_, engine)| engine.is(id));
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
            // The native engine's want is its key, which "provider key" checks.
            Availability::Unavailable { .. } if id.as_str() == lemon_engines::native::ENGINE_ID => {}
            Availability::Unavailable { .. } if !named_by(id.as_str()) => {
                not_installed.push(id.to_string());
            }
            Availability::Unavailable { reason } => report.warn(
                &what,
                reason.to_string(),
                format!("the config names {id}: install its CLI or set cli_path in [gateway.engines.{id}]"),
            ),
        }
    }
    if !not_installed.is_empty() {
        report.info(
            "vendor CLIs",
            format!("{} not installed (optional: install one to run it)", not_installed.join(", ")),
        );
    }
    if let Ok(native) = lemon_engines::native::NativeSettings::from_section(
        sections.get(lemon_engines::native::ENGINE_ID),
    ) {
        if native.enabled && native.api_key_secret.is_empty() {
            report.ok("provider key", "none needed: api_key_secret = \"\"");
        } else if native.enabled {
            let name = &native.api_key_secret;
            match store.get(name) {
                Ok(Some(_)) => report.ok("provider key", format!("{name} is set")),
                Ok(None) if native.key_optional() => report.ok(
                    "provider key",
                    format!("{name} is not set; none needed by the server on this machine"),
                ),
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
    let reach = Reach::of(config.allow_everyone, config.allowed_chat_ids.len());
    check_access(report, what, "telegram", "allowed_chat_ids", reach);
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

/// Who a chat channel lets in: its allow-lists, nobody, or everyone
/// (`allow_everyone`, a warning).
fn check_access(report: &mut Report, what: &str, section: &str, keys: &str, reach: Reach) {
    match reach {
        Reach::Everyone => report.warn(
            what,
            "open to everyone (allow_everyone = true): anyone who finds it gets runs with the gateway's tools",
            format!("list who may talk in {keys} and remove allow_everyone from [gateway.{section}]"),
        ),
        Reach::Nobody => report.warn(
            what,
            format!("{keys} is empty: nobody gets a run"),
            format!("add yours to {keys} in [gateway.{section}]; the log names each one refused"),
        ),
        Reach::Listed(n) => report.ok(what, format!("{n} allowed in {keys}")),
    }
}

/// Whether `addr` can be listened on now.
async fn port_free(addr: &str) -> Result<(), String> {
    tokio::net::TcpListener::bind(addr).await.map(drop).map_err(|error| error.to_string())
}

/// `public_url` of a Twilio webhook: set, https, a URL.
fn check_public_url(report: &mut Report, what: &str, public_url: Option<&str>, section: &str) {
    match public_url.map(str::trim) {
        None | Some("") => report.warn(
            what,
            "public_url is not set; Twilio cannot reach the webhook and signatures cannot be checked",
            format!("set public_url in [gateway.{section}] to the https URL of your tunnel or proxy"),
        ),
        Some(url) if url.starts_with("https://") => report.ok(what, format!("public_url {url}")),
        Some(url) => report.warn(
            what,
            format!("public_url {url} is not https; Twilio sends webhooks to https URLs"),
            "put TLS in front (a tunnel or a proxy) and set its https URL",
        ),
    }
}

fn check_secret(report: &mut Report, what: &str, store: &SecretStore, name: &str, role: &str) {
    match store.get(name) {
        Ok(Some(value)) if !value.expose().trim().is_empty() => {
            report.ok(what, format!("{role} ({name}) is set"));
        }
        Ok(_) => report.fail(
            what,
            format!("{role} ({name}) is not set"),
            format!("lemon-gateway secrets set {name}"),
        ),
        Err(error) => report.fail(what, error.to_string(), "repair the secret store named"),
    }
}

async fn check_sms_and_voice(report: &mut Report, gateway: &GatewayConfig, store: &SecretStore) {
    match lemon_sms::SmsConfig::from_gateway(gateway.sms.as_ref()) {
        Ok(Some(sms)) => {
            let what = "channel sms";
            if sms.reply_to_allowed {
                let reach = Reach::of(sms.allow_everyone, sms.allowed_senders.len());
                check_access(report, what, "sms", "allowed_senders", reach);
            }
            check_secret(report, what, store, &sms.auth_token_secret, "the Twilio auth token");
            check_secret(report, what, store, &sms.account_sid_secret, "the Twilio account SID");
            check_public_url(report, what, sms.public_url.as_deref(), "sms");
            match port_free(&sms.addr()).await {
                Ok(()) => report.ok(what, format!("{} is free for the webhook", sms.addr())),
                Err(error) => report.fail(
                    what,
                    format!("cannot listen on {}: {error}", sms.addr()),
                    "stop what listens there or set another port in [gateway.sms]",
                ),
            }
        }
        Ok(None) => {}
        Err(error) => report.fail("channel sms", error.0, "correct [gateway.sms]"),
    }
    match lemon_voice::VoiceConfig::from_gateway(gateway.voice.as_ref()) {
        Ok(Some(voice)) => {
            let what = "channel voice";
            check_secret(report, what, store, &voice.deepgram_api_key_secret, "the Deepgram key");
            check_secret(
                report,
                what,
                store,
                &voice.elevenlabs_api_key_secret,
                "the ElevenLabs key",
            );
            check_public_url(report, what, voice.public_url.as_deref(), "voice");
            match port_free(&voice.addr()).await {
                Ok(()) => report.ok(what, format!("{} is free for calls", voice.addr())),
                Err(error) => report.fail(
                    what,
                    format!("cannot listen on {}: {error}", voice.addr()),
                    "stop what listens there or set another port in [gateway.voice]",
                ),
            }
        }
        Ok(None) => {}
        Err(error) => report.fail("channel voice", error.0, "correct [gateway.voice]"),
    }
}

/// Asks Discord's `GET /users/@me` whether it takes the bot token.
async fn check_discord(report: &mut Report, gateway: &GatewayConfig, store: &SecretStore) {
    use lemon_transports::discord::config::DiscordConfig;
    let what = "channel discord";
    if !lemon_core::transport::enabled(gateway.enable_discord, gateway.discord.as_ref()) {
        return;
    }
    let section = gateway.discord.clone().unwrap_or_default();
    let config = match DiscordConfig::parse(&section) {
        Ok(config) => config,
        Err(error) => return report.fail(what, error.0, "correct [gateway.discord]"),
    };
    let keys = "allowed_guild_ids, allowed_channel_ids and allowed_user_ids";
    let reach = Reach::of(config.allow_everyone, config.listed_count());
    check_access(report, what, "discord", keys, reach);
    let secret = config.bot_token_secret.clone();
    let token = match config.resolve_token(store) {
        Ok(token) => token,
        Err(error) => {
            return report.fail(what, error.0, format!("lemon-gateway secrets set {secret}"))
        }
    };
    let base = config.api_base_url.trim_end_matches('/');
    let Ok(http) = reqwest::Client::builder().timeout(GET_ME_TIMEOUT).build() else {
        return report.warn(what, "cannot make an HTTP client", "try again");
    };
    let answer = http
        .get(format!("{base}/users/@me"))
        .header("Authorization", format!("Bot {token}"))
        .send();
    drop(token);
    match answer.await {
        Ok(response) if response.status().is_success() => {
            let body: serde_json::Value = response.json().await.unwrap_or_default();
            let name = body["username"].as_str().unwrap_or("?");
            report.ok(what, format!("the bot token is accepted (@{name})"));
        }
        Ok(response) if response.status().as_u16() == 401 => report.fail(
            what,
            format!("Discord refused the bot token ({})", response.status()),
            format!(
                "copy the token from the Bot page of your application in the Developer Portal and run `lemon-gateway secrets set {secret}`"
            ),
        ),
        Ok(response) => report.warn(
            what,
            format!("/users/@me answered {}", response.status()),
            "check api_base_url and try again later",
        ),
        Err(error) => report.warn(
            what,
            format!(
                "cannot reach {base}: {}",
                if error.is_timeout() { "timed out" } else { "connection failed" }
            ),
            "check the network and api_base_url",
        ),
    }
}

/// Logs in to the IMAP server and connects to the SMTP server, as a start would.
async fn check_email(report: &mut Report, gateway: &GatewayConfig, store: &SecretStore) {
    use lemon_transports::email::check::{self, Problem};
    use lemon_transports::email::config::EmailConfig;
    if !lemon_core::transport::enabled(None, gateway.email.as_ref()) {
        return;
    }
    let section = gateway.email.clone().unwrap_or_default();
    let config = match EmailConfig::parse(&section) {
        Ok(config) => config,
        Err(error) => return report.fail("channel email", error.0, "correct [gateway.email]"),
    };
    let reach = Reach::of(config.allow_everyone, config.allowed_senders.len());
    check_access(report, "channel email", "email", "allowed_senders", reach);
    let mut place = |what: &str, result: Option<Result<String, Problem>>, key: &str| {
        let secret = |table: Option<&toml::Value>| {
            table
                .and_then(|t| t.get("password_secret"))
                .and_then(toml::Value::as_str)
                .unwrap_or("the password secret")
                .to_owned()
        };
        let name = secret(section.get(key));
        match result {
            None => {}
            Some(Ok(detail)) => report.ok(what, detail),
            Some(Err(Problem::Refused(why))) => report.fail(
                what,
                why,
                format!("check username in [gateway.email.{key}] and run `lemon-gateway secrets set {name}`"),
            ),
            Some(Err(Problem::Unreachable(why))) => report.fail(
                what,
                why,
                format!("check host, port and TLS in [gateway.email.{key}] and that the server runs"),
            ),
            Some(Err(Problem::Config(why))) => {
                report.fail(what, why, format!("lemon-gateway secrets set {name}"))
            }
        }
    };
    place("channel email imap", check::imap(&config, store, MAIL_TIMEOUT).await, "imap");
    place("channel email smtp", check::smtp(&config, store, MAIL_TIMEOUT).await, "smtp");
}

/// Node.js (found, its version), the bridge script, its installed SDK, the wallet key.
async fn check_xmtp(
    report: &mut Report,
    gateway: &GatewayConfig,
    paths: &Paths,
    env: &BTreeMap<String, String>,
    store: &SecretStore,
) {
    use lemon_transports::xmtp::config::XmtpConfig;
    let what = "channel xmtp";
    if !lemon_core::transport::enabled(gateway.enable_xmtp, gateway.xmtp.as_ref()) {
        return;
    }
    let section = gateway.xmtp.clone().unwrap_or_default();
    let config = match XmtpConfig::parse(&section) {
        Ok(config) => config,
        Err(error) => return report.fail(what, error.0, "correct [gateway.xmtp]"),
    };
    let reach = Reach::of(config.allow_everyone, config.allowed_senders.len());
    check_access(report, what, "xmtp", "allowed_senders", reach);
    let search = env.get("PATH").cloned().unwrap_or_default();
    let node = if config.node.contains('/') {
        Some(std::path::PathBuf::from(&config.node)).filter(|p| p.is_file())
    } else {
        lemon_engines::cli::which(std::path::Path::new(&config.node), &search)
    };
    match node {
        None => report.fail(
            what,
            format!("{} is not found", config.node),
            format!("install Node.js {XMTP_NODE_MAJOR} or later, or set node in [gateway.xmtp] to its path"),
        ),
        Some(node) => match program_version(&node, &search).await {
            Some(version) => {
                let major = version
                    .trim_start_matches('v')
                    .split('.')
                    .next()
                    .and_then(|m| m.parse::<u32>().ok());
                if major.is_some_and(|m| m >= XMTP_NODE_MAJOR) {
                    report.ok(what, format!("{} {version}", node.display()));
                } else {
                    report.warn(
                        what,
                        format!("{} is {version}; the XMTP SDK needs Node.js {XMTP_NODE_MAJOR} or later", node.display()),
                        format!("install Node.js {XMTP_NODE_MAJOR} or later, or set node in [gateway.xmtp] to one"),
                    );
                }
            }
            None => report.warn(
                what,
                format!("{} did not say its version", node.display()),
                "check that it is Node.js",
            ),
        },
    }
    let config_dir = paths.config.parent().unwrap_or_else(|| std::path::Path::new("."));
    let script = config.script(config_dir);
    if !script.is_file() {
        report.fail(
            what,
            format!("the bridge script {} does not exist", script.display()),
            "set bridge_script in [gateway.xmtp] to bridges/xmtp/bridge.mjs of the source tree",
        );
    } else {
        report.ok(what, format!("bridge script {}", script.display()));
        let folder = script.parent().unwrap_or(config_dir);
        let sdk = folder.join("node_modules/@xmtp/agent-sdk/package.json");
        match std::fs::read_to_string(&sdk) {
            Ok(text) => {
                let version: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
                let version = version["version"].as_str().unwrap_or("?").to_owned();
                report.ok(what, format!("@xmtp/agent-sdk {version} installed"));
            }
            Err(_) => report.fail(
                what,
                format!("the bridge's packages are not installed in {}", folder.display()),
                format!("npm ci --prefix {}", folder.display()),
            ),
        }
    }
    check_secret(report, what, store, &config.wallet_key_secret, "the wallet key");
}

/// How much longer than a server's `startup_timeout_ms` doctor waits for
/// its probe before it reports the server as not answering.
const MCP_PROBE_MARGIN: Duration = Duration::from_secs(5);

/// Each `[[gateway.mcp_servers]]` entry: a disabled one is listed as such;
/// an enabled one is started (all at once, each within its
/// `startup_timeout_ms`), its tools listed as runs would be offered them,
/// and stopped. A missing command or secret is named before anything is
/// started.
async fn check_mcp_servers(
    report: &mut Report,
    servers: &[lemon_core::mcp::McpServerConfig],
    paths: &Paths,
    env: &BTreeMap<String, String>,
    store: SecretStore,
) {
    use lemon_engines::mcp::{probe, McpOptions};
    if servers.is_empty() {
        return;
    }
    let store = std::sync::Arc::new(store);
    let lookup_store = store.clone();
    let options = McpOptions {
        base_env: env.clone(),
        home: paths.home.clone(),
        secrets: std::sync::Arc::new(move |name: &str| {
            lookup_store.get(name).map_err(|error| error.to_string())
        }),
        tracker: tokio_util::task::TaskTracker::new(),
        shutdown: tokio_util::sync::CancellationToken::new(),
    };
    let search = env.get("PATH").cloned().unwrap_or_default();
    // In config order; the probes run at once.
    let checks = servers.iter().map(|server| {
        let (options, store, search) = (&options, &store, &search);
        async move {
            if !server.enabled {
                return (server, McpVerdict::Disabled);
            }
            if let Some((detail, fix)) = mcp_missing(server, store, search) {
                return (server, McpVerdict::Failed(detail, fix));
            }
            let patience = Duration::from_millis(server.startup_timeout_ms) + MCP_PROBE_MARGIN;
            match tokio::time::timeout(patience, probe(server, options)).await {
                Ok(Ok(tools)) => (server, McpVerdict::Listed(tools)),
                Ok(Err(error)) => (server, McpVerdict::Failed(error, mcp_fix(server))),
                Err(_) => (
                    server,
                    McpVerdict::Failed(
                        format!("no answer within {} s", patience.as_secs()),
                        mcp_fix(server),
                    ),
                ),
            }
        }
    });
    for (server, verdict) in futures::future::join_all(checks).await {
        let what = format!("mcp server {}", server.name);
        match verdict {
            McpVerdict::Disabled => {
                report.info(&what, format!("disabled (enabled = false), {}", mcp_place(server)));
            }
            McpVerdict::Listed(tools) => report.ok(&what, mcp_tools_line(server, &tools)),
            McpVerdict::Failed(detail, fix) => report.fail(&what, detail, fix),
        }
    }
    options.shutdown.cancel();
    options.tracker.close();
    if tokio::time::timeout(MCP_PROBE_MARGIN, options.tracker.wait()).await.is_err() {
        report.warn(
            "mcp servers",
            "a probed server did not stop in time",
            "look for a leftover MCP server process and stop it",
        );
    }
}

/// What doctor found of one MCP server.
#[derive(Debug)]
enum McpVerdict {
    Disabled,
    /// Started; the tools runs would be offered.
    Listed(Vec<lemon_core::tool::ToolSpec>),
    /// Why not, and the fix.
    Failed(String, String),
}

/// The fix of a server that would not start or list its tools.
fn mcp_fix(server: &lemon_core::mcp::McpServerConfig) -> String {
    format!(
        "correct the [[gateway.mcp_servers]] entry named {:?} (or set enabled = false there), \
         then run lemon-gateway doctor again",
        server.name
    )
}

/// How a server is reached, for the report: `stdio: npx -y pkg` or `http: <url>`.
fn mcp_place(server: &lemon_core::mcp::McpServerConfig) -> String {
    match (&server.command, &server.url) {
        (Some(command), _) => {
            let mut line = format!("stdio: {command}");
            for arg in &server.args {
                line.push(' ');
                line.push_str(arg);
            }
            lemon_core::log_text::escape(&line)
        }
        (None, Some(url)) => {
            // Without a login or a query, which may hold a key.
            let shown = match reqwest::Url::parse(url) {
                Ok(mut parsed) => {
                    let _ = parsed.set_username("");
                    let _ = parsed.set_password(None);
                    parsed.set_query(None);
                    parsed.to_string()
                }
                Err(_) => url.clone(),
            };
            format!("http: {}", lemon_core::log_text::escape(&shown))
        }
        (None, None) => "no command or url".to_owned(),
    }
}

/// A command that is not there or a secret that is not set: what is
/// missing and the fix.
fn mcp_missing(
    server: &lemon_core::mcp::McpServerConfig,
    store: &SecretStore,
    search: &str,
) -> Option<(String, String)> {
    let entry = format!("the [[gateway.mcp_servers]] entry named {:?}", server.name);
    if let Some(command) = &server.command {
        let found = if command.contains('/') {
            std::path::Path::new(command).is_file()
        } else {
            lemon_engines::cli::which(std::path::Path::new(command), search).is_some()
        };
        if !found {
            let shown = lemon_core::log_text::escape(command);
            let detail = if command.contains('/') {
                format!("the command {shown} does not exist")
            } else {
                format!("the command {shown} is not found on PATH")
            };
            let fix = format!(
                "install {shown} (npx and node come with Node.js), or set command in {entry} to \
                 its full path"
            );
            return Some((detail, fix));
        }
    }
    let named =
        server.env.iter().map(|(var, secret)| (format!("env {var}"), secret)).chain(
            server.headers.iter().map(|(header, secret)| (format!("header {header}"), secret)),
        );
    for (what, secret) in named {
        match store.get(secret) {
            Ok(Some(_)) => {}
            Ok(None) => {
                return Some((
                    format!("the secret {secret} ({what}) is not set"),
                    format!("lemon-gateway secrets set {secret}"),
                ))
            }
            Err(error) => {
                return Some((
                    format!("the secret {secret} ({what}) cannot be read: {error}"),
                    "repair the secret store named".to_owned(),
                ))
            }
        }
    }
    None
}

/// `3 tools (offered as everything__<tool>): add, echo, sum`.
fn mcp_tools_line(
    server: &lemon_core::mcp::McpServerConfig,
    tools: &[lemon_core::tool::ToolSpec],
) -> String {
    let prefix = lemon_core::mcp::qualified_name(&server.name, "");
    let mut names: Vec<&str> =
        tools.iter().map(|tool| tool.name.strip_prefix(&prefix).unwrap_or(&tool.name)).collect();
    names.sort_unstable();
    let count = match names.len() {
        0 => return format!("started, offers no tools ({})", mcp_place(server)),
        1 => "1 tool".to_owned(),
        n => format!("{n} tools"),
    };
    format!("{count} (offered as {}__<tool>): {}", server.name, names.join(", "))
}

/// What `program --version` prints (first line), within a few seconds.
async fn program_version(program: &std::path::Path, search: &str) -> Option<String> {
    use tokio::io::AsyncReadExt;
    let tracker = tokio_util::task::TaskTracker::new();
    let spec = lemon_engines::cli::HelperSpec {
        program: program.to_owned(),
        args: vec!["--version".to_owned()],
        cwd: std::path::PathBuf::from("/"),
        env: BTreeMap::from([("PATH".to_owned(), search.to_owned())]),
    };
    let mut helper = lemon_engines::cli::spawn_helper(spec, &tracker).await.ok()?;
    drop(helper.stdin);
    let mut out = String::new();
    let read = tokio::time::timeout(
        Duration::from_secs(5),
        (&mut helper.stdout).take(4096).read_to_string(&mut out),
    )
    .await;
    helper.child.terminate(Duration::from_millis(200)).await;
    read.ok()?.ok()?;
    out.lines().next().map(str::trim).filter(|l| !l.is_empty()).map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_disk_under_1_gb_or_5_percent_free_is_warned_about() {
        assert_eq!(
            storage_verdict(999_999_999, 2_000_000_000),
            Some("less than 1 GB left".to_owned())
        );
        assert_eq!(
            storage_verdict(4_000_000_000, 100_000_000_000),
            Some("less than 5 % left".to_owned())
        );
        assert_eq!(storage_verdict(5_000_000_000, 100_000_000_000), None);
        assert_eq!(storage_verdict(2_000_000_000, 0), None);
    }
}
