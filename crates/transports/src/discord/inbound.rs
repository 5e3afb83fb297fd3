//! What an incoming Discord message or slash command means: which
//! conversation it belongs to, whether it is for the bot, and its text.

use lemon_core::ids::{RunId, SessionKey};
use lemon_core::router::ChannelRef;

use super::types::{ApplicationCommand, ApplicationCommandOption, CommandData, Message, Snowflake};

/// The transport's id, in session keys, bindings and status.
pub const TRANSPORT_ID: &str = "discord";

/// The slash commands registered as application commands; the router answers them.
pub const COMMANDS: [(&str, &str); 4] = [
    ("cancel", "Stop the running job"),
    ("new", "Start a fresh session for the next message"),
    ("status", "Show the running job, the queue and the engine"),
    ("engine", "Show or pick the engine"),
];

/// The application commands as Discord registers them; `/engine` takes an
/// optional engine id.
pub fn application_commands() -> Vec<ApplicationCommand> {
    COMMANDS
        .iter()
        .map(|(name, description)| ApplicationCommand {
            name: (*name).to_owned(),
            description: (*description).to_owned(),
            kind: 1,
            options: if *name == "engine" {
                vec![ApplicationCommandOption {
                    kind: 3,
                    name: "engine".to_owned(),
                    description: "The engine id, e.g. claude or claude:opus".to_owned(),
                    required: false,
                }]
            } else {
                Vec::new()
            },
        })
        .collect()
}

/// The text of a slash command as the router reads it (`/engine claude`);
/// `None` for a command the bot does not know.
pub fn command_text(data: &CommandData) -> Option<String> {
    let (name, _) = COMMANDS.iter().find(|(name, _)| *name == data.name)?;
    let args: Vec<String> = data
        .options
        .iter()
        .filter_map(|option| option.value.as_ref())
        .map(|value| value.as_str().map_or_else(|| value.to_string(), str::to_owned))
        .collect();
    let mut text = format!("/{name}");
    for arg in args {
        text.push(' ');
        text.push_str(arg.trim());
    }
    Some(text)
}

/// Where a message was written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Place {
    /// `None` in a DM.
    pub guild: Option<Snowflake>,
    /// The channel, or a thread's parent channel.
    pub channel: Snowflake,
    pub thread: Option<Snowflake>,
}

impl Place {
    /// Where answers go: the thread, else the channel.
    pub fn target(&self) -> Snowflake {
        self.thread.unwrap_or(self.channel)
    }
}

/// `agent:<agent>:discord:<bot>:dm:<channel>` for a DM,
/// `agent:<agent>:discord:<bot>:channel:<channel>` for a server channel and
/// `agent:<agent>:discord:<bot>:channel:<parent>:thread:<thread>` for a thread
/// (its own conversation). Channel ids are unique across servers.
pub fn session_key(agent_id: &str, bot: Snowflake, place: &Place) -> SessionKey {
    let base = format!("agent:{agent_id}:{TRANSPORT_ID}:{bot}");
    match (place.guild, place.thread) {
        (None, _) => format!("{base}:dm:{}", place.channel).into(),
        (Some(_), None) => format!("{base}:channel:{}", place.channel).into(),
        (Some(_), Some(thread)) => {
            format!("{base}:channel:{}:thread:{thread}", place.channel).into()
        }
    }
}

/// The channel and thread a session key of `bot` names ([`session_key`]'s
/// inverse), with whether it is a DM; `None` for any other shape.
pub fn place_of(session_key: &str, bot: Snowflake) -> Option<(bool, Snowflake, Option<Snowflake>)> {
    let parts: Vec<&str> = session_key.split(':').collect();
    let ["agent", agent, TRANSPORT_ID, owner, kind, channel, rest @ ..] = parts.as_slice() else {
        return None;
    };
    if agent.is_empty() || owner.parse::<u64>().ok()? != bot.0 {
        return None;
    }
    let channel = Snowflake(channel.parse().ok()?);
    match (*kind, rest) {
        ("dm", []) => Some((true, channel, None)),
        ("channel", []) => Some((false, channel, None)),
        ("channel", ["thread", thread]) => {
            Some((false, channel, Some(Snowflake(thread.parse().ok()?))))
        }
        _ => None,
    }
}

/// The channel and thread, for `[[gateway.bindings]]`.
pub fn channel_ref(place: &Place) -> ChannelRef {
    ChannelRef {
        transport: TRANSPORT_ID.to_owned(),
        chat_id: Some(place.channel.to_string()),
        topic_id: place.thread.map(|thread| thread.to_string()),
    }
}

/// The run id of a message: the same message always gets the same id, so a
/// message seen twice (a resumed session replaying it) is one run.
pub fn run_id(message_id: Snowflake) -> RunId {
    RunId::parse(&format!("dc_{message_id}")).unwrap_or_else(RunId::generate)
}

/// The run id of a slash command.
pub fn interaction_run_id(interaction_id: Snowflake) -> RunId {
    RunId::parse(&format!("dc_i_{interaction_id}")).unwrap_or_else(RunId::generate)
}

/// The prompt in a message for the bot `bot`, with its mentions of the bot
/// taken out; `None` when the message is not for the bot ([`text_for_bot`])
/// or its text is empty once the mention is gone.
pub fn prompt(message: &Message, bot: Snowflake, mention_required: bool) -> Option<String> {
    text_for_bot(message, bot, mention_required).filter(|text| !text.is_empty())
}

/// The text of a message for the bot `bot`, with its mentions of the bot
/// taken out (possibly empty: a message that only brings files); `None` when
/// the message is not for the bot: written by a bot, or, in a server with
/// `mention_required`, neither mentioning the bot nor replying to it.
pub fn text_for_bot(message: &Message, bot: Snowflake, mention_required: bool) -> Option<String> {
    if message.author.bot || message.author.id == bot {
        return None;
    }
    let tokens = [format!("<@{bot}>"), format!("<@!{bot}>")];
    let mentioned = message.mentions.iter().any(|user| user.id == bot)
        || tokens.iter().any(|token| message.content.contains(token.as_str()));
    let replies_to_bot =
        message.referenced_message.as_ref().is_some_and(|replied| replied.author.id == bot);
    if message.guild_id.is_some() && mention_required && !mentioned && !replies_to_bot {
        return None;
    }
    let mut text = message.content.clone();
    for token in &tokens {
        text = text.replace(token.as_str(), " ");
    }
    Some(text.trim().trim_start_matches([',', ':']).trim().to_owned())
}

#[cfg(test)]
mod tests {
    use super::super::types::{CommandOption, User};
    use super::*;
    use serde_json::json;

    const BOT: Snowflake = Snowflake(900);

    fn message(guild: Option<u64>, content: &str) -> Message {
        Message {
            id: Snowflake(1),
            channel_id: Snowflake(20),
            guild_id: guild.map(Snowflake),
            author: User { id: Snowflake(30), username: "ana".into(), bot: false },
            content: content.into(),
            mentions: Vec::new(),
            referenced_message: None,
            attachments: Vec::new(),
            flags: 0,
        }
    }

    #[test]
    fn session_keys_name_dms_channels_and_threads_and_read_back() {
        let dm = Place { guild: None, channel: Snowflake(5), thread: None };
        let channel = Place { guild: Some(Snowflake(1)), channel: Snowflake(6), thread: None };
        let thread = Place { thread: Some(Snowflake(7)), ..channel };
        assert_eq!(session_key("main", BOT, &dm), "agent:main:discord:900:dm:5");
        assert_eq!(session_key("main", BOT, &channel), "agent:main:discord:900:channel:6");
        assert_eq!(session_key("main", BOT, &thread), "agent:main:discord:900:channel:6:thread:7");
        assert_eq!(place_of(&session_key("a", BOT, &dm), BOT), Some((true, Snowflake(5), None)));
        assert_eq!(
            place_of(&session_key("a", BOT, &thread), BOT),
            Some((false, Snowflake(6), Some(Snowflake(7))))
        );
        for bad in [
            "agent:a:discord:901:dm:5",
            "agent:a:discord:900:dm:x",
            "agent:a:discord:900:dm:5:thread:7",
            "agent:a:discord:900:room:5",
            "agent:a:discord:900:channel:6:thread",
            "agent:a:telegram:900:dm:5",
            "agent::discord:900:dm:5",
        ] {
            assert_eq!(place_of(bad, BOT), None, "{bad}");
        }
        assert_eq!(channel_ref(&thread).topic_id.as_deref(), Some("7"));
        assert_eq!(channel_ref(&thread).chat_id.as_deref(), Some("6"));
    }

    #[test]
    fn in_servers_a_mention_or_a_reply_to_the_bot_is_needed() {
        assert_eq!(prompt(&message(Some(1), "hello"), BOT, true), None);
        assert_eq!(prompt(&message(Some(1), "hello"), BOT, false).as_deref(), Some("hello"));
        assert_eq!(prompt(&message(None, "hello"), BOT, true).as_deref(), Some("hello"));
        let mut mentioned = message(Some(1), "<@900> fix the test");
        assert_eq!(prompt(&mentioned, BOT, true).as_deref(), Some("fix the test"));
        mentioned.content = "<@!900>, /cancel".into();
        assert_eq!(prompt(&mentioned, BOT, true).as_deref(), Some("/cancel"));
        let mut reply = message(Some(1), "and now?");
        let mut answer = message(Some(1), "an answer");
        answer.author = User { id: BOT, username: "lemon".into(), bot: true };
        reply.referenced_message = Some(Box::new(answer));
        assert_eq!(prompt(&reply, BOT, true).as_deref(), Some("and now?"));
    }

    #[test]
    fn bots_and_empty_messages_get_nothing() {
        let mut from_bot = message(None, "hi");
        from_bot.author.bot = true;
        assert_eq!(prompt(&from_bot, BOT, false), None);
        assert_eq!(prompt(&message(None, "  <@900>  "), BOT, false), None);
        // A message that only brings files is for the bot, with no text.
        assert_eq!(text_for_bot(&message(None, "  <@900>  "), BOT, false).as_deref(), Some(""));
        assert_eq!(text_for_bot(&message(Some(1), "a file"), BOT, true), None);
    }

    #[test]
    fn slash_commands_read_as_text_commands() {
        let data = |name: &str, value: Option<serde_json::Value>| CommandData {
            name: name.into(),
            options: value
                .map(|value| vec![CommandOption { name: "engine".into(), value: Some(value) }])
                .unwrap_or_default(),
            custom_id: None,
        };
        assert_eq!(command_text(&data("cancel", None)).as_deref(), Some("/cancel"));
        assert_eq!(
            command_text(&data("engine", Some(json!("claude")))).as_deref(),
            Some("/engine claude")
        );
        assert_eq!(command_text(&data("deploy", None)), None);
        let names: Vec<String> = application_commands().into_iter().map(|c| c.name).collect();
        assert_eq!(names, ["cancel", "new", "status", "engine"]);
    }

    #[test]
    fn the_same_message_always_gets_the_same_run_id() {
        assert_eq!(run_id(Snowflake(42)).as_str(), "dc_42");
        assert_eq!(interaction_run_id(Snowflake(42)).as_str(), "dc_i_42");
    }
}
