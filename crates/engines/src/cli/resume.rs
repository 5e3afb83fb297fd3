//! Each vendor's resume line: what a user pastes to continue a session.
//!
//! | vendor | line | token |
//! |---|---|---|
//! | claude | `claude --resume <id>` | `[A-Za-z0-9_-]+` |
//! | codex | `codex resume <id>` | `[A-Za-z0-9_-]+` |
//! | opencode | `opencode [run] --session\|-s ses_<id>` | `ses_[A-Za-z0-9]+` |
//! | pi | `pi --session <token>` | a word, or a `"…"` / `'…'` quoted string |
//! | droid | `droid [exec] -s\|--session <id>` | `[A-Za-z0-9_-]+` |
//!
//! Words match case-insensitively, optionally inside backticks, anywhere in a text
//! for [`extract`] (the command word must start a word) and as the whole trimmed
//! line for [`is_resume_line`]. [`format()`] renders the first form, in backticks.
//! [`check`] is the shape a token must have before it may reach the command line.

use lemon_core::engine::validate::{check_word_token, MAX_TOKEN_LEN};
use lemon_core::engine::{InvalidValue, ResumeToken};

use super::Vendor;

/// The line that continues `value`'s session, in backticks.
pub(crate) fn format(vendor: Vendor, value: &str) -> String {
    match vendor {
        Vendor::Claude => format!("`claude --resume {value}`"),
        Vendor::Codex => format!("`codex resume {value}`"),
        Vendor::Opencode => format!("`opencode --session {value}`"),
        Vendor::Pi => format!("`pi --session {}`", quote_pi(value)),
        Vendor::Droid => format!("`droid exec -s {value}`"),
    }
}

/// Pi tokens (session file paths) are quoted when they hold whitespace or quotes.
fn quote_pi(value: &str) -> String {
    if value.is_empty()
        || value.chars().any(|c| c.is_whitespace() || c == '"' || c == '\'' || c == '`')
    {
        let escaped = value.replace('\\', "\\\\").replace('"', "\\\"");
        format!("\"{escaped}\"")
    } else {
        value.to_owned()
    }
}

/// The longest pi token accepted: a session file path.
pub(crate) const MAX_PI_TOKEN_LEN: usize = 4096;

/// Whether `value` has the shape of a `vendor` session id, and so may follow its
/// option on the command line:
/// - claude, codex, droid: `[A-Za-z0-9_-]+`, not starting with `-` (UUIDs, `sess_1`);
/// - opencode: `ses_` and ASCII letters and digits;
/// - pi: a session id (`[A-Za-z0-9_.-]+`, not starting with `-`), or a session file
///   path (it holds `/` or starts with `~`) without control characters that does
///   not start with `-`.
///
/// Every shape is bounded in length ([`MAX_TOKEN_LEN`], pi paths [`MAX_PI_TOKEN_LEN`]).
pub(crate) fn check(vendor: Vendor, value: &str) -> Result<(), InvalidValue> {
    match vendor {
        Vendor::Claude | Vendor::Codex | Vendor::Droid => check_word_token(value),
        Vendor::Opencode => {
            check_word_token(value)?;
            let id = value.get(..4).filter(|p| p.eq_ignore_ascii_case("ses_")).map(|_| &value[4..]);
            match id {
                Some(id) if !id.is_empty() && id.bytes().all(|b| b.is_ascii_alphanumeric()) => {
                    Ok(())
                }
                _ => Err(InvalidValue::Shape),
            }
        }
        Vendor::Pi => check_pi(value),
    }
}

fn check_pi(value: &str) -> Result<(), InvalidValue> {
    if value.is_empty() {
        return Err(InvalidValue::Empty);
    }
    if value.starts_with('-') {
        return Err(InvalidValue::LeadingDash);
    }
    let word = value.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
    if word {
        return match value.len() {
            len if len > MAX_TOKEN_LEN => Err(InvalidValue::TooLong { max: MAX_TOKEN_LEN }),
            _ => Ok(()),
        };
    }
    if value.len() > MAX_PI_TOKEN_LEN {
        return Err(InvalidValue::TooLong { max: MAX_PI_TOKEN_LEN });
    }
    if value.chars().any(char::is_control) {
        return Err(InvalidValue::Character);
    }
    if value.contains('/') || value.starts_with('~') {
        Ok(())
    } else {
        Err(InvalidValue::Shape)
    }
}

/// The first resume line of `vendor` anywhere in `text`.
pub(crate) fn extract(vendor: Vendor, text: &str) -> Option<ResumeToken> {
    text.char_indices()
        .filter(|(i, _)| starts_word(text, *i))
        .find_map(|(i, _)| match_at(vendor, &text[i..]))
        .map(|m| ResumeToken::new(vendor.id(), m.value))
}

/// Whether the whole trimmed `line` is a resume line of `vendor`.
pub(crate) fn is_resume_line(vendor: Vendor, line: &str) -> bool {
    let line = line.trim();
    match_at(vendor, line).is_some_and(|m| m.len == line.len())
}

/// Whether a command word may start at byte `i`: at the start, or after a character
/// that cannot be part of a word.
fn starts_word(text: &str, i: usize) -> bool {
    text[..i]
        .chars()
        .next_back()
        .is_none_or(|c| !(c.is_alphanumeric() || c == '_' || c == '-' || c == '.' || c == '/'))
}

struct Match {
    value: String,
    /// Bytes matched, including an optional closing backtick.
    len: usize,
}

/// The command words of a vendor's resume line: each a set of alternatives, and
/// whether it may be left out.
fn words(vendor: Vendor) -> &'static [(&'static [&'static str], bool)] {
    match vendor {
        Vendor::Claude => &[(&["claude"], false), (&["--resume"], false)],
        Vendor::Codex => &[(&["codex"], false), (&["resume"], false)],
        Vendor::Opencode => {
            &[(&["opencode"], false), (&["run"], true), (&["--session", "-s"], false)]
        }
        Vendor::Pi => &[(&["pi"], false), (&["--session"], false)],
        Vendor::Droid => &[(&["droid"], false), (&["exec"], true), (&["-s", "--session"], false)],
    }
}

/// Matches `` `?<words> <token>`? `` at the start of `text`.
fn match_at(vendor: Vendor, text: &str) -> Option<Match> {
    let mut rest = text.strip_prefix('`').unwrap_or(text);
    for (i, (alternatives, optional)) in words(vendor).iter().enumerate() {
        let candidate = if i == 0 { Some(rest) } else { skip_space(rest) };
        let after = candidate
            .and_then(|candidate| alternatives.iter().find_map(|word| strip_word(candidate, word)));
        match after {
            Some(after) => rest = after,
            None if *optional => {}
            None => return None,
        }
    }
    let after_words = skip_space(rest)?;
    let (value, token_len) = token(vendor, after_words)?;
    let mut end = text.len() - after_words.len() + token_len;
    if text[end..].starts_with('`') {
        end += 1;
    }
    Some(Match { value, len: end })
}

/// `text` after its leading whitespace, when it has some.
fn skip_space(text: &str) -> Option<&str> {
    let trimmed = text.trim_start();
    (trimmed.len() < text.len()).then_some(trimmed)
}

/// `text` after `word` (any case) when a space follows it.
fn strip_word<'a>(text: &'a str, word: &str) -> Option<&'a str> {
    let head = text.get(..word.len())?;
    let rest = &text[word.len()..];
    (head.eq_ignore_ascii_case(word) && rest.starts_with(char::is_whitespace)).then_some(rest)
}

/// The token at the start of `text`: its value and the bytes it spans.
fn token(vendor: Vendor, text: &str) -> Option<(String, usize)> {
    match vendor {
        Vendor::Opencode => {
            let prefix = text.get(..4).filter(|p| p.eq_ignore_ascii_case("ses_"))?;
            let rest = text[prefix.len()..].bytes().take_while(u8::is_ascii_alphanumeric).count();
            (rest > 0).then(|| (text[..4 + rest].to_owned(), 4 + rest))
        }
        Vendor::Pi => pi_token(text),
        Vendor::Claude | Vendor::Codex | Vendor::Droid => {
            let len = text
                .bytes()
                .take_while(|b| b.is_ascii_alphanumeric() || *b == b'_' || *b == b'-')
                .count();
            (len > 0).then(|| (text[..len].to_owned(), len))
        }
    }
}

/// A quoted string (with `\` escapes) or a run of non-whitespace without backticks.
fn pi_token(text: &str) -> Option<(String, usize)> {
    let mut chars = text.char_indices();
    match chars.next()? {
        (_, quote @ ('"' | '\'')) => {
            let mut value = String::new();
            let mut escaped = false;
            for (i, c) in chars {
                if escaped {
                    value.push(c);
                    escaped = false;
                } else if c == '\\' {
                    escaped = true;
                } else if c == quote {
                    return (!value.is_empty()).then(|| (value, i + c.len_utf8()));
                } else {
                    value.push(c);
                }
            }
            None
        }
        _ => {
            let len = text.find(|c: char| c.is_whitespace() || c == '`').unwrap_or(text.len());
            (len > 0).then(|| (text[..len].to_owned(), len))
        }
    }
}

#[cfg(test)]
mod tests;
