//! The Telegram splitter and formatter: an answer (Markdown) cut to a limit,
//! each chunk turned into text with `code`/`pre` entities.
//!
//! Input: two bytes of limit, then the answer (UTF-8, lossy).
//! Properties: every chunk fits the limit and is not blank; nothing of the
//! source is lost or reordered (its non-blank characters are a subsequence of
//! the chunks', and equal to them when no backtick can add fence lines);
//! formatting never lengthens a chunk; entities are sorted, non-empty, do not
//! overlap and lie inside the text.
#![no_main]

use lemon_transports::telegram::format::{markdown_to_telegram, utf16_len};
use lemon_transports::telegram::split::split_markdown;
use lemon_transports::telegram::types::MAX_TEXT_UTF16;
use libfuzzer_sys::fuzz_target;

fn visible(text: &str) -> impl Iterator<Item = char> + '_ {
    text.chars().filter(|c| !c.is_whitespace())
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 2 {
        return;
    }
    let limit = usize::from(u16::from_le_bytes([data[0], data[1]])) % (MAX_TEXT_UTF16 + 200);
    let src = String::from_utf8_lossy(&data[2..]);
    let chunks = split_markdown(&src, limit);
    let effective = limit.max(2);
    for chunk in &chunks {
        assert!(
            utf16_len(chunk) <= effective,
            "chunk of {} units over {effective}",
            utf16_len(chunk)
        );
        assert!(!chunk.trim().is_empty(), "blank chunk");
    }
    let joined: String = chunks.concat();
    if !src.contains('`') {
        assert!(visible(&src).eq(visible(&joined)), "text lost or reordered");
    } else {
        let mut kept = visible(&joined);
        for c in visible(&src) {
            assert!(kept.any(|k| k == c), "source character {c:?} lost or reordered");
        }
    }
    if src.trim().is_empty() {
        assert!(chunks.is_empty());
    }
    for chunk in &chunks {
        let formatted = markdown_to_telegram(chunk);
        let len = utf16_len(&formatted.text);
        assert!(len <= utf16_len(chunk), "formatting lengthened a chunk");
        let mut end = 0;
        for entity in &formatted.entities {
            assert!(entity.length > 0, "empty entity");
            assert!(entity.offset >= end, "entities overlap or are unsorted");
            end = entity.offset + entity.length;
            assert!(end <= len, "entity past the text");
            assert!(entity.kind == "code" || entity.kind == "pre");
        }
    }
});
