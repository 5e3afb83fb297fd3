//! Tests of splitting long Markdown into message-sized chunks.

use proptest::prelude::*;

use super::{plan, split_markdown, Chunk};
use crate::telegram::format::{markdown_to_telegram, utf16_len};

fn check(src: &str, max: usize, expected: &[&str]) {
    let chunks = split_markdown(src, max);
    assert_eq!(chunks, expected, "splitting {src:?} at {max}");
    for chunk in &chunks {
        assert!(utf16_len(chunk) <= max, "{chunk:?} is longer than {max}");
    }
}

#[test]
fn short_text_is_one_chunk() {
    check("hello world", 4096, &["hello world"]);
}

#[test]
fn blank_text_gives_no_chunk() {
    check("", 100, &[]);
    check(" \n\n\t \n", 100, &[]);
}

#[test]
fn leading_blank_lines_and_trailing_whitespace_are_left_out() {
    check("\n\n  indented\nnext  \n\n", 100, &["  indented\nnext"]);
}

#[test]
fn paragraph_break_is_preferred_to_a_later_line_break() {
    check(
        "first paragraph here\n\nsecond one\nand more text",
        36,
        &["first paragraph here", "second one\nand more text"],
    );
}

#[test]
fn line_break_when_no_paragraph_break_is_late_enough() {
    check("aaaa\n\nbbbbbbbbbbbbbbbb\ncccc dddd", 24, &["aaaa\n\nbbbbbbbbbbbbbbbb", "cccc dddd"]);
}

#[test]
fn space_when_there_is_no_line_break() {
    check("one two three four five", 10, &["one two", "three four", "five"]);
}

#[test]
fn long_word_is_cut_between_characters() {
    check("abcdefghij", 4, &["abcd", "efgh", "ij"]);
}

#[test]
fn surrogate_pairs_are_never_split() {
    check("🙂🙂🙂", 3, &["🙂", "🙂", "🙂"]);
    check("a🙂b", 2, &["a", "🙂", "b"]);
}

/// Found by fuzzing: with a limit too small for fence lines, chunks cut a code
/// block without closing it, so the block's own closing fence must not be
/// skipped as if a chunk had already closed it.
#[test]
fn a_closing_fence_no_chunk_closed_is_kept_at_a_tiny_limit() {
    let src = "````md\n```\ninner\n```\n````\n";
    let chunks = split_markdown(src, 2);
    let joined: String = chunks.concat();
    let ticks = |text: &str| text.chars().filter(|&c| c == '`').count();
    assert_eq!(ticks(&joined), ticks(src), "chunks {chunks:?}");
    let visible = |text: &str| text.chars().filter(|c| !c.is_whitespace()).collect::<String>();
    assert_eq!(visible(&joined), visible(src));
}

#[test]
fn a_limit_below_two_still_fits_every_character() {
    assert_eq!(split_markdown("ab🙂", 0), ["ab", "🙂"]);
}

#[test]
fn code_block_is_closed_and_reopened_with_its_info_string() {
    check(
        "```rust\nline 1\nline 2\nline 3\nline 4\n```",
        33,
        &["```rust\nline 1\nline 2\nline 3\n```", "```rust\nline 4\n```"],
    );
}

#[test]
fn code_keeps_its_indentation_across_chunks() {
    check(
        "```py\ndef f():\n    return 1\n    return 2\n```",
        30,
        &["```py\ndef f():\n```", "```py\n    return 1\n```", "```py\n    return 2\n```"],
    );
}

#[test]
fn closing_fence_is_not_left_alone_in_a_chunk() {
    // The block's closing fence fits exactly: no chunk made of fences only.
    let src = "```\n0123456789\n```\nafter";
    check(src, 18, &["```\n0123456789\n```", "after"]);
}

#[test]
fn text_before_a_code_block_splits_before_the_fence() {
    check(
        "Some intro text.\n\n```sh\nls -la\n```",
        24,
        &["Some intro text.", "```sh\nls -la\n```"],
    );
}

#[test]
fn long_code_line_is_cut_inside_the_block() {
    check("```\nabcdefghijklmnop\n```", 16, &["```\nabcdefgh\n```", "```\nijklmnop\n```"]);
}

#[test]
fn a_cut_never_turns_inline_backticks_into_a_fence() {
    let chunks = split_markdown("word ```not a fence``` more words here", 12);
    for chunk in &chunks {
        assert!(!chunk.starts_with("```"), "{chunks:?}");
    }
}

#[test]
fn converted_chunks_show_code_as_pre() {
    let src = format!("Intro.\n\n```rust\n{}```\n\nOutro.", "let x = 1;\n".repeat(20));
    let chunks = split_markdown(&src, 80);
    assert!(chunks.len() > 2, "{chunks:?}");
    for chunk in &chunks {
        let formatted = markdown_to_telegram(chunk);
        assert!(!formatted.text.contains("```"), "fence left visible in {chunk:?}");
    }
}

/// Whether every code fence opened in `chunk` is closed in it.
fn fences_balanced(chunk: &str) -> bool {
    let mut open: Option<usize> = None;
    for line in chunk.lines() {
        let trimmed = line.trim_start_matches(' ');
        if line.len() - trimmed.len() > 3 {
            continue;
        }
        let ticks = trimmed.len() - trimmed.trim_start_matches('`').len();
        if ticks < 3 {
            continue;
        }
        let rest = &trimmed[ticks..];
        match open {
            None if !rest.contains('`') => open = Some(ticks),
            Some(n) if ticks >= n && rest.trim().is_empty() => open = None,
            _ => {}
        }
    }
    open.is_none()
}

/// Checks the plan against the source: bodies in order, every gap only whitespace
/// (or the source's closing fence, replaced by the previous chunk's), fences added
/// in pairs.
fn plan_problem(src: &str, chunks: &[Chunk]) -> Option<String> {
    let mut at = 0;
    let mut closed_previous = false;
    for chunk in chunks {
        if chunk.body.start < at {
            return Some(format!("{chunk:?} goes back before {at}"));
        }
        let gap = src[at..chunk.body.start].trim();
        let is_closing_fence = !gap.is_empty() && gap.chars().all(|c| c == '`');
        let gap_allowed = gap.is_empty() || (closed_previous && is_closing_fence);
        if !gap_allowed {
            return Some(format!("{gap:?} lost before {chunk:?}"));
        }
        if chunk.reopen.is_empty() == closed_previous && !is_closing_fence {
            return Some(format!("{chunk:?} reopens no closed block, or misses one"));
        }
        closed_previous = !chunk.close.is_empty();
        at = chunk.body.end;
    }
    // The source's closing fence may end it, replaced by the last chunk's own.
    let rest = src[at..].trim();
    let replaced_fence = closed_previous && !rest.is_empty() && rest.chars().all(|c| c == '`');
    (!rest.is_empty() && !replaced_fence).then(|| format!("{rest:?} lost at the end"))
}

fn paragraph() -> impl Strategy<Value = String> {
    let word = prop_oneof![
        4 => "[a-zA-Z]{1,12}",
        1 => "`[a-z ]{1,8}`",
        1 => Just("🙂".to_owned()),
        1 => Just("é".to_owned()),
    ];
    let separator = prop_oneof![6 => Just(" "), 1 => Just("\n"), 1 => Just("  ")];
    prop::collection::vec((word, separator), 1..40).prop_map(|words| {
        words.into_iter().map(|(word, sep)| format!("{word}{sep}")).collect::<String>()
    })
}

fn code_block() -> impl Strategy<Value = String> {
    let info = prop_oneof![Just(""), Just("rust"), Just("python title=x.py"), Just("sh")];
    let line = prop_oneof![
        4 => "[ a-z(){};=]{0,30}",
        1 => Just("let s = `x`;".to_owned()),
        1 => Just("    indented(🙂);".to_owned()),
    ];
    (info, prop::collection::vec(line, 0..15), 3usize..5).prop_map(|(info, lines, ticks)| {
        let fence = "`".repeat(ticks);
        let body: String = lines.iter().map(|l| format!("{l}\n")).collect();
        format!("{fence}{info}\n{body}{fence}")
    })
}

fn markdown() -> impl Strategy<Value = String> {
    let block = prop_oneof![2 => paragraph(), 1 => code_block()];
    let join = prop_oneof![Just("\n\n"), Just("\n")];
    prop::collection::vec((block, join), 0..8)
        .prop_map(|blocks| blocks.into_iter().map(|(b, j)| format!("{b}{j}")).collect())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn every_chunk_fits_and_is_not_blank(src in any::<String>(), max in 0usize..120) {
        for chunk in split_markdown(&src, max) {
            prop_assert!(utf16_len(&chunk) <= max.max(2), "{:?} over {}", chunk, max);
            prop_assert!(!chunk.trim().is_empty());
        }
    }

    #[test]
    fn markdown_chunks_fit_and_give_back_the_source(src in markdown(), max in 40usize..400) {
        let chunks = plan(&src, max);
        prop_assert_eq!(plan_problem(&src, &chunks), None);
        for chunk in &chunks {
            let text = chunk.render(&src);
            prop_assert!(utf16_len(&text) <= max, "{:?} over {}", text, max);
            prop_assert!(!text.trim().is_empty());
        }
    }

    #[test]
    fn every_chunk_has_balanced_fences(src in markdown(), max in 40usize..400) {
        for chunk in split_markdown(&src, max) {
            prop_assert!(fences_balanced(&chunk), "unbalanced {:?}", chunk);
            prop_assert!(!markdown_to_telegram(&chunk).text.contains("```"), "{:?}", chunk);
        }
    }

    #[test]
    fn arbitrary_text_gives_back_the_source(src in any::<String>(), max in 2usize..60) {
        let chunks = plan(&src, max);
        prop_assert_eq!(plan_problem(&src, &chunks), None);
    }
}

#[test]
fn a_block_ending_the_source_closes_with_the_last_chunks_fence() {
    // Found by the property test: the last chunk closes the block itself, in
    // place of the source's own closing fence, and nothing else is left over.
    let src =
        "````\na (aaa((; (= a(a}=\n=;};aaa;=;}(=a(a a(( ( (a(;=\n    indented(🙂);\n\n````\n\n";
    let chunks = plan(src, 56);
    assert_eq!(plan_problem(src, &chunks), None, "{chunks:?}");
    let last = chunks.last().unwrap().render(src);
    assert!(last.ends_with("indented(🙂);\n````"), "{last:?}");
    assert!(chunks.iter().all(|c| fences_balanced(&c.render(src))));
}
