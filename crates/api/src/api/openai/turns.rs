//! The messages of an OpenAI request, reduced to what a run takes: the newest
//! user message as the prompt, with the earlier messages written before it only
//! when the engine does not already hold the conversation.

use super::error::OpenAiError;

/// Who wrote a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// `system` and `developer`: instructions.
    System,
    User,
    Assistant,
    /// `tool` and `function`: a tool's result the client ran.
    Tool,
}

impl Role {
    /// A role as OpenAI's clients name it.
    ///
    /// # Errors
    /// A `400` naming the roles there are.
    pub(crate) fn parse(raw: &str) -> Result<Role, OpenAiError> {
        match raw {
            "system" | "developer" => Ok(Role::System),
            "user" => Ok(Role::User),
            "assistant" => Ok(Role::Assistant),
            "tool" | "function" => Ok(Role::Tool),
            other => Err(OpenAiError::invalid(format!(
                "unknown role {other:?}: expected system, developer, user, assistant or tool"
            ))
            .with_param("messages")),
        }
    }

    fn label(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        }
    }
}

/// One message: its role, its text, and the images and files it carries
/// (only the last user message's reach the run).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Turn {
    pub(crate) role: Role,
    pub(crate) text: String,
    pub(crate) files: Vec<crate::files::IncomingFile>,
}

/// The prompt of a request whose last message is the user's. With `history`,
/// the earlier messages come first, as a transcript the engine can read; without,
/// only the newest message is sent (the engine's own session has the rest).
///
/// # Errors
/// A `400` when there is no message, the last one is not the user's, or it is blank.
pub(crate) fn prompt(
    turns: &[Turn],
    history: bool,
    param: &'static str,
) -> Result<String, OpenAiError> {
    let Some((last, earlier)) = turns.split_last() else {
        return Err(OpenAiError::invalid("at least one message is required").with_param(param));
    };
    if last.role != Role::User {
        return Err(OpenAiError::invalid(format!(
            "the last message must be the user's (it is the prompt), not the {}'s",
            last.role.label()
        ))
        .with_param(param));
    }
    if last.text.trim().is_empty() {
        return Err(
            OpenAiError::invalid("the last user message must not be empty").with_param(param)
        );
    }
    let earlier: Vec<&Turn> = earlier.iter().filter(|turn| !turn.text.trim().is_empty()).collect();
    if !history || earlier.is_empty() {
        return Ok(last.text.clone());
    }
    let mut out = String::from("<conversation so far>\n");
    for turn in earlier {
        out.push_str(turn.role.label());
        out.push_str(": ");
        out.push_str(turn.text.trim_end());
        out.push('\n');
    }
    out.push_str("</conversation so far>\n\n");
    out.push_str(&last.text);
    Ok(out)
}
