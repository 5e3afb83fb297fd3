//! Tests of the Markdown to Telegram conversion.

use proptest::prelude::*;

use super::{code_fences, markdown_to_telegram, utf16_len};
use crate::telegram::types::FormattedText;

/// The text with each entity shown as `<kind>…</kind>` (`<pre lang>` with a
/// language), so that expectations read like the message a user sees. Entities
/// must be sorted and disjoint (see [`entity_problem`]).
pub(crate) fn annotate(formatted: &FormattedText) -> String {
    let units: Vec<u16> = formatted.text.encode_utf16().collect();
    let slice = |from: usize, to: usize| String::from_utf16_lossy(&units[from..to]);
    let mut out = String::new();
    let mut at = 0;
    for entity in &formatted.entities {
        let end = entity.offset + entity.length;
        out.push_str(&slice(at, entity.offset));
        match &entity.language {
            Some(language) => out.push_str(&format!("<{} {language}>", entity.kind)),
            None => out.push_str(&format!("<{}>", entity.kind)),
        }
        out.push_str(&slice(entity.offset, end));
        out.push_str(&format!("</{}>", entity.kind));
        at = end;
    }
    out.push_str(&slice(at, units.len()));
    out
}

/// Entities are sorted, disjoint, non-empty, inside the text and never split a
/// surrogate pair. Returns what is wrong, if anything.
pub(crate) fn entity_problem(formatted: &FormattedText) -> Option<String> {
    let units: Vec<u16> = formatted.text.encode_utf16().collect();
    let is_boundary =
        |at: usize| at == 0 || at >= units.len() || !(0xDC00..0xE000).contains(&units[at]);
    let mut previous_end = 0;
    for entity in &formatted.entities {
        let end = entity.offset + entity.length;
        if entity.length == 0 {
            return Some(format!("empty entity {entity:?}"));
        }
        if end > units.len() {
            return Some(format!("entity {entity:?} beyond the text ({} units)", units.len()));
        }
        if entity.offset < previous_end {
            return Some(format!("entity {entity:?} overlaps or is out of order"));
        }
        if !is_boundary(entity.offset) || !is_boundary(end) {
            return Some(format!("entity {entity:?} splits a character"));
        }
        previous_end = end;
    }
    None
}

fn check(src: &str, expected: &str) {
    let formatted = markdown_to_telegram(src);
    assert_eq!(entity_problem(&formatted), None, "for {src:?}");
    assert_eq!(annotate(&formatted), expected, "for {src:?}");
}

#[test]
fn plain_text_is_kept_as_is() {
    check(
        "Hello *world* _x_ <b> [link](http://a)\n\nbye",
        "Hello *world* _x_ <b> [link](http://a)\n\nbye",
    );
}

#[test]
fn inline_code_becomes_a_code_entity() {
    check("run `cargo test` now", "run <code>cargo test</code> now");
    check("`a` and `b`", "<code>a</code> and <code>b</code>");
}

#[test]
fn double_backticks_can_hold_a_backtick() {
    check("use `` a`b `` here", "use <code>a`b</code> here");
}

#[test]
fn unmatched_backticks_stay_literal() {
    check("a ` b", "a ` b");
    check("a `` b ` c", "a `` b ` c");
    check("empty `` here", "empty `` here");
    check("blank ` ` here", "blank ` ` here");
}

#[test]
fn inline_code_does_not_cross_lines() {
    check("a `b\nc` d", "a `b\nc` d");
}

#[test]
fn fenced_block_becomes_pre_with_its_language() {
    check("Here:\n```rust\nfn main() {}\n```\nDone.", "Here:\n<pre rust>fn main() {}</pre>\nDone.");
}

#[test]
fn fenced_block_at_the_end_leaves_no_trailing_line_break() {
    check("```\nline 1\nline 2\n```", "<pre>line 1\nline 2</pre>");
}

#[test]
fn only_the_first_word_of_the_info_string_is_the_language() {
    check("```python title=x.py\nprint(1)\n```\n", "<pre python>print(1)</pre>\n");
}

#[test]
fn code_inside_a_block_is_not_inline_formatted() {
    check("```\nlet s = `x`;\n```", "<pre>let s = `x`;</pre>");
}

#[test]
fn empty_block_disappears() {
    check("a\n```\n```\nb", "a\nb");
}

#[test]
fn unclosed_fence_is_literal() {
    check("```rust\nfn x() {}\n", "```rust\nfn x() {}\n");
}

#[test]
fn longer_fence_needs_a_closing_fence_as_long() {
    check("````\n```\ninner\n```\n````", "<pre>```\ninner\n```</pre>");
}

#[test]
fn indented_fence_removes_that_indentation_from_content() {
    check("  ```\n  a\n    b\nc\n  ```", "<pre>a\n  b\nc</pre>");
}

#[test]
fn four_spaces_are_not_a_fence() {
    check("    ```\nx\n    ```", "    ```\nx\n    ```");
}

#[test]
fn info_string_with_a_backtick_is_not_a_fence() {
    check("```a`b\nx\n```", "```a`b\nx\n```");
}

#[test]
fn windows_line_breaks() {
    check("a\r\n```sh\r\nls\r\n```\r\nb", "a\r\n<pre sh>ls</pre>\r\nb");
}

#[test]
fn offsets_count_utf16_units() {
    let formatted = markdown_to_telegram("🙂 é `x`\n```\n🙂\n```");
    assert_eq!(formatted.text, "🙂 é x\n🙂");
    let spans: Vec<(&str, usize, usize)> =
        formatted.entities.iter().map(|e| (e.kind.as_str(), e.offset, e.length)).collect();
    assert_eq!(spans, [("code", 5, 1), ("pre", 7, 2)]);
}

#[test]
fn utf16_len_counts_surrogate_pairs_twice() {
    assert_eq!(utf16_len(""), 0);
    assert_eq!(utf16_len("abc"), 3);
    assert_eq!(utf16_len("é"), 1);
    assert_eq!(utf16_len("🙂"), 2);
}

#[test]
fn many_unclosed_fences_are_found_quickly() {
    let src = "```x\n".repeat(20_000);
    assert!(code_fences(&src).is_empty());
    assert_eq!(markdown_to_telegram(&src).text, src);
}

fn markdownish() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        "[a-z ]{0,12}",
        Just("`".to_owned()),
        Just("``".to_owned()),
        Just("```".to_owned()),
        Just("\n".to_owned()),
        Just("\n```rust\n".to_owned()),
        Just("\n```\n".to_owned()),
        Just("  ".to_owned()),
        Just("🙂".to_owned()),
        Just("é".to_owned()),
        Just("\r\n".to_owned()),
    ];
    prop::collection::vec(piece, 0..40).prop_map(|pieces| pieces.concat())
}

proptest! {
    #[test]
    fn conversion_never_grows_and_keeps_entities_valid(src in markdownish()) {
        let formatted = markdown_to_telegram(&src);
        prop_assert!(utf16_len(&formatted.text) <= utf16_len(&src));
        prop_assert_eq!(entity_problem(&formatted), None);
    }

    #[test]
    fn arbitrary_text_never_breaks_conversion(src in any::<String>()) {
        let formatted = markdown_to_telegram(&src);
        prop_assert!(utf16_len(&formatted.text) <= utf16_len(&src));
        prop_assert_eq!(entity_problem(&formatted), None);
    }

    #[test]
    fn text_without_backticks_is_unchanged(src in "[^`]{0,200}") {
        let formatted = markdown_to_telegram(&src);
        prop_assert_eq!(formatted, FormattedText::plain(src));
    }
}
