//! Every listener of the real binary refuses what it has not authenticated
//! before reading it, and bounds what it reads and parses: the control API,
//! an OpenAI-compatible route, a generic webhook, the email hook, the SMS
//! webhook and the voice webhook, all on one gateway.
//!
//! - A 39 MiB body with a wrong token (or no Twilio signature) is answered
//!   `401`/`403` while it is still being sent, and the gateway's resident
//!   memory (`VmRSS` in `/proc/<pid>/status`) grows by less than 8 MiB.
//! - An authenticated body declared over the listener's limit is a `413` with
//!   `{"error": …}` (the limits the README states: 1 MiB for the API and the
//!   webhooks, one file of `[gateway.files] max_download_bytes` in base64 for
//!   the routes that take files, 40 MiB for the email hook, 64 KiB for the
//!   Twilio webhooks).
//! - JSON nested 100 000 levels deep, with the right token, is a `400`, and
//!   the gateway goes on answering.
//! - An unknown webhook integration gets the answer a wrong token gets.

use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;

use lemon_tests::fake_smtp::FakeSmtp;
use lemon_tests::fake_twilio::FakeTwilio;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::{home_with, Gateway, PATIENCE, TOKEN};

const HOOK_TOKEN: &str = "hook-listeners-token-41c2";
const MAIL_TOKEN: &str = "mail-listeners-token-9e07";
const TWILIO_TOKEN: &str = "twilio-listeners-token-3b8a";
const ACCOUNT_SID: &str = "AC0123456789abcdef0123456789abcdef";

/// What a refused body may add to the gateway's resident memory.
const RSS_BOUND_BYTES: u64 = 8 * 1024 * 1024;
/// The body sent with a wrong token: 39 MiB.
const HUGE: usize = 39 * 1024 * 1024;
/// The limits the README states.
const API_LIMIT: usize = 1024 * 1024;
/// The routes that take files (`POST /v1/runs`, the OpenAI routes): one file
/// of the default `[gateway.files] max_download_bytes` (20 MiB) in base64,
/// and 64 KiB beside it.
const FILES_LIMIT: usize = (20 * 1024 * 1024usize).div_ceil(3) * 4 + 64 * 1024;
const MAIL_LIMIT: usize = 40 * 1024 * 1024;
const TWILIO_LIMIT: usize = 64 * 1024;

/// Where each listener is.
struct Listeners {
    gateway: Gateway,
    api: SocketAddr,
    webhook: SocketAddr,
    mail: SocketAddr,
    sms: SocketAddr,
    voice: SocketAddr,
    _smtp: FakeSmtp,
    _twilio: FakeTwilio,
    _home: tempfile::TempDir,
}

/// A gateway with every listener on (API, webhook, email hook, SMS, voice).
async fn start() -> Listeners {
    let smtp = FakeSmtp::start().await;
    let twilio = FakeTwilio::start(ACCOUNT_SID, TWILIO_TOKEN).await;
    let config = format!(
        "[gateway.engines.echo]\ndelay_ms = 1\n\
         [gateway.webhook]\nenabled = true\nport = 0\n\
         [gateway.webhook.integrations.zap]\ntoken = \"{HOOK_TOKEN}\"\n\
         [gateway.email]\nenabled = true\nfrom = \"Lemon <agent@lemon.test>\"\n\
         allowed_senders = [\"alice@example.com\"]\nauthserv_id = \"mx.lemon.test\"\n\
         [gateway.email.smtp]\nhost = \"127.0.0.1\"\nport = {}\nsecurity = \"none\"\n\
         username = \"agent@lemon.test\"\npassword_secret = \"smtp_password\"\n\
         [gateway.email.inbound_webhook]\nlisten = \"127.0.0.1:0\"\ntoken_secret = \"mail_token\"\n\
         [gateway.sms]\nenabled = true\nport = 0\npublic_url = \"https://sms.example.test\"\n\
         inbox_number = \"+15551239999\"\napi_base_url = \"{}\"\n\
         [gateway.voice]\nenabled = true\nport = 0\npublic_url = \"https://voice.example.test\"\n\
         allowed_callers = [\"+15551230100\"]\n\
         deepgram_base_url = \"ws://127.0.0.1:9\"\nelevenlabs_base_url = \"http://127.0.0.1:9\"\n",
        smtp.port(),
        twilio.url(),
    );
    let home = home_with(&config);
    let secrets = home.path().join("secrets.toml");
    std::fs::write(
        &secrets,
        format!(
            "smtp_password = \"smtp-pass\"\nmail_token = \"{MAIL_TOKEN}\"\n\
             twilio_auth_token = \"{TWILIO_TOKEN}\"\ntwilio_account_sid = \"{ACCOUNT_SID}\"\n\
             deepgram_api_key = \"dg-key\"\nelevenlabs_api_key = \"el-key\"\n"
        ),
    )
    .unwrap();
    std::fs::set_permissions(&secrets, std::fs::Permissions::from_mode(0o600)).unwrap();
    let gateway = Gateway::start_in(home.path()).await;
    // Each transport's address is the first word of its status detail.
    let running = tokio::time::timeout(PATIENCE, async {
        loop {
            let status = gateway.status().await;
            let detail = |id: &str| -> Option<String> {
                let transport = &status["transports"][id];
                (transport["state"] == "running")
                    .then(|| transport["detail"].as_str().unwrap_or_default().to_owned())
            };
            if let (Some(email), Some(sms), Some(voice)) =
                (detail("email"), detail("sms"), detail("voice"))
            {
                return (email, sms, voice);
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    })
    .await;
    let (email, sms, voice) = running.expect("every transport runs");
    let addr = |text: &str| -> SocketAddr {
        let word = text.split([' ', ';', '/']).find(|w| w.parse::<SocketAddr>().is_ok());
        word.unwrap_or_else(|| panic!("no address in {text:?}")).parse().unwrap()
    };
    let mail = addr(email.trim_start_matches("http://"));
    let url_addr = |url: &str| addr(url.trim_start_matches("http://"));
    Listeners {
        api: url_addr(&gateway.api),
        webhook: gateway.webhook.as_deref().unwrap().parse().unwrap(),
        mail,
        sms: addr(&sms),
        voice: addr(&voice),
        gateway,
        _smtp: smtp,
        _twilio: twilio,
        _home: home,
    }
}

/// The gateway's resident memory, in bytes.
fn rss(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib * 1024
}

/// The status and body of the answer to a POST of `path` with `headers`
/// (lines ending in `\r\n`) declaring a body of `declared` bytes, of which up
/// to `sent` are sent (JSON-ish filler) while the answer is read. The answer
/// may come, and the connection close, before the body is sent.
async fn post_declared(
    addr: SocketAddr,
    path: &str,
    headers: &str,
    declared: usize,
    sent: usize,
) -> (u16, Value) {
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut reader, mut writer) = stream.into_split();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\ncontent-length: {declared}\r\n{headers}connection: close\r\n\r\n"
    );
    let sending = tokio::spawn(async move {
        writer.write_all(head.as_bytes()).await?;
        let chunk = vec![b' '; 64 * 1024];
        let mut left = sent;
        while left > 0 {
            let n = left.min(chunk.len());
            writer.write_all(&chunk[..n]).await?;
            left -= n;
        }
        writer.flush().await
    });
    let mut answer = Vec::new();
    let read = tokio::time::timeout(PATIENCE, async {
        let mut buffer = [0u8; 16 * 1024];
        loop {
            match reader.read(&mut buffer).await {
                Ok(0) | Err(_) => return,
                Ok(n) => answer.extend_from_slice(&buffer[..n]),
            }
            if complete(&answer) {
                return;
            }
        }
    })
    .await;
    assert!(read.is_ok(), "{path}: no answer in time");
    sending.abort();
    let text = String::from_utf8_lossy(&answer).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("{path}: not an HTTP answer: {text:?}"));
    let body = text.split_once("\r\n\r\n").map(|(_, body)| body).unwrap_or_default();
    let body = serde_json::from_str(body).unwrap_or(Value::String(body.to_owned()));
    (status, body)
}

/// Whether `answer` holds a whole response (its head and `content-length` bytes).
fn complete(answer: &[u8]) -> bool {
    let text = String::from_utf8_lossy(answer);
    let Some((head, body)) = text.split_once("\r\n\r\n") else { return false };
    let length = head.lines().find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.eq_ignore_ascii_case("content-length").then(|| value.trim().parse::<usize>().ok())?
    });
    length.is_some_and(|length| body.len() >= length)
}

/// Each listener's path and the headers of a request that is not authenticated.
fn unauthenticated() -> Vec<(&'static str, &'static str, String)> {
    let json = "content-type: application/json\r\n";
    let form = "content-type: application/x-www-form-urlencoded\r\n";
    vec![
        ("api", "/v1/runs", format!("{json}authorization: Bearer wrong-token\r\n")),
        ("openai", "/v1/chat/completions", format!("{json}authorization: Bearer wrong-token\r\n")),
        ("webhook", "/webhooks/zap", format!("{json}authorization: Bearer wrong-token\r\n")),
        ("email", "/email/inbound", format!("{json}authorization: Bearer wrong-token\r\n")),
        ("sms", "/webhooks/twilio/sms", form.to_owned()),
        ("voice", "/webhooks/twilio/voice", form.to_owned()),
    ]
}

impl Listeners {
    fn addr_of(&self, listener: &str) -> SocketAddr {
        match listener {
            "api" | "openai" => self.api,
            "webhook" => self.webhook,
            "email" => self.mail,
            "sms" => self.sms,
            "voice" => self.voice,
            other => panic!("no listener {other}"),
        }
    }
}

#[tokio::test]
#[allow(clippy::print_stderr)] // The figures, for the README.
async fn a_huge_body_without_credentials_is_refused_unread_on_every_listener() {
    let listeners = start().await;
    let pid = listeners.gateway.pid();
    let mut figures = Vec::new();
    for (listener, path, headers) in unauthenticated() {
        let before = rss(pid);
        let (status, body) =
            post_declared(listeners.addr_of(listener), path, &headers, HUGE, HUGE).await;
        let after = rss(pid);
        let expected: &[u16] = if matches!(listener, "sms") { &[401] } else { &[401, 403] };
        assert!(expected.contains(&status), "{listener}: {status} {body}");
        assert!(!body["error"].is_null(), "{listener}: {body}");
        let grown = after.saturating_sub(before);
        assert!(
            grown < RSS_BOUND_BYTES,
            "{listener}: resident memory grew by {grown} bytes ({before} -> {after})"
        );
        figures.push(format!("{listener} {} KiB", grown / 1024));
    }
    eprintln!("RSS rise for a refused {} MiB body: {}", HUGE >> 20, figures.join(", "));
    // The gateway goes on answering.
    assert_eq!(listeners.gateway.get("/v1/status").send().await.unwrap().status(), 200);
}

#[tokio::test]
async fn an_authenticated_body_over_the_limit_is_413_before_it_is_read() {
    let listeners = start().await;
    let pid = listeners.gateway.pid();
    let json = "content-type: application/json\r\n";
    let form = "content-type: application/x-www-form-urlencoded\r\n";
    let signed = format!("{form}x-twilio-signature: c2lnbmVk\r\n");
    let cases = [
        ("api", "/v1/runs", format!("{json}authorization: Bearer {TOKEN}\r\n"), FILES_LIMIT),
        ("api", "/v1/cron", format!("{json}authorization: Bearer {TOKEN}\r\n"), API_LIMIT),
        (
            "openai",
            "/v1/chat/completions",
            format!("{json}authorization: Bearer {TOKEN}\r\n"),
            FILES_LIMIT,
        ),
        ("webhook", "/webhooks/zap", format!("{json}x-webhook-token: {HOOK_TOKEN}\r\n"), API_LIMIT),
        (
            "email",
            "/email/inbound",
            format!("{json}x-lemon-email-token: {MAIL_TOKEN}\r\n"),
            MAIL_LIMIT,
        ),
        ("sms", "/webhooks/twilio/sms", signed.clone(), TWILIO_LIMIT),
        ("voice", "/webhooks/twilio/voice", signed, TWILIO_LIMIT),
    ];
    for (listener, path, headers, limit) in cases {
        // Declared one byte over, nothing sent: answered without waiting for it.
        let addr = listeners.addr_of(listener);
        let (status, body) = post_declared(addr, path, &headers, limit + 1, 0).await;
        assert_eq!(status, 413, "{listener}: {body}");
        let message = match listener {
            "openai" => body["error"]["message"].as_str(),
            _ => body["error"].as_str(),
        };
        let message = message.unwrap_or_else(|| panic!("{listener}: {body}"));
        assert!(message.contains(&format!("larger than {limit} bytes")), "{listener}: {message}");
        // 39 MiB declared and sent: refused as fast, memory bounded.
        let before = rss(pid);
        let (status, _) = post_declared(addr, path, &headers, HUGE + limit, HUGE).await;
        let grown = rss(pid).saturating_sub(before);
        assert_eq!(status, 413, "{listener}");
        assert!(grown < RSS_BOUND_BYTES, "{listener}: resident memory grew by {grown} bytes");
    }
}

#[tokio::test]
async fn deeply_nested_json_with_the_right_token_is_a_400_and_the_gateway_stays_up() {
    let listeners = start().await;
    let deep = |prefix: &str| format!("{prefix}{}{}}}", "[".repeat(100_000), "]".repeat(100_000));
    let http = reqwest::Client::new();
    let cases = [
        (
            "api",
            http.post(format!("{}/v1/runs", listeners.gateway.api)).bearer_auth(TOKEN),
            deep("{\"prompt\":"),
        ),
        (
            "openai",
            http.post(format!("{}/v1/chat/completions", listeners.gateway.api)).bearer_auth(TOKEN),
            deep("{\"model\":\"echo\",\"messages\":"),
        ),
        (
            "webhook",
            http.post(listeners.gateway.webhook_url("zap")).bearer_auth(HOOK_TOKEN),
            deep("{\"prompt\":"),
        ),
        (
            "email",
            http.post(format!("http://{}/email/inbound", listeners.mail)).bearer_auth(MAIL_TOKEN),
            deep("{\"text\":"),
        ),
    ];
    for (listener, request, body) in cases {
        let response =
            request.header("content-type", "application/json").body(body).send().await.unwrap();
        assert_eq!(response.status(), 400, "{listener}");
        let body: Value = response.json().await.unwrap();
        let message = match listener {
            "openai" => body["error"]["message"].as_str(),
            _ => body["error"].as_str(),
        };
        let message = message.unwrap_or_else(|| panic!("{listener}: {body}"));
        assert!(message.contains("nested deeper than 64 levels"), "{listener}: {message}");
    }
    let run = listeners.gateway.submit(json!({ "prompt": "still here", "engine": "echo" })).await;
    assert_eq!(listeners.gateway.wait(&run).await["status"], "completed");
}

#[tokio::test]
async fn an_unknown_webhook_integration_is_answered_as_a_wrong_token() {
    let listeners = start().await;
    let http = reqwest::Client::new();
    let answer = |url: String, token: &'static str| {
        let request = http.post(url).bearer_auth(token).json(&json!({ "prompt": "hi" }));
        async move {
            let response = request.send().await.unwrap();
            let status = response.status().as_u16();
            (status, response.text().await.unwrap())
        }
    };
    let wrong = answer(listeners.gateway.webhook_url("zap"), "wrong-token").await;
    let unknown = answer(listeners.gateway.webhook_url("nope"), HOOK_TOKEN).await;
    let unknown_unauthenticated = answer(listeners.gateway.webhook_url("nope"), "wrong").await;
    assert_eq!(wrong.0, 401, "{wrong:?}");
    assert_eq!(unknown, wrong);
    assert_eq!(unknown_unauthenticated, wrong);
}
