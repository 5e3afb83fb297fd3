//! Tests of each vendor's resume line: extraction, whole-line matching, round trips.

use super::*;

fn check_extract(vendor: Vendor, text: &str, expected: Option<&str>) {
    let got = extract(vendor, text).map(|token| token.value);
    assert_eq!(got.as_deref(), expected, "{vendor} in {text:?}");
}

#[test]
fn extract_finds_each_vendors_line_anywhere() {
    check_extract(
        Vendor::Claude,
        "resume with `claude --resume 5b1c-7a52` later",
        Some("5b1c-7a52"),
    );
    check_extract(Vendor::Claude, "CLAUDE   --RESUME abc_1.", Some("abc_1"));
    check_extract(Vendor::Claude, "claude resume abc", None);
    check_extract(Vendor::Claude, "myclaude --resume abc", None);
    check_extract(Vendor::Codex, "`codex resume thread-1`", Some("thread-1"));
    check_extract(Vendor::Codex, "codex --resume thread-1", None);
    check_extract(Vendor::Opencode, "opencode --session ses_abc9", Some("ses_abc9"));
    check_extract(Vendor::Opencode, "opencode run -s ses_XyZ", Some("ses_XyZ"));
    check_extract(Vendor::Opencode, "opencode --session abc", None);
    check_extract(Vendor::Droid, "droid exec -s sess_1", Some("sess_1"));
    check_extract(Vendor::Droid, "droid --session sess_1", Some("sess_1"));
    check_extract(Vendor::Droid, "droid exec sess_1", None);
    check_extract(Vendor::Pi, "pi --session abcd", Some("abcd"));
    check_extract(Vendor::Pi, "`pi --session abcd`", Some("abcd"));
    check_extract(
        Vendor::Pi,
        r#"pi --session "/tmp/my dir/s.jsonl" now"#,
        Some("/tmp/my dir/s.jsonl"),
    );
    check_extract(Vendor::Pi, "pi --session '/tmp/x.jsonl'", Some("/tmp/x.jsonl"));
    check_extract(Vendor::Pi, "api --session abcd", None);
}

#[test]
fn a_resume_line_is_the_whole_line() {
    for (vendor, line, expected) in [
        (Vendor::Claude, "claude --resume abc", true),
        (Vendor::Claude, "  `claude --resume abc`  ", true),
        (Vendor::Claude, "claude --resume abc`", true),
        (Vendor::Claude, "claude --resume abc please", false),
        (Vendor::Claude, "run claude --resume abc", false),
        (Vendor::Codex, "codex resume abc", true),
        (Vendor::Opencode, "opencode run --session ses_a1", true),
        (Vendor::Droid, "droid -s abc", true),
        (Vendor::Pi, r#"`pi --session "a b"`"#, true),
        (Vendor::Pi, "pi --session abc def", false),
    ] {
        assert_eq!(is_resume_line(vendor, line), expected, "{vendor}: {line:?}");
    }
}

#[test]
fn formatted_lines_round_trip() {
    for (vendor, value) in [
        (Vendor::Claude, "5b1c7a52-8f0e-4d7b-9c1a-2f3e4d5c6b7a"),
        (Vendor::Codex, "0199a213-81c0-7800-8aa1-bbab2a035a53"),
        (Vendor::Opencode, "ses_7c1e2f3a4b5cXyZ"),
        (Vendor::Droid, "sess_1"),
        (Vendor::Pi, "3f2a9c1e"),
        (Vendor::Pi, "/home/me/.pi/agent/sessions/--a b--/2026_x.jsonl"),
        (Vendor::Pi, r#"we"ird\path"#),
    ] {
        let line = format(vendor, value);
        assert_eq!(extract(vendor, &line), Some(ResumeToken::new(vendor.id(), value)), "{line}");
        assert!(is_resume_line(vendor, &line), "{line}");
    }
    assert_eq!(format(Vendor::Claude, "x"), "`claude --resume x`");
    assert_eq!(format(Vendor::Droid, "x"), "`droid exec -s x`");
    assert_eq!(format(Vendor::Pi, "a b"), r#"`pi --session "a b"`"#);
}
