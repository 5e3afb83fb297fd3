//! XMTP end to end: the real gateway binary starts `fake-xmtp-bridge` as its
//! bridge, which relays the protocol to a hub in this process, so each test
//! plays the bridge (ready, messages, sent, crashes) against the echo engine.

use std::path::Path;

use lemon_tests::fake_xmtp::{AttachmentHost, BridgeConn, FakeXmtpHub};
use serde_json::{json, Value};

use crate::support::{failed_start, home_with, Gateway, PATIENCE};

const WALLET_KEY: &str = "0x59c6995e998f97a5a0044966f0945389dc9e86dae88c7a8412f4603b6b78690d";
pub(crate) const INBOX: &str = "a11ce0000000000000000000000000000000000000000000000000000000b0b1";
pub(crate) const ADDRESS: &str = "0x00000000000000000000000000000000000a11ce";
pub(crate) const CONVERSATION: &str = "c0ffee00c0ffee00c0ffee00c0ffee00";
pub(crate) const FRIEND: &str = "f00d0000000000000000000000000000000000000000000000000000000000f1";
pub(crate) const STRANGER: &str =
    "bad00000000000000000000000000000000000000000000000000000000000b2";

pub(crate) fn fake_bridge() -> &'static str {
    env!("CARGO_BIN_EXE_fake-xmtp-bridge")
}

/// A config with XMTP on, its bridge the fake reporting to `hub`. [`FRIEND`]
/// is allowed unless `xmtp_extra` sets `allowed_senders` (or
/// `allow_everyone`) itself: an empty list lets nobody in.
pub(crate) fn config(hub: &FakeXmtpHub, xmtp_extra: &str, extra: &str) -> String {
    let allowed = if xmtp_extra.contains("allowed_senders") || xmtp_extra.contains("allow_everyone")
    {
        String::new()
    } else {
        format!("allowed_senders = [\"{FRIEND}\"]\n")
    };
    format!(
        "[gateway]\nenable_xmtp = true\n{extra}\n\
         [gateway.xmtp]\nnode = \"{}\"\nbridge_script = \"{}\"\nrestart_backoff_ms = 50\n{allowed}{xmtp_extra}\n",
        fake_bridge(),
        hub.control_file().display()
    )
}

fn echo_delay(ms: u64) -> String {
    format!("[gateway.engines.echo]\ndelay_ms = {ms}\n")
}

pub(crate) fn home(config: &str) -> tempfile::TempDir {
    let home = home_with(config);
    let secrets = home.path().join("secrets.toml");
    std::fs::write(&secrets, format!("xmtp_wallet_key = \"{WALLET_KEY}\"\n")).unwrap();
    std::fs::set_permissions(&secrets, std::os::unix::fs::PermissionsExt::from_mode(0o600))
        .unwrap();
    home
}

/// Waits until the transport's state is `state`; its entry.
pub(crate) async fn transport_state(gateway: &Gateway, state: &str) -> Value {
    let wait = async {
        loop {
            let status = gateway.status().await;
            let xmtp = status["transports"]["xmtp"].clone();
            if xmtp["state"] == state {
                return xmtp;
            }
            tokio::time::sleep(std::time::Duration::from_millis(25)).await;
        }
    };
    tokio::time::timeout(PATIENCE, wait).await.expect("the xmtp transport's state in time")
}

/// Starts the gateway on `home`; the first bridge, ready.
/// The gateway reports itself ready once its transports run, so the bridge
/// says `ready` while the gateway starts.
pub(crate) async fn start(hub: &FakeXmtpHub, home: &Path) -> (Gateway, BridgeConn) {
    let bridge = async {
        let bridge = hub.next_bridge(PATIENCE).await;
        bridge.ready(INBOX, ADDRESS).await;
        bridge
    };
    let (gateway, bridge) = tokio::join!(Gateway::start_in(home), bridge);
    transport_state(&gateway, "running").await;
    (gateway, bridge)
}

/// The `send` lines so far whose text contains `needle`.
fn sends_containing(bridge: &BridgeConn, needle: &str) -> Vec<Value> {
    bridge
        .of_type("send")
        .into_iter()
        .filter(|s| s["text"].as_str().unwrap_or("").contains(needle))
        .collect()
}

/// Waits for the answer containing `needle`, answers it `sent`; the send line.
pub(crate) async fn answer(bridge: &BridgeConn, needle: &str) -> Value {
    let what = format!("a send containing {needle:?}");
    bridge.wait_for(&what, PATIENCE, |_| !sends_containing(bridge, needle).is_empty()).await;
    let send = sends_containing(bridge, needle).remove(0);
    bridge.sent(send["request_id"].as_str().unwrap(), "sent-message-1").await;
    send
}

async fn runs(gateway: &Gateway) -> Vec<Value> {
    let runs: Value = gateway.get("/v1/runs").send().await.unwrap().json().await.unwrap();
    runs["runs"].as_array().unwrap().clone()
}

pub(crate) fn acks(bridge: &BridgeConn) -> Vec<String> {
    bridge.of_type("ack").iter().map(|a| a["id"].as_str().unwrap().to_owned()).collect()
}

#[tokio::test]
async fn a_message_is_acked_run_and_answered_in_its_conversation() {
    let hub = FakeXmtpHub::start(true).await;
    let home = home(&config(&hub, "", ""));
    let (gateway, bridge) = start(&hub, home.path()).await;

    // Started with the key in its environment only.
    let argv = bridge.hello["argv"].to_string();
    assert!(!argv.contains(WALLET_KEY), "{argv}");
    assert_eq!(bridge.hello["env"]["XMTP_WALLET_KEY"], WALLET_KEY);
    assert_eq!(bridge.hello["env"]["XMTP_ENV"], "dev");
    assert_eq!(bridge.hello["argv"][1], hub.control_file().display().to_string());
    let xmtp = transport_state(&gateway, "running").await;
    assert_eq!(xmtp["detail"], format!("inbox {INBOX} ({ADDRESS}) on dev"), "{xmtp}");

    bridge.message("m-1", CONVERSATION, FRIEND, "hello over xmtp").await;
    bridge.wait_for("the ack", PATIENCE, |_| acks(&bridge) == ["m-1"]).await;
    let send = answer(&bridge, "hello over xmtp").await;
    assert_eq!(send["v"], 1);
    assert_eq!(send["conversation_id"], CONVERSATION);
    let runs = runs(&gateway).await;
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert_eq!(runs[0]["session_key"], format!("agent:default:xmtp:{CONVERSATION}"));
    assert_eq!(send["request_id"], runs[0]["run_id"]);
    let health: Value =
        reqwest::get(format!("{}/healthz", gateway.health)).await.unwrap().json().await.unwrap();
    assert_eq!(health["transports"]["xmtp"]["state"], "running", "{health}");

    // The same conversation again is the same session.
    bridge.message("m-2", CONVERSATION, FRIEND, "second message").await;
    answer(&bridge, "second message").await;
    let runs = self::runs(&gateway).await;
    assert_eq!(runs.len(), 2);
    assert_eq!(runs[0]["session_key"], runs[1]["session_key"]);

    // Stopping the gateway stops the bridge.
    gateway.terminate().await;
    bridge.wait_closed(PATIENCE).await;
}

#[tokio::test]
async fn a_disallowed_sender_gets_no_run_and_a_garbage_line_is_survived() {
    let hub = FakeXmtpHub::start(true).await;
    let home = home(&config(&hub, &format!("allowed_senders = [\"{FRIEND}\"]"), ""));
    let (gateway, bridge) = start(&hub, home.path()).await;

    bridge.message("m-stranger", CONVERSATION, STRANGER, "let me in").await;
    bridge.send_raw("this is not json").await;
    bridge.send_raw("[1, 2, 3]").await;
    bridge.send(json!({"v": 1, "type": "typing", "conversation_id": CONVERSATION})).await;
    bridge.send(json!({"v": 2, "type": "message", "id": "m-future"})).await;
    bridge.send(json!({"v": 1, "type": "message", "id": "m-no-fields"})).await;
    bridge
        .send_raw(&format!(
            "{{\"v\":1,\"type\":\"message\",\"text\":\"{}\"}}",
            "x".repeat(1_100_000)
        ))
        .await;
    bridge.message("m-bad-conv", "../../etc", FRIEND, "path in the id").await;
    bridge.message("m-friend", CONVERSATION, FRIEND, "a friend asks").await;
    answer(&bridge, "a friend asks").await;

    // The stranger's message is acked (the bridge may forget it) and ran nothing.
    assert_eq!(acks(&bridge), ["m-stranger", "m-bad-conv", "m-friend"]);
    let runs = runs(&gateway).await;
    assert_eq!(runs.len(), 1, "only the friend's message ran: {runs:?}");
    assert!(sends_containing(&bridge, "let me in").is_empty());
    assert_eq!(transport_state(&gateway, "running").await["state"], "running");
    assert!(hub.try_next_bridge().await.is_none(), "the bridge was not restarted");
    gateway.terminate().await;
}

#[tokio::test]
async fn a_bridge_that_crashes_mid_answer_is_restarted_and_the_answer_sent_once() {
    let hub = FakeXmtpHub::start(true).await;
    let home = home(&config(&hub, "", ""));
    let (gateway, first) = start(&hub, home.path()).await;

    first.message("m-crash", CONVERSATION, FRIEND, "survive a crash").await;
    first
        .wait_for("the answer", PATIENCE, |_| {
            !sends_containing(&first, "survive a crash").is_empty()
        })
        .await;
    let request_id = sends_containing(&first, "survive a crash")[0]["request_id"].clone();
    first.crash(3).await;
    let failing = transport_state(&gateway, "failing").await;
    assert!(failing["reason"].as_str().unwrap().contains("exit code 3"), "{failing}");

    let second = hub.next_bridge(PATIENCE).await;
    second.ready(INBOX, ADDRESS).await;
    let send = answer(&second, "survive a crash").await;
    assert_eq!(send["request_id"], request_id, "the same answer, not a new one");
    transport_state(&gateway, "running").await;

    // The next message's answer comes after, and the crashed one is not sent again.
    second.message("m-after", CONVERSATION, FRIEND, "after the crash").await;
    answer(&second, "after the crash").await;
    assert_eq!(sends_containing(&second, "survive a crash").len(), 1);
    assert_eq!(runs(&gateway).await.len(), 2);
    gateway.terminate().await;
}

#[tokio::test]
async fn a_bridge_that_stops_answering_pings_is_restarted() {
    let hub = FakeXmtpHub::start(false).await;
    let home = home(&config(&hub, "ping_interval_ms = 200\nping_timeout_ms = 300", ""));
    let (gateway, first) = start(&hub, home.path()).await;
    first.wait_for("a ping", PATIENCE, |_| !first.of_type("ping").is_empty()).await;
    first.wait_closed(PATIENCE).await;
    let failing = transport_state(&gateway, "failing").await;
    assert!(failing["reason"].as_str().unwrap().contains("stopped answering"), "{failing}");
    let second = hub.next_bridge(PATIENCE).await;
    second.ready(INBOX, ADDRESS).await;
    transport_state(&gateway, "running").await;
    gateway.terminate().await;
}

#[tokio::test]
async fn a_restart_of_the_gateway_loses_and_repeats_nothing() {
    let hub = FakeXmtpHub::start(true).await;
    let home = home(&config(&hub, "", &echo_delay(400)));
    let (gateway, bridge) = start(&hub, home.path()).await;
    bridge.message("m-r1", CONVERSATION, FRIEND, "before the restart").await;
    answer(&bridge, "before the restart").await;
    // A second one is taken, and the gateway stops before it is answered.
    bridge.message("m-r2", CONVERSATION, FRIEND, "across the restart").await;
    bridge.wait_for("the ack", PATIENCE, |_| acks(&bridge).len() == 2).await;
    gateway.terminate().await;
    bridge.wait_closed(PATIENCE).await;

    let (gateway, bridge) = start(&hub, home.path()).await;
    // A bridge whose cursor did not move hands both over again.
    bridge.message("m-r1", CONVERSATION, FRIEND, "before the restart").await;
    bridge.message("m-r2", CONVERSATION, FRIEND, "across the restart").await;
    bridge.message("m-r3", CONVERSATION, FRIEND, "after the restart").await;
    // The answer owed from before the restart goes first, once; then the new one.
    answer(&bridge, "across the restart").await;
    answer(&bridge, "after the restart").await;
    assert_eq!(sends_containing(&bridge, "across the restart").len(), 1);
    assert!(sends_containing(&bridge, "before the restart").is_empty(), "{:#?}", bridge.received());
    assert_eq!(acks(&bridge), ["m-r1", "m-r2", "m-r3"]);
    let runs = runs(&gateway).await;
    assert_eq!(runs.len(), 3, "{runs:?}");
    gateway.terminate().await;
}

#[tokio::test]
async fn a_run_started_elsewhere_in_a_conversation_is_answered_there() {
    let hub = FakeXmtpHub::start(true).await;
    let home = home(&config(&hub, "", ""));
    let (gateway, bridge) = start(&hub, home.path()).await;
    let session = format!("agent:default:xmtp:{CONVERSATION}");
    let run_id = gateway.submit(json!({"prompt": "from the api", "session_key": session})).await;
    let send = answer(&bridge, "from the api").await;
    assert_eq!(send["conversation_id"], CONVERSATION);
    assert_eq!(send["request_id"], run_id);
    gateway.terminate().await;
}

#[tokio::test]
async fn a_mistake_in_the_xmtp_section_is_placed_in_the_file_and_a_missing_key_named() {
    let hub = FakeXmtpHub::start(true).await;
    let bad = home(&config(&hub, "env = \"mainnet\"", ""));
    let (code, stderr) = failed_start(bad.path()).await;
    assert_ne!(code, Some(0));
    assert!(stderr.contains("config.toml:") && stderr.contains("env"), "{stderr}");

    let keyless = home_with(&config(&hub, "", ""));
    let (code, stderr) = failed_start(keyless.path()).await;
    assert_ne!(code, Some(0));
    assert!(stderr.contains("xmtp_wallet_key"), "{stderr}");
    assert!(!stderr.contains(WALLET_KEY));
}

/// XMTP on a local network (so attachments may come from loopback over
/// http), files of at most 4 KiB, runs in `project`.
fn attachment_config(hub: &FakeXmtpHub, project: &Path) -> String {
    config(
        hub,
        "env = \"local\"\n[gateway.xmtp.files]\nmax_download_bytes = 4096",
        &format!(
            "default_cwd = {:?}\n[gateway.engines.echo]\ndelay_ms = 0",
            project.display().to_string()
        ),
    )
}

#[tokio::test]
async fn a_remote_attachment_is_fetched_decrypted_and_handed_to_the_run() {
    let hub = FakeXmtpHub::start(true).await;
    let host = AttachmentHost::start().await;
    let project = tempfile::tempdir().unwrap();
    let home = home(&attachment_config(&hub, project.path()));
    let (gateway, bridge) = start(&hub, home.path()).await;

    let fields = host.put("abc123", "notes.txt", "text/plain", b"remember the milk");
    bridge.attachment("m-file", CONVERSATION, FRIEND, fields).await;
    let send = answer(&bridge, ".lemon/uploads/notes.txt").await;
    let text = send["text"].as_str().unwrap();
    assert!(text.starts_with("(files attached)\n\n[Files sent with this message"), "{text}");
    assert!(text.contains("- .lemon/uploads/notes.txt (file, text/plain,"), "{text}");
    assert_eq!(send["conversation_id"], CONVERSATION);
    assert_eq!(
        std::fs::read(project.path().join(".lemon/uploads/notes.txt")).unwrap(),
        b"remember the milk"
    );
    bridge.wait_for("the ack", PATIENCE, |_| acks(&bridge) == ["m-file"]).await;
    assert_eq!(host.n_fetches(), 1);
    assert_eq!(runs(&gateway).await.len(), 1);
    gateway.terminate().await;
}

#[tokio::test]
async fn a_tampered_or_oversized_attachment_is_refused_with_a_reply_and_no_run() {
    let hub = FakeXmtpHub::start(true).await;
    let host = AttachmentHost::start().await;
    let project = tempfile::tempdir().unwrap();
    let home = home(&attachment_config(&hub, project.path()));
    let (gateway, bridge) = start(&hub, home.path()).await;

    // Changed on the way: its bytes no longer match the sender's digest.
    let fields = host.put("t1", "plan.txt", "text/plain", b"the real plan");
    host.tamper("t1");
    bridge.attachment("m-tampered", CONVERSATION, FRIEND, fields).await;
    answer(&bridge, "plan.txt was refused: its bytes do not match the digest the sender gave")
        .await;

    // Announced larger than the limit: refused before a byte is fetched.
    let fetched = host.n_fetches();
    let big = host.put("b1", "big.bin", "application/octet-stream", &[7; 8192]);
    bridge.attachment("m-big", CONVERSATION, FRIEND, big).await;
    let send = answer(&bridge, "big.bin is 8 KB").await;
    assert!(send["text"].as_str().unwrap().ends_with("the limit is 4 KB"), "{send}");
    assert_eq!(host.n_fetches(), fetched, "not fetched");

    // Announced small, but larger once opened: refused all the same.
    let mut liar = host.put("l1", "liar.bin", "application/octet-stream", &[7; 8192]);
    liar["content_length"] = json!(10);
    bridge.attachment("m-liar", CONVERSATION, FRIEND, liar).await;
    answer(&bridge, "liar.bin is 8 KB — the limit is 4 KB").await;

    bridge.wait_for("the acks", PATIENCE, |_| acks(&bridge).len() == 3).await;
    assert!(runs(&gateway).await.is_empty(), "no run started");
    assert!(!project.path().join(".lemon/uploads").exists());
    gateway.terminate().await;
}
