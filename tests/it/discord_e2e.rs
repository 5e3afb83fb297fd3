//! Discord end to end: the real gateway binary on a fake Discord (Gateway
//! WebSocket and REST API) in this process, with the echo engine and the fake
//! CLI.

use std::path::Path;
use std::time::Duration;

use lemon_tests::fake_discord::{
    ChannelSpec, FakeDiscord, FakeMessage, Fault, GatewayOp, Snapshot, BOT_ID,
};
use serde_json::Value;

use crate::support::{failed_start, home_with, Gateway, PATIENCE};

const TOKEN: &str = "discord-test-token-3b9d7e";
pub(crate) const GUILD: u64 = 700_000_000_000_000_001;
const OTHER_GUILD: u64 = 700_000_000_000_000_002;
pub(crate) const CHANNEL: u64 = 710_000_000_000_000_001;
pub(crate) const DM: u64 = 720_000_000_000_000_001;
pub(crate) const USER: u64 = 730_000_000_000_000_001;
pub(crate) const STRANGER: u64 = 730_000_000_000_000_099;

pub(crate) async fn fake() -> FakeDiscord {
    let fake = FakeDiscord::start(TOKEN).await;
    fake.add_channel(ChannelSpec::text(GUILD, CHANNEL));
    fake.add_channel(ChannelSpec::dm(DM));
    fake
}

/// A config with Discord on against `fake`, plus `discord_extra` in its section
/// and `extra` at the top; the token comes from the default secret. [`USER`]
/// in [`GUILD`] and in DMs is allowed unless `discord_extra` sets the lists
/// (or `allow_everyone`) itself: empty lists let nobody in.
pub(crate) fn config(fake: &FakeDiscord, discord_extra: &str, extra: &str) -> String {
    let allowed = if discord_extra.contains("allowed_") || discord_extra.contains("allow_everyone")
    {
        String::new()
    } else {
        format!("allowed_guild_ids = [\"{GUILD}\"]\nallowed_user_ids = [\"{USER}\"]\n")
    };
    format!(
        "[gateway]\nenable_discord = true\n{extra}\n\
         [gateway.discord]\ngateway_url = \"{}\"\napi_base_url = \"{}\"\nedit_interval_ms = 300\n{allowed}{discord_extra}\n",
        fake.gateway_url(),
        fake.api_base_url()
    )
}

fn echo_delay(ms: u64) -> String {
    format!("[gateway.engines.echo]\ndelay_ms = {ms}\n")
}

/// A home with `config` and the bot token in `secrets.toml`.
pub(crate) fn home(config: &str) -> tempfile::TempDir {
    let home = home_with(config);
    write_token(home.path());
    home
}

fn write_token(home: &Path) {
    let secrets = home.join("secrets.toml");
    std::fs::write(&secrets, format!("discord_bot_token = \"{TOKEN}\"\n")).unwrap();
    std::fs::set_permissions(&secrets, std::os::unix::fs::PermissionsExt::from_mode(0o600))
        .unwrap();
}

/// Starts the gateway on `home` and waits until the bot is on the gateway.
pub(crate) async fn start_in(fake: &FakeDiscord, home: &Path) -> Gateway {
    let gateway = Gateway::start_in(home).await;
    fake.wait_until("the bot on the gateway", PATIENCE, |s| s.connected()).await;
    gateway
}

/// The bot's message replying to `message`, once it contains `needle`.
pub(crate) async fn reply_containing(
    fake: &FakeDiscord,
    message: &FakeMessage,
    needle: &str,
) -> FakeMessage {
    let what = format!("a reply to {:?} containing {needle:?}", message.content);
    let found =
        |s: &Snapshot<'_>| s.reply_to(message.id).filter(|m| m.content.contains(needle)).cloned();
    fake.wait_until(&what, PATIENCE, |s| found(s).is_some()).await;
    fake.snapshot(found).unwrap()
}

pub(crate) fn assert_within_limits(fake: &FakeDiscord) {
    let violations = fake.violations();
    assert!(violations.is_empty(), "rate limits broken: {violations:?}\n{}", fake.describe());
}

fn identifies(fake: &FakeDiscord) -> usize {
    fake.ops().iter().filter(|op| matches!(op, GatewayOp::Identify { .. })).count()
}

fn resumes(fake: &FakeDiscord) -> Vec<(String, u64)> {
    fake.ops()
        .into_iter()
        .filter_map(|op| match op {
            GatewayOp::Resume { session_id, seq } => Some((session_id, seq)),
            _ => None,
        })
        .collect()
}

async fn runs(gateway: &Gateway) -> Vec<Value> {
    let runs: Value = gateway.get("/v1/runs").send().await.unwrap().json().await.unwrap();
    runs["runs"].as_array().unwrap().clone()
}

/// How many of the bot's messages in `channel` reply to `message`.
pub(crate) fn replies(fake: &FakeDiscord, channel: u64, message: &FakeMessage) -> usize {
    fake.bot_messages(channel).iter().filter(|m| m.reply_to == Some(message.id)).count()
}

#[tokio::test]
async fn a_message_gets_an_answer_streamed_by_edits_with_its_resume_line_in_code() {
    let fake = fake().await;
    let home = home(&config(&fake, "", &echo_delay(150)));
    let gateway = start_in(&fake, home.path()).await;
    fake.wait_until("the slash commands", PATIENCE, |s| s.commands().len() == 4).await;
    let names: Vec<String> =
        fake.commands().iter().map(|c| c["name"].as_str().unwrap().to_owned()).collect();
    assert_eq!(names, ["cancel", "new", "status", "engine"]);
    assert_eq!(fake.ops()[0], GatewayOp::Identify { intents: (1 << 9) | (1 << 12) | (1 << 15) });

    let prompt = "one two three four five six seven eight nine ten eleven twelve";
    let asked = fake.inject_message(CHANNEL, USER, prompt, true, None);
    let resume = format!("`echo resume dc_{}`", asked.id);
    let answer = reply_containing(&fake, &asked, &resume).await;
    assert!(answer.content.starts_with(prompt), "{}", answer.content);
    assert!(!answer.content.contains("Running"), "{}", answer.content);
    assert!(answer.edits >= 2, "the answer streamed in by edits: {:?}", answer.versions);
    assert!(answer.versions[0].contains("Running…"), "{:?}", answer.versions);
    assert!(
        answer.versions.iter().any(|v| v.starts_with("one two") && v.contains("Running…")),
        "the text showed while the run went on: {:?}",
        answer.versions
    );
    assert_eq!(replies(&fake, CHANNEL, &asked), 1, "one message, edited");
    assert_within_limits(&fake);

    let runs = runs(&gateway).await;
    assert_eq!(runs[0]["session_key"], format!("agent:default:discord:{BOT_ID}:channel:{CHANNEL}"));
    let status = gateway.status().await;
    assert_eq!(status["transports"]["discord"]["state"], "running", "{status}");
    assert_eq!(status["transports"]["discord"]["detail"], "@lemon-test");
    let health: Value =
        reqwest::get(format!("{}/healthz", gateway.health)).await.unwrap().json().await.unwrap();
    assert_eq!(health["transports"]["discord"]["state"], "running", "{health}");
}

#[tokio::test]
async fn ten_channels_at_once_stay_within_the_rate_limits() {
    let fake = fake().await;
    // Tighter than Discord's 5 in 5 s, so the buckets' headers are what keeps the bot in.
    fake.set_channel_limit(3, Duration::from_secs(3));
    let home = home(&config(&fake, "", &echo_delay(60)));
    let _gateway = start_in(&fake, home.path()).await;
    let mut asked = Vec::new();
    for n in 0..10u64 {
        let channel = CHANNEL + 100 + n;
        fake.add_channel(ChannelSpec::text(GUILD, channel));
        let text = format!("channel {n} says one two three four five six seven eight");
        asked.push((channel, fake.inject_message(channel, USER, &text, true, None), text));
    }
    for (_, message, text) in &asked {
        let answer = reply_containing(&fake, message, "`echo resume").await;
        assert!(answer.content.starts_with(text.as_str()), "{}", answer.content);
    }
    assert_within_limits(&fake);
}

#[tokio::test]
async fn a_dropped_connection_is_resumed_without_losing_or_repeating_a_message() {
    let fake = fake().await;
    let home = home(&config(&fake, "", ""));
    let gateway = start_in(&fake, home.path()).await;
    let first = fake.inject_message(DM, USER, "before the drop", false, None);
    reply_containing(&fake, &first, "before the drop").await;

    fake.drop_connection();
    // Written while the bot is away: replayed by the resume.
    let second = fake.inject_message(DM, USER, "during the drop", false, None);
    reply_containing(&fake, &second, "during the drop").await;
    let resumed = resumes(&fake);
    assert_eq!(resumed.len(), 1, "{}", fake.describe());
    assert!(resumed[0].1 >= 2, "resumed after READY and the first message: {resumed:?}");

    // A connection whose heartbeats go unanswered is dropped and resumed too.
    fake.ack_heartbeats(false);
    fake.wait_until("a second resume", PATIENCE, |s| {
        s.ops().iter().filter(|op| matches!(op, GatewayOp::Resume { .. })).count() == 2
    })
    .await;
    fake.ack_heartbeats(true);
    let third = fake.inject_message(DM, USER, "after the zombie", false, None);
    reply_containing(&fake, &third, "after the zombie").await;

    assert_eq!(identifies(&fake), 1, "one session all along: {}", fake.describe());
    for message in [&first, &second, &third] {
        assert_eq!(replies(&fake, DM, message), 1, "{:?}", message.content);
    }
    assert_eq!(runs(&gateway).await.len(), 3);
}

#[tokio::test]
async fn an_invalid_session_identifies_again_and_the_bot_keeps_answering() {
    let fake = fake().await;
    let home = home(&config(&fake, "", ""));
    let _gateway = start_in(&fake, home.path()).await;
    fake.refuse_next_resume();
    fake.drop_connection();
    fake.wait_until("a second identify", PATIENCE, |s| {
        s.ops().iter().filter(|op| matches!(op, GatewayOp::Identify { .. })).count() == 2
    })
    .await;
    let ops = fake.ops();
    let resume = ops.iter().position(|op| matches!(op, GatewayOp::Resume { .. })).unwrap();
    let identify = ops.iter().rposition(|op| matches!(op, GatewayOp::Identify { .. })).unwrap();
    assert!(resume < identify, "{ops:?}");
    let asked = fake.inject_message(DM, USER, "a new session", false, None);
    reply_containing(&fake, &asked, "a new session").await;
}

#[tokio::test]
async fn cancel_as_a_slash_command_and_as_text_ends_a_slow_run() {
    let fake = fake().await;
    let home = home(&config(&fake, "", &echo_delay(1_000)));
    let _gateway = start_in(&fake, home.path()).await;
    let slow = "one two three four five six seven eight nine ten ".repeat(6);

    let first = fake.inject_message(CHANNEL, USER, &slow, true, None);
    let working = reply_containing(&fake, &first, "Running").await;
    let interaction = fake.inject_command(CHANNEL, USER, "status", None);
    fake.wait_until("the status reply", PATIENCE, |s| s.interaction_reply(interaction).is_some())
        .await;
    let status = fake.snapshot(|s| s.interaction_reply(interaction).unwrap().to_owned());
    assert!(status.contains("dc_"), "the status names the running job: {status}");
    let cancel = fake.inject_command(CHANNEL, USER, "cancel", None);
    fake.wait_until("the cancel reply", PATIENCE, |s| s.interaction_reply(cancel).is_some()).await;
    fake.wait_until("the working message says cancelled", PATIENCE, |s| {
        s.message(working.id).is_some_and(|m| m.content.starts_with("Cancelled."))
    })
    .await;

    let second = fake.inject_message(CHANNEL, USER, &slow, true, None);
    let working = reply_containing(&fake, &second, "Running").await;
    let cancel = fake.inject_message(CHANNEL, USER, "/cancel", true, None);
    reply_containing(&fake, &cancel, "").await;
    fake.wait_until("the second working message says cancelled", PATIENCE, |s| {
        s.message(working.id).is_some_and(|m| m.content.starts_with("Cancelled."))
    })
    .await;
    assert_within_limits(&fake);
}

#[tokio::test]
async fn a_restart_resumes_the_session_and_neither_repeats_nor_loses_a_message() {
    let fake = fake().await;
    let home = home(&config(&fake, "", ""));
    let gateway = start_in(&fake, home.path()).await;
    let first = fake.inject_message(DM, USER, "before the restart", false, None);
    reply_containing(&fake, &first, "before the restart").await;
    assert!(gateway.terminate().await.success());
    fake.wait_until("the bot gone", PATIENCE, |s| !s.connected()).await;

    // Written while the gateway is down: the saved session is resumed and Discord replays it.
    let second = fake.inject_message(DM, USER, "while it was down", false, None);
    let gateway = start_in(&fake, home.path()).await;
    reply_containing(&fake, &second, "while it was down").await;
    let third = fake.inject_message(DM, USER, "after the restart", false, None);
    reply_containing(&fake, &third, "after the restart").await;

    assert_eq!(identifies(&fake), 1, "the restart resumed: {}", fake.describe());
    assert_eq!(resumes(&fake).len(), 1);
    for message in [&first, &second, &third] {
        assert_eq!(replies(&fake, DM, message), 1, "{:?}\n{}", message.content, fake.describe());
    }
    assert_eq!(runs(&gateway).await.len(), 3);
}

#[tokio::test]
async fn an_answer_cut_off_by_a_crash_is_delivered_after_the_restart() {
    let fake = fake().await;
    let home = home(&config(&fake, "", &echo_delay(1_000)));
    let mut gateway = start_in(&fake, home.path()).await;
    let slow = "one two three four five six seven eight nine ten";
    let asked = fake.inject_message(DM, USER, slow, false, None);
    let working = reply_containing(&fake, &asked, "Running").await;
    gateway.child.kill().await.unwrap();

    let _gateway = start_in(&fake, home.path()).await;
    // A run the crash cut off completes as interrupted, with the line to resume
    // it; one that had not visibly started runs again. Either way one answer:
    // in the working message, or (when the crash came before its id was saved)
    // in a new reply.
    let resume = format!("`echo resume dc_{}`", asked.id);
    let answered = |s: &Snapshot<'_>| {
        s.bot_messages(DM)
            .into_iter()
            .filter(|m| m.reply_to == Some(asked.id) && m.content.contains(&resume))
            .cloned()
            .collect::<Vec<_>>()
    };
    fake.wait_until("the answer after the restart", PATIENCE, |s| !answered(s).is_empty()).await;
    let answers = fake.snapshot(answered);
    assert_eq!(answers.len(), 1, "{}", fake.describe());
    let answer = &answers[0];
    assert!(
        answer.content.starts_with("Interrupted.") || answer.content.starts_with(slow),
        "{}",
        answer.content
    );
    if answer.id != working.id {
        assert_eq!(replies(&fake, DM, &asked), 2, "the working message and the answer");
    }
}

#[tokio::test]
async fn only_allowed_guilds_and_users_get_runs_and_servers_need_a_mention() {
    let fake = fake().await;
    let elsewhere = CHANNEL + 5;
    fake.add_channel(ChannelSpec::text(OTHER_GUILD, elsewhere));
    let allow = format!("allowed_guild_ids = [\"{GUILD}\"]\nallowed_user_ids = [\"{USER}\"]");
    let home = home(&config(&fake, &allow, ""));
    let gateway = start_in(&fake, home.path()).await;
    let stranger = fake.inject_message(CHANNEL, STRANGER, "let me in", true, None);
    let other_guild = fake.inject_message(elsewhere, USER, "wrong server", true, None);
    let unmentioned = fake.inject_message(CHANNEL, USER, "just chatting", false, None);
    let interaction = fake.inject_command(CHANNEL, STRANGER, "new", None);
    fake.wait_until("the refusal of the command", PATIENCE, |s| {
        s.interaction_reply(interaction).is_some()
    })
    .await;
    assert_eq!(
        fake.snapshot(|s| s.interaction_reply(interaction).map(str::to_owned)).unwrap(),
        "Not allowed here."
    );
    let allowed = fake.inject_message(CHANNEL, USER, "may I", true, None);
    reply_containing(&fake, &allowed, "may I").await;
    // Dispatches are handled in order: the earlier ones were passed over by now.
    for message in [&stranger, &unmentioned] {
        assert_eq!(replies(&fake, CHANNEL, message), 0, "{:?}", message.content);
    }
    assert!(fake.bot_messages(elsewhere).is_empty());
    assert_eq!(other_guild.channel_id, elsewhere);
    assert_eq!(runs(&gateway).await.len(), 1);
}

#[tokio::test]
async fn a_thread_is_its_own_conversation_and_a_reply_to_an_answer_continues_it() {
    let fake = fake().await;
    let thread = CHANNEL + 1;
    fake.add_channel(ChannelSpec::thread(GUILD, CHANNEL, thread));
    let home = home(&config(&fake, "", ""));
    let gateway = start_in(&fake, home.path()).await;
    let in_channel = fake.inject_message(CHANNEL, USER, "in the channel", true, None);
    reply_containing(&fake, &in_channel, "in the channel").await;
    let in_thread = fake.inject_message(thread, USER, "in the thread", true, None);
    let answer = reply_containing(&fake, &in_thread, "in the thread").await;
    assert_eq!(answer.channel_id, thread, "the answer is in the thread");
    // A reply to the answer needs no mention and continues its session.
    let follow_up = fake.inject_message(thread, USER, "and more", false, Some(answer.id));
    reply_containing(&fake, &follow_up, "and more").await;

    let runs = runs(&gateway).await;
    let key_of = |prompt_start: &str| {
        runs.iter()
            .find(|r| r["run_id"].as_str().unwrap().ends_with(prompt_start))
            .map(|r| r["session_key"].as_str().unwrap().to_owned())
            .unwrap()
    };
    let thread_key = format!("agent:default:discord:{BOT_ID}:channel:{CHANNEL}:thread:{thread}");
    assert_eq!(
        key_of(&in_channel.id.to_string()),
        format!("agent:default:discord:{BOT_ID}:channel:{CHANNEL}")
    );
    assert_eq!(key_of(&in_thread.id.to_string()), thread_key);
    assert_eq!(key_of(&follow_up.id.to_string()), thread_key);
    let continued = gateway.run(&format!("dc_{}", follow_up.id)).await;
    assert_eq!(continued["resume"]["value"], format!("dc_{}", in_thread.id), "{continued}");
}

#[tokio::test]
async fn a_long_answer_is_split_under_2000_characters_with_code_blocks_whole() {
    let fake = fake().await;
    let home = home(&config(&fake, "", ""));
    let _gateway = start_in(&fake, home.path()).await;
    let paragraph = "Lorem ipsum dolor sit amet, consectetur adipiscing elit. ".repeat(12);
    let code: String = (0..60).map(|i| format!("let value_{i} = {i} * 2;\n")).collect();
    let prompt = format!("{paragraph}\n\n```rust\n{code}```\n\n{paragraph}\n\nThe end.");
    assert!(prompt.chars().count() > 2000);
    let asked = fake.inject_message(DM, USER, &prompt, false, None);
    fake.wait_until("the last part", PATIENCE, |s| {
        s.bot_messages(DM).iter().any(|m| m.content.contains("The end."))
    })
    .await;
    let parts = fake.bot_messages(DM);
    assert!(parts.len() >= 2, "{}", parts.len());
    assert_eq!(parts[0].reply_to, Some(asked.id));
    for part in &parts {
        assert!(part.content.chars().count() <= 2000);
        assert_eq!(part.content.matches("```").count() % 2, 0, "fences balanced: {}", part.content);
    }
    assert!(parts.last().unwrap().content.ends_with(&format!("`echo resume dc_{}`", asked.id)));
}

#[tokio::test]
async fn a_429_is_waited_out_and_a_file_of_the_answer_comes_as_an_attachment() {
    let fake = fake().await;
    let cwd = tempfile::tempdir().unwrap();
    let codex = format!(
        "default_cwd = \"{}\"\n[gateway.engines.codex]\ncli_path = \"{}\"\nenv = {{ FAKE_CLI_FIXTURE = \"{}/fixtures/cli/codex/synth_media_answer.jsonl\", FAKE_CLI_WRITE_FILE = \"chart.png=not really a png\" }}\n{}",
        cwd.path().display(),
        env!("CARGO_BIN_EXE_fake-cli"),
        env!("CARGO_MANIFEST_DIR"),
        crate::support::ALLOW_EVERY_CALL,
    );
    let home = home(&config(&fake, "engine = \"codex\"", &codex));
    let _gateway = start_in(&fake, home.path()).await;
    fake.fail_next("/messages", Fault::RateLimited { retry_after: 1.5, global: false });
    let asked = fake.inject_message(DM, USER, "plot it", false, None);
    fake.wait_until("the chart", PATIENCE, |s| {
        s.bot_messages(DM).iter().any(|m| !m.attachments.is_empty())
    })
    .await;
    let messages = fake.bot_messages(DM);
    let answer = messages.iter().find(|m| m.reply_to == Some(asked.id)).unwrap();
    assert!(answer.content.contains("Here is the chart."), "{}", answer.content);
    assert!(!answer.content.contains("MEDIA"), "{}", answer.content);
    let file = messages.iter().find(|m| !m.attachments.is_empty()).unwrap();
    assert_eq!(file.attachments, [("chart.png".to_owned(), b"not really a png".to_vec())]);
    assert!(file.id > answer.id, "the file follows the answer");
    let calls = fake.calls();
    let limited = calls.iter().position(|c| c.status == 429).expect("one call got 429");
    let retried = calls[limited + 1..].iter().find(|c| c.path == calls[limited].path).unwrap();
    assert!(
        retried.at.duration_since(calls[limited].at) >= Duration::from_millis(1500),
        "{}",
        fake.describe()
    );
    assert_within_limits(&fake);
}

#[tokio::test]
async fn a_mistake_in_the_discord_section_names_file_line_and_column() {
    let home = home_with("[gateway.discord]\nenabled = true\nallowed_guild_ids = [\"general\"]\n");
    let (code, stderr) = failed_start(home.path()).await;
    assert_ne!(code, Some(0));
    let path = home.path().join("config.toml");
    assert!(stderr.contains(&format!("{}:3:", path.display())), "{stderr}");
    assert!(stderr.contains("allowed_guild_ids"), "{stderr}");
}

#[tokio::test]
async fn a_wrong_token_is_reported_without_the_token_and_the_gateway_keeps_serving() {
    let fake = fake().await;
    let home = home_with(&config(&fake, "bot_token = \"not-the-right-token-1234\"", ""));
    let gateway = Gateway::start_in(home.path()).await;
    let status = gateway.status().await;
    let discord = &status["transports"]["discord"];
    let reason = discord["reason"].as_str().unwrap_or_default();
    assert_eq!(discord["state"], "failing", "{status}");
    assert!(reason.contains("token"), "{reason}");
    assert!(!status.to_string().contains("not-the-right-token"), "{status}");
    assert_eq!(gateway.get("/v1/runs").send().await.unwrap().status(), 200);
}

#[tokio::test]
async fn a_run_started_elsewhere_in_a_channels_session_is_posted_there() {
    let fake = fake().await;
    let home = home(&config(&fake, "", ""));
    let gateway = start_in(&fake, home.path()).await;
    let session = format!("agent:default:discord:{BOT_ID}:dm:{DM}");
    let run_id = gateway
        .submit(serde_json::json!({ "session_key": session, "prompt": "from the api" }))
        .await;
    gateway.wait(&run_id).await;
    fake.wait_until("the answer in the DM", PATIENCE, |s| {
        s.bot_messages(DM).iter().any(|m| m.content.starts_with("from the api"))
    })
    .await;
    let posted = fake.bot_messages(DM);
    assert_eq!(posted.len(), 1, "{}", fake.describe());
    assert_eq!(posted[0].reply_to, None);
}
