//! The reference's `[gateway.telegram]` keys end to end: the real gateway
//! binary polling the fake Bot API, with the echo engine (it answers the
//! prompt it got, so an answer shows the prompt a run was given).

use lemon_tests::fake_telegram::{BotMessage, ChatSpec, FakeTelegram};
use serde_json::Value;

use crate::support::{command, home_with, output_text, Gateway, PATIENCE};
use crate::telegram_e2e::{
    config, fake_telegram, wait_for_reply, BOT_ID, BOT_NAME, BOT_TOKEN, USER,
};

/// Starts the gateway and waits until the bot registered `commands` commands
/// (it polls next).
async fn start(fake: &FakeTelegram, config: &str, commands: usize) -> Gateway {
    let gateway = Gateway::start(config).await;
    fake.wait_until("the bot's commands", PATIENCE, |s| s.commands().len() == commands).await;
    gateway
}

/// The runs the gateway made.
async fn runs(gateway: &Gateway) -> Vec<Value> {
    let runs = gateway.get("/v1/runs").send().await.unwrap().json::<Value>().await.unwrap();
    runs["runs"].as_array().unwrap().clone()
}

fn echo_delay(ms: u64) -> String {
    format!("[gateway.engines.echo]\ndelay_ms = {ms}\n")
}

/// The answer to `message_id` that reads exactly `text` (the echo engine's
/// answer to the prompt `text`), with whatever resume line follows.
async fn wait_for_answer(fake: &FakeTelegram, message_id: i64, text: &str) -> BotMessage {
    let what = format!("the answer {text:?} to message {message_id}");
    let is_answer = |m: &BotMessage| {
        m.text == text
            || (m.text.starts_with(&format!("{text}\n\n")) && m.text.contains(" resume "))
    };
    fake.wait_until(&what, PATIENCE, |s| {
        s.replies_to(USER, message_id).into_iter().any(&is_answer)
    })
    .await;
    fake.replies_to(USER, message_id).into_iter().find(|m| is_answer(m)).unwrap()
}

#[tokio::test]
async fn quick_messages_are_one_prompt_and_a_later_one_is_a_run_of_its_own() {
    let fake = fake_telegram().await;
    let gateway = start(&fake, &config(&fake, "debounce_ms = 3000", ""), 4).await;
    let chat = ChatSpec::private(USER);
    let first = fake.inject_text(&chat, USER, "fix the bug");
    let second = fake.inject_text(&chat, USER, "in parser.rs");
    // One run, answering the last message, with both texts in order.
    wait_for_answer(&fake, second.message_id, "fix the bug\nin parser.rs").await;
    assert!(fake.replies_to(USER, first.message_id).is_empty(), "{}", fake.describe_calls());

    // Sent after the merged answer, so after the window: a run of its own.
    let third = fake.inject_text(&chat, USER, "and the docs");
    wait_for_answer(&fake, third.message_id, "and the docs").await;
    let runs = runs(&gateway).await;
    let mut prompts: Vec<&str> = runs.iter().map(|r| r["prompt"].as_str().unwrap()).collect();
    prompts.sort_unstable();
    assert_eq!(prompts, ["and the docs", "fix the bug\nin parser.rs"], "{runs:?}");
}

#[tokio::test]
async fn a_command_is_not_merged_and_sends_what_waits_first() {
    let fake = fake_telegram().await;
    // A ten-minute window: only the command makes the waiting messages go.
    let _gateway = start(&fake, &config(&fake, "debounce_ms = 600000", ""), 4).await;
    let chat = ChatSpec::private(USER);
    fake.inject_text(&chat, USER, "one");
    let two = fake.inject_text(&chat, USER, "two");
    let status = fake.inject_text(&chat, USER, "/status");
    wait_for_answer(&fake, two.message_id, "one\ntwo").await;
    wait_for_reply(&fake, USER, status.message_id, "").await;
}

#[tokio::test]
async fn messages_waiting_when_the_gateway_stops_go_at_the_next_start() {
    let fake = fake_telegram().await;
    let home = home_with(&config(&fake, "debounce_ms = 600000", ""));
    let gateway = Gateway::start_in(home.path()).await;
    let chat = ChatSpec::private(USER);
    fake.inject_text(&chat, USER, "keep");
    let waiting = fake.inject_text(&chat, USER, "this");
    // A poll past the message: the bot has it, and Telegram forgets it.
    fake.wait_until("the bot past the messages", PATIENCE, |s| {
        s.poll_offsets().contains(&Some(waiting.update_id + 1))
    })
    .await;
    assert!(gateway.terminate().await.success());

    let _gateway = Gateway::start_in(home.path()).await;
    wait_for_answer(&fake, waiting.message_id, "keep\nthis").await;
}

#[tokio::test]
async fn the_startup_message_reaches_every_allowed_chat() {
    let fake = fake_telegram().await;
    let other = 2002;
    fake.add_chat(&ChatSpec::private(USER));
    fake.add_chat(&ChatSpec::private(other));
    let telegram =
        format!("allowed_chat_ids = [{USER}, {other}]\nstartup_message = \"Back online.\"");
    let _gateway = start(&fake, &config(&fake, &telegram, ""), 4).await;
    fake.wait_until("the startup message in both chats", PATIENCE, |s| {
        [USER, other].iter().all(|chat| s.messages(*chat).iter().any(|m| m.text == "Back online."))
    })
    .await;
}

#[tokio::test]
async fn drop_pending_updates_skips_what_came_while_the_bot_was_offline() {
    let fake = fake_telegram().await;
    let chat = ChatSpec::private(USER);
    let old = fake.inject_text(&chat, USER, "old news");
    let gateway = start(&fake, &config(&fake, "drop_pending_updates = true", ""), 4).await;
    let fresh = fake.inject_text(&chat, USER, "fresh news");
    wait_for_answer(&fake, fresh.message_id, "fresh news").await;
    // Updates are handled in order: had the old one been read, it would be answered by now.
    assert!(fake.replies_to(USER, old.message_id).is_empty(), "{}", fake.describe_calls());
    assert_eq!(runs(&gateway).await.len(), 1);
    let dropped = fake.snapshot(|s| {
        s.calls_to("deleteWebhook").iter().any(|c| c.params["drop_pending_updates"] == true)
    });
    assert!(dropped, "{}", fake.describe_calls());
}

#[tokio::test]
async fn an_offset_skips_the_updates_below_it() {
    let fake = fake_telegram().await;
    let chat = ChatSpec::private(USER);
    let skipped = fake.inject_text(&chat, USER, "skip me");
    let kept = fake.inject_text(&chat, USER, "keep me");
    let telegram = format!("offset = {}", kept.update_id);
    let _gateway = start(&fake, &config(&fake, &telegram, ""), 4).await;
    wait_for_answer(&fake, kept.message_id, "keep me").await;
    assert!(fake.replies_to(USER, skipped.message_id).is_empty());
    assert_eq!(fake.poll_offsets()[0], Some(kept.update_id));
}

#[tokio::test]
async fn without_the_resume_line_a_reply_still_continues_the_session() {
    let fake = fake_telegram().await;
    let gateway = start(&fake, &config(&fake, "show_resume_line = false", ""), 4).await;
    let chat = ChatSpec::private(USER);
    let first = fake.inject_text(&chat, USER, "remember this");
    let answer = wait_for_answer(&fake, first.message_id, "remember this").await;
    assert_eq!(answer.text, "remember this", "no resume line");
    assert!(answer.entities.is_empty());

    // After /new a plain message starts afresh: only the reply names the session.
    let new = fake.inject_text(&chat, USER, "/new");
    wait_for_reply(&fake, USER, new.message_id, "").await;
    let again = fake.inject_reply(&chat, USER, "and this", answer.message_id);
    wait_for_answer(&fake, again.message_id, "and this").await;
    let runs = runs(&gateway).await;
    let first_run = format!("tg_{BOT_ID}_{USER}_{}", first.message_id);
    let second = runs.iter().find(|r| r["prompt"] == "and this").expect("the reply's run");
    assert_eq!(second["resume"]["value"], first_run.as_str(), "continued: {second}");
}

#[tokio::test]
async fn without_markdown_answers_are_plain_text() {
    let fake = fake_telegram().await;
    let _gateway = start(&fake, &config(&fake, "use_markdown = false", ""), 4).await;
    let prompt = "Use `ls`:\n\n```sh\nls -la\n```";
    let asked = fake.inject_text(&ChatSpec::private(USER), USER, prompt);
    let answer = wait_for_answer(&fake, asked.message_id, prompt).await;
    let run = format!("tg_{BOT_ID}_{USER}_{}", asked.message_id);
    assert_eq!(answer.text, format!("{prompt}\n\necho resume {run}"));
    assert!(answer.entities.is_empty(), "{:?}", answer.entities);
    let formatted = fake.snapshot(|s| {
        s.calls_to("sendMessage")
            .iter()
            .any(|c| c.params.get("entities").is_some() || c.params.get("parse_mode").is_some())
    });
    assert!(!formatted, "{}", fake.describe_calls());
}

#[tokio::test]
async fn with_queue_override_a_message_picks_its_queue_mode() {
    let fake = fake_telegram().await;
    let telegram = "allow_queue_override = true";
    let _gateway = start(&fake, &config(&fake, telegram, &echo_delay(1_000)), 8).await;
    let commands: Vec<String> = fake.commands().into_iter().map(|c| c.command).collect();
    assert!(commands.contains(&"interrupt".to_owned()), "{commands:?}");
    let chat = ChatSpec::private(USER);
    let slow = "one two three four five six seven eight nine ten ".repeat(6);
    let first = fake.inject_text(&chat, USER, &slow);
    wait_for_reply(&fake, USER, first.message_id, "Running").await;
    // The chat queues (collect); this message stops the running job instead.
    let urgent = fake.inject_text(&chat, USER, "/interrupt stop now");
    wait_for_answer(&fake, urgent.message_id, "stop now").await;
    wait_for_reply(&fake, USER, first.message_id, "Interrupted.").await;
    let bare = fake.inject_text(&chat, USER, "/steer");
    wait_for_reply(&fake, USER, bare.message_id, "Write the message after /steer").await;
}

#[tokio::test]
async fn without_queue_override_the_command_is_text_for_the_engine() {
    let fake = fake_telegram().await;
    let _gateway = start(&fake, &config(&fake, "", ""), 4).await;
    let asked = fake.inject_text(&ChatSpec::private(USER), USER, "/interrupt stop now");
    wait_for_answer(&fake, asked.message_id, "/interrupt stop now").await;
}

#[tokio::test]
async fn a_long_edit_throttle_leaves_only_the_last_progress_edit() {
    let fake = fake_telegram().await;
    let fixture =
        format!("{}/fixtures/cli/claude/synth_tool_use_success.jsonl", env!("CARGO_MANIFEST_DIR"));
    let claude = format!(
        "[gateway.engines.claude]\ncli_path = \"{}\"\nenv = {{ FAKE_CLI_FIXTURE = \"{fixture}\", FAKE_CLI_LINE_DELAY_MS = \"1500\" }}\n",
        env!("CARGO_BIN_EXE_fake-cli")
    );
    let telegram = "engine = \"claude\"\nprogress_delay_ms = 0\nedit_throttle_ms = 600000";
    let _gateway = start(&fake, &config(&fake, telegram, &claude), 4).await;
    let asked = fake.inject_text(&ChatSpec::private(USER), USER, "how many tests?");
    let answer = wait_for_reply(&fake, USER, asked.message_id, "There are 2 test files.").await;
    let progress = fake
        .replies_to(USER, asked.message_id)
        .into_iter()
        .find(|m| m.message_id != answer.message_id)
        .expect("a progress message");
    fake.wait_until("the progress message says done", PATIENCE, |s| {
        s.message(USER, progress.message_id).is_some_and(|m| m.text.starts_with("Done."))
    })
    .await;
    let progress = fake.snapshot(|s| s.message(USER, progress.message_id).cloned()).unwrap();
    // The actions came and went within the throttle: the run's end is the one edit.
    assert_eq!(progress.edits, 1, "{:?}", progress.versions);
    assert!(progress.versions[0].starts_with("Running…"), "{:?}", progress.versions);
}

#[tokio::test]
async fn a_bot_username_of_another_bot_is_refused_naming_both() {
    let fake = fake_telegram().await;
    let gateway = Gateway::start(&config(&fake, "bot_username = \"@someone_else_bot\"", "")).await;
    let status = tokio::time::timeout(PATIENCE, async {
        loop {
            let status = gateway.status().await;
            if status["transports"]["telegram"]["state"] == "failing" {
                return status;
            }
        }
    })
    .await
    .expect("the bot stops");
    let reason = status["transports"]["telegram"]["reason"].as_str().unwrap().to_owned();
    assert!(reason.contains("@someone_else_bot") && reason.contains(BOT_NAME), "{reason}");
    assert!(!status.to_string().contains(BOT_TOKEN));
    assert!(fake.snapshot(|s| s.calls_to("getUpdates").is_empty()), "it never polls");
}

#[tokio::test]
async fn a_bot_id_that_is_not_the_tokens_stops_the_start_naming_both() {
    let fake = fake_telegram().await;
    let dir = home_with(&config(&fake, "bot_id = 5", ""));
    let (code, stderr) = crate::support::failed_start(dir.path()).await;
    assert_eq!(code, Some(5), "{stderr}");
    assert!(stderr.contains("bot_id: 5 is not the bot of bot_token (bot 424242)"), "{stderr}");
    assert!(!stderr.contains(BOT_TOKEN), "the token is never printed");
}

#[tokio::test]
async fn config_check_takes_every_reference_key_without_ignoring_one() {
    let dir = home_with(
        "[gateway.telegram]\nenabled = false\nbot_token = \"123456:abc\"\nbot_id = 123456\n\
         bot_username = \"lemon_bot\"\nallowed_chat_ids = [12345678]\ndeny_unbound_chats = false\n\
         startup_message = \"Lemon is up\"\npoll_interval_ms = 1000\nedit_throttle_ms = 1000\n\
         debounce_ms = 1000\nshow_resume_line = false\nuse_markdown = true\n\
         allow_queue_override = false\naccount_id = \"default\"\noffset = 0\n\
         drop_pending_updates = false\n\
         [gateway.telegram.compaction]\nenabled = true\ncontext_window_tokens = 123000\n\
         reserve_tokens = 12000\ntrigger_ratio = 0.88\n",
    );
    let mut check = command(dir.path());
    check.args(["config", "check"]);
    let (ok, output) = output_text(check).await;
    assert!(ok, "{output}");
    assert!(!output.contains("ignored"), "{output}");
    assert!(!output.contains("unknown key"), "{output}");
}
