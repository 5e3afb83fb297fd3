//! Tests of the shared tool classification and result previews.

use serde_json::json;

use super::*;

fn check(name: &str, input: Value, cwd: Option<&str>, expected: (ActionKind, &str)) {
    let got = classify(name, &input, &["file_path", "path"], cwd.map(Path::new));
    assert_eq!((got.0, got.1.as_str()), expected, "{name} {input}");
}

#[test]
fn tools_are_classified_with_readable_titles() {
    use ActionKind::*;
    check("Bash", json!({"command": "ls -la"}), None, (Command, "ls -la"));
    check("shell", json!({"cmd": "echo hi"}), None, (Command, "echo hi"));
    check("KillShell", json!({}), None, (Command, "KillShell"));
    check("Bash", json!({"command": "x".repeat(100)}), None, (Command, &"x".repeat(80)));
    check("Edit", json!({"file_path": "/p/src/a.rs"}), Some("/p"), (FileChange, "src/a.rs"));
    check("Write", json!({"file_path": "/etc/hosts"}), Some("/p"), (FileChange, "/etc/hosts"));
    check("MultiEdit", json!({}), None, (FileChange, "MultiEdit"));
    check("Read", json!({"file_path": "/p/a.rs"}), Some("/p"), (Tool, "read: `a.rs`"));
    check("read_file", json!({}), None, (Tool, "read"));
    check("Glob", json!({"pattern": "**/*.rs"}), None, (Tool, "glob: `**/*.rs`"));
    check("Grep", json!({"pattern": "fn main"}), None, (Tool, "grep: fn main"));
    check("find", json!({"pattern": "*.md"}), None, (Tool, "find: *.md"));
    check("LS", json!({"path": "/p/src"}), Some("/p"), (Tool, "ls: `src`"));
    check("WebSearch", json!({"query": "rust tokio"}), None, (WebSearch, "rust tokio"));
    check(
        "WebFetch",
        json!({"url": "https://example.com"}),
        None,
        (WebSearch, "https://example.com"),
    );
    check(
        "Task",
        json!({"description": "Survey", "model": "haiku"}),
        None,
        (Subagent, "Survey (haiku)"),
    );
    check("agent", json!({"prompt": "Do it"}), None, (Subagent, "Do it"));
    check("mcp__docs__search", json!({}), None, (Tool, "mcp__docs__search"));
}

#[test]
fn paths_are_relative_only_inside_the_cwd() {
    assert_eq!(relativize("/p/src/a.rs", Some(Path::new("/p"))), "src/a.rs");
    assert_eq!(relativize("/p/src/a.rs", Some(Path::new("/p/"))), "src/a.rs");
    assert_eq!(relativize("/pq/a.rs", Some(Path::new("/p"))), "/pq/a.rs");
    assert_eq!(relativize("/p", Some(Path::new("/p"))), "/p");
    assert_eq!(relativize("a.rs", Some(Path::new("/p"))), "a.rs");
    assert_eq!(relativize("/p/a.rs", None), "/p/a.rs");
}

#[test]
fn result_previews_are_short_text() {
    assert_eq!(result_preview(&json!("plain")), "plain");
    assert_eq!(
        result_preview(&json!([{"type": "text", "text": "a"}, {"type": "image"}, "b"])),
        "a\nb"
    );
    assert_eq!(result_preview(&json!({"content": [{"type": "text", "text": "nested"}]})), "nested");
    assert_eq!(result_preview(&json!({"text": "t"})), "t");
    assert_eq!(result_preview(&json!({"other": 1})), r#"{"other":1}"#);
    assert_eq!(result_preview(&json!(42)), "42");
    assert_eq!(result_preview(&Value::Null), "");
    assert_eq!(result_preview(&json!("é".repeat(300))).chars().count(), RESULT_PREVIEW_CHARS);
}
