//! SMS end to end on the real binary, with a fake Twilio REST API and the
//! webhooks signed as Twilio signs them: a signed message stored with its code
//! and visible over `/v1/sms/messages`; unsigned, forged, re-signed-elsewhere,
//! replayed-with-a-changed-parameter and malformed requests refused with
//! nothing stored; a duplicate ignored; a claim conflict between two
//! sessions; a native run's `sms_wait_for_code` reading the inbox;
//! `/v1/sms/send` reaching Twilio through a 429 and a 500; a conversation
//! answered by text and not answered again after a restart; a start refused
//! when signatures cannot be checked.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use lemon_tests::fake_llm::{FakeLlm, FakeToolCall, Turn};
use lemon_tests::fake_twilio::{twilio_signature, Failure, FakeTwilio};
use serde_json::{json, Value};

use crate::support::{command, failed_start, home_with, Gateway, PATIENCE};

pub(crate) const ACCOUNT_SID: &str = "AC0123456789abcdef0123456789abcdef";
pub(crate) const AUTH_TOKEN: &str = "twilio-e2e-auth-token-51f2";
pub(crate) const PUBLIC_URL: &str = "https://lemon-sms.example.test";
pub(crate) const INBOX: &str = "+15551239999";
pub(crate) const FRIEND: &str = "+15550001111";
const SERVICE: &str = "+15557770000";

pub(crate) fn sms_config(twilio: &FakeTwilio, extra: &str) -> String {
    format!(
        "[gateway.sms]\nenabled = true\nport = 0\npublic_url = \"{PUBLIC_URL}\"\n\
         inbox_number = \"{INBOX}\"\napi_base_url = \"{}\"\nallowed_senders = [\"{FRIEND}\"]\n{extra}",
        twilio.url()
    )
}

/// The Twilio credentials in the secrets file, as a user would set them.
pub(crate) fn write_secrets(home: &Path, more: &str) {
    let path = home.join("secrets.toml");
    let text = format!(
        "twilio_auth_token = \"{AUTH_TOKEN}\"\ntwilio_account_sid = \"{ACCOUNT_SID}\"\n{more}"
    );
    std::fs::write(&path, text).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

/// The SMS webhook's local address, from `/v1/status`.
pub(crate) async fn sms_addr(gateway: &Gateway) -> String {
    let status = gateway.status().await;
    let sms = &status["transports"]["sms"];
    assert_eq!(sms["state"], "running", "{status}");
    let detail = sms["detail"].as_str().unwrap();
    assert!(detail.ends_with(&format!("{PUBLIC_URL}/webhooks/twilio/sms")), "{detail}");
    detail.split(' ').next().unwrap().to_owned()
}

pub(crate) fn inbound(sid: &str, from: &str, body: &str) -> Vec<(&'static str, String)> {
    vec![
        ("MessageSid", sid.to_owned()),
        ("SmsSid", sid.to_owned()),
        ("AccountSid", ACCOUNT_SID.to_owned()),
        ("From", from.to_owned()),
        ("To", INBOX.to_owned()),
        ("Body", body.to_owned()),
        ("NumMedia", "0".to_owned()),
    ]
}

fn sign(token: &str, url: &str, params: &[(&'static str, String)]) -> String {
    let pairs: Vec<(&str, &str)> = params.iter().map(|(k, v)| (*k, v.as_str())).collect();
    twilio_signature(token, url, &pairs)
}

/// POSTs `params` to the webhook at `addr` with `signature` (if any); the status and body.
async fn post_webhook(
    addr: &str,
    params: &[(&'static str, String)],
    signature: Option<&str>,
) -> (u16, String, String) {
    let mut request =
        reqwest::Client::new().post(format!("http://{addr}/webhooks/twilio/sms")).form(params);
    if let Some(signature) = signature {
        request = request.header("X-Twilio-Signature", signature);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let kind = response
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    (status, kind, response.text().await.unwrap())
}

/// Posts a message signed as Twilio signs it; asserts the empty TwiML answer.
pub(crate) async fn deliver(addr: &str, params: &[(&'static str, String)]) {
    let url = format!("{PUBLIC_URL}/webhooks/twilio/sms");
    let (status, kind, body) =
        post_webhook(addr, params, Some(&sign(AUTH_TOKEN, &url, params))).await;
    assert_eq!(status, 200, "{body}");
    assert!(kind.starts_with("text/xml"), "{kind}");
    assert!(body.ends_with("<Response/>"), "{body}");
}

async fn messages(gateway: &Gateway, query: &str) -> Value {
    let response = gateway.get(&format!("/v1/sms/messages{query}")).send().await.unwrap();
    assert_eq!(response.status(), 200);
    response.json().await.unwrap()
}

fn error_of(body: &str) -> String {
    let parsed: Value = serde_json::from_str(body).unwrap_or_else(|_| panic!("JSON: {body}"));
    parsed["error"].as_str().unwrap_or_else(|| panic!("an error: {body}")).to_owned()
}

#[tokio::test]
async fn signed_messages_are_stored_with_their_codes_and_bad_ones_are_refused() {
    let twilio = FakeTwilio::start(ACCOUNT_SID, AUTH_TOKEN).await;
    let dir = home_with(&sms_config(&twilio, ""));
    write_secrets(dir.path(), "");
    let gateway = Gateway::start_in(dir.path()).await;
    let addr = sms_addr(&gateway).await;
    let health: Value =
        reqwest::get(format!("{}/healthz", gateway.health)).await.unwrap().json().await.unwrap();
    assert_eq!(health["transports"]["sms"]["state"], "running", "{health}");

    let url = format!("{PUBLIC_URL}/webhooks/twilio/sms");
    let params = inbound("SM00000000000000000000000000000001", SERVICE, "Your Acme code is 482913");
    let good = sign(AUTH_TOKEN, &url, &params);

    // Refused, each with a JSON error, and nothing stored.
    let (status, _, body) = post_webhook(&addr, &params, None).await;
    assert_eq!((status, error_of(&body).as_str()), (401, "missing X-Twilio-Signature"));
    let forged = sign("not-the-token", &url, &params);
    let (status, _, body) = post_webhook(&addr, &params, Some(&forged)).await;
    assert_eq!((status, error_of(&body).as_str()), (403, "invalid X-Twilio-Signature"));
    // Signed for the address the gateway sees instead of the public URL.
    let local = sign(AUTH_TOKEN, &format!("http://{addr}/webhooks/twilio/sms"), &params);
    assert_eq!(post_webhook(&addr, &params, Some(&local)).await.0, 403);
    // The right signature replayed with a changed parameter.
    let mut changed = params.clone();
    changed[5].1 = "Your Acme code is 000000".to_owned();
    assert_eq!(post_webhook(&addr, &changed, Some(&good)).await.0, 403);
    let mut extra = params.clone();
    extra.push(("Injected", "1".to_owned()));
    assert_eq!(post_webhook(&addr, &extra, Some(&good)).await.0, 403);
    // Signed, but without a MessageSid.
    let no_sid: Vec<_> =
        params.iter().filter(|(k, _)| !k.ends_with("Sid") || *k == "AccountSid").cloned().collect();
    let (status, _, body) =
        post_webhook(&addr, &no_sid, Some(&sign(AUTH_TOKEN, &url, &no_sid))).await;
    assert_eq!((status, error_of(&body).as_str()), (400, "missing MessageSid"));
    // Not a form, and too large.
    let client = reqwest::Client::new();
    let json_post = client
        .post(format!("http://{addr}/webhooks/twilio/sms"))
        .header("X-Twilio-Signature", &good)
        .json(&json!({"MessageSid": "SM1"}))
        .send()
        .await
        .unwrap();
    assert_eq!(json_post.status(), 415);
    let huge = vec![("Body", "x".repeat(100_000))];
    assert_eq!(post_webhook(&addr, &huge, Some(&good)).await.0, 413);
    assert_eq!(messages(&gateway, "?include_claimed=true").await["count"], 0);

    // Signed as Twilio signs it: stored, its code extracted; Twilio's retry is ignored.
    deliver(&addr, &params).await;
    deliver(&addr, &params).await;
    let mut query_url = params.clone();
    query_url[0].1 = "SM00000000000000000000000000000002".to_owned();
    query_url[5].1 = "Second: 1234 and 567890".to_owned();
    // A webhook URL with a query is signed with it.
    let with_query = format!("{url}?source=acme");
    let signed = sign(AUTH_TOKEN, &with_query, &query_url);
    let response = client
        .post(format!("http://{addr}/webhooks/twilio/sms?source=acme"))
        .header("X-Twilio-Signature", signed)
        .form(&query_url)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let listed = messages(&gateway, "").await;
    assert_eq!(listed["count"], 2, "{listed}");
    let newest = &listed["messages"][0];
    assert_eq!(newest["codes"], json!(["1234", "567890"]), "{listed}");
    let first = &listed["messages"][1];
    assert_eq!(first["message_sid"], "SM00000000000000000000000000000001");
    assert_eq!(first["codes"], json!(["482913"]));
    assert_eq!((first["from"].as_str(), first["to"].as_str()), (Some(SERVICE), Some(INBOX)));
    assert_eq!(messages(&gateway, "?body_contains=Acme").await["count"], 1);
    assert_eq!(messages(&gateway, "?from_contains=7770000&limit=1").await["count"], 1);
    let bad = gateway.get("/v1/sms/messages?limit=0").send().await.unwrap();
    assert_eq!(bad.status(), 400);
    let anonymous = reqwest::get(format!("{}/v1/sms/messages", gateway.api)).await.unwrap();
    assert_eq!(anonymous.status(), 401);

    // One session claims; another is refused; the first may claim again.
    let claim = |session: &str, sid: &str| {
        gateway
            .post(&format!("/v1/sms/messages/{sid}/claim"))
            .json(&json!({ "session": session }))
            .send()
    };
    let sid = "SM00000000000000000000000000000001";
    assert_eq!(claim("agent-a", sid).await.unwrap().status(), 200);
    let refused = claim("agent-b", sid).await.unwrap();
    assert_eq!(refused.status(), 409);
    let body: Value = refused.json().await.unwrap();
    assert!(body["error"].as_str().unwrap().contains("already claimed"), "{body}");
    assert_eq!(claim("agent-a", sid).await.unwrap().status(), 200);
    assert_eq!(claim("agent-a", "SM404").await.unwrap().status(), 404);
    let empty = gateway.post(&format!("/v1/sms/messages/{sid}/claim")).json(&json!({})).send();
    assert_eq!(empty.await.unwrap().status(), 400);
    assert_eq!(messages(&gateway, "").await["count"], 1);
    let claimed = messages(&gateway, "?include_claimed=true&claimed_by=agent-a").await;
    assert_eq!(claimed["count"], 1, "{claimed}");
    assert_eq!(claimed["messages"][0]["claimed_by"], "agent-a");
    // No conversation with a sender who is not allowed: nothing was texted.
    assert!(twilio.requests().is_empty());
    gateway.terminate().await;
}

#[tokio::test]
async fn sms_send_reaches_twilio_through_a_429_and_a_500() {
    let twilio = FakeTwilio::start(ACCOUNT_SID, AUTH_TOKEN).await;
    let dir = home_with(&sms_config(&twilio, ""));
    write_secrets(dir.path(), "");
    let gateway = Gateway::start_in(dir.path()).await;
    twilio.fail_next(&[Failure::TooManyRequests { retry_after_secs: 1 }, Failure::ServerError]);
    let response = gateway
        .post("/v1/sms/send")
        .json(&json!({ "to": FRIEND, "body": "The build is green." }))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let sent: Value = response.json().await.unwrap();
    assert!(sent["sid"].as_str().unwrap().starts_with("SM"), "{sent}");
    let requests = twilio.requests();
    assert_eq!(requests.iter().map(|r| r.status).collect::<Vec<_>>(), [429, 500, 201]);
    for request in &requests {
        assert!(request.authorized, "{request:?}");
        assert_eq!(request.path, format!("/2010-04-01/Accounts/{ACCOUNT_SID}/Messages.json"));
        assert_eq!(request.field("To"), Some(FRIEND));
        assert_eq!(request.field("From"), Some(INBOX));
        assert_eq!(request.field("Body"), Some("The build is green."));
    }

    let send = |body: Value| gateway.post("/v1/sms/send").json(&body).send();
    assert_eq!(send(json!({ "to": "5550001111", "body": "x" })).await.unwrap().status(), 400);
    assert_eq!(send(json!({ "to": FRIEND })).await.unwrap().status(), 400);
    assert_eq!(
        send(json!({ "to": FRIEND, "body": "x".repeat(1601) })).await.unwrap().status(),
        400
    );
    twilio.fail_next(&[Failure::InvalidTo]);
    let refused = send(json!({ "to": FRIEND, "body": "hi" })).await.unwrap();
    assert_eq!(refused.status(), 502);
    let error = error_of(&refused.text().await.unwrap());
    assert!(error.contains("not a valid phone number") && error.contains("21211"), "{error}");
    assert!(!error.contains(AUTH_TOKEN) && !error.contains(ACCOUNT_SID), "{error}");
    gateway.terminate().await;
}

#[tokio::test]
async fn an_sms_conversation_is_answered_by_text_and_not_again_after_a_restart() {
    let twilio = FakeTwilio::start(ACCOUNT_SID, AUTH_TOKEN).await;
    let dir = home_with(&sms_config(&twilio, "reply_to_allowed = true\n"));
    write_secrets(dir.path(), "");
    let gateway = Gateway::start_in(dir.path()).await;
    let addr = sms_addr(&gateway).await;
    let params = inbound("SM0000000000000000000000000000c0de", FRIEND, "what is on today?");
    deliver(&addr, &params).await;
    let answered = twilio.wait_for_requests(1, PATIENCE).await;
    assert_eq!(answered.len(), 1, "{answered:?}");
    assert_eq!(answered[0].field("To"), Some(FRIEND));
    assert_eq!(answered[0].field("From"), Some(INBOX));
    // The echo engine answers with the prompt.
    assert_eq!(answered[0].field("Body"), Some("what is on today?"));
    let session = format!("sms:{FRIEND}");
    let runs: Value = gateway
        .get(&format!("/v1/runs?session_key={}", session.replace('+', "%2B")))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(runs.to_string().contains(&session), "{runs}");
    gateway.terminate().await;

    let mut restarted = command(dir.path());
    restarted.env("LEMON_LOG", "warn");
    let gateway = Gateway::spawn(restarted, dir.path()).await;
    let addr = sms_addr(&gateway).await;
    // Twilio retrying the same message is not a new question.
    deliver(&addr, &params).await;
    // A text sent now comes after anything still owed to that number.
    let marker = gateway
        .post("/v1/sms/send")
        .json(&json!({ "to": FRIEND, "body": "marker" }))
        .send()
        .await
        .unwrap();
    assert_eq!(marker.status(), 200);
    let created = twilio.created();
    let bodies: Vec<_> = created.iter().map(|r| r.field("Body").unwrap().to_owned()).collect();
    assert_eq!(bodies, ["what is on today?", "marker"]);
    gateway.terminate().await;
}

#[tokio::test]
async fn a_native_run_reads_a_code_from_the_inbox_and_claims_it() {
    let twilio = FakeTwilio::start(ACCOUNT_SID, AUTH_TOKEN).await;
    let llm = FakeLlm::builder().api_key("sk-sms-native").start().await;
    let wait = json!({ "timeout_ms": 30000, "from_contains": "7770000" });
    llm.push(Turn::tool_calls(vec![FakeToolCall::new(
        "call_1",
        "sms_wait_for_code",
        &[&wait.to_string()],
    )]));
    llm.push(Turn::text(&["Signed up."]));
    let config = format!(
        "{}{}\n[gateway.engines.lemon]\nbase_url = \"{}\"\nmodel = \"test-model\"\n",
        sms_config(&twilio, ""),
        crate::support::ALLOW_EVERY_CALL,
        llm.base_url()
    );
    let dir = home_with(&config);
    write_secrets(dir.path(), "openai_api_key = \"sk-sms-native\"\n");
    let gateway = Gateway::start_in(dir.path()).await;
    let addr = sms_addr(&gateway).await;
    deliver(&addr, &inbound("SM000000000000000000000000000000aa", SERVICE, "Your code: 318604"))
        .await;
    let run_id = gateway.submit(json!({ "prompt": "sign me up", "session_key": "signup" })).await;
    let run = gateway.wait(&run_id).await;
    assert_eq!(run["answer"], "Signed up.", "{run}");
    let requests = llm.requests();
    assert_eq!(requests.len(), 2, "{requests:?}");
    let tools = requests[0].body.to_string();
    for name in ["sms_wait_for_code", "sms_list_messages", "sms_claim_message", "sms_send"] {
        assert!(tools.contains(name), "{name} offered: {tools}");
    }
    let result = requests[1].body.to_string();
    assert!(result.contains("Code: 318604"), "{result}");
    let claimed = messages(&gateway, "?include_claimed=true").await;
    assert_eq!(claimed["messages"][0]["claimed_by"], "signup", "{claimed}");
    gateway.terminate().await;
}

#[tokio::test]
async fn a_webhook_that_cannot_be_checked_stops_the_start() {
    let twilio = FakeTwilio::start(ACCOUNT_SID, AUTH_TOKEN).await;
    // No auth token anywhere.
    let dir = home_with(&sms_config(&twilio, ""));
    let (code, stderr) = failed_start(dir.path()).await;
    assert_ne!(code, Some(0), "{stderr}");
    assert!(stderr.contains("config.toml:") && stderr.contains("gateway.sms"), "{stderr}");
    assert!(stderr.contains("auth token") && stderr.contains("twilio_auth_token"), "{stderr}");
    // An auth token but no public URL to check signatures over.
    let dir = home_with(&format!(
        "[gateway.sms]\nenabled = true\nport = 0\napi_base_url = \"{}\"\n",
        twilio.url()
    ));
    write_secrets(dir.path(), "");
    let (code, stderr) = failed_start(dir.path()).await;
    assert_ne!(code, Some(0), "{stderr}");
    assert!(stderr.contains("public_url"), "{stderr}");
    assert!(!stderr.contains(AUTH_TOKEN), "{stderr}");
}
