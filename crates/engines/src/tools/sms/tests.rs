//! Every message of the `sms_*` tools, over a fake inbox that keeps the
//! inbox's semantics (FIFO waiters, timeouts) under paused time.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use lemon_core::ids::SessionKey;
use lemon_core::sms::{CodeMatch, ListFilter, SmsError, SmsInbox, SmsMessage, WaitForCode as Wait};
use lemon_core::testing::within;
use lemon_core::tool::{Tool, ToolContext, ToolOutput};
use serde_json::{json, Value};
use tokio::sync::oneshot;

use super::super::testutil::Dirs;
use super::super::{gateway_tools, GatewayToolOptions};

const NUMBER: &str = "+15551239999";

struct Waiter {
    session: String,
    wait: Wait,
    reply: oneshot::Sender<CodeMatch>,
}

#[derive(Default)]
struct State {
    messages: Vec<SmsMessage>,
    waiters: VecDeque<Waiter>,
}

/// An inbox in memory.
#[derive(Default)]
struct FakeInbox {
    number: Option<String>,
    state: Mutex<State>,
    /// Never answers a wait (an inbox that hangs).
    hang: bool,
    /// Every call fails.
    broken: bool,
}

impl std::fmt::Debug for FakeInbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeInbox").finish_non_exhaustive()
    }
}

fn codes(body: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for found in regex::Regex::new(r"\b\d{4,8}\b").unwrap().find_iter(body) {
        if !out.iter().any(|c| c == found.as_str()) {
            out.push(found.as_str().to_owned());
        }
    }
    out
}

fn message(sid: &str, from: &str, body: &str, at: u64) -> SmsMessage {
    SmsMessage {
        message_sid: sid.to_owned(),
        account_sid: Some("AC1".to_owned()),
        to: NUMBER.to_owned(),
        from: from.to_owned(),
        body: body.to_owned(),
        codes: codes(body),
        received_at_ms: at,
        claimed_by: None,
        claimed_at_ms: None,
    }
}

/// The code `wait` takes from `m`, if `m` matches it.
fn code_for(m: &SmsMessage, wait: &Wait, number: Option<&str>) -> Option<String> {
    let to = wait.to.as_deref().or(number);
    let matches = m.claimed_by.is_none()
        && wait.since_ms.is_none_or(|since| m.received_at_ms >= since)
        && to.is_none_or(|to| m.to == to)
        && wait
            .from_contains
            .as_deref()
            .is_none_or(|f| m.from.to_lowercase().contains(&f.to_lowercase()))
        && wait.body_contains.as_deref().is_none_or(|b| m.body.contains(b));
    if !matches {
        return None;
    }
    match wait.regex.as_deref().and_then(|r| regex::Regex::new(r).ok()) {
        Some(re) => re.find(&m.body).map(|found| found.as_str().to_owned()),
        None => m.codes.first().cloned(),
    }
}

impl FakeInbox {
    fn with_number() -> Self {
        FakeInbox { number: Some(NUMBER.to_owned()), ..FakeInbox::default() }
    }

    fn ingest(&self, mut m: SmsMessage) {
        let mut state = self.state.lock().unwrap();
        let position = state
            .waiters
            .iter()
            .position(|w| code_for(&m, &w.wait, self.number.as_deref()).is_some());
        if let Some(waiter) = position.and_then(|i| state.waiters.remove(i)) {
            let code = code_for(&m, &waiter.wait, self.number.as_deref()).unwrap();
            if waiter.wait.claim {
                m.claimed_by = Some(waiter.session.clone());
                m.claimed_at_ms = Some(m.received_at_ms);
            }
            let _ = waiter.reply.send(CodeMatch { code, message: m.clone() });
        }
        state.messages.push(m);
    }

    fn waiting(&self) -> usize {
        self.state.lock().unwrap().waiters.len()
    }

    fn claimed_by(&self, sid: &str) -> Option<String> {
        let state = self.state.lock().unwrap();
        state.messages.iter().find(|m| m.message_sid == sid).and_then(|m| m.claimed_by.clone())
    }
}

#[async_trait]
impl SmsInbox for FakeInbox {
    fn inbox_number(&self) -> Option<String> {
        self.number.clone()
    }

    async fn wait_for_code(&self, session: &SessionKey, wait: Wait) -> Result<CodeMatch, SmsError> {
        if self.broken {
            return Err(SmsError::Unavailable("the inbox store is closed".to_owned()));
        }
        if self.hang {
            std::future::pending::<()>().await;
        }
        let rx = {
            let mut state = self.state.lock().unwrap();
            let number = self.number.as_deref();
            let mut newest_first: Vec<usize> = (0..state.messages.len()).collect();
            newest_first.sort_by_key(|i| std::cmp::Reverse(state.messages[*i].received_at_ms));
            if let Some((i, code)) = newest_first
                .into_iter()
                .find_map(|i| code_for(&state.messages[i], &wait, number).map(|c| (i, c)))
            {
                if wait.claim {
                    state.messages[i].claimed_by = Some(session.to_string());
                    state.messages[i].claimed_at_ms = Some(1);
                }
                return Ok(CodeMatch { code, message: state.messages[i].clone() });
            }
            let (reply, rx) = oneshot::channel();
            let timeout = wait.timeout;
            state.waiters.push_back(Waiter { session: session.to_string(), wait, reply });
            (rx, timeout)
        };
        match tokio::time::timeout(rx.1, rx.0).await {
            Ok(Ok(found)) => Ok(found),
            _ => Err(SmsError::Timeout),
        }
    }

    async fn list_messages(&self, filter: ListFilter) -> Result<Vec<SmsMessage>, SmsError> {
        let state = self.state.lock().unwrap();
        let mut out: Vec<SmsMessage> = state
            .messages
            .iter()
            .filter(|m| filter.include_claimed || m.claimed_by.is_none())
            .filter(|m| filter.claimed_by.as_ref().is_none_or(|s| m.claimed_by.as_ref() == Some(s)))
            .filter(|m| filter.from_contains.as_deref().is_none_or(|f| m.from.contains(f)))
            .filter(|m| filter.body_contains.as_deref().is_none_or(|b| m.body.contains(b)))
            .cloned()
            .collect();
        out.sort_by_key(|m| std::cmp::Reverse(m.received_at_ms));
        out.truncate(filter.limit);
        Ok(out)
    }

    async fn claim_message(&self, session: &SessionKey, sid: &str) -> Result<(), SmsError> {
        let mut state = self.state.lock().unwrap();
        let Some(m) = state.messages.iter_mut().find(|m| m.message_sid == sid) else {
            return Err(SmsError::NotFound { message_sid: sid.to_owned() });
        };
        match &m.claimed_by {
            Some(owner) if owner != session.as_str() => {
                Err(SmsError::AlreadyClaimed { message_sid: sid.to_owned() })
            }
            _ => {
                m.claimed_by = Some(session.to_string());
                Ok(())
            }
        }
    }
}

fn tool(inbox: Option<Arc<FakeInbox>>, name: &str) -> Arc<dyn Tool> {
    let sms = inbox.map(|inbox| inbox as Arc<dyn SmsInbox>);
    let options = GatewayToolOptions { sms, ..GatewayToolOptions::default() };
    gateway_tools(&options).into_iter().find(|tool| tool.spec().name == name).unwrap()
}

fn ctx(session: &str) -> ToolContext {
    Dirs::new().ctx_for(session)
}

async fn call(inbox: &Arc<FakeInbox>, name: &str, session: &str, args: Value) -> ToolOutput {
    within(name, tool(Some(inbox.clone()), name).execute(args, ctx(session))).await
}

#[tokio::test]
async fn without_an_inbox_every_sms_tool_says_sms_is_not_configured() {
    let number = tool(None, "sms_get_inbox_number").execute(json!({}), ctx("s")).await;
    assert!(number.is_error);
    assert_eq!(
        number.text,
        "SMS inbox number is not configured. Set TWILIO_INBOX_NUMBER (E.164, e.g. +15551234567)."
    );
    for name in ["sms_wait_for_code", "sms_list_messages", "sms_claim_message"] {
        let out = tool(None, name).execute(json!({"message_sid": "SM1"}), ctx("s")).await;
        assert!(out.is_error, "{name}");
        assert_eq!(out.text, "SMS is not configured on this gateway: no inbox receives messages.");
        assert_eq!(out.details["error"], true);
    }
    // An inbox without a number answers the same as none for the number.
    let inbox = Arc::new(FakeInbox::default());
    let out = call(&inbox, "sms_get_inbox_number", "s", json!({})).await;
    assert!(out.is_error && out.text.starts_with("SMS inbox number is not configured."));
}

#[tokio::test]
async fn the_inbox_number_is_text_and_details() {
    let inbox = Arc::new(FakeInbox::with_number());
    let out = call(&inbox, "sms_get_inbox_number", "s", json!({})).await;
    assert!(!out.is_error);
    assert_eq!(out.text, NUMBER);
    assert_eq!(out.details, json!({"inbox_number": NUMBER}));
}

#[tokio::test(start_paused = true)]
async fn a_stored_code_is_returned_and_claimed_for_the_session() {
    let inbox = Arc::new(FakeInbox::with_number());
    inbox.ingest(message("SM1", "+15550000010", "Verification: 7777", 1_000));
    let out = call(&inbox, "sms_wait_for_code", "session-a", json!({"timeout_ms": 2000})).await;
    assert!(!out.is_error, "{out:?}");
    assert_eq!(
        out.text,
        "Code: 7777\nFrom: +15550000010\nTo: +15551239999\nMessageSid: SM1\nReceivedAtMs: 1000"
    );
    assert_eq!(out.details["code"], "7777");
    assert_eq!(out.details["message"]["message_sid"], "SM1");
    assert_eq!(out.details["message"]["claimed_by"], "session-a");
    assert_eq!(out.details["message"]["codes"], json!(["7777"]));

    let none = call(&inbox, "sms_list_messages", "session-a", json!({})).await;
    assert_eq!(none.text, "No messages.");
    assert_eq!(none.details, json!({"count": 0, "messages": []}));
    let claimed =
        call(&inbox, "sms_list_messages", "session-a", json!({"include_claimed": "yes"})).await;
    assert_eq!(
        claimed.text,
        "Messages: 1\n1. MessageSid=SM1 From=+15550000010 To=+15551239999 ReceivedAtMs=1000 Codes=[7777] ClaimedBy=session-a Body=\"Verification: 7777\""
    );
    assert_eq!(claimed.details["count"], 1);
}

#[tokio::test(start_paused = true)]
async fn waiters_are_served_in_order_and_time_out_alone() {
    let inbox = Arc::new(FakeInbox::with_number());
    let first = tokio::spawn({
        let inbox = inbox.clone();
        async move {
            call(&inbox, "sms_wait_for_code", "session-a", json!({"timeout_ms": "60000"})).await
        }
    });
    within("the first waiter", async {
        while inbox.waiting() < 1 {
            tokio::task::yield_now().await;
        }
    })
    .await;
    let second = tokio::spawn({
        let inbox = inbox.clone();
        async move { call(&inbox, "sms_wait_for_code", "session-b", json!({"timeout_ms": 5000})).await }
    });
    within("the second waiter", async {
        while inbox.waiting() < 2 {
            tokio::task::yield_now().await;
        }
    })
    .await;

    inbox.ingest(message("SM2", "+15550000011", "Code: 888888", 2_000));
    let out = within("the first answer", first).await.unwrap();
    assert!(out.text.starts_with("Code: 888888\n"), "{}", out.text);
    assert_eq!(inbox.claimed_by("SM2").as_deref(), Some("session-a"));
    assert_eq!(inbox.waiting(), 1, "the second waiter still waits");

    // Nothing more arrives: the second waiter times out.
    let out = within("the second answer", second).await.unwrap();
    assert!(out.is_error);
    assert_eq!(out.text, "Timed out waiting for an SMS code.");
    assert_eq!(out.details, json!({"timeout": true, "error": true}));
}

#[tokio::test(start_paused = true)]
async fn filters_regex_and_claim_false_are_passed_to_the_inbox() {
    let inbox = Arc::new(FakeInbox::with_number());
    inbox.ingest(message("SM1", "+15550000010", "Alpha code 1111 ref 22222", 1_000));
    inbox.ingest(message("SM2", "+15550000020", "Beta code 3333", 2_000));
    let out = call(
        &inbox,
        "sms_wait_for_code",
        "s",
        json!({"from_contains": "0010", "regex": "ref \\d+", "claim": "no", "timeout_ms": 10}),
    )
    .await;
    assert!(out.text.starts_with("Code: ref 22222\n"), "{}", out.text);
    assert_eq!(inbox.claimed_by("SM1"), None, "claim false leaves it unclaimed");
    let beta = call(&inbox, "sms_wait_for_code", "s", json!({"body_contains": "Beta"})).await;
    assert!(beta.text.starts_with("Code: 3333\n"), "{}", beta.text);
    let late =
        call(&inbox, "sms_wait_for_code", "s", json!({"since_ms": 5000, "timeout_ms": 10})).await;
    assert_eq!(late.text, "Timed out waiting for an SMS code.");
    let bad = call(&inbox, "sms_wait_for_code", "s", json!({"claim": "perhaps"})).await;
    assert_eq!(bad.text, "claim must be a boolean");
}

#[tokio::test(start_paused = true)]
async fn an_inbox_that_never_answers_is_bounded_and_a_failing_one_is_reported() {
    let hanging = Arc::new(FakeInbox { hang: true, ..FakeInbox::with_number() });
    let out = call(&hanging, "sms_wait_for_code", "s", json!({"timeout_ms": 1000})).await;
    assert_eq!(out.text, "Timed out waiting for an SMS code.");
    assert_eq!(out.details["timeout"], true);

    let broken = Arc::new(FakeInbox { broken: true, ..FakeInbox::with_number() });
    let out = call(&broken, "sms_wait_for_code", "s", json!({})).await;
    assert_eq!(out.text, "Failed waiting for an SMS code: the inbox store is closed");

    let cancelled = ctx("s");
    cancelled.cancel.cancel();
    let out = tool(Some(hanging), "sms_wait_for_code").execute(json!({}), cancelled).await;
    assert_eq!(out.text, "The run was cancelled while waiting for an SMS code.");
}

#[tokio::test]
async fn listing_filters_bounds_and_previews() {
    let inbox = Arc::new(FakeInbox::with_number());
    inbox.ingest(message("SM1", "+15550000010", "Alpha 1234", 1_000));
    inbox.ingest(message("SM2", "+15550000020", &format!("Beta {}", "y".repeat(300)), 2_000));
    inbox.ingest(message("SM3", "+15550000030", "Gamma 5678 5678 9012", 3_000));
    let out = call(&inbox, "sms_list_messages", "me", json!({"limit": 2})).await;
    let lines: Vec<&str> = out.text.lines().collect();
    assert_eq!(lines[0], "Messages: 2");
    assert!(
        lines[1].starts_with("1. MessageSid=SM3 ")
            && lines[1].contains("Codes=[5678, 9012] ClaimedBy=nil"),
        "{}",
        lines[1]
    );
    assert!(lines[2].starts_with("2. MessageSid=SM2 "), "{}", lines[2]);
    let preview = format!("Body=\"Beta {}...\"", "y".repeat(195));
    assert!(lines[2].ends_with(&preview), "{}", lines[2]);

    let alpha = call(&inbox, "sms_list_messages", "me", json!({"body_contains": "Alpha"})).await;
    assert_eq!(alpha.details["count"], 1);
    assert_eq!(alpha.details["messages"][0]["message_sid"], "SM1");

    call(&inbox, "sms_claim_message", "me", json!({"message_sid": "SM1"})).await;
    call(&inbox, "sms_claim_message", "other", json!({"message_sid": "SM2"})).await;
    let mine = call(
        &inbox,
        "sms_list_messages",
        "me",
        json!({"include_claimed": true, "only_mine": true}),
    )
    .await;
    assert_eq!(mine.details["count"], 1);
    assert_eq!(mine.details["messages"][0]["message_sid"], "SM1");
    let unclaimed = call(&inbox, "sms_list_messages", "me", json!({})).await;
    assert_eq!(unclaimed.details["count"], 1);
    assert_eq!(unclaimed.details["messages"][0]["message_sid"], "SM3");
}

#[tokio::test]
async fn claiming_is_exclusive_per_session_and_every_refusal_has_its_text() {
    let inbox = Arc::new(FakeInbox::with_number());
    inbox.ingest(message("SM1", "+15550000010", "Code 4444", 1_000));
    let out = call(&inbox, "sms_claim_message", "session-x", json!({"message_sid": " SM1 "})).await;
    assert!(!out.is_error);
    assert_eq!(out.text, "Claimed message: SM1");
    assert_eq!(out.details, json!({"ok": true, "message_sid": "SM1"}));
    let other = call(&inbox, "sms_claim_message", "session-y", json!({"message_sid": "SM1"})).await;
    assert!(other.is_error);
    assert_eq!(other.text, "Message is already claimed: SM1");
    let again = call(&inbox, "sms_claim_message", "session-x", json!({"message_sid": "SM1"})).await;
    assert_eq!(again.text, "Claimed message: SM1");
    let missing =
        call(&inbox, "sms_claim_message", "session-x", json!({"message_sid": "SM9"})).await;
    assert_eq!(missing.text, "Message not found: SM9");
    let no_sid = call(&inbox, "sms_claim_message", "session-x", json!({})).await;
    assert_eq!(no_sid.text, "Missing required parameter: message_sid");
    let no_session = call(&inbox, "sms_claim_message", " ", json!({"message_sid": "SM1"})).await;
    assert_eq!(no_session.text, "sms_claim_message requires a session key (internal).");
    let broken = Arc::new(FakeInbox { broken: false, ..FakeInbox::with_number() });
    let out = call(&broken, "sms_claim_message", "s", json!({"message_sid": 5})).await;
    assert_eq!(out.text, "message_sid must be a string");
}
