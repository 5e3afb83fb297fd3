//! A Discord REST API that fails, flood-limits, drops connections and goes
//! quiet, with the real binary as its bot: every answer shows once, the
//! waits Discord asks for are kept (read from the fake's own clock), no
//! bucket or global limit is broken, `/metrics` counts what the outbox did,
//! and the bot answers the next message. A create that timed out is made
//! again with the same nonce, which Discord (and the fake) answers with the
//! message already made.

use std::time::Duration;

use lemon_tests::fake_discord::{Call, FakeDiscord, FakeMessage, Fault, Snapshot};

use crate::discord_e2e::{assert_within_limits, config, fake, home, replies, start_in, DM, USER};
use crate::fault_support::outbox_calls;
use crate::support::{Gateway, PATIENCE};

/// A bot with `discord_extra` in its section, serving, its slash commands
/// registered (so the calls that follow are the answers').
async fn serving(fake: &FakeDiscord, discord_extra: &str) -> (Gateway, tempfile::TempDir) {
    let home = home(&config(fake, discord_extra, ""));
    let gateway = start_in(fake, home.path()).await;
    fake.wait_until("the slash commands", PATIENCE, |s| s.commands().len() == 4).await;
    (gateway, home)
}

/// The message creates in the DM so far.
fn creates(fake: &FakeDiscord) -> Vec<Call> {
    let path = format!("/channels/{DM}/messages");
    fake.calls().into_iter().filter(|c| c.method == "POST" && c.path == path).collect()
}

/// Asks `prompt` in the DM and waits for the whole answer; the message and
/// the creates its answer took.
async fn ask(fake: &FakeDiscord, prompt: &str) -> (FakeMessage, Vec<Call>) {
    let before = creates(fake).len();
    let asked = fake.inject_message(DM, USER, prompt, false, None);
    // The resume line comes with the whole answer (it names the session's first
    // run), in whichever of the replies the answer went to.
    let answered = |s: &Snapshot<'_>| {
        s.bot_messages(DM)
            .into_iter()
            .find(|m| m.reply_to == Some(asked.id) && m.content.contains("`echo resume dc_"))
            .cloned()
    };
    fake.wait_until(&format!("the answer to {prompt:?}"), PATIENCE, |s| answered(s).is_some())
        .await;
    let answer = fake.snapshot(answered).unwrap();
    assert!(answer.content.starts_with(prompt), "{}", answer.content);
    assert_eq!(replies(fake, DM, &asked), 1, "one answer\n{}", fake.describe());
    (asked, creates(fake).split_off(before))
}

/// The answer of the next message comes as usual: one create, answered.
async fn answers_the_next_message(fake: &FakeDiscord) {
    let (_, made) = ask(fake, "and the next one").await;
    assert_eq!(made.len(), 1, "{}", fake.describe());
    assert!(made[0].answered && made[0].applied, "{}", fake.describe());
}

fn statuses(calls: &[Call]) -> Vec<u16> {
    calls.iter().map(|c| c.status).collect()
}

#[tokio::test]
async fn a_create_answered_502_is_made_again_and_the_answer_shows_once() {
    let fake = fake().await;
    let (gateway, _home) = serving(&fake, "").await;
    fake.fail_next("/messages", Fault::Status(502));
    let (_, made) = ask(&fake, "through a bad gateway").await;
    assert_eq!(statuses(&made), [502, 200], "{}", fake.describe());
    assert!(made[1].at - made[0].at >= Duration::from_secs(1), "backed off: {}", fake.describe());
    outbox_calls(&gateway, "discord", |c| c.sent >= 1 && c.retried == 1 && c.failed == 0).await;
    answers_the_next_message(&fake).await;
    assert_within_limits(&fake);
}

#[tokio::test]
async fn a_429_of_a_route_and_a_global_one_are_waited_out_then_the_answer_shows_once() {
    let fake = fake().await;
    let (gateway, _home) = serving(&fake, "").await;

    fake.fail_next("/messages", Fault::RateLimited { retry_after: 1.2, global: false });
    let (_, made) = ask(&fake, "through a bucket's limit").await;
    assert_eq!(statuses(&made), [429, 200], "{}", fake.describe());
    assert!(made[1].at - made[0].at >= Duration::from_millis(1200), "{}", fake.describe());

    fake.fail_next("/messages", Fault::RateLimited { retry_after: 1.5, global: true });
    let (_, made) = ask(&fake, "through the global limit").await;
    assert_eq!(statuses(&made), [429, 200], "{}", fake.describe());
    // A global limit holds back every call, not only the one it answered.
    let limited = made[0].at;
    let calls = fake.calls();
    let next = calls.iter().find(|c| c.at > limited).expect("calls after the 429");
    assert!(next.at - limited >= Duration::from_millis(1500), "{}", fake.describe());

    let counted = outbox_calls(&gateway, "discord", |c| c.rate_limited == 2 && c.sent >= 2).await;
    assert_eq!((counted.retried, counted.failed), (0, 0), "{counted:?}");
    answers_the_next_message(&fake).await;
    assert_within_limits(&fake);
}

#[tokio::test]
async fn a_dropped_connection_is_made_again_and_a_slow_answer_is_waited_for_both_show_once() {
    let fake = fake().await;
    let (gateway, _home) = serving(&fake, "").await;
    fake.fail_next("/messages", Fault::Drop);
    let (_, made) = ask(&fake, "through a dropped connection").await;
    assert_eq!(made.len(), 2, "{}", fake.describe());
    assert!(!made[0].answered && !made[0].applied, "{:?}", made[0]);
    assert!(made[1].answered && made[1].applied, "{:?}", made[1]);

    // Slow, but well inside the call's timeout: one call, no retry.
    fake.fail_next("/messages", Fault::Delay(Duration::from_millis(700)));
    let (_, made) = ask(&fake, "through a slow network").await;
    assert_eq!(statuses(&made), [200], "{}", fake.describe());

    let counted = outbox_calls(&gateway, "discord", |c| c.retried == 1 && c.sent >= 2).await;
    assert_eq!(counted.failed, 0, "{counted:?}");
    answers_the_next_message(&fake).await;
    assert_within_limits(&fake);
}

#[tokio::test]
async fn a_create_that_times_out_is_made_again_with_its_nonce_and_shows_once() {
    let fake = fake().await;
    // The call timeout, short so that the test does not wait 30 s for it.
    let (gateway, _home) = serving(&fake, "api_timeout_ms = 1000").await;

    // Discord made the message and its answer never came: the create made
    // again carries the same nonce and gets that message back.
    fake.fail_next("/messages", Fault::Hang { applied: true });
    let (asked, made) = ask(&fake, "made, then silence").await;
    assert_eq!(made.len(), 2, "{}", fake.describe());
    assert!(!made[0].answered && made[0].applied, "{:?}", made[0]);
    assert!(made[1].answered && !made[1].applied, "answered with the first: {:?}", made[1]);
    assert!(made[1].at - made[0].at >= Duration::from_secs(1), "{}", fake.describe());
    assert_eq!(made[0].nonce, made[1].nonce, "{}", fake.describe());
    assert_eq!(fake.snapshot(|s| s.nonce_hits()), 1);
    assert_eq!(fake.bot_messages(DM).len(), 1, "one message, edited to the answer");
    assert_eq!(replies(&fake, DM, &asked), 1);

    // The call never got that far: made again, and made once.
    fake.fail_next("/messages", Fault::Hang { applied: false });
    let (_, made) = ask(&fake, "silence, never made").await;
    assert_eq!(made.len(), 2, "{}", fake.describe());
    assert!(!made[0].answered && !made[0].applied, "{:?}", made[0]);
    assert!(made[1].answered && made[1].applied, "{:?}", made[1]);
    assert_eq!(fake.snapshot(|s| s.nonce_hits()), 1);

    // Every create carries an enforced nonce, one of its own.
    let all = creates(&fake);
    assert!(all.iter().all(|c| matches!(&c.nonce, Some((_, true)))), "{}", fake.describe());
    let mut nonces: Vec<_> = all.iter().filter_map(|c| c.nonce.clone()).collect();
    nonces.dedup();
    assert_eq!(nonces.len(), 2, "the retries reused theirs: {}", fake.describe());

    let counted = outbox_calls(&gateway, "discord", |c| c.retried == 2 && c.sent >= 2).await;
    assert_eq!(counted.failed, 0, "{counted:?}");
    answers_the_next_message(&fake).await;
    assert_within_limits(&fake);
}
