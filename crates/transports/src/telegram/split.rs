//! Long Markdown cut into chunks that each fit one Telegram message.
//!
//! Chunks are cut at the last paragraph break that leaves the chunk at least half
//! full, else at the last such line break, else at the last such space (outside
//! code), else at any line break, else between two characters. A chunk that stops inside a fenced code block gets a closing fence,
//! and the next chunk opens the block again with the same info string, so each
//! chunk renders on its own. The added fence lines count toward the limit.
//!
//! The whitespace at a cut (the paragraph break, line break or space) is dropped,
//! except inside code blocks where only the line break itself goes; nothing else
//! of the source is lost or reordered.

use std::ops::Range;

use super::format::{code_fences, utf16_len, CodeFence};

/// Splits Markdown into chunks of at most `max_utf16` UTF-16 units each.
///
/// No chunk is empty or whitespace only; the source's leading blank lines and
/// trailing whitespace are left out. A `max_utf16` below 2 is taken as 2 so that
/// every character fits. Fences are repaired only when the fence lines leave room
/// for content (a limit of a few dozen units is plenty); with a smaller limit
/// chunks are cut without regard to code blocks.
pub fn split_markdown(src: &str, max_utf16: usize) -> Vec<String> {
    plan(src, max_utf16).iter().map(|chunk| chunk.render(src)).collect()
}

/// One chunk of a split: a slice of the source, maybe wrapped in fence lines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Chunk {
    /// A fence line reopening the code block the previous chunk closed, or empty.
    pub(crate) reopen: String,
    /// The slice of the source this chunk carries.
    pub(crate) body: Range<usize>,
    /// A fence line closing a code block the body leaves open, or empty.
    pub(crate) close: String,
}

impl Chunk {
    pub(crate) fn render(&self, src: &str) -> String {
        [self.reopen.as_str(), &src[self.body.clone()], self.close.as_str()].concat()
    }
}

/// Where a chunk may end, from the most to the least preferred.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Cut {
    /// At a line break followed by a blank line, outside code.
    Paragraph,
    /// At a line break.
    Line,
    /// At a space or tab.
    Space,
    /// Between any two characters.
    Char,
}

/// The source with what the planner asks about it answered quickly.
#[derive(Debug)]
struct Source<'a> {
    text: &'a str,
    /// UTF-16 units before each byte offset (meaningful at char boundaries).
    units_before: Vec<usize>,
    fences: Vec<CodeFence>,
}

impl<'a> Source<'a> {
    fn new(text: &'a str) -> Self {
        let mut units_before = vec![0; text.len() + 1];
        let mut units = 0;
        for (at, c) in text.char_indices() {
            units_before[at..at + c.len_utf8()].fill(units);
            units += c.len_utf16();
        }
        units_before[text.len()] = units;
        Source { text, units_before, fences: code_fences(text) }
    }

    fn units(&self, range: Range<usize>) -> usize {
        self.units_before[range.end] - self.units_before[range.start]
    }

    fn is_line_start(&self, at: usize) -> bool {
        at == 0 || self.text.as_bytes()[at - 1] == b'\n'
    }

    /// The code block whose content (or the end of it) `at` is in, where a chunk
    /// starting at `at` must reopen the block.
    fn reopening_fence(&self, at: usize) -> Option<&CodeFence> {
        let i = self.fences.partition_point(|f| f.close_start < at);
        self.fences.get(i).filter(|f| f.content_start <= at)
    }

    /// The code block a chunk ending at `at` would leave open, and whether ending
    /// there is allowed at all (not inside a fence line).
    fn open_fence_at_end(&self, at: usize) -> Result<Option<&CodeFence>, ()> {
        let i = self.fences.partition_point(|f| f.close_text_end <= at);
        match self.fences.get(i) {
            Some(f) if f.open_start < at => {
                if at <= f.content_start || at > f.close_start {
                    Err(())
                } else {
                    Ok(Some(f))
                }
            }
            _ => Ok(None),
        }
    }

    /// Skips the whitespace between two chunks outside code: blank lines and the
    /// spaces of a cut, but not the indentation of the next line.
    fn skip_gap(&self, at: usize) -> usize {
        let rest = &self.text[at..];
        let gap = rest.len() - rest.trim_start().len();
        match rest[..gap].rfind('\n') {
            Some(i) => at + i + 1,
            None if self.is_line_start(at) && gap < rest.len() => at,
            None => at + gap,
        }
    }

    fn cut_at(&self, at: usize, inside_code: bool) -> Option<Cut> {
        let bytes = self.text.as_bytes();
        match bytes.get(at) {
            Some(b'\n') => {
                let next_line = &self.text[at + 1..];
                let blank =
                    next_line.split_once('\n').is_some_and(|(line, _)| line.trim().is_empty());
                Some(if blank && !inside_code { Cut::Paragraph } else { Cut::Line })
            }
            // Inside code a space is part of the code, as good as any character.
            Some(b' ' | b'\t') if !inside_code => Some(Cut::Space),
            Some(_) if self.text.is_char_boundary(at) => Some(Cut::Char),
            _ => None,
        }
    }
}

/// The fence line that reopens `fence` at the start of a chunk, if there is room
/// for it, its closing fence and some content within `max` units.
fn reopen_line(fence: &CodeFence, max: usize) -> Option<String> {
    let indent = " ".repeat(fence.indent);
    let ticks = "`".repeat(fence.ticks);
    let closing = fence.ticks + 1;
    let with_info = format!("{indent}{ticks}{}\n", fence.info);
    if utf16_len(&with_info) + closing <= max / 2 {
        return Some(with_info);
    }
    let bare = format!("{indent}{ticks}\n");
    (bare.len() + closing + 2 <= max).then_some(bare)
}

fn closing_line(fence: &CodeFence, body: &str) -> String {
    let ticks = "`".repeat(fence.ticks);
    if body.ends_with('\n') {
        ticks
    } else {
        format!("\n{ticks}")
    }
}

/// Plans the chunks of `src` (see [`split_markdown`]).
pub(crate) fn plan(src: &str, max_utf16: usize) -> Vec<Chunk> {
    let max = max_utf16.max(2);
    let source = Source::new(src);
    let mut chunks = Vec::new();
    let mut pos = 0;
    // The opening of the code block the last chunk closed with a fence line of
    // its own, if it did.
    let mut closed_block = None;
    loop {
        let reopening = source.reopening_fence(pos);
        if let Some(fence) = reopening {
            if closed_block == Some(fence.open_start)
                && src[pos..fence.close_start].trim().is_empty()
            {
                // The previous chunk's closing fence already ended this block.
                pos = fence.close_end;
                continue;
            }
        } else {
            pos = source.skip_gap(pos);
        }
        if src[pos..].trim().is_empty() {
            break;
        }
        // Without room for the fence lines, this chunk ignores code blocks.
        let reopen = reopening.and_then(|fence| reopen_line(fence, max));
        let fence_aware = reopening.is_none() || reopen.is_some();
        let reopen = reopen.unwrap_or_default();
        let budget = max - utf16_len(&reopen);

        let (end, next, close) = if source.units(pos..src.len()) <= budget {
            (src.len(), src.len(), String::new())
        } else {
            choose_cut(&source, pos, budget, fence_aware)
        };
        let mut body = pos..end;
        if close.is_empty() {
            body.end = pos + src[body.clone()].trim_end().len();
        }
        if !src[body.clone()].trim().is_empty() || !reopen.is_empty() {
            closed_block = if close.is_empty() {
                None
            } else {
                source.open_fence_at_end(body.end).ok().flatten().map(|f| f.open_start)
            };
            chunks.push(Chunk { reopen, body, close });
        }
        pos = next;
    }
    chunks
}

/// Picks where a chunk starting at `pos` ends: `(body end, next start, closing
/// fence line)`. The body plus the closing line fits `budget` units.
fn choose_cut(
    source: &Source<'_>,
    pos: usize,
    budget: usize,
    fence_aware: bool,
) -> (usize, usize, String) {
    let src = source.text;
    // The furthest char boundary within the budget, before any closing fence.
    let mut hard = pos;
    for (offset, c) in src[pos..].char_indices() {
        if source.units(pos..pos + offset) + c.len_utf16() > budget {
            break;
        }
        hard = pos + offset + c.len_utf8();
    }
    let half = budget / 2;
    let passes = [
        (Cut::Paragraph, half),
        (Cut::Line, half),
        (Cut::Space, half),
        (Cut::Line, 0),
        (Cut::Char, 0),
    ];
    for (wanted, min_units) in passes {
        for end in (pos + 1..=hard).rev() {
            if source.units(pos..end) < min_units {
                break;
            }
            if let Some(found) = try_cut(source, pos, end, wanted, budget, fence_aware) {
                return found;
            }
        }
    }
    // Nothing fence-aware fits (a fence line longer than the limit): cut anywhere.
    let end =
        if hard > pos { hard } else { pos + src[pos..].chars().next().map_or(0, char::len_utf8) };
    (end, end, String::new())
}

/// The cut at `end` if it is no worse than `wanted`, allowed and within budget.
fn try_cut(
    source: &Source<'_>,
    pos: usize,
    end: usize,
    wanted: Cut,
    budget: usize,
    fence_aware: bool,
) -> Option<(usize, usize, String)> {
    let src = source.text;
    let open = if fence_aware { source.open_fence_at_end(end).ok()? } else { None };
    let found = source.cut_at(end, open.is_some())?;
    if found > wanted {
        return None;
    }
    let close = open.map(|fence| closing_line(fence, &src[pos..end])).unwrap_or_default();
    if source.units(pos..end) + utf16_len(&close) > budget {
        return None;
    }
    // Inside code only the line break itself is dropped; outside, the next chunk
    // skips the whitespace of the gap.
    let next = match (found, open) {
        (Cut::Paragraph | Cut::Line, Some(_)) => end + 1,
        _ => end,
    };
    if matches!(found, Cut::Space | Cut::Char) {
        // A cut inside a line must not make a fence line out of backticks that
        // were in the middle of it.
        let start = if open.is_some() || !fence_aware { next } else { source.skip_gap(next) };
        let rest = src[start..].trim_start_matches(' ');
        if !source.is_line_start(start) && rest.starts_with("```") {
            return None;
        }
    }
    Some((end, next, close))
}

#[cfg(test)]
mod tests;
