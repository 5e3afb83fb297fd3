//! What a run's processes can reach of the gateway and how long they live, on
//! the real binary: a `bash` command of the native engine and a vendor CLI
//! find neither the gateway's API token nor its provider key in
//! `/proc/<gateway>/environ` (blanked at start; some kernels let a root child
//! read the block of a process that is not dumpable) and cannot open its
//! `/proc/<gateway>/mem`, and a process a command starts in a session of its own with an
//! empty environment is gone when the command ends, and after a gateway that
//! was killed starts again.

use serde_json::{json, Value};

use lemon_tests::fake_llm::{FakeLlm, FakeToolCall, Turn};

use crate::fault_support::{alive, claude_config, eventually, success_fixture};
use crate::support::{command, home_with, Gateway, TOKEN};

/// The provider key the gateway gets in its environment.
const KEY: &str = "sk-environ-probe-8c1f2e";

fn bash(id: &str, command: &str) -> FakeToolCall {
    FakeToolCall::new(id, "bash", &[&json!({ "command": command }).to_string()])
}

/// A gateway whose native engine talks to `llm`, with `OPENAI_API_KEY` and
/// `LEMON_API_TOKEN` in its environment (as a user's shell or unit file
/// gives them).
async fn native_gateway(home: &std::path::Path) -> Gateway {
    let mut cmd = command(home);
    cmd.env("OPENAI_API_KEY", KEY);
    Gateway::spawn(cmd, home).await
}

fn native_home(llm: &FakeLlm) -> tempfile::TempDir {
    home_with(&format!(
        "{}\n[gateway.engines.lemon]\nbase_url = \"{}\"\nmodel = \"test-model\"\n",
        crate::support::ALLOW_EVERY_CALL,
        llm.base_url()
    ))
}

/// The text of the tool result the model was sent in request `n`.
fn tool_result(llm: &FakeLlm, n: usize) -> String {
    let requests = llm.requests();
    let messages = requests[n].body["messages"].as_array().unwrap().clone();
    messages
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| m["content"].to_string())
        .collect::<Vec<_>>()
        .join("\n")
}

#[tokio::test]
async fn a_command_cannot_read_the_gateways_environment() {
    let workdir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::builder().api_key(KEY).start().await;
    let home = native_home(&llm);
    let gateway = native_gateway(home.path()).await;
    let pid = gateway.pid();
    // The shell's parent is the gateway; name it both ways.
    let probe = format!(
        "echo ppid=$PPID; cat /proc/$PPID/environ; echo status=$?; \
         cat /proc/{pid}/environ; echo status=$?; head -c 1 /proc/{pid}/mem; echo mem=$?"
    );
    llm.push(Turn::tool_calls(vec![bash("call_probe", &probe)]));
    llm.push(Turn::text(&["Nothing to see."]));

    let cwd = workdir.path().to_str().unwrap();
    let run_id = gateway.submit(json!({ "prompt": "read the environ", "cwd": cwd })).await;
    let run = gateway.wait(&run_id).await;
    assert_eq!(run["status"], "completed", "{run}");
    let output = tool_result(&llm, 1);
    assert!(output.contains(&format!("ppid={pid}")), "the gateway is the parent: {output}");
    assert!(!output.contains(KEY), "the provider key was readable: {output}");
    assert!(!output.contains(TOKEN), "the API token was readable: {output}");
    assert!(!output.contains("LEMON_API_TOKEN="), "the token's entry is left: {output}");
    assert!(output.contains("mem=1"), "the gateway's memory was readable: {output}");
    assert!(output.contains("Permission denied"), "{output}");
    gateway.terminate().await;
}

#[tokio::test]
async fn a_vendor_cli_cannot_read_the_gateways_environment() {
    let scratch = tempfile::tempdir().unwrap();
    let report = scratch.path().join("parent-environ.txt");
    let env = [
        ("FAKE_CLI_FIXTURE", success_fixture().display().to_string()),
        ("FAKE_CLI_PARENT_ENVIRON_FILE", report.display().to_string()),
    ];
    let home = home_with(&claude_config(&env, ""));
    let mut cmd = command(home.path());
    cmd.env("OPENAI_API_KEY", KEY);
    let gateway = Gateway::spawn(cmd, home.path()).await;
    let run_id = gateway.submit(json!({ "prompt": "look around" })).await;
    let run = gateway.wait(&run_id).await;
    assert_eq!(run["status"], "completed", "{run}");
    let text = std::fs::read_to_string(&report).unwrap();
    assert!(!text.contains(KEY) && !text.contains(TOKEN), "the CLI read a secret: {text}");
    assert!(text.contains("\nmem: refused: "), "the CLI opened the gateway's memory: {text}");
    gateway.terminate().await;
}

/// Starts, from a command, a process in a session of its own with an empty
/// environment (so neither its group nor `LEMON_PROCESS_SCOPE` leads to it),
/// which writes its pid to `sleeper.pid` and sleeps; waits until the test
/// has looked at it (the file `go`), then runs `then`.
fn escape_command(then: &str) -> String {
    format!(
        "setsid env -i /bin/sh -c 'echo $$ > sleeper.tmp && mv sleeper.tmp sleeper.pid && \
         exec sleep 1000' </dev/null >/dev/null 2>&1 & \
         while [ ! -e go ]; do sleep 0.01; done; {then}"
    )
}

/// The escaped sleeper's pid, once it wrote it; checks it did escape (another
/// session, no scope in its environment), then lets the command go on.
async fn escaped_sleeper(workdir: &std::path::Path, gateway_pid: i32) -> i32 {
    let path = workdir.join("sleeper.pid");
    eventually("the sleeper's pid", || {
        std::fs::read_to_string(&path).is_ok_and(|s| s.ends_with('\n'))
    })
    .await;
    let pid: i32 = std::fs::read_to_string(&path).unwrap().trim().parse().unwrap();
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let session = stat.rsplit_once(')').unwrap().1.split_whitespace().nth(3).unwrap().to_owned();
    assert_eq!(session, pid.to_string(), "the sleeper leads a session of its own");
    let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
    assert!(
        !String::from_utf8_lossy(&environ).contains("LEMON_PROCESS_SCOPE"),
        "the sleeper dropped the scope"
    );
    assert_ne!(pid, gateway_pid);
    std::fs::write(workdir.join("go"), "").unwrap();
    pid
}

#[tokio::test]
async fn a_process_that_left_its_group_and_environment_dies_with_its_command() {
    let workdir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::builder().api_key(KEY).start().await;
    llm.push(Turn::tool_calls(vec![bash("call_escape", &escape_command("echo started"))]));
    llm.push(Turn::text(&["Started it."]));
    let home = native_home(&llm);
    let gateway = native_gateway(home.path()).await;
    let cwd = workdir.path().to_str().unwrap();
    let run_id = gateway.submit(json!({ "prompt": "start a daemon", "cwd": cwd })).await;
    let sleeper = escaped_sleeper(workdir.path(), gateway.pid()).await;
    let run: Value = gateway.wait(&run_id).await;
    assert_eq!(run["status"], "completed", "{run}");
    eventually("the escaped sleeper is gone once its command ended", || !alive(sleeper)).await;
    gateway.terminate().await;
}

#[tokio::test]
async fn a_process_that_left_its_group_and_environment_is_killed_by_the_next_start() {
    let workdir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::builder().api_key(KEY).start().await;
    // The command stays running, so the sleeper is still its own when the
    // gateway is killed.
    llm.push(Turn::tool_calls(vec![bash("call_escape", &escape_command("sleep 300"))]));
    let home = native_home(&llm);
    let mut gateway = native_gateway(home.path()).await;
    let cwd = workdir.path().to_str().unwrap();
    gateway.submit(json!({ "prompt": "start a daemon", "cwd": cwd })).await;
    let sleeper = escaped_sleeper(workdir.path(), gateway.pid()).await;

    gateway.child.kill().await.unwrap();
    // Neither the parent-death signal nor its group reaches it.
    assert!(alive(sleeper), "the escaped sleeper outlived the gateway");

    let gateway = native_gateway(home.path()).await;
    eventually("the next start killed the escaped sleeper", || !alive(sleeper)).await;
    gateway.terminate().await;
}
