//! `bash` with a real `sh`: output, exit codes, the output cap, timeouts,
//! and cancel killing the whole process group.

use std::collections::BTreeMap;
use std::time::Duration;

use lemon_core::testing::within;
use lemon_core::tool::{Tool, ToolOutput};
use serde_json::{json, Value};

use super::super::testutil::Dirs;
use super::super::BuiltinOptions;
use super::Bash;

fn options() -> BuiltinOptions {
    let env: BTreeMap<String, String> = [("PATH", "/usr/bin:/bin"), ("LEMON_TEST_VAR", "visible")]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    BuiltinOptions { bash_env: env, ..BuiltinOptions::default() }
}

async fn bash(dirs: &Dirs, options: BuiltinOptions, args: Value) -> ToolOutput {
    let tool = Bash::new(options.into());
    within("the command", tool.execute(args, dirs.ctx())).await
}

/// Live (not zombie) processes of process group `pgid`.
fn group_members(pgid: i32) -> Vec<i32> {
    let mut members = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|name| name.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        let Some((_, rest)) = stat.rsplit_once(')') else { continue };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let alive = !matches!(fields.first(), Some(&"Z") | Some(&"X"));
        if alive && fields.get(2).and_then(|f| f.parse::<i32>().ok()) == Some(pgid) {
            members.push(pid);
        }
    }
    members
}

#[tokio::test]
async fn output_exit_code_cwd_and_environment() {
    let dirs = Dirs::new();
    let out = bash(
        &dirs,
        options(),
        json!({"command": "pwd; echo \"$LEMON_TEST_VAR ${HOME:-nohome}\"; echo oops >&2; exit 3"}),
    )
    .await;
    let cwd = dirs.cwd.canonicalize().unwrap();
    // stdout and stderr are separate pipes: their lines may arrive in either order.
    assert!(out.text.contains(&format!("{}\n", cwd.display())), "{}", out.text);
    assert!(out.text.contains("visible nohome\n"), "{}", out.text);
    assert!(out.text.contains("oops\n"), "{}", out.text);
    assert!(out.text.ends_with("[exit code 3]"), "{}", out.text);
    assert!(out.is_error);
    assert_eq!(out.result_meta, json!({"exit_code": 3}));
    assert_eq!(out.details["exit_code"], 3);

    let ok = bash(&dirs, options(), json!({"command": "true"})).await;
    assert!(!ok.is_error);
    assert_eq!(ok.text, "(no output)\n[exit code 0]");
    assert_eq!(ok.result_meta, json!({"exit_code": 0}));
}

#[tokio::test]
async fn long_output_keeps_its_head_and_tail_and_says_how_much_was_cut() {
    let dirs = Dirs::new();
    let capped = BuiltinOptions { output_limit: 100, ..options() };
    let out = bash(&dirs, capped, json!({"command": "seq 1 10000"})).await;
    let total: usize = (1..=10000).map(|n: u32| n.to_string().len() + 1).sum();
    assert_eq!(out.details["output_bytes"], total);
    assert_eq!(out.details["truncated"], true);
    assert!(out.text.starts_with("1\n2\n3\n"), "{}", out.text);
    assert!(
        out.text.contains(&format!("[... {} bytes of output cut ...]", total - 100)),
        "{}",
        out.text
    );
    assert!(out.text.ends_with("9999\n10000\n[exit code 0]"), "{}", out.text);
    assert!(out.text.len() < 200, "{}", out.text);
}

#[tokio::test]
async fn a_command_over_its_timeout_is_killed_and_says_so() {
    let dirs = Dirs::new();
    let out =
        bash(&dirs, options(), json!({"command": "echo before; sleep 30", "timeout_ms": 200}))
            .await;
    assert!(out.is_error);
    assert!(out.text.starts_with("before\n"), "{}", out.text);
    assert!(out.text.ends_with("[timed out after 200 ms; the command was killed]"), "{}", out.text);
    assert_eq!(out.result_meta, json!({"error_type": "timeout", "timeout_ms": 200}));

    // A call cannot ask for more than the cap.
    let capped = BuiltinOptions { bash_max_timeout: Duration::from_millis(150), ..options() };
    let out = bash(&dirs, capped, json!({"command": "sleep 30", "timeout_ms": "999999999"})).await;
    assert_eq!(out.result_meta, json!({"error_type": "timeout", "timeout_ms": 150}));
    let bad = bash(&dirs, options(), json!({"command": "true", "timeout_ms": 0})).await;
    assert_eq!(bad.text, "timeout_ms must be at least 1");
    let missing = bash(&dirs, options(), json!({})).await;
    assert_eq!(missing.text, "Missing required parameter: command");
}

#[tokio::test]
async fn what_the_shell_leaves_running_is_killed_when_it_exits() {
    let dirs = Dirs::new();
    let out = bash(&dirs, options(), json!({"command": "sleep 300 & echo $$"})).await;
    let pgid: i32 = out.text.lines().next().unwrap().parse().unwrap();
    assert!(!out.is_error, "{}", out.text);
    assert_eq!(group_members(pgid), Vec::<i32>::new());
}

#[tokio::test]
async fn cancel_kills_the_whole_group_at_once() {
    let dirs = Dirs::new();
    let tool = Bash::new(options().into());
    let ctx = dirs.ctx();
    let cancel = ctx.cancel.clone();
    // The shell, a child shell and two sleeps, one of them a grandchild.
    let command = "echo $$ > pid.tmp && mv pid.tmp pid; sh -c 'sleep 300; echo never' & sleep 300";
    let call = tokio::spawn(async move { tool.execute(json!({"command": command}), ctx).await });
    let pid_file = dirs.cwd.join("pid");
    let pgid = within("the group to start", async {
        loop {
            if let Some(pgid) = std::fs::read_to_string(&pid_file)
                .ok()
                .and_then(|text| text.trim().parse::<i32>().ok())
                .filter(|pgid| group_members(*pgid).len() >= 4)
            {
                return pgid;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;

    cancel.cancel();
    let out = within("the cancelled command", call).await.unwrap();
    assert!(out.is_error);
    assert!(out.text.ends_with("[the run was cancelled; the command was killed]"), "{}", out.text);
    assert_eq!(out.result_meta, json!({"error_type": "cancelled"}));
    assert_eq!(group_members(pgid), Vec::<i32>::new(), "every process of the group is gone");
}

#[tokio::test]
async fn a_cancelled_run_starts_nothing() {
    let dirs = Dirs::new();
    let ctx = dirs.ctx();
    ctx.cancel.cancel();
    let out = Bash::new(options().into()).execute(json!({"command": "touch made"}), ctx).await;
    assert!(out.is_error);
    assert!(!dirs.cwd.join("made").exists());
}

#[test]
fn captured_output_below_the_limit_is_kept_whole() {
    let mut captured = super::Captured::new(10);
    captured.push(b"abc");
    captured.push(b"defg");
    assert_eq!((captured.text(), captured.cut()), ("abcdefg".to_owned(), 0));
    captured.push(b"hij");
    assert_eq!((captured.text(), captured.cut()), ("abcdefghij".to_owned(), 0));
    captured.push(b"k");
    assert_eq!(captured.text(), "abcde\n[... 1 bytes of output cut ...]\nghijk");
}
