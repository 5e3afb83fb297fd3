//! Text from outside (a CLI's stderr, an engine's error message) on its way into
//! a log field.
//!
//! A log line is only trustworthy if nothing it quotes can end it: a raw newline
//! in a field starts what looks like a new entry, and an ANSI escape can repaint
//! or erase what a terminal shows. [`escape`] makes such text one line of plain
//! characters in both the text and the JSON log format: control characters
//! (newlines, carriage returns, tabs, escapes, C1 controls) and the Unicode line
//! breaks and direction overrides are written as `\n`, `\r`, `\t` or `\u{…}`, and
//! a backslash as `\\`, so the escaped form is unambiguous.

use std::fmt::Write as _;

/// Longest escaped text a log field carries; the rest is cut.
pub const MAX_LOGGED_TEXT: usize = 4096;

/// `text` as one line without control characters, cut to [`MAX_LOGGED_TEXT`]
/// bytes (with a note of how much of the escaped text was left out).
pub fn escape(text: &str) -> String {
    escape_within(text, MAX_LOGGED_TEXT)
}

/// [`escape`] with another limit, in bytes of the escaped text.
pub fn escape_within(text: &str, max_bytes: usize) -> String {
    let mut out = String::with_capacity(text.len().min(max_bytes) + 16);
    let mut left_out = 0usize;
    let mut piece = String::new();
    for c in text.chars() {
        piece.clear();
        push_escaped(&mut piece, c);
        if left_out == 0 && out.len() + piece.len() <= max_bytes {
            out.push_str(&piece);
        } else {
            left_out += piece.len();
        }
    }
    if left_out > 0 {
        let _ = write!(out, "...[truncated {left_out} bytes]");
    }
    out
}

fn push_escaped(out: &mut String, c: char) {
    match c {
        '\\' => out.push_str("\\\\"),
        '\n' => out.push_str("\\n"),
        '\r' => out.push_str("\\r"),
        '\t' => out.push_str("\\t"),
        c if needs_escape(c) => {
            let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
        }
        c => out.push(c),
    }
}

/// Control characters, and the characters that break a line or reorder what is
/// shown around them.
fn needs_escape(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{2028}' | '\u{2029}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

#[cfg(test)]
mod tests;
