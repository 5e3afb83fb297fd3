//! The file tools on real files in temp dirs, and every containment attack.

use std::sync::Arc;

use lemon_core::tool::{Tool, ToolOutput};
use serde_json::{json, Value};

use super::super::testutil::{Dirs, CONFIG, SECRETS};
use super::super::{builtin, BuiltinOptions};

fn tool(name: &str, options: &BuiltinOptions) -> Arc<dyn Tool> {
    builtin(options).into_iter().find(|tool| tool.spec().name == name).unwrap()
}

async fn call(dirs: &Dirs, name: &str, args: Value) -> ToolOutput {
    tool(name, &BuiltinOptions::default()).execute(args, dirs.ctx()).await
}

fn assert_error(output: &ToolOutput, contains: &str) {
    assert!(output.is_error, "expected an error, got {output:?}");
    assert!(output.text.contains(contains), "{:?} lacks {contains:?}", output.text);
    assert_eq!(output.details["error"], true);
}

#[tokio::test]
async fn read_pages_through_lines_and_refuses_binary_and_directories() {
    let dirs = Dirs::new();
    let lines: String = (1..=10).map(|i| format!("line {i}\n")).collect();
    std::fs::write(dirs.cwd.join("a.txt"), &lines).unwrap();

    let all = call(&dirs, "read", json!({"path": "a.txt"})).await;
    assert!(!all.is_error);
    assert_eq!(all.text, lines);
    assert_eq!(all.details["lines"], 10);

    let page = call(&dirs, "read", json!({"path": "a.txt", "offset": 3, "limit": "2"})).await;
    assert_eq!(page.text, "line 3\nline 4\n[more lines follow; continue with offset=5]\n");
    assert_eq!(page.details["truncated"], true);

    assert_error(
        &call(&dirs, "read", json!({"path": "a.txt", "offset": 50})).await,
        "fewer than 50",
    );
    std::fs::write(dirs.cwd.join("bin"), b"\x7fELF\0\0\x01").unwrap();
    assert_error(&call(&dirs, "read", json!({"path": "bin"})).await, "binary");
    assert_error(&call(&dirs, "read", json!({"path": "."})).await, "directory");
    assert_error(&call(&dirs, "read", json!({"path": "missing"})).await, "missing");
    assert_error(&call(&dirs, "read", json!({})).await, "Missing required parameter: path");
    assert_error(&call(&dirs, "read", json!({"path": 5})).await, "path must be a string");
}

#[tokio::test]
async fn read_output_is_capped() {
    let dirs = Dirs::new();
    std::fs::write(dirs.cwd.join("long"), "x".repeat(500) + "\nsecond\n").unwrap();
    let options = BuiltinOptions { output_limit: 100, ..BuiltinOptions::default() };
    let out = tool("read", &options).execute(json!({"path": "long"}), dirs.ctx()).await;
    assert!(!out.is_error);
    assert!(out.text.starts_with(&"x".repeat(100)), "{}", out.text);
    assert!(
        out.text.contains("[line 1 is 500 bytes; only its first 100 bytes are shown"),
        "{}",
        out.text
    );
    assert!(out.text.contains("continue with offset=2"), "{}", out.text);
}

#[tokio::test]
async fn write_creates_parents_and_reads_back_in_the_workspace_too() {
    let dirs = Dirs::new();
    let out = call(&dirs, "write", json!({"path": "deep/er/new.txt", "content": "hello\n"})).await;
    assert!(!out.is_error, "{out:?}");
    assert_eq!(out.text, "Wrote 6 bytes to deep/er/new.txt");
    assert_eq!(std::fs::read_to_string(dirs.cwd.join("deep/er/new.txt")).unwrap(), "hello\n");

    let in_workspace = dirs.workspace.join("w.txt").display().to_string();
    let out = call(&dirs, "write", json!({"path": in_workspace, "content": ""})).await;
    assert!(!out.is_error, "{out:?}");
    assert_eq!(std::fs::read_to_string(dirs.workspace.join("w.txt")).unwrap(), "");
    assert_error(&call(&dirs, "write", json!({"path": "x"})).await, "content");
    assert_error(&call(&dirs, "write", json!({"path": ".", "content": "x"})).await, "directory");
}

#[tokio::test]
async fn edit_replaces_one_exact_match_and_names_how_many_otherwise() {
    let dirs = Dirs::new();
    let file = dirs.cwd.join("f.rs");
    std::fs::write(&file, "let a = 1;\nlet b = 1;\nlet c = 2;\n").unwrap();

    let out =
        call(&dirs, "edit", json!({"path": "f.rs", "old_string": "c = 2", "new_string": "c = 3"}))
            .await;
    assert!(!out.is_error, "{out:?}");
    assert_eq!(out.text, "Replaced 1 occurrence in f.rs");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "let a = 1;\nlet b = 1;\nlet c = 3;\n");

    let none =
        call(&dirs, "edit", json!({"path": "f.rs", "old_string": "zzz", "new_string": "y"})).await;
    assert_error(&none, "old_string was not found in f.rs");
    let two =
        call(&dirs, "edit", json!({"path": "f.rs", "old_string": "= 1", "new_string": "= 9"}))
            .await;
    assert_error(&two, "old_string occurs 2 times in f.rs");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "let a = 1;\nlet b = 1;\nlet c = 3;\n");

    let all = call(
        &dirs,
        "edit",
        json!({"path": "f.rs", "old_string": "= 1", "new_string": "= 9", "replace_all": true}),
    )
    .await;
    assert_eq!(all.text, "Replaced 2 occurrences in f.rs");
    assert_eq!(all.details["replacements"], 2);
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "let a = 9;\nlet b = 9;\nlet c = 3;\n");

    assert_error(
        &call(&dirs, "edit", json!({"path": "f.rs", "old_string": "", "new_string": "x"})).await,
        "empty",
    );
    assert_error(
        &call(&dirs, "edit", json!({"path": "f.rs", "old_string": "a", "new_string": "a"})).await,
        "the same",
    );
}

#[tokio::test]
async fn list_marks_directories_and_links_and_is_bounded() {
    let dirs = Dirs::new();
    std::fs::create_dir(dirs.cwd.join("sub")).unwrap();
    std::fs::write(dirs.cwd.join("b.txt"), "").unwrap();
    std::os::unix::fs::symlink(dirs.cwd.join("b.txt"), dirs.cwd.join("l")).unwrap();
    let out = call(&dirs, "list", json!({})).await;
    assert_eq!(out.text, "b.txt\nl@\nsub/");
    let empty = call(&dirs, "list", json!({"path": "sub"})).await;
    assert_eq!(empty.text, "(empty directory)");
    let options = BuiltinOptions { max_results: 1, ..BuiltinOptions::default() };
    let capped = tool("list", &options).execute(json!({}), dirs.ctx()).await;
    assert_eq!(capped.text, "b.txt\n[2 more entries not shown]");
    assert_error(&call(&dirs, "list", json!({"path": "b.txt"})).await, "not a directory");
}

#[tokio::test]
async fn every_file_tool_refuses_paths_out_of_the_cwd_and_workspace() {
    let dirs = Dirs::new();
    dirs.plant_links();
    for attack in dirs.attacks() {
        let read = call(&dirs, "read", json!({"path": attack})).await;
        assert!(read.is_error, "read {attack}: {read:?}");
        assert!(!read.text.contains("top secret"), "read {attack} leaked");
        let edit =
            call(&dirs, "edit", json!({"path": attack, "old_string": "top", "new_string": "x"}))
                .await;
        assert!(edit.is_error, "edit {attack}: {edit:?}");
        let write = call(&dirs, "write", json!({"path": attack, "content": "owned"})).await;
        assert!(write.is_error, "write {attack}: {write:?}");
    }
    for attack in ["../outside", "/etc", "link_out", "loop_a"] {
        let list = call(&dirs, "list", json!({"path": attack})).await;
        assert!(list.is_error, "list {attack}: {list:?}");
        assert!(!list.text.contains("secret"), "list {attack} leaked: {}", list.text);
    }
    // Nothing outside was changed or created.
    assert_eq!(std::fs::read_to_string(dirs.outside.join("secret")).unwrap(), "top secret\n");
    assert!(!dirs.outside.join("made_by_tool").exists());
    let refused = call(&dirs, "read", json!({"path": "../outside/secret"})).await;
    assert_eq!(
        refused.text,
        "../outside/secret is outside the working directory and the workspace"
    );
}

/// The documented default: `read` returns 2 000 lines when the call gives no `limit`.
#[tokio::test]
async fn read_returns_2_000_lines_by_default() {
    let dirs = Dirs::new();
    let line = |n: usize| format!("line {n}\n");
    std::fs::write(dirs.cwd.join("exact"), (1..=2_000).map(line).collect::<String>()).unwrap();
    std::fs::write(dirs.cwd.join("longer"), (1..=2_500).map(line).collect::<String>()).unwrap();

    let exact = call(&dirs, "read", json!({"path": "exact"})).await;
    assert_eq!(exact.details["lines"], 2_000);
    assert_eq!(exact.details["truncated"], false);
    assert!(exact.text.ends_with("line 2000\n"), "{}", &exact.text[exact.text.len() - 40..]);

    let longer = call(&dirs, "read", json!({"path": "longer"})).await;
    assert_eq!(longer.details["lines"], 2_000);
    let expected: String = (1..=2_000).map(line).collect();
    assert_eq!(longer.text, expected + "[more lines follow; continue with offset=2001]\n");
    let rest = call(&dirs, "read", json!({"path": "longer", "offset": 2_001})).await;
    assert_eq!(rest.details["lines"], 500);
}

#[tokio::test]
async fn read_returns_at_most_30000_bytes_of_a_single_line_file() {
    let dirs = Dirs::new();
    // 1 MiB on one line, then a second line.
    std::fs::write(dirs.cwd.join("huge"), "y".repeat(1 << 20) + "\nafter\n").unwrap();
    let out = call(&dirs, "read", json!({"path": "huge"})).await;
    assert!(!out.is_error, "{out:?}");
    let (content, notes) = out.text.split_once('\n').unwrap();
    assert_eq!(content.len(), 30_000);
    assert!(
        notes.contains("[line 1 is 1048576 bytes; only its first 30000 bytes are shown"),
        "{notes}"
    );
    assert!(notes.contains("continue with offset=2"), "{notes}");
    let next = call(&dirs, "read", json!({"path": "huge", "offset": 2})).await;
    assert_eq!(next.text, "after\n");
    assert!(tool("read", &BuiltinOptions::default()).spec().description.contains("30000 bytes"));
}

#[tokio::test]
async fn no_file_tool_reaches_the_gateways_state_directly_or_through_a_link() {
    let dirs = Dirs::new();
    dirs.plant_state();
    let attacks = [
        ".lemon/secrets.toml",
        ".lemon/config.toml",
        ".lemon/new.toml",
        "../workspace/secrets_link",
        "../workspace/state_link/config.toml",
    ];
    for attack in attacks {
        let read = call(&dirs, "read", json!({"path": attack})).await;
        assert_error(&read, "the gateway's own state");
        assert!(!read.text.contains("tok-state"), "read {attack} leaked");
        let edit = call(
            &dirs,
            "edit",
            json!({"path": attack, "old_string": "tok-state", "new_string": "owned"}),
        )
        .await;
        assert_error(&edit, "the gateway's own state");
        let write = call(&dirs, "write", json!({"path": attack, "content": "owned"})).await;
        assert_error(&write, "the gateway's own state");
    }
    for attack in [".lemon", "../workspace/state_link"] {
        assert_error(
            &call(&dirs, "list", json!({"path": attack})).await,
            "the gateway's own state",
        );
    }
    assert_eq!(std::fs::read_to_string(dirs.state().join("secrets.toml")).unwrap(), SECRETS);
    assert_eq!(std::fs::read_to_string(dirs.state().join("config.toml")).unwrap(), CONFIG);
    assert!(!dirs.state().join("new.toml").exists());
}
