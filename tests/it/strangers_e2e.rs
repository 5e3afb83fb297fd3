//! Strangers on every chat channel, on the real binary: with no allow-list
//! nobody gets a run, nothing is stored and nothing is answered, and the log
//! (INFO) names who was refused, once per start, so the owner can copy the id
//! into the list; `allow_everyone = true` lets a stranger in, is warned about
//! at start and shows in `/v1/status` and `doctor`. Email also refuses what a
//! forger can put in a mail: a second `From`, an `Authentication-Results`
//! header of another server, a pass for another domain; and a channel that
//! would believe an unsigned `From` does not start.

use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex};

use lemon_tests::dovecot::{self, Dovecot};
use lemon_tests::fake_discord::FakeDiscord;
use lemon_tests::fake_smtp::FakeSmtp;
use lemon_tests::fake_telegram::{ChatSpec, FakeTelegram};
use lemon_tests::fake_twilio::FakeTwilio;
use lemon_tests::fake_xmtp::{BridgeConn, FakeXmtpHub};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::Notify;

use crate::support::{command, failed_start, home_with, Gateway, PATIENCE};

/// What status and the log say of a channel open to everyone.
const OPEN: &str = "open to everyone (allow_everyone = true)";

/// The gateway's log (stderr, INFO and up), line by line as it comes.
#[derive(Clone, Default)]
struct Log {
    lines: Arc<Mutex<Vec<String>>>,
    grew: Arc<Notify>,
}

impl Log {
    fn text(&self) -> String {
        self.lines.lock().unwrap().join("\n")
    }

    /// The lines holding every one of `needles`.
    fn matching(&self, needles: &[&str]) -> Vec<String> {
        let lines = self.lines.lock().unwrap();
        lines.iter().filter(|l| needles.iter().all(|n| l.contains(n))).cloned().collect()
    }

    /// Waits for a line holding every one of `needles`; that line.
    async fn wait_for(&self, needles: &[&str]) -> String {
        self.wait_count(needles, 1).await.remove(0)
    }

    /// Waits for `count` lines holding every one of `needles`; those lines.
    async fn wait_count(&self, needles: &[&str], count: usize) -> Vec<String> {
        let found = tokio::time::timeout(PATIENCE, async {
            loop {
                let grew = self.grew.notified();
                tokio::pin!(grew);
                grew.as_mut().enable();
                let lines = self.matching(needles);
                if lines.len() >= count {
                    return lines;
                }
                grew.await;
            }
        })
        .await;
        found.unwrap_or_else(|_| {
            panic!("not {count} log lines with {needles:?} in\n{}", self.text())
        })
    }
}

/// Starts the gateway on `home` logging at INFO; its log as it comes.
async fn start_logged(home: &Path) -> (Gateway, Log) {
    let mut cmd = command(home);
    cmd.env("LEMON_LOG", "info");
    let mut gateway = Gateway::spawn_with_stderr(cmd, home, Stdio::piped()).await;
    let stderr = gateway.child.stderr.take().expect("stderr is piped");
    let log = Log::default();
    let writer = log.clone();
    tokio::spawn(async move {
        let mut lines = BufReader::new(stderr).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            writer.lines.lock().unwrap().push(line);
            writer.grew.notify_waiters();
        }
    });
    (gateway, log)
}

async fn runs(gateway: &Gateway) -> Vec<Value> {
    let runs: Value = gateway.get("/v1/runs").send().await.unwrap().json().await.unwrap();
    runs["runs"].as_array().cloned().unwrap_or_default()
}

/// The status detail of `transport` once it runs.
async fn running_detail(gateway: &Gateway, transport: &str) -> String {
    let wait = async {
        loop {
            let status = gateway.status().await;
            let entry = &status["transports"][transport];
            if entry["state"] == "running" {
                return entry["detail"].as_str().unwrap_or_default().to_owned();
            }
            tokio::time::sleep(std::time::Duration::from_millis(25)).await;
        }
    };
    tokio::time::timeout(PATIENCE, wait).await.expect("the transport runs in time")
}

// ---------------------------------------------------------------- Telegram

const TG_TOKEN: &str = "616161:strangers-bot-token";
const TG_BOT: i64 = 616_161;

async fn fake_telegram() -> FakeTelegram {
    FakeTelegram::start(&[(TG_TOKEN, TG_BOT, "strangers_bot")]).await
}

/// The Telegram section a new user writes: the token and nothing else.
fn telegram_config(fake: &FakeTelegram, telegram_extra: &str) -> String {
    format!(
        "[gateway]\nenable_telegram = true\n\
         [gateway.telegram]\nbot_token = \"{TG_TOKEN}\"\napi_base_url = \"{}\"\npoll_timeout_s = 5\n{telegram_extra}\n",
        fake.base_url()
    )
}

#[tokio::test]
async fn telegram_with_the_default_config_answers_no_chat_and_logs_each_once() {
    let fake = fake_telegram().await;
    let home = home_with(&telegram_config(&fake, ""));
    let (gateway, log) = start_logged(home.path()).await;
    fake.wait_until("the bot's commands", PATIENCE, |s| s.commands().len() == 4).await;

    let private = ChatSpec::private(1001);
    let group = ChatSpec::group(-4_001);
    fake.inject_text(&private, 1001, "run `id` for me");
    fake.inject_text(&group, 1002, "and for the group");
    fake.inject_text(&private, 1001, "again");
    let last = ChatSpec::private(1003);
    fake.inject_text(&last, 1003, "me too");
    // Updates are handled in order: once the last is refused, so were the others.
    let line = log.wait_for(&["allowed_chat_ids", "1003"]).await;
    assert!(line.contains("INFO") && line.contains("add 1003 to allowed_chat_ids"), "{line}");
    log.wait_for(&["allowed_chat_ids", "-4001"]).await;
    assert_eq!(log.matching(&["not in allowed_chat_ids", "1001"]).len(), 1, "{}", log.text());

    for chat in [1001, -4_001, 1003] {
        assert!(fake.messages(chat).is_empty(), "chat {chat} got an answer");
    }
    assert!(fake.snapshot(|s| s.calls_to("sendMessage").is_empty()), "{}", fake.describe_calls());
    assert!(runs(&gateway).await.is_empty(), "no run, nothing stored");
    let detail = running_detail(&gateway, "telegram").await;
    assert!(!detail.contains(OPEN), "{detail}");
    assert!(!log.text().contains("allow_everyone = true"), "no warning when closed");
    gateway.terminate().await;
}

#[tokio::test]
async fn telegram_with_allow_everyone_answers_a_stranger_warns_at_start_and_says_so_in_status() {
    let fake = fake_telegram().await;
    let home = home_with(&telegram_config(&fake, "allow_everyone = true"));
    let (gateway, log) = start_logged(home.path()).await;
    let warning = log.wait_for(&["WARN", "allow_everyone = true"]).await;
    assert!(warning.contains("[gateway.telegram]") && warning.contains("anyone"), "{warning}");
    let detail = running_detail(&gateway, "telegram").await;
    assert!(detail.ends_with(OPEN), "{detail}");
    fake.wait_until("the bot's commands", PATIENCE, |s| s.commands().len() == 4).await;

    let asked = fake.inject_text(&ChatSpec::private(4242), 4242, "hello from anyone");
    let what = "the stranger's answer";
    fake.wait_until(what, PATIENCE, |s| {
        s.messages(4242)
            .iter()
            .any(|m| m.reply_to == Some(asked.message_id) && m.text.contains("hello from anyone"))
    })
    .await;
    assert_eq!(runs(&gateway).await.len(), 1);
    gateway.terminate().await;
}

#[tokio::test]
async fn doctor_says_who_a_telegram_bot_lets_in() {
    let fake = fake_telegram().await;
    let doctor = |home: &Path| {
        let mut cmd = command(home);
        cmd.env("NO_COLOR", "1").arg("doctor").stdin(Stdio::null());
        async move {
            let output = tokio::time::timeout(PATIENCE, cmd.output()).await.unwrap().unwrap();
            String::from_utf8_lossy(&output.stdout).into_owned()
                + &String::from_utf8_lossy(&output.stderr)
        }
    };
    let line = |report: &str, needle: &str| {
        report
            .lines()
            .find(|l| l.contains("channel telegram") && l.contains(needle))
            .unwrap_or_else(|| panic!("no telegram line with {needle:?} in\n{report}"))
            .to_owned()
    };
    let open = home_with(&telegram_config(&fake, "allow_everyone = true"));
    let report = doctor(open.path()).await;
    assert!(line(&report, "open to everyone").starts_with("warn"), "{report}");
    let closed = home_with(&telegram_config(&fake, ""));
    let report = doctor(closed.path()).await;
    let nobody = line(&report, "allowed_chat_ids is empty: nobody gets a run");
    assert!(nobody.starts_with("warn"), "{report}");
    let listed = home_with(&telegram_config(&fake, "allowed_chat_ids = [1001, -4001]"));
    let report = doctor(listed.path()).await;
    assert!(line(&report, "2 allowed in allowed_chat_ids").starts_with("ok"), "{report}");
}

// ---------------------------------------------------------------- Discord

fn discord_config(fake: &FakeDiscord, discord_extra: &str) -> String {
    format!(
        "[gateway]\nenable_discord = true\n\
         [gateway.discord]\ngateway_url = \"{}\"\napi_base_url = \"{}\"\n{discord_extra}\n",
        fake.gateway_url(),
        fake.api_base_url()
    )
}

#[tokio::test]
async fn discord_without_lists_answers_nobody_in_a_server_or_a_dm() {
    use crate::discord_e2e::{fake, home, CHANNEL, DM, GUILD, USER};
    let fake = fake().await;
    let home = home(&discord_config(&fake, ""));
    let (gateway, log) = start_logged(home.path()).await;
    fake.wait_until("the bot on the gateway", PATIENCE, |s| s.connected()).await;

    fake.inject_message(CHANNEL, USER, "in the server", true, None);
    fake.inject_message(DM, USER, "in a DM", false, None);
    let place =
        log.wait_for(&["allowed_channel_ids or allowed_guild_ids", &CHANNEL.to_string()]).await;
    assert!(place.contains(&GUILD.to_string()), "names the server: {place}");
    log.wait_for(&["not in allowed_user_ids", &USER.to_string()]).await;
    assert!(fake.bot_messages(CHANNEL).is_empty() && fake.bot_messages(DM).is_empty());
    assert!(runs(&gateway).await.is_empty());
    gateway.terminate().await;
}

#[tokio::test]
async fn discord_users_alone_are_answered_in_dms_not_in_servers() {
    use crate::discord_e2e::{fake, home, reply_containing, CHANNEL, DM, USER};
    let fake = fake().await;
    let home = home(&discord_config(&fake, &format!("allowed_user_ids = [\"{USER}\"]")));
    let (gateway, log) = start_logged(home.path()).await;
    fake.wait_until("the bot on the gateway", PATIENCE, |s| s.connected()).await;

    fake.inject_message(CHANNEL, USER, "in the server", true, None);
    log.wait_for(&["allowed_channel_ids or allowed_guild_ids", &CHANNEL.to_string()]).await;
    let dm = fake.inject_message(DM, USER, "in my DM", false, None);
    reply_containing(&fake, &dm, "in my DM").await;
    assert!(fake.bot_messages(CHANNEL).is_empty());
    assert_eq!(runs(&gateway).await.len(), 1);
    gateway.terminate().await;
}

// ---------------------------------------------------------------- XMTP

/// Starts the gateway on `home` logging at INFO; the first bridge, ready.
async fn start_xmtp(hub: &FakeXmtpHub, home: &Path) -> (Gateway, BridgeConn, Log) {
    use crate::xmtp_e2e::{transport_state, ADDRESS, INBOX};
    let bridge = async {
        let bridge = hub.next_bridge(PATIENCE).await;
        bridge.ready(INBOX, ADDRESS).await;
        bridge
    };
    let ((gateway, log), bridge) = tokio::join!(start_logged(home), bridge);
    transport_state(&gateway, "running").await;
    (gateway, bridge, log)
}

fn xmtp_config(hub: &FakeXmtpHub, xmtp_extra: &str) -> String {
    format!(
        "[gateway]\nenable_xmtp = true\n\
         [gateway.xmtp]\nnode = \"{}\"\nbridge_script = \"{}\"\nrestart_backoff_ms = 50\n{xmtp_extra}\n",
        crate::xmtp_e2e::fake_bridge(),
        hub.control_file().display()
    )
}

#[tokio::test]
async fn xmtp_without_allowed_senders_runs_nothing_and_with_allow_everyone_answers() {
    use crate::xmtp_e2e::{acks, answer, home, CONVERSATION, STRANGER};
    let hub = FakeXmtpHub::start(true).await;
    let closed = home(&xmtp_config(&hub, ""));
    let (gateway, bridge, log) = start_xmtp(&hub, closed.path()).await;
    bridge.message("m-stranger", CONVERSATION, STRANGER, "let me in").await;
    let line = log.wait_for(&["not in allowed_senders", STRANGER]).await;
    assert!(line.contains("INFO") && line.contains("[gateway.xmtp]"), "{line}");
    bridge.wait_for("the ack", PATIENCE, |lines| lines.iter().any(|l| l["type"] == "ack")).await;
    assert_eq!(acks(&bridge), ["m-stranger"], "refused for good: the bridge may forget it");
    assert!(bridge.of_type("send").is_empty(), "no answer");
    assert!(runs(&gateway).await.is_empty());
    assert!(!running_detail(&gateway, "xmtp").await.contains(OPEN));
    gateway.terminate().await;
    bridge.wait_closed(PATIENCE).await;

    let open = home(&xmtp_config(&hub, "allow_everyone = true"));
    let (gateway, bridge, log) = start_xmtp(&hub, open.path()).await;
    log.wait_for(&["WARN", "[gateway.xmtp] allow_everyone = true"]).await;
    assert!(running_detail(&gateway, "xmtp").await.ends_with(OPEN));
    bridge.message("m-open", CONVERSATION, STRANGER, "anyone home").await;
    answer(&bridge, "anyone home").await;
    assert_eq!(runs(&gateway).await.len(), 1);
    gateway.terminate().await;
}

// ---------------------------------------------------------------- SMS

#[tokio::test]
async fn an_sms_from_a_number_not_listed_is_kept_but_gets_no_run_and_no_text() {
    use crate::sms_e2e::{
        deliver, inbound, sms_addr, sms_config, write_secrets, ACCOUNT_SID, AUTH_TOKEN, FRIEND,
    };
    const STRANGER: &str = "+15550002222";
    let twilio = FakeTwilio::start(ACCOUNT_SID, AUTH_TOKEN).await;
    let home = home_with(&sms_config(&twilio, "reply_to_allowed = true\n"));
    write_secrets(home.path(), "");
    let (gateway, log) = start_logged(home.path()).await;
    let addr = sms_addr(&gateway).await;
    let sid = "SM00000000000000000000000000000bad";
    deliver(&addr, &inbound(sid, STRANGER, "text me your tools")).await;
    let line = log.wait_for(&["not in allowed_senders", STRANGER]).await;
    assert!(line.contains("[gateway.sms]"), "{line}");
    // Kept in the inbox (codes come from anyone), as before.
    let kept: Value = gateway.get("/v1/sms/messages").send().await.unwrap().json().await.unwrap();
    assert!(kept.to_string().contains(sid), "{kept}");

    deliver(&addr, &inbound("SM0000000000000000000000000000f00d", FRIEND, "hi, it's me")).await;
    let texts = twilio.wait_for_requests(1, PATIENCE).await;
    assert_eq!(texts.len(), 1, "{texts:?}");
    assert_eq!(texts[0].field("To"), Some(FRIEND));
    let runs = runs(&gateway).await;
    assert_eq!(runs.len(), 1, "only the listed number ran: {runs:?}");
    assert!(!runs[0].to_string().contains(STRANGER));
    assert_eq!(twilio.requests().len(), 1, "the stranger got no text");
    gateway.terminate().await;
}

// ---------------------------------------------------------------- Email

const AGENT: &str = "agent@lemon.test";
const ALICE: &str = "alice@example.com";
const AUTHSERV: &str = "mx.lemon.test";

fn email_secrets(home: &Path) {
    let text = format!(
        "imap_password = \"{}\"\nsmtp_password = \"smtp-pass-strangers\"\n",
        dovecot::PASSWORD
    );
    let path = home.join("secrets.toml");
    std::fs::write(&path, text).unwrap();
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
}

/// `[gateway.email]` with `email_extra`, IMAP from `imap`, SMTP to `smtp`.
fn email_config(imap_port: u16, smtp: &FakeSmtp, email_extra: &str) -> String {
    format!(
        "[gateway.email]\nenabled = true\nfrom = \"Lemon Agent <{AGENT}>\"\n{email_extra}\n\
         [gateway.email.smtp]\nhost = \"127.0.0.1\"\nport = {}\nsecurity = \"none\"\n\
         username = \"{AGENT}\"\npassword_secret = \"smtp_password\"\n\
         [gateway.email.imap]\nhost = \"127.0.0.1\"\nport = {imap_port}\ntls = false\n\
         username = \"{}\"\npassword_secret = \"imap_password\"\n",
        smtp.port(),
        dovecot::USER
    )
}

/// A mail to the agent with `headers` (each ending in CRLF) before the body.
fn mail(headers: &str, message_id: &str, body: &str) -> String {
    format!(
        "{headers}To: {AGENT}\r\nSubject: Hi\r\nMessage-ID: <{message_id}>\r\n\
         Date: Tue, 1 Dec 2026 10:00:00 +0000\r\nMIME-Version: 1.0\r\n\
         Content-Type: text/plain; charset=utf-8\r\n\r\n{body}\r\n"
    )
}

#[tokio::test]
async fn email_believes_one_from_and_only_its_own_servers_aligned_pass() {
    let imap = Dovecot::start(PATIENCE).await;
    let smtp = FakeSmtp::start().await;
    // The defaults but for who may write and which server's word counts.
    let extra = format!("allowed_senders = [\"{ALICE}\"]\nauthserv_id = \"{AUTHSERV}\"");
    let home = home_with(&email_config(imap.port(), &smtp, &extra));
    email_secrets(home.path());
    let (gateway, log) = start_logged(home.path()).await;
    running_detail(&gateway, "email").await;

    let signed = format!("Authentication-Results: {AUTHSERV}; dkim=pass header.d=example.com\r\n");
    // A stranger, however well signed.
    let stranger = "Authentication-Results: mx.lemon.test; dkim=pass header.d=evil.test\r\n";
    imap.append(&mail(&format!("{stranger}From: mallory@evil.test\r\n"), "s1@evil.test", "one"))
        .await;
    // Two From headers: a reader may show either.
    let two_froms = format!("{signed}From: mallory@evil.test\r\nFrom: {ALICE}\r\n");
    imap.append(&mail(&two_froms, "s2@evil.test", "two")).await;
    // A pass written by the sender, not by the receiving server.
    let forged = format!(
        "Authentication-Results: mx.evil.test; dkim=pass header.d=example.com\r\nFrom: {ALICE}\r\n"
    );
    imap.append(&mail(&forged, "s3@evil.test", "three")).await;
    // The receiving server's pass, for another domain than the From's.
    let unaligned = format!("Authentication-Results: {AUTHSERV}; dkim=pass header.d=evil.test; spf=pass smtp.mailfrom=bounce@evil.test\r\nFrom: {ALICE}\r\n");
    imap.append(&mail(&unaligned, "s4@evil.test", "four")).await;
    // Mail is taken in UID order: once this one is answered, the others were seen.
    imap.append(&mail(&format!("{signed}From: Alice <{ALICE}>\r\n"), "s5@example.com", "genuine"))
        .await;

    let mails = smtp.wait_for("the genuine answer", PATIENCE, |m| !m.is_empty()).await;
    assert_eq!(mails.len(), 1, "{mails:#?}");
    assert_eq!(mails[0].rcpt_to, [ALICE]);
    let runs = runs(&gateway).await;
    assert_eq!(runs.len(), 1, "only the genuine mail ran: {runs:?}");
    assert!(runs[0]["prompt"].as_str().unwrap_or_default().contains("genuine"), "{runs:?}");
    let line = log.wait_for(&["not in allowed_senders", "mallory@evil.test"]).await;
    assert!(line.contains("[gateway.email]"), "{line}");
    log.wait_count(&["mail refused", "no single From address"], 1).await;
    log.wait_count(&["mail refused", "sender not authenticated"], 2).await;
    gateway.terminate().await;
}

#[tokio::test]
async fn email_without_an_authserv_id_does_not_start_unless_told_to_trust_from() {
    let smtp = FakeSmtp::start().await;
    let closed = email_config(1, &smtp, &format!("allowed_senders = [\"{ALICE}\"]"));
    let home = home_with(&closed);
    email_secrets(home.path());
    let (code, stderr) = failed_start(home.path()).await;
    assert_ne!(code, Some(0), "{stderr}");
    assert!(stderr.contains("config.toml:1:"), "placed in the file: {stderr}");
    assert!(stderr.contains("`authserv_id`: required"), "{stderr}");
    assert!(stderr.contains("require_authenticated = false"), "says the way out: {stderr}");

    let imap = Dovecot::start(PATIENCE).await;
    let extra = format!("allowed_senders = [\"{ALICE}\"]\nrequire_authenticated = false");
    let home = home_with(&email_config(imap.port(), &smtp, &extra));
    email_secrets(home.path());
    let (gateway, _log) = start_logged(home.path()).await;
    running_detail(&gateway, "email").await;
    imap.append(&mail(&format!("From: {ALICE}\r\n"), "u1@example.com", "unsigned")).await;
    let mails = smtp.wait_for("the answer", PATIENCE, |m| !m.is_empty()).await;
    assert_eq!(mails[0].rcpt_to, [ALICE]);
    gateway.terminate().await;
}
