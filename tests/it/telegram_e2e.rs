//! Telegram end to end: the real gateway binary polling a fake Bot API server
//! in this process, with the echo engine and the fake Claude Code CLI.

use std::time::Duration;

use lemon_tests::fake_telegram::{BotMessage, ChatSpec, FakeTelegram, Fault, Snapshot};
use serde_json::{json, Value};

use crate::support::{home_with, Gateway, PATIENCE};

pub(crate) const BOT_TOKEN: &str = "424242:test-bot-token-5f1e";
pub(crate) const BOT_ID: i64 = 424_242;
pub(crate) const BOT_NAME: &str = "lemon_test_bot";
pub(crate) const USER: i64 = 1001;

pub(crate) async fn fake_telegram() -> FakeTelegram {
    FakeTelegram::start(&[(BOT_TOKEN, BOT_ID, BOT_NAME)]).await
}

/// A config with the bot enabled against `fake`, plus `extra` TOML. Only
/// [`USER`]'s private chat is allowed unless `telegram_extra` sets
/// `allowed_chat_ids` (or `allow_everyone`) itself: an empty list lets nobody in.
pub(crate) fn config(fake: &FakeTelegram, telegram_extra: &str, extra: &str) -> String {
    let allowed = if telegram_extra.contains("allowed_chat_ids")
        || telegram_extra.contains("allow_everyone")
    {
        String::new()
    } else {
        format!("allowed_chat_ids = [{USER}]\n")
    };
    format!(
        "[gateway]\nenable_telegram = true\n{extra}\n\
         [gateway.telegram]\nbot_token = \"{BOT_TOKEN}\"\napi_base_url = \"{}\"\npoll_timeout_s = 5\n{allowed}{telegram_extra}\n",
        fake.base_url()
    )
}

fn echo_delay(ms: u64) -> String {
    format!("[gateway.engines.echo]\ndelay_ms = {ms}\n")
}

/// Starts the gateway and waits until the bot registered its commands (it polls next).
pub(crate) async fn start(fake: &FakeTelegram, config: &str) -> Gateway {
    let gateway = Gateway::start(config).await;
    fake.wait_until("the bot's commands", PATIENCE, |s| s.commands().len() == 4).await;
    gateway
}

/// The bot's message in `chat` that replies to `message_id` with text containing `needle`.
fn reply_containing<'a>(
    s: &Snapshot<'a>,
    chat: i64,
    message_id: i64,
    needle: &str,
) -> Option<&'a BotMessage> {
    s.messages(chat).into_iter().find(|m| m.reply_to == Some(message_id) && m.text.contains(needle))
}

pub(crate) async fn wait_for_reply(
    fake: &FakeTelegram,
    chat: i64,
    message_id: i64,
    needle: &str,
) -> BotMessage {
    let what = format!("a reply to message {message_id} in chat {chat} containing {needle:?}");
    fake.wait_until(&what, PATIENCE, |s| reply_containing(s, chat, message_id, needle).is_some())
        .await;
    fake.snapshot(|s| reply_containing(s, chat, message_id, needle).cloned()).expect("found")
}

fn assert_no_flood(fake: &FakeTelegram) {
    let violations = fake.violations();
    assert!(
        violations.is_empty(),
        "flood limits broken: {violations:?}\n{}",
        fake.describe_calls()
    );
}

fn code_entities(message: &BotMessage) -> Vec<String> {
    let units: Vec<u16> = message.text.encode_utf16().collect();
    message
        .entities
        .iter()
        .filter(|e| e.kind == "code")
        .map(|e| String::from_utf16_lossy(&units[e.offset..e.offset + e.length]))
        .collect()
}

#[tokio::test]
async fn a_message_shows_progress_edits_then_the_answer_with_its_resume_line() {
    let fake = fake_telegram().await;
    let fixture =
        format!("{}/fixtures/cli/claude/synth_tool_use_success.jsonl", env!("CARGO_MANIFEST_DIR"));
    let claude = format!(
        "[gateway.engines.claude]\ncli_path = \"{}\"\nenv = {{ FAKE_CLI_FIXTURE = \"{fixture}\", FAKE_CLI_LINE_DELAY_MS = \"1500\" }}\n",
        env!("CARGO_BIN_EXE_fake-cli")
    );
    let gateway = start(&fake, &config(&fake, "engine = \"claude\"", &claude)).await;
    let commands: Vec<String> = fake.commands().into_iter().map(|c| c.command).collect();
    assert_eq!(commands, ["cancel", "new", "status", "engine"]);

    let chat = ChatSpec::private(USER);
    let asked = fake.inject_text(&chat, USER, "how many tests?");
    let answer = wait_for_reply(&fake, USER, asked.message_id, "There are 2 test files.").await;
    assert_eq!(
        code_entities(&answer),
        ["claude --resume 5b1c7a52-8f0e-4d7b-9c1a-2f3e4d5c6b7a"],
        "the resume line is code: {answer:?}"
    );

    let progress = fake
        .messages(USER)
        .into_iter()
        .find(|m| m.reply_to == Some(asked.message_id) && m.message_id != answer.message_id)
        .expect("a progress message");
    // The answer goes ahead of the last progress edit, which follows within the chat's pace.
    fake.wait_until("the progress message says done", PATIENCE, |s| {
        s.message(USER, progress.message_id).is_some_and(|m| m.text.starts_with("Done."))
    })
    .await;
    let progress = fake.snapshot(|s| s.message(USER, progress.message_id).cloned()).unwrap();
    assert!(progress.versions[0].starts_with("Running…"), "{:?}", progress.versions);
    assert!(progress.edits >= 2, "progress was edited as the run went: {:?}", progress.versions);
    assert!(
        progress
            .versions
            .iter()
            .any(|v| v.contains("read: `/home/dev/proj/test/a_test.exs`: running")),
        "an action is shown while it runs: {:?}",
        progress.versions
    );
    let last = progress.versions.last().unwrap();
    assert!(last.starts_with("Done."), "{last}");
    assert!(progress.sent_at < answer.sent_at);
    assert_no_flood(&fake);

    let runs = gateway.get("/v1/runs").send().await.unwrap().json::<Value>().await.unwrap();
    let run = &runs["runs"][0];
    assert_eq!(run["session_key"], format!("agent:default:telegram:{BOT_ID}:dm:{USER}"));
    assert_eq!(run["engine"], "claude");
}

#[tokio::test]
async fn ten_chats_at_once_stay_within_telegrams_limits() {
    let fake = fake_telegram().await;
    let chats: Vec<String> =
        (0..10i64).map(|n| if n % 2 == 0 { 2000 + n } else { -100_000 - n }.to_string()).collect();
    let allowed = format!("allowed_chat_ids = [{}]", chats.join(", "));
    let _gateway = start(&fake, &config(&fake, &allowed, &echo_delay(120))).await;
    let mut asked = Vec::new();
    for n in 0..10i64 {
        let chat = if n % 2 == 0 {
            ChatSpec::private(2000 + n)
        } else {
            ChatSpec::supergroup(-100_000 - n)
        };
        let text = format!("chat {n} says one two three four five six seven eight");
        let message = fake.inject_text(&chat, 2000 + n, &text);
        asked.push((chat.id, message.message_id, text));
    }
    for (chat, message_id, text) in &asked {
        let answer = wait_for_reply(&fake, *chat, *message_id, text).await;
        assert!(answer.text.starts_with(text.as_str()), "{}", answer.text);
    }
    assert_no_flood(&fake);
}

#[tokio::test]
async fn a_server_error_and_a_429_are_waited_out_and_the_answer_still_arrives() {
    let fake = fake_telegram().await;
    let _gateway = start(&fake, &config(&fake, "", "")).await;
    fake.fail_next("sendMessage", Fault::Status(502, "Bad Gateway".into()));
    fake.fail_next("sendMessage", Fault::RetryAfter(2));
    let asked = fake.inject_text(&ChatSpec::private(USER), USER, "patience pays");
    wait_for_reply(&fake, USER, asked.message_id, "patience pays").await;
    let sends: Vec<_> =
        fake.calls().into_iter().filter(|c| c.method == "sendMessage").collect::<Vec<_>>();
    let refused = sends.iter().position(|c| c.status == Some(429)).expect("one send got 429");
    assert!(sends[..refused].iter().any(|c| c.status == Some(502)), "{}", fake.describe_calls());
    let retried = &sends[refused + 1];
    assert_eq!(retried.status, Some(200));
    assert!(
        retried.at.duration_since(sends[refused].at) >= Duration::from_secs(2),
        "the retry waited retry_after: {}",
        fake.describe_calls()
    );
    assert_no_flood(&fake);
}

#[tokio::test]
async fn a_long_answer_is_split_at_paragraphs_and_code_blocks_stay_whole() {
    let fake = fake_telegram().await;
    let _gateway = start(&fake, &config(&fake, "", "")).await;
    let paragraph = "Lorem ipsum dolor sit amet, consectetur adipiscing elit. ".repeat(20);
    let code: String = (0..120).map(|i| format!("let value_{i} = {i} * 2;\n")).collect();
    let prompt = format!("{paragraph}\n\n```rust\n{code}```\n\n{paragraph}\n\nThe end.");
    assert!(prompt.encode_utf16().count() > 4096);
    let asked = fake.inject_text(&ChatSpec::private(USER), USER, &prompt);
    wait_for_reply(&fake, USER, asked.message_id, "Lorem").await;
    fake.wait_until("the last part of the answer", PATIENCE, |s| {
        s.messages(USER).iter().any(|m| m.text.contains("The end."))
    })
    .await;
    let parts: Vec<BotMessage> = fake.messages(USER);
    assert!(parts.len() >= 2, "split into several messages: {}", parts.len());
    let mut shown = String::new();
    for part in &parts {
        assert!(part.text.encode_utf16().count() <= 4096);
        // The code is sent as `pre` entities, the fences themselves are gone.
        assert!(!part.text.contains("```"), "no fence left visible: {}", part.text);
        shown.push_str(&part.text);
    }
    for i in 0..120 {
        assert!(shown.contains(&format!("let value_{i} = {i} * 2;")), "line {i} delivered");
    }
    let pre: usize =
        parts.iter().map(|p| p.entities.iter().filter(|e| e.kind == "pre").count()).sum();
    assert!(pre >= 1, "the code block is formatted as code");
    assert_no_flood(&fake);
}

#[tokio::test]
async fn cancel_ends_a_slow_run_also_as_a_reply_to_its_progress_message() {
    let fake = fake_telegram().await;
    let _gateway = start(&fake, &config(&fake, "", &echo_delay(1_000))).await;
    let chat = ChatSpec::private(USER);
    let slow = "one two three four five six seven eight nine ten ".repeat(6);

    let first = fake.inject_text(&chat, USER, &slow);
    let progress = wait_for_reply(&fake, USER, first.message_id, "Running").await;
    // Commands are answered ahead of the chat's queue, while the run goes on.
    let status = fake.inject_text(&chat, USER, "/status");
    let reply = wait_for_reply(&fake, USER, status.message_id, "").await;
    assert!(reply.text.contains("tg_"), "the status names the running job: {}", reply.text);
    let cancel = fake.inject_text(&chat, USER, "/cancel");
    wait_for_reply(&fake, USER, cancel.message_id, "").await;
    fake.wait_until("the progress message says cancelled", PATIENCE, |s| {
        s.message(USER, progress.message_id).is_some_and(|m| m.text.starts_with("Cancelled."))
    })
    .await;

    let second = fake.inject_text(&chat, USER, &slow);
    let progress = wait_for_reply(&fake, USER, second.message_id, "Running").await;
    let cancel = fake.inject_reply(&chat, USER, "/cancel", progress.message_id);
    wait_for_reply(&fake, USER, cancel.message_id, "Cancelling.").await;
    fake.wait_until("the second progress message says cancelled", PATIENCE, |s| {
        s.message(USER, progress.message_id).is_some_and(|m| m.text.starts_with("Cancelled."))
    })
    .await;
    assert_no_flood(&fake);
}

#[tokio::test]
async fn a_restart_neither_repeats_nor_loses_a_message() {
    let fake = fake_telegram().await;
    let home = home_with(&config(&fake, "", ""));
    let gateway = Gateway::start_in(home.path()).await;
    let chat = ChatSpec::private(USER);
    let first = fake.inject_text(&chat, USER, "before the restart");
    wait_for_reply(&fake, USER, first.message_id, "before the restart").await;
    assert!(gateway.terminate().await.success());

    // Written while the gateway is down: picked up after the restart, once.
    let second = fake.inject_text(&chat, USER, "while it was down");
    let gateway = Gateway::start_in(home.path()).await;
    wait_for_reply(&fake, USER, second.message_id, "while it was down").await;
    let third = fake.inject_text(&chat, USER, "after the restart");
    wait_for_reply(&fake, USER, third.message_id, "after the restart").await;

    // A progress message may come too when the run is slow; the answer comes once.
    let answers = |id: i64, text: &str| {
        fake.messages(USER)
            .iter()
            .filter(|m| m.reply_to == Some(id) && m.text.contains(text))
            .count()
    };
    assert_eq!(answers(first.message_id, "before the restart"), 1, "{}", fake.describe_calls());
    assert_eq!(answers(second.message_id, "while it was down"), 1);
    assert_eq!(answers(third.message_id, "after the restart"), 1);
    let runs = gateway.get("/v1/runs").send().await.unwrap().json::<Value>().await.unwrap();
    assert_eq!(runs["runs"].as_array().unwrap().len(), 3, "{runs}");
    assert!(fake.confirmed_offset() > third.update_id - 1);
}

#[tokio::test]
async fn an_answer_cut_off_by_a_crash_is_delivered_after_the_restart() {
    let fake = fake_telegram().await;
    let home = home_with(&config(&fake, "", &echo_delay(1_000)));
    let mut gateway = Gateway::start_in(home.path()).await;
    let chat = ChatSpec::private(USER);
    let slow = "one two three four five six seven eight nine ten";
    let asked = fake.inject_text(&chat, USER, slow);
    let progress = wait_for_reply(&fake, USER, asked.message_id, "Running").await;
    gateway.child.kill().await.unwrap();

    let _gateway = Gateway::start_in(home.path()).await;
    // A run the crash cut off completes as interrupted, with the line to resume
    // it; one that had not visibly started yet runs again. Either way the chat
    // gets exactly one answer.
    let answered = |s: &Snapshot<'_>| {
        s.messages(USER)
            .into_iter()
            .filter(|m| m.reply_to == Some(asked.message_id) && m.message_id != progress.message_id)
            .cloned()
            .collect::<Vec<_>>()
    };
    fake.wait_until("the answer after the restart", PATIENCE, |s| !answered(s).is_empty()).await;
    let answers = fake.snapshot(answered);
    assert_eq!(answers.len(), 1, "{}", fake.describe_calls());
    let answer = &answers[0];
    assert!(
        answer.text.starts_with("Interrupted.") || answer.text.starts_with(slow),
        "{}",
        answer.text
    );
    assert_eq!(
        code_entities(answer),
        [format!("echo resume tg_{BOT_ID}_{USER}_{}", asked.message_id)]
    );
    // The progress message is finished too, unless the crash came before its id
    // was saved (then it stays as it was: the answer above is what counts).
    assert_no_flood(&fake);
}

#[tokio::test]
async fn a_wrong_token_is_reported_and_the_gateway_keeps_serving() {
    let fake = fake_telegram().await;
    let config = config(&fake, "", "").replace(BOT_TOKEN, "999:not-the-right-token");
    let gateway = Gateway::start(&config).await;
    let status = gateway.status().await;
    let telegram = &status["transports"]["telegram"];
    assert_eq!(telegram["state"], "failing", "{status}");
    assert!(telegram["reason"].as_str().unwrap().contains("token"), "{telegram}");
    assert!(!status.to_string().contains("not-the-right-token"));
    let run_id = gateway.submit(json!({ "prompt": "still here" })).await;
    assert_eq!(gateway.wait(&run_id).await["answer"], "still here");
}

#[tokio::test]
async fn only_allowed_chats_get_runs_start_gets_help_and_stickers_get_a_notice() {
    let fake = fake_telegram().await;
    let _gateway = start(&fake, &config(&fake, &format!("allowed_chat_ids = [{USER}]"), "")).await;
    let stranger = ChatSpec::private(666);
    let chat = ChatSpec::private(USER);
    fake.inject_text(&stranger, 666, "let me in");
    let start = fake.inject_text(&chat, USER, "/start");
    let help = wait_for_reply(&fake, USER, start.message_id, "/cancel").await;
    assert!(help.text.contains("/engine"), "{}", help.text);
    let sticker = fake.inject_sticker(&chat, USER);
    wait_for_reply(&fake, USER, sticker.message_id, "this kind of message is not supported").await;
    // Updates are handled in order: once this one is answered, the stranger's was handled.
    let asked = fake.inject_text(&chat, USER, "am I allowed");
    wait_for_reply(&fake, USER, asked.message_id, "am I allowed").await;
    assert!(fake.messages(666).is_empty(), "the stranger got nothing");
}

#[tokio::test]
async fn forum_topics_are_separate_conversations() {
    let fake = fake_telegram().await;
    let group = -100_777;
    let gateway = start(&fake, &config(&fake, &format!("allowed_chat_ids = [{group}]"), "")).await;
    let topic_a = ChatSpec::forum_topic(group, 5);
    let topic_b = ChatSpec::forum_topic(group, 7);
    let in_a = fake.inject_text(&topic_a, USER, "hello topic five");
    let in_b = fake.inject_text(&topic_b, USER, "hello topic seven");
    let answer_a = wait_for_reply(&fake, group, in_a.message_id, "hello topic five").await;
    let answer_b = wait_for_reply(&fake, group, in_b.message_id, "hello topic seven").await;
    assert_eq!(answer_a.message_thread_id, Some(5));
    assert_eq!(answer_b.message_thread_id, Some(7));
    let runs = gateway.get("/v1/runs").send().await.unwrap().json::<Value>().await.unwrap();
    let mut keys: Vec<String> = runs["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["session_key"].as_str().unwrap().to_owned())
        .collect();
    keys.sort();
    let key = |topic: i64| format!("agent:default:telegram:{BOT_ID}:group:{group}:thread:{topic}");
    assert_eq!(keys, [key(5), key(7)]);
    assert_no_flood(&fake);
}

#[tokio::test]
async fn a_reply_to_an_answer_continues_the_session_its_resume_line_names() {
    let fake = fake_telegram().await;
    let args = tempfile::NamedTempFile::new().unwrap();
    let fixture =
        format!("{}/fixtures/cli/claude/synth_tool_use_success.jsonl", env!("CARGO_MANIFEST_DIR"));
    let claude = format!(
        "[gateway.engines.claude]\ncli_path = \"{}\"\nenv = {{ FAKE_CLI_FIXTURE = \"{fixture}\", FAKE_CLI_ARGS_FILE = \"{}\" }}\n",
        env!("CARGO_BIN_EXE_fake-cli"),
        args.path().display()
    );
    let _gateway = start(&fake, &config(&fake, "engine = \"claude\"", &claude)).await;
    let chat = ChatSpec::private(USER);
    let argv = || -> Vec<String> {
        let text = std::fs::read_to_string(args.path()).unwrap();
        let first: Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
        first["argv"].as_array().unwrap().iter().map(|a| a.as_str().unwrap().to_owned()).collect()
    };

    let first = fake.inject_text(&chat, USER, "how many tests?");
    let answer = wait_for_reply(&fake, USER, first.message_id, "There are 2 test files.").await;
    assert!(
        !argv().iter().any(|a| a.starts_with("--resume")),
        "a new chat starts fresh: {:?}",
        argv()
    );
    let new = fake.inject_text(&chat, USER, "/new");
    wait_for_reply(&fake, USER, new.message_id, "").await;

    let follow_up = fake.inject_reply(&chat, USER, "and how many pass?", answer.message_id);
    wait_for_reply(&fake, USER, follow_up.message_id, "There are 2 test files.").await;
    let argv = argv();
    assert!(
        argv.contains(&"--resume=5b1c7a52-8f0e-4d7b-9c1a-2f3e4d5c6b7a".to_owned()),
        "resumed: {argv:?}"
    );
    assert_no_flood(&fake);
}

#[tokio::test]
async fn a_mistake_in_the_telegram_section_names_file_line_and_column() {
    let dir = home_with(&format!(
        "[gateway]\nenable_telegram = true\n[gateway.telegram]\nbot_token = \"{BOT_TOKEN}\"\npoll_timeout_s = \"5\"\n"
    ));
    let (code, stderr) = crate::support::failed_start(dir.path()).await;
    assert_eq!(code, Some(5));
    // An unknown key is a warning now (see first_run.rs); a wrong type is the mistake here.
    let expected = format!(
        "{}:5:18: gateway.telegram.poll_timeout_s: `poll_timeout_s`: invalid type: string \"5\", expected a whole number, 0 or more",
        dir.path().join("config.toml").display()
    );
    assert!(stderr.contains(&expected), "{stderr}");
    assert!(!stderr.contains(BOT_TOKEN), "the token is never printed");
}

#[tokio::test]
async fn bindings_pick_a_chats_engine_and_unbound_chats_can_be_refused() {
    let fake = fake_telegram().await;
    let fixture =
        format!("{}/fixtures/cli/claude/synth_tool_use_success.jsonl", env!("CARGO_MANIFEST_DIR"));
    let extra = format!(
        "[gateway.engines.claude]\ncli_path = \"{}\"\nenv = {{ FAKE_CLI_FIXTURE = \"{fixture}\" }}\n\
         [[gateway.bindings]]\ntransport = \"telegram\"\nchat_id = {USER}\ndefault_engine = \"claude\"\n",
        env!("CARGO_BIN_EXE_fake-cli")
    );
    // Both chats are allowed: the stranger is refused for having no binding.
    let telegram = format!("allowed_chat_ids = [{USER}, 777]\ndeny_unbound_chats = true");
    let gateway = start(&fake, &config(&fake, &telegram, &extra)).await;
    let stranger = ChatSpec::private(777);
    fake.inject_text(&stranger, 777, "not bound");
    let asked = fake.inject_text(&ChatSpec::private(USER), USER, "how many tests?");
    wait_for_reply(&fake, USER, asked.message_id, "There are 2 test files.").await;
    // Updates are handled in order, so the unbound chat's message was handled first.
    assert!(fake.messages(777).is_empty(), "the unbound chat got nothing");
    let runs = gateway.get("/v1/runs").send().await.unwrap().json::<Value>().await.unwrap();
    let runs = runs["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert_eq!(runs[0]["engine"], "claude", "the binding's engine");
}

#[tokio::test]
async fn an_answer_telegram_refuses_is_recorded_and_shown_in_status() {
    let fake = fake_telegram().await;
    let gateway = start(&fake, &config(&fake, "", "")).await;
    fake.fail_next(
        "sendMessage",
        Fault::Status(403, "Forbidden: bot was blocked by the user".into()),
    );
    fake.inject_text(&ChatSpec::private(USER), USER, "are you there");
    fake.wait_until("the refused answer", PATIENCE, |s| {
        s.calls_to("sendMessage").iter().any(|c| c.status == Some(403))
    })
    .await;
    // Status is read over HTTP from the other process: asked until it says so.
    let detail = tokio::time::timeout(PATIENCE, async {
        loop {
            let status = gateway.status().await;
            let detail =
                status["transports"]["telegram"]["detail"].as_str().unwrap_or("").to_owned();
            if detail.contains("refused") {
                return detail;
            }
        }
    })
    .await
    .expect("status reports the refused answer");
    assert_eq!(detail, format!("@{BOT_NAME}; 1 answer Telegram refused (see the log)"));
    assert_eq!(gateway.status().await["transports"]["telegram"]["state"], "running");
}

#[tokio::test]
async fn a_poll_conflict_is_waited_out_and_nothing_is_lost() {
    let fake = fake_telegram().await;
    let _gateway = start(&fake, &config(&fake, "", "")).await;
    fake.fail_next(
        "getUpdates",
        Fault::Status(409, "Conflict: terminated by other getUpdates request".into()),
    );
    // The poll open now ends normally; the next one meets the conflict.
    let first = fake.inject_text(&ChatSpec::private(USER), USER, "first");
    wait_for_reply(&fake, USER, first.message_id, "first").await;
    let second = fake.inject_text(&ChatSpec::private(USER), USER, "after the conflict");
    wait_for_reply(&fake, USER, second.message_id, "after the conflict").await;
    let polls = fake.calls().into_iter().filter(|c| c.method == "getUpdates").collect::<Vec<_>>();
    assert!(polls.iter().any(|c| c.status == Some(409)), "{}", fake.describe_calls());
}
