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

#[test]
fn every_fixture_token_has_its_vendors_shape() {
    let tokens: [(Vendor, &[&str]); 5] = [
        (
            Vendor::Claude,
            &[
                "5b1c7a52-8f0e-4d7b-9c1a-2f3e4d5c6b7a",
                "a7c3e9f1-2b4d-4c6e-8f0a-1b2c3d4e5f60",
                "c0ffee00-aaaa-4bbb-8ccc-dddddddddddd",
                "9d8e7f60-1111-4222-8333-444455556666",
                "steer-0001",
                "prev-1",
            ],
        ),
        (
            Vendor::Codex,
            &[
                "0199a213-81c0-7800-8aa1-bbab2a035a53",
                "0199a213-9999-7000-8000-000000000abc",
                "full_lifecycle",
                "invalid_json_test",
                "fake-thread",
                "abc123",
            ],
        ),
        (Vendor::Opencode, &["ses_7c1e2f3a4b5cXyZ", "ses_abc", "ses_prev1", "SES_abc9"]),
        (
            Vendor::Pi,
            &[
                "3f2a9c1e",
                "pi_session_0123456789abcdef0123456789abcdef",
                "/home/dev/.pi/agent/sessions/--home-dev-proj--/2026-08-01T12-00-00-000Z_0123abcd.jsonl",
                "/home/dev/my projects/s.jsonl",
                "~/.pi/agent/sessions/x.jsonl",
            ],
        ),
        (Vendor::Droid, &["sess_1", "sess_123", "9d8e7f60-1111-4222-8333-444455556666"]),
    ];
    for (vendor, tokens) in tokens {
        for token in tokens {
            assert_eq!(check(vendor, token), Ok(()), "{vendor} {token}");
        }
    }
}

#[test]
fn tokens_that_could_be_options_or_split_are_refused_for_every_vendor() {
    let long = "a".repeat(MAX_TOKEN_LEN + 1);
    let bad = [
        "",
        "-x",
        "--dangerously-skip-permissions",
        "--dangerously-bypass-approvals-and-sandbox",
        "-s=abc",
        "abc def",
        "abc\n--yolo",
        "abc\t-x",
        "\u{2010}\u{2010}yolo",
        "\u{2014}x",
        long.as_str(),
    ];
    for vendor in Vendor::ALL {
        for token in bad {
            assert!(check(vendor, token).is_err(), "{vendor} accepted {token:?}");
        }
    }
    for token in ["abc=--x", "ses_abc=--x", "abc\u{0430}"] {
        for vendor in [Vendor::Claude, Vendor::Codex, Vendor::Opencode, Vendor::Droid] {
            assert!(check(vendor, token).is_err(), "{vendor} accepted {token:?}");
        }
    }
    assert_eq!(check(Vendor::Opencode, "abc"), Err(InvalidValue::Shape));
    assert_eq!(check(Vendor::Opencode, "ses_"), Err(InvalidValue::Shape));
    assert_eq!(check(Vendor::Opencode, "ses_ab-c"), Err(InvalidValue::Shape));
    assert_eq!(check(Vendor::Pi, "/tmp/s\n--x.jsonl"), Err(InvalidValue::Character));
    assert_eq!(check(Vendor::Pi, "abc def"), Err(InvalidValue::Shape));
    assert_eq!(check(Vendor::Pi, "-/x.jsonl"), Err(InvalidValue::LeadingDash));
    let long_path = format!("/{}", "a".repeat(MAX_PI_TOKEN_LEN));
    assert_eq!(check(Vendor::Pi, &long_path), Err(InvalidValue::TooLong { max: MAX_PI_TOKEN_LEN }));
}

#[test]
fn every_extracted_token_that_is_accepted_formats_back_to_a_line_with_the_same_token() {
    for vendor in Vendor::ALL {
        let token = if vendor == Vendor::Opencode { "ses_Ab1" } else { "sess_1" };
        let line = format(vendor, token);
        let found = extract(vendor, &line).expect("extracted");
        assert_eq!(found.value, token);
        assert_eq!(check(vendor, &found.value), Ok(()));
    }
}
