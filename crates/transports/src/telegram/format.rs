//! Engine answers, written in Markdown, turned into Telegram text with entities.
//!
//! Only code is formatted: fenced code blocks become `pre` entities and inline code
//! spans become `code` entities. Everything else is kept literally and no parse mode
//! is used, so Telegram has nothing to reject: a stray `*` or `_` is just a
//! character. Unclosed fences and unmatched backticks stay as they are.
//!
//! Offsets and lengths of entities count UTF-16 code units, as the Bot API wants.
//! The converted text is never longer than the source: conversion only removes
//! fence lines, backticks and indentation.

use super::types::{FormattedText, MessageEntity};

/// Length of `s` in UTF-16 code units, the unit of Telegram's limits and offsets.
pub fn utf16_len(s: &str) -> usize {
    s.chars().map(char::len_utf16).sum()
}

/// Converts Markdown code to Telegram entities and keeps the rest as plain text.
///
/// - A fenced code block (a line of three or more backticks with an optional info
///   string, up to a line of at least as many backticks) becomes a `pre` entity
///   whose language is the first word of the info string; the fence lines go.
/// - An inline code span (a run of backticks up to the next run of the same length
///   on the same line) becomes a `code` entity without its backticks.
///
/// Entities come out sorted by offset, never overlap and never have length zero.
pub fn markdown_to_telegram(src: &str) -> FormattedText {
    let mut out = Builder::default();
    let mut pos = 0;
    for fence in code_fences(src) {
        push_inline(&mut out, &src[pos..fence.open_start]);
        push_code_block(&mut out, src, &fence);
        pos = fence.close_end;
    }
    push_inline(&mut out, &src[pos..]);
    FormattedText { text: out.text, entities: out.entities }
}

/// A fenced code block of a Markdown source, located by byte offsets.
///
/// Only fences that are closed are reported: an opening fence without a closing
/// one is literal text, both here and in [`markdown_to_telegram`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CodeFence {
    /// Start of the opening fence line.
    pub(crate) open_start: usize,
    /// Start of the first content line, just after the opening line's newline.
    pub(crate) content_start: usize,
    /// Start of the closing fence line; the content is `content_start..close_start`.
    pub(crate) close_start: usize,
    /// End of the closing fence line's text, before its line break.
    pub(crate) close_text_end: usize,
    /// End of the closing fence line including its line break, if it has one.
    pub(crate) close_end: usize,
    /// Spaces before the opening backticks; content lines lose up to as many.
    pub(crate) indent: usize,
    /// Number of backticks of the opening fence.
    pub(crate) ticks: usize,
    /// The info string, trimmed; empty when there is none.
    pub(crate) info: String,
}

impl CodeFence {
    /// The language named by the info string: its first word.
    pub(crate) fn language(&self) -> Option<&str> {
        self.info.split_whitespace().next()
    }
}

/// A line of the source: its byte range with and without the line break.
#[derive(Debug, Clone, Copy)]
struct Line {
    start: usize,
    text_end: usize,
    end: usize,
}

/// Bytes of the line break `s` ends with: 2 for `\r\n`, 1 for `\n`, else 0.
fn line_break_len(s: &str) -> usize {
    if s.ends_with("\r\n") {
        2
    } else {
        usize::from(s.ends_with('\n'))
    }
}

fn lines(src: &str) -> Vec<Line> {
    let mut lines = Vec::new();
    let mut start = 0;
    while start < src.len() {
        let end = src[start..].find('\n').map_or(src.len(), |i| start + i + 1);
        let text_end = end - line_break_len(&src[start..end]);
        lines.push(Line { start, text_end, end });
        start = end;
    }
    lines
}

/// Up to three spaces, then a run of backticks: `(indent, ticks, rest)`.
fn fence_parts(line: &str) -> Option<(usize, usize, &str)> {
    let indent = line.len() - line.trim_start_matches(' ').len();
    if indent > 3 {
        return None;
    }
    let after_indent = &line[indent..];
    let ticks = after_indent.len() - after_indent.trim_start_matches('`').len();
    (ticks >= 3).then(|| (indent, ticks, &after_indent[ticks..]))
}

/// An opening fence: the info string may not contain backticks.
fn opening_fence(line: &str) -> Option<(usize, usize, &str)> {
    fence_parts(line).filter(|(_, _, info)| !info.contains('`'))
}

/// A closing fence: nothing but whitespace after the backticks. Returns its ticks.
fn closing_fence_ticks(line: &str) -> Option<usize> {
    fence_parts(line).filter(|(_, _, rest)| rest.trim().is_empty()).map(|(_, ticks, _)| ticks)
}

/// Every closed fenced code block of `src`, in order. Linear in the source size.
pub(crate) fn code_fences(src: &str) -> Vec<CodeFence> {
    let lines = lines(src);
    let closer_ticks: Vec<usize> =
        lines.iter().map(|l| closing_fence_ticks(&src[l.start..l.text_end]).unwrap_or(0)).collect();
    // most_ticks_after[i]: the longest closing fence among lines i.. (0 when none),
    // so an opening fence without a closing one is recognised without a scan.
    let mut most_ticks_after = vec![0; lines.len() + 1];
    for i in (0..lines.len()).rev() {
        most_ticks_after[i] = most_ticks_after[i + 1].max(closer_ticks[i]);
    }
    let mut fences = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let open = lines[i];
        let Some((indent, ticks, info)) = opening_fence(&src[open.start..open.text_end]) else {
            i += 1;
            continue;
        };
        if most_ticks_after[i + 1] < ticks {
            i += 1;
            continue;
        }
        // A closing fence exists below; the lines scanned here are consumed.
        let Some(j) = (i + 1..lines.len()).find(|&j| closer_ticks[j] >= ticks) else {
            i += 1;
            continue;
        };
        let close = lines[j];
        fences.push(CodeFence {
            open_start: open.start,
            content_start: open.end,
            close_start: close.start,
            close_text_end: close.text_end,
            close_end: close.end,
            indent,
            ticks,
            info: info.trim().to_owned(),
        });
        i = j + 1;
    }
    fences
}

/// Text under construction, with its length in UTF-16 units kept up to date.
#[derive(Debug, Default)]
struct Builder {
    text: String,
    utf16: usize,
    entities: Vec<MessageEntity>,
}

impl Builder {
    fn push(&mut self, s: &str) {
        self.text.push_str(s);
        self.utf16 += utf16_len(s);
    }

    fn pop_line_break(&mut self) {
        let n = line_break_len(&self.text);
        self.text.truncate(self.text.len() - n);
        // `\r` and `\n` are one UTF-16 unit each.
        self.utf16 -= n;
    }

    fn entity(&mut self, kind: &str, offset: usize, length: usize, language: Option<&str>) {
        if length > 0 {
            self.entities.push(MessageEntity {
                kind: kind.to_owned(),
                offset,
                length,
                language: language.map(str::to_owned),
            });
        }
    }
}

fn push_code_block(out: &mut Builder, src: &str, fence: &CodeFence) {
    let offset = out.utf16;
    let from = out.text.len();
    for line in src[fence.content_start..fence.close_start].split_inclusive('\n') {
        let spaces = line.len() - line.trim_start_matches(' ').len();
        out.push(&line[spaces.min(fence.indent)..]);
    }
    if out.text.len() == from {
        return;
    }
    // The last line break stays plain text after the entity, or goes when the
    // closing fence ended the source.
    let code = &out.text[from..];
    let line_break = line_break_len(code);
    let length = out.utf16 - offset - line_break;
    out.entity("pre", offset, length, fence.language());
    if fence.close_end == src.len() && fence.close_text_end == fence.close_end {
        out.pop_line_break();
    }
}

/// Plain text with inline code spans; spans never cross a line break.
fn push_inline(out: &mut Builder, text: &str) {
    for line in text.split_inclusive('\n') {
        push_inline_line(out, line);
    }
}

fn backtick_run(bytes: &[u8], at: usize) -> usize {
    bytes[at..].iter().take_while(|&&b| b == b'`').count()
}

fn push_inline_line(out: &mut Builder, line: &str) {
    let bytes = line.as_bytes();
    // `plain_from..i` is literal text not yet pushed. Backticks are ASCII, so every
    // index where one is found is a char boundary.
    let mut plain_from = 0;
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] != b'`' {
            i += 1;
            continue;
        }
        let run = backtick_run(bytes, i);
        match closing_run(bytes, i + run, run) {
            Some(close) if !line[i + run..close].trim().is_empty() => {
                out.push(&line[plain_from..i]);
                let mut code = &line[i + run..close];
                if code.len() >= 2 && code.starts_with(' ') && code.ends_with(' ') {
                    code = &code[1..code.len() - 1];
                }
                let offset = out.utf16;
                out.push(code);
                out.entity("code", offset, out.utf16 - offset, None);
                i = close + run;
                plain_from = i;
            }
            _ => i += run,
        }
    }
    out.push(&line[plain_from..]);
}

/// Start of the next run of exactly `run` backticks at or after `from`.
fn closing_run(bytes: &[u8], from: usize, run: usize) -> Option<usize> {
    let mut i = from;
    while i < bytes.len() {
        if bytes[i] == b'`' {
            let len = backtick_run(bytes, i);
            if len == run {
                return Some(i);
            }
            i += len;
        } else {
            i += 1;
        }
    }
    None
}

#[cfg(test)]
pub(crate) mod tests;
