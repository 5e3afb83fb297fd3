//! Tests of the Telegram side of the outbox under paused time: Telegram's
//! limits, what its answers mean, and `sendMessage`/`editMessageText` as
//! made, against a fake bot that records every call with the (virtual) time it
//! was made and can be told to fail. The generic behaviour (order, coalescing,
//! attempts, shutdown) is tested in `delivery/outbox/tests.rs`.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use futures::future::join_all;
use serde_json::json;
use tokio::time::{sleep, Instant};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::{BotSender, DeliveryError, OutboxConfig, OutboxHandle, TelegramSink};
use crate::delivery::outbox::checks::{assert_spaced, just_calls, most_calls_in_any_window};
use crate::delivery::{Failure, Sink, Window};
use crate::telegram::types::{
    EditMessageText, FileKind, FormattedText, Message, MessageEntity, SendFile, SendMessage,
    TelegramError,
};

#[derive(Debug, Clone, PartialEq, Eq)]
enum Call {
    Send { chat_id: i64, text: String },
    Edit { chat_id: i64, message_id: i64, text: String },
    File { chat_id: i64, method: &'static str, filename: String },
}

impl Call {
    fn chat_id(&self) -> i64 {
        match self {
            Call::Send { chat_id, .. }
            | Call::Edit { chat_id, .. }
            | Call::File { chat_id, .. } => *chat_id,
        }
    }
}

/// A bot that records each call and the time it was answered, and fails the
/// next calls to a chat as scripted. Answers come at once unless given a latency.
#[derive(Debug, Default)]
struct FakeBot {
    calls: Mutex<Vec<(Call, Instant)>>,
    failures: Mutex<HashMap<i64, VecDeque<TelegramError>>>,
    next_message_id: AtomicI64,
    /// How long a call takes to be answered.
    latency: Mutex<Duration>,
}

impl FakeBot {
    fn fail_next(&self, chat_id: i64, errors: impl IntoIterator<Item = TelegramError>) {
        self.failures.lock().unwrap().entry(chat_id).or_default().extend(errors);
    }

    fn record(&self, call: Call) -> Result<(), TelegramError> {
        let chat_id = call.chat_id();
        self.calls.lock().unwrap().push((call, Instant::now()));
        match self.failures.lock().unwrap().get_mut(&chat_id).and_then(VecDeque::pop_front) {
            Some(error) => Err(error),
            None => Ok(()),
        }
    }

    fn calls(&self) -> Vec<(Call, Instant)> {
        self.calls.lock().unwrap().clone()
    }

    fn calls_to(&self, chat_id: i64) -> Vec<(Call, Instant)> {
        self.calls().into_iter().filter(|(call, _)| call.chat_id() == chat_id).collect()
    }
}

#[async_trait]
impl BotSender for FakeBot {
    async fn send_message(&self, req: &SendMessage) -> Result<Message, TelegramError> {
        let latency = *self.latency.lock().unwrap();
        sleep(latency).await;
        self.record(Call::Send { chat_id: req.chat_id, text: req.text.clone() })?;
        let message_id = self.next_message_id.fetch_add(1, Ordering::Relaxed) + 100;
        let message = json!({
            "message_id": message_id,
            "chat": { "id": req.chat_id, "type": if req.chat_id < 0 { "group" } else { "private" } },
            "date": 0,
            "text": req.text,
        });
        Ok(serde_json::from_value(message).unwrap())
    }

    async fn edit_message_text(&self, req: &EditMessageText) -> Result<(), TelegramError> {
        let latency = *self.latency.lock().unwrap();
        sleep(latency).await;
        self.record(Call::Edit {
            chat_id: req.chat_id,
            message_id: req.message_id,
            text: req.text.clone(),
        })
    }

    async fn send_file(&self, req: &SendFile) -> Result<Message, TelegramError> {
        self.record(Call::File {
            chat_id: req.chat_id,
            method: req.kind.method(),
            filename: req.filename.clone(),
        })?;
        let message_id = self.next_message_id.fetch_add(1, Ordering::Relaxed) + 100;
        let message = json!({
            "message_id": message_id,
            "chat": { "id": req.chat_id, "type": "private" },
            "date": 0,
        });
        Ok(serde_json::from_value(message).unwrap())
    }
}

struct Harness {
    outbox: OutboxHandle,
    bot: Arc<FakeBot>,
    start: Instant,
}

impl Harness {
    /// Default limits, but calls may start at once (the quiet start has its own test).
    fn new() -> Self {
        Harness::with_config(OutboxConfig::default())
    }

    fn with_config(config: OutboxConfig) -> Self {
        Harness::with_quiet_start(OutboxConfig { quiet_start: Duration::ZERO, ..config })
    }

    fn with_quiet_start(config: OutboxConfig) -> Self {
        let bot = Arc::new(FakeBot::default());
        let outbox =
            OutboxHandle::spawn(bot.clone(), config, CancellationToken::new(), &TaskTracker::new());
        Harness { outbox, bot, start: Instant::now() }
    }

    async fn send(&self, chat_id: i64, text: &str) -> Result<Message, DeliveryError> {
        self.outbox.send(SendMessage::new(chat_id, FormattedText::plain(text))).await
    }

    fn since_start(&self, at: Instant) -> Duration {
        at - self.start
    }
}

fn send(chat_id: i64, text: &str) -> Call {
    Call::Send { chat_id, text: text.to_owned() }
}

fn edit(chat_id: i64, message_id: i64, text: &str) -> Call {
    Call::Edit { chat_id, message_id, text: text.to_owned() }
}

#[tokio::test(start_paused = true)]
async fn calls_to_one_chat_are_at_least_a_second_apart() {
    let h = Harness::new();
    let texts: Vec<String> = (0..5).map(|i| format!("m{i}")).collect();
    let results = join_all(texts.iter().map(|text| h.send(7, text))).await;
    let sent = results.into_iter().collect::<Result<Vec<_>, _>>().unwrap();
    let ids: Vec<i64> = sent.iter().map(|m| m.message_id).collect();
    let message_id = ids[4];
    h.outbox.edit_and_wait(7, message_id, FormattedText::plain("m4 edited")).await.unwrap();

    let calls = h.bot.calls();
    assert_eq!(calls.len(), 6);
    assert_spaced(&calls, Duration::from_secs(1));
    assert_eq!(h.since_start(calls[5].1), Duration::from_secs(5));
}

#[tokio::test(start_paused = true)]
async fn a_group_never_gets_more_than_20_calls_in_a_minute() {
    let h = Harness::new();
    let texts: Vec<String> = (0..45).map(|i| format!("g{i}")).collect();
    let results = join_all(texts.iter().map(|text| h.send(-100, text))).await;
    assert!(results.iter().all(Result::is_ok));

    let times: Vec<Instant> = h.bot.calls().iter().map(|(_, at)| *at).collect();
    assert_eq!(times.len(), 45);
    assert_eq!(most_calls_in_any_window(&times, Duration::from_secs(60)), 20);
    // The 21st call waits for the first to leave the window.
    assert_eq!(h.since_start(times[20]), Duration::from_secs(60));
    // A private chat is not held to the group limit.
    let private: Vec<String> = (0..25).map(|i| format!("p{i}")).collect();
    let start = Instant::now();
    join_all(private.iter().map(|text| h.send(5, text))).await;
    assert_eq!(Instant::now() - start, Duration::from_secs(24));
}

#[tokio::test(start_paused = true)]
async fn many_chats_never_exceed_30_calls_a_second_and_all_are_served() {
    let h = Harness::new();
    let mut sends = Vec::new();
    for round in 0..3 {
        for chat in 1..=40 {
            sends.push((chat, format!("chat {chat} message {round}")));
        }
    }
    let results = join_all(sends.iter().map(|(chat, text)| h.send(*chat, text))).await;
    assert!(results.iter().all(Result::is_ok));

    let calls = h.bot.calls();
    assert_eq!(calls.len(), 120);
    let times: Vec<Instant> = calls.iter().map(|(_, at)| *at).collect();
    assert_eq!(most_calls_in_any_window(&times, Duration::from_secs(1)), 30);
    for chat in 1..=40 {
        let to_chat = h.bot.calls_to(chat);
        assert_eq!(to_chat.len(), 3, "chat {chat}");
        assert_spaced(&to_chat, Duration::from_secs(1));
        // Taking turns: every chat gets its first message within two seconds.
        assert!(h.since_start(to_chat[0].1) < Duration::from_secs(2), "chat {chat} starved");
    }
}

#[tokio::test(start_paused = true)]
async fn an_edit_identical_to_what_is_shown_makes_no_call() {
    let h = Harness::new();
    let message = h.send(7, "hello").await.unwrap();
    h.outbox.edit_and_wait(7, message.message_id, FormattedText::plain("hello")).await.unwrap();
    h.outbox.edit_and_wait(7, message.message_id, FormattedText::plain("world")).await.unwrap();
    h.outbox.edit_and_wait(7, message.message_id, FormattedText::plain("world")).await.unwrap();
    // Same text with other formatting is a change.
    let code = FormattedText {
        text: "world".to_owned(),
        entities: vec![MessageEntity {
            kind: "code".to_owned(),
            offset: 0,
            length: 5,
            language: None,
        }],
    };
    h.outbox.edit_and_wait(7, message.message_id, code).await.unwrap();

    assert_eq!(
        just_calls(&h.bot.calls()),
        [
            send(7, "hello"),
            edit(7, message.message_id, "world"),
            edit(7, message.message_id, "world")
        ]
    );
    assert_eq!(h.outbox.stats().n_skipped_identical, 2);
}

#[tokio::test(start_paused = true)]
async fn not_modified_counts_as_success() {
    let h = Harness::new();
    let message = h.send(7, "a").await.unwrap();
    h.bot.fail_next(7, [TelegramError::NotModified]);
    let result = h.outbox.edit_and_wait(7, message.message_id, FormattedText::plain("b")).await;
    assert_eq!(result, Ok(()));
    // What the message shows is now known: the same edit is skipped.
    h.outbox.edit_and_wait(7, message.message_id, FormattedText::plain("b")).await.unwrap();
    assert_eq!(h.bot.calls().len(), 2);
}

#[tokio::test(start_paused = true)]
async fn rate_limited_chat_waits_retry_after_then_gets_the_message() {
    let h = Harness::new();
    h.bot.fail_next(7, [TelegramError::RetryAfter(Duration::from_secs(5))]);
    let limited = h.send(7, "hello");
    let other = async {
        sleep(Duration::from_secs(1)).await;
        h.send(8, "meanwhile").await
    };
    let (limited, other) = tokio::join!(limited, other);
    assert_eq!(limited.unwrap().text.as_deref(), Some("hello"));
    assert!(other.is_ok());

    let to_chat = h.bot.calls_to(7);
    assert_eq!(just_calls(&to_chat), [send(7, "hello"), send(7, "hello")]);
    assert!(to_chat[1].1 - to_chat[0].1 >= Duration::from_secs(5));
    // Another chat is not held up by the 429.
    assert_eq!(h.since_start(h.bot.calls_to(8)[0].1), Duration::from_secs(1));
    assert_eq!(h.outbox.stats().n_rate_limited, 1);
}

#[tokio::test(start_paused = true)]
async fn a_429_holds_back_edits_of_that_chat_too() {
    let h = Harness::new();
    let message = h.send(7, "a").await.unwrap();
    h.bot.fail_next(7, [TelegramError::RetryAfter(Duration::from_secs(30))]);
    h.outbox.edit(7, message.message_id, FormattedText::plain("b")).await.unwrap();
    sleep(Duration::from_secs(2)).await;
    h.outbox.edit(7, message.message_id, FormattedText::plain("c")).await.unwrap();
    h.outbox.edit_and_wait(7, message.message_id, FormattedText::plain("d")).await.unwrap();

    let calls = h.bot.calls();
    assert_eq!(
        just_calls(&calls),
        [send(7, "a"), edit(7, message.message_id, "b"), edit(7, message.message_id, "d")]
    );
    assert!(calls[2].1 - calls[1].1 >= Duration::from_secs(30));
}

#[tokio::test(start_paused = true)]
async fn server_errors_are_retried_with_growing_backoff() {
    let h = Harness::new();
    h.bot.fail_next(
        7,
        [
            TelegramError::Server { code: 500, description: "Internal".to_owned() },
            TelegramError::Network("connection reset".to_owned()),
        ],
    );
    let message = h.send(7, "hello").await.unwrap();
    assert_eq!(message.text.as_deref(), Some("hello"));

    let calls = h.bot.calls();
    assert_eq!(calls.len(), 3);
    assert!(calls[1].1 - calls[0].1 >= Duration::from_secs(1));
    assert!(calls[2].1 - calls[1].1 >= Duration::from_secs(2));
    assert_eq!(h.outbox.stats().n_retries, 2);
}

#[tokio::test(start_paused = true)]
async fn a_rejected_send_fails_at_once() {
    let h = Harness::new();
    let refusal = TelegramError::Rejected { code: 400, description: "chat not found".to_owned() };
    h.bot.fail_next(7, [refusal.clone()]);
    let result = h.send(7, "hello").await;
    assert_eq!(result, Err(DeliveryError::Failed { attempts: 1, error: refusal }));
    assert_eq!(h.bot.calls().len(), 1);
    assert_eq!(h.outbox.stats().n_failed, 1);
    // The chat keeps working.
    assert!(h.send(7, "again").await.is_ok());
}

#[tokio::test(start_paused = true)]
async fn a_migrated_group_gets_the_message_at_its_new_id() {
    let h = Harness::new();
    h.bot.fail_next(-5, [TelegramError::MigratedTo(-1005)]);
    let (first, second) = tokio::join!(h.send(-5, "one"), h.send(-5, "two"));
    assert_eq!(first.unwrap().chat.id, -1005);
    assert_eq!(second.unwrap().chat.id, -1005);
    h.send(-5, "three").await.unwrap();
    assert_eq!(
        just_calls(&h.bot.calls()),
        [send(-5, "one"), send(-1005, "one"), send(-1005, "two"), send(-1005, "three")]
    );
}

#[tokio::test(start_paused = true)]
async fn files_are_paced_and_moved_like_messages() {
    let h = Harness::new();
    h.bot.fail_next(-5, [TelegramError::MigratedTo(-1005)]);
    let file = |kind, filename: &str| SendFile {
        chat_id: -5,
        kind,
        path: "/nonexistent".into(),
        filename: filename.to_owned(),
        mime: "image/png".to_owned(),
        caption: None,
        message_thread_id: None,
    };
    h.send(-5, "answer").await.unwrap();
    h.outbox.send_file(file(FileKind::Photo, "chart.png")).await.unwrap();
    h.outbox.send_file(file(FileKind::Document, "report.pdf")).await.unwrap();
    let calls = h.bot.calls();
    assert_eq!(
        just_calls(&calls),
        [
            send(-5, "answer"),
            send(-1005, "answer"),
            Call::File { chat_id: -1005, method: "sendPhoto", filename: "chart.png".to_owned() },
            Call::File {
                chat_id: -1005,
                method: "sendDocument",
                filename: "report.pdf".to_owned()
            },
        ]
    );
    assert_spaced(&calls[1..], Duration::from_secs(1));
}

#[tokio::test(start_paused = true)]
async fn a_restarted_outbox_waits_a_chat_interval_before_its_first_call() {
    let h = Harness::with_quiet_start(OutboxConfig::default());
    h.send(7, "after the restart").await.expect("delivered");
    let calls = h.bot.calls();
    assert_eq!(calls.len(), 1);
    assert!(h.since_start(calls[0].1) >= Duration::from_secs(1), "{calls:?}");
}

#[test]
fn telegram_errors_are_classified_as_their_meaning() {
    let sink = TelegramSink::new(Arc::new(FakeBot::default()), &OutboxConfig::default());
    let wait = Duration::from_secs(7);
    let server = TelegramError::Server { code: 502, description: "Bad Gateway".to_owned() };
    let cases = [
        (TelegramError::RetryAfter(wait), Failure::RetryAfter(wait)),
        (TelegramError::NotModified, Failure::AlreadyShown),
        (TelegramError::MigratedTo(-1005), Failure::MovedTo(-1005)),
        (server, Failure::Transient),
        (TelegramError::Network("reset".to_owned()), Failure::Transient),
        (TelegramError::Rejected { code: 400, description: "x".to_owned() }, Failure::Fatal),
        (TelegramError::Unauthorized { description: "x".to_owned() }, Failure::Fatal),
        (TelegramError::Conflict { description: "x".to_owned() }, Failure::Fatal),
        (TelegramError::InvalidBaseUrl("x".to_owned()), Failure::Fatal),
    ];
    for (error, failure) in cases {
        assert_eq!(sink.classify(&error), failure, "{error:?}");
    }
    // Groups (negative ids) have the group cap; private chats none.
    assert_eq!(sink.window(&-100), Some(Window::new(20, Duration::from_secs(60))));
    assert_eq!(sink.window(&100), None);
}
