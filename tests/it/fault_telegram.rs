//! A Bot API that is slow, drops connections, rate-limits and times out, with
//! the real binary polling the fake: the per-chat interval holds at Telegram's
//! end even when a call is delayed on the way, a dropped or rate-limited send
//! is made again and shows once, and a poll that never answers is given up and
//! made again.

use std::time::Duration;

use lemon_tests::fake_telegram::{Call, ChatSpec, Fault};

use crate::support::{Gateway, PATIENCE};
use crate::telegram_e2e::{config, fake_telegram, start, wait_for_reply, USER};

/// The calls of `method` the fake received, in order.
fn calls_to(fake: &lemon_tests::fake_telegram::FakeTelegram, method: &str) -> Vec<Call> {
    fake.calls().into_iter().filter(|call| call.method == method).collect()
}

/// Replies to `message_id` in the user's chat.
fn replies_to(fake: &lemon_tests::fake_telegram::FakeTelegram, message_id: i64) -> usize {
    fake.messages(USER).iter().filter(|m| m.reply_to == Some(message_id)).count()
}

#[tokio::test]
async fn a_slow_call_never_brings_two_calls_to_one_chat_within_a_second_at_telegram() {
    let fake = fake_telegram().await;
    fake.add_chat(&ChatSpec::private(USER));
    let gateway = start(&fake, &config(&fake, "progress_delay_ms = 600000", "")).await;
    // An answer of two parts: two sends to the chat, the first one 400 ms late.
    fake.fail_next("sendMessage", Fault::Delay(Duration::from_millis(400)));
    let prompt = "slow ".repeat(1200);
    let message = fake.inject_text(&ChatSpec::private(USER), USER, prompt.trim_end());
    fake.wait_until("both parts of the answer", PATIENCE, |s| {
        s.messages(USER).iter().filter(|m| m.reply_to == Some(message.message_id)).count() >= 1
            && s.calls_to("sendMessage").iter().filter(|c| c.status == Some(200)).count() >= 2
    })
    .await;
    assert!(
        fake.violations().is_empty(),
        "the fake saw calls closer than its 1 s interval: {:?}\n{}",
        fake.violations(),
        fake.describe_calls()
    );
    gateway.terminate().await;
}

#[tokio::test]
async fn a_dropped_and_a_rate_limited_send_are_made_again_and_show_once() {
    let fake = fake_telegram().await;
    fake.add_chat(&ChatSpec::private(USER));
    let gateway = start(&fake, &config(&fake, "progress_delay_ms = 600000", "")).await;
    fake.fail_next("sendMessage", Fault::Drop);
    fake.fail_next("sendMessage", Fault::RetryAfter(1));
    let message = fake.inject_text(&ChatSpec::private(USER), USER, "once only");
    wait_for_reply(&fake, USER, message.message_id, "once only").await;
    let sends = calls_to(&fake, "sendMessage");
    assert_eq!(sends.len(), 3, "dropped, limited, sent: {}", fake.describe_calls());
    assert_eq!(sends[0].status, None, "the dropped call got no answer");
    assert_eq!(sends[1].status, Some(429));
    assert_eq!(sends[2].status, Some(200));
    // The retry-after was kept: the third call came a second after the second.
    assert!(sends[2].at - sends[1].at >= Duration::from_secs(1), "{}", fake.describe_calls());
    assert_eq!(replies_to(&fake, message.message_id), 1, "{}", fake.describe_calls());
    gateway.terminate().await;
}

#[tokio::test]
async fn a_poll_that_never_answers_is_given_up_and_polled_again() {
    let fake = fake_telegram().await;
    fake.add_chat(&ChatSpec::private(USER));
    // The bot's first poll hangs; its client gives up after the poll timeout
    // and its grace.
    fake.fail_next("getUpdates", Fault::Hang);
    let config = config(&fake, "progress_delay_ms = 600000", "")
        .replace("poll_timeout_s = 5", "poll_timeout_s = 1");
    let gateway: Gateway = start(&fake, &config).await;
    let message = fake.inject_text(&ChatSpec::private(USER), USER, "after the hang");
    wait_for_reply(&fake, USER, message.message_id, "after the hang").await;
    let polls = calls_to(&fake, "getUpdates");
    assert!(polls.len() >= 2, "{}", fake.describe_calls());
    assert_eq!(polls[0].status, None, "the hung poll was never answered");
    assert_eq!(replies_to(&fake, message.message_id), 1);
    gateway.terminate().await;
}
