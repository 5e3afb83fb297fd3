//! The Bot API objects the fake reads from a bot's calls, in the fake's own
//! types (never the gateway's), with the field names of Telegram's documentation
//! (<https://core.telegram.org/bots/api#messageentity>,
//! <https://core.telegram.org/bots/api#botcommand>). Unknown fields are refused,
//! so a misspelt field fails here instead of being read the same wrong way on
//! both sides.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One special entity in a text message (`MessageEntity`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Entity {
    /// `mention`, `hashtag`, `bot_command`, `url`, `bold`, `code`, `pre`,
    /// `text_link`, `text_mention`, `custom_emoji`, … (the documentation's list).
    #[serde(rename = "type")]
    pub kind: String,
    /// Offset in UTF-16 code units to the start of the entity.
    pub offset: usize,
    /// Length of the entity in UTF-16 code units.
    pub length: usize,
    /// For `text_link` only: the URL opened on a tap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// For `text_mention` only: the mentioned user.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<Value>,
    /// For `pre` only: the programming language of the entity text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub language: Option<String>,
    /// For `custom_emoji` only: the sticker's identifier.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub custom_emoji_id: Option<String>,
}

/// The entity types of the documentation; any other is refused as Telegram
/// refuses it.
pub(super) const ENTITY_TYPES: [&str; 19] = [
    "mention",
    "hashtag",
    "cashtag",
    "bot_command",
    "url",
    "email",
    "phone_number",
    "bold",
    "italic",
    "underline",
    "strikethrough",
    "spoiler",
    "blockquote",
    "expandable_blockquote",
    "code",
    "pre",
    "text_link",
    "text_mention",
    "custom_emoji",
];

/// A command of the bot (`BotCommand`), as `setMyCommands` takes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Command {
    /// 1-32 characters: lowercase English letters, digits and underscores.
    pub command: String,
    /// 1-256 characters.
    pub description: String,
}

/// The body of `setMyCommands`: `commands` and the optional `scope` and
/// `language_code`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct SetMyCommands {
    pub(super) commands: Vec<Command>,
    #[serde(default)]
    pub(super) scope: Option<Value>,
    #[serde(default)]
    pub(super) language_code: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Entities as the documentation describes them, one of each shape.
    #[test]
    fn entities_from_the_documentation_parse() {
        let literal = r#"[
            {"type": "bot_command", "offset": 0, "length": 6},
            {"type": "pre", "offset": 7, "length": 12, "language": "python"},
            {"type": "text_link", "offset": 20, "length": 4, "url": "https://telegram.org/"},
            {"type": "text_mention", "offset": 25, "length": 3, "user": {"id": 1, "is_bot": false, "first_name": "Ann"}},
            {"type": "custom_emoji", "offset": 29, "length": 2, "custom_emoji_id": "5368324170671202286"}
        ]"#;
        let entities: Vec<Entity> = serde_json::from_str(literal).unwrap();
        assert_eq!(entities.len(), 5);
        assert_eq!(entities[0].kind, "bot_command");
        assert_eq!(entities[1].language.as_deref(), Some("python"));
        assert_eq!(entities[2].url.as_deref(), Some("https://telegram.org/"));
        assert_eq!(entities[3].user.as_ref().unwrap()["first_name"], "Ann");
        assert_eq!(entities[4].custom_emoji_id.as_deref(), Some("5368324170671202286"));
        assert!(entities.iter().all(|e| ENTITY_TYPES.contains(&e.kind.as_str())));
        // Back to the same JSON, absent fields left out.
        let again: Vec<Entity> =
            serde_json::from_value(serde_json::to_value(&entities).unwrap()).unwrap();
        assert_eq!(again, entities);
        assert!(serde_json::to_value(&entities[0]).unwrap().get("url").is_none());
    }

    #[test]
    fn a_misspelt_entity_field_is_refused() {
        for wrong in [
            r#"{"kind": "code", "offset": 0, "length": 1}"#,
            r#"{"type": "code", "start": 0, "length": 1}"#,
            r#"{"type": "pre", "offset": 0, "length": 1, "lang": "rust"}"#,
        ] {
            assert!(serde_json::from_str::<Entity>(wrong).is_err(), "{wrong}");
        }
    }

    #[test]
    fn set_my_commands_from_the_documentation_parses() {
        let literal = r#"{
            "commands": [
                {"command": "start", "description": "Start the bot"},
                {"command": "help", "description": "Show help"}
            ],
            "scope": {"type": "default"},
            "language_code": "en"
        }"#;
        let body: SetMyCommands = serde_json::from_str(literal).unwrap();
        assert_eq!(
            body.commands,
            [
                Command { command: "start".into(), description: "Start the bot".into() },
                Command { command: "help".into(), description: "Show help".into() },
            ]
        );
        assert_eq!(body.language_code.as_deref(), Some("en"));
        for wrong in [
            r#"{"commands": [{"name": "start", "description": "Start"}]}"#,
            r#"{"commands": [{"command": "start", "desc": "Start"}]}"#,
            r#"{"cmds": []}"#,
        ] {
            assert!(serde_json::from_str::<SetMyCommands>(wrong).is_err(), "{wrong}");
        }
    }
}
