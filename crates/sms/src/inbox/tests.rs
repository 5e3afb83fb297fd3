//! The inbox's semantics on the memory store: one record per MessageSid, codes,
//! filters, claims, waits (stored first, then FIFO waiters), timeouts and the
//! TTL, under paused time with a clock the tests move.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use lemon_core::testing::within;

use super::*;

const NUMBER: &str = "+15551239999";
const START_MS: i64 = 1_700_000_000_000;

struct Setup {
    inbox: Arc<StoreInbox>,
    now: Arc<AtomicI64>,
}

fn setup_with_ttl(ttl_ms: u64) -> Setup {
    let now = Arc::new(AtomicI64::new(START_MS));
    let clock_now = now.clone();
    let clock: Clock = Arc::new(move || clock_now.load(Ordering::SeqCst));
    let inbox =
        StoreInbox::with_clock(StoreHandle::memory(), Some(NUMBER.to_owned()), ttl_ms, clock);
    Setup { inbox: Arc::new(inbox), now }
}

fn setup() -> Setup {
    setup_with_ttl(24 * 60 * 60 * 1000)
}

impl Setup {
    fn advance(&self, ms: i64) {
        self.now.fetch_add(ms, Ordering::SeqCst);
    }

    async fn receive(&self, sid: &str, from: &str, body: &str) -> Ingested {
        self.receive_to(sid, from, NUMBER, body).await
    }

    async fn receive_to(&self, sid: &str, from: &str, to: &str, body: &str) -> Ingested {
        // Each message a millisecond after the one before, so newest-first is defined.
        self.advance(1);
        let params = form(&[
            ("MessageSid", sid),
            ("AccountSid", "AC00000000000000000000000000000001"),
            ("From", from),
            ("To", to),
            ("Body", body),
        ]);
        self.inbox.ingest(&params).await.unwrap()
    }
}

fn form(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
}

fn session(name: &str) -> SessionKey {
    SessionKey::from(name)
}

fn all() -> ListFilter {
    ListFilter { include_claimed: true, ..ListFilter::default() }
}

fn wait(timeout_ms: u64) -> WaitForCode {
    WaitForCode { timeout: Duration::from_millis(timeout_ms), ..WaitForCode::default() }
}

#[test]
fn codes_are_the_standalone_runs_of_four_to_eight_digits_in_order_without_repeats() {
    assert_eq!(extract_codes("Your code is 123456. Again: 123456"), ["123456"]);
    assert_eq!(extract_codes("1234 then 98765432, not 123 nor 123456789"), ["1234", "98765432"]);
    assert_eq!(extract_codes("G-554433 is your Google code"), ["554433"]);
    assert_eq!(extract_codes("abc12345 12345abc"), Vec::<String>::new());
    assert!(extract_codes("").is_empty());
}

#[tokio::test]
async fn a_message_is_stored_once_per_message_sid() {
    let s = setup();
    let first = s.receive("SM1", "+15550000001", "Code 7777").await;
    let Ingested::Stored(message) = first else { panic!("stored: {first:?}") };
    assert_eq!(message.codes, ["7777"]);
    assert_eq!(message.to, NUMBER);
    assert_eq!(message.account_sid.as_deref(), Some("AC00000000000000000000000000000001"));
    assert_eq!(s.receive("SM1", "+15550000001", "Another 8888").await, Ingested::Duplicate);
    let listed = s.inbox.list_messages(all()).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].body, "Code 7777");
}

#[tokio::test]
async fn malformed_messages_are_refused_and_not_stored() {
    let s = setup();
    let cases = [
        (form(&[("From", "+1555"), ("To", NUMBER)]), IngestError::MissingSid),
        (form(&[("MessageSid", "  "), ("From", "+1555"), ("To", NUMBER)]), IngestError::MissingSid),
        (form(&[("MessageSid", "SM../x"), ("From", "+1555"), ("To", NUMBER)]), IngestError::BadSid),
        (form(&[("MessageSid", "SM2"), ("To", NUMBER)]), IngestError::BadAddress("From")),
        (
            form(&[("MessageSid", "SM3"), ("From", "a\nb"), ("To", NUMBER)]),
            IngestError::BadAddress("From"),
        ),
        (form(&[("MessageSid", "SM4"), ("From", "+1555")]), IngestError::BadAddress("To")),
    ];
    for (params, expected) in cases {
        assert_eq!(s.inbox.ingest(&params).await, Err(expected));
    }
    // The deprecated SmsMessageSid still names a message.
    let params = form(&[("SmsMessageSid", "SM5"), ("From", "GOOGLE"), ("To", NUMBER)]);
    assert!(matches!(s.inbox.ingest(&params).await, Ok(Ingested::Stored(_))));
    assert_eq!(s.inbox.list_messages(all()).await.unwrap().len(), 1);
}

#[tokio::test]
async fn a_stored_code_is_found_claimed_and_then_left_out_of_the_default_list() {
    let s = setup();
    s.receive("SM1", "+15550000001", "Verification: 7777").await;
    let found = s.inbox.wait_for_code(&session("session-a"), wait(2000)).await.unwrap();
    assert_eq!(found.code, "7777");
    assert_eq!(found.message.claimed_by.as_deref(), Some("session-a"));
    assert!(s.inbox.list_messages(ListFilter::default()).await.unwrap().is_empty());
    let listed = s.inbox.list_messages(all()).await.unwrap();
    assert_eq!(listed[0].claimed_by.as_deref(), Some("session-a"));
    // Claimed, it is nobody else's code.
    let again = s.inbox.wait_for_code(&session("session-b"), wait(10)).await;
    assert_eq!(again, Err(SmsError::Timeout));
}

#[tokio::test(start_paused = true)]
async fn a_waiter_gets_the_message_that_arrives_after_it_started() {
    let s = setup();
    let inbox = s.inbox.clone();
    let waiting =
        tokio::spawn(async move { inbox.wait_for_code(&session("session-b"), wait(60_000)).await });
    waiters(&s.inbox, 1).await;
    s.receive("SM1", "+15550000001", "Code: 888888").await;
    let found = within("the waiter", waiting).await.unwrap().unwrap();
    assert_eq!(found.code, "888888");
    assert_eq!(found.message.claimed_by.as_deref(), Some("session-b"));
}

/// Waits until the inbox holds `n` waiters.
async fn waiters(inbox: &StoreInbox, n: usize) {
    within("the waiters", async {
        while inbox.state.lock().await.waiters.len() < n {
            tokio::task::yield_now().await;
        }
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn waiters_are_served_in_the_order_they_started_waiting() {
    let s = setup();
    let mut handles = Vec::new();
    for name in ["first", "second", "third"] {
        let inbox = s.inbox.clone();
        handles.push(tokio::spawn(async move {
            inbox.wait_for_code(&session(name), wait(60_000)).await
        }));
        waiters(&s.inbox, handles.len()).await;
    }
    for (i, code) in ["1111", "2222", "3333"].iter().enumerate() {
        s.receive(&format!("SM{i}"), "+15550000001", &format!("code {code}")).await;
    }
    let mut got = Vec::new();
    for handle in handles {
        let found = within("a waiter", handle).await.unwrap().unwrap();
        got.push((found.message.claimed_by.unwrap(), found.code));
    }
    assert_eq!(
        got,
        [
            ("first".into(), "1111".into()),
            ("second".into(), "2222".into()),
            ("third".into(), "3333".into())
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_message_goes_to_the_first_waiter_whose_filters_match() {
    let s = setup();
    let inbox = s.inbox.clone();
    let picky = tokio::spawn(async move {
        let wait = WaitForCode { from_contains: Some("ACME".into()), ..wait(60_000) };
        inbox.wait_for_code(&session("picky"), wait).await
    });
    waiters(&s.inbox, 1).await;
    let inbox = s.inbox.clone();
    let any = tokio::spawn(async move { inbox.wait_for_code(&session("any"), wait(60_000)).await });
    waiters(&s.inbox, 2).await;
    s.receive("SM1", "+15550000001", "code 4444").await;
    assert_eq!(within("the waiter for any", any).await.unwrap().unwrap().code, "4444");
    s.receive("SM2", "acme-alerts", "code 5555").await;
    let found = within("the picky waiter", picky).await.unwrap().unwrap();
    assert_eq!((found.code.as_str(), found.message.from.as_str()), ("5555", "acme-alerts"));
}

#[tokio::test(start_paused = true)]
async fn a_wait_times_out_and_leaves_later_messages_unclaimed() {
    let s = setup();
    let started = tokio::time::Instant::now();
    let waited = s.inbox.wait_for_code(&session("late"), wait(5_000)).await;
    assert_eq!(waited, Err(SmsError::Timeout));
    assert_eq!(started.elapsed(), Duration::from_secs(5));
    assert!(s.inbox.state.lock().await.waiters.is_empty());
    s.receive("SM1", "+15550000001", "code 9999").await;
    let listed = s.inbox.list_messages(ListFilter::default()).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].claimed_by, None);
}

#[tokio::test(start_paused = true)]
async fn a_waiter_that_went_away_does_not_take_the_message() {
    let s = setup();
    let inbox = s.inbox.clone();
    let gone =
        tokio::spawn(async move { inbox.wait_for_code(&session("gone"), wait(60_000)).await });
    waiters(&s.inbox, 1).await;
    gone.abort();
    let _ = gone.await;
    s.receive("SM1", "+15550000001", "code 1212").await;
    let listed = s.inbox.list_messages(ListFilter::default()).await.unwrap();
    assert_eq!(listed[0].claimed_by, None);
}

#[tokio::test]
async fn without_claim_a_wait_leaves_the_message_for_others() {
    let s = setup();
    s.receive("SM1", "+15550000001", "code 3131").await;
    let peek = WaitForCode { claim: false, ..wait(10) };
    assert_eq!(s.inbox.wait_for_code(&session("a"), peek).await.unwrap().code, "3131");
    let found = s.inbox.wait_for_code(&session("b"), wait(10)).await.unwrap();
    assert_eq!(found.message.claimed_by.as_deref(), Some("b"));
}

#[tokio::test]
async fn waits_default_to_the_inbox_number_and_take_the_newest_stored_message() {
    let s = setup();
    s.receive_to("SM1", "+15550000001", "+15550009999", "code 1000").await;
    s.receive("SM2", "+15550000001", "code 2000").await;
    s.receive("SM3", "+15550000001", "code 3000").await;
    let found = s.inbox.wait_for_code(&session("a"), wait(10)).await.unwrap();
    assert_eq!(found.code, "3000");
    let found = s.inbox.wait_for_code(&session("a"), wait(10)).await.unwrap();
    assert_eq!(found.code, "2000");
    // Sent to another number: only found when asked for.
    assert_eq!(s.inbox.wait_for_code(&session("a"), wait(10)).await, Err(SmsError::Timeout));
    let other = WaitForCode { to: Some("+15550009999".into()), ..wait(10) };
    assert_eq!(s.inbox.wait_for_code(&session("a"), other).await.unwrap().code, "1000");
}

#[tokio::test]
async fn a_regex_takes_its_first_group_or_its_whole_match_and_an_invalid_one_falls_back() {
    let s = setup();
    s.receive("SM1", "+15550000001", "Your login code: AB-12 (valid 10 min), ref 445566").await;
    let grouped =
        WaitForCode { regex: Some(r"code: ([A-Z]{2}-\d+)".into()), claim: false, ..wait(10) };
    assert_eq!(s.inbox.wait_for_code(&session("a"), grouped).await.unwrap().code, "AB-12");
    let whole = WaitForCode { regex: Some(r"[A-Z]{2}-\d+".into()), claim: false, ..wait(10) };
    assert_eq!(s.inbox.wait_for_code(&session("a"), whole).await.unwrap().code, "AB-12");
    let invalid = WaitForCode { regex: Some("([".into()), claim: false, ..wait(10) };
    assert_eq!(s.inbox.wait_for_code(&session("a"), invalid).await.unwrap().code, "445566");
    let none = WaitForCode { regex: Some("nomatch".into()), claim: false, ..wait(10) };
    assert_eq!(s.inbox.wait_for_code(&session("a"), none).await, Err(SmsError::Timeout));
}

#[tokio::test]
async fn one_session_claims_and_another_is_refused_while_the_same_may_claim_again() {
    let s = setup();
    s.receive("SM1", "+15550000001", "code 1234").await;
    s.inbox.claim_message(&session("session-x"), "SM1").await.unwrap();
    assert_eq!(
        s.inbox.claim_message(&session("session-y"), "SM1").await,
        Err(SmsError::AlreadyClaimed { message_sid: "SM1".into() })
    );
    s.inbox.claim_message(&session("session-x"), "SM1").await.unwrap();
    assert_eq!(
        s.inbox.claim_message(&session("session-x"), "SM404").await,
        Err(SmsError::NotFound { message_sid: "SM404".into() })
    );
    // A blank session claims as "unknown".
    s.receive("SM2", "+15550000001", "code 5678").await;
    s.inbox.claim_message(&session(""), "SM2").await.unwrap();
    let listed = s.inbox.list_messages(all()).await.unwrap();
    assert_eq!(listed[0].claimed_by.as_deref(), Some("unknown"));
}

#[tokio::test]
async fn list_filters_select_as_documented() {
    let s = setup();
    s.receive("SM1", "+15550000010", "Alpha 1111").await;
    s.receive("SM2", "+15550000020", "Beta 2222").await;
    s.receive("SM3", "+15550000030", "Gamma 3333").await;
    s.inbox.claim_message(&session("mine"), "SM3").await.unwrap();
    let sids = |messages: Vec<SmsMessage>| -> Vec<String> {
        messages.into_iter().map(|m| m.message_sid).collect()
    };
    let list = |filter: ListFilter| {
        let inbox = s.inbox.clone();
        async move { sids(inbox.list_messages(filter).await.unwrap()) }
    };
    assert_eq!(list(ListFilter::default()).await, ["SM2", "SM1"]);
    assert_eq!(list(all()).await, ["SM3", "SM2", "SM1"]);
    assert_eq!(list(ListFilter { from_contains: Some("0010".into()), ..all() }).await, ["SM1"]);
    assert_eq!(list(ListFilter { body_contains: Some("Beta".into()), ..all() }).await, ["SM2"]);
    assert!(list(ListFilter { body_contains: Some("beta".into()), ..all() }).await.is_empty());
    assert_eq!(list(ListFilter { to: Some(NUMBER.into()), ..all() }).await.len(), 3);
    assert_eq!(list(ListFilter { limit: 1, ..all() }).await, ["SM3"]);
    assert_eq!(list(ListFilter { claimed_by: Some("mine".into()), ..all() }).await, ["SM3"]);
    let since = u64::try_from(START_MS).unwrap() + 2;
    assert_eq!(list(ListFilter { since_ms: Some(since), ..all() }).await, ["SM3", "SM2"]);
}

#[tokio::test]
async fn messages_older_than_the_ttl_are_gone() {
    let s = setup_with_ttl(60_000);
    s.receive("SM1", "+15550000001", "old 1111").await;
    s.advance(30_000);
    s.receive("SM2", "+15550000001", "new 2222").await;
    s.advance(30_000);
    let listed = s.inbox.list_messages(all()).await.unwrap();
    assert_eq!(listed.iter().map(|m| m.message_sid.as_str()).collect::<Vec<_>>(), ["SM2"]);
    assert_eq!(s.inbox.wait_for_code(&session("a"), wait(10)).await.unwrap().code, "2222");
    // Expired, its sid is free again (Twilio never reuses one; nothing is kept forever).
    assert!(matches!(s.receive("SM1", "+15550000001", "again 3333").await, Ingested::Stored(_)));
}
