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

/// The README's promise: a command's output keeps its head and tail up to
/// 30 000 bytes.
#[tokio::test]
async fn by_default_output_keeps_30_000_bytes_of_head_and_tail() {
    let dirs = Dirs::new();
    let xs = |n: usize| format!("head -c {n} /dev/zero | tr '\\0' x");

    let whole = bash(&dirs, BuiltinOptions::default(), json!({"command": xs(30_000)})).await;
    assert_eq!(whole.text, format!("{}\n[exit code 0]", "x".repeat(30_000)));
    assert_eq!(whole.details["truncated"], false);

    let one_over = bash(&dirs, BuiltinOptions::default(), json!({"command": xs(30_001)})).await;
    assert!(one_over.text.contains("[... 1 bytes of output cut ...]"), "{}", one_over.text);
    assert_eq!(one_over.details["truncated"], true);

    let long = bash(&dirs, BuiltinOptions::default(), json!({"command": xs(100_000)})).await;
    assert_eq!(long.details["output_bytes"], 100_000);
    assert!(long.text.contains("\n[... 70000 bytes of output cut ...]\n"), "{}", long.text);
    let kept = long.text.strip_suffix("\n[exit code 0]").expect("the exit code follows");
    assert_eq!(kept.matches('x').count(), 30_000, "what is kept: 30 000 bytes");
    assert!(kept.starts_with('x') && kept.ends_with('x'), "{kept}");
}

/// The README's promise: `timeout_ms` is 120 s by default and at most 600 s.
#[tokio::test(start_paused = true)]
async fn by_default_a_command_is_killed_after_120_s_and_never_runs_past_600_s() {
    let dirs = Dirs::new();
    let tool = Bash::new(BuiltinOptions::default().into());
    let started = tokio::time::Instant::now();
    let out = tool.execute(json!({"command": "sleep 100000"}), dirs.ctx()).await;
    let waited = started.elapsed();
    assert_eq!(out.result_meta, json!({"error_type": "timeout", "timeout_ms": 120_000}));
    assert!(out.text.ends_with("[timed out after 120000 ms; the command was killed]"));
    assert!(waited >= Duration::from_secs(120), "killed after {waited:?}");
    assert!(waited < Duration::from_secs(130), "killed after {waited:?}");

    let started = tokio::time::Instant::now();
    let asked_for_an_hour = json!({"command": "sleep 100000", "timeout_ms": 3_600_000});
    let out = tool.execute(asked_for_an_hour, dirs.ctx()).await;
    let waited = started.elapsed();
    assert_eq!(out.result_meta, json!({"error_type": "timeout", "timeout_ms": 600_000}));
    assert!(waited >= Duration::from_secs(600), "killed after {waited:?}");
    assert!(waited < Duration::from_secs(610), "killed after {waited:?}");
    let description = tool.spec().description;
    assert!(description.contains("default 120000, at most 600000"), "{description}");
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

// ------------------------------------------------------------ Landlock

use lemon_core::config::{SandboxConfig, SandboxMode};
use lemon_core::contain::OffLimits;

use super::super::{Sandbox, SandboxSupport};

/// A sandbox as `[gateway.sandbox]` makes it by default (`auto`, system read
/// roots, no port), plus `ports`; this host must have Landlock.
fn contained(mode: SandboxMode, ports: &[u16]) -> BuiltinOptions {
    let config =
        SandboxConfig { mode, allow_connect_ports: ports.to_vec(), ..SandboxConfig::default() };
    let sandbox = Sandbox::from_config(&config, None);
    assert!(
        matches!(sandbox.support, SandboxSupport::Landlock(abi) if abi >= 6),
        "this host's kernel must offer Landlock ABI 6 or later: {:?}",
        sandbox.support
    );
    BuiltinOptions { sandbox, ..options() }
}

/// The context of [`Dirs`] with the gateway's state beside the run's
/// directory (`state/`), not inside it.
fn ctx_beside(dirs: &Dirs) -> lemon_core::tool::ToolContext {
    let state = dirs.outside.parent().unwrap().join("state");
    std::fs::create_dir_all(&state).unwrap();
    std::fs::write(state.join("secrets.toml"), "token = \"x\"\n").unwrap();
    lemon_core::tool::ToolContext { off_limits: OffLimits::new([state], []), ..dirs.ctx() }
}

async fn bash_in(dirs: &Dirs, options: BuiltinOptions, command: &str) -> ToolOutput {
    let tool = Bash::new(options.into());
    within("the command", tool.execute(json!({ "command": command }), ctx_beside(dirs))).await
}

#[tokio::test]
async fn a_contained_command_writes_only_in_its_directory_the_workspace_and_its_temp() {
    let dirs = Dirs::new();
    let ws = dirs.workspace.display();
    let out = bash_in(
        &dirs,
        contained(SandboxMode::Auto, &[]),
        &format!(
            "touch made; echo here=$?; touch {ws}/made; echo workspace=$?; \
             touch \"$TMPDIR/made\"; echo temp=$?; touch ../outside/made; echo outside=$?; \
             touch /tmp/lemon-sandbox-made; echo tmp=$?; rm ../outside/secret; echo rm=$?"
        ),
    )
    .await;
    for expected in ["here=0", "workspace=0", "temp=0", "outside=1", "tmp=1", "rm=1"] {
        assert!(out.text.contains(expected), "{expected}: {}", out.text);
    }
    assert!(out.text.contains("Permission denied"), "{}", out.text);
    assert!(dirs.cwd.join("made").exists() && dirs.workspace.join("made").exists());
    assert!(!dirs.outside.join("made").exists());
    assert!(!std::path::Path::new("/tmp/lemon-sandbox-made").exists());
    assert!(dirs.outside.join("secret").exists());
}

#[tokio::test]
async fn a_contained_command_reads_system_files_but_not_outside_its_roots_even_through_a_link() {
    let dirs = Dirs::new();
    let state = dirs.outside.parent().unwrap().join("state/secrets.toml");
    let out = bash_in(
        &dirs,
        contained(SandboxMode::Auto, &[]),
        &format!(
            "head -c 0 /etc/passwd; echo etc=$?; cat ../outside/secret; echo outside=$?; \
             ln -s ../outside/secret link; cat link; echo link=$?; cat {}; echo state=$?",
            state.display()
        ),
    )
    .await;
    for expected in ["etc=0", "outside=1", "link=1", "state=1"] {
        assert!(out.text.contains(expected), "{expected}: {}", out.text);
    }
    assert!(!out.text.contains("top secret"), "{}", out.text);
    assert!(!out.text.contains("token"), "{}", out.text);
}

/// A TCP connection from Python, which prints the errno's name.
fn connect(port: u16) -> String {
    format!(
        "python3 -c 'import socket, errno\n\
         s = socket.socket()\n\
         try:\n    s.connect((\"127.0.0.1\", {port})); print(\"port {port}: connected\")\n\
         except OSError as e:\n    print(\"port {port}:\", errno.errorcode[e.errno])'"
    )
}

#[tokio::test]
async fn a_contained_command_connects_only_to_the_allowed_ports_and_signals_nothing_outside() {
    let dirs = Dirs::new();
    let refused = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let allowed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let (refused_port, allowed_port) =
        (refused.local_addr().unwrap().port(), allowed.local_addr().unwrap().port());
    let out = bash_in(
        &dirs,
        contained(SandboxMode::Auto, &[allowed_port]),
        &format!(
            "{}; {}; kill -0 {}; echo signal=$?",
            connect(refused_port),
            connect(allowed_port),
            std::process::id()
        ),
    )
    .await;
    assert!(out.text.contains(&format!("port {refused_port}: EACCES")), "{}", out.text);
    assert!(out.text.contains(&format!("port {allowed_port}: connected")), "{}", out.text);
    assert!(out.text.contains("signal=1"), "the gateway cannot be signalled: {}", out.text);
}

#[tokio::test]
async fn without_landlock_required_refuses_the_command_and_auto_runs_it_uncontained() {
    let dirs = Dirs::new();
    let missing = |mode| {
        let config = SandboxConfig { mode, simulate_no_landlock: true, ..SandboxConfig::default() };
        BuiltinOptions { sandbox: Sandbox::from_config(&config, None), ..options() }
    };
    let out = bash_in(&dirs, missing(SandboxMode::Required), "touch ../outside/required").await;
    assert!(out.is_error, "{}", out.text);
    assert!(out.text.contains("mode = \"required\""), "{}", out.text);
    assert!(!dirs.outside.join("required").exists(), "the command did not run");
    let out = bash_in(&dirs, missing(SandboxMode::Auto), "touch ../outside/auto").await;
    assert!(!out.is_error, "{}", out.text);
    assert!(dirs.outside.join("auto").exists(), "auto without Landlock runs uncontained");
}

#[tokio::test]
async fn a_run_directory_holding_the_gateways_state_is_not_granted() {
    let dirs = Dirs::new();
    dirs.plant_state();
    let tool = Bash::new(contained(SandboxMode::Auto, &[]).into());
    // `Dirs::ctx` puts the state inside the run's directory.
    let out =
        within("the command", tool.execute(json!({ "command": "touch x" }), dirs.ctx())).await;
    assert!(out.is_error, "{}", out.text);
    assert!(out.text.contains("holds the gateway's state"), "{}", out.text);
    assert!(!dirs.cwd.join("x").exists());
}
