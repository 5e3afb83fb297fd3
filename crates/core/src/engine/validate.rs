//! Shapes of the values that end up on an engine's command line: model names and
//! resume tokens. Whatever a caller, a chat message, a stored session or the config
//! supplies is checked here before it can reach a vendor CLI, so no value can be
//! read there as an option (`--dangerously-skip-permissions`) or split into two.
//!
//! Both checks are deliberately narrow: ASCII only (no look-alike dashes), no
//! whitespace or control characters, never a leading `-`, and a length bound.

use std::fmt;

/// The longest model name accepted.
pub const MAX_MODEL_LEN: usize = 128;

/// The longest word-shaped resume token accepted (UUIDs, `ses_…`, thread ids).
pub const MAX_TOKEN_LEN: usize = 128;

/// Why a value was refused. The message describes the value's problem without
/// repeating the value, so it is safe to show and to log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum InvalidValue {
    #[error("it is empty")]
    Empty,
    #[error("it is longer than {max} characters")]
    TooLong { max: usize },
    #[error("it starts with '-'")]
    LeadingDash,
    #[error("it contains a character that is not allowed")]
    Character,
    #[error("it does not have the expected shape")]
    Shape,
}

/// Which value of a request a refusal is about, as the control API names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Field {
    /// The request's `engine` (its model part).
    Engine,
    /// The structured resume token's `engine`.
    ResumeEngine,
    /// The structured resume token's `value`.
    ResumeValue,
    /// The prompt: a resume line or a `/<engine>:<model>` directive in it.
    Prompt,
    /// `meta.model`.
    MetaModel,
}

impl Field {
    /// The field's name in a request body (`resume.value`, `engine`…).
    pub fn as_str(self) -> &'static str {
        match self {
            Field::Engine => "engine",
            Field::ResumeEngine => "resume.engine",
            Field::ResumeValue => "resume.value",
            Field::Prompt => "prompt",
            Field::MetaModel => "meta.model",
        }
    }
}

impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A model name: 1 to [`MAX_MODEL_LEN`] ASCII letters, digits and `._:/@-`, not
/// starting with `-` (`opus`, `gpt-5-codex`, `anthropic/claude-sonnet-4-5`,
/// `claude-opus-4-1@20250805`).
///
/// # Errors
/// [`InvalidValue`] saying what is wrong.
pub fn check_model(model: &str) -> Result<(), InvalidValue> {
    check_chars(model, MAX_MODEL_LEN, |b| {
        b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'/' | b'@' | b'-')
    })
}

/// A word-shaped resume token: 1 to [`MAX_TOKEN_LEN`] ASCII letters, digits, `_`
/// and `-`, not starting with `-` (a UUID, `sess_1`, `steer-0001`): the session
/// ids of Claude Code, Codex and Droid.
///
/// # Errors
/// [`InvalidValue`] saying what is wrong.
pub fn check_word_token(value: &str) -> Result<(), InvalidValue> {
    check_chars(value, MAX_TOKEN_LEN, |b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// A resume token of an engine that states no shape of its own: 1 to
/// [`MAX_TOKEN_LEN`] ASCII letters, digits and `_-.:` (the characters of run ids),
/// not starting with `-`.
///
/// # Errors
/// [`InvalidValue`] saying what is wrong.
pub fn check_token(value: &str) -> Result<(), InvalidValue> {
    check_chars(value, MAX_TOKEN_LEN, |b| {
        b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b':')
    })
}

/// The model part of a composite engine id (`claude:opus` → `opus`), checked.
/// An id without `:` has no model and passes.
///
/// # Errors
/// [`InvalidValue`] for a model part that [`check_model`] refuses (an empty one too).
pub fn check_engine_ref_model(engine_ref: &str) -> Result<(), InvalidValue> {
    match engine_ref.split_once(':') {
        Some((_, model)) => check_model(model),
        None => Ok(()),
    }
}

fn check_chars(value: &str, max: usize, allowed: impl Fn(u8) -> bool) -> Result<(), InvalidValue> {
    if value.is_empty() {
        return Err(InvalidValue::Empty);
    }
    if value.len() > max {
        return Err(InvalidValue::TooLong { max });
    }
    if value.starts_with('-') {
        return Err(InvalidValue::LeadingDash);
    }
    if !value.bytes().all(allowed) {
        return Err(InvalidValue::Character);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn real_model_names_are_accepted() {
        for model in [
            "opus",
            "sonnet",
            "gpt-5-codex",
            "anthropic/claude-sonnet-4-5",
            "claude-opus-4-1@20250805",
            "openrouter/meta-llama/llama-3.1-70b:free",
            "glm-5.1",
            "o3_mini",
        ] {
            assert_eq!(check_model(model), Ok(()), "{model}");
        }
    }

    #[test]
    fn model_names_that_could_be_options_or_split_are_refused() {
        let long = "a".repeat(MAX_MODEL_LEN + 1);
        let cases: [(&str, InvalidValue); 12] = [
            ("", InvalidValue::Empty),
            ("-x", InvalidValue::LeadingDash),
            ("--dangerously-skip-permissions", InvalidValue::LeadingDash),
            ("--allowedTools=Bash", InvalidValue::LeadingDash),
            ("opus --dangerously-skip-permissions", InvalidValue::Character),
            ("opus\n--resume", InvalidValue::Character),
            ("opus\t-x", InvalidValue::Character),
            ("opus=--x", InvalidValue::Character),
            ("\u{2010}\u{2010}dangerously", InvalidValue::Character),
            ("\u{2212}x", InvalidValue::Character),
            ("o\u{0440}us", InvalidValue::Character),
            (&long, InvalidValue::TooLong { max: MAX_MODEL_LEN }),
        ];
        for (model, why) in cases {
            assert_eq!(check_model(model), Err(why), "{model:?}");
        }
        assert_eq!(check_model(&"a".repeat(MAX_MODEL_LEN)), Ok(()));
    }

    #[test]
    fn word_tokens_of_the_fixtures_are_accepted() {
        for token in [
            "5b1c7a52-8f0e-4d7b-9c1a-2f3e4d5c6b7a",
            "0199a213-81c0-7800-8aa1-bbab2a035a53",
            "sess_1",
            "steer-0001",
            "full_lifecycle",
            "abc123",
            "42",
        ] {
            assert_eq!(check_word_token(token), Ok(()), "{token}");
        }
    }

    #[test]
    fn word_tokens_that_could_be_options_or_split_are_refused() {
        let long = "a".repeat(MAX_TOKEN_LEN + 1);
        let cases: [(&str, InvalidValue); 11] = [
            ("", InvalidValue::Empty),
            ("-x", InvalidValue::LeadingDash),
            ("--dangerously-bypass-approvals-and-sandbox", InvalidValue::LeadingDash),
            ("abc def", InvalidValue::Character),
            ("abc\n--x", InvalidValue::Character),
            ("abc\r", InvalidValue::Character),
            ("--resume=abc", InvalidValue::LeadingDash),
            ("abc=--x", InvalidValue::Character),
            ("\u{2013}\u{2013}yolo", InvalidValue::Character),
            ("abc\u{00a0}", InvalidValue::Character),
            (&long, InvalidValue::TooLong { max: MAX_TOKEN_LEN }),
        ];
        for (token, why) in cases {
            assert_eq!(check_word_token(token), Err(why), "{token:?}");
        }
    }

    #[test]
    fn default_tokens_allow_run_id_characters_but_never_an_option() {
        assert_eq!(check_token("01JX4Z:run.1_a-b"), Ok(()));
        assert_eq!(check_token("-x"), Err(InvalidValue::LeadingDash));
        assert_eq!(check_token("a b"), Err(InvalidValue::Character));
        assert_eq!(check_token("a=b"), Err(InvalidValue::Character));
        assert_eq!(check_token(""), Err(InvalidValue::Empty));
    }

    #[test]
    fn the_model_part_of_a_composite_id_is_checked() {
        assert_eq!(check_engine_ref_model("claude"), Ok(()));
        assert_eq!(check_engine_ref_model("claude:opus"), Ok(()));
        assert_eq!(
            check_engine_ref_model("claude:--dangerously-skip-permissions"),
            Err(InvalidValue::LeadingDash)
        );
        assert_eq!(check_engine_ref_model("claude:"), Err(InvalidValue::Empty));
    }
}
