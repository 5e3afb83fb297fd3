//! A config written for the reference gateway, on the real binary: every key
//! of its loader loads without an "ignored" warning (`config check`); the
//! README's SMS example listens on its `webhook_port` and takes a message
//! Twilio signed; the reference's environment variables win over the file,
//! at start and across a live edit; a bad variable stops the start naming
//! it; where one of our keys and its reference name are both written, ours
//! is used and the warning names both.

use std::path::Path;

use lemon_tests::fake_twilio::twilio_signature;
use serde_json::{json, Value};
use tokio::net::TcpListener;

use crate::reload_e2e::Notices;
use crate::support::{command, home_with, output_text, write_config, Gateway};
use crate::webhook_e2e::free_port;

const AUTH_TOKEN: &str = "reference-twilio-token-7c1e";
const INBOX: &str = "+15551239999";
const SIGNED_URL: &str = "https://lemon-sms.example.test/webhooks/twilio/sms";

/// Every key the reference's ConfigLoader reads (its §10.3), with the values
/// its own example uses; channels switched off so nothing is contacted.
const REFERENCE_CONFIG: &str = r#"
[gateway]
max_concurrent_runs = 4
default_cwd = "/tmp"
auto_resume = true
enable_telegram = false
enable_discord = false
enable_xmtp = false
enable_webhook = false
require_engine_lock = true
engine_lock_timeout_ms = 45000

[gateway.queue]
mode = "collect"
cap = 10
drop = "oldest"

[gateway.projects.demo]
root = "/tmp"

[[gateway.bindings]]
transport = "telegram"
chat_id = 123456
topic_id = 7
project = "demo"
agent_id = "default"
queue_mode = "followup"

[gateway.sms]
webhook_enabled = false
webhook_port = 4045
webhook_bind = "127.0.0.1"
inbox_number = "+15551230000"
inbox_ttl_ms = 86400000
validate_webhook = false
auth_token = "reference-inline-token"
webhook_url = "https://sms.example.test/webhooks/twilio/sms"

[gateway.telegram]
bot_token = "123456:replace-me"
bot_id = 123456
bot_username = "lemon_bot"
allowed_chat_ids = [123456, -1001234567890]
deny_unbound_chats = false
startup_message = true
poll_interval_ms = 1000
edit_throttle_ms = 400
debounce_ms = 1000
show_resume_line = true
use_markdown = true
allow_queue_override = false
account_id = "default"
offset = 0
drop_pending_updates = false
voice_transcription = true
voice_transcription_model = "gpt-4o-mini-transcribe"
voice_transcription_base_url = "https://api.openai.com/v1"
voice_transcription_api_key = "sk-replace-me"
voice_max_bytes = 10485760

[gateway.telegram.compaction]
enabled = true
context_window_tokens = 123000
reserve_tokens = 12000
trigger_ratio = 0.88

[gateway.telegram.files]
enabled = true
auto_put = true
auto_put_mode = "upload"
auto_send_generated_files = true
auto_send_generated_images = true
auto_send_generated_max_files = 4
uploads_dir = "incoming"
allowed_user_ids = [42]
deny_globs = [".git/**", "*.pem"]
max_upload_bytes = 20971520
max_download_bytes = 52428800
media_group_debounce_ms = 1200
outbound_send_delay_ms = 800

[gateway.discord]
bot_token = "discord-replace-me"
allowed_guild_ids = [111111111111111111]
allowed_channel_ids = [222222222222222222]
deny_unbound_channels = true

[gateway.discord.files]
enabled = true
max_download_bytes = 1234

[gateway.email]
inbound_enabled = true
webhook_enabled = true
webhook_port = 4048
webhook_bind = "127.0.0.1"
webhook_path = "/webhooks/email/inbound"
webhook_token = "email-token"
reply_to = "lemon@example.test"
from = "Lemon <lemon@example.test>"
relay = "smtp.example.test"
smtp_relay = "smtp.example.test"
smtp_port = 587
smtp_username = " lemon "
smtp_password = "replace-me"
smtp_tls = true
smtp_ssl = false
smtp_auth = "always"
smtp_hostname = "lemon.example.test"

[gateway.email.inbound]
enabled = true
bind = "127.0.0.1"
port = 4048
path = "/webhooks/email/inbound"
token = "inbound-token"

[gateway.email.outbound]
from = "lemon@example.test"
reply_to = "lemon@example.test"
relay = "nested-relay.example.test"
port = 465
username = "lemon"
password = "replace-me"
tls = "always"
tls_versions = ["tlsv1.2", "tlsv1.3"]
ssl = true
auth = "always"
hostname = "lemon.example.test"

[gateway.xmtp]
env = "dev"
environment = "dev"
api_url = "${XMTP_API_URL}"
poll_interval_ms = 1500
connect_timeout_ms = 10000
require_live = false
wallet_address = "${XMTP_WALLET_ADDRESS}"
wallet_key = "${XMTP_WALLET_KEY}"
private_key = "${XMTP_PRIVATE_KEY}"
inbox_id = "inbox-1"
db_path = "/tmp/xmtp.db"
bridge_script = "/tmp/xmtp-bridge.mjs"
mock_mode = true
sdk_module = "@xmtp/node-sdk"

[gateway.webhook]
bind = "127.0.0.1"
port = 4046
mode = "sync"
timeout_ms = 30000
callback_wait_timeout_ms = 60000
callback_url = "https://hooks.example.test/lemon"
allow_callback_override = false
allow_private_callback_hosts = false
allow_query_token = false
allow_payload_token = true
allow_payload_idempotency_key = true
callback_max_attempts = 3
callback_backoff_ms = 500
callback_backoff_max_ms = 5000

[gateway.webhook.integrations.n8n-demo]
token = "n8n-token"
session_key = "agent:default:webhook:n8n-demo"
agent_id = "default"
queue_mode = "followup"
cwd = "/tmp"
callback_url = "https://n8n.example.test/callback"
allow_callback_override = false
allow_private_callback_hosts = false
allow_query_token = false
allow_payload_token = false
allow_payload_idempotency_key = false
callback_max_attempts = 5
callback_backoff_ms = 250
callback_backoff_max_ms = 4000
mode = "async"
timeout_ms = 20000
callback_wait_timeout_ms = 30000
"#;

/// Sections still being brought over, whose keys may be warned about as
/// ignored (`"gateway.telegram"`, `"gateway.discord.files"` were, until
/// they loaded): an entry here is left out of the assertion below. Empty:
/// every key of the file is covered.
const PENDING_SECTIONS: &[&str] = &[];

/// `config check` of `home`'s config.toml with `vars` in its environment:
/// whether it passed, and the warning lines.
async fn check(home: &Path, vars: &[(&str, &str)]) -> (bool, Vec<String>, String) {
    let mut check = command(home);
    check.envs(vars.iter().copied()).args(["config", "check"]);
    let (ok, text) = output_text(check).await;
    let warnings =
        text.lines().filter_map(|line| line.strip_prefix("warning: ")).map(str::to_owned).collect();
    (ok, warnings, text)
}

/// The key path a warning line is about (`gateway.sms.webhook_port`).
fn key_of(warning: &str) -> &str {
    let after_place = warning.split_once(": ").map_or(warning, |(_, rest)| rest);
    match after_place.strip_prefix("unknown key ") {
        Some(rest) => rest.split(' ').next().unwrap_or(rest),
        None => after_place.split(':').next().unwrap_or(after_place),
    }
}

/// A gateway on `home` with `vars` added to its environment.
async fn start_with_env(home: &Path, vars: &[(&str, &str)]) -> Gateway {
    let mut start = command(home);
    start.envs(vars.iter().copied());
    Gateway::spawn(start, home).await
}

/// The SMS webhook's local address, from `/v1/status` (`127.0.0.1:PORT`).
async fn sms_addr(gateway: &Gateway) -> String {
    let status = gateway.status().await;
    let sms = &status["transports"]["sms"];
    assert_eq!(sms["state"], "running", "{status}");
    sms["detail"].as_str().unwrap().split(' ').next().unwrap().to_owned()
}

fn inbound(sid: &str, body: &str) -> Vec<(&'static str, String)> {
    vec![
        ("MessageSid", sid.to_owned()),
        ("AccountSid", "AC0123456789abcdef0123456789abcdef".to_owned()),
        ("From", "+15557770000".to_owned()),
        ("To", INBOX.to_owned()),
        ("Body", body.to_owned()),
    ]
}

/// POSTs `params` to the SMS webhook at `addr`, signed over `SIGNED_URL`
/// with `token` (unsigned without one): the status.
async fn post_sms(addr: &str, params: &[(&'static str, String)], token: Option<&str>) -> u16 {
    let mut request =
        reqwest::Client::new().post(format!("http://{addr}/webhooks/twilio/sms")).form(params);
    if let Some(token) = token {
        let pairs: Vec<(&str, &str)> = params.iter().map(|(k, v)| (*k, v.as_str())).collect();
        request = request.header("X-Twilio-Signature", twilio_signature(token, SIGNED_URL, &pairs));
    }
    request.send().await.unwrap().status().as_u16()
}

async fn config_report(gateway: &Gateway) -> Value {
    let response = gateway.get("/v1/config").send().await.unwrap();
    assert_eq!(response.status(), 200);
    response.json().await.unwrap()
}

#[tokio::test]
async fn every_reference_key_loads_without_an_ignored_warning() {
    let dir = home_with(REFERENCE_CONFIG);
    let (ok, warnings, text) = check(dir.path(), &[]).await;
    assert!(ok, "{text}");
    let ignored: Vec<&String> = warnings
        .iter()
        .filter(|w| w.contains("(ignored)"))
        .filter(|w| !PENDING_SECTIONS.iter().any(|section| key_of(w).starts_with(section)))
        .collect();
    assert!(ignored.is_empty(), "reference keys dropped:\n{ignored:#?}");
    // What has no meaning here is accepted and said plainly.
    let about = |key: &str| warnings.iter().find(|w| key_of(w) == key).cloned();
    let mock = about("gateway.xmtp.mock_mode").expect("a note on mock_mode");
    assert!(mock.contains("accepted; there is no mock mode"), "{mock}");
    let versions = about("gateway.email.outbound.tls_versions").expect("a note on tls_versions");
    assert!(versions.contains("accepted; TLS 1.2 or later is always used"), "{versions}");
    // A `${VAR}` whose variable is unset is said, never silently kept.
    let key = about("gateway.xmtp.wallet_key").expect("a note on wallet_key");
    assert!(key.contains("XMTP_WALLET_KEY is not set"), "{key}");
    // The inline Twilio token is never repeated.
    assert!(!text.contains("reference-inline-token"), "{text}");
}

/// The reference README's `[gateway.sms]` (its port 4045 replaced by a free
/// one): the webhook listens on `webhook_port` and stores a signed message.
#[tokio::test]
async fn the_readme_sms_example_listens_on_webhook_port_and_takes_a_signed_message() {
    let port = free_port().await;
    let config = format!(
        "[gateway.sms]\nwebhook_enabled = true\nwebhook_port = {port}\nwebhook_bind = \"127.0.0.1\"\n\
         inbox_number = \"{INBOX}\"\nvalidate_webhook = true\nwebhook_url = \"{SIGNED_URL}\"\n"
    );
    let dir = home_with(&config);
    let env = [("TWILIO_AUTH_TOKEN", AUTH_TOKEN)];
    let (ok, warnings, text) = check(dir.path(), &env).await;
    assert!(ok, "{text}");
    assert!(warnings.is_empty(), "{warnings:#?}");

    let gateway = start_with_env(dir.path(), &env).await;
    let addr = sms_addr(&gateway).await;
    assert_eq!(addr, format!("127.0.0.1:{port}"));
    let params = inbound("SM00000000000000000000000000000451", "Your code is 482913");
    assert_eq!(post_sms(&addr, &params, None).await, 401, "signatures are checked");
    assert_eq!(post_sms(&addr, &params, Some("not-the-token")).await, 403);
    assert_eq!(post_sms(&addr, &params, Some(AUTH_TOKEN)).await, 200);
    let listed: Value = gateway.get("/v1/sms/messages").send().await.unwrap().json().await.unwrap();
    assert_eq!(listed["messages"][0]["codes"], json!(["482913"]), "{listed}");
    assert_eq!(listed["messages"][0]["to"], INBOX, "{listed}");
}

#[tokio::test]
async fn environment_variables_win_over_the_file() {
    // The file's port is held by this test: a gateway that used it would fail.
    let held = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let file_port = held.local_addr().unwrap().port();
    let (sms_port, health_port) = (free_port().await, free_port().await);
    let config = format!(
        "[gateway]\nmax_concurrent_runs = 1\n\
         [gateway.sms]\nwebhook_enabled = false\nwebhook_port = {file_port}\n\
         validate_webhook = true\ninbox_number = \"+15550000000\"\n"
    );
    let dir = home_with(&config);
    let (sms_port_text, health_port_text) = (sms_port.to_string(), health_port.to_string());
    let env = [
        ("LEMON_SMS_WEBHOOK_ENABLED", "1"),
        ("LEMON_SMS_WEBHOOK_PORT", sms_port_text.as_str()),
        ("LEMON_SMS_WEBHOOK_BIND", "localhost"),
        ("TWILIO_VALIDATE_WEBHOOK", "false"),
        ("TWILIO_INBOX_NUMBER", INBOX),
        ("LEMON_SMS_INBOX_TTL_MS", "3600000"),
        ("LEMON_GATEWAY_HEALTH_PORT", health_port_text.as_str()),
        ("LEMON_GATEWAY_MAX_CONCURRENT_RUNS", "3"),
        ("LEMON_GATEWAY_ENGINE_LOCK_TIMEOUT_MS", "1234"),
    ];
    let (ok, warnings, text) = check(dir.path(), &env).await;
    assert!(ok, "{text}");
    for key in [
        "gateway.max_concurrent_runs",
        "gateway.sms.webhook_enabled",
        "gateway.sms.webhook_port",
        "gateway.sms.validate_webhook",
        "gateway.sms.inbox_number",
    ] {
        let warning = warnings.iter().find(|w| key_of(w) == key);
        let warning = warning.unwrap_or_else(|| panic!("a warning on {key}: {warnings:#?}"));
        assert!(warning.contains("the environment variable"), "{warning}");
    }

    let gateway = start_with_env(dir.path(), &env).await;
    assert_eq!(gateway.health, format!("http://127.0.0.1:{health_port}"));
    let health = reqwest::get(format!("{}/healthz", gateway.health)).await.unwrap();
    assert_eq!(health.status(), 200);
    let addr = sms_addr(&gateway).await;
    assert_eq!(addr, format!("127.0.0.1:{sms_port}"));
    // Signatures off by TWILIO_VALIDATE_WEBHOOK: an unsigned message is taken.
    let params = inbound("SM00000000000000000000000000000452", "code 1234");
    assert_eq!(post_sms(&addr, &params, None).await, 200);
    let effective = &config_report(&gateway).await["effective"];
    assert_eq!(effective["max_concurrent_runs"], 3, "{effective}");
    assert_eq!(effective["engine_lock_timeout_ms"], 1234, "{effective}");
    assert_eq!(effective["sms"]["inbox_number"], INBOX, "{effective}");
    assert_eq!(effective["sms"]["inbox_ttl_ms"], 3_600_000, "{effective}");
    assert_eq!(gateway.status().await["scheduler"]["max"], 3);
    drop(held);
}

#[tokio::test]
async fn a_live_edit_keeps_the_environment_over_the_file() {
    let config = "[gateway]\nmax_concurrent_runs = 1\nengine_lock_timeout_ms = 1000\n";
    let dir = home_with(config);
    let gateway = start_with_env(dir.path(), &[("LEMON_GATEWAY_MAX_CONCURRENT_RUNS", "3")]).await;
    assert_eq!(gateway.status().await["scheduler"]["max"], 3);

    let mut notices = Notices::subscribe(&gateway).await;
    write_config(dir.path(), "[gateway]\nmax_concurrent_runs = 2\nengine_lock_timeout_ms = 2000\n");
    let (kind, data) = notices.next().await;
    assert_eq!(kind, "config_reloaded", "{data}");
    assert_eq!(data["applied"], json!(["engine_lock_timeout_ms"]), "{data}");
    let effective = &config_report(&gateway).await["effective"];
    assert_eq!(effective["max_concurrent_runs"], 3, "{effective}");
    assert_eq!(effective["engine_lock_timeout_ms"], 2000, "{effective}");
    assert_eq!(gateway.status().await["scheduler"]["max"], 3);
}

#[tokio::test]
async fn a_bad_environment_value_stops_the_start_naming_the_variable() {
    let dir = home_with("[gateway.sms]\nwebhook_enabled = true\nvalidate_webhook = false\n");
    let env = [("LEMON_SMS_WEBHOOK_PORT", "forty-one")];
    let expected =
        "environment variable LEMON_SMS_WEBHOOK_PORT: \"forty-one\" is not a port (a whole number from 0 to 65535)";
    let (ok, _, text) = check(dir.path(), &env).await;
    assert!(!ok && text.contains(expected), "{text}");

    let mut start = command(dir.path());
    start.envs(env).stdin(std::process::Stdio::null());
    let output = tokio::time::timeout(crate::support::PATIENCE, start.output())
        .await
        .expect("the gateway exits in time")
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(5), "a configuration error: {stderr}");
    assert!(stderr.contains(expected), "{stderr}");
}

#[tokio::test]
async fn ours_and_the_reference_name_both_written_use_ours_and_warn_naming_both() {
    let (ours, theirs) = (free_port().await, free_port().await);
    let config = format!(
        "[gateway.sms]\nenabled = true\nvalidate_webhook = false\n\
         port = {ours}\nwebhook_port = {theirs}\n\n[gateway.discord]\n\
         deny_unbound = false\ndeny_unbound_channels = true\n"
    );
    let dir = home_with(&config);
    let (ok, warnings, text) = check(dir.path(), &[]).await;
    assert!(ok, "{text}");
    let sms = warnings.iter().find(|w| key_of(w) == "gateway.sms.webhook_port").expect(&text);
    assert!(
        sms.ends_with(
            "both `port` and `webhook_port` (the reference's name for it) are set; `port` is used"
        ),
        "{sms}"
    );
    assert!(sms.contains("config.toml:5:1: "), "placed at the reference key: {sms}");
    let discord = warnings
        .iter()
        .find(|w| key_of(w) == "gateway.discord.deny_unbound_channels")
        .expect(&text);
    assert!(discord.contains("`deny_unbound` is used"), "{discord}");

    let gateway = Gateway::start_in(dir.path()).await;
    assert_eq!(sms_addr(&gateway).await, format!("127.0.0.1:{ours}"));
}
