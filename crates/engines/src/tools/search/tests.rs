//! `grep` and `glob` over real trees, bounded, and kept inside the roots.

use lemon_core::tool::{Tool, ToolOutput};
use serde_json::{json, Value};

use super::super::testutil::Dirs;
use super::super::BuiltinOptions;
use super::{Glob, Grep};

fn tree(dirs: &Dirs) {
    let files = [
        ("src/main.rs", "fn main() {\n    println!(\"Hello\");\n}\n"),
        ("src/lib/util.rs", "pub fn hello() {}\n"),
        ("README.md", "hello world\nbye\n"),
        (".git/config", "hello from git\n"),
    ];
    for (path, text) in files {
        let path = dirs.cwd.join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
    std::fs::write(dirs.cwd.join("blob.bin"), b"hello\0\x01").unwrap();
}

async fn grep(dirs: &Dirs, options: BuiltinOptions, args: Value) -> ToolOutput {
    Grep::new(options.into()).execute(args, dirs.ctx()).await
}

async fn glob(dirs: &Dirs, options: BuiltinOptions, args: Value) -> ToolOutput {
    Glob::new(options.into()).execute(args, dirs.ctx()).await
}

#[tokio::test]
async fn grep_finds_lines_skips_binary_and_git_and_filters_by_glob() {
    let dirs = Dirs::new();
    tree(&dirs);
    let out = grep(
        &dirs,
        BuiltinOptions::default(),
        json!({"pattern": "hello", "case_insensitive": true}),
    )
    .await;
    assert_eq!(
        out.text,
        "README.md:1: hello world\nsrc/lib/util.rs:1: pub fn hello() {}\nsrc/main.rs:2:     println!(\"Hello\");"
    );
    assert_eq!(out.details["matches"], 3);
    assert_eq!(out.details["files"], 3);

    let sensitive = grep(&dirs, BuiltinOptions::default(), json!({"pattern": "Hel+o"})).await;
    assert_eq!(sensitive.text, "src/main.rs:2:     println!(\"Hello\");");
    let rs = grep(&dirs, BuiltinOptions::default(), json!({"pattern": "hello", "glob": "**/*.rs"}))
        .await;
    assert_eq!(rs.text, "src/lib/util.rs:1: pub fn hello() {}");
    let one_file =
        grep(&dirs, BuiltinOptions::default(), json!({"pattern": "bye", "path": "README.md"}))
            .await;
    assert_eq!(one_file.text, "README.md:2: bye");
    let none = grep(&dirs, BuiltinOptions::default(), json!({"pattern": "zzz"})).await;
    assert_eq!(none.text, "No matches.");
    let bad = grep(&dirs, BuiltinOptions::default(), json!({"pattern": "("})).await;
    assert!(bad.is_error && bad.text.starts_with("invalid pattern"), "{}", bad.text);
}

#[tokio::test]
async fn grep_and_glob_are_bounded() {
    let dirs = Dirs::new();
    tree(&dirs);
    let few = BuiltinOptions { max_results: 1, ..BuiltinOptions::default() };
    let out = grep(&dirs, few.clone(), json!({"pattern": "(?i)hello"})).await;
    assert_eq!(
        out.text,
        "README.md:1: hello world\n[stopped at 1 matches; narrow the pattern or the path]"
    );
    let out = glob(&dirs, few, json!({"pattern": "**/*.rs"})).await;
    assert_eq!(out.text, "src/lib/util.rs\n[stopped at 1 paths; narrow the pattern]");
    let short_walk = BuiltinOptions { max_walk_entries: 2, ..BuiltinOptions::default() };
    let out = glob(&dirs, short_walk, json!({"pattern": "**"})).await;
    assert!(
        out.text.ends_with("[the search stopped after 2 entries; search a smaller directory]"),
        "{}",
        out.text
    );
    assert_eq!(out.details["truncated"], true);
}

/// The documented defaults: `grep` returns at most 200 lines, `glob` at most 200 paths.
#[tokio::test]
async fn grep_and_glob_return_at_most_200_by_default() {
    let dirs = Dirs::new();
    let matching = |count: usize| (1..=count).map(|n| format!("match {n}\n")).collect::<String>();
    for (dir, count) in [("many", 250), ("exactly", 200)] {
        std::fs::create_dir(dirs.cwd.join(dir)).unwrap();
        std::fs::write(dirs.cwd.join(dir).join("lines.txt"), matching(count)).unwrap();
        for n in 0..count {
            std::fs::write(dirs.cwd.join(dir).join(format!("f{n:03}.rs")), "").unwrap();
        }
    }

    let out =
        grep(&dirs, BuiltinOptions::default(), json!({"pattern": "^match", "path": "many"})).await;
    assert_eq!(out.details["matches"], 200);
    let lines: Vec<&str> = out.text.lines().collect();
    assert_eq!(lines.len(), 201, "{}", out.text);
    assert_eq!(
        (lines[0], lines[199]),
        ("many/lines.txt:1: match 1", "many/lines.txt:200: match 200")
    );
    assert_eq!(lines[200], "[stopped at 200 matches; narrow the pattern or the path]");
    let all = json!({"pattern": "^match", "path": "exactly"});
    let out = grep(&dirs, BuiltinOptions::default(), all).await;
    assert_eq!(
        (out.details["matches"].clone(), out.details["truncated"].clone()),
        (json!(200), json!(false))
    );

    let out =
        glob(&dirs, BuiltinOptions::default(), json!({"pattern": "*.rs", "path": "many"})).await;
    assert_eq!(out.details["count"], 200);
    let paths: Vec<&str> = out.text.lines().collect();
    assert_eq!(paths.len(), 201, "{}", out.text);
    assert_eq!((paths[0], paths[199]), ("many/f000.rs", "many/f199.rs"));
    assert_eq!(paths[200], "[stopped at 200 paths; narrow the pattern]");
    let all = json!({"pattern": "*.rs", "path": "exactly"});
    let out = glob(&dirs, BuiltinOptions::default(), all).await;
    assert_eq!(
        (out.details["count"].clone(), out.details["truncated"].clone()),
        (json!(200), json!(false))
    );
}

#[tokio::test]
async fn glob_matches_paths_with_single_and_double_stars() {
    let dirs = Dirs::new();
    tree(&dirs);
    let all = glob(&dirs, BuiltinOptions::default(), json!({"pattern": "**/*.rs"})).await;
    assert_eq!(all.text, "src/lib/util.rs\nsrc/main.rs");
    let top = glob(&dirs, BuiltinOptions::default(), json!({"pattern": "src/*.rs"})).await;
    assert_eq!(top.text, "src/main.rs");
    let under =
        glob(&dirs, BuiltinOptions::default(), json!({"pattern": "*.rs", "path": "src/lib"})).await;
    assert_eq!(under.text, "src/lib/util.rs");
    let none = glob(&dirs, BuiltinOptions::default(), json!({"pattern": "*.py"})).await;
    assert_eq!(none.text, "No files matched.");
    let bad = glob(&dirs, BuiltinOptions::default(), json!({"pattern": "a[", "path": "."})).await;
    assert!(bad.is_error && bad.text.starts_with("invalid glob"), "{}", bad.text);
}

#[tokio::test]
async fn searches_stay_inside_the_roots() {
    let dirs = Dirs::new();
    dirs.plant_links();
    std::fs::write(dirs.cwd.join("mine.txt"), "top secret copy\n").unwrap();
    // Symlinks out are neither entered nor read.
    let out = grep(&dirs, BuiltinOptions::default(), json!({"pattern": "secret"})).await;
    assert_eq!(out.text, "mine.txt:1: top secret copy");
    let listed = glob(&dirs, BuiltinOptions::default(), json!({"pattern": "**/secret"})).await;
    assert_eq!(listed.text, "No files matched.");
    for attack in ["../outside", "/etc", "link_out", "loop_a", "secret_link"] {
        let out =
            grep(&dirs, BuiltinOptions::default(), json!({"pattern": "secret", "path": attack}))
                .await;
        assert!(out.is_error, "grep {attack}: {out:?}");
        assert!(!out.text.contains("top secret"), "grep {attack} leaked");
        let out =
            glob(&dirs, BuiltinOptions::default(), json!({"pattern": "*", "path": attack})).await;
        assert!(out.is_error, "glob {attack}: {out:?}");
    }
}

#[tokio::test]
async fn searches_skip_the_gateways_state_and_refuse_to_start_in_it() {
    let dirs = Dirs::new();
    tree(&dirs);
    dirs.plant_state();
    std::os::unix::fs::symlink(dirs.state().join("secrets.toml"), dirs.cwd.join("tok.txt"))
        .unwrap();
    let found =
        grep(&dirs, BuiltinOptions::default(), json!({"pattern": "tok-state|gateway"})).await;
    assert!(!found.is_error, "{found:?}");
    assert_eq!(found.text, "No matches.");
    let paths = glob(&dirs, BuiltinOptions::default(), json!({"pattern": "**/*.toml"})).await;
    assert_eq!(paths.text, "No files matched.");
    for path in [".lemon", ".lemon/secrets.toml", "../workspace/state_link"] {
        let refused =
            grep(&dirs, BuiltinOptions::default(), json!({"pattern": "t", "path": path})).await;
        assert!(
            refused.is_error && refused.text.contains("the gateway's own state"),
            "{refused:?}"
        );
        let refused =
            glob(&dirs, BuiltinOptions::default(), json!({"pattern": "*", "path": path})).await;
        assert!(
            refused.is_error && refused.text.contains("the gateway's own state"),
            "{refused:?}"
        );
    }
}
