//! The Telegram Bot API client against the fake Telegram server: what a bot
//! owner would notice (messages shown, edits, waits, errors), and the fake's
//! own rules (offsets, one poller, flood limits).

use std::future::Future;
use std::io;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lemon_tests::fake_telegram::{
    ChatSpec, Command, Enforcement, Entity, FakeTelegram, Fault, LimitKind, RateLimits,
};
use lemon_transports::telegram::api::BotApi;
use lemon_transports::telegram::types::{
    BotCommand, EditMessageText, FormattedText, MessageEntity, ReplyParameters, SendMessage,
    TelegramError,
};
use serde_json::json;

const TOKEN: &str = "4242:AAH-fake_SECRET-token";

/// An entity as the fake parsed it from the wire, in its own type.
fn fake_entity(kind: &str, offset: usize, length: usize) -> Entity {
    Entity {
        kind: kind.to_owned(),
        offset,
        length,
        url: None,
        user: None,
        language: None,
        custom_emoji_id: None,
    }
}

/// The commands as the fake should have read them off the wire.
fn fake_commands(commands: &[BotCommand]) -> Vec<Command> {
    commands
        .iter()
        .map(|c| Command { command: c.command.clone(), description: c.description.clone() })
        .collect()
}
/// A part of the token that no other text would contain by chance.
const TOKEN_SECRET: &str = "fake_SECRET";
const BOT_ID: i64 = 4242;
const BOT_NAME: &str = "lemon_test_bot";
const USER: i64 = 1_001;
/// Failure guard for anything awaited; tests never wait this long when they pass.
const PATIENCE: Duration = Duration::from_secs(20);

/// A fake without flood limits, for tests of everything else.
async fn start() -> (FakeTelegram, BotApi) {
    let fake = FakeTelegram::builder()
        .bot(TOKEN, BOT_ID, BOT_NAME)
        .rate_limits(RateLimits::off())
        .start()
        .await;
    let api = BotApi::new(&fake.base_url(), TOKEN).unwrap();
    (fake, api)
}

/// A fake whose flood-limit clock moves only when the test says so.
async fn start_with_manual_clock(limits: RateLimits) -> (FakeTelegram, BotApi) {
    let fake = FakeTelegram::builder()
        .bot(TOKEN, BOT_ID, BOT_NAME)
        .rate_limits(limits)
        .manual_clock()
        .start()
        .await;
    let api = BotApi::new(&fake.base_url(), TOKEN).unwrap();
    (fake, api)
}

async fn within<T>(what: &str, future: impl Future<Output = T>) -> T {
    tokio::time::timeout(PATIENCE, future)
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
}

fn text(chat_id: i64, text: &str) -> SendMessage {
    SendMessage::new(chat_id, FormattedText::plain(text))
}

fn edit(chat_id: i64, message_id: i64, text: &str) -> EditMessageText {
    EditMessageText::new(chat_id, message_id, FormattedText::plain(text))
}

fn assert_rejected(result: Result<impl std::fmt::Debug, TelegramError>, code: u16, needle: &str) {
    match result {
        Err(TelegramError::Rejected { code: got, description }) => {
            assert_eq!(got, code, "{description}");
            assert!(description.contains(needle), "{description:?} should contain {needle:?}");
        }
        other => panic!("expected a {code} rejection containing {needle:?}, got {other:?}"),
    }
}

fn assert_no_token(text: &str) {
    assert!(!text.contains(TOKEN) && !text.contains(TOKEN_SECRET), "the token leaked: {text}");
}

// ---- The client ----

#[tokio::test]
async fn get_me_names_the_bot() {
    let (_fake, api) = start().await;
    let me = api.get_me().await.unwrap();
    assert_eq!(me.id, BOT_ID);
    assert!(me.is_bot);
    assert_eq!(me.username.as_deref(), Some(BOT_NAME));
}

#[tokio::test]
async fn a_sent_message_shows_its_edited_text() {
    let (fake, api) = start().await;
    let chat = ChatSpec::private(USER);
    fake.add_chat(&chat);

    let sent = api.send_message(&text(USER, "working…")).await.unwrap();
    assert_eq!(sent.chat.id, USER);
    assert_eq!(sent.chat.kind, "private");
    assert_eq!(sent.text.as_deref(), Some("working…"));
    assert_eq!(sent.from.as_ref().map(|u| u.id), Some(BOT_ID));

    api.edit_message_text(&edit(USER, sent.message_id, "done: 42")).await.unwrap();

    let messages = fake.messages(USER);
    assert_eq!(messages.len(), 1);
    assert_eq!(messages[0].message_id, sent.message_id);
    assert_eq!(messages[0].text, "done: 42");
    assert_eq!(messages[0].versions, ["working…", "done: 42"]);
    assert_eq!(messages[0].edits, 1);
}

#[tokio::test]
async fn an_identical_edit_is_not_modified_and_changes_nothing() {
    let (fake, api) = start().await;
    fake.add_chat(&ChatSpec::private(USER));
    let sent = api.send_message(&text(USER, "same")).await.unwrap();

    let again = api.edit_message_text(&edit(USER, sent.message_id, "same")).await;

    assert_eq!(again, Err(TelegramError::NotModified));
    assert_eq!(fake.messages(USER)[0].edits, 0);
}

#[tokio::test]
async fn changing_only_the_formatting_is_an_edit() {
    let (fake, api) = start().await;
    fake.add_chat(&ChatSpec::private(USER));
    let sent = api.send_message(&text(USER, "run ls")).await.unwrap();

    let mut formatted = edit(USER, sent.message_id, "run ls");
    formatted.entities =
        vec![MessageEntity { kind: "code".into(), offset: 4, length: 2, language: None }];
    api.edit_message_text(&formatted).await.unwrap();

    let message = &fake.messages(USER)[0];
    assert_eq!(message.edits, 1);
    assert_eq!(message.entities, [fake_entity("code", 4, 2)]);
}

#[tokio::test]
async fn an_injected_429_asks_to_wait_and_the_next_call_passes() {
    let (fake, api) = start().await;
    fake.add_chat(&ChatSpec::private(USER));
    fake.fail_next("sendMessage", Fault::RetryAfter(2));

    let limited = api.send_message(&text(USER, "hello")).await;
    assert_eq!(limited, Err(TelegramError::RetryAfter(Duration::from_secs(2))));
    assert!(fake.messages(USER).is_empty());

    api.send_message(&text(USER, "hello")).await.unwrap();
    assert_eq!(fake.messages(USER).len(), 1);
}

#[tokio::test]
async fn server_errors_are_retryable_with_or_without_json() {
    let (fake, api) = start().await;
    fake.add_chat(&ChatSpec::private(USER));
    fake.fail_next("sendMessage", Fault::Status(500, "Internal Server Error".into()));
    fake.fail_next("sendMessage", Fault::NonJson(502));

    let first = api.send_message(&text(USER, "hello")).await.unwrap_err();
    assert_eq!(
        first,
        TelegramError::Server { code: 500, description: "Internal Server Error".into() }
    );
    assert!(first.is_retryable());

    let second = api.send_message(&text(USER, "hello")).await.unwrap_err();
    assert!(matches!(second, TelegramError::Server { code: 502, .. }), "{second:?}");
    assert!(second.is_retryable());

    let statuses: Vec<_> = fake.calls().iter().map(|c| c.status).collect();
    assert_eq!(statuses, [Some(500), Some(502)]);
}

#[tokio::test]
async fn a_group_upgraded_to_a_supergroup_names_the_new_chat() {
    let (fake, api) = start().await;
    fake.add_chat(&ChatSpec::group(-4_001));
    fake.fail_next("sendMessage", Fault::MigrateTo(-1_009_999));

    let moved = api.send_message(&text(-4_001, "hi")).await;

    assert_eq!(moved, Err(TelegramError::MigratedTo(-1_009_999)));
}

#[tokio::test]
async fn an_unknown_token_is_unauthorized() {
    let (fake, _api) = start().await;
    let stranger = BotApi::new(&fake.base_url(), "999:not-a-known-token").unwrap();

    let error = stranger.get_me().await.unwrap_err();

    assert!(matches!(error, TelegramError::Unauthorized { .. }), "{error:?}");
    assert!(!error.is_retryable());
}

#[tokio::test]
async fn texts_are_measured_in_utf16_code_units() {
    let (fake, api) = start().await;
    fake.add_chat(&ChatSpec::private(USER));

    // 4096 code units pass; 2049 emoji are 2049 characters but 4098 code units.
    api.send_message(&text(USER, &"a".repeat(4096))).await.unwrap();
    let too_long = api.send_message(&text(USER, &"😀".repeat(2049))).await;

    assert_rejected(too_long, 400, "message is too long");
    assert_eq!(fake.messages(USER).len(), 1);
}

#[tokio::test]
async fn blank_texts_and_entities_past_the_end_are_rejected() {
    let (fake, api) = start().await;
    fake.add_chat(&ChatSpec::private(USER));

    assert_rejected(api.send_message(&text(USER, " \n ")).await, 400, "message text is empty");

    // "😀x" is three code units long: an entity over code units 1..4 ends past it.
    let mut past_the_end = text(USER, "😀x");
    past_the_end.entities =
        vec![MessageEntity { kind: "bold".into(), offset: 1, length: 3, language: None }];
    assert_rejected(api.send_message(&past_the_end).await, 400, "can't parse entities");

    let mut inside = text(USER, "😀x");
    inside.entities =
        vec![MessageEntity { kind: "bold".into(), offset: 0, length: 3, language: None }];
    api.send_message(&inside).await.unwrap();
}

#[tokio::test]
async fn edits_of_messages_the_bot_did_not_send_are_rejected() {
    let (fake, api) = start().await;
    let chat = ChatSpec::private(USER);
    let from_user = fake.inject_text(&chat, USER, "hi");

    assert_rejected(
        api.edit_message_text(&edit(USER, 987_654, "x")).await,
        400,
        "message to edit not found",
    );
    assert_rejected(
        api.edit_message_text(&edit(USER, from_user.message_id, "x")).await,
        400,
        "message can't be edited",
    );
}

#[tokio::test]
async fn messages_to_unknown_chats_are_rejected() {
    let (_fake, api) = start().await;
    assert_rejected(api.send_message(&text(31_337, "hi")).await, 400, "chat not found");
}

#[tokio::test]
async fn a_reply_quotes_the_message_it_answers_and_users_can_reply_to_the_bot() {
    let (fake, api) = start().await;
    let chat = ChatSpec::supergroup(-1_000_777);
    let question = fake.inject_text(&chat, USER, "what is 6*7?");

    let mut answer = text(chat.id, "thinking");
    answer.reply_parameters = Some(ReplyParameters {
        message_id: question.message_id,
        allow_sending_without_reply: true,
    });
    let sent = api.send_message(&answer).await.unwrap();
    let quoted = sent.reply_to_message.as_deref().unwrap();
    assert_eq!(quoted.message_id, question.message_id);
    assert_eq!(quoted.text.as_deref(), Some("what is 6*7?"));
    assert_eq!(fake.messages(chat.id)[0].reply_to, Some(question.message_id));

    api.edit_message_text(&edit(chat.id, sent.message_id, "42")).await.unwrap();
    let follow_up = fake.inject_reply(&chat, USER, "why?", sent.message_id);

    let updates = api.get_updates(None, Duration::ZERO, 100).await.unwrap();
    let reply = updates
        .iter()
        .find(|u| u.update_id == follow_up.update_id)
        .and_then(|u| u.message.as_ref())
        .unwrap();
    let replied_to = reply.reply_to_message.as_deref().unwrap();
    assert_eq!(replied_to.message_id, sent.message_id);
    assert_eq!(replied_to.text.as_deref(), Some("42"), "the quote shows the current text");
    assert!(replied_to.from.as_ref().is_some_and(|u| u.is_bot && u.id == BOT_ID));
}

#[tokio::test]
async fn replying_to_a_missing_message_needs_permission() {
    let (fake, api) = start().await;
    fake.add_chat(&ChatSpec::private(USER));
    let mut reply = text(USER, "answer");
    reply.reply_parameters =
        Some(ReplyParameters { message_id: 424_242, allow_sending_without_reply: false });
    assert_rejected(api.send_message(&reply).await, 400, "message to be replied not found");

    reply.reply_parameters =
        Some(ReplyParameters { message_id: 424_242, allow_sending_without_reply: true });
    let sent = api.send_message(&reply).await.unwrap();
    assert_eq!(sent.reply_to_message, None);
}

#[tokio::test]
async fn forum_topics_carry_their_thread_and_the_general_topic_takes_none() {
    let (fake, api) = start().await;
    let topic = ChatSpec::forum_topic(-1_000_500, 77);
    let injected = fake.inject_text(&topic, USER, "/status now");

    let updates = api.get_updates(None, Duration::ZERO, 100).await.unwrap();
    let message = updates[0].message.as_ref().unwrap();
    assert_eq!(updates[0].update_id, injected.update_id);
    assert_eq!(message.message_thread_id, Some(77));
    assert!(message.is_topic_message);
    assert!(message.chat.is_forum);
    // Telegram shows a topic message as a reply to the topic's first message.
    assert_eq!(message.reply_to_message.as_ref().map(|m| m.message_id), Some(77));
    assert_eq!(
        message.entities,
        [MessageEntity { kind: "bot_command".into(), offset: 0, length: 7, language: None }]
    );

    let mut in_topic = text(topic.id, "ok");
    in_topic.message_thread_id = Some(77);
    let sent = api.send_message(&in_topic).await.unwrap();
    assert_eq!(sent.message_thread_id, Some(77));
    assert_eq!(fake.messages(topic.id)[0].message_thread_id, Some(77));

    in_topic.message_thread_id = Some(1);
    assert_rejected(api.send_message(&in_topic).await, 400, "message thread not found");
    in_topic.message_thread_id = Some(78);
    assert_rejected(api.send_message(&in_topic).await, 400, "message thread not found");
}

#[tokio::test]
async fn channel_posts_and_photos_arrive_as_messages_without_text() {
    let (fake, api) = start().await;
    let photo = fake.inject_photo(&ChatSpec::private(USER), USER, Some("look"));
    let post = fake.inject_text(&ChatSpec::channel(-1_000_321), USER, "news");

    let updates = api.get_updates(None, Duration::ZERO, 100).await.unwrap();

    assert_eq!(updates.len(), 2);
    let photo_message = updates[0].message.as_ref().unwrap();
    assert_eq!(
        (updates[0].update_id, photo_message.message_id),
        (photo.update_id, photo.message_id)
    );
    assert_eq!(photo_message.text, None);
    assert_eq!(photo_message.caption.as_deref(), Some("look"));
    assert!(!photo_message.photo.is_empty());
    let channel_post = updates[1].channel_post.as_ref().unwrap();
    assert_eq!(updates[1].update_id, post.update_id);
    assert_eq!(channel_post.from, None);
    assert_eq!(channel_post.chat.kind, "channel");
}

#[tokio::test]
async fn commands_and_webhook_deletion() {
    let (fake, api) = start().await;
    let commands = vec![
        BotCommand { command: "cancel".into(), description: "Stop the running answer".into() },
        BotCommand { command: "new".into(), description: "Start a new conversation".into() },
    ];

    api.delete_webhook().await.unwrap();
    api.set_my_commands(&commands).await.unwrap();
    assert_eq!(fake.commands(), fake_commands(&commands));

    let invalid = [BotCommand { command: "Bad-Name".into(), description: "x".into() }];
    assert_rejected(api.set_my_commands(&invalid).await, 400, "BOT_COMMAND_INVALID");
    assert_eq!(fake.commands(), fake_commands(&commands));

    let delete = fake.calls().into_iter().find(|c| c.method == "deleteWebhook").unwrap();
    assert_eq!(delete.params["drop_pending_updates"], json!(false));
}

// ---- Long polling ----

#[tokio::test]
async fn a_long_poll_returns_a_message_as_soon_as_it_arrives() {
    let (fake, api) = start().await;
    let poll = tokio::spawn({
        let api = api.clone();
        async move { api.get_updates(None, Duration::from_secs(30), 100).await }
    });
    fake.wait_until("the long poll to be waiting", PATIENCE, |s| s.waiting_polls() == 1).await;

    let injected = fake.inject_text(&ChatSpec::private(USER), USER, "hello");
    let updates = within("the long poll to return", poll).await.unwrap().unwrap();

    assert_eq!(updates.len(), 1);
    assert_eq!(updates[0].update_id, injected.update_id);
    assert_eq!(updates[0].message.as_ref().and_then(|m| m.text.as_deref()), Some("hello"));
    let call = &fake.calls()[0];
    assert_eq!(call.params["timeout"], json!(30));
    assert_eq!(
        call.params["allowed_updates"],
        json!(["message", "edited_message", "channel_post", "callback_query"])
    );
}

#[tokio::test]
async fn an_offset_confirms_updates_for_good() {
    let (fake, api) = start().await;
    let chat = ChatSpec::private(USER);
    let first = fake.inject_text(&chat, USER, "one");
    let second = fake.inject_text(&chat, USER, "two");

    let all = api.get_updates(None, Duration::ZERO, 100).await.unwrap();
    assert_eq!(
        all.iter().map(|u| u.update_id).collect::<Vec<_>>(),
        [first.update_id, second.update_id]
    );

    let rest = api.get_updates(Some(first.update_id + 1), Duration::ZERO, 100).await.unwrap();
    assert_eq!(rest.iter().map(|u| u.update_id).collect::<Vec<_>>(), [second.update_id]);
    assert_eq!(fake.confirmed_offset(), first.update_id + 1);

    // Asking again from an older offset does not bring a confirmed update back.
    let again = api.get_updates(Some(first.update_id), Duration::ZERO, 100).await.unwrap();
    assert_eq!(again.iter().map(|u| u.update_id).collect::<Vec<_>>(), [second.update_id]);
    assert_eq!(fake.pending_updates().len(), 1);
}

#[tokio::test]
async fn a_limit_bounds_the_batch() {
    let (fake, api) = start().await;
    let chat = ChatSpec::private(USER);
    let ids: Vec<i64> =
        (0..5).map(|i| fake.inject_text(&chat, USER, &format!("m{i}")).update_id).collect();

    let batch = api.get_updates(None, Duration::ZERO, 2).await.unwrap();

    assert_eq!(batch.iter().map(|u| u.update_id).collect::<Vec<_>>(), ids[..2]);
}

#[tokio::test]
async fn a_second_poller_ends_the_first_with_a_conflict() {
    let (fake, api) = start().await;
    let first = tokio::spawn({
        let api = api.clone();
        async move { api.get_updates(None, Duration::from_secs(30), 100).await }
    });
    fake.wait_until("the first poll to be waiting", PATIENCE, |s| s.waiting_polls() == 1).await;
    let second = tokio::spawn({
        let api = api.clone();
        async move { api.get_updates(None, Duration::from_secs(30), 100).await }
    });

    let first = within("the first poll to end", first).await.unwrap();
    assert!(
        matches!(&first, Err(TelegramError::Conflict { description }) if description.contains("terminated by other getUpdates request")),
        "{first:?}"
    );

    fake.wait_until("only the second poll to be waiting", PATIENCE, |s| {
        s.waiting_polls() == 1 && s.calls_to("getUpdates").len() == 2
    })
    .await;
    let injected = fake.inject_text(&ChatSpec::private(USER), USER, "still here");
    let second = within("the second poll to return", second).await.unwrap().unwrap();
    assert_eq!(second[0].update_id, injected.update_id);
}

#[tokio::test]
async fn shutting_the_fake_down_ends_an_open_poll() {
    let (fake, api) = start().await;
    let poll = tokio::spawn({
        let api = api.clone();
        async move { api.get_updates(None, Duration::from_secs(30), 100).await }
    });
    fake.wait_until("the long poll to be waiting", PATIENCE, |s| s.waiting_polls() == 1).await;

    within("the fake to stop", fake.shutdown()).await;

    let ended = within("the poll to end", poll).await.unwrap();
    assert!(matches!(ended.as_deref(), Ok([]) | Err(TelegramError::Network(_))), "{ended:?}");
}

/// Log lines written while a test runs on this thread.
#[derive(Clone, Default)]
struct CapturedLogs(Arc<Mutex<Vec<u8>>>);

impl io::Write for CapturedLogs {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl CapturedLogs {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

#[tokio::test]
async fn a_malformed_update_keeps_its_id_so_the_offset_moves_past_it() {
    let (fake, api) = start().await;
    let broken = fake.inject_raw(json!({
        "message": { "message_id": "not a number", "chat": { "id": USER, "type": "private" } }
    }));
    let fine = fake.inject_text(&ChatSpec::private(USER), USER, "after");

    let logs = CapturedLogs::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer({
            let logs = logs.clone();
            move || logs.clone()
        })
        .with_max_level(tracing::Level::DEBUG)
        .with_ansi(false)
        .finish();
    let updates = {
        let _default = tracing::subscriber::set_default(subscriber);
        api.get_updates(None, Duration::ZERO, 100).await.unwrap()
    };

    assert_eq!(updates.iter().map(|u| u.update_id).collect::<Vec<_>>(), [broken, fine.update_id]);
    assert_eq!(updates[0].message, None);
    assert_eq!(updates[1].message.as_ref().and_then(|m| m.text.as_deref()), Some("after"));

    let logs = logs.text();
    assert!(logs.contains("does not parse") && logs.contains(&broken.to_string()), "{logs}");
    assert_no_token(&logs);

    let after = api.get_updates(Some(fine.update_id + 1), Duration::ZERO, 100).await.unwrap();
    assert!(after.is_empty());
}

// ---- Secrets ----

#[tokio::test]
async fn errors_and_debug_output_never_contain_the_token() {
    // A port that was just free: connecting to it is refused.
    let closed = {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        listener.local_addr().unwrap()
    };
    let unreachable = BotApi::new(&format!("http://{closed}"), TOKEN).unwrap();
    let network = unreachable.get_me().await.unwrap_err();
    assert!(matches!(network, TelegramError::Network(_)), "{network:?}");
    assert_no_token(&format!("{network} {network:?} {unreachable:?}"));

    let (fake, api) = start().await;
    fake.add_chat(&ChatSpec::private(USER));
    fake.fail_next("getMe", Fault::Status(500, "Internal Server Error".into()));
    fake.fail_next("getMe", Fault::NonJson(502));
    let mut errors = vec![
        api.get_me().await.unwrap_err(),
        api.get_me().await.unwrap_err(),
        api.send_message(&text(USER, "")).await.unwrap_err(),
        api.edit_message_text(&edit(USER, 1, "x")).await.unwrap_err(),
    ];
    errors.push(BotApi::new(&fake.base_url(), "1:wrong").unwrap().get_me().await.unwrap_err());
    for error in &errors {
        assert_no_token(&format!("{error} {error:?}"));
    }
    assert_no_token(&format!("{fake:?} {api:?}"));
    assert_no_token(&fake.describe_calls());
    assert_no_token(&format!("{:?}", fake.calls()));
}

// ---- The fake's flood limits ----

#[tokio::test]
async fn a_burst_in_one_chat_is_answered_429_and_recorded() {
    // The clock stands still, so the second call is always too soon.
    let (fake, api) = start_with_manual_clock(RateLimits::telegram()).await;
    fake.add_chat(&ChatSpec::private(USER));

    api.send_message(&text(USER, "one")).await.unwrap();
    let second = api.send_message(&text(USER, "two")).await;

    assert_eq!(second, Err(TelegramError::RetryAfter(Duration::from_secs(1))));
    let violations = fake.violations();
    assert_eq!(violations.len(), 1);
    assert_eq!(
        (violations[0].method.as_str(), violations[0].chat_id, violations[0].kind),
        ("sendMessage", USER, LimitKind::ChatInterval)
    );
    assert_eq!(fake.messages(USER).len(), 1);
}

#[tokio::test]
async fn ten_chats_at_once_stay_within_the_limits() {
    let fake = FakeTelegram::start(&[(TOKEN, BOT_ID, BOT_NAME)]).await;
    let api = BotApi::new(&fake.base_url(), TOKEN).unwrap();
    for chat in 1..=10 {
        fake.add_chat(&ChatSpec::private(chat));
    }

    let sends = (1..=10).map(|chat| {
        let api = api.clone();
        async move { api.send_message(&text(chat, "answer")).await }
    });
    let results = within("ten sends", futures::future::join_all(sends)).await;

    assert!(results.iter().all(Result::is_ok), "{results:?}");
    assert!(fake.violations().is_empty(), "{:?}", fake.violations());
    assert!((1..=10).all(|chat| fake.messages(chat).len() == 1));
}

#[tokio::test]
async fn calls_to_one_chat_a_second_apart_pass() {
    let (fake, api) = start_with_manual_clock(RateLimits::telegram()).await;
    fake.add_chat(&ChatSpec::private(USER));

    let sent = api.send_message(&text(USER, "step 1")).await.unwrap();
    fake.advance_clock(Duration::from_millis(999));
    let early = api.edit_message_text(&edit(USER, sent.message_id, "step 2")).await;
    assert_eq!(early, Err(TelegramError::RetryAfter(Duration::from_secs(1))));
    fake.advance_clock(Duration::from_millis(1));
    api.edit_message_text(&edit(USER, sent.message_id, "step 2")).await.unwrap();
    fake.advance_clock(Duration::from_secs(1));
    api.edit_message_text(&edit(USER, sent.message_id, "step 3")).await.unwrap();

    assert_eq!(fake.messages(USER)[0].versions, ["step 1", "step 2", "step 3"]);
    assert_eq!(fake.violations().len(), 1);
    assert_eq!(fake.violations()[0].method, "editMessageText");
}

#[tokio::test]
async fn a_group_gets_twenty_messages_a_minute() {
    let (fake, api) = start_with_manual_clock(RateLimits::telegram()).await;
    let group = -1_000_123;
    fake.add_chat(&ChatSpec::supergroup(group));

    for i in 0..20 {
        api.send_message(&text(group, &format!("m{i}"))).await.unwrap();
        fake.advance_clock(Duration::from_secs(1));
    }
    // 20 s in, the first message leaves the window 40 s from now.
    let over = api.send_message(&text(group, "m20")).await;
    assert_eq!(over, Err(TelegramError::RetryAfter(Duration::from_secs(40))));
    assert_eq!(fake.violations()[0].kind, LimitKind::GroupPerMinute);

    fake.advance_clock(Duration::from_secs(40));
    api.send_message(&text(group, "m20")).await.unwrap();
    assert_eq!(fake.messages(group).len(), 21);
}

#[tokio::test]
async fn thirty_messages_a_second_overall() {
    let (fake, api) = start_with_manual_clock(RateLimits::telegram()).await;
    for chat in 1..=31 {
        fake.add_chat(&ChatSpec::private(chat));
    }
    for chat in 1..=30 {
        api.send_message(&text(chat, "hi")).await.unwrap();
    }

    let over = api.send_message(&text(31, "hi")).await;
    assert_eq!(over, Err(TelegramError::RetryAfter(Duration::from_secs(1))));
    assert_eq!(fake.violations()[0].kind, LimitKind::OverallPerSecond);

    fake.advance_clock(Duration::from_secs(1));
    api.send_message(&text(31, "hi")).await.unwrap();
}

#[tokio::test]
async fn limits_can_be_recorded_without_refusing_or_switched_off() {
    let record_only = RateLimits { enforcement: Enforcement::RecordOnly, ..RateLimits::telegram() };
    let (fake, api) = start_with_manual_clock(record_only).await;
    fake.add_chat(&ChatSpec::private(USER));
    api.send_message(&text(USER, "one")).await.unwrap();
    api.send_message(&text(USER, "two")).await.unwrap();
    assert_eq!(fake.violations().len(), 1);
    assert_eq!(fake.messages(USER).len(), 2);

    let (fake, api) = start_with_manual_clock(RateLimits::off()).await;
    fake.add_chat(&ChatSpec::private(USER));
    api.send_message(&text(USER, "one")).await.unwrap();
    api.send_message(&text(USER, "two")).await.unwrap();
    assert!(fake.violations().is_empty());
}

#[tokio::test]
async fn form_encoded_calls_are_understood() {
    let (fake, _api) = start().await;
    fake.add_chat(&ChatSpec::private(USER));
    let url = format!("{}/bot{TOKEN}/sendMessage", fake.base_url());

    let answer: serde_json::Value = reqwest::Client::new()
        .post(url)
        .form(&[("chat_id", USER.to_string()), ("text", "from a form".to_owned())])
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();

    assert_eq!(answer["ok"], json!(true), "{answer}");
    assert_eq!(fake.messages(USER)[0].text, "from a form");
}

#[tokio::test]
async fn unknown_methods_and_paths_are_not_found() {
    let (fake, _api) = start().await;
    let http = reqwest::Client::new();
    for path in [format!("/bot{TOKEN}/noSuchMethod"), "/favicon.ico".to_owned()] {
        let response = http.post(format!("{}{path}", fake.base_url())).send().await.unwrap();
        assert_eq!(response.status().as_u16(), 404);
        let body: serde_json::Value = response.json().await.unwrap();
        assert_eq!(body, json!({"ok": false, "error_code": 404, "description": "Not Found"}));
    }
}
