//! `doctor`'s channel lines on the real binary against the local fakes: a
//! fake Discord REST API, Dovecot, the fake SMTP server; SMS, voice and XMTP
//! from their config and secrets.

use std::path::Path;
use std::process::{Output, Stdio};

use lemon_tests::dovecot::{self, Dovecot};
use lemon_tests::fake_discord::FakeDiscord;
use lemon_tests::fake_smtp::FakeSmtp;
use tokio::process::Command;

use crate::support::{command, everything_server, home_with, write_config, PATIENCE};

const DISCORD_TOKEN: &str = "discord-doctor-token-51f0";

async fn doctor(home: &Path) -> (Option<i32>, String) {
    let mut cmd: Command = command(home);
    cmd.env("NO_COLOR", "1").arg("doctor").stdin(Stdio::null());
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let output: Output =
        tokio::time::timeout(PATIENCE, cmd.output()).await.expect("doctor ends in time").unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.code(), text)
}

fn write_secrets(home: &Path, text: &str) {
    use std::os::unix::fs::PermissionsExt;
    let path = home.join("secrets.toml");
    std::fs::write(&path, text).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

/// The report's line for `what` holding `needle`, with its fix line if it has one.
fn line_with(report: &str, what: &str, needle: &str) -> String {
    let lines: Vec<&str> = report.lines().collect();
    for (i, line) in lines.iter().enumerate() {
        if line.contains(what) && line.contains(needle) {
            let mut found = (*line).to_owned();
            if let Some(next) = lines.get(i + 1).filter(|l| l.trim_start().starts_with("fix:")) {
                found.push('\n');
                found.push_str(next);
            }
            return found;
        }
    }
    panic!("no {what:?} line with {needle:?} in\n{report}");
}

#[tokio::test]
async fn doctor_checks_the_discord_token_against_users_me() {
    let fake = FakeDiscord::start(DISCORD_TOKEN).await;
    let home = home_with(&format!(
        "[gateway]\nenable_discord = true\n[gateway.discord]\napi_base_url = \"{}\"\ngateway_url = \"{}\"\n",
        fake.api_base_url(),
        fake.gateway_url()
    ));
    write_secrets(home.path(), &format!("discord_bot_token = \"{DISCORD_TOKEN}\"\n"));
    let (code, report) = doctor(home.path()).await;
    let line = line_with(&report, "channel discord", "accepted");
    assert!(line.starts_with("ok") && line.contains("@lemon-test"), "{report}");
    assert_eq!(code, Some(0), "{report}");

    write_secrets(home.path(), "discord_bot_token = \"not-the-token\"\n");
    let (code, report) = doctor(home.path()).await;
    let line = line_with(&report, "channel discord", "refused");
    assert!(line.starts_with("fail") && line.contains("401"), "{line}");
    assert!(line.contains("fix: ") && line.contains("secrets set discord_bot_token"), "{line}");
    assert!(!report.contains("not-the-token"), "the token is not shown: {report}");
    assert_eq!(code, Some(1));
}

#[tokio::test]
async fn doctor_logs_in_to_imap_and_connects_to_smtp() {
    let imap = Dovecot::start(PATIENCE).await;
    let smtp = FakeSmtp::start().await;
    let config = |smtp_port: u16| {
        format!(
            "[gateway.email]\nenabled = true\nfrom = \"agent@lemon.test\"\n\
             allowed_senders = [\"alice@example.com\"]\nauthserv_id = \"mx.lemon.test\"\n\
             [gateway.email.imap]\nhost = \"127.0.0.1\"\nport = {}\ntls = false\nusername = \"{}\"\npassword_secret = \"imap_password\"\n\
             [gateway.email.smtp]\nhost = \"127.0.0.1\"\nport = {smtp_port}\nsecurity = \"none\"\nusername = \"agent@lemon.test\"\npassword_secret = \"smtp_password\"\n",
            imap.port(),
            dovecot::USER
        )
    };
    let home = home_with(&config(smtp.port()));
    write_secrets(
        home.path(),
        &format!("imap_password = \"{}\"\nsmtp_password = \"smtp-pw\"\n", dovecot::PASSWORD),
    );
    let (code, report) = doctor(home.path()).await;
    let imap_line = line_with(&report, "channel email imap", "logged in");
    assert!(imap_line.starts_with("ok") && imap_line.contains(dovecot::USER), "{report}");
    let smtp_line = line_with(&report, "channel email smtp", "EHLO");
    assert!(smtp_line.starts_with("ok") && smtp_line.contains("login"), "{report}");
    assert_eq!(code, Some(0), "{report}");

    // A wrong IMAP password and an SMTP server that is not there.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let closed_port = closed.local_addr().unwrap().port();
    drop(closed);
    write_config(home.path(), &config(closed_port));
    write_secrets(home.path(), "imap_password = \"wrong\"\nsmtp_password = \"smtp-pw\"\n");
    let (code, report) = doctor(home.path()).await;
    let imap_line = line_with(&report, "channel email imap", "refused");
    assert!(imap_line.starts_with("fail"), "{imap_line}");
    assert!(imap_line.contains("secrets set imap_password"), "{imap_line}");
    let smtp_line = line_with(&report, "channel email smtp", &closed_port.to_string());
    assert!(smtp_line.starts_with("fail") && smtp_line.contains("fix: check host"), "{smtp_line}");
    assert!(!report.contains("wrong\""), "{report}");
    assert_eq!(code, Some(1));
}

#[tokio::test]
async fn doctor_checks_sms_and_voice_secrets_public_url_and_port() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let home = home_with(&format!(
        "[gateway.sms]\nenabled = true\nport = {port}\nvalidate_webhook = false\npublic_url = \"http://example.test\"\n\
         [gateway.voice]\nenabled = true\nport = 0\nvalidate_webhook = false\npublic_url = \"https://voice.example.test\"\n"
    ));
    write_secrets(
        home.path(),
        "twilio_account_sid = \"AC123\"\ndeepgram_api_key = \"dg\"\nelevenlabs_api_key = \"el\"\n",
    );
    let (code, report) = doctor(home.path()).await;
    assert!(line_with(&report, "channel sms", "account SID").starts_with("ok"), "{report}");
    let token = line_with(&report, "channel sms", "auth token");
    assert!(
        token.starts_with("fail") && token.contains("secrets set twilio_auth_token"),
        "{token}"
    );
    let url = line_with(&report, "channel sms", "not https");
    assert!(url.starts_with("warn") && url.contains("fix: "), "{url}");
    let busy = line_with(&report, "channel sms", &format!("127.0.0.1:{port}"));
    assert!(busy.starts_with("fail") && busy.contains("another port"), "{busy}");
    assert!(line_with(&report, "channel voice", "Deepgram").starts_with("ok"), "{report}");
    assert!(line_with(&report, "channel voice", "ElevenLabs").starts_with("ok"), "{report}");
    assert!(line_with(&report, "channel voice", "https://voice").starts_with("ok"), "{report}");
    assert!(!report.contains("AC123"), "{report}");
    assert_eq!(code, Some(1));
    drop(taken);
}

#[tokio::test]
async fn doctor_checks_node_the_bridge_its_packages_and_the_wallet_key() {
    let bridge = tempfile::tempdir().unwrap();
    let script = bridge.path().join("bridge.mjs");
    std::fs::write(&script, "// bridge\n").unwrap();
    let home = home_with(&format!(
        "[gateway]\nenable_xmtp = true\n[gateway.xmtp]\nbridge_script = \"{}\"\n",
        script.display()
    ));
    let (code, report) = doctor(home.path()).await;
    // Node.js from the PATH, with its version.
    let node = line_with(&report, "channel xmtp", "node");
    assert!(node.contains(" v") && !node.starts_with("fail"), "{report}");
    assert!(line_with(&report, "channel xmtp", "bridge script").starts_with("ok"), "{report}");
    let packages = line_with(&report, "channel xmtp", "not installed");
    assert!(packages.starts_with("fail") && packages.contains("npm ci --prefix"), "{packages}");
    let key = line_with(&report, "channel xmtp", "wallet key");
    assert!(key.starts_with("fail") && key.contains("secrets set xmtp_wallet_key"), "{key}");
    assert_eq!(code, Some(1));

    let sdk = bridge.path().join("node_modules/@xmtp/agent-sdk");
    std::fs::create_dir_all(&sdk).unwrap();
    std::fs::write(sdk.join("package.json"), r#"{"name":"@xmtp/agent-sdk","version":"2.3.0"}"#)
        .unwrap();
    write_secrets(home.path(), "xmtp_wallet_key = \"0xabc\"\n");
    let (_, report) = doctor(home.path()).await;
    assert!(line_with(&report, "channel xmtp", "agent-sdk 2.3.0").starts_with("ok"), "{report}");
    assert!(line_with(&report, "channel xmtp", "wallet key").starts_with("ok"), "{report}");
    assert!(!report.contains("0xabc"), "{report}");

    std::fs::remove_file(&script).unwrap();
    let (code, report) = doctor(home.path()).await;
    let missing = line_with(&report, "channel xmtp", "does not exist");
    assert!(missing.starts_with("fail") && missing.contains("fix: set bridge_script"), "{missing}");
    assert_eq!(code, Some(1));
}

#[tokio::test]
async fn doctor_says_how_big_the_database_is_and_how_much_room_is_left() {
    let home = home_with("");
    std::fs::write(home.path().join("lemon.db"), vec![0u8; 12_345]).unwrap();
    let (_, report) = doctor(home.path()).await;
    let line = line_with(&report, "storage", "lemon.db 12.3 kB;");
    assert!(line.contains(" free of "), "{line}");
    assert!(line.contains(&format!("on the disk of {}", home.path().display())), "{line}");
}

#[tokio::test]
async fn doctor_says_whether_commands_are_contained() {
    let home = home_with("");
    let (_, report) = doctor(home.path()).await;
    let line = line_with(&report, "sandbox", "Landlock ABI");
    assert!(line.starts_with("ok"), "{line}");
    assert!(line.contains("connects to no TCP port"), "{line}");
    write_config(
        home.path(),
        "[gateway.sandbox]\nmode = \"required\"\nsimulate_no_landlock = true\n",
    );
    let (code, report) = doctor(home.path()).await;
    let line = line_with(&report, "sandbox", "no Landlock");
    assert!(line.starts_with("fail"), "{line}");
    assert!(line.contains("fix: run on a kernel with Landlock"), "{line}");
    assert_eq!(code, Some(1), "{report}");
    write_config(home.path(), "[gateway.sandbox]\nsimulate_no_landlock = true\n");
    let (_, report) = doctor(home.path()).await;
    let line = line_with(&report, "sandbox", "no Landlock");
    assert!(line.starts_with("warn"), "{line}");
}

/// Beside the gateway running on its home, doctor checks it through its API
/// and its health port instead of failing on ports it cannot bind.
#[tokio::test]
async fn doctor_beside_the_running_gateway_checks_it_instead_of_failing_its_ports() {
    let free = || std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let (api, health) = (free(), free());
    let home =
        home_with(&format!("[gateway.api]\nport = {api}\n\n[gateway.health]\nport = {health}\n"));
    let gateway = crate::support::Gateway::start_in(home.path()).await;
    let (code, report) = doctor(home.path()).await;
    assert!(!report.contains("cannot listen"), "{report}");
    let line = line_with(&report, "control API", "this home's gateway runs there (version");
    assert!(line.starts_with("ok"), "{line}");
    let line = line_with(&report, "health", "the gateway answers there: healthy");
    assert!(line.starts_with("ok"), "{line}");
    assert_eq!(code, Some(0), "{report}");
    gateway.terminate().await;
}

#[tokio::test]
async fn doctor_starts_each_mcp_server_and_lists_its_tools_or_says_why_not() {
    let Some(everything) = everything_server() else { return };
    let home = home_with(&format!(
        "[[gateway.mcp_servers]]\nname = \"everything\"\ncommand = \"{}\"\nargs = [\"stdio\"]\n\n\
         [[gateway.mcp_servers]]\nname = \"missing\"\ncommand = \"lemon-no-such-mcp-server\"\n\n\
         [[gateway.mcp_servers]]\nname = \"github\"\nurl = \"https://mcp.example.test/mcp?key=k\"\n\
         headers = {{ Authorization = \"github_mcp_auth\" }}\n\n\
         [[gateway.mcp_servers]]\nname = \"off\"\ncommand = \"npx\"\nargs = [\"-y\", \"some-server\"]\nenabled = false\n",
        everything.display()
    ));
    let (code, report) = doctor(home.path()).await;

    let line = line_with(&report, "mcp server everything", "tools");
    assert!(line.starts_with("ok"), "{report}");
    assert!(line.contains("(offered as everything__<tool>): "), "{line}");
    let count: usize = line
        .split_once("mcp server everything")
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("a count of tools: {line}"));
    let names: Vec<&str> = line.rsplit_once("): ").unwrap().1.split(", ").collect();
    assert_eq!(names.len(), count, "{line}");
    assert!(names.contains(&"echo"), "the everything server's echo tool: {line}");

    let missing = line_with(&report, "mcp server missing", "lemon-no-such-mcp-server");
    assert!(missing.starts_with("fail") && missing.contains("not found on PATH"), "{missing}");
    assert!(missing.contains("fix: install lemon-no-such-mcp-server"), "{missing}");
    assert!(missing.contains("set command in the [[gateway.mcp_servers]] entry named \"missing\""));

    let secret = line_with(&report, "mcp server github", "github_mcp_auth");
    assert!(secret.starts_with("fail") && secret.contains("header Authorization"), "{secret}");
    assert!(secret.contains("fix: lemon-gateway secrets set github_mcp_auth"), "{secret}");

    let off = line_with(&report, "mcp server off", "disabled");
    assert!(off.starts_with("info") && off.contains("stdio: npx -y some-server"), "{off}");
    assert_eq!(code, Some(1), "{report}");
}
