use super::{escape, escape_within};

fn check(input: &str, expected: &str) {
    assert_eq!(escape(input), expected, "escape({input:?})");
}

#[test]
fn plain_text_is_kept() {
    check("claude exited with status 2: no such file", "claude exited with status 2: no such file");
    check("naïve café ✓", "naïve café ✓");
    check("", "");
}

#[test]
fn line_breaks_cannot_start_a_new_log_entry() {
    check(
        "boom\n2026-01-01T00:00:00Z  INFO forged entry",
        "boom\\n2026-01-01T00:00:00Z  INFO forged entry",
    );
    check("a\r\nb", "a\\r\\nb");
    check("col\tcol", "col\\tcol");
    check("a\u{2028}b\u{2029}c", "a\\u{2028}b\\u{2029}c");
    check("a\u{85}b", "a\\u{85}b");
}

#[test]
fn terminal_escapes_and_direction_overrides_are_shown_not_applied() {
    check("red\x1b[31malert\x1b[0m", "red\\u{1b}[31malert\\u{1b}[0m");
    check("bell\x07 del\x7f nul\0", "bell\\u{7} del\\u{7f} nul\\u{0}");
    check("\u{202e}txt.exe", "\\u{202e}txt.exe");
    check("\u{2066}x\u{2069}", "\\u{2066}x\\u{2069}");
}

#[test]
fn a_backslash_is_escaped_so_the_escaped_form_is_unambiguous() {
    // A literal backslash-n in the input stays distinguishable from a newline.
    check("a\\nb", "a\\\\nb");
    assert_ne!(escape("a\\nb"), escape("a\nb"));
}

#[test]
fn long_text_is_cut_on_a_character_boundary_with_a_note() {
    let long = "é".repeat(10);
    let cut = escape_within(&long, 5);
    assert_eq!(cut, "éé...[truncated 16 bytes]");
    let escapes = escape_within("\n\n\n", 4);
    assert_eq!(escapes, "\\n\\n...[truncated 2 bytes]");
    assert_eq!(escape_within("short", 5), "short");
}

#[test]
fn the_escaped_text_never_holds_a_control_character() {
    let all: String = (0u32..0x3000).filter_map(char::from_u32).collect();
    let escaped = escape_within(&all, usize::MAX);
    assert!(!escaped.chars().any(char::is_control), "{escaped:?}");
    assert!(!escaped.contains('\u{2028}') && !escaped.contains('\u{202e}'));
}
