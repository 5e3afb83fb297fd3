//! Discord gateway frames: each text frame read as the session reads it, the
//! `READY`, `MESSAGE_CREATE` and `INTERACTION_CREATE` dispatches decoded as the
//! bot decodes them, close codes classified.
//!
//! Input: frames, one a line; a line `close <code> <reason>` is a close frame.
//! Properties: a payload's fields are the frame's; a `READY` becomes a
//! session only when it names one; a message's prompt is trimmed, not empty,
//! free of the bot's mention, never for a bot's own message, and also there
//! without `mention_required`; a place's session key reads back to the place;
//! a known slash command reads as `/<name> args`.
#![no_main]

use lemon_transports::discord::gateway::GatewayEvent;
use lemon_transports::discord::inbound::{command_text, place_of, prompt, session_key, Place};
use lemon_transports::discord::types::{Interaction, Message, Snowflake};
use lemon_transports::fuzzing::{discord_frame, DiscordFrame};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

const BOT: Snowflake = Snowflake(900);

fn check_message(message: &Message) {
    let strict = prompt(message, BOT, true);
    let loose = prompt(message, BOT, false);
    if let Some(text) = &strict {
        assert_eq!(strict, loose, "a prompt that needs no mention differs");
        assert!(!text.is_empty() && text.trim() == text, "untrimmed prompt {text:?}");
        assert!(!text.contains("<@900>") && !text.contains("<@!900>"), "mention left in {text:?}");
    }
    if message.author.bot || message.author.id == BOT {
        assert!(loose.is_none(), "a prompt from a bot's message");
    }
    if message.guild_id.is_none() {
        assert_eq!(strict, loose, "a DM needs no mention");
    }
    for thread in [None, Some(Snowflake(message.id.0))] {
        let place = Place { guild: message.guild_id, channel: message.channel_id, thread };
        let key = session_key("main", BOT, &place);
        let back = place_of(key.as_str(), BOT).expect("a session key reads back");
        let thread = if place.guild.is_none() { None } else { thread };
        assert_eq!(back, (place.guild.is_none(), place.channel, thread), "{key:?}");
    }
}

fn check_interaction(interaction: &Interaction) {
    if let Some(data) = &interaction.data {
        if let Some(text) = command_text(data) {
            assert!(text.starts_with(&format!("/{}", data.name)), "{text:?} for {}", data.name);
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    for line in text.lines().take(64) {
        let frame = match line.strip_prefix("close ") {
            Some(rest) => {
                let (code, reason) = rest.split_once(' ').unwrap_or((rest, ""));
                let Ok(code) = code.parse::<u16>() else { continue };
                let frame = discord_frame(reason, Some(code));
                match &frame {
                    DiscordFrame::Closed { code: got, fatal } => {
                        assert_eq!(*got, code);
                        assert_eq!(*fatal, matches!(code, 4004 | 4010..=4014), "close code {code}");
                    }
                    other => panic!("a close frame read as {other:?}"),
                }
                continue;
            }
            None => discord_frame(line, None),
        };
        let DiscordFrame::Payload { op, seq, name, data, ready } = frame else { continue };
        // A field the gateway does not read may hold a number no `Value` can
        // (`1e7777`): the frame is still read, there is only nothing to compare.
        let Ok(raw) = serde_json::from_str::<Value>(line) else { continue };
        // serde also reads a struct from a list of its fields (`[0]`); only an
        // object names them.
        if !raw.is_object() {
            continue;
        }
        assert_eq!(raw.get("op").and_then(Value::as_u64), Some(u64::from(op)));
        assert_eq!(seq, raw.get("s").and_then(Value::as_u64));
        assert_eq!(name.as_deref(), raw.get("t").and_then(Value::as_str));
        match (&ready, name.as_deref()) {
            (Some(GatewayEvent::Ready { session_id, resume_url, .. }), Some("READY")) => {
                assert_eq!(
                    Some(session_id.as_str()),
                    data.get("session_id").and_then(Value::as_str)
                );
                assert_eq!(
                    Some(resume_url.as_str()),
                    data.get("resume_gateway_url").and_then(Value::as_str)
                );
            }
            (Some(other), _) => panic!("{other:?} from a {name:?} frame"),
            (None, _) => {}
        }
        if op != 0 {
            assert!(ready.is_none());
            continue;
        }
        match name.as_deref() {
            Some("MESSAGE_CREATE") => {
                if let Ok(message) = serde_json::from_value::<Message>(data) {
                    check_message(&message);
                }
            }
            Some("INTERACTION_CREATE") => {
                if let Ok(interaction) = serde_json::from_value::<Interaction>(data) {
                    check_interaction(&interaction);
                }
            }
            _ => {}
        }
    }
});
